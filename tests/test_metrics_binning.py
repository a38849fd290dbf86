"""The shared numeric kernels of timm_csm.metrics.binning (bin sums, equal-mass edges) against the code each call site
used before, written inline here: the metric values must not move (bit for bit where the summation order is kept)."""
import numpy as np
import pytest
import torch

from timm_csm.calibration import TemperatureScaling
from timm_csm.metrics import adaptive_ece, bin_edges, bin_index, ece, piece, proximity
from timm_csm.metrics.binning import _Buckets, bin_sums, calibration_error_from_bins, equal_mass_bins, equal_mass_edges
from timm_csm.metrics.classwise import _flat_nonzero
from timm_csm.metrics.inputs import prepare_inputs
from timm_csm.metrics.state import _FLUSH_SAMPLES, accumulate


def random_bins(n, n_bins, seed):
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n_bins, (n,), generator=g)
    return index, torch.rand(n, generator=g, dtype=torch.float64), (torch.rand(n, generator=g) < 0.7).double()


def old_equal_mass_edges(sorted_values, n_bins):
    """The metrics' edge rule before the helper was shared (sorted input), one edge at a time in Python floats
    (the same IEEE operations: v[lo] (1 - f) + v[lo + 1] f, the last value from position N - 1 on)."""
    v, n = sorted_values.tolist(), sorted_values.numel()
    edges = []
    for p in torch.linspace(0.0, float(n), n_bins + 1, dtype=torch.float64).tolist():
        lo = int(p)
        edges.append(v[-1] if p >= n - 1 else v[lo] * (1.0 - (p - lo)) + v[lo + 1] * (p - lo))
    return torch.tensor(edges, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(4))
def test_bin_sums_is_bit_identical_to_the_index_add_and_bincount_code_it_replaces(seed):
    index, conf, acc = random_bins(5000, 15, seed)
    count, conf_sum, acc_sum = bin_sums(index, 15, conf, acc)
    # metrics / temperature scaling: fresh float64 index_add_; temperature scaling counted with bincount
    assert torch.equal(count, torch.bincount(index, minlength=15).double())
    assert torch.equal(conf_sum, torch.zeros(15, dtype=torch.float64).index_add_(0, index, conf))
    assert torch.equal(acc_sum, torch.zeros(15, dtype=torch.float64).index_add_(0, index, acc))
    # AdaFocal: bincount with weights
    assert torch.equal(conf_sum, torch.bincount(index, weights=conf, minlength=15))
    # the streaming state: in-place accumulation into sums that already hold earlier samples
    start = [t.clone() for t in bin_sums(*random_bins(300, 15, seed + 10)[:1], 15, conf[:300], acc[:300])]
    old = [t.clone() for t in start]
    old[0].index_add_(0, index, torch.ones_like(conf))
    old[1].index_add_(0, index, conf)
    old[2].index_add_(0, index, acc)
    out = bin_sums(index, 15, conf, acc, out=start)
    assert all(a is b for a, b in zip(out, start))
    assert all(torch.equal(a, b) for a, b in zip(out, old))


def test_bin_sums_refuses_mismatched_shapes():
    index, conf, acc = random_bins(10, 4, 0)
    with pytest.raises(ValueError, match="shape of index"):
        bin_sums(index, 4, conf[:5])
    with pytest.raises(ValueError, match=r"out must hold 2 float64 tensors of shape \(4,\)"):
        bin_sums(index, 4, conf, out=(torch.zeros(4, dtype=torch.float64),))
    with pytest.raises(ValueError, match="out must hold"):
        bin_sums(index, 4, conf, out=(torch.zeros(4), torch.zeros(4)))


@pytest.mark.parametrize("n", [1, 2, 7, 15, 16, 1000, 4097])
def test_equal_mass_edges_are_the_old_metric_edges_bit_for_bit(n):
    conf = torch.rand(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64) ** 0.2
    edges = equal_mass_edges(conf, 15)  # any order: the helper sorts
    assert torch.equal(edges, old_equal_mass_edges(conf.sort().values, 15))
    # np.interp (the reference AECE, and the AdaFocal code's a + f (b - a)) agree to the last bits
    ref = np.interp(np.linspace(0, n, 16), np.arange(n), np.sort(conf.numpy()))
    np.testing.assert_array_max_ulp(edges.numpy(), ref, maxulp=2)


@pytest.mark.parametrize("n", [2, 5, 100, 999])
def test_quantile_edges_are_the_linear_quantiles(n):
    prox = torch.rand(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    edges = equal_mass_edges(prox, 10, quantile=True)
    q = torch.linspace(0, 1, 11, dtype=torch.float64)
    # positions q (N - 1) and b (N - 1) / B round differently: the edges agree to a few units in the last place
    np.testing.assert_allclose(edges.numpy(), torch.quantile(prox, q).numpy(), rtol=1e-14, atol=0)
    np.testing.assert_allclose(edges.numpy(), np.quantile(prox.numpy(), q.numpy()), rtol=1e-14, atol=0)


def test_the_two_position_rules_on_ties():
    v = torch.tensor([0.9, 0.1, 0.9, 0.1], dtype=torch.float64)
    assert equal_mass_edges(v, 2).tolist() == [0.1, 0.9, 0.9]  # b N / B: everything in the lower bin
    assert equal_mass_edges(v, 2, quantile=True).tolist() == pytest.approx([0.1, 0.5, 0.9])
    with pytest.raises(ValueError, match="empty"):
        equal_mass_edges(torch.zeros(0), 3)
    with pytest.raises(ValueError, match="n_bins"):
        equal_mass_edges(v, 0)


def logits(n, c, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (n,), generator=g)
    z = 2.5 * torch.randn(n, c, generator=g, dtype=torch.float64)
    z[torch.arange(n), y] += 2.0
    return z.to(dtype), y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adaptive_ece_is_bit_identical_to_the_old_inline_computation(dtype):
    z, y = logits(3000, 10, 1, dtype)
    st = accumulate(prepare_inputs(z, y), 15, binned=False, classwise=False, nll=False, brier=False, points=True)
    conf, acc = st.points()
    edges = old_equal_mass_edges(conf.sort().values, 15)
    b = bin_index(conf, edges, equal_width=False)
    count = torch.zeros(15, dtype=torch.float64).index_add_(0, b, torch.ones_like(conf))
    conf_sum = torch.zeros_like(count).index_add_(0, b, conf)
    acc_sum = torch.zeros_like(count).index_add_(0, b, acc)
    assert adaptive_ece(z, y) == calibration_error_from_bins(count, conf_sum, acc_sum, "l1")


def test_streaming_bins_over_several_flushes_are_bit_identical_to_the_old_flush():
    z, y = logits(2 * _FLUSH_SAMPLES + 123, 3, 2, torch.float32)
    st = accumulate(prepare_inputs(z, y), 15, classwise=False, nll=False, brier=False, points=True)
    conf, acc = st.points()
    count, conf_sum, acc_sum = (torch.zeros(15, dtype=torch.float64) for _ in range(3))
    edges = bin_edges(15)
    for a in range(0, conf.numel(), _FLUSH_SAMPLES):  # the old flush: index_add_ into the running sums
        c, r = conf[a:a + _FLUSH_SAMPLES], acc[a:a + _FLUSH_SAMPLES]
        b = bin_index(c, edges)
        count.index_add_(0, b, torch.ones_like(c))
        conf_sum.index_add_(0, b, c)
        acc_sum.index_add_(0, b, r)
    assert torch.equal(st.count, count) and torch.equal(st.conf_sum, conf_sum) and torch.equal(st.acc_sum, acc_sum)
    assert ece(z, y) == calibration_error_from_bins(count, conf_sum, acc_sum, "l1")


def test_temperature_grid_scores_are_bit_identical_to_the_old_loop():
    z, y = logits(2000, 10, 3)
    ts = TemperatureScaling().fit(z, y)
    shifted = z - z.max(dim=1, keepdim=True).values
    correct = (z.argmax(dim=1) == y).double()
    edges = bin_edges(15)
    old = []
    for t in [ts.grid[0] + i * 0.1 for i in range(len(ts.scores))]:
        t = float(f"{t:.1f}")
        confidence = (shifted / t).exp().sum(dim=1).reciprocal()
        index = bin_index(confidence, edges)
        count = torch.bincount(index, minlength=15).double()
        conf_sum = torch.zeros(15, dtype=torch.float64).index_add_(0, index, confidence)
        acc_sum = torch.zeros(15, dtype=torch.float64).index_add_(0, index, correct)
        old.append(calibration_error_from_bins(count, conf_sum, acc_sum, "l1"))
    assert ts.scores.tolist() == old


def test_piece_agrees_with_its_old_quantile_code_on_continuous_proximities():
    z, y = logits(1000, 10, 4)
    prox = proximity(torch.randn(1000, 16, generator=torch.Generator().manual_seed(4)))
    probs = torch.softmax(z, dim=1)
    confidence, pred = probs.max(dim=1)
    correct = (pred == y).double()
    conf_bin = bin_index(confidence, bin_edges(15))
    prox_bin = torch.bucketize(prox, torch.quantile(prox, torch.linspace(0, 1, 11, dtype=torch.float64)[1:-1]))
    gap = torch.zeros(150, dtype=torch.float64).index_add_(0, prox_bin * 15 + conf_bin, correct - confidence)
    assert piece(z, y, None, prox=prox) == pytest.approx(float(gap.abs().sum() / 1000), abs=1e-13)


def test_bucketed_order_statistics_and_bins_equal_a_sort_and_a_count():
    rng = np.random.default_rng(0)
    out_of_order = 0
    for n in (2, 3, 17, 100, 5000):
        crowd = np.concatenate([rng.random(max(1, n // 50)), 0.5 + 1e-12 * rng.random(n - max(1, n // 50))])
        for v in (rng.random(n), rng.integers(0, 3, n) / 3.0, np.full(n, 0.3), 1e3 * rng.normal(size=n), crowd):
            ranks = np.unique(np.concatenate([rng.integers(0, n, 20), [0, n - 1]]))
            assert np.array_equal(_Buckets(v).order_statistics(ranks), np.sort(v)[ranks])
            for quantile in (False, True):
                edges, index = equal_mass_bins(torch.from_numpy(v), 15, quantile)
                assert torch.equal(edges, equal_mass_edges(torch.from_numpy(v), 15, quantile))
                inner = edges[1:-1].numpy()
                out_of_order += bool((np.diff(inner) < 0).any())  # interpolated between ties, off by a rounding
                below = (inner[None, :] < v[:, None]).sum(1)  # the bin: the number of edges below the value
                assert np.array_equal(index.numpy(), below)
                assert np.array_equal(bin_index(torch.from_numpy(v), edges, equal_width=False).numpy(), below)
    assert out_of_order  # the count, not a binary search of unsorted edges, was checked


def test_sparse_flat_nonzero_and_float32_bins_are_exact():
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 8, 9, 65, 4099):
        for density in (0.0, 0.02, 0.5, 1.0):
            mask = rng.random(n + 3) < density
            for m in (mask[:n], mask[3:]):  # an offset start too
                assert np.array_equal(_flat_nonzero(m), np.flatnonzero(m))
    for n_bins in (2, 3, 10, 15, 40):
        edges = bin_edges(n_bins)
        exact = torch.arange(n_bins + 1, dtype=torch.float64) / n_bins
        v = torch.cat([edges, exact, torch.rand(300, dtype=torch.float64)]).float()
        near = [v]
        for direction in (2.0, -1.0):  # every float32 within four steps of an edge
            w = v
            for _ in range(4):
                w = torch.nextafter(w, torch.full_like(w, direction))
                near.append(w)
        v = torch.cat(near).clamp(0, 1)
        assert torch.equal(bin_index(v, edges), torch.bucketize(v.double(), edges[1:-1], right=False))

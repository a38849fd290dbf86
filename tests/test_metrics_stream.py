"""CalibrationAccumulator: batched updates, merging and syncing equal the one-shot functional values."""
import pytest
import torch

from timm_csm.metrics import CalibrationAccumulator, calibration_metrics, reliability_table
from timm_csm.metrics.state import CalibrationState


def make_data(n, c, seed, soft=False):
    g = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    z[torch.arange(n), y] += 2
    if soft:
        return z, torch.softmax(3 * torch.randn(n, c, generator=g, dtype=torch.float64), 1)
    return z, y


def uneven_batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randint(1, n, (6,), generator=g).tolist())
    bounds = [0, *cuts, n]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def assert_same(got, want, tol=1e-12):
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=tol), k


@pytest.mark.parametrize("soft", [False, True])
def test_batched_updates_equal_one_shot(soft):
    z, y = make_data(1200, 8, seed=1, soft=soft)
    acc = CalibrationAccumulator(num_classes=8)
    for a, b in uneven_batches(1200):
        acc.update(z[a:b], y[a:b])
    assert acc.num_samples == 1200
    assert_same(acc.compute(smooth=True), calibration_metrics(z, y, smooth=True))
    want = reliability_table(z, y)
    got = acc.reliability_table()
    assert torch.equal(got.count, want.count) and got.ece == pytest.approx(want.ece, abs=1e-15)


def test_merge_of_shards_equals_one_shot_and_num_classes_is_inferred():
    z, y = make_data(900, 5, seed=2)
    shards = []
    for a, b in [(0, 300), (300, 301), (301, 900)]:
        shards.append(CalibrationAccumulator().update(z[a:b], y[a:b]))
    total = CalibrationAccumulator()
    for shard in shards:
        total.merge(shard)
    assert total.num_classes == 5
    assert_same(total.compute(smooth=True), calibration_metrics(z, y, smooth=True))
    # merging an empty accumulator changes nothing
    before = total.compute()
    assert_same(total.merge(CalibrationAccumulator(num_classes=5)).compute(), before, 0.0)


def test_dense_binary_and_ignore_index_stream():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 3, 4, 4, generator=g, dtype=torch.float64)
    target = torch.randint(0, 3, (6, 4, 4), generator=g)
    target[2] = 255
    acc = CalibrationAccumulator(num_classes=3, ignore_index=255)
    for i in range(6):
        acc.update(logits[i:i + 1], target[i:i + 1])  # includes a batch with every pixel ignored
    assert_same(acc.compute(), calibration_metrics(logits, target, ignore_index=255))

    z = torch.randn(500, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (500,), generator=g)
    binary = CalibrationAccumulator(task="binary")
    binary.update(z[:200], y[:200]).update(z[200:], y[200:])
    assert binary.num_classes == 2
    assert_same(binary.compute(), calibration_metrics(z, y, task="binary"))


def test_state_is_bins_by_classes_without_kept_confidences():
    z, y = make_data(3000, 40, seed=4)
    acc = CalibrationAccumulator(num_classes=40, n_bins=10, keep_confidences=False)
    for a in range(0, 3000, 500):
        acc.update(z[a:a + 500], y[a:a + 500])
    st = acc.state
    assert st.conf_points == [] and st.acc_points == []
    assert sum(t.numel() for t in st.sum_tensors()) == 4 * 10 + 5 + 3 * 40 * 10
    assert all(t.dtype == torch.float64 for t in st.sum_tensors())
    got = acc.compute()
    assert "aece" not in got
    want = calibration_metrics(z, y, n_bins=10)
    assert_same(got, {k: v for k, v in want.items() if k != "aece"})
    with pytest.raises(ValueError, match="keep_confidences=False"):
        acc.compute(smooth=True)


def test_failed_update_leaves_the_state_untouched():
    z, y = make_data(400, 4, seed=5)
    acc = CalibrationAccumulator(num_classes=4).update(z[:200], y[:200])
    before = acc.compute()
    # 70000 x 4 values span two blocks; only the second one is bad, and the first must not be kept either
    bad = torch.randn(70000, 4, dtype=torch.float64)
    bad[-1, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        acc.update(bad, torch.zeros(70000, dtype=torch.long))
    with pytest.raises(ValueError, match="label out of range"):
        acc.update(z[200:], y[200:] + 4)
    with pytest.raises(ValueError, match="num_classes=4"):
        acc.update(torch.randn(3, 5), torch.zeros(3, dtype=torch.long))
    assert_same(acc.compute(), before, 0.0)


def test_state_dict_round_trip_and_reset():
    z, y = make_data(300, 6, seed=6)
    acc = CalibrationAccumulator(num_classes=6).update(z, y)
    restored = CalibrationAccumulator(num_classes=6).load_state_dict(acc.state_dict())
    assert_same(restored.compute(smooth=True), acc.compute(smooth=True), 0.0)
    earlier = {k: v for k, v in acc.state_dict().items() if k != "acc_sq_sum"}  # saved before the debiased CE
    assert CalibrationAccumulator(num_classes=6).load_state_dict(earlier).compute() == acc.compute()  # hard labels
    broken = acc.state_dict()
    del broken["cw_count"]
    with pytest.raises(ValueError, match="cw_count"):
        CalibrationAccumulator(num_classes=6).load_state_dict(broken)
    acc.reset()
    assert acc.num_samples == 0
    with pytest.raises(ValueError, match="no samples"):
        acc.compute()


def test_merge_rejects_incompatible_accumulators():
    z, y = make_data(50, 3, seed=7)
    a = CalibrationAccumulator(n_bins=15).update(z, y)
    with pytest.raises(ValueError, match="n_bins"):
        a.merge(CalibrationAccumulator(n_bins=10).update(z, y))
    with pytest.raises(ValueError, match="input_type"):
        a.merge(CalibrationAccumulator(input_type="probs"))
    with pytest.raises(ValueError, match="different statistics"):
        a.merge(CalibrationAccumulator(classwise=False).update(z, y))
    with pytest.raises(ValueError, match="num_classes is unknown"):
        CalibrationAccumulator().state  # noqa: B018


def test_sync_through_accelerate_single_process():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    z, y = make_data(700, 5, seed=8)
    acc = CalibrationAccumulator(num_classes=5)
    acc.update(z[:350], y[:350]).update(z[350:], y[350:])
    acc.sync(accelerator)  # one process: the global state is the local one
    assert_same(acc.compute(smooth=True), calibration_metrics(z, y, smooth=True))
    with pytest.raises(ValueError, match="already called"):
        acc.sync(accelerator)
    # a process that saw no batch still syncs when num_classes is known
    empty = CalibrationAccumulator(num_classes=5).sync(accelerator)
    assert empty.num_samples == 0 and isinstance(empty.state, CalibrationState)


def test_sync_across_two_gloo_processes(tmp_path):
    """2 processes with uneven shares, synced: the same metrics as one pass over all rows (adaptive and smooth ECE
    included, which need the gathered per-sample confidences)."""
    import json

    from accumulator_sync_worker import shared_data
    from gloo_launch import SCRIPTS, launch_two_processes

    launch_two_processes(SCRIPTS / "accumulator_sync_worker.py", tmp_path / "synced.json")
    synced = json.loads((tmp_path / "synced.json").read_text())
    assert synced["num_processes"] == 2
    z, y = shared_data()
    one = calibration_metrics(z, y, smooth=True)
    assert set(synced["metrics"]) == set(one)
    for key, value in one.items():
        assert synced["metrics"][key] == pytest.approx(value, abs=1e-6), key

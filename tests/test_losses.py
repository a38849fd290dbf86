"""Calibration losses: hand-worked values, gradient checks, dense / ignore_index / soft-target forms, finiteness at
logits of magnitude 1e4, stateful hooks with state save/restore, registry behaviour and spec defaults."""
import math

import pytest
import torch
import torch.nn.functional as F

from timm_csm.losses import create_loss, list_losses, register_loss
from timm_csm.losses import registry as loss_registry

LN2 = math.log(2.0)
# p = softmax(P_LOGITS) = [1/8, 1/8, 1/4, 1/2]
P_LOGITS = torch.log(torch.tensor([[1.0, 1.0, 2.0, 4.0]], dtype=torch.float64))
# p = [1/8, 1/8, 1/8, 5/8]
Q_LOGITS = torch.log(torch.tensor([[1.0, 1.0, 1.0, 5.0]], dtype=torch.float64))

MULTICLASS_PLAIN = ["ce", "ls", "focal", "flsd53", "adafocal", "brier", "mmce", "mdca", "entropy_penalty",
                    "l1_penalty", "mbls", "acls", "cals"]
BINARY = ["bce", "ls_bce", "focal_bce", "aslp_bce"]
CSM_NAMES = ["csm", "csm_soft_ce", "csm_soft_focal"]
MIXED = ["mrl", "mndcg"]


def t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def soft_rows(n, c, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, c, generator=g, dtype=dtype) * 2, dim=1)


def call(loss, logits, target, **extra):
    """Invoke any registered loss with a matching batch built from (logits, target)."""
    if loss.is_csm:
        gen = extra.get("logits_gen", logits.flip(0) * 0.5)
        q = extra.get("q_gen", soft_rows(gen.shape[0], gen.shape[1], 7, gen.dtype))
        return loss(logits, target, gen, q)
    if loss.needs_mixed:
        mixed = extra.get("logits_mixed", torch.cat([logits.flip(0) * 0.7, logits.roll(1, 0) * 0.3]))
        q = extra.get("target_mixed", soft_rows(mixed.shape[0], mixed.shape[1], 8, mixed.dtype))
        return loss(logits, target, mixed, q)
    if loss.needs_index:
        return loss(logits, target, index=extra.get("index", torch.arange(logits.shape[0])))
    if loss.needs_teacher:  # a fixed teacher, independent of the logits a gradient check perturbs
        teacher = torch.linspace(-2.0, 2.0, logits.numel(), dtype=logits.dtype).reshape(logits.shape)
        return loss(logits, target, extra.get("teacher_logits", teacher))
    return loss(logits, target)


# ---------------------------------------------------------------------------------------------------------------
# registry


def test_registry_lists_every_loss_of_the_issue():
    names = set(list_losses())
    expected = set(MULTICLASS_PLAIN + BINARY + CSM_NAMES + MIXED + ["aslp"])
    assert expected <= names
    assert list_losses("csm*") == ["csm", "csm_soft_ce", "csm_soft_focal"]
    assert list_losses() == sorted(list_losses())


def test_unknown_loss_lists_known_names():
    with pytest.raises(ValueError) as err:
        create_loss("no_such_loss")
    message = str(err.value)
    assert "no_such_loss" in message and "mbls" in message and "csm_soft_focal" in message


def test_bad_kwargs_name_the_loss():
    with pytest.raises(TypeError, match="create_loss\\('focal'"):
        create_loss("focal", margin=3)


def test_register_duplicate_and_overwrite():
    name = "test_registry_tmp_loss"
    with loss_registry.LOSSES.restored():
        @register_loss(name)
        class Tmp(torch.nn.Module):
            def forward(self, logits, target):
                return logits.sum() * 0

        assert isinstance(create_loss(name), Tmp)
        with pytest.raises(ValueError, match="already registered"):
            register_loss(name, lambda: torch.nn.Identity())
        register_loss(name, torch.nn.Identity, overwrite=True)
        assert isinstance(create_loss(name), torch.nn.Identity)
    assert name not in list_losses()  # restored
    with pytest.raises(ValueError):
        register_loss("", torch.nn.Identity)


def test_defaults_match_spec():
    assert create_loss("ls").smoothing == 0.05
    assert create_loss("focal").gamma == 3.0
    flsd = create_loss("flsd53")
    assert flsd.gamma == 3.0 and flsd.schedule == ((0.2, 5.0), (0.5, 3.0))
    ada = create_loss("adafocal")
    assert (ada.n_bins, ada.lam, ada.switch, ada.gamma_max, ada.gamma_min) == (15, 1.0, 0.2, 20.0, -2.0)
    assert torch.all(ada.bin_gamma == 1.0)
    mmce = create_loss("mmce")
    assert (mmce.lam, mmce.weighted, mmce.kernel_width) == (1.0, False, 0.4)
    mdca = create_loss("mdca")
    assert (mdca.beta, mdca.base, mdca.smoothing, mdca.gamma) == (1.0, "ce", 0.1, 1.0)
    ecp = create_loss("entropy_penalty")
    assert (ecp.alpha, ecp.class_mean) == (0.1, True)
    assert create_loss("l1_penalty").alpha == 1.0
    mbls = create_loss("mbls")
    assert (mbls.margin, mbls.alpha) == (10.0, 0.1)
    acls = create_loss("acls")
    assert (acls.pos_lambda, acls.neg_lambda, acls.alpha, acls.margin) == (1.0, 0.1, 0.1, 10.0)
    assert not acls.regularize_ignored
    cals = create_loss("cals")
    assert (cals.margin, cals.penalty, cals.lambd_min, cals.lambd_max, cals.rho_max, cals.rho_step, cals.gamma,
            cals.tau, cals.normalize) == (10.0, "phr", 1e-6, 1e6, 10.0, 10, 1.2, 0.9, True)
    assert (cals.rho_init, cals.class_sum, cals.rho_update, cals.regularize_ignored) == (1.0, False, "class", False)
    assert torch.equal(create_loss("cals", num_classes=3).rho, torch.ones(3))
    bce_aslp = create_loss("aslp_bce")
    assert (bce_aslp.beta, bce_aslp.lr, bce_aslp.lam, bce_aslp.warmup_epochs) == (2.0, 0.002, 2000.0, 5)
    mrl = create_loss("mrl")
    assert (mrl.margin, mrl.alpha, mrl.mask) == (2.0, 0.1, "row") and mrl.needs_mixed
    assert create_loss("mndcg").alpha == 0.1 and create_loss("mndcg").needs_mixed
    csm = create_loss("csm")
    assert (csm.kind, csm.weight) == ("l2", 1.0) and csm.is_csm
    assert create_loss("csm_soft_ce").kind == "soft_ce"
    soft_focal = create_loss("csm_soft_focal")
    assert (soft_focal.kind, soft_focal.gamma) == ("soft_focal", 1.0)
    assert create_loss("aslp").needs_index and create_loss("aslp_bce").needs_index
    assert not create_loss("ce").needs_index and not create_loss("ce").needs_mixed and not create_loss("ce").is_csm


# ---------------------------------------------------------------------------------------------------------------
# hand-worked values


def test_cross_entropy_and_label_smoothing_values():
    y = torch.tensor([3])
    assert create_loss("ce")(P_LOGITS, y).item() == pytest.approx(LN2, abs=1e-12)
    # 0.9 ln2 + 0.1 * mean(3, 3, 2, 1) ln2
    assert create_loss("ls", smoothing=0.1)(P_LOGITS, y).item() == pytest.approx(1.125 * LN2, abs=1e-12)


def test_ce_and_ls_match_torch():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 5, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (6, 3), generator=g)
    y[0, 1] = -100
    assert torch.allclose(create_loss("ce")(z, y), F.cross_entropy(z, y))
    assert torch.allclose(create_loss("ls", smoothing=0.2)(z, y), F.cross_entropy(z, y, label_smoothing=0.2))
    soft = soft_rows(6, 5, 3)
    zz = z[..., 0]
    assert torch.allclose(create_loss("ce")(zz, soft), F.cross_entropy(zz, soft))
    assert torch.allclose(create_loss("ce", reduction="sum")(zz, soft), F.cross_entropy(zz, soft, reduction="sum"))


def test_focal_and_flsd_values():
    logits = torch.cat([P_LOGITS, P_LOGITS, P_LOGITS])
    y = torch.tensor([3, 0, 2])  # p_t = 1/2, 1/8, 1/4
    assert create_loss("focal")(P_LOGITS, y[:1]).item() == pytest.approx(LN2 / 8, abs=1e-12)
    flsd53 = ((0.5 ** 3) * LN2 + (7 / 8) ** 5 * 3 * LN2 + (3 / 4) ** 3 * 2 * LN2) / 3  # gammas 3, 5, 3
    assert create_loss("flsd53")(logits, y).item() == pytest.approx(flsd53, abs=1e-12)
    flsd52 = ((0.5 ** 2) * LN2 + (7 / 8) ** 5 * 3 * LN2 + (3 / 4) ** 3 * 2 * LN2) / 3  # gammas 2, 5, 3
    assert create_loss("flsd53", gamma=2.0)(logits, y).item() == pytest.approx(flsd52, abs=1e-12)


def test_brier_value():
    assert create_loss("brier")(P_LOGITS, torch.tensor([3])).item() == pytest.approx(11 / 32, abs=1e-12)


def test_mmce_values():
    logits = torch.cat([P_LOGITS, Q_LOGITS])
    y = torch.tensor([3, 0])  # A correct with r = 1/2, B wrong with r = 5/8
    ce = (LN2 + 3 * LN2) / 2
    k = math.exp(-0.125 / 0.4)
    unweighted = (0.25 + 0.390625 + 2 * 0.5 * (-0.625) * k) / 4
    assert create_loss("mmce")(logits, y).item() == pytest.approx(ce + unweighted, abs=1e-12)
    weighted = math.sqrt(0.25 + 0.390625 - 2 * 0.5 * 0.625 * k + 1e-10)
    assert create_loss("mmce", weighted=True, lam=2.0)(logits, y).item() == pytest.approx(ce + 2 * weighted,
                                                                                          abs=1e-12)
    # all correct: the weighted MMCE vanishes
    assert create_loss("mmce", weighted=True)(logits, torch.tensor([3, 3])).item() == pytest.approx(
        (LN2 + math.log(8 / 5)) / 2, abs=1e-12)


def test_mdca_value():
    logits = torch.cat([P_LOGITS, Q_LOGITS])
    y = torch.tensor([3, 0])
    # mean p = [2, 2, 3, 9] / 16, class frequencies [1/2, 0, 0, 1/2]
    reg = (0.375 + 0.125 + 0.1875 + 0.0625) / 4
    assert create_loss("mdca")(logits, y).item() == pytest.approx(2 * LN2 + reg, abs=1e-12)


def test_penalty_values():
    y = torch.tensor([3])
    entropy = 1.75 * LN2
    assert create_loss("entropy_penalty")(P_LOGITS, y).item() == pytest.approx(LN2 - 0.1 * entropy / 4, abs=1e-12)
    assert create_loss("entropy_penalty", class_mean=False)(P_LOGITS, y).item() == pytest.approx(
        LN2 - 0.1 * entropy, abs=1e-12)
    assert create_loss("l1_penalty")(P_LOGITS, y).item() == pytest.approx(LN2 + 0.5, abs=1e-12)
    assert create_loss("l1_penalty", space="logits", alpha=0.5)(P_LOGITS, y).item() == pytest.approx(
        LN2 + 0.5 * 1.25 * LN2, abs=1e-12)


MARGIN_LOGITS = t([[0.0, 3.0, 5.0, 12.0]])
MARGIN_CE = torch.logsumexp(MARGIN_LOGITS, 1).item() - 12.0  # target 3


def test_mbls_value():
    y = torch.tensor([3])
    assert create_loss("mbls", margin=4)(MARGIN_LOGITS, y).item() == pytest.approx(MARGIN_CE + 0.1 * 4, abs=1e-12)
    # default margin 10: only the gap of 12 exceeds it, (2 + 0 + 0 + 0) / 4
    assert create_loss("mbls")(MARGIN_LOGITS, y).item() == pytest.approx(MARGIN_CE + 0.1 * 0.5, abs=1e-12)


def test_acls_value():
    y = torch.tensor([3])
    reg = 1.0 * 8 ** 2 + 0.1 * (8 ** 2 + 5 ** 2 + 3 ** 2) / 3
    assert create_loss("acls", margin=4)(MARGIN_LOGITS, y).item() == pytest.approx(MARGIN_CE + 0.1 * reg, abs=1e-10)
    reg10 = 1.0 * 2 ** 2 + 0.1 * 2 ** 2 / 3
    assert create_loss("acls")(MARGIN_LOGITS, y).item() == pytest.approx(MARGIN_CE + 0.1 * reg10, abs=1e-10)


def test_acls_counts_tied_maxima_as_positives():
    z = t([[12.0, 12.0, 0.0, 3.0]])
    ce = torch.logsumexp(z, 1).item() - 12.0
    reg = 1.0 * 2 * 8 ** 2 + 0.1 * (8 ** 2 + 5 ** 2) / 3
    assert create_loss("acls", margin=4)(z, torch.tensor([0])).item() == pytest.approx(ce + 0.1 * reg, abs=1e-10)


@pytest.mark.parametrize("penalty", ["p2", "p3", "phr"])
def test_cals_penalty_functions(penalty):
    from timm_csm.losses.margin import augmented_lagrangian_penalty

    lam, rho = 0.5, 2.0
    h = t([-1.0, -0.1, 0.0, 0.3, 1.5])
    value, grad = augmented_lagrangian_penalty(h, t(lam), t(rho), penalty)
    for v, g, x in zip(value.tolist(), grad.tolist(), h.tolist()):
        if penalty == "phr":
            s = lam + rho * x
            want = ((s * s - lam * lam) / (2 * rho) if s >= 0 else -lam * lam / (2 * rho), max(s, 0.0))
        elif x >= 0:
            cubic = rho ** 2 * x ** 3 / 6 if penalty == "p2" else 0.0
            dcubic = rho ** 2 * x ** 2 / 2 if penalty == "p2" else 0.0
            want = (lam * x + lam * rho * x * x + cubic, lam + 2 * lam * rho * x + dcubic)
        else:
            want = (lam * x / (1 - rho * x), lam / (1 - rho * x) ** 2)
        assert (v, g) == pytest.approx(want, abs=1e-12)
    # the loss averages the penalty over all N * K entries (class_sum=True: sums over classes), whichever penalty
    for class_sum, scale in ((False, 1 / 4), (True, 1.0)):
        loss = create_loss("cals", margin=4, penalty=penalty, class_sum=class_sum)
        loss.lambd = torch.full((4,), lam)
        loss.rho = torch.full((4,), rho)
        hs = t([2.0, 1.25, 0.75, -1.0])
        total = augmented_lagrangian_penalty(hs, t([lam] * 4), t(rho), penalty)[0].sum().item()
        assert loss(MARGIN_LOGITS, torch.tensor([3])).item() == pytest.approx(MARGIN_CE + scale * total, abs=1e-6)


def test_acls_negative_term_treats_max_as_constant():
    z = MARGIN_LOGITS.clone().requires_grad_()
    create_loss("acls", margin=4, pos_lambda=0.0, alpha=1.0)(z, torch.tensor([3])).backward()
    ce_grad = torch.softmax(MARGIN_LOGITS, 1)[0] - t([0, 0, 0, 1.0])
    gaps = 12.0 - MARGIN_LOGITS[0] - 4.0
    reg_grad = -2 * 0.1 * gaps.clamp_min(0) / 3
    reg_grad[3] = 0.0  # the (detached) max gets no gradient from the negative term
    assert torch.allclose(z.grad[0], ce_grad + reg_grad)


def test_cals_value_and_multiplier_update():
    y = torch.tensor([3])
    loss = create_loss("cals", margin=4)
    lam = 1e-6
    h = [2.0, 1.25, 0.75, -1.0]  # (d - 4) / 4 for d = 12, 9, 7, 0
    phr = [((lam + v) ** 2 - lam ** 2) / 2 if lam + v >= 0 else -lam ** 2 / 2 for v in h]
    assert loss(MARGIN_LOGITS, y).item() == pytest.approx(MARGIN_CE + sum(phr) / 4, abs=1e-7)
    loss.on_epoch_end(MARGIN_LOGITS, y)
    expected = torch.tensor([2.0 + lam, 1.25 + lam, 0.75 + lam, lam])
    assert torch.allclose(loss.lambd.double(), expected.double(), rtol=1e-6, atol=1e-9)
    assert int(loss.epoch) == 1 and torch.equal(loss.rho, torch.ones(4))


def test_cals_scalar_rho_grows_when_the_penalty_does_not_drop():
    loss = create_loss("cals", margin=4, rho_step=1, rho_update="scalar")
    y = torch.tensor([3])
    loss.on_epoch_end(MARGIN_LOGITS, y)  # sets the reference penalty
    assert torch.equal(loss.rho, torch.ones(4))
    loss.on_epoch_end(MARGIN_LOGITS, y)  # same logits, larger multipliers: penalty > 0.9 * previous
    assert torch.allclose(loss.rho, torch.full((4,), 1.2))  # one value shared by every class
    loss.on_epoch_end(MARGIN_LOGITS * 0, y)  # constraint satisfied: penalty <= 0, rho kept
    assert torch.allclose(loss.rho, torch.full((4,), 1.2))


def test_adafocal_initial_value_update_and_switch():
    loss = create_loss("adafocal", n_bins=2)
    y = torch.tensor([3])
    assert loss(P_LOGITS, y).item() == pytest.approx(0.5 * LN2, abs=1e-12)  # gamma 1: (1 - 1/2) ln 2
    # validation confidences 0.75, 0.8, 0.9, 0.95 (class 1 predicted), correct / wrong / correct / correct
    a = torch.log(t([3.0, 4.0, 9.0, 19.0]))
    val_logits = torch.stack([torch.zeros(4, dtype=torch.float64), a], 1)
    val_y = torch.tensor([1, 0, 1, 1])
    loss.on_epoch_end(val_logits, val_y)
    gap0 = (0.75 + 0.8 + 0.9) / 3 - 2 / 3
    gap1 = 0.95 - 1.0
    assert torch.allclose(loss.bin_edges, t([0.75, 0.9, 0.95]))
    assert torch.allclose(loss.bin_gamma, t([math.exp(gap0), math.exp(gap1)]))
    # p_t = 1/2 < 0.9 -> bin 0; p_t = 0.95 >= 0.9 -> bin 1
    assert loss(P_LOGITS, y).item() == pytest.approx(0.5 ** math.exp(gap0) * LN2, abs=1e-12)
    z = torch.log(t([[0.05, 0.95]]))
    assert loss(z, torch.tensor([1])).item() == pytest.approx(0.05 ** math.exp(gap1) * -math.log(0.95), abs=1e-12)

    switching = create_loss("adafocal", n_bins=2, lam=40.0)
    switching.on_epoch_end(val_logits, val_y)
    assert switching.bin_gamma[1].item() == pytest.approx(-0.2)  # exp(-2) < 0.2 flips to inverse focal
    # inverse focal: -(1 + p_t)^0.2 log p_t for p_t = 0.95
    assert switching(z, torch.tensor([1])).item() == pytest.approx(-(1.95 ** 0.2) * math.log(0.95), abs=1e-12)
    switching.on_epoch_end(val_logits, val_y)  # gamma <= 0 moves with exp(-lam * gap) = exp(2)
    assert switching.bin_gamma[1].item() == pytest.approx(-0.2 * math.exp(2.0))


def test_adafocal_update_matches_its_released_formula_on_random_validation_sets():
    # the update with the edges and per-bin sums written inline (np.interp-style edges, (lo, hi] bins, bincount
    # sums): the gammas agree to rounding and the bins of the validation samples are the same
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        z = 3.0 * torch.randn(500, 6, generator=g, dtype=torch.float64)
        y = torch.randint(0, 6, (500,), generator=g)
        loss = create_loss("adafocal")
        loss.on_epoch_end(z, y)
        conf, pred = torch.softmax(z, 1).max(1)
        v, n = conf.sort().values, conf.numel()
        pos = torch.linspace(0, n, 16, dtype=torch.float64)
        lo = pos.floor().clamp(max=n - 1).long()
        hi = (lo + 1).clamp(max=n - 1)
        edges = v[lo] + (pos - lo.double()).clamp(0, 1) * (v[hi] - v[lo])
        edges = torch.where(pos >= n - 1, v[-1].expand_as(edges), edges)
        index = torch.bucketize(conf, edges[1:-1], right=False)
        assert torch.equal(index, torch.bucketize(conf, loss.bin_edges[1:-1], right=False))
        count = torch.bincount(index, minlength=15).double()
        gap = (torch.bincount(index, weights=conf, minlength=15)
               - torch.bincount(index, weights=(pred == y).double(), minlength=15)) / count.clamp_min(1)
        gamma = torch.exp(gap)
        gamma = torch.where(gamma.abs() < 0.2, torch.full_like(gamma, -0.2), gamma).clamp(-2, 20)
        assert torch.allclose(loss.bin_edges, edges, rtol=1e-15, atol=0)
        assert torch.allclose(loss.bin_gamma, gamma, rtol=1e-14, atol=0)


def test_batch_all_lists_exactly_its_public_definitions():
    import inspect

    from timm_csm.losses import batch

    defined = [name for name, obj in vars(batch).items() if not name.startswith("_")
               and (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == batch.__name__]
    assert sorted(batch.__all__) == sorted(defined)


def test_aslp_value_and_updates():
    loss = create_loss("aslp", warmup_epochs=0, lr=0.01, lam=100.0)
    y = torch.tensor([3])
    ce_u = (3 + 3 + 2 + 1) * LN2 / 4
    index = torch.tensor([4])
    assert loss(P_LOGITS, y, index=index).item() == pytest.approx(LN2, abs=1e-12)  # eps starts at 0
    eps = 0.01 * (ce_u - LN2)  # ascent only: the enforcer is inactive before the first on_epoch_end
    assert loss.level.numel() >= 5 and loss.level[4].item() == pytest.approx(eps, rel=1e-6)
    assert loss.level[:4].abs().sum() == 0
    value = loss(P_LOGITS, y, index=index).item()
    assert value == pytest.approx((1 - eps) * LN2 + eps * ce_u, rel=1e-6)
    eps2 = eps + 0.01 * (ce_u - LN2)
    assert loss.level[4].item() == pytest.approx(eps2, rel=1e-6)
    loss.on_epoch_end(P_LOGITS, y)  # validation accuracy 1: the expected confidence loss eps * 3/4 is too much
    assert float(loss.val_accuracy) == 1.0
    loss(P_LOGITS, y, index=index)
    eps3 = eps2 + 0.01 * ((ce_u - LN2) + 100.0 * (0.0 - eps2 * 3 / 4))
    assert loss.level[4].item() == pytest.approx(max(eps3, 0.0), rel=1e-5)
    # eval mode: no index needed, clean targets, no update
    loss.eval()
    before = loss.level.clone()
    assert loss(P_LOGITS, y).item() == pytest.approx(LN2, abs=1e-12)
    assert torch.equal(loss.level, before)
    loss.train()
    with pytest.raises(ValueError, match="index"):
        loss(P_LOGITS, y)


def test_aslp_waits_for_warmup_epochs():
    loss = create_loss("aslp", warmup_epochs=2)
    y = torch.tensor([3])
    loss(P_LOGITS, y, index=torch.tensor([0]))
    loss.on_epoch_end(P_LOGITS, y)
    loss(P_LOGITS, y, index=torch.tensor([0]))
    assert loss.level.abs().sum() == 0
    loss.on_epoch_end(P_LOGITS, y)
    loss(P_LOGITS, y, index=torch.tensor([0]))
    assert loss.level[0] > 0


def test_binary_values():
    z = t([0.0, math.log(3.0)])
    y = t([1.0, 1.0])
    assert create_loss("bce")(z[:1], y[:1]).item() == pytest.approx(LN2, abs=1e-12)
    smooth = 0.9 + 0.05  # target 1 smoothed with eps 0.1
    expected = -(smooth * math.log(0.75) + (1 - smooth) * math.log(0.25))
    assert create_loss("ls_bce", smoothing=0.1)(z[1:], y[1:]).item() == pytest.approx(expected, abs=1e-12)
    assert create_loss("focal_bce")(z[1:], y[1:]).item() == pytest.approx(0.25 ** 3 * -math.log(0.75), abs=1e-12)
    # a negative: -(p^gamma) log(1 - p)
    assert create_loss("focal_bce", gamma=2)(z[1:], t([0.0])).item() == pytest.approx(
        0.75 ** 2 * -math.log(0.25), abs=1e-12)


def test_binary_focal_matches_torchvision():
    ops = pytest.importorskip("torchvision.ops")
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4, 1, 5, 5, generator=g, dtype=torch.float64) * 3
    y = (torch.rand(4, 1, 5, 5, generator=g) > 0.5).double()
    ours = create_loss("focal_bce", gamma=2.0, alpha=0.25)(z, y)
    theirs = ops.sigmoid_focal_loss(z, y, alpha=0.25, gamma=2.0, reduction="mean")
    assert torch.allclose(ours, theirs)


def test_aslp_bce_alpha_update():
    loss = create_loss("aslp_bce", warmup_epochs=0, lr=0.01, lam=10.0)
    z = t([[math.log(3.0), 0.0]])  # p = 0.75 and 0.5, mask [1, 0]
    y = t([[1.0, 0.0]])
    index = torch.tensor([0])
    bce = [-math.log(0.75), LN2]
    assert loss(z, y, index=index).item() == pytest.approx(sum(bce) / 2, abs=1e-12)
    entropy = [-math.log(0.75 * 0.25), -math.log(0.25)]
    ascent = sum(e - 2 * b for e, b in zip(entropy, bce)) / 2
    alpha = 0.01 * ascent / 2.0
    assert loss.level[0].item() == pytest.approx(alpha, rel=1e-6)
    # expected target y + alpha * beta * (1 - 2 y)
    shift = alpha * 2.0
    t0, t1 = 1 - shift, shift
    expected = (-(t0 * math.log(0.75) + (1 - t0) * math.log(0.25)) + LN2) / 2
    assert loss(z, y, index=index).item() == pytest.approx(expected, rel=1e-6)
    assert t1 >= 0
    loss.on_epoch_end(z, y)  # pixel accuracy: 0.75 > 0.5 right, 0.5 (z = 0) predicted 0: right
    assert float(loss.val_accuracy) == 1.0


def test_mrl_value():
    logits = t([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0]])
    y = torch.tensor([2, 0])
    mixed = t([[0.0, 2.0, 2.5], [5.0, 0.0, 0.0]])
    target_mixed = t([[0.0, 0.4, 0.6], [1.0, 0.0, 0.0]])  # the second copy mixed the same class: masked
    ce = F.cross_entropy(logits, y).item()
    expected = ce + 0.1 * (max(2.5 - 3.0 + 2.0, 0.0) + 0.0) / 2
    assert create_loss("mrl")(logits, y, mixed, target_mixed).item() == pytest.approx(expected, abs=1e-12)


def test_mndcg_value():
    logits = t([[0.0, math.log(3.0)]])  # clean confidence 3/4
    y = torch.tensor([1])
    mixed = torch.log(t([[1.0, 1.0], [1.0, 4.0]]))  # copy confidences 1/2, 4/5
    target_mixed = t([[0.3, 0.7], [0.1, 0.9]])  # relevances 0.7, 0.9 -> order: copy 2, copy 1
    d = [1.0, math.log2(3.0), 2.0]
    dcg = 0.75 / d[0] + 0.8 / d[1] + 0.5 / d[2]
    idcg = 1.0 / d[0] + 0.9 / d[1] + 0.7 / d[2]
    ndcg = dcg / idcg if idcg > dcg else idcg / dcg
    expected = -math.log(0.75) + 0.1 * (1 - ndcg)
    assert create_loss("mndcg")(logits, y, mixed, target_mixed).item() == pytest.approx(expected, abs=1e-12)


def test_csm_values():
    y = torch.tensor([3])
    q = t([[0.0, 0.0, 0.5, 0.5]])
    assert create_loss("csm")(P_LOGITS, y, P_LOGITS, q).item() == pytest.approx(LN2 + 3 / 32, abs=1e-12)
    assert create_loss("csm", weight=2.0)(P_LOGITS, y, P_LOGITS, q).item() == pytest.approx(LN2 + 6 / 32, abs=1e-12)
    assert create_loss("csm_soft_ce")(P_LOGITS, y, P_LOGITS, q).item() == pytest.approx(2.5 * LN2, abs=1e-12)
    # soft focal, gamma 1: 0.5 * (3/4) * 2 ln2 + 0.5 * (1/2) * ln2 = ln2
    assert create_loss("csm_soft_focal")(P_LOGITS, y, P_LOGITS, q).item() == pytest.approx(2 * LN2, abs=1e-12)
    # hard labels for the generated batch (ablation): Brier against one-hot
    assert create_loss("csm")(P_LOGITS, y, P_LOGITS, y).item() == pytest.approx(LN2 + 11 / 32, abs=1e-12)
    # an empty generated batch contributes nothing
    empty = torch.zeros(0, 4, dtype=torch.float64)
    assert create_loss("csm")(P_LOGITS, y, empty, empty).item() == pytest.approx(LN2, abs=1e-12)


def test_csm_rejects_mismatched_classes():
    with pytest.raises(ValueError, match="classes"):
        create_loss("csm")(P_LOGITS, torch.tensor([3]), P_LOGITS[:, :3], soft_rows(1, 3, 0))


# ---------------------------------------------------------------------------------------------------------------
# gradient checks (float64, small inputs away from kinks)

GRAD_KWARGS = {
    # ACLS stops the gradient through the max in its negative term (as released), so only the positive term is a
    # true gradient; the negative term is checked by hand in test_acls_negative_term_treats_max_as_constant
    "mbls": {"margin": 1.0}, "acls": {"margin": 1.0, "neg_lambda": 0.0}, "cals": {"margin": 1.0}, "mmce": {"lam": 1.0},
    "csm_soft_focal": {"gamma": 1.5}, "focal_bce": {"alpha": 0.3},
}


@pytest.mark.parametrize("name", sorted(set(list_losses()) - {"test_registry_tmp_loss"}))
def test_gradcheck(name):
    g = torch.Generator().manual_seed(3)
    loss = create_loss(name, **GRAD_KWARGS.get(name, {}))
    if name in BINARY:
        logits = (torch.randn(3, 4, generator=g, dtype=torch.float64) * 2).requires_grad_()
        target = (torch.rand(3, 4, generator=g) > 0.5).double()
        if loss.needs_index:
            loss.level.data = torch.tensor([0.05, 0.1, 0.2])
            loss.eval()  # no state updates between gradcheck evaluations
        assert torch.autograd.gradcheck(lambda z: call(loss, z, target), (logits,))
        return
    logits = (torch.randn(5, 4, generator=g, dtype=torch.float64) * 3).requires_grad_()
    target = torch.randint(0, 4, (5,), generator=g)
    if name == "flsd53" or name == "adafocal":
        p_t = torch.softmax(logits.detach(), 1)[torch.arange(5), target]
        assert ((p_t - 0.2).abs().min() > 1e-3) and ((p_t - 0.5).abs().min() > 1e-3)
    if name == "adafocal":
        loss.bin_gamma.copy_(torch.linspace(-1.5, 4.0, 15, dtype=torch.float64))
    if name == "cals":
        loss.on_epoch_end(logits.detach() * 1.3, target)  # non-trivial multipliers
    if name == "aslp":
        loss.level.data = torch.tensor([0.0, 0.1, 0.3, 0.2, 0.5])
        loss.eval()
        assert torch.autograd.gradcheck(lambda z: loss(z, target, index=torch.arange(5)), (logits,))
        return
    assert torch.autograd.gradcheck(lambda z: call(loss, z, target), (logits,))
    soft = soft_rows(5, 4, 11)
    if not loss.needs_mixed:
        assert torch.autograd.gradcheck(lambda z: call(loss, z, soft), (logits,))


# ---------------------------------------------------------------------------------------------------------------
# soft / dense / ignore_index forms


@pytest.mark.parametrize("name", MULTICLASS_PLAIN + CSM_NAMES + MIXED + ["aslp"])
def test_one_hot_soft_target_equals_hard(name):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 5, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 5, (6,), generator=g)
    hard = call(create_loss(name), logits, y)
    soft = call(create_loss(name), logits, F.one_hot(y, 5).double())
    assert torch.allclose(hard, soft, atol=1e-12)


@pytest.mark.parametrize("name", MULTICLASS_PLAIN + CSM_NAMES)
def test_dense_with_ignore_index_equals_flat_rows(name):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 4, (2, 3, 3), generator=g)
    y[0, 0, 0] = y[1, 2, 1] = 255
    kwargs = {"ignore_index": 255, **GRAD_KWARGS.get(name, {})}
    rows = logits.movedim(1, -1).reshape(-1, 4)
    flat_y = y.reshape(-1)
    keep = flat_y != 255
    if name in CSM_NAMES:
        gen = torch.randn(2, 4, 2, 2, generator=g, dtype=torch.float64)
        q = torch.softmax(torch.randn(2, 4, 2, 2, generator=g, dtype=torch.float64), dim=1)
        dense = create_loss(name, **kwargs)(logits, y, gen, q)
        flat = create_loss(name, **kwargs)(rows[keep], flat_y[keep], gen.movedim(1, -1).reshape(-1, 4),
                                           q.movedim(1, -1).reshape(-1, 4))
    else:
        dense = call(create_loss(name, **kwargs), logits, y)
        flat = call(create_loss(name, **kwargs), rows[keep], flat_y[keep])
    assert torch.allclose(dense, flat, atol=1e-12)



def _reference_margin_loss(name, z, y, margin):
    """MbLS / ACLS written as plain autograd expressions over the kept rows (the hand-written backward of the
    registered losses must give the same value and gradient)."""
    keep = y != -100
    z, y = z[keep], y[keep]
    ce = F.cross_entropy(z, y) if len(y) else z.sum() * 0.0
    z_max = z.max(dim=1, keepdim=True).values
    if name == "mbls":
        return ce + 0.1 * ((z_max - margin) - z).clamp_min(0.0).mean()
    ties = (z.detach() == z_max.detach()).sum(dim=1, keepdim=True)
    pos = (z_max - margin).clamp_min(0.0).square() * ties
    neg = ((z_max.detach() - margin) - z).clamp_min(0.0).square().sum(dim=1, keepdim=True) / (z.shape[1] - 1)
    return ce + 0.1 * (pos.mean() + 0.1 * neg.mean())


@pytest.mark.parametrize("name", ["mbls", "acls"])
@pytest.mark.parametrize("ignored", [False, True])
def test_margin_losses_match_their_autograd_form(name, ignored):
    g = torch.Generator().manual_seed(11)
    base = torch.randn(7, 6, generator=g, dtype=torch.float64) * 6
    base[2, 4] = base[2, 1] = base[2].max() + 1.0  # tied maxima
    y = torch.randint(0, 6, (7,), generator=g)
    if ignored:
        y[[0, 5]] = -100
    grads = []
    for form in ("registered", "reference"):
        z = base.clone().requires_grad_()
        value = create_loss(name, margin=3.0)(z, y) if form == "registered" else _reference_margin_loss(
            name, z, y, 3.0)
        value.backward()
        grads.append((value.detach(), z.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_brier_reduced_inside_its_function_matches_its_rows(reduction):
    g = torch.Generator().manual_seed(12)
    base = torch.randn(5, 4, generator=g, dtype=torch.float64) * 2
    q = soft_rows(5, 4, 13)
    results = []
    for reduced in (True, False):
        z, target = base.clone().requires_grad_(), q.clone().requires_grad_()
        if reduced:
            value = create_loss("brier", reduction=reduction)(z, target)
        else:
            rows = create_loss("brier", reduction="none")(z, target)
            value = rows.mean() if reduction == "mean" else rows.sum()
        value.backward()
        results.append((value.detach(), z.grad, target.grad))
    for ours, plain in zip(*results):
        torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-12)

def test_dense_soft_targets_and_reduction_none():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64)
    soft = torch.softmax(torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64), dim=1)
    per_pixel = create_loss("focal", reduction="none")(logits, soft)
    assert per_pixel.shape == (2, 4, 4)
    rows = create_loss("focal", reduction="none")(logits.movedim(1, -1).reshape(-1, 3),
                                                  soft.movedim(1, -1).reshape(-1, 3))
    assert torch.allclose(per_pixel.reshape(-1), rows)
    y = soft.argmax(1)
    y[0, 0, 0] = -100
    none = create_loss("ce", reduction="none")(logits, y)
    assert none[0, 0, 0] == 0 and none.shape == (2, 4, 4)
    assert torch.allclose(create_loss("ce", reduction="sum")(logits, y), none.sum())


def test_all_ignored_batch_gives_zero_not_nan():
    logits = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.full((3,), -100)
    for name in MULTICLASS_PLAIN:
        value = create_loss(name)(logits, y)
        assert value.item() == 0.0, name


def test_aslp_dense_uses_one_level_per_image():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 3, 2, 2, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (2, 2, 2), generator=g)
    y[1, 0, 0] = -100
    dense = create_loss("aslp", warmup_epochs=0)
    flat = create_loss("aslp", warmup_epochs=0)
    rows = logits.movedim(1, -1).reshape(-1, 3)
    keep = y.reshape(-1) != -100
    dense.level = torch.tensor([0.1, 0.3])
    flat.level = torch.tensor([0.1, 0.3])
    pixel_index = torch.arange(2).repeat_interleave(4)
    flat.eval()
    dense.eval()
    a = dense(logits, y, index=torch.tensor([0, 1]))
    b = flat(rows[keep], y.reshape(-1)[keep], index=pixel_index[keep])
    assert torch.allclose(a, b)


def test_binary_dense_with_channel_dim_and_ignore():
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(2, 1, 3, 3, generator=g, dtype=torch.float64)
    y = (torch.rand(2, 3, 3, generator=g) > 0.5).long()
    y[0, 1, 1] = 255
    keep = y != 255
    for name in ("bce", "ls_bce", "focal_bce"):
        dense = create_loss(name, ignore_index=255)(logits, y)
        flat = create_loss(name)(logits[:, 0][keep], y[keep].double())
        assert torch.allclose(dense, flat)
    bce = create_loss("bce", ignore_index=255)(logits, y)
    reference = F.binary_cross_entropy_with_logits(logits[:, 0][keep], y[keep].double())
    assert torch.allclose(bce, reference)


# ---------------------------------------------------------------------------------------------------------------
# finiteness at extreme logits


@pytest.mark.parametrize("name", sorted(set(list_losses()) - {"test_registry_tmp_loss"}))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_at_logits_1e4(name, dtype):
    g = torch.Generator().manual_seed(9)
    logits = (torch.randn(6, 5, generator=g, dtype=dtype).sign() * 1e4
              + torch.randn(6, 5, generator=g, dtype=dtype)).requires_grad_()
    loss = create_loss(name)
    if name in BINARY:
        target = (torch.rand(6, 5, generator=g) > 0.5).to(dtype)
        if loss.needs_index:
            loss.warmup_epochs = 0
            loss.on_epoch_end(logits.detach(), target)
    else:
        target = torch.randint(0, 5, (6,), generator=g)
        if hasattr(loss, "on_epoch_end"):
            if name == "aslp":
                loss.warmup_epochs = 0
            loss.on_epoch_end(logits.detach(), target)
        if name == "adafocal":
            loss.bin_gamma.copy_(torch.linspace(-2.0, 0.5, 15, dtype=torch.float64))  # inverse and 0 < gamma < 1
    value = call(loss, logits, target,
                 logits_gen=-logits.detach().clone().requires_grad_(), logits_mixed=torch.cat([logits, -logits]))
    value.backward()
    assert torch.isfinite(value), f"{name}: {value}"
    assert torch.isfinite(logits.grad).all(), name
    if not loss.needs_mixed and name not in BINARY and not loss.is_csm:
        soft = soft_rows(6, 5, 10, dtype)
        logits.grad = None
        value = call(loss, logits, soft)
        value.backward()
        assert torch.isfinite(value) and torch.isfinite(logits.grad).all(), name


# ---------------------------------------------------------------------------------------------------------------
# state save / restore


def _trained_state(name):
    g = torch.Generator().manual_seed(12)
    loss = create_loss(name, **({"warmup_epochs": 0} if name.startswith("aslp") else {}))
    if name == "aslp_bce":
        logits = torch.randn(6, 8, generator=g, dtype=torch.float64)
        y = (torch.rand(6, 8, generator=g) > 0.5).double()
    else:
        logits = torch.randn(40, 5, generator=g, dtype=torch.float64) * 4
        y = torch.randint(0, 5, (40,), generator=g)
    for _ in range(3):
        call(loss, logits, y, index=torch.arange(logits.shape[0]) * 3)
        loss.on_epoch_end(logits * 1.5, y)
    return loss, logits, y


@pytest.mark.parametrize("name", ["adafocal", "cals", "aslp", "aslp_bce"])
def test_state_dict_round_trip(name):
    loss, logits, y = _trained_state(name)
    state = loss.state_dict()
    assert state, name
    fresh = create_loss(name, **({"warmup_epochs": 0} if name.startswith("aslp") else {}))
    fresh.load_state_dict(state)
    for key, value in state.items():
        torch.testing.assert_close(fresh.state_dict()[key], value, rtol=0, atol=0, equal_nan=True, msg=key)
    loss.eval()
    fresh.eval()
    index = torch.arange(logits.shape[0]) * 3
    assert torch.equal(call(loss, logits, y, index=index), call(fresh, logits, y, index=index))
    # the state really moved away from its initial value
    changed = {"adafocal": "bin_gamma", "cals": "lambd", "aslp": "level", "aslp_bce": "level"}[name]
    initial = {"adafocal": 1.0, "cals": 1e-6, "aslp": 0.0, "aslp_bce": 0.0}[name]
    assert (state[changed].double() - initial).abs().max() > 1e-5


# ---------------------------------------------------------------------------------------------------------------
# input validation


def test_validation_errors():
    ce = create_loss("ce")
    z = torch.randn(3, 4)
    with pytest.raises(ValueError, match="out of range"):
        ce(z, torch.tensor([0, 4, 1]))
    with pytest.raises(ValueError, match="sum to 1"):
        ce(z, torch.full((3, 4), 0.5))
    with pytest.raises(ValueError, match="NaN"):
        ce(torch.full((3, 4), float("nan")), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="does not match"):
        ce(z, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="binary"):
        ce(torch.randn(3, 1), torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="reduction"):
        create_loss("focal", reduction="avg")
    with pytest.raises(ValueError, match="gamma"):
        create_loss("focal", gamma=-1)
    with pytest.raises(ValueError, match="multiple"):
        create_loss("mrl")(z, torch.tensor([0, 1, 2]), torch.randn(4, 4), soft_rows(4, 4, 0, torch.float32))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        create_loss("bce")(z, torch.full((3, 4), 2.0))
    assert ce.__class__(validate=False)(z, torch.tensor([0, 1, 2])).isfinite()


def test_checked_numbers_read_in_one_stack_match_the_cpu_reads():
    """An accelerator reads the checked numbers in one stacked copy; the CPU reads them one by one. Both give the
    same Python numbers (the stack is exact for integer labels)."""
    from timm_csm.losses import batch

    values = (torch.tensor(1.5), torch.tensor(2 ** 40 + 3), torch.tensor(-7, dtype=torch.int32),
              torch.tensor(float("nan"), dtype=torch.bfloat16))
    cpu = batch._host_values(*values)
    stacked = batch._stacked_values(values)
    assert cpu[:3] == stacked[:3] == [1.5, 2 ** 40 + 3, -7]
    assert math.isnan(cpu[3]) and math.isnan(stacked[3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_soft_target_errors_name_the_problem(dtype):
    """The soft-target check reads a few numbers on the fast path; a failing batch must still get the message that
    names its problem, in this order."""
    ce = create_loss("ce")
    z = torch.randn(3, 4, dtype=dtype)
    good = soft_rows(3, 4, 1, dtype)
    ce(z, good)  # passes
    cases = [
        (torch.full((3, 4), float("inf"), dtype=dtype), good, "logits contain NaN"),
        (z, good.clone().index_put_((torch.tensor(1), torch.tensor(2)), torch.tensor(float("nan"), dtype=dtype)),
         "soft target contains NaN"),
        (z, good.clone().index_put_((torch.tensor(0), torch.tensor(0)), torch.tensor(float("inf"), dtype=dtype)),
         "soft target contains NaN"),
        (z, torch.tensor([[1.5, -0.5, 0.0, 0.0]] * 3, dtype=dtype), "negative entries"),
        (z, good * 1.1, "sum to 1"),
    ]
    for logits, target, message in cases:
        with pytest.raises(ValueError, match=message):
            ce(logits, target)
    # an empty batch is checked for its logits only
    assert create_loss("brier")(torch.zeros(0, 4, dtype=dtype), torch.zeros(0, 4, dtype=dtype)).item() == 0.0


def test_aslp_levels_sync_across_two_gloo_processes(tmp_path):
    """Each of 2 processes updates the levels of its samples (sample 0 on both); after the per-epoch sync every
    process holds the table a single process computes over all samples."""
    import json

    from aslp_sync_worker import new_loss, run_epochs, NUM_SAMPLES
    from gloo_launch import SCRIPTS, launch_two_processes

    launch_two_processes(SCRIPTS / "aslp_sync_worker.py", tmp_path / "levels")
    tables = [json.loads((tmp_path / f"levels.{rank}.json").read_text()) for rank in (0, 1)]
    assert [t["world"] for t in tables] == [2, 2]
    expected = run_epochs(new_loss(), lambda epoch: torch.arange(NUM_SAMPLES))
    assert (expected > 0).sum() >= NUM_SAMPLES // 4  # the levels moved, so the comparison means something
    for t in tables:
        assert torch.tensor(t["level"]) == pytest.approx(expected, abs=1e-6)


def test_aslp_sync_is_a_no_op_on_one_process():
    from accelerate import Accelerator

    loss = create_loss("aslp", num_samples=6, warmup_epochs=0, lr=0.1)
    loss(torch.randn(3, 4) * 3, torch.tensor([0, 1, 2]), index=torch.tensor([0, 2, 4]))
    before = loss.level.clone()
    assert loss.touched.tolist() == [True, False, True, False, True, False]
    loss.sync(Accelerator(cpu=True))
    assert torch.equal(loss.level, before) and not loss.touched.any()
    assert "touched" not in loss.state_dict()


# ---------------------------------------------------------------------------------------------------------------
# parity with the authors' released code: each reference below is re-derived entry by entry from the released
# formula (plain Python loops), independently of the package's vectorised code


def _phr(h, lambd, rho):
    x = lambd + rho * h
    return ((x * x - lambd * lambd) / (2 * rho) if x >= 0 else -lambd * lambd / (2 * rho)), max(x, 0.0)


def _released_cals_penalty(z, lambd, rho, margin):
    """AugLagrangianClass.get: mean over every (sample, class) entry of PHR(h; lambda_k, rho_k)."""
    rows = z.tolist()
    total = 0.0
    for row in rows:
        top = max(row)
        for k, value in enumerate(row):
            total += _phr((top - value - margin) / margin, lambd[k], rho[k])[0]
    return total / (len(rows) * len(rows[0]))


def _released_cals_epoch(z, lambd, rho, prev, epoch, margin, rho_step, gamma, tau, rho_min=1.0, rho_max=10.0,
                         lambd_min=1e-6, lambd_max=1e6):
    """update_lambd over the validation rows, then set_lambd and update_rho at the end of 0-based ``epoch``."""
    rows = z.tolist()
    n, k = len(rows), len(rows[0])
    grad_sum, h_sum = [0.0] * k, [0.0] * k
    for row in rows:
        top = max(row)
        for c in range(k):
            h = (top - row[c] - margin) / margin
            grad_sum[c] += min(max(_phr(h, lambd[c], rho[c])[1], lambd_min), lambd_max)
            h_sum[c] += h
    new_lambd = [min(max(g / n, lambd_min), lambd_max) for g in grad_sum]
    current = [v / n for v in h_sum]
    new_rho = list(rho)
    if (epoch + 1) % rho_step == 0 and prev is not None:
        new_rho = [min(max(gamma * r if cur > max(p, 0.0) * tau else r, rho_min), rho_max)
                   for r, cur, p in zip(rho, current, prev)]
    return new_lambd, new_rho, current


def test_cals_matches_the_released_class_over_epochs():
    g = torch.Generator().manual_seed(21)
    margin, rho_step, gamma = 2.0, 2, 1.5
    loss = create_loss("cals", margin=margin, rho_step=rho_step, gamma=gamma)
    train_z = torch.randn(6, 4, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 4, (6,), generator=g)
    lambd, rho, prev = [1e-6] * 4, [1.0] * 4, None
    grew = set()
    for epoch in range(6):
        ce = F.cross_entropy(train_z, y).item()
        want = ce + _released_cals_penalty(train_z, lambd, rho, margin)
        assert loss(train_z, y).item() == pytest.approx(want, rel=1e-6, abs=1e-9), epoch
        val_z = torch.randn(8, 4, generator=g, dtype=torch.float64) * (1.0 + epoch % 3)
        val_z[:, 3] = 20.0  # always predicted: its mean constraint stays at -1, so its rho never grows
        lambd, new_rho, prev = _released_cals_epoch(val_z, lambd, rho, prev, epoch, margin, rho_step, gamma, 0.9)
        grew |= {k for k in range(4) if new_rho[k] > rho[k]}
        rho = new_rho
        loss.on_epoch_end(val_z, torch.zeros(8, dtype=torch.long))
        assert torch.allclose(loss.lambd.double(), t(lambd), rtol=1e-5), epoch
        assert torch.allclose(loss.rho.double(), t(rho), rtol=1e-6), epoch
    assert 0 < len(grew) < 4 and rho[3] == 1.0  # per-class rho: some classes grew, class 3 did not


def test_cals_tied_maxima_share_the_gradient():
    margin = 1.0
    z = t([[5.0, 5.0, 0.0, 1.5], [2.0, 0.0, 3.0, 3.0]]).requires_grad_()
    y = torch.tensor([0, 3])
    lambd, rho = [0.5, 0.2, 1.0, 0.3], [1.0, 2.0, 1.5, 1.2]
    loss = create_loss("cals", margin=margin)
    loss.lambd, loss.rho = t(lambd).float(), t(rho).float()
    loss(z, y).backward()
    n, k = z.shape
    want = (torch.softmax(z.detach(), 1) - F.one_hot(y, k).double()) / n
    for i, row in enumerate(z.detach().tolist()):
        top = max(row)
        ties = [c for c in range(k) if row[c] == top]
        grads = [_phr((top - row[c] - margin) / margin, lambd[c], rho[c])[1] / margin for c in range(k)]
        for c in range(k):
            # d h_ic / d z_ic = -1 / margin; d max / d z_ij = 1 / |ties| for each tied j (amax)
            share = sum(grads) / len(ties) if c in ties else 0.0
            want[i, c] += (share - grads[c]) / (n * k)
    assert torch.allclose(z.grad, want, atol=1e-6)


def test_acls_regularize_ignored_matches_the_released_class():
    g = torch.Generator().manual_seed(22)
    z = torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64) * 6
    y = torch.randint(0, 4, (2, 3, 3), generator=g)
    y[0, 0, 0] = y[1, 2, 1] = -100
    margin, pos_lambda, neg_lambda, alpha = 2.0, 1.0, 0.1, 0.1
    rows = z.movedim(1, -1).reshape(-1, 4)
    pos = neg = 0.0
    for row in rows.tolist():  # every row, ignored pixels included
        top = max(row)
        for value in row:
            if value == top:
                pos += max(top - margin, 0.0) ** 2
            else:
                neg += max(top - value - margin, 0.0) ** 2
    m = len(rows)
    reg = pos_lambda * pos / m + neg_lambda * neg / (m * 3)
    ce = F.cross_entropy(rows, y.reshape(-1), ignore_index=-100).item()
    ours = create_loss("acls", margin=margin, regularize_ignored=True)(z, y).item()
    assert ours == pytest.approx(ce + alpha * reg, rel=1e-9)
    assert create_loss("acls", margin=margin)(z, y).item() != pytest.approx(ours, rel=1e-6)


def test_cals_regularize_ignored_keeps_every_pixel():
    g = torch.Generator().manual_seed(23)
    z = torch.randn(2, 3, 2, 2, generator=g, dtype=torch.float64) * 4
    y = torch.randint(0, 3, (2, 2, 2), generator=g)
    y[0, 1, 1] = -100
    rows = z.movedim(1, -1).reshape(-1, 3)
    lambd, rho = [0.4, 0.1, 0.7], [1.0, 1.0, 1.0]
    loss = create_loss("cals", margin=1.0, regularize_ignored=True)
    loss.lambd = t(lambd).float()
    want = F.cross_entropy(rows, y.reshape(-1)).item() + _released_cals_penalty(rows, lambd, rho, 1.0)
    assert loss(z, y).item() == pytest.approx(want, rel=1e-6)


def test_mrl_broadcast_mask_matches_the_released_code():
    logits = t([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0], [0.5, 0.5, 1.0]])
    y = torch.tensor([2, 0, 2])
    mixed = t([[0.0, 2.0, 2.5], [5.0, 0.0, 0.0], [0.0, 1.0, 0.2]])
    target_mixed = t([[0.0, 0.4, 0.6], [1.0, 0.0, 0.0], [0.3, 0.0, 0.7]])  # the second copy mixed the same class
    margin, alpha = 2.0, 0.1
    mask = [float(all(v != 1.0 for v in row)) for row in target_mixed.tolist()]
    diff = [max(m) - max(c) for m, c in zip(mixed.tolist(), logits.tolist())]
    b = len(mask)
    # released: mask (B,) times hinge (B, 1) broadcasts to (B, B) before the mean
    rank = sum(mask[j] * max(diff[i] + margin, 0.0) for i in range(b) for j in range(b)) / (b * b)
    want = F.cross_entropy(logits, y).item() + alpha * rank
    ours = create_loss("mrl", mask="broadcast")(logits, y, mixed, target_mixed).item()
    assert ours == pytest.approx(want, abs=1e-12)
    row_rank = sum(mask[i] * max(diff[i] + margin, 0.0) for i in range(b)) / b
    assert create_loss("mrl")(logits, y, mixed, target_mixed).item() == pytest.approx(
        F.cross_entropy(logits, y).item() + alpha * row_rank, abs=1e-12)
    with pytest.raises(ValueError, match="mask must be"):
        create_loss("mrl", mask="rows")


def test_mdca_label_smoothing_base_matches_the_released_code():
    g = torch.Generator().manual_seed(24)
    z = torch.randn(7, 4, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 4, (7,), generator=g)
    eps, k = 0.1, 4
    p = torch.softmax(z, 1).tolist()
    cls = 0.0
    for row, label in zip(p, y.tolist()):  # 1 - eps on the label, eps / (K - 1) on each other class
        cls -= sum((1 - eps if c == label else eps / (k - 1)) * math.log(row[c]) for c in range(k))
    cls /= len(p)
    reg = sum(abs(sum(row[c] for row in p) / len(p) - sum(lb == c for lb in y.tolist()) / len(p))
              for c in range(k)) / k
    assert create_loss("mdca", base="ls", smoothing=eps)(z, y).item() == pytest.approx(cls + reg, abs=1e-12)


def test_aslp_bce_level_cap_matches_the_released_code():
    beta, lr = 2.0, 0.1
    loss = create_loss("aslp_bce", warmup_epochs=0, lr=lr, beta=beta)
    z = t([[1.0, -0.5], [1.0, 2.0], [-3.0, 0.5]])
    y = t([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    start = [0.21, 0.2, 0.05]
    loss.level = t(start).float()
    loss(z, y, index=torch.arange(3))
    want = []
    for alpha, zs, ys in zip(start, z.tolist(), y.tolist()):
        ps = [1 / (1 + math.exp(-v)) for v in zs]
        bce = sum(-t_ * math.log(p_) - (1 - t_) * math.log(1 - p_) for p_, t_ in zip(ps, ys)) / len(ps)
        ent = sum(-math.log(p_ * (1 - p_)) for p_ in ps) / len(ps)
        a = alpha + lr * (ent - 2 * bce) / beta  # the enforcer is 0 before the first validation accuracy
        want.append(0.0 if a < 0 else (1 / (2 * beta) - 0.01 if a >= 1 / (2 * beta) else a))
    assert 0.24 < want[0] < 0.25 and want[1] == 0.24 and want[2] == 0.0  # the three branches
    assert torch.allclose(loss.level.double(), t(want), atol=1e-6)

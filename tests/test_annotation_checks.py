"""Annotation checks: Spearman monotonicity per group, misread endpoints, soft-label confidence, dropping groups."""
import numpy as np
import pytest
from scipy.stats import spearmanr

from csm_fixtures import annotated_by_hand
from timm_csm.annotation import annotation_report, drop_groups, flag_groups, group_spearman, soft_label_confidence

LAMBDAS = np.linspace(0, 1, 8)


def test_group_spearman_matches_scipy_with_ties_and_any_row_order():
    rng = np.random.default_rng(0)
    gid = np.repeat([7, 3, 11], 8)
    lam = np.tile(LAMBDAS, 3)
    hat = lam + rng.normal(0, 0.4, 24)
    hat[16:20] = 0.5  # ties within group 11
    perm = rng.permutation(24)
    rho = group_spearman(gid[perm], lam[perm], hat[perm])
    assert set(rho) == {3, 7, 11}
    for g in (3, 7, 11):
        assert rho[g] == pytest.approx(spearmanr(lam[gid == g], hat[gid == g])[0], abs=1e-12)


def test_flags_reversed_groups_and_misread_endpoints():
    gid = np.repeat([0, 1, 2, 3], 8)
    lam = np.tile(LAMBDAS, 4)
    hat = lam.copy()
    hat[8:16] = LAMBDAS[::-1]  # group 1 runs backwards
    hat[16 + 7] = 0.4  # group 2: its lambda = 1 member projects nearer class b (still monotone)
    hat[16:23] = np.linspace(-0.5, 0.3, 7)
    hat[24:32] = 0.5  # group 3: constant, no order at all
    flags = flag_groups(gid, lam, hat, min_spearman=0.8)
    assert flags["not_monotone"].tolist() == [1, 3]
    assert flags["endpoint_misread"].tolist() == [1, 2]
    assert np.isnan(group_spearman(gid, lam, hat)[3])
    with pytest.raises(ValueError, match="one length"):
        group_spearman(gid[:-1], lam, hat)
    with pytest.raises(ValueError, match="finite"):
        group_spearman(gid, lam, np.where(gid == 0, np.nan, hat))


def test_soft_label_confidence():
    q = np.array([[0.5, 0.5, 0], [0.95, 0.05, 0], [0, 0.995, 0.005], [0.7, 0, 0.3]])
    out = soft_label_confidence(q, quantiles=(0.5,))
    assert out["mean"] == pytest.approx((0.5 + 0.95 + 0.995 + 0.7) / 4)
    assert out["quantiles"]["0.5"] == pytest.approx((0.7 + 0.95) / 2)
    assert out["share_above_0.9"] == 0.5 and out["share_above_0.99"] == 0.25
    with pytest.raises(ValueError, match="non-empty"):
        soft_label_confidence(np.zeros((0, 3)))


def test_report_and_drop_on_a_csm_dataset():
    ds = annotated_by_hand(num_groups=6)
    hat = np.array(ds["lambda_hat"])
    gid = np.array(ds["group_id"])
    bad = int(gid[0])
    ds = ds.map(lambda row: {"lambda_hat": 1.0 - row["lambda_gen"] if row["group_id"] == bad else row["lambda_hat"]})
    report = annotation_report(ds)
    assert report["num_groups"] == 6 and bad in report["flagged_group_ids"] and report["not_monotone"] >= 1
    assert 0.5 <= report["max_soft_label"]["mean"] <= 1.0
    kept = drop_groups(ds, report["flagged_group_ids"])
    assert bad not in set(kept["group_id"])
    assert len(kept) == len(ds) - 8 * report["flagged"] and len(hat) == len(ds)
    assert set(kept["group_id"]).isdisjoint(report["flagged_group_ids"])  # whole flagged groups are gone
    assert np.array_equal(np.array(kept["lambda_hat"]), hat[~np.isin(gid, report["flagged_group_ids"])])
    assert annotation_report(kept)["flagged"] == 0


def test_the_generator_check_names_recognition_near_chance_and_most_groups_flagged():
    from timm_csm.annotation.checks import generator_problems

    def report(accuracy, flagged, groups=300, k=10):
        return {"num_groups": groups, "flagged": flagged,
                "pure_class_recognition": {"accuracy": accuracy, "chance": 1 / k, "num_images": 2 * groups}}

    # the shipped generator's numbers (benchmarks/calibration.md): no problem
    assert generator_problems(report(0.609, 1772, groups=6750)) == []
    # a generator after 400 steps: both problems, each with its numbers
    poor = generator_problems(report(0.15, 264))
    assert len(poor) == 2 and "recognised 15.0%, near chance 10.0% (600 images" in poor[0]
    assert poor[1] == "264 of 300 groups flagged"
    # the bounds: a quarter of the way from chance (10% -> 32.5%) and more than half of the groups
    assert generator_problems(report(0.325, 150)) == []
    assert len(generator_problems(report(0.3249, 151))) == 2
    assert len(generator_problems(report(0.70, 0, k=2))) == 0 and len(generator_problems(report(0.62, 0, k=2))) == 1
    assert generator_problems({"pure_class_recognition": None, "num_groups": 0, "flagged": 0}) == []


def test_pure_members_of_groups_that_show_their_classes_are_recognised_and_noise_is_not(tmp_path):
    """The recognition the check reads, from annotation's encoding pass: the nearest real-class prototype of each
    pure member (lambda 0: class b, 1: class a), among all classes: the fixtures' morphs of the class patterns, then
    the same groups as noise."""
    from csm_fixtures import CLASS_NAMES, LAMBDAS, png_bytes, raw_generated, synthetic_arrays, tiny_timm_encoder
    from timm_csm.annotation import annotate, compute_prototypes

    encoder = tiny_timm_encoder(tmp_path)[0]
    protos = compute_prototypes(encoder, synthetic_arrays(n_per_class=20), batch_size=32, progress=False)

    def recognition(generated):
        return annotate(generated, CLASS_NAMES, encoder, protos, 4.0, lambdas=LAMBDAS, batch_size=5,
                        return_recognition=True, progress=False)[1]

    assert recognition(raw_generated(num_groups=6)) == {"accuracy": 1.0, "chance": 1 / 3, "num_images": 12}

    def noise(rows):
        rng = np.random.default_rng(0)
        rows["image"] = [{"bytes": png_bytes(rng.integers(0, 256, (1, 16, 16), dtype=np.uint8)), "path": None}
                         for _ in rows["image"]]

    poor = recognition(raw_generated(num_groups=6, edit=noise))
    assert poor["num_images"] == 12 and poor["accuracy"] < 0.5

"""A shift page (amendment 3's ``benchmarks/shift_a3.md``, amendment 4's ``shift_a4.md``): the Holm-corrected
decisions under shift and against OOD images, the per-setting tables and the secondary comparisons, from the
committed shift cells' records of a :class:`~amendment3_cells.ShiftSource`."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import calibration_methods as method_table
from amendment3_cells import A3, SHIFT_FILE, ShiftSource, decision_rows, shift_cells
from timm_csm.io import write_text_atomic
from timm_csm.metrics import detectable_difference, holm, interval_text, paired_t_interval
from timm_csm.recipes.cells import CELL_META, read_json

PAGE = Path("benchmarks/shift_a3.md")
SEVERITIES = (1, 2, 3, 4, 5)
OOD_SOURCES = ("mnist5k", "digits")
PHASES = {"uncalibrated": "before TS", "temperature_scaling": "after TS"}
FAMILY_ALPHA = 0.05
#: the secondary comparisons under shift (PROTOCOL.md amendment 3): label, phase, statistic over the corruptions,
#: metric, scale and digits on the page
SHIFT_SECONDARY = (("mean ECE before TS", "uncalibrated", "mean", "ece", 100.0, 2),
                   ("mean ECE after TS", "temperature_scaling", "mean", "ece", 100.0, 2),
                   ("worst corruption's ECE before TS", "uncalibrated", "worst", "ece", 100.0, 2),
                   ("worst corruption's ECE after TS", "temperature_scaling", "worst", "ece", 100.0, 2),
                   ("mean accuracy", "uncalibrated", "mean", "accuracy", 100.0, 2),
                   ("mean NLL before TS", "uncalibrated", "mean", "nll", 1.0, 4),
                   ("mean NLL after TS", "temperature_scaling", "mean", "nll", 1.0, 4))
#: the OOD scores and the metrics of the secondary OOD comparisons
OOD_SCORES = {"msp": "max-softmax", "max_logit": "max-logit", "energy": "energy", "entropy": "entropy"}
OOD_METRICS = {"auroc": "AUROC", "fpr95": "FPR at 95% TPR"}


@functools.lru_cache(maxsize=None)
def _read_record(path: str, mtime_ns: int) -> Dict[str, Any]:
    """A ``shift.json``, read once per version of the file: the page reads each for every comparison it shows."""
    return read_json(Path(path))


def _values(cells: Dict[int, Path], getter) -> Dict[int, float]:
    out = {}
    for seed, d in cells.items():
        path = d / SHIFT_FILE
        if path.exists():
            value = getter(_read_record(str(path), path.stat().st_mtime_ns))
            if value is not None:
                out[seed] = float(value)
    return out


def shift_ece(severity: int, phase: str = "uncalibrated", key: str = "ece", statistic: str = "mean"):
    """A severity's mean over the corruptions (``statistic="worst"``: its worst corruption) of metric ``key``."""
    return lambda s: s["severity"][str(severity)][phase][statistic][key]


def ood_auroc(source: str = "mnist5k", phase: str = "uncalibrated", score: str = "msp", key: str = "auroc"):
    return lambda s: s["ood"][source]["methods"][phase][score][key]


def corruption_seed(cell: Path) -> Tuple[Optional[int], str]:
    """The seed a committed shift cell's corruptions were drawn with, and where it comes from: its ``shift.json``
    (cells run since it is recorded) or, for the cells run before, its training seed (``cell.json``), which the
    ``--eval-only`` run took from the checkpoint."""
    record = read_json(cell / SHIFT_FILE)
    if record.get("corruption_seed") is not None:
        return int(record["corruption_seed"]), "recorded"
    return int(read_json(cell / CELL_META)["seed"]), "derived"


def _label(name: Optional[str]) -> str:
    return method_table.get_method(name).label if name else "pending"


def primary_tests(found, choices, source: ShiftSource = A3) -> List[Dict[str, Any]]:
    """Both families of primary comparisons (PROTOCOL.md amendment 3), each test with its Holm decision; a
    comparison short of the decision seeds of both rows is pending (and left out of its family until all are in)."""
    families = {"shift": [], "ood": []}
    for setting in source.settings:
        ch = choices[setting]
        csm, others = ch["csm"], ["ce", ch["best_other"]["pre_ts"]]
        rows = found.get(setting, {})
        for other in others:
            for k in SEVERITIES:
                families["shift"].append(_test(setting, f"severity {k}", csm, other, rows, shift_ece(k), -1))
            families["ood"].append(_test(setting, "OOD (mnist5k, max-softmax AUROC)", csm, other, rows, ood_auroc(),
                                         +1))
    for family, tests in families.items():
        for t in tests:
            t["family_size"] = len(tests)
        ready = [t for t in tests if t["interval"] is not None and t["interval"].n == len(source.seeds)]
        if ready and len(ready) == len(tests):
            adjusted, reject = holm([t["interval"].p_value for t in ready], FAMILY_ALPHA)
            for t, adj, rej in zip(ready, adjusted, reject):
                t.update(holm_p=adj, better=rej and t["interval"].mean * t["sign"] > 0)
    return families["shift"] + families["ood"]


def _test(setting, what, csm, other, rows, getter, sign) -> Dict[str, Any]:
    interval = None
    if csm is not None and other is not None:
        interval = paired_t_interval(_values(rows.get(csm, {}), getter), _values(rows.get(other, {}), getter))
    return {"setting": setting, "what": what, "csm": csm, "other": other, "interval": interval, "sign": sign,
            "holm_p": None, "better": None}


def _fmt(v: Optional[float], scale: float = 100.0, digits: int = 2) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


def _mean_sd(values: Dict[int, float], scale: float = 100.0) -> str:
    if not values:
        return "-"
    vs = [v * scale for v in values.values()]
    m = sum(vs) / len(vs)
    sd = (sum((v - m) ** 2 for v in vs) / (len(vs) - 1)) ** 0.5 if len(vs) > 1 else 0.0
    return f"{m:.2f} ± {sd:.2f} ({len(vs)})"


def _test_line(t: Dict[str, Any], scale: float) -> str:
    iv = t["interval"]
    if iv is None:
        return f"| {t['setting']} | {t['what']} | {_label(t['other'])} | pending | - | - | - | - |"
    sd = iv.sd
    power = (f"{detectable_difference(sd, iv.n) * scale:.2f} / "
             f"{detectable_difference(sd, iv.n, FAMILY_ALPHA / t['family_size']) * scale:.2f}"
             if sd > 0 else "-")
    verdict = ("pending" if t["better"] is None else "yes" if t["better"] else
               "not shown" if iv.low <= 0 <= iv.high else "no (the other way)")
    holm_p = "-" if t["holm_p"] is None else f"{t['holm_p']:.3g}"
    return (f"| {t['setting']} | {t['what']} | {_label(t['other'])} | {iv.mean * scale:+.2f} [{iv.low * scale:+.2f}, "
            f"{iv.high * scale:+.2f}] (n {iv.n}) | {holm_p} | {sd * scale:.2f} | {power} | {verdict} |")


def _severities(ks: Sequence[int]) -> str:
    """``[1]`` -> "severity 1", ``[2, 4, 5]`` -> "severities 2, 4 and 5"."""
    if len(ks) == 1:
        return f"severity {ks[0]}"
    return f"severities {', '.join(map(str, ks[:-1]))} and {ks[-1]}"


def verdict_lines(tests: List[Dict[str, Any]], settings: Sequence[str] = A3.settings) -> List[str]:
    """The protocol's claims in its words, per setting: "CSM calibrates better under shift at severity k" holds iff
    both of that severity's comparisons are decided better; "CSM detects OOD images better" likewise."""
    lines = []
    for setting in settings:
        mine = [t for t in tests if t["setting"] == setting]
        if any(t["better"] is None for t in mine):
            lines.append(f"- `{setting}`: pending.")
            continue
        holds = {k: all(t["better"] for t in mine if t["what"] == f"severity {k}") for k in SEVERITIES}
        yes, no = [k for k in SEVERITIES if holds[k]], [k for k in SEVERITIES if not holds[k]]
        shift = ("holds at every severity" if not no else "holds at no severity" if not yes else
                 f"holds at {_severities(yes)}; does not hold at {_severities(no)}")
        ood = "holds" if all(t["better"] for t in mine if "OOD" in t["what"]) else "does not hold"
        lines.append(f"- `{setting}`: \"CSM calibrates better under shift\" {shift}. \"CSM detects OOD images "
                     f"better\" {ood}.")
    return lines + [""]


def _pair(rows, csm: str, other: str, getter):
    return paired_t_interval(_values(rows.get(csm, {}), getter), _values(rows.get(other, {}), getter))


def _interval_cell(iv, scale: float = 100.0, digits: int = 2) -> str:
    """The library's ``mean [low, high] (n=...)`` of ``iv`` in the page's units, and its paired sd."""
    if iv is None:
        return "pending"
    shown = iv._replace(mean=iv.mean * scale, low=iv.low * scale, high=iv.high * scale, sd=iv.sd * scale)
    return f"{interval_text(shown, digits)} sd {shown.sd:.{digits}f}"


def _sides(intervals: Sequence[Tuple[int, Any]]) -> str:
    """Where a severity's interval lies below 0 and where above it."""
    below = [k for k, iv in intervals if iv is not None and iv.high < 0]
    above = [k for k, iv in intervals if iv is not None and iv.low > 0]
    return (f"below 0 at {_severities(below) if below else 'no severity'}"
            + (f", above 0 at {_severities(above)}" if above else ""))


def secondary_summary(setting: str, rows, choices: Dict[str, Any]) -> List[str]:
    """The secondary intervals in words: where each of the CSM row's mean-ECE differences under shift lies, before
    and after TS, and the after-TS counterpart of the shift claim (below CE and the best other method after TS)."""
    csm, post = choices["csm"], choices["best_other"]["post_ts"]
    lines = []
    for other in [m for m in decision_rows(choices) if m != csm]:
        by_phase = {phase: [(k, _pair(rows, csm, other, shift_ece(k, phase))) for k in SEVERITIES] for phase in PHASES}
        lines.append(f"- `{setting}`, the CSM row minus {_label(other)}, mean ECE under shift: before TS "
                     f"{_sides(by_phase['uncalibrated'])}; after TS {_sides(by_phase['temperature_scaling'])}.")
    both = [k for k in SEVERITIES if all(
        (iv := _pair(rows, csm, o, shift_ece(k, "temperature_scaling"))) is not None and iv.high < 0
        for o in ("ce", post))]
    lines.append(f"- `{setting}`, after TS: the CSM row's mean ECE under shift lies below both CE's and the best other "
                 f"method's after TS ({_label(post)}) at {_severities(both) if both else 'no severity'}.")
    return lines


def secondary_tables(setting: str, rows, choices: Dict[str, Any]) -> List[str]:
    """The CSM row minus each other decision row: every secondary metric under shift by severity, and every OOD
    score's AUROC and FPR at 95% TPR on both sources, before and after TS."""
    csm = choices["csm"]
    others = [m for m in decision_rows(choices) if m != csm]
    lines = [f"### `{setting}`: under shift", "", "| the CSM row minus | metric | "
             + " | ".join(f"severity {k}" for k in SEVERITIES) + " |", "|---|---|" + "---|" * len(SEVERITIES)]
    for other in others:
        for label, phase, statistic, key, scale, digits in SHIFT_SECONDARY:
            cells = [_interval_cell(_pair(rows, csm, other, shift_ece(k, phase, key, statistic)), scale, digits)
                     for k in SEVERITIES]
            lines.append(f"| {_label(other)} | {label} | " + " | ".join(cells) + " |")
    lines += ["", f"### `{setting}`: out of distribution", "", "| the CSM row minus | source | phase | metric | "
              + " | ".join(OOD_SCORES.values()) + " |", "|---|---|---|---|" + "---|" * len(OOD_SCORES)]
    for other in others:
        for source in OOD_SOURCES:
            for phase, phase_label in PHASES.items():
                for key, metric in OOD_METRICS.items():
                    cells = [_interval_cell(_pair(rows, csm, other, ood_auroc(source, phase, score, key)))
                             for score in OOD_SCORES]
                    lines.append(f"| {_label(other)} | {source} | {phase_label} | {metric} | " + " | ".join(cells)
                                 + " |")
    return lines + [""]


def secondary_section(found, choices, source: ShiftSource = A3) -> List[str]:
    lines = [f"## Secondary comparisons (unadjusted paired 95% t-intervals over the {len(source.seeds)} seeds; no "
             "claim unless the interval excludes 0)", "",
             "The CSM row minus each other decision row: difference [95% t-interval] and the observed paired sd "
             "(`sd`); ECE, accuracy, AUROC and FPR in points, NLL in nats. Lower is better for ECE, NLL and FPR, "
             "higher for accuracy and AUROC. These are the secondary comparisons PROTOCOL.md amendment 3 names: "
             "after TS, accuracy and NLL under shift, the worst corruption's ECE, against RegMixup, the other OOD "
             "scores, FPR at 95% TPR and the `digits` source.", ""]
    ready = [s for s in source.settings if choices[s]["csm"] is not None]
    for setting in ready:
        lines += secondary_summary(setting, found.get(setting, {}), choices[setting])
    lines.append("")
    for setting in ready:
        lines += secondary_tables(setting, found.get(setting, {}), choices[setting])
    return lines if ready else lines[:2] + ["Pending: no CSM row yet.", ""]


@dataclass(frozen=True)
class PageText:
    """The words of a shift page that differ between amendments: its title, what it evaluates (``rows``: "Amendment
    2's decision rows"), its script and the rule the corruptions were drawn by (``seed_rule``)."""

    title: str
    rows: str
    script: str
    seed_rule: str


A3_TEXT = PageText(
    "Calibration under shift and out of distribution (PROTOCOL.md amendment 3)", "Amendment 2's decision rows",
    "benchmarks/amendment3.py",
    "PROTOCOL.md amendment 3 states seed 0; the `--eval-only` run takes `--seed` from the checkpoint, so each cell's "
    "corruptions were drawn with its training seed (PROTOCOL.md, amendment 3, clarification of 2026-12-06)")


def seed_lines(done: Sequence[str], committed: Path = A3.committed, rule: str = A3_TEXT.seed_rule) -> List[str]:
    """Which seed each cell's corruptions were drawn with, after the protocol's ``rule``."""
    seeds = {c: corruption_seed(Path(committed) / c) for c in done}
    training = {c: int(read_json(Path(committed) / c / CELL_META)["seed"]) for c in done}
    same = [c for c in done if seeds[c][0] == training[c]]
    recorded = sum(1 for c in done if seeds[c][1] == "recorded")
    other = [f"{c} (seed {seeds[c][0]})" for c in done if c not in same]
    return [f"Corruption seed: {rule}. The two rows of a paired comparison share that seed, hence the same corrupted "
            f"images, and the paired tests stand. Of the {len(done)} cells, {len(same)} drew with their "
            f"training seed: {recorded} as recorded in `shift.json` (`corruption_seed`), {len(done) - recorded} "
            f"derived from the training seed in `cell.json` (run before `shift.json` recorded it)"
            + (f"; other seeds: {', '.join(other)}." if other else "."), ""]


def checkpoint_lines(records: Dict[str, Dict[str, Any]]) -> List[str]:
    """How each shift cell's checkpoint was found to be its training cell's, where any was re-made (``records``:
    the shift records by cell; one without ``checkpoint_found_by`` was checked by its sha256); none otherwise."""
    remade = sorted(c for c, r in records.items() if r.get("checkpoint_found_by", "sha256") != "sha256")
    if not remade:
        return []
    return [f"Checkpoints: {len(records) - len(remade)} kept from their training cells (the sha256 each recorded), "
            f"{len(remade)} re-made by running the cell again and found the same: by their weights' digest, or, where "
            "the cell recorded its file's digest alone, by a run that reproduced every committed number (PROTOCOL.md, "
            f"amendment 4's clarifications of 2026-12-07): {', '.join(remade)}.", ""]


def write_page(path: Path = PAGE, source: ShiftSource = A3, text: PageText = A3_TEXT) -> Path:
    found = shift_cells(source)
    choices = {s: source.setting_choices(s) for s in source.settings}
    done = sorted({d.name for rows in found.values() for seeds in rows.values() for d in seeds.values()
                   if (d / SHIFT_FILE).exists()})
    by_cell = {c: read_json(Path(source.committed) / c / SHIFT_FILE)["record"] for c in done}
    records = list(by_cell.values())
    n = len(source.seeds)
    commits = ", ".join(sorted({r["commit"][:7] for r in records}))
    threads = ", ".join(sorted({str(r["torch_threads"]) for r in records}))
    lines = [f"# {text.title}", "",
             f"{text.rows}, as trained (their kept checkpoints), on 2 000 Fashion-MNIST test images "
             "under 23 corruptions at severities 1-5 and against two OOD sources; temperatures fitted on each "
             "cell's clean validation images. Metrics in %, mean ± sd over seeds (number of seeds).", "",
             f"Commands: `python {text.script} --run CELL` (one shift cell), `--next` (those that can "
             "run, one a line: each runs with `--run`), `--report` (this page).",
             "",
             f"Shift cells finished: {len(done)}; commits: {commits or '-'}; torch threads: {threads or '-'}.", "",
             *checkpoint_lines(by_cell), *seed_lines(done, source.committed, text.seed_rule)]
    tests = primary_tests(found, choices, source)
    lines += [f"## Decisions (the CSM row minus the other method; paired over {n} seeds; Holm within each family)",
              "",
              f"Shift: mean test ECE over the 23 corruptions before TS (lower is better; Holm over "
              f"{sum(t['what'].startswith('severity') for t in tests)}). OOD: max-softmax AUROC before TS on mnist5k "
              f"(higher is better; Holm over {sum(not t['what'].startswith('severity') for t in tests)}). "
              f"Detectable: the smallest true difference {n} seeds detect with 80% power at the observed paired sd, "
              "at alpha 0.05 / at Holm's strictest level.", "",
              "| setting | comparison | other method | difference [95% t-interval] | Holm-adjusted p | paired sd | "
              "detectable | CSM better |", "|---|---|---|---|---|---|---|---|"]
    lines += [_test_line(t, 100.0) for t in tests] + [""]
    lines += ["Verdicts (a severity holds where both of its comparisons say yes; OOD likewise):", "",
              *verdict_lines(tests, source.settings)]
    for setting in source.settings:
        rows = found.get(setting, {})
        methods = decision_rows(choices[setting])
        lines += [f"## `{setting}`", "",
                  f"Rows: {', '.join(_label(m) for m in methods)}; the CSM row "
                  f"{'is ' + _label(choices[setting]['csm']) if choices[setting]['csm'] else 'is pending (stage 1)'}.",
                  "", "| method | phase | clean (2 000) | " + " | ".join(f"severity {k}" for k in SEVERITIES) +
                  " | OOD AUROC mnist5k | OOD AUROC digits |", "|---|---|---|" + "---|" * (len(SEVERITIES) + 2)]
        for m in methods:
            for phase, label in PHASES.items():
                clean = _mean_sd(_values(rows.get(m, {}), lambda s, p=phase: s["clean"][p]["ece"]))
                sev = [_mean_sd(_values(rows.get(m, {}), shift_ece(k, phase))) for k in SEVERITIES]
                ood = [_mean_sd(_values(rows.get(m, {}), ood_auroc(src, phase))) for src in OOD_SOURCES]
                lines.append(f"| {_label(m)} | ECE {label} | {clean} | " + " | ".join(sev + ood) + " |")
            acc = [_mean_sd(_values(rows.get(m, {}), shift_ece(k, key="accuracy"))) for k in SEVERITIES]
            clean_acc = _mean_sd(_values(rows.get(m, {}), lambda s: s["clean"]["uncalibrated"]["accuracy"]))
            lines.append(f"| {_label(m)} | accuracy | {clean_acc} | " + " | ".join(acc) + " | | |")
        lines.append("")
    lines += secondary_section(found, choices, source)
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path

"""The later stages' sections of a study's page (:mod:`.later_stages`: their configurations): stage 3's label
variants (``labels``), stage 4's generated volume with its figure (``volume``) and stage 5's other real subsets
(``data_seeds``). Each reads the setting summaries of :func:`timm_csm.study.report.setting_summaries`."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..io import write_json_atomic
from ..metrics import interval_text, paired_t_interval
from ..recipes.cells import read_json
from ..recipes.derive import label_confidence as derived_label_confidence
from .decide import values_by_seed
from .later_stages import data_seed_methods, label_setting, label_variants, volume_points, volume_settings
from .report_figures import volume_figure
from .report_tables import fmt, mean_cell, only_seeds, paired, seed_range, spread
from .spec import StudySpec

__all__ = ["label_confidence", "labels_section", "volume_section", "data_seeds_section"]

Summaries = Mapping[str, Mapping[str, Any]]


def label_confidence(cells: Mapping[int, Mapping[str, Any]], cache: Optional[Path]) -> Optional[float]:
    """The mean max-probability of the labels (``soft_label``) of the generated set ``cells`` read
    (:func:`timm_csm.annotation.soft_label_confidence`), cached in ``cache`` by the set's recorded fingerprint;
    None when no cell records one and no set at the recorded path has it."""
    cell = next((c for c in cells.values() if c["record"].get("generated_set")), None)
    if cell is None or cache is None:
        return None
    key = cell["record"]["generated_set"]
    known = read_json(cache) if Path(cache).exists() else {}
    if key not in known:
        found = derived_label_confidence(cell["config"].get("csm_dataset"), key)
        if found is None:
            return None
        known[key] = found
        write_json_atomic(Path(cache), known, indent=1)
    return known[key]


def labels_section(spec: StudySpec, summaries: Summaries, cache: Optional[Path]) -> List[str]:
    seeds = spec.report.later_seeds
    lines = [f"## Stage 3: soft labels with contrast (seeds {seed_range(seeds)}; secondary, no Holm)", ""]
    third = label_setting(spec, {s: sm["rows"] for s, sm in summaries.items()})
    if third is None:
        return lines + [f"Pending: the CSM rows of {' and '.join(f'`{s}`' for s in spec.decision.settings)} "
                        "(stage 1).", ""]
    sm = summaries[third]
    rows, row = sm["rows"], sm["choices"]["csm"]
    lines += [f"Setting `{third}`: its CSM row has the lower mean validation ECE before TS (seeds "
              f"{seed_range(spec.seeds.tuning)}). Each variant keeps the row's weight, n_aug and filter; `max-prob`: "
              "the mean over the set's images of the largest class probability of its label (1: one-hot). "
              f"Differences: the variant minus the CSM row, test ECE, paired 95% t-intervals over seeds "
              f"{seed_range(seeds)}.", "",
              f"| variant | seeds (of {seed_range(seeds)}) | max-prob of labels | test ECE before TS | test ECE after "
              "TS | minus CSM row, before TS | minus CSM row, after TS |", "|---|---|---|---|---|---|---|"]
    for what, name in label_variants(spec, row):
        r = only_seeds(rows.get(name, []), seeds)
        confidence = label_confidence(sm["cells"].get(name, {}), cache)
        diffs = ["-" if name == row else interval_text(paired(rows, name, row, f"ece_{phase}", seeds))
                 for phase in ("pre_ts", "post_ts")]
        lines.append(f"| {what}: `{name}` | {len(r)} | {fmt(confidence, 3)} | {mean_cell(r, 'ece_pre_ts', 2)} | "
                     f"{mean_cell(r, 'ece_post_ts', 2)} | {diffs[0]} | {diffs[1]} |")
    return lines + [""]


def _images(n: int) -> str:
    """A count as the page writes it in prose: ``27 000``."""
    return f"{n:,}".replace(",", " ")


def volume_section(spec: StudySpec, summaries: Summaries, figure: Path) -> List[str]:
    per_volume, seeds = spec.report.images_per_volume, spec.seeds.decision
    lines = [f"## Stage 4: volume beyond {_images(per_volume)} generated images ({len(seeds)} seeds; secondary, "
             "unadjusted)", ""]
    third = label_setting(spec, {s: sm["rows"] for s, sm in summaries.items()})
    series: Dict[str, Dict[str, Any]] = {}
    table = ["| setting | generated images | seeds | test ECE before TS | test ECE after TS | minus RegMixup, before "
             "TS | minus RegMixup, after TS | minus 1x, before TS | minus 1x, after TS |", "|---" * 9 + "|"]
    phases = ("pre_ts", "post_ts")
    for setting in volume_settings(spec, third):
        sm = summaries[setting]
        row, regmixup = sm["choices"]["csm"], sm["choices"]["chosen"].get("regmixup")
        if row is None or regmixup is None:
            lines.append(f"`{setting}`: pending (the CSM row and RegMixup's alpha, stage 1).")
            continue
        rows = sm["rows"]
        series[setting] = {"regmixup": {ph: spread(rows.get(regmixup, []), f"ece_{ph}") for ph in phases},
                           "points": []}
        for volume, name in volume_points(spec, row):
            r = rows.get(name, [])
            series[setting]["points"].append((per_volume * volume, {ph: spread(r, f"ece_{ph}") for ph in phases}))
            diffs = [interval_text(paired(rows, name, other, f"ece_{ph}", seeds)) if other != name else "-"
                     for other in (regmixup, row) for ph in phases]
            table.append(f"| {setting} | {per_volume * volume:,} | {len(r)} | {mean_cell(r, 'ece_pre_ts', 2)} | "
                         f"{mean_cell(r, 'ece_post_ts', 2)} | " + " | ".join(diffs) + " |")
    if not series:
        return lines + [""]
    lines += ["The CSM row's configuration on the setting's set and on 2x and 4x its groups (the first "
              f"{_images(spec.report.volume_groups)} the same images); differences in test ECE points, paired 95% "
              f"t-intervals over the common seeds of {seed_range(seeds)}.", "", *table, ""]
    if any(i is not None for sr in series.values() for _, ph in sr["points"] for i in ph.values()):
        volume_figure(series, figure)
        lines += [f"![Test ECE against generated images, 95% intervals, RegMixup's band]({figure.name})", ""]
    return lines


def data_seeds_section(spec: StudySpec, choices: Mapping[str, Any],
                       rows_by_data_seed: Mapping[int, Mapping[str, Sequence[Mapping[str, Any]]]]) -> List[str]:
    report = spec.report
    seeds, data_seeds = report.later_seeds, report.data_seeds
    source, setting = report.data_seed_choices, report.data_seed_setting
    lines = [f"## Stage 5: other real subsets (data seeds {seed_range(data_seeds)}, seeds {seed_range(seeds)}, the "
             f"{setting} generated set; secondary, unadjusted)", ""]
    methods = data_seed_methods(spec, choices)
    if methods is None:
        shown = [s for s, _ in report.data_seed_methods]
        return lines + [f"Pending: the `{source}` choices of {', '.join(shown[:-1])} and {shown[-1]} and the CSM "
                        "row (stage 1).", ""]
    csm = methods[-1][1]
    encoder = report.encoder_name
    shown = [s for s, _ in methods[:-1]]
    pairs_n = len(data_seeds) * len(seeds)
    lines += [f"{', '.join(shown[:-1])} and {shown[-1]} at their `{source}` choices, CSM at the `{source}` row's "
              f"configuration on the {setting} set. CSM minus each method, test ECE: paired 95% t-intervals over the "
              f"{len(data_seeds)} data-seed means (first: the interval that also covers the choice of images), per "
              f"data seed (over seeds {seed_range(seeds)}), and over the {pairs_n} (data seed, seed) pairs (which "
              f"leaves the choice of images out). {encoder[0].upper() + encoder[1:]} (the annotator and KD's "
              f"teacher) learned from {report.encoder_train_images:,} training images, among them "
              f"{' / '.join(f'{report.saw_validation(d):,}' for d in data_seeds)} of the {spec.data.val_size:,} "
              f"validation images of data seeds {' / '.join(map(str, data_seeds))}.", "",
              f"| CSM minus | phase | {len(data_seeds)} data-seed means | "
              + " | ".join(f"data seed {d}" for d in data_seeds) + f" | {pairs_n} pairs |",
              "|---|---|---|" + "---|" * len(data_seeds) + "---|"]
    for what, other in methods[:-1]:
        for phase, name in (("pre_ts", "before TS"), ("post_ts", "after TS")):
            key = f"ece_{phase}"
            per = {d: paired(rows, csm, other, key, seeds) for d, rows in rows_by_data_seed.items()}
            pairs = [{(d, s): v for d, rows in rows_by_data_seed.items() if m in rows
                      for s, v in values_by_seed(only_seeds(rows[m], seeds), key).items()} for m in (csm, other)]
            # a data seed's mean difference once all its seeds are paired
            means = {d: i[1] for d, i in per.items() if i is not None and i[0] == len(seeds)}
            over_means = paired_t_interval(means, dict.fromkeys(means, 0.0))
            cells = [over_means] + [per[d] for d in data_seeds] + [paired_t_interval(*pairs)]
            lines.append(f"| {what} (`{other}`) | {name} | " + " | ".join(map(interval_text, cells)) + " |")
    return lines + [""]

"""Amendment 4's pilot (``benchmarks/PROTOCOL.md``): which timm backbone, at which recipe length, the timm-backbone
study trains. Validation only: the pilot's data has no test split at all.

The rule, written before any pilot cell ran (and committed with the cells, before amendment 4's text):

1. **Candidates**, in order of preference: ``resnet18`` (the paper's family, 11.2 M parameters), ``resnet10t``
   (4.9 M), the package's ``swin_tiny`` (patch 2, window 4), all with one input channel at Fashion-MNIST's 28 px and
   timm's default stems (the Swin at its fixed 32 px input); each at two recipe lengths, the amendment-2 classifier recipe (SGD 0.1, momentum 0.9,
   weight decay 5e-4, batch 128, crops and flips, 60 epochs, lr x0.1 at 30 and 45) and the same recipe halved
   (30 epochs, lr x0.1 at 15 and 23).
2. **Cost**: the training seconds per step of each candidate at the CE batch (128 real images) and at CSM's batch
   (128 real images and 256 companions, two forward passes), on one torch thread (``--timing``); a candidate whose
   projected CSM cell (epochs x 20 steps x the CSM step) exceeds 25 CPU-minutes at a recipe length is out at that
   length.
3. **Over-confidence**: one CE cell per remaining (candidate, length), training seed 0, on the benchmark's 2 500 real
   training images with its 2 000 validation images (data seed 0, the protocol's digests checked); it must reach a
   validation ECE before temperature scaling (15 bins, at the checkpoint of best validation accuracy) of at least
   4%.
4. **Choice**: the first candidate in the order above that meets both at some length, at the shorter length that
   meets both. Its measured CSM cell time (one real CSM cell on the real-copies control set, the same batch and
   loss as CSM) is recorded.

    python benchmarks/pilot_a4.py --timing           # step times, one thread (minutes)
    python benchmarks/pilot_a4.py --cells            # the CE cells the rule needs, resumable; then the choice
    python benchmarks/pilot_a4.py --report           # benchmarks/pilot_a4.md and .json from what has run

Cells run into ``runs/pilot_a4/`` (resumable: run the same command again after a kill).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_methods import base_recipe  # noqa: E402
from matched_setting import images_digest, real_subset, save_image_splits  # noqa: E402

OUTPUT = Path("runs/pilot_a4")
PAGE = Path("benchmarks/pilot_a4.md")
RECORD = Path("benchmarks/pilot_a4.json")
#: the protocol's digests of data seed 0's training and validation images (PROTOCOL.md, Data)
DIGESTS = {"train": "9d4aaf5714c4c00f906b5a95c37b7f1d9ba5c12a5c9d74423c05eb6a89dd7496",
           "validation": "e69971079824e4222d09a2d8dfee4efbd9526ed44506d95fc731cd8830f8c9f0"}
CANDIDATES = ("resnet18", "resnet10t", "swin_tiny")
#: the input side each candidate trains at: Fashion-MNIST's 28 px, the package's Swin at its fixed 32 px (patch 2,
#: window 4: 28 px would leave 14 x 14 tokens, which windows of 4 do not tile)
INPUT_SIDE = {"swin_tiny": 32}
#: recipe lengths: epochs and their lr milestones (the amendment-2 recipe, and it halved, milestones rounded up)
LENGTHS = {60: [30, 45], 30: [15, 23]}
BATCH = 128
STEPS_PER_EPOCH = math.ceil(2500 / BATCH)
MAX_CSM_MINUTES = 25.0
MIN_VAL_ECE = 4.0


def export_pilot_data(folder: Path) -> Dict[str, Any]:
    """The benchmark's 2 500 training and 2 000 validation images as a ``save_to_disk`` DatasetDict with the splits
    ``train`` and ``validation`` and no test split, so that no pilot cell can read a test image."""
    import datasets

    marker = folder / "pilot_data.json"
    if marker.exists():
        splits = sorted(datasets.load_from_disk(str(folder)))
        if splits != ["train", "validation"]:
            raise SystemExit(f"{folder} holds the splits {splits}; the pilot's data is train and validation only")
        return json.loads(marker.read_text())
    splits = real_subset()
    digests = {"train": images_digest(splits.train), "validation": images_digest(splits.val)}
    if digests != DIGESTS:
        raise SystemExit(f"the real subset's digests {digests} are not the protocol's {DIGESTS}")
    save_image_splits(folder, {"train": splits.train, "validation": splits.val}, splits.class_names)
    info = {"train_images": len(splits.train), "validation_images": len(splits.val), "digests": digests}
    marker.write_text(json.dumps(info, indent=1))
    return info


def step_seconds(model_name: str, batch: int, companions: int, repeats: int = 4) -> float:
    """Median seconds of one SGD step of ``model_name`` (1 x 28 x 28, 10 classes) on ``batch`` real images and,
    when ``companions``, a second forward pass on that many more (CSM's step), after one warm-up step."""
    import statistics

    import timm
    import torch

    import timm_csm  # noqa: F401  (registers the package's models)

    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=10, in_chans=1)
    side = INPUT_SIDE.get(model_name, 28)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 1, side, side), torch.randint(0, 10, (batch,))
    xc, qc = torch.randn(companions, 1, side, side), torch.softmax(torch.randn(companions, 10), 1)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if companions:
            loss = loss + (torch.softmax(model(xc), 1) - qc).pow(2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def timing() -> Dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    rows = {}
    for name in CANDIDATES:
        ce, csm = step_seconds(name, BATCH, 0), step_seconds(name, BATCH, 2 * BATCH)
        rows[name] = {"ce_step_s": round(ce, 4), "csm_step_s": round(csm, 4),
                      "projected_training_minutes": {
                          str(e): {"ce": round(e * STEPS_PER_EPOCH * ce / 60, 1),
                                   "csm": round(e * STEPS_PER_EPOCH * csm / 60, 1)} for e in LENGTHS}}
        print(name, json.dumps(rows[name]), flush=True)
    return {"torch_threads": 1, "batch": BATCH, "steps_per_epoch": STEPS_PER_EPOCH, "models": rows}


def cell_options(model: str, epochs: int, data: Path, cell_dir: Path, loss: str = "ce",
                 csm_dataset: Optional[str] = None) -> Dict[str, Any]:
    """The amendment-2 recipe on the pilot data: the backbone and the recipe length replaced, nothing else."""
    recipe = base_recipe(name="matched")
    for key in ("val_size", "data_seed", "max_train_samples", "model_kwargs", "n_aug"):
        recipe.pop(key, None)
    recipe.update(model=model, epochs=epochs, decay_milestones=LENGTHS[epochs], dataset=str(data),
                  val_split="validation", loss=loss, seed=0, output=str(cell_dir), experiment=".", progress=False)
    if csm_dataset:
        recipe.update(csm_dataset=csm_dataset, n_aug=1)
    return recipe


def run_pilot_cell(name: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """One pilot cell (resumable); its validation numbers, checkpoint epoch and wall seconds."""
    from timm_csm.recipes.cells import RESULTS, run_cell

    cell_dir = Path(options["output"])
    t0, cpu0 = time.time(), time.process_time()
    results = run_cell(options, cell_dir, name, 0)
    meta = json.loads((cell_dir / "cell.json").read_text())
    val = results["val"]["pre_ts"]
    return {"val_ece": round(100 * val["ece"], 2), "val_accuracy": round(100 * val["accuracy"], 2),
            "val_confidence": round(100 * val["confidence"], 2), "val_nll": round(val["nll"], 4),
            "val_ece_after_ts": round(100 * results["val"]["post_ts"]["ece"], 2),
            "temperature": results["temperature"], "checkpoint_epoch": results["checkpoint_epoch"],
            "seconds": meta.get("seconds", round(time.time() - t0, 1)),
            # CPU seconds of this process's run (0 for a cell finished earlier): the cost on a loaded machine
            "cpu_seconds": round(time.process_time() - cpu0, 1), "results": str(cell_dir / RESULTS)}


def plan(timings: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The (candidate, length) pairs within the CSM budget, in the rule's order (shorter length first)."""
    out = []
    for name in CANDIDATES:
        for epochs in sorted(LENGTHS):
            minutes = timings["models"][name]["projected_training_minutes"][str(epochs)]["csm"]
            out.append({"model": name, "epochs": epochs, "projected_csm_minutes": minutes,
                        "within_budget": minutes <= MAX_CSM_MINUTES})
    return out


def run_cells(record: Dict[str, Any]) -> Dict[str, Any]:
    """The CE cells the rule needs, in its order, stopping at the first candidate that meets it; then the chosen
    one's measured CSM cell on the real-copies control set."""
    import torch

    from timm_csm.recipes import derive

    torch.set_num_threads(1)
    data = OUTPUT / "data"
    record["data"] = export_pilot_data(data)
    cells = record.setdefault("cells", {})
    chosen = None
    for entry in plan(record["timing"]):
        if chosen is not None and entry["model"] != chosen["model"]:
            break
        if not entry["within_budget"] or (chosen and chosen["model"] == entry["model"]):
            continue
        key = f"ce-{entry['model']}-e{entry['epochs']}"
        print(f"pilot cell {key}: output in {OUTPUT / 'cells' / key}", flush=True)
        cells[key] = run_pilot_cell(key, cell_options(entry["model"], entry["epochs"], data, OUTPUT / "cells" / key))
        print(key, json.dumps(cells[key]), flush=True)
        write_record(record)
        if cells[key]["val_ece"] >= MIN_VAL_ECE:
            chosen = dict(entry, ce_cell=key)
    record["choice"] = chosen
    write_record(record)
    if chosen is not None:
        # companions drawn from the training split less a 10% hold-out (derive's default): the step's cost is the
        # same as with all 2 500 images
        copies = derive.derive_real_copies_dataset({"dataset": str(data)}, OUTPUT / "real-copies")
        report(record)
        key = f"real_copies-{chosen['model']}-e{chosen['epochs']}"
        print(f"pilot cell {key}: output in {OUTPUT / 'cells' / key}", flush=True)
        cells[key] = run_pilot_cell(key, cell_options(chosen["model"], chosen["epochs"], data, OUTPUT / "cells" / key,
                                                      loss="csm", csm_dataset=str(copies)))
        print(key, json.dumps(cells[key]), flush=True)
    write_record(record)
    return record


def write_record(record: Dict[str, Any]) -> None:
    RECORD.write_text(json.dumps(record, indent=1) + "\n")


def report(record: Dict[str, Any]) -> str:
    t = record["timing"]
    lines = ["# Amendment 4's pilot: the timm backbone (validation only)", "",
             "Command: `python benchmarks/pilot_a4.py --timing --cells` (rule: the script's docstring, written before "
             "its cells ran and committed with them, before amendment 4's text). The pilot's data holds the benchmark's 2 500 training and 2 000 validation images "
             "(data seed 0, digests checked against PROTOCOL.md) and no test split.", "",
             f"## Cost (one torch thread, batch {t['batch']}, {t['steps_per_epoch']} steps an epoch)", "",
             "| model | CE step (s) | CSM step (s) | CSM / CE | projected CSM training, 30 / 60 epochs (min) |",
             "|---|---|---|---|---|"]
    for name, row in t["models"].items():
        p = row["projected_training_minutes"]
        lines.append(f"| `{name}` | {row['ce_step_s']:.3f} | {row['csm_step_s']:.3f} | "
                     f"{row['csm_step_s'] / row['ce_step_s']:.2f} | {p['30']['csm']} / {p['60']['csm']} |")
    lines += ["", f"A (model, length) is in budget when its projected CSM training is at most {MAX_CSM_MINUTES:g} "
              "minutes.", "", "## Cells (training seed 0, validation numbers only)", "",
              "| cell | val ECE before TS (%) | val accuracy (%) | val confidence (%) | val NLL | val ECE after TS (%) "
              "| T | checkpoint epoch | wall (min) | CPU (min) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, c in record.get("cells", {}).items():
        lines.append(f"| `{key}` | {c['val_ece']:.2f} | {c['val_accuracy']:.2f} | {c['val_confidence']:.2f} | "
                     f"{c['val_nll']:.4f} | {c['val_ece_after_ts']:.2f} | {c['temperature']:.2f} | "
                     f"{c['checkpoint_epoch']} | {c['seconds'] / 60:.1f} | "
                     + (f"{c['cpu_seconds'] / 60:.1f} |" if c.get("cpu_seconds") else "- |"))
    choice = record.get("choice")
    lines += ["", "## Choice", "",
              (f"`{choice['model']}` at {choice['epochs']} epochs: the first candidate in budget whose CE cell "
               f"reaches validation ECE >= {MIN_VAL_ECE:g}% before TS." if choice else
               "None: no candidate met the rule.")]
    if choice and not any(k.startswith("real_copies-") for k in record.get("cells", {})):
        lines += ["", "The chosen backbone's measured CSM cell (the real-copies control) is pending: it did not finish "
                  "before amendment 4's cells took the machine; amendment 4's CSM cells record their CPU seconds."]
    text = "\n".join(lines) + "\n"
    PAGE.write_text(text)
    return text


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timing", action="store_true", help="measure the step times (writes the record)")
    p.add_argument("--cells", action="store_true", help="run the CE cells the rule needs and the chosen one's CSM "
                   "cell (after --timing)")
    p.add_argument("--report", action="store_true", help="write the page from the record")
    args = p.parse_args(argv)
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    if args.timing:
        record["timing"] = timing()
        write_record(record)
    if args.cells:
        if "timing" not in record:
            p.error("run --timing first")
        run_cells(record)
    if args.report or args.cells:
        print(report(record))


if __name__ == "__main__":
    main()

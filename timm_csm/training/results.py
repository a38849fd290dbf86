"""The test evaluation of a training run: the test and validation splits predicted, scored before and after each
calibrator of ``--calibrators`` (:func:`~timm_csm.evaluation.evaluate_calibration`), under shift when asked
(:class:`~timm_csm.evaluation.ShiftEvaluation`, with every calibrator), and written as results.json, results.md and
the reliability diagrams (:func:`~timm_csm.training.write_results`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from ..io import read_model_meta
from ..evaluation import evaluate_calibration, predict
from .checkpoint import saved_temperature
from .config import TrainConfig
from .reporting import write_results

__all__ = ["evaluate_run"]


def evaluate_run(config: TrainConfig, model, val_loader, test_loader, accelerator, out_dir: Path, data,
                 best: Dict[str, Any], weights_path, run_id: str, shift=None, predict_split=None,
                 eval_transform=None) -> Dict[str, Any]:
    """Predict the test and validation splits, score them (:func:`~timm_csm.evaluation.evaluate_calibration`), under
    ``shift`` too (:class:`~timm_csm.evaluation.ShiftEvaluation`, with ``predict_split`` and the
    ``eval_transform`` it applies), and write the reports (main process); the results dict of results.json."""
    def predictions(loader):
        return (predict(model, loader, accelerator, features=bool(config.piece), channels_last=config.channels_last)
                if loader is not None else None)

    test, val = predictions(test_loader), predictions(val_loader)
    fitted = None  # an eval-only run without validation images applies the temperature its checkpoint's run fitted
    if config.eval_only and val is None:
        fitted = saved_temperature(config.checkpoint)
    scores = evaluate_calibration(val, test, n_bins=config.n_bins, calibrators=config.calibrators,
                                  options={"ts_method": config.ts_method}, with_piece=config.piece,
                                  fitted=fitted[0] if fitted else None, bootstrap=config.bootstrap)
    if config.eval_only:  # the checkpoint's own epoch, not a selection of this run
        best = dict(best, epoch=(read_model_meta(config.checkpoint) or {}).get("epoch"))
    results: Dict[str, Any] = {
        "dataset": str(config.dataset), "model": config.model, "loss": config.loss, "n_train": len(data.train),
        "n_val": len(data.val), "n_test": len(data.test) if data.test is not None else 0, "n_bins": config.n_bins,
        "ts_method": config.ts_method,
        "select_by": config.select_by, "checkpoint": None if weights_path is None else str(weights_path),
        "checkpoint_epoch": best.get("epoch"), "eval_only": bool(config.eval_only),
        "temperature_source": fitted[1] if fitted else None,
        "num_processes": accelerator.num_processes, "output_dir": str(out_dir), "run_id": run_id,
        **scores.metrics,
    }
    shown = test if test is not None else val  # without a test split the reports show the validation images
    if shift is not None:
        results.update(shift.run(predict_split, data.test if test is not None else data.val, shown[:2],
                                 val[:2] if val is not None else None, scores.calibrators, n_bins=config.n_bins,
                                 resamples=config.bootstrap, log=accelerator.print, transform=eval_transform,
                                 progress=config.progress))
    if accelerator.is_main_process:
        accelerator.print(write_results(out_dir, results, shown[0], shown[1], scores.post_logits, scores.scaler,
                                        split=_shown_split(config, test is not None),
                                        diagrams=config.reliability_diagrams))
    return results


def _shown_split(config: TrainConfig, has_test: bool) -> str:
    """The name of the split the reports show: ``--test-split``, the images ``--test-fraction`` held out (no split of
    the dataset: ``test_split`` is None), else the validation images."""
    if not has_test:
        return "validation"
    return config.test_split or f"held-out test ({config.test_fraction:g})"

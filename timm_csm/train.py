"""Train any timm classifier with any registered calibration loss (CSM included) and evaluate its calibration.

    timm-csm-train --model small_cnn --dataset digits --loss csm --csm-dataset csm-digits-aug --epochs 5
    accelerate launch -m timm_csm.train --model swin_tiny --dataset cifar10 --loss csm --csm-dataset org/csm-cifar10-aug

Pipeline of one run (``run(config)``; ``main(argv)`` is the command line; the pieces live in
:mod:`timm_csm.training`):

1. data (:mod:`~timm_csm.training.data`): ``--dataset`` is opened (the embedded sets in memory, any other read
   lazily, decoded per batch in the DataLoader workers); the ``--val-split`` split, else a
   seeded ``--val-fraction`` of the training split, is the validation set for checkpoint selection, stateful-loss
   hooks and temperature scaling; the test split is ``--test-split``, else ``test``, ``validation`` or ``val``
   (a flat ``<class>/<image>`` folder has none: the run says so and reports its validation images). CSM
   companions come from ``--csm-dataset`` (the published generated dataset) through
   :class:`~timm_csm.data.CSMCollator`.
2. training (defaults: the CIFAR recipe of the CSM paper: SGD 0.1 without Nesterov, momentum 0.9, weight decay
   5e-4 on every parameter, LR x0.1 at epochs 80 and 120 of 200, batch 128, gradient-norm clip 2, seed 12345):
   a task (:mod:`~timm_csm.training.tasks`, chosen from the loss's registry spec and ``--mixup`` /
   ``--regmixup``) builds the batches and computes each step's loss: plain losses, Mixup, RegMixup
   (``(loss(f(x), y) + w * CE(f(x~), y~)) / 2``, the released code's mean; ``--regmixup-reduction sum`` drops the
   1/2), RankMixup ("mrl", "mndcg": clean and mixed copies in two passes) and CSM (real and generated batches in
   two passes, separate batch-norm statistics, one backward pass of ``loss(logits_real, y, logits_gen, q_gen)``).
   After each epoch (:mod:`~timm_csm.training.loop`): validation logits (gathered over processes), the loss's
   ``sync`` and ``on_epoch_end`` hooks, the scheduler step, the per-epoch log, ``last.safetensors`` (model,
   optimizer, scheduler, loss state, RNG) and ``model_best.safetensors`` when ``--select-by`` improves
   (:mod:`~timm_csm.training.checkpoint`), timm's ``summary.csv``. timm's ``--sync-bn``, ``--model-ema``,
   ``--grad-accum-steps``, ``--channels-last`` and ``--torchcompile`` keep timm's meaning
   (:mod:`~timm_csm.training.prepare`); trackers (``--log-with``, ``--log-wandb``) get the per-update loss, the
   epoch rows and the final metrics (:mod:`~timm_csm.training.trackers`).
3. evaluation of the best checkpoint on the test split, before and after temperature scaling fitted on the
   validation split (``--ts-method``), optionally PIECE (``--piece``) (:mod:`~timm_csm.training.evaluation`):
   ``results.json``, ``results.md``, reliability diagrams (:mod:`~timm_csm.training.reporting`).

Batches are sharded by :class:`~timm_csm.data.GlobalBatchSampler`: each process takes its slice of a global
batch of ``num_processes * batch_size`` samples, with augmentation and companion randomness keyed per sample, so a
run on R processes with batch B sees the same samples, crops and companions as one process with batch R*B.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Union

import torch

from . import __version__
from .cli import console_command
from .io import read_model_meta, safetensors_metadata, write_text_atomic
from .training.args import CONFIG_MARKER, RUN_META_KEYS, build_parser
from .training.checkpoint import saved_temperature
from .training.config import TrainConfig
from .training.prepare import check_training_options
from .training.trackers import log_results, start_trackers, tracker_names
from .training import (CHECKPOINT_LAST, apply_input_size, build_transforms, check_model_name,
                       check_resumed_processes, claim_run_dir, config_record, create_criterion, create_train_model,
                       eval_loader, evaluate_calibration, fill_from_checkpoint, fit, input_channels, load_best,
                       load_csm_groups, load_data, load_model_weights, load_resumed, new_run_id, parse_args, predict,
                       resolve_config, select_task, write_results)
from .training.shift import ShiftEvaluation

__all__ = ["run", "main", "evaluate_checkpoint", "RunInterrupted", "end_process_group", "exit_interrupted"]


def _make_accelerator(config: TrainConfig, out_dir: Optional[Path]):
    """An ``Accelerator`` for ``config``; its trackers (``--log-with``, ``--log-wandb``) only with the run folder
    ``out_dir``."""
    from accelerate import Accelerator

    kwargs = {}
    if config.amp:
        kwargs["mixed_precision"] = "bf16" if config.amp_dtype == "bfloat16" else "fp16"
    if config.cpu:
        kwargs["cpu"] = True
    if tracker_names(config) and out_dir is not None:
        kwargs["log_with"] = tracker_names(config)
        kwargs["project_dir"] = str(out_dir)
    return Accelerator(**kwargs)


def _experiment_dir(config: TrainConfig) -> Path:
    """The experiment folder a new run asks for (a taken one gives way to ``<name>-1``, ...; see run_dir)."""
    if config.experiment:
        return Path(config.output) / config.experiment
    if config.eval_only and config.checkpoint and "output" not in config.explicit:  # beside the checkpoint
        whole = config.test_split == config.train_split  # a folder of held-out images, scored whole
        split = "" if whole else f"-{config.test_split}"
        return Path(config.checkpoint).parent / f"eval-{Path(str(config.dataset)).name}{split}"
    name = f"{Path(str(config.dataset)).name}-{config.model}-{config.loss}"
    return Path(config.output) / name


def _model_meta(config: TrainConfig, data_info: Dict[str, Any]) -> Dict[str, Any]:
    """The run metadata stored with every model file and training state (what eval-only and loaders read)."""
    meta = {k: getattr(config, k) for k in RUN_META_KEYS}
    meta["model_kwargs"] = [list(kv) for kv in (config.model_kwargs or [])]
    meta.update(data_info)
    return meta


def _prepare_config(config: TrainConfig) -> Optional[Dict[str, Any]]:
    """Complete and check ``config`` before anything is built: a checkpoint's metadata (eval-only), the configuration
    of a resumed run (``--resume``, or ``--auto-resume`` finding one); returns the resumed state (None: new run)."""
    if config.eval_only:
        if not config.checkpoint:
            raise ValueError("--eval-only needs --checkpoint PATH")
        if not os.path.isfile(config.checkpoint):
            raise FileNotFoundError(f"--checkpoint {config.checkpoint} does not exist or is not a file")
        if safetensors_metadata(config.checkpoint) is None:
            raise ValueError(f"--checkpoint {config.checkpoint} is not a safetensors file (a pickle or JSON?); "
                             "--eval-only reads the model files train.py writes, never unpickles")
        taken = fill_from_checkpoint(config)
        if taken:
            print("train.py: --eval-only takes from the checkpoint's run: " + ", ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in taken.items()) + " (give a flag to override)",
                  file=sys.stderr)
        _refuse_training_split(config)
        _require_preprocessing(config)
    elif config.auto_resume and not config.resume and (_experiment_dir(config) / CHECKPOINT_LAST).exists():
        config.resume = str(_experiment_dir(config) / CHECKPOINT_LAST)
    resume_state = load_resumed(config) if config.resume and not config.eval_only else None
    for name, least in (("batch_size", 1), ("epochs", 0), ("n_bins", 1), ("bootstrap", 0)):
        value = getattr(config, name)
        if value is None or value < least:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {value}")
    check_training_options(config)
    return resume_state


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C after the run took its ``folder``; ``message`` says where the run is and the command that continues it."""

    def __init__(self, folder: Path, eval_only: bool):
        super().__init__(str(folder))
        self.folder = folder
        if eval_only:
            self.message = f"the evaluation in {folder} stopped; run the same command again"
        elif (folder / CHECKPOINT_LAST).exists():
            self.message = f"the run is in {folder}; continue it with: {_resume_command(folder)}"
        else:
            self.message = (f"the run in {folder} had not finished an epoch, so there is nothing to resume; run the "
                            "same command again to start over")


def _resume_command(folder: Path) -> str:
    """The command that resumes the run in ``folder``, on as many processes as this launch has."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    launcher = (f"accelerate launch --num_processes {processes} -m timm_csm.train" if processes > 1 else
                "timm-csm-train")
    return f"{launcher} --resume {folder / CHECKPOINT_LAST}"


_PASSED_OVER = {"in use": "is in use by another run", "finished": "holds a finished run",
                "other": "holds another run's files"}


def _run_folder_line(asked: Path, lock) -> str:
    """``run folder: ...``, saying why a new run did not take the folder it asked for when it took ``<name>-1``, ..."""
    line = f"run folder: {lock.path}"
    if lock.passed_over == "interrupted":
        return (f"{line} ({asked} holds an interrupted run; to continue that one instead: {_resume_command(asked)}, "
                "or add --auto-resume)")
    if lock.passed_over is not None:
        return f"{line} ({asked} {_PASSED_OVER[lock.passed_over]})"
    return line


def _require_preprocessing(config: TrainConfig) -> None:
    """--eval-shift / --ood corrupt or score images as the model sees them: an evaluated checkpoint must record its
    normalisation (or the flags give it), else the shift would be measured through a guessed transform."""
    if (config.eval_shift or config.ood) and (config.mean is None or config.std is None):
        raise ValueError(f"--eval-shift / --ood need the model's preprocessing and {config.checkpoint} records no "
                         "normalisation (not a model file of train.py): give --mean and --std (and --img-size)")


def _refuse_training_split(config: TrainConfig) -> None:
    """--eval-only never scores the split the checkpoint trained on (a flat folder's only split, ``train``, is
    scored when it is another folder than the training run's)."""
    from .data.sources import same_dataset

    meta = read_model_meta(config.checkpoint) or {}
    trained = meta.get("train_split") or "train"
    if config.test_split == trained and same_dataset(meta.get("dataset"), config.dataset):
        raise ValueError(f"--test-split {config.test_split!r} of {config.dataset} is the split {config.checkpoint} was "
                         "trained on; score a held-out split or folder")


def _take_run_dir(config: TrainConfig, accelerator, resume_state):
    """(lock, folder, run id): the main process takes the run folder (see :mod:`timm_csm.training.run_dir`), every
    process learns which, and the main process prints it; the lock is None on the other processes. A refusal is
    raised on every process."""
    from accelerate.utils import broadcast_object_list

    lock, message = None, [None, None, None]  # folder, run id, error
    if accelerator.is_main_process:
        try:
            if resume_state is not None:
                run_id = resume_state["meta"]["run_id"]
                lock = claim_run_dir(Path(config.resume).parent, run_id, resumes=run_id)
            else:
                run_id, auto = new_run_id(), config.auto_resume and not config.eval_only
                fixed = config.experiment is not None and Path(config.experiment) == Path(".")
                lock = claim_run_dir(_experiment_dir(config), run_id, numbered=not (fixed or auto),
                                     replace_unfinished=auto)
            message = [str(lock.path), run_id, None]
            print(_run_folder_line(_experiment_dir(config), lock), flush=True)
        except ValueError as e:
            message[2] = str(e)
    broadcast_object_list(message)
    if message[2] is not None:
        raise ValueError(message[2])
    return lock, Path(message[0]), message[1]


def _build(config: TrainConfig):
    """Data, loss, task, CSM companions, model and transforms: everything that can fail before training (the task
    is None with ``--eval-only``)."""
    from .data import CSMCompanionSampler, LazyImages, pil_mode

    apply_input_size(config)
    data = load_data(config)
    k = len(data.class_names)
    if config.eval_only:  # labels read in another class order would be scored silently as wrong
        stored = (read_model_meta(config.checkpoint) or {}).get("class_names")
        if stored is not None and list(stored) != list(data.class_names):
            raise ValueError(f"the checkpoint's classes {list(stored)[:5]}... differ from the dataset's "
                             f"{list(data.class_names)[:5]}... ({len(stored)} vs {k}); score the data the model "
                             "was trained on, or rename the class folders")
    if config.num_classes is not None and config.num_classes != k:
        raise ValueError(f"--num-classes {config.num_classes} but the dataset has {k} classes")
    criterion, spec = create_criterion(config, len(data.train)) if not config.eval_only else (None, None)
    task_cls = select_task(config, spec) if not config.eval_only else None
    in_chans = input_channels(config, data)
    model = create_train_model(config.model, k, in_chans, config.img_size, pretrained=config.pretrained,
                               pretrained_path=config.pretrained_path, initial_checkpoint=config.initial_checkpoint,
                               drop=config.drop, drop_path=config.drop_path,
                               model_kwargs=dict(config.model_kwargs or []))
    shift = ShiftEvaluation.create(config.eval_shift, config.shift_severities, config.ood, config.ood_split,
                                   seed=config.seed, in_dataset=config.dataset, class_names=data.class_names,
                                   data_dir=config.data_dir)
    data.ood = shift.ood if shift is not None else None
    train_tf, eval_tf, data_info = build_transforms(config, data, in_chans, getattr(model, "pretrained_cfg", None))
    data_info.update(num_classes=k, class_names=data.class_names)
    companions = None
    if task_cls is not None and task_cls.needs_companions:
        groups = load_csm_groups(config, data.class_names)
        if isinstance(groups.images, LazyImages):  # decoded in the real images' mode, as they are read
            groups.images = groups.images.with_output(pil_mode(in_chans), tuple(train_tf.img_size))
        companions = CSMCompanionSampler(groups, n_aug=config.n_aug, num_classes=k)
    task = (task_cls.from_config(config, model, criterion, k, companions, spec, data_info=data_info)
            if task_cls is not None else None)
    return data, task, model, train_tf, eval_tf, data_info, shift


def run(config: Union[TrainConfig, Dict[str, Any], argparse.Namespace]) -> Dict[str, Any]:
    """Train (unless ``eval_only``) and evaluate; returns the results dict also written to results.json.

    ``config``: a :class:`~timm_csm.training.config.TrainConfig` (from :func:`parse_args`, a YAML file or Python),
    a dict of option names (``"batch_size"`` or ``"batch-size"``) or an ``argparse.Namespace``; options not given
    take the command-line defaults. The run completes a copy of it. The run writes into a folder of its own
    (:mod:`timm_csm.training.run_dir`), under a run id recorded in args.yaml, the training states, the model files
    and results.json; ``resume`` continues a run in its folder with its stored configuration.
    """
    config = resolve_config(config)
    resume_state = _prepare_config(config)
    from accelerate.utils import set_seed

    check_model_name(config.model)
    if not config.eval_only:
        from .losses import get_loss_entrypoint

        get_loss_entrypoint(config.loss)  # unknown names list the registered losses
    accelerator = _make_accelerator(config, None)
    check_resumed_processes(resume_state, accelerator)
    set_seed(config.seed)
    data, task, model, train_tf, eval_tf, data_info, shift = _build(config)
    lock, out_dir, run_id = _take_run_dir(config, accelerator, resume_state)
    try:
        if tracker_names(config):  # trackers write into the run folder, known only now
            accelerator = _make_accelerator(config, out_dir)
            start_trackers(accelerator, config, out_dir.name)
        meta = dict(_model_meta(config, data_info), run_id=run_id, config=config_record(config),
                    num_processes=accelerator.num_processes)
        if accelerator.is_main_process:
            import yaml

            record = dict(run_id=run_id, **{CONFIG_MARKER: __version__}, **meta["config"])
            write_text_atomic(out_dir / "args.yaml", yaml.safe_dump(record, sort_keys=False))
        eval_bs = config.validation_batch_size or config.batch_size
        val_loader = eval_loader(data.val, eval_tf, eval_bs, config, accelerator) if len(data.val) else None
        test_loader = eval_loader(data.test, eval_tf, eval_bs, config, accelerator) if data.test is not None else None
        if data.test is None:
            accelerator.print(f"train.py: {config.dataset} has no test split: the results are on the {len(data.val)} "
                              "validation images, which select the checkpoint and fit the temperature (name a "
                              "held-out split with --test-split, or score a held-out folder with --eval-only)")
        history: List[Dict[str, Any]] = []
        best: Dict[str, Any] = {"value": None, "epoch": None, "metric": config.select_by}
        if not config.eval_only:
            history, best = fit(config, task, data.train, train_tf, accelerator, out_dir, meta, val_loader,
                                resume_state)
            accelerator.wait_for_everyone()
            weights_path = load_best(model, out_dir, best, run_id)
        else:
            load_model_weights(model, config.checkpoint)
            weights_path = Path(config.checkpoint)
        model = model.to(accelerator.device, memory_format=torch.channels_last if config.channels_last else
                         torch.preserve_format)

        def predict_split(split):  # the corrupted test splits and the OOD split, as the test split is predicted
            return predict(model, eval_loader(split, eval_tf, eval_bs, config, accelerator), accelerator,
                           channels_last=config.channels_last)[:2]

        results = _evaluate(config, model, val_loader, test_loader, accelerator, out_dir, data, best, weights_path,
                            run_id, shift, predict_split)
        results["history"] = history
        log_results(accelerator, results, step=history[-1].get("step", 0) if history else 0)
        accelerator.wait_for_everyone()
        for tracker in accelerator.trackers:
            tracker.finish()
        accelerator.print(f"run folder: {out_dir} (results.json, results.md, reliability diagrams)")
        return results
    except KeyboardInterrupt:
        raise RunInterrupted(out_dir, config.eval_only) from None
    finally:
        if lock is not None:
            lock.release()


def _evaluate(config: TrainConfig, model, val_loader, test_loader, accelerator, out_dir: Path, data,
              best: Dict[str, Any], weights_path, run_id: str, shift=None, predict_split=None) -> Dict[str, Any]:
    """Predict the test and validation splits, score them (:func:`~timm_csm.training.evaluate_calibration`), under
    ``shift`` too (:class:`~timm_csm.training.shift.ShiftEvaluation`, with ``predict_split``), and write the reports
    (main process); the results dict of results.json."""
    def predictions(loader):
        return (predict(model, loader, accelerator, features=bool(config.piece), channels_last=config.channels_last)
                if loader is not None else None)

    test, val = predictions(test_loader), predictions(val_loader)
    fitted = None  # an eval-only run without validation images applies the temperature its checkpoint's run fitted
    if config.eval_only and val is None:
        fitted = saved_temperature(config.checkpoint)
    scores = evaluate_calibration(val, test, n_bins=config.n_bins, ts_method=config.ts_method, with_piece=config.piece,
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
        calibrators = {"temperature_scaling": scores.scaler} if scores.scaler is not None else {}
        results.update(shift.run(predict_split, data.test if test is not None else data.val, shown[:2],
                                 val[:2] if val is not None else None, calibrators, n_bins=config.n_bins,
                                 resamples=config.bootstrap, log=accelerator.print))
    if accelerator.is_main_process:
        accelerator.print(write_results(out_dir, results, shown[0], shown[1], scores.post_logits, scores.scaler,
                                        split=config.test_split if test is not None else "validation"))
    return results


def evaluate_checkpoint(checkpoint, **options) -> Dict[str, Any]:
    """Evaluate a saved checkpoint (``--eval-only --checkpoint``); ``options`` as in :func:`run`."""
    return run(dict(options, eval_only=True, checkpoint=str(checkpoint)))


@console_command("timm-csm-train", build_parser)
def main(argv: Optional[Sequence[str]] = None) -> None:
    """Command-line entry point: ``timm-csm-train``, ``accelerate launch -m timm_csm.train``, ``train.py`` (the
    results are in the run folder; :func:`run` returns them). An error is one line, exit status 2; Ctrl-C one line
    naming the run folder and the command that resumes it, exit status 130."""
    try:
        folder = run(parse_args(argv))["output_dir"]
        if os.environ.get("RANK", "0") == "0":
            print(f"next: timm_csm.training.load_trained_classifier({folder!r}) loads the model; timm-csm-calibrate "
                  f"--model {folder} fits other calibrators")
    except (ValueError, FileNotFoundError) as e:
        print(f"{_program()}: error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except RunInterrupted as e:
        exit_interrupted(e.message)
    except KeyboardInterrupt:
        exit_interrupted("before the run took its folder; nothing was written")
    finally:
        end_process_group()


def _program() -> str:
    """The name this command was started by (``timm-csm-train``, ``train.py``), for its messages."""
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "timm-csm-train"


def exit_interrupted(message: str) -> NoReturn:
    """End a command stopped with Ctrl-C: ``interrupted: <message>`` (where the work is, how to continue) as one
    line on stderr from the main process, exit status 130 as a shell reports SIGINT, and no traceback."""
    if os.environ.get("RANK", "0") == "0":
        print(f"\ninterrupted: {message}", file=sys.stderr, flush=True)
    raise SystemExit(130)


def end_process_group() -> None:
    """Destroy the default ``torch.distributed`` process group if one is initialised (no-op otherwise).

    A process that exits with a live gloo group can abort (SIGABRT): gloo's worker thread
    (``ProcessGroupGloo::runLoop``) frees the last work object while the interpreter finalises. Entry points call
    this before they exit, also on errors, as accelerate's ``Accelerator.end_training`` does.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

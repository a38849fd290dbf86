"""Train any timm classifier with any registered calibration loss (CSM included) and evaluate its calibration:
:func:`run`, the library call behind ``timm-csm-train`` (:mod:`timm_csm.commands.train`).

    timm-csm-train --model small_cnn --dataset digits --loss csm --csm-dataset csm-digits-aug --epochs 5
    accelerate launch -m timm_csm.commands.train --model swin_tiny --dataset cifar10 --loss csm \\
        --csm-dataset org/csm-cifar10-aug

Pipeline of one run (``run(config)``; the pieces live in the other modules of :mod:`timm_csm.training`):

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
   two passes, separate batch-norm statistics, or in one with ``--csm-forward concat``; one backward pass of
   ``loss(logits_real, y, logits_gen, q_gen)``).
   After each epoch (:mod:`~timm_csm.training.loop`): validation logits (gathered over processes), the loss's
   ``sync`` and ``on_epoch_end`` hooks, the scheduler step, the per-epoch log, ``last.safetensors`` (model,
   optimizer, scheduler, loss state, RNG) and ``model_best.safetensors`` when ``--select-by`` improves
   (:mod:`~timm_csm.training.checkpoint`), timm's ``summary.csv``. timm's ``--sync-bn``, ``--model-ema``,
   ``--grad-accum-steps``, ``--channels-last`` and ``--torchcompile`` keep timm's meaning
   (:mod:`~timm_csm.training.prepare`); trackers (``--log-with``, ``--log-wandb``) get the per-update loss, the
   epoch rows and the final metrics (:mod:`~timm_csm.training.trackers`).
3. evaluation of the best checkpoint on the test split, before and after each calibrator of ``--calibrators``
   fitted on the validation split (temperature scaling by default, its fit ``--ts-method``), optionally PIECE
   (``--piece``) (:func:`timm_csm.evaluation.evaluate_calibration`):
   ``results.json``, ``results.md``, reliability diagrams (:mod:`~timm_csm.training.results`,
   :mod:`~timm_csm.training.reporting`).

Batches are sharded by :class:`~timm_csm.data.GlobalBatchSampler`: each process takes its slice of a global
batch of ``num_processes * batch_size`` samples, with augmentation and companion randomness keyed per sample, so a
run on R processes with batch B sees the same samples, crops and companions as one process with batch R*B.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict, List, Union

import torch

from .. import __version__
from ..evaluation import ShiftEvaluation, predict
from ..evaluation.model import check_model_name, create_train_model, load_model_weights
from ..io import read_model_meta, write_text_atomic
from .args import CONFIG_MARKER, model_meta, prepare_config, resolve_config
from .checkpoint import load_best
from .config import TrainConfig
from .data import (HELD_OUT_DIGESTS, apply_input_size, build_transforms, eval_loader, held_out_digests,
                   input_channels, load_csm_groups, load_data)
from .loop import fit
from .optim import fit_decay_to_epochs
from .results import evaluate_run
from .run_dir import RunInterrupted, check_resumed_processes, config_record, take_run_dir
from .tasks import create_criterion, select_task
from .trackers import log_results, make_accelerator, start_trackers, tracker_names

__all__ = ["run", "evaluate_checkpoint"]


def _build(config: TrainConfig):
    """Data, loss, task, CSM companions, model and transforms: everything that can fail before training (the task
    is None with ``--eval-only``)."""
    from ..data import CSMCompanionSampler, LazyImages, pil_mode

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

    ``config``: a :class:`~timm_csm.training.config.TrainConfig` (from :func:`~timm_csm.training.args.parse_args`, a
    YAML file or Python), a dict of option names (``"batch_size"`` or ``"batch-size"``) or an
    ``argparse.Namespace``; options not given take the command-line defaults. The run completes a copy of it. The
    run writes into a folder of its own (:mod:`timm_csm.training.run_dir`), under a run id recorded in args.yaml,
    the training states, the model files and results.json; ``resume`` continues a run in its folder with its stored
    configuration.
    """
    config = resolve_config(config)
    resume_state = prepare_config(config)
    # a new run's decay fitted to --epochs before anything loads (a resumed run keeps the schedule it trained with);
    # the note is printed once the run has started
    decay_note = fit_decay_to_epochs(config) if not config.eval_only and resume_state is None else None
    from accelerate.utils import set_seed

    check_model_name(config.model)
    if not config.eval_only:
        from ..losses import get_loss_entrypoint

        get_loss_entrypoint(config.loss)  # unknown names list the registered losses
    accelerator = make_accelerator(config, None)
    check_resumed_processes(resume_state, accelerator)
    set_seed(config.seed)
    data, task, model, train_tf, eval_tf, data_info, shift = _build(config)
    lock, out_dir, run_id = take_run_dir(config, accelerator, resume_state)
    try:
        if tracker_names(config):  # trackers write into the run folder, known only now
            accelerator = make_accelerator(config, out_dir)
            start_trackers(accelerator, config, out_dir.name)
        meta = dict(model_meta(config, data_info), run_id=run_id, config=config_record(config),
                    num_processes=accelerator.num_processes, **{HELD_OUT_DIGESTS: held_out_digests(data)})
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
        if decay_note:
            accelerator.print(f"train.py: {decay_note}")
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

        results = evaluate_run(config, model, val_loader, test_loader, accelerator, out_dir, data, best,
                               weights_path, run_id, shift, predict_split, eval_tf)
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


def evaluate_checkpoint(checkpoint, **options) -> Dict[str, Any]:
    """Evaluate a saved checkpoint (``--eval-only --checkpoint``); ``options`` as in :func:`run`."""
    return run(dict(options, eval_only=True, checkpoint=str(checkpoint)))

"""The training engine of ``timm-csm-train`` (:mod:`timm_csm.commands.train`) as a library, in the shape of timm's
``timm.task`` and ``timm.utils.checkpoint_saver``:

* :mod:`~timm_csm.training.train`: :func:`run`, one training run from its configuration to its results, and
  :func:`evaluate_checkpoint`;
* :mod:`~timm_csm.training.config`: :class:`TrainConfig`, the typed configuration every function here takes (from
  the command line, a dict, a YAML file or Python); :mod:`~timm_csm.training.args`: the command line built from it;
* :mod:`~timm_csm.training.data`: the seeded train / validation / test splits and evaluation loaders;
* the classifier factory, weight loading and :func:`load_trained_classifier` are :mod:`timm_csm.evaluation`'s
  (:mod:`~timm_csm.evaluation.model`), re-exported here;
* :mod:`~timm_csm.training.tasks`: the training tasks (plain, Mixup, RegMixup, RankMixup, CSM) and the criterion;
* :mod:`~timm_csm.training.optim`: optimizer and schedule;
* :mod:`~timm_csm.training.loop`: one epoch, the epochs of a run (prediction: :mod:`timm_csm.evaluation.predict`);
* :mod:`~timm_csm.training.prepare`: the model on its accelerator (``--sync-bn``, ``--channels-last``,
  ``--model-ema``, ``--torchcompile``); :mod:`~timm_csm.training.sync_bn`: the batch norm synchronised by all-reduce;
* :mod:`~timm_csm.training.trackers`: accelerate's experiment trackers (``--log-with``, ``--log-wandb``);
* :mod:`~timm_csm.training.checkpoint`: last / best / history checkpoints;
* :mod:`~timm_csm.training.results`: a run's test evaluation (:func:`timm_csm.evaluation.evaluate_calibration`
  before and after each of ``--calibrators``, under shift by :class:`timm_csm.evaluation.ShiftEvaluation`),
  results.json and its reports;
* :mod:`~timm_csm.training.reporting`: the log, ``results.md`` and the other reports;
* :mod:`~timm_csm.training.run_dir`: run folders (ownership, lock, run id, resumed configuration, the folder a run
  takes and the line that resumes it).
"""
from .args import build_parser, fill_from_checkpoint, parse_args, resolve_config
from .checkpoint import CHECKPOINT_BEST, CHECKPOINT_LAST, CheckpointSaver, load_best
from .config import PAPER_SEED, TrainConfig
from .data import DataSplits, apply_input_size, build_transforms, eval_loader, input_channels, load_csm_groups, load_data
from ..evaluation import Evaluation, evaluate_calibration, predict
from ..evaluation.model import (CalibratedClassifier, check_model_name, create_train_model, load_model_weights,
                                load_trained_classifier)
from .loop import fit, train_one_epoch
from .prepare import check_training_options, prepare_training
from .reporting import results_markdown, write_results
from .run_dir import (LOCK_FILE, RUN_FILES, RunDirLock, check_resumed_processes, claim_run_dir, config_record,
                      folder_run_id, load_resumed, new_run_id, restore_config)
from .sync_bn import AllReduceBatchNorm, convert_sync_batchnorm
from .tasks import (ClassificationTask, CSMTask, MixupTask, RankMixupTask, RegMixupTask, TimmMixupTask, TrainingModule,
                    TrainingTask,
                    create_criterion, select_task)
from .trackers import tracker_names
from .train import evaluate_checkpoint, run

__all__ = [
    "run", "evaluate_checkpoint", "PAPER_SEED", "TrainConfig", "build_parser", "parse_args", "resolve_config", "fill_from_checkpoint",
    "CHECKPOINT_BEST", "CHECKPOINT_LAST", "CheckpointSaver", "load_best",
    "DataSplits", "apply_input_size", "load_data", "load_csm_groups", "input_channels", "build_transforms", "eval_loader",
    "Evaluation", "evaluate_calibration", "fit", "predict", "train_one_epoch",
    "check_training_options", "prepare_training", "AllReduceBatchNorm", "convert_sync_batchnorm", "tracker_names",
    "check_model_name", "create_train_model", "load_model_weights", "load_trained_classifier",
    "CalibratedClassifier",
    "results_markdown", "write_results",
    "LOCK_FILE", "RUN_FILES", "RunDirLock", "claim_run_dir", "config_record", "folder_run_id", "new_run_id",
    "restore_config", "load_resumed", "check_resumed_processes",
    "TrainingTask", "TrainingModule", "ClassificationTask", "MixupTask", "TimmMixupTask", "RegMixupTask", "RankMixupTask", "CSMTask",
    "select_task", "create_criterion",
]

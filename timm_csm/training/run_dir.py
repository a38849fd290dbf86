"""Run folders: a folder belongs to one run, which locks it while it runs and stamps its run id on what it writes.

* A new run whose experiment folder already holds a run (or is locked) takes the first free ``<name>-1``,
  ``<name>-2``, ... beside it, as timm's ``get_outdir(..., inc=True)`` numbers experiment folders. A fixed folder
  (``--experiment .``) that holds another run is refused instead: the caller chose that exact folder.
* ``--resume`` continues in the resumed run's own folder, with the configuration stored in its training state
  (:func:`restore_config`); ``--auto-resume`` does so for the run found in the experiment folder itself.
* The lock is an exclusive ``flock`` on ``<folder>/.run.lock`` (POSIX). The kernel drops it when its process ends,
  so a killed run leaves no stale lock; the file names the holder (run id, pid, host) for the error message.
* Taking a folder removes the temporary files a killed writer left in it (:func:`timm_csm.io.remove_temp_files`).
* A run asks for :func:`experiment_dir` and takes its folder with :func:`take_run_dir` (the main process claims it,
  every process learns which); Ctrl-C after that is :class:`RunInterrupted`, whose message names the command that
  resumes the run (:func:`resume_command`).
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..io import CHECKPOINT_LAST, read_checkpoint, remove_temp_files
from .config import TrainConfig, upgrade_stored_config

__all__ = ["LOCK_FILE", "RUN_FILES", "RUN_LOCAL_OPTIONS", "RunDirLock", "new_run_id", "folder_run_id", "claim_run_dir",
           "config_record", "restore_config", "load_resumed", "check_resumed_processes", "experiment_dir",
           "RunInterrupted", "resume_command", "take_run_dir"]

LOCK_FILE = ".run.lock"
#: the files whose presence means a folder holds a run (args.yaml is written first, when the folder is taken)
RUN_FILES = ("args.yaml", "last.safetensors", "model_best.safetensors", "results.json")
#: options a resumed run may change when given: where and how fast it runs, how it reports, the number of epochs
RUN_LOCAL_OPTIONS = frozenset({"epochs", "output", "experiment", "workers", "pin_mem", "progress", "log_with",
                               "log_wandb", "validation_batch_size", "checkpoint_hist", "cpu", "channels_last",
                               "torchcompile", "torchcompile_mode"})
#: options of one invocation, never taken from the resumed run
_INVOCATION_OPTIONS = frozenset({"config", "resume", "auto_resume", "eval_only", "checkpoint"})
_KEY_VALUE_OPTIONS = ("model_kwargs", "loss_kwargs")


def new_run_id() -> str:
    """A random run id: 12 hexadecimal digits of a UUID4."""
    return uuid.uuid4().hex[:12]


def folder_run_id(folder) -> Optional[str]:
    """The run id in ``<folder>/args.yaml`` (None: no such file, or written before runs had ids)."""
    import yaml

    path = Path(folder) / "args.yaml"
    if not path.is_file():
        return None
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path} is not readable YAML ({e}); it cannot tell which run owns {folder}") from e
    return cfg.get("run_id") if isinstance(cfg, dict) else None


class RunDirLock:
    """A run folder held by this process: ``path``, and the lock released by :meth:`release` (or process exit).

    ``passed_over``: when a numbered claim gave way to ``<name>-1``, ... : why the folder asked for was not taken,
    ``"in use"`` (locked by a running run), ``"finished"`` (it holds results.json), ``"interrupted"`` (a
    last.safetensors to resume) or ``"other"`` (another run's files); None when the folder asked for was taken.
    """

    def __init__(self, path: Path, fd: int, passed_over: Optional[str] = None):
        self.path, self._fd, self.passed_over = path, fd, passed_over

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _try_lock(folder: Path, run_id: str) -> Optional[int]:
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"run_id": run_id, "pid": os.getpid(), "host": socket.gethostname()}).encode())
    return fd


def _holder(folder: Path) -> str:
    try:
        info = json.loads((folder / LOCK_FILE).read_text())
        return f"run {info['run_id']} (pid {info['pid']} on {info['host']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another run"


def _ownership_problem(folder: Path, resumes: Optional[str], replace_unfinished: bool) -> Optional[str]:
    """None when the locked ``folder`` may be used, else why not."""
    files = [name for name in RUN_FILES if (folder / name).exists()]
    if not files:
        return None
    owner = folder_run_id(folder)
    if resumes is not None:
        if owner in (None, resumes):
            return None
        return f"{folder} belongs to run {owner}, but the resumed training state is from run {resumes}"
    if replace_unfinished and not {"last.safetensors", "results.json"} & set(files):
        for name in files:  # a run killed before it finished an epoch: nothing of it can be resumed
            (folder / name).unlink()
        return None
    hint = (f"resume it (--resume {folder / 'last.safetensors'} or --auto-resume), or "
            if "last.safetensors" in files else "")
    return (f"{folder} holds another run's files ({', '.join(files)}; run {owner or 'without a run id'}): a run "
            f"folder belongs to one run; {hint}choose another --output / --experiment")


def claim_run_dir(folder, run_id: str, *, numbered: bool = False, resumes: Optional[str] = None,
                  replace_unfinished: bool = False) -> RunDirLock:
    """Lock ``folder`` (created when missing) for run ``run_id`` and return it, or raise ``ValueError`` saying why not.

    ``numbered``: when ``folder`` holds a run or is locked, take the first free ``folder-1``, ``folder-2``, ...
    ``resumes``: the run id a resumed state carries; the folder must be that run's (or hold no run id).
    ``replace_unfinished``: a folder whose run left neither ``last.safetensors`` nor ``results.json`` (killed in its
    first epoch) is taken over, its files removed. Otherwise a folder that holds a run is refused.
    """
    base, passed_over = Path(folder), None
    for i in itertools.count():
        candidate = base if i == 0 else base.with_name(f"{base.name}-{i}")
        fd = _try_lock(candidate, run_id)
        if fd is None:
            problem = (f"{candidate} is in use by {_holder(candidate)}: wait for it to end, or choose another "
                       f"--output / --experiment")
        else:
            problem = _ownership_problem(candidate, resumes, replace_unfinished)
            if problem is None:
                remove_temp_files(candidate)
                return RunDirLock(candidate, fd, passed_over)
            os.close(fd)
        if not numbered:
            raise ValueError(problem)
        if i == 0:
            passed_over = ("in use" if fd is None else "finished" if (base / "results.json").exists() else
                           "interrupted" if (base / "last.safetensors").exists() else "other")


def config_record(config: TrainConfig) -> Dict[str, Any]:
    """The options of ``config`` as JSON values (key=value lists as dicts, paths as strings): args.yaml and the
    state."""
    cfg = config.options()
    for key in _KEY_VALUE_OPTIONS:
        if key in cfg:
            cfg[key] = {str(k): v for k, v in (cfg[key] or [])}
    return json.loads(json.dumps(cfg, default=str))


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def restore_config(config: TrainConfig, stored: Dict[str, Any]) -> List[str]:
    """Give ``config`` the configuration ``stored`` by the resumed run (its :func:`config_record`).

    Every option not given explicitly (``config.explicit``) takes its stored value, except the options of the
    invocation itself (``resume``, ``config``, ...). An explicit option with another value than the stored one is a
    ``ValueError`` naming its flag, unless it is one of :data:`RUN_LOCAL_OPTIONS`; ``--epochs`` may extend the run,
    not shorten it. Returns the flags whose stored value replaced the command line's.
    """
    given, explicit = config_record(config), set(config.explicit)
    conflicts = [f"{_flag(k)} {given[k]!r} (the run has {v!r})" for k, v in stored.items()
                 if k in explicit and k in given and k not in RUN_LOCAL_OPTIONS | _INVOCATION_OPTIONS
                 and given[k] != v]
    if conflicts:
        raise ValueError("--resume continues a run with the configuration stored in its state; these options "
                         f"conflict with it: {'; '.join(conflicts)}. Drop them, or start a new run")
    restored = []
    for key, value in stored.items():
        if key in explicit or key in _INVOCATION_OPTIONS or key not in given:
            continue
        if given[key] != value:
            restored.append(_flag(key))
        setattr(config, key, list(value.items()) if key in _KEY_VALUE_OPTIONS else value)
    if config.epochs < stored["epochs"]:
        raise ValueError(f"--epochs {config.epochs}: the resumed run was set to {stored['epochs']} epochs; --epochs "
                         "can extend a resumed run, not shorten it")
    return restored


def load_resumed(config: TrainConfig) -> Dict[str, Any]:
    """The training state of ``--resume``, with its stored configuration restored into ``config``."""
    if not os.path.exists(config.resume):
        raise FileNotFoundError(f"--resume {config.resume} does not exist")
    state = read_checkpoint(config.resume, "training state", cache=False)
    meta = state.get("meta") or {}
    if "config" not in meta or "run_id" not in meta:
        raise ValueError(f"--resume {config.resume}: the state stores no run configuration (written by an earlier "
                         "timm-csm); it cannot be resumed, start a new run")
    folder, explicit = Path(config.resume).resolve().parent, set(config.explicit)
    named = Path(config.output) / config.experiment if "experiment" in explicit and config.experiment else None
    if (named is not None and named.resolve() != folder) or (named is None and "output" in explicit and Path(
            config.output).resolve() not in (folder, folder.parent)):
        raise ValueError(f"--resume continues in the resumed run's folder {folder}; --output / --experiment name "
                         f"another ({named or config.output})")
    state["restored"] = restore_config(config, upgrade_stored_config(meta["config"]))
    return state


def check_resumed_processes(resume_state, accelerator) -> None:
    """A resumed run continues on as many processes as it was trained on; say which options it took back."""
    trained_on = (resume_state or {}).get("meta", {}).get("num_processes", accelerator.num_processes)
    if trained_on != accelerator.num_processes:
        raise ValueError(f"--resume: the run was trained on {trained_on} processes, this launch has "
                         f"{accelerator.num_processes}; --batch-size is per process, so the global batch would "
                         f"change. Launch {trained_on} processes")
    restored = (resume_state or {}).get("restored")
    if restored:
        accelerator.print(f"--resume: {', '.join(restored)} taken from the resumed run's configuration")


def experiment_dir(config: TrainConfig) -> Path:
    """The experiment folder a new run asks for (a taken one gives way to ``<name>-1``, ...; see run_dir)."""
    if config.experiment:
        return Path(config.output) / config.experiment
    if config.eval_only and config.checkpoint and "output" not in config.explicit:  # beside the checkpoint
        whole = config.test_split == config.train_split  # a folder of held-out images, scored whole
        split = "" if whole else f"-{config.test_split}"
        return Path(config.checkpoint).parent / f"eval-{Path(str(config.dataset)).name}{split}"
    name = f"{Path(str(config.dataset)).name}-{config.model}-{config.loss}"
    return Path(config.output) / name


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C after the run took its ``folder``; ``message`` says where the run is and the command that continues it."""

    def __init__(self, folder: Path, eval_only: bool):
        super().__init__(str(folder))
        self.folder = folder
        if eval_only:
            self.message = f"the evaluation in {folder} stopped; run the same command again"
        elif (folder / CHECKPOINT_LAST).exists():
            self.message = f"the run is in {folder}; continue it with: {resume_command(folder)}"
        else:
            self.message = (f"the run in {folder} had not finished an epoch, so there is nothing to resume; run the "
                            "same command again to start over")


def resume_command(folder: Path) -> str:
    """The command that resumes the run in ``folder``, on as many processes as this launch has."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    launcher = (f"accelerate launch --num_processes {processes} -m timm_csm.commands.train" if processes > 1 else
                "timm-csm-train")
    return f"{launcher} --resume {folder / CHECKPOINT_LAST}"


_PASSED_OVER = {"in use": "is in use by another run", "finished": "holds a finished run",
                "other": "holds another run's files"}


def _run_folder_line(asked: Path, lock) -> str:
    """``run folder: ...``, saying why a new run did not take the folder it asked for when it took ``<name>-1``, ..."""
    line = f"run folder: {lock.path}"
    if lock.passed_over == "interrupted":
        return (f"{line} ({asked} holds an interrupted run; to continue that one instead: {resume_command(asked)}, "
                "or add --auto-resume)")
    if lock.passed_over is not None:
        return f"{line} ({asked} {_PASSED_OVER[lock.passed_over]})"
    return line


def take_run_dir(config: TrainConfig, accelerator, resume_state):
    """(lock, folder, run id): the main process takes the run folder (:func:`claim_run_dir`), every
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
                lock = claim_run_dir(experiment_dir(config), run_id, numbered=not (fixed or auto),
                                     replace_unfinished=auto)
            message = [str(lock.path), run_id, None]
            print(_run_folder_line(experiment_dir(config), lock), flush=True)
        except ValueError as e:
            message[2] = str(e)
    broadcast_object_list(message)
    if message[2] is not None:
        raise ValueError(message[2])
    return lock, Path(message[0]), message[1]

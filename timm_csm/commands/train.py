"""``timm-csm-train``: train any timm classifier with any registered calibration loss (CSM included) and evaluate
its calibration; the run is :func:`timm_csm.training.run` (its pipeline is described there).

    timm-csm-train --model small_cnn --dataset digits --loss csm --csm-dataset csm-digits-aug --epochs 5
    accelerate launch -m timm_csm.commands.train --model swin_tiny --dataset cifar10 --loss csm \\
        --csm-dataset org/csm-cifar10-aug
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from timm_csm.cli import console_command, end_process_group, exit_interrupted
from timm_csm.training.args import build_parser, parse_args
from timm_csm.training.run_dir import RunInterrupted
from timm_csm.training.train import run

__all__ = ["main"]


@console_command("timm-csm-train", build_parser)
def main(argv: Optional[Sequence[str]] = None) -> None:
    """Command-line entry point: ``timm-csm-train``, ``accelerate launch -m timm_csm.commands.train``, ``train.py``
    (the results are in the run folder; :func:`~timm_csm.training.run` returns them). An error is one line, exit
    status 2; Ctrl-C one line naming the run folder and the command that resumes it, exit status 130."""
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


if __name__ == "__main__":
    sys.exit(main())

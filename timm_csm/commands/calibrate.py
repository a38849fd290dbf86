"""``timm-csm-calibrate``: fit post-hoc calibrators to a classifier a timm user already has, on the labelled images
they already have, and report before / after (:func:`timm_csm.evaluation.calibrate`, whose docstring describes the
checks and the output; its options are :class:`~timm_csm.evaluation.CalibrateConfig`'s fields, these flags).

    timm-csm-calibrate --model runs/my-run --dataset ./holdout --calibration-split val --test-split test \\
        --calibrators temperature_scaling,dirichlet,isotonic --output calibrated/

    timm-csm-calibrate --model runs/my-run --output calibrated/     # the run's validation and held-out test images

    timm-csm-calibrate --model resnet18 --checkpoint resnet18.safetensors --num-classes 10 \\
        --input-size 1 28 28 --mean 0.1307 --std 0.3081 --dataset ./digits --test-split train \\
        --calibration-fraction 0.5 --output calibrated/
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from ..cli import HelpFormatter, console_command
from ..evaluation import CalibrateConfig, calibrate
from ..options import add_options, options_from_namespace
from ..training.data import run_held_out_splits

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    what = sys.modules[calibrate.__module__].__doc__.split("\n\n")[0]  # the library module's first paragraph
    p = argparse.ArgumentParser(prog="timm-csm-calibrate", description=what, formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="a train.py run folder or model file, or a timm model name")
    p.add_argument("--dataset", default=None, help="image folder, datasets name or folder, hfds/..., torch/... "
                                                  "(default, for a train.py run: the run's)")
    p.add_argument("--output", required=True, help="a new folder for the report and the calibrated model")
    return add_options(p, CalibrateConfig)


@console_command("timm-csm-calibrate", build_parser)
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``timm-csm-calibrate``: bad input (a model at chance accuracy included) is one line on stderr and exit
    status 2 (:func:`~timm_csm.cli.console_command`), with nothing written."""
    args = build_parser().parse_args(argv)
    calibrate(args.model, args.dataset, output=args.output, config=options_from_namespace(CalibrateConfig, args),
              held_out=run_held_out_splits, log=lambda m: print(m, file=sys.stderr))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

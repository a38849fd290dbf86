"""``timm-csm-calibrate``: fit post-hoc calibrators to a classifier a timm user already has, on the labelled images
they already have, and report before / after (:func:`timm_csm.calibrate.calibrate`, whose docstring describes the
checks and the output).

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

from .. import calibrate as library
from ..calibration import CONFORMAL_METHODS, SELECTION_METRICS, list_calibrators
from ..cli import HelpFormatter, console_command
from ..metrics import DEFAULT_N_BINS
from ..metrics.intervals import DEFAULT_RESAMPLES
from ..training.classifier import CROP_MODES, INTERPOLATIONS

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="timm-csm-calibrate", description=library.__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="a train.py run folder or model file, or a timm model name")
    p.add_argument("--checkpoint", default=None, help="weights (safetensors) of a timm model name, trained anywhere; "
                                                      "or the file to use in a run folder")
    p.add_argument("--pretrained-path", default=None, help="timm's own pretrained weights (safetensors) of a timm "
                                                           "model name: its pretrained_cfg describes them")
    p.add_argument("--dataset", default=None, help="image folder, datasets name or folder, hfds/..., torch/... "
                                                  "(default, for a train.py run: the run's)")
    p.add_argument("--calibration-split", default=None, help="the split the calibrators are fitted on")
    p.add_argument("--calibration-fraction", type=float, default=None,
                   help="hold out this seeded fraction of the test split for fitting instead")
    p.add_argument("--test-split", default=None,
                   help="the split the report scores (a flat <class>/* folder is split 'train'); default, for a "
                        "train.py run: the test images the run held out, with its validation images as the "
                        "calibration split (checked against the digests the run recorded)")
    p.add_argument("--calibrators", default=",".join(list_calibrators(default=True)),
                   help="comma-separated registry names (timm_csm.calibration.list_calibrators()), or 'auto': every "
                        "registered one that applies")
    p.add_argument("--export", default=None, help="the calibrator exported with the model (default: the lowest "
                                                  "cross-validated --select-by on the calibration split)")
    p.add_argument("--select-by", default="nll", choices=SELECTION_METRICS,
                   help="the held-out metric that chooses the exported calibrator among several")
    p.add_argument("--folds", type=int, default=5, help="folds of the calibration split in that cross-validation")
    p.add_argument("--bootstrap", type=int, default=DEFAULT_RESAMPLES,
                   help="bootstrap resamples behind the 95%% interval of every number of the report (0: none)")
    p.add_argument("--conformal", default=",".join(CONFORMAL_METHODS), help="conformal methods ('' for none)")
    p.add_argument("--alpha", type=float, default=0.1, help="conformal miscoverage level")
    p.add_argument("--output", required=True, help="a new folder for the report and the calibrated model")
    p.add_argument("--reg-lambda", type=float, default=0.0,
                   help=f"{' / '.join(list_calibrators(penalty='reg_lambda'))}: the off-diagonal weight penalty (ODIR, "
                        "Kull et al. 2019)")
    p.add_argument("--reg-mu", type=float, default=0.0,
                   help=f"{' / '.join(list_calibrators(penalty='reg_mu'))}: the intercept penalty")
    p.add_argument("--shift", nargs="?", const="all", default=None, metavar="NAMES",
                   help="also score the test split under corruptions, before and after each calibrator: 'all' (the "
                        "flag alone) or comma-separated names of timm_csm.data.corruptions.list_corruptions()")
    p.add_argument("--shift-severities", type=int, nargs="+", default=[1, 2, 3, 4, 5],
                   help="the corruption severities of --shift (1-5)")
    p.add_argument("--ood", default=None, help="an image source of none of the model's classes (any --dataset "
                                               "form): OOD detection scores against the test images")
    p.add_argument("--ood-split", default=None, help="the split of --ood (default: its test split, else 'train')")
    p.add_argument("--reliability", default="", help="extra reliability diagrams, comma-separated: adaptive "
                   "(equal-mass bins), classwise (one-vs-rest pairs of every class)")
    p.add_argument("--num-classes", type=int, default=None, help="classes of a timm model name (default: the run's)")
    g = p.add_argument_group("preprocessing of a timm model name (timm's validate.py flags; default: the model's "
                             "pretrained_cfg, and for weights trained elsewhere the images' own size, said as a guess)")
    g.add_argument("--input-size", type=int, nargs=3, default=None, metavar=("C", "H", "W"),
                   help="input channels and size (H = W)")
    g.add_argument("--in-chans", type=int, default=None, help="input channels (default: the model's, 3 for most)")
    g.add_argument("--img-size", type=int, default=None, help="input size")
    g.add_argument("--mean", type=float, nargs="+", default=None, help="normalisation mean, one value per channel")
    g.add_argument("--std", type=float, nargs="+", default=None, help="normalisation std, one value per channel")
    g.add_argument("--crop-pct", type=float, default=None, help="resize to size / crop-pct, then crop")
    g.add_argument("--crop-mode", default=None, choices=CROP_MODES, help="timm's crop mode")
    g.add_argument("--interpolation", default=None, choices=INTERPOLATIONS, help="resize interpolation")
    p.add_argument("--allow-training-split", action="store_true",
                   help="score the split the model was trained on (refused otherwise)")
    p.add_argument("--n-bins", type=int, default=DEFAULT_N_BINS, help="confidence bins of ECE-type metrics")
    p.add_argument("--batch-size", type=int, default=128, help="images per prediction batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration split and of the calibrators")
    p.add_argument("--device", default="cpu", help="torch device of the model")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--image-column", default=None, help="image column (detected when omitted)")
    p.add_argument("--label-column", default=None, help="label column (detected when omitted)")
    p.add_argument("--data-dir", default=None, help="root folder of a timm torch/<name> dataset")
    p.add_argument("--class-names", default=None, help="comma-separated names of the model's outputs, in output "
                   "order (a plain timm model carries none); the data's classes must carry the same names in "
                   "timm's order (natural sort: 1, 2, 10), so map by renaming class folders")
    return p


@console_command("timm-csm-calibrate", build_parser)
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``timm-csm-calibrate``: bad input (a model at chance accuracy included) is one line on stderr and exit
    status 2 (:func:`~timm_csm.cli.console_command`), with nothing written."""
    args = build_parser().parse_args(argv)
    data_config = {"input_size": args.input_size, "mean": args.mean, "std": args.std, "crop_pct": args.crop_pct,
                   "crop_mode": args.crop_mode, "interpolation": args.interpolation}
    library.calibrate(args.model, args.dataset, output=args.output, test_split=args.test_split,
                  calibration_split=args.calibration_split, calibration_fraction=args.calibration_fraction,
                  calibrators=[c for c in args.calibrators.split(",") if c], export=args.export,
                  conformal=[c for c in args.conformal.split(",") if c], alpha=args.alpha,
                  checkpoint=args.checkpoint, pretrained_path=args.pretrained_path, num_classes=args.num_classes,
                  in_chans=args.in_chans, img_size=args.img_size, data_config=data_config,
                  allow_training_split=args.allow_training_split,
                  n_bins=args.n_bins, batch_size=args.batch_size, seed=args.seed, device=args.device,
                  workers=args.workers, image_column=args.image_column, label_column=args.label_column,
                  data_dir=args.data_dir, reg_lambda=args.reg_lambda, reg_mu=args.reg_mu,
                  reliability=[r for r in args.reliability.split(",") if r], select_by=args.select_by,
                  folds=args.folds, bootstrap=args.bootstrap, shift=args.shift,
                  shift_severities=args.shift_severities, ood=args.ood, ood_split=args.ood_split,
                  class_names=args.class_names.split(",") if args.class_names else None,
                  log=lambda m: print(m, file=sys.stderr))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

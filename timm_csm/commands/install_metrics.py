"""``timm-csm-install-metrics``: make ``evaluate.load(name)`` find the package's calibration metrics, offline too
(:func:`timm_csm.hf_metrics.install_evaluate_modules`)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from ..cli import console_command
from ..hf_metrics import METRIC_NAMES, install_evaluate_modules

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timm-csm-install-metrics",
                                     description="Make evaluate.load('<name>') find the timm-csm calibration "
                                                 "metrics offline: " + ", ".join(METRIC_NAMES))
    parser.add_argument("names", nargs="*", help="metrics to install (default: all)")
    parser.add_argument("--cache-dir", default=None,
                        help="evaluate_modules folder (default: from HF_MODULES_CACHE / HF_HOME, as evaluate)")
    parser.add_argument("--quiet", action="store_true", help="print nothing")
    return parser


@console_command("timm-csm-install-metrics", build_parser)
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``timm-csm-install-metrics``: install the evaluate modules into the module cache (or ``--cache-dir``)."""
    args = build_parser().parse_args(argv)
    try:
        paths = install_evaluate_modules(args.names or None, args.cache_dir)
    except OSError as e:  # an unknown name (ValueError) is bad input: console_command's one line, status 2
        print(f"timm-csm-install-metrics: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        for path in paths:
            print(path)
        print(f"next: evaluate.load({(args.names or METRIC_NAMES)[0]!r}), offline too")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

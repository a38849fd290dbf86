"""Re-annotate generated groups with calibrated soft labels and save them as a Hub-layout dataset.

    timm-csm-annotate --generated runs/gen-fmnist --dataset fashion_mnist --install
    timm-csm-annotate --generated runs/gen-c100 --dataset cifar100 \\
        --encoder open_clip --model ViT-B-32 --pretrained /weights/vit_b_32-openai.safetensors --force-quick-gelu

Writes ``<output>/csm-<dataset>-aug`` (``data/<version>/train-*.parquet`` + ``README.md``). With ``--install`` a bare
``load_dataset("csm-<dataset>-aug")`` works afterwards. The default encoder is the reference classifier, trained
on the real training split on first use and cached in ``--reference-dir``. The work is
:func:`timm_csm.recipes.steps.annotate_generated_folder`; with ``--s auto`` s is fitted on a held-out share of the real
training split that the reference encoder does not see.
"""
from __future__ import annotations

import argparse
import sys

from timm_csm.annotation.config import AnnotationConfig
from timm_csm.cli import HelpFormatter, console_command
from timm_csm.options import add_options, options_from_namespace


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--generated", required=True, help="raw generation folder (plan.json + shards/)")
    p.add_argument("--dataset", default=None,
                   help="the real dataset (fashion_mnist, digits, cifar10, a Hub name or folder); "
                        "default: the generator's dataset recorded in the plan")
    p.add_argument("--image-column", default=None, help="image column of --dataset (detected when omitted)")
    p.add_argument("--label-column", default=None, help="label column of --dataset (detected when omitted)")
    p.add_argument("--output", default="runs/hub", help="folder that receives csm-<dataset>-aug")
    p.add_argument("--name", default=None, help="dataset folder name (default csm-<dataset>-aug)")
    p.add_argument("--encoder", default="reference",
                   help="features to annotate with, an encoder spec as the recipe's: reference (a reference CNN "
                        "trained here), reference:<folder> (one trained before), open_clip[:<model>[:<tag or weights "
                        "file>]] (the paper) or timm[:<model>[:<checkpoint>]]; --model, --pretrained and --checkpoint "
                        "give the fields a spec leaves out")
    add_encoder_flags(p)
    p.add_argument("--reference-dir", default=None, help="reference encoder folder (default runs/reference-<name>)")
    p.add_argument("--reference-epochs", type=int, default=4, help="epochs of the reference encoder")
    p.add_argument("--install", action="store_true", help="install for bare-name load_dataset afterwards")
    p.add_argument("--cache-dir", default=None, help="prototype cache (default $TIMM_CSM_CACHE or ~/.cache/timm_csm)")
    p.add_argument("--device", default="cpu", help="torch device of the encoder")
    return add_options(p, AnnotationConfig)


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def reference_dir(name: str, holdout: bool) -> str:
    """The default folder of the reference encoder of the CSM dataset ``name`` (``csm-<short>-aug``):
    ``runs/reference-<short>``, ``-holdout`` when it learns without the held-out share (``--s auto``)."""
    short = name[len("csm-"):-len("-aug")] if name.startswith("csm-") and name.endswith("-aug") else name
    return f"runs/reference-{short}{'-holdout' if holdout else ''}"


def train_reference(dataset: str, fit, folder, epochs: int = 4, device: str = "cpu", image_column=None,
                    label_column=None, trains=None):
    """The reference encoder of ``dataset`` trained on ``fit`` (its real training images, less any held-out share)
    into ``folder``, or reused from there; its test accuracy is measured when the dataset has a test split.
    ``trains``: the training function of the encoder kind (default the reference encoder's)."""
    from timm_csm.annotation import train_reference_encoder
    from timm_csm.data import load_image_arrays
    from timm_csm.data.sources import dataset_split_names, detect_test_split

    test_split = detect_test_split(dataset_split_names(dataset), exclude=["train"])
    test = load_image_arrays(dataset, test_split, image_column, label_column) if test_split is not None else None
    return (trains or train_reference_encoder)(fit, folder, epochs=epochs, test=test, device=device)


def add_encoder_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of every registered encoder kind (:attr:`~timm_csm.annotation.EncoderSpec.flags`), each declared
    once: a flag two kinds share (``--model``) is added by the first."""
    from timm_csm.annotation import ENCODERS

    for _, spec in ENCODERS.items():
        for flag in spec.flags:
            if flag.flag not in parser._option_string_actions:
                options = dict(flag.argparse or {})
                options.setdefault("default", False if options.get("action") == "store_true" else None)
                parser.add_argument(flag.flag, dest=flag.dest, help=flag.help, **options)


def _encoder(args, dataset: str, name: str, holdout: bool):
    """The encoder of ``--encoder`` (:func:`~timm_csm.annotation.encoder_from_options` of its spec, with the flags
    that give the fields it leaves out), or for a spec its kind trains (the bare ``reference``) a function that
    trains it on the real images it may see (without the held-out share when ``holdout``)."""
    from timm_csm.annotation import encoder_from_options, encoder_spec, parse_encoder_spec

    kind, fields = parse_encoder_spec(args.encoder)
    if encoder_spec(kind).trained_here(fields):
        ref_dir = args.reference_dir or reference_dir(name, holdout)
        return lambda fit: train_reference(dataset, fit, ref_dir, args.reference_epochs, args.device,
                                           args.image_column, args.label_column, encoder_spec(kind).trains)
    return encoder_from_options(args.encoder, vars(args), device=args.device)


@console_command("timm-csm-annotate", build_parser)
def main(argv=None):
    args = parse_args(argv)
    from timm_csm.recipes.steps import annotate_generated_folder, csm_dataset_name, generated_dataset

    dataset = args.dataset or generated_dataset(args.generated)
    name = args.name or csm_dataset_name(dataset)
    annotation = options_from_namespace(AnnotationConfig, args).resolved(dataset)
    folder, _ = annotate_generated_folder(
        args.generated, args.output, _encoder(args, dataset, name, annotation.holds_out(dataset)), annotation,
        dataset=dataset, name=name, cache_dir=args.cache_dir, install=args.install, image_column=args.image_column,
        label_column=args.label_column)
    print(f"next: timm-csm-train --dataset {dataset} --loss csm --csm-dataset {name if args.install else folder}")


if __name__ == "__main__":
    sys.exit(main())

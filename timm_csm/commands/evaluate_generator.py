"""Judge a generator before any generation is spent: the annotation's generator check (``timm-csm-annotate`` stops a
poor generator with it) on a few groups sampled here, with the same recogniser and thresholds, and its verdict.

    timm-csm-evaluate-generator --generator runs/generator-fmnist
    timm-csm-evaluate-generator --generator runs/generator-mine --dataset my_images
    timm-csm-evaluate-generator --checkpoint-of runs/generator-fmnist --profile fmnist --classifier runs/encoder

``--num-groups`` groups of ``--num-lambdas`` ratios are sampled and annotated as ``timm-csm-annotate`` annotates
(:func:`timm_csm.recipes.steps.judge_generator`): its default encoder, the reference encoder folder
(``runs/reference-<name>-holdout``, trained here on first use, so that the annotation reuses it), the prototypes of
the real training split, its checks. The verdict is the gate's: poor when the pure-class images (lambda 0 and 1) are
recognised near chance by their nearest real-class prototype, or when more than half of the groups are flagged; it
is printed with its numbers, next to the same recogniser's accuracy on real images the encoder never learned from
(the dataset's test split, or for a dataset with none, a flat ``<class>/*.png`` folder, the held-out tenth of the
training split that s is fitted on).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from timm_csm.cli import HelpFormatter, console_command
from timm_csm.generation.config import MixingConfig
from timm_csm.generation.quality import QUALITY_SAMPLER_STEPS


#: groups judged by default: 400 images of the default lambda grid, 100 of them pure-class
JUDGED_GROUPS = 50


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--generator", help="a generator folder (timm-csm-train-generator's), an EDM network pickle, or "
                                         "the name of a shipped generator (fmnist)")
    src.add_argument("--checkpoint-of", help="a generator-training folder: evaluate its latest checkpoint's EMA")
    p.add_argument("--profile", default="fmnist", help="generator profile of --checkpoint-of")
    p.add_argument("--classifier", default=None,
                   help="the reference encoder folder, trained there when it does not exist (default: the one "
                        "timm-csm-annotate uses for --dataset)")
    p.add_argument("--dataset", default="fashion_mnist",
                   help="the real dataset the generator learned (a name or an image folder [<split>/]<class>/*.png)")
    p.add_argument("--image-column", default=None, help="image column of --dataset (detected when omitted)")
    p.add_argument("--label-column", default=None, help="label column of --dataset (detected when omitted)")
    p.add_argument("--num-groups", type=int, default=JUDGED_GROUPS, help="groups sampled and annotated")
    p.add_argument("--num-lambdas", type=int, default=MixingConfig().num_lambdas,
                   help="lambda grid linspace(0, 1, n) of each group (as timm-csm-generate's)")
    p.add_argument("--steps", type=int, default=QUALITY_SAMPLER_STEPS, help="sampler steps")
    p.add_argument("--guidance-scale", type=float, default=None,
                   help="default: the generator's recommended scale (1 = no guidance for a checkpoint)")
    p.add_argument("--device", default="cpu", help="torch device of the classifier's training")
    p.add_argument("--output", default=None, help="write the result as JSON here")
    return p


def _encoder(args, real):
    """(the reference encoder, real images it never learned from or None, what they are). The default folder is the
    one annotation reuses: trained without the held-out share where annotation fits s on it (``--s auto``)."""
    from timm_csm.annotation import AnnotationConfig, holdout_rows, holdout_split, load_reference_encoder
    from timm_csm.annotation.cache import dataset_fingerprint
    from timm_csm.commands.annotate import reference_dir, train_reference
    from timm_csm.data import load_image_arrays
    from timm_csm.data.sources import dataset_split_names, detect_test_split
    from timm_csm.recipes.steps import csm_dataset_name

    annotation = AnnotationConfig()  # timm-csm-annotate's defaults: its reference encoder is the one reused
    holdout = annotation.holds_out(args.dataset)
    fit = holdout_split(real, annotation.holdout_fraction, annotation.seed)[0] if holdout else real
    folder = Path(args.classifier or reference_dir(csm_dataset_name(args.dataset), holdout))
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        classifier = load_reference_encoder(folder)
    else:
        print(f"training the reference classifier into {folder} (timm-csm-annotate reuses it)")
        classifier = train_reference(args.dataset, fit, folder, device=args.device, image_column=args.image_column,
                                     label_column=args.label_column)
    test_split = detect_test_split(dataset_split_names(args.dataset), exclude=["train"])
    if test_split is not None:
        test = load_image_arrays(args.dataset, test_split, args.image_column, args.label_column)
        return classifier, test, f"the {test_split!r} split"
    if holdout and classifier.config.get("dataset") == dataset_fingerprint(fit):
        held_out = real.subset(holdout_rows(len(real), annotation.holdout_fraction, annotation.seed))
        return classifier, held_out, "the held-out tenth of the training split"
    return classifier, None, None


def _pipeline(args, real, mixing):
    """(the mixing pipeline of ``--generator`` or ``--checkpoint-of``'s latest EMA, its training step or None)."""
    if args.generator:
        from timm_csm.recipes.steps import load_mixing_pipeline

        return load_mixing_pipeline(args.generator, mixing, real.class_names), None
    from diffusers import DDIMScheduler

    from timm_csm.generation import GENERATOR_PROFILES, SemanticMixingPipeline
    from timm_csm.generation.training import load_checkpoint_ema

    cfg = GENERATOR_PROFILES[args.profile]
    unet, step = load_checkpoint_ema(args.checkpoint_of, real.num_classes, cfg)
    sched = DDIMScheduler(num_train_timesteps=cfg.num_train_timesteps, beta_schedule=cfg.beta_schedule)
    return SemanticMixingPipeline(unet, sched, real.class_names, num_inference_steps=args.steps,
                                  guidance_scale=args.guidance_scale or 1.0), step


@console_command("timm-csm-evaluate-generator", build_parser, requires=("diffusers",))
def main(argv=None):
    args = build_parser().parse_args(argv)
    from timm_csm.annotation import AnnotationConfig
    from timm_csm.data import load_image_arrays
    from timm_csm.recipes.steps import judge_generator

    real = load_image_arrays(args.dataset, "train", args.image_column, args.label_column)
    encoder, unseen, unseen_name = _encoder(args, real)
    mixing = MixingConfig(num_lambdas=args.num_lambdas, steps=args.steps, guidance_scale=args.guidance_scale)
    pipe, step = _pipeline(args, real, mixing)
    report = judge_generator(pipe, real, encoder, AnnotationConfig(), dataset=args.dataset,
                             num_groups=args.num_groups, mixing=mixing, unseen=unseen, log=lambda line: None)
    result = {**{k: report[k] for k in ("verdict", "poor", "pure_class_recognition", "num_groups", "flagged",
                                        "not_monotone", "endpoint_misread", "spearman_median", "real_recognition")},
              "real_images": unseen_name, "encoder": encoder.identity, "training_step": step,
              "num_lambdas": args.num_lambdas, "sampler_steps": args.steps,
              "guidance_scale": pipe.provenance.get("guidance_scale")}
    print(json.dumps(result, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
        print(f"result: {args.output}")
    if report["poor"]:
        print(f"the generator is {report['verdict']}; timm-csm-annotate would stop on its groups: train it longer "
              "(timm-csm-train-generator resumes with --steps N) before generating groups")
    else:
        print(f"the generator is {report['verdict']}; next: timm-csm-generate --generator "
              f"{args.generator or args.checkpoint_of} --num-groups 900 --output runs/generated")


if __name__ == "__main__":
    sys.exit(main())

"""Measure a generator: how often a real-data classifier recognises its pure-class samples (lambda = 0 and 1),
next to that classifier's accuracy on real images it did not learn from.

    timm-csm-evaluate-generator --generator runs/generator-fmnist
    timm-csm-evaluate-generator --generator runs/generator-mine --dataset my_images
    timm-csm-evaluate-generator --checkpoint-of runs/generator-fmnist --profile fmnist --classifier runs/encoder

The classifier is a reference encoder folder: by default the one ``timm-csm-annotate`` uses for the dataset
(``runs/reference-<name>-holdout``), trained there on first use, so that the annotation reuses it. Its real accuracy
is measured on the dataset's test split, or, for a dataset with none (a flat ``<class>/*.png`` folder), on the
held-out tenth of the training split that the default classifier never sees (the share ``--s auto`` is fitted on).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from timm_csm.cli import console_command
from timm_csm.generation.quality import QUALITY_SAMPLER_STEPS
from timm_csm.training.args import HelpFormatter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--generator", help="a finished generator folder, or the name of a shipped generator (fmnist)")
    src.add_argument("--checkpoint-of", help="a generator-training folder: evaluate its latest checkpoint's EMA")
    p.add_argument("--profile", default="fmnist", help="generator profile of --checkpoint-of")
    p.add_argument("--classifier", default=None,
                   help="a reference encoder folder, trained there when it does not exist (default: the one "
                        "timm-csm-annotate uses for --dataset)")
    p.add_argument("--dataset", default="fashion_mnist",
                   help="the real dataset the generator learned (a name or an image folder [<split>/]<class>/*.png)")
    p.add_argument("--image-column", default=None, help="image column of --dataset (detected when omitted)")
    p.add_argument("--label-column", default=None, help="label column of --dataset (detected when omitted)")
    p.add_argument("--num-groups", type=int, default=200, help="groups sampled (two pure-class images each)")
    p.add_argument("--steps", type=int, default=QUALITY_SAMPLER_STEPS, help="DDIM sampler steps")
    p.add_argument("--guidance-scale", type=float, default=None,
                   help="default: the generator's recommended scale (1 = no guidance for a checkpoint)")
    p.add_argument("--device", default="cpu", help="torch device of the classifier's training")
    p.add_argument("--output", default=None, help="write the result as JSON here")
    return p


def _classifier(args, real):
    """(classifier, the real images to measure it on, what they are). The default folder is the one annotation
    reuses: trained without the held-out share where annotation fits s on it (``--s auto``)."""
    from timm_csm.annotation import AnnotationConfig, holdout_rows, holdout_split, load_reference_encoder
    from timm_csm.annotation.cache import dataset_fingerprint
    from timm_csm.commands.annotate import reference_dir, train_reference
    from timm_csm.data import load_image_arrays
    from timm_csm.data.sources import dataset_split_names, detect_test_split
    from timm_csm.steps import csm_dataset_name

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


@console_command("timm-csm-evaluate-generator", build_parser, requires=("diffusers",))
def main(argv=None):
    args = build_parser().parse_args(argv)
    from diffusers import DDIMScheduler

    from timm_csm.annotation.checks import generator_problems
    from timm_csm.data import load_image_arrays
    from timm_csm.generation import GENERATOR_PROFILES, SemanticMixingPipeline, pure_class_accuracy
    from timm_csm.generation.training import load_checkpoint_ema
    from timm_csm.steps import resolve_generator

    real = load_image_arrays(args.dataset, "train", args.image_column, args.label_column)
    classifier, held_out, held_out_name = _classifier(args, real)
    if held_out is not None:
        real_acc = float((classifier.classify(held_out.images).argmax(1).numpy() == held_out.labels).mean())
    else:  # a classifier given that learned from every training image: its own record, if any
        real_acc, held_out_name = classifier.test_accuracy, "as recorded by the classifier"
    if args.generator:
        pipe = SemanticMixingPipeline.from_pretrained(resolve_generator(args.generator),
                                                      num_inference_steps=args.steps,
                                                      guidance_scale=args.guidance_scale)
        step = None
    else:
        cfg = GENERATOR_PROFILES[args.profile]
        unet, step = load_checkpoint_ema(args.checkpoint_of, real.num_classes, cfg)
        sched = DDIMScheduler(num_train_timesteps=cfg.num_train_timesteps, beta_schedule=cfg.beta_schedule)
        pipe = SemanticMixingPipeline(unet, sched, real.class_names, num_inference_steps=args.steps,
                                      guidance_scale=args.guidance_scale or 1.0)
    quality = pure_class_accuracy(pipe, classifier.classify, num_groups=args.num_groups)
    result = {"generated_pure_class_accuracy": quality["accuracy"], "chance": 1.0 / real.num_classes,
              "per_class": quality["per_class"], "num_images": quality["num_images"],
              "classifier_real_test_accuracy": real_acc, "classifier_real_images": held_out_name,
              "training_step": step, "sampler_steps": args.steps, "guidance_scale": pipe.guidance_scale}
    print(json.dumps(result, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
        print(f"result: {args.output}")
    recognition = {"accuracy": quality["accuracy"], "chance": 1.0 / real.num_classes,
                   "num_images": quality["num_images"], "by": "the reference classifier"}
    problems = generator_problems({"pure_class_recognition": recognition})
    if problems:
        print(f"the generator is poor: {'; '.join(problems)}; train it longer (timm-csm-train-generator resumes "
              "with --steps N) before generating groups")
    else:
        print(f"next: timm-csm-generate --generator {args.generator or args.checkpoint_of} --num-groups 900 "
              "--output runs/generated")


if __name__ == "__main__":
    sys.exit(main())

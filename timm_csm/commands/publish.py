"""Push a saved CSM dataset folder to the Hugging Face Hub with ``push_to_hub``.

    timm-csm-publish --repo-id my-org/csm-cifar100-aug               # folder runs/hub/csm-cifar100-aug
    timm-csm-publish --repo-id my-org/csm-fmnist-aug --folder out/csm-fmnist-aug --private

The token comes from ``--token``, ``HF_TOKEN`` or ``hf auth login``. The local folder is only read: a failed push
leaves it as it was, and the command can simply be run again.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from timm_csm.cli import HelpFormatter, console_command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--repo-id", required=True, help="namespace/name of the dataset repository")
    p.add_argument("--folder", default=None, help="Hub-layout folder (default <root>/<name of the repository>)")
    p.add_argument("--root", default="runs/hub", help="folder holding the saved CSM datasets")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the stored login)")
    p.add_argument("--revision", default=None, help="branch to push to (default main)")
    p.add_argument("--max-shard-size", default=None, help="e.g. 500MB")
    return p


@console_command("timm-csm-publish", build_parser)
def main(argv=None):
    args = build_parser().parse_args(argv)
    from timm_csm.hub import PushError, push_csm_dataset

    folder = Path(args.folder) if args.folder else Path(args.root) / args.repo_id.split("/")[-1]
    try:
        commit = push_csm_dataset(folder, args.repo_id, token=args.token, private=args.private or None,
                                  revision=args.revision, max_shard_size=args.max_shard_size)
    except PushError as e:
        sys.exit(str(e))
    url = getattr(commit, "commit_url", None) or f"https://huggingface.co/datasets/{args.repo_id}"
    print(f"pushed {folder} to {args.repo_id}: {url}")
    print(f"next: datasets.load_dataset({args.repo_id!r}) anywhere, or timm-csm-train --csm-dataset {args.repo_id}")


if __name__ == "__main__":
    sys.exit(main())

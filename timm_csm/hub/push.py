"""Publish a saved CSM dataset to the Hugging Face Hub with ``push_to_hub``.

The local folder is only read: it is loaded with ``load_dataset`` and pushed from the loaded copy, so a failed push
(network, permissions, a conflict) leaves it exactly as it was. The dataset card goes first: ``push_to_hub`` then
finds it on the Hub and only rewrites its ``dataset_info`` / ``configs`` YAML, keeping the provenance text.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Union

from huggingface_hub import HfApi

from .build import validate_csm_dataset
from .install import load_folder
from .layout import README

__all__ = ["push_csm_dataset", "PushError"]

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class PushError(RuntimeError):
    """A push failed; the message says that the local copy is unchanged."""


def push_csm_dataset(folder, repo_id: str, token: Optional[str] = None, private: Optional[bool] = None,
                     revision: Optional[str] = None, max_shard_size: Union[int, str, None] = None,
                     commit_message: Optional[str] = None):
    """Push the Hub-layout ``folder`` to the dataset repository ``repo_id`` (``"org/csm-cifar100-aug"``).

    Returns the ``CommitInfo`` of the data commit. Raises :class:`PushError` (with the cause chained) when any
    step fails; the local folder is never modified.
    """
    if not _REPO_ID.match(repo_id or ""):
        raise ValueError(f"repo_id must be 'namespace/name' (e.g. 'my-org/csm-cifar100-aug'), got {repo_id!r}; "
                         "bare names cannot be Hub repositories")
    folder = Path(folder).absolute()
    dd = load_folder(folder)
    for split, ds in dd.items():
        try:
            validate_csm_dataset(ds)
        except ValueError as e:
            raise ValueError(f"{folder}, split {split!r}: {e}") from None
    card = (folder / README).read_bytes()
    try:
        api = HfApi(token=token)
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        if revision is not None and not revision.startswith("refs/pr/"):
            api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
        api.upload_file(path_or_fileobj=card, path_in_repo=README, repo_id=repo_id, repo_type="dataset",
                        revision=revision, commit_message="Dataset card")
        return dd.push_to_hub(repo_id, token=token, private=private, revision=revision,
                              max_shard_size=max_shard_size, commit_message=commit_message or f"Upload {folder.name}")
    except Exception as e:
        raise PushError(f"pushing {folder} to {repo_id} failed ({type(e).__name__}: {e}); "
                        f"the local copy at {folder} is unchanged") from e

"""File I/O shared across the package, one concept a module:

* :mod:`.atomic`: atomic writers (a temporary file ``.<name>.<random>.tmp`` beside the target, then ``os.replace``;
  files and folders appear complete or not at all) and the removal of what a killed writer leaves;
* :mod:`.hashing`: a reader that hashes what it reads (:class:`HashingReader`, :func:`file_sha256`);
* :mod:`.state_file`: state files (:func:`save_state` / :func:`load_state`): a nested dict of tensors and JSON values
  in one safetensors file, so that resuming never unpickles (no ``torch.load``);
* :mod:`.model_file`: model files (:func:`save_model_file`): a plain safetensors state dict, readable by timm, with
  the run's metadata in the header (:func:`read_model_meta`), and the digest of its weights alone
  (:func:`tensors_sha256`);
* :mod:`.checkpoint`: resumable checkpoints: a state file (``last.safetensors``) read back by
  :func:`read_checkpoint`, the one answer to a checkpoint that does not read.
"""
from .atomic import (atomic_path, link_or_copy_atomic, remove_temp_files, save_safetensors_atomic, staging_folder,
                     write_bytes_atomic, write_json_atomic, write_text_atomic)
from .checkpoint import CHECKPOINT_LAST, read_checkpoint, remove_checkpoint
from .hashing import HashingReader, file_sha256
from .model_file import read_model_meta, save_model_file, state_dict_mismatch, tensors_sha256
from .state_file import is_state_file, load_state, safetensors_metadata, save_state

__all__ = ["atomic_path", "save_safetensors_atomic", "write_text_atomic", "write_bytes_atomic", "write_json_atomic",
           "link_or_copy_atomic", "remove_temp_files", "HashingReader", "file_sha256", "save_state", "load_state",
           "is_state_file", "safetensors_metadata", "save_model_file", "read_model_meta", "CHECKPOINT_LAST",
           "read_checkpoint", "remove_checkpoint", "staging_folder", "state_dict_mismatch", "tensors_sha256"]

"""Training support shared by :mod:`timm_csm.train`: run folders (ownership, lock, run id, resumed configuration)."""
from .run_dir import (LOCK_FILE, RUN_FILES, RunDirLock, claim_run_dir, config_record, folder_run_id, new_run_id,
                      restore_config)

__all__ = ["LOCK_FILE", "RUN_FILES", "RunDirLock", "claim_run_dir", "config_record", "folder_run_id", "new_run_id",
           "restore_config"]

"""The one progress bar of the package's training loops (the classifier's epochs, the reference encoder, the
generator): the same tqdm settings, the running loss in the same postfix, and shown on the main process only."""
from __future__ import annotations

from typing import Iterable, Optional

__all__ = ["progress_bar"]


def _is_main_process() -> bool:
    """False on every process but rank 0 of an initialised process group (several bars would overwrite each other)."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class _TrainingBar:
    """A tqdm bar whose postfix is the running loss (4 decimals) and any other fields given."""

    def __init__(self, bar):
        self._bar = bar

    def __iter__(self):
        return iter(self._bar)

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def show_loss(self, loss: float, **fields) -> None:
        self._bar.set_postfix(fields, loss=f"{loss:.4f}")

    def close(self) -> None:
        self._bar.close()


def progress_bar(desc: str, *, iterable: Optional[Iterable] = None, total: Optional[int] = None, initial: int = 0,
                 unit: str = "step", leave: bool = True, enabled: bool = True) -> _TrainingBar:
    """A training loop's bar over ``iterable`` or ``total`` steps from ``initial`` (a resumed run's step), shown when
    ``enabled`` and on the main process; ``leave=False`` for a bar per epoch."""
    from tqdm.auto import tqdm

    return _TrainingBar(tqdm(iterable, total=total, initial=initial, desc=desc, unit=unit, leave=leave,
                             dynamic_ncols=True, disable=not (enabled and _is_main_process())))

"""The one resumable trainer of the package's trainings (the classifier, the reference encoder, the generator), the
one schema of their training state, and their one progress bar.

* :mod:`.resumable`: :class:`ResumableTrainer` (restore, train the units, checkpoint, finish) and
  :func:`load_training_state`, the one function that resumes a training state;
* :mod:`.progress`: :func:`progress_bar`, the bar every training loop shows.
"""
from .progress import progress_bar
from .resumable import STATE_KEYS, ResumableTrainer, load_training_state

__all__ = ["ResumableTrainer", "load_training_state", "STATE_KEYS", "progress_bar"]

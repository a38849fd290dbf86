"""The resumable trainer the classifier, the reference encoder and the generator share: which units are
checkpointed, that a run stopped and resumed trains the units a straight run trains, the one schema of their training
state and the one function that resumes it, and the answer of a cache and of a run to a checkpoint that does not
fit (one of an earlier schema included)."""
import re

import pytest
import torch

from timm_csm.io import CHECKPOINT_LAST, load_state, save_state
from timm_csm.trainer import ResumableTrainer, load_training_state


class _Counter:
    """A one-weight model whose unit adds the unit's index: the weight says which units ran."""

    def __init__(self):
        self.weight = torch.zeros(1)

    def train_unit(self, unit, bar):
        self.weight += unit
        if bar is not None:
            bar.update(1)

    def state(self):
        return {"model": {"weight": self.weight.clone()}}

    def load_state_dict(self, state):
        self.weight = state["weight"].clone()


def _fit(folder, counter, start, end, **kw):
    saved = []
    trainer = ResumableTrainer(folder, "test checkpoint", unit=kw.pop("unit", "step"), cache=kw.pop("cache", False),
                               log=kw.pop("log", print), **kw)
    trainer.fit(counter.train_unit, counter.state, start, end,
                save=lambda unit, state: (saved.append(unit), save_state(trainer.path, state)))
    return trainer, saved


def test_checkpoints_every_n_units_and_after_the_last_only_when_asked(tmp_path):
    counter = _Counter()
    _, saved = _fit(tmp_path / "a", counter, 0, 7, every=3)
    assert saved == [2, 5, 6] and float(counter.weight) == sum(range(7))
    assert load_state(tmp_path / "a" / CHECKPOINT_LAST)["step"] == 7
    _, saved = _fit(tmp_path / "b", _Counter(), 0, 4, checkpoint_end=False)
    assert saved == [0, 1, 2]
    _, saved = _fit(tmp_path / "c", _Counter(), 0, 3, is_main_process=False)
    assert saved == [] and not (tmp_path / "c").exists()  # only the main process writes
    with pytest.raises(ValueError, match="checkpoint every 0 units"):
        ResumableTrainer(tmp_path, "test checkpoint", unit="step", cache=False, every=0)
    with pytest.raises(ValueError, match="unit 'batch': must be one of"):
        ResumableTrainer(tmp_path, "test checkpoint", unit="batch", cache=False)


def test_a_time_interval_checkpoints_long_units_between_the_unit_interval(tmp_path, monkeypatch):
    """``every_seconds``: a unit that ends that long after the last checkpoint is checkpointed too (the clock
    restarts at each checkpoint), so a slow run is never far from its last one."""
    from types import SimpleNamespace

    import timm_csm.trainer.resumable as trainer_module

    clock = iter(range(0, 10000, 60))  # each look at the trainer's clock is 60 s after the one before
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    _, saved = _fit(tmp_path / "a", _Counter(), 0, 6, every=100, every_seconds=120)
    assert saved == [1, 3, 5]  # 120 s after the start, 120 s after that checkpoint, and the last unit
    _, saved = _fit(tmp_path / "b", _Counter(), 0, 6, every=100, every_seconds=None)
    assert saved == [5]
    with pytest.raises(ValueError, match="checkpoint every 0 seconds"):
        ResumableTrainer(tmp_path, "test checkpoint", unit="step", cache=False, every_seconds=0)


@pytest.mark.parametrize("unit, stored", [("step", 2), ("epoch", 1)])
def test_a_resumed_run_trains_the_units_a_straight_run_trains(tmp_path, unit, stored):
    """A step state stores the steps done, an epoch state the last finished epoch (timm's): both resume at 2."""
    straight = _Counter()
    _fit(tmp_path / "straight", straight, 0, 6, every=2, unit=unit)
    first = _Counter()
    _fit(tmp_path / "cut", first, 0, 3, every=2, checkpoint_end=False, unit=unit)  # stopped after 3: checkpoint of 2
    resumed = _Counter()
    trainer = ResumableTrainer(tmp_path / "cut", "test checkpoint", unit=unit, cache=False)
    start, state = trainer.restore({"model": resumed})
    assert (start, state[unit]) == (2, stored) and float(resumed.weight) == 0 + 1
    _fit(tmp_path / "cut", resumed, start, 6, every=2, unit=unit)
    assert torch.equal(resumed.weight, straight.weight)
    trainer.finish()
    assert not trainer.path.exists() and trainer.restore({"model": resumed}) is None


def test_the_one_resume_loads_each_entry_by_its_key_and_a_missing_key_does_not_fit():
    loaded = []
    model = _Counter()
    load_training_state({"model": {"weight": torch.ones(1)}, "rng": 7, "step": 3},
                        {"model": model, "rng": loaded.append})
    assert float(model.weight) == 1 and loaded == [7]
    with pytest.raises(KeyError, match="scheduler"):
        load_training_state({"model": {"weight": torch.ones(1)}, "sched": {}}, {"model": model, "scheduler": model})


def test_a_checkpoint_that_does_not_fit_is_an_error_for_a_run_and_trained_again_for_a_cache(tmp_path):
    _fit(tmp_path, _Counter(), 0, 2)

    earlier_schema = {"model": _Counter(), "scheduler": _Counter()}  # the state holds no "scheduler"

    path = re.escape(str(tmp_path / CHECKPOINT_LAST))
    with pytest.raises(ValueError, match=path + " is a damaged test checkpoint: it does not fit .*scheduler.*delete"):
        ResumableTrainer(tmp_path, "test checkpoint", unit="step", cache=False).restore(earlier_schema)
    assert (tmp_path / CHECKPOINT_LAST).exists()
    lines = []
    cache = ResumableTrainer(tmp_path, "test checkpoint", unit="step", cache=True, log=lines.append)
    assert cache.restore(earlier_schema) is None
    assert len(lines) == 1 and "starts over" in lines[0] and not (tmp_path / CHECKPOINT_LAST).exists()


def test_the_run_bar_counts_the_steps_from_where_the_run_resumes(tmp_path, monkeypatch):
    from timm_csm.trainer import resumable as trainer_module

    opened = []

    def fake_bar(desc, **kw):
        opened.append((desc, kw["total"], kw["initial"], kw["enabled"]))
        return type("Bar", (), {"update": lambda self, n=1: None, "close": lambda self: opened.append("closed")})()

    monkeypatch.setattr(trainer_module, "progress_bar", fake_bar)
    _fit(tmp_path / "a", _Counter(), 2, 5, desc="units", progress=True)
    trainer = ResumableTrainer(tmp_path / "c", "test checkpoint", unit="step", cache=False, desc="steps",
                               progress=False)
    trainer.fit(_Counter().train_unit, _Counter().state, 1, 3, bar_total=30, bar_initial=10)
    assert opened == [("units", 5, 2, True), "closed", ("steps", 30, 10, False), "closed"]

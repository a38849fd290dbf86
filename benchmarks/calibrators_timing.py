"""The calibrators benchmark's timing harness: process CPU time, the best of repeated runs, the applies of one row
in interleaved rounds (their spread kept), a wall-time budget for a fit, and one fused pass over the logits, the limit
every time is a multiple of (``calibrators_bench.py``'s docstring says how it is used)."""
from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from typing import Callable, Dict, List, Tuple

import torch


class OverBudget(Exception):
    pass


@contextmanager
def budget(seconds: float):
    """Raise ``OverBudget`` in the main thread after ``seconds`` of wall time (between two Python bytecodes)."""
    def stop(*_):
        raise OverBudget()
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def best_time(fn: Callable[[], object], repeats: int):
    """(best process CPU seconds over ``repeats`` calls, the last result)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        best = min(best, time.process_time() - start)
    return best, result


def apply_repeats(repeats: int) -> int:
    """Applies take micro- to milliseconds where fits repeat: ten times the repeats; three where fits run once
    (N x C > 1e6: a matrix product there varies by about 10 % from run to run)."""
    return 3 if repeats == 1 else 10 * repeats


def one_pass(logits: torch.Tensor, repeats: int) -> float:
    return best_time(lambda: torch.logsumexp(logits, dim=1), apply_repeats(repeats))[0]


def interleaved_times(applies: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, Tuple[float, float]]:
    """(best, median) process CPU seconds of each apply over ``rounds`` rounds that call every apply once in turn:
    on a shared machine a burst of load then falls on every library alike."""
    times: Dict[str, List[float]] = {lib: [] for lib in applies}
    for _ in range(rounds):
        for lib, apply in applies.items():
            start = time.process_time()
            apply()
            times[lib].append(time.process_time() - start)
    return {lib: (min(t), sorted(t)[len(t) // 2]) for lib, t in times.items()}


def apply_tie(ours: dict, peer: dict) -> bool:
    """Whether a peer's faster apply lies within the rounds' spread: its best time is above timm_csm's best less
    the larger of the two libraries' (median - best) (the same matrix product in both, for instance, varies by
    about that much from round to round). Rows measured before the medians were kept have no tie."""
    if "apply_median_s" not in ours or "apply_median_s" not in peer:
        return False
    spread = max(ours["apply_median_s"] - ours["apply_s"], peer["apply_median_s"] - peer["apply_s"])
    return peer["apply_s"] >= ours["apply_s"] - spread

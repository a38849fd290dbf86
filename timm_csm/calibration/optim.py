"""The one minimiser of the parametric calibrators: full-batch L-BFGS on float64 parameters with a strong Wolfe
line search, stopped by a test on the objective."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Sequence, Tuple

import torch

__all__ = ["minimise_lbfgs", "LbfgsResult", "objective_tolerance"]

Evaluation = Callable[[], Tuple[float, List[torch.Tensor]]]


@dataclass(frozen=True)
class LbfgsResult:
    """The final objective, the L-BFGS iterations and the objective evaluations (line-search trials included)."""

    value: float
    iterations: int
    evaluations: int


def objective_tolerance(dtype: torch.dtype) -> float:
    """Relative change of the objective below which a fit has converged: the precision an objective summed in
    float64 from per-sample values of ``dtype`` resolves (float32 blocks: about 1e-9 of the objective, SciPy's
    L-BFGS-B default ``ftol``; float64: 1e-15, a few units of its last place)."""
    return 1e-15 if dtype == torch.float64 else 1e-9


def minimise_lbfgs(params: Sequence[torch.Tensor], evaluate: Evaluation, max_iter: int, name: str,
                   ftol: float = 1e-15, history_size: int = 20) -> LbfgsResult:
    """Minimise over ``params`` (float64 tensors, updated in place) the objective whose ``evaluate()`` returns
    ``(value, gradients)`` at the current parameters. ``ValueError`` naming the calibrator when a parameter or the
    value ends non-finite (a diverged fit).

    Stops when an iteration lowers the objective by less than ``ftol * max(1, |f(x0)|)`` (or moves no parameter by
    more than that), when the gradient vanishes, or after ``max_iter`` iterations. ``history_size`` is lowered for
    large parameter counts so the history stays under about 160 MB.
    """
    params = list(params)
    first = evaluate()
    scale = max(1.0, abs(first[0]))
    count = sum(p.numel() for p in params)
    history = max(3, min(history_size, (1 << 24) // max(count, 1) // 2))
    optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=int(max_iter), history_size=history,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-12 * scale,
                                  tolerance_change=ftol * scale)
    pending = [first]
    best = [first[0], [p.detach().clone() for p in params]]

    def closure():
        value, grads = pending.pop() if pending else evaluate()
        if value < best[0]:  # the accepted point of each line search is its lowest trial
            best[0], best[1] = value, [p.detach().clone() for p in params]
        for p, g in zip(params, grads):
            p.grad = g
        return value

    optimizer.step(closure)
    state = optimizer.state[params[0]]
    evaluations = int(state.get("func_evals", 0))
    if all(torch.equal(p, b) for p, b in zip(params, best[1])):
        value = best[0]
    else:
        value, _ = evaluate()
        evaluations += 1
    if not (all(bool(torch.isfinite(p).all()) for p in params) and value == value and abs(value) != float("inf")):
        raise ValueError(f"{name}: the fit diverged (non-finite parameters or loss)")
    return LbfgsResult(value, int(state.get("n_iter", 0)), evaluations)

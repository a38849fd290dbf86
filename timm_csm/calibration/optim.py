"""The one minimiser of the parametric calibrators: full-batch L-BFGS in float64 with a strong Wolfe line search."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

__all__ = ["minimise_lbfgs"]


def minimise_lbfgs(params: Sequence[torch.Tensor], objective: Callable[[], torch.Tensor], max_iter: int,
                   name: str, history_size: int = 20) -> float:
    """Minimise ``objective()`` over ``params`` (leaf tensors with ``requires_grad``) in place; returns the final
    value. ``ValueError`` naming the calibrator when a parameter or the value ends non-finite (a diverged fit).

    One ``LBFGS.step`` runs up to ``max_iter`` iterations; the tolerances are tight enough that float64 fits stop
    at the optimum rather than at torch's float32-sized defaults. ``history_size`` 20 keeps the memory of a
    1000-class matrix at 2 x 20 x 10^6 float64 numbers.
    """
    optimizer = torch.optim.LBFGS(list(params), lr=1.0, max_iter=int(max_iter), history_size=history_size,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-12, tolerance_change=1e-16)

    def closure():
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        value = float(objective())
    if not (all(bool(torch.isfinite(p).all()) for p in params) and value == value and abs(value) != float("inf")):
        raise ValueError(f"{name}: the fit diverged (non-finite parameters or loss)")
    return value

"""Temperature scaling (Guo et al., ICML 2017) with the two fitting rules used in the literature."""
from __future__ import annotations

import math
from decimal import Decimal
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..metrics.binning import bin_edges, bin_index, bin_sums, calibration_error_from_bins
from ._checks import check_fit_inputs
from .base import PostHocCalibrator

__all__ = ["TemperatureScaling", "temperature_grid"]

_METHODS = ("grid_ece", "nll")
_T_BOUNDS = (1e-2, 1e2)  # NLL fits on (near-)separable data run off towards 0; keep T in a sane range


def temperature_grid(start: float = 0.1, stop: float = 10.0, step: float = 0.1) -> Tuple[float, ...]:
    """Temperatures start, start + step, ..., stop as exact decimals (0.3, not 0.30000000000000004).

    The reference code builds the grid by float accumulation; the values here are the floats nearest to the
    decimals, so a saved T reads back as the printed number.
    """
    start_d, stop_d, step_d = (Decimal(repr(float(v))) for v in (start, stop, step))
    if not (start_d > 0 and step_d > 0 and stop_d >= start_d):
        raise ValueError(f"need 0 < start <= stop and step > 0, got start={start}, stop={stop}, step={step}")
    count = int((stop_d - start_d) / step_d) + 1
    return tuple(float(start_d + i * step_d) for i in range(count))


class TemperatureScaling(PostHocCalibrator):
    """Divide logits by one scalar T > 0 fitted on validation logits; accuracy is unchanged.

    * ``method="grid_ece"`` (the protocol of focal_calibration, MbLS, ACLS, RankMixup and CSM): try
      T in ``temperature_grid(*grid)`` (default 0.1, 0.2, ..., 10.0) and keep the T with the lowest validation ECE
      (:func:`timm_csm.metrics.ece`, ``n_bins`` equal-width bins over (lo, hi]); ties go to the smaller T.
      ``scores`` holds the ECE per T.
    * ``method="nll"`` (Guo et al. / gpleiss): minimise the validation NLL over log T with L-BFGS (strong Wolfe line
      search, float64, at most ``max_iter`` = 50 iterations as Guo's code), starting from T = ``init`` = 1.5. T is
      clipped to [0.01, 100].

    Fitting refuses fewer samples than classes and a validation set with a single class (``ValueError``).
    """

    kind = "temperature_scaling"

    def __init__(self, method: str = "grid_ece", n_bins: int = 15, grid: Sequence[float] = (0.1, 10.0, 0.1),
                 init: float = 1.5, max_iter: int = 50):
        if method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
        if int(n_bins) < 1:
            raise ValueError(f"n_bins must be >= 1, got {n_bins}")
        if not (math.isfinite(float(init)) and float(init) > 0):
            raise ValueError(f"init must be a positive temperature, got {init}")
        self.method = method
        self.n_bins = int(n_bins)
        self.grid = tuple(float(v) for v in grid)
        if len(self.grid) != 3:
            raise ValueError(f"grid must be (start, stop, step), got {grid!r}")
        temperature_grid(*self.grid)  # validate
        self.init = float(init)
        self.max_iter = int(max_iter)
        self._temperature: Optional[float] = None
        self.scores: Optional[torch.Tensor] = None

    @property
    def temperature(self) -> float:
        self._require_fitted()
        return self._temperature

    def fit(self, logits, targets) -> "TemperatureScaling":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        if self.method == "grid_ece":
            self._temperature, self.scores = self._fit_grid(logits, targets)
        else:
            self._temperature = self._fit_nll(logits, targets)
            self.scores = None
        return self

    def _fit_grid(self, logits: torch.Tensor, targets: torch.Tensor):
        temperatures = temperature_grid(*self.grid)
        # ECE only needs the top-label confidence, 1 / sum_k exp((z_k - z_max) / T), and the (T-independent)
        # correctness; the bins and the error are timm_csm.metrics', so the chosen T is the argmin of the reported
        # metric (tests check the scores against timm_csm.metrics.ece)
        shifted = logits - logits.max(dim=1, keepdim=True).values
        correct = (logits.argmax(dim=1) == targets).to(torch.float64)
        edges = bin_edges(self.n_bins, device=logits.device)
        scores = torch.empty(len(temperatures), dtype=torch.float64)
        buffer = torch.empty_like(shifted)  # reused across temperatures: no fresh (N, C) allocation per T
        for i, t in enumerate(temperatures):
            torch.div(shifted, t, out=buffer)
            confidence = buffer.exp_().sum(dim=1).reciprocal_()
            sums = bin_sums(bin_index(confidence, edges), self.n_bins, confidence, correct)
            scores[i] = calibration_error_from_bins(*sums, "l1")
        best = int(torch.argmin(scores))  # first minimum: ties go to the smaller T
        return temperatures[best], scores

    def _fit_nll(self, logits: torch.Tensor, targets: torch.Tensor) -> float:
        log_t = torch.tensor([math.log(self.init)], dtype=torch.float64, device=logits.device, requires_grad=True)
        optimizer = torch.optim.LBFGS([log_t], lr=1.0, max_iter=self.max_iter, line_search_fn="strong_wolfe",
                                      tolerance_grad=1e-12, tolerance_change=1e-15)

        def closure():
            optimizer.zero_grad()
            loss = F.cross_entropy(logits * torch.exp(-log_t), targets)
            loss.backward()
            return loss

        optimizer.step(closure)
        t = float(torch.exp(log_t.detach()))
        if not math.isfinite(t):
            raise ValueError("TemperatureScaling: the NLL fit diverged")
        return min(max(t, _T_BOUNDS[0]), _T_BOUNDS[1])

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self._temperature

    def config(self) -> dict:
        return {"method": self.method, "n_bins": self.n_bins, "grid": list(self.grid), "init": self.init,
                "max_iter": self.max_iter}

    def state_dict(self) -> Dict[str, torch.Tensor]:
        if self._temperature is None:
            return {}
        return {"temperature": torch.tensor([self._temperature], dtype=torch.float64)}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> "TemperatureScaling":
        if set(state) != {"temperature"} or state["temperature"].numel() != 1:
            raise ValueError(f"expected a state with one 'temperature' value, got keys {sorted(state)}")
        t = float(state["temperature"].reshape(()))
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"temperature must be positive and finite, got {t}")
        self._temperature = t
        return self

    def __repr__(self) -> str:
        t = "unfitted" if self._temperature is None else f"T={self._temperature:g}"
        return f"TemperatureScaling(method={self.method!r}, n_bins={self.n_bins}, {t})"

"""Temperature scaling (Guo et al., ICML 2017) with the two fitting rules used in the literature."""
from __future__ import annotations

import math
from decimal import Decimal
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from ..metrics.binning import DEFAULT_N_BINS, bin_edges, bin_index, bin_sums, calibration_error_from_bins
from ._checks import check_fit_inputs
from ._kernels import NARROW_CLASSES, row_blocks
from .base import PostHocCalibrator
from ..registry import Registry
from .registry import register_calibrator

__all__ = ["TemperatureScaling", "temperature_grid", "fit_inverse_temperature", "bootstrap_temperatures",
           "TEMPERATURE_METHODS", "register_temperature_method", "DEFAULT_TEMPERATURE_METHOD", "PAPER_TEMPERATURE_METHOD", "TEMPERATURE_RESAMPLES",
           "SMALL_VALIDATION"]

#: the fitting rules of the temperature: name -> ``fit(calibrator, logits, targets) -> (T, scores or None)``
TEMPERATURE_METHODS = Registry("temperature method", sort=False)


def register_temperature_method(name: str, fit: Optional[Callable] = None, *, overwrite: bool = False):
    """Register ``fit(calibrator, logits, targets) -> (temperature, scores per candidate or None)`` as the
    fitting rule ``name`` of :class:`TemperatureScaling` (without ``fit``, a decorator)."""
    return TEMPERATURE_METHODS.register(name, overwrite=overwrite) if fit is None else \
        TEMPERATURE_METHODS.register(name, fit, overwrite=overwrite)

#: the protocol of the calibration-loss papers and CSM (the grid by validation ECE): the calibrator's default, the
#: rule of the recipes' profiles and of the benchmark cells; training runs default to NLL (Guo et al.), which is
#: steadier on a few hundred validation images
PAPER_TEMPERATURE_METHOD = "grid_ece"
DEFAULT_TEMPERATURE_METHOD = PAPER_TEMPERATURE_METHOD
#: the most resamples behind a reported temperature's interval (each one a fit: :func:`bootstrap_temperatures`)
TEMPERATURE_RESAMPLES = 200
#: below this many fitting images a report says how far the after-TS numbers move with the temperature
SMALL_VALIDATION = 1000
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


class _ShiftedLogits:
    """``u = z - max_k z`` of every row, block by block, laid out for fast sums over the classes: computed on the
    fly from row blocks for many classes; for fewer than 32 one (C, N) copy whose class sums run along the samples
    (torch sums a short last dimension slowly)."""

    def __init__(self, logits: torch.Tensor, row_max: torch.Tensor):
        n, c = logits.shape
        self.logits, self.row_max = logits, row_max
        self.columns = c < NARROW_CLASSES
        if self.columns:
            self.shifted = (logits - row_max[:, None]).T.contiguous()
        self.blocks = row_blocks(n, c)

    def __iter__(self):
        for start, stop in self.blocks:
            if self.columns:
                yield self.shifted[:, start:stop], 0
            else:
                yield self.logits[start:stop] - self.row_max[start:stop, None], 1


def _nll_derivatives(shifted: _ShiftedLogits, beta: float) -> Tuple[float, ...]:
    """Sums over the samples of ``log S0``, ``S1 / S0`` and ``S2 / S0 - (S1 / S0)^2`` with
    ``Sj = sum_k exp(beta u_k) u_k^j``, in one fused pass over cache-sized blocks of the shifted logits ``u``
    (per-sample sums in the logits' precision, sums over samples in float64)."""
    totals = torch.zeros(3, dtype=torch.float64, device=shifted.logits.device)
    for u, dim in shifted:
        e = torch.mul(u, beta).exp_()
        s0 = e.sum(dim).double()
        s1 = e.mul_(u).sum(dim).double().div_(s0)
        s2 = e.mul_(u).sum(dim).double().div_(s0)
        totals += torch.stack([s0.log_().sum(), s1.sum(), s2.sub_(s1 * s1).clamp_(min=0).sum()])
    return tuple(totals.tolist())


def fit_inverse_temperature(logits: torch.Tensor, targets: torch.Tensor, beta: float, max_iter: int):
    """The inverse temperature ``beta = 1 / T`` minimising the mean NLL of ``softmax(beta z)``, by safeguarded
    Newton steps on the convex one-parameter objective

        f(beta) = (1/N) sum_i [log sum_k exp(beta (z_ik - m_i)) + beta (m_i - z_iy)],   m_i = max_k z_ik,

    whose first and second derivatives are the mean of ``E_p[z] - z_y`` and of ``Var_p[z]`` under
    ``p = softmax(beta z)``: every iteration is one fused pass over the logits. The minimum is bracketed in
    [1 / T_max, 1 / T_min]; a Newton step leaving the bracket is replaced by its geometric midpoint (or the bound
    itself, tried once). Converged when the Newton step moves beta by less than the precision of the logits' type.
    Returns ``(beta, {"iterations", "objective"})``.
    """
    n = logits.shape[0]
    row_max = logits.amax(1)
    gap = float((row_max - logits.gather(1, targets[:, None]).squeeze(1)).sum(dtype=torch.float64))
    shifted = _ShiftedLogits(logits, row_max)
    bound_lo, bound_hi = 1.0 / _T_BOUNDS[1], 1.0 / _T_BOUNDS[0]
    lo, hi = bound_lo, bound_hi
    rtol = 1e-12 if logits.dtype == torch.float64 else 1e-7
    beta = min(max(beta, lo), hi)
    iterations, value = 0, float("nan")
    for iterations in range(1, max(1, max_iter) + 1):
        log_s0, mean_u, variance = _nll_derivatives(shifted, beta)
        value, slope, curvature = (log_s0 + beta * gap) / n, (mean_u + gap) / n, variance / n
        if slope < 0:
            lo = beta
        else:
            hi = beta
        if (beta == bound_hi and slope < 0) or (beta == bound_lo and slope > 0) or slope == 0:
            break  # the minimum lies at (or beyond) a bound of T
        step = -slope / curvature if curvature > 0 else float("inf") * -slope
        candidate = beta + step
        if not lo < candidate < hi:
            if candidate >= hi and hi == bound_hi:
                candidate = bound_hi
            elif candidate <= lo and lo == bound_lo:
                candidate = bound_lo
            else:
                candidate = math.sqrt(lo * hi)
        converged = abs(candidate - beta) <= rtol * beta
        beta = candidate
        if converged:
            break
    return beta, {"iterations": iterations, "objective": value}


@register_calibrator("temperature_scaling", default=True, options={"method": "ts_method", "n_bins": "n_bins"},
                     summary="one temperature, chosen on the grid 0.1 ... 10.0 by validation ECE (the CSM paper's "
                             "protocol)")
class TemperatureScaling(PostHocCalibrator):
    """Divide logits by one scalar T > 0 fitted on validation logits; accuracy is unchanged.

    * ``method="grid_ece"`` (the protocol of focal_calibration, MbLS, ACLS, RankMixup and CSM): try
      T in ``temperature_grid(*grid)`` (default 0.1, 0.2, ..., 10.0) and keep the T with the lowest validation ECE
      (:func:`timm_csm.metrics.ece`, ``n_bins`` equal-width bins over (lo, hi]); ties go to the smaller T.
      ``scores`` holds the ECE per T.
    * ``method="nll"`` (Guo et al. / gpleiss): minimise the validation NLL over T by safeguarded Newton steps on
      1 / T (:func:`fit_inverse_temperature`: one fused pass over the logits per iteration, typically 4-8), starting
      from T = ``init`` = 1.5, at most ``max_iter`` iterations; T is clipped to [0.01, 100]. ``fit_info`` holds the
      iterations and the final objective.

    Fitting refuses fewer samples than classes and a validation set with a single class (``ValueError``).
    """

    non_finite_shows_in = "values"

    def __init__(self, method: str = DEFAULT_TEMPERATURE_METHOD, n_bins: int = DEFAULT_N_BINS,
                 grid: Sequence[float] = (0.1, 10.0, 0.1), init: float = 1.5, max_iter: int = 50):
        if method not in TEMPERATURE_METHODS:
            raise ValueError(f"method must be one of {tuple(TEMPERATURE_METHODS)}, got {method!r}")
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
        self._inverse: Optional[torch.Tensor] = None
        self.scores: Optional[torch.Tensor] = None
        self.fit_info: Optional[dict] = None

    @property
    def is_fitted(self) -> bool:
        return self._temperature is not None

    @property
    def temperature(self) -> float:
        self._require_fitted()
        return self._temperature

    def fit(self, logits, targets) -> "TemperatureScaling":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        temperature, self.scores = TEMPERATURE_METHODS.get(self.method)(self, logits, targets)
        self._set_temperature(temperature)
        return self

    def _set_temperature(self, temperature: float) -> None:
        self._temperature = temperature
        self._inverse = torch.tensor([1.0 / temperature], dtype=torch.float64)

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
        self.fit_info = {"iterations": len(scores), "objective": float(scores.min())}
        return temperatures[best], scores

    def _fit_nll(self, logits: torch.Tensor, targets: torch.Tensor) -> Tuple[float, None]:
        beta, self.fit_info = fit_inverse_temperature(logits, targets, 1.0 / self.init, self.max_iter)
        return min(max(1.0 / beta, _T_BOUNDS[0]), _T_BOUNDS[1]), None

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        # a multiply by 1 / T (within an ulp of z / T) held as a one-value tensor in the logits' dtype: torch
        # multiplies by it faster than by a Python number
        return torch.mul(logits, self._derived("inverse", self._inverse, logits))

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
        self._set_temperature(t)
        return self

    def __repr__(self) -> str:
        t = "unfitted" if self._temperature is None else f"T={self._temperature:g}"
        return f"TemperatureScaling(method={self.method!r}, n_bins={self.n_bins}, {t})"


register_temperature_method("grid_ece", TemperatureScaling._fit_grid)
register_temperature_method("nll", TemperatureScaling._fit_nll)
register_calibrator("temperature_scaling_nll", preset={"method": "nll"},
                    summary="one temperature by validation NLL (Guo et al., 2017)")(TemperatureScaling)


def bootstrap_temperatures(logits, targets, method: str = DEFAULT_TEMPERATURE_METHOD, n_bins: int = DEFAULT_N_BINS,
                           resamples: int = TEMPERATURE_RESAMPLES, seed: int = 0) -> torch.Tensor:
    """(resamples,) float64: the temperature of :class:`TemperatureScaling` (``method``, ``n_bins``) refitted on each
    bootstrap resample of ``(logits, targets)`` (:func:`~timm_csm.metrics.resample_indices`, ``seed``): how far a
    temperature fitted on these images can move (its percentile interval:
    :func:`~timm_csm.metrics.percentile_interval`). One fit per resample, by the calibrator's own code."""
    from ..metrics.intervals import resample_indices

    n = len(targets)
    return torch.tensor([TemperatureScaling(method=method, n_bins=n_bins).fit(logits[idx], targets[idx]).temperature
                         for idx in resample_indices(n, resamples, seed)], dtype=torch.float64)

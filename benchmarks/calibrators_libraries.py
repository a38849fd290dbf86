"""The calibrators benchmark's library adapters: the libraries compared, each method's counterpart in each of them,
one runner per library (what it is given: ``calibrators_bench.py``'s docstring) and the versions installed."""
from __future__ import annotations

import importlib
from typing import Dict, Optional

import numpy as np
import torch

from calibrators_timing import best_time

LIBRARIES = ("timm_csm", "netcal", "torch-uncertainty", "scikit-learn", "probmetrics")
DIRICHLET_REG = {"reg_lambda": 1e-3, "reg_mu": 1e-3}
# per method: the peers' specs (None: the library has no such method) and whether it is a two-class method
METHODS: Dict[str, Dict[str, object]] = {
    "temperature_scaling_nll": {"netcal": ("scaling.TemperatureScaling", {}), "torch-uncertainty":
                                ("TemperatureScaler", {}), "scikit-learn": "temperature", "probmetrics":
                                "TemperatureScalingCalibrator"},
    "vector_scaling": {"netcal": ("scaling.LogisticCalibration", {"temperature_only": False}),
                       "torch-uncertainty": ("VectorScaler", {"num_classes": True}), "probmetrics":
                       "VectorScalingCalibrator"},
    "matrix_scaling": {"torch-uncertainty": ("MatrixScaler", {"num_classes": True}), "scikit-learn": "logistic",
                       "probmetrics": "MatrixScalingCalibrator"},
    "dirichlet": {"torch-uncertainty": ("DirichletScaler", {"num_classes": True, "lambda_reg": 1e-3,
                                                            "mu_reg": 1e-3})},
    "isotonic": {"netcal": ("binning.IsotonicRegression", {}), "torch-uncertainty": ("IsotonicRegressionScaler", {}),
                 "scikit-learn": "isotonic"},
    "histogram_binning": {"netcal": ("binning.HistogramBinning", {"bins": 15}),
                          "torch-uncertainty": ("HistogramBinningScaler", {"num_bins": 15})},
    "platt": {"netcal": ("scaling.LogisticCalibration", {}), "scikit-learn": "logistic"},
    "beta": {"netcal": ("scaling.BetaCalibration", {})},
}
BINARY = ("platt", "beta")


def as_logits(p) -> torch.Tensor:
    """Logits of a library's probabilities: (N,) P(y = 1) of two classes, else (N, C) rows renormalised."""
    p = np.asarray(p.detach().cpu() if isinstance(p, torch.Tensor) else p, dtype=np.float64)
    if p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=1)
    p = np.clip(p, 1e-12, None)
    return torch.from_numpy(np.log(p / p.sum(axis=1, keepdims=True)))


def softmax64(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.double(), dim=1).numpy()


# ---------------------------------------------------------------------------------------------------------------
# one runner per library: (fit seconds, the apply as a function of nothing, held-out logits, fit-set logits,
# iterations, penalty, objective trace or None); the applies of one row are timed together, interleaved
# ---------------------------------------------------------------------------------------------------------------


def run_ours(name, spec, fit, held_out, repeats):
    from timm_csm.calibration import create_calibrator

    kwargs = DIRICHLET_REG if name == "dirichlet" else {}
    fit_s, cal = best_time(lambda: create_calibrator(name, **kwargs).fit(*fit), repeats)
    apply = lambda: cal.transform(held_out[0])  # noqa: E731
    out = apply()
    info = getattr(cal, "fit_info", None) or {}
    iterations = info.get("iterations")
    if "warm_start_iterations" in info:
        iterations = f"{info['iterations']} ({info['evaluations']} evaluations) + {info['warm_start_iterations']} TS"
    penalty = float(cal.penalty(cal.weight, cal.bias)) if name == "dirichlet" else 0.0
    trace = info.get("trace")
    if trace:  # the fit time outside the trace (input checks, the final parameters) added to each point
        trace = [(seconds + fit_s - trace[-1][0], value) for seconds, value in trace]
    return fit_s, apply, out, cal.transform(fit[0]), iterations, penalty, trace


def run_netcal(name, spec, fit, held_out, repeats):
    module, cls = spec[0].rsplit(".", 1)
    factory = getattr(importlib.import_module(f"netcal.{module}"), cls)
    two = fit[0].shape[1] == 2
    x_fit, x_test = (softmax64(z)[:, 1].copy() if two else softmax64(z) for z in (fit[0], held_out[0]))
    fit_s, model = best_time(lambda: factory(**spec[1]).fit(x_fit, fit[1].numpy()), repeats)
    apply = lambda: model.transform(x_test)  # noqa: E731
    out = apply()
    return fit_s, apply, as_logits(out), as_logits(model.transform(x_fit)), None, 0.0, None


def run_tu(name, spec, fit, held_out, repeats):
    import logging

    import torch_uncertainty.post_processing as tu
    from torch.utils.data import DataLoader, TensorDataset

    logging.getLogger().setLevel(logging.ERROR)  # its "model is None" warning on every fit
    kwargs = dict(spec[1])
    if kwargs.pop("num_classes", None):
        kwargs["num_classes"] = fit[0].shape[1]
    loader = DataLoader(TensorDataset(*fit), batch_size=len(fit[1]))

    def fitted():
        scaler = getattr(tu, spec[0])(**kwargs)
        scaler.fit(loader, progress=False)
        return scaler

    fit_s, scaler = best_time(fitted, repeats)
    def apply():
        with torch.no_grad():
            return scaler(held_out[0])

    out = apply()
    with torch.no_grad():
        on_fit = scaler(fit[0])
    penalty = 0.0
    if name == "dirichlet":
        from timm_csm.calibration import DirichletCalibration

        weight, bias = scaler.inv_temperature_weight.detach(), scaler.inv_temperature_bias.detach()
        penalty = float(DirichletCalibration(**DIRICHLET_REG).penalty(weight.double(), bias.double()))
    return fit_s, apply, out.detach().double(), on_fit.detach().double(), None, penalty, None


class _Scores:
    """A frozen identity classifier for scikit-learn: its ``decision_function`` (logits) or ``predict_proba`` is
    the array it is given (two classes: the log-odds)."""

    @staticmethod
    def make(kind: str):
        from sklearn.base import BaseEstimator, ClassifierMixin

        class Identity(ClassifierMixin, BaseEstimator):
            def fit(self, x, y):
                self.classes_ = np.unique(y)
                return self

            def predict(self, x):
                return self.classes_[np.argmax(x, axis=1)]

        def predict_proba(self, x):
            return x

        def decision_function(self, x):
            return x[:, 1] - x[:, 0] if x.shape[1] == 2 else x

        if kind == "probabilities":
            Identity.predict_proba = predict_proba
        else:
            Identity.decision_function = decision_function
        return Identity


def run_sklearn(name, spec, fit, held_out, repeats):
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.frozen import FrozenEstimator
    from sklearn.linear_model import LogisticRegression

    y = fit[1].numpy()
    if spec == "logistic":  # matrix scaling: the logits as features; Platt: the log-odds
        feature = (lambda z: (z[:, 1] - z[:, 0])[:, None].double().numpy()) if name == "platt" else \
            (lambda z: z.double().numpy())
        x_fit, x_test = feature(fit[0]), feature(held_out[0])
        fit_s, model = best_time(lambda: LogisticRegression(C=np.inf).fit(x_fit, y), repeats)
        iterations = int(np.max(model.n_iter_))
    else:
        kind = "probabilities" if spec == "isotonic" else "logits"
        prepare = softmax64 if spec == "isotonic" else (lambda z: z.double().numpy())
        x_fit, x_test = prepare(fit[0]), prepare(held_out[0])
        base = _Scores.make(kind)().fit(x_fit, y)
        fit_s, model = best_time(lambda: CalibratedClassifierCV(FrozenEstimator(base), method=spec)
                                 .fit(x_fit, y), repeats)
        iterations = None
    apply = lambda: model.predict_proba(x_test)  # noqa: E731
    out = apply()
    return fit_s, apply, as_logits(out), as_logits(model.predict_proba(x_fit)), iterations, 0.0, None


def run_probmetrics(name, spec, fit, held_out, repeats):
    import probmetrics.calibrators as pm
    from probmetrics.distributions import CategoricalLogits

    labels = fit[1]
    fit_s, cal = best_time(lambda: getattr(pm, spec)().fit_torch(CategoricalLogits(fit[0]), labels), repeats)
    apply = lambda: cal.predict_proba_torch(CategoricalLogits(held_out[0])).get_logits()  # noqa: E731
    out = apply()
    on_fit = cal.predict_proba_torch(CategoricalLogits(fit[0])).get_logits()
    return fit_s, apply, out.detach().double(), on_fit.detach().double(), None, 0.0, None


RUNNERS = {"timm_csm": run_ours, "netcal": run_netcal, "torch-uncertainty": run_tu, "scikit-learn": run_sklearn,
           "probmetrics": run_probmetrics}
MODULES = {"netcal": "netcal", "torch-uncertainty": "torch_uncertainty.post_processing",
           "scikit-learn": "sklearn.calibration", "probmetrics": "probmetrics.calibrators"}
DISTRIBUTIONS = {"timm_csm": "timm-csm", "netcal": "netcal", "torch-uncertainty": "torch-uncertainty",
                 "scikit-learn": "scikit-learn", "probmetrics": "probmetrics"}


def installed() -> Dict[str, Optional[str]]:
    """{library: version, or None where it (or a dependency of it) does not import}."""
    from importlib.metadata import version

    out = {"timm_csm": version("timm-csm")}
    for lib, module in MODULES.items():
        try:
            importlib.import_module(module)
            out[lib] = version(DISTRIBUTIONS[lib])
        except Exception:  # absent, or a dependency of it absent
            out[lib] = None
    return out

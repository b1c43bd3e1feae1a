"""Draft acceptance: a model fitted to the in-project LM's measurements.

The model
---------
Per-token acceptance of a draft token is::

    a = a_max * overlap**beta * exp(-gamma * err**2)

* ``overlap`` (expert axis): the fraction of the target's top-``k`` experts
  that the draft also had (resident), averaged over the MoE layers and the
  draft tokens; :mod:`.claims` measures it per model as the share of a
  calibration run's VERIFY picks whose expert was resident.
* ``err`` (bit axis): relative RMS error of the experts' dot products with
  the draft's weights instead of the INT8 weights, *measured* on the small
  MoE LM: the golden bit-slice model applied to that model's INT8 expert
  weights and the activations recorded at its experts' inputs
  (:func:`elmoe3d.sim.lm.evidence.precision_errors`). ``augmented`` = the
  kept planes + LSB augmentation, ``truncated`` = the kept planes alone,
  ``rtn4`` = an independently quantised 4-bit copy, ``full`` = 0.
* ``a_max, beta, gamma`` are *fitted* to the Elastic-SD acceptance measured
  on that LM (every trained model, draft lengths 1..8, resident fractions,
  policies, precisions and slice widths;
  :func:`elmoe3d.sim.lm.evidence.fit_acceptance`), not to any result of the
  paper. Both come from ``sim/lm/data/acceptance.json`` (written by
  ``elmoe3d evidence --update-data``); without that file the fallback of
  ``systems.json`` is used and :attr:`AcceptanceModel.source` says so.

The fit transfers from a 16-expert top-2 byte model to the published shapes
through ``overlap`` alone - an assumption, stated with every result.

The claims use the ``augmented`` rate (the design's drafts) at the measured
overlap, and sweep the paper's 0.33-0.91 besides.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["AcceptanceModel", "load_fit", "PRECISIONS"]

PRECISIONS = ("full", "augmented", "truncated", "rtn4")


def load_fit(path=None, cfg: dict | None = None) -> dict:
    """``{"a_max", "beta", "gamma", "errors", "source", "fitted"}`` from the LM
    evidence's acceptance file (``fit`` and ``precision_error``), else the
    fallback of ``systems.json`` (``fitted`` False)."""
    cfg = cfg or {}
    if path:
        p = Path(path)
    else:                                    # the LM's data folder, wherever the package is
        from elmoe3d.golden.lm import DATA_DIR
        p = DATA_DIR / Path(cfg.get("fit_file", "sim/lm/data/acceptance.json")).name
    try:
        data = json.loads(p.read_text())
        fit, errs = data["fit"], data["precision_error"]
        out = dict(a_max=float(fit["a_max"]), beta=float(fit["beta"]), gamma=float(fit["gamma"]),
                   errors={k: float(v) for k, v in errs.items()}, fitted=True,
                   rmse=fit.get("rmse"), rows=fit.get("rows"),
                   source=f"fit to the LM's measured acceptance ({p.name}: {fit.get('rows')} rows, "
                          f"rmse {fit.get('rmse', float('nan')):.3f})")
        return out
    except (OSError, ValueError, KeyError, TypeError):
        fb = cfg.get("fallback", {"a_max": 1.0, "beta": 0.55, "gamma": 3.8,
                                  "errors": {"augmented": 0.074, "truncated": 0.169, "rtn4": 0.083}})
        return dict(a_max=fb["a_max"], beta=fb["beta"], gamma=fb["gamma"],
                    errors={f"s4k1-channel-{k}" if k != "rtn4" else k: v
                            for k, v in fb["errors"].items()},
                    fitted=False, source=f"FALLBACK (no fit file {p}): systems.json acceptance.fallback")


class AcceptanceModel:
    """Per-token draft acceptance (see the module docstring).

    Parameters
    ----------
    a_max, beta, gamma : float
        Model parameters (default: the fit from the LM evidence).
    errors : dict, optional
        Measured dot-product errors by name (``s4k1-channel-augmented``, ...,
        ``rtn4``).
    slice_bits, keep, scales : the bit-slice configuration drafts run at.
    """

    def __init__(self, a_max: float | None = None, beta: float | None = None,
                 gamma: float | None = None, errors: dict | None = None,
                 slice_bits: int = 4, keep: int = 1, scales: str = "channel", source: str | None = None):
        fit = None
        if a_max is None or beta is None or gamma is None or errors is None:
            fit = load_fit()
        self.a_max = float(fit["a_max"] if a_max is None else a_max)
        self.beta = float(fit["beta"] if beta is None else beta)
        self.gamma = float(fit["gamma"] if gamma is None else gamma)
        if not 0 < self.a_max <= 1:
            raise ValueError(f"a_max must be in (0, 1], not {self.a_max!r}")
        self.errors = dict(fit["errors"] if errors is None else errors)
        self.fit_source = (fit or {}).get("source", source or "given parameters")
        self.fitted = bool((fit or {}).get("fitted", False))
        self.slice_bits, self.keep, self.scales = slice_bits, keep, scales

    @classmethod
    def from_config(cls, cfg: dict, **kw) -> "AcceptanceModel":
        """The model of ``systems.json``'s ``acceptance`` entry (its fit file,
        else its fallback)."""
        fit = load_fit(cfg=cfg)
        m = cls(fit["a_max"], fit["beta"], fit["gamma"], fit["errors"], source=fit["source"], **kw)
        m.fit_source, m.fitted = fit["source"], fit["fitted"]
        return m

    @property
    def source(self) -> str:
        return (f"model a_max={self.a_max:.3g} beta={self.beta:.3g} gamma={self.gamma:.3g}, "
                f"{self.fit_source}")

    def error(self, precision: str) -> float:
        """Measured relative dot-product error of a draft precision at this
        slice configuration."""
        if precision not in PRECISIONS:
            raise ValueError(f"Draft precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        if precision == "full":
            return 0.0
        name = "rtn4" if precision == "rtn4" else \
            f"s{self.slice_bits}k{self.keep}-{self.scales}-{precision}"
        if name not in self.errors:
            raise ValueError(f"No measured draft-weight error for {name!r} (have "
                             f"{', '.join(sorted(self.errors))})")
        return float(self.errors[name])

    def precision_factor(self, precision: str) -> float:
        return float(np.exp(-self.gamma * self.error(precision) ** 2))

    def rate(self, overlap, precision: str = "augmented"):
        """Per-token acceptance (array-friendly in ``overlap``)."""
        ov = np.clip(np.asarray(overlap, dtype=np.float64), 0.0, 1.0)
        return np.clip(self.a_max * ov ** self.beta * self.precision_factor(precision), 0.0, 1.0)

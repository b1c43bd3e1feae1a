"""Draft acceptance: a model fitted to measurements, or measured rows from a file.

The model
---------
Per-token acceptance of a draft token is::

    a = a_max * overlap**beta * exp(-gamma * err**2)

* ``overlap`` (expert axis): the fraction of the target's top-``k`` experts
  that the draft also had (resident), averaged over the MoE layers and the
  draft tokens of one request; measured from the replayed routing trace
  against the cache state of each iteration.
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

Accepted tokens per verification with draft length ``K`` and per-token rate
``a`` (stop at the first rejection) follow ``P(n) = a**n (1-a)`` for
``n < K`` and ``a**K`` for ``n = K``; every verification also emits one token
of its own (the correction or bonus), so the *acceptance length* is ``n + 1``.

Measured acceptance rows (``--acceptance FILE``)
------------------------------------------------
A JSON file (a list of rows, or ``{"rows": [...], ...}``) replaces the model
by table lookup. Each row::

    {"draft_len": 4, "resident_fraction": 0.25, "policy": "hotness",
     "precision": "augmented", "acceptance_rate": 0.71, "mean_accepted": 2.3,
     "slice_bits": 4, "keep": 1, "scales": "channel", "dense_precision": "full"}

(the last four optional; rows of other slice configurations are ignored).
``mean_accepted`` (preferred) is the mean accepted drafts per verification;
when present the per-token rate is solved from
``sum(a**i, i = 1..draft_len) = mean_accepted``, otherwise
``acceptance_rate`` is taken as the per-token rate. Lookup: rows with the
same policy and precision (falling back to any policy), the nearest
``draft_len``, then linear interpolation over ``resident_fraction``. A
precision without rows uses the model.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["AcceptanceModel", "synthetic_precision_error", "expected_accepted", "sample_accepted",
           "load_measured", "load_fit", "PRECISIONS", "POLICIES", "per_token_rate"]

PRECISIONS = ("full", "augmented", "truncated", "rtn4")
POLICIES = ("hotness", "random", "static")


@lru_cache(maxsize=None)
def synthetic_precision_error(precision: str, mean: float = 2.0, std: float = 20.0) -> float:
    """The *old, assumed* bit error: golden bit-slice dot products on synthetic
    INT8 weights ~ N(0, 28) and activations ~ N(mean, std). Kept only to show
    how much the assumption differed from the measurement (docs/blocks/perf.md)."""
    from elmoe3d.golden import bitslice as bs
    if precision not in PRECISIONS:
        raise ValueError(f"Draft precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "full":
        return 0.0
    rng = np.random.default_rng(1234)
    w = np.clip(np.round(rng.normal(0, 28, (64, 1024))), -128, 127).astype(np.int64)
    x = np.clip(np.round(rng.normal(mean, std, (32, 1024))), -128, 127).astype(np.int64)
    y = (x @ w.T).astype(np.float64)
    if precision == "augmented":
        wd = bs.reconstruct(w, 4, 1, augment=True).astype(np.float64)
    elif precision == "truncated":
        wd = bs.reconstruct(w, 4, 1, augment=False).astype(np.float64)
    else:
        scale = np.abs(w).max(axis=1, keepdims=True) / 7.0
        wd = np.clip(np.round(w / scale), -8, 7) * scale
    yd = x @ wd.T
    return float(np.sqrt(np.mean((yd - y) ** 2)) / np.sqrt(np.mean(y ** 2)))


def expected_accepted(a: float, k: int) -> float:
    """Mean accepted drafts of ``k`` at per-token rate ``a`` (excluding the bonus token)."""
    return float(sum(a ** i for i in range(1, k + 1)))


def per_token_rate(mean_accepted: float, k: int) -> float:
    """``a`` with ``expected_accepted(a, k) == mean_accepted`` (bisection)."""
    m = min(max(float(mean_accepted), 0.0), k)
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if expected_accepted(mid, k) < m:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def sample_accepted(a: np.ndarray, k: int, rng) -> np.ndarray:
    """Accepted drafts per request: count of leading successes among ``k`` trials."""
    a = np.asarray(a, dtype=np.float64)
    trials = rng.random(a.shape + (k,)) < a[..., None]
    return np.cumprod(trials, axis=-1).sum(axis=-1)


def load_measured(path) -> dict:
    """Read a measured-acceptance JSON file; ``ValueError`` (one line) when malformed."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"Malformed acceptance file {str(path)!r}: {e}") from None
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"Malformed acceptance file {str(path)!r}: expected a non-empty list of rows")
    need = ("draft_len", "resident_fraction", "policy", "precision", "acceptance_rate")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or any(k not in r for k in need):
            raise ValueError(f"Malformed acceptance file {str(path)!r}: row {i} lacks one of {need}")
        try:
            ok = 0 <= float(r["acceptance_rate"]) <= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"Malformed acceptance file {str(path)!r}: row {i} acceptance_rate "
                             f"{r['acceptance_rate']!r} outside 0..1")
    return {"rows": rows, "source": str(path)}


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
                   dense_msb_factor=dense_msb_factor(data.get("rows", [])),
                   rmse=fit.get("rmse"), rows=fit.get("rows"),
                   source=f"fit to the LM's measured acceptance ({p.name}: {fit.get('rows')} rows, "
                          f"rmse {fit.get('rmse', float('nan')):.3f})")
        return out
    except (OSError, ValueError, KeyError, TypeError):
        fb = cfg.get("fallback", {"a_max": 1.0, "beta": 0.55, "gamma": 3.8,
                                  "errors": {"augmented": 0.074, "truncated": 0.169, "rtn4": 0.083}})
        return dict(a_max=fb["a_max"], beta=fb["beta"], gamma=fb["gamma"],
                    errors={f"s4k1-channel-{k}" if k != "rtn4" else k: v
                            for k, v in fb["errors"].items()}, dense_msb_factor=None,
                    fitted=False, source=f"FALLBACK (no fit file {p}): systems.json acceptance.fallback")


def dense_msb_factor(rows) -> float | None:
    """Measured effect of drafting with the dense weights (attention, router,
    embedding/head) at MSB-augmented precision too: the mean ratio of per-token
    rates, dense augmented over dense INT8, of the LM's rows with the same
    resident fraction and draft length (hotness, augmented experts). ``None``
    without such rows."""
    base, aug = {}, {}
    for r in rows:
        if r.get("policy") != "hotness" or r.get("precision") != "augmented" or \
                (r.get("slice_bits", 4), r.get("keep", 1), r.get("scales", "channel")) != (4, 1, "channel"):
            continue
        k = (r["resident_fraction"], int(r["draft_len"]))
        (aug if r.get("dense_precision", "full") == "augmented" else base)[k] = _per_token(r)
    ratios = [aug[k] / base[k] for k in aug if k in base and base[k] > 0]
    return float(np.mean(ratios)) if ratios else None


class AcceptanceModel:
    """Per-token draft acceptance (see the module docstring).

    Parameters
    ----------
    a_max, beta, gamma : float
        Model parameters (default: the fit from the LM evidence).
    errors : dict, optional
        Measured dot-product errors by name (``s4k1-channel-augmented``, ...,
        ``rtn4``).
    measured : dict, optional
        From :func:`load_measured`; when given, :meth:`rate` looks rows up.
    slice_bits, keep, scales : the bit-slice configuration drafts run at.
    """

    def __init__(self, a_max: float | None = None, beta: float | None = None,
                 gamma: float | None = None, measured=None, errors: dict | None = None,
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
        self.dense_factor = (fit or {}).get("dense_msb_factor")
        self.fit_source = (fit or {}).get("source", source or "given parameters")
        self.fitted = bool((fit or {}).get("fitted", False))
        self.measured = measured
        self.slice_bits, self.keep, self.scales = slice_bits, keep, scales

    @classmethod
    def from_config(cls, cfg: dict, measured_path=None, **kw) -> "AcceptanceModel":
        m = load_measured(measured_path) if measured_path else None
        fit = load_fit(cfg=cfg)
        return cls(fit["a_max"], fit["beta"], fit["gamma"], m, fit["errors"],
                   source=fit["source"], **kw)._with(fit)

    def _with(self, fit):
        self.fit_source, self.fitted = fit["source"], fit["fitted"]
        self.dense_factor = fit.get("dense_msb_factor")
        return self

    @property
    def source(self) -> str:
        if self.measured:
            return f"measured rows: {self.measured['source']}"
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

    def rate(self, overlap, precision: str = "augmented", *, resident_fraction: float | None = None,
             policy: str = "hotness", draft_len: int | None = None, dense: str = "full"):
        """Per-token acceptance (array-friendly in ``overlap``); ``dense="msb"``
        (the draft reads the dense weights at MSB-augmented precision too)
        multiplies by the LM's measured factor (:func:`dense_msb_factor`)."""
        if dense == "msb":
            if self.dense_factor is None:
                raise ValueError("No measured acceptance for drafts with MSB dense weights "
                                 "(the acceptance file has no dense_precision 'augmented' rows)")
            return np.clip(self.rate(overlap, precision, resident_fraction=resident_fraction,
                                     policy=policy, draft_len=draft_len) * self.dense_factor, 0.0, 1.0)
        if self.measured is not None and resident_fraction is not None:
            rows = self._rows(precision)
            if rows:
                return np.full(np.shape(overlap), self._lookup(rows, resident_fraction, policy, draft_len))
        ov = np.clip(np.asarray(overlap, dtype=np.float64), 0.0, 1.0)
        return np.clip(self.a_max * ov ** self.beta * self.precision_factor(precision), 0.0, 1.0)

    def _rows(self, precision):
        out = []
        for r in self.measured["rows"]:
            if r["precision"] != precision or r.get("dense_precision", "full") != "full":
                continue
            if precision != "full" and precision != "rtn4" and \
                    (r.get("slice_bits", 4), r.get("keep", 1), r.get("scales", "channel")) != \
                    (self.slice_bits, self.keep, self.scales):
                continue
            if precision == "full" and r.get("scales", "channel") != self.scales:
                continue
            out.append(r)
        return out

    def _lookup(self, rows, frac, policy, draft_len):
        pol = [r for r in rows if r["policy"] == policy]
        rows = pol or rows
        if draft_len is not None:
            best = min(abs(int(r["draft_len"]) - draft_len) for r in rows)
            rows = [r for r in rows if abs(int(r["draft_len"]) - draft_len) == best]
        pts = {}
        for r in rows:
            pts.setdefault(float(r["resident_fraction"]), []).append(_per_token(r))
        xs = sorted(pts)
        return float(np.interp(frac, xs, [float(np.mean(pts[x])) for x in xs]))


def _per_token(row: dict) -> float:
    """Per-token rate of a measured row: solved from ``mean_accepted`` when
    given, else ``acceptance_rate``."""
    K = int(row["draft_len"])
    m = row.get("mean_accepted")
    if m is None or K < 1:
        return float(row["acceptance_rate"])
    return per_token_rate(m, K)

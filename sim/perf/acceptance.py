"""Draft acceptance: an explicit model, or measured rates from a file.

The model
---------
Per-token acceptance of a draft token is::

    a = a_max * overlap**beta * exp(-gamma * err**2)

* ``overlap`` (expert axis): the fraction of the target's top-``k`` experts
  that the draft also used, averaged over the MoE layers and the draft
  tokens of one request. For Elastic-SD the draft routes only to resident
  experts, so ``overlap`` = fraction of the true top-k that is resident; it is
  measured from the routing trace against the cache state of each iteration.
* ``err`` (bit axis): relative RMS error of a dot product computed with the
  draft's weights instead of the INT8 weights, from the golden bit-slice model
  (:func:`elmoe3d.golden.bitslice.reconstruct`) on seeded synthetic data:
  INT8 weights ~ N(0, 28) (a per-channel scale putting max|w| near 4.5 sigma),
  INT8 activations ~ N(2, 20) (a small positive mean, as after a gated
  activation), length 1024. ``augmented`` = MSB plane + implicit rounding bit,
  ``truncated`` = MSB plane alone (biased by -7.5 per weight), ``rtn4`` = an
  independently quantised 4-bit copy (per-row scale max|w|/7), ``full`` = 0.
* ``a_max, beta, gamma`` are in ``data/systems.json`` (``"acceptance"``) and
  were chosen so the grid spans the paper's reported 0.33-0.91.

Accepted tokens per verification with draft length ``K`` and per-token rate
``a`` (stop at the first rejection) follow ``P(n) = a**n (1-a)`` for
``n < K`` and ``a**K`` for ``n = K``; every verification also emits one token
of its own (the correction or bonus), so the *acceptance length* is ``n + 1``.

Measured acceptance file
------------------------
A JSON file (a list of rows, or ``{"rows": [...], "source": ...}``) replaces
the model. Each row::

    {"draft_len": 4, "resident_fraction": 0.25, "policy": "hotness",
     "precision": "augmented", "acceptance_rate": 0.71, "mean_accepted": 2.3}

``resident_fraction`` is the fraction of all routed experts resident in the
draft model; ``policy`` is ``"hotness"`` or ``"random"``; ``precision`` is
``"augmented"``, ``"truncated"``, ``"rtn4"`` or ``"full"``;
``mean_accepted`` (optional but preferred) is the mean number of accepted
drafts per verification (matched prefix, capped at ``draft_len``); when it is
present the per-token rate ``a`` is solved from
``sum(a**i, i = 1..draft_len) = mean_accepted``, otherwise ``acceptance_rate``
is taken as the per-token rate. Lookup: rows with the same policy and
precision (falling back to any policy), the nearest ``draft_len``, then linear
interpolation of the per-token rate over ``resident_fraction`` (clamped). A
precision the file has no rows for (e.g. SD-Q4's ``rtn4``) uses the model.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["AcceptanceModel", "precision_error", "expected_accepted", "sample_accepted",
           "load_measured", "PRECISIONS", "POLICIES"]

PRECISIONS = ("full", "augmented", "truncated", "rtn4")
POLICIES = ("hotness", "random")


@lru_cache(maxsize=None)
def precision_error(precision: str) -> float:
    """Relative RMS dot-product error of a draft precision (golden bit-slice model)."""
    from elmoe3d.golden import bitslice as bs
    if precision not in PRECISIONS:
        raise ValueError(f"Draft precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "full":
        return 0.0
    rng = np.random.default_rng(1234)
    w = np.clip(np.round(rng.normal(0, 28, (64, 1024))), -128, 127).astype(np.int64)
    x = np.clip(np.round(rng.normal(2, 20, (32, 1024))), -128, 127).astype(np.int64)
    y = (x @ w.T).astype(np.float64)
    if precision == "augmented":
        wd = bs.reconstruct(w, 4, 1, augment=True).astype(np.float64)
    elif precision == "truncated":
        wd = bs.reconstruct(w, 4, 1, augment=False).astype(np.float64)
    else:                                    # independent 4-bit RTN copy, per-row scale
        scale = np.abs(w).max(axis=1, keepdims=True) / 7.0
        wd = np.clip(np.round(w / scale), -8, 7) * scale
    yd = x @ wd.T
    return float(np.sqrt(np.mean((yd - y) ** 2)) / np.sqrt(np.mean(y ** 2)))


def expected_accepted(a: float, k: int) -> float:
    """Mean accepted drafts of ``k`` at per-token rate ``a`` (excluding the bonus token)."""
    return float(sum(a ** i for i in range(1, k + 1)))


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
        if not 0 <= float(r["acceptance_rate"]) <= 1:
            raise ValueError(f"Malformed acceptance file {str(path)!r}: row {i} acceptance_rate "
                             f"{r['acceptance_rate']!r} outside 0..1")
    return {"rows": rows, "source": str(path)}


class AcceptanceModel:
    """Per-token draft acceptance (see the module docstring).

    Parameters
    ----------
    a_max, beta, gamma : float
        Model parameters.
    measured : dict, optional
        From :func:`load_measured`; when given, :meth:`rate` uses it.
    """

    def __init__(self, a_max: float = 0.93, beta: float = 1.0, gamma: float = 4.0, measured=None):
        if not 0 < a_max <= 1:
            raise ValueError(f"a_max must be in (0, 1], not {a_max!r}")
        self.a_max, self.beta, self.gamma = float(a_max), float(beta), float(gamma)
        self.measured = measured

    @classmethod
    def from_config(cls, cfg: dict, measured_path=None) -> "AcceptanceModel":
        m = load_measured(measured_path) if measured_path else None
        return cls(cfg.get("a_max", 0.93), cfg.get("beta", 1.0), cfg.get("gamma", 4.0), m)

    @property
    def source(self) -> str:
        return f"measured: {self.measured['source']}" if self.measured else \
            f"model a_max={self.a_max:g} beta={self.beta:g} gamma={self.gamma:g}"

    def precision_factor(self, precision: str) -> float:
        return float(np.exp(-self.gamma * precision_error(precision) ** 2))

    def rate(self, overlap, precision: str = "augmented", *, resident_fraction: float | None = None,
             policy: str = "hotness", draft_len: int | None = None):
        """Per-token acceptance (array-friendly in ``overlap``)."""
        if self.measured is not None and resident_fraction is not None and \
                any(r["precision"] == precision for r in self.measured["rows"]):
            return np.full(np.shape(overlap), self._lookup(resident_fraction, precision, policy, draft_len))
        ov = np.clip(np.asarray(overlap, dtype=np.float64), 0.0, 1.0)
        return np.clip(self.a_max * ov ** self.beta * self.precision_factor(precision), 0.0, 1.0)

    def _lookup(self, frac, precision, policy, draft_len):
        rows = [r for r in self.measured["rows"] if r["precision"] == precision]
        pol = [r for r in rows if r["policy"] == policy]
        rows = pol or rows
        if not rows:
            raise ValueError(f"Acceptance file {self.measured['source']!r} has no rows for precision "
                             f"{precision!r}")
        if draft_len is not None:
            best = min(abs(int(r["draft_len"]) - draft_len) for r in rows)
            rows = [r for r in rows if abs(int(r["draft_len"]) - draft_len) == best]
        pts = sorted((float(r["resident_fraction"]), _per_token(r)) for r in rows)
        xs, ys = zip(*pts)
        return float(np.interp(frac, xs, ys))


def _per_token(row: dict) -> float:
    """Per-token rate of a measured row: solved from ``mean_accepted`` when
    given (``sum(a**i, i=1..K) = mean_accepted``, whatever the file's own
    definition of ``acceptance_rate``), else ``acceptance_rate``."""
    K = int(row["draft_len"])
    m = row.get("mean_accepted")
    if m is None or K < 1:
        return float(row["acceptance_rate"])
    m = min(max(float(m), 0.0), K)
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if expected_accepted(mid, K) < m:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2

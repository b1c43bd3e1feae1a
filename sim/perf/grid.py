"""The evaluation grid, the ratios the paper reports, the ablations and the
side-by-side table with the paper.

Ratios per (model, batch): ``speedup_vs_xpu = tok/s(ELMoE-3D) / tok/s(xPU)``,
``energy_vs_xpu = J/token(xPU) / J/token(ELMoE-3D)`` (energy efficiency), and
the same against the *best prior accelerator* (of xPU-PIM, xPU-NMP and HB-xPU,
the fastest for speed and the most frugal for energy, per point). Means are
arithmetic over the paper's grid (``paper_eval`` models x batches 1..16 at
8 GB), as the paper reports them.
"""

from __future__ import annotations

import time

import numpy as np

from .acceptance import AcceptanceModel
from .hardware import Hardware, get_hardware
from .models import ModelShape, get_model, model_names, load_models
from .systems import PRIOR, SYSTEMS, RunResult, Workload, load_systems, run_system
from .traces import Trace

__all__ = ["run_point", "run_grid", "summarize", "ablations", "side_by_side", "DEFAULT_BATCHES",
           "elmoe_auto"]

DEFAULT_BATCHES = (1, 2, 4, 8, 16)
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)


def elmoe_auto(w: Workload, accm, **kw) -> RunResult:
    """ELMoE-3D with the batch threshold of systems.json (``"auto"``: AR and
    Elastic-SD both run, the faster is kept and the other is in ``alternative``)."""
    return run_system("ELMoE-3D", w, accm, **kw)


def run_point(model: ModelShape, hw: Hardware, batch: int, context: int | None = None,
              trace: Trace | None = None, accm: AcceptanceModel | None = None,
              systems=SYSTEMS, draft_len: int | None = None) -> dict:
    """``{system: RunResult}`` for one grid point (all systems share one workload).
    ``draft_len`` overrides K of the SD systems."""
    w = Workload(model, hw, batch, context, trace)
    accm = accm or AcceptanceModel.from_config(load_systems()["acceptance"])
    return {s: run_system(s, w, accm, draft_len=draft_len) for s in systems}


def _ratios(point: dict) -> dict:
    e = point["ELMoE-3D"]
    x = point["xPU"]
    pri = [point[p] for p in PRIOR if p in point]
    r = dict(speedup_vs_xpu=e.tokens_per_s / x.tokens_per_s,
             energy_vs_xpu=x.energy_per_token_mj / e.energy_per_token_mj)
    if pri:
        fast = max(pri, key=lambda p: p.tokens_per_s)
        frugal = min(pri, key=lambda p: p.energy_per_token_mj)
        r.update(speedup_vs_best_prior=e.tokens_per_s / fast.tokens_per_s, best_prior=fast.system,
                 energy_vs_best_prior=frugal.energy_per_token_mj / e.energy_per_token_mj,
                 best_prior_energy=frugal.system)
    if "SD-EAGLE" in point and "SD-Q4" in point:
        sd = max((point["SD-EAGLE"], point["SD-Q4"]), key=lambda p: p.tokens_per_s)
        r["speedup_vs_best_sd"] = e.tokens_per_s / sd.tokens_per_s
    return r


def run_grid(models=None, batches=DEFAULT_BATCHES, hb_gb: float = 8.0, context: int | None = None,
             trace: Trace | None = None, accm: AcceptanceModel | None = None, progress=None,
             systems=SYSTEMS, draft_len: int | None = None) -> dict:
    """Run every (model, batch) point. Returns ``{"points": [...], "summary": ...}``;
    each point is ``{"model", "batch", "results": {system: dict}, "ratios": {...}}``."""
    models = list(models) if models else model_names()
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"Batch must be a positive integer, not {b!r}")
    hw = get_hardware(hb_gb=hb_gb)
    accm = accm or AcceptanceModel.from_config(load_systems()["acceptance"])
    t0 = time.monotonic()
    points = []
    for name in models:
        m = get_model(name)
        for b in batches:
            if progress:
                progress(f"perf: {m.name} batch {b}", step=False)
            res = run_point(m, hw, b, context, trace, accm, systems, draft_len)
            pt = dict(model=m.name, batch=int(b), paper_eval=m.paper_eval,
                      results={k: _asdict(v) for k, v in res.items()})
            if "ELMoE-3D" in res and "xPU" in res:
                pt["ratios"] = _ratios(res)
            points.append(pt)
    out = dict(hb_gb=hw.hb_gb, context=context or load_systems()["common"]["context"],
               batches=list(batches), models=[get_model(n).name for n in models],
               systems=list(systems), rtl=dict(hw.rtl), acceptance_source=accm.source,
               draft_len=draft_len,
               trace=("file: " + str(trace.meta.get("path", trace.model))) if trace else "synthetic",
               points=points, seconds=round(time.monotonic() - t0, 2))
    out["summary"] = summarize(out)
    return out


def _asdict(r: RunResult) -> dict:
    d = r.to_dict()
    return _jsonable(d)


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def summarize(grid: dict) -> dict:
    """Means and maxima of the ratios: over the paper's models and over all models."""
    out = {}
    for scope, sel in (("paper_models", lambda p: p["paper_eval"]), ("all_models", lambda p: True)):
        pts = [p for p in grid["points"] if "ratios" in p and sel(p)]
        if not pts:
            continue
        s = {}
        for k in ("speedup_vs_xpu", "energy_vs_xpu", "speedup_vs_best_prior", "energy_vs_best_prior",
                  "speedup_vs_best_sd"):
            v = np.array([p["ratios"][k] for p in pts if k in p["ratios"]])
            if len(v):
                s[k] = dict(mean=float(v.mean()), max=float(v.max()), min=float(v.min()))
        acc = [p["results"]["ELMoE-3D"]["acceptance"]["rate"] for p in pts
               if p["results"]["ELMoE-3D"].get("acceptance")]
        if acc:
            s["acceptance_rate"] = dict(min=float(min(acc)), max=float(max(acc)))
        s["points"] = len(pts)
        out[scope] = s
    return out


# -- ablations -------------------------------------------------------------------------

def ablations(models=None, hb_gb: float = 8.0, context: int | None = None, trace: Trace | None = None,
              accm: AcceptanceModel | None = None,
              which=("hotness", "precision", "planes", "hb", "context", "draft_len", "reuse"),
              batches=(4, 16), progress=None) -> dict:
    """The paper's ablations on this model (see docs/blocks/perf.md)."""
    models = [get_model(n) for n in (models or [n for n, m in load_models().items() if m.paper_eval])]
    accm = accm or AcceptanceModel.from_config(load_systems()["acceptance"])
    hw = get_hardware(hb_gb=hb_gb)
    out = {}

    def note(msg):
        if progress:
            progress(msg, step=False)

    if "hotness" in which:
        rows = []
        for m in models:
            for b in batches:
                note(f"perf ablation hotness: {m.name} batch {b}")
                w = Workload(m, hw, b, context, trace)
                h = run_system("ELMoE-3D", w, accm, mode="SD", policy="hotness")
                r = run_system("ELMoE-3D", w, accm, mode="SD", policy="random")
                if h.mode != "SD" or r.mode != "SD":
                    continue
                rows.append(dict(model=m.name, batch=b,
                                 hotness_length=h.acceptance["acceptance_length"],
                                 random_length=r.acceptance["acceptance_length"],
                                 hotness_rate=h.acceptance["rate"], random_rate=r.acceptance["rate"],
                                 hotness_tok_s=h.tokens_per_s, random_tok_s=r.tokens_per_s,
                                 gain=h.acceptance["acceptance_length"] / r.acceptance["acceptance_length"] - 1))
        out["hotness"] = dict(rows=rows, mean_gain=float(np.mean([r["gain"] for r in rows])) if rows else None)
    if "precision" in which:
        rows = []
        for m in models:
            b = batches[-1]
            note(f"perf ablation precision: {m.name} batch {b}")
            w = Workload(m, hw, b, context, trace)
            for p in ("augmented", "truncated"):
                r = run_system("ELMoE-3D", w, accm, mode="SD", precision=p)
                if r.mode == "SD":
                    rows.append(dict(model=m.name, batch=b, precision=p, rate=r.acceptance["rate"],
                                     acceptance_length=r.acceptance["acceptance_length"],
                                     tokens_per_s=r.tokens_per_s))
        out["precision"] = dict(rows=rows)
    if "planes" in which:
        rows = []
        for m in models:
            b = batches[-1]
            note(f"perf ablation resident planes: {m.name} batch {b}")
            w = Workload(m, hw, b, context, trace)
            for planes in ("msb", "full"):
                r = run_system("ELMoE-3D", w, accm, mode="SD", spec_override={"resident_planes": planes})
                if r.mode == "SD":
                    rows.append(dict(model=m.name, batch=b, resident_planes=planes,
                                     tokens_per_s=r.tokens_per_s, hit_rate=r.cache["hit_rate"],
                                     rate=r.acceptance["rate"],
                                     acceptance_length=r.acceptance["acceptance_length"],
                                     lpddr_mb_per_token=r.bytes_per_token["lpddr"] / 1e6))
        out["planes"] = dict(rows=rows)
    if "hb" in which:
        rows = []
        for m in models:
            for gb in (4.0, 8.0):
                h = get_hardware(hb_gb=gb)
                for b in batches:
                    note(f"perf ablation HB {gb:g} GB: {m.name} batch {b}")
                    try:
                        w = Workload(m, h, b, context, trace)
                    except ValueError as e:
                        rows.append(dict(model=m.name, hb_gb=gb, batch=b, error=str(e)))
                        continue
                    x = run_system("xPU", w, accm)
                    hbx = run_system("HB-xPU", w, accm)
                    e = elmoe_auto(w, accm)
                    rows.append(dict(model=m.name, hb_gb=gb, batch=b, mode=e.mode,
                                     elmoe_tok_s=e.tokens_per_s, hbxpu_tok_s=hbx.tokens_per_s,
                                     speedup_vs_xpu=e.tokens_per_s / x.tokens_per_s,
                                     elmoe_hit_rate=e.cache["hit_rate"],
                                     cache_gb=e.cache["capacity_gb"]))
        out["hb"] = dict(rows=rows)
    if "context" in which:
        rows = []
        m = models[0]
        b = batches[0]
        for ctx in CONTEXTS:
            note(f"perf ablation context {ctx}: {m.name} batch {b}")
            w = Workload(m, hw, b, ctx, trace)
            x = run_system("xPU", w, accm)
            hbx = run_system("HB-xPU", w, accm)
            e = elmoe_auto(w, accm)
            kv_hb, kv_lp, cache = w.hb_split()
            rows.append(dict(model=m.name, batch=b, context=ctx, kv_gb=w.kv_total / 2**30,
                             expert_cache_gb=cache / 2**30, mode=e.mode, elmoe_tok_s=e.tokens_per_s,
                             hbxpu_tok_s=hbx.tokens_per_s, xpu_tok_s=x.tokens_per_s,
                             speedup_vs_xpu=e.tokens_per_s / x.tokens_per_s,
                             notes="; ".join(n for n in e.notes if "backed off" in n)))
        out["context"] = dict(rows=rows)
    if "draft_len" in which:
        rows = []
        b = batches[-1]
        for m in models:
            note(f"perf ablation draft length: {m.name} batch {b}")
            w = Workload(m, hw, b, context, trace)
            for K in (1, 2, 3, 4, 6, 8):
                r = run_system("ELMoE-3D", w, accm, mode="SD", draft_len=K)
                if r.mode == "SD":
                    rows.append(dict(model=m.name, batch=b, draft_len=K, tokens_per_s=r.tokens_per_s,
                                     rate=r.acceptance["rate"],
                                     acceptance_length=r.acceptance["acceptance_length"]))
        out["draft_len"] = dict(rows=rows)
    if "reuse" in which and trace is None:
        import dataclasses
        rows = []
        m0 = models[0]
        for reuse in (m0.locality.get("reuse", 0.4), 0.7, 0.9):
            m = dataclasses.replace(m0, locality=dict(m0.locality, reuse=reuse))
            for b in batches:
                note(f"perf ablation reuse {reuse}: {m.name} batch {b}")
                w = Workload(m, hw, b, context)
                pt = {s_: run_system(s_, w, accm) for s_ in ("xPU",) + PRIOR}
                e = elmoe_auto(w, accm)
                best = max(pt[p_].tokens_per_s for p_ in PRIOR)
                rows.append(dict(model=m.name, reuse=reuse, batch=b, mode=e.mode,
                                 elmoe_tok_s=e.tokens_per_s,
                                 speedup_vs_xpu=e.tokens_per_s / pt["xPU"].tokens_per_s,
                                 speedup_vs_best_prior=e.tokens_per_s / best,
                                 acceptance_length=(e.acceptance or {}).get("acceptance_length")))
        out["reuse"] = dict(rows=rows)
    return _jsonable(out)


def side_by_side(grid: dict, abl: dict | None = None) -> list[dict]:
    """Rows ``{metric, paper, model, note}`` for the report."""
    p = load_systems()["paper"]
    s = grid["summary"].get("paper_models") or grid["summary"].get("all_models", {})
    g = lambda k, f: s.get(k, {}).get(f)
    rows = [
        dict(metric="speedup vs xPU, mean", paper=p["speedup_vs_xpu_mean"], model=g("speedup_vs_xpu", "mean")),
        dict(metric="speedup vs xPU, max", paper=p["speedup_vs_xpu_max"], model=g("speedup_vs_xpu", "max")),
        dict(metric="energy efficiency vs xPU, mean", paper=p["energy_vs_xpu_mean"], model=g("energy_vs_xpu", "mean")),
        dict(metric="speedup vs best prior, mean", paper=p["speedup_vs_best_prior_mean"],
             model=g("speedup_vs_best_prior", "mean")),
        dict(metric="energy efficiency vs best prior, mean", paper=p["energy_vs_best_prior_mean"],
             model=g("energy_vs_best_prior", "mean")),
    ]
    hot = (abl or {}).get("hotness", {}).get("mean_gain")
    rows.append(dict(metric="acceptance length, hotness vs random resident set", paper=p["hotness_vs_random_acceptance_length"],
                     model=hot))
    ar = s.get("acceptance_rate")
    rows.append(dict(metric="acceptance rate range", paper="%.2f-%.2f" % tuple(p["acceptance_range"]),
                     model=("%.2f-%.2f" % (ar["min"], ar["max"])) if ar else None))
    return rows


def locality_check(models=None, fractions=(0.1, 0.25, 0.5), batches=(1, 16),
                   trace: Trace | None = None) -> dict:
    """Per-layer LRU hit rate with a fraction of each layer's experts cached,
    at batch 1 and 16, on the routing traces the model uses - to set them next
    to published expert-cache figures (LRU hit rates from under 20% with a
    small cache to about 89% for Qwen3-30B-A3B with a large one; miss rate
    growing sharply with batch). Returns ``{"rows": [...], "published": str}``."""
    from .cache import LRUCache
    hw = get_hardware()
    rows = []
    for name in (models or model_names()):
        m = get_model(name)
        row = dict(model=m.name)
        for b in batches:
            w = Workload(m, hw, b, None, trace)
            for f in fractions:
                cap = max(1, round(f * m.experts))
                lookups = hits = 0
                for j in range(len(w.moe)):
                    lru = LRUCache(cap)
                    for s in range(w.steps):
                        for e in np.flatnonzero(w.counts[s, j]).tolist():
                            hit = lru.access(e)
                            if s >= w.warmup:
                                lookups += 1
                                hits += hit
                row[f"hit_{int(f * 100)}pct_b{b}"] = round(hits / max(lookups, 1), 3)
        rows.append(row)
    return dict(fractions=list(fractions), batches=list(batches), rows=rows,
                published="LRU expert-cache hit rate <20% (256 experts, small cache) to ~89% "
                          "(Qwen3-30B-A3B, large cache); miss 6.9% (batch 1) -> 68.8% (batch 16) "
                          "with 5% of experts cached in one study")

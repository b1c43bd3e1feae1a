"""Model vs RTL: the tile's hit/miss and byte counters for the same routing.

The RTL tile (the Elastic-SD controller joined with the tag unit, HB banks,
stream engine and MoE datapath) writes what it counted while running a
routing trace to ``build/measured/tile_counters.json``. This module replays
the same trace through a tag-unit cache driver (the golden policy,
:class:`~elmoe3d.sim.perf.cache.TagCache`) with the tile's geometry and the
host's accept decisions, and reports the agreement of the cache and byte
counters (:data:`COMPARED`). It prices nothing: the tile's cycles are
predicted by :mod:`elmoe3d.sim.perf.tile_model` and checked against these
and every other recorded run by :mod:`elmoe3d.sim.perf.validate`. When the
file does not exist it says so; nothing is assumed in its place.

File schema (``format: "elmoe3d-tile-counters"``, ``version: 1``)
---------------------------------------------------------------
::

    {"format": "elmoe3d-tile-counters", "version": 1,
     "source": "which test wrote it (block, simulator, seed)",
     "runs": [{
        "trace":    {"path": "…/trace.npz", "sha256": "<hex of the file>",
                     "model": str, "layers": L, "experts": E, "top_k": k},
        "batch":    B,                      # requests decoded in lock step
        "mode":     "AR" | "SD",
        "draft_len": K,                     # SD only
        "steps":    S,                      # decode steps per request replayed (AR), or
                                            # the trace positions covered (SD)
        "accepted": [[a_0, ..., a_{B-1}], ...],   # SD: accepted drafts per request and
                                            # iteration, as the host decided (in order)
        "geometry": {"slots": n, "expert_bytes": 3*H*I, "planes": n_planes,
                     "resident_planes": k, "hot_bits": 8, "decay_shift": 2},
        "driver":   {"touch_scale": 8, "alloc_hot": 32, "decay_period": 8},   # AR settings
        "rates":    {"hb_bytes_per_cycle": x, "lpddr_bytes_per_cycle": y,
                     "macs_per_cycle": z},  # the tile's peak rates (recorded, not used here)
        "counters": {"hb_hits": int, "hb_misses": int, "hb_pending": int,
                     "hb_bytes": int, "lpddr_bytes": int, "fills": int,
                     "evictions": int, "accepted_tokens": int,
                     "draft_cycles": int, "verify_cycles": int, "ar_cycles": int}
     }, ...]}

Version 2 (written by the tile's report runs, ``tests/test_tile.py -k
tile_report``) carries the routing itself instead of a trace file: ``trace``
is ``{"name": str}`` (a path is optional), and each run adds::

        "layer_steps": [[phase, layer, [[expert, ...] per token]], ...],
                                            # every layer step the tile ran, in order,
                                            # phase "AR" | "DRAFT" | "VERIFY", with the
                                            # experts it routed (DRAFT: eligible ones)
        "accepted":  [n_0, n_1, ...]        # SD: drafts accepted per round (all requests)

and the model replays exactly those steps through the same driver (AR:
:meth:`TagCache.access_layer` per layer step with ``touch_scale`` /
``alloc_hot``, DECAY every ``decay_period`` AR steps; SD: every DRAFT
layer step touches and reads its resident picks, every VERIFY layer step
looks up the union of its tokens' experts, DECAY once per round). So the
routing is the tile's, and what differs is the driver: the replay
looks up a layer step's union where the tile looks up per pass of ``T``
tokens, decays per round where the tile decays every ``decay_period``
decode steps, reads one HB copy per drafted pick where the tile reads an
expert once per pass, and caches whole experts in AR where the tile keeps
its MSB planes -- the comparison measures what those simplifications cost.

Counter meanings (per run, from reset): ``hb_hits`` / ``hb_misses`` -
verification (SD) or decode (AR) expert lookups that hit / missed the tag
unit; ``hb_pending`` - lookups that found their slot still being filled;
``hb_bytes`` / ``lpddr_bytes`` - weight bytes read from HB / LPDDR;
``fills`` - slots committed by an HB fill; ``evictions`` - valid slots
replaced; ``accepted_tokens`` - drafts accepted in total; ``*_cycles`` -
clock cycles spent in each phase (recorded; not compared here). Cache
counters are compared exactly (the policy is deterministic given the trace
and the accept decisions); bytes as relative errors within 5 %.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .cache import TagCache
from .hardware import REPO_ROOT
from .traces import load_trace

__all__ = ["TILE_COUNTERS", "COUNTERS", "COMPARED", "load_tile_counters", "model_counters", "tile_run",
           "compare", "report_lines"]

TILE_COUNTERS = REPO_ROOT / "build" / "measured" / "tile_counters.json"
#: The tile report's counters as recorded in the repository (``elmoe3d
#: tile-run --report --record`` writes it, so a fresh clone has the figures
#: without a simulation); used when no fresh file exists.
RECORDED = Path(__file__).resolve().parent.parent / "data" / "tile_counters.json"
FORMAT, VERSION = "elmoe3d-tile-counters", 2
VERSIONS = (1, 2)
COUNTERS = ("hb_hits", "hb_misses", "hb_pending", "hb_bytes", "lpddr_bytes", "fills", "evictions",
            "accepted_tokens", "draft_cycles", "verify_cycles", "ar_cycles")
#: what the replay is compared on: the cache counters exactly, the bytes within 5 %; the
#: tile's cycles are compared with the tile cycle model (:mod:`.validate`), not here
COMPARED = tuple(k for k in COUNTERS if not k.endswith("_cycles"))
EXACT = ("hb_hits", "hb_misses", "hb_pending", "fills", "evictions", "accepted_tokens")


def _fail(path, why):
    raise ValueError(f"Malformed tile-counter file {str(path)!r}: {why}")


def load_tile_counters(path=None) -> dict | None:
    """The parsed file, or ``None`` when it does not exist. ``ValueError``
    (one line) when it exists but is malformed."""
    if not path and not TILE_COUNTERS.is_file() and RECORDED.is_file():
        path = RECORDED
    path = Path(path) if path else TILE_COUNTERS
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        _fail(path, e)
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        _fail(path, f"'format' must be {FORMAT!r}")
    if int(d.get("version", 0)) not in VERSIONS:
        _fail(path, f"version {d.get('version')!r} is not one of {VERSIONS}")
    runs = d.get("runs")
    if not isinstance(runs, list) or not runs:
        _fail(path, "'runs' must be a non-empty list")
    for i, r in enumerate(runs):
        for k in ("trace", "batch", "mode", "geometry", "counters"):
            if k not in r:
                _fail(path, f"run {i} lacks {k!r}")
        if r["mode"] not in ("AR", "SD"):
            _fail(path, f"run {i} mode must be AR or SD, not {r['mode']!r}")
        miss = [c for c in COUNTERS if c not in r["counters"]]
        if miss:
            _fail(path, f"run {i} counters lack {', '.join(miss)}")
        if int(d["version"]) == 2 and not isinstance(r.get("layer_steps"), list):
            _fail(path, f"run {i} (version 2) lacks its 'layer_steps'")
    d["path"] = str(path)
    return d


def _trace_for(run, base: Path):
    t = run["trace"]
    p = Path(t["path"])
    if not p.is_absolute():
        p = (base / p) if (base / p).exists() else REPO_ROOT / p
    if not p.is_file():
        raise ValueError(f"Tile-counter trace {str(p)!r} does not exist")
    if t.get("sha256") and hashlib.sha256(p.read_bytes()).hexdigest() != t["sha256"]:
        raise ValueError(f"Tile-counter trace {str(p)!r} does not match its sha256 "
                         f"(the counters were measured on another trace)")
    tr = load_trace(p)
    for k, v in (("layers", tr.layers), ("experts", tr.num_experts), ("top_k", tr.top_k)):
        if k in t and int(t[k]) != v:
            raise ValueError(f"Tile-counter trace {str(p)!r}: {k} {v} != {t[k]} in the file")
    return tr


def _access(tc, c, li, ids, **kw) -> int:
    """One layer's lookups through the driver (:meth:`TagCache.access_layer`,
    then release), counted into ``c``; returns the hits."""
    hit, filled = tc.access_layer(li, ids, **kw)
    tc.release()
    nh = int(hit.sum())
    c["hb_hits"] += nh
    c["hb_misses"] += ids.size - nh
    c["fills"] += int(filled.sum())
    return nh


def _replay_steps(run: dict) -> dict:
    """Version 2: the model's counters for the exact layer steps the tile ran
    (module doc)."""
    g = run["geometry"]
    steps = run["layer_steps"]
    nL = 1 + max((int(s[1]) for s in steps), default=0)
    NE = int(g.get("experts") or 1 + max((e for s in steps for t in s[2] for e in t), default=1))
    tc = TagCache(int(g["slots"]), nL, NE, int(g.get("hot_bits", 8)), int(g.get("decay_shift", 2)))
    E = float(g["expert_bytes"])
    planes, keep = int(g.get("planes", 2)), int(g.get("resident_planes", 1))
    msb = E * keep / planes
    d = run.get("driver") or {}
    scale, alloc, period = (int(d.get("touch_scale", 8)), int(d.get("alloc_hot", 32)),
                            int(d.get("decay_period", 8)))
    c = dict.fromkeys(COMPARED, 0)
    acc = iter(run.get("accepted") or [])
    ev0, ar_steps = tc.evictions, 0

    for i, (phase, layer, sel) in enumerate(steps):
        li = int(layer)
        x = np.array([e for t in sel for e in t], np.int64)
        ids, cnt = np.unique(x, return_counts=True)
        last_layer = i + 1 == len(steps) or steps[i + 1][0] != phase or int(steps[i + 1][1]) <= li
        if phase == "DRAFT":
            res = tc.resident_mask()[li][ids] if ids.size else np.zeros(0, bool)
            tc.touch_layer(li, ids[res], cnt[res])
            c["hb_bytes"] += float(cnt[res].sum()) * msb
            continue
        if phase == "AR":
            amount = cnt * scale
            nh = _access(tc, c, li, ids, planes=planes, hots=np.maximum(amount, alloc),
                         touch=amount)
        else:
            nh = _access(tc, c, li, ids, planes=keep, hots=cnt)
        if phase == "AR":
            hb, lp = nh * E, (ids.size - nh) * E
            if last_layer:
                ar_steps += 1
                if ar_steps % period == 0:
                    tc.decay()
        else:
            hb, lp = nh * msb, nh * (E - msb) + (ids.size - nh) * E
            if last_layer:
                tc.decay()
                c["accepted_tokens"] += int(next(acc, 0))
        c["hb_bytes"] += hb
        c["lpddr_bytes"] += lp
    c["evictions"] = tc.evictions - ev0
    return c


def model_counters(run: dict, base: Path | None = None) -> dict:
    """The replay's counters (:data:`COMPARED`) for one run: the same trace, geometry and accept
    decisions through the ELMoE-3D driver (AR: LOOKUP / PIN / TOUCH /
    ALLOCATE per layer, DECAY every ``decay_period`` steps; SD: draft TOUCHes
    of resident picks, verification of the union of ``B*(K+1)`` tokens per
    layer, DECAY per iteration). A version-2 run (``layer_steps``) replays
    the tile's own steps."""
    if "layer_steps" in run:
        return _replay_steps(run)
    tr = _trace_for(run, base or REPO_ROOT)
    B = int(run["batch"])
    g = run["geometry"]
    S = tr.streams(B, run.get("steps"))                       # (B, T, L, k)
    moe = [l for l in range(tr.layers) if (S[:, :, l] >= 0).any()]
    ex = S[:, :, moe].astype(np.int64)
    nL, NE = len(moe), tr.num_experts
    tc = TagCache(int(g["slots"]), nL, NE, int(g.get("hot_bits", 8)), int(g.get("decay_shift", 2)))
    E = float(g["expert_bytes"])
    planes, keep = int(g.get("planes", 2)), int(g.get("resident_planes", 1))
    c = dict.fromkeys(COMPARED, 0)

    if run["mode"] == "AR":
        d = run.get("driver") or {}
        scale, alloc, period = int(d.get("touch_scale", 8)), int(d.get("alloc_hot", 32)), \
            int(d.get("decay_period", 8))
        ev0 = tc.evictions
        for s in range(ex.shape[1]):
            hb = lp = 0.0
            for li in range(nL):
                x = ex[:, s, li].reshape(-1)
                ids, cnt = np.unique(x[x >= 0], return_counts=True)
                amount = cnt * scale
                nh = _access(tc, c, li, ids, planes=planes, hots=np.maximum(amount, alloc),
                             touch=amount)
                hb += nh * E
                lp += (ids.size - nh) * E
            if (s + 1) % period == 0:
                tc.decay()
            c["hb_bytes"] += hb
            c["lpddr_bytes"] += lp
        c["evictions"] = tc.evictions - ev0
        return c
    K = int(run.get("draft_len", 4))
    msb = E * keep / planes
    pos = np.zeros(B, np.int64)
    ev0 = tc.evictions
    for a in run.get("accepted", []):
        a = np.asarray(a, np.int64)
        if a.shape != (B,) or (a < 0).any() or (a > K).any():
            raise ValueError(f"Tile-counter run: accepted decisions must be {B} integers in 0..{K}")
        if pos.max() + K + 1 > ex.shape[1]:
            raise ValueError("Tile-counter run: more accept decisions than the trace has tokens")
        win = ex[np.arange(B)[:, None], pos[:, None] + np.arange(K + 1)[None, :]]     # (B, K+1, nL, k)
        R = tc.resident_mask()
        d = win[:, :K]
        ok = d >= 0
        res = ok & R[np.arange(nL)[None, None, :, None], np.maximum(d, 0)]
        flat = np.arange(nL)[None, None, :, None] * NE + d
        tcnt = np.bincount(flat[res], minlength=nL * NE)
        for li in range(nL):
            ids = np.flatnonzero(tcnt[li * NE:(li + 1) * NE])
            tc.touch_layer(li, ids, tcnt[li * NE + ids])
        c["hb_bytes"] += float(res.sum()) * msb     # the draft's expert reads (resident picks)
        hb = lp = 0.0
        for li in range(nL):
            x = win[:, :, li].reshape(-1)
            ids, cnt = np.unique(x[x >= 0], return_counts=True)
            nh = _access(tc, c, li, ids, planes=keep, hots=cnt)
            hb += nh * msb
            lp += nh * (E - msb) + (ids.size - nh) * E
        tc.decay()
        c["hb_bytes"] += hb
        c["lpddr_bytes"] += lp
        c["accepted_tokens"] += int(a.sum())
        pos += a + 1
    c["evictions"] = tc.evictions - ev0
    return c


def tile_run(cfg, trace: str, batch: int, mode: str, script, counters) -> dict:
    """A version-2 run record of a tile run: the golden host script it
    replayed (:func:`elmoe3d.golden.esd.run_trace`'s, whose STEP entries
    carry the rankings and the DRAFT mask) turned into the layer steps the
    tile routed, with the tile's geometry and peak rates and its
    ``counters`` (read over the host port)."""
    from elmoe3d.golden.esd import Phase, RankingRouter
    steps = [[Phase(e["phase"]).name, int(e["layer"]),
              RankingRouter(e["rankings"], cfg.top_k)(e.get("mask"))]
             for e in script if e["op"] == "STEP" and "refused" not in e and not e["error"]]
    return {"trace": {"name": trace}, "batch": int(batch), "mode": mode,
            "layer_steps": steps,
            "accepted": [int(e["value"]) for e in script
                         if e["op"] == "ACCEPT" and "refused" not in e],
            "geometry": {"slots": cfg.tag_slots, "experts": cfg.experts,
                         "expert_bytes": 3 * cfg.hidden * cfg.ffn, "planes": cfg.planes,
                         "resident_planes": cfg.hb_planes_eff, "hot_bits": cfg.hot_bits,
                         "decay_shift": cfg.decay_shift},
            "driver": {"touch_scale": 1, "alloc_hot": 0, "decay_period": cfg.decay_period},
            "rates": {"hb_bytes_per_cycle": cfg.pes * cfg.lanes * cfg.slice_bits / 8,
                      "lpddr_bytes_per_cycle": cfg.lpddr_rate,
                      "macs_per_cycle": cfg.pes * cfg.lanes},
            "counters": {k: int(counters[k]) for k in COUNTERS}}


def compare(path=None) -> dict:
    """``{"available": False, "message"}`` when there is no tile-counter file,
    else per run the RTL and model counters and their agreement."""
    d = load_tile_counters(path)
    if d is None:
        p = Path(path) if path else TILE_COUNTERS
        return dict(available=False, path=str(p),
                    message=f"model vs RTL: no tile counters ({p} does not exist; `elmoe3d "
                            "tile-run --report` writes it), so no agreement "
                            "is reported")
    base = Path(d["path"]).parent
    runs = []
    for i, r in enumerate(d["runs"]):
        m = model_counters(r, base)
        rows = []
        for k in COMPARED:
            rtl, mod = float(r["counters"][k]), float(m[k])
            exact = k in EXACT
            rel = None if rtl == mod == 0 else abs(mod - rtl) / max(abs(rtl), 1e-12)
            rows.append(dict(counter=k, rtl=rtl, model=mod, rel_error=rel,
                             agree=(rtl == mod) if exact else (rel is None or rel <= 0.05)))
        runs.append(dict(run=i, mode=r["mode"], batch=r["batch"],
                         trace=r["trace"].get("path") or r["trace"].get("name"),
                         rows=rows, all_agree=all(x["agree"] for x in rows)))
    return dict(available=True, path=d["path"], source=d.get("source"), runs=runs,
                all_agree=all(r["all_agree"] for r in runs))


def report_lines(cmp: dict) -> list[str]:
    if not cmp["available"]:
        return [cmp["message"]]
    out = [f"model vs RTL tile counters ({cmp['path']}; {cmp.get('source') or 'source not given'}): "
           + ("all agree" if cmp["all_agree"] else "DISAGREE")]
    for r in cmp["runs"]:
        out.append(f"  run {r['run']} ({r['mode']}, batch {r['batch']}, {r['trace']}):")
        for x in r["rows"]:
            e = "-" if x["rel_error"] is None else f"{x['rel_error']:.2%}"
            out.append(f"    {x['counter']:16s} RTL {x['rtl']:>14.0f}  model {x['model']:>14.0f}  "
                       f"rel. error {e:>8s}  {'ok' if x['agree'] else 'MISMATCH'}")
    return out


#: markers around the comparison table in docs/blocks/perf.md
DOC_MARKERS = ("<!-- rtl-compare: generated from sim/data/tile_counters.json -->",
               "<!-- end of rtl-compare -->")


def doc_table(cmp: dict) -> str:
    """docs/blocks/perf.md's table: per recorded tile run, the cache counters
    and bytes of the tile (RTL) and the model, and whether the exact counters
    agree."""
    out = ["| trace | batch | mode | hits RTL / model | misses | fills | evictions | "
           "HB MB | LPDDR MB | cache counters agree |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in cmp["runs"]:
        v = {x["counter"]: x for x in r["rows"]}

        def pair(k, mb=False):
            a, b = v[k]["rtl"], v[k]["model"]
            return f"{a / 1e6:.2f} / {b / 1e6:.2f}" if mb else f"{a:.0f} / {b:.0f}"
        agree = all(v[k]["agree"] for k in ("hb_hits", "hb_misses", "fills", "evictions"))
        out.append(f"| {r['trace']} | {r['batch']} | {r['mode']} | {pair('hb_hits')} | "
                   f"{pair('hb_misses')} | {pair('fills')} | {pair('evictions')} | "
                   f"{pair('hb_bytes', True)} | {pair('lpddr_bytes', True)} | "
                   f"{'yes' if agree else 'no'} |")
    return "\n".join(out)

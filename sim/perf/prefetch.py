"""What prefetch during drafts gives the tile, by the model: the golden
controller's prefetch (:class:`elmoe3d.golden.esd.EsdController`,
``prefetch``; the RTL: ``Tile(cfg, prefetch=N)``) priced by the validated
tile cycle model (:mod:`.tile_model`, constants fitted as in :mod:`.validate`) on the
steady-state set's own runs (``sim/data/steady_state.json``: same traces,
batches, seeds, warm-up windows and acceptance draws).

Pricing. A run's passes cost what :func:`.tile_model.predict` says, the
prefetches' fills excluded: they stream while the drafts compute. The
verification cannot start before the last prefetch of its round has
arrived (the LPDDR stream engine serves commands in order, so the first
VERIFY read queues behind the prefetches), so a round pays
``max(0, prefetch LPDDR cycles - its DRAFT cycles)`` more. Not priced: the
fills' HB writes beside the drafts' HB reads (at the LPDDR rate, a quarter
of HB's at ``default``), and the announce of a pass's candidates.

``elmoe3d perf --prefetch [N]`` prints the table, with the RTL's own
cycles where the recorded set has the prefetching tile's runs at that depth
(``elmoe3d tile-run --steady-state --prefetch N --record``): the projection
beside the measurement.
"""

from __future__ import annotations

import json
import statistics

from ...golden import esd as gesd
from . import tile_model as tm
from . import validate as va

__all__ = ["project", "table"]


def _round_prefetches(events) -> dict:
    """``{round (1-based): prefetches issued}`` from a run's events."""
    out, rnd = {}, 0
    for e in events:
        if e.kind == gesd.EventKind.MODE:
            rnd += 1
        elif e.kind == gesd.EventKind.SOURCE and e.code == gesd.Source.PREFETCH:
            out[rnd] = out.get(rnd, 0) + 1
    return out


def _cycles(recs, v) -> tuple[float, dict]:
    """Model cycles of layer-step records, and the DRAFT cycles per round."""
    cyc, draft = 0.0, {}
    for x in recs:
        c = sum(f @ v for f in tm.features([x]).values())
        cyc += c
        if x.phase == "DRAFT":
            draft[x.round] = draft.get(x.round, 0.0) + c
    return cyc, draft


def _priced(r, prefetch, v):
    """Model cycles per output token of one steady-state run's window with
    ``prefetch`` outstanding prefetches, the prefetches' wait included, the
    wait per token, and the run's prefetch counts."""
    from ..run import tile_run as trun
    s = va.steady_spec(r)
    with tm.record_steps() as log:
        g = trun.golden_run(s, va._steps_of(s, r), prefetch=prefetch)
    recs = va._window(r, tm.records(log))
    cyc, draft = _cycles(recs, v)
    cfg = g.controller.cfg
    tr = next(t for x in recs for t in x.traffic)
    per_fill = (cfg.hb_planes_eff * cfg.expert_bytes / cfg.planes
                / (cfg.axi_beat_bits // 8) * tr.ext_cycles_per_beat)
    wait = sum(max(0.0, n * per_fill - draft.get(rnd, 0.0))
               for rnd, n in _round_prefetches(g.events).items()
               if rnd - 1 >= r["warmup_rounds"])
    tok = r["measured"]["tokens"]
    return (cyc + wait) / tok, wait / tok, dict(g.controller.prefetch_counts)


def project(prefetch: int = 8, constants: tm.Constants | None = None) -> list:
    """Per trace and batch of the steady-state set (means over its seeds):
    model cycles per output token of HB-cached AR, Elastic-SD (both from the
    validation's own golden runs, :func:`.validate._steady_recs`), and
    Elastic-SD with ``prefetch`` outstanding prefetches; SD/AR of both; the
    RTL's measured AR and SD beside them; the prefetches' hit rate (share
    the verification hit)."""
    c = constants or va.fit(va.report_rows() + [r for r in va.bench_rows() if r["set"] in va.TRAIN])
    v = c.vector()
    groups = {}
    for r, recs in va._steady_recs():
        if r["mode"] not in ("ar", "sd"):
            continue
        g = groups.setdefault((r["trace_key"], r["batch"]), {})
        tok = r["measured"]["tokens"]
        g.setdefault(f"{r['mode']}_rtl", []).append(r["measured"]["cycles"] / tok)
        g.setdefault(r["mode"], []).append(_cycles(recs, v)[0] / tok)
        if r["mode"] == "sd" and prefetch:
            cyc, wait, counts = _priced(r, prefetch, v)
            g.setdefault("sd_pf", []).append(cyc)
            g.setdefault("wait", []).append(wait)
            g.setdefault("pf", []).append(counts["prefetches"])
            g.setdefault("pf_hits", []).append(counts["prefetch_hits"])
    for r in json.loads((va.DATA / "steady_state.json").read_text())["runs"]:
        if prefetch and r.get("prefetch") == prefetch and r["mode"] == "sd":
            g = groups.get((r["trace_key"], r["batch"]))
            if g is not None:
                g.setdefault("sd_pf_rtl", []).append(r["measured"]["cycles"]
                                                      / r["measured"]["tokens"])
    rows = []
    for (trace, batch), g in sorted(groups.items()):
        m = {k: statistics.mean(x) for k, x in g.items()}
        row = dict(trace=trace, batch=batch, ar_rtl=m["ar_rtl"], sd_rtl=m["sd_rtl"],
                   ar=m["ar"], sd=m["sd"], sd_over_ar=m["sd"] / m["ar"])
        if prefetch:
            row.update(sd_prefetch=m["sd_pf"], wait=m["wait"],
                       sd_prefetch_over_ar=m["sd_pf"] / m["ar"],
                       hit_rate=sum(g["pf_hits"]) / max(1, sum(g["pf"])))
            if "sd_pf_rtl" in m:
                row.update(sd_prefetch_rtl=m["sd_pf_rtl"],
                           sd_prefetch_rtl_over_ar=m["sd_pf_rtl"] / m["ar_rtl"])
        rows.append(row)
    return rows


def table(rows, prefetch: int) -> str:
    from ...report import text_table
    head = ["trace", "batch", "AR RTL", "SD RTL", "AR model", "SD model", "SD/AR",
            f"SD+prefetch {prefetch}", "SD+prefetch/AR", "wait / token", "prefetch hit rate",
            "SD+prefetch RTL", "RTL SD+prefetch/AR"]

    def rtl(r, k, nd):
        return (round(r[k], nd) if nd else round(r[k])) if k in r else "-"
    body = [[r["trace"], r["batch"], round(r["ar_rtl"]), round(r["sd_rtl"]), round(r["ar"]),
             round(r["sd"]), round(r["sd_over_ar"], 3), round(r.get("sd_prefetch", 0)),
             round(r.get("sd_prefetch_over_ar", 0), 3), round(r.get("wait", 0)),
             round(r.get("hit_rate", 0), 2), rtl(r, "sd_prefetch_rtl", 0),
             rtl(r, "sd_prefetch_rtl_over_ar", 3)] for r in rows]
    return ("cycles per output token, steady state (means over seeds); prefetch priced by the "
            "validated tile model\n" + text_table(head, body))

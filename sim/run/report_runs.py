"""The report's decode runs: the two routing traces (the synthetic Zipf
trace on ``default``, the in-project LM's routing on ``lm``), the golden
control sequence's runs on them per batch and mode, and the figures the
report, ``elmoe3d decode``, ``elmoe3d tile-run`` and the system model's
validation take from a run's counters."""

from __future__ import annotations

__all__ = ["BATCHES", "report_traces", "report_runs", "RTL_REPORT", "TILE_REPORT",
           "recorded_tile_report", "cycles_per_token", "figures"]

#: Batches of the report runs
BATCHES = (1, 4, 16)


def report_traces(quick=False):
    """``[(name, cfg, rankings)]``: the synthetic Zipf trace on the ``default``
    tile and the LM's own routing trace (top-2, completed by popularity) on
    the ``lm`` tile."""
    import numpy as np

    from ...config import preset
    from ...golden import esd
    from ...golden.lm import DATA_DIR
    from ..perf.traces import load_trace
    cfg = preset("default")
    n = 300 if quick else 1200
    syn = esd.synthetic_trace(np.random.default_rng(2026), requests=16, tokens=n,
                              layers=cfg.layers, experts=cfg.experts)
    lm_cfg = preset("lm")
    tr = load_trace(DATA_DIR / "routing_trace.npz")
    S = tr.streams(16)                                       # (16, T, L, k)
    lm_r = esd.complete_rankings(S, tr.num_experts)
    return [("zipf-1.1 (default)", cfg, syn), ("moe_lm routing (lm)", lm_cfg, lm_r)]


def report_runs(quick=False, steps=None, traces=None):
    """Golden runs per trace, batch and mode: a list of dicts with the
    counters (``traces``: names to keep; ``steps`` default 400, quick 60)."""
    from ...golden import esd
    steps = steps or (60 if quick else 400)
    out = []
    for name, cfg, R in report_traces(quick):
        if traces and name not in traces:
            continue
        for B in BATCHES:
            for mode in ("AR", "SD"):
                run = esd.run_trace(cfg, R, batch=B, steps=steps, seed=B, check=False,
                                    kv_mid_round=False, force=esd.Mode[mode])
                out.append(dict(trace=name, batch=B, mode=mode, steps=steps,
                                counters=run.counters, run=run, cfg=cfg))
    return out


#: Where the controller RTL's report runs are written (tests/test_esd_ctrl.py).
RTL_REPORT = "esd_ctrl_report.json"
#: Where the tile's report runs are written (the tile top replaying the same
#: traces: ``elmoe3d tile-run --report``).
TILE_REPORT = "tile_report.json"


def recorded_tile_report():
    """The recorded copy of the tile's report runs in the repository
    (``sim/data/tile_report.json``, a few minutes on the native harness): the report
    uses it when ``build/measured`` has none."""
    from pathlib import Path

    return Path(__file__).resolve().parent.parent / "data" / TILE_REPORT


def cycles_per_token(c) -> float:
    """Simulated cycles spent in layer steps (AR + DRAFT + VERIFY, the tile's
    own phase counters) per token the decode produced (``tokens_out``)."""
    return (c["ar_cycles"] + c["draft_cycles"] + c["verify_cycles"]) / max(1, c["tokens_out"])


def figures(c, B):
    """HB hit rate, mean accepted length, HB MB, LPDDR MB, HB share and LPDDR
    KB per token of a run's counters at batch ``B``."""
    look = c["hb_hits"] + c["hb_misses"] + c["hb_pending"]
    acc = ((c["accepted_tokens"] + c["rounds_sd"] * B) / (c["rounds_sd"] * B)
           if c["rounds_sd"] else 1.0)
    tot = c["hb_bytes"] + c["lpddr_bytes"]
    return [round(c["hb_hits"] / look, 4) if look else 0.0, round(acc, 3),
            round(c["hb_bytes"] / 1e6, 3), round(c["lpddr_bytes"] / 1e6, 3),
            round(c["hb_bytes"] / tot, 3) if tot else 0,
            round(c["lpddr_bytes"] / 1e3 / max(1, c["tokens_out"]), 2)]

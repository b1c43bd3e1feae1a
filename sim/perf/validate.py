"""The tile cycle model (:mod:`.tile_model`) against every recorded RTL run,
with a train/test split.

Sets (all read from ``sim/data``; the controller's passes are recomputed by
the golden controller, which every recorded run equalled event for event):

``report`` (:data:`TRAIN`, the fit set)
    The 12 report runs (``sim/data/tile_report.json``, ``elmoe3d tile-run
    --report``): Zipf at ``default`` and the LM's routing at ``lm``, batch
    1 / 4 / 16, AR and SD forced, 8 decode steps from a cold cache. Targets:
    the tile's own ``ar_cycles`` / ``draft_cycles`` / ``verify_cycles``
    counters (18 values).
``bench-fit`` (fit set too)
    The MoE layer's timed passes at T = 1 and 16
    (``sim/data/moe_cycles.json``, ``elmoe3d moe-bench``): cycles per pass,
    the pass's own bound and experts as recorded; no controller.
``steady`` (validation)
    The native harness's steady-state set (``sim/data/steady_state.json``,
    ``elmoe3d tile-run --steady-state``, 54 runs): cycles per phase over the
    window after the warm-up rounds.
``decode`` (validation)
    ``elmoe3d decode --rtl --tokens 16 --mode sd|ar`` on the LM at batch 1
    (``sim/data/decode_rtl.json``): the decode's cycles after the dense load
    against the model's cycles of every layer step.
``bench`` (validation)
    The MoE layer's timed passes at T = 4 and T = whole step (80).

:func:`fit` solves the constants by least squares on relative error (each
row divided by its RTL cycles) over the fit sets only; :func:`validate`
reports every run's error and the rms and maximum per set.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

from . import tile_model as tm

__all__ = ["DATA", "TRAIN", "BOUND", "report_rows", "steady_rows", "decode_rows", "bench_rows",
           "all_rows", "fit", "validate", "DECODE_FILE", "three_way", "three_way_table",
           "validation_table"]

DATA = Path(__file__).resolve().parent.parent / "data"
DECODE_FILE = DATA / "decode_rtl.json"
#: the fit sets (everything else validates)
TRAIN = ("report", "bench-fit")
#: the validation bound on every run's relative cycle error
BOUND = 0.05
#: moe-bench points in the fit set (the rest validate)
BENCH_FIT_T = ("T1", "T16")


def _row(set_, name, phase, feats, rtl):
    return dict(set=set_, run=name, phase=phase, x=np.asarray(feats, float), rtl=float(rtl))


@functools.lru_cache(maxsize=None)
def _report_recs():
    from ..run import report_runs as dec
    from ...golden import esd as gesd
    out = {}
    for name, cfg, R in dec.report_traces():
        for B in dec.BATCHES:
            for mode in ("AR", "SD"):
                with tm.record_steps() as log:
                    gesd.run_trace(cfg, R, batch=B, steps=8, seed=B, check=False,
                                   kv_mid_round=False, force=gesd.Mode[mode])
                out[(name, B, mode)] = tm.records(log)
    return out


def report_rows(compute=True, restream=True) -> list:
    """The fit set's tile rows: per report run and phase."""
    rep = json.loads((DATA / "tile_report.json").read_text())
    recs = _report_recs()
    rows = []
    for r in rep["runs"]:
        f = tm.features(recs[(r["trace"], r["batch"], r["mode"])], compute=compute,
                        restream=restream)
        for ph, key in (("AR", "ar_cycles"), ("DRAFT", "draft_cycles"),
                        ("VERIFY", "verify_cycles")):
            if r["rtl"][key]:
                rows.append(_row("report", f"{r['trace']} B{r['batch']} {r['mode']}", ph, f[ph],
                                 r["rtl"][key]))
    return rows


@functools.lru_cache(maxsize=None)
def _steady_logs():
    """Per steady-state run: the record and the golden controller's log of
    its decode (warm-up included)."""
    from ..run import tile_run as trun
    out = []
    for r in steady_runs():
        s = steady_spec(r)
        with tm.record_steps() as log:
            trun.golden_run(s, _steps_of(s, r))
        out.append((r, log))
    return out


def steady_runs() -> list:
    """The recorded steady-state runs (``sim/data/steady_state.json``) of the
    tile without prefetch (the one the model prices; the set's ``SD+PF``
    runs are the prefetching tile's)."""
    return [r for r in json.loads((DATA / "steady_state.json").read_text())["runs"]
            if not r.get("prefetch")]


def steady_spec(r) -> dict:
    """The :func:`elmoe3d.sim.run.tile_run.spec` of a recorded steady-state run."""
    from ..run import tile_run as trun
    return trun.spec(r["trace_key"], r["batch"], r["mode"], r["steps_asked"], r["warmup"],
                     r["seed"], latency=r["latency"], accept_p=r["accept_p"])


def _window(r, recs) -> list:
    return [x for x in recs if x.round - 1 >= r["warmup_rounds"]]


@functools.lru_cache(maxsize=None)
def _steady_recs():
    return [(r, _window(r, tm.records(log))) for r, log in _steady_logs()]


def _steps_of(s, r) -> int:
    """Decode steps of the run's golden decode (``tile_run.run_one``: the
    warm-up's rounds, then ``steps`` more)."""
    from ..run import tile_run as trun
    warm = trun.golden_run(s, s["warmup"]).counters["decode_steps"] if s["warmup"] else 0
    return warm + s["steps"]


def steady_rows(compute=True, restream=True) -> list:
    rows = []
    for r, recs in _steady_recs():
        f = tm.features(recs, compute=compute, restream=restream)
        name = f"{r['trace_key']} B{r['batch']} {r['mode'].upper()} seed {r['seed']}"
        for ph, cyc in r["measured"]["phase_cycles"].items():
            if cyc:
                rows.append(_row("steady", name, ph, f[ph], cyc))
    return rows


@functools.lru_cache(maxsize=None)
def _decode_recs():
    """The golden decode of ``decode --rtl --tokens 16`` at batch 1 per mode
    (the script the native tile replays), its layer steps recorded."""
    from ...config import preset
    from ...golden import lm as glm
    from ...golden.lm import HELD_PROMPT
    from ...golden import lm_int as li
    from ..lm.evidence import heldout_prompts
    d = json.loads(DECODE_FILE.read_text())
    cfg = preset("lm")
    weights, meta = glm.load_weights()
    intmoe = li.IntMoE.from_model(weights, meta, cfg=cfg)
    prompt = [int(x) for x in heldout_prompts()[200][:HELD_PROMPT]]
    out = []
    for run in d["runs"]:
        with tm.record_steps() as log:
            li.decode(weights, meta, intmoe, [np.array(prompt)], run["tokens"], mode=run["mode"],
                      cfg=cfg)
        out.append((run, tm.records(log)))
    return out


def decode_rows(compute=True, restream=True) -> list:
    rows = []
    for run, recs in _decode_recs():
        f = tm.features(recs, compute=compute, restream=restream)
        rows.append(_row("decode", f"decode --rtl {run['mode']} B1", "all",
                         sum(f.values()), run["cycles"]))
    return rows


def bench_rows(compute=True, restream=True) -> list:
    """Per moe-bench point: cycles per pass against the recorded bound plus
    the datapath's constants (no controller, no step). ``compute=False``
    drops the PE term of the bound; ``restream=False`` prices the point's
    passes as one step whose experts stream once (at most ``E`` of them)."""
    rec = json.loads((DATA / "moe_cycles.json").read_text())
    rows = []
    for preset_name, p in rec["presets"].items():
        E = p["config"]["experts"]
        for name, f in p["figures"].items():
            bound = f["bound_cycles_per_pass"]
            ext = f["ext_cycles_per_pass"]
            if not restream:
                # the bench's passes as one step: each expert streamed once over all of them
                n = f["passes"]
                union = min(E, f["experts_per_pass"] * n) if ext else 0
                ext = ext * union / (f["experts_per_pass"] * n) if ext else 0.0
                bound = max(f["hb_beats_per_pass"], ext, f["mac_beats_per_pass"])
            if not compute:
                bound = max(f["hb_beats_per_pass"], ext)
            pe = f["experts_per_pass"] if compute and f["bound_by"] == "PE" else 0.0
            x = [bound, 0.0, 1.0, pe] + [0.0] * (len(tm.FEATURES) - 4)
            set_ = "bench-fit" if name.endswith(BENCH_FIT_T) else "bench"
            rows.append(_row(set_, f"{preset_name} {name}", "pass", x, f["cycles_per_pass"]))
    return rows


def three_way(c: tm.Constants | None = None) -> list:
    """The tile's three ways to decode at its own scale, per trace and batch
    of the steady-state set (means over the seeds, cycles per output token
    over the measured window): LPDDR-only AR (the HB expert cache off: the
    claims' xPU), HB-cached AR and Elastic-SD, the RTL's beside the model's."""
    c = c or fit(report_rows() + [r for r in bench_rows() if r["set"] in TRAIN])
    v = c.vector()
    groups = {}
    for r, recs in _steady_recs():
        g = groups.setdefault((r["trace_key"], r["batch"]), {})
        tok = r["measured"]["tokens"]
        model = sum(f @ v for f in tm.features(recs).values()) / tok
        g.setdefault(r["mode"], []).append((r["measured"]["cycles"] / tok, model))
    rows = []
    for (trace, batch), g in sorted(groups.items()):
        row = dict(trace=trace, batch=batch)
        for mode, key in (("lpddr", "xpu"), ("ar", "ar"), ("sd", "sd")):
            row[f"{key}_rtl"] = sum(a for a, _ in g[mode]) / len(g[mode])
            row[f"{key}_model"] = sum(m for _, m in g[mode]) / len(g[mode])
        rows.append(row)
    return rows


VALIDATION_MARKERS = ("<!-- perf-validation: generated from sim/data/perf_claims.json -->",
                      "<!-- end of perf-validation -->")


def validation_table(res: dict) -> str:
    """docs/blocks/perf.md's table of a :func:`validate` result: per set its
    role, values, rms and maximum error and its worst run; then the rms over
    the validation runs and the fitted constants."""
    out = ["| set | role | values | rms error | max error | worst |", "|---|---|---|---|---|---|"]
    for name, x in res["sets"].items():
        w = max((r for r in res["rows"] if r["set"] == name), key=lambda r: abs(r["error"]))
        out.append(f"| {name} | {'fit' if x['fit'] else 'validation'} | {x['rows']} | "
                   f"{x['rms']:.2%} | {x['max']:.2%} | {w['run']} {w['phase']} "
                   f"({w['error']:+.2%}) |")
    out += ["", f"Validation rms over the {sum(1 for r in res['rows'] if not r['fit'])} "
                f"validation values: {res['rms']:.2%}. Fitted constants (cycles): "
            + ", ".join(f"`{k}` {v:g}" for k, v in res["constants"].items()) + "."]
    return "\n".join(out)


THREE_WAY_MARKERS = ("<!-- tile-three-way: generated from sim/data/perf_claims.json -->",
                     "<!-- end of tile-three-way -->")


def three_way_table(rows) -> str:
    """docs/blocks/perf.md's table of :func:`three_way`."""
    out = ["| trace | batch | LPDDR-only AR: RTL / model | HB-cached AR: RTL / model | "
           "Elastic-SD: RTL / model | SD / AR: RTL / model | HB cache gain: RTL / model |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['trace']} | {r['batch']} | "
                   f"{r['xpu_rtl']:,.0f} / {r['xpu_model']:,.0f} | "
                   f"{r['ar_rtl']:,.0f} / {r['ar_model']:,.0f} | "
                   f"{r['sd_rtl']:,.0f} / {r['sd_model']:,.0f} | "
                   f"{r['sd_rtl'] / r['ar_rtl']:.2f} / {r['sd_model'] / r['ar_model']:.2f} | "
                   f"{r['xpu_rtl'] / r['ar_rtl']:.2f}x / {r['xpu_model'] / r['ar_model']:.2f}x |")
    return "\n".join(out)


def all_rows(**kw) -> list:
    return report_rows(**kw) + bench_rows(**kw) + steady_rows(**kw) + decode_rows(**kw)


def fit(rows) -> tm.Constants:
    """Least squares on relative error over the rows of the fit sets: the
    bound's coefficient is 1, the constants free (columns that no fit row
    uses stay 0)."""
    tr = [r for r in rows if r["set"] in TRAIN]
    X = np.array([r["x"] for r in tr])
    y = np.array([r["rtl"] for r in tr])
    w = 1.0 / y
    A = X[:, 1:] * w[:, None]
    b = (y - X[:, 0]) * w
    used = np.abs(A).sum(axis=0) > 0
    coef = np.zeros(A.shape[1])
    coef[used] = np.linalg.lstsq(A[:, used], b, rcond=None)[0]
    return tm.Constants.from_vector(np.concatenate([[1.0], coef]))


def validate(rows=None, constants: tm.Constants | None = None, **kw) -> dict:
    """Fit on :data:`TRAIN`, then every row's model cycles and relative error;
    per set the rms and the maximum; ``ok`` when every validation row is
    within :data:`BOUND`."""
    rows = rows if rows is not None else all_rows(**kw)
    c = constants or fit(rows)
    v = c.vector()
    out = []
    for r in rows:
        m = float(r["x"] @ v)
        out.append(dict(set=r["set"], run=r["run"], phase=r["phase"], rtl=r["rtl"],
                        model=round(m, 1), error=(m - r["rtl"]) / r["rtl"],
                        fit=r["set"] in TRAIN))
    sets = {}
    for s in dict.fromkeys(r["set"] for r in out):
        e = [x["error"] for x in out if x["set"] == s]
        sets[s] = dict(rows=len(e), rms=math.sqrt(sum(x * x for x in e) / len(e)),
                       max=max(abs(x) for x in e), fit=s in TRAIN)
    val = [x for x in out if not x["fit"]]
    worst = max(val, key=lambda x: abs(x["error"])) if val else None
    rms = math.sqrt(sum(x["error"] ** 2 for x in val) / len(val)) if val else 0.0
    return dict(constants=c.as_dict(), fit_sets=list(TRAIN), bound=BOUND, rows=out, sets=sets,
                rms=rms, worst=worst, ok=all(abs(x["error"]) <= BOUND for x in val))

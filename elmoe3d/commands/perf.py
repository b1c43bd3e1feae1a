"""``elmoe3d perf``: the paper's claims on the validated tile cycle model.

By default: the tile cycle model's constants, fitted on the report runs
and the MoE layer's T = 1 / 16 passes (:mod:`elmoe3d.sim.perf.validate`;
``--validate`` also checks every other recorded RTL run), then the claims
table (:mod:`elmoe3d.sim.perf.claims`): ELMoE-3D against the
LPDDR-only xPU, xPU-PIM, xPU-NMP, HB-xPU and the per-point best prior, per
model and batch, for the tile's structure today and before the token-lane
datapath, beside the paper's 6.6x / 12.0x / 4.4x / 2.2x / 1.4x, and the
acceptance sweep. ``--json F`` writes it; ``--record`` validates and writes
``sim/data/perf_claims.json`` and the tables of README.md and
docs/blocks/perf.md.

``--grid`` runs the older roofline grid instead (bytes over bandwidth per
system, every MoE layer replayed; not validated against the RTL): tokens/s,
ratios, floors, ablations, plots. See ``docs/blocks/perf.md``.
"""

from __future__ import annotations

import json
import time

from ..extras import require
from ..report import md_table, text_table
from ._common import writable_dir, writable_file

NAME = "perf"
HELP = ("the paper's claims on the tile cycle model validated against every recorded RTL run "
        "(--grid: the older roofline grid)")

#: options that only the roofline grid (--grid) reads
GRID_ONLY = ("trace", "trace_remap", "acceptance", "draft_len", "ablations", "tile_counters", "plot",
             "context")


def register(p):
    p.add_argument("--grid", action="store_true",
                   help="run the older roofline grid (not validated against the RTL) instead of "
                        "the claims table")
    p.add_argument("--record", action="store_true",
                   help="write the claims to sim/data/perf_claims.json and regenerate the tables of "
                        "README.md and docs/blocks/perf.md (the paper's four models, batch 1, 4, 16)")
    p.add_argument("--validate", action="store_true",
                   help="first check the tile cycle model against every recorded RTL run (about "
                        "30 s more)")
    p.add_argument("--model", action="append", default=None, metavar="NAME",
                   help="model name (repeatable or comma-separated; default: the paper's four for "
                        "the claims, all six for --grid)")
    p.add_argument("--batch", action="append", default=None, metavar="N",
                   help="batch size (repeatable or comma-separated; default: 1,4,16 for the claims, "
                        "1,2,4,8,16 for --grid)")
    p.add_argument("--hb-gb", type=float, default=8.0, metavar="GB",
                   help="HB capacity in decimal GB (4 and 8 are the paper's chips; default 8)")
    p.add_argument("--context", type=int, default=None, metavar="TOKENS",
                   help="KV length per request during decode (default from systems.json: 1024)")
    p.add_argument("--trace", metavar="FILE", help="replay a real routing trace (.npz or .jsonl) "
                   "instead of the synthetic generator; its shape must match the model")
    p.add_argument("--trace-remap", action="store_true",
                   help="allow a trace of another shape through the documented remapping "
                        "(layers proportionally, each trace expert -> a block of model experts)")
    p.add_argument("--acceptance", metavar="FILE",
                   help="measured acceptance rows (JSON) looked up instead of the fitted model")
    p.add_argument("--draft-len", type=int, default=None, metavar="K",
                   help="draft length of ELMoE-3D and the SD baselines (default from systems.json)")
    p.add_argument("--ablations", action="store_true",
                   help="also run the ablations (hotness/random/static residents, precision, resident "
                        "planes msb/full/mixed, draft-byte cap, draft dense precision, draft length "
                        "incl. adaptive, HB 4 vs 8 GB, context, locality) and the trace statistics")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes (default 1, or ELMOE_PERF_JOBS); results do not depend on it")
    p.add_argument("--tile-counters", metavar="FILE", default=None,
                   help="RTL tile counters to compare with (default build/measured/tile_counters.json)")
    p.add_argument("--json", metavar="FILE", help="write the grid (and ablations) as JSON")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots of speedup/energy vs batch")


def _split(values, conv, what):
    out = []
    for v in values or []:
        for item in str(v).split(","):
            item = item.strip()
            if not item:
                continue
            try:
                out.append(conv(item))
            except ValueError:
                raise ValueError(f"{what} must be an integer, not {item!r}") from None
    return out


def _inputs(args):
    from ..sim.perf.acceptance import AcceptanceModel
    from ..sim.perf.hardware import get_hardware
    from ..sim.perf.models import get_model, model_names
    from ..sim.perf.systems import Workload, load_systems
    from ..sim.perf.traces import load_trace
    models = [get_model(m).name for m in _split(args.model, str, "Model")] or None
    batches = _split(args.batch, int, "Batch") or [1, 2, 4, 8, 16]
    for b in batches:
        if b < 1:
            raise ValueError(f"Batch must be a positive integer, not {b!r}")
    if not args.grid:
        from ..golden.esd import MAX_BATCH
        for b in batches:
            if b > MAX_BATCH:
                raise ValueError(f"Batch must be in 1..{MAX_BATCH} (the controller's), not {b!r}")
        given = [o for o in GRID_ONLY if getattr(args, o) not in (None, False)]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} applies to the roofline grid: add --grid")
        if args.hb_gb != 8.0:
            raise ValueError("The claims table is the paper's 8 GB chip; --hb-gb applies to --grid")
    elif args.record:
        raise ValueError("--record writes the claims table, not the grid: drop --grid")
    if args.context is not None and args.context < 1:
        raise ValueError(f"Context must be a positive number of tokens, not {args.context!r}")
    if not args.hb_gb > 0:
        raise ValueError(f"HB capacity must be a positive number of GB, not {args.hb_gb!r}")
    if args.draft_len is not None and not 1 <= args.draft_len <= 16:
        raise ValueError(f"Draft length must be in 1..16, not {args.draft_len!r}")
    if args.jobs is not None and not 1 <= args.jobs <= 64:
        raise ValueError(f"--jobs must be in 1..64, not {args.jobs!r}")
    hw = get_hardware(hb_gb=args.hb_gb)
    for name in models or model_names():
        m = get_model(name)
        if m.dense_bytes > hw.hb_bytes:
            raise ValueError(f"HB capacity {args.hb_gb:g} GB is smaller than the dense weights of "
                             f"{m.name} ({m.dense_bytes / 1e9:.2f} GB)")
    trace = load_trace(args.trace) if args.trace else None
    if trace is not None:
        trace.meta.setdefault("path", args.trace)
        for name in models or model_names():           # refuse a mismatched trace up front
            Workload(get_model(name), hw, batches[0], args.context, trace,
                     trace_remap=args.trace_remap)
    accm = AcceptanceModel.from_config(load_systems()["acceptance"], args.acceptance)
    return models, batches, trace, accm


HEAD = ["model", "B", "mode", "xPU", "PIM", "NMP", "HB-xPU", "SD-EAGLE", "SD-Q4", "ELMoE-3D",
        "x vs xPU", "x vs PIM", "x vs NMP", "x vs HB-xPU", "x vs envelope", "acc"]


def _f(v, d=2):
    return "-" if v is None else round(v, d)


def grid_rows(grid):
    rows = []
    for p in grid["points"]:
        r = p["results"]
        e = r["ELMoE-3D"]
        q = p.get("ratios", {})
        acc = e.get("acceptance") or {}
        sv = q.get("speedup_vs", {})
        rows.append([p["model"], p["batch"], e["mode"]] +
                    [round(r[s]["tokens_per_s"], 1) for s in
                     ("xPU", "xPU-PIM", "xPU-NMP", "HB-xPU", "SD-EAGLE", "SD-Q4", "ELMoE-3D")] +
                    [_f(q.get("speedup_vs_xpu")), _f(sv.get("xPU-PIM")), _f(sv.get("xPU-NMP")),
                     _f(sv.get("HB-xPU")),
                     f"{q.get('speedup_vs_envelope', float('nan')):.2f} ({q.get('envelope_prior', '-')})",
                     acc.get("rate", "-")])
    return rows


FLOOR_HEAD = ["model", "B", "system", "mode", "LPDDR GB/phase", "floor GB/phase", "vs floor",
              "bound tok/s", "tok/s", "attainment", "compute tok/s"]


def floor_rows(grid):
    rows = []
    for p in grid["points"]:
        for s in ("ELMoE-3D", "HB-xPU"):
            f = (p.get("floors") or {}).get(s)
            if not f:
                continue
            rows.append([p["model"], p["batch"], s, f"{f['mode']} ({f.get('phase', '-')})",
                         _f(f.get("lpddr_gb_per_phase"), 3), _f(f.get("floor_gb_per_phase"), 3),
                         _f(f.get("lpddr_vs_floor")), _f(f.get("bound_tok_s"), 1),
                         round(p["results"][s]["tokens_per_s"], 1), _f(f.get("attainment")),
                         _f(f.get("compute_tok_s"), 0)])
    return rows


SBS_HEAD = ["metric", "paper", "this model"]


def _fmt(v, pct=False):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"+{v * 100:.0f}%" if pct else f"{v:.2f}x"


def sbs_rows(rows):
    return [[r["metric"] + (f" ({r['note']})" if r.get("note") else ""),
             _fmt(r["paper"], "hotness" in r["metric"]), _fmt(r["model"], "hotness" in r["metric"])]
            for r in rows]


CLAIM_HEAD = ["claim", "paper", "this model", "ceilings", "the LM measures", "where"]


def claim_rows(rows):
    out = []
    for r in rows:
        pct = "%" in r["claim"]
        lm = "-"
        if "lm_mean" in r:
            lm = f"{r['lm_mean']:+.1%} (range {r['lm_min']:+.1%}..{r['lm_max']:+.1%}, {r['lm_models']} models)"
        elif "lm_gain_s4" in r:
            lm = (f"aug vs trunc: s=4 {r['lm_gain_s4']:+.1%}, s=4 per-tensor {r.get('lm_gain_s4_tensor', 0):+.1%}, "
                  f"s=2 keep 1 {r.get('lm_gain_s2k1', 0):+.0%}; truncated acceptance all resident: "
                  f"s=4 {r.get('lm_trunc_rate_s4', 0):.2f}, s=2 keep 1 {r.get('lm_trunc_rate_s2k1', 0):.2f}")
        meas = _fmt(r.get("measured"), pct)
        if r.get("envelope") is not None:
            meas += f" (envelope {_fmt(r['envelope'])})"
        bound = ("perfect cache " + _fmt(r.get("bound"))) if r.get("bound") is not None else "-"
        if r.get("demand") is not None:
            bound += f"; Belady AR / perfect SD {_fmt(r['demand'])}"
        if r.get("ideal") is not None:
            bound += f"; every draft accepted {_fmt(r['ideal'])}"
        out.append([r["claim"], _fmt(r.get("paper"), pct), meas, bound, lm, r["where"]])
    return out


def _evidence_cache():
    try:
        from ..sim.lm.evidence import DATA_DIR, RESULT
        return json.loads((DATA_DIR / RESULT).read_text())
    except (OSError, ValueError, ImportError):
        return None


WHY = (
    "Why the numbers differ from the paper (each a measured statement of this model, see "
    "docs/blocks/perf.md): (1) at batch 8-16 the verification union of B*(K+1) tokens touches most "
    "experts of a fine-grained MoE, and no policy can read less from LPDDR than those experts' bytes "
    "minus what HB holds - the LPDDR floor, which ELMoE-3D's Elastic-SD reaches within a few per cent "
    "there; (2) below the SD threshold ELMoE-3D runs AR with the same HB and the same kind of cache as "
    "HB-xPU, so it is no faster than the strongest HB-xPU policy there (~1x); (3) 'best prior' is "
    "reported three ways - against each prior, against the best single prior (the one strongest on "
    "average) and against the per-point envelope of three machines; (4) routing locality is synthetic, "
    "calibrated for Qwen3-30B-A3B only; (5) acceptance is fitted to the small LM's measurements and "
    "transferred through the expert overlap; (6) prefill, the aggregation link and rollback are not "
    "modelled.")


def run(args) -> int:
    if not args.grid:
        return _claims(args)
    return _grid(args)


VAL_HEAD = ["set", "role", "runs", "rms error", "max error"]
CLAIMS_HEAD = ["", "x vs xPU mean (max)", "energy vs xPU", "x vs PIM / NMP / HB-xPU",
               "x / energy vs per-point best prior"]


def _claims(args) -> int:
    """The default: validation, then the claims table (module doc)."""
    from ..sim.perf import claims as cl
    from ..sim.perf import validate as val
    from ..sim.perf.grid import _jsonable
    models, _, _, _ = _inputs(args)
    batches = _split(args.batch, int, "Batch") or list(cl.BATCHES)
    if args.record and (models or args.batch):
        raise ValueError("--record writes the recorded table (the paper's four models, batch 1, 4, "
                         "16): drop --model and --batch")
    out = writable_file(args.json, "--json") if args.json else None
    t0 = time.monotonic()
    res = None
    if args.validate or args.record:
        res = val.validate()
        print(f"tile cycle model vs the RTL (fit on {', '.join(res['fit_sets'])}; bound "
              f"{res['bound']:.0%} on every other run; {time.monotonic() - t0:.1f} s):")
        print(text_table(VAL_HEAD, [[s, "fit" if x["fit"] else "validation", x["rows"],
                                     f"{x['rms']:.2%}", f"{x['max']:.2%}"]
                                    for s, x in res["sets"].items()]))
        print("every run (cycles; fit rows marked):")
        print(text_table(["set", "run", "phase", "RTL", "model", "error"],
                         [[x["set"] + (" (fit)" if x["fit"] else ""), x["run"], x["phase"],
                           f"{x['rtl']:,.0f}", f"{x['model']:,.0f}", f"{x['error']:+.2%}"]
                          for x in res["rows"]]))
        w = res["worst"]
        print(f"validation rms {res['rms']:.2%}; worst {w['set']} {w['run']} {w['phase']} "
              f"{w['error']:+.2%}")
        if not res["ok"]:
            raise ValueError("The tile cycle model misses a validation run by more than "
                             f"{res['bound']:.0%}: {w['run']} {w['phase']} {w['error']:+.2%}")
        res["three_way"] = val.three_way()
        print("\nthe tile's three ways at its own scale (cycles per output token, steady state; "
              "LPDDR-only AR is the model's alone):")
        print(val.three_way_table(res["three_way"]))
    else:
        print("tile cycle model: constants fitted on the report runs and the MoE layer's T = 1 / 16 "
              "passes; its validation against every other recorded RTL run is `elmoe3d perf "
              "--validate` (and pytest -m perf)")
    jobs = args.jobs or 2
    t1 = time.monotonic()
    rec = _jsonable(cl.claims(models, batches, jobs=jobs))
    t_cl = time.monotonic() - t1
    print(f"\nthe paper's claims on the validated model ({', '.join(rec['models'])}; batch "
          f"{', '.join(map(str, rec['batches']))}; MoE layers only, {rec['sim_layers']} simulated "
          f"per model; {t_cl:.1f} s):")
    rows = [["paper", "6.6x (12.0x)", "4.4x", "-", "2.2x / 1.4x"]]
    for name, s in rec["structures"].items():
        m = s["summary"]
        rows.append([name, f"{m['speedup_vs_xpu_mean']:.2f}x ({m['speedup_vs_xpu_max']:.2f}x)",
                     f"{m['energy_vs_xpu_mean']:.2f}x",
                     " / ".join(f"{m[f'speedup_vs_{p}_mean']:.2f}x" for p in cl.PRIORS),
                     f"{m['speedup_vs_best_prior_mean']:.2f}x / {m['energy_vs_best_prior_mean']:.2f}x"])
    print(text_table(CLAIMS_HEAD, rows))
    print("\nper model and batch:")
    print(cl.points_table(rec))
    if rec["sweep"]:
        print("\nacceptance sweep (the paper's 0.33-0.91), ELMoE-3D today:")
        print(text_table(["model", "B", "acceptance", "mode", "x vs xPU", "x vs best prior"],
                         [[r["model"], r["batch"], r["rate"], r["mode"],
                           f"{r['speedup_vs_xpu']:.2f}x",
                           f"{r['speedup_vs_best']:.2f}x ({r['best_prior']})"]
                          for r in rec["sweep"]]))
    if res is not None:
        rec["validation"] = res
    print("constants (cycles): " + ", ".join(f"{k} {v:g}" for k, v in rec["constants"].items()))
    rec["seconds"] = round(time.monotonic() - t0, 1)
    rec["command"] = "elmoe3d perf --validate --record" if args.record else "elmoe3d perf"
    print(f"\nperf took {rec['seconds']} s ({jobs} worker processes)")
    text = json.dumps(_jsonable(rec), indent=1)
    if out:
        out.write_text(text + "\n")
        print(f"wrote {out}")
    if args.record:
        from .. import sim
        from pathlib import Path
        cl.recorded_path().write_text(text + "\n")
        print(f"wrote {cl.recorded_path()}")
        root = Path(sim.__file__).resolve().parent.parent
        for f in (root / "README.md", root / "docs" / "blocks" / "perf.md"):
            if f.is_file() and cl.write_tables(f, rec):
                print(f"updated {f}")
        from ..sim.generated import replace_between
        doc = root / "docs" / "blocks" / "perf.md"
        if replace_between(doc, val.THREE_WAY_MARKERS, val.three_way_table(res["three_way"])):
            print(f"updated {doc} (three ways)")
        if replace_between(doc, val.VALIDATION_MARKERS, val.validation_table(res)):
            print(f"updated {doc} (validation)")
    return 0


def _grid(args) -> int:
    from ..report import Progress
    from ..sim.perf.grid import (ablations, ar_policy_table, claims_table, locality_check, run_grid,
                                 side_by_side)
    from ..sim.perf.plots import plot_grid
    from ..sim.perf.rtl_compare import compare, report_lines
    models, batches, trace, accm = _inputs(args)
    out = writable_file(args.json, "--json") if args.json else None
    if args.plot:                                      # checked before the grid, not after it
        require("plot", "elmoe3d perf --plot", ("matplotlib",))
        writable_dir(args.plot, "--plot")
    tile = compare(args.tile_counters)                 # malformed file -> one error, before the grid
    prog = Progress()
    t0 = time.monotonic()
    grid = run_grid(models, batches, args.hb_gb, args.context, trace, accm, progress=prog,
                    draft_len=args.draft_len, trace_remap=args.trace_remap, jobs=args.jobs)
    t_grid = time.monotonic() - t0
    abl = None
    if args.ablations:
        paper = [m for m in (models or []) if _paper(m)] or None
        abl = ablations(models=paper, hb_gb=args.hb_gb, context=args.context, trace=trace, accm=accm,
                        progress=prog, jobs=args.jobs, trace_remap=args.trace_remap)
        abl["ar_policies"] = dict(rows=ar_policy_table(grid))
        abl["locality"] = locality_check(models, trace=trace, lm_trace=_lm_trace(),
                                         trace_remap=args.trace_remap)
        grid["ablations"] = abl
    t_all = time.monotonic() - t0
    grid["tile_counters"] = tile
    print(f"RTL figures: {_rtl_line(grid['rtl'])}\nacceptance: {grid['acceptance_source']}; "
          f"trace: {grid['trace']}; every MoE layer replayed "
          f"({', '.join(f'{k} {v}' for k, v in grid['moe_layers_replayed'].items())}); decimal GB")
    print("tokens/s per system and ELMoE-3D's speedup vs xPU, each prior and the envelope "
          "(HB %g GB, context %d):" % (grid["hb_gb"], grid["context"]))
    print(text_table(HEAD, grid_rows(grid)))
    print("\nLPDDR floor (no policy reads less per step / verification) and bounds per grid point:")
    print(text_table(FLOOR_HEAD, floor_rows(grid)))
    sbs = side_by_side(grid, abl)
    grid["side_by_side"] = sbs
    claims = claims_table(grid, abl, _evidence_cache())
    grid["claims"] = claims
    print("\nELMoE-3D, AR vs Elastic-SD (the 'auto' batch threshold keeps the faster):")
    print(text_table(["model", "B", "AR tok/s", "SD tok/s", "chosen"], _mode_rows(grid)))
    ours = [m for m in grid["models"] if _paper(m)]
    print("\nside by side with the paper (" + ("means over " + ", ".join(ours) if ours else
          "none of the paper's models selected: means over " + ", ".join(grid["models"])) + "):")
    print(text_table(SBS_HEAD, sbs_rows(sbs)))
    print("\nthe paper's claims, claim by claim:")
    print(text_table(CLAIM_HEAD, claim_rows(claims)))
    if abl:
        _print_ablations(abl)
    print("\n" + "\n".join(report_lines(tile)))
    print(f"\ngrid: {len(grid['points'])} points x {len(grid['systems'])} systems in {t_grid:.1f} s"
          + (f"; with ablations {t_all:.1f} s" if abl else ""))
    grid["seconds_with_ablations"] = round(t_all, 2)
    if args.plot:
        for f in plot_grid(grid, args.plot, abl):
            print(f"wrote {f}")
    if out:
        out.write_text(json.dumps(grid, indent=1))
        print(f"wrote {out}")
    return 0


def _lm_trace():
    try:
        from ..sim.lm.evidence import DATA_DIR, TRACE
        from ..sim.perf.traces import load_trace
        return load_trace(DATA_DIR / TRACE)
    except (OSError, ValueError, ImportError):
        return None


def _rtl_line(rtl) -> str:
    return (f"PE efficiency {rtl['pe_efficiency']:.3g}, DRAFT/FULL cycles {rtl['draft_cycle_ratio']:.3g}, "
            f"MoE efficiency {rtl['moe_full_efficiency']:.3g}/{rtl['moe_draft_efficiency']:.3g}, "
            f"HB {rtl['hb_efficiency']:.3g}, LPDDR {rtl['ext_efficiency']:.3g} (every system) - from "
            f"{rtl['source']}")


def _mode_rows(grid):
    rows = []
    for p in grid["points"]:
        e = p["results"]["ELMoE-3D"]
        alt = e.get("alternative") or {}
        t = {e["mode"]: e["tokens_per_s"], alt.get("mode"): alt.get("tokens_per_s")}
        f = lambda v: "-" if v is None else round(v, 1)
        rows.append([p["model"], p["batch"], f(t.get("AR")), f(t.get("SD")), e["mode"]])
    return rows


def _paper(name):
    from ..sim.perf.models import get_model
    return get_model(name).paper_eval


def _print_ablations(abl):
    if abl.get("hotness", {}).get("rows"):
        print("\nElastic-SD resident set: hotness (tag unit) vs random vs static hot set (acceptance length):")
        print(text_table(["model", "B", "hotness", "random", "static", "overlap h/r/s", "gain vs random",
                          "gain vs static"],
                         [[r["model"], r["batch"], r["hotness_acceptance_length"], r["random_acceptance_length"],
                           r["static_acceptance_length"],
                           f"{r['hotness_expected_overlap']:.2f}/{r['random_expected_overlap']:.2f}/"
                           f"{r['static_expected_overlap']:.2f}",
                           f"{r['gain'] * 100:+.0f}%", f"{r['gain_vs_static'] * 100:+.0f}%"]
                          for r in abl["hotness"]["rows"]]))
    if abl.get("ar_policies", {}).get("rows"):
        rows = abl["ar_policies"]["rows"]
        print("\nAR caches (batch 1-4): ELMoE-3D's tag-unit policies vs HB-xPU's, hit rate / tok/s "
              "(Belady = offline optimum):")
        print(text_table(["model", "B", "E hotness", "E recency", "E static", "HB lru", "HB lfu", "HB static",
                          "Belady"],
                         [[r["model"], r["batch"]] +
                          [f"{r.get(f'{s}_hit', '-')}/{round(r.get(f'{s}_tok_s', 0), 0):.0f}" if f"{s}_hit" in r
                           else "-" for s in ("elmoe_hotness", "elmoe_recency", "elmoe_static", "hbxpu_lru",
                                              "hbxpu_lfu", "hbxpu_static")] + [r.get("belady_hit", "-")]
                          for r in rows]))
    if abl.get("precision", {}).get("rows"):
        print("\ndraft precision (acceptance from the fitted model; measured draft-weight errors):")
        print(text_table(["model", "B", "precision", "acc rate", "acc length", "tok/s"],
                         [[r["model"], r["batch"], r["precision"], r["rate"], r["acceptance_length"],
                           round(r["tokens_per_s"], 1)] for r in abl["precision"]["rows"]]))
    if abl.get("planes", {}).get("rows"):
        print("\nresident planes: MSB slices (the design), whole experts, or a fraction of whole INT8 copies:")
        print(text_table(["model", "B", "planes", "tok/s", "hit", "acc rate", "acc length", "LPDDR MB/token",
                          "promoted"],
                         [[r["model"], r["batch"], r["resident_planes"], round(r["tokens_per_s"], 1),
                           r["hit_rate"], r["rate"], r["acceptance_length"], round(r["lpddr_mb_per_token"], 1),
                           r.get("promoted") or "-"] for r in abl["planes"]["rows"]]))
    if abl.get("draft_cap", {}).get("rows"):
        print("\ndraft bytes capped at what HB holds (true) vs the old upper bound (false):")
        print(text_table(["model", "B", "cap", "tok/s", "HB read GB/token", "resident GB"],
                         [[r["model"], r["batch"], r["draft_cap"], round(r["tokens_per_s"], 1),
                           round(r["hb_read_gb_per_token"], 3), round(r["resident_gb"], 2)]
                          for r in abl["draft_cap"]["rows"]]))
    if abl.get("draft_dense", {}).get("rows"):
        print("\ndense weights a draft reads: INT8 (as in the LM evidence) or MSB-augmented:")
        print(text_table(["model", "B", "dense", "tok/s", "acc rate", "acc length"],
                         [[r["model"], r["batch"], r["draft_dense"], round(r["tokens_per_s"], 1), r["rate"],
                           r["acceptance_length"]] if "error" not in r else
                          [r["model"], r["batch"], r["draft_dense"], r["error"], "", ""]
                          for r in abl["draft_dense"]["rows"]]))
    if abl.get("draft_len", {}).get("rows"):
        print("\ndraft length, fixed and adaptive per round:")
        print(text_table(["model", "B", "K", "adaptive", "acc rate", "acc length", "tok/s"],
                         [[r["model"], r["batch"], r["draft_len"], r["adaptive"], r["rate"],
                           r["acceptance_length"], round(r["tokens_per_s"], 1)] for r in abl["draft_len"]["rows"]]))
    if abl.get("hb", {}).get("rows"):
        print("\nHB 4 vs 8 GB (ELMoE-3D):")
        print(text_table(["model", "HB GB", "B", "mode", "tok/s", "x vs xPU", "hit", "cache GB"],
                         [[r["model"], r["hb_gb"], r["batch"], r.get("mode", "-"),
                           round(r.get("elmoe_tok_s", 0), 1), round(r.get("speedup_vs_xpu", 0), 2),
                           r.get("elmoe_hit_rate", "-"), round(r.get("cache_gb", 0), 2)]
                          if "error" not in r else [r["model"], r["hb_gb"], r["batch"], r["error"]] + [""] * 4
                          for r in abl["hb"]["rows"]]))
    if abl.get("reuse", {}).get("rows"):
        print("\nsensitivity to intra-request locality (per-pick reuse of the previous token's experts):")
        print(text_table(["model", "reuse", "B", "mode", "tok/s", "x vs xPU", "x vs envelope", "acc length"],
                         [[r["model"], r["reuse"], r["batch"], r["mode"], round(r["elmoe_tok_s"], 1),
                           round(r["speedup_vs_xpu"], 2), round(r["speedup_vs_envelope"], 2),
                           r["acceptance_length"] or "-"] for r in abl["reuse"]["rows"]]))
    if abl.get("locality"):
        loc = abl["locality"]
        keys = [k for k in loc["rows"][0] if k.startswith("lru_hit_")]
        print("\nrouting-trace statistics: the replayed traces beside the small LM's real one "
              "(LRU per request and layer; working set = fraction of experts one step of 16 requests touches)")
        print(f"(published: {loc['published']})")
        print(text_table(["trace", "source", "locality", "median reuse dist", "reuse prev token", "top expert share",
                          "working set B=16"] + [k[8:] for k in keys],
                         [[r["model"], r["source"], r["calibrated"].split()[0], r["median_reuse_distance"],
                           round(r["reuse_prev_token"], 3), round(r["top_expert_share"], 3),
                           round(r["working_set_all_requests"], 3)] + [round(r[k], 3) for k in keys]
                          for r in loc["rows"]]))
    if abl.get("context", {}).get("rows"):
        print("\ncontext length (KV squeezing the expert cache):")
        print(text_table(["model", "B", "context", "KV GB", "cache GB", "mode", "ELMoE tok/s",
                          "HB-xPU tok/s", "xPU tok/s"],
                         [[r["model"], r["batch"], r["context"], round(r["kv_gb"], 2),
                           round(r["expert_cache_gb"], 2), r["mode"], round(r["elmoe_tok_s"], 1),
                           round(r["hbxpu_tok_s"], 1), round(r["xpu_tok_s"], 1)]
                          for r in abl["context"]["rows"]]))


def _recorded_claims_md() -> list:
    """The recorded claims on the validated tile model
    (``sim/data/perf_claims.json``, ``elmoe3d perf --record``) as report
    lines: the validation and the headline table."""
    from ..sim.perf import claims as cl
    try:
        rec = json.loads(cl.recorded_path().read_text())
    except (OSError, ValueError):
        return ["No recorded claims (`elmoe3d perf --record` writes sim/data/perf_claims.json).\n"]
    val = rec.get("validation") or {}
    sets = ", ".join(f"{k} {x['rms']:.2%} rms / {x['max']:.2%} max"
                     for k, x in (val.get("sets") or {}).items() if not x["fit"])
    return [f"The paper's claims on the tile cycle model validated against every recorded RTL run "
            f"(`{rec.get('command', 'elmoe3d perf --record')}`; validation: {sets}):\n",
            cl.readme_table(rec), ""]


def build_section(ctx):
    """Short summary for ``make demo``: the recorded claims on the validated
    tile model, then the roofline grid at 8 GB, every comparison against
    the priors, the bounds, the hotness ablation at batch 16, the
    claim-by-claim table, the tile-counter status and two plots."""
    from ..report import Section
    from ..sim.perf.grid import ablations, claims_table, run_grid, side_by_side
    from ..sim.perf.models import load_models
    from ..sim.perf.plots import plot_grid
    from ..sim.perf.rtl_compare import compare, report_lines
    ctx.progress("performance model (paper grid)")
    t0 = time.monotonic()
    paper = [n for n, m in load_models().items() if m.paper_eval]
    batches = (1, 4, 16) if ctx.quick else (1, 2, 4, 8, 16)
    grid = run_grid(paper, batches, 8.0)
    abl = ablations(paper, which=("hotness",), batches=(16,))
    sbs = side_by_side(grid, abl)
    claims = claims_table(grid, abl, _evidence_cache())
    try:
        tile = compare()
    except ValueError as e:
        tile = dict(available=False, message=f"model vs RTL: tile-counter file unreadable: {e}")
    files = []
    try:
        files = plot_grid(grid, ctx.outdir / "perf")
    except Exception as e:                       # plots are optional in the report
        files = []
        grid.setdefault("notes", []).append(f"plots failed: {e!r}")
    secs = time.monotonic() - t0
    rows = sbs_rows(sbs)
    md = _recorded_claims_md() + [
          "The older roofline grid (not validated against the RTL; `elmoe3d perf --grid`):\n",
          f"Paper grid ({', '.join(paper)}; batch {', '.join(map(str, batches))}; 8 GB HB; "
          f"context {grid['context']}; synthetic routing traces; every MoE layer replayed). RTL figures: "
          f"{_rtl_line(grid['rtl'])}; acceptance: {grid['acceptance_source']}. "
          f"Ran in {secs:.0f} s. Full grid, ablations and plots: "
          "`elmoe3d perf --grid --ablations --json build/perf.json --plot build/perf`.\n",
          md_table(SBS_HEAD, rows), "", "Claim by claim:", "", md_table(CLAIM_HEAD, claim_rows(claims)), "",
          "LPDDR floor and bounds (ELMoE-3D and HB-xPU):", "", md_table(FLOOR_HEAD, floor_rows(grid)), "",
          WHY, "", "\n".join(report_lines(tile)), ""]
    md += [f"![{f.stem}](perf/{f.name})" for f in files]
    stdout = text_table(SBS_HEAD, rows) + "\n" + "\n".join(report_lines(tile))
    return Section("System performance model vs the paper", "\n".join(md),
                   {"grid": grid, "hotness": abl.get("hotness"), "side_by_side": sbs, "claims": claims,
                    "tile_counters": tile, "seconds": round(secs, 1)}, stdout)

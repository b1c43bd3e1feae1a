"""``elmoe3d perf``: the system-level performance and energy model (issue 6).

Runs the paper's evaluation grid (models x batch x systems) on published model
shapes, prints tokens/s, energy/token and the ratios the paper reports, and
the side-by-side table with the paper. See ``docs/blocks/perf.md``.
"""

from __future__ import annotations

import json
import time

from ..report import md_table, text_table
from ._common import writable_file

NAME = "perf"
HELP = "system performance/energy model: the paper's grid, ablations, side by side with the paper"


def register(p):
    p.add_argument("--model", action="append", default=None, metavar="NAME",
                   help="model name (repeatable or comma-separated; default: all six)")
    p.add_argument("--batch", action="append", default=None, metavar="N",
                   help="batch size (repeatable or comma-separated; default: 1,2,4,8,16)")
    p.add_argument("--hb-gb", type=float, default=8.0, metavar="GB",
                   help="HB capacity in GB (4 and 8 are the paper's chips; default 8)")
    p.add_argument("--context", type=int, default=None, metavar="TOKENS",
                   help="KV length per request during decode (default from systems.json: 1024)")
    p.add_argument("--trace", metavar="FILE", help="replay a real routing trace (.npz or .jsonl) "
                   "instead of the synthetic generator")
    p.add_argument("--acceptance", metavar="FILE",
                   help="measured acceptance rates (JSON rows) replacing the acceptance model")
    p.add_argument("--draft-len", type=int, default=None, metavar="K",
                   help="draft length of ELMoE-3D and the SD baselines (default from systems.json)")
    p.add_argument("--ablations", action="store_true",
                   help="also run the ablations (hotness vs random, truncation vs augmented, MSB-only vs "
                        "whole-expert residency, HB 4 vs 8 GB, context 1k..32k, draft length, locality)")
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
    from ..sim.perf.models import get_model
    from ..sim.perf.systems import load_systems
    from ..sim.perf.traces import load_trace
    models = [get_model(m).name for m in _split(args.model, str, "Model")] or None
    batches = _split(args.batch, int, "Batch") or [1, 2, 4, 8, 16]
    for b in batches:
        if b < 1:
            raise ValueError(f"Batch must be a positive integer, not {b!r}")
    if args.context is not None and args.context < 1:
        raise ValueError(f"Context must be a positive number of tokens, not {args.context!r}")
    if not args.hb_gb > 0:
        raise ValueError(f"HB capacity must be a positive number of GB, not {args.hb_gb!r}")
    if args.draft_len is not None and not 1 <= args.draft_len <= 16:
        raise ValueError(f"Draft length must be in 1..16, not {args.draft_len!r}")
    from ..sim.perf.hardware import get_hardware
    hw = get_hardware(hb_gb=args.hb_gb)
    for name in models or [n for n in _all_models()]:
        m = get_model(name)
        if m.dense_bytes > hw.hb_bytes:
            raise ValueError(f"HB capacity {args.hb_gb:g} GB is smaller than the dense weights of "
                             f"{m.name} ({m.dense_bytes / 2**30:.2f} GB)")
    trace = load_trace(args.trace) if args.trace else None
    if trace is not None:
        trace.meta.setdefault("path", args.trace)
    accm = AcceptanceModel.from_config(load_systems()["acceptance"], args.acceptance)
    return models, batches, trace, accm


HEAD = ["model", "B", "mode", "xPU", "PIM", "NMP", "HB-xPU", "SD-EAGLE", "SD-Q4", "ELMoE-3D",
        "x vs xPU", "E vs xPU", "x vs best prior", "acc"]


def grid_rows(grid):
    rows = []
    for p in grid["points"]:
        r = p["results"]
        e = r["ELMoE-3D"]
        q = p.get("ratios", {})
        acc = e.get("acceptance") or {}
        rows.append([p["model"], p["batch"], e["mode"]] +
                    [round(r[s]["tokens_per_s"], 1) for s in
                     ("xPU", "xPU-PIM", "xPU-NMP", "HB-xPU", "SD-EAGLE", "SD-Q4", "ELMoE-3D")] +
                    [round(q.get("speedup_vs_xpu", float("nan")), 2),
                     round(q.get("energy_vs_xpu", float("nan")), 2),
                     f"{q.get('speedup_vs_best_prior', float('nan')):.2f} ({q.get('best_prior', '-')})",
                     acc.get("rate", "-")])
    return rows


SBS_HEAD = ["metric", "paper", "this model"]


def sbs_rows(rows):
    def f(v, pct=False):
        if v is None:
            return "-"
        if isinstance(v, str):
            return v
        return f"+{v * 100:.0f}%" if pct else f"{v:.2f}x"
    return [[r["metric"], f(r["paper"], "hotness" in r["metric"]), f(r["model"], "hotness" in r["metric"])]
            for r in rows]


WHY = (
    "Why the numbers differ: (1) Elastic-SD verification still streams from LPDDR the LSB half of "
    "every resident expert it touches and every non-resident expert whole; at batch 8-16 the union "
    "of B*(K+1) tokens covers most experts of a fine-grained MoE, so external traffic per token "
    "falls only 1.3-5.4x below xPU's - and keeping whole experts instead is worse (the resident-planes "
    "ablation), so the MSB-only design is not the cause; (2) below the threshold ELMoE-3D runs AR "
    "with the golden tag unit, whose hotness policy is close to (batch 1-2) or below (batch 4) "
    "LRU, so against HB-xPU it is ~1x there; (3) routing locality is synthetic (Zipf popularity, "
    "per-request tilt, 35-45% per-pick reuse of the previous token's experts, `data/models.json`), "
    "an assumption checked only against published LRU hit-rate ranges; (4) the acceptance model is "
    "ours (overlap x bit error, calibrated only to the 0.33-0.91 range); (5) the PIM/NMP baselines "
    "are generous (4x/2x internal bandwidth, per-layer best dispatch): PIM is the best prior from "
    "batch 4-8 on at 2.3-3.9x over xPU; (6) a 1k-token FP16 KV cache per request lives in HB and "
    "squeezes the expert cache at batch 16; (7) prefill, the aggregation link and rollback are not "
    "modelled. The model reproduces the paper's trends - large gains over xPU at small batch, HB "
    "caching collapsing with batch, Elastic-SD overtaking AR at large batch, truncated drafts "
    "failing, hotness beating a random resident set - but not its magnitudes.")


def run(args) -> int:
    from ..report import Progress
    from ..sim.perf.grid import ablations, run_grid, side_by_side
    from ..sim.perf.plots import plot_grid
    models, batches, trace, accm = _inputs(args)
    out = writable_file(args.json) if args.json else None
    prog = Progress()
    t0 = time.monotonic()
    grid = run_grid(models, batches, args.hb_gb, args.context, trace, accm, progress=prog,
                    draft_len=args.draft_len)
    t_grid = time.monotonic() - t0
    abl = None
    if args.ablations:
        abl = ablations(models=[m for m in (models or []) if _paper(m)] or None, hb_gb=args.hb_gb,
                        context=args.context, trace=trace, accm=accm, progress=prog)
        from ..sim.perf.grid import locality_check
        abl["locality"] = locality_check(models, trace=trace)
        grid["ablations"] = abl
    print(f"RTL figures: {_rtl_line(grid['rtl'])}\nacceptance: {grid['acceptance_source']}; "
          f"trace: {grid['trace']}")
    print("tokens/s per system (HB %g GB, context %d):" % (grid["hb_gb"], grid["context"]))
    print(text_table(HEAD, grid_rows(grid)))
    sbs = side_by_side(grid, abl)
    grid["side_by_side"] = sbs
    print("\nELMoE-3D, AR vs Elastic-SD (the 'auto' batch threshold keeps the faster):")
    print(text_table(["model", "B", "AR tok/s", "SD tok/s", "chosen"], _mode_rows(grid)))
    ours = [m for m in grid["models"] if _paper(m)]
    print("\nside by side with the paper (" + ("means over " + ", ".join(ours) if ours else
          "none of the paper's models selected: means over " + ", ".join(grid["models"])) + "):")
    print(text_table(SBS_HEAD, sbs_rows(sbs)))
    if abl:
        _print_ablations(abl)
    print(f"\ngrid: {len(grid['points'])} points x {len(grid['systems'])} systems in {t_grid:.1f} s")
    if args.plot:
        for f in plot_grid(grid, args.plot, abl):
            print(f"wrote {f}")
    if out:
        out.write_text(json.dumps(grid, indent=1))
        print(f"wrote {out}")
    return 0


def _rtl_line(rtl) -> str:
    return (f"PE efficiency {rtl['pe_efficiency']:.3g}, DRAFT/FULL cycles {rtl['draft_cycle_ratio']:.3g}, "
            f"MoE efficiency {rtl['moe_full_efficiency']:.3g}/{rtl['moe_draft_efficiency']:.3g}, "
            f"HB {rtl['hb_efficiency']:.3g}, ext {rtl['ext_efficiency']:.3g} - from {rtl['source']}")


def _mode_rows(grid):
    rows = []
    for p in grid["points"]:
        e = p["results"]["ELMoE-3D"]
        alt = e.get("alternative") or {}
        t = {e["mode"]: e["tokens_per_s"], alt.get("mode"): alt.get("tokens_per_s")}
        f = lambda v: "-" if v is None else round(v, 1)
        rows.append([p["model"], p["batch"], f(t.get("AR")), f(t.get("SD")), e["mode"]])
    return rows


def _all_models():
    from ..sim.perf.models import model_names
    return model_names()


def _paper(name):
    from ..sim.perf.models import get_model
    return get_model(name).paper_eval


def _print_ablations(abl):
    if "hotness" in abl:
        print("\nhotness vs random resident set (Elastic-SD acceptance length):")
        print(text_table(["model", "B", "hotness", "random", "gain"],
                         [[r["model"], r["batch"], r["hotness_length"], r["random_length"],
                           f"{r['gain'] * 100:+.0f}%"] for r in abl["hotness"]["rows"]]))
    if "precision" in abl:
        print("\ntruncated vs LSB-augmented MSB drafts:")
        print(text_table(["model", "B", "precision", "acc rate", "acc length", "tok/s"],
                         [[r["model"], r["batch"], r["precision"], r["rate"], r["acceptance_length"],
                           round(r["tokens_per_s"], 1)] for r in abl["precision"]["rows"]]))
    if "planes" in abl:
        print("\nElastic-SD resident planes: MSB slices (the design) vs whole experts:")
        print(text_table(["model", "B", "planes", "tok/s", "hit", "acc rate", "acc length", "LPDDR MB/token"],
                         [[r["model"], r["batch"], r["resident_planes"], round(r["tokens_per_s"], 1),
                           r["hit_rate"], r["rate"], r["acceptance_length"], round(r["lpddr_mb_per_token"], 1)]
                          for r in abl["planes"]["rows"]]))
    if "hb" in abl:
        print("\nHB 4 vs 8 GB (ELMoE-3D):")
        print(text_table(["model", "HB GB", "B", "mode", "tok/s", "x vs xPU", "hit", "cache GB"],
                         [[r["model"], r["hb_gb"], r["batch"], r.get("mode", "-"),
                           round(r.get("elmoe_tok_s", 0), 1), round(r.get("speedup_vs_xpu", 0), 2),
                           r.get("elmoe_hit_rate", "-"), round(r.get("cache_gb", 0), 2)]
                          if "error" not in r else [r["model"], r["hb_gb"], r["batch"], r["error"]] + [""] * 4
                          for r in abl["hb"]["rows"]]))
    if "draft_len" in abl:
        print("\nElastic-SD draft length (the paper adapts it):")
        print(text_table(["model", "B", "K", "acc rate", "acc length", "tok/s"],
                         [[r["model"], r["batch"], r["draft_len"], r["rate"], r["acceptance_length"],
                           round(r["tokens_per_s"], 1)] for r in abl["draft_len"]["rows"]]))
    if "reuse" in abl:
        print("\nsensitivity to intra-request locality (per-pick reuse of the previous token's experts):")
        print(text_table(["model", "reuse", "B", "mode", "tok/s", "x vs xPU", "x vs best prior", "acc length"],
                         [[r["model"], r["reuse"], r["batch"], r["mode"], round(r["elmoe_tok_s"], 1),
                           round(r["speedup_vs_xpu"], 2), round(r["speedup_vs_best_prior"], 2),
                           r["acceptance_length"] or "-"] for r in abl["reuse"]["rows"]]))
    if "locality" in abl:
        loc = abl["locality"]
        keys = [k for k in loc["rows"][0] if k.startswith("hit_")]
        print("\nrouting-trace locality: per-layer LRU hit rate, cached fraction of experts x batch")
        print(f"(published: {loc['published']})")
        print(text_table(["model"] + [k[4:] for k in keys], [[r["model"]] + [r[k] for k in keys]
                                                            for r in loc["rows"]]))
    if "context" in abl:
        print("\ncontext length (KV squeezing the expert cache):")
        print(text_table(["model", "B", "context", "KV GB", "cache GB", "mode", "ELMoE tok/s",
                          "HB-xPU tok/s", "xPU tok/s"],
                         [[r["model"], r["batch"], r["context"], round(r["kv_gb"], 2),
                           round(r["expert_cache_gb"], 2), r["mode"], round(r["elmoe_tok_s"], 1),
                           round(r["hbxpu_tok_s"], 1), round(r["xpu_tok_s"], 1)]
                          for r in abl["context"]["rows"]]))


def build_section(ctx):
    """Short summary for ``make demo``: the paper's grid at 8 GB, the
    side-by-side table, the hotness ablation at batch 16, and two plots."""
    from ..report import Section
    from ..sim.perf.grid import ablations, run_grid, side_by_side
    from ..sim.perf.models import load_models
    from ..sim.perf.plots import plot_grid
    ctx.progress("performance model (paper grid)")
    t0 = time.monotonic()
    paper = [n for n, m in load_models().items() if m.paper_eval]
    batches = (1, 4, 16) if ctx.quick else (1, 2, 4, 8, 16)
    grid = run_grid(paper, batches, 8.0)
    abl = ablations(paper, which=("hotness",), batches=(16,))
    sbs = side_by_side(grid, abl)
    files = []
    try:
        files = plot_grid(grid, ctx.outdir / "perf")
    except Exception as e:                       # plots are optional in the report
        files = []
        grid.setdefault("notes", []).append(f"plots failed: {e!r}")
    secs = time.monotonic() - t0
    rows = sbs_rows(sbs)
    md = [f"Paper grid ({', '.join(paper)}; batch {', '.join(map(str, batches))}; 8 GB HB; "
          f"context {grid['context']}; synthetic routing traces). RTL figures: "
          f"{_rtl_line(grid['rtl'])}; acceptance: {grid['acceptance_source']}. "
          f"Ran in {secs:.0f} s. Full grid, ablations and plots: "
          "`elmoe3d perf --ablations --json build/perf.json --plot build/perf`.\n",
          md_table(SBS_HEAD, rows), "", WHY, ""]
    md += [f"![{f.stem}](perf/{f.name})" for f in files]
    stdout = text_table(SBS_HEAD, rows)
    return Section("System performance model vs the paper", "\n".join(md),
                   {"grid": grid, "hotness": abl.get("hotness"), "side_by_side": sbs,
                    "seconds": round(secs, 1)}, stdout)

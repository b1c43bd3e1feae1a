"""``elmoe3d build``: the main job (``make demo``).

Verilog for every block, synthesis estimates (Yosys generic + ECP5 Fmax),
the PE throughput measured in cocotb, the studies and models that other
command modules contribute (``build_section``), a table on stdout, and
``build/report.md`` + ``build/report.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..report import BuildContext, Progress, Section, md_table, text_table
from ._common import add_config_args, config_from_args

NAME = "build"

#: Blocks larger than this (generic cells) skip nextpnr in `make demo`: the MoE
#: layer alone takes about 10 minutes per seed to place and route on ECP5.
FMAX_MAX_CELLS = 30000
#: `make demo` places and routes with one seed to stay fast (and says so in
#: the report); `elmoe3d synth --fmax` uses the constraints files' three.
DEMO_SEEDS = [1]
#: Targets of the report's synthesis section.
DEMO_TARGETS = ("generic", "ecp5", "ice40")
HELP = "main job: Verilog + synthesis estimates + measurements + models -> build/report.md"


def register(p):
    p.add_argument("--out", default="build", metavar="DIR", help="output folder (default: build)")
    p.add_argument("--no-fmax", action="store_true", help="skip nextpnr place and route")
    p.add_argument("--no-sim", action="store_true", help="skip the cocotb measurements")
    p.add_argument("--quick", action="store_true",
                   help="smallest useful run (no Fmax, no sweeps, short models)")
    add_config_args(p)


def pe_throughput_section(ctx) -> Section:
    """PE cycles per dot product in FULL and DRAFT, counted in cocotb."""
    from ..blocks import get_block
    from ..sim.harness import simulate
    b = get_block("pe")
    params = dict(b.params(ctx.cfg), kind="bitslice")
    out = (ctx.outdir / "measured" / "throughput-pe-build.json").resolve()
    ctx.progress("cocotb: PE throughput (Verilator)")
    simulate(lambda kind, **kw: b.factory(**kw), block="pe", params=params, top=b.top,
             test_module="elmoe3d.tb.test_pe", testcase="throughput",
             env={"ELMOE_MEASURE_OUT": str(out)})
    fig = json.loads(out.read_text())["figures"]
    rows = [[name, f["beats"], f["input_cycles"], f["cycles_per_dot"], round(f["ratio_to_full"], 4),
             f["latency"]] for name, f in fig.items()]
    head = ["mode", "beats", "cycles", "cycles/dot", "ratio to FULL", "latency"]
    md = (f"{fig['FULL']['dot_products']} back-to-back dot products of "
          f"{fig['FULL']['chunks']} x {ctx.cfg.lanes} elements per mode, Verilator, "
          "cycles counted in the testbench:\n\n" + md_table(head, rows))
    return Section("PE throughput (cocotb)", md, fig, text_table(head, rows))


def synthesis_sections(ctx, bl, *, fmax: bool, sweep: bool) -> list:
    """The report's synthesis sections: blocks on every target (one seed),
    pipelining cost vs the committed baseline, peers, scaling with plots."""
    from ..sim.peers import peer_markdown, peer_table, peer_text
    from ..sim.scaling import growth_sentence, plot_sweeps
    from .synth import markdown as synth_md, run_synth, text_report
    work = ctx.outdir / "synth"
    targets = ("generic",) if ctx.quick else DEMO_TARGETS
    synth = run_synth(ctx.cfg, [b for b in bl if b.synth], work, targets=targets, pnr=fmax, seeds=DEMO_SEEDS,
                      sweep=sweep, sweep_pnr=False, progress=ctx.progress,
                      fmax_max_cells=FMAX_MAX_CELLS)
    note = (f"; `make demo` uses one seed ({DEMO_SEEDS[0]}) to stay fast -- "
            "`elmoe3d synth --target generic,ecp5,ice40` gives the median of three")
    secs = [Section("Blocks: synthesis estimates", synth_md(synth, targets, seeds_note=note),
                    {"blocks": synth, "seeds": DEMO_SEEDS}, text_report(synth, targets))]
    if ctx.quick:
        return secs
    ctx.progress("synthesis: peers per area")
    peers = peer_table(ctx.cfg, work, seeds=DEMO_SEEDS, pnr=fmax, progress=ctx.progress)
    if peers["rows"]:
        secs.append(Section("Peers per area (draft and INT8 throughput per LUT4)",
                            peer_markdown(peers) + f"\n\nFmax: ECP5-85F, one seed{note}.",
                            peers, peer_text(peers)))
    sweeps = {n: r["sweep"] for n, r in synth.items() if r.get("sweep")}
    if sweeps:
        pngs = plot_sweeps(sweeps, ctx.outdir / "plots")
        lines = [growth_sentence(n, p) for n, p in sweeps.items()]
        md = "\n".join([f"- {x}" for x in lines if x] + [""] +
                        [f"![{p.stem}](plots/{p.name})" for p in pngs])
        secs.append(Section("Scaling", md + "\n\nArea only in `make demo`; "
                            "`elmoe3d synth --sweep --fmax` adds Fmax.",
                            {"plots": [str(p) for p in pngs]}, "\n".join(x for x in lines if x)))
    return secs


def run(args) -> int:
    from ..blocks import blocks
    from ..cli import commands
    from .verilog import write_all

    cfg = config_from_args(args)
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    bl = list(blocks().values())
    hooks = [m for name, m in commands().items() if hasattr(m, "build_section")]
    total = 2 * len(bl) + 1 + (0 if args.no_sim else 1) + len(hooks)
    progress = Progress(total)
    ctx = BuildContext(cfg=cfg, outdir=outdir, progress=progress, quick=args.quick)
    t0 = time.monotonic()

    write_all(cfg, bl, outdir / "verilog", progress)
    sections = synthesis_sections(ctx, bl, fmax=not (args.no_fmax or args.quick),
                                  sweep=not args.quick)
    steps = ([("pe throughput", pe_throughput_section)] if not args.no_sim else []) + \
        [(mod.NAME, mod.build_section) for mod in hooks]
    failed = []
    for name, fn in steps:
        try:
            sec = fn(ctx)
        except Exception as e:          # one failing section must not hide the rest of the report
            failed.append(name)
            sec = Section(f"{name}: FAILED", f"The `{name}` section failed: `{e!r}`",
                          {"error": repr(e)}, f"FAILED: {e!r}")
        if sec is not None:
            sections.append(sec)

    md = ["# ELMoE-3D build report\n",
          f"Configuration `{args.preset}`: " + ", ".join(f"{k}={v}" for k, v in cfg.to_dict().items()),
          f"\nGenerated by `elmoe3d build` in {time.monotonic() - t0:.0f} s. Verilog in "
          f"`{outdir / 'verilog'}`, tool logs in `{outdir / 'synth'}`.\n"]
    for s in sections:
        md += [f"## {s.title}\n", s.markdown, ""]
    (outdir / "report.md").write_text("\n".join(md))
    (outdir / "report.json").write_text(json.dumps(
        {"config": cfg.to_dict(), "sections": {s.title: s.data for s in sections}},
        indent=2, default=str))
    for s in sections:
        print(f"\n== {s.title} ==")
        print(s.stdout or s.markdown)
    print(f"\nwrote {outdir / 'report.md'} and {outdir / 'report.json'}")
    if failed:
        print(f"elmoe3d: error: report sections failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0

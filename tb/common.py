"""Shared testbench pieces: payload packing from Amaranth layouts, stream
drivers with idle / back-pressure generators and a stream-rule checker, the
clock/reset helper, and the knobs every testbench reads from the environment.

Ports: Amaranth flattens a ``wiring`` stream member ``i`` into ``i__valid``,
``i__ready`` and one ``i__payload`` vector whose bits follow the payload's
``data`` layout (first field in the low bits, array element 0 lowest).
:func:`pack` / :func:`unpack` (:mod:`elmoe3d.sim.run.payload`, re-exported here)
walk that same layout object, so the testbench can never disagree with the
RTL about a bit position.
"""

from __future__ import annotations

import collections
import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from ..sim.run.payload import pack, unpack

__all__ = ["pack", "unpack", "params", "knob", "rng", "golden_mutation", "StreamSource",
           "StreamSink", "start_clock_and_reset", "CycleCounter"]


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
    cocotb.start_soon(Clock(dut.clk, period_ns, unit="ns").start())
    dut.rst.value = 1
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


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


class StreamSource:
    """Drives ``<prefix>__valid/payload`` from a queue of Python payloads.

    ``idle`` is the probability of inserting an idle cycle before an item (a
    float, or a callable returning bool per cycle). ``valid`` is held, with
    the payload unchanged, until ``ready`` — the stream rules. ``sent``
    records ``(cycle, item)`` of each transfer.
    """

    def __init__(self, dut, prefix: str, layout, clk, counter: CycleCounter, *,
                 idle=0.0, rand: random.Random | None = None):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.layout, self.clk, self.counter = layout, clk, counter
        self.idle = idle
        self.rand = rand or random.Random(0)
        self.queue = collections.deque()
        self.sent = []
        self.stalls = 0                     # cycles with valid & ~ready
        self.valid.value = 0
        cocotb.start_soon(self._run())

    def send(self, items):
        self.queue.extend(items)

    def _idle_now(self) -> bool:
        if callable(self.idle):
            return self.idle()
        return self.idle > 0 and self.rand.random() < self.idle

    def empty(self) -> bool:
        return not self.queue and self._item is None

    _item = None

    async def _run(self):
        fired = False
        while True:
            await RisingEdge(self.clk)
            if fired:
                self._item = None
            if self._item is None and self.queue and not self._idle_now():
                self._item = self.queue.popleft()
                self.payload.value = pack(self.layout, self._item)
            self.valid.value = self._item is not None
            await ReadOnly()
            fired = self._item is not None and bool(self.ready.value)
            if fired:
                self.sent.append((self.counter.cycle, self._item))
            elif self._item is not None:
                self.stalls += 1


class StreamSink:
    """Accepts ``<prefix>`` stream transfers with random back-pressure and
    checks the stream rules (valid held, payload stable until ready).

    ``received`` holds ``(cycle, payload_dict)``.
    """

    def __init__(self, dut, prefix: str, layout, clk, counter: CycleCounter, *,
                 backpressure=0.0, rand: random.Random | None = None):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.layout, self.clk, self.counter = layout, clk, counter
        self.backpressure = backpressure
        self.rand = rand or random.Random(1)
        self.received = []
        self.rule_violations = []
        self.ready.value = 0
        cocotb.start_soon(self._run())

    def _stall_now(self) -> bool:
        if callable(self.backpressure):
            return self.backpressure()
        return self.backpressure > 0 and self.rand.random() < self.backpressure

    async def _run(self):
        pending = None                       # payload offered but not taken
        while True:
            await RisingEdge(self.clk)
            ready = not self._stall_now()
            self.ready.value = ready
            await ReadOnly()
            valid = bool(self.valid.value)
            raw = self.payload.value.to_unsigned() if valid else None
            if pending is not None and (not valid or raw != pending):
                self.rule_violations.append(
                    (self.counter.cycle, "valid dropped or payload changed before ready"))
            if valid and ready:
                self.received.append((self.counter.cycle, unpack(self.layout, raw)))
                pending = None
            else:
                pending = raw if valid else None

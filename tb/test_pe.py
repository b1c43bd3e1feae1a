"""cocotb testbench: bit-slice PE (and the INT8 MAC baseline) against the
golden bit-slice model, bit for bit.

Parameters come from the harness (``$ELMOE_PARAMS``): ``lanes``,
``max_len``, and for the bit-slice PE ``slice_bits`` and ``augment``; a
``kind`` key (``"bitslice"`` or ``"int8"``) picks the testbench flavour.
Knobs: ``ELMOE_PE_VECTORS`` (beats in the random test, default 20000),
``ELMOE_MEASURE_OUT`` (JSON file for the throughput figures),
``ELMOE_GOLDEN_MUTATION`` (see :func:`elmoe3d.tb.common.golden_mutation`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from ..golden import bitfusion as gbf
from ..golden import bitslice as gbs
from ..hw.bitfusion import bitfusion_input_layout
from ..hw.pe import int8_input_layout, pe_input_layout, pe_output_layout
from .common import (CycleCounter, StreamSink, StreamSource, golden_mutation, knob, params,
                     rng, start_clock_and_reset)

CORNERS = (-128, 127, 0, -1, 1, -127)


class PETB:
    """Owns clock, reset, the input driver, the output monitor and the
    scoreboard for one PE instance."""

    def __init__(self, dut, *, idle=0.0, backpressure=0.0):
        self.dut = dut
        self.p = params()
        self.kind = self.p.get("kind", "bitslice")
        self.lanes = self.p["lanes"]
        self.s = self.p.get("slice_bits", 8)
        self.n = gbs.n_planes(self.s) if self.kind == "bitslice" else 1
        self.augment = self.p.get("augment", True)
        self.acc_width = gbs.acc_width(self.p["max_len"])
        self.max_beats = -(-self.p["max_len"] // self.lanes) * self.n
        self.rand = rng()
        self.np_rng = np.random.default_rng(self.rand.getrandbits(32))
        self.in_layout = {"bitslice": lambda: pe_input_layout(self.lanes, self.s),
                          "int8": lambda: int8_input_layout(self.lanes),
                          "bitfusion": lambda: bitfusion_input_layout(self.lanes)}[self.kind]()
        self.out_layout = pe_output_layout(self.acc_width)
        self.idle, self.backpressure = idle, backpressure
        self.expected = []                   # (value or None, error)
        self.mutate = golden_mutation()

    async def start(self):
        await start_clock_and_reset(self.dut)
        self.counter = CycleCounter(self.dut.clk)
        self.src = StreamSource(self.dut, "i", self.in_layout, self.dut.clk, self.counter,
                                idle=self.idle, rand=self.rand)
        self.sink = StreamSink(self.dut, "o", self.out_layout, self.dut.clk, self.counter,
                               backpressure=self.backpressure, rand=self.rand)

    # -- stimulus ------------------------------------------------------------
    def rand_int8(self, size):
        """INT8 values: mostly uniform, with corner values and runs of extremes."""
        v = self.np_rng.integers(-128, 128, size=size)
        pick = self.np_rng.random(size)
        corners = self.np_rng.choice(CORNERS, size=size)
        v = np.where(pick < 0.25, corners, v)
        style = self.rand.random()
        if style < 0.05:
            v[:] = -128
        elif style < 0.10:
            v[:] = 127
        elif style < 0.12:
            v[:] = -1                       # all ones
        return v.astype(np.int64)

    def dot_product(self, mode, keep, chunks, *, order="plane", bad=None):
        """Queue one dot product; returns the number of beats queued."""
        L, s = self.lanes, self.s
        a = self.rand_int8(chunks * L)
        w = self.rand_int8(chunks * L)
        if self.kind == "bitfusion":
            return self._bitfusion_dot(mode, chunks)
        if self.kind == "int8":
            beats = [{"act": a[c * L:(c + 1) * L].tolist(), "weight": w[c * L:(c + 1) * L].tolist(),
                      "last": int(c == chunks - 1)} for c in range(chunks)]
            self.src.send(beats)
            if len(beats) > self.max_beats:
                self._expect(None, 1)
            else:
                self._expect(int(np.sum(a * w)), 0)
            return len(beats)
        planes = gbs.split(w, s)
        prange = list(gbs.plane_range(s, mode, keep))
        if bad == "plane":                  # a plane outside the mode's set
            others = [q for q in range(self.n) if q not in prange]
            prange = prange + [self.rand.choice(others)]
        seq = ([(q, c) for q in prange for c in range(chunks)] if order == "plane"
               else [(q, c) for c in range(chunks) for q in prange])
        if order == "shuffle":
            self.rand.shuffle(seq)
        beats = []
        for idx, (q, c) in enumerate(seq):
            beats.append({"act": a[c * L:(c + 1) * L].tolist(),
                          "slices": (planes[q, c * L:(c + 1) * L] & ((1 << s) - 1)).tolist(),
                          "plane": q, "mode": int(mode), "keep": keep if bad != "keep" else 0,
                          "last": int(idx == len(seq) - 1)})
        self.src.send(beats)
        if bad is not None or len(beats) > self.max_beats:
            self._expect(None, 1)
        else:
            gmode = gbs.Mode.MSB if (mode == gbs.Mode.DRAFT and not self.augment) else mode
            self._expect(int(gbs.dot(a, w, s, gmode, keep)), 0)
        return len(beats)

    def _bitfusion_dot(self, mode, chunks):
        """Bit-Fusion beats: W8 uses act[0:L] (act[L:2L] is random and must be
        ignored); W4 uses all 2L activations against packed INT4 pairs."""
        L = self.lanes
        total, beats = 0, []
        for c in range(chunks):
            a = self.rand_int8(2 * L)
            if mode == gbf.W8:
                wb = self.rand_int8(L) & 0xFF
            else:
                wb = gbf.pack_w4(self.np_rng.integers(-8, 8, size=2 * L))
            total += gbf.beat_dot(a, wb, mode)
            beats.append({"act": a.tolist(), "weight": wb.tolist(), "mode": mode,
                          "last": int(c == chunks - 1)})
        self.src.send(beats)
        self._expect(None if len(beats) > self.max_beats else total,
                     int(len(beats) > self.max_beats))
        return len(beats)

    def _expect(self, value, error):
        if value is not None and self.mutate:
            value ^= 1
        self.expected.append((value, error))

    def random_mode(self):
        mode = self.rand.choice(list(gbs.Mode))
        keep = self.n if mode is gbs.Mode.FULL else self.rand.randint(1, self.n - 1)
        return mode, keep

    # -- checking --------------------------------------------------------------
    async def drain(self, timeout_cycles=1_000_000):
        start = self.counter.cycle
        while len(self.sink.received) < len(self.expected):
            await RisingEdge(self.dut.clk)
            if self.counter.cycle - start > timeout_cycles:
                raise AssertionError(
                    f"timeout: {len(self.sink.received)} of {len(self.expected)} results")
        for _ in range(8):                  # nothing extra may arrive
            await RisingEdge(self.dut.clk)

    def check(self):
        errors = []
        got = [r for _, r in self.sink.received]
        if len(got) != len(self.expected):
            errors.append(f"{len(got)} results for {len(self.expected)} dot products")
        for i, (g, (val, err)) in enumerate(zip(got, self.expected)):
            if g["error"] != err or (val is not None and g["value"] != val):
                errors.append(f"result {i}: got value={g['value']} error={g['error']}, "
                              f"expected value={val} error={err}")
        errors += [f"stream rule at cycle {c}: {m}" for c, m in self.sink.rule_violations]
        if errors:
            raise AssertionError(f"{len(errors)} mismatches (seed {cocotb.RANDOM_SEED}); first: "
                                 + "; ".join(errors[:5]))
        assert self.src.empty(), "input not drained"


@cocotb.test()
async def random_vectors(dut):
    """Random and corner vectors in all modes and plane orders, random idle
    cycles on the input and random back-pressure on the output."""
    tb = PETB(dut, idle=0.3, backpressure=0.3)
    await tb.start()
    target = knob("pe_vectors", 20000)
    beats = 0
    max_chunks = max(1, min(6, tb.p["max_len"] // tb.lanes))
    while beats < target:
        if tb.kind in ("int8", "bitfusion"):
            mode = tb.rand.choice((gbf.W8, gbf.W4))
            beats += tb.dot_product(mode, None, tb.rand.randint(1, max_chunks))
            continue
        mode, keep = tb.random_mode()
        order = tb.rand.choice(("plane", "plane", "chunk", "shuffle"))
        bad = None
        if tb.rand.random() < 0.03 and mode is not gbs.Mode.FULL:
            bad = tb.rand.choice(("plane", "keep"))
        beats += tb.dot_product(mode, keep, tb.rand.randint(1, max_chunks), order=order, bad=bad)
    await tb.drain()
    tb.check()
    dut._log.info("random_vectors: %d beats, %d dot products checked", beats, len(tb.expected))


@cocotb.test()
async def too_long(dut):
    """A dot product longer than the accumulator was sized for is flagged, and
    the next one is clean."""
    tb = PETB(dut)
    await tb.start()
    chunks = tb.max_beats // tb.n + 1
    if tb.kind in ("int8", "bitfusion"):
        tb.dot_product(gbf.W8, None, chunks)
        tb.dot_product(gbf.W8, None, 1)
    else:
        tb.dot_product(gbs.Mode.FULL, tb.n, chunks)
        tb.dot_product(gbs.Mode.FULL, tb.n, 1)
    await tb.drain()
    tb.check()


@cocotb.test()
async def throughput(dut):
    """Back to back beats with an always-ready sink: counts cycles per beat
    (must be 1: no bubbles) and the DRAFT/FULL cycle ratio for every k."""
    tb = PETB(dut)
    await tb.start()
    chunks, count = 4, 32
    groups = [("FULL", gbs.Mode.FULL if tb.kind != "bitfusion" else gbf.W8, tb.n)]
    if tb.kind == "bitfusion":
        groups += [("W4", gbf.W4, None)]
    if tb.kind == "bitslice":
        groups += [(f"DRAFT_k{k}", gbs.Mode.DRAFT, k) for k in range(1, tb.n)]
    figures = {}
    for name, mode, keep in groups:
        first = len(tb.src.sent)
        nres = len(tb.sink.received)
        beats = sum(tb.dot_product(mode, keep, chunks) for _ in range(count))
        await tb.drain()
        sent = tb.src.sent[first:]
        got = tb.sink.received[nres:]
        span = sent[-1][0] - sent[0][0] + 1            # cycles the input was busy
        figures[name] = {"beats": beats, "dot_products": count, "chunks": chunks,
                         "input_cycles": span, "cycles_per_dot": span / count,
                         "latency": got[-1][0] - sent[-1][0]}
        assert span == beats, f"{name}: {beats} beats took {span} cycles (bubbles)"
        assert tb.src.stalls == 0, f"{name}: input stalled {tb.src.stalls} cycles"
    tb.check()
    full = figures["FULL"]["input_cycles"]
    for name, fig in figures.items():
        fig["ratio_to_full"] = fig["input_cycles"] / full
        if name.startswith("DRAFT_k"):
            k = int(name[7:])
            assert fig["input_cycles"] * tb.n == full * k, f"{name}: not exactly k/n of FULL"
    dut._log.info("throughput: %s", figures)
    out = os.environ.get("ELMOE_MEASURE_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"params": tb.p, "figures": figures}, indent=2))

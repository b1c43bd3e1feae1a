"""cocotb testbench: the weight-bit-serial MAC vector peer against
:mod:`elmoe3d.golden.bitserial`, bit for bit.

Parameters from the harness (``$ELMOE_PARAMS``): ``lanes``, ``digit_bits``,
``max_len`` (and ``levels_per_stage``). Knobs: ``ELMOE_BITSERIAL_DOTS``
(dot products in the random test, default 600), ``ELMOE_MEASURE_OUT``
(JSON for the throughput figures), ``ELMOE_GOLDEN_MUTATION``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from ..golden import bitserial as gbsr
from ..hw.vocab import bitserial_beat, bitserial_result
from .common import (CycleLoop, Scoreboard, Sink, Source, golden_mutation, knob, params, rng,
                     start_clock_and_reset)
from .kit import IdleBackpressure, per_cycle

CORNERS = (-128, 127, 0, -1, 1)


class BitSerialTB(IdleBackpressure):
    """One bit-serial MAC vector on the testbench kit (:mod:`elmoe3d.tb.kit`):
    from :meth:`start` on a :class:`~elmoe3d.tb.kit.CycleLoop` drives the
    beats (a :class:`~elmoe3d.tb.kit.Source` on ``i``) and takes the results
    (a :class:`~elmoe3d.tb.kit.Sink` on ``o``); each result is compared on
    arrival, in order, with the golden one :meth:`queue` put on the
    :class:`~elmoe3d.tb.kit.Scoreboard`. Idle cycles and back-pressure come
    from :class:`~elmoe3d.tb.kit.IdleBackpressure` (none by default).

    Parameters
    ----------
    dut
        The cocotb handle of the bit-serial MAC.

    Attributes
    ----------
    src : elmoe3d.tb.kit.Source
        Its ``sent`` holds ``(cycle, beat)`` per beat, ``stalls`` the cycles
        a beat waited for ``ready``.
    sink : elmoe3d.tb.kit.Sink
    scoreboard : elmoe3d.tb.kit.Scoreboard
        The golden ``(value, error)`` not yet matched.
    beats : list
        The beats queued (the test may clear it between phases).
    golden : list
        ``(value, error)`` of every dot product queued.
    received : list
        ``(cycle, payload)`` per result (the test may clear it).
    """

    def __init__(self, dut):
        self.dut = dut
        self.p = params()
        self.L, self.b, self.max_len = self.p["lanes"], self.p["digit_bits"], self.p["max_len"]
        self.W = gbsr.acc_width(self.max_len)
        self.rand = rng()
        self.np_rng = np.random.default_rng(self.rand.getrandbits(32))
        self.beats = []
        self.golden = []
        self.received = []
        self.scoreboard = Scoreboard("result", compare=self._compare)
        self.mutate = golden_mutation()

    async def start(self):
        """Clock and reset, then the streams, cycle by cycle for the rest of
        the test."""
        await start_clock_and_reset(self.dut)
        self.src = Source(self.dut, "i", bitserial_beat(self.L, self.b), self.rand, self.idle)
        self.sink = Sink(self.dut, "o", bitserial_result(self.W), self.rand, self.backpressure,
                         self._result)
        self.loop = CycleLoop(self.dut.clk)
        cocotb.start_soon(self.loop.run([self.src], [self.sink], limit=math.inf))

    def values(self, n, p):
        lo, hi = -(1 << (p - 1)), (1 << (p - 1))
        v = self.np_rng.integers(lo, hi, size=n)
        pick = self.np_rng.random(n)
        v = np.where(pick < 0.2, self.np_rng.choice([lo, hi - 1, 0, -1], size=n), v)
        if self.rand.random() < 0.05:
            v[:] = lo
        return v.astype(np.int64)

    def dot(self, n, p):
        act = self.values(n, 8)
        w = self.values(n, p)
        return gbsr.weight_beats(act, w, p, self.b, self.L)

    def corrupt(self, beats):
        """A malformed dot product: one of the error cases of the contract."""
        kind = self.rand.randrange(4)
        beats = [dict(x) for x in beats]
        if kind == 0 and len(beats) > 1:          # a group without its msd
            i = next((k for k, x in enumerate(beats) if x["msd"]), 0)
            beats[i]["msd"] = 0
        elif kind == 1:                            # last without lsd: cut the last digit off
            if len(beats) > 1 and not beats[-2]["lsd"]:
                beats = beats[:-1]
                beats[-1]["last"] = 1
            else:
                beats[-1]["lsd"] = 0
        elif kind == 2:                            # a group wider than 8 bits
            g = gbsr.MAX_WEIGHT_BITS // self.b
            extra = dict(beats[-1], msd=0, lsd=1, last=1)
            body = [dict(beats[0], msd=int(k == 0), lsd=0, last=0) for k in range(g)]
            beats = body + [extra]
        else:                                      # msd inside a group
            g = 8 // self.b
            if g > 1:
                beats = [dict(beats[0], msd=1, lsd=0, last=0), dict(beats[0], msd=1, lsd=1, last=1)]
            else:
                beats[-1]["lsd"] = 0
        return beats

    def queue(self, beats):
        """Send one dot product's beats and expect its golden result. The
        golden model starts afresh after every ``last`` beat, so a dot
        product's result is :func:`~elmoe3d.golden.bitserial.run` of its
        own beats."""
        assert beats[-1]["last"], "a dot product ends with its last beat"
        self.beats.extend(beats)
        for value, error in gbsr.run(beats, b=self.b, lanes=self.L, max_len=self.max_len):
            self.golden.append((value, error))
            self.scoreboard.expect((value ^ 1 if self.mutate else value, error))
        self.src.send(beats)

    @staticmethod
    def _compare(want, got):
        ev, ee = want
        gv, ge = got["value"], got["error"]
        if ge != ee or (not ee and gv != ev):
            return f"got ({gv}, {ge}), expected ({ev}, {ee})"
        return None

    def _result(self, got):
        self.received.append((self.sink.cycle, got))
        self.scoreboard.check(got)

    async def drain(self, n_results, timeout=200000):
        """Wait until the beats are sent and ``n_results`` results arrived
        (at most ``timeout`` cycles), then 50 cycles more."""
        for _ in range(timeout):
            if self.src.empty() and len(self.received) >= n_results:
                break
            await RisingEdge(self.dut.clk)
        for _ in range(50):
            await RisingEdge(self.dut.clk)

    def check(self):
        """Fail on a stream-rule violation on ``o`` or a wrong, extra or
        missing result; returns the dot products queued."""
        assert not self.sink.rule_violations, self.sink.rule_violations[:3]
        self.scoreboard.finish(f"cycle {self.loop.cycle}")
        return len(self.golden)


@cocotb.test()
async def random_vectors(dut):
    """Random INT8 / 4-bit / other-precision dot products with malformed ones
    mixed in, random idle cycles on the input and back-pressure on the output."""
    tb = BitSerialTB(dut)
    tb.set_idle_generator(0.2)
    tb.set_backpressure_generator(0.3)
    await tb.start()
    n = knob("bitserial_dots", 600)
    precs = [p for p in range(tb.b, 9, tb.b)]
    limit = gbsr.max_groups(tb.max_len, tb.L) * tb.L
    for k in range(n):
        r = tb.rand.random()
        length = (limit if r < 0.03 else tb.rand.randint(1, min(limit, 4 * tb.L)))
        p = tb.rand.choice([8, 4] * 3 + precs) if tb.b <= 4 else 8
        beats = tb.dot(length, p)
        if tb.rand.random() < 0.08:
            beats = tb.corrupt(beats)
        elif r > 0.99:                              # one group past the limit
            beats = tb.dot(limit + tb.L, p)
        tb.queue(beats)
    await tb.drain(n)
    checked = tb.check()
    errs = sum(e for _, e in tb.golden)
    dut._log.info(f"{checked} dot products checked ({errs} with error), {len(tb.beats)} beats")
    assert errs > 0, "no error case was exercised"


@cocotb.test()
async def throughput(dut):
    """Back-to-back dot products with ``o`` always ready: one beat per cycle,
    no input stall; INT8 weights take 8/b cycles per chunk, 4-bit weights
    4/b; the latency from ``last`` to the result is the documented one."""
    tb = BitSerialTB(dut)
    await tb.start()
    chunks, dots = 4, 32
    figures = {}
    for p in (8, 4):
        tb.beats = []
        tb.received.clear()
        tb.src.sent.clear()
        for _ in range(dots):
            tb.queue(tb.dot(chunks * tb.L, p))
        await tb.drain(dots)
        tb.check()
        cyc = [c for c, _ in tb.src.sent]
        last_cycles = [c for c, beat in tb.src.sent if beat["last"]]
        out_cycles = [c for c, _ in tb.received]
        figures[f"W{p}"] = {
            "beats": len(tb.beats), "input_cycles": cyc[-1] - cyc[0] + 1,
            "cycles_per_dot": (cyc[-1] - cyc[0] + 1) / dots, "chunks": chunks,
            "input_stalls": tb.src.stalls,
            "latency": min(o - c for o, c in zip(out_cycles, last_cycles))}
        assert figures[f"W{p}"]["input_cycles"] == len(tb.beats), figures
        assert len(tb.beats) == dots * chunks * p // tb.b
    figures["W4"]["ratio_to_W8"] = figures["W4"]["input_cycles"] / figures["W8"]["input_cycles"]
    assert figures["W4"]["ratio_to_W8"] == 0.5
    assert figures["W8"]["latency"] == figures["W4"]["latency"] == int(tb.p["latency"]), figures
    dut._log.info(json.dumps(figures))
    out = knob("measure_out", "")
    if out:
        Path(out).write_text(json.dumps({"params": tb.p, "figures": figures}, indent=1))


@cocotb.test()
async def one_beat_dots_fill_the_buffer(dut):
    """Every beat a whole dot product (L elements of b-bit weights) while the
    output is stalled for long stretches: no result is lost or duplicated and
    ``i.ready`` falls only when every result slot is taken."""
    tb = BitSerialTB(dut)
    await tb.start()
    stall = {"n": 0}

    def bp():
        stall["n"] += 1
        return (stall["n"] // 40) % 2 == 0
    tb.set_backpressure_generator(per_cycle(bp))
    for _ in range(300):
        tb.queue(tb.dot(tb.L, tb.b))
    await tb.drain(300)
    tb.check()
    assert tb.src.stalls > 0

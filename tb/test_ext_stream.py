"""cocotb testbench: the external-memory stream engine against its contract
(:mod:`elmoe3d.golden.ext_stream`), with cocotbext-axi's ``AxiRamRead`` as
the LPDDR.

LPDDR models
------------
* ``AxiRamRead`` as shipped (``stock_axi_ram``): one burst at a time, with
  cocotbext-axi's pause generators on AR (``arready``) and R (``rvalid``).
* :class:`Lpddr`, an ``AxiRamRead`` whose read process is replaced: many
  bursts in flight, the first beat of a burst no earlier than ``latency``
  cycles after its AR handshake, and on a random fraction of bursts one
  fault on one random beat — SLVERR, DECERR, EXOKAY, an early RLAST, a
  missing RLAST or a wrong RID. It records every beat it corrupted.

Scoreboard (contracts, not a replay of the RTL's choices)
---------------------------------------------------------
* AXI, every cycle: AR payload stable from ``arvalid`` until ``arready``;
  at most ``axi_outstanding`` bursts in flight (bursts framed by their
  ``ARLEN``).
* Per command: its bursts obey :func:`~elmoe3d.golden.ext_stream.burst_violations`
  (every byte of the read exactly once, in order, no 4 KiB crossing, at most
  ``axi_max_burst`` beats; a failed command's bursts a prefix reaching its
  first bad beat, at most ``axi_outstanding - 1`` bursts past the failing
  one). The bursts are split between commands by matching them against each
  command's read (consecutive commands never read the same bytes).
* Every PE beat, fill beat and response equals
  :func:`~elmoe3d.golden.ext_stream.split_command` given the command's first
  bad beat (classified by the golden :func:`beat_error`), item for item.
* Stream rules on ``pe``, ``fill``, ``rsp`` (``tb.common.StreamSink``).

Functional coverage (``build/coverage/ext_stream.json``): command kind,
plane mask, fill, response code, fault kind, failing burst, how the PE
stream ended, AR/R pauses and back-pressure on every output, and crosses.

Parameters: ``$ELMOE_PARAMS`` = ``{"config": Config.to_dict()}`` (or
``{"ext": ..., "hb": ...}`` for the engine + HB pair). Knobs:
``ELMOE_EXT_CMDS``, ``ELMOE_EXT_MIN_BURSTS``, ``ELMOE_EXT_LATENCY``,
``ELMOE_EXT_ERR`` (fault probability per burst), ``ELMOE_MEASURE_OUT``,
``ELMOE_GOLDEN_MUTATION``.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
from pathlib import Path

import cocotb
from cocotb.queue import Queue
from cocotb.triggers import ReadOnly, RisingEdge
from cocotbext.axi import AxiReadBus, AxiRamRead
from cocotbext.axi.constants import AxiResp

from ..config import Config
from ..golden import ext_stream as ge
from ..golden import layout as gl
from ..golden.vocab import ExtError, ExtKind
from ..hw import vocab as hv
from .common import (CycleCounter, StreamSink, StreamSource, golden_mutation, knob, params,
                     rng, start_clock_and_reset)
from .coverage import write_coverage

#: Bounded wait with outputs always ready (docs/blocks/ext_stream.md): a
#: response follows its command's last R beat within WAIT_AFTER_READ cycles,
#: or, for a command that reads nothing (refused or empty), its acceptance
#: within WAIT_NO_READ cycles, plus the range check's row division
#: (:func:`wait_no_read`) when a dense row is not a power of two of bytes.
WAIT_AFTER_READ = 6
WAIT_NO_READ = 18


def wait_no_read(cfg) -> int:
    """The bound for a command that reads nothing: WAIT_NO_READ, plus the
    ``bits(dense_words) + 1`` cycles of CommandCheck's restoring division when
    a dense row is not a power of two of bytes."""
    rb = ge.row_bytes(cfg)
    return WAIT_NO_READ + (0 if rb & (rb - 1) == 0 else max(cfg.dense_words, 2).bit_length() + 1)

FAULTS = ("slverr", "decerr", "exokay", "early_rlast", "missing_rlast", "bad_rid")


class Lpddr(AxiRamRead):
    """AxiRamRead with read latency, many bursts in flight and fault injection.

    ``records`` holds one entry per burst served, in AR order: ``(cycle,
    addr, beats, faults)`` with ``faults`` ``{beat: (kind, rid, rresp,
    rlast)}`` for every beat it corrupted. ``force`` queues faults for the
    next bursts (``[kind or None, ...]``) ahead of the random ones."""

    def __init__(self, bus, clock, counter, *, mem, latency, rand, err_prob=0.0):
        self.counter, self.latency, self.rand, self.err_prob = counter, latency, rand, err_prob
        self.records = []
        self.force = []
        self._accepted = Queue()
        super().__init__(bus, clock, None, mem=mem)
        self.ar_channel.queue_occupancy_limit = 64
        self.r_channel.queue_occupancy_limit = 4

    async def _accept(self):
        while True:
            ar = await self.ar_channel.recv()
            await self._accepted.put((self.counter.cycle, ar))

    def _fault(self, n):
        if self.force:
            kind = self.force.pop(0)
        elif self.err_prob and self.rand.random() < self.err_prob:
            kind = self.rand.choice(FAULTS if n > 1 else
                                    tuple(f for f in FAULTS if f != "early_rlast"))
        else:
            return None, None
        if kind is None:
            return None, None
        if kind == "missing_rlast":
            return kind, n - 1
        if kind == "early_rlast":
            return kind, self.rand.randrange(n - 1)
        return kind, self.rand.randrange(n)

    async def _process_read(self):
        cocotb.start_soon(self._accept())
        idw = len(self.ar_channel.bus.arid)
        while True:
            t0, ar = await self._accepted.get()
            arid, addr, n = int(ar.arid), int(ar.araddr), int(ar.arlen) + 1
            kind, at = self._fault(n)
            faults = {}
            self.records.append((t0, addr, n, faults))
            while self.counter.cycle < t0 + self.latency:
                await RisingEdge(self.clock)
            for j in range(n):
                r = self.r_channel._transaction_obj()
                r.rid, r.rlast, r.rresp = arid, int(j == n - 1), int(AxiResp.OKAY)
                if j == at:
                    if kind == "slverr":
                        r.rresp = int(AxiResp.SLVERR)
                    elif kind == "decerr":
                        r.rresp = int(AxiResp.DECERR)
                    elif kind == "exokay":
                        r.rresp = int(AxiResp.EXOKAY)
                    elif kind in ("early_rlast", "missing_rlast"):
                        r.rlast = int(not r.rlast)
                    else:
                        r.rid = self.rand.randrange(1, 1 << idw) if idw else arid
                    faults[j] = (kind, int(r.rid), int(r.rresp), int(r.rlast))
                r.rdata = int.from_bytes(self.mem[addr + j * self.byte_lanes:
                                                  addr + (j + 1) * self.byte_lanes], "little")
                await self.r_channel.send(r)


def _pause(rand, prob):
    if not prob:
        return None
    return (rand.random() < prob for _ in itertools.count())


_COVER = {}


def _coverage(n):
    """Declare the coverpoints once per process (bins depend on the plane count)."""
    if "sample" in _COVER:
        return _COVER["sample"]
    from cocotb_coverage.coverage import CoverCross, CoverPoint
    P = "ext_stream"
    yes_no = [False, True]

    @CoverPoint(f"{P}.kind", xf=lambda c: c["kind"], bins=["EXPERT", "DENSE"])
    @CoverPoint(f"{P}.plane_mask", xf=lambda c: c["plane_mask"], bins=list(range(1 << n)))
    @CoverPoint(f"{P}.fill", xf=lambda c: c["fill"], bins=[0, 1])
    @CoverPoint(f"{P}.error", xf=lambda c: c["error"],
                bins=["OK", "SLVERR", "DECERR", "PROTOCOL", "RANGE"])
    @CoverPoint(f"{P}.fault", xf=lambda c: c["fault"], bins=list(FAULTS))
    @CoverPoint(f"{P}.fail_burst", xf=lambda c: c["fail_burst"], bins=["first", "later"])
    @CoverPoint(f"{P}.fail_beat", xf=lambda c: c["fail_beat"], bins=["first", "middle", "last"])
    @CoverPoint(f"{P}.pe_end", xf=lambda c: c["pe_end"],
                bins=["last", "error_beat", "ended_before_error", "none"])
    @CoverPoint(f"{P}.dense_len", xf=lambda c: c["dense_len"], bins=["one", "some", "all"])
    @CoverPoint(f"{P}.ar_pause", xf=lambda c: c["ar_pause"], bins=yes_no)
    @CoverPoint(f"{P}.r_pause", xf=lambda c: c["r_pause"], bins=yes_no)
    @CoverPoint(f"{P}.pe_backpressure", xf=lambda c: c["pe_bp"], bins=yes_no)
    @CoverPoint(f"{P}.fill_backpressure", xf=lambda c: c["fill_bp"], bins=yes_no)
    @CoverPoint(f"{P}.rsp_backpressure", xf=lambda c: c["rsp_bp"], bins=yes_no)
    @CoverPoint(f"{P}.cmd_idle", xf=lambda c: c["cmd_idle"], bins=yes_no)
    @CoverCross(f"{P}.kindXerror", items=[f"{P}.kind", f"{P}.error"])
    @CoverCross(f"{P}.plane_maskXfill", items=[f"{P}.plane_mask", f"{P}.fill"])
    @CoverCross(f"{P}.fillXerror", items=[f"{P}.fill", f"{P}.error"])
    @CoverCross(f"{P}.faultXfail_burst", items=[f"{P}.fault", f"{P}.fail_burst"])
    @CoverCross(f"{P}.ar_pauseXr_pause", items=[f"{P}.ar_pause", f"{P}.r_pause"])
    @CoverCross(f"{P}.pe_bpXfill_bp", items=[f"{P}.pe_backpressure", f"{P}.fill_backpressure"])
    @CoverCross(f"{P}.errorXr_pause", items=[f"{P}.error", f"{P}.r_pause"])
    def sample(c):
        pass

    _COVER["sample"] = sample
    return sample


class ExtTB:
    def __init__(self, dut, *, idle=0.0, backpressure=0.0, axi_pause=0.0, latency=None,
                 err_prob=None):
        self.dut = dut
        raw = params()
        self.pair = "ext" in raw
        self.cfg = cfg = Config(**(raw["ext"] if self.pair else raw)["config"])
        self.v = hv.vocab(cfg)
        self.rand = rng()
        self.idle, self.bp, self.axi_pause = idle, backpressure, axi_pause
        self.latency = knob("ext_latency", 20) if latency is None else latency
        self.err_prob = knob("ext_err", 0.05) if err_prob is None else err_prob
        self.mutate = golden_mutation()
        self.cmds = []
        self.last_reader = None
        lay = gl.lpddr_layout(cfg)
        self.lo, self.hi = lay.base, lay.base + lay.total_bytes
        # memory beyond the window (a guard) so that a stray read would be seen
        self.mem_bytes = self.hi + 8192
        self.image = bytearray(self.rand.randbytes(self.mem_bytes))
        # cycle logs for coverage and the AXI checks
        self.ar = []                  # (cycle, addr, beats, size, burst, id)
        self.log = {k: [] for k in ("ar_pause", "r_pause", "pe_bp", "fill_bp", "rsp_bp")}
        self.axi_errors = []
        self.rbeats = []              # cycle of every R handshake

    async def start(self, stock=False):
        d = self.dut
        await start_clock_and_reset(d)
        self.counter = c = CycleCounter(d.clk)
        r = self.rand
        bus = AxiReadBus.from_prefix(d, "m_axi")
        if stock:
            self.ram = AxiRamRead(bus, d.clk, None, mem=self.image)
        else:
            self.ram = Lpddr(bus, d.clk, c, mem=self.image, latency=self.latency, rand=r,
                             err_prob=self.err_prob)
        self.ram.ar_channel.set_pause_generator(_pause(r, self.axi_pause))
        self.ram.r_channel.set_pause_generator(_pause(r, self.axi_pause))
        v = self.v
        self.cmd = StreamSource(d, "cmd", v.ExtCommand.as_shape(), d.clk, c, idle=self.idle, rand=r)
        self.rsp = StreamSink(d, "rsp", v.ExtResponse.as_shape(), d.clk, c, backpressure=self.bp, rand=r)
        self.pe = StreamSink(d, "pe", v.ExtBeat.as_shape(), d.clk, c, backpressure=self.bp, rand=r)
        if not self.pair:
            self.fill = StreamSink(d, "fill", v.FillBeat.as_shape(), d.clk, c, backpressure=self.bp, rand=r)
        cocotb.start_soon(self._monitor())

    async def _monitor(self):
        """AR/R checks and the per-cycle logs (one coroutine for all)."""
        d, N = self.dut, self.cfg.axi_outstanding
        prev = None
        lens, done_beats, done = [], 0, 0
        names = [("pe_bp", "pe"), ("rsp_bp", "rsp")] + ([] if self.pair else [("fill_bp", "fill")])
        while True:
            await RisingEdge(d.clk)
            await ReadOnly()
            cyc = self.counter.cycle
            av, ar_r = int(d.m_axi_arvalid.value), int(d.m_axi_arready.value)
            if prev is not None:
                pay = (int(d.m_axi_araddr.value), int(d.m_axi_arlen.value),
                       int(d.m_axi_arsize.value), int(d.m_axi_arburst.value),
                       int(d.m_axi_arid.value))
                if not av or pay != prev:
                    self.axi_errors.append(f"cycle {cyc}: AR dropped or changed before arready")
            if av:
                pay = (int(d.m_axi_araddr.value), int(d.m_axi_arlen.value),
                       int(d.m_axi_arsize.value), int(d.m_axi_arburst.value),
                       int(d.m_axi_arid.value))
                if ar_r:
                    self.ar.append((cyc, pay[0], pay[1] + 1, pay[2], pay[3], pay[4]))
                    lens.append(pay[1] + 1)
                    if len(lens) - done > N:
                        self.axi_errors.append(f"cycle {cyc}: {len(lens) - done} bursts in "
                                               f"flight, more than {N}")
                    prev = None
                else:
                    self.log["ar_pause"].append(cyc)
                    prev = pay
            else:
                prev = None
            rv, rr = int(d.m_axi_rvalid.value), int(d.m_axi_rready.value)
            if rv and rr:
                self.rbeats.append(cyc)
                done_beats += 1
                if done < len(lens) and done_beats == lens[done]:
                    done, done_beats = done + 1, 0
            elif rr and done < len(lens):
                self.log["r_pause"].append(cyc)
            for key, port in names:
                if int(getattr(d, f"{port}__valid").value) and \
                        not int(getattr(d, f"{port}__ready").value):
                    self.log[key].append(cyc)

    # -- stimulus ------------------------------------------------------------
    def send(self, cmd):
        cmd = dict(cmd, id=len(self.cmds) % (1 << hv.CMD_ID_BITS))
        self.cmds.append(cmd)
        self.cmd.send([cmd])
        if ge.read_runs(self.cfg, cmd):
            self.last_reader = (cmd["kind"], cmd["addr"])
        return cmd

    def expert_addr(self):
        cfg = self.cfg
        while True:
            a = gl.lpddr_expert_base(cfg, self.rand.randrange(cfg.layers),
                                     self.rand.randrange(cfg.experts))
            if self.last_reader != (ExtKind.EXPERT, a):
                return a

    def random_command(self):
        cfg, r = self.cfg, self.rand
        n, hbm = cfg.planes, ge.hb_mask(cfg)
        full = (1 << n) - 1
        x = r.random()
        slot = r.randrange(cfg.tag_slots)
        if x < 0.75:
            y = r.random()
            if y < 0.25:
                mask, fill = full, 1                    # miss, cached on the way
            elif y < 0.45:
                mask, fill = full & ~hbm, 0             # hit: the LSB planes only
            elif y < 0.55:
                mask, fill = full, 0                    # miss, not cached
            elif y < 0.7:
                mask, fill = 0, 1                       # prefetch into HB only
            else:
                mask, fill = r.randrange(1 << n), r.randrange(2)
            return self.send(ge.command(addr=self.expert_addr(), plane_mask=mask, fill=fill,
                                        slot=slot))
        lay = gl.lpddr_layout(cfg)
        D, rb = cfg.dense_words, ge.row_bytes(cfg)
        if x < 0.87 and self.last_reader is not None and self.last_reader[0] != ExtKind.DENSE:
            y = r.random()
            if y < 0.1:
                o0, length = 0, D
            elif y < 0.3:
                o0, length = r.randrange(D), 1
            else:
                o0 = r.randrange(D)
                length = r.randint(1, min(D - o0, 48))
            return self.send(ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + o0 * rb,
                                        length=length, plane_mask=r.randrange(1 << n),
                                        fill=r.randrange(2), slot=slot))
        # refused commands (RANGE), each kind of violation
        bb = ge.beat_bytes(cfg)
        y = r.randrange(6)
        if y == 0:
            c = ge.command(addr=self.hi - cfg.expert_bytes + bb * r.randint(1, 4), plane_mask=full,
                           fill=1, slot=slot)
        elif y == 1 and bb > 1:
            c = ge.command(addr=self.expert_addr() + r.randrange(1, bb), plane_mask=full,
                           slot=slot)
        elif y == 2 and self.lo:
            c = ge.command(addr=self.lo - bb * r.randint(1, 8), plane_mask=1, slot=slot)
        elif y == 3:
            c = ge.command(kind=ExtKind.DENSE, addr=lay.dense_base, length=D + 1, slot=slot)
        elif y == 4:
            c = ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + rb * r.randrange(D),
                           length=0, slot=slot)
        else:
            c = ge.command(kind=ExtKind.DENSE, addr=lay.dense_base - rb, length=1, slot=slot,
                           plane_mask=r.randrange(1 << n))
        return self.send(c)

    # -- checking --------------------------------------------------------------
    async def drain(self, timeout=300_000):
        start = self.counter.cycle
        while not (self.cmd.empty() and len(self.rsp.received) >= len(self.cmds)):
            await RisingEdge(self.dut.clk)
            if self.counter.cycle - start > timeout:
                raise AssertionError(f"timeout (seed {cocotb.RANDOM_SEED}): "
                                     f"{len(self.rsp.received)} of {len(self.cmds)} responses")
        for _ in range(40):
            await RisingEdge(self.dut.clk)

    def golden(self):
        """Expected PE beats, fill beats and responses, per-command facts for
        coverage, and every contract violation found."""
        cfg, bb = self.cfg, ge.beat_bytes(self.cfg)
        recs = getattr(self.ram, "records", None)
        errors = list(self.axi_errors)
        if recs is not None and [(a, n) for _, a, n, _ in recs] != \
                [(a, n) for _, a, n, *_ in self.ar]:
            errors.append("the memory model and the AR monitor disagree")
        exp_pe, exp_fill, exp_rsp, facts = [], [], [], []
        k = 0
        r_at = 0
        for ci, c in enumerate(self.cmds):
            runs = ge.read_runs(cfg, c)
            # the command's bursts: those that continue its read in order
            pos = [runs[0][0], 0] if runs else None
            mine = []
            ri = 0
            while runs and k < len(self.ar):
                _, a, n, *_ = self.ar[k]
                if ri < len(runs) and a == pos[0] and a + n * bb <= runs[ri][0] + runs[ri][1]:
                    mine.append(k)
                    pos[0] = a + n * bb
                    k += 1
                    if pos[0] == runs[ri][0] + runs[ri][1]:
                        ri += 1
                        if ri < len(runs):
                            pos[0] = runs[ri][0]
                else:
                    break
            bursts = [self.ar[i][1:] for i in mine]
            bad = {}
            fault_of = {}
            if recs is not None:
                for bi, i in enumerate(mine):
                    _, a, n, faults = recs[i]
                    for j, (kind, rid, rresp, rlast) in faults.items():
                        code = ge.beat_error(cfg, rid, rresp, rlast, j == n - 1)
                        if code != ExtError.OK:
                            bad[(bi, j)] = code
                            fault_of[(bi, j)] = kind
            err = ge.error_beat(cfg, c, [(a, n) for a, n, *_ in bursts], bad)
            msgs = ge.burst_violations(cfg, c, bursts, failed_beat=None if err is None else err[0])
            errors.extend(f"command {ci} {c}: {m}" for m in msgs)
            fact = {"kind": ExtKind(c["kind"]).name,
                    "plane_mask": c["plane_mask"] if c["kind"] == ExtKind.EXPERT else None,
                    "fill": c["fill"] if c["kind"] == ExtKind.EXPERT else None,
                    "fault": None, "fail_burst": None, "fail_beat": None,
                    "window": (self.ar[mine[0]][0] if mine else None)}
            nbeats = sum(n for _a, n, *_ in bursts)
            fact["last_r"] = self.rbeats[r_at + nbeats - 1] if nbeats else None
            r_at += nbeats
            if err is not None:
                bi, j, left = 0, err[0], err[0]
                while left >= bursts[bi][1]:
                    left -= bursts[bi][1]
                    bi += 1
                j = left
                n_b = bursts[bi][1]
                fact.update(fault=fault_of[(bi, j)], fail_burst="first" if bi == 0 else "later",
                            fail_beat="last" if j == n_b - 1 else ("first" if j == 0 else "middle"))
                after = len(mine) - bi - 1
                if after > cfg.axi_outstanding - 1:
                    errors.append(f"command {ci}: {after} bursts issued after the failing one "
                                  f"(at most {cfg.axi_outstanding - 1})")
            pe, fl, rsp = ge.split_command(cfg, self.image, c, err)
            if c["kind"] == ExtKind.DENSE and rsp["error"] != ExtError.RANGE:
                L = c["length"]
                fact["dense_len"] = "one" if L == 1 else ("all" if L == cfg.dense_words else "some")
            else:
                fact["dense_len"] = None
            fact["error"] = ExtError(rsp["error"]).name
            pe_stream = c["kind"] == ExtKind.EXPERT and c["plane_mask"] != 0
            if not pe_stream:
                fact["pe_end"] = "none"
            elif pe[-1]["error"]:
                fact["pe_end"] = "error_beat"
            elif rsp["error"] != ExtError.OK:
                fact["pe_end"] = "ended_before_error"
            else:
                fact["pe_end"] = "last"
            facts.append(fact)
            exp_pe += pe
            exp_fill += fl
            exp_rsp.append(rsp)
        if k != len(self.ar) and not errors:
            errors.append(f"{len(self.ar) - k} bursts belong to no command, first {self.ar[k]}")
        if self.mutate:
            for x in exp_pe:
                x["words"][0] ^= 1
        return exp_pe, exp_fill, exp_rsp, facts, errors

    def check(self, name="random"):
        exp_pe, exp_fill, exp_rsp, facts, errors = self.golden()

        def cmp(label, sink, exp):
            got = [x for _, x in sink.received]
            if len(got) != len(exp):
                errors.append(f"{label}: {len(got)} items, expected {len(exp)}")
            for i, (a, e) in enumerate(zip(got, exp)):
                if a != e:
                    errors.append(f"{label}[{i}]: got {a}, expected {e}")
                    break
            errors.extend(f"{label} stream rule at {c}: {m}" for c, m in sink.rule_violations)
        cmp("pe", self.pe, exp_pe)
        cmp("rsp", self.rsp, exp_rsp)
        if not self.pair:
            cmp("fill", self.fill, exp_fill)
        if errors:
            raise AssertionError(f"{len(errors)} mismatches (seed {cocotb.RANDOM_SEED}): "
                                 + "; ".join(errors[:6]))
        self.cover(facts, name)
        return exp_fill, facts

    def cover(self, facts, name):
        sample = _coverage(self.cfg.planes)
        rsp_cycles = [cyc for cyc, _ in self.rsp.received]
        sent = [cyc for cyc, _ in self.cmd.sent]
        logs = {k: sorted(v) for k, v in self.log.items()}

        def any_in(key, lo, hi):
            a = logs[key]
            i = bisect.bisect_left(a, lo)
            return i < len(a) and a[i] <= hi

        for i, f in enumerate(facts):
            lo = f["window"] if f["window"] is not None else sent[i]
            hi = rsp_cycles[i]
            sample({**f, "ar_pause": any_in("ar_pause", lo, hi),
                    "r_pause": any_in("r_pause", lo, hi), "pe_bp": any_in("pe_bp", lo, hi),
                    "fill_bp": any_in("fill_bp", lo, hi) if not self.pair else False,
                    "rsp_bp": any_in("rsp_bp", lo, hi),
                    "cmd_idle": i > 0 and sent[i] - sent[i - 1] > 1})
        write_coverage("ext_stream", run=f"{name} {self.cfg.slice_bits}-{self.cfg.pes}",
                       transactions=len(self.ar) + len(self.cmds))


@cocotb.test()
async def random_commands(dut):
    """Random expert / dense / refused commands, read latency, pauses on AR
    and R, back-pressure on every output, idle on ``cmd``, faults on random
    bursts; runs until ``ELMOE_EXT_MIN_BURSTS`` bursts were issued."""
    tb = ExtTB(dut, idle=0.2, backpressure=0.25, axi_pause=0.15)
    await tb.start()
    target = knob("ext_min_bursts", 0)
    n_cmds = knob("ext_cmds", 100)
    sent = 0
    while sent < n_cmds or len(tb.ar) < target:
        for _ in range(20):
            tb.random_command()
            sent += 1
        await tb.drain()
    exp_fill, facts = tb.check("random")
    failed = sum(1 for f in facts if f["error"] not in ("OK", "RANGE"))
    dut._log.info("random_commands: %d commands, %d bursts, %d failed by faults, %d refused, "
                  "%d PE beats, %d fill beats", len(tb.cmds), len(tb.ar), failed,
                  sum(f["error"] == "RANGE" for f in facts), len(tb.pe.received), len(exp_fill))
    assert len(tb.ar) >= target, f"{len(tb.ar)} bursts, fewer than {target}"
    if tb.err_prob >= 0.02 and len(tb.ar) >= 500:
        assert failed > 0, "no command failed: fault injection did not happen"


@cocotb.test()
async def stock_axi_ram(dut):
    """cocotbext-axi's AxiRamRead as shipped, with its pause generators on AR
    and R, and random back-pressure: every command delivers exactly its bytes."""
    tb = ExtTB(dut, idle=0.1, backpressure=0.2, axi_pause=0.3, err_prob=0.0)
    await tb.start(stock=True)
    for _ in range(knob("ext_cmds", 40)):
        tb.random_command()
    await tb.drain()
    _, facts = tb.check("stock")
    assert any(f["error"] == "OK" for f in facts)


@cocotb.test()
async def directed(dut):
    """Every fault on the first, a middle and the last burst of a command,
    each followed by a clean command (later commands are unaffected); every
    refused-command limit and one past it; the longest legal commands.
    Outputs always ready, so the run also checks a bounded wait: every
    response within ``ELMOE_EXT_WAIT`` cycles of its command's last R beat
    (or of its acceptance, for a command that reads nothing)."""
    tb = ExtTB(dut, err_prob=0.0, latency=6)
    await tb.start()
    cfg = tb.cfg
    full = (1 << cfg.planes) - 1
    lay = gl.lpddr_layout(cfg)
    for kind in FAULTS:
        for where in ("first", "middle", "last"):
            c = ge.command(addr=tb.expert_addr(), plane_mask=full, fill=1, slot=1)
            n0 = len(tb.ar)
            if where == "last":            # learn the burst count with a clean copy
                tb.send(c)
                await tb.drain()
                nb = len(tb.ar) - n0
                tb.send(ge.command(addr=tb.expert_addr(), plane_mask=1, slot=0))
                await tb.drain()
                tb.ram.force = [None] * (nb - 1) + [kind]
            else:
                tb.ram.force = [None] * (0 if where == "first" else 3) + [kind]
            tb.send(c)
            await tb.drain()
            tb.ram.force = []
            tb.send(ge.command(addr=tb.expert_addr(), plane_mask=full, fill=1, slot=2))
            await tb.drain()
    bb, rb, D = ge.beat_bytes(cfg), ge.row_bytes(cfg), cfg.dense_words
    # a fault on a dense copy; a fault on the last beat of an expert read whose
    # PE stream (plane 0 only) ended before it (with 4 planes, 2 in HB)
    for kind in FAULTS:
        tb.ram.force = [kind]
        tb.send(ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + rb * (D // 2),
                           length=min(D // 2, 3 * cfg.axi_max_burst)))
        await tb.drain()
        c = ge.command(addr=tb.expert_addr(), plane_mask=1, fill=1, slot=1)
        n0 = len(tb.ar)
        tb.send(c)
        await tb.drain()
        tb.ram.force = [None] * (len(tb.ar) - n0 - 1) + ["missing_rlast"]
        tb.send(c)
        await tb.drain()
    top = tb.hi - cfg.expert_bytes
    top -= top % bb
    for c in (ge.command(addr=top, plane_mask=full, fill=1, slot=5),            # the highest
              ge.command(addr=top + bb, plane_mask=full, fill=1, slot=5),       # one past
              ge.command(addr=tb.lo + 1, plane_mask=1),                         # unaligned
              ge.command(addr=tb.lo - bb if tb.lo else tb.hi, plane_mask=1),    # below / above
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base, length=D),    # the longest
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base, length=D + 1),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + (D - 1) * rb, length=1),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + (D - 1) * rb, length=2),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base - rb, length=1),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + 1, length=1),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base, length=0),
              ge.command(addr=tb.expert_addr(), plane_mask=0, fill=0),
              ge.command(addr=tb.expert_addr(), plane_mask=full, fill=1, slot=6)):
        tb.send(c)
        await tb.drain()
    _, facts = tb.check("directed")
    errs = [f["error"] for f in facts]
    for code in ("SLVERR", "DECERR", "PROTOCOL", "RANGE", "OK"):
        assert code in errs, f"no {code} response in the directed run"
    assert {f["fault"] for f in facts} >= set(FAULTS)
    rsp_cycles = [cyc for cyc, _ in tb.rsp.received]
    w_read = [rsp_cycles[i] - f["last_r"] for i, f in enumerate(facts) if f["last_r"] is not None]
    w_none = [rsp_cycles[i] - tb.cmd.sent[i][0] for i, f in enumerate(facts)
              if f["last_r"] is None]
    dut._log.info("directed: %d commands, response waits max %d (after the last R beat) / %d "
                  "(after acceptance, commands that read nothing)", len(facts), max(w_read),
                  max(w_none))
    assert max(w_read) <= WAIT_AFTER_READ, f"a response waited {max(w_read)} cycles after its " \
        f"last R beat (bound {WAIT_AFTER_READ})"
    bound = wait_no_read(cfg)
    assert max(w_none) <= bound, f"a response waited {max(w_none)} cycles after its " \
        f"command (bound {bound})"


@cocotb.test()
async def defect3(dut):
    """Issue 10, defect 3 (the reproducers, on the ports), one fault after the
    other in one run (``ELMOE_EXT_DEFECT``: comma-separated faults): a fault
    on the first burst of an expert read with a fill -- its PE stream must end
    with a ``last`` beat that carries ``error``, its fill with ABORT, its
    response with the fault's code; a command outside the LPDDR window must
    issue nothing and be refused; the next command must be exact."""
    faults = os.environ["ELMOE_EXT_DEFECT"].split(",")
    tb = ExtTB(dut, err_prob=0.0, latency=5)
    await tb.start()
    cfg = tb.cfg
    full = (1 << cfg.planes) - 1
    for fault in faults:
        n_rsp, n_pe, n_fl, n_ar = (len(tb.rsp.received), len(tb.pe.received),
                                   len(tb.fill.received), len(tb.ar))
        if fault == "range":
            tb.send(ge.command(addr=tb.hi, plane_mask=full, fill=1, slot=1))
        else:
            tb.ram.force = [fault]
            tb.send(ge.command(addr=tb.expert_addr(), plane_mask=full, fill=1, slot=1))
        await tb.drain()
        tb.ram.force = []
        rsp = tb.rsp.received[n_rsp][1]
        pe = [x for _, x in tb.pe.received[n_pe:]]
        fl = [x for _, x in tb.fill.received[n_fl:]]
        want = {"slverr": "SLVERR", "decerr": "DECERR", "range": "RANGE"}.get(fault, "PROTOCOL")
        assert ExtError(rsp["error"]).name == want and rsp["resident"] == 0, f"{fault}: {rsp}"
        assert pe and pe[-1]["last"] == 1 and pe[-1]["error"] == 1, \
            f"{fault}: the failed command's PE stream has no last beat with error"
        assert fl and fl[-1]["kind"] == 2, f"{fault}: the fill did not end with ABORT"
        if fault == "range":
            assert len(tb.ar) == n_ar, "a command outside the LPDDR window was issued"
        n_pe = len(tb.pe.received)
        tb.send(ge.command(addr=tb.expert_addr(), plane_mask=full, fill=0, slot=2))
        await tb.drain()
        exp_pe, _, exp_rsp = ge.split_command(cfg, tb.image, tb.cmds[-1])
        assert [x for _, x in tb.pe.received][n_pe:] == exp_pe and \
            tb.rsp.received[-1][1] == exp_rsp, f"{fault}: the next command was affected"
        dut._log.info("defect3 %s: %s, PE stream ended with last+error, fill ABORT, next "
                      "command exact", fault, want)
    tb.check("defect3")


@cocotb.test()
async def bandwidth(dut):
    """R beats per cycle vs the bus peak (1 beat/cycle) at read latencies 10,
    50 and 100 cycles: whole experts without and with a fill, and LSB-plane
    hits; outputs always ready, no faults. Also the latencies: first AR after
    the command, PE beat after its R beat."""
    tb = ExtTB(dut, err_prob=0.0, latency=10)
    await tb.start()
    cfg = tb.cfg
    figures = {}
    n_cmds = knob("ext_bw_cmds", 6)
    full = (1 << cfg.planes) - 1
    lsb = full & ~ge.hb_mask(cfg)
    for lat in (10, 50, 100):
        for name, mask, fill in (("full", full, 0), ("full_with_fill", full, 1),
                                 ("lsb_hit", lsb, 0)):
            tb.ram.latency = lat
            r0, b0, c0 = len(tb.ram.records), len(tb.pe.received), len(tb.cmds)
            beats = []

            async def mon():
                while True:
                    await RisingEdge(dut.clk)
                    await ReadOnly()
                    if dut.m_axi_rvalid.value and dut.m_axi_rready.value:
                        beats.append(tb.counter.cycle)
            task = cocotb.start_soon(mon())
            for _ in range(n_cmds):
                tb.send(ge.command(addr=tb.expert_addr(), plane_mask=mask, fill=fill))
            await tb.drain()
            task.cancel()
            span = beats[-1] - beats[0] + 1
            first_ar = tb.ram.records[r0][0]
            figures[f"{name}_lat{lat}"] = {
                "latency": lat, "beats": len(beats), "bursts": len(tb.ram.records) - r0,
                "beats_per_cycle_steady": round(len(beats) / span, 4),
                "beats_per_cycle_incl_first_latency": round(len(beats) / (beats[-1] - first_ar + 1), 4),
                "first_ar_after_cmd": first_ar - tb.cmd.sent[c0][0],
                "pe_beat_after_r": tb.pe.received[b0][0] - beats[0],
                "pe_beats": len(tb.pe.received) - b0}
            dut._log.info("bandwidth %s lat %d: %s", name, lat, figures[f"{name}_lat{lat}"])
    tb.check("bandwidth")
    out = os.environ.get("ELMOE_MEASURE_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"config": cfg.to_dict(), "bus_peak_beats_per_cycle": 1.0,
                                         "figures": figures}, indent=2))


@cocotb.test(skip=os.environ.get("ELMOE_EXT_TRACE") is None)
async def trace(dut):
    """Debug aid: one command, a few internal signals per cycle."""
    tb = ExtTB(dut, err_prob=0.0, latency=3)
    await tb.start()
    tb.send(ge.command(addr=tb.expert_addr(), plane_mask=1, fill=1, slot=1))
    for _ in range(int(os.environ["ELMOE_EXT_TRACE"])):
        await RisingEdge(dut.clk)
        await ReadOnly()
        vals = []
        for path in os.environ.get("ELMOE_EXT_SIGS", "cmd__ready,m_axi_arvalid").split(","):
            h = dut
            for part in path.split("."):
                h = getattr(h, part)
            vals.append(f"{path}={h.value}")
        dut._log.info("%d %s", tb.counter.cycle, " ".join(vals))

"""cocotb testbench: external-memory stream engine against the golden split
(:func:`elmoe3d.golden.hb_map.split_command`), with cocotbext-axi's
``AxiRamRead`` as the LPDDR.

LPDDR model. :class:`Lpddr` is cocotbext-axi's :class:`AxiRamRead` (its
memory, AR sink and R source, bound with ``AxiReadBus.from_prefix(dut,
"m_axi")``) with the burst process replaced: the stock model serves one burst
at a time with no latency and can only signal SLVERR (by a failing read), so
the subclass accepts many bursts, offers each burst's first beat no earlier
than ``latency`` cycles after its AR handshake, and injects SLVERR or DECERR
on one random beat of a random burst. Random pauses on AR (``arready``) and R
(``rvalid``) come from cocotbext-axi's pause generators.

Scoreboard. Every AR is checked against the golden burst list (an aborted
command's ARs must be a prefix of it that includes the failing burst, at most
``max_outstanding`` bursts past it); every PE beat, HB fill beat and response
against the golden split of each command given where its first error beat
was. Parameters come from ``$ELMOE_PARAMS`` (``{"ext": ..., "hb": ...}`` for
the engine + HB pair, else the engine's own). Knobs: ``ELMOE_EXT_CMDS``
(commands in the random test, default 120), ``ELMOE_EXT_LATENCY`` (default
20), ``ELMOE_EXT_ERR`` (error probability per burst, default 0.05),
``ELMOE_MEASURE_OUT``, ``ELMOE_GOLDEN_MUTATION``.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import cocotb
from cocotb.queue import Queue
from cocotb.triggers import ReadOnly, RisingEdge
from cocotbext.axi import AxiReadBus, AxiRamRead
from cocotbext.axi.constants import AxiResp

from ..golden.hb_map import ExpertLayout, HBMap, HBModel, bursts, split_command
from ..hw.ext_stream import ext_cmd_layout, ext_rsp_layout, pe_beat_layout
from ..hw.hb_bank import fill_layout, read_beat_layout, read_cmd_layout
from .common import (CycleCounter, StreamSink, StreamSource, golden_mutation, knob, params,
                     rng, start_clock_and_reset)

MEM_BYTES = 1 << 16


class Lpddr(AxiRamRead):
    """AxiRamRead with read latency, many bursts in flight and error injection.

    ``records`` lists every burst served: ``(cycle, addr, len, error_beat,
    resp)`` with ``error_beat`` ``None`` for a clean burst."""

    def __init__(self, bus, clock, counter, *, size, latency, rand, err_prob=0.0):
        self.counter, self.latency, self.rand, self.err_prob = counter, latency, rand, err_prob
        self.records = []
        self._accepted = Queue()
        super().__init__(bus, clock, None, size=size)
        self.ar_channel.queue_occupancy_limit = 64
        self.r_channel.queue_occupancy_limit = 4

    async def _accept(self):
        while True:
            ar = await self.ar_channel.recv()
            await self._accepted.put((self.counter.cycle, ar))

    async def _process_read(self):
        cocotb.start_soon(self._accept())
        while True:
            t0, ar = await self._accepted.get()
            arid, addr = int(ar.arid), int(ar.araddr)
            length, size = int(ar.arlen) + 1, int(ar.arsize)
            assert int(ar.arburst) == 1, f"burst type {int(ar.arburst)} is not INCR"
            assert 2 ** size == self.byte_lanes, f"arsize {size} is not the full bus"
            assert addr % self.byte_lanes == 0, f"unaligned burst address {addr:#x}"
            assert (addr % 4096) + length * self.byte_lanes <= 4096, \
                f"burst at {addr:#x} of {length} beats crosses 4 KiB"
            err_beat, resp = None, AxiResp.OKAY
            if self.err_prob and self.rand.random() < self.err_prob:
                err_beat = self.rand.randrange(length)
                resp = self.rand.choice((AxiResp.SLVERR, AxiResp.DECERR))
            self.records.append((t0, addr, length, err_beat, int(resp)))
            while self.counter.cycle < t0 + self.latency:
                await RisingEdge(self.clock)
            for n in range(length):
                r = self.r_channel._transaction_obj()
                r.rid = arid
                r.rlast = int(n == length - 1)
                r.rresp = int(resp) if n == err_beat else int(AxiResp.OKAY)
                data = self.read(addr + n * self.byte_lanes, self.byte_lanes)
                r.rdata = int.from_bytes(data, "little")
                await self.r_channel.send(r)


def _pause(rand, prob):
    if not prob:
        return None
    return (rand.random() < prob for _ in itertools.count())


class ExtTB:
    def __init__(self, dut, *, idle=0.0, backpressure=0.0, axi_pause=0.0, latency=None,
                 err_prob=None):
        self.dut = dut
        raw = params()
        self.pair = "ext" in raw
        self.p = raw["ext"] if self.pair else raw
        self.hbp = raw.get("hb")
        p = self.p
        self.lay = ExpertLayout(slice_bits=p["slice_bits"], lanes=p["lanes"], banks=p["banks"],
                                rows=p["rows"], hb_planes=p["hb_planes"],
                                data_bits=p["data_bits"], max_burst=p["max_burst"])
        self.rand = rng()
        self.idle, self.bp, self.axi_pause = idle, backpressure, axi_pause
        self.latency = knob("ext_latency", 20) if latency is None else latency
        self.err_prob = knob("ext_err", 0.05) if err_prob is None else err_prob
        self.mutate = golden_mutation()
        self.cmds = []
        self.seq = 0
        self.last_region = None

    async def start(self):
        d = self.dut
        await start_clock_and_reset(d)
        self.counter = c = CycleCounter(d.clk)
        r = self.rand
        p, lay = self.p, self.lay
        self.ram = Lpddr(AxiReadBus.from_prefix(d, "m_axi"), d.clk, c, size=MEM_BYTES,
                         latency=self.latency, rand=r, err_prob=self.err_prob)
        self.ram.write(0, bytes(r.getrandbits(8) for _ in range(MEM_BYTES)))
        self.ram.ar_channel.set_pause_generator(_pause(r, self.axi_pause))
        self.ram.r_channel.set_pause_generator(_pause(r, self.axi_pause))
        self.cmd = StreamSource(d, "cmd", ext_cmd_layout(p["addr_bits"], lay.planes, p["slots"],
                                                         p["cmd_id_bits"]),
                                d.clk, c, idle=self.idle, rand=r)
        self.rsp = StreamSink(d, "rsp", ext_rsp_layout(p["slots"], p["cmd_id_bits"]), d.clk, c,
                              backpressure=self.bp, rand=r)
        self.pe = StreamSink(d, "pe", pe_beat_layout(lay.sv_bits, lay.fill_words, lay.planes,
                                                     p["rows"], p["banks"], p["cmd_id_bits"]),
                             d.clk, c, backpressure=self.bp, rand=r)
        self.flayout = fill_layout(lay.sv_bits, lay.fill_words, p["slots"], p["hb_planes"],
                                   p["rows"], p["banks"])
        if not self.pair:
            self.fill = StreamSink(d, "fill", self.flayout, d.clk, c, backpressure=self.bp, rand=r)
        else:
            hb = self.hbp
            self.hbmap = HBMap(banks=hb["banks"], words=hb["words"], slots=hb["slots"],
                               planes=hb["planes"], sv_bits=lay.sv_bits)
            self.rd_cmd = [StreamSource(d, f"rd_cmd__{b}",
                                        read_cmd_layout(hb["slots"], hb["planes"],
                                                        self.hbmap.slot_words), d.clk, c, rand=r)
                           for b in range(hb["banks"])]
            self.rd = [StreamSink(d, f"rd__{b}", read_beat_layout(lay.sv_bits, hb["planes"],
                                                                  self.hbmap.rows),
                                  d.clk, c, backpressure=self.bp, rand=r)
                       for b in range(hb["banks"])]
            for name in ("kv__valid", "boundary__valid"):
                getattr(d, name).value = 0
            for name in ("kv_rsp__ready", "moved__ready"):
                getattr(d, name).value = 1

    # -- stimulus ------------------------------------------------------------
    def expert_base(self):
        """A base in a region of three experts (never the previous command's
        region, so consecutive commands never share addresses); regions are
        not 4 KiB aligned, so about a third of the experts cross a 4 KiB
        boundary. One in ten bases has low bits below a beat (ignored)."""
        region = 3 * self.lay.expert_bytes
        nreg = MEM_BYTES // region
        while True:
            reg = self.rand.randrange(nreg)
            if reg != self.last_region:
                break
        self.last_region = reg
        off = self.rand.randrange(0, region - self.lay.expert_bytes + 1, self.lay.beat_bytes)
        base = reg * region + off
        if self.rand.random() < 0.1:
            base += self.rand.randrange(self.lay.beat_bytes)
        return base

    def command(self, planes, fill, slot, base=None):
        c = {"addr": self.expert_base() if base is None else base, "planes": planes,
             "fill": int(fill), "slot": slot, "id": self.seq % (1 << self.p["cmd_id_bits"])}
        self.seq += 1
        self.cmds.append(c)
        self.cmd.send([c])
        return c

    def random_command(self, slots=None):
        r, n, k = self.rand, self.lay.planes, self.lay.hb_planes
        kind = r.random()
        full = (1 << n) - 1
        if kind < 0.35:          # miss being cached: all planes to PEs + MSB planes to HB
            planes, fill = full, True
        elif kind < 0.6:         # hit: only the LSB planes
            planes, fill = full & ~((1 << k) - 1), False
        elif kind < 0.75:        # miss, not cached
            planes, fill = full, False
        elif kind < 0.85:        # prefetch: MSB planes into HB only
            planes, fill = 0, True
        else:
            planes, fill = r.randrange(1, full + 1), r.random() < 0.5
        slot = r.choice(slots) if slots else r.randrange(self.p["slots"])
        return self.command(planes, fill, slot)

    # -- checking --------------------------------------------------------------
    async def drain(self, timeout=500_000):
        start = self.counter.cycle
        while not (self.cmd.empty() and len(self.rsp.received) >= len(self.cmds)):
            await RisingEdge(self.dut.clk)
            if self.counter.cycle - start > timeout:
                raise AssertionError(f"timeout (seed {cocotb.RANDOM_SEED}): "
                                     f"{len(self.rsp.received)} of {len(self.cmds)} responses")
        for _ in range(30):
            await RisingEdge(self.dut.clk)

    def golden(self):
        """Golden PE beats, fill beats and responses for every command, from
        the bursts the LPDDR model actually served and where it injected errors."""
        recs = self.ram.records
        k = 0
        exp_pe, exp_fill, exp_rsp, errors = [], [], [], []
        mem = self.ram.mem
        for ci, c in enumerate(self.cmds):
            g = bursts(self.lay, c["addr"], c["planes"], bool(c["fill"]))
            err_beat, beats_before, err_burst = None, 0, None
            i = 0
            while i < len(g) and k < len(recs) and (recs[k][1], recs[k][2]) == (g[i]["addr"],
                                                                                 g[i]["len"]):
                if err_beat is None and recs[k][3] is not None:
                    err_beat, err_burst = beats_before + recs[k][3], i
                beats_before += g[i]["len"]
                i += 1
                k += 1
            if err_burst is None and i != len(g):
                errors.append(f"command {ci} {c}: {i} of {len(g)} bursts issued, no error; "
                              f"next AR {recs[k][1:3] if k < len(recs) else None}, "
                              f"golden {g[i]}")
                break
            if err_burst is not None and i - err_burst - 1 > self.p["max_outstanding"]:
                errors.append(f"command {ci}: {i - err_burst - 1} bursts issued after the "
                              f"failing one (abort too late)")
            pe, fl, rsp = split_command(self.lay, mem, c, err_beat)
            exp_pe += pe
            exp_fill += fl
            exp_rsp.append(rsp)
        if k != len(recs) and not errors:
            errors.append(f"{len(recs) - k} ARs not belonging to any command, first {recs[k]}")
        if self.mutate:
            for x in exp_pe:
                x["data"][0] ^= 1
        return exp_pe, exp_fill, exp_rsp, errors

    def check(self):
        exp_pe, exp_fill, exp_rsp, errors = self.golden()

        def cmp(name, sink, exp):
            got = [x for _, x in sink.received]
            if len(got) != len(exp):
                errors.append(f"{name}: {len(got)} items, expected {len(exp)}")
            for i, (a, e) in enumerate(zip(got, exp)):
                if a != e:
                    errors.append(f"{name}[{i}]: got {a}, expected {e}")
                    break
            errors.extend(f"{name} stream rule at {c}: {m}" for c, m in sink.rule_violations)
        cmp("pe", self.pe, exp_pe)
        cmp("rsp", self.rsp, exp_rsp)
        if not self.pair:
            cmp("fill", self.fill, exp_fill)
        if errors:
            raise AssertionError(f"{len(errors)} mismatches (seed {cocotb.RANDOM_SEED}): "
                                 + "; ".join(errors[:6]))
        return exp_fill


@cocotb.test()
async def random_commands(dut):
    """Random hit / miss / prefetch commands, latency, random back-pressure on
    every stream and both AXI channels, SLVERR/DECERR on random bursts."""
    tb = ExtTB(dut, idle=0.3, backpressure=0.3, axi_pause=0.2)
    await tb.start()
    for _ in range(knob("ext_cmds", 120)):
        tb.random_command()
    await tb.drain()
    tb.check()
    nerr = sum(1 for r in tb.ram.records if r[3] is not None)
    failed = sum(1 for _, x in tb.rsp.received if not x["ok"])
    dut._log.info("random_commands: %d commands, %d bursts, %d error bursts, %d failed commands, "
                  "%d PE beats", len(tb.cmds), len(tb.ram.records), nerr, failed,
                  len(tb.pe.received))
    if tb.err_prob >= 0.05 and len(tb.cmds) >= 50:
        assert failed > 0, "no command failed: error injection did not happen"


@cocotb.test()
async def error_never_resident(dut):
    """Engine + HB bank: fills with injected AXI errors, then read back every
    slot. A slot is resident exactly when its last fill succeeded, and every
    resident slot holds exactly that expert's MSB planes."""
    tb = ExtTB(dut, idle=0.2, backpressure=0.2, axi_pause=0.1, err_prob=0.3)
    assert tb.pair, "error_never_resident needs the engine + HB bank build (ExtHBPair)"
    await tb.start()
    slots = tb.hbp["slots"]
    n = knob("ext_cmds", 120) // 2
    for _ in range(n):
        r = tb.rand.random()
        planes = 0 if r < 0.5 else (1 << tb.lay.planes) - 1
        tb.command(planes, True, tb.rand.randrange(slots))
    await tb.drain()
    exp_fill = tb.check()
    g = HBModel(tb.hbmap)
    for it in exp_fill:
        g.fill(it["kind"], it["slot"], it["plane"], it["row"], it["bank"], it["data"])
    await ReadOnly()
    valid = tb.dut.slot_valid.value.to_unsigned()
    await RisingEdge(dut.clk)
    # the golden valid bits come from the golden split; check against the
    # responses too: resident iff the last fill of the slot succeeded
    last = {}
    for _, x in tb.rsp.received:
        last[x["slot"]] = x["resident"]
    exp_valid = sum(1 << s for s, v in last.items() if v)
    assert valid == g.valid == exp_valid, \
        f"slot_valid {valid:#x}, golden {g.valid:#x}, from responses {exp_valid:#x}"
    sw = tb.hbmap.slot_words
    for b in range(tb.hbp["banks"]):
        tb.rd_cmd[b].send([{"slot": s, "plane": 0, "len": sw - 1} for s in range(slots)])
    total = slots * sw
    while not all(len(s.received) >= total for s in tb.rd):
        await RisingEdge(dut.clk)
    bad = []
    for b, s in enumerate(tb.rd):
        exp = []
        for slot in range(slots):
            exp += g.read(b, slot, 0, sw - 1)
        got = [x for _, x in s.received]
        for i, (a, e) in enumerate(zip(got, exp)):
            slot = i // sw
            if (valid >> slot) & 1 and a != e:
                bad.append(f"bank {b} slot {slot} word {i % sw}: {a} != {e}")
    # failing fills did leave partial data behind in a non-resident slot
    failed = sum(1 for _, x in tb.rsp.received if not x["ok"])
    dut._log.info("error_never_resident: %d fills, %d failed, resident %#x", n, failed, valid)
    assert not bad, f"resident slot with wrong data (seed {cocotb.RANDOM_SEED}): {bad[:4]}"
    assert failed > 0, "no fill failed: error injection did not happen"


@cocotb.test()
async def bandwidth(dut):
    """R beats per cycle vs the bus peak (1 beat/cycle) at read latencies 10,
    50 and 100 cycles, PE-only and miss-with-fill streams, outputs always
    ready, no errors."""
    tb = ExtTB(dut, err_prob=0.0, latency=10)
    await tb.start()
    figures = {}
    n_cmds = knob("ext_bw_cmds", 24)
    full = (1 << tb.lay.planes) - 1
    for lat in (10, 50, 100):
        for name, planes, fill in (("pe_only", full, False), ("miss_with_fill", full, True)):
            tb.ram.latency = lat
            r0, b0, c0 = len(tb.ram.records), len(tb.pe.received), len(tb.cmd.sent)
            monitor = []

            async def mon():
                while True:
                    await RisingEdge(dut.clk)
                    await ReadOnly()
                    if dut.m_axi_rvalid.value and dut.m_axi_rready.value:
                        monitor.append(tb.counter.cycle)
            task = cocotb.start_soon(mon())
            t_start = tb.counter.cycle
            for _ in range(n_cmds):
                tb.command(planes, fill, 0)
            await tb.drain()
            task.cancel()
            beats = len(monitor)
            span = monitor[-1] - monitor[0] + 1
            first_ar = tb.ram.records[r0][0]
            fig = {"latency": lat, "beats": beats, "bursts": len(tb.ram.records) - r0,
                   "beats_per_cycle_steady": beats / span,
                   "beats_per_cycle_incl_first_latency": beats / (monitor[-1] - first_ar + 1),
                   "first_beat_after_ar": monitor[0] - first_ar,
                   "first_ar_after_cmd": first_ar - tb.cmd.sent[c0][0],
                   "pe_beat_after_r": tb.pe.received[b0][0] - monitor[0],
                   "cycles_from_first_command": monitor[-1] - t_start + 1,
                   "pe_beats": len(tb.pe.received) - b0}
            figures[f"{name}_lat{lat}"] = fig
            dut._log.info("bandwidth %s lat %d: %s", name, lat, fig)
    tb.check()
    out = os.environ.get("ELMOE_MEASURE_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"params": tb.p, "bus_peak_beats_per_cycle": 1.0,
                                         "figures": figures}, indent=2))


class FaultyLpddr(Lpddr):
    """Lpddr whose first burst carries one fault (issue 10, defect 3):
    ``slverr`` (SLVERR on beat 3), ``early_rlast`` (RLAST on beat 2 as well),
    ``missing_rlast`` (no RLAST on the last beat), ``bad_rid`` (RID 1 on beat
    1), ``exokay`` (EXOKAY on beat 1)."""

    def __init__(self, *args, fault, **kw):
        self.fault, self.faulted = fault, False
        super().__init__(*args, **kw)

    async def _process_read(self):
        cocotb.start_soon(self._accept())
        while True:
            t0, ar = await self._accepted.get()
            addr, length = int(ar.araddr), int(ar.arlen) + 1
            self.records.append((t0, addr, length, None, 0))
            fault, self.faulted = (None if self.faulted else self.fault), True
            for n in range(length):
                r = self.r_channel._transaction_obj()
                r.rid = 1 if (fault == "bad_rid" and n == 1) else int(ar.arid)
                r.rlast = int(n == length - 1)
                if fault == "early_rlast" and n == 2:
                    r.rlast = 1
                if fault == "missing_rlast" and n == length - 1:
                    r.rlast = 0
                r.rresp = int(AxiResp.OKAY)
                if fault == "slverr" and n == 3:
                    r.rresp = int(AxiResp.SLVERR)
                if fault == "exokay" and n == 1:
                    r.rresp = int(AxiResp.EXOKAY)
                r.rdata = int.from_bytes(self.read(addr + n * self.byte_lanes, self.byte_lanes),
                                         "little")
                await self.r_channel.send(r)


@cocotb.test()
async def defect3(dut):
    """Issue 10, defect 3, on the engine's ports: a failed command's PE stream
    must end with a ``last`` beat; a wrong RLAST, an unexpected RID and EXOKAY
    must fail the command; a command outside the LPDDR window must not be
    issued; the next command must be unaffected."""
    fault = os.environ["ELMOE_EXT_DEFECT"]
    tb = ExtTB(dut, err_prob=0.0)
    await start_clock_and_reset(dut)
    tb.counter = c = CycleCounter(dut.clk)
    p, lay = tb.p, tb.lay
    tb.ram = FaultyLpddr(AxiReadBus.from_prefix(dut, "m_axi"), dut.clk, c, size=MEM_BYTES,
                         latency=5, rand=tb.rand, fault=fault if fault != "range" else None)
    tb.ram.write(0, bytes(tb.rand.getrandbits(8) for _ in range(MEM_BYTES)))
    tb.cmd = StreamSource(dut, "cmd", ext_cmd_layout(p["addr_bits"], lay.planes, p["slots"],
                                                     p["cmd_id_bits"]), dut.clk, c)
    tb.rsp = StreamSink(dut, "rsp", ext_rsp_layout(p["slots"], p["cmd_id_bits"]), dut.clk, c)
    tb.pe = StreamSink(dut, "pe", pe_beat_layout(lay.sv_bits, lay.fill_words, lay.planes,
                                                 p["rows"], p["banks"], p["cmd_id_bits"]),
                       dut.clk, c)
    tb.fill = StreamSink(dut, "fill", fill_layout(lay.sv_bits, lay.fill_words, p["slots"],
                                                  p["hb_planes"], p["rows"], p["banks"]),
                         dut.clk, c)
    full = (1 << lay.planes) - 1
    first = tb.command(full, True, 1, base=MEM_BYTES if fault == "range" else 0)
    for _ in range(2000):
        await RisingEdge(dut.clk)
    rsp = [x for _, x in tb.rsp.received]
    pe = [x for _, x in tb.pe.received]
    if fault == "range":
        assert not any(r[1] >= MEM_BYTES for r in tb.ram.records), \
            "a command outside the LPDDR window was issued"
    else:
        assert rsp and rsp[0]["ok"] == 0, f"{fault}: command not failed: {rsp}"
        assert pe and pe[-1]["last"] == 1, f"{fault}: failed command's PE stream has no last beat"
    # the next command is unaffected
    n_pe = len(pe)
    tb.command(full, False, 2, base=4 * lay.expert_bytes)
    for _ in range(3000):
        await RisingEdge(dut.clk)
    exp_pe, _, exp_rsp = split_command(lay, tb.ram.mem, tb.cmds[-1])
    got = [x for _, x in tb.pe.received][n_pe:]
    assert got == exp_pe and [x for _, x in tb.rsp.received][-1] == exp_rsp, \
        f"{fault}: the next command was affected"
    del first

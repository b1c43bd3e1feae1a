"""cocotb testbench: HB bank controller against the golden HB model
(:class:`elmoe3d.golden.hb_map.HBModel`), word for word and event for event.

Every accepted transfer (read command, fill beat, KV access, boundary write)
is recorded with its cycle; afterwards the events are replayed through the
golden model in acceptance order (same cycle: boundary, KV, read, fill — the
controller's documented order) and every PE read word, KV response and
boundary report must equal the golden one. A final sweep reads back every
slot of every bank and every KV word, so every byte written is checked.

Parameters come from the harness (``$ELMOE_PARAMS``, :func:`hb_params`).
Knobs: ``ELMOE_HB_OPS`` (operations per stream in the random test, default
300), ``ELMOE_MEASURE_OUT`` (JSON for the bandwidth figures),
``ELMOE_GOLDEN_MUTATION``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from ..golden.hb_map import FillKind, HBMap, HBModel
from ..hw.hb_bank import (fill_layout, kv_cmd_layout, kv_rsp_layout, moved_layout,
                          read_beat_layout, read_cmd_layout)
from .common import (CycleCounter, StreamSink, StreamSource, golden_mutation, knob, params,
                     rng, start_clock_and_reset)

# same-cycle order of acceptance events in the controller
PRIO = {"boundary": 0, "kv": 1, "read": 2, "fill": 3}


class HBTB:
    def __init__(self, dut, *, idle=0.0, backpressure=0.0, pe_backpressure=None):
        self.dut = dut
        self.p = params()
        p = self.p
        self.map = HBMap(banks=p["banks"], words=p["words"], slots=p["slots"],
                         planes=p["planes"], sv_bits=p["lanes"] * p["slice_bits"])
        self.B, self.S, self.W = p["banks"], p["slots"], p["words"]
        self.SW, self.R, self.K = self.map.slot_words, self.map.rows, p["planes"]
        self.FW = p["fill_words"]
        self.sv = self.map.sv_bits
        self.rand = rng()
        self.idle, self.bp = idle, backpressure
        self.pe_bp = backpressure if pe_backpressure is None else pe_backpressure
        self.mutate = golden_mutation()
        self.n_read_beats = [0] * self.B
        self.n_kv = 0
        self.n_moves = 0

    async def start(self):
        d = self.dut
        await start_clock_and_reset(d)
        self.counter = c = CycleCounter(d.clk)
        r = self.rand
        self.rd_cmd = [StreamSource(d, f"rd_cmd__{b}", read_cmd_layout(self.S, self.K, self.SW),
                                    d.clk, c, idle=self.idle, rand=r) for b in range(self.B)]
        self.rd = [StreamSink(d, f"rd__{b}", read_beat_layout(self.sv, self.K, self.R), d.clk, c,
                              backpressure=self.pe_bp, rand=r) for b in range(self.B)]
        self.fill = StreamSource(d, "fill", fill_layout(self.sv, self.FW, self.S, self.K, self.R,
                                                        self.B), d.clk, c, idle=self.idle, rand=r)
        self.kv = StreamSource(d, "kv", kv_cmd_layout(self.sv, self.B, self.W), d.clk, c,
                               idle=self.idle, rand=r)
        self.kv_rsp = StreamSink(d, "kv_rsp", kv_rsp_layout(self.sv), d.clk, c,
                                 backpressure=self.bp, rand=r)
        self.bnd = StreamSource(d, "boundary", self.W.bit_length(), d.clk, c, rand=r)
        self.moved = StreamSink(d, "moved", moved_layout(self.W, self.S), d.clk, c,
                                backpressure=self.bp, rand=r)

    # -- stimulus ------------------------------------------------------------
    def rword(self):
        return self.rand.getrandbits(self.sv)

    def read(self, bank, slot, plane, length):
        self.rd_cmd[bank].send([{"slot": slot, "plane": plane, "len": length}])
        self.n_read_beats[bank] += length + 1

    def random_read(self, bank):
        r = self.rand
        slot = r.randrange(self.S)
        plane = r.randrange(self.K)
        room = self.SW - plane * self.R
        length = room - 1 if r.random() < 0.3 else r.randrange(room)
        if r.random() < 0.04:                      # reaches past the slot: error beats
            length = min(self.SW - 1, room + r.randrange(2))
        self.read(bank, slot, plane, length)

    def fill_beats(self, slot, *, abort_after=None, kind_end=FillKind.COMMIT):
        beats = []
        for plane in range(self.K):
            for row in range(self.R):
                for g in range(0, self.B, self.FW):
                    beats.append({"kind": int(FillKind.DATA), "slot": slot, "plane": plane,
                                  "row": row, "bank": g,
                                  "data": [self.rword() for _ in range(self.FW)]})
        if abort_after is not None:
            beats = beats[:abort_after]
        beats.append({"kind": int(kind_end), "slot": slot, "plane": 0, "row": 0, "bank": 0,
                      "data": [0] * self.FW})
        return beats

    def random_fill(self, slots=None):
        r = self.rand
        slot = r.choice(slots) if slots else r.randrange(self.S)
        if r.random() < 0.15:
            n = self.K * self.R * (self.B // self.FW)
            return self.fill_beats(slot, abort_after=r.randrange(n), kind_end=FillKind.ABORT)
        return self.fill_beats(slot)

    def kv_op(self, write, bank, addr, data=0):
        self.kv.send([{"write": int(write), "bank": bank, "addr": addr, "data": data}])
        self.n_kv += 1

    def move(self, value):
        self.bnd.send([value])
        self.n_moves += 1

    # -- checking --------------------------------------------------------------
    def sources(self):
        return self.rd_cmd + [self.fill, self.kv, self.bnd]

    async def drain(self, timeout=400_000):
        start = self.counter.cycle
        while True:
            done = (all(s.empty() for s in self.sources())
                    and all(len(self.rd[b].received) >= self.n_read_beats[b] for b in range(self.B))
                    and len(self.kv_rsp.received) >= self.n_kv
                    and len(self.moved.received) >= self.n_moves)
            if done:
                break
            await RisingEdge(self.dut.clk)
            if self.counter.cycle - start > timeout:
                raise AssertionError(
                    f"timeout (seed {cocotb.RANDOM_SEED}): read beats "
                    f"{[len(s.received) for s in self.rd]} of {self.n_read_beats}, kv "
                    f"{len(self.kv_rsp.received)}/{self.n_kv}, moves "
                    f"{len(self.moved.received)}/{self.n_moves}, sources empty "
                    f"{[s.empty() for s in self.sources()]}")
        for _ in range(20):                        # fill FIFO drains, nothing extra arrives
            await RisingEdge(self.dut.clk)

    def events(self):
        ev = []
        for cyc, item in self.bnd.sent:
            ev.append((cyc, PRIO["boundary"], 0, "boundary", item))
        for cyc, item in self.kv.sent:
            ev.append((cyc, PRIO["kv"], 0, "kv", item))
        for b, src in enumerate(self.rd_cmd):
            for cyc, item in src.sent:
                ev.append((cyc, PRIO["read"], b, "read", item))
        for cyc, item in self.fill.sent:
            ev.append((cyc, PRIO["fill"], 0, "fill", item))
        ev.sort(key=lambda e: (e[0], e[1], e[2]))
        return ev

    def replay(self):
        """Golden replay of every accepted event; returns the golden model
        and the expected output streams."""
        g = HBModel(self.map)
        exp_rd = [[] for _ in range(self.B)]
        exp_kv, exp_moved = [], []
        self.read_src = [[] for _ in range(self.B)]     # (cycle, command) of each expected word
        for cyc, _, b, kind, it in self.events():
            if kind == "boundary":
                cov, inv = g.move_boundary(it)
                exp_moved.append({"boundary": it, "covered": cov, "invalidated": inv})
            elif kind == "kv":
                dat, err = g.kv(it["write"], it["bank"], it["addr"], it["data"])
                exp_kv.append({"data": dat, "error": err})
            elif kind == "read":
                exp_rd[b].extend(g.read(b, it["slot"], it["plane"], it["len"]))
                self.read_src[b].extend([(cyc, it)] * (it["len"] + 1))
            else:
                g.fill(it["kind"], it["slot"], it["plane"], it["row"], it["bank"], it["data"])
        if self.mutate:
            for beats in exp_rd:
                for x in beats:
                    x["data"] ^= 1
            for x in exp_kv:
                x["data"] ^= 1
        return g, exp_rd, exp_kv, exp_moved

    async def check(self):
        g, exp_rd, exp_kv, exp_moved = self.replay()
        errors = []

        def cmp(name, got, exp, src=None):
            got = [x for _, x in got]
            if len(got) != len(exp):
                errors.append(f"{name}: {len(got)} items, expected {len(exp)}")
            for i, (a, e) in enumerate(zip(got, exp)):
                if a != e:
                    where = f" (read command {src[i]})" if src else ""
                    errors.append(f"{name}[{i}]: got {a}, expected {e}{where}")
                    break
        for b in range(self.B):
            cmp(f"rd{b}", self.rd[b].received, exp_rd[b], self.read_src[b])
            errors += [f"rd{b} stream rule at {c}: {m}" for c, m in self.rd[b].rule_violations]
        cmp("kv_rsp", self.kv_rsp.received, exp_kv)
        cmp("moved", self.moved.received, exp_moved)
        errors += [f"kv_rsp stream rule at {c}: {m}" for c, m in self.kv_rsp.rule_violations]
        errors += [f"moved stream rule at {c}: {m}" for c, m in self.moved.rule_violations]
        await ReadOnly()
        sv = self.dut.slot_valid.value.to_unsigned()
        bq = self.dut.boundary_q.value.to_unsigned()
        if sv != g.valid:
            errors.append(f"slot_valid {sv:#x}, golden {g.valid:#x}")
        if bq != g.boundary:
            errors.append(f"boundary {bq}, golden {g.boundary}")
        if errors:
            raise AssertionError(f"{len(errors)} mismatches (seed {cocotb.RANDOM_SEED}): "
                                 + "; ".join(errors[:6]))
        return g

    async def sweep(self):
        """Read back every slot of every bank and every KV word (golden-checked
        by the next :meth:`check`)."""
        await RisingEdge(self.dut.clk)
        for b in range(self.B):
            for slot in range(self.S):
                self.read(b, slot, 0, self.SW - 1)
        bnd = self.dut.boundary_q.value.to_unsigned()
        for b in range(self.B):
            for a in range(min(bnd + 1, self.W)):
                self.kv_op(False, b, a)
        await self.drain()


@cocotb.test()
async def random_traffic(dut):
    """Random reads, fills (with aborts), KV accesses and boundary moves,
    all at once, with random idle cycles and back-pressure on every stream;
    then a full read-back sweep."""
    tb = HBTB(dut, idle=0.3, backpressure=0.3)
    await tb.start()
    r = tb.rand
    ops = knob("hb_ops", 300)
    for _ in range(ops):
        for b in range(tb.B):
            tb.random_read(b)
        if r.random() < 0.35:
            tb.fill.send(tb.random_fill())
        if r.random() < 0.5:
            bank = r.randrange(tb.B)
            addr = r.randrange(tb.W // 2)
            tb.kv_op(r.random() < 0.6, bank, addr, tb.rword())
    # boundary moves in the middle of the traffic
    for _ in range(max(4, ops // 25)):
        for _ in range(r.randrange(50, 400)):
            await RisingEdge(dut.clk)
        choice = r.random()
        if choice < 0.4:
            v = r.randrange(0, tb.W // 2 + 1)
        elif choice < 0.8:
            v = tb.SW * r.randrange(0, tb.S // 2 + 1)
        else:
            v = r.randrange(0, tb.W + 1)
        tb.move(v)
    await tb.drain()
    await tb.check()
    tb.move(tb.SW * r.randrange(0, tb.S // 2))     # final map for the sweep
    await tb.drain()
    await tb.sweep()
    g = await tb.check()
    _, exp_rd, exp_kv, exp_moved = tb.replay()
    cover = {"moves_invalidating": sum(1 for x in exp_moved if x["invalidated"]),
             "error_read_words": sum(x["error"] for beats in exp_rd for x in beats),
             "refused_kv": sum(x["error"] for x in exp_kv),
             "aborted_fills": sum(1 for _, x in tb.fill.sent if x["kind"] == FillKind.ABORT),
             "fill_stall_cycles": tb.fill.stalls,
             "read_cmd_stall_cycles": sum(s.stalls for s in tb.rd_cmd)}
    dut._log.info("random_traffic coverage: %s", cover)
    assert cover["aborted_fills"] and cover["error_read_words"], cover
    assert cover["fill_stall_cycles"], cover
    dut._log.info("random_traffic: %d read words, %d fill beats, %d KV ops, %d moves, "
                  "final valid %#x boundary %d", sum(tb.n_read_beats), len(tb.fill.sent),
                  tb.n_kv, tb.n_moves, g.valid, g.boundary)


@cocotb.test()
async def torn_expert(dut):
    """A fill of the slot that PEs are reading: every read returns either the
    whole old or the whole new expert, and a read that starts during the
    fill waits for it. The PEs take a word in only 15% of the cycles, so a
    fill written as soon as banks are free would overtake the reads."""
    tb = HBTB(dut, pe_backpressure=0.85)
    await tb.start()
    slot = 1 % tb.S
    tb.fill.send(tb.fill_beats(slot))
    await tb.drain()
    for _ in range(6):
        for b in range(tb.B):
            tb.read(b, slot, 0, tb.SW - 1)
        tb.fill.send(tb.fill_beats(slot))
        for b in range(tb.B):
            tb.read(b, slot, 0, tb.SW - 1)
        for _ in range(tb.rand.randrange(0, 40)):
            await RisingEdge(dut.clk)
    await tb.drain()
    g = await tb.check()
    # every read returned one whole expert: compare with the fills' contents
    versions = [[None] * tb.B]
    cur = [[0] * tb.SW for _ in range(tb.B)]
    for _, beats in [(None, [it for _, it in tb.fill.sent])]:
        for it in beats:
            if it["kind"] == FillKind.DATA:
                a = tb.map.addr(it["slot"], it["plane"], it["row"]) - tb.map.slot_base(slot)
                for i, w in enumerate(it["data"]):
                    cur[it["bank"] + i][a] = w
            elif it["kind"] == FillKind.COMMIT:
                versions.append([list(x) for x in cur])
    for b in range(tb.B):
        got = [x["data"] for _, x in tb.rd[b].received]
        for k in range(0, len(got), tb.SW):
            block = got[k:k + tb.SW]
            assert any(v[b] == block for v in versions[1:]), f"bank {b}: torn read {k // tb.SW}"
    assert (g.valid >> slot) & 1


@cocotb.test()
async def bandwidth(dut):
    """Words per cycle per bank: PE reads alone, PE reads with concurrent
    fills (readers always ready), and with PEs taking half the cycles."""
    figures = {}
    tb = HBTB(dut)
    await tb.start()
    n_cmds = knob("hb_bw_cmds", 24)
    half = max(1, tb.S // 2)

    async def phase(name, fills, pe_bp):
        for s in tb.rd:
            s.backpressure = pe_bp
        first = [len(s.received) for s in tb.rd]
        cfirst = [len(s.sent) for s in tb.rd_cmd]
        ffirst = len(tb.fill.sent)
        for b in range(tb.B):
            for i in range(n_cmds):
                tb.read(b, i % half, 0, tb.SW - 1)
        if fills:
            for i in range(n_cmds * tb.B):
                tb.fill.send(tb.fill_beats(half + i % (tb.S - half)))
        await RisingEdge(dut.clk)
        t0 = tb.counter.cycle
        while not all(len(s.received) >= tb.n_read_beats[b] for b, s in enumerate(tb.rd)):
            await RisingEdge(dut.clk)
        t1 = tb.counter.cycle
        per_bank = []
        for b, s in enumerate(tb.rd):
            got = s.received[first[b]:]
            span = got[-1][0] - got[0][0] + 1
            per_bank.append(len(got) / span)
        fill_beats = [c for c, _ in tb.fill.sent[ffirst:] if t0 <= c <= t1]
        latency = [tb.rd[b].received[first[b]][0] - tb.rd_cmd[b].sent[cfirst[b]][0]
                   for b in range(tb.B)]
        fig = {"words_per_cycle_per_bank": min(per_bank), "per_bank": per_bank,
               "first_word_latency_cycles": max(latency),
               "fill_beats_accepted_per_cycle": len(fill_beats) / max(1, t1 - t0),
               "fill_words_per_cycle": len(fill_beats) * tb.FW / max(1, t1 - t0),
               "pe_ready_probability": 1 - pe_bp, "cycles": t1 - t0,
               "read_words": sum(len(s.received) - f for s, f in zip(tb.rd, first))}
        # the fills left over when the readers stop are drained outside the window
        await tb.drain()
        figures[name] = fig
        dut._log.info("bandwidth %s: %s", name, fig)

    await phase("reads_only", False, 0.0)
    await phase("reads_with_fills", True, 0.0)
    await phase("reads_half_rate_with_fills", True, 0.5)
    await tb.check()
    assert figures["reads_only"]["words_per_cycle_per_bank"] >= 0.95, figures["reads_only"]
    assert figures["reads_with_fills"]["words_per_cycle_per_bank"] >= 0.95, figures
    out = os.environ.get("ELMOE_MEASURE_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"params": tb.p, "figures": figures}, indent=2))

"""cocotb testbench of the Elastic-SD controller (``elmoe3d_esd_ctrl``) alone:
its trace stream against the golden control sequence, event for event.

The host script (commands, the rankings each layer step routes, the
responses) and the golden events come from :func:`elmoe3d.golden.esd.run_trace`,
prepared by the pytest wrapper (``$ELMOE_ESD_CASE``, a pickle). Around the
controller the testbench models the blocks it drives, each by its golden
model or contract:

* tag unit: :class:`elmoe3d.golden.esd.TagPolicy` (LOOKUP, LOOKUP_PIN, TOUCH,
  ALLOCATE with PENDING + pin, UNPIN, ABORT, DECAY) with 1..4 cycles latency;
* stream engine: one ``ExtResponse`` per ``ExtCommand`` after a random delay
  (the fault plan's ordinals answer with an error);
* HB: the fill of a slot ends (``fill_done``, and the tag unit's commit)
  after its read's response; KV moves computed with
  :func:`elmoe3d.golden.layout.slot_covered_mask`, the tag unit's disabled
  mask updated;
* datapath: the golden routing of the step's rankings with the mask the
  controller sends (:class:`~elmoe3d.golden.esd.RankingRouter`), announced
  per pass in announce order, the pass done after a random delay.

Every stream has random idle cycles and back-pressure. At the end the trace
(in canonical order) must equal the golden events, every host response the
golden's, and the controller's counters the golden counters.
"""

from __future__ import annotations

import json
import os
import pickle

import cocotb
from amaranth.lib import data
from cocotb.triggers import ReadOnly, RisingEdge

from elmoe3d.config import Config
from elmoe3d.golden import esd as gesd
from elmoe3d.golden import layout as gl
from elmoe3d.hw.esd_ctrl import COUNTERS, HostOp, esd_ports
from elmoe3d.tb.common import (CycleCounter, StreamSink, StreamSource, params, rng,
                               start_clock_and_reset, unpack)


def _case():
    with open(os.environ["ELMOE_ESD_CASE"], "rb") as f:
        return pickle.load(f)


class Responder:
    """Accepts a stream with random back-pressure and calls ``fn(payload)``
    for every transfer, in the cycle it happens."""

    def __init__(self, dut, prefix, layout, clk, fn, r, backpressure=0.3):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.layout, self.clk, self.fn, self.r, self.bp = layout, clk, fn, r, backpressure
        self.ready.value = 0
        cocotb.start_soon(self._run())

    async def _run(self):
        while True:
            await RisingEdge(self.clk)
            rdy = self.r.random() >= self.bp
            self.ready.value = rdy
            await ReadOnly()
            if rdy and self.valid.value:
                self.fn(unpack(self.layout, self.payload.value.to_unsigned()))


class Delayed:
    """A StreamSource whose items become sendable ``delay`` cycles after
    they are queued (random delays keep their order per source)."""

    def __init__(self, src: StreamSource, counter: CycleCounter):
        self.src, self.counter = src, counter
        self.later = []

    def put(self, item, delay):
        due = self.counter.cycle + delay
        if self.later and self.later[-1][0] > due:
            due = self.later[-1][0]
        self.later.append((due, item))

    def tick(self):
        while self.later and self.later[0][0] <= self.counter.cycle:
            self.src.send([self.later.pop(0)[1]])


@cocotb.test()
async def replay(dut):
    case = _case()
    cfg = Config(**params())
    t = {k: data.Layout.cast(v) for k, v in esd_ports(cfg).items()}
    r = rng()
    idle = float(os.environ.get("ELMOE_ESD_IDLE", "0.2"))
    await start_clock_and_reset(dut)
    cnt = CycleCounter(dut.clk)
    clk = dut.clk
    tags = gesd.TagPolicy(cfg)
    faults = dict(case.get("faults") or {})
    ext_seen = [0]

    host = StreamSource(dut, "host_cmd", t["HostCommand"], clk, cnt, idle=idle, rand=r)
    rsp = StreamSink(dut, "host_rsp", t["HostResponse"], clk, cnt, backpressure=idle, rand=r)
    trace = StreamSink(dut, "trace", t["TraceEvent"], clk, cnt, backpressure=idle, rand=r)
    tag_rsp = Delayed(StreamSource(dut, "tag_rsp", t["TagResponse"], clk, cnt, idle=idle,
                                   rand=r), cnt)
    ext_rsp = Delayed(StreamSource(dut, "ext_rsp", t["ExtResponse"], clk, cnt, idle=idle,
                                   rand=r), cnt)
    fill_done = Delayed(StreamSource(dut, "fill_done", t["FillDone"], clk, cnt, idle=idle,
                                     rand=r), cnt)
    kv_move = Delayed(StreamSource(dut, "kv_move", t["KVMove"], clk, cnt, idle=idle, rand=r), cnt)
    announce = StreamSource(dut, "dp_announce", t["Announce"], clk, cnt, idle=idle, rand=r)
    dp_done = Delayed(StreamSource(dut, "dp_done", t["PassDone"], clk, cnt, idle=idle, rand=r),
                      cnt)
    problems = []

    def blank(layout):
        return {name: 0 for name, _ in t[layout]}

    # ---- tag unit -----------------------------------------------------------------
    def on_tag(c):
        out = blank("TagResponse")
        out["op"] = c["op"]
        op = c["op"]
        if op == 0:                                   # LOOKUP
            res, s = tags.probe(c["tag"])
            out.update(hit=int(res == gesd.LookupResult.HIT),
                       pending=int(res == gesd.LookupResult.PENDING),
                       slot=s if res != gesd.LookupResult.MISS else 0)
        elif op == 9:                                 # LOOKUP_PIN
            res, s = tags.lookup_pin(c["tag"])
            out.update(hit=int(res == gesd.LookupResult.HIT),
                       pending=int(res == gesd.LookupResult.PENDING),
                       slot=s if res != gesd.LookupResult.MISS else 0)
        elif op == 1:                                 # TOUCH
            hit = tags.touch(c["tag"], c["amount"])
            out.update(hit=int(hit))
        elif op == 3:                                 # ALLOCATE
            ok, v, ev = tags.allocate_pin(c["tag"], c["planes"], c["amount"])
            if ok:
                out.update(slot=v, evicted=int(ev is not None), evicted_tag=ev or 0)
            else:
                out["error"] = 4
        elif op == 6:
            tags.unpin(c["slot"])
        elif op == 12:                                # ABORT
            tags.free_slot(c["slot"])
        elif op == 2:
            tags.decay()
        else:
            problems.append(f"unexpected tag op {op}")
        tag_rsp.put(out, r.randint(1, 4))

    # ---- stream engine and HB fills -------------------------------------------------
    def on_ext(c):
        i = ext_seen[0]
        ext_seen[0] += 1
        err = int(faults.get(i, 0))
        d = r.randint(2, 25)
        ext_rsp.put(dict(id=c["id"], error=err, resident=int(bool(c["fill"]) and not err),
                         slot=c["slot"]), d)
        if c["fill"]:
            slot = c["slot"]
            ok = not err
            due = d + r.randint(0, 6)

            def fire(slot=slot, ok=ok):
                if ok:
                    tags.commit(slot)
                return dict(slot=slot, ok=int(ok))
            fill_done.put(fire, due)

    def on_kv(c):
        words = c["kv_words"]
        mask = gl.slot_covered_mask(cfg, words)
        old = kv_state[0]
        newly = mask & ~old
        inv = 0
        for s in range(cfg.tag_slots):
            if (newly >> s) & 1 and tags.valid[s]:
                inv |= 1 << s
        tags.set_disabled(mask)
        kv_state[0] = mask
        kv_move.put(dict(kv_words=words, covered=newly, invalidated=inv), r.randint(1, 8))
    kv_state = [0]

    # ---- datapath -------------------------------------------------------------------
    steps = [e for e in case["script"] if e["op"] == "STEP"]
    step_i = [0]
    pending_sources = []
    passes = []

    def on_step(c):
        if step_i[0] >= len(steps):
            problems.append("dp_step beyond the script")
            return
        e = steps[step_i[0]]
        step_i[0] += 1
        ph = gesd.Phase(c["phase"])
        mask = c["mask"] if ph == gesd.Phase.DRAFT else None
        sel = gesd.RankingRouter(e["rankings"], cfg.top_k)(mask)
        if c["tokens"] != len(sel):
            problems.append(f"step tokens {c['tokens']} != {len(sel)}")
        T = cfg.batch_tokens
        for p in range(0, len(sel), T):
            counts = {}
            for s in sel[p:p + T]:
                for x in s:
                    counts[x] = counts.get(x, 0) + 1
            order = gesd.announce_order(counts)
            passes.append(len(order))
            if not order:
                announce.send([dict(expert=0, count=0, none=1, last=1)])
            for i, x in enumerate(order):
                announce.send([dict(expert=x, count=counts[x], none=0,
                                    last=int(i == len(order) - 1))])

    def on_source(c):
        pending_sources.append(c)
        if passes and len(pending_sources) == passes[0]:
            passes.pop(0)
            pending_sources.clear()
            dp_done.put(dict(error=0), r.randint(1, 30))

    Responder(dut, "tag_cmd", t["TagCommand"], clk, on_tag, r, idle)
    Responder(dut, "ext_cmd", t["ExtCommand"], clk, on_ext, r, idle)
    Responder(dut, "kv_req", t["KVRequest"], clk, on_kv, r, idle)
    Responder(dut, "dp_step", t["StepInfo"], clk, on_step, r, idle)
    Responder(dut, "dp_source", t["SourceInfo"], clk, on_source, r, idle)

    async def ticker():
        while True:
            await RisingEdge(clk)
            tag_rsp.tick()
            ext_rsp.tick()
            kv_move.tick()
            dp_done.tick()
            # passes without routed experts: done once announced (no sources)
            while passes and passes[0] == 0:
                passes.pop(0)
                dp_done.put(dict(error=0), r.randint(1, 10))
            while fill_done.later and fill_done.later[0][0] <= cnt.cycle:
                fill_done.src.send([fill_done.later.pop(0)[1]()])
    cocotb.start_soon(ticker())

    # ---- the host -------------------------------------------------------------------
    expected = []
    for e in case["script"]:
        op = e["op"]
        if op == "ROUND":
            host.send([dict(op=HostOp.ROUND, phase=0, step=0, layer=0, value=e["value"])])
            expected.append(dict(op=HostOp.ROUND, error=0, mode=e["mode"], k=e["k"]))
        elif op == "STEP":
            host.send([dict(op=HostOp.STEP, phase=e["phase"], step=e["step"], layer=e["layer"],
                            value=0)])
            expected.append(dict(op=HostOp.STEP, error=0, value=e["error"]))
        elif op == "ACCEPT":
            host.send([dict(op=HostOp.ACCEPT, phase=0, step=0, layer=0, value=e["value"])])
            expected.append(dict(op=HostOp.ACCEPT, error=0))
        elif op == "CONTEXT":
            host.send([dict(op=HostOp.CONTEXT, phase=0, step=0, layer=0, value=e["value"])])
            expected.append(dict(op=HostOp.CONTEXT, error=e.get("error", 0)))
    for i in range(len(COUNTERS)):
        host.send([dict(op=HostOp.COUNTER, phase=0, step=0, layer=0, value=i)])
    total = len(expected) + len(COUNTERS)
    limit = int(os.environ.get("ELMOE_ESD_MAX_CYCLES", "20000000"))
    while len(rsp.received) < total and cnt.cycle < limit and not problems:
        await RisingEdge(clk)
    for _ in range(50):
        await RisingEdge(clk)
    assert not problems, problems[:5]
    assert len(rsp.received) == total, f"{len(rsp.received)} of {total} responses by cycle {cnt.cycle}"
    for i, (want, (_, got)) in enumerate(zip(expected, rsp.received)):
        for k, v in want.items():
            assert got[k] == v, f"response {i} ({case['script'][i]['op']}): {k} {got[k]} != {v}"
    counters = {name: rsp.received[len(expected) + i][1]["value"]
                for i, name in enumerate(COUNTERS)}
    events = [gesd.Event.from_dict(p) for _, p in trace.received]
    msg = gesd.compare(case["events"], events)
    out = dict(cycles=cnt.cycle, counters=counters, events=len(events),
               rule_violations=len(trace.rule_violations) + len(rsp.rule_violations))
    with open(os.environ["ELMOE_ESD_OUT"], "w") as f:
        json.dump(out, f)
    assert not trace.rule_violations and not rsp.rule_violations
    assert msg is None, msg
    for k, v in case["counters"].items():
        if k in counters:
            assert counters[k] == v, f"counter {k}: RTL {counters[k]} != golden {v}"

"""cocotb testbench: expert-cache tag unit against the golden cache policy,
response for response.

Every command is executed on :class:`elmoe3d.golden.tag_unit.TagUnitModel`
when it is queued (commands transfer in queue order, so that is the order the
RTL sees), and the RTL's response must equal the golden response in every
field. Traces that behave like a cache controller (the Zipf stream) use the
golden response to decide the next command (miss -> ALLOCATE, hit -> TOUCH);
if the RTL ever disagreed, the comparison of that very response fails.

Parameters come from the harness (``$ELMOE_PARAMS``): the
:class:`elmoe3d.hw.tag_unit.TagUnit` parameters. Knobs (environment
``ELMOE_<NAME>``):

* ``TAG_COMMANDS`` - commands in ``random_commands`` (default 200000);
* ``TAG_ZIPF_COMMANDS`` - commands in ``zipf_trace`` (default 1000000);
* ``TAG_MUTANT`` - ``tie`` or ``decay``: run against a deliberately wrong
  golden model (the self-check test expects failure);
* ``GOLDEN_MUTATION`` - flip bit 0 of every golden ``value`` field;
* ``MEASURE_OUT`` - JSON file for the Zipf hit-rate figures;
* ``THROUGHPUT_OUT`` - JSON file for the latency / stall figures.

The driver is one coroutine per clock that drives the command stream (with
random idle cycles), drives ``o.ready`` (with random back-pressure), checks
the stream rules on the response stream (valid held and payload stable until
ready) and scoreboards responses. Commands and responses are compared as
packed integers (offsets taken from the Amaranth layouts), unpacked only to
describe a mismatch.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge

from ..golden.tag_unit import STAT_NAMES, TagError, TagOp, TagUnitModel
from ..hw.tag_unit import tag_command_layout, tag_response_layout, value_bits
from .common import golden_mutation, knob, params, rng, start_clock_and_reset


class _Packer:
    """Fast pack/unpack of flat struct layouts (fields of plain or enum shape)."""

    def __init__(self, layout):
        self.fields = [(name, f.offset, (1 << f.width) - 1) for name, f in layout]

    def pack(self, d: dict) -> int:
        out = 0
        for name, off, mask in self.fields:
            v = int(d.get(name, 0))
            if v & ~mask:
                raise ValueError(f"field {name}={v} does not fit")
            out |= v << off
        return out

    def unpack(self, raw: int) -> dict:
        return {name: (raw >> off) & mask for name, off, mask in self.fields}


class TagTB:
    """Clock, reset, the combined command driver / response monitor and the
    scoreboard for one tag-unit instance."""

    def __init__(self, dut, *, idle=0.0, backpressure=0.0):
        self.dut = dut
        self.p = params()
        self.rand = rng()
        self.np_rng = np.random.default_rng(self.rand.getrandbits(32))
        mutant = knob("tag_mutant", "") or None
        self.model = TagUnitModel(**self.p, mutant=mutant)
        self.S = self.model.slots
        tb = self.model.tag_bits
        self.cmd = _Packer(tag_command_layout(self.S, tb, self.model.hot_bits,
                                              self.model.plane_bits))
        self.rsp = _Packer(tag_response_layout(self.S, tb, self.model.plane_bits,
                                               value_bits(self.model.hot_bits,
                                                          self.model.stat_bits,
                                                          self.model.pin_bits)))
        self.value_lsb = 1 << dict((n, o) for n, o, _ in self.rsp.fields)["value"]
        self.flip = golden_mutation()
        self.idle, self.backpressure = idle, backpressure
        self.queue = collections.deque()       # (cmd_raw, expected_raw)
        self.expected = collections.deque()    # (cmd_raw, expected_raw, send_cycle)
        self.cycle = 0
        self.sent = 0
        self.checked = 0
        self.in_stalls = 0
        self.latencies = collections.Counter()
        self.errors = []
        self.rule_violations = []
        self.error_codes = collections.Counter()

    async def start(self):
        self.dut.i__valid.value = 0
        self.dut.o__ready.value = 0
        await start_clock_and_reset(self.dut)

    # -- stimulus ------------------------------------------------------------
    def issue(self, op, tag=0, slot=0, amount=0, planes=0) -> dict:
        """Queue one command; execute it on the golden model now and return
        the golden response (the RTL's must equal it)."""
        c = {"op": int(op), "tag": tag, "slot": slot, "amount": amount, "planes": planes}
        r = self.model.execute(c)
        self.error_codes[r["error"]] += 1
        exp = self.rsp.pack(r)
        if self.flip:
            exp ^= self.value_lsb
        self.queue.append((self.cmd.pack(c), exp))
        return r

    # -- the driver / monitor / scoreboard ------------------------------------
    async def run(self, refill=None, *, max_errors=10):
        """Stream the queue (calling ``refill()`` to top it up while it returns
        True) until every response has arrived and been checked."""
        dut, rand = self.dut, self.rand
        i_valid, i_ready, i_payload = dut.i__valid, dut.i__ready, dut.i__payload
        o_valid, o_ready, o_payload = dut.o__valid, dut.o__ready, dut.o__payload
        clk = dut.clk
        idle, bp = self.idle, self.backpressure
        cur = None
        pending = None                         # response offered, not yet taken
        more = refill is not None
        quiet = 0
        while True:
            await RisingEdge(clk)
            self.cycle += 1
            if cur is None:
                if more and len(self.queue) < 256:
                    more = bool(refill())
                if self.queue and not (idle and rand.random() < idle):
                    cur = self.queue.popleft()
                    i_payload.value = cur[0]
            i_valid.value = cur is not None
            ready = not (bp and rand.random() < bp)
            o_ready.value = ready
            await ReadOnly()
            if cur is not None:
                if i_ready.value:
                    self.expected.append((cur[0], cur[1], self.cycle))
                    self.sent += 1
                    cur = None
                else:
                    self.in_stalls += 1
            if o_valid.value:
                val = o_payload.value
                if not val.is_resolvable:
                    self.errors.append(f"cycle {self.cycle}: response payload not 0/1: {val}")
                    break
                raw = val.to_unsigned()
                if pending is not None and raw != pending:
                    self.rule_violations.append((self.cycle, "payload changed before ready"))
                if ready:
                    self._check(raw)
                    pending = None
                else:
                    pending = raw
            elif pending is not None:
                self.rule_violations.append((self.cycle, "valid dropped before ready"))
                pending = None
            if len(self.errors) >= max_errors or self.rule_violations:
                break
            if cur is None and not self.queue and not more and not self.expected:
                quiet += 1
                if quiet > 8:                  # nothing extra may arrive
                    break
            else:
                quiet = 0
        await RisingEdge(clk)
        i_valid.value = 0
        self.cycle += 1
        self.report()

    def _check(self, raw):
        if not self.expected:
            self.errors.append(f"cycle {self.cycle}: unexpected response {self.rsp.unpack(raw)}")
            return
        cmd, exp, sent = self.expected.popleft()
        self.latencies[self.cycle - sent] += 1
        self.checked += 1
        if raw != exp:
            self.errors.append(
                f"command #{self.checked - 1} {self.cmd.unpack(cmd)}: got {self.rsp.unpack(raw)}, "
                f"expected {self.rsp.unpack(exp)}")

    def report(self):
        errs = list(self.errors)
        errs += [f"stream rule at cycle {c}: {m}" for c, m in self.rule_violations]
        if self.expected and not errs:
            errs.append(f"{len(self.expected)} responses missing")
        if errs:
            raise AssertionError(f"{len(errs)} mismatches (seed {cocotb.RANDOM_SEED}); first: "
                                 + "; ".join(errs[:3]))
        assert not self.queue, "commands left unsent"

    # -- helpers for traces ----------------------------------------------------
    def rand_tag(self):
        return self.rand.getrandbits(self.model.tag_bits)

    def read_stats(self) -> dict:
        """Queue STATS reads of all counters; returns the golden values."""
        return {n: self.issue(TagOp.STATS, slot=k)["value"] for k, n in enumerate(STAT_NAMES)}


def _random_batch(tb: TagTB, n: int, pool: list, weights: list):
    """``n`` random commands; slot-addressed ops mostly name valid slots."""
    m, rand, S = tb.model, tb.rand, tb.S
    ops = rand.choices(range(len(weights)), weights=weights, k=n)
    hot_max = m.hot_max
    plane_max = (1 << m.plane_bits) - 1
    slot_top = (1 << m.slot_bits) - 1
    for k in ops:
        tag = rand.choice(pool) if rand.random() < 0.95 else tb.rand_tag()
        if k == 9:                                     # unknown opcode
            tb.issue(rand.randint(9, 15), tag=tag, slot=rand.randint(0, slot_top),
                     amount=rand.randint(0, hot_max))
            continue
        op = TagOp(k)
        if op in (TagOp.PIN, TagOp.UNPIN):
            r = rand.random()
            if r < 0.85:
                live = [s for s in range(S) if m.valid[s]]
                slot = rand.choice(live) if live else 0
            else:
                slot = rand.randint(0, slot_top)
            tb.issue(op, slot=slot, tag=tag)
        elif op == TagOp.STATS:
            tb.issue(op, slot=rand.randint(0, min(slot_top, 5)))
        else:
            amount = (hot_max if rand.random() < 0.1 else
                      rand.randint(0, hot_max) if rand.random() < 0.3 else rand.randint(0, 3))
            tb.issue(op, tag=tag, amount=amount, planes=rand.randint(0, plane_max))


# opcode weights of the random phases: LOOKUP TOUCH DECAY ALLOCATE INVALIDATE
# PIN UNPIN RESET STATS bad-op
PHASES = {
    "mixed": [30, 15, 3, 20, 5, 8, 8, 0.05, 3, 1],
    "pin_heavy": [15, 5, 1, 20, 5, 30, 5, 0.02, 2, 1],
    "churn": [20, 10, 2, 40, 15, 4, 6, 0.02, 2, 1],
    "hot": [30, 40, 10, 10, 2, 4, 4, 0.02, 2, 1],
}


@cocotb.test()
async def random_commands(dut):
    """>= 200,000 random commands (phases of differently weighted opcode
    mixes, tag pools from S/2 to 3S, bad commands of every kind), random
    idle cycles on the command stream, random response back-pressure."""
    tb = TagTB(dut, idle=0.25, backpressure=0.3)
    await tb.start()
    target = knob("tag_commands", 200_000)
    state = {"left": target}

    def refill():
        if state["left"] <= 0:
            return False
        n = min(2000, state["left"])
        size = tb.rand.choice((tb.S // 2, tb.S, tb.S + tb.S // 2, 2 * tb.S, 3 * tb.S))
        pool = [tb.rand_tag() for _ in range(max(2, size))]
        _random_batch(tb, n, pool, PHASES[tb.rand.choice(list(PHASES))])
        state["left"] -= n
        tb.model.check_invariants()
        return True

    t0 = time.monotonic()
    await tb.run(refill)
    tb.read_stats()
    await tb.run()
    dut._log.info("random_commands: %d commands checked in %d cycles (%.1f s); errors seen %s",
                  tb.checked, tb.cycle, time.monotonic() - t0,
                  {TagError(k).name: v for k, v in sorted(tb.error_codes.items())})
    assert tb.checked >= target


@cocotb.test()
async def all_pinned(dut):
    """Fill every slot, pin them all (one twice, up to the pin limit): ALLOCATE
    answers NO_VICTIM and changes nothing; INVALIDATE of a pinned tag is
    PINNED; unpinning one slot makes exactly it the victim; UNPIN of an
    unpinned or free slot and PIN of a free slot are refused."""
    tb = TagTB(dut, idle=0.2, backpressure=0.2)
    await tb.start()
    S, m = tb.S, tb.model
    tags = tb.rand.sample(range(1 << m.tag_bits), S + 4)
    for k in range(S):
        tb.issue(TagOp.ALLOCATE, tag=tags[k], amount=tb.rand.randint(0, m.hot_max), planes=1)
    for s in range(S):
        tb.issue(TagOp.PIN, slot=s)
    for _ in range(m.pin_max + 1):                      # last one: PIN_LIMIT
        r = tb.issue(TagOp.PIN, slot=S // 2)
    assert r["error"] == TagError.PIN_LIMIT
    for k in range(S, S + 4):
        assert tb.issue(TagOp.ALLOCATE, tag=tags[k])["error"] == TagError.NO_VICTIM
    assert tb.issue(TagOp.INVALIDATE, tag=tags[3])["error"] == TagError.PINNED
    assert tb.issue(TagOp.ALLOCATE, tag=tags[5])["error"] == TagError.RESIDENT
    assert tb.issue(TagOp.UNPIN, slot=S - 1)["error"] == TagError.OK
    assert tb.issue(TagOp.UNPIN, slot=S - 1)["error"] == TagError.NOT_PINNED
    r = tb.issue(TagOp.ALLOCATE, tag=tags[S])
    assert r["error"] == TagError.OK and r["slot"] == S - 1 and r["evicted_tag"] == tags[S - 1]
    tb.issue(TagOp.PIN, slot=S - 1)
    assert tb.issue(TagOp.ALLOCATE, tag=tags[S + 1])["error"] == TagError.NO_VICTIM
    tb.issue(TagOp.UNPIN, slot=S - 1)
    assert tb.issue(TagOp.INVALIDATE, tag=tags[S])["hit"] == 1
    assert tb.issue(TagOp.PIN, slot=S - 1)["error"] == TagError.NOT_VALID
    assert tb.issue(TagOp.UNPIN, slot=S - 1)["error"] == TagError.NOT_VALID
    assert tb.issue(TagOp.ALLOCATE, tag=tags[S + 1])["slot"] == S - 1   # the free slot
    if S < (1 << m.slot_bits):
        assert tb.issue(TagOp.PIN, slot=S)["error"] == TagError.BAD_SLOT
    tb.issue(TagOp.STATS, slot=(1 << m.slot_bits) - 1)                  # BAD_SLOT
    tb.read_stats()
    tb.issue(TagOp.RESET)
    for k in range(4):
        tb.issue(TagOp.LOOKUP, tag=tags[k])
    tb.read_stats()
    await tb.run()


@cocotb.test()
async def thrash(dut):
    """Working set larger than S, cycled in order (every lookup misses and
    every allocation evicts), then a working set of exactly S (all hits)."""
    tb = TagTB(dut, backpressure=0.1)
    await tb.start()
    m = tb.model
    for ws, rounds in ((tb.S + tb.S // 2 + 1, 6), (2 * tb.S, 3), (tb.S, 4)):
        tb.issue(TagOp.RESET)
        tags = tb.rand.sample(range(1 << m.tag_bits), ws)
        for _ in range(rounds):
            for t in tags:
                if tb.issue(TagOp.LOOKUP, tag=t)["hit"]:
                    tb.issue(TagOp.TOUCH, tag=t, amount=1)
                else:
                    tb.issue(TagOp.ALLOCATE, tag=t, amount=1, planes=1)
        st = tb.read_stats()
        if ws > tb.S:
            assert st["evictions"] == st["allocations"] - tb.S, st
        else:
            assert st["hits"] == ws * (rounds - 1), st
    await tb.run()


@cocotb.test()
async def decay_and_saturation(dut):
    """TOUCH with large amounts saturates at 2**hot_bits - 1 (never wraps);
    repeated DECAY drives every counter to its fixed point of ``h -= h >> d``
    (0 for d = 0, otherwise below 2**d; 0 stays 0); statistics counters
    saturate when ``stat_bits`` is small."""
    tb = TagTB(dut, idle=0.1, backpressure=0.1)
    await tb.start()
    m = tb.model
    tags = tb.rand.sample(range(1 << m.tag_bits), tb.S)
    for k, t in enumerate(tags):
        tb.issue(TagOp.ALLOCATE, tag=t, amount=k % (m.hot_max + 1))
    for rep in range(4):
        for t in tags:
            r = tb.issue(TagOp.TOUCH, tag=t, amount=m.hot_max if rep else m.hot_max // 2 + 1)
            assert r["hit"]
    assert all(h == m.hot_max for h in m.hot)
    for t in tags[: tb.S // 2]:
        tb.issue(TagOp.TOUCH, tag=t, amount=0)
    steps = 0
    while True:                                          # decay to the fixed point
        before = list(m.hot)
        tb.issue(TagOp.DECAY)
        for t in tags[::3]:
            tb.issue(TagOp.LOOKUP, tag=t)
        steps += 1
        if m.hot == before:
            break
        assert steps < 10 * (m.hot_bits + 1) << m.decay_shift
    assert all(h < (1 << m.decay_shift) if m.decay_shift else h == 0 for h in m.hot)
    tb.issue(TagOp.INVALIDATE, tag=tags[0])
    tb.issue(TagOp.ALLOCATE, tag=tags[0], amount=0)     # coldest possible
    for _ in range(m.hot_bits + 2):
        tb.issue(TagOp.DECAY)
    tb.issue(TagOp.LOOKUP, tag=tags[0])
    # statistics saturation (reachable in a test only with narrow counters)
    if m.stat_bits <= 12:
        for _ in range((1 << m.stat_bits) + 5):
            tb.issue(TagOp.LOOKUP, tag=tags[1])
        st = tb.read_stats()
        assert st["lookups"] == st["hits"] == m.stat_max, st
    await tb.run()


def zipf_probabilities(n: int, a: float) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** a
    return p / p.sum()


@cocotb.test()
async def zipf_trace(dut):
    """A Zipf-distributed expert stream driven like the cache controller: per
    access LOOKUP; a hit TOUCHes (+1, draft routing's one-hot), a miss
    ALLOCATEs (hot = 1, planes = MSB planes); the most recent accesses stay
    pinned while "in use" (pin on use, unpin a few accesses later); DECAY
    every 64 accesses. The hit rate comes from the unit's own STATS and must
    equal the golden model's to the count."""
    tb = TagTB(dut, idle=0.05, backpressure=0.1)
    await tb.start()
    m, rand = tb.model, tb.rand
    target = knob("tag_zipf_commands", 1_000_000)
    layers = min(1 << m.layer_bits, 4)
    experts = min(1 << m.expert_bits, 64)
    alpha = 1.1
    p = zipf_probabilities(experts, alpha)
    perms = [tb.np_rng.permutation(experts) for _ in range(layers)]   # rank -> expert per layer
    in_use = collections.deque()
    window = max(1, tb.S // 4)
    state = {"issued": 0, "access": 0}

    def refill():
        if state["issued"] >= target:
            while in_use:                                 # release every pin
                tb.issue(TagOp.UNPIN, slot=in_use.popleft())
            return False
        n0 = len(tb.queue)
        ranks = tb.np_rng.choice(experts, size=256, p=p)
        lyr = tb.np_rng.integers(0, layers, size=256)
        for r, ly in zip(ranks.tolist(), lyr.tolist()):
            tag = m.make_tag(ly, int(perms[ly][r]))
            res = tb.issue(TagOp.LOOKUP, tag=tag)
            if res["hit"]:
                tb.issue(TagOp.TOUCH, tag=tag, amount=1)
                slot = res["slot"]
            else:
                a = tb.issue(TagOp.ALLOCATE, tag=tag, amount=1,
                             planes=min(1, (1 << m.plane_bits) - 1))
                slot = a["slot"] if a["error"] == TagError.OK else None
            if slot is not None and rand.random() < 0.3 and m.pins[slot] < m.pin_max:
                tb.issue(TagOp.PIN, slot=slot)
                in_use.append(slot)
            while len(in_use) > window:
                tb.issue(TagOp.UNPIN, slot=in_use.popleft())
            state["access"] += 1
            if state["access"] % 64 == 0:
                tb.issue(TagOp.DECAY)
            if state["issued"] + len(tb.queue) - n0 >= target:
                break
        state["issued"] += len(tb.queue) - n0
        return True

    t0 = time.monotonic()
    await tb.run(refill)
    stats_golden = tb.read_stats()
    # the unit's own STATS: read them back through the scoreboard (equal to
    # the golden counters field for field) and keep the raw RTL values
    rtl_stats = {}
    orig_check = tb._check

    def capture(raw):
        cmd = tb.cmd.unpack(tb.expected[0][0]) if tb.expected else None
        if cmd and cmd["op"] == TagOp.STATS:
            rtl_stats[STAT_NAMES[cmd["slot"]]] = tb.rsp.unpack(raw)["value"]
        orig_check(raw)
    tb._check = capture
    await tb.run()
    wall = time.monotonic() - t0
    commands = tb.checked
    assert rtl_stats == stats_golden, (rtl_stats, stats_golden)
    hit_rate = rtl_stats["hits"] / max(1, rtl_stats["lookups"])
    dut._log.info("zipf_trace: %d commands, %d cycles, %.1f s; RTL STATS %s; golden %s; "
                  "hit rate %.4f (alpha %.2f, %d layers x %d experts, S=%d)",
                  commands, tb.cycle, wall, rtl_stats, stats_golden, hit_rate, alpha,
                  layers, experts, tb.S)
    out = knob("measure_out", "")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({
            "params": tb.p, "commands": commands, "cycles": tb.cycle, "seconds": wall,
            "rtl_stats": rtl_stats, "golden_stats": stats_golden, "hit_rate": hit_rate,
            "zipf_alpha": alpha, "layers": layers, "experts": experts,
            "seed": cocotb.RANDOM_SEED}, indent=2))


@cocotb.test()
async def lookup_throughput(dut):
    """Back-to-back LOOKUPs (and a mix of every operation) with an always-ready
    consumer: no input stall, every response exactly 2 cycles after its
    command (the documented latency)."""
    tb = TagTB(dut)
    await tb.start()
    m = tb.model
    tags = tb.rand.sample(range(1 << m.tag_bits), 2 * tb.S)
    for t in tags[: tb.S]:
        tb.issue(TagOp.ALLOCATE, tag=t)
    for _ in range(4):
        for t in tags:
            tb.issue(TagOp.LOOKUP, tag=t)
    for t in tags:                                        # every op back to back
        tb.issue(TagOp.TOUCH, tag=t, amount=3)
        tb.issue(TagOp.ALLOCATE, tag=t)
        tb.issue(TagOp.LOOKUP, tag=t)
        tb.issue(TagOp.DECAY)
        tb.issue(TagOp.PIN, slot=tb.rand.randrange(tb.S))
        tb.issue(TagOp.UNPIN, slot=tb.rand.randrange(tb.S))
        tb.issue(TagOp.INVALIDATE, tag=tags[tb.rand.randrange(len(tags))])
    n = len(tb.queue)
    await tb.run()
    assert tb.in_stalls == 0, f"command stream stalled {tb.in_stalls} cycles"
    assert dict(tb.latencies) == {2: n}, f"latencies {dict(tb.latencies)}"
    dut._log.info("lookup_throughput: %d commands, %d stalls, latency %s", n, tb.in_stalls,
                  dict(tb.latencies))
    out = knob("throughput_out", "")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"params": tb.p, "commands": n,
                                         "stalls": tb.in_stalls,
                                         "latency_cycles": sorted(tb.latencies)}, indent=2))


"""cocotb testbench: the expert-cache tag unit against the golden cache policy,
response for response and cycle for cycle.

Checking rule (the contract of :mod:`elmoe3d.hw.tag_unit`, not a replay of
its choices): a command *executes* ``RESPONSE_DELAY`` (2) cycles before its
response first becomes valid, unless that response follows the previous one
without a gap, then in the cycle before the previous one first became valid
(:func:`execution_cycle`; it may have waited in the output queue behind a
stalled response). The scoreboard keeps the golden model
(:class:`elmoe3d.golden.tag_unit.TagUnitModel`) in step with the hardware
cycle by cycle: for every cycle ``t`` it applies the command that executed in
``t`` (if any), then ``disabled`` of ``t``, then the commit strobe of ``t``
(:meth:`~elmoe3d.golden.tag_unit.TagUnitModel.step`), compares that command's
response with the golden one field for field, and compares the ``resident``
and ``pending`` outputs with the golden slot states every cycle. Every
response must come at least ``TagUnit.LATENCY`` cycles after its command.

Stimulus is decided on a second golden copy (``shadow``) updated when a
command is queued or an event driven; it only steers the traffic (which tags
to allocate, which slots to pin) and is never compared with.

The testbench plays HB and the KV region too: ``hb_auto`` commits PENDING
slots (seen on the ``pending`` output) after random delays, with a few
strobes of slots that are not PENDING (which the unit must ignore);
``kv_auto`` moves a KV boundary that covers the highest slots first, and in
its "wild" mode drives arbitrary disabled masks.

Parameters come from the harness (``$ELMOE_PARAMS``). Knobs (environment
``ELMOE_<NAME>``): ``TAG_COMMANDS`` (random commands, default 10000),
``TAG_ZIPF_COMMANDS`` (default 20000), ``TAG_MUTANT`` (``tie``, ``decay`` or
``pending_hit``: a deliberately wrong golden model that must fail the
test), ``GOLDEN_MUTATION`` (flip bit 0 of every golden ``value``),
``MEASURE_OUT`` / ``THROUGHPUT_OUT`` (JSON figures), ``COVERAGE_RUN`` (the
run name recorded in ``build/coverage/tag_unit.json``).
"""

from __future__ import annotations

import collections
import json
import math
import time
from pathlib import Path
from typing import NamedTuple

import cocotb
import numpy as np

from ..golden.tag_unit import STAT_NAMES, SlotState, TagError, TagOp, TagUnitModel
from ..hw.tag_unit import TagUnit
from ..hw.vocab import tag_command, tag_response
from .common import (CycleLoop, Scoreboard, Sink, Source, golden_mutation, knob, params, rng,
                     start_clock_and_reset)
from .coverage import write_coverage
from .kit import IdleBackpressure

BLOCK = "tag_unit"
#: cycles from a command's execution to its response on ``o`` when ``o`` is free
RESPONSE_DELAY = TagUnit.RESPONSE_DELAY


def execution_cycle(first_valid: int, pred_first_valid: int | None) -> int:
    """The cycle in which a command executed, from when its response first
    became valid (the contract of :mod:`elmoe3d.hw.tag_unit`): a command
    executes only in a cycle in which ``o`` is empty or its response is
    taken, and its response enters the two-entry output queue
    ``RESPONSE_DELAY - 1`` cycles later. So a response that appears on an
    idle ``o`` executed ``RESPONSE_DELAY`` cycles before; one that follows
    its predecessor without a gap (``pred_first_valid``: the predecessor's
    first valid cycle) executed ``RESPONSE_DELAY`` cycles before, or, if it
    was queued behind the stalled predecessor, in the cycle in which the
    predecessor was loaded into ``o`` (the last cycle before the stall in
    which ``o`` was free): in both cases ``pred_first_valid - 1``."""
    if pred_first_valid is None:
        return first_valid - RESPONSE_DELAY
    return pred_first_valid - RESPONSE_DELAY + 1


class _Packer:
    """Fast pack/unpack of flat struct layouts (fields of plain or enum shape)."""

    def __init__(self, layout):
        from amaranth.lib import data
        self.fields = [(name, f.offset, (1 << f.width) - 1) for name, f in data.Layout.cast(layout)]

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


def op_name(op: int) -> str:
    return TagOp(op).name if op in TagOp._value2member_map_ else "BAD_OP"


# -- functional coverage ------------------------------------------------------------------

#: (op, error) pairs the golden policy can produce
LEGAL_ERRORS = {
    "LOOKUP": ["OK"], "LOOKUP_PIN": ["OK", "PIN_LIMIT"], "TOUCH": ["OK"], "DECAY": ["OK"],
    "ALLOCATE": ["OK", "RESIDENT", "PENDING", "NO_VICTIM"], "INVALIDATE": ["OK", "PINNED"],
    "INVALIDATE_SLOT": ["OK", "BAD_SLOT", "PINNED"], "INVALIDATE_MASK": ["OK", "PINNED"],
    "PIN": ["OK", "BAD_SLOT", "NOT_VALID", "PIN_LIMIT"],
    "UNPIN": ["OK", "BAD_SLOT", "NOT_VALID", "NOT_PINNED"],
    "ABORT": ["OK", "BAD_SLOT", "NOT_PENDING"], "RESET": ["OK"], "STATS": ["OK", "BAD_SLOT"],
    "BAD_OP": ["BAD_OP"],
}
SLOW_OPS = ("ALLOCATE", "INVALIDATE_MASK", "STATS")
#: the ops that take their response from registers filled in a first cycle
TWO_CYCLE_OPS = ("LOOKUP_PIN", "INVALIDATE", "INVALIDATE_SLOT", "PIN", "UNPIN", "ABORT")
EVENTS = ("none", "commit", "disabled", "both")
TRANSITIONS = (["FREE>PENDING:ALLOCATE", "RESIDENT>PENDING:ALLOCATE", "PENDING>RESIDENT:commit"]
               + [f"PENDING>FREE:{c}" for c in ("ABORT", "INVALIDATE", "INVALIDATE_SLOT",
                                                "INVALIDATE_MASK", "RESET", "kv")]
               + [f"RESIDENT>FREE:{c}" for c in ("INVALIDATE", "INVALIDATE_SLOT",
                                                 "INVALIDATE_MASK", "RESET", "kv")])


def reachable_errors(p: dict) -> dict:
    """LEGAL_ERRORS without BAD_SLOT where the slot field cannot name a bad slot."""
    S, sb = p["slots"], TagUnitModel(**p).slot_bits
    out = {k: list(v) for k, v in LEGAL_ERRORS.items()}
    for op in ("INVALIDATE_SLOT", "PIN", "UNPIN", "ABORT"):
        if (1 << sb) <= S:
            out[op].remove("BAD_SLOT")
    if (1 << sb) <= len(STAT_NAMES):
        out["STATS"].remove("BAD_SLOT")
    return out


class Coverage:
    """cocotb-coverage coverpoints and crosses of the tag unit (names under
    ``tag_unit.``); samplers are plain methods taking one dict."""

    def __init__(self, p: dict):
        from cocotb_coverage.coverage import CoverCross, CoverPoint
        legal = reachable_errors(p)
        ops = list(LEGAL_ERRORS)
        errors = sorted({e for v in legal.values() for e in v}, key=lambda e: TagError[e])
        pairs = [f"{o}/{e}" for o in ops for e in legal[o]]
        waits = ["ALLOCATE/1", "ALLOCATE/>1", "INVALIDATE_MASK/1", "INVALIDATE_MASK/>1",
                 "STATS/0", "STATS/1", "TWO/1", "TWO/>1"]

        def build(f, decos):
            for d in reversed(decos):
                f = d(f)
            return f

        n = "tag_unit.exec."
        self.exec = build(lambda d: None, [
            CoverPoint(n + "op", xf=lambda d: d["op"], bins=ops),
            CoverPoint(n + "error", xf=lambda d: d["error"], bins=errors),
            CoverPoint(n + "op_error", xf=lambda d: f"{d['op']}/{d['error']}", bins=pairs),
            CoverPoint(n + "lookup", xf=lambda d: d["lookup"], bins=["hit", "pending", "miss"]),
            CoverPoint(n + "event", xf=lambda d: d["event"], bins=list(EVENTS)),
            CoverPoint(n + "victim", xf=lambda d: d["victim"],
                       bins=["free/first", "free/middle", "free/last",
                             "evict/first", "evict/middle", "evict/last"]),
            CoverPoint(n + "wait", xf=lambda d: d["wait"], bins=waits),
            CoverCross(n + "opXevent", items=[n + "op", n + "event"],
                       ign_bins=[(o, e) for o in SLOW_OPS for e in EVENTS[1:]]),
            CoverCross(n + "lookupXevent", items=[n + "lookup", n + "event"]),
        ])
        n = "tag_unit.state."
        self.transition = build(lambda d: None, [
            CoverPoint(n + "transition", xf=lambda d: d, bins=TRANSITIONS)])
        n = "tag_unit.take."
        self.take = build(lambda d: None, [
            CoverPoint(n + "op", xf=lambda d: d["op"], bins=ops),
            CoverPoint(n + "stall", xf=lambda d: d["stall"], bins=["direct", "stalled"]),
            CoverCross(n + "opXstall", items=[n + "op", n + "stall"]),
        ])
        n = "tag_unit.accept."
        self.accept = build(lambda d: None, [
            CoverPoint(n + "op", xf=lambda d: d["op"], bins=ops),
            CoverPoint(n + "kind", xf=lambda d: d["kind"], bins=["back_to_back", "idle", "stalled"]),
            CoverCross(n + "opXkind", items=[n + "op", n + "kind"]),
        ])


_COVERAGE = None


def coverage() -> Coverage:
    global _COVERAGE
    if _COVERAGE is None:
        _COVERAGE = Coverage(params())
    return _COVERAGE


# -- the testbench ---------------------------------------------------------------------------

class _Response(NamedTuple):
    """A response as it first becomes valid on ``o`` (what the scoreboard
    checks): its cycle, the packed payload, and the first-valid cycle of the
    response right before it when it followed that one without a gap."""

    cycle: int
    raw: int
    pred_first_valid: int | None


class TagTB(IdleBackpressure):
    """One tag-unit instance on the testbench kit (:mod:`elmoe3d.tb.kit`):
    clock and reset, commands on ``i`` from a :class:`~elmoe3d.tb.kit.Source`,
    responses on ``o`` into a :class:`~elmoe3d.tb.kit.Sink` (its stream-rule
    check), the HB commit strobes and the KV ``disabled`` mask, all in one
    :class:`~elmoe3d.tb.kit.CycleLoop` per :meth:`run`; the responses are
    paired with their commands in order on a
    :class:`~elmoe3d.tb.kit.Scoreboard` whose comparison is the cycle-exact
    golden check (:class:`_Run`).

    The test queues a script (:meth:`issue`, :meth:`commit`,
    :meth:`set_disabled`, :meth:`barrier`, :meth:`wait`) and runs it with
    :meth:`run`. Idle cycles on ``i`` and back-pressure on ``o``:
    ``set_idle_generator``, ``set_backpressure_generator``
    (:class:`~elmoe3d.tb.kit.IdleBackpressure`; default none; they may
    change between runs and inside ``refill``).

    Parameters
    ----------
    dut
        The cocotb handle of the tag unit.

    Attributes
    ----------
    src : elmoe3d.tb.kit.Source
        The commands (dicts) on ``i``; ``sent`` holds ``(cycle, command)``
        per transfer, ``stalls`` the cycles a command waited for ``ready``.
    sink : elmoe3d.tb.kit.Sink
        The responses on ``o``.
    scoreboard : elmoe3d.tb.kit.Scoreboard
        ``(command, accept cycle)`` of every command whose response is due.
    loop : elmoe3d.tb.kit.CycleLoop
        Its ``cycle`` (:attr:`cycle`) counts on across runs.
    """

    def __init__(self, dut):
        self.dut = dut
        self.p = params()
        self.rand = rng()
        self.np_rng = np.random.default_rng(self.rand.getrandbits(32))
        mutant = knob("tag_mutant", "") or None
        self.model = TagUnitModel(**self.p, mutant=mutant)       # the checker
        self.shadow = TagUnitModel(**self.p)                     # steers the stimulus
        m = self.model
        self.S = m.slots
        unit = TagUnit(**self.p)
        self.latency, self.settle = unit.LATENCY, unit.victim_settle
        self.kv_stages = unit.kv_count_stages
        self.cmd = _Packer(tag_command(self.S, m.tag_bits, m.hot_bits, m.plane_bits))
        self.rsp = _Packer(tag_response(self.S, m.tag_bits, m.plane_bits, unit.value_bits))
        del unit
        self.value_lsb = 1 << dict((n, o) for n, o, _ in self.rsp.fields)["value"]
        self.flip = golden_mutation()
        self.cov = coverage()
        self.queue = collections.deque()     # ("cmd", dict) / ("commit", s) / ("disabled", m) / ("barrier",) / ("wait", n)
        self.issued = 0
        self.fed = 0                         # commands handed to the source
        self.sent = 0                        # commands transferred on i
        self.src = self.sink = None
        self.loop = CycleLoop(dut.clk)
        self.scoreboard = Scoreboard("response", compare=self._compare)
        self._run = None
        self._i_stalled = self._o_stalled = False
        self.latencies = collections.Counter()       # (op name, latency) -> count
        self.errors = []
        self.error_codes = collections.Counter()
        self.exec_events = collections.Counter()      # (op name, event of its cycle) -> count
        self.log = None                               # list of (cmd, response) when set
        self.resident_trace = None                    # list of (cycle, resident, commit) when set
        # HB / KV models
        self.hb_auto = False
        self.commit_p, self.commit_delay, self.bogus_commit_p = 0.3, (0, 12), 0.02
        self.kv_auto = False
        self.kv_p, self.kv_wild_p, self.kv_max = 0.01, 0.1, max(1, self.S // 2)
        self._kv_level = 0
        self._fills = {}                              # pending slot -> cycle to commit
        self.events_driven = collections.Counter()
        self.refill_below = 256                       # queue length that calls refill()
        self.on_response = None                       # callback(cmd, response) of a closed loop
        self.dis_now = 0

    @property
    def cycle(self) -> int:
        """The cycles run so far (from the end of reset)."""
        return self.loop.cycle

    @property
    def checked(self) -> int:
        """Responses checked so far."""
        return self.scoreboard.checked

    async def start(self):
        """The stream ports, the HB and KV inputs low, then clock and reset."""
        d = self.dut
        self.src = Source(d, "i", None, self.rand, self.idle, encode=self.cmd.pack,
                          on_stall=self._i_stall)
        self.sink = Sink(d, "o", None, self.rand, self.backpressure, self._take,
                         on_stall=self._o_stall, decode=int)
        d.commit__valid.value = 0
        d.commit__slot.value = 0
        d.disabled.value = 0
        await start_clock_and_reset(self.dut)

    # -- stimulus ----------------------------------------------------------------
    def issue(self, op, tag=0, slot=0, amount=0, planes=0, slot_mask=0) -> dict:
        """Queue one command; returns the *shadow's* response (exact when no
        event can overtake it: directed sequences with :meth:`barrier`)."""
        c = {"op": int(op), "tag": tag, "slot": slot, "amount": amount, "planes": planes,
             "slot_mask": slot_mask}
        self.queue.append(("cmd", c))
        self.issued += 1
        return self.shadow.execute(c)

    def commit(self, slot: int):
        """Queue a commit strobe (one cycle) of ``slot``."""
        self.queue.append(("commit", slot))
        self.shadow.commit(slot)

    def set_disabled(self, mask: int):
        """Queue a change of the disabled mask (held from then on)."""
        self.queue.append(("disabled", mask))
        self.shadow.set_disabled(mask)

    def barrier(self):
        """Queue a barrier: nothing further is driven until every response arrived."""
        self.queue.append(("barrier",))

    def wait(self, cycles: int):
        """Queue ``cycles`` idle cycles on the command stream."""
        self.queue.append(("wait", cycles))

    def read_stats(self) -> dict:
        """Queue STATS reads of every counter; returns the shadow values."""
        return {n: self.issue(TagOp.STATS, slot=k)["value"] for k, n in enumerate(STAT_NAMES)}

    def rand_tag(self):
        return self.rand.getrandbits(self.model.tag_bits)

    # -- the golden side of one cycle ----------------------------------------------
    def _states(self):
        m = self.model
        return [m.slot_state(s) for s in range(self.S)]

    def _transitions(self, before, cause):
        after = self._states()
        for s in range(self.S):
            if before[s] != after[s]:
                self.cov.transition(f"{before[s].name}>{after[s].name}:{cause}")
        return after

    def _golden_events(self, commit, disabled):
        m = self.model
        before = self._states()
        if disabled != m.disabled_mask():
            m.set_disabled(disabled)
            before = self._transitions(before, "kv")
        if commit is not None:
            m.commit(commit)
            self._transitions(before, "commit")

    def _golden_command(self, cmd, raw, accept, exec_cycle, event, entry):
        """Execute ``cmd`` on the golden model in ``exec_cycle``, sample the
        coverage, check the latency; returns None if ``raw`` is the golden
        response, else the mismatch."""
        m = self.model
        before = self._states()
        pre_victim = m.choose_victim()
        pre_held = m.valid[pre_victim] if pre_victim is not None else 0
        exp = m.execute(cmd)
        self._transitions(before, op_name(cmd["op"]))
        name = op_name(cmd["op"])
        err = TagError(exp["error"]).name
        self.error_codes[err] += 1
        lookup = None
        if name in ("LOOKUP", "LOOKUP_PIN", "TOUCH", "INVALIDATE") and err == "OK":
            lookup = "hit" if exp["hit"] else "pending" if exp["pending"] else "miss"
        victim = None
        if name == "ALLOCATE" and err == "OK":
            pos = "first" if exp["slot"] == 0 else "last" if exp["slot"] == self.S - 1 else "middle"
            victim = f"{'evict' if pre_held else 'free'}/{pos}"
        wait = None
        if name in SLOW_OPS or name in TWO_CYCLE_OPS:
            w = exec_cycle - entry
            wait = f"{'TWO' if name in TWO_CYCLE_OPS else name}/{w if w <= 1 else '>1'}"
        self.exec_events[(name, event)] += 1
        self.cov.exec({"op": name, "error": err, "lookup": lookup, "event": event,
                       "victim": victim, "wait": wait})
        want = self.rsp.pack(exp)
        if self.flip:
            want ^= self.value_lsb
        lat = exec_cycle + RESPONSE_DELAY - accept
        self.latencies[(name, lat)] += 1
        if self.log is not None:
            self.log.append((cmd, exp, lat, self.rsp.unpack(raw), exec_cycle))
        if self.on_response is not None:
            self.on_response(cmd, exp)
        if lat < self.latency:
            self.errors.append(f"cycle {exec_cycle + 1}: response of {cmd} after {lat} cycles")
        if raw != want:
            return (f"{cmd} (executed in cycle {exec_cycle}): got {self.rsp.unpack(raw)}, "
                    f"expected {self.rsp.unpack(want)}")
        return None

    # -- HB and KV models ---------------------------------------------------------
    def _hb(self, pending_seen: int):
        """A commit strobe for this cycle, or None."""
        for s in range(self.S):
            if (pending_seen >> s) & 1 and s not in self._fills:
                self._fills[s] = self.cycle + self.rand.randint(*self.commit_delay)
        for s in list(self._fills):
            if not (pending_seen >> s) & 1:
                del self._fills[s]
        if self.rand.random() < self.bogus_commit_p:
            return self.rand.randrange(self.S)
        due = [s for s, c in self._fills.items() if c <= self.cycle]
        if due and self.rand.random() < self.commit_p:
            s = self.rand.choice(due)
            del self._fills[s]
            return s
        return None

    def _kv(self):
        """The disabled mask of this cycle (a KV boundary from the top)."""
        if self.rand.random() >= self.kv_p:
            return self.dis_now
        if self.rand.random() < self.kv_wild_p:
            return self.rand.getrandbits(self.S) & self.rand.getrandbits(self.S)
        self._kv_level = max(0, min(self.kv_max, self._kv_level + self.rand.choice((-2, -1, 1, 2))))
        k = self._kv_level
        return ((1 << k) - 1) << (self.S - k)

    # -- the streams, the run, the scoreboard -------------------------------------------
    def _i_stall(self, prefix):
        self._i_stalled = True

    def _o_stall(self, prefix):
        self._o_stalled = True

    def _take(self, raw):
        """A response taken from ``o`` (the sink's ``fn``): coverage only."""
        op = op_name(self.rsp.unpack(raw)["op"])
        self.cov.take({"op": op, "stall": "stalled" if self._o_stalled else "direct"})
        self._o_stalled = False

    def _compare(self, want, got):
        return self._run.response(want, got)

    def _feed(self, cmd):
        self.fed += 1
        self.src.send([cmd])

    def _on_i(self) -> bool:
        """A command is offered on ``i`` and not taken yet (not waiting out
        an idle cycle in the source)."""
        return self.fed > len(self.src.sent) and not self.src.queue

    def _busy(self) -> bool:
        """A command is still to be sent or its response still due."""
        return bool(self.fed > len(self.src.sent) or self.queue or self.scoreboard.expected)

    async def run(self, refill=None, *, max_errors=10):
        """Drive the queue (``refill()`` tops it up while it returns True)
        until every response has arrived and been checked (:class:`_Run`),
        then one more cycle with ``i.valid`` and the commit strobe low; fail
        on any error so far."""
        run = self._run = _Run(self, refill, max_errors)
        await self.loop.run([self.src, run], [self.sink], limit=math.inf, before=run.before,
                            stop=run.stop)
        await self.loop.run([], [], limit=self.loop.cycle + 1, before=run.release)
        run.close()
        self.report()

    def report(self):
        """Raise AssertionError on any error: a golden or timing mismatch, a
        stream-rule violation on ``o``, a response extra or missing."""
        errs = list(self.errors)
        errs += [f"stream rule at cycle {c}: {m}" for c, m in self.sink.rule_violations]
        try:
            self.scoreboard.finish(f"cycle {self.cycle}")
        except AssertionError as e:
            errs.append(str(e))
        if errs:
            raise AssertionError(f"{len(errs)} mismatches (seed {cocotb.RANDOM_SEED}); first: "
                                 + "; ".join(errs[:3]))
        assert not self.queue, "commands left unsent"

    def save_coverage(self, run: str, transactions: int):
        write_coverage(BLOCK, run=f"{knob('coverage_run', '')}:{run}", transactions=transactions)


class _Run:
    """One :meth:`TagTB.run`: the bench's part of each cycle around the
    kit's command source and response sink, in the order of the
    :class:`~elmoe3d.tb.kit.CycleLoop`: :meth:`before` (the script:
    ``refill``, barriers, waits, commit and disabled events, the next
    command handed to the source), the source's drive (its idle draw),
    :meth:`drive` (HB and KV models, the ``commit`` and ``disabled``
    ports), the sink's drive (its back-pressure draw); in ReadOnly the
    source's sample, :meth:`sample` (the golden side, the command transfer,
    ``resident`` / ``pending``), the sink's sample (stream rules, the take).
    That order fixes the sequence of random draws (``refill``, idle, HB,
    KV, back-pressure), so a seed replays a run.

    The golden model lags the hardware: events of cycle c (commit strobe,
    disabled) are applied once no command can still turn out to have
    executed in c or before (a response queued behind a stalled one shows
    its execution cycle only when it reaches ``o``), and the ``resident`` /
    ``pending`` outputs of cycle c are compared once the model stands at the
    end of cycle c - 1.
    """

    def __init__(self, tb: TagTB, refill, max_errors: int):
        self.tb, self.refill, self.max_errors = tb, refill, max_errors
        self.more = refill is not None
        self.smask = (1 << tb.S) - 1
        self.quiet = self.waiting = 0
        self.halt = False
        self.commit_now = None
        self.prev = (None, tb.dis_now)          # events of the previous cycle
        self.prev2_dis = tb.dis_now
        self.o_prev_valid = self.o_prev_taken = False
        self.last_accept = self.last_exec = -10
        self.ev = collections.deque()           # (cycle, commit, disabled, disabled of the cycle before)
        self.res_chk = collections.deque()      # (cycle, resident, pending, disabled)
        self.applied = tb.cycle - 1             # events applied up to this cycle
        self.head_fv = None                     # first-valid cycle of the response on ``o``
        self.pend_seen = 0

    # -- the golden model's pace ---------------------------------------------------
    def apply_events(self, upto):
        while True:
            # the model stands at the end of cycle self.applied: compare the
            # outputs of the cycle after it, then step one cycle further
            while self.res_chk and self.res_chk[0][0] - 1 <= self.applied:
                self.check_outputs()
            if self.applied >= upto:
                break
            self.applied += 1
            while self.ev and self.ev[0][0] <= self.applied:
                _, e_commit, e_dis, _ = self.ev.popleft()
                self.tb._golden_events(e_commit, e_dis)

    def check_outputs(self):
        c, res_rtl, pend_rtl, dis_c = self.res_chk.popleft()
        m = self.tb.model
        res_want = m.resident_mask() & ~dis_c & self.smask
        pend_want = m.pending_mask() & ~dis_c & self.smask
        if (res_rtl, pend_rtl) != (res_want, pend_want):
            self.tb.errors.append(f"cycle {c}: resident/pending {res_rtl:#x}/{pend_rtl:#x}, "
                                  f"expected {res_want:#x}/{pend_want:#x}")

    def response(self, want, got: _Response):
        """The scoreboard's comparison: the golden response of command
        ``want`` = ``(command, accept cycle)``, executed in the cycle
        :func:`execution_cycle` derives from ``got``, against ``got``;
        None if equal, else the mismatch. Timing errors go to the bench's
        errors."""
        tb = self.tb
        cmd, accept = want
        cyc = got.cycle
        ex = execution_cycle(cyc, got.pred_first_valid)
        if ex <= self.applied:
            self.halt = True
            return (f"cycle {cyc}: response of {cmd} implies execution in cycle {ex}, "
                    "already closed (rule of execution_cycle)")
        self.apply_events(ex - 1)
        e = self.ev[0] if self.ev and self.ev[0][0] == ex else (ex, None, tb.dis_now, tb.dis_now)
        e_commit, e_dis, e_dis0 = e[1], e[2], e[3]
        event = ("both" if e_commit is not None and e_dis != e_dis0 else
                 "commit" if e_commit is not None else
                 "disabled" if e_dis != e_dis0 else "none")
        entry = max(accept + 2, self.last_exec + 1)
        if ex <= self.last_exec:
            tb.errors.append(f"cycle {cyc}: response order: execution cycle {ex} "
                             f"not after {self.last_exec}")
        msg = tb._golden_command(cmd, got.raw, accept, ex, event, entry)
        self.last_exec = ex
        return msg

    # -- the cycle -------------------------------------------------------------------
    def before(self, cyc):
        """The script, while no command is on ``i``: ``refill``, barriers,
        waits, commit and disabled events, and the next command handed to
        the source (which draws its idle cycles)."""
        tb, queue = self.tb, self.tb.queue
        self.commit_now = None
        if self.waiting:
            self.waiting -= 1
        elif not tb._on_i():
            if self.more and len(queue) + len(tb.src.queue) < tb.refill_below:
                self.more = bool(self.refill())
            if tb.src.queue:                    # the command waits out an idle cycle
                return
            while queue and queue[0][0] != "cmd":
                kind = queue[0][0]
                if kind == "barrier":
                    if tb.scoreboard.expected:
                        break
                    queue.popleft()
                elif kind == "wait":
                    self.waiting = queue.popleft()[1]
                    break
                elif kind == "commit":
                    if self.commit_now is not None:
                        break
                    self.commit_now = queue.popleft()[1]
                else:
                    tb.dis_now = queue.popleft()[1]
            if not self.waiting and queue and queue[0][0] == "cmd":
                tb._feed(queue.popleft()[1])

    def drive(self, cyc):
        """HB and KV models (after the source's idle draw), the ``commit``
        and ``disabled`` ports."""
        tb, dut = self.tb, self.tb.dut
        if tb.hb_auto and self.commit_now is None:
            self.commit_now = tb._hb(self.pend_seen)
            if self.commit_now is not None:
                tb.shadow.commit(self.commit_now)
        if tb.kv_auto:
            new = tb._kv()
            if new != tb.dis_now:
                tb.dis_now = new
                tb.shadow.set_disabled(new)
                tb.events_driven["disabled"] += 1
        dut.commit__valid.value = self.commit_now is not None
        dut.commit__slot.value = self.commit_now or 0
        dut.disabled.value = tb.dis_now
        if self.commit_now is not None:
            tb.events_driven["commit"] += 1

    def sample(self):
        """In ReadOnly: each command in its execution cycle, after the events
        of the cycles before it and before the events of its own (a
        response is checked when it first becomes valid, not when the sink
        takes it: its execution cycle follows from that cycle); the command
        transfer on ``i``; ``resident`` / ``pending`` every cycle."""
        tb, dut = self.tb, self.tb.dut
        cyc = tb.cycle
        p_commit, p_dis = self.prev
        self.ev.append((cyc - 1, p_commit, p_dis, self.prev2_dis))
        ov = bool(dut.o__valid.value)
        raw = dut.o__payload.value.to_unsigned() if ov else None
        if ov and (not self.o_prev_valid or self.o_prev_taken):
            if not tb.scoreboard.expected:
                tb.scoreboard.check(dict(tb.rsp.unpack(raw), cycle=cyc))   # none expected
                self.halt = True
                return
            tb.scoreboard.check(_Response(cyc, raw, self.head_fv if self.o_prev_valid else None))
            if self.halt:
                return
            self.head_fv = cyc
        elif not ov:
            self.head_fv = None
        # no command still to come can have executed before this cycle
        self.apply_events((cyc if self.head_fv is None else self.head_fv) - RESPONSE_DELAY)
        if len(tb.src.sent) > tb.sent:          # the command on i transferred
            cmd = tb.src.sent[-1][1]
            kind = ("stalled" if tb._i_stalled else
                    "back_to_back" if self.last_accept == cyc - 1 else "idle")
            tb.cov.accept({"op": op_name(cmd["op"]), "kind": kind})
            tb.scoreboard.expect((cmd, cyc))
            self.last_accept = cyc
            tb.sent += 1
            tb._i_stalled = False
        self.o_prev_valid, self.o_prev_taken = ov, ov and tb.sink.rdy
        res_rtl, pend_rtl = dut.resident.value.to_unsigned(), dut.pending.value.to_unsigned()
        self.res_chk.append((cyc, res_rtl, pend_rtl, tb.dis_now))
        self.apply_events(self.applied)
        if tb.resident_trace is not None:
            tb.resident_trace.append((cyc, res_rtl, self.commit_now))
        self.pend_seen = pend_rtl
        self.prev2_dis = p_dis
        self.prev = (self.commit_now, tb.dis_now)
        # (a run ends only once `o` is empty: a response held under
        # back-pressure past the quiet cycles had been left on `o` for
        # the next run, which saw it as a response without a command)
        if not tb._busy() and not self.more and not self.waiting and not ov:
            self.quiet += 1
        else:
            self.quiet = 0

    def stop(self) -> bool:
        """Asked before each cycle: after a fatal or the ``max_errors``-th
        error, a stream-rule violation, or 9 quiet cycles (nothing extra may
        arrive)."""
        tb = self.tb
        return (self.halt or self.quiet > 8 or bool(tb.sink.rule_violations)
                or len(tb.errors) + len(tb.scoreboard.errors) >= self.max_errors)

    def release(self, cyc):
        """The cycle after the run: ``i.valid`` and the commit strobe low."""
        self.tb.src.valid.value = 0
        self.tb.dut.commit__valid.value = 0

    def close(self):
        """Apply the events up to the run's last cycle."""
        cyc = self.tb.cycle
        self.ev.append((cyc - 1, self.prev[0], self.prev[1], self.prev2_dis))
        self.apply_events(cyc - 1)


# -- random traffic -------------------------------------------------------------------------

#: opcode weights of the random phases
PHASES = {
    "mixed": {TagOp.LOOKUP: 20, TagOp.LOOKUP_PIN: 10, TagOp.TOUCH: 12, TagOp.DECAY: 2,
              TagOp.ALLOCATE: 18, TagOp.INVALIDATE: 4, TagOp.INVALIDATE_SLOT: 3,
              TagOp.INVALIDATE_MASK: 1, TagOp.PIN: 6, TagOp.UNPIN: 12, TagOp.ABORT: 3,
              TagOp.RESET: 0.05, TagOp.STATS: 2, "bad": 0.5},
    "pin_heavy": {TagOp.LOOKUP: 10, TagOp.LOOKUP_PIN: 15, TagOp.TOUCH: 4, TagOp.DECAY: 1,
                  TagOp.ALLOCATE: 15, TagOp.INVALIDATE: 4, TagOp.INVALIDATE_SLOT: 3,
                  TagOp.INVALIDATE_MASK: 2, TagOp.PIN: 20, TagOp.UNPIN: 8, TagOp.ABORT: 2,
                  TagOp.RESET: 0.02, TagOp.STATS: 1, "bad": 0.5},
    "churn": {TagOp.LOOKUP: 15, TagOp.LOOKUP_PIN: 5, TagOp.TOUCH: 8, TagOp.DECAY: 2,
              TagOp.ALLOCATE: 30, TagOp.INVALIDATE: 10, TagOp.INVALIDATE_SLOT: 6,
              TagOp.INVALIDATE_MASK: 3, TagOp.PIN: 3, TagOp.UNPIN: 20, TagOp.ABORT: 6,
              TagOp.RESET: 0.02, TagOp.STATS: 2, "bad": 0.5},
    "hot": {TagOp.LOOKUP: 25, TagOp.LOOKUP_PIN: 5, TagOp.TOUCH: 40, TagOp.DECAY: 8,
            TagOp.ALLOCATE: 8, TagOp.INVALIDATE: 2, TagOp.INVALIDATE_SLOT: 1,
            TagOp.INVALIDATE_MASK: 0.5, TagOp.PIN: 3, TagOp.UNPIN: 6, TagOp.ABORT: 1,
            TagOp.RESET: 0.02, TagOp.STATS: 2, "bad": 0.5},
}


def random_batch(tb: TagTB, n: int, pool: list, weights: dict):
    """``n`` random commands decided on the shadow model: tags mostly from
    ``pool``; slot-addressed ops mostly name slots in a useful state."""
    sh, rand, S = tb.shadow, tb.rand, tb.S
    keys = list(weights)
    picks = rand.choices(keys, weights=[weights[k] for k in keys], k=n)
    hot_max = sh.hot_max
    plane_max = (1 << sh.plane_bits) - 1
    slot_top = (1 << sh.slot_bits) - 1
    for k in picks:
        tag = rand.choice(pool) if rand.random() < 0.95 else tb.rand_tag()
        if k == "bad":
            tb.issue(rand.randint(13, 15), tag=tag, slot=rand.randint(0, slot_top),
                     amount=rand.randint(0, hot_max), slot_mask=rand.getrandbits(S))
            continue
        op = k
        if op in (TagOp.PIN, TagOp.UNPIN, TagOp.ABORT, TagOp.INVALIDATE_SLOT):
            held = [s for s in range(S) if sh.valid[s]]
            if op == TagOp.UNPIN:
                want = [s for s in held if sh.pins[s]]
            elif op == TagOp.ABORT:
                want = [s for s in range(S) if sh.pending[s]]
            elif op == TagOp.INVALIDATE_SLOT:
                want = [s for s in held if not sh.pins[s]]
            else:
                want = held
            r = rand.random()
            if r < 0.75 and want:
                slot = rand.choice(want)
            elif r < 0.9:
                slot = rand.randrange(S)
            else:
                slot = rand.randint(0, slot_top)
            tb.issue(op, slot=slot, tag=tag)
        elif op == TagOp.INVALIDATE_MASK:
            free_ok = [s for s in range(S) if not sh.pins[s]]
            mask = 0
            for s in rand.sample(range(S), rand.randint(1, max(1, S // 3))):
                if s in free_ok or rand.random() < 0.3:
                    mask |= 1 << s
            tb.issue(op, slot_mask=mask)
        elif op == TagOp.STATS:
            tb.issue(op, slot=rand.randint(0, slot_top))
        else:
            amount = (hot_max if rand.random() < 0.1 else
                      rand.randint(0, hot_max) if rand.random() < 0.3 else rand.randint(0, 3))
            tb.issue(op, tag=tag, amount=amount, planes=rand.randint(0, plane_max),
                     slot=rand.randint(0, slot_top))


async def _random_run(dut, target: int, name: str):
    tb = TagTB(dut)
    tb.set_idle_generator(0.2)
    tb.set_backpressure_generator(0.25)
    tb.hb_auto = tb.kv_auto = True
    await tb.start()
    state = {"left": target}

    def refill():
        if state["left"] <= 0:
            return False
        n = min(500, state["left"])
        size = tb.rand.choice((tb.S // 2, tb.S, tb.S + tb.S // 2, 2 * tb.S, 3 * tb.S))
        pool = [tb.rand_tag() for _ in range(max(2, size))]
        phase = tb.rand.choice(list(PHASES))
        tb.set_idle_generator(tb.rand.choice((0.0, 0.0, 0.1, 0.3)))
        tb.set_backpressure_generator(tb.rand.choice((0.0, 0.1, 0.3, 0.6)))
        tb.commit_p = tb.rand.choice((0.05, 0.3, 1.0))
        random_batch(tb, n, pool, PHASES[phase])
        state["left"] -= n
        tb.model.check_invariants()
        return True

    t0 = time.monotonic()
    await tb.run(refill)
    tb.kv_auto = tb.hb_auto = False
    tb.read_stats()
    await tb.run()
    dut._log.info("%s: %d commands checked in %d cycles (%.1f s); errors %s; events %s",
                  name, tb.checked, tb.cycle, time.monotonic() - t0,
                  dict(sorted(tb.error_codes.items())), dict(tb.events_driven))
    assert tb.checked >= target
    tb.save_coverage(name, tb.checked)
    return tb


@cocotb.test()
async def random_commands(dut):
    """Random commands (``TAG_COMMANDS``, default 10,000) in phases of
    differently weighted mixes of every opcode, tag pools S/2..3S, bad
    commands of every kind; random idle cycles on the command stream,
    random response back-pressure, HB commit strobes (some naming slots
    that are not PENDING) and KV boundary moves (some arbitrary masks)."""
    await _random_run(dut, knob("tag_commands", 10_000), "random_commands")


# -- directed traces ------------------------------------------------------------------------

def _fill_resident(tb: TagTB, tags, hot=lambda k: 0, planes=1):
    """ALLOCATE each tag, commit it (HB) and UNPIN it (controller): the pure-cache fill."""
    slots = []
    for k, t in enumerate(tags):
        r = tb.issue(TagOp.ALLOCATE, tag=t, amount=hot(k), planes=planes)
        assert r["error"] == TagError.OK, r
        tb.barrier()
        tb.commit(r["slot"])
        tb.issue(TagOp.UNPIN, slot=r["slot"])
        slots.append(r["slot"])
    return slots


@cocotb.test()
async def allocate_pins_its_victim(dut):
    """Issue 10, defect 5: on a full cache ``ALLOCATE A`` then ``ALLOCATE B``
    must take two different slots (A's slot is PENDING and pinned, so B
    cannot evict it while A's fill is in flight). A pending tag is not a
    hit (LOOKUP, LOOKUP_PIN, TOUCH report it as pending), INVALIDATE of it
    is PINNED, ABORT frees it; its commit makes it a hit with the pin
    kept until UNPIN."""
    tb = TagTB(dut)
    tb.set_idle_generator(0.1)
    tb.set_backpressure_generator(0.2)
    await tb.start()
    S, m = tb.S, tb.shadow
    tags = tb.rand.sample(range(1 << m.tag_bits), S + 3)
    _fill_resident(tb, tags[:S], hot=lambda k: 5)
    a = tb.issue(TagOp.ALLOCATE, tag=tags[S], amount=1)
    b = tb.issue(TagOp.ALLOCATE, tag=tags[S + 1], amount=1)
    assert a["error"] == b["error"] == TagError.OK and a["slot"] != b["slot"], (a, b)
    assert a["evicted"] and b["evicted"] and b["evicted_tag"] != tags[S], (a, b)
    for op in (TagOp.LOOKUP, TagOp.LOOKUP_PIN, TagOp.TOUCH):
        r = tb.issue(op, tag=tags[S], amount=1)
        assert r["pending"] == 1 and r["hit"] == 0 and r["slot"] == a["slot"], (op, r)
    assert tb.issue(TagOp.ALLOCATE, tag=tags[S])["error"] == TagError.PENDING
    assert tb.issue(TagOp.INVALIDATE, tag=tags[S])["error"] == TagError.PINNED
    assert tb.issue(TagOp.INVALIDATE_SLOT, slot=a["slot"])["error"] == TagError.PINNED
    assert tb.issue(TagOp.ABORT, slot=b["slot"])["evicted_tag"] == tags[S + 1]
    assert tb.issue(TagOp.LOOKUP, tag=tags[S + 1])["hit"] == 0
    assert tb.issue(TagOp.ABORT, slot=b["slot"])["error"] == TagError.NOT_PENDING
    tb.barrier()
    tb.commit(a["slot"])
    r = tb.issue(TagOp.LOOKUP_PIN, tag=tags[S])
    assert r["hit"] == 1 and m.pins[a["slot"]] == 2, r
    assert tb.issue(TagOp.ABORT, slot=a["slot"])["error"] == TagError.NOT_PENDING
    tb.issue(TagOp.UNPIN, slot=a["slot"])
    tb.issue(TagOp.UNPIN, slot=a["slot"])
    assert tb.issue(TagOp.INVALIDATE, tag=tags[S])["hit"] == 1
    tb.read_stats()
    await tb.run()
    tb.save_coverage("allocate_pins_its_victim", 0)


@cocotb.test()
async def kv_disabled_slots(dut):
    """The KV region covers the highest slots first and victims are taken
    from slot 0 up: a covered slot holding a tag is freed in the cycle it is
    covered (``resident`` drops that cycle), is never a hit and never a
    victim; with every enabled slot pinned ALLOCATE answers NO_VICTIM even
    though covered slots exist; uncovering gives FREE slots back."""
    tb = TagTB(dut)
    tb.set_idle_generator(0.1)
    tb.set_backpressure_generator(0.2)
    tb.resident_trace = []
    await tb.start()
    S, m = tb.S, tb.shadow
    tags = tb.rand.sample(range(1 << m.tag_bits), 2 * S)
    slots = _fill_resident(tb, tags[:S])
    assert slots == list(range(S)), slots                  # lowest index first
    k = max(1, S // 4)
    top = ((1 << k) - 1) << (S - k)
    tb.barrier()
    tb.set_disabled(top)
    for t in tags[S - k:S]:                                 # covered: gone
        assert tb.issue(TagOp.LOOKUP, tag=t)["hit"] == 0
    for s in range(S - k, S):
        assert tb.issue(TagOp.PIN, slot=s)["error"] == TagError.NOT_VALID
    for j in range(S - k):                                  # pin every enabled slot
        tb.issue(TagOp.PIN, slot=j)
    assert tb.issue(TagOp.ALLOCATE, tag=tags[S])["error"] == TagError.NO_VICTIM
    tb.issue(TagOp.UNPIN, slot=S - k - 1)
    r = tb.issue(TagOp.ALLOCATE, tag=tags[S])
    assert r["slot"] == S - k - 1 and r["evicted_tag"] == tags[S - k - 1], r
    tb.barrier()
    tb.set_disabled(0)
    r = tb.issue(TagOp.ALLOCATE, tag=tags[S + 1])           # the lowest uncovered FREE slot
    assert r["slot"] == S - k and not r["evicted"], r
    # a pending slot covered: freed (pins cleared), its commit strobe ignored
    tb.barrier()
    tb.set_disabled(1 << (S - k))
    tb.barrier()
    tb.commit(S - k)
    assert tb.issue(TagOp.LOOKUP, tag=tags[S + 1])["pending"] == 0
    assert tb.issue(TagOp.ABORT, slot=S - k)["error"] == TagError.NOT_PENDING
    tb.barrier()
    tb.set_disabled(0)
    assert tb.read_stats()["kv_frees"] == k + 1, tb.shadow.stats()
    tb.issue(TagOp.RESET)
    await tb.run()
    tb.save_coverage("kv_disabled_slots", 0)


@cocotb.test()
async def commit_same_edge(dut):
    """A commit strobe in cycle t: ``resident`` of that slot is 0 in t and 1
    from t + 1 on (the edge at which HB sets its valid bit); a LOOKUP that
    executes in t still sees the slot PENDING (step order: command,
    disabled, commit), as the golden model in the scoreboard requires."""
    tb = TagTB(dut)
    tb.resident_trace = []
    await tb.start()
    m = tb.shadow
    tags = tb.rand.sample(range(1 << m.tag_bits), 4)
    for t in tags:
        tb.issue(TagOp.ALLOCATE, tag=t)
    tb.barrier()
    for s in range(4):
        tb.commit(s)
        for _ in range(s):
            tb.issue(TagOp.LOOKUP, tag=tags[s])
        tb.barrier()
    await tb.run()
    trace = tb.resident_trace
    for c, res, strobe in trace:
        if strobe is not None:
            nxt = [r for cc, r, _ in trace if cc == c + 1][0]
            assert not (res >> strobe) & 1 and (nxt >> strobe) & 1, (c, res, nxt, strobe)
    assert sum(1 for _, _, s in trace if s is not None) == 4
    tb.save_coverage("commit_same_edge", 0)


@cocotb.test()
async def free_and_cover_same_cycle(dut):
    """A command that frees a slot (INVALIDATE, INVALIDATE_SLOT,
    INVALIDATE_MASK, ABORT, RESET) executing in the very cycle in which
    ``disabled`` covers that slot: step order is command, then disabled, so
    the slot is freed by the command and ``kv_frees`` does *not* count it
    (regression: the RTL counted every held slot covered in the cycle, even
    one the command freed; found by the random run at seed 854843070, STATS
    of ``kv_frees`` one higher than the golden). The delay between the
    command and the cover sweeps a window of cycles, so that for every
    opcode at least one run lands in the same cycle; the test asserts it
    did. The window is ``victim_settle + 4`` cycles wide: INVALIDATE_MASK
    waits ``P``-dependent cycles for the state to settle, and a cover paced
    by back-to-back commands alone (as this test first did) reaches it only
    at S <= 16 (at S = 32 it lands either before it, restarting the wait, or
    after it), so the window is idle cycles beyond the first two."""
    tb = TagTB(dut)
    await tb.start()
    m = tb.shadow
    kv = STAT_NAMES.index("kv_frees")
    ops = (TagOp.INVALIDATE, TagOp.INVALIDATE_SLOT, TagOp.INVALIDATE_MASK, TagOp.ABORT,
           TagOp.RESET)
    for op in ops:
        for w in range(tb.settle + 4):
            tb.issue(TagOp.RESET)
            tb.barrier()
            t = tb.rand_tag()
            if op == TagOp.ABORT:                        # a PENDING slot, pinned by its ALLOCATE
                s = tb.issue(TagOp.ALLOCATE, tag=t)["slot"]
            else:                                        # a RESIDENT, unpinned slot
                s = _fill_resident(tb, [t])[0]
            tb.barrier()
            tb.issue(op, tag=t, slot=s, slot_mask=1 << s)
            # the cover 1 + w cycles after the command's transfer: right after
            # it (w = 0), behind one back-to-back LOOKUP (w = 1), after idle cycles
            if w == 1:
                tb.issue(TagOp.LOOKUP, tag=t ^ 1)
            elif w > 1:
                tb.wait(w - 1)
            tb.set_disabled(1 << s)
            tb.barrier()
            tb.set_disabled(0)
            tb.barrier()
            tb.issue(TagOp.STATS, slot=kv)
            tb.barrier()
    await tb.run()
    for op in ops:
        name = op_name(int(op))
        same = tb.exec_events[(name, "disabled")] + tb.exec_events[(name, "both")]
        assert same >= 1, (f"no {name} executed in the cycle of a disabled change "
                           f"(the sweep missed it): {dict(tb.exec_events)}")
    tb.save_coverage("free_and_cover_same_cycle", 0)


@cocotb.test()
async def invalidate_slot_and_mask(dut):
    """INVALIDATE_SLOT frees one slot (FREE slot: no change; pinned: PINNED);
    INVALIDATE_MASK frees every masked slot or, if one of them is pinned,
    none (PINNED), and reports the slots that held a tag."""
    tb = TagTB(dut)
    tb.set_idle_generator(0.2)
    tb.set_backpressure_generator(0.3)
    await tb.start()
    S, m = tb.S, tb.shadow
    tags = tb.rand.sample(range(1 << m.tag_bits), S)
    _fill_resident(tb, tags)
    r = tb.issue(TagOp.INVALIDATE_SLOT, slot=1)
    assert r["hit"] and r["evicted_tag"] == tags[1], r
    assert tb.issue(TagOp.INVALIDATE_SLOT, slot=1)["evicted"] == 0
    tb.issue(TagOp.PIN, slot=2)
    assert tb.issue(TagOp.INVALIDATE_SLOT, slot=2)["error"] == TagError.PINNED
    assert tb.issue(TagOp.INVALIDATE_MASK, slot_mask=0b1111)["error"] == TagError.PINNED
    assert m.valid[0] and m.valid[3]                           # nothing freed
    tb.issue(TagOp.UNPIN, slot=2)
    r = tb.issue(TagOp.INVALIDATE_MASK, slot_mask=0b1111)
    assert r["slot_mask"] == 0b1101, r
    assert tb.issue(TagOp.INVALIDATE_MASK, slot_mask=(1 << S) - 1)["slot_mask"] == \
        ((1 << S) - 1) & ~0b1111
    assert not any(m.valid)
    # a PENDING slot whose ALLOCATE pin was released before its fill
    # committed: INVALIDATE_MASK frees it (PENDING -> FREE) and names it
    a = tb.issue(TagOp.ALLOCATE, tag=tags[0], amount=1)
    assert a["error"] == TagError.OK, a
    tb.issue(TagOp.UNPIN, slot=a["slot"])
    r = tb.issue(TagOp.INVALIDATE_MASK, slot_mask=1 << a["slot"])
    assert r["error"] == TagError.OK and r["slot_mask"] == 1 << a["slot"], r
    assert tb.issue(TagOp.LOOKUP, tag=tags[0])["pending"] == 0
    a = tb.issue(TagOp.ALLOCATE, tag=tags[1], amount=1)        # the same by INVALIDATE_SLOT
    tb.issue(TagOp.UNPIN, slot=a["slot"])
    r = tb.issue(TagOp.INVALIDATE_SLOT, slot=a["slot"])
    assert r["error"] == TagError.OK and r["evicted_tag"] == tags[1], r
    if (1 << m.slot_bits) > S:
        for op in (TagOp.INVALIDATE_SLOT, TagOp.PIN, TagOp.UNPIN, TagOp.ABORT):
            assert tb.issue(op, slot=S)["error"] == TagError.BAD_SLOT
    await tb.run()
    tb.save_coverage("invalidate_slot_and_mask", 0)


@cocotb.test()
async def all_pinned(dut):
    """Every slot PENDING (pinned by ALLOCATE): ALLOCATE answers NO_VICTIM;
    committed but still pinned: NO_VICTIM; one UNPIN makes exactly that slot
    the victim; PIN up to the limit; UNPIN of an unpinned or free slot and
    PIN of a free slot are refused."""
    tb = TagTB(dut)
    tb.set_idle_generator(0.2)
    tb.set_backpressure_generator(0.2)
    await tb.start()
    S, m = tb.S, tb.shadow
    tags = tb.rand.sample(range(1 << m.tag_bits), S + 4)
    for k in range(S):
        tb.issue(TagOp.ALLOCATE, tag=tags[k], amount=tb.rand.randint(0, m.hot_max), planes=1)
    assert tb.issue(TagOp.ALLOCATE, tag=tags[S])["error"] == TagError.NO_VICTIM
    tb.barrier()
    for s in range(S):
        tb.commit(s)
    assert tb.issue(TagOp.ALLOCATE, tag=tags[S])["error"] == TagError.NO_VICTIM
    for _ in range(m.pin_max):                              # last one: PIN_LIMIT
        r = tb.issue(TagOp.PIN, slot=S // 2)
    assert r["error"] == TagError.PIN_LIMIT
    r = tb.issue(TagOp.LOOKUP_PIN, tag=tags[S // 2])
    assert r["error"] == TagError.PIN_LIMIT
    assert tb.issue(TagOp.INVALIDATE, tag=tags[3])["error"] == TagError.PINNED
    assert tb.issue(TagOp.ALLOCATE, tag=tags[5])["error"] == TagError.RESIDENT
    assert tb.issue(TagOp.UNPIN, slot=S - 1)["error"] == TagError.OK
    assert tb.issue(TagOp.UNPIN, slot=S - 1)["error"] == TagError.NOT_PINNED
    r = tb.issue(TagOp.ALLOCATE, tag=tags[S])
    assert r["error"] == TagError.OK and r["slot"] == S - 1 and r["evicted_tag"] == tags[S - 1]
    assert tb.issue(TagOp.ALLOCATE, tag=tags[S + 1])["error"] == TagError.NO_VICTIM
    tb.issue(TagOp.ABORT, slot=S - 1)
    assert tb.issue(TagOp.PIN, slot=S - 1)["error"] == TagError.NOT_VALID
    assert tb.issue(TagOp.UNPIN, slot=S - 1)["error"] == TagError.NOT_VALID
    assert tb.issue(TagOp.ALLOCATE, tag=tags[S + 1])["slot"] == S - 1   # the free slot
    tb.issue(TagOp.STATS, slot=(1 << m.slot_bits) - 1)
    tb.read_stats()
    tb.issue(TagOp.RESET)
    for k in range(4):
        tb.issue(TagOp.LOOKUP, tag=tags[k])
    tb.read_stats()
    await tb.run()
    tb.save_coverage("all_pinned", 0)


@cocotb.test()
async def thrash(dut):
    """A controller loop (LOOKUP_PIN; hit: TOUCH, UNPIN; miss: ALLOCATE,
    commit, UNPIN) over a working set larger than S cycled in order (every
    lookup misses, every allocation evicts), then one of exactly S (all hits)."""
    tb = TagTB(dut)
    tb.set_backpressure_generator(0.1)
    await tb.start()
    m = tb.shadow
    for ws, rounds in ((tb.S + tb.S // 2 + 1, 4), (2 * tb.S, 2), (tb.S, 3)):
        tb.issue(TagOp.RESET)
        tags = tb.rand.sample(range(1 << m.tag_bits), ws)
        for _ in range(rounds):
            for t in tags:
                r = tb.issue(TagOp.LOOKUP_PIN, tag=t)
                if r["hit"]:
                    tb.issue(TagOp.TOUCH, tag=t, amount=1)
                    tb.issue(TagOp.UNPIN, slot=r["slot"])
                else:
                    a = tb.issue(TagOp.ALLOCATE, tag=t, amount=1, planes=1)
                    tb.barrier()
                    tb.commit(a["slot"])
                    tb.issue(TagOp.UNPIN, slot=a["slot"])
        st = tb.read_stats()
        if ws > tb.S:
            assert st["evictions"] == st["allocations"] - tb.S, st
        else:
            assert st["hits"] == ws * (rounds - 1), st
    await tb.run()
    tb.save_coverage("thrash", 0)


@cocotb.test()
async def decay_and_saturation(dut):
    """TOUCH with large amounts saturates at 2**hot_bits - 1 (never wraps);
    repeated DECAY drives every counter to its fixed point of ``h -= h >> d``
    (0 for d = 0, otherwise below 2**d); statistics counters saturate when
    ``stat_bits`` is small; pin counters stop at the limit."""
    tb = TagTB(dut)
    tb.set_idle_generator(0.1)
    tb.set_backpressure_generator(0.1)
    await tb.start()
    m = tb.shadow
    tags = tb.rand.sample(range(1 << m.tag_bits), tb.S)
    _fill_resident(tb, tags, hot=lambda k: k % (m.hot_max + 1))
    for rep in range(4):
        for t in tags:
            r = tb.issue(TagOp.TOUCH, tag=t, amount=m.hot_max if rep else m.hot_max // 2 + 1)
            assert r["hit"]
    assert all(h == m.hot_max for h in m.hot)
    steps = 0
    while True:
        before = list(m.hot)
        tb.issue(TagOp.DECAY)
        for t in tags[::3]:
            tb.issue(TagOp.LOOKUP, tag=t)
        steps += 1
        if m.hot == before:
            break
        assert steps < 10 * (m.hot_bits + 1) << m.decay_shift
    assert all(h < (1 << m.decay_shift) if m.decay_shift else h == 0 for h in m.hot)
    if m.stat_bits <= 12:
        for _ in range((1 << m.stat_bits) + 5):
            tb.issue(TagOp.LOOKUP, tag=tags[1])
        st = tb.read_stats()
        assert st["lookups"] == st["hits"] == m.stat_max, st
    await tb.run()
    tb.save_coverage("decay_and_saturation", 0)


def zipf_probabilities(n: int, a: float) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** a
    return p / p.sum()


@cocotb.test()
async def zipf_trace(dut):
    """A Zipf-distributed expert stream driven like the cache controller, in a
    closed loop on the responses it receives (up to 4 LOOKUP_PINs in
    flight): a hit TOUCHes (+1) and stays pinned while "in use" (UNPIN a
    few accesses later); a miss ALLOCATEs (hot = 1; the slot is PENDING and
    pinned), HB commits it after a random delay and the controller UNPINs it
    later; a PENDING tag is left to its fill; DECAY every 64 accesses. The
    hit rate comes from the unit's own STATS and must equal the golden
    model's to the count."""
    tb = TagTB(dut)
    tb.set_idle_generator(0.05)
    tb.set_backpressure_generator(0.1)
    tb.hb_auto = True
    tb.bogus_commit_p = 0.0
    tb.commit_delay = (2, 30)
    tb.refill_below = 2
    await tb.start()
    m = tb.model
    target = knob("tag_zipf_commands", 20_000)
    layers = min(1 << m.layer_bits, 4)
    experts = min(1 << m.expert_bits, 64)
    alpha = 1.1
    p = zipf_probabilities(experts, alpha)
    perms = [tb.np_rng.permutation(experts) for _ in range(layers)]
    accesses = iter(zip(tb.np_rng.choice(experts, size=target, p=p).tolist(),
                        tb.np_rng.integers(0, layers, size=target).tolist()))
    in_use = collections.deque()            # slots whose pin this controller holds
    window = max(1, tb.S // 4)
    st = {"lookups": 0, "access": 0, "done": False}

    def issue(op, **kw):
        tb.issue(op, **kw)

    def on_response(cmd, r):
        op = cmd["op"]
        if op == TagOp.LOOKUP_PIN:
            st["lookups"] -= 1
            if r["error"] == TagError.OK and r["hit"]:
                issue(TagOp.TOUCH, tag=cmd["tag"], amount=1)
                in_use.append(r["slot"])
            elif r["error"] == TagError.OK and not r["pending"]:
                issue(TagOp.ALLOCATE, tag=cmd["tag"], amount=1,
                      planes=min(1, (1 << m.plane_bits) - 1))
        elif op == TagOp.ALLOCATE and r["error"] == TagError.OK:
            in_use.append(r["slot"])
        while len(in_use) > window:
            issue(TagOp.UNPIN, slot=in_use.popleft())

    def refill():
        if tb.issued >= target:
            if not st["done"] and not st["lookups"]:
                st["done"] = True
                while in_use:
                    issue(TagOp.UNPIN, slot=in_use.popleft())
            return not st["done"]
        while st["lookups"] < 4:
            rank, ly = next(accesses)
            issue(TagOp.LOOKUP_PIN, tag=m.make_tag(ly, int(perms[ly][rank])))
            st["lookups"] += 1
            st["access"] += 1
            if st["access"] % 64 == 0:
                issue(TagOp.DECAY)
        return True

    tb.on_response = on_response
    t0 = time.monotonic()
    await tb.run(refill)
    tb.on_response = None
    while in_use:
        issue(TagOp.UNPIN, slot=in_use.popleft())
    await tb.run()
    tb.hb_auto = False
    for s in range(tb.S):                      # the last fills commit
        if tb.model.pending[s]:
            tb.commit(s)
    tb.log = []
    tb.read_stats()
    await tb.run()
    wall = time.monotonic() - t0
    rtl_stats = {STAT_NAMES[c["slot"]]: got["value"] for c, _, _, got, _ in tb.log
                 if c["op"] == TagOp.STATS}
    golden = tb.model.stats()
    assert rtl_stats == golden, (rtl_stats, golden)      # equal to the scoreboard's golden
    assert not any(tb.model.pins), tb.model.pins         # every pin this controller took released
    hit_rate = rtl_stats["hits"] / max(1, rtl_stats["lookups"])
    dut._log.info("zipf_trace: %d commands, %d cycles, %.1f s; RTL STATS %s; errors %s; "
                  "hit rate %.4f (alpha %.2f, %d layers x %d experts, S=%d)", tb.checked,
                  tb.cycle, wall, rtl_stats, dict(tb.error_codes), hit_rate, alpha, layers,
                  experts, tb.S)
    out = knob("measure_out", "")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({
            "params": tb.p, "commands": tb.checked, "cycles": tb.cycle, "seconds": wall,
            "rtl_stats": rtl_stats, "golden_stats": golden, "hit_rate": hit_rate,
            "zipf_alpha": alpha, "layers": layers, "experts": experts,
            "seed": cocotb.RANDOM_SEED}, indent=2))
    tb.save_coverage("zipf_trace", tb.checked)


@cocotb.test()
async def latency_and_throughput(dut):
    """With an always-ready consumer: a back-to-back stream of every
    single-cycle operation with no input stall and every response exactly
    ``LATENCY`` (4) cycles after its command; ALLOCATE and INVALIDATE_MASK
    ``LATENCY + 1`` on a quiet state and ``LATENCY + victim_settle`` right
    behind a state-changing command; STATS ``LATENCY`` on a quiet state,
    ``LATENCY + 1`` right behind a LOOKUP, ``LATENCY + 2`` when a commit
    strobe and ``LATENCY + 1 + kv_count_stages`` (``LATENCY + 2`` up to 16
    slots) when a KV move arrives in the cycle after its transfer (the
    documented timing)."""
    tb = TagTB(dut)
    await tb.start()
    m, S, L, P = tb.shadow, tb.S, tb.latency, tb.settle
    tags = tb.rand.sample(range(1 << m.tag_bits), 2 * S)
    _fill_resident(tb, tags[:S])
    await tb.run()
    # 1. single-cycle operations, back to back
    tb.latencies.clear()
    tb.src.stalls = 0
    for _ in range(4):
        for t in tags:
            tb.issue(TagOp.LOOKUP, tag=t)
    for t in tags:
        for op in (TagOp.TOUCH, TagOp.LOOKUP, TagOp.TOUCH, TagOp.DECAY, 13):
            tb.issue(op, tag=t, amount=3)
    await tb.run()
    single = collections.Counter()
    for (name, la), n in tb.latencies.items():
        single[la] += n
    assert tb.src.stalls == 0, f"command stream stalled {tb.src.stalls} cycles"
    assert set(single) == {L}, dict(single)
    n_single = sum(single.values())
    # 2. the two-cycle operations: L + 1 each alone, one per two cycles back to back
    def two_cycle_ops(t, alone=False):
        for op, kw in ((TagOp.LOOKUP_PIN, {"tag": t}), (TagOp.PIN, {"slot": tb.rand.randrange(S)}),
                       (TagOp.UNPIN, {"slot": tb.rand.randrange(S)}),
                       (TagOp.INVALIDATE, {"tag": tags[tb.rand.randrange(len(tags))]}),
                       (TagOp.ABORT, {"slot": tb.rand.randrange(S)}),
                       (TagOp.INVALIDATE_SLOT, {"slot": tb.rand.randrange(S)})):
            tb.issue(op, **kw)
            if alone:
                tb.barrier()
    tb.log = []
    for t in tags[:4]:
        two_cycle_ops(t, alone=True)
    await tb.run()
    two = collections.Counter(e[2] for e in tb.log)
    assert set(two) == {L + 1}, dict(two)
    tb.log = []
    for t in tags:
        two_cycle_ops(t)
    await tb.run()
    n_two = len(tb.log)
    spacing = collections.Counter(b[4] - a[4] for a, b in zip(tb.log, tb.log[1:]))
    assert set(spacing) == {2}, dict(spacing)
    # 2. the waiting operations, on a quiet state and right behind a change
    tb.issue(TagOp.RESET)
    _fill_resident(tb, tags[:S])
    await tb.run()
    tb.log = []
    first = tb.issued
    marks = {}
    for op, kw, kw2 in ((TagOp.ALLOCATE, {"tag": tags[S]}, {"tag": tags[S + 1]}),
                        (TagOp.INVALIDATE_MASK, {"slot_mask": 1}, {"slot_mask": 2}),
                        (TagOp.STATS, {"slot": 0}, {"slot": 1})):
        tb.wait(P + 2)
        marks[(op.name, "quiet")] = tb.issued - first
        tb.issue(op, **kw)
        tb.barrier()
        tb.wait(P + 2)
        tb.issue(TagOp.LOOKUP if op == TagOp.STATS else TagOp.TOUCH, tag=tags[2], amount=1)
        marks[(op.name, "behind")] = tb.issued - first
        tb.issue(op, **kw2)
        tb.barrier()
    # STATS with a KV move (covering the top slot) or a commit strobe (of slot
    # 0, PENDING or not: STATS waits for any strobe) in the cycle after it
    tb.wait(P + 2)
    marks[("STATS", "kv_move")] = tb.issued - first
    tb.issue(TagOp.STATS, slot=STAT_NAMES.index("kv_frees"))
    tb.set_disabled(1 << (S - 1))
    tb.barrier()
    tb.wait(P + 2)
    marks[("STATS", "commit")] = tb.issued - first
    tb.issue(TagOp.STATS, slot=STAT_NAMES.index("commits"))
    tb.commit(0)
    tb.barrier()
    tb.set_disabled(0)
    await tb.run()
    got = {k: tb.log[i][2] for k, i in marks.items()}
    want = {("ALLOCATE", "quiet"): L + 1, ("ALLOCATE", "behind"): L + P,
            ("INVALIDATE_MASK", "quiet"): L + 1, ("INVALIDATE_MASK", "behind"): L + P,
            ("STATS", "quiet"): L, ("STATS", "behind"): L + 1,
            ("STATS", "kv_move"): L + 1 + tb.kv_stages, ("STATS", "commit"): L + 2}
    assert got == want, (got, want)
    dut._log.info("latency_and_throughput: %d single-cycle commands, 0 input stalls, latency %d; "
                  "%d two-cycle commands, latency %d; waiting ops %s (victim_settle P = %d)",
                  n_single, L, n_two, L + 1, got, P)
    out = knob("throughput_out", "")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({
            "params": tb.p, "commands": n_single, "stalls": 0, "latency_cycles": [L],
            "two_cycle_latency": L + 1, "victim_settle": P,
            "waiting_op_latency": {f"{k[0]}/{k[1]}": v for k, v in got.items()}}, indent=2))
    tb.save_coverage("latency_and_throughput", 0)


@cocotb.test()
async def one_lookup_per_cycle(dut):
    """Measured throughput: N back-to-back LOOKUPs with an always-ready
    consumer take exactly N cycles from the first response to the last."""
    tb = TagTB(dut)
    await tb.start()
    tags = tb.rand.sample(range(1 << tb.shadow.tag_bits), tb.S)
    _fill_resident(tb, tags)
    tb.barrier()
    N = 2000
    tb.log = []
    for k in range(N):
        tb.issue(TagOp.LOOKUP, tag=tags[k % tb.S])
    seen = []
    orig = tb._golden_command

    def spy(cmd, raw, accept, exec_cycle, event, entry):
        seen.append(exec_cycle)
        return orig(cmd, raw, accept, exec_cycle, event, entry)
    tb._golden_command = spy
    await tb.run()
    ex = seen[-N:]
    span = ex[-1] - ex[0] + 1
    assert span == N, f"{N} lookups executed over {span} cycles"
    dut._log.info("one_lookup_per_cycle: %d LOOKUPs in %d cycles (%.3f lookups/cycle)",
                  N, span, N / span)
    out = knob("throughput_out", "")
    if out:
        p = Path(out)
        d = json.loads(p.read_text()) if p.exists() else {}
        d["lookups_per_cycle"] = N / span
        d["lookups"] = N
        p.write_text(json.dumps(d, indent=2))

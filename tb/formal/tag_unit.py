"""Formal wrapper of :class:`elmoe3d.hw.tag_unit.TagUnit`: its safety
properties as Amaranth ``Assert`` / ``Assume`` statements for SymbiYosys
(:func:`elmoe3d.sim.run.formal.run_sby`). Test scaffolding, not a block.

Environment (``Assume``)
------------------------
* reset is never asserted (the run starts from the registers' reset values);
* the command stream obeys the stream rules (:func:`.common.stream_rules_all`:
  assumed on ``i``, asserted on ``o``). Everything else is free: opcodes
  (invalid ones included), tags, slots, masks, amounts, ``o.ready``, the
  ``commit`` strobe (any slot, any cycle, PENDING or not) and the
  ``disabled`` mask (any value, changing any cycle).

Reference state of a cycle
--------------------------
The properties state the contract of ``docs/architecture.md`` §4 directly on
the slot registers and the inputs (the response of a command executing in
cycle ``t`` is checked in ``t + 1``, in the response stage, against the
state of ``t``), in the step order of the golden model: a
command sees the registers at the start of its cycle; then the command, the
cycle's ``disabled`` frees and its commit strobe take effect. A held slot
that is RESIDENT is a hit, one that is not is PENDING; the slots a command
may take as FREE are the ones not disabled in the previous cycle (its
``disabled`` took effect at that edge).

Properties (``Assert``), every cycle
------------------------------------
``unique``          no two slots hold the same tag.
``disabled_free``   a slot that was disabled in the previous cycle holds no
                    tag (it is freed in the cycle it becomes disabled).
``victim``          an ALLOCATE that executes takes the lowest-index FREE
                    enabled slot, else the coldest unpinned RESIDENT enabled
                    slot (ties: lowest index) - computed here by a direct
                    search of the *current* state, so a stale pipelined victim
                    fails; NO_VICTIM exactly when there is none; RESIDENT /
                    PENDING exactly when a slot holds the tag in that state;
                    ``evicted`` / ``evicted_tag`` name the victim's old tag.
``lookup``          a LOOKUP / LOOKUP_PIN / TOUCH response with ``hit`` names
                    a RESIDENT slot holding the tag, with ``pending`` a
                    PENDING one, and with neither means no slot holds it:
                    PENDING and disabled (freed) slots never hit.
``pins_hold``       a pinned slot keeps its tag into the next cycle unless
                    RESET, ABORT of it, or ``disabled`` freed it.
``commit``          a slot becomes RESIDENT only by the previous cycle's
                    commit strobe, and a strobe of a PENDING slot that is not
                    freed in that cycle makes it RESIDENT (same edge as HB's
                    valid bit).
``no_wrap``         after a TOUCH the touched slot's hotness is
                    ``min(old + amount, max)``; after a DECAY no held slot's
                    hotness grew.
``stream``          stream rules on ``o``; at most 5 commands inside; never
                    a response without a command; the response stage
                    always finds room in the two-entry output queue.

Reachability (``Cover``, ``mode cover``): NO_VICTIM, an eviction, a pending
LOOKUP, a pending LOOKUP in the cycle its slot's commit strobe arrives, a
saturated TOUCH, PIN_LIMIT, a covered slot freed, a back-pressured response,
a response that waited in the output queue's skid register moving up.

Planted bugs (``bug=``): subclasses of :class:`TagUnit` that override one of
its small per-slot methods, so ``hw/`` carries no test hook:
``victim_ignores_pins``, ``hot_wraps``, ``pending_hits``, ``no_settle``
(ALLOCATE does not wait for the victim pipeline: the issue-10 double
allocation comes back).
"""

from __future__ import annotations

from amaranth.hdl import Array, Assert, Assume, Cat, Const, Cover, Module, Mux, ResetSignal, Signal
from amaranth.lib import wiring

from ...hw.tag_unit import TagErrorCode, TagOpcode, TagUnit
from .common import history_ok, stream_rules_all

__all__ = ["TagUnitFormal", "BUGS"]


class _VictimIgnoresPins(TagUnit):
    def _victim_candidate(self, held, res, pins, disabled):
        return ~disabled & (~held | res)


class _HotWraps(TagUnit):
    def _saturating_add(self, hot, amount):
        return (hot + amount)[:self.hot_bits]


class _PendingHits(TagUnit):
    def _hit_state(self, res):
        return Const(1)


class _NoSettle(TagUnit):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.victim_settle = 1


BUGS = {"victim_ignores_pins": _VictimIgnoresPins, "hot_wraps": _HotWraps,
        "pending_hits": _PendingHits, "no_settle": _NoSettle}


class TagUnitFormal(wiring.Component):
    """The tag unit with its properties; same ports as :class:`TagUnit`.

    Parameters
    ----------
    **params
        :class:`TagUnit` parameters (use a small instance: ``slots=4``).
    bug : str, optional
        One of :data:`BUGS`: plant that bug to show the properties fail.
    """

    def __init__(self, *, bug: str | None = None, **params):
        if bug is not None and bug not in BUGS:
            raise ValueError(f"Unknown planted bug {bug!r}; choose from {', '.join(BUGS)}")
        self.dut = BUGS.get(bug, TagUnit)(**params)
        super().__init__(self.dut.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        wiring.connect(m, wiring.flipped(self.i), dut.i)
        wiring.connect(m, dut.o, wiring.flipped(self.o))
        m.d.comb += [dut.commit.valid.eq(self.commit.valid), dut.commit.slot.eq(self.commit.slot),
                     dut.disabled.eq(self.disabled), self.resident.eq(dut.resident),
                     self.pending.eq(dut.pending)]
        S = dut.slots
        held, res, tags = dut.state_valid, dut.state_resident, dut.state_tag
        hot, pins = dut.state_hot, dut.state_pins
        dis = self.disabled
        hmax = (1 << dut.hot_bits) - 1
        # x: the command executing in this cycle; o: the final response of the
        # command that executed in the previous cycle (the response stage,
        # entering the output queue now), checked against that cycle's state
        x, o = dut.x_cmd, dut.r_rsp
        Op, Err = TagOpcode, TagErrorCode

        m.d.comb += Assume(~ResetSignal())
        ok = history_ok(m)
        stream_rules_all(m, self)
        # the registered "may execute" equals its definition every cycle
        m.d.comb += Assert(dut.x_go == dut.x_go_ref, "fire: x_go differs from x_valid & ~waits")

        # ---- reference state of this cycle (step order: disabled, commit, command)
        cm = [self.commit.valid & (self.commit.slot == s) for s in range(S)]
        res_e = [held[s] & res[s] for s in range(S)]
        pend_e = [held[s] & ~res[s] for s in range(S)]

        # ---- one-cycle history --------------------------------------------------
        def past(v, name):
            p = Signal.like(v, name=f"p_{name}")
            m.d.sync += p.eq(v)
            return p
        p_fire = past(dut.x_fire, "fire")
        p_op = past(x.op.as_value(), "op")
        p_tag = past(x.tag, "tag")
        p_slot = past(x.slot, "slot")
        p_amount = past(x.amount, "amount")
        p_dis = past(dis, "dis")
        p_held = [past(held[s], f"held{s}") for s in range(S)]
        p_res = [past(res[s], f"res{s}") for s in range(S)]
        p_cm = [past(cm[s], f"cm{s}") for s in range(S)]
        p_tags = [past(tags[s], f"tag{s}") for s in range(S)]
        p_hot = [past(hot[s], f"hot{s}") for s in range(S)]
        p_pins = [past(pins[s], f"pins{s}") for s in range(S)]
        p_ok = past(dut.x_fire & (dut.x_error == Err.OK), "applied")
        p_xtag = past(x.tag, "xtag")
        p_tags_a = Array(p_tags)
        p_res_e = Array([p_held[s] & p_res[s] for s in range(S)])
        p_pend_e = Array([p_held[s] & ~p_res[s] for s in range(S)])

        # ---- unique / disabled_free ---------------------------------------------
        for s in range(S):
            for t in range(s + 1, S):
                m.d.comb += Assert(~(held[s] & held[t] & (tags[s] == tags[t])),
                                   f"unique: slots {s} and {t} hold the same tag")
            with m.If(ok & p_dis[s]):
                m.d.comb += Assert(~held[s], f"disabled_free: covered slot {s} holds a tag")

        # ---- victim ------------------------------------------------------------------
        # direct search: lowest FREE enabled slot, else coldest unpinned RESIDENT enabled
        free_en = [~held[s] & ~p_dis[s] for s in range(S)]
        cand = [res_e[s] & (pins[s] == 0) for s in range(S)]
        ref_free, ref_free_idx = Const(0), Const(0, range(S))
        for s in reversed(range(S)):
            ref_free_idx = Mux(free_en[s], s, ref_free_idx)
            ref_free = ref_free | free_en[s]
        best_ok, best_idx, best_hot = Const(0), Const(0, range(S)), Const(0, dut.hot_bits)
        for s in range(S):
            better = cand[s] & (~best_ok | (hot[s] < best_hot))
            best_idx = Mux(better, s, best_idx)
            best_hot = Mux(better, hot[s], best_hot)
            best_ok = best_ok | cand[s]
        ref_any = ref_free | best_ok
        ref_idx = Signal(range(S), name="f_ref_victim")
        m.d.comb += ref_idx.eq(Mux(ref_free, ref_free_idx, best_idx))
        t_res = Cat(res_e[s] & (tags[s] == x.tag) for s in range(S)).any()
        t_pend = Cat(pend_e[s] & (tags[s] == x.tag) for s in range(S)).any()
        ref_tag = Signal.like(tags[0], name="f_ref_tag")
        m.d.comb += ref_tag.eq(Array(tags)[ref_idx])
        pt_res, pt_pend = past(t_res, "t_res"), past(t_pend, "t_pend")
        p_ref_any, p_ref_free = past(ref_any, "ref_any"), past(ref_free, "ref_free")
        p_ref_idx, p_ref_tag = past(ref_idx, "ref_idx"), past(ref_tag, "ref_tag")
        with m.If(p_fire & (p_op == Op.ALLOCATE.value)):
            m.d.comb += Assert(dut.r_valid, "response stage: lost a command")
            m.d.comb += Assert((o.error == Err.RESIDENT) == pt_res, "victim: RESIDENT error")
            m.d.comb += Assert((o.error == Err.PENDING) == (pt_pend & ~pt_res),
                               "victim: PENDING error")
            with m.If(~pt_res & ~pt_pend):
                m.d.comb += Assert((o.error == Err.NO_VICTIM) == ~p_ref_any, "victim: NO_VICTIM")
            with m.If(o.error == Err.OK):
                m.d.comb += Assert(o.slot == p_ref_idx, "victim: not the specified victim")
                m.d.comb += Assert(o.evicted == ~p_ref_free, "victim: evicted flag")
                with m.If(o.evicted):
                    m.d.comb += Assert(o.evicted_tag == p_ref_tag, "victim: evicted tag")

        # ---- lookup ------------------------------------------------------------------
        p_lk = p_fire & ((p_op == Op.LOOKUP.value) | (p_op == Op.LOOKUP_PIN.value) |
                         (p_op == Op.TOUCH.value))
        with m.If(p_lk & (o.error == Err.OK)):
            m.d.comb += Assert(~(o.hit & o.pending), "lookup: hit and pending")
            with m.If(o.hit | o.pending):
                m.d.comb += Assert(o.slot < S, "lookup: slot out of range")
                m.d.comb += Assert(p_tags_a[o.slot] == p_xtag, "lookup: slot does not hold tag")
            with m.If(o.hit):
                m.d.comb += Assert(p_res_e[o.slot], "lookup: hit on a slot not RESIDENT")
            with m.If(o.pending):
                m.d.comb += Assert(p_pend_e[o.slot], "lookup: pending on a slot not PENDING")
            with m.If(~o.hit & ~o.pending):
                for s in range(S):
                    m.d.comb += Assert(~(p_held[s] & (p_tags[s] == p_xtag)),
                                       f"lookup: miss but slot {s} holds the tag")

        # ---- pins_hold / commit ---------------------------------------------------------
        for s in range(S):
            freed_ok = (p_ok & ((p_op == Op.RESET.value) |
                                ((p_op == Op.ABORT.value) & (p_slot == s)))) | p_dis[s]
            with m.If(ok & p_held[s] & (p_pins[s] != 0) & ~freed_ok):
                m.d.comb += Assert(held[s] & (tags[s] == p_tags[s]),
                                   f"pins_hold: pinned slot {s} lost its tag")
            with m.If(ok & held[s] & res[s] & ~(p_held[s] & p_res[s])):
                m.d.comb += Assert(p_cm[s], f"commit: slot {s} resident without a strobe")
            with m.If(ok & p_cm[s] & ~p_dis[s] & p_held[s] & ~p_res[s] & held[s] &
                      (tags[s] == p_tags[s])):
                m.d.comb += Assert(res[s], f"commit: strobe of pending slot {s} lost")

        # ---- no_wrap -------------------------------------------------------------------
        with m.If(ok & p_ok & (p_op == Op.TOUCH.value)):
            for s in range(S):
                want = Signal.like(hot[s], name=f"f_want{s}")
                total = p_hot[s] + p_amount
                m.d.comb += want.eq(Mux(total > hmax, hmax, total))
                with m.If(p_held[s] & (p_tags[s] == p_tag)):
                    m.d.comb += Assert(hot[s] == want, f"no_wrap: slot {s} not saturating")
                with m.Elif(p_held[s]):
                    m.d.comb += Assert(hot[s] == p_hot[s], f"no_wrap: slot {s} changed")
        with m.If(ok & p_ok & (p_op == Op.DECAY.value)):
            for s in range(S):
                with m.If(held[s]):
                    m.d.comb += Assert(hot[s] <= p_hot[s], f"no_wrap: DECAY grew slot {s}")

        # ---- stream: occupancy -----------------------------------------------------------
        inflight = Signal(range(8))
        took = self.i.valid & self.i.ready
        gave = self.o.valid & self.o.ready
        m.d.sync += inflight.eq(inflight + took - gave)
        m.d.comb += Assert(inflight <= 5, "stream: more than 5 commands inside")
        # the response stage always finds room in the output queue (o + skid)
        m.d.comb += Assert(~(dut.r_valid & dut.skid_valid & self.o.valid & ~self.o.ready),
                           "stream: output queue overflow")
        m.d.comb += Assert(dut.r_valid == p_fire, "stream: response stage out of step")
        m.d.comb += Assert(~self.o.valid | (inflight != 0), "stream: response without command")

        # ---- reachability -----------------------------------------------------------------
        fo = p_fire                      # o: the response of the previous cycle's command
        p_cv = past(self.commit.valid, "commit_valid")
        p_cs = past(self.commit.slot, "commit_slot")
        m.d.comb += [
            Cover(fo & (o.error == Err.NO_VICTIM), "no victim"),
            Cover(fo & (p_op == Op.ALLOCATE.value) & (o.error == Err.OK) & o.evicted, "eviction"),
            Cover(fo & (p_op == Op.LOOKUP.value) & o.pending, "pending lookup"),
            Cover(fo & (p_op == Op.LOOKUP.value) & o.pending & p_cv & (p_cs == o.slot),
                  "pending lookup as its slot commits"),
            Cover(fo & (p_op == Op.TOUCH.value) & o.hit & (o.value == hmax), "saturated touch"),
            Cover(fo & (o.error == Err.PIN_LIMIT), "pin limit"),
            Cover(dut.skid_valid & self.o.ready, "response queued behind a stalled one moves up"),
            Cover(ok & Cat(p_held[s] & ~held[s] & p_dis[s] for s in range(S)).any(),
                  "covered slot freed"),
            Cover(self.o.valid & ~self.o.ready & (self.o.payload.op == Op.LOOKUP) &
                  self.o.payload.hit, "stalled hit"),
        ]
        return m

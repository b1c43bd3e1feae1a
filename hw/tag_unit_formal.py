"""Formal-only wrapper of :class:`elmoe3d.hw.tag_unit.TagUnit`: the safety
properties of the tag unit as Amaranth ``Assert``/``Assume`` statements, for
bounded model checking with :func:`elmoe3d.sim.formal.run_sby`. Not a
synthesisable block (it registers no ``BLOCK_SPECS``).

Environment (``Assume``)
------------------------
* reset is never asserted (the run starts from the registers' reset values);
* the command stream obeys the stream rules: once ``i.valid`` is high without
  ``i.ready``, it stays high with an unchanged payload until the transfer.
  Everything else (opcodes, including invalid ones, tags, slots, amounts,
  ``o.ready``) is unconstrained.

Properties (``Assert``), checked every cycle
--------------------------------------------
``unique``
    No two valid slots hold the same tag.
``lookup_sound`` / ``lookup_complete``
    A LOOKUP or TOUCH response with ``hit`` names a slot ``< S`` that is
    valid and holds the command's tag; one without ``hit`` (and no error)
    means no valid slot holds it.
``victim_unpinned``
    An ALLOCATE that executes never picks a slot with a non-zero pin count,
    and a slot that was pinned keeps its tag and validity into the next cycle
    unless a RESET executed.
``no_wrap``
    After a TOUCH the touched slot's hotness is ``min(old + amount, max)``
    (never below its old value); other slots are unchanged; after a DECAY no
    counter grew.
``slot_state``
    ``pins > 0`` implies ``valid``; a free slot has hotness 0 and no pins
    (the invariants the victim search relies on).
``stream``
    The response stream obeys the stream rules: once ``o.valid`` is high
    without ``o.ready``, it stays high with an unchanged payload; and there is
    never a response without a command (at most 2 commands in flight).

Reachability (``Cover``, for ``mode cover``): an all-pinned NO_VICTIM, an
eviction, a saturated TOUCH, a LOOKUP hit held under back-pressure, a
PIN_LIMIT - so the assertions above are not vacuously true.
"""

from __future__ import annotations

from amaranth.hdl import Array, Assert, Assume, Cover, Module, Mux, ResetSignal, Signal
from amaranth.lib import wiring

from .tag_unit import TagErrorCode, TagOpcode, TagUnit

__all__ = ["TagUnitFormal"]


class TagUnitFormal(wiring.Component):
    """The tag unit with its properties; same ports as :class:`TagUnit`.

    Parameters
    ----------
    **params
        :class:`TagUnit` parameters (use a small instance: ``slots=4``).
    bug : str, optional
        Plant a bug in the DUT (see ``TagUnit._formal_bug``) to show that
        the properties can fail.
    """

    def __init__(self, *, bug: str | None = None, **params):
        self.dut = TagUnit(**params)
        if bug is not None:
            self.dut._formal_bug = bug
        super().__init__(self.dut.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        wiring.connect(m, wiring.flipped(self.i), dut.i)
        wiring.connect(m, dut.o, wiring.flipped(self.o))
        S = dut.slots
        valid, tags, hot, pins = dut.state_valid, dut.state_tag, dut.state_hot, dut.state_pins
        hmax = (1 << dut.hot_bits) - 1

        m.d.comb += Assume(~ResetSignal())

        # ---- one-cycle history ----------------------------------------------
        past_ok = Signal()                       # a previous cycle exists
        m.d.sync += past_ok.eq(1)
        p_i_valid, p_i_ready = Signal(), Signal()
        p_i_payload = Signal.like(self.i.payload.as_value())
        p_o_valid, p_o_ready = Signal(), Signal()
        p_o_payload = Signal.like(self.o.payload.as_value())
        p_fire = Signal()
        p_op = Signal.like(dut.x_cmd.op.as_value())
        p_tag = Signal.like(dut.x_cmd.tag)
        p_amount = Signal.like(dut.x_cmd.amount)
        p_err = Signal.like(dut.x_error.as_value())
        p_valid = [Signal(name=f"p_valid{s}") for s in range(S)]
        p_tags = [Signal.like(tags[s], name=f"p_tag{s}") for s in range(S)]
        p_hot = [Signal.like(hot[s], name=f"p_hot{s}") for s in range(S)]
        p_pins = [Signal.like(pins[s], name=f"p_pins{s}") for s in range(S)]
        m.d.sync += [
            p_i_valid.eq(self.i.valid), p_i_ready.eq(self.i.ready),
            p_i_payload.eq(self.i.payload.as_value()),
            p_o_valid.eq(self.o.valid), p_o_ready.eq(self.o.ready),
            p_o_payload.eq(self.o.payload.as_value()),
            p_fire.eq(dut.x_fire), p_op.eq(dut.x_cmd.op.as_value()), p_tag.eq(dut.x_cmd.tag),
            p_amount.eq(dut.x_cmd.amount), p_err.eq(dut.x_error.as_value()),
        ]
        m.d.sync += [p_valid[s].eq(valid[s]) for s in range(S)]
        m.d.sync += [p_tags[s].eq(tags[s]) for s in range(S)]
        m.d.sync += [p_hot[s].eq(hot[s]) for s in range(S)]
        m.d.sync += [p_pins[s].eq(pins[s]) for s in range(S)]
        p_applied = Signal()                     # the previous x_ command changed state
        m.d.comb += p_applied.eq(p_fire & (p_err == TagErrorCode.OK.value))

        # ---- environment: command stream rules --------------------------------
        with m.If(past_ok & p_i_valid & ~p_i_ready):
            m.d.comb += Assume(self.i.valid & (self.i.payload.as_value() == p_i_payload))

        # ---- unique / slot_state ------------------------------------------
        for s in range(S):
            for t in range(s + 1, S):
                m.d.comb += Assert(~(valid[s] & valid[t] & (tags[s] == tags[t])),
                                   f"unique: slots {s} and {t} hold the same tag")
            m.d.comb += Assert(valid[s] | ((pins[s] == 0) & (hot[s] == 0)),
                               f"slot_state: free slot {s} has pins or hotness")

        # ---- lookup_sound / lookup_complete (at the response port) ------------
        # The response leaves with the state it was computed on: LOOKUP and
        # TOUCH change no tag, and nothing executes while the response waits.
        r_tag = Signal.like(p_tag)               # tag of the command now in o
        with m.If(dut.x_fire):
            m.d.sync += r_tag.eq(dut.x_cmd.tag)
        o = self.o.payload
        is_lookup = (o.op == TagOpcode.LOOKUP) | (o.op == TagOpcode.TOUCH)
        with m.If(self.o.valid & is_lookup & (o.error == TagErrorCode.OK)):
            holds = [valid[s] & (tags[s] == r_tag) for s in range(S)]
            with m.If(o.hit):
                m.d.comb += Assert(o.slot < S, "lookup_sound: hit slot out of range")
                m.d.comb += Assert(Array(valid)[o.slot] & (Array(tags)[o.slot] == r_tag),
                                   "lookup_sound: hit slot does not hold the tag")
            with m.Else():
                for s in range(S):
                    m.d.comb += Assert(~holds[s], f"lookup_complete: miss but slot {s} holds it")

        # ---- victim_unpinned ------------------------------------------------
        x = dut.x_cmd
        with m.If(dut.x_fire & (x.op == TagOpcode.ALLOCATE) &
                  (dut.x_error == TagErrorCode.OK)):
            m.d.comb += Assert(Array(pins)[dut.x_victim] == 0,
                               "victim_unpinned: ALLOCATE chose a pinned slot")
        with m.If(past_ok & ~(p_applied & (p_op == TagOpcode.RESET.value))):
            for s in range(S):
                with m.If(p_pins[s] != 0):
                    m.d.comb += Assert(valid[s] & (tags[s] == p_tags[s]),
                                       f"victim_unpinned: pinned slot {s} lost its tag")

        # ---- no_wrap -------------------------------------------------------
        with m.If(past_ok & p_applied & (p_op == TagOpcode.TOUCH.value)):
            for s in range(S):
                touched = p_valid[s] & (p_tags[s] == p_tag)
                want = Signal.like(hot[s], name=f"f_want{s}")
                total = p_hot[s] + p_amount
                m.d.comb += want.eq(Mux(total > hmax, hmax, total))
                with m.If(touched):
                    m.d.comb += Assert(hot[s] >= p_hot[s], f"no_wrap: slot {s} hotness fell")
                    m.d.comb += Assert(hot[s] == want, f"no_wrap: slot {s} not saturating")
                with m.Else():
                    m.d.comb += Assert(hot[s] == p_hot[s], f"no_wrap: slot {s} changed")
        with m.If(past_ok & p_applied & (p_op == TagOpcode.DECAY.value)):
            for s in range(S):
                m.d.comb += Assert(hot[s] <= p_hot[s], f"no_wrap: DECAY grew slot {s}")

        # ---- stream ----------------------------------------------------------
        with m.If(past_ok & p_o_valid & ~p_o_ready):
            m.d.comb += Assert(self.o.valid & (self.o.payload.as_value() == p_o_payload),
                               "stream: response dropped or changed before ready")
        inflight = Signal(range(4))
        took = self.i.valid & self.i.ready
        gave = self.o.valid & self.o.ready
        m.d.sync += inflight.eq(inflight + took - gave)
        m.d.comb += Assert(inflight <= 2, "stream: more than 2 commands in flight")
        m.d.comb += Assert(~self.o.valid | (inflight != 0), "stream: response without command")

        # ---- reachability (``mode cover``): the properties are not vacuous ----
        ov = self.o.valid
        m.d.comb += [
            Cover(ov & (o.error == TagErrorCode.NO_VICTIM), "all slots pinned"),
            Cover(ov & (o.op == TagOpcode.ALLOCATE) & (o.error == TagErrorCode.OK) & o.evicted,
                  "eviction"),
            Cover(ov & (o.op == TagOpcode.TOUCH) & o.hit & (o.value == hmax), "saturated"),
            Cover(ov & ~self.o.ready & (o.op == TagOpcode.LOOKUP) & o.hit, "stalled hit"),
            Cover(ov & (o.error == TagErrorCode.PIN_LIMIT), "pin limit"),
        ]
        return m

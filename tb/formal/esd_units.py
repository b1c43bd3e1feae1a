"""Formal wrapper of each unit of the Elastic-SD controller
(:mod:`elmoe3d.hw.esd_ctrl_units`) for SymbiYosys. Test scaffolding, not a
block.

Properties (``Assert``): the stream rules on every stream the unit drives,
nested ones included (a tag port's ``rsp`` at the tag client, a command
port's ``order`` at the host front end; :func:`.common.stream_rules_all`
with ``nested=True``): once ``valid`` is high without ``ready`` it stays
high and the payload stays unchanged until the transfer.

Environment (``Assume``): reset is never asserted; every stream the unit
takes obeys the same rules; payloads, pauses, ``ready`` s and the plain
side channels (``status``, ``usable``, ``decode_steps``, counter
increments) are otherwise free. One contract is assumed as its interface
states it: the host front end's ``status`` (the round's ``mode`` and
``k``) does not change while a response waits
(:func:`elmoe3d.hw.esd_ctrl_units.payloads.round_status`).

Planted bugs (:data:`BUGS`, one per unit), each must fail:

* ``overwrite`` (every unit built on
  :class:`~elmoe3d.hw.esd_ctrl_units.common.Emit`): an output register
  takes a new payload while the old one still waits (``free`` always high);
* ``no_hold`` (tag client): its arbiter forgets the user it showed while
  ``tag_cmd`` waited, so a lower-numbered user that becomes valid replaces
  the command;
* ``drops_valid`` (trace emitter): its output queue drops ``valid`` after
  one stalled cycle (the arbiter's choice ends in the emitter's register
  slice, so only the queue reaches ``trace``);
* ``live_op`` (host front end): the response's ``op`` is the command
  port's current opcode instead of the latched one of the command it
  answers.
"""

from __future__ import annotations

import importlib
from unittest import mock

from amaranth.hdl import Assume, Cat, Elaboratable, Module, ResetSignal, Signal
from amaranth.lib import wiring

from ...hw import esd_ctrl_units as units
from ...hw.esd_ctrl_units import common
from ...hw.moe.queue import Queue
from ...hw.streams import StreamArbiter
from .common import stream_rules_all
from .esd_ctrl import FORMAL_CONFIG

__all__ = ["UnitFormal", "BUGS"]

#: the planted bug of each unit (:data:`elmoe3d.hw.esd_ctrl_units.UNITS`)
BUGS = {name: "overwrite" for name in units.UNITS}
BUGS.update(trace="drops_valid", tag_client="no_hold", host="live_op")


class _Overwrites(common.Emit):
    """An output register that loads whenever its unit puts (``free`` = 1)."""

    def __init__(self, m, port, name):
        super().__init__(m, port, name)
        m.d.comb += self.free.eq(1)


class _NoHold(StreamArbiter):
    """An arbiter whose grant is always the lowest valid input (the later
    assignment replaces the held one)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        valid = Cat(s.valid for s in self.i)
        m.d.comb += self.grant.eq(Cat(valid[k] & ~valid[:k].any() if k else valid[0]
                                      for k in range(self.n)))
        return m


class _DropsValid(Queue):
    """A queue whose output drops ``valid`` after one stalled cycle."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        stalled = Signal()
        m.d.sync += stalled.eq(self.o.valid & ~self.o.ready)
        m.d.comb += self.o.valid.eq(m.submodules.fifo.r_rdy & ~stalled)
        return m


class _Planted(Elaboratable):
    """Elaborates ``dut`` with the bug's patch in place (the classes the
    unit's ``elaborate`` builds from are looked up in its module)."""

    def __init__(self, dut, module, bug):
        self.dut, self.module, self.bug = dut, module, bug

    def elaborate(self, platform):
        if self.bug == "overwrite":
            with mock.patch.object(self.module, "Emit", _Overwrites):
                return self.dut.elaborate(platform)
        if self.bug == "no_hold":
            with mock.patch.object(self.module, "StreamArbiter", _NoHold):
                return self.dut.elaborate(platform)
        if self.bug == "drops_valid":
            with mock.patch.object(self.module, "Queue", _DropsValid):
                return self.dut.elaborate(platform)
        m = self.dut.elaborate(platform)            # live_op
        m.d.comb += self.dut.rsp.payload.op.eq(self.dut.cmd.payload.op)
        return m


class UnitFormal(wiring.Component):
    """One unit with the stream rules on its streams; same ports as the unit.

    Parameters
    ----------
    unit : str
        A unit name (:data:`elmoe3d.hw.esd_ctrl_units.UNITS`).
    cfg : Config
        Geometry (default :data:`.esd_ctrl.FORMAL_CONFIG`).
    bug : str, optional
        The unit's planted bug (:data:`BUGS`).
    """

    def __init__(self, unit: str, cfg=FORMAL_CONFIG, *, bug: str | None = None):
        if unit not in units.UNITS:
            raise ValueError(f"Unknown unit {unit!r}; choose from {', '.join(units.UNITS)}")
        if bug is not None and bug != BUGS[unit]:
            raise ValueError(f"The planted bug of {unit} is {BUGS[unit]!r}, not {bug!r}")
        self.unit, self.bug = unit, bug
        self.dut = units.UNITS[unit][0](cfg)
        super().__init__(self.dut.signature)

    def elaborate(self, platform):
        m = Module()
        dut = self.dut
        if self.bug is None:
            m.submodules.dut = dut
        else:
            module = importlib.import_module(f"{units.__name__}.{self.unit}")
            m.submodules.dut = _Planted(dut, module, self.bug)
        for name, member in self.signature.members.items():
            mine, theirs = getattr(self, name), getattr(dut, name)
            pairs = list(zip(mine, theirs)) if member.dimensions else [(mine, theirs)]
            for a, b in pairs:
                if member.is_port:           # a plain level (the round's `hb_cache`): free
                    m.d.comb += (b.eq(a) if member.flow == wiring.In else a.eq(b))
                elif member.flow == wiring.In:
                    wiring.connect(m, wiring.flipped(a), b)
                else:
                    wiring.connect(m, b, wiring.flipped(a))
        m.d.comb += Assume(~ResetSignal())
        if self.unit == "host":
            was = Signal.like(self.status.mode), Signal.like(self.status.k)
            waited = Signal()
            m.d.sync += [was[0].eq(self.status.mode), was[1].eq(self.status.k),
                         waited.eq(self.rsp.valid & ~self.rsp.ready)]
            with m.If(waited):
                m.d.comb += Assume((self.status.mode == was[0]) & (self.status.k == was[1]))
        self.covered = stream_rules_all(m, self, nested=True)
        return m

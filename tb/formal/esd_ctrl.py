"""Formal wrapper of :class:`elmoe3d.hw.esd_ctrl.EsdCtrl` (the Elastic-SD
controller) for SymbiYosys. Test scaffolding, not a block.

Properties (``Assert``): the stream rules on every one of the controller's
14 stream ports (:func:`.common.stream_rules_all`): on the outputs
``host_rsp``, ``trace``, ``tag_cmd``, ``ext_cmd``, ``kv_req``, ``dp_step``,
``dp_source``, once ``valid`` is high without ``ready`` it stays high and the
payload stays unchanged until the transfer.

Environment (``Assume``): reset is never asserted; the inputs ``host_cmd``,
``tag_rsp``, ``ext_rsp``, ``fill_done``, ``kv_move``, ``dp_announce``,
``dp_done`` obey the same rules; their payloads, their pauses and every
output's ``ready`` are otherwise free (a tag response without a command,
a fill report of any slot, ... are all allowed: the rules must hold whatever
the peers do).

Planted bugs (``bug=``), each must fail:

* ``slice_drops_valid``: the controller built with output registers that
  drop ``valid`` after one stalled cycle: its input ``RegisterSlice`` s and
  every unit's registered output (:class:`~elmoe3d.hw.esd_ctrl_units.common.Emit`)
  forget their payload while ``ready`` is low;
* ``trace_payload``: the trace payload changes while it waits (the
  wrapper XORs a free-running bit into the event while ``trace`` is
  stalled).
"""

from __future__ import annotations

import contextlib
import importlib
from unittest import mock

from amaranth.hdl import Assume, Cover, Elaboratable, Fragment, Module, ResetSignal, Signal
from amaranth.lib import wiring

from ...config import Config
from ...hw import esd_ctrl as _esd
from ...hw import esd_ctrl_units
from ...hw.esd_ctrl_units import UNITS
from ...hw.esd_ctrl_units.common import Emit
from ...hw.streams import RegisterSlice
from .common import stream_rules_all

__all__ = ["EsdCtrlFormal", "BUGS", "FORMAL_CONFIG"]

#: The ``tiny`` geometry with 4 tag slots, 4 experts, 1-token passes and
#: 8-bit statistics: every state of the controller is still reachable (SD and
#: AR rounds, hits, misses, evictions, splits, fills, KV moves, DECAY).
FORMAL_CONFIG = Config(lanes=4, pes=2, max_len=256, hb_words=4096, tag_slots=4, layers=2,
                       hidden=16, ffn=32, experts=4, expert_bits=2, top_k=1, batch_tokens=1,
                       token_lanes=1, sd_threshold=1, draft_len_max=2, draft_len_init=1, decay_period=2,
                       min_free_slots=1, stat_bits=8)


class _ForgetfulSlice(RegisterSlice):
    """A register slice whose output drops ``valid`` after one stalled cycle."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        stalled = Signal()
        m.d.sync += stalled.eq(self.o.valid & ~self.o.ready)
        with m.If(stalled & ~self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        return m


class _ForgetfulEmit(Emit):
    """A unit output register that drops ``valid`` after one stalled cycle."""

    def __init__(self, m, port, name):
        super().__init__(m, port, name)
        stalled = Signal(name=f"{name}_stalled")
        m.d.sync += stalled.eq(port.valid & ~port.ready)
        with m.If(stalled & ~port.ready):
            m.d.sync += port.valid.eq(0)


class _SliceDropsValid(_esd.EsdCtrl):
    """The controller elaborated whole (its units too) with the forgetful
    slices and output registers in place."""

    def elaborate(self, platform):
        patches = [mock.patch.object(_esd, "RegisterSlice", _ForgetfulSlice)]
        for name in UNITS:
            module = importlib.import_module(f"{esd_ctrl_units.__name__}.{name}")
            if hasattr(module, "Emit"):
                patches.append(mock.patch.object(module, "Emit", _ForgetfulEmit))
        with contextlib.ExitStack() as stack:
            for p in patches:
                stack.enter_context(p)
            return Fragment.get(_Whole(self), platform)


class _Whole(Elaboratable):
    """``EsdCtrl.elaborate`` of the mutant, so that ``Fragment.get`` above
    elaborates every unit while the patches are in place."""

    def __init__(self, ctrl):
        self.ctrl = ctrl

    def elaborate(self, platform):
        return _esd.EsdCtrl.elaborate(self.ctrl, platform)


BUGS = ("slice_drops_valid", "trace_payload")


class EsdCtrlFormal(wiring.Component):
    """The controller with the stream rules on every port; same ports as
    :class:`EsdCtrl`.

    Parameters
    ----------
    cfg : Config
        Geometry (default :data:`FORMAL_CONFIG`).
    bug : str, optional
        One of :data:`BUGS`.
    """

    def __init__(self, cfg: Config = FORMAL_CONFIG, *, bug: str | None = None):
        if bug is not None and bug not in BUGS:
            raise ValueError(f"Unknown planted bug {bug!r}; choose from {', '.join(BUGS)}")
        self.bug = bug
        self.dut = (_SliceDropsValid if bug == "slice_drops_valid" else _esd.EsdCtrl)(cfg)
        super().__init__(self.dut.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        for name, member in dut.signature.members.items():
            if name == "trace":
                continue
            if member.flow == wiring.In:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(dut, name))
            else:
                wiring.connect(m, getattr(dut, name), wiring.flipped(getattr(self, name)))
        flip = Signal()
        m.d.sync += flip.eq(~flip)
        tp = self.trace.payload.as_value()
        m.d.comb += [self.trace.valid.eq(dut.trace.valid), dut.trace.ready.eq(self.trace.ready),
                     tp.eq(dut.trace.payload.as_value())]
        if self.bug == "trace_payload":
            m.d.comb += tp[0].eq(dut.trace.payload.as_value()[0] ^ (flip & ~self.trace.ready))
        m.d.comb += Assume(~ResetSignal())
        self.covered = stream_rules_all(m, self)
        # reachability: a stalled output of each kind (the rules are not vacuous)
        for name in ("host_rsp", "trace", "tag_cmd", "ext_cmd", "kv_req", "dp_step",
                     "dp_source"):
            s = getattr(self, name)
            m.d.comb += Cover(s.valid & ~s.ready, f"{name} stalled")
        return m

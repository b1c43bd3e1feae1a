"""The Elastic-SD controller joined with the real tag unit (issue 13, item
4(a)): test scaffolding on the way to the tile top.

``EsdTagJoin`` is :class:`~elmoe3d.hw.esd_ctrl.EsdCtrl` with its ``tag_cmd`` /
``tag_rsp`` streams wired to :class:`~elmoe3d.hw.tag_unit.TagUnit` (both
built from one :class:`~elmoe3d.config.Config`). Every other controller port
stays a top-level port (the testbench models HB, the stream engine and the
datapath by their golden contracts), and so do the tag unit's HB-side ports,
which the tile will wire to the HB bank controller:

``commit`` (``SlotStrobe``)
    HB's commit strobe: the fill of ``slot`` committed (the tag unit makes the
    PENDING slot RESIDENT at that edge).
``disabled`` (S bits)
    HB's registered KV-covered slot mask.
``resident`` / ``pending`` (S bits)
    The tag unit's slot states (the testbench checks them against its HB
    model's valid bits: one definition of resident).
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import Config
from ..golden import tag_unit as gtu
from ..hw import vocab as hv
from ..hw.esd_ctrl import EsdCtrl
from ..hw.tag_unit import TagUnit

__all__ = ["EsdTagJoin", "Join"]

_JOINED = ("tag_cmd", "tag_rsp")


class Join(wiring.Component):
    """Blocks built from one :class:`~elmoe3d.config.Config`, joined inside
    one component: a subclass builds its blocks in ``_build(cfg)``, which
    returns the top-level members, and wires them to the top level with
    :meth:`_export`.

    Raises
    ------
    TypeError
        For a ``cfg`` that is not a Config.
    """

    def __init__(self, cfg: Config):
        if not isinstance(cfg, Config):
            raise TypeError(f"{type(self).__name__} needs a Config, not {cfg!r}")
        self.cfg = cfg
        super().__init__(self._build(cfg))

    def _build(self, cfg: Config) -> dict:
        raise NotImplementedError

    def _export(self, m, name, sub):
        """Wire top-level member ``name`` to ``sub``'s member of that name
        (streams connected, plain signals assigned in their direction, a
        list element by element)."""
        mine, theirs = getattr(self, name), getattr(sub, name)
        flow = self.signature.members[name].flow
        pairs = list(zip(mine, theirs)) if isinstance(mine, list) else [(mine, theirs)]
        for a, b in pairs:
            if isinstance(a, wiring.PureInterface) or hasattr(a, "signature"):
                wiring.connect(m, wiring.flipped(a), b)
            elif flow == wiring.In:
                m.d.comb += b.eq(a)
            else:
                m.d.comb += a.eq(b)


class EsdTagJoin(Join):
    """Controller (with ``prefetch`` depth) + tag unit for ``cfg`` (see the
    module doc for the ports; :class:`Join`)."""

    def __init__(self, cfg: Config, *, prefetch: int = 0):
        self.prefetch = prefetch
        super().__init__(cfg)

    def _build(self, cfg):
        self.ctrl = EsdCtrl(cfg, prefetch=self.prefetch)
        self.tags = TagUnit(**gtu.params_from_config(cfg))
        S = cfg.tag_slots
        members = {name: member for name, member in self.ctrl.signature.members.items()
                   if name not in _JOINED}
        members.update(commit=In(hv.slot_strobe(S)), disabled=In(S), resident=Out(S),
                       pending=Out(S))
        return members

    def elaborate(self, platform):
        m = Module()
        m.submodules.ctrl = ctrl = self.ctrl
        m.submodules.tag_unit = tags = self.tags
        wiring.connect(m, ctrl.tag_cmd, tags.i)
        wiring.connect(m, tags.o, ctrl.tag_rsp)
        for name in self.ctrl.signature.members:
            if name not in _JOINED:
                self._export(m, name, ctrl)
        wiring.connect(m, wiring.flipped(self.commit), tags.commit)
        m.d.comb += [tags.disabled.eq(self.disabled), self.resident.eq(tags.resident),
                     self.pending.eq(tags.pending)]
        return m

"""The Elastic-SD controller joined with the real tag unit, the token feed
and the real batched MoE datapath (issue 13, item 4(b) on the way to the
tile top): test scaffolding, not ``hw/``.

``EsdDpJoin`` = :class:`~elmoe3d.tb.esd_join.EsdTagJoin` (controller + tag
unit) + :class:`~elmoe3d.hw.esd_feed.TokenFeed` +
:class:`~elmoe3d.hw.moe.MoEDatapath`, all from one
:class:`~elmoe3d.config.Config`, joined by the handshake of
``docs/architecture.md`` section 8 with ``wiring.connect`` (one type per
stream, no adapter):

=================  ==================  ==================================
controller         datapath / feed     payload
=================  ==================  ==================================
``dp_step``        feed ``step``       ``StepInfo``
feed ``tok``       ``tok``             ``MoEToken``
``dp_announce``    ``need``            ``ExpertNeed``
``dp_source``      ``source``          ``ExpertSource``
``dp_done``        ``stats``           ``PassStats``
=================  ==================  ==================================

Top-level ports (served by the testbench): the controller's ``host_cmd`` /
``host_rsp``, ``trace``, ``ext_cmd`` / ``ext_rsp``, ``fill_done``,
``kv_req`` / ``kv_move``; the tag unit's ``commit``, ``disabled``,
``resident``, ``pending`` (as in ``EsdTagJoin``); the feed's ``x`` (the
host's token vectors); the datapath's ``hb_cmd[b]`` / ``hb_data[b]``,
``ext`` and ``o``.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring

from ..hw.esd_feed import TokenFeed
from ..hw.moe import MoEDatapath
from ..hw.tile import connect_compute
from .esd_join import EsdTagJoin, Join

__all__ = ["EsdDpJoin"]

#: controller ports joined inside (not top-level)
_INNER_CTRL = ("dp_step", "dp_announce", "dp_source", "dp_done")
#: datapath ports joined inside
_INNER_DP = ("tok", "need", "source", "stats")


class EsdDpJoin(Join):
    """Controller + tag unit + token feed + datapath for ``cfg``
    (:class:`~elmoe3d.tb.esd_join.Join`)."""

    def _build(self, cfg):
        self.ctl = EsdTagJoin(cfg)
        self.feed = TokenFeed(cfg)
        self.dp = MoEDatapath(cfg)
        members = {n: m for n, m in self.ctl.signature.members.items() if n not in _INNER_CTRL}
        members["x"] = self.feed.signature.members["x"]
        members.update({n: m for n, m in self.dp.signature.members.items()
                        if n not in _INNER_DP})
        return members

    def elaborate(self, platform):
        m = Module()
        m.submodules.ctl = ctl = self.ctl
        m.submodules.feed = feed = self.feed
        m.submodules.dp = dp = self.dp
        connect_compute(m, ctl, feed, dp)
        wiring.connect(m, wiring.flipped(self.x), feed.x)
        for name in self.ctl.signature.members:
            if name not in _INNER_CTRL:
                self._export(m, name, ctl)
        for name in self.dp.signature.members:
            if name not in _INNER_DP:
                self._export(m, name, dp)
        return m

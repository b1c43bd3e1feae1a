"""Test harness: the stream engine with its fill stream wired to an HB bank
controller (not a registered block; test scaffolding, so it lives in tb/).

The pair has the ports of both components minus the internal ``fill``
stream, which ``wiring.connect`` joins directly: both sides use the shared
``FillBeat`` of :func:`elmoe3d.hw.vocab.vocab`, so a disagreement about the
fill payload is an elaboration error, not a silent mismatch.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring

from ..config import Config
from ..hw.ext_stream import ExtStream

__all__ = ["ExtHBPair", "pair_factory"]


class ExtHBPair(wiring.Component):
    """:class:`~elmoe3d.hw.ext_stream.ExtStream` + :class:`~elmoe3d.hw.hb_bank.HBBank`
    for one :class:`Config`.

    Parameters
    ----------
    ext, hb : Elaboratable
        The two components (their ``fill`` signatures must be the same).
    """

    def __init__(self, ext, hb):
        if ext.signature.members["fill"].signature != \
                hb.signature.members["fill"].signature.flip():
            raise ValueError("Stream engine and HB bank disagree on the fill beat: "
                             f"{ext.signature.members['fill']!r} vs "
                             f"{hb.signature.members['fill']!r}")
        self._ext, self._hb = ext, hb
        members = {k: v for k, v in ext.signature.members.items() if k != "fill"}
        for k, v in hb.signature.members.items():
            if k == "fill":
                continue
            if k in members:
                raise ValueError(f"Stream engine and HB bank both have a port {k!r}")
            members[k] = v
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ext = ext = self._ext
        m.submodules.hb = hb = self._hb
        wiring.connect(m, ext.fill, hb.fill)
        for sub in (ext, hb):
            for name, member in sub.signature.members.items():
                if name == "fill":
                    continue
                outer, inner = getattr(self, name), getattr(sub, name)
                if member.is_port:
                    if member.flow == wiring.In:
                        m.d.comb += inner.eq(outer)
                    else:
                        m.d.comb += outer.eq(inner)
                elif member.dimensions:
                    for i in range(member.dimensions[0]):
                        wiring.connect(m, wiring.flipped(outer[i]), inner[i])
                else:
                    wiring.connect(m, wiring.flipped(outer), inner)
        return m


def pair_factory(ext: dict, hb: dict) -> ExtHBPair:
    """Build the pair from the two blocks' registry parameters (JSON-able)."""
    from ..blocks import get_block
    return ExtHBPair(get_block("ext_stream").factory(**ext), get_block("hb_bank").factory(**hb))

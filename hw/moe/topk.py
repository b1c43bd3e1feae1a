"""Streaming top-k: the ``k`` best router logits of each token, kept while
its logits pass by.

The router runs token-major (all ``E`` logits of a token, expert ``0``
first, leave the vector unit one per cycle), so one sorted list of ``k``
``(logit, expert)`` pairs is enough. A logit enters the list in front of
every entry with a *smaller* logit: an equal logit stays behind the entries
already there, which have lower expert indices — ties rank the lower index
first (:func:`elmoe3d.golden.moe_layer.route`). A DRAFT token only admits
experts of its allowed mask, so the list holds the highest-ranked allowed
experts (fewer than ``k`` if fewer are allowed).

Stages: a logit is registered with its admission bit (the mask lookup),
then inserted (``k`` parallel comparisons, one shift); on the token's last
logit the updated list is the result. One logit per cycle, no stall.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..vocab import TokenRole
from .payloads import logit, topk_result

__all__ = ["TopK"]


class TopK(wiring.Component):
    """Per-token top-k over a flow of logits.

    Members
    -------
    i_valid : ``In(1)``; i : ``In(Logit)``
        A logit (a flow, no ready: any logit but a token's last is always
        taken; the producer presents a last logit only while ``last_ok``).
    last_ok : ``Out(1)``
        The result register is free (registers only).
    roles, masks : ``In`` per pass buffer (from the token store).
    o : ``Out(stream.Signature(TopKResult))``
        One result per token, two cycles after its last logit.
    idle : ``Out(1)``
        No logit in the stages and no result waiting.
    """

    def __init__(self, g):
        self.g = g
        T, E = g.T, g.E
        super().__init__({
            "i_valid": In(1), "i": In(logit(g)), "last_ok": Out(1),
            "roles": In(data.ArrayLayout(TokenRole, T)).array(2),
            "masks": In(data.ArrayLayout(unsigned(E), T)).array(2),
            "o": Out(stream.Signature(topk_result(g))), "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        K, W = g.K, g.W
        # stage 0: register with the admission bit
        s_valid = Signal()
        s_in = Signal.like(self.i)
        s_ok = Signal()
        ok = Signal()
        mask_bit = Signal()
        role = Signal(TokenRole)
        e = self.i.expert
        m.d.comb += [mask_bit.eq(Mux(self.i.par, self.masks[1][self.i.token].bit_select(e, 1),
                                     self.masks[0][self.i.token].bit_select(e, 1))),
                     role.eq(Mux(self.i.par, self.roles[1][self.i.token],
                                 self.roles[0][self.i.token])),
                     ok.eq((role != TokenRole.DRAFT) | mask_bit)]
        m.d.sync += [s_valid.eq(self.i_valid), s_in.eq(self.i), s_ok.eq(ok)]

        # stage 1: insert
        vals = [Signal(signed(W), name=f"lv{i}") for i in range(K)]
        idxs = [Signal.like(self.i.expert, name=f"ix{i}") for i in range(K)]
        cnt = Signal(range(K + 1))
        first = s_in.expert == 0
        base = Mux(first, 0, cnt)
        gt = []
        for i in range(K):
            gti = Signal(name=f"gt{i}")
            m.d.comb += gti.eq((i >= base) | (s_in.value > vals[i]))
            gt.append(gti)
        new_v = [Signal.like(vals[i], name=f"nv{i}") for i in range(K)]
        new_i = [Signal.like(idxs[i], name=f"ni{i}") for i in range(K)]
        for i in range(K):
            prev_v = vals[i - 1] if i else s_in.value
            prev_i = idxs[i - 1] if i else s_in.expert
            shift_in = gt[i - 1] if i else 0
            m.d.comb += [
                new_v[i].eq(Mux(s_ok & gt[i], Mux(shift_in, prev_v, s_in.value), vals[i])),
                new_i[i].eq(Mux(s_ok & gt[i], Mux(shift_in, prev_i, s_in.expert), idxs[i]))]
        new_cnt = Signal.like(cnt)
        m.d.comb += new_cnt.eq(Mux(s_ok & (base < K), base + 1, base))
        with m.If(s_valid):
            m.d.sync += [vals[i].eq(new_v[i]) for i in range(K)]
            m.d.sync += [idxs[i].eq(new_i[i]) for i in range(K)]
            m.d.sync += cnt.eq(new_cnt)
        o = self.o.payload
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(s_valid & s_in.last):
            m.d.sync += [self.o.valid.eq(1), o.token.eq(s_in.token), o.par.eq(s_in.par),
                         o.count.eq(new_cnt)]
            m.d.sync += [o.sel[i].eq(new_i[i]) for i in range(K)]
            m.d.sync += [o.logit[i].eq(new_v[i]) for i in range(K)]
        # free when no result is waiting and none can appear from the two stages
        # (registers only: the producer's valid may depend on it)
        m.d.comb += [self.last_ok.eq(~self.o.valid & ~(s_valid & s_in.last)),
                     self.idle.eq(~self.o.valid & ~s_valid)]
        return m

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

Stages: a logit is registered with its token's mask row and role; then
its admission bit is picked and it is compared (``k + 1`` parallel comparisons: with the current entries and
with the logit being inserted, the list it will meet being the current one
with that logit inserted); then inserted (each entry selects its
comparison by the previous insertion's choice, one shift). On the token's
last logit the updated list is the result, three cycles after that logit.
One logit per cycle, no stall.
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
        One result per token, three cycles after its last logit.
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
        # (the token's mask row and role are registered with the logit, the
        # expert's bit is picked in stage 1)
        s_valid = Signal()
        s_in = Signal.like(self.i)
        s_row = Signal(g.E)
        s_role = Signal(TokenRole)
        m.d.sync += [s_valid.eq(self.i_valid), s_in.eq(self.i),
                     s_row.eq(Mux(self.i.par, self.masks[1][self.i.token],
                                  self.masks[0][self.i.token])),
                     s_role.eq(Mux(self.i.par, self.roles[1][self.i.token],
                                   self.roles[0][self.i.token]))]
        s_ok = Signal()
        m.d.comb += s_ok.eq((s_role != TokenRole.DRAFT) | s_row.bit_select(s_in.expert, 1))

        # stage 1: compare, a cycle ahead. The list the logit in stage 0 will
        # meet is the current list with the logit of stage 1 inserted, so it
        # is compared with the current entries and with that logit, and the
        # insertion selects the comparison each entry's new value needs (no
        # carry chain in front of the insertion's muxes).
        vals = [Signal(signed(W), name=f"lv{i}") for i in range(K)]
        idxs = [Signal.like(self.i.expert, name=f"ix{i}") for i in range(K)]
        u_valid = Signal()
        u_in = Signal.like(self.i)
        u_ok = Signal()
        c_old = [Signal(name=f"c_old{i}") for i in range(K)]     # u_in.value > lv[i] (before)
        c_prev = Signal()                                      # u_in.value > the inserted one
        take = [Signal(name=f"take{i}") for i in range(K)]       # last insert wrote entry i
        shift = [Signal(name=f"shift{i}") for i in range(K)]     # ... from entry i - 1
        m.d.sync += [u_valid.eq(s_valid), u_in.eq(s_in), u_ok.eq(s_ok),
                     c_prev.eq(s_in.value > u_in.value)]
        m.d.sync += [c_old[i].eq(s_in.value > vals[i]) for i in range(K)]

        # stage 2: insert
        cnt = Signal(range(K + 1))
        first = u_in.expert == 0
        base = Mux(first, 0, cnt)
        gt = []
        for i in range(K):
            gti = Signal(name=f"gt{i}")
            cmp = Mux(take[i], Mux(shift[i], c_old[i - 1] if i else 0, c_prev), c_old[i])
            m.d.comb += gti.eq((i >= base) | cmp)
            gt.append(gti)
        new_v = [Signal.like(vals[i], name=f"nv{i}") for i in range(K)]
        new_i = [Signal.like(idxs[i], name=f"ni{i}") for i in range(K)]
        for i in range(K):
            prev_v = vals[i - 1] if i else u_in.value
            prev_i = idxs[i - 1] if i else u_in.expert
            shift_in = gt[i - 1] if i else 0
            m.d.comb += [
                new_v[i].eq(Mux(u_ok & gt[i], Mux(shift_in, prev_v, u_in.value), vals[i])),
                new_i[i].eq(Mux(u_ok & gt[i], Mux(shift_in, prev_i, u_in.expert), idxs[i]))]
        m.d.sync += [take[i].eq(u_valid & u_ok & gt[i]) for i in range(K)]
        m.d.sync += [shift[i].eq(gt[i - 1] if i else 0) for i in range(K)]
        new_cnt = Signal.like(cnt)
        m.d.comb += new_cnt.eq(Mux(u_ok & (base < K), base + 1, base))
        with m.If(u_valid):
            m.d.sync += [vals[i].eq(new_v[i]) for i in range(K)]
            m.d.sync += [idxs[i].eq(new_i[i]) for i in range(K)]
            m.d.sync += cnt.eq(new_cnt)
        o = self.o.payload
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(u_valid & u_in.last):
            m.d.sync += [self.o.valid.eq(1), o.token.eq(u_in.token), o.par.eq(u_in.par),
                         o.count.eq(new_cnt)]
            m.d.sync += [o.sel[i].eq(new_i[i]) for i in range(K)]
            m.d.sync += [o.logit[i].eq(new_v[i]) for i in range(K)]
        # free when no result is waiting and none can appear from the three stages
        # (registers only: the producer's valid may depend on it)
        m.d.comb += [self.last_ok.eq(~self.o.valid & ~(s_valid & s_in.last)
                                     & ~(u_valid & u_in.last)),
                     self.idle.eq(~self.o.valid & ~s_valid & ~u_valid)]
        return m

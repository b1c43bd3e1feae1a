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

Stages: a logit is registered as it comes; then with its token's mask
row (shifted one bit per logit: a token's logits come expert 0 first, one
per expert in order) and role (selected from that register, not from the
producer's); then
its admission bit is picked and it is compared (``k + 1`` parallel
comparisons: with the current entries and with the logit being inserted,
the list it will meet being the current one with that logit inserted), and
each entry's comparison is selected by that insertion's choices into a
register; then inserted (one shift). On the token's last logit the updated
list is the result, four cycles after that logit. One logit per cycle, no
stall.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..vocab import TokenRole
from .payloads import topk_result
from .ports import LaneTokens, LogitFlow, OutsideFlow, RoutingFlow

__all__ = ["TopK"]


class TopK(wiring.Component):
    """Per-token top-k over a flow of logits.

    Members
    -------
    i : ``In(LogitFlow)``
        ``valid``, ``payload``: a logit (a flow, no ready: any logit but a
        token's last is always taken; the producer presents a last logit
        only while ``last_ok``). A token's ``E`` logits come expert 0 first,
        one per expert in order (the router's order; tokens need not be
        consecutive in time). ``last_ok`` (driven here): the result register
        is free (registers only). ``idle`` (driven here): no logit in the
        stages and no result waiting (a register).
    tokens : ``In(LaneTokens)``
        Roles and masks per pass buffer (from the token store); a token's
        role is read a cycle after its logit is (it must not change in
        between; the token store writes it when the pass is loaded).
    o : ``Out(stream.Signature(TopKResult))``
        One result per token, four cycles after its last logit.
    sel : ``Out(RoutingFlow)``
        A copy of each handshake of ``o`` (the scheduler's view of the
        routings: ``valid`` is ``o.valid & o.ready``).
    seen : ``Out(OutsideFlow)`` (with ``snoop``)
        Each logit as the insertion stage takes it, and whether it is a
        DRAFT token's logit of an expert outside its mask (for the prefetch
        candidates, :class:`~.prefetch_cands.CandidateTracker`).
    """

    def __init__(self, g, *, snoop: bool = False):
        self.g, self.snoop = g, snoop
        super().__init__({
            "i": In(LogitFlow(g)),
            "tokens": In(LaneTokens(g)),
            "o": Out(stream.Signature(topk_result(g))),
            "sel": Out(RoutingFlow(g)),
            **({"seen": Out(OutsideFlow(g))} if snoop else {}),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        K, W, T = g.K, g.W, g.T
        # stage 0: the logit registered as it comes (round 16: the mask-row
        # select below had started at the vector unit's `ser` register, whose
        # token also addresses the gate table; the worst path of a seed ran
        # from there across the die into `s_row`)
        # (loaded only with a logit: loaded every cycle it had the same input
        # and no enable as the vector unit's A0 registers of the same
        # element, `a_tok`/`a_val`, and Yosys merged it into them, so the
        # select still started in the vector unit)
        # The (buffer, token) pair is also registered one-hot, so the row and
        # role selects below are AND-ORs of `2 T` terms (3 LUT levels at
        # `T` = 16) instead of a `2 T`:1 mux (6).
        t_valid = Signal()
        t_in = Signal.like(self.i.payload)
        t_oh = Signal(2 * T)
        m.d.sync += t_valid.eq(self.i.valid)
        with m.If(self.i.valid):
            m.d.sync += [t_in.eq(self.i.payload),
                         t_oh.eq(Cat(*[(self.i.payload.par == p) & (self.i.payload.token == t)
                                       for p in range(2) for t in range(T)]))]
        # stage 1: register with the admission bit
        # (the token's mask row and role are registered with the logit, the
        # expert's bit is the row's bit 0 in stage 2)
        s_valid = Signal()
        s_in = Signal.like(self.i.payload)
        s_row = Signal(g.E)
        s_draft = Signal()

        row_terms = [self.tokens.masks[p][t] & t_oh[p * T + t].replicate(g.E)
                     for p in range(2) for t in range(T)]
        # (each token's "is DRAFT" is a register of its own: as a compare of
        # the role inputs, ABC shared it with the issue stage's DRAFT mask
        # and chained the OR through it, 6 levels; a role is written when its
        # pass is loaded, long before that pass's first logit)
        is_draft = Signal(2 * T)
        m.d.sync += is_draft.eq(Cat(*[self.tokens.roles[p][t] == TokenRole.DRAFT
                                      for p in range(2) for t in range(T)]))
        draft_terms = is_draft & t_oh
        row_or = row_terms[0]
        for x in row_terms[1:]:
            row_or = row_or | x
        # `s_row` is the token's mask row shifted so that bit 0 is the
        # expert of the logit in stage 1: a token's logits come expert 0
        # first, one per expert in order (the router's order), so the row is
        # loaded with its first logit and shifted by one with each next one,
        # and the admission bit is `s_row[0]` (timing round 17: the `E`:1
        # select `s_row[s_in.expert]` in front of the insertion's choices,
        # 5 LUT levels, was a seed's worst path)
        m.d.sync += [s_valid.eq(t_valid), s_in.eq(t_in), s_draft.eq(draft_terms.any())]
        with m.If(t_valid):
            m.d.sync += s_row.eq(Mux(t_in.expert == 0, row_or, s_row >> 1))
        s_ok = Signal()
        m.d.comb += s_ok.eq(~s_draft | s_row[0])

        # stage 2: compare and choose, a cycle ahead. The list the logit in
        # stage 2 will meet is the current list with the logit of stage 3
        # inserted, so it is compared with the current entries and with that
        # logit, and the comparison each entry of that list needs is selected
        # by the insertion's own choices (`gt` of stage 3): `gt` of the logit
        # leaving stage 2 is a register, so stage 3's insertion is a select
        # by flip-flops (round 11 had registered the compares only, and
        # selected them in stage 3 in front of the insertion). Each compare
        # is the sign of a difference, one carry chain (a `>` of two 28-bit
        # values had been a tree of 4 LUT levels alone, 6 in the layer).
        vals = [Signal(signed(W), name=f"lv{i}") for i in range(K)]
        idxs = [Signal.like(self.i.payload.expert, name=f"ix{i}") for i in range(K)]
        u_valid = Signal()
        u_in = Signal.like(self.i.payload)
        u_ok = Signal()
        u_first = Signal()                                     # u_in is its token's first logit
        gt = [Signal(name=f"gt{i}") for i in range(K)]         # u_in goes in front of entry i

        def gt_of(a, b, name):
            dif = Signal(signed(W + 1), name=name)
            m.d.comb += dif.eq(b - a)
            return dif[-1]
        c_prev = gt_of(s_in.value, u_in.value, "d_prev")     # s_in.value > the one inserted
        c_old = [gt_of(s_in.value, vals[i], f"d_old{i}") for i in range(K)]  # > lv[i] (before)
        cnt = Signal(range(K + 1))
        base = Mux(u_first, 0, cnt)
        new_cnt = Signal.like(cnt)
        m.d.comb += new_cnt.eq(Mux(u_ok & (base < K), base + 1, base))
        # `free[i]` is `cnt <= i` (entry i empty), a register beside `cnt`;
        # `u_ins` (stage 3 inserts) and `u_new` (stage 3 holds a token's first
        # logit) are stage 3's flags as the compare needs them, so entry i's
        # emptiness after the insertion is one LUT of four flip-flops
        free = [Signal(init=1, name=f"free{i}") for i in range(K)]
        u_ins = Signal()
        u_new = Signal()
        s_first = s_in.expert == 0
        for i in range(K):
            free_next = Mux(u_new, (i > 0) | ~u_ins,
                            free[i] & ~(u_ins & ~free[i - 1] if i else u_ins))
            # the entry i the logit will meet: entry i - 1 if the insertion
            # shifts it down, the inserted logit if it writes entry i, else
            # entry i; a token's first logit meets an empty list
            meets = Mux(u_ins & gt[i], Mux(gt[i - 1], c_old[i - 1], c_prev) if i else c_prev,
                        c_old[i])
            m.d.sync += [free[i].eq(free_next), gt[i].eq(s_first | free_next | meets)]
        m.d.sync += [u_valid.eq(s_valid), u_in.eq(s_in), u_ok.eq(s_ok), u_first.eq(s_first),
                     u_ins.eq(s_valid & s_ok), u_new.eq(s_valid & s_first)]

        if self.snoop:                       # the logit of stage 3, for the prefetch candidates
            u_out = Signal()
            m.d.sync += u_out.eq(s_draft & ~s_row[0])
            m.d.comb += [self.seen.valid.eq(u_valid), self.seen.value.eq(u_in.value),
                         self.seen.expert.eq(u_in.expert), self.seen.last.eq(u_in.last),
                         self.seen.outside.eq(u_out)]

        # stage 3: insert
        new_v = [Signal.like(vals[i], name=f"nv{i}") for i in range(K)]
        new_i = [Signal.like(idxs[i], name=f"ni{i}") for i in range(K)]
        for i in range(K):
            prev_v = vals[i - 1] if i else u_in.value
            prev_i = idxs[i - 1] if i else u_in.expert
            shift_in = gt[i - 1] if i else 0
            m.d.comb += [
                new_v[i].eq(Mux(u_ok & gt[i], Mux(shift_in, prev_v, u_in.value), vals[i])),
                new_i[i].eq(Mux(u_ok & gt[i], Mux(shift_in, prev_i, u_in.expert), idxs[i]))]
        with m.If(u_valid):
            m.d.sync += [vals[i].eq(new_v[i]) for i in range(K)]
            m.d.sync += [idxs[i].eq(new_i[i]) for i in range(K)]
            m.d.sync += cnt.eq(new_cnt)
        o = self.o.payload
        m.d.comb += [self.sel.valid.eq(self.o.valid & self.o.ready), self.sel.payload.eq(o)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(u_valid & u_in.last):
            m.d.sync += [self.o.valid.eq(1), o.token.eq(u_in.token), o.par.eq(u_in.par),
                         o.count.eq(new_cnt)]
            m.d.sync += [o.sel[i].eq(new_i[i]) for i in range(K)]
            m.d.sync += [o.logit[i].eq(new_v[i]) for i in range(K)]
        # free when no result is waiting and none can appear from the four stages
        # (registers only: the producer's valid may depend on it)
        m.d.comb += self.i.last_ok.eq(~self.o.valid & ~(t_valid & t_in.last)
                                    & ~(s_valid & s_in.last) & ~(u_valid & u_in.last))
        # `idle` (no result and no logit in the stages) is a flip-flop, set
        # from the next values of what it is made of, so it equals
        # `~o.valid & ~t_valid & ~s_valid & ~u_valid` in every cycle: the vector unit's
        # `ok` register starts its path at it, not at a LUT of registers
        # (round 11's deepest cone in the layer ran from the softmax's `idle`
        # through this one into `ok`). (`last_ok` stays a LUT of registers:
        # as a register of its own, k-induction on the stream rules no longer
        # closes at depth 3.)
        idle = Signal(init=1)
        o_valid_n = (u_valid & u_in.last) | (self.o.valid & ~self.o.ready)
        m.d.sync += idle.eq(~o_valid_n & ~self.i.valid & ~t_valid & ~s_valid)
        m.d.comb += self.i.idle.eq(idle)
        return m

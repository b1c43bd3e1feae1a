"""Prefetch candidates of a lane's DRAFT tokens: per token, the best-ranked
expert of its *unrestricted* top-k that its eligibility mask does not allow
(:func:`elmoe3d.golden.esd.prefetch_candidates`, the controller's prefetch
during drafts). Built only for prefetch (``MoEDatapath(cfg, prefetch=True)``).

Why no second top-k: let ``c`` be the token's best-ranked outside expert
(highest logit, ties to the lower index). Every expert ranked above ``c``
is allowed, so ``c`` is in the unrestricted top-k exactly when fewer than
``k`` allowed experts rank above it: when the restricted top-k (top-k's own
result) holds fewer than ``k`` experts, or ``c`` ranks above its ``k``-th.
So one running maximum over the outside logits (top-k's ``seen``) and one
comparison with top-k's result decide it; ``c`` is then the highest-ranked
outside expert of the unrestricted list.

Top-k presents a token's last logit only once the previous token's result
has been taken, so the maximum of a token waits in one register for its
result (``sel``).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..vocab import bits
from .ports import CandFlow, OutsideFlow, RoutingFlow

__all__ = ["CandidateTracker"]


class CandidateTracker(wiring.Component):
    """One lane's prefetch candidates (``g``: the lane's geometry).

    Members
    -------
    seen : ``In(OutsideFlow)``
        Top-k's logits as its insertion stage takes them.
    sel : ``In(RoutingFlow)``
        Top-k's results as taken.
    cand : ``Out(CandFlow)``
        Per result, a cycle later: ``ok`` and ``expert`` (the candidate),
        ``par``.
    """

    def __init__(self, g):
        self.g = g
        super().__init__({"seen": In(OutsideFlow(g)), "sel": In(RoutingFlow(g)),
                          "cand": Out(CandFlow(g))})

    def elaborate(self, platform):
        m = Module()
        g = self.g
        K, W = g.K, g.W
        sn = self.seen
        # the running maximum of the token's outside logits (ties: the lower
        # index, which comes first)
        have = Signal()
        best_v = Signal(signed(W))
        best_e = Signal(bits(g.E))
        first = sn.expert == 0
        take = sn.outside & (first | ~have | (sn.value > best_v))
        n_have = Signal()
        n_v = Signal(signed(W))
        n_e = Signal(bits(g.E))
        m.d.comb += [n_have.eq(sn.outside | (have & ~first)), n_v.eq(best_v), n_e.eq(best_e)]
        with m.If(take):
            m.d.comb += [n_v.eq(sn.value), n_e.eq(sn.expert)]
        with m.If(sn.valid):
            m.d.sync += [have.eq(n_have), best_v.eq(n_v), best_e.eq(n_e)]
        # the token's maximum, held for its result
        h_have = Signal()
        h_v = Signal(signed(W))
        h_e = Signal(bits(g.E))
        with m.If(sn.valid & sn.last):
            m.d.sync += [h_have.eq(n_have), h_v.eq(n_v), h_e.eq(n_e)]
        # in the unrestricted top-k: fewer than k allowed, or above the k-th
        r = self.sel.payload
        kth_v, kth_e = r.logit[K - 1], r.sel[K - 1]
        above = (h_v > kth_v) | ((h_v == kth_v) & (h_e < kth_e))
        c = self.cand
        m.d.sync += c.valid.eq(self.sel.valid)
        with m.If(self.sel.valid):
            m.d.sync += [c.par.eq(r.par), c.expert.eq(h_e),
                         c.ok.eq(h_have & ((r.count < K) | above))]
        return m

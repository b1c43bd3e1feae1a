"""Token feed of the tile: the batched MoE datapath's ``tok`` stream, made
from the Elastic-SD controller's layer step and the host's token vectors.

The host command stream carries a layer step's token vectors (``x[H]``
INT8, in step order: VERIFY request-major); the controller decides the
step's phase, layer, token count and (DRAFT) eligibility mask and sends them
on ``dp_step`` (``StepInfo``). :class:`TokenFeed` joins the two:

* it takes one ``StepInfo`` and then exactly ``tokens`` vectors on ``x``,
  and sends one ``MoEToken`` per vector on ``tok``: ``x`` as it came,
  ``role`` = the phase's role (:data:`ROLE_OF_PHASE`: AR -> FULL, DRAFT ->
  DRAFT, VERIFY -> VERIFY), ``mask`` = the step's eligibility mask (every
  token of a DRAFT step routes over the resident experts only; the datapath
  ignores ``mask`` for FULL and VERIFY tokens, the controller sends all ones
  there), ``layer`` = the step's layer, ``last`` on the ``tokens``-th;
* then it takes the next ``StepInfo``. A vector is never taken before its
  step's ``StepInfo`` (the host may send it early: it waits on ``x``).

So a step's datapath passes are exactly the controller's: ``ceil(tokens /
T)`` passes of consecutive tokens (the datapath ends a pass at ``last`` or
at the ``T``-th token).

Ports: ``step`` (In, ``StepInfo``), ``x`` (In, ``HostToken`` = ``{x[H]}``;
both of :mod:`elmoe3d.hw.vocab`), ``tok`` (Out, ``MoEToken``). ``tok``
leaves through a :class:`~elmoe3d.hw.streams.RegisterSlice`; ``step.ready``
is a register and ``x.ready`` the slice's registered ``ready`` and a
register, so no ``ready`` crosses the feed combinationally. Throughput: one
token per cycle; one idle cycle between steps.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import Config, require_config
from ..golden import esd as gesd
from ..golden import moe_batched as gb
from . import vocab as hv
from .streams import RegisterSlice

__all__ = ["ROLE_OF_PHASE", "TokenFeed"]

#: Role of the tokens of a layer step of each phase (and so the precision of
#: the datapath's jobs: every token of a step has the same role).
ROLE_OF_PHASE = {gesd.Phase.AR: gb.Role.FULL, gesd.Phase.DRAFT: gb.Role.DRAFT,
                 gesd.Phase.VERIFY: gb.Role.VERIFY}


class TokenFeed(wiring.Component):
    """``StepInfo`` + token vectors -> ``MoEToken`` s (see the module doc).

    Raises
    ------
    TypeError
        For a ``cfg`` that is not a Config.
    """

    def __init__(self, cfg: Config):
        require_config("TokenFeed", cfg)
        self.cfg = cfg
        v = hv.vocab(cfg)
        self.step_t = v.StepInfo
        self.tok_t = v.MoEToken
        S = stream.Signature
        super().__init__({"step": In(S(self.step_t)), "x": In(S(v.HostToken)),
                          "tok": Out(S(self.tok_t))})

    def elaborate(self, platform):
        m = Module()
        out = m.submodules.tok_slice = RegisterSlice(self.tok_t)
        wiring.connect(m, out.o, wiring.flipped(self.tok))
        have = Signal()                      # a step is in hand
        info = Signal(self.step_t)
        left = Signal.like(info.tokens)      # vectors of the step still to come
        role = Signal(hv.TokenRole)
        m.d.comb += self.step.ready.eq(~have)
        with m.If(self.step.valid & ~have):
            p = self.step.payload
            m.d.sync += [info.eq(p), left.eq(p.tokens), have.eq(p.tokens != 0),
                         role.eq(Mux(p.phase == gesd.Phase.DRAFT, hv.TokenRole.DRAFT,
                                     Mux(p.phase == gesd.Phase.VERIFY, hv.TokenRole.VERIFY,
                                         hv.TokenRole.FULL)))]
        go = Signal()
        m.d.comb += [go.eq(have & out.i.ready),
                     self.x.ready.eq(go),
                     out.i.valid.eq(go & self.x.valid),
                     out.i.payload.x.eq(self.x.payload.x),
                     out.i.payload.role.eq(role),
                     out.i.payload.mask.eq(info.mask),
                     out.i.payload.layer.eq(info.layer),
                     out.i.payload.last.eq(left == 1)]
        with m.If(go & self.x.valid):
            m.d.sync += left.eq(left - 1)
            with m.If(left == 1):
                m.d.sync += have.eq(0)
        return m

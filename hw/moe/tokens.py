"""Token store: takes the ``tok`` stream, cuts it into passes of up to ``T``
tokens and holds two passes (double buffer) for the rest of the datapath.

A pass ends with a token whose ``last`` is set (the end of a step), with
the ``T``-th token, or just before a token of a different layer. Buffer
``par`` holds the tokens' activations in ``P`` memories of ``L``-element
chunks, one per token lane (token ``t`` in lane ``t mod P`` at lane-local
index ``t div P``: ``x_mem{p}``, read by the issue stage, one address per
lane) and their roles and masks in registers; ``valid[par]`` is set when the pass is complete and cleared by
the issue stage's ``release`` after the pass's last beat. ``seq[par]``
toggles every time a buffer is filled, so a consumer that has finished one
pass at ``par`` can tell the next one from it. The buffers are seen through
:class:`~elmoe3d.hw.moe.ports.PassView` (the whole pass) and, per token
lane, :class:`~elmoe3d.hw.moe.ports.LaneTokens` (the lane's roles and
masks, for its top-k unit).

Timing: the incoming token goes into an input register (``lat``, loaded
every cycle it is empty, so its clock enable is one flip-flop) and waits
there for a free buffer; a token's role, mask and layer are written from it
by registered per-slot and per-buffer enables (``we_slot``, ``we_layer``),
so no buffer pointer drives the clock enable of the buffer registers (the
whole layer's critical path before: ``pw`` through the ``tok`` handshake to
about a thousand enables).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..vocab import bits, moe_token
from .common import zext
from .ports import LaneTokens, PassRelease, PassView, x_read

__all__ = ["TokenStore"]


class TokenStore(wiring.Component):
    """Two pass buffers of up to ``T`` tokens.

    Members
    -------
    tok : ``In(stream.Signature(MoEToken))``
        ``ready`` is a register: high while the input register is empty
        (IDLE), whether or not the filling buffer is free (a token taken
        while both buffers are full waits in the input register).
    passes : ``Out(PassView)``
        The pass in each buffer (``valid``, ``seq``, ``count``, ``layer``,
        ``step_last``, ``roles``, ``masks``; see the module doc).
    lanes : ``Out(LaneTokens).array(P)``
        Lane ``p``'s roles and masks (pass positions ``i P + p``, by
        lane-local index ``i``): wires, no logic.
    release : ``In(PassRelease)``
        The issue stage frees buffer ``release.par``.
    x : ``In(ReadPort).array(P)``
        Lane ``p``'s activation chunk ``{chunk, lane-local token, par}``,
        one cycle after its address.

    Throughput: a token takes ``H / L + 3`` cycles (taken, layer check,
    buffer check, then its ``H / L`` chunks one per cycle); a pass is handed
    over the cycle after its last chunk.

    Latency: a token taken at cycle ``a`` into a free buffer has its chunks
    written at ``a + 3 .. a + 2 + H/L`` and, if it ends the pass, ``valid``
    / ``seq`` / ``count`` change at ``a + 3 + H/L`` (unchanged). Its role,
    mask and layer appear at ``a + 4`` (one cycle later than before the
    input register, still no later than the pass's ``valid``). ``ready``
    is high again at ``a + 3 + H/L`` (unchanged); it no longer waits for a
    free buffer, so after a release the waiting token's pass completes two
    cycles earlier than before.
    """

    def __init__(self, g):
        self.g = g
        self.tb, self.cb = bits(g.Tl), bits(g.c_in)
        super().__init__({
            "tok": In(stream.Signature(moe_token(g.H, g.E, g.cfg.layer_bits))),
            "passes": Out(PassView(g)),
            "lanes": Out(LaneTokens(g.lane())).array(g.P),
            "release": In(PassRelease()),
            "x": In(x_read(g)).array(g.P),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        T, L, C = g.T, g.L, g.c_in
        # `no_rw_check`: tokens are written into a buffer no pass is reading
        # (`valid` low), so a read that meets a write is never used
        P = g.P
        wps = []
        for p in range(P):
            mem = m.submodules[f"x_mem{p}"] = memory.Memory(
                shape=unsigned(8 * L), depth=1 << (1 + self.tb + self.cb), init=[],
                attrs={"no_rw_check": 1})
            wp, rp = mem.write_port(), mem.read_port()
            wps.append(wp)
            m.d.comb += [rp.addr.eq(self.x[p].addr), self.x[p].data.eq(rp.data)]
        # each lane's view of the roles and masks
        pv = self.passes
        for p in range(P):
            for par in range(2):
                for i in range(g.Tl):
                    if i * P + p < T:
                        m.d.comb += [self.lanes[p].roles[par][i].eq(pv.roles[par][i * P + p]),
                                     self.lanes[p].masks[par][i].eq(pv.masks[par][i * P + p])]

        pw = Signal()                        # buffer being filled
        t = Signal(range(T + 1))
        # the token's lane and lane-local index (counters beside `t`: no divider)
        t_lane = Signal(range(max(2, P)))
        t_idx = Signal(range(max(2, g.Tl)))
        t_last = Signal(init=T == 1)          # `t == T - 1`, set with `t`
        c = Signal(range(C + 1))
        cur_layer = Signal.like(pv.layer[0])
        # input register: loaded every cycle it is empty (``rdy``), so its
        # clock enable is one flip-flop and ``tok.ready`` is that flip-flop.
        # ``rdy`` is high exactly in IDLE, and its next value is one LUT of
        # flip-flops: it falls with ``tok.valid`` and rises after WRITE's
        # last cycle (``w_last``, a flip-flop), so the FSM's state decode is
        # not in front of the wide register's enable
        rdy = Signal(init=1)
        w_last = Signal()
        m.d.sync += rdy.eq(Mux(rdy, ~self.tok.valid, w_last))
        lat = Signal.like(self.tok.payload)
        # registered write enables: slot ``t`` of buffer ``pw`` (roles and
        # mask), buffer ``pw``'s layer (first token), the current layer
        we_slot = Signal(2 * T)
        we_layer = Signal(2)
        we_cur = Signal()
        m.d.comb += self.tok.ready.eq(rdy)
        for p, wp in enumerate(wps):
            m.d.comb += [wp.addr.eq(Cat(zext(c, self.cb), zext(t_idx, self.tb), pw)),
                         wp.data.eq(lat.x.as_value().word_select(c, 8 * L))]
        with m.If(rdy):
            m.d.sync += lat.eq(self.tok.payload)
        m.d.sync += [we_slot.eq(0), we_layer.eq(0), we_cur.eq(0)]
        for p in range(2):
            for j in range(T):
                with m.If(we_slot[p * T + j]):
                    m.d.sync += [pv.roles[p][j].eq(lat.role), pv.masks[p][j].eq(lat.mask)]
            with m.If(we_layer[p]):
                m.d.sync += pv.layer[p].eq(lat.layer)
        with m.If(we_cur):
            m.d.sync += cur_layer.eq(lat.layer)
        with m.If(self.release.en):
            m.d.sync += pv.valid.bit_select(self.release.par, 1).eq(0)

        def close(count, step_last):
            m.d.sync += [pv.count[0].eq(Mux(pw, pv.count[0], count)),
                         pv.count[1].eq(Mux(pw, count, pv.count[1])),
                         pv.valid.bit_select(pw, 1).eq(1),
                         pv.seq.bit_select(pw, 1).eq(~pv.seq.bit_select(pw, 1)),
                         pv.step_last.bit_select(pw, 1).eq(step_last),
                         pw.eq(~pw), t.eq(0), t_last.eq(T == 1), t_lane.eq(0), t_idx.eq(0)]

        with m.FSM(name="tokens"):
            with m.State("IDLE"):
                with m.If(self.tok.valid):
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If((t != 0) & (lat.layer != cur_layer)):
                    # a new layer: close the pass before this token
                    close(t, 0)
                m.next = "WAIT_BUF"
            with m.State("WAIT_BUF"):
                with m.If(~pv.valid.bit_select(pw, 1)):
                    m.d.sync += [c.eq(0), we_cur.eq(1), w_last.eq(C == 1)]
                    for p in range(2):
                        m.d.sync += we_layer[p].eq((pw == p) & (t == 0))
                        for j in range(T):
                            m.d.sync += we_slot[p * T + j].eq((pw == p) & (t == j))
                    m.next = "WRITE"
            with m.State("WRITE"):
                for p, wp in enumerate(wps):
                    m.d.comb += wp.en.eq(t_lane == p)
                m.d.sync += [c.eq(c + 1), w_last.eq(c + 2 == C)]
                # (`w_last` is `c == C - 1` here: the pass's close starts at
                # flip-flops, not at the chunk counter's compare)
                with m.If(w_last):
                    with m.If(lat.last | t_last):
                        close(t + 1, lat.last)
                    with m.Else():
                        m.d.sync += [t.eq(t + 1), t_last.eq(t == T - 2)]
                        with m.If(t_lane == P - 1):
                            m.d.sync += [t_lane.eq(0), t_idx.eq(t_idx + 1)]
                        with m.Else():
                            m.d.sync += t_lane.eq(t_lane + 1)
                    m.d.sync += w_last.eq(0)
                    m.next = "IDLE"
        return m

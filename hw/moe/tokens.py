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
pass at ``par`` can tell the next one from it.

Timing: the incoming token goes into an input register (``lat``, loaded
every cycle it is empty, so its clock enable is one flip-flop) and waits
there for a free buffer; a token's role, mask and layer are written from it
by registered per-slot and per-buffer enables (``we_slot``, ``we_layer``),
so no buffer pointer drives the clock enable of the buffer registers (the
whole layer's critical path before: ``pw`` through the ``tok`` handshake to
about a thousand enables).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..vocab import TokenRole, bits, moe_token
from .common import zext

__all__ = ["TokenStore"]


class TokenStore(wiring.Component):
    """Two pass buffers of up to ``T`` tokens.

    Members
    -------
    tok : ``In(stream.Signature(MoEToken))``
        ``ready`` is a register: high while the input register is empty
        (IDLE), whether or not the filling buffer is free (a token taken
        while both buffers are full waits in the input register).
    valid, seq, count, layer, step_last, roles, masks : ``Out`` per buffer
        The pass in each buffer (see the module doc).
    release, release_par : ``In(1)``
        The issue stage frees buffer ``release_par``.
    x_addr : ``In.array(P)`` ``{chunk, lane-local token, par}``; ``x_data`` : ``Out(L x INT8).array(P)``
        Activation chunk of each lane, one cycle after its ``x_addr``.

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
        T, E, L = g.T, g.E, g.L
        self.tb, self.cb = bits(g.Tl), bits(g.c_in)
        super().__init__({
            "tok": In(stream.Signature(moe_token(g.H, E, g.cfg.layer_bits))),
            "valid": Out(2), "seq": Out(2),
            "count": Out(unsigned(T.bit_length())).array(2),
            "layer": Out(unsigned(g.cfg.layer_bits)).array(2),
            "step_last": Out(2),
            "roles": Out(data.ArrayLayout(TokenRole, T)).array(2),
            "masks": Out(data.ArrayLayout(unsigned(E), T)).array(2),
            "release": In(1), "release_par": In(1),
            "x_addr": In(unsigned(1 + self.tb + self.cb)).array(g.P),
            "x_data": Out(data.ArrayLayout(signed(8), L)).array(g.P),
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
            m.d.comb += [rp.addr.eq(self.x_addr[p]), self.x_data[p].eq(rp.data)]

        pw = Signal()                        # buffer being filled
        t = Signal(range(T + 1))
        # the token's lane and lane-local index (counters beside `t`: no divider)
        t_lane = Signal(range(max(2, P)))
        t_idx = Signal(range(max(2, g.Tl)))
        t_last = Signal(init=T == 1)          # `t == T - 1`, set with `t`
        c = Signal(range(C + 1))
        cur_layer = Signal.like(self.layer[0])
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
                    m.d.sync += [self.roles[p][j].eq(lat.role), self.masks[p][j].eq(lat.mask)]
            with m.If(we_layer[p]):
                m.d.sync += self.layer[p].eq(lat.layer)
        with m.If(we_cur):
            m.d.sync += cur_layer.eq(lat.layer)
        with m.If(self.release):
            m.d.sync += self.valid.bit_select(self.release_par, 1).eq(0)

        def close(count, step_last):
            m.d.sync += [self.count[0].eq(Mux(pw, self.count[0], count)),
                         self.count[1].eq(Mux(pw, count, self.count[1])),
                         self.valid.bit_select(pw, 1).eq(1),
                         self.seq.bit_select(pw, 1).eq(~self.seq.bit_select(pw, 1)),
                         self.step_last.bit_select(pw, 1).eq(step_last),
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
                with m.If(~self.valid.bit_select(pw, 1)):
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

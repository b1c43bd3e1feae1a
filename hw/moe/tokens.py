"""Token store: takes the ``tok`` stream, cuts it into passes of up to ``T``
tokens and holds two passes (double buffer) for the rest of the datapath.

A pass ends with a token whose ``last`` is set (the end of a step), with
the ``T``-th token, or just before a token of a different layer. Buffer
``par`` holds the tokens' activations in a memory of ``L``-element chunks
(``x_mem``, read by the issue stage) and their roles and masks in
registers; ``valid[par]`` is set when the pass is complete and cleared by
the issue stage's ``release`` after the pass's last beat. ``seq[par]``
toggles every time a buffer is filled, so a consumer that has finished one
pass at ``par`` can tell the next one from it.
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
        ``ready`` is a register: high in IDLE with the filling buffer free.
    valid, seq, count, layer, step_last, roles, masks : ``Out`` per buffer
        The pass in each buffer (see the module doc).
    release, release_par : ``In(1)``
        The issue stage frees buffer ``release_par``.
    x_addr : ``In`` ``{par, token, chunk}``; ``x_data`` : ``Out(L x INT8)``
        Activation chunk, one cycle after ``x_addr``.

    Throughput: a token takes ``H / L`` cycles (its chunks are written one
    per cycle); a pass is handed over the cycle after its last chunk.
    """

    def __init__(self, g):
        self.g = g
        T, E, L = g.T, g.E, g.L
        self.tb, self.cb = bits(T), bits(g.c_in)
        super().__init__({
            "tok": In(stream.Signature(moe_token(g.H, E, g.cfg.layer_bits))),
            "valid": Out(2), "seq": Out(2),
            "count": Out(unsigned(T.bit_length())).array(2),
            "layer": Out(unsigned(g.cfg.layer_bits)).array(2),
            "step_last": Out(2),
            "roles": Out(data.ArrayLayout(TokenRole, T)).array(2),
            "masks": Out(data.ArrayLayout(unsigned(E), T)).array(2),
            "release": In(1), "release_par": In(1),
            "x_addr": In(unsigned(1 + self.tb + self.cb)),
            "x_data": Out(data.ArrayLayout(signed(8), L)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        T, L, C = g.T, g.L, g.c_in
        mem = m.submodules.x_mem = memory.Memory(shape=unsigned(8 * L),
                                                 depth=1 << (1 + self.tb + self.cb), init=[])
        wp, rp = mem.write_port(), mem.read_port()
        m.d.comb += [rp.addr.eq(self.x_addr), self.x_data.eq(rp.data)]

        pw = Signal()                        # buffer being filled
        t = Signal(range(T + 1))
        c = Signal(range(C + 1))
        x = Signal(8 * g.H)
        cur_layer = Signal.like(self.layer[0])
        lat = Signal.like(self.tok.payload)
        m.d.comb += [wp.addr.eq(Cat(zext(c, self.cb), zext(t, self.tb), pw)),
                     wp.data.eq(x.word_select(c, 8 * L))]
        with m.If(self.release):
            m.d.sync += self.valid.bit_select(self.release_par, 1).eq(0)

        def close(count, step_last):
            m.d.sync += [self.count[0].eq(Mux(pw, self.count[0], count)),
                         self.count[1].eq(Mux(pw, count, self.count[1])),
                         self.valid.bit_select(pw, 1).eq(1),
                         self.seq.bit_select(pw, 1).eq(~self.seq.bit_select(pw, 1)),
                         self.step_last.bit_select(pw, 1).eq(step_last),
                         pw.eq(~pw), t.eq(0)]

        with m.FSM(name="tokens") as fsm:
            with m.State("IDLE"):
                with m.If(self.tok.valid & self.tok.ready):
                    m.d.sync += lat.eq(self.tok.payload)
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If((t != 0) & (lat.layer != cur_layer)):
                    # a new layer: close the pass before this token
                    close(t, 0)
                    m.next = "WAIT_BUF"
                with m.Else():
                    m.next = "WAIT_BUF"
            with m.State("WAIT_BUF"):
                with m.If(~self.valid.bit_select(pw, 1)):
                    m.d.sync += [x.eq(lat.x), c.eq(0), cur_layer.eq(lat.layer)]
                    for p in range(2):
                        with m.If(pw == p):
                            m.d.sync += [self.roles[p][t].eq(lat.role),
                                         self.masks[p][t].eq(lat.mask)]
                            with m.If(t == 0):
                                m.d.sync += self.layer[p].eq(lat.layer)
                    m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += wp.en.eq(1)
                m.d.sync += c.eq(c + 1)
                with m.If(c == C - 1):
                    with m.If(lat.last | (t == T - 1)):
                        close(t + 1, lat.last)
                    with m.Else():
                        m.d.sync += t.eq(t + 1)
                    m.next = "IDLE"
        # an expression of registers outside the FSM (Icarus: see output.py)
        m.d.comb += self.tok.ready.eq(fsm.ongoing("IDLE") & ~self.valid.bit_select(pw, 1))
        return m

"""MoE layer datapath: router, top-k, SwiGLU experts on an array of bit-slice PEs.

The block computes :func:`elmoe3d.golden.moe_layer.forward` bit for bit, one
token at a time, on ``P`` instances of :class:`elmoe3d.hw.pe.BitSlicePE`.

Dataflow
--------
A token (``x``, precision mode, allowed-expert mask) arrives on ``tok``. The
block asks for weights on ``req`` (one request for the router, then one per
expert: shared experts first, then the selected experts in rank order) and
consumes them as slice vectors on ``w``; the weight source (HB bank, LPDDR
stream engine, or a testbench) answers every request with the beats below,
in request order, and may run ahead of the datapath.

Every projection ``out = W @ act`` (``R`` output rows, reduction length
``C``) is cut into row groups of ``P`` rows, PE ``p`` computing row
``g*P + p``. One ``w`` beat carries one slice vector per PE; a row group is
``planes x C/L`` beats, plane-major (all chunks of plane 0, then plane 1, ...),
the plane index travelling in the beat. The beats of a request are:

=========  =====================================  ==========================
request    projections (in order)                 planes per chunk
=========  =====================================  ==========================
ROUTER     ``Wr`` (``E x H``)                     all ``n`` (always FULL)
EXPERT     ``Wg`` (``I x H``), ``Wu`` (``I x H``),  ``n`` (FULL) or
           ``Wd`` (``H x I``)                     ``draft_keep`` (DRAFT)
=========  =====================================  ==========================

Per-row requantisation parameters travel with the row: ``mult[p]``/``shift[p]``
(requantisation of the projection) and ``mult2[p]``/``shift2[p]`` (for ``Wu``
rows: the product requantisation; for ``Wd`` rows: the layer's output
requantisation of that channel) are sampled on the last beat of a row group.

Sequencer and hazards
---------------------
The issue sequencer feeds a beat to all PEs every cycle that a beat is
available, so PE utilisation is limited only by the weight stream and by
three waits: ``Wd`` beats wait until the vector unit has written the last
element of ``h`` (the up projection's result), routed experts wait for the
top-k selector, and the last shared expert's ``Wd`` beats wait for it too
(they need to know whether it is the last expert). Results leave the PEs in
row-group order and enter the vector unit with a descriptor (projection,
expert slot, row group, requantisation parameters) queued when the row
group's last beat was issued.

Vector unit: two stages, one element per cycle. Stage A requantises a PE
result; stage B writes a router logit, applies the SiLU LUT to a gate
value, forms and requantises ``silu(g) * u``, or multiplies a down value by
its gate weight and accumulates it into the combine register; on the last
expert it also requantises the sum into the output vector. ``P`` results
arrive together every ``planes x C/L`` cycles, so the vector unit keeps up
when that is at least ``P``.

Top-k and softmax (:class:`RouterPost`): after the last logit, ``k`` cycles
of a comparator tree (ties to the lower index, masked in DRAFT), then ``m``
cycles of exponentials and ``m x 13`` cycles of restoring division. It
overlaps with the first expert's gate and up projections; the vector unit
waits for the gate weights only if it reaches a routed ``Wd`` result first.

Latency and throughput: cycles per token are the analytic
``(E H n + (S + k) 3 H I planes) / (P L)`` plus a fixed overhead (token
hand-over, router -> top-k, ``up -> down`` drains): 53 cycles per token at
the default size in FULL and DRAFT, efficiency 0.98 / 0.97; see
``docs/blocks/moe_layer.md`` for the measured numbers and their commands.
"""

from __future__ import annotations

import enum as _enum

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..golden import bitslice as gbs
from ..golden import moe_layer as gm
from .common import check_int
from .pe import BitSlicePE, PEMode
from .vocab import bits as _plane_bits

__all__ = ["MoELayer", "RouterPost", "ReqKind", "Proj", "token_layout", "request_layout",
           "weight_layout", "output_layout", "config_layout", "requant"]


class ReqKind(enum.Enum, shape=1):
    ROUTER = 0
    EXPERT = 1


class Proj(enum.Enum, shape=2):
    ROUTER = 0
    GATE = 1
    UP = 2
    DOWN = 3


def _bits(n: int) -> int:
    """Bits of an index in ``0 .. n-1`` (at least 1)."""
    return max(1, (n - 1).bit_length())


def token_layout(hidden: int, experts: int) -> data.StructLayout:
    """A token: ``x`` (INT8, element 0 lowest), ``mode`` (FULL or DRAFT),
    ``mask`` (bit ``e`` allows expert ``e`` in DRAFT; ignored in FULL)."""
    return data.StructLayout({"x": data.ArrayLayout(signed(8), hidden), "mode": PEMode,
                              "mask": unsigned(experts)})


def request_layout(experts: int, shared: int) -> data.StructLayout:
    """A weight request: the router, or expert ``expert`` (a shared expert's
    index when ``shared``), with the precision its planes are wanted in."""
    return data.StructLayout({"kind": ReqKind, "shared": unsigned(1),
                              "expert": unsigned(_bits(max(experts, shared))), "mode": PEMode})


def weight_layout(pes: int, lanes: int, slice_bits: int) -> data.StructLayout:
    """One weight beat: a slice vector per PE (``slices[p]``, lane 0 lowest),
    their plane (0 = MSB), and the per-row requantisation parameters."""
    n = gbs.n_planes(slice_bits)
    return data.StructLayout({
        "slices": data.ArrayLayout(data.ArrayLayout(unsigned(slice_bits), lanes), pes),
        "plane": unsigned(_plane_bits(n)),
        "mult": data.ArrayLayout(unsigned(gm.MULT_BITS), pes),
        "shift": data.ArrayLayout(unsigned(gm.SHIFT_BITS), pes),
        "mult2": data.ArrayLayout(unsigned(gm.MULT_BITS), pes),
        "shift2": data.ArrayLayout(unsigned(gm.SHIFT_BITS), pes),
    })


def output_layout(hidden: int) -> data.StructLayout:
    return data.StructLayout({"y": data.ArrayLayout(signed(8), hidden)})


def config_layout() -> data.StructLayout:
    """Layer constants (hold stable while tokens are in flight): the SiLU
    table (entry ``q + 128`` for code ``q``) and the softmax multiplier/shift."""
    return data.StructLayout({"lut": data.ArrayLayout(signed(8), 256),
                              "sm_mult": unsigned(gm.MULT_BITS),
                              "sm_shift": unsigned(gm.SHIFT_BITS)})


def requant(m: Module, v, mult, shift, name: str):
    """``clamp((v * mult + 2**(shift-1)) >> shift, -128, 127)`` as a
    combinational INT8 signal (:func:`elmoe3d.golden.moe_layer.requant`)."""
    prod = Signal(signed(len(v) + gm.MULT_BITS + 1), name=f"{name}_prod")
    m.d.comb += prod.eq(v * mult)
    half = (Const(1, unsigned(gm.SHIFT_MAX + 2)) << shift) >> 1
    rnd = Signal(signed(len(prod) + 1), name=f"{name}_rnd")
    m.d.comb += rnd.eq((prod + half) >> shift)
    out = Signal(signed(8), name=name)
    m.d.comb += out.eq(Mux(rnd > 127, 127, Mux(rnd < -128, -128, rnd)))
    return out


class RouterPost(wiring.Component):
    """Top-k selector and integer softmax over ``E`` router logits.

    Parameters
    ----------
    experts, top_k : int
    logit_width : int
        Width of a signed logit.

    Members
    -------
    start : In(1)
        One-cycle pulse: ``logits``, ``mask``, ``use_mask``, ``sm_*`` are
        valid and stay stable until ``gates_valid``.
    logits : In(E * logit_width)
        Logit ``e`` in bits ``[e*w, (e+1)*w)``.
    mask, use_mask : In
        Allowed experts; honoured when ``use_mask`` (DRAFT).
    sel, nsel, sel_valid : Out
        Selected experts best first (ties to the lower index), how many
        (``min(k, allowed)``), valid from ``k + 1`` cycles after ``start``.
    gates, gates_valid : Out
        Q12 gate weights in rank order (:func:`~elmoe3d.golden.moe_layer.gate_weights`),
        valid ``m + 13 m`` cycles after ``sel_valid``.

    Latency: ``k + m (GATE_FRAC + 2) + 2`` cycles from ``start``; one token
    at a time.
    """

    def __init__(self, *, experts: int, top_k: int, logit_width: int):
        self.E, self.k, self.W = experts, top_k, logit_width
        ib = _bits(experts)
        super().__init__({
            "start": In(1),
            "logits": In(experts * logit_width),
            "mask": In(experts),
            "use_mask": In(1),
            "sm_mult": In(gm.MULT_BITS),
            "sm_shift": In(gm.SHIFT_BITS),
            "sel": Out(data.ArrayLayout(unsigned(ib), top_k)),
            "nsel": Out(range(top_k + 1)),
            "sel_valid": Out(1),
            "gates": Out(data.ArrayLayout(unsigned(gm.GATE_FRAC + 1), top_k)),
            "gates_valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        E, k, W, F = self.E, self.k, self.W, gm.GATE_FRAC
        logit = [self.logits.word_select(e, W).as_signed() for e in range(E)]
        taken = Signal(E)
        cand = Signal(E)
        m.d.comb += cand.eq(Mux(self.use_mask, self.mask, (1 << E) - 1) & ~taken)
        # comparator tree: left (lower index) wins ties
        # (each node is a named signal: re-using expressions would duplicate
        # the subtrees in the generated Verilog)
        nodes = [(cand[e], logit[e], Const(e, _bits(E))) for e in range(E)]
        level = 0
        while len(nodes) > 1:
            nxt = []
            for i in range(0, len(nodes) - 1, 2):
                (va, la, ia), (vb, lb, ib) = nodes[i], nodes[i + 1]
                left = va & (~vb | (la >= lb))
                nv = Signal(name=f"t{level}_{i}_v")
                nl = Signal(signed(W), name=f"t{level}_{i}_l")
                ni = Signal(_bits(E), name=f"t{level}_{i}_i")
                m.d.comb += [nv.eq(va | vb), nl.eq(Mux(left, la, lb)), ni.eq(Mux(left, ia, ib))]
                nxt.append((nv, nl, ni))
            level += 1
            if len(nodes) % 2:
                nxt.append(nodes[-1])
            nodes = nxt
        any_c, best_l, best_i = nodes[0]
        sel_logit = Array(Signal(signed(W), name=f"sel_logit{r}") for r in range(k))
        e_val = Array(Signal(unsigned(16), name=f"e{r}") for r in range(k))
        esum = Signal(unsigned(16 + k.bit_length()))
        r = Signal(range(k + 1))
        exp2 = Const(sum(int(v) << (16 * f) for f, v in enumerate(gm.EXP2_Q15)), 16 * 16)
        # exponent of rank r
        d = Signal(unsigned(W + 1))
        m.d.comb += d.eq(sel_logit[0] - sel_logit[r])
        t_full = Signal(unsigned(W + 1 + gm.MULT_BITS))
        m.d.comb += t_full.eq((d * self.sm_mult) >> self.sm_shift)
        t = Signal(8)
        m.d.comb += t.eq(Mux(t_full > gm.T_MAX, gm.T_MAX, t_full))
        e_now = Signal(16)
        m.d.comb += e_now.eq(exp2.word_select(t[:4], 16) >> t[4:])
        # restoring division (e_r << F) // esum, one quotient bit per cycle
        rem = Signal(unsigned(16 + F + 1))
        dv = Signal(unsigned(len(esum) + F + 1))
        q = Signal(unsigned(F + 1))
        step = Signal(range(F + 2))
        gates = Array(Signal(unsigned(F + 1), name=f"gate{r}") for r in range(k))
        m.d.comb += [self.gates[i].eq(gates[i]) for i in range(k)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [taken.eq(0), r.eq(0), self.sel_valid.eq(0),
                                 self.gates_valid.eq(0), esum.eq(0)]
                    m.next = "SEL"
            with m.State("SEL"):
                with m.If(any_c & (r < k)):
                    m.d.sync += [taken.eq(taken | (1 << best_i)), sel_logit[r].eq(best_l),
                                 r.eq(r + 1)]
                    for i in range(k):
                        with m.If(r == i):
                            m.d.sync += self.sel[i].eq(best_i)
                with m.Else():
                    m.d.sync += [self.nsel.eq(r), self.sel_valid.eq(1), r.eq(0)]
                    with m.If(r == 0):
                        m.d.sync += self.gates_valid.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "EXP"
            with m.State("EXP"):
                m.d.sync += [e_val[r].eq(e_now), esum.eq(esum + e_now), r.eq(r + 1)]
                with m.If(r == self.nsel - 1):
                    m.d.sync += r.eq(0)
                    m.next = "DIV0"
            with m.State("DIV0"):
                m.d.sync += [rem.eq(e_val[r] << F), dv.eq(esum << F), q.eq(0), step.eq(0)]
                m.next = "DIV"
            with m.State("DIV"):
                ge = rem >= dv
                m.d.sync += [rem.eq(Mux(ge, rem - dv, rem)), dv.eq(dv >> 1),
                             q.eq(Cat(ge, q)), step.eq(step + 1)]
                with m.If(step == F):
                    m.d.sync += gates[r].eq(Cat(ge, q)), r.eq(r + 1)
                    with m.If(r == self.nsel - 1):
                        m.d.sync += self.gates_valid.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "DIV0"
        return m


class _St(_enum.IntEnum):
    IDLE = 0
    RUN = 1
    NEXT = 2
    ZERO = 3


class MoELayer(wiring.Component):
    """MoE layer datapath (router, top-k, SwiGLU experts, gated combine).

    Parameters
    ----------
    hidden, ffn : int
        ``H``, ``I``; multiples of ``lanes`` and of ``pes``.
    experts, top_k : int
        ``E`` (multiple of ``pes``) and ``k <= E``.
    shared : int
        ``S`` shared experts (always run, weight 1.0), 0..8.
    pes, lanes, slice_bits : int
        ``P`` bit-slice PEs of ``L`` lanes and slice width ``s``.
    draft_keep : int, optional
        Planes kept in DRAFT (``1 .. n-1``, default ``n // 2``).

    Members
    -------
    tok : ``In(stream.Signature(token_layout(H, E)))``
    req : ``Out(stream.Signature(request_layout(E, S)))``
    w : ``In(stream.Signature(weight_layout(P, L, s)))``
    o : ``Out(stream.Signature(output_layout(H)))``
    cfg : ``In(config_layout())`` (static while busy)
    error : ``Out(1)``
        Sticky: a PE flagged a result (a beat's plane outside its mode's
        planes, i.e. a weight source that broke the beat order). Cleared by
        reset only.

    Latency and throughput: see the module docstring. One token at a time;
    the next token is accepted as soon as the last ``Wd`` beat of the
    current one has been issued (its tail overlaps the next router).

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    def __init__(self, *, hidden: int = 64, ffn: int = 128, experts: int = 16, top_k: int = 4,
                 shared: int = 0, pes: int = 4, lanes: int = 16, slice_bits: int = 4,
                 draft_keep: int | None = None):
        check_int("Hidden size", hidden, 1)
        check_int("Expert FFN width", ffn, 1)
        check_int("Routed expert count", experts, 1, 1024)
        check_int("Top-k", top_k, 1)
        check_int("Shared expert count", shared, 0, 8)
        check_int("PE count", pes, 1, 64)
        check_int("Lane count", lanes, 1, 1024)
        gbs.check_slice_bits(slice_bits)
        n = gbs.n_planes(slice_bits)
        if draft_keep is None:
            draft_keep = max(1, n // 2)
        check_int("Draft kept plane count", draft_keep, 1, n - 1)
        if top_k > experts:
            raise ValueError(f"Top-k must not exceed the expert count {experts}, not {top_k!r}")
        for name, v, div, dname in (("Hidden size", hidden, lanes, "lane count"),
                                    ("Expert FFN width", ffn, lanes, "lane count"),
                                    ("Hidden size", hidden, pes, "PE count"),
                                    ("Expert FFN width", ffn, pes, "PE count"),
                                    ("Routed expert count", experts, pes, "PE count")):
            if v % div:
                raise ValueError(f"{name} {v!r} must be a multiple of the {dname} {div}")
        self.H, self.I, self.E, self.k, self.S = hidden, ffn, experts, top_k, shared
        self.P, self.L, self.s, self.n, self.keep = pes, lanes, slice_bits, n, draft_keep
        self.max_len = max(hidden, ffn)
        self.pe_width = gbs.acc_width(self.max_len)
        super().__init__({
            "tok": In(stream.Signature(token_layout(hidden, experts))),
            "req": Out(stream.Signature(request_layout(experts, shared))),
            "w": In(stream.Signature(weight_layout(pes, lanes, slice_bits))),
            "o": Out(stream.Signature(output_layout(hidden))),
            "cfg": In(config_layout()),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        H, I, E, k, S = self.H, self.I, self.E, self.k, self.S
        P, L, n, keep = self.P, self.L, self.n, self.keep
        W = self.pe_width
        X = S + k                                       # expert slots per token
        F = gm.GATE_FRAC
        ACCW = ((S + 1) * gm.GATE_ONE * 128).bit_length() + 1

        pes = [BitSlicePE(lanes=L, slice_bits=self.s, max_len=self.max_len) for _ in range(P)]
        for p, pe in enumerate(pes):
            m.submodules[f"pe{p}"] = pe
        post = m.submodules.post = RouterPost(experts=E, top_k=k, logit_width=W)

        # ---- token state ------------------------------------------------------------------
        x_reg = Signal(H * 8)
        mode_reg = Signal(PEMode)
        mask_reg = Signal(E)
        tag = Signal()                                  # toggles per accepted token
        h_reg = Signal(I * 8)
        silu_reg = Signal(I * 8)
        logits = Signal(E * W)
        acc = Signal(H * ACCW)
        y_reg = Signal(H * 8)
        h_ready = Signal()
        post_tag = Signal()
        m.d.comb += [post.logits.eq(logits), post.mask.eq(mask_reg),
                     post.use_mask.eq(mode_reg == PEMode.DRAFT),
                     post.sm_mult.eq(self.cfg.sm_mult), post.sm_shift.eq(self.cfg.sm_shift)]
        sel_ok = Signal()
        m.d.comb += sel_ok.eq(post.sel_valid & (post_tag == tag))
        nsel = post.nsel

        # ---- descriptor FIFO (issue -> vector unit) ------------------------------------------
        desc_layout = data.StructLayout({
            "proj": Proj, "j": unsigned(_bits(X)), "g": unsigned(_bits(max(E, H, I) // P)),
            "tag": unsigned(1), "first": unsigned(1), "last": unsigned(1),
            "mult": data.ArrayLayout(unsigned(gm.MULT_BITS), P),
            "shift": data.ArrayLayout(unsigned(gm.SHIFT_BITS), P),
            "mult2": data.ArrayLayout(unsigned(gm.MULT_BITS), P),
            "shift2": data.ArrayLayout(unsigned(gm.SHIFT_BITS), P)})
        fifo = m.submodules.desc_fifo = SyncFIFOBuffered(width=desc_layout.size, depth=8)

        # ---- issue sequencer --------------------------------------------------------------------
        state = Signal(_St)
        proj = Signal(Proj)
        j = Signal(range(X + 1))
        g = Signal(range(max(E, H, I) // P + 1))
        qi = Signal(range(n + 1))
        c = Signal(range(max(H, I) // L + 1))
        draft = mode_reg == PEMode.DRAFT
        planes = Mux((proj == Proj.ROUTER) | ~draft, n, keep)
        g_last = Mux(proj == Proj.ROUTER, E // P - 1,
                     Mux(proj == Proj.DOWN, H // P - 1, I // P - 1))
        c_last = Mux(proj == Proj.DOWN, I // L - 1, H // L - 1)
        total = Signal(range(X + 1))
        m.d.comb += total.eq(S + nsel)
        # Combinational control is written as expressions, not m.If/m.Switch
        # blocks: Icarus does not run an `always @*` block at time 0, so a
        # block whose inputs have not changed yet would read as X.
        dep_ok = Signal()
        m.d.comb += dep_ok.eq(Mux(proj == Proj.DOWN, h_ready & ((j + 1 < S) | sel_ok), 1))
        running = state == _St.RUN
        pe_rdy = pes[0].i.ready
        fire = Signal()
        m.d.comb += fire.eq(running & dep_ok & fifo.w_rdy)
        m.d.comb += self.w.ready.eq(fire & pe_rdy)
        xfer = Signal()
        m.d.comb += xfer.eq(self.w.valid & self.w.ready)
        c_end = c == c_last
        q_end = qi == planes - 1
        g_end = g == g_last
        closing = c_end & q_end
        act = Mux(proj == Proj.DOWN, h_reg.word_select(c, L * 8), x_reg.word_select(c, L * 8))
        for p, pe in enumerate(pes):
            m.d.comb += [
                pe.i.valid.eq(self.w.valid & fire),
                pe.i.payload.act.eq(act),
                pe.i.payload.sv.slices.eq(self.w.payload.slices[p]),
                pe.i.payload.sv.plane.eq(self.w.payload.plane),
                pe.i.payload.mode.eq(Mux(proj == Proj.ROUTER, PEMode.FULL, mode_reg)),
                pe.i.payload.keep.eq(keep),
                pe.i.payload.last.eq(closing),
            ]
        wd = desc_layout(fifo.w_data)
        m.d.comb += [
            wd.proj.eq(proj), wd.j.eq(j), wd.g.eq(g), wd.tag.eq(tag),
            wd.first.eq(j == 0), wd.last.eq(j == total - 1),
            wd.mult.eq(self.w.payload.mult), wd.shift.eq(self.w.payload.shift),
            wd.mult2.eq(self.w.payload.mult2), wd.shift2.eq(self.w.payload.shift2),
            fifo.w_en.eq(xfer & closing),
        ]
        h_clear = Signal()
        # h stays valid for the whole down projection; the next up projection
        # (which rewrites it) is only issued after this one
        m.d.comb += h_clear.eq(xfer & (proj == Proj.DOWN) & closing & g_end)

        # request issuer
        rstate = Signal(range(5))                       # 0 idle, 1 router, 2 shared, 3 wait, 4 routed
        ridx = Signal(range(max(S, k) + 1))
        tok_take = Signal()
        m.d.comb += [tok_take.eq(self.tok.valid & self.tok.ready),
                     self.tok.ready.eq((state == _St.IDLE) & (rstate == 0))]
        rq = self.req.payload
        m.d.comb += [self.req.valid.eq((rstate == 1) | (rstate == 2) | (rstate == 4)),
                     rq.kind.eq(Mux(rstate == 1, ReqKind.ROUTER, ReqKind.EXPERT)),
                     rq.shared.eq(rstate == 2),
                     rq.expert.eq(Mux(rstate == 4, post.sel[ridx[:_bits(k)]] if k > 1
                                      else post.sel[0], Mux(rstate == 2, ridx, 0))),
                     rq.mode.eq(Mux(rstate == 1, PEMode.FULL, mode_reg))]
        req_go = self.req.valid & self.req.ready
        with m.Switch(rstate):
            with m.Case(0):
                with m.If(tok_take):
                    m.d.sync += rstate.eq(1)
            with m.Case(1):
                with m.If(req_go):
                    m.d.sync += [rstate.eq(2 if S else 3), ridx.eq(0)]
            with m.Case(2):
                with m.If(req_go):
                    m.d.sync += ridx.eq(ridx + 1)
                    with m.If(ridx == S - 1):
                        m.d.sync += rstate.eq(3)
            with m.Case(3):
                with m.If(sel_ok):
                    m.d.sync += ridx.eq(0)
                    m.d.sync += rstate.eq(Mux(nsel == 0, 0, 4))
            with m.Case(4):
                with m.If(req_go):
                    m.d.sync += ridx.eq(ridx + 1)
                    with m.If(ridx == nsel - 1):
                        m.d.sync += rstate.eq(0)

        zero_out = Signal()
        with m.Switch(state):
            with m.Case(_St.IDLE):
                with m.If(tok_take):
                    m.d.sync += [x_reg.eq(self.tok.payload.x), mode_reg.eq(self.tok.payload.mode),
                                 mask_reg.eq(self.tok.payload.mask), tag.eq(~tag),
                                 proj.eq(Proj.ROUTER), g.eq(0), qi.eq(0), c.eq(0), j.eq(0),
                                 state.eq(_St.RUN)]
            with m.Case(_St.RUN):
                with m.If(xfer):
                    m.d.sync += c.eq(c + 1)
                    with m.If(c_end):
                        m.d.sync += [c.eq(0), qi.eq(qi + 1)]
                        with m.If(q_end):
                            m.d.sync += [qi.eq(0), g.eq(g + 1)]
                            with m.If(g_end):
                                m.d.sync += g.eq(0)
                                with m.Switch(proj):
                                    with m.Case(Proj.ROUTER):
                                        m.d.sync += state.eq(_St.NEXT)
                                    with m.Case(Proj.GATE):
                                        m.d.sync += proj.eq(Proj.UP)
                                    with m.Case(Proj.UP):
                                        m.d.sync += proj.eq(Proj.DOWN)
                                    with m.Case(Proj.DOWN):
                                        m.d.sync += [j.eq(j + 1), state.eq(_St.NEXT)]
            with m.Case(_St.NEXT):
                with m.If(j < S):
                    m.d.sync += [proj.eq(Proj.GATE), state.eq(_St.RUN)]
                with m.Elif(sel_ok):
                    with m.If(j < total):
                        m.d.sync += [proj.eq(Proj.GATE), state.eq(_St.RUN)]
                    with m.Elif(j == 0):
                        m.d.sync += state.eq(_St.ZERO)
                    with m.Else():
                        m.d.sync += state.eq(_St.IDLE)
            with m.Case(_St.ZERO):
                with m.If(zero_out):
                    m.d.sync += state.eq(_St.IDLE)
        m.d.comb += zero_out.eq((state == _St.ZERO) & ~self.o.valid)

        # ---- vector unit -------------------------------------------------------------------------
        gb_vals = Array(Signal(signed(W), name=f"gb_val{p}") for p in range(P))
        gb_desc = Signal(desc_layout)
        gb_busy = Signal()
        gb_idx = Signal(range(P))
        vu_adv = Signal()
        take = Signal()
        all_valid = pes[0].o.valid
        for pe in pes[1:]:
            all_valid = all_valid & pe.o.valid
        m.d.comb += take.eq(all_valid & fifo.r_rdy & (~gb_busy | (vu_adv & (gb_idx == P - 1))))
        m.d.comb += [pe.o.ready.eq(take) for pe in pes]
        m.d.comb += fifo.r_en.eq(take)
        with m.If(take):
            m.d.sync += [gb_vals[p].eq(pes[p].o.payload.value) for p in range(P)]
            m.d.sync += self.error.eq(self.error | Cat(pe.o.payload.error for pe in pes).any())
            m.d.sync += [gb_desc.eq(fifo.r_data), gb_idx.eq(0), gb_busy.eq(1)]
        with m.Elif(vu_adv & gb_busy):
            m.d.sync += gb_idx.eq(gb_idx + 1)
            with m.If(gb_idx == P - 1):
                m.d.sync += gb_busy.eq(0)

        # stage A: requantise
        a_v = gb_vals[gb_idx]
        a_q = requant(m, a_v, gb_desc.mult[gb_idx], gb_desc.shift[gb_idx], "rq_a")
        b_valid = Signal()
        b_proj = Signal(Proj)
        b_j = Signal.like(gb_desc.j)
        b_ch = Signal(range(max(E, H, I)))
        b_tag, b_first, b_last = Signal(), Signal(), Signal()
        b_v = Signal(signed(W))
        b_q = Signal(signed(8))
        b_m2 = Signal(gm.MULT_BITS)
        b_s2 = Signal(gm.SHIFT_BITS)
        with m.If(vu_adv):
            m.d.sync += [b_valid.eq(gb_busy), b_proj.eq(gb_desc.proj), b_j.eq(gb_desc.j),
                         b_ch.eq(gb_desc.g * P + gb_idx), b_tag.eq(gb_desc.tag),
                         b_first.eq(gb_desc.first), b_last.eq(gb_desc.last),
                         b_v.eq(a_v), b_q.eq(a_q), b_m2.eq(gb_desc.mult2[gb_idx]),
                         b_s2.eq(gb_desc.shift2[gb_idx])]

        # stage B: LUT / product / combine
        gates_ok = post.gates_valid & (post_tag == b_tag)
        gw = Signal(unsigned(F + 1))
        routed = b_j >= S
        if k > 1:
            m.d.comb += gw.eq(Mux(routed, post.gates[(b_j - S)[:_bits(k)]], gm.GATE_ONE))
        else:
            m.d.comb += gw.eq(Mux(routed, post.gates[0], gm.GATE_ONE))
        blocked = Signal()
        m.d.comb += blocked.eq(b_valid & (b_proj == Proj.DOWN) &
                               ((routed & ~gates_ok) | (b_last & self.o.valid)))
        m.d.comb += vu_adv.eq(~blocked)
        b_go = b_valid & ~blocked

        silu_in = silu_reg.word_select(b_ch, 8).as_signed()
        prod = Signal(signed(16))
        m.d.comb += prod.eq(silu_in * b_q)
        h_val = requant(m, prod, b_m2, b_s2, "rq_h")
        term = Signal(signed(F + 10))
        m.d.comb += term.eq(b_q * gw)
        acc_old = acc.word_select(b_ch, ACCW).as_signed()
        acc_new = Signal(signed(ACCW))
        m.d.comb += acc_new.eq(Mux(b_first, 0, acc_old) + term)
        y_val = requant(m, acc_new, b_m2, b_s2, "rq_y")
        lut_idx = Signal(8)
        m.d.comb += lut_idx.eq(b_q.as_unsigned() ^ 0x80)
        post_start = Signal()
        y_done = Signal()
        with m.If(b_go):
            with m.Switch(b_proj):
                with m.Case(Proj.ROUTER):
                    m.d.sync += logits.word_select(b_ch, W).eq(b_v)
                    with m.If(b_ch == E - 1):
                        m.d.sync += post_tag.eq(b_tag)
                with m.Case(Proj.GATE):
                    m.d.sync += silu_reg.word_select(b_ch, 8).eq(self.cfg.lut[lut_idx])
                with m.Case(Proj.UP):
                    m.d.sync += h_reg.word_select(b_ch, 8).eq(h_val)
                with m.Case(Proj.DOWN):
                    with m.If(b_last):
                        m.d.sync += y_reg.word_select(b_ch, 8).eq(y_val)
                    with m.Else():
                        m.d.sync += acc.word_select(b_ch, ACCW).eq(acc_new)
        m.d.comb += [
            post_start.eq(b_go & (b_proj == Proj.ROUTER) & (b_ch == E - 1)),
            y_done.eq(b_go & (b_proj == Proj.DOWN) & b_last & (b_ch == H - 1)),
            post.start.eq(post_start)]
        h_set = b_go & (b_proj == Proj.UP) & (b_ch == I - 1)
        with m.If(h_set):
            m.d.sync += h_ready.eq(1)
        with m.Elif(h_clear):
            m.d.sync += h_ready.eq(0)

        # ---- output ---------------------------------------------------------------------------
        m.d.comb += self.o.payload.y.eq(y_reg)
        with m.If(zero_out):
            m.d.sync += [y_reg.eq(0), self.o.valid.eq(1)]
        with m.Elif(y_done):
            m.d.sync += self.o.valid.eq(1)
        with m.Elif(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        return m


def _params(cfg):
    return dict(hidden=cfg.hidden, ffn=cfg.ffn, experts=cfg.experts, top_k=cfg.top_k,
                shared=cfg.shared_experts, pes=cfg.pes, lanes=cfg.lanes,
                slice_bits=cfg.slice_bits)


def _register():
    from ..blocks import Block
    return [Block("moe_layer", "elmoe3d_moe_layer",
                  "MoE layer datapath: router, top-k, SwiGLU experts on the bit-slice PE array",
                  _params, MoELayer, order=60)]


BLOCK_SPECS = _register()

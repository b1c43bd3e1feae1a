"""Vector unit: everything between a PE result and the layer output, one
element per cycle in a fixed-latency pipeline that never stalls after its
entry, for ``P`` token lanes in lockstep.

An ``ArrayResult`` (``P x B`` values of one dot-product step) is taken apart
into ``B`` elements, element ``b`` being row ``group * B + b`` of its
projection for every lane's token. The entry and the control of the stages
are shared; each lane has its own arithmetic (requantisations, product,
combine) and its own memories (its tokens' ``silu``, ``acc``, ``h`` and
``y``, by lane-local index, and a copy of the SiLU table), and writes only
for a lane that holds a token. The conditions of the entry that belong to
a token (its gates, its top-k's room) hold for every lane with a token.
At the entry (E0) an element waits until what it needs is there (its
segment's requantisation parameters, the pass's SiLU table / output
records, its token's gate weights, a free output buffer, room in top-k);
from then on it flows:

=====  ==================================================================
stage  work
=====  ==================================================================
E0     router logits go to top-k; parameters are popped after a segment's
       last token; the gate-table read is issued
A0     element registered (value, parameters, tag); the gate of its token
       for its expert selected (compares at A1, select at A2)
A0-A7  ``q1 = rq(value, mult, shift)`` (partial-product tree, two barrel
       stages, clamp)
A7     reads issued: SiLU table (GATE), ``silu`` of the row (UP), the
       output record of the row (DOWN)
A8     the read data registered as it is (no logic after a block RAM)
A9     GATE: ``silu = LUT[q1]`` written; UP/DOWN: ``b = silu`` or the gate
A9-A12 ``p = q1 * b`` (UP: ``silu * u``; DOWN: ``gate * d``); the ``acc``
       read is issued at A10 and its data registered at A12
A12    DOWN: ``acc = (first ? 0 : acc) + p`` (written at A13, unless last)
A13-20 ``q2 = rq(UP: p, prod_rq | DOWN last: acc, out_rq)``
A20    UP: ``h`` written, and after the segment row's last bank an
       ``up_done`` pulse; DOWN last: ``y`` written; END: ``done`` pulse
=====  ==================================================================

Every multiply is a partial-product tree with a register per level and
every memory output is registered before any logic (``silu``, ``acc``,
SiLU table, output records), so the longest path is one carry chain: the
unit is built for 125 MHz.

The entry's decision is a register. Whether an element may advance
(``ok``) is computed a cycle ahead, for the element that will be at the
entry in the next cycle (the next element of the result being taken apart,
the incoming result's first, or the same one if it waits), from what it
waits for *as it will be then*: every condition only rises, except through
an event of the current cycle that the entry knows and masks with (its own
parameter pop, logit into top-k, END, pass ``done``, and the softmax taking
a token's next result, which clears that token's gate-ready bit a cycle
later: the softmax's ``ready_keep``, the vector unit's ``gates[p].keep``, is its
``ready`` without that bit, a register). So a stale bit never
lets an element pass; a condition that rises while an element waits is seen
one cycle later than a combinational ``ok`` would see it (the element leaves
one cycle later; an element whose conditions already hold leaves in its
first cycle as before, so the unit still takes one element per cycle).
``i.ready`` is one LUT of flip-flops (``~ser_valid | ok & last``): the 16:1
select of ``gates[p].keep`` by the token and the rest of the conditions end
at the ``ok`` register instead of the PE array's output register enable;
the gate comes last in ``ok`` (an AND-OR with the held token's one-hot, or
the select by the incoming result's token).

Read-after-write without bypass logic (a transparent read port would put
Yosys's bypass multiplexer, and the block RAM's 5.8 ns, back in front of
the multiplier): a ``silu`` entry is written at A9 and read at A7, an
``acc`` entry written at A13 and read at A10, so an element sees the
``silu`` writes of every element at least three ahead of it and the
``acc`` writes of every element at least four ahead. (The ``acc`` write
is registered after the adder: the read-add-write loop through a block
RAM placed far from the adder had been one path, two long routes.) The same ``(token,
row)`` is much further apart: a GATE row's UP element comes after the
remaining GATE segments and the UP segments before it (at least
``g_in * B = I`` elements), a DOWN row's next accumulation is a later
job's (its GATE and UP segments lie between). The constructor requires
``I >= 4``.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ...geometry import GATE_FRAC, GATE_ONE
from ..vocab import bits
from .common import delay, mul_pipe, requant_pipe, zext
from .payloads import Kind, array_result, seg_params
from .ports import GateRead, HiddenRead, LogitFlow, PassConstants, PassDone, YRead

__all__ = ["VectorUnit", "LATENCY"]

#: Stages from A0 to the writes (A20).
LATENCY = 20


class VectorUnit(wiring.Component):
    """Requantisation, SiLU, SwiGLU product, gated combine, output
    requantisation for ``P`` token lanes in lockstep (see the module doc).

    Members
    -------
    i : ``In(stream.Signature(ArrayResult))``
    params : ``In(stream.Signature(SegParams)).array(B)``
    consts : ``In(PassConstants)``
        Pass constants (from the HB reader): ``out`` (per bank), ``lut`` writes;
        ``out_loaded``, ``lut_loaded`` say they are complete.
    logits : ``Out(LogitFlow).array(P)``
        Lane ``p``'s router logits (lane-local token) to lane ``p``'s top-k,
        and its ``last_ok`` / ``idle``.
    gates : ``Out(GateRead).array(P)``
        Lane ``p``'s softmax: gate-table read, ``keep`` (its ``ready_keep``),
        ``idle``.
    h : ``In(HiddenRead)``
        The issue stage's ``h`` reads (``rd``, one port per lane) and
        ``up_done``: one pulse per UP dot-product step (all its lanes),
        after its last row.
    y : ``In(YRead)``
        The output stage's ``y`` reads (``addr``: lane-local token, chunk;
        ``data[p]``) and ``out_done``.
    pass_done : ``Out(PassDone)``
        A pass's END element passed the last stage: every write of the pass
        is done (``done``, ``par``, ``error``).
    """

    def __init__(self, g):
        self.g = g
        B, P, Tl = g.B, g.P, g.Tl
        if g.I < 4:
            raise ValueError(f"VectorUnit needs an FFN size of at least 4 (the silu/acc "
                             f"read-after-write distance), not {g.I}")
        self.tb = bits(Tl)
        gl_ = g.lane()
        super().__init__({
            "i": In(stream.Signature(array_result(g))),
            "params": In(stream.Signature(seg_params())).array(B),
            "consts": In(PassConstants(g)),
            "logits": Out(LogitFlow(gl_)).array(P),
            "gates": Out(GateRead(gl_)).array(P),
            "h": In(HiddenRead(g)),
            "y": In(YRead(g)),
            "pass_done": Out(PassDone()),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        B, L, W, P, Tl = g.B, g.L, g.W, g.P, g.Tl
        rb = bits(max(g.E, g.I, g.H))

        # ---- memories ----------------------------------------------------------------------
        # `no_rw_check` on every memory: no read whose data is used meets a
        # write of the same entry in the same cycle (``silu``/``acc``: the same
        # (token, row) is at least I elements apart, see the module doc; ``h``:
        # the issue stage reads a token's ``h`` only once its UP results are
        # written; ``y``: read only after the pass is done, written again only
        # after ``out_done``; the SiLU table and the output records of a buffer:
        # loaded only while no pass of that buffer runs). Without it Yosys
        # puts a read-old-data bypass multiplexer behind each block RAM, and
        # the register behind it cannot become the EBR's output register.
        # Per token lane: its tokens' ``silu``, ``acc``, ``h`` and ``y`` and a
        # copy of the SiLU table (each lane looks up its own codes).
        def mem(name, shape, depth, gran=None):
            mm = m.submodules[name] = memory.Memory(shape=shape, depth=depth, init=[],
                                                    attrs={"no_rw_check": 1})
            w = mm.write_port(granularity=gran) if gran else mm.write_port()
            return mm, w

        def lname(base, p):
            return base if P == 1 else f"{base}{p}"
        silu_w, silu_r, acc_w, acc_r, h_w, y_w, lut_r = [], [], [], [], [], [], []
        for p in range(P):
            sm_, sw_ = mem(lname("silu", p), signed(8), Tl << bits(g.I))
            silu_w.append(sw_)
            silu_r.append(sm_.read_port())
            am_, aw_ = mem(lname("acc", p), signed(g.accw), Tl << bits(g.H))
            acc_w.append(aw_)
            acc_r.append(am_.read_port())
            hm_, hw_ = mem(lname("h", p), unsigned(8 * L), Tl << bits(g.c_down), gran=8)
            h_w.append(hw_)
            hr_ = hm_.read_port()
            ym_, yw_ = mem(lname("y", p), unsigned(8 * L), Tl << bits(g.c_in), gran=8)
            y_w.append(yw_)
            yr_ = ym_.read_port()
            lm_, lw_ = mem(lname("lut", p), unsigned(32), 128)
            lut_r.append(lm_.read_port())
            m.d.comb += [hr_.addr.eq(self.h.rd.addr[p]), self.h.rd.data[p].eq(hr_.data),
                         yr_.addr.eq(self.y.addr), self.y.data[p].eq(yr_.data),
                         lw_.addr.eq(self.consts.lut.addr), lw_.data.eq(self.consts.lut.data),
                         lw_.en.eq(self.consts.lut.en)]
        out_r = []
        for b in range(B):
            om, ow = mem(f"outrq{b}", unsigned(22), 2 << bits(g.g_down))
            r = om.read_port()
            out_r.append(r)
            cw = self.consts.out
            m.d.comb += [ow.addr.eq(cw.addr[b]), ow.data.eq(cw.data[b]), ow.en.eq(cw.en[b])]

        # ---- serializer and entry (E0) ------------------------------------------------------
        ser = Signal(array_result(g))
        ser_valid = Signal()
        bi = Signal(range(max(2, B)))
        # ``ok``: the element at the entry may advance; ``last``: it is its
        # result's last (END or bank B-1). Both are registers, computed a
        # cycle ahead for the element that will be at the entry (see the
        # module doc, "The entry"), so ``adv`` and ``i.ready`` come from
        # flip-flops.
        ok = Signal()
        last = Signal()
        dsc = ser.desc
        kind = dsc.kind
        is_end = dsc.end
        # (flags of the held result, registered as it is loaded)
        is_router = Signal()
        lgrp = Signal()                      # its group is the router's last
        need_params = ~is_router & ~is_end
        phead = Signal(seg_params())
        m.d.comb += phead.eq(Array(p.payload for p in self.params)[bi])
        ends = Signal(2)
        # `bi` one-hot, a register beside it: the entry's selects by `bi` and
        # `bi + 1` (a rotation) are AND-ORs of flip-flops, with no compare
        # (timing round 18: `bi` -> the parameter valid's select -> `ok`)
        bi_oh = Signal(B, init=1)
        bi1_oh = Cat(bi_oh[B - 1], bi_oh[:B - 1]) if B > 1 else bi_oh
        last_logit = lgrp & bi_oh[B - 1]
        adv = Signal()
        m.d.comb += adv.eq(ok)
        done_res = ok & last
        m.d.comb += self.i.ready.eq(~ser_valid | done_res)
        load = self.i.valid & self.i.ready
        with m.If(adv):
            m.d.sync += [bi.eq(bi + 1), bi_oh.eq(bi1_oh)]
        with m.If(done_res):
            m.d.sync += [ser_valid.eq(0), bi.eq(0), bi_oh.eq(1)]
        with m.If(load):
            nd_ = self.i.payload.desc
            m.d.sync += [ser.eq(self.i.payload), ser_valid.eq(1), bi.eq(0), bi_oh.eq(1),
                         is_router.eq((nd_.kind == Kind.ROUTER) & ~nd_.end),
                         lgrp.eq(nd_.group == g.g_router - 1)]
        for b in range(B):
            m.d.comb += self.params[b].ready.eq(adv & bi_oh[b] & need_params & dsc.seg_last)
        logit_go = adv & is_router
        lane_v = Signal(P)
        m.d.comb += lane_v.eq(Cat(*[dsc.lanes[p].valid for p in range(P)]))

        # What the entry waits for, as it will be in the next cycle. Every
        # condition only rises, except through an event of this cycle that is
        # known here, and is masked with it: a parameter pop (the stream's
        # ``ready``), a logit into top-k (top-k's ``idle`` / ``last_ok`` fall
        # a cycle later), an END's ``ends`` increment (the output buffer is
        # taken), a pass done (its constants' ``loaded`` flags are cleared a
        # cycle later) and the softmax taking a token's next result (its
        # ``ready`` bit is cleared a cycle later: ``gates[p].keep`` is the
        # softmax's ``ready`` without it, a register). A rise is seen a
        # cycle late (a waiting element leaves a cycle later than a
        # combinational ``ok`` would let it); a fall never is. With lanes,
        # each per-lane condition (top-k, gates) holds for every lane that
        # has a token.
        pv = Cat(p.valid for p in self.params)
        pv_n = Cat(p.valid & ~p.ready for p in self.params)
        topk_idle = Cat(*[self.logits[p].idle for p in range(P)])
        topk_idle_n = (topk_idle & ~(lane_v & logit_go.replicate(P))).all()
        y_free_n = (ends == self.y.out_done) & ~(adv & is_end)

        def last_ok_n(lanes):
            """Every lane with a token can take its last logit next cycle."""
            return Cat(*[~lanes[p] | (self.logits[p].last_ok
                                      & ~(logit_go & last_logit & lane_v[p]))
                         for p in range(P)]).all()

        def flag_n(flags, par):
            done = self.pass_done
            return flags.bit_select(par, 1) & ~(done.done & (done.par == par))

        def ok_of(d, lanes, p_ok, last_bank, d_lgrp):
            """``ok`` next cycle of an element of a result tagged ``d`` (bank's
            params valid ``p_ok``; ``last_bank``), bar the gate: ``(base, needs_gate)``.

            END also waits for the pass's constants: a pass that runs no
            expert never waits for them otherwise, and its `done` clears
            their "loaded" flags (a constant arriving later would set them
            again for the next pass in this buffer) and ends its HB word
            count."""
            lut_ok = flag_n(self.consts.lut_loaded, d.par)
            out_ok = flag_n(self.consts.out_loaded, d.par)
            last_lg = d_lgrp & last_bank
            sm_idle = Cat(*[self.gates[p].idle for p in range(P)]).all()
            base = Mux(d.end, sm_idle & topk_idle_n & lut_ok & out_ok,
                       Mux(d.kind == Kind.ROUTER, ~last_lg | last_ok_n(lanes),
                           p_ok
                           & Mux(d.kind == Kind.GATE, lut_ok, 1)
                           & Mux(d.kind == Kind.DOWN,
                                 ~Cat(*[d.lanes[p].last & d.lanes[p].valid
                                        for p in range(P)]).any() | (y_free_n & out_ok), 1)))
            return base, ~d.end & (d.kind == Kind.DOWN) & d.routed
        nd = self.i.payload.desc
        nd_v = Signal(P)
        m.d.comb += nd_v.eq(Cat(*[nd.lanes[p].valid for p in range(P)]))
        # The tokens' gates come last: for the incoming result a select of
        # `gates[p].keep` by each lane's token, for the held one an AND-OR with
        # the lane token's one-hot (a register loaded with it); each meets
        # the rest of the decision in the last LUT levels.
        tok_oh = [Signal(Tl, name=f"tok_oh{p}") for p in range(P)]
        with m.If(load):
            m.d.sync += [tok_oh[p].eq(Mux(nd.lanes[p].valid, 1 << nd.lanes[p].token, 0))
                         for p in range(P)]
        g_in = Cat(*[~nd.lanes[p].valid | self.gates[p].keep.bit_select(nd.lanes[p].token, 1)
                     for p in range(P)]).all()
        g_held = Cat(*[~lane_v[p] | (self.gates[p].keep & tok_oh[p]).any()
                       for p in range(P)]).all()
        b_in, n_in = ok_of(nd, nd_v, pv[0] if B > 1 else pv_n[0], Const(B == 1, 1),
                           nd.group == g.g_router - 1)
        b_nx, n_held = ok_of(dsc, lane_v, (pv & bi1_oh).any(), bi1_oh[B - 1], lgrp)
        b_st, _ = ok_of(dsc, lane_v, (pv & bi_oh).any(), bi_oh[B - 1], lgrp)
        b_held = Mux(adv, ~last & b_nx, ser_valid & b_st)
        ok_p, ok_qi, ok_qh = Signal(), Signal(), Signal()
        m.d.comb += [ok_p.eq(Mux(load, b_in & ~n_in, b_held & ~n_held)),
                     ok_qi.eq(load & b_in & n_in), ok_qh.eq(~load & b_held & n_held)]
        m.d.sync += [
            ok.eq((ok_p | (ok_qh & g_held)) | (ok_qi & g_in)),
            last.eq(Mux(load, nd.end | Const(B == 1, 1),
                        Mux(adv, bi1_oh[B - 1] if B > 1 else bi + 1 == B - 1, last)))]
        # the values of the element at the entry (one per lane), registers
        # loaded as `bi` moves (the `B`:1 select by `bi` ends there, not in
        # top-k's compares)
        value = [Signal(signed(W), name=f"value{p}") for p in range(P)]
        for p in range(P):
            m.d.sync += value[p].eq(Mux(load, self.i.payload.value[p][0],
                                        Mux(adv, Array(ser.value[p][b] for b in range(B))[bi + 1],
                                            value[p])))
        # logits straight to the lanes' top-k
        expert_of = (Cat(bi, dsc.group) if B == 1 << (B - 1).bit_length() and B > 1
                     else dsc.group * B + bi)
        for p in range(P):
            lg = self.logits[p].payload
            m.d.comb += [self.logits[p].valid.eq(logit_go & lane_v[p]),
                         lg.token.eq(dsc.lanes[p].token), lg.expert.eq(expert_of),
                         lg.value.eq(value[p]), lg.par.eq(dsc.par), lg.last.eq(last_logit),
                         self.gates[p].addr.eq(dsc.lanes[p].token)]
        pass_err = Signal()
        with m.If(adv & ~is_end):
            m.d.sync += pass_err.eq(pass_err | ser.error)
        with m.If(adv & is_end):
            m.d.sync += [pass_err.eq(0), ends.eq(ends + 1)]

        # ---- A0 (control shared by the lanes) --------------------------------------------
        a_valid = Signal()
        a_kind = Signal(Kind)
        a_end, a_par, a_routed = (Signal(name=f"a_{n}") for n in ("end", "par", "routed"))
        a_err = Signal()
        a_row = Signal(rb)
        a_grp = Signal.like(dsc.group)
        a_b = Signal.like(bi)
        a_exp = Signal.like(dsc.expert)
        a_p = Signal(seg_params())
        m.d.sync += [a_valid.eq(adv & ~is_router), a_kind.eq(kind), a_end.eq(is_end),
                     a_par.eq(dsc.par), a_routed.eq(dsc.routed),
                     a_err.eq(pass_err | ser.error),
                     a_row.eq(dsc.group * B + bi), a_grp.eq(dsc.group), a_b.eq(bi),
                     a_exp.eq(dsc.expert), a_p.eq(phead)]
        # (per lane: its token, valid, first and last flags and value)
        a_lv = Signal(P)
        a_first, a_last = Signal(P), Signal(P)
        a_tok = [Signal(range(max(2, Tl)), name=f"a_tok{p}") for p in range(P)]
        m.d.sync += [a_lv.eq(lane_v), a_first.eq(Cat(*[dsc.lanes[p].first for p in range(P)])),
                     a_last.eq(Cat(*[dsc.lanes[p].last for p in range(P)]))]
        m.d.sync += [a_tok[p].eq(dsc.lanes[p].token) for p in range(P)]
        a_val = [Signal(signed(W), name=f"a_val{p}") for p in range(P)]
        m.d.sync += [a_val[p].eq(value[p]) for p in range(P)]

        def carry(sig, n, name):
            return delay(m, sig, n, name)
        c7 = {nme: carry(sig, 7, nme) for nme, sig in
              (("v7", a_valid), ("k7", a_kind), ("e7", a_end), ("p7", a_par), ("f7", a_first),
               ("l7", a_last), ("r7", a_err), ("w7", a_row), ("g7", a_grp),
               ("b7", a_b), ("rt7", a_routed), ("lv7", a_lv))}
        t7 = [carry(a_tok[p], 7, f"t7_{p}") for p in range(P)]
        m27 = carry(a_p.mult2, 7, "m2_7")
        s27 = carry(a_p.shift2, 7, "s2_7")
        for b in range(B):
            m.d.comb += out_r[b].addr.eq(Cat(zext(c7["g7"], bits(g.g_down)), c7["p7"]))
        # ---- A8: the read data, registered into A9 (a block RAM drives no logic) ------------
        c8 = {k8: carry(v, 1, k8 + "_8") for k8, v in c7.items()}
        out_q = [Signal(22, name=f"out_q{b}", reset_less=True) for b in range(B)]
        m.d.sync += [out_q[b].eq(out_r[b].data) for b in range(B)]
        # ---- A9 -------------------------------------------------------------------------
        c9 = {k9: carry(v, 1, k9 + "_9") for k9, v in c8.items()}
        m2_9, s2_9 = carry(m27, 2, "m2_9"), carry(s27, 2, "s2_9")
        # the operand select's "is UP" is a flip-flop of its own (A8's kind
        # compared a cycle early): `k7` -> the compare -> `bop` -> the first
        # partial products -> the adder's carry chain was 8.2 ns in timing
        # round 17
        up9 = Signal()
        m.d.sync += up9.eq(c8["k7"] == Kind.UP)
        outrec = Signal(22)
        m.d.comb += outrec.eq(Array(out_q)[c9["b7"]])
        c12 = {k1: carry(v, 3, k1 + "_12") for k1, v in c9.items()}
        m2_12, s2_12 = carry(m2_9, 3, "m2_12"), carry(s2_9, 3, "s2_12")
        out_10 = Signal(22)
        m.d.sync += out_10.eq(outrec)
        out_12 = carry(out_10, 2, "out_12")
        c10 = {k0: carry(v, 1, k0 + "_10") for k0, v in c9.items()}
        c13 = {k2: carry(v, 1, k2 + "_13") for k2, v in c12.items()}
        c19 = {k9: carry(v, 7, k9 + "_20") for k9, v in c13.items()}
        is_down12 = c12["v7"] & (c12["k7"] == Kind.DOWN) & ~c12["e7"]
        v19 = c19["v7"] & ~c19["e7"]
        row19 = c19["w7"]
        lane_bits = bits(L)
        lane_en = (Const(1, L) << row19[:lane_bits]) if L > 1 else Const(1, 1)

        # ---- the lanes' pipelines --------------------------------------------------------
        for p in range(P):
            self._lane(m, p, a_val[p], a_exp, a_routed, a_p, t7[p], c7, c9, c10, c12, c19,
                       m2_12, s2_12, out_12, up9, is_down12, v19, row19, lane_en,
                       silu_r[p], silu_w[p], acc_r[p], acc_w[p], h_w[p], y_w[p], lut_r[p],
                       m27, s27)

        # the pulses leave from flip-flops (worked out a stage early, from the
        # same carried fields one register shorter: the same cycle as the writes)
        c18 = {k8: carry(c13[k8], 6, k8 + "_19") for k8 in ("v7", "k7", "e7", "b7", "p7", "r7")}
        m.d.sync += [self.h.up_done.eq(c18["v7"] & ~c18["e7"] & (c18["k7"] == Kind.UP)
                                     & (c18["b7"] == B - 1)),
                     self.pass_done.done.eq(c18["v7"] & c18["e7"]),
                     self.pass_done.par.eq(c18["p7"]), self.pass_done.error.eq(c18["r7"])]
        return m

    def _lane(self, m, p, a_val, a_exp, a_routed, a_p, t7, c7, c9, c10, c12, c19, m2_12,
              s2_12, out_12, up9, is_down12, v19, row19, lane_en, silu_r, silu_w, acc_r, acc_w,
              h_w, y_w, lut_r, m27, s27):
        """One token lane's stages A0 .. A20 (the module doc's table)."""
        g = self.g
        K, tb = g.K, self.tb

        def nm(x):
            return x if g.P == 1 else f"{x}_l{p}"

        def carry(sig, n, name):
            return delay(m, sig, n, nm(name))
        # gate of this lane's token for this expert (routed DOWN), in Q12: the
        # expert compares are registered at A1 with the gates, the select at
        # A2 (the gate is first used at A9)
        gd = self.gates[p].data
        g_hit = Signal(K, name=nm("g_hit"))
        g_gates = [Signal(GATE_FRAC + 1, name=nm(f"g_gate{r}")) for r in range(K)]
        g_routed = Signal(name=nm("g_routed"))
        m.d.sync += [g_hit.eq(Cat(*[gd.sel[r] == a_exp for r in range(K)])),
                     g_routed.eq(a_routed)]
        m.d.sync += [g_gates[r].eq(gd.gate[r]) for r in range(K)]
        gsel = Const(GATE_ONE, GATE_FRAC + 1)
        for r in reversed(range(K)):
            gsel = Mux(g_hit[r], g_gates[r], gsel)
        gate = Signal(GATE_FRAC + 1, name=nm("gate"))
        m.d.sync += gate.eq(Mux(g_routed, gsel, GATE_ONE))   # at A2

        # ---- A0..A7: q1 = rq(value) ----------------------------------------------------------
        q1, lat1 = requant_pipe(m, a_val, a_p.mult, a_p.shift, nm("rq1"))
        assert lat1 == 7, lat1
        gate7 = carry(gate, 5, "gate7")
        code = Signal(8, name=nm("code"))
        m.d.comb += code.eq(q1.as_unsigned() ^ 0x80)
        m.d.comb += [lut_r.addr.eq(Cat(code[2:8], c7["p7"])),
                     silu_r.addr.eq(Cat(zext(c7["w7"], bits(g.I)), zext(t7, tb)))]
        # ---- A8 ---------------------------------------------------------------------------
        # (no reset and no enable: on ECP5 they become the EBRs' output registers)
        lut_q = Signal(32, reset_less=True, name=nm("lut_q"))
        silu_q = Signal(signed(8), reset_less=True, name=nm("silu_q"))
        m.d.sync += [lut_q.eq(lut_r.data), silu_q.eq(silu_r.data)]
        # ---- A9 -------------------------------------------------------------------------
        t9 = carry(t7, 2, "t9")
        t10 = carry(t7, 3, "t10")
        t12 = carry(t7, 5, "t12")
        t19 = carry(t7, 13, "t19")
        q1_9 = carry(q1, 2, "q1_9")
        code9 = carry(code, 2, "code9")
        gate9 = carry(gate7, 2, "gate9")
        lv9 = c9["lv7"][p]
        silu_new = Signal(signed(8), name=nm("silu_new"))
        m.d.comb += silu_new.eq(lut_q.word_select(code9[:2], 8))
        m.d.comb += [silu_w.addr.eq(Cat(zext(c9["w7"], bits(g.I)), zext(t9, tb))),
                     silu_w.data.eq(silu_new),
                     silu_w.en.eq(c9["v7"] & lv9 & (c9["k7"] == Kind.GATE) & ~c9["e7"])]
        bop = Signal(signed(14), name=nm("bop"))
        m.d.comb += bop.eq(Mux(up9, silu_q, gate9))
        prod, latm = mul_pipe(m, bop, q1_9, nm("mul_s"), b_signed=True)
        assert latm == 3, latm
        # acc read issued at A10, its data registered at A12
        m.d.comb += acc_r.addr.eq(Cat(zext(c10["w7"], bits(g.H)), zext(t10, tb)))
        acc_q = Signal(signed(g.accw), reset_less=True, name=nm("acc_q"))
        m.d.sync += acc_q.eq(acc_r.data)

        # ---- A12: combine ------------------------------------------------------------------
        acc_new = Signal(signed(g.accw), name=nm("acc_new"))
        m.d.comb += acc_new.eq(Mux(c12["f7"][p], 0, acc_q) + prod)
        # (written a cycle later, from registers: see the module doc)
        m.d.sync += [acc_w.addr.eq(Cat(zext(c12["w7"], bits(g.H)), zext(t12, tb))),
                     acc_w.data.eq(acc_new),
                     acc_w.en.eq(is_down12 & c12["lv7"][p] & ~c12["l7"][p])]
        v2 = Signal(signed(max(g.accw, len(prod))), name=nm("v2"))
        m2, s2 = Signal(16, name=nm("m2")), Signal(6, name=nm("s2"))
        m.d.sync += [v2.eq(Mux(c12["k7"] == Kind.DOWN, acc_new, prod)),
                     m2.eq(Mux(c12["k7"] == Kind.DOWN, out_12[:16], m2_12)),
                     s2.eq(Mux(c12["k7"] == Kind.DOWN, out_12[16:22], s2_12))]

        # ---- A13..A20: q2 = rq(v2) -----------------------------------------------------------
        q2, lat2 = requant_pipe(m, v2, m2, s2, nm("rq2"))
        assert lat2 == 7, lat2

        # ---- A20: writes -------------------------------------------------------------------
        lane_bits = bits(g.L)
        v = v19 & c19["lv7"][p]
        word = Cat(*[q2.as_unsigned()] * g.L)
        m.d.comb += [h_w.addr.eq(Cat(zext(row19 >> lane_bits, bits(g.c_down)), zext(t19, tb))),
                     h_w.data.eq(word),
                     h_w.en.eq(Mux(v & (c19["k7"] == Kind.UP), lane_en, 0)),
                     y_w.addr.eq(Cat(zext(row19 >> lane_bits, bits(g.c_in)), zext(t19, tb))),
                     y_w.data.eq(word),
                     y_w.en.eq(Mux(v & (c19["k7"] == Kind.DOWN) & c19["l7"][p], lane_en, 0))]

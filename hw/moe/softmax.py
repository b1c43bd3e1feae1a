"""Integer softmax of each token's selected logits into Q12 gate weights
(:func:`elmoe3d.golden.moe_layer.gate_weights`), written into the gate table
the vector unit reads for the combine.

Per token (``m <= k`` selected logits ``l_0 >= l_1 >= ...``):

1. ``m`` exponents, one per cycle through a pipeline:
   ``d = l_0 - l_r`` -> ``d * SM_MULT`` (partial-product tree) -> ``>> SM_SHIFT``
   (two barrel stages) -> ``min(., 255)`` -> ``EXP2_Q15[t & 15] >> (t >> 4)``;
2. ``k`` restoring dividers in parallel, ``(e_r << 12) // sum(e)``, one
   quotient bit per cycle (13 cycles);
3. one write of the token's ``k`` gates and experts into the gate table,
   and its bit of ``ready`` set.

About ``m + 9 + 14`` cycles per token (one of them the ``TAKE`` state, for
timing); the router spends ``E H n / (B L)`` cycles per token, so the
softmax keeps pace at every preset. ``sm_mult`` /
``sm_shift`` come from the pass's softmax record (two sets, one per pass
buffer), loaded by the HB reader (``sm``).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ...geometry import GATE_FRAC, MULT_BITS, SHIFT_BITS, T_MAX
from ...golden import moe_layer as gm
from .common import delay, mul_pipe
from .payloads import gate_row, topk_result
from .ports import GateRead, PassDone, SoftmaxRecord
from .queue import Queue

__all__ = ["Softmax", "gate_row"]

F = GATE_FRAC


class Softmax(wiring.Component):
    """Gate weights of every token of a pass.

    Members
    -------
    i : ``In(stream.Signature(TopKResult))``
        Through an internal FIFO of ``T`` entries.
    sm : ``In(SoftmaxRecord)``
        Load the softmax record of pass buffer ``sm.par``.
    clear : ``In(PassDone)``
        The pass in buffer ``clear.par`` is done: its record is stale.
    gates : ``In(GateRead)``
        ``addr`` (a token) -> ``data`` (its ``gate_row``), one cycle later;
        ``keep`` is ``ready_keep`` and ``idle`` is ``idle`` below.
    ready : ``Out(T)``
        Token ``t``'s gates are in the table (cleared when its next result
        arrives).
    ready_clr, ready_clr_token : ``Out``
        ``ready`` bit ``ready_clr_token`` falls in the next cycle (its token's
        next result is taken): a consumer that registers a ``ready`` bit a
        cycle ahead masks it with this (registers only, one compare).
    ready_keep (``gates.keep``)
        ``ready`` without the bit ``ready_clr`` names: the bits certain to be
        up in the next cycle, as a register of its own (a consumer that
        registers a ``ready`` bit a cycle ahead selects from it, with no
        compare after the select).
    idle (``gates.idle``)
        No token waiting or in progress (a register).
    """

    def __init__(self, g):
        self.g = g
        super().__init__({
            "i": In(stream.Signature(topk_result(g))),
            "sm": In(SoftmaxRecord()),
            "clear": In(PassDone()),
            "gates": In(GateRead(g)),
            "ready": Out(g.T),
            "ready_clr": Out(1), "ready_clr_token": Out(range(max(2, g.T))),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        K, T, W = g.K, g.T, g.W
        # `i.ready` is a flip-flop (`room`: room for a write next cycle too, as
        # at most one write happens per cycle), so top-k's output handshake
        # and the scheduler's snoop of it start at registers; one entry more
        # than the tokens of a pass keeps a whole pass's results acceptable.
        # The FIFO writes on `i.valid` alone (a `Queue` on a `CreditFIFO`).
        fifo = m.submodules.fifo = Queue(topk_result(g), max(2, T) + 1, counter=True)
        # The FIFO's level is counted here as well (`used`, equal to
        # `fifo.level` in every cycle): its next value is one of four worked
        # out from `used` alone, which the write and the read only select, so
        # `room` and `idle` compare a register instead of the FIFO's
        # `inner_level + r_rdy` adder (timing round 17: the level's carry
        # chains and a compare behind them, 10 LUT levels, set a seed's clock
        # when the FIFO was a `QueueFIFO`)
        room = Signal()
        used = Signal(range(fifo.depth + 1))
        u_inc, u_dec = Signal.like(used), Signal.like(used)
        f_rd = Signal()
        m.d.comb += [u_inc.eq(used + 1), u_dec.eq(used - 1), f_rd.eq(fifo.o.ready & fifo.o.valid)]
        m.d.sync += [used.eq(Mux(fifo.i.valid, Mux(f_rd, used, u_inc), Mux(f_rd, u_dec, used))),
                     room.eq(used <= fifo.depth - 2)]
        m.d.comb += [fifo.i.payload.eq(self.i.payload), fifo.i.valid.eq(self.i.valid & room),
                     self.i.ready.eq(room)]
        head = Signal(topk_result(g))
        m.d.comb += head.eq(fifo.o.payload)

        mem = m.submodules.table = memory.Memory(shape=gate_row(g), depth=max(2, T), init=[])
        wp, rp = mem.write_port(), mem.read_port()
        m.d.comb += [rp.addr.eq(self.gates.addr), self.gates.data.eq(rp.data)]

        sm_m = Array(Signal(MULT_BITS, name=f"sm_mult{p}") for p in range(2))
        sm_s = Array(Signal(SHIFT_BITS, name=f"sm_shift{p}") for p in range(2))
        sm_ok = Signal(2)
        with m.If(self.sm.en):
            m.d.sync += [sm_m[self.sm.par].eq(self.sm.mult), sm_s[self.sm.par].eq(self.sm.shift),
                         sm_ok.bit_select(self.sm.par, 1).eq(1)]
        with m.If(self.clear.done):
            m.d.sync += sm_ok.bit_select(self.clear.par, 1).eq(0)

        cur = Signal(topk_result(g))
        mult = Signal(MULT_BITS)
        shift = Signal(SHIFT_BITS)
        # exponent pipeline
        launch = Signal()
        lr = Signal(range(K + 1))
        d = Signal(unsigned(W + 1))
        d_valid = Signal()
        d_rank = Signal(range(K))
        logits = Array(cur.logit[r] for r in range(K))
        # the logit of rank `lr` is selected into a register of its own, and
        # subtracted a cycle later (the select and the carry chain had been
        # one path, the layer's worst on two seeds of round 10)
        l_sel = Signal.like(cur.logit[0])
        l_valid = Signal()
        l_rank = Signal(range(K))
        m.d.sync += [l_sel.eq(logits[lr]), l_valid.eq(launch), l_rank.eq(lr)]
        m.d.sync += [d.eq(cur.logit[0] - l_sel), d_valid.eq(l_valid), d_rank.eq(l_rank)]
        prod, lat = mul_pipe(m, d, mult, "sm_mul")
        pv = delay(m, d_valid, lat, "sm_pv")
        pr = delay(m, d_rank, lat, "sm_pr")
        ta = Signal(prod.shape())
        tb = Signal(prod.shape())
        m.d.sync += [ta.eq(prod >> shift[:3]), tb.eq(ta >> Cat(Const(0, 3), shift[3:]))]
        v2, r2 = delay(m, pv, 2, "sm_v2"), delay(m, pr, 2, "sm_r2")
        # `e = EXP2_Q15[t & 15] >> (t >> 4)` of `t = min(tb, T_MAX)` in two
        # halves, no register more: the table read and the shift by
        # `t >> 4 & 3` are one table of `tb`'s low six bits, the shift by
        # `t >> 6` and the saturation come a cycle later (a registered `t8`
        # then a 16:1 shift behind the table had been the unit's deepest
        # cone, 5 LUT levels). `tb <= T_MAX <= 255` where it is not saturated,
        # so `tb[:8]` is `t` there.
        exp2 = Array(Const(int(gm.EXP2_Q15[i & 15]) >> (i >> 4), 16) for i in range(64))
        e_lo = Signal(16)                   # EXP2_Q15[t & 15] >> (t >> 4 & 3)
        e_hi = Signal(2)                    # t >> 6
        e_big = Signal()                    # t saturated
        m.d.sync += [e_lo.eq(exp2[tb[:6]]), e_hi.eq(tb[6:8]), e_big.eq(tb > T_MAX)]
        v3, r3 = delay(m, v2, 1, "sm_v3"), delay(m, r2, 1, "sm_r3")
        e_sat = int(gm.EXP2_Q15[T_MAX & 15]) >> (T_MAX >> 4)
        e_now = Signal(16)
        m.d.sync += e_now.eq(Mux(e_big, e_sat, e_lo >> Cat(Const(0, 2), e_hi)))
        v4, r4 = delay(m, v3, 1, "sm_v4"), delay(m, r3, 1, "sm_r4")

        e_val = Array(Signal(16, name=f"e{r}") for r in range(K))
        esum = Signal(16 + K.bit_length())
        got = Signal(range(K + 1))
        # `got == cur.count` as a flip-flop, worked out beside each assignment
        # of `got` (the dividers' load enable then starts at a register)
        all_got = Signal()
        with m.If(v4):
            m.d.sync += [e_val[r4].eq(e_now), esum.eq(esum + e_now), got.eq(got + 1),
                         all_got.eq(got + 1 == cur.count)]

        # dividers
        rem = [Signal(16 + F + 1, name=f"rem{r}") for r in range(K)]
        quo = [Signal(F + 1, name=f"q{r}") for r in range(K)]
        dv = Signal(len(esum) + F)
        step = Signal(range(F + 2))
        ready = Signal(T)
        m.d.comb += self.ready.eq(ready)

        row = Signal(gate_row(g))
        for r in range(K):
            m.d.comb += [row.gate[r].eq(Mux(r < cur.count, quo[r], 0)), row.sel[r].eq(cur.sel[r])]
        m.d.comb += [wp.addr.eq(cur.token), wp.data.eq(row)]

        take = Signal()
        m.d.comb += take.eq(fifo.o.valid & sm_ok.bit_select(head.par, 1))
        # `ready_clr` / `ready_clr_token` are flip-flops of their own, set as
        # TAKE is entered (TAKE lasts one cycle and the head does not change
        # from LOAD to TAKE): the vector unit's `ok` register, far away,
        # starts its path at them, not at this FSM's state decode
        clr = Signal()
        clr_token = Signal.like(self.ready_clr_token)
        m.d.comb += [self.ready_clr.eq(clr), self.ready_clr_token.eq(clr_token)]
        m.d.sync += [clr.eq(0), clr_token.eq(head.token)]
        # `ready_keep` = `ready & ~(ready_clr ? 1 << ready_clr_token : 0)`,
        # registered from the next values of both (set below with them)
        keep = Signal(T)
        ready_set = Signal(T)               # WRITE: the bit it sets
        ready_drop = Signal(T)              # TAKE: the bit it clears
        clr_next = Signal(T)                # LOAD -> TAKE: the bit `ready_clr` will name
        # the tokens' one-hots are registers (the head's, decoded every cycle:
        # in TAKE it is the head's, unchanged since LOAD; the current
        # token's, loaded in TAKE), so a `ready` / `ready_keep` bit's next
        # value is a LUT of the state and flip-flops, not a token decode
        # behind the state decode (5 LUT levels alone, 6 in the layer)
        head_oh = Signal(T)
        cur_oh = Signal(T)
        m.d.sync += head_oh.eq(1 << head.token)
        ready_n = Signal(T)
        m.d.comb += [self.gates.keep.eq(keep), ready_n.eq((ready & ~ready_drop) | ready_set)]
        m.d.sync += [ready.eq(ready_n), keep.eq(ready_n & ~clr_next)]
        # `idle` (LOAD and an empty FIFO) is a flip-flop, set from the next
        # values of both: the next state is LOAD only from LOAD (no take) or
        # WRITE; the FIFO is read only in TAKE, and a FIFO of level 0 has no
        # head to take, so from LOAD or WRITE with level 0 and no write the
        # next cycle is idle, and from anything else it is not. The register
        # equals `LOAD & level == 0` in every cycle (the level's adder and
        # compare had been the head of the layer's deepest cone, through
        # `idle` into the vector unit's `ok`).
        idle = Signal(init=1)
        m.d.comb += self.gates.idle.eq(idle)
        m.d.sync += idle.eq(0)
        with m.FSM(name="softmax"):
            with m.State("LOAD"):
                m.d.sync += idle.eq((used == 0) & ~fifo.i.valid)   # (o.valid lags a write)
                with m.If(take):
                    m.d.sync += clr.eq(1)
                    m.d.comb += clr_next.eq(1 << head.token)
                    m.next = "TAKE"
            with m.State("TAKE"):
                # the head seen in LOAD is still there (nothing else reads the
                # FIFO): its read enable and `ready_clr` are decoded from the
                # state register alone, so the take decision ends at it
                m.d.comb += fifo.o.ready.eq(1)
                m.d.sync += [cur.eq(head), mult.eq(sm_m[head.par]), shift.eq(sm_s[head.par]),
                             lr.eq(0), got.eq(0), all_got.eq(head.count == 0), esum.eq(0),
                             cur_oh.eq(head_oh)]
                m.d.comb += ready_drop.eq(head_oh)
                m.next = "EXP"
            with m.State("EXP"):
                with m.If(lr < cur.count):
                    m.d.comb += launch.eq(1)
                    m.d.sync += lr.eq(lr + 1)
                with m.If(all_got):
                    m.d.sync += [dv.eq(esum << F), step.eq(0)]
                    for r in range(K):
                        m.d.sync += [rem[r].eq(e_val[r] << F), quo[r].eq(0)]
                    m.next = "DIV"
            with m.State("DIV"):
                for r in range(K):
                    # one carry chain: `rem >= dv` is the difference's sign
                    diff = Signal(signed(max(len(rem[r]), len(dv)) + 1), name=f"diff{r}")
                    m.d.comb += diff.eq(rem[r] - dv)
                    ge = ~diff[-1]
                    m.d.sync += [rem[r].eq(Mux(ge, diff, rem[r])), quo[r].eq(Cat(ge, quo[r]))]
                m.d.sync += [dv.eq(dv >> 1), step.eq(step + 1)]
                with m.If(step == F):
                    m.next = "WRITE"
            with m.State("WRITE"):
                m.d.sync += idle.eq((used == 0) & ~fifo.i.valid)
                m.d.comb += wp.en.eq(1)
                m.d.comb += ready_set.eq(cur_oh)
                m.next = "LOAD"
        return m

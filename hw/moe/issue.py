"""Issue stage: walks a pass's router and jobs segment by segment and step
by step, reads weights from the two replay buffers and activations from
the token store (``x``) or the vector unit (``h``), one per token lane, and
feeds the PE array one beat per cycle.

Steps (the token-parallel array)
--------------------------------
A beat carries one slice vector per PE and the activations of up to ``P``
tokens, one per token lane (token ``t`` of a pass is lane ``t mod P``'s, at
lane-local index ``t div P``). A **step** is the beats of one dot product
for the tokens the lanes hold: for the router, the ``P`` consecutive tokens
``s P .. s P + P - 1``; for a job's segment, in each lane the lowest of the
job's tokens of that lane not yet taken in this segment
(:func:`elmoe3d.golden.moe_batched.lane_steps`). A job's tokens run in two
classes, its DRAFT tokens (``k`` planes) first, then the others (``n``
planes), so every token of a step has the same planes; a lane without a
token in a step multiplies zeros and the vector unit ignores its result.
The steps of a segment are ``JobEntry.steps`` (the scheduler counts them).

Order of a pass (buffer ``par``)
--------------------------------
1. The **router**, step-major: for every router step, all ``E / B`` router
   segments (planes ``0 .. n-1``, FULL), replayed from the HB buffer, so
   each token's logits leave the vector unit together (streaming top-k, one
   unit per lane).
2. The **jobs** in job-table order (shared, then routed in announce
   order), each as soon as its decision is in; per job, per segment
   (GATE groups, UP groups, DOWN groups), per step of the job: the
   step's planes (``k`` for the DRAFT class, ``n`` otherwise), each plane's
   chunks. Plane ``q`` comes from the HB buffer when ``q`` is below the
   job's HB plane count (a shared job: the planes its precision needs; an
   HB-sourced one: ``k``; an LPDDR one: 0), else from the LPDDR buffer; the
   segment is freed in both buffers after its last step. Every word a port
   delivers is read by at least one step (a job needs all ``n`` planes only
   if one of its tokens does), so freeing a segment never skips a word that
   has not arrived.
3. One END beat (a dot product of zeros) whose tag tells the vector unit
   that the pass is complete; the pass summary goes to the output stage and
   the token buffer is released.

PE modes: the router FULL; a DRAFT token DRAFT (the PE adds the LSB
augmentation on plane ``k-1``); a FULL or VERIFY token FULL.

Split verification
------------------
A FULL/VERIFY token of a split job reads planes ``0 .. k-1`` of each
segment from the HB buffer and planes ``k .. n-1`` from the LPDDR buffer,
which the two ports fill concurrently, and the PE accumulates them as one
FULL dot product. That *is* the sum of the two partial sums: the PE adds
``(slice field * activation) << field_shift(plane)`` per plane whatever the
mode, so its FULL result over planes ``0 .. n-1`` equals its MSB-mode result
over ``0 .. k-1`` plus its LSB-mode result over ``k .. n-1``, exactly
(``golden.bitslice.pe_dot``; ``tests/test_moe_units.py`` proves it on the
golden PE and ``split_equals_full`` on the RTL). One dot product instead of
two partial ones keeps one result per segment row for the vector unit and
keeps each dot product in one mode, as the PE's beat rule requires.

A whole-resident job (both plane groups in HB slots) looks like a split
one here: its planes ``k .. n-1`` arrive in the LPDDR buffer from its LSB
slot (the LPDDR writer puts them there, :mod:`.ext_port`) instead of from
LPDDR.

Hazards: a DOWN beat of the ``j``-th step of a job needs its tokens'
``h`` (written by the vector unit after their last UP results). Every
segment of a job has the same steps in the same order and UP results
leave in issue order, so it suffices that at most ``S_e - 1 - j`` UP
steps are still in flight (``S_e`` the job's steps per segment;
``up_inflight``: +1 per issued UP step, -1 per ``up_done`` pulse). The last shared job waits for the
pass's routing before its DOWN segments (it is the last job of tokens that
selected no routed expert).

Pipeline: I0 decides a beat and presents the memory addresses, I1 has the
memory outputs (registered as they are), I2 forms the beat, I3 writes it
into a FIFO; a beat launches only while fewer than ``CREDITS`` beats are in
I1, I2, I3 and the FIFO, so nothing stalls between I0 and the FIFO. For 125 MHz,
``launch`` (I0) looks only at registers or small compares of registers:
the availability of the word at the next read position is compared with
the write pointers a cycle ahead, for both outcomes (launch or not), and
``launch`` only selects; so are the next read positions. A new word is
seen a cycle after its write (one cycle more latency from a port, no
change of throughput).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..vocab import PEMode, TokenRole, bits
from .common import CycleCount, lowest_set, pow2ceil, zext
from .payloads import Kind, array_beat, job_entry, job_source, pass_summary
from .ports import (BufferRead, HiddenRead, JobRead, PassCounters, PassProgress, PassRelease,
                    PassView, x_read)
from .queue import Queue

__all__ = ["Issue"]

#: Beats in flight after I0 (I1, I2, I3 and the FIFO) at most. A beat holds
#: its credit for five cycles (launch + 1 .. its read, the buffered FIFO's
#: output register appearing two cycles after its write), so one launch per
#: cycle needs six: with one credit fewer than its cycles the issue stage
#: launched 4 beats in 5 cycles (MAC-bound passes at 0.79-0.80 of the bound,
#: T = 16 at ``default``, when I3 did not exist and five were needed).
CREDITS = 6
#: The FIFO is deeper than the credits: a buffered FIFO refuses a write
#: while its inner memory is full even if its output register is empty, so
#: its ``level`` alone does not guarantee ``i.ready``. With ``CREDITS`` below
#: the inner memory's ``FIFO_DEPTH - 1`` entries no write meets a full FIFO,
#: so the FIFO (a :class:`~elmoe3d.hw.moe.queue.Queue` with ``credit``, on a
#: ``QueueFIFO``) writes on ``i.valid`` alone and counts its level with two
#: pointers: neither the 450-bit storage's write enable nor its read enable
#: passes a level counter (the layer's critical path in round 8, both ways).
FIFO_DEPTH = 8
assert CREDITS < FIFO_DEPTH - 1


class Issue(wiring.Component):
    """The beat sequencer of the batched datapath (see the module doc).

    Members
    -------
    passes : ``In(PassView)`` (token store; ``valid``, ``count``, ``roles``,
        ``step_last`` are read)
    release : ``Out(PassRelease)``
        The pass's buffer is free (with the END beat).
    x : ``Out(ReadPort).array(P)`` (token store's ``x``, one per token lane)
    jobs : ``Out(JobRead)`` (job table)
    progress : ``In(PassProgress)`` (scheduler)
    hb_buf, ext_buf : ``Out(BufferRead)``
        The HB and LPDDR weight buffers (read position, ``free``; their
        words and ``wp_all``).
    h : ``Out(HiddenRead)``
        The vector unit's ``h`` (one read port per token lane) and its
        ``up_done`` pulses.
    ext_counters : ``In(PassCounters)``
        The LPDDR writer's beats and error per buffer (the HB reader's go
        to the output stage).
    time : ``In(CycleCount)``
        The cycle counter (a pass's ``start``).
    o : ``Out(stream.Signature(ArrayBeat))``
    summary : ``Out(stream.Signature(PassSummary))``
    """

    def __init__(self, g):
        self.g = g
        P = g.P
        if P & (P - 1):
            raise ValueError(f"Token lanes must be a power of two, not {P!r}")
        self.tb, self.cb = bits(g.Tl), bits(max(g.c_in, g.c_down))
        self.cbx = bits(g.c_in)
        self.jb = bits(pow2ceil(g.jobs))
        super().__init__({
            "passes": In(PassView(g)),
            "release": Out(PassRelease()),
            "x": Out(x_read(g)).array(P),
            "jobs": Out(JobRead(g)),
            "progress": In(PassProgress(g)),
            "hb_buf": Out(BufferRead(g.B, g.sv, g.hb_depth)),
            "ext_buf": Out(BufferRead(g.B, g.sv, g.ext_depth)),
            "h": Out(HiddenRead(g)),
            "ext_counters": In(PassCounters(g)),
            "time": In(CycleCount(g)),
            "o": Out(stream.Signature(array_beat(g))),
            "summary": Out(stream.Signature(pass_summary(g))),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        pv, prog = self.passes, self.progress
        T, B, n, k, S, P, Tl = g.T, g.B, g.n, g.k, g.S, g.P, g.Tl
        pb = bits(P) if P > 1 else 0         # lane bits of a pass position
        AB = array_beat(g)

        n_views = [0]

        def lanes_of(mask):
            """``mask`` (``T`` bits, pass positions) cut into its ``P`` lane
            views (bit ``i`` of lane ``p`` is position ``i P + p``), as
            signals (an expression would be rebuilt for every bit taken)."""
            src = Signal(T, name=f"view{n_views[0]}")
            m.d.comb += src.eq(mask)
            out = []
            for p in range(P):
                v = Signal(Tl, name=f"view{n_views[0]}_l{p}")
                m.d.comb += v.eq(Cat(*[src[i * P + p] if i * P + p < T else Const(0, 1)
                                       for i in range(Tl)]))
                out.append(v)
            n_views[0] += 1
            return out

        def scatter(lane_bits):
            """The inverse of ``lanes_of``: ``P`` lane views -> ``T`` bits."""
            return Cat(*[lane_bits[t % P][t // P] for t in range(T)])
        fifo = m.submodules.fifo = Queue(AB, FIFO_DEPTH, credit=True)
        wiring.connect(m, fifo.o, wiring.flipped(self.o))

        # ---- pass state -------------------------------------------------------------
        pi = Signal()
        count = Signal.like(pv.count[0])
        # the router's last step, ceil(count / P) - 1, registered with it
        rsteps_m1 = Signal(range(max(2, Tl)))
        dmask = Signal(T)                    # the DRAFT tokens of the pass
        step_last = Signal()
        start = Signal.like(self.time.cycle)
        mac = Signal.like(self.time.cycle)
        j = Signal(range(g.jobs + 1))
        ent = Signal(job_entry(g))
        src = Signal(job_source(g))
        m.d.comb += self.jobs.addr.eq(Cat(zext(j, self.jb), pi))
        decided = Array(prog.decided)
        j_ok, j_end = Signal(), Signal()     # (registers, set below)
        idle_was = Signal()                  # `~running` in the previous cycle
        total = Array(prog.total)
        no_routed = Signal(T)
        m.d.comb += no_routed.eq(Mux(pi, prog.no_routed[1], prog.no_routed[0]))

        # ---- walk --------------------------------------------------------------------
        in_router = Signal()
        running = Signal()
        end_req = Signal()
        # the FSM is in END, as a flip-flop of its own (`end_req` and what it
        # selects do not decode the FSM's state register)
        at_end = Signal()
        proj = Signal(Kind)                  # GATE, UP, DOWN for a job
        grp = Signal(range(max(g.g_router, g.g_in, g.g_down) + 1))
        q = Signal(range(n + 1))
        c = Signal(range(max(g.c_in, g.c_down) + 1))
        t = Signal(range(max(2, Tl)))        # router step (lane-local token index)
        # the tokens of the current step, per lane: lane-local index and valid
        lt = [Signal(range(max(2, Tl)), name=f"lt{p}") for p in range(P)]
        lv = Signal(P)
        # Tokens of a job run class by class: its DRAFT tokens (`k` planes)
        # first, then the others (`n` planes); `cls2` says the second class
        # is running. `rem` holds the running class's tokens not yet started.
        cls2 = Signal()
        rem = Signal(T)                       # tokens of this segment and class not yet started
        slot = Signal(range(T + 1))
        slack = Signal(range(T + 1))
        hbn = Signal(range(n + 1))           # job planes in the HB buffer
        extn = Signal(range(n + 1))          # job planes in the LPDDR buffer
        hb_seg = Signal.like(self.hb_buf.pos)
        ext_seg = Signal.like(self.ext_buf.pos)
        hb_p = Signal.like(self.hb_buf.pos)
        ext_p = Signal.like(self.ext_buf.pos)
        up_inflight = Signal(range(g.g_in * T + 2))
        m.d.comb += [self.hb_buf.free.eq(hb_seg), self.ext_buf.free.eq(ext_seg),
                     self.hb_buf.pos.eq(hb_p), self.ext_buf.pos.eq(ext_p)]

        # Everything the launch decision looks at is a register (or one compare
        # of registers): the "last" compares use registered limits, the next
        # token of a segment is looked up a cycle ahead, the credit is a
        # counter and the h-ready condition is registered for the current,
        # the next and the first token slot. After any token or segment
        # transition those lookahead registers settle for a cycle: a beat that
        # would end the new token at once (a one-beat token) waits one cycle,
        # and the first beat after an UP -> DOWN change waits two cycles (so
        # that every UP dot product of the job is counted in `up_inflight`).
        cl = Signal.like(c)                  # chunks - 1 of the current phase
        gl_ = Signal.like(grp)               # groups - 1 of the current phase
        tpl = Signal(range(n))               # planes - 1 of the current token
        # `cl - 1`, `gl_ - 1`, `tpl - 1` (wrapping: `c`, `grp`, `q` never reach
        # all-ones) and `hbn - 1` (0 for 0), registered with them, so that the
        # "next is last" compares `x + 1 == lim` are `x == lim_m1`, no adder
        cl_m1, gl_m1, tpl_m1 = Signal.like(cl), Signal.like(gl_), Signal.like(tpl)
        hbn_m1 = Signal(range(n + 1))
        # `in_router | (q < hbn)` as a flip-flop, worked out wherever `q`,
        # `in_router` or `hbn` is assigned (below, beside each assignment)
        from_hb = Signal(init=1)
        s1_valid, s2_valid = Signal(), Signal()
        inflight = Signal(range(CREDITS + 2))
        credit = Signal(init=1)              # `inflight < CREDITS`, as a flip-flop (below)
        is_down = ~in_router & (proj == Kind.DOWN)
        bubble = Signal()                    # next cycle waits (through `go`)
        bubble_b = Signal()                  # the bubble's second cycle
        # the last shared job waits for the pass's routing before its DOWN
        # segments: "the last shared expert" is registered with the job entry,
        # and `sel_done` (far away, in the scheduler) enters the register
        # `h_go` (below), so is seen a cycle late, a safe bound (it only rises
        # within a pass, long before a DOWN segment)
        last_sh = Signal()
        wait_sel = last_sh & ~prog.sel_done.bit_select(pi, 1) if S else Const(0)
        # `~is_down | (h-ready & ~wait_sel)`, next cycle's value (it reaches
        # `launch` through the flip-flop `go`), from this cycle's `is_down`
        # (`proj` and `in_router` only change where `launch` waits anyway:
        # the UP -> DOWN bubble, the end of the router or of a job)
        h_go = Signal()
        go = Signal()                        # `h_go & ~hold & ~bubble`, registered (below)

        def h_go_is(h):
            return Mux(is_down, h & ~wait_sel, 1)
        # `last_c & last_q` in the cycle after a token start (a one-beat token
        # waits while the lookahead registers settle), next cycle's value
        # (through `go`), worked out wherever a token starts: the new token is
        # one beat long (below, beside each token start)
        hold = Signal()
        # `c == cl`, `q == tpl` and `grp == gl_` as flip-flops, worked out
        # wherever `c`, `q`, `grp`, `cl`, `tpl` or `gl_` is assigned (below,
        # beside each assignment), so that `launch` and everything it selects
        # start from registers
        last_c = Signal()
        last_q = Signal()
        last_g = Signal()
        tok_end = last_c & last_q

        # Read positions: both next values computed from registers (`launch`,
        # which is late, only selects one), and the availability of the word
        # at each of them registered a cycle ahead: `hb_p`/`ext_p` next cycle is
        # `*_p_l` after a launch, `*_p_n` otherwise (a token or segment start
        # moves them to the segment's start). A word is there iff the position
        # is not a bank's write pointer; last cycle's write pointers are a safe
        # bound (they only move forward, and a read position never passes them),
        # so new words are seen a cycle later, at unchanged throughput.
        nxt_any = Signal()                   # (set below)
        # another step in this segment: of the running class, or the job's
        # second class (registered with `nxt_any`; the read positions go back
        # to the segment's start for it)
        nxt_more = Signal()
        nxt_idx = [Signal.like(lt[p], name=f"nxt_idx{p}") for p in range(P)]
        nxt_v, nxt_oh = Signal(P), Signal(T)
        hb_reset, ext_reset = Signal(), Signal()   # FSM: position to the segment start
        hb_p_l, ext_p_l = Signal.like(hb_p), Signal.like(ext_p)
        hb_p_n, ext_p_n = Signal.like(hb_p), Signal.like(ext_p)
        hb_av_l, hb_av_n, ext_av_l, ext_av_n = Signal(), Signal(), Signal(), Signal()
        launched = Signal()
        avail = Mux(from_hb, Mux(launched, hb_av_l, hb_av_n), Mux(launched, ext_av_l, ext_av_n))
        launch = Signal()
        m.d.comb += launch.eq(running & avail & credit & go)
        # (as `up_inflight` below: the late `launch` only selects)
        rd_now = fifo.o.ready & fifo.o.valid
        inf_keep = Signal.like(inflight)
        inf_inc = Signal.like(inflight)
        m.d.comb += [inf_keep.eq(inflight - rd_now), inf_inc.eq(inflight + 1 - rd_now)]
        m.d.sync += [inflight.eq(Mux(launch | end_req, inf_inc, inf_keep)),
                     credit.eq(Mux(launch | end_req, inf_inc < CREDITS, inf_keep < CREDITS))]

        def step_of(mask, name):
            """The step that takes the lowest token of each lane of ``mask``:
            per-lane indices, the lanes' valid bits and the tokens as ``T``
            bits (a priority tree per lane, the one-hot by ``x & -x``)."""
            idx, vs, ohs = [], [], []
            for p, lm in enumerate(lanes_of(mask)):
                a, i = lowest_set(m, lm, f"{name}{p}")
                oh = Signal(Tl, name=f"{name}_oh{p}")
                m.d.comb += oh.eq(lm & (~lm + 1))
                idx.append(i)
                vs.append(a)
                ohs.append(oh)
            return idx, Cat(*vs), scatter(ohs)

        # next step of the segment, one cycle ahead; the first step of the
        # job's first class and of its second class
        ni_c, nv_c, noh_c = step_of(rem, "nxt")
        m.d.sync += [nxt_any.eq(rem.any()), nxt_v.eq(nv_c), nxt_oh.eq(noh_c)]
        m.d.sync += [nxt_idx[p].eq(ni_c[p]) for p in range(P)]
        jm2 = Signal(T)                      # the job's other tokens
        has2 = Signal()                      # the job has both classes
        m.d.sync += nxt_more.eq(rem.any() | (~cls2 & has2))
        f_draft = Signal()                   # its first class is DRAFT
        cm0 = Signal(T)                      # the first class's tokens (registered with them)
        fi_c, fv_c, foh_c = step_of(cm0, "first")
        f2i_c, f2v_c, f2oh_c = step_of(jm2, "second")
        f_idx = [Signal.like(lt[p], name=f"f_idx{p}") for p in range(P)]
        f2_idx = [Signal.like(lt[p], name=f"f2_idx{p}") for p in range(P)]
        f_v, f2_v = Signal(P), Signal(P)
        f_rem, f2_rem = Signal(T), Signal(T)  # `rem` after each first step
        cur_draft = Signal()
        # h-ready for the current, the next and the first step (up_inflight only
        # falls during DOWN, so last cycle's count is a safe bound)
        h_cur = up_inflight <= slack
        h_nxt = up_inflight < slack
        h_first = up_inflight < ent.steps

        def planes_l(draft):
            return Mux(in_router, n - 1, Mux(draft, k - 1, n - 1))

        # beat contents (registered into I1)
        mode = Signal(PEMode)
        m.d.comb += mode.eq(Mux(~in_router & cur_draft, PEMode.DRAFT, PEMode.FULL))
        D = array_beat(g)
        s1 = Signal(D)
        s1_ext, s1_h = Signal(), Signal()
        dsc = s1.desc
        for p in range(P):
            m.d.comb += [self.x[p].addr.eq(Cat(zext(c, self.cbx),
                                               zext(Mux(in_router, t, lt[p]), self.tb), pi)),
                         self.h.rd.addr[p].eq(Cat(zext(c, bits(g.c_down)), zext(lt[p], self.tb)))]
        first_l, last_l, nr_l = lanes_of(ent.first_mask), lanes_of(ent.last_mask), \
            lanes_of(no_routed)
        # a router step's lanes: position t P + p below the pass's count
        rvalid = Cat(*[(Cat(Const(p, pb), t) if pb else t) < count for p in range(P)])
        m.d.sync += [s1_valid.eq(launch | end_req), launched.eq(launch)]
        # the read positions load as the walk registers do (below): on a
        # launch their after-a-launch values, while not `running` the FSM's
        # (a segment start) or their own; `launch` is their clock enable and
        # the data select is `running` (a flip-flop), so `launch` is in no
        # data cone (timing round 17: `launch` -> three LUTs -> `hb_pos`,
        # ABC having folded the launch select into the positions' logic).
        # While `running` without a launch they hold: the FSM's resets
        # (`hb_reset`, `ext_reset`) come only while not `running`.
        with m.If(launch | ~running):
            m.d.sync += [hb_p.eq(Mux(running, hb_p_l, hb_p_n)),
                         ext_p.eq(Mux(running, ext_p_l, ext_p_n))]
        # I1 is loaded every cycle (its contents matter only with `s1_valid`):
        # `launch` enables none of its registers, so its fan-out stays small
        with m.If(launch):
            m.d.sync += mac.eq(mac + 1)
        with m.If(~end_req):
            m.d.sync += [s1.mode.eq(mode), s1.keep.eq(k), s1.last.eq(tok_end),
                         s1_ext.eq(~from_hb), s1_h.eq(is_down),
                         dsc.kind.eq(Mux(in_router, Kind.ROUTER, proj)), dsc.end.eq(0),
                         dsc.par.eq(pi), dsc.group.eq(grp),
                         dsc.expert.eq(ent.expert), dsc.routed.eq(~ent.shared),
                         dsc.seg_last.eq(~rem.any() & (cls2 | ~has2))]
            for p in range(P):
                ln = dsc.lanes[p]
                m.d.sync += [
                    ln.valid.eq(Mux(in_router, rvalid[p], lv[p])),
                    ln.token.eq(Mux(in_router, t, lt[p])),
                    ln.first.eq(Mux(ent.shared, ent.expert == 0,
                                    first_l[p].bit_select(lt[p], 1))),
                    ln.last.eq(Mux(ent.shared,
                                   (ent.expert == S - 1) & nr_l[p].bit_select(lt[p], 1),
                                   last_l[p].bit_select(lt[p], 1)))]
            m.d.sync += [s1.sv[b].plane.eq(q) for b in range(B)]
        with m.Else():
            # a one-beat MSB dot product of zeros (a legal beat sequence)
            m.d.sync += [s1.mode.eq(PEMode.MSB), s1.keep.eq(1), s1.last.eq(1), s1_ext.eq(0),
                         s1_h.eq(0), dsc.kind.eq(Kind.ROUTER), dsc.end.eq(1), dsc.par.eq(pi),
                         dsc.seg_last.eq(0)]
            m.d.sync += [dsc.lanes[p].valid.eq(0) for p in range(P)]
            m.d.sync += [s1.sv[b].plane.eq(0) for b in range(B)]
        s1_zero = Signal()
        m.d.sync += s1_zero.eq(~launch)
        # I1 -> I2: memory outputs registered as they are
        s2 = Signal(D)
        s2_ext, s2_h, s2_zero = Signal(), Signal(), Signal()
        # (no reset and no enable: on ECP5 the flow packs them into the block
        # RAMs' output registers, see `ReplayBuffer`)
        s2_hb = [Signal(g.sv, name=f"s2_hb{b}", reset_less=True) for b in range(B)]
        s2_xd = [Signal(g.sv, name=f"s2_xd{b}", reset_less=True) for b in range(B)]
        s2_x = [Signal(8 * g.L, name=f"s2_x{p}", reset_less=True) for p in range(P)]
        s2_hh = [Signal(8 * g.L, name=f"s2_hh{p}", reset_less=True) for p in range(P)]
        m.d.sync += [s2_valid.eq(s1_valid), s2.eq(s1), s2_ext.eq(s1_ext), s2_h.eq(s1_h),
                     s2_zero.eq(s1_zero)]
        m.d.sync += [s2_x[p].eq(self.x[p].data) for p in range(P)]
        m.d.sync += [s2_hh[p].eq(self.h.rd.data[p]) for p in range(P)]
        m.d.sync += [s2_hb[b].eq(self.hb_buf.data[b]) for b in range(B)]
        m.d.sync += [s2_xd[b].eq(self.ext_buf.data[b]) for b in range(B)]
        # I2 -> I3: the beat formed from the memory words into a register
        # before the FIFO's distributed RAM. The block RAMs sit in their own
        # columns, the FIFO by the issue stage: with the select straight
        # into the FIFO's write data both routes were on one path (4.3 ns
        # from an EBR's output register to the select, 2.5 ns on to the
        # FIFO; timing round 17). No reset and no enable: the beat matters
        # only with `s3_valid`.
        s3_valid = Signal()
        s3 = Signal(D, reset_less=True)
        m.d.sync += [s3_valid.eq(s2_valid), s3.mode.eq(s2.mode), s3.keep.eq(s2.keep),
                     s3.last.eq(s2.last), s3.desc.eq(s2.desc)]
        # (a lane without a token multiplies zeros)
        m.d.sync += [s3.act[p].eq(Mux(s2_zero | ~s2.desc.lanes[p].valid, 0,
                                      Mux(s2_h, s2_hh[p], s2_x[p]))) for p in range(P)]
        for b in range(B):
            m.d.sync += [s3.sv[b].plane.eq(s2.sv[b].plane),
                         s3.sv[b].slices.eq(Mux(s2_zero, 0, Mux(s2_ext, s2_xd[b], s2_hb[b])))]
        m.d.comb += [fifo.i.valid.eq(s3_valid), fifo.i.payload.eq(s3)]

        # ---- walk updates -------------------------------------------------------------------
        # an issued UP dot product is counted a cycle after its launch (a
        # register between `launch` and the counter); the UP -> DOWN bubble
        # lasts two cycles so that the first DOWN beat still sees every UP
        # dot product of the job counted (`h_go` is registered from it)
        up_inc = Signal()
        m.d.sync += up_inc.eq(launch & tok_end & ~in_router & (proj == Kind.UP))
        # both outcomes computed from registers, `up_inc` (late: it follows
        # `launch`) only selects one (no carry chain after the launch logic)
        upd_keep = Signal.like(up_inflight)
        upd_inc = Signal.like(up_inflight)
        m.d.comb += [upd_keep.eq(up_inflight - self.h.up_done),
                     upd_inc.eq(up_inflight + 1 - self.h.up_done)]
        m.d.sync += up_inflight.eq(Mux(up_inc, upd_inc, upd_keep))
        # segment lengths in each buffer, and the next segment starts
        hb_len = Signal.like(hb_seg)
        ext_len = Signal.like(ext_seg)
        hb_nxt = Signal.like(hb_seg)
        ext_nxt = Signal.like(ext_seg)
        m.d.sync += [hb_nxt.eq(hb_seg + hb_len), ext_nxt.eq(ext_seg + ext_len)]
        # next read positions and their availability (see `launch` above)
        m.d.comb += [
            hb_p_l.eq(Mux(in_router, Mux(tok_end & last_g, hb_seg, hb_p + 1),
                          Mux(tok_end, Mux(nxt_more, hb_seg, hb_nxt),
                              Mux(from_hb, hb_p + 1, hb_p)))),
            ext_p_l.eq(Mux(in_router, ext_p,
                           Mux(tok_end, Mux(nxt_more, ext_seg, ext_nxt),
                               Mux(from_hb, ext_p, ext_p + 1)))),
            hb_p_n.eq(Mux(hb_reset, hb_seg, hb_p)),
            ext_p_n.eq(Mux(ext_reset, ext_seg, ext_p))]
        # each candidate compared on its own (the compares run in parallel and
        # the choice comes after them) with the buffer's `wp_all` (one register:
        # every bank has its word below it); `p + 1 != wp` as `p != wp - 1`,
        # with `wp - 1` registered (one cycle older: still a safe bound)
        hb_wm1 = Signal.like(self.hb_buf.wp, name="hb_wm1")
        ext_wm1 = Signal.like(self.ext_buf.wp, name="ext_wm1")
        m.d.sync += [hb_wm1.eq(self.hb_buf.wp - 1), ext_wm1.eq(self.ext_buf.wp - 1)]
        hb_c_p, hb_c_p1 = hb_p != self.hb_buf.wp, hb_p != hb_wm1
        hb_c_seg, hb_c_nxt = hb_seg != self.hb_buf.wp, hb_nxt != self.hb_buf.wp
        ext_c_p, ext_c_p1 = ext_p != self.ext_buf.wp, ext_p != ext_wm1
        ext_c_seg, ext_c_nxt = ext_seg != self.ext_buf.wp, ext_nxt != self.ext_buf.wp
        hb_ok_l = Mux(in_router, Mux(tok_end & last_g, hb_c_seg, hb_c_p1),
                      Mux(tok_end, Mux(nxt_more, hb_c_seg, hb_c_nxt), Mux(from_hb, hb_c_p1, hb_c_p)))
        ext_ok_l = Mux(in_router, ext_c_p,
                       Mux(tok_end, Mux(nxt_more, ext_c_seg, ext_c_nxt),
                           Mux(from_hb, ext_c_p, ext_c_p1)))
        hb_ok_n = Mux(hb_reset, hb_c_seg, hb_c_p)
        ext_ok_n = Mux(ext_reset, ext_c_seg, ext_c_p)
        m.d.sync += [hb_av_l.eq(hb_ok_l), hb_av_n.eq(hb_ok_n), ext_av_l.eq(ext_ok_l),
                     ext_av_n.eq(ext_ok_n)]
        # `hold`, `bubble` and `h_go` are worked out as next values (their
        # defaults here, overridden beside the walk's assignments below) and
        # reach `launch` as one flip-flop, `go`: `launch` is then an AND of
        # three flip-flops with the availability select (two LUT levels),
        # not of six (three levels; round 12's worst path on two seeds of
        # five ran `bubble` -> `h_go` -> `launch` -> a walk register)
        m.d.comb += [hold.eq(0), bubble.eq(bubble_b), h_go.eq(h_go_is(h_cur))]
        m.d.sync += [bubble_b.eq(0), go.eq(h_go & ~hold & ~bubble)]

        # The walk after a launch is worked out from registers alone, into
        # `nx[id(r)]` for each walk register `r` (`id`: `proj` is an enum
        # view; `nx_c` for `hold`, `h_go` and `bubble`): `launch` only
        # selects it, in the last LUT in front of each register (the block at
        # the end, after the FSM, which never writes these while `running`,
        # so never while `launch`). In round 15
        # the conditions were nested under `launch`, and ABC shared terms of
        # them: the worst path of a seed ran `launch` -> `rem`'s clock
        # enable -> `from_hb`, 6 LUTs with two routes across the die.
        walk = [c, last_c, q, last_q, from_hb, grp, last_g, t, running, in_router, hb_seg,
                ext_seg, rem, j, tpl, tpl_m1, cur_draft, slot, slack, proj, cl, gl_, cl_m1,
                gl_m1, hb_len, ext_len, lv, cls2] + lt
        nx = {id(r): Signal.like(r, name=f"{Value.cast(r).name}_l") for r in walk}
        nx_c = {"hold": Signal(name="hold_l"), "h_go": Signal(name="h_go_l"),
                "bubble": Signal(name="bubble_l")}
        nx_bb = Signal(name="bubble_b_l")
        m.d.comb += [nx[id(r)].eq(r) for r in walk]
        m.d.comb += [nx_bb.eq(0), nx_c["hold"].eq(0), nx_c["h_go"].eq(h_go_is(h_cur)),
                     nx_c["bubble"].eq(bubble_b)]

        class _Launched:
            """Assignments into the after-a-launch values."""
            @staticmethod
            def sync(*pairs):
                m.d.comb += [nx[id(r)].eq(v) for r, v in pairs]

            @staticmethod
            def comb(*pairs):
                m.d.comb += [nx_c[r.name].eq(v) for r, v in pairs]

        class _Fsm:
            """The FSM's assignments (it runs only while not `running`): the
            walk registers' into `nx` too, the combinational ones as made."""
            sync = _Launched.sync

            @staticmethod
            def comb(*pairs):
                m.d.comb += [r.eq(v) for r, v in pairs]

        def start_step(w, idx, v, draft, sl, h):
            """A job's step starts: lane tokens ``idx`` (valid ``v``), all of
            one class (``draft``), ``sl``-th of its segment."""
            w.sync(*[(lt[p], idx[p]) for p in range(P)])
            w.sync((lv, v), (q, 0), (c, 0), (tpl, planes_l(draft)),
                   (tpl_m1, planes_l(draft) - 1), (cur_draft, draft),
                   (slot, sl), (slack, ent.steps - 1 - sl),
                   (from_hb, hbn != 0),
                   (last_c, cl == 0), (last_q, planes_l(draft) == 0))
            w.comb((hold, (cl == 0) & (planes_l(draft) == 0)), (h_go, h_go_is(h)))

        def start_first(w):
            """The first step of a segment: the job's first class."""
            start_step(w, f_idx, f_v, f_draft, 0, h_first)
            w.sync((rem, f_rem), (cls2, 0))

        def set_phase(w, kind, draft=None):
            # (`c` is 0 whenever the phase changes; `draft`: the role of the
            # token started with the phase, if one is)
            ch = g.c_down if kind == Kind.DOWN else g.c_in
            gr = g.g_down if kind == Kind.DOWN else g.g_in
            # (`grp` is 0 whenever the phase changes)
            w.sync((proj, kind), (cl, ch - 1), (gl_, gr - 1), (cl_m1, ch - 2),
                   (gl_m1, gr - 2),
                   (hb_len, hbn * ch), (ext_len, extn * ch), (last_c, ch == 1),
                   (last_g, gr == 1))
            if draft is not None:
                w.comb((hold, (planes_l(draft) == 0) if ch == 1 else 0))

        L_ = _Launched
        with m.If(running):                                   # (launch implies it)
            L_.sync((c, c + 1), (last_c, c == cl_m1))
            with m.If(last_c):
                L_.sync((c, 0), (q, q + 1), (last_c, cl == 0), (last_q, q == tpl_m1),
                        (from_hb, in_router | (q < hbn_m1)))
            with m.If(in_router):
                with m.If(last_c & last_q):
                    L_.sync((q, 0), (grp, grp + 1), (last_q, tpl == 0), (from_hb, 1),
                            (last_g, grp == gl_m1))
                    with m.If(last_g):                            # token done
                        L_.sync((grp, 0), (last_g, gl_ == 0))
                        L_.comb((hold, (cl == 0) & (tpl == 0)))
                        with m.If(t == rsteps_m1):
                            L_.sync((running, 0), (in_router, 0), (hb_seg, hb_seg + g.router_words))
                        with m.Else():
                            L_.sync((t, t + 1))
            with m.Elif(tok_end):
                with m.If(nxt_any):                               # next step of the class
                    start_step(L_, nxt_idx, nxt_v, cur_draft, slot + 1, h_nxt)
                    L_.sync((rem, rem & ~nxt_oh))
                with m.Elif(~cls2 & has2):                        # the job's second class
                    start_step(L_, f2_idx, f2_v, 0, slot + 1, h_nxt)
                    L_.sync((rem, f2_rem), (cls2, 1))
                with m.Else():                                    # segment done
                    L_.sync((hb_seg, hb_nxt), (ext_seg, ext_nxt), (grp, grp + 1),
                            (last_g, grp == gl_m1))
                    start_first(L_)
                    with m.If(last_g):
                        L_.sync((grp, 0), (last_g, gl_ == 0))
                        with m.Switch(proj):
                            with m.Case(Kind.GATE):
                                set_phase(L_, Kind.UP, f_draft)
                            with m.Case(Kind.UP):
                                set_phase(L_, Kind.DOWN, f_draft)
                                L_.comb((bubble, 1))
                                m.d.comb += nx_bb.eq(1)
                            with m.Case(Kind.DOWN):
                                L_.sync((running, 0), (j, j + 1))

        summ = self.summary.payload
        my_epoch = Signal(2)
        fresh = prog.epoch.bit_select(pi, 1) != my_epoch.bit_select(pi, 1)
        # END: the summary is offered once the beat FIFO has room (which only
        # grows while nothing launches); its handshake launches the END beat
        m.d.comb += [self.summary.valid.eq(at_end & credit),
                     end_req.eq(at_end & credit & self.summary.ready)]
        with m.If(end_req):
            m.d.comb += [self.release.en.eq(1), self.release.par.eq(pi)]
            m.d.sync += [pi.eq(~pi), at_end.eq(0),
                         my_epoch.bit_select(pi, 1).eq(prog.epoch.bit_select(pi, 1))]
        with m.FSM(name="issue"):
            with m.State("IDLE"):
                with m.If(pv.valid.bit_select(pi, 1)):
                    cnt_in = Mux(pi, pv.count[1], pv.count[0])
                    m.d.sync += [count.eq(cnt_in),
                                 rsteps_m1.eq(((cnt_in + (P - 1)) >> pb) - 1),
                                 dmask.eq(Cat(*[Mux(pi, pv.roles[1][x], pv.roles[0][x])
                                                == TokenRole.DRAFT for x in range(T)])),
                                 step_last.eq(pv.step_last.bit_select(pi, 1)),
                                 start.eq(self.time.cycle), mac.eq(0)]
                    _Fsm.sync((j, 0), (in_router, 1), (running, 1), (grp, 0), (q, 0), (c, 0),
                              (from_hb, 1),
                              (last_c, g.c_in == 1), (last_q, n == 1),
                              (t, 0), (tpl, n - 1), (cl, g.c_in - 1),
                              (tpl_m1, n - 2), (cl_m1, g.c_in - 2),
                              (gl_, g.g_router - 1), (gl_m1, g.g_router - 2),
                              (last_g, g.g_router == 1), (slack, 0),
                              (cur_draft, 0))
                    m.d.comb += [h_go.eq(1), hold.eq(int(g.c_in == 1 and n == 1))]
                    m.d.comb += hb_reset.eq(1)
                    m.next = "ROUTER"
            with m.State("ROUTER"):
                with m.If(~running):
                    m.next = "JOB_WAIT"
            with m.State("JOB_WAIT"):
                with m.If(~running & idle_was & fresh & j_ok):
                    m.next = "JOB_READ"
                with m.Elif(~running & idle_was & fresh & j_end):
                    m.d.sync += at_end.eq(1)
                    m.next = "END"
            with m.State("JOB_READ"):
                e, s_ = self.jobs.entry, self.jobs.src
                need = Mux(e.precision == TokenRole.DRAFT, k, n)
                nh = Mux(e.shared, need, Mux(s_.hb, k, 0))
                m.d.sync += [ent.eq(self.jobs.entry), src.eq(self.jobs.src), hbn.eq(nh),
                             hbn_m1.eq(Mux(nh == 0, 0, nh - 1)),
                             extn.eq(Mux(e.shared, 0, need - nh))]
                _Fsm.sync((grp, 0), (last_g, gl_ == 0))
                if S:
                    m.d.sync += last_sh.eq(e.shared & (e.expert == S - 1))
                m.next = "JOB_FIRST"
            with m.State("JOB_FIRST"):
                set_phase(_Fsm, Kind.GATE)
                d_tok = ent.tok_mask & dmask
                o_tok = ent.tok_mask & ~dmask
                m.d.sync += [jm2.eq(o_tok), f_draft.eq(d_tok.any()),
                             cm0.eq(Mux(d_tok.any(), d_tok, o_tok)),
                             has2.eq(d_tok.any() & o_tok.any())]
                m.next = "JOB_STEPS"
            with m.State("JOB_STEPS"):
                # the first steps of both classes, from the registered classes
                m.d.sync += [f_v.eq(fv_c), f_rem.eq(cm0 & ~foh_c),
                             f2_v.eq(f2v_c), f2_rem.eq(jm2 & ~f2oh_c)]
                m.d.sync += [f_idx[p].eq(fi_c[p]) for p in range(P)]
                m.d.sync += [f2_idx[p].eq(f2i_c[p]) for p in range(P)]
                m.next = "JOB_START"
            with m.State("JOB_START"):
                start_first(_Fsm)
                _Fsm.sync((running, 1))
                m.d.comb += [hb_reset.eq(1), ext_reset.eq(1)]
                m.next = "JOB_WAIT"
            with m.State("END"):
                m.d.comb += [summ.count.eq(count), summ.step_last.eq(step_last),
                             summ.zero_mask.eq(no_routed if not S else 0),
                             summ.error.eq(self.ext_counters.error.bit_select(pi, 1)),
                             summ.start.eq(start),
                             summ.ext_beats.eq(Mux(pi, self.ext_counters.count[1],
                                                   self.ext_counters.count[0])),
                             summ.mac_beats.eq(mac),
                             summ.experts.eq(Mux(pi, prog.experts[1], prog.experts[0])),
                             summ.expert_tokens.eq(Mux(pi, prog.expert_tokens[1],
                                                       prog.expert_tokens[0]))]
                with m.If(end_req):
                    m.next = "IDLE"
        # `j < decided[pi]` and `j == total[pi]` (with `total_valid`) as
        # flip-flops of `j`'s register (round 16's netlist had `pi` -> the
        # `decided` select -> the compare's carry chain -> the FSM state's
        # enable, 9.05 ns; round 17's, which compared `j`'s next value, the
        # walk's next-`j` logic in front of the compare, 10 LUT levels). A
        # decision or the total is seen a cycle after it is made (both only
        # rise within a pass, so a cycle late is safe). `j` steps only as a
        # job's last launch stops the walk (`running` falls at that edge) and
        # is set to 0 only in IDLE (which sets `running`), so in a cycle
        # whose previous cycle was not `running` too (`idle_was`) the flags
        # are those of the current `j`: JOB_WAIT decides from its second
        # cycle (one cycle per job).
        tv = prog.total_valid.bit_select(pi, 1)
        m.d.sync += [j_ok.eq(j < decided[pi]), j_end.eq(tv & (j == total[pi])),
                     idle_was.eq(~running)]
        # The walk registers load `nx` on a launch, and in every cycle while
        # not `running` (the FSM's values then, or their own): `launch` is
        # their clock enable and nothing else, so ABC cannot fold it into
        # their next-value cones (round 16's first netlist selected `nx` by
        # `launch` in the data path: ABC moved `launch` to the cones' second
        # level again, and seeds ran `launch` -> `rem`, 6 LUTs).
        with m.If(launch | ~running):
            m.d.sync += [r.eq(nx[id(r)]) for r in walk]
        with m.If(launch):
            m.d.sync += bubble_b.eq(nx_bb)
            m.d.comb += [hold.eq(nx_c["hold"]), h_go.eq(nx_c["h_go"]),
                         bubble.eq(nx_c["bubble"])]
        return m

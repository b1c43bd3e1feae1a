"""Expert scheduler: groups a pass's tokens by expert, announces every
needed routed expert once to the Elastic-SD controller, takes its source
decisions and keeps the pass's job table.

The announce handshake (the controller's contract, ``docs/architecture.md``
"Batched datapath")
-------------------------------------------------------------------------
For each pass the scheduler sends, on ``need``, one ``ExpertNeed``
``{layer, expert, tokens, precision, last, none}`` per routed expert that
at least one token of the pass selected, in order of decreasing ``tokens``,
ties to the lower expert index
(:func:`elmoe3d.golden.moe_batched.announce_order`), ``last`` on the pass's
last one; a pass that routes no expert (every token DRAFT with nothing
allowed) sends one beat with ``none`` = 1 and ``last`` = 1 instead, which
takes no decision. It
accepts, on ``source``, one ``ExpertSource`` ``{hb, slot}`` per
announcement, in announcement order (``source.ready`` is high only while an
announced expert is undecided; announcing does not wait for decisions).
``hb = 1`` reads planes ``0 .. k-1`` of the expert from HB slot ``slot``
and — when ``precision`` is FULL or VERIFY — planes ``k .. n-1`` from LPDDR
(split); ``hb = 0`` reads every needed plane from LPDDR. For every decided
expert with LPDDR planes the LPDDR port must then deliver exactly those
planes, in decision order, as one command's beats. Shared experts are not
announced (the dense HB region holds them).

Job table
---------
Jobs of pass buffer ``par``: the ``S`` shared jobs at indices ``0 .. S-1``
(written when the pass starts: they need no routing, so the issue stage
can run them while routing and decisions proceed), then the routed jobs in
announce order. Each entry holds the job's token mask, the tokens for
which it is the first and the last job (the combine starts and ends
there), its token count and precision; a second table holds the decision.
``decided[par]`` counts entries whose decision is in; ``total[par]`` is
valid once every routed expert is announced. Three read ports
(:class:`~elmoe3d.hw.moe.ports.JobRead`) serve the HB reader, the LPDDR
writer and the issue stage; the counters reach them as
:class:`~elmoe3d.hw.moe.ports.PassProgress`.

Prefetch candidates (``ExpertScheduler(g, prefetch=True)`` only)
-----------------------------------------------------------------
Each lane's :class:`~.prefetch_cands.CandidateTracker` reports per routing
whether the token has a prefetch candidate and which (``cands``); the
scheduler counts the candidates' tokens per expert and buffer as they come
(like the routed experts'). After a DRAFT pass's last decision (every
token of the pass DRAFT) it sends the pass's candidates on ``pf``
(``PrefetchCandidate``): in announce order (decreasing tokens, ties to the
lower expert), ``count`` = the distinct candidates on each, ``last`` on
the final one, or one ``none`` beat; the next pass waits for them (the
controller takes them once the pass has ended).

Timing: routing results (``sel``) are collected into a ``T x E`` selection
matrix per buffer two cycles after they pass (the snoop and its decode are
registered); a pass
is taken two cycles after the scheduler is idle and the pass is complete
(both registered); after a pass's last token's selection: a cycle to
see it (``sel_ok``, registered), four cycles of columns and counts (the
counts themselves are kept as the routings arrive), then one announcement
per four cycles (plus the controller's ``ready``) and two cycles per empty
token-count level.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..vocab import TokenRole, bits, expert_need, expert_source, prefetch_candidate
from .common import lowest_set, pow2ceil, zext
from .payloads import job_entry, job_source
from .ports import CandFlow, JobRead, PassProgress, PassView, RoutingFlow

__all__ = ["ExpertScheduler", "READERS"]

#: Job-table read ports: HB reader, LPDDR writer, issue stage.
READERS = 3


class ExpertScheduler(wiring.Component):
    """Selection matrix, announcements, decisions and the job table.

    Members
    -------
    passes : ``In(PassView)`` (token store; ``valid``, ``seq``, ``count``,
        ``layer``, ``roles`` are read)
    sel : ``In(RoutingFlow).array(P)``
        Lane ``p``'s routing of one of its tokens (a copy of each handshake
        of lane ``p``'s top-k output, one per lane per cycle at most;
        ``token`` is lane-local, the pass position is ``token * P + p``).
    need : ``Out(stream.Signature(ExpertNeed))``
    source : ``In(stream.Signature(ExpertSource))``
    jobs : ``In(JobRead).array(3)``
        Job-table reads ``{par, job}``, data one cycle later.
    progress : ``Out(PassProgress)``
        Per buffer: ``decided``, ``total``, ``total_valid``, ``sel_done``,
        ``no_routed``, ``experts`` and ``expert_tokens`` (routed jobs, sum
        of their tokens; valid with ``total_valid``) and ``epoch``, which
        toggles when the scheduler starts a pass in a buffer (its counters
        are then fresh): a job-table reader takes a buffer's jobs only once
        its epoch has moved on from the pass it last finished there.
    cands : ``In(CandFlow).array(P)``; pf : ``Out(stream.Signature(PrefetchCandidate))``
        With ``prefetch``: each lane's candidates in, a DRAFT pass's out.
    """

    def __init__(self, g, *, prefetch: bool = False):
        self.g, self.prefetch = g, prefetch
        cfg = g.cfg
        self.jb = bits(pow2ceil(g.jobs))
        extra = ({"cands": In(CandFlow(g.lane())).array(g.P),
                  "pf": Out(stream.Signature(prefetch_candidate(cfg.expert_bits, g.T, g.E)))}
                 if prefetch else {})
        super().__init__({**extra,
            "passes": In(PassView(g)),
            "sel": In(RoutingFlow(g.lane())).array(g.P),
            "need": Out(stream.Signature(expert_need(cfg.layer_bits, cfg.expert_bits, g.T))),
            "source": In(stream.Signature(expert_source(cfg.tag_slots))),
            "jobs": In(JobRead(g)).array(READERS),
            "progress": Out(PassProgress(g)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.g
        pv, prog = self.passes, self.progress
        T, E, S, K, P, Tl = g.T, g.E, g.S, g.K, g.P, g.Tl
        jb = self.jb
        jmem = m.submodules.jobs = memory.Memory(shape=job_entry(g), depth=2 << jb, init=[])
        smem = m.submodules.srcs = memory.Memory(shape=job_source(g), depth=2 << jb, init=[])
        jw, sw = jmem.write_port(), smem.write_port()
        for r in range(READERS):
            jr, sr = jmem.read_port(), smem.read_port()
            m.d.comb += [jr.addr.eq(self.jobs[r].addr), sr.addr.eq(self.jobs[r].addr),
                         self.jobs[r].entry.eq(jr.data), self.jobs[r].src.eq(sr.data)]

        # ---- selection matrix (always collecting) -------------------------------------
        rows = [[Signal(E, name=f"sel{p}_{t}") for t in range(T)] for p in range(2)]
        done_tok = [Signal(range(T + 1), name=f"done_tok{p}") for p in range(2)]
        # The snoop of top-k's output is registered twice before the matrix
        # takes it. `sel_valid` is top-k's handshake, whose `ready` is the
        # softmax's room flag; as the decoded clock enable of the 2 T x E
        # matrix it had crossed three components in one cycle (room ->
        # handshake -> a 3 ns route -> the rows' enables: a seed's worst
        # endpoints in timing round 17). Registered once, the decode of a
        # flip-flop still reached 512 enables spread over the scheduler (8 ns
        # of routing); so the second stage registers the decode itself: one
        # write-enable flip-flop per (buffer, token) row (`row_we`), and the
        # row's bits (`row_d`). The payload register loads only with a
        # routing (an enable of its own, so Yosys does not merge it with a
        # register of another component that loads the same port every cycle).
        # (one selection per lane and cycle: token `t` is lane `t mod P`'s)
        s_valid = Signal(P)
        s_sel = [Signal.like(self.sel[ln].payload, name=f"s_sel{ln}") for ln in range(P)]
        m.d.sync += s_valid.eq(Cat(*[self.sel[ln].valid for ln in range(P)]))
        row_d = [Signal(E, name=f"row_d{ln}") for ln in range(P)]
        # (beside `row_d`: the routing's selection count and, per buffer, its
        # valid; the counts below are kept as routings arrive)
        cnt_d = [Signal(range(K + 1), name=f"cnt_d{ln}") for ln in range(P)]
        v_d = [Signal(2, name=f"v_d{ln}") for ln in range(P)]
        for ln in range(P):
            with m.If(self.sel[ln].valid):
                m.d.sync += s_sel[ln].eq(self.sel[ln].payload)
            sel_bits = Signal(E, name=f"sel_bits{ln}")
            expr = Const(0, E)
            for r in range(K):
                expr = expr | Mux(r < s_sel[ln].count, Const(1, E) << s_sel[ln].sel[r], 0)
            m.d.comb += sel_bits.eq(expr)
            m.d.sync += [row_d[ln].eq(sel_bits), cnt_d[ln].eq(s_sel[ln].count),
                         v_d[ln].eq(Cat(s_valid[ln] & (s_sel[ln].par == p) for p in range(2)))]
        row_we = Signal(2 * T)
        tok_inc = [Signal(range(P + 1), name=f"tok_inc{p}") for p in range(2)]
        m.d.sync += row_we.eq(Cat(*[s_valid[t % P] & (s_sel[t % P].par == p)
                                    & (s_sel[t % P].token == t // P)
                                    for p in range(2) for t in range(T)]))
        m.d.sync += [tok_inc[p].eq(sum(s_valid[ln] & (s_sel[ln].par == p) for ln in range(P)))
                     for p in range(2)]
        # The counts the announcements need, per buffer, kept as the routings
        # arrive rather than counted from the matrix once it is complete
        # (popcounts of T-bit columns and E-bit rows had been about a third of the
        # scheduler's LUTs): a token's selections (`tsel`: the routing's
        # `count`, top-k's experts being distinct) and an expert's tokens
        # (`ecnt`: the lanes that selected it in a cycle, `e_inc`, registered,
        # then added). Both are final a cycle after the matrix (`ecnt`) or
        # with it (`tsel`), three cycles before ORDER reads them; `ecnt` is
        # cleared with `done_tok` (no routing of the buffer's next pass is in
        # flight then).
        tsel = [[Signal(range(K + 1), name=f"tsel{p}_{t}") for t in range(T)] for p in range(2)]
        ecnt = [[Signal(range(T + 1), name=f"ecnt{p}_{e}") for e in range(E)] for p in range(2)]
        e_inc = [[Signal(range(P + 1), name=f"e_inc{p}_{e}") for e in range(E)]
                 for p in range(2)]
        for p in range(2):
            m.d.sync += done_tok[p].eq(done_tok[p] + tok_inc[p])
            for t in range(T):
                with m.If(row_we[p * T + t]):
                    m.d.sync += [rows[p][t].eq(row_d[t % P]), tsel[p][t].eq(cnt_d[t % P])]
            for e in range(E):
                m.d.sync += [e_inc[p][e].eq(sum(v_d[ln][p] & row_d[ln][e] for ln in range(P))),
                             ecnt[p][e].eq(ecnt[p][e] + e_inc[p][e])]

        # ---- the pass being scheduled ------------------------------------------------
        ps = Signal()
        my_seq = Signal(2)
        count = Signal.like(pv.count[0])
        layer = Signal.like(pv.layer[0])
        is_d = Signal(T)
        is_v = Signal(T)
        pmask = Signal(T)
        cur_rows = [Signal(E, name=f"row{t}") for t in range(T)]
        # (the columns are `cur_rows` read the other way: they do not change
        # after WAIT_SEL)
        col = [Cat(*[cur_rows[t][e] for t in range(T)]) for e in range(E)]
        cnt = [Signal(range(T + 1), name=f"cnt{e}") for e in range(E)]
        anyv = Signal(E)
        anyf = Signal(E)
        rem = [Signal(range(K + 1), name=f"rem{t}") for t in range(T)]
        seen = Signal(T)
        done_e = Signal(E)
        routed = Signal(E)                  # experts any token of the pass selected
        level = Signal(range(T + 1))
        announced = Signal(range(E + 1))
        sidx = Signal(range(S + 1))
        pick = Signal(range(max(2, E)))

        decided = Array(prog.decided)
        total = Array(prog.total)
        n_exp = Array(prog.experts)
        n_tok = Array(prog.expert_tokens)
        # the pass's counts are kept in registers of their own (no buffer
        # mux in front of their enables) and copied into the buffer's outputs
        # with `total_valid` (the issue stage reads them at the pass's END,
        # after `total_valid`)
        exp_c = Signal.like(prog.experts[0])
        tok_c = Signal.like(prog.expert_tokens[0])

        # decisions: accepted while an announced expert is undecided. `dec` is
        # `decided[ps]` and `lim` is `S + announced`, kept as registers of their
        # own (no buffer mux and no adder in front of `source.ready`).
        # `source.ready` (dec < lim) is a flip-flop: `pend` = lim - dec (dec
        # never passes lim) moves by the events below, and the flag is worked
        # out for both outcomes from registers (the events only select)
        dec = Signal.like(prog.decided[0])
        lim = Signal(range(g.jobs + 1))
        pend = Signal(range(g.jobs + 1))
        start = Signal()                     # IDLE: a new pass (dec = 0, lim = S)
        dec_inc = Signal()                   # dec + 1 (a decision, or a shared job)
        lim_inc = Signal()                   # lim + 1 (an announced expert)
        rdy = Signal()
        m.d.comb += [self.source.ready.eq(rdy), dec_inc.eq(self.source.valid & rdy)]
        with m.If(start):
            m.d.sync += [pend.eq(S), rdy.eq(S != 0)]
        with m.Elif(lim_inc & ~dec_inc):
            m.d.sync += [pend.eq(pend + 1), rdy.eq(1)]
        with m.Elif(dec_inc & ~lim_inc):
            m.d.sync += [pend.eq(pend - 1), rdy.eq(pend != 1)]
        with m.If(self.source.valid & self.source.ready):
            m.d.sync += [decided[ps].eq(dec + 1), dec.eq(dec + 1)]
            m.d.comb += [sw.addr.eq(Cat(zext(dec, jb), ps)), sw.data.eq(self.source.payload),
                         sw.en.eq(1)]

        def lane_views(mask, name):
            src = Signal(T, name=name)
            m.d.comb += src.eq(mask)
            return [Cat(*[src[i * P + ln] if i * P + ln < T else Const(0, 1)
                          for i in range(Tl)]) for ln in range(P)]

        def class_counts(mask, name):
            """Per lane, the tokens of ``mask`` in the DRAFT class and in the
            other class (registered): the steps of a job's segment are the
            larger DRAFT count plus the larger other count
            (:func:`elmoe3d.golden.moe_batched.lane_steps`)."""
            outs = []
            for cls, cm in (("d", mask & is_d), ("o", mask & ~is_d)):
                for ln, lm in enumerate(lane_views(cm, f"{name}_{cls}")):
                    c_ = Signal(range(Tl + 1), name=f"{name}_{cls}{ln}")
                    m.d.sync += c_.eq(sum(lm[i] for i in range(Tl)))
                    outs.append(c_)
            return outs[:P], outs[P:]

        def max_of(vals):
            cur = vals[0]
            for v in vals[1:]:
                cur = Mux(v > cur, v, cur)
            return cur

        prec_all = Mux(is_v.any(), TokenRole.VERIFY, Mux((~is_d & pmask).any(), TokenRole.FULL,
                                                            TokenRole.DRAFT))
        # ORDER takes two cycles per step: the candidates of the current level
        # are registered, then the lowest one is picked (a compare per expert
        # and a priority tree in one cycle would be too deep for 125 MHz)
        cand = Signal(E)
        c_any, c_idx = lowest_set(m, cand, "cand")
        # the announced job's token masks are registered in OFFER (``pick``,
        # ``rem`` and ``seen`` do not change between OFFER and ANNOUNCE), so
        # the job table's write port is fed from registers
        ncol = Signal(T)
        ncol_first = Signal(T)
        last_of = Signal(T)
        # PICK also registers `pick` one-hot (the lowest set bit of `cand`,
        # `cand & -cand`: a carry chain), so OFFER selects the expert's column
        # and flags by an AND-OR of E terms rather than an E:1 multiplexer
        # addressed by `pick` (timing round 15: `pick` -> `colsel[pick]` ->
        # `ncol_first`, 6 LUTs, was the worst path)
        pick_oh = Signal(E)
        ncol_c = Signal(T)
        m.d.comb += ncol_c.eq(Cat(*[
            Cat(*[col[e][t] & pick_oh[e] for e in range(E)]).any() for t in range(T)]))
        # the steps of a job per segment: lane counts of the announced column
        # (registered in STEPS1), their maxima summed (STEPS2); the shared
        # jobs' from the pass's tokens (MASK -> SHARED)
        jd_cnt, jo_cnt = class_counts(ncol, "jcnt")
        j_steps = Signal(range(T + 1))
        sh_d_cnt, sh_o_cnt = class_counts(pmask, "shcnt")
        sh_steps = Signal(range(T + 1))

        # A new pass in buffer `ps`, as a flip-flop: the token store's
        # `valid`/`seq` and `my_seq`, selected by `ps`, had passed a compare
        # and the start's decode into the clock enables of the hundred
        # registers a start loads (five LUT levels, the token store's
        # registers far away). `newp` is the condition of the previous
        # cycle; `idle_seen` (the previous cycle was IDLE without a start)
        # makes sure `ps` and `my_seq` have not moved since: `ps` changes as
        # IDLE is entered, `my_seq` as it is left. A pass is therefore taken
        # a cycle after it could have been (two after IDLE is entered); a
        # pass is never released before it is scheduled, so `newp` is never
        # stale-high.
        newp = Signal()
        idle_seen = Signal()
        # every token of the pass has its selection: a flip-flop, the
        # condition of the previous cycle (`ps` -> `done_tok[ps]` -> the
        # compare -> the FSM's state enable was 6 LUTs in timing round 17).
        # `ps` and `count` are set at the start, two cycles before WAIT_SEL,
        # `done_tok` only rises within a pass and a selection's row is written
        # with its count, so a late `sel_ok` is never a wrong one.
        sel_ok = Signal()
        m.d.sync += sel_ok.eq(Mux(ps, done_tok[1], done_tok[0]) == count)
        m.d.sync += newp.eq(pv.valid.bit_select(ps, 1)
                            & (pv.seq.bit_select(ps, 1) != my_seq.bit_select(ps, 1)))

        # prefetch: the candidates' tokens per expert and buffer, kept as they come
        ccnt = None
        if self.prefetch:
            ccnt = [[Signal(range(T + 1), name=f"ccnt{p}_{e}") for e in range(E)]
                    for p in range(2)]
            cv = [Signal(2, name=f"cv{ln}") for ln in range(P)]
            ce = [Signal(E, name=f"ce{ln}") for ln in range(P)]
            for ln in range(P):
                c_ = self.cands[ln]
                m.d.sync += [cv[ln].eq(Cat(c_.valid & c_.ok & (c_.par == p) for p in range(2))),
                             ce[ln].eq(Const(1, E) << c_.expert)]
            for p in range(2):
                for e in range(E):
                    m.d.sync += ccnt[p][e].eq(ccnt[p][e] + sum(cv[ln][p] & ce[ln][e]
                                                               for ln in range(P)))

        def end_pass():
            """The pass is over: its buffer's counts cleared, the other buffer next."""
            for p in range(2):
                with m.If(ps == p):
                    m.d.sync += done_tok[p].eq(0)
                    m.d.sync += [ecnt[p][e].eq(0) for e in range(E)]
                    if ccnt is not None:
                        m.d.sync += [ccnt[p][e].eq(0) for e in range(E)]
            m.d.sync += ps.eq(~ps)
            m.next = "IDLE"

        with m.FSM(name="scheduler"):
            with m.State("IDLE"):
                m.d.sync += idle_seen.eq(1)
                with m.If(idle_seen & newp):
                    m.d.comb += start.eq(1)
                    m.d.sync += idle_seen.eq(0)
                    m.d.sync += [my_seq.bit_select(ps, 1).eq(pv.seq.bit_select(ps, 1)),
                                 prog.epoch.bit_select(ps, 1).eq(~prog.epoch.bit_select(ps, 1)),
                                 count.eq(pv.count[0]), layer.eq(pv.layer[0]),
                                 decided[ps].eq(0), dec.eq(0), lim.eq(S), announced.eq(0),
                                 sidx.eq(0),
                                 prog.total_valid.bit_select(ps, 1).eq(0),
                                 prog.sel_done.bit_select(ps, 1).eq(0),
                                 exp_c.eq(0), tok_c.eq(0), done_e.eq(0)]
                    for t in range(T):
                        rl = Mux(ps, pv.roles[1][t], pv.roles[0][t])
                        m.d.sync += [is_d[t].eq(rl == TokenRole.DRAFT),
                                     is_v[t].eq(rl == TokenRole.VERIFY)]
                    with m.If(ps):
                        m.d.sync += [count.eq(pv.count[1]), layer.eq(pv.layer[1])]
                    m.next = "MASK"
            with m.State("MASK"):
                m.d.sync += [pmask.eq(Cat(*[t < count for t in range(T)])),
                             is_d.eq(is_d & Cat(*[t < count for t in range(T)])),
                             is_v.eq(is_v & Cat(*[t < count for t in range(T)]))]
                m.next = "SH_STEPS" if S else "WAIT_SEL"
            if S:
                with m.State("SH_STEPS"):
                    # (`sh_*_cnt` are registered from `pmask` here)
                    m.next = "SH_STEPS2"
                with m.State("SH_STEPS2"):
                    m.d.sync += sh_steps.eq(max_of(sh_d_cnt) + max_of(sh_o_cnt))
                    m.next = "SHARED"
            if S:
                with m.State("SHARED"):
                    ent = job_entry(g)(jw.data)
                    m.d.comb += [jw.addr.eq(Cat(zext(sidx, jb), ps)), jw.en.eq(1),
                                 ent.shared.eq(1), ent.expert.eq(sidx), ent.tok_mask.eq(pmask),
                                 ent.first_mask.eq(Mux(sidx == 0, pmask, 0)), ent.last_mask.eq(0),
                                 ent.count.eq(count), ent.steps.eq(sh_steps),
                                 ent.precision.eq(prec_all),
                                 sw.addr.eq(Cat(zext(sidx, jb), ps)), sw.en.eq(1),
                                 job_source(g)(sw.data).hb.eq(1)]
                    m.d.sync += [sidx.eq(sidx + 1), decided[ps].eq(dec + 1), dec.eq(dec + 1)]
                    m.d.comb += dec_inc.eq(1)
                    with m.If(sidx == S - 1):
                        m.next = "WAIT_SEL"
            with m.State("WAIT_SEL"):
                with m.If(sel_ok):
                    for t in range(T):
                        m.d.sync += [
                            cur_rows[t].eq(Mux(pmask[t], Mux(ps, rows[1][t], rows[0][t]), 0)),
                            rem[t].eq(Mux(pmask[t], Mux(ps, tsel[1][t], tsel[0][t]), 0))]
                    m.next = "COLS"
            with m.State("COLS"):
                for e in range(E):
                    m.d.sync += [anyv[e].eq((col[e] & is_v).any()),
                                 anyf[e].eq((col[e] & ~is_d).any())]
                no_r = Cat(*[rem[t] == 0 for t in range(T)]) & pmask
                m.d.sync += [seen.eq(Mux(S > 0, pmask, 0)),
                             prog.no_routed[0].eq(Mux(ps, prog.no_routed[0], no_r)),
                             prog.no_routed[1].eq(Mux(ps, no_r, prog.no_routed[1]))]
                m.next = "COUNT"
            # COUNT .. COUNT3 keep the cycles of the popcounts these states
            # once held (the announcements' timing is unchanged)
            with m.State("COUNT"):
                m.d.sync += routed.eq(Cat(*[col[e].any() for e in range(E)]))
                m.next = "COUNT2"
            with m.State("COUNT2"):
                m.next = "COUNT3"
            with m.State("COUNT3"):
                for e in range(E):
                    m.d.sync += cnt[e].eq(Mux(ps, ecnt[1][e], ecnt[0][e]))
                m.d.sync += [level.eq(count), prog.sel_done.bit_select(ps, 1).eq(1)]
                m.next = "ORDER"
            with m.State("ORDER"):
                m.d.sync += cand.eq(Cat(*[(cnt[e] == level) & ~done_e[e] for e in range(E)]))
                m.next = "PICK"
            with m.State("PICK"):
                with m.If(c_any):
                    oh = Signal(E, name="cand_oh")
                    m.d.comb += oh.eq(cand & (~cand + 1))
                    m.d.sync += [pick.eq(c_idx), pick_oh.eq(oh), done_e.eq(done_e | oh)]
                    m.next = "OFFER"
                with m.Elif(level <= 1):
                    m.next = "FINISH"
                with m.Else():
                    m.d.sync += level.eq(level - 1)
                    m.next = "ORDER"
            with m.State("FINISH"):
                # (a state of its own: the `need` registers written here do not
                # wait for PICK's priority tree)
                m.d.sync += [total[ps].eq(S + announced),
                             prog.total_valid.bit_select(ps, 1).eq(1),
                             n_exp[ps].eq(exp_c), n_tok[ps].eq(tok_c)]
                m.next = "WAIT_DEC"
                with m.If(announced == 0):
                    # a pass that routes no expert: one `none` beat (no decision)
                    m.d.sync += [self.need.valid.eq(1),
                                 self.need.payload.layer.eq(layer),
                                 self.need.payload.expert.eq(0),
                                 self.need.payload.tokens.eq(0),
                                 self.need.payload.precision.eq(TokenRole.FULL),
                                 self.need.payload.last.eq(1),
                                 self.need.payload.none.eq(1)]
                    m.next = "NONE"
            with m.State("OFFER"):
                m.d.sync += [ncol.eq(ncol_c), ncol_first.eq(ncol_c & ~seen),
                             last_of.eq(Cat(*[ncol_c[t] & (rem[t] == 1) for t in range(T)]))]
                m.d.sync += [self.need.payload.layer.eq(layer),
                             self.need.payload.expert.eq(pick),
                             self.need.payload.tokens.eq(level),
                             # `done_e` holds `pick` already: no expert left after it
                             self.need.payload.last.eq(~(routed & ~done_e).any()),
                             self.need.payload.none.eq(0),
                             self.need.payload.precision.eq(
                                 Mux((anyv & pick_oh).any(), TokenRole.VERIFY,
                                     Mux((anyf & pick_oh).any(), TokenRole.FULL,
                                         TokenRole.DRAFT)))]
                m.next = "STEPS1"
            with m.State("STEPS1"):
                # (`jcnt_*` are registered from `ncol` here)
                m.next = "STEPS2"
            with m.State("STEPS2"):
                m.d.sync += [j_steps.eq(max_of(jd_cnt) + max_of(jo_cnt)),
                             self.need.valid.eq(1)]
                m.next = "ANNOUNCE"
            with m.State("ANNOUNCE"):
                with m.If(self.need.ready):
                    ent = job_entry(g)(jw.data)
                    m.d.comb += [jw.addr.eq(Cat(zext(S + announced, jb), ps)), jw.en.eq(1),
                                 ent.shared.eq(0), ent.expert.eq(pick), ent.tok_mask.eq(ncol),
                                 ent.first_mask.eq(ncol_first), ent.last_mask.eq(last_of),
                                 ent.count.eq(self.need.payload.tokens), ent.steps.eq(j_steps),
                                 ent.precision.eq(self.need.payload.precision)]
                    m.d.comb += lim_inc.eq(1)
                    m.d.sync += [self.need.valid.eq(0), announced.eq(announced + 1),
                                 lim.eq(lim + 1),
                                 seen.eq(seen | ncol),
                                 exp_c.eq(exp_c + 1),
                                 tok_c.eq(tok_c + self.need.payload.tokens)]
                    for t in range(T):
                        m.d.sync += rem[t].eq(rem[t] - ncol[t])
                    m.next = "ORDER"
            with m.State("NONE"):
                with m.If(self.need.ready):
                    m.d.sync += self.need.valid.eq(0)
                    m.next = "WAIT_DEC"
            with m.State("WAIT_DEC"):
                # every announced expert decided: `dec == total[ps]`, which
                # is `~rdy` here (`lim` = `S + announced` = `total[ps]` after
                # FINISH, and `rdy` is the flip-flop `pend != 0`, `pend` =
                # `lim - dec`): the same cycle, no compare behind a buffer
                # select (`ps` -> `total[ps]` -> the compare -> `done_tok`'s
                # reset and `ps`'s enable, 6 LUTs, timing round 17)
                with m.If(~rdy):
                    if self.prefetch:
                        m.next = "C_LOAD"
                    else:
                        end_pass()
            if self.prefetch:
                self._candidates(m, ps, count, is_d, pmask, ccnt, end_pass)
        return m

    def _candidates(self, m, ps, count, is_d, pmask, ccnt, end_pass):
        """The states that send a DRAFT pass's prefetch candidates (module doc)."""
        g = self.g
        T, E = g.T, g.E
        pcnt = [Signal(range(T + 1), name=f"pcnt{e}") for e in range(E)]
        nz = Signal(E)                        # experts with a candidate
        pdone = Signal(E)
        plevel = Signal(range(T + 1))
        ptotal = Signal.like(self.pf.payload.count)
        pc = Signal(E)
        pc_any, pc_idx = lowest_set(m, pc, "pcand")
        o = self.pf.payload
        with m.State("C_LOAD"):
            for e in range(E):
                m.d.sync += [pcnt[e].eq(Mux(ps, ccnt[1][e], ccnt[0][e])),
                             nz[e].eq(Mux(ps, ccnt[1][e], ccnt[0][e]) != 0)]
            m.d.sync += [pdone.eq(0), plevel.eq(count)]
            with m.If((is_d == pmask) & pmask.any()):        # a DRAFT pass
                m.next = "C_TOTAL"
            with m.Else():
                m.next = "C_END"
        with m.State("C_TOTAL"):
            m.d.sync += ptotal.eq(sum(nz[e] for e in range(E)))
            with m.If(~nz.any()):
                m.d.sync += [self.pf.valid.eq(1), o.expert.eq(0), o.tokens.eq(0), o.count.eq(0),
                             o.last.eq(1), o.none.eq(1)]
                m.next = "C_SEND"
            with m.Else():
                m.next = "C_ORDER"
        with m.State("C_ORDER"):
            m.d.sync += pc.eq(Cat(*[(pcnt[e] == plevel) & nz[e] & ~pdone[e] for e in range(E)]))
            m.next = "C_PICK"
        with m.State("C_PICK"):
            with m.If(pc_any):
                oh = Signal(E, name="pcand_oh")
                m.d.comb += oh.eq(pc & (~pc + 1))
                m.d.sync += [pdone.eq(pdone | oh), self.pf.valid.eq(1), o.expert.eq(pc_idx),
                             o.tokens.eq(plevel), o.count.eq(ptotal), o.none.eq(0),
                             o.last.eq(~(nz & ~(pdone | oh)).any())]
                m.next = "C_SEND"
            with m.Else():
                m.d.sync += plevel.eq(plevel - 1)
                m.next = "C_ORDER"
        with m.State("C_SEND"):
            with m.If(self.pf.ready):
                m.d.sync += self.pf.valid.eq(0)
                with m.If(o.last):
                    m.next = "C_END"
                with m.Else():
                    m.next = "C_ORDER"
        with m.State("C_END"):
            end_pass()

"""The batched MoE datapath's components on their own (Amaranth's simulator):
pipelined arithmetic against the golden integer primitives, streaming top-k
against ``golden.moe_layer.route``, the softmax against ``gate_weights``,
the replay buffer's rules, the record path against ``layout.dense_records``
and the scheduler's announce order against ``golden.moe_batched.plan_pass``."""

import random

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, signed
from amaranth.sim import Simulator

from elmoe3d.config import preset
from elmoe3d.golden import layout as gl
from elmoe3d.golden import moe_batched as gb
from elmoe3d.golden import moe_layer as gm
from elmoe3d.hw.moe.buffers import ReplayBuffer
from elmoe3d.hw.moe.common import geom, lowest_flag, lowest_set, mul_pipe, requant_pipe
from elmoe3d.hw.moe.hb_reader import RecordPath
from elmoe3d.hw.moe.queue import Queue
from elmoe3d.hw.moe.scheduler import ExpertScheduler
from elmoe3d.hw.moe.softmax import Softmax
from elmoe3d.hw.moe.topk import TopK
from elmoe3d.hw.vocab import TokenRole

pytestmark = pytest.mark.moe


def _sim(dut, bench, cycles=None):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("width", [23, 28])
def test_requant_pipe_matches_golden(width):
    """Random operands plus the corners: saturation both ways, shift 1 and
    47, multiplier 0 and 65535, the most negative input, every value around
    the two clip edges and the range check's edge."""
    m = Module()
    v, mult, sh = Signal(signed(width)), Signal(16), Signal(6)
    out, lat = requant_pipe(m, v, mult, sh, "rq")
    rng = np.random.default_rng(width)
    N = 2000
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    vs = rng.integers(lo, hi + 1, N)
    vs[:300] = rng.integers(-4000, 4000, 300)
    ms = rng.integers(0, 1 << 16, N)
    ss = rng.integers(1, 48, N)
    corners = [(lo, 65535, 1), (hi, 65535, 1), (lo, 65535, 47), (hi, 1, 47), (-1, 1, 1),
               (1, 1, 1), (0, 0, 5), (-3, 1, 1), (3, 1, 1), (5, 1, 1), (-5, 1, 1)]
    # every value around both clip edges (127/128 and -128/-129 after rounding)
    # and around the edge of the range check (|q| near 512)
    corners += [(v_, 1, 1) for v_ in list(range(250, 262)) + list(range(-262, -250))]
    corners += [(v_, 1, 2) for v_ in list(range(505, 520)) + list(range(-520, -505))]
    corners += [(v_, 1, 1) for v_ in (511, 512, 513, -511, -512, -513, 1023, 1024, -1024, -1025)]
    for i, c in enumerate(corners):
        vs[i], ms[i], ss[i] = c
    exp = gm.requant(vs, ms, ss)
    got = []

    async def bench(ctx):
        for i in range(N + lat):
            if i < N:
                ctx.set(v, int(vs[i]))
                ctx.set(mult, int(ms[i]))
                ctx.set(sh, int(ss[i]))
            await ctx.tick()
            if i >= lat - 1:
                got.append(ctx.get(out))
    _sim(m, bench)
    assert lat == 7
    assert np.array_equal(np.array(got[:N]), exp)


@pytest.mark.parametrize("b_signed", [False, True])
def test_mul_pipe(b_signed):
    m = Module()
    a = Signal(signed(14))
    b = Signal(signed(8)) if b_signed else Signal(13)
    p, lat = mul_pipe(m, a, b, "mm", b_signed=b_signed)
    rng = np.random.default_rng(int(b_signed))
    A = rng.integers(-8192, 8192, 500)
    Bv = rng.integers(-128, 128, 500) if b_signed else rng.integers(0, 8192, 500)
    A[:4], Bv[:4] = [-8192, 8191, -8192, 0], ([-128, -128, 127, 5] if b_signed else [8191, 8191, 0, 5])
    got = []

    async def bench(ctx):
        for i in range(500 + lat):
            if i < 500:
                ctx.set(a, int(A[i]))
                ctx.set(b, int(Bv[i]))
            await ctx.tick()
            if i >= lat - 1:
                got.append(ctx.get(p))
    _sim(m, bench)
    assert np.array_equal(np.array(got[:500]), A * Bv)


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 7, 8, 13, 16, 17])
def test_lowest_set_and_flag(w):
    """`lowest_set`'s index (the upper half's offset is a select when the
    split is a power of two, an adder otherwise) and `lowest_flag`'s flag of
    that bit, against Python: every value up to 10 bits, a sample beyond."""
    m = Module()
    vec, flags = Signal(w), Signal(w)
    anyb, idx = lowest_set(m, vec, "ls")
    flag = lowest_flag(m, vec, flags, "lf")
    rng = np.random.default_rng(w)
    xs = range(1 << w) if w <= 10 else [int(x) for x in rng.integers(0, 1 << w, 3000)]

    async def bench(ctx):
        for x in list(xs) + [0, 1 << (w - 1)]:
            f = int(rng.integers(0, 1 << w))
            ctx.set(vec, x)
            ctx.set(flags, f)
            assert ctx.get(anyb) == (x != 0)
            low = (x & -x).bit_length() - 1
            if x:
                assert ctx.get(idx) == low
            assert ctx.get(flag) == (bool(x) and (f >> low) & 1)
    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("s,k", [(4, 1), (2, 1), (2, 2), (2, 3), (1, 4)])
def test_split_partial_sums_add_to_full(s, k):
    """The equivalence the split job relies on, on the golden PE
    (``bitslice.pe_dot``, the PE's arithmetic beat by beat): a FULL dot
    product over planes 0..n-1 (0..k-1 from HB, k..n-1 from LPDDR) equals
    the MSB-mode partial sum over 0..k-1 plus the LSB-mode partial sum over
    k..n-1, and the FULL weights' dot product."""
    from elmoe3d.golden import bitslice as gbs
    rng = np.random.default_rng(s * 10 + k)
    n = 8 // s
    for _ in range(200):
        C = int(rng.integers(1, 5))
        L = 4
        w = rng.integers(-128, 128, (C, L))
        a = rng.integers(-128, 128, (C, L))
        w[0, 0], a[0, 0] = -128, -128
        planes = gbs.split(w, s) & ((1 << s) - 1)
        planes[0] = gbs.split(w, s)[0]
        def beats(qs):
            return ([a[c] for q in qs for c in range(C)], [planes[q][c] for q in qs for c in range(C)],
                    [q for q in qs for c in range(C)])
        full = gbs.pe_dot(*beats(range(n)), s, gbs.Mode.FULL, None)
        msb = gbs.pe_dot(*beats(range(k)), s, gbs.Mode.MSB, k)
        lsb = gbs.pe_dot(*beats(range(k, n)), s, gbs.Mode.LSB, k)
        assert full == msb + lsb == int(np.sum(a * w))


def _g(name="tiny", **over):
    return geom(preset(name).replace(**over))


@pytest.mark.parametrize("over", [{}, {"top_k": 1}, {"experts": 16, "top_k": 5, "hb_words": 8192}])
def test_topk_matches_route(over):
    """Ties (many equal logits) go to the lower index; DRAFT tokens only
    admit their allowed experts; fewer allowed than k gives fewer. With
    random back-pressure on ``o``, and every cycle the flags the vector unit
    relies on, from the ports: ``idle`` is no result and no logit in the
    three cycles before, ``last_ok`` no result and no last logit in them."""
    g = _g(**over)
    dut = TopK(g)
    rng = np.random.default_rng(1)
    E, K, T = g.E, g.K, g.T
    cases = []
    for i in range(60):
        lg = rng.integers(-50, 50, E) if i % 3 else rng.integers(-2, 2, E)
        role = TokenRole.DRAFT if i % 2 else TokenRole.FULL
        mask = rng.random(E) < [0.0, 0.2, 0.6, 1.0][i % 4]
        cases.append((lg, role, mask))
    got = []
    checked = {"idle": 0, "last_ok": 0}

    async def bench(ctx):
        for i, (lg, role, mask) in enumerate(cases):
            t, par = i % T, (i // T) % 2
            ctx.set(dut.tokens.roles[par][t], role)
            ctx.set(dut.tokens.masks[par][t], int(sum(1 << e for e in range(E) if mask[e])))
            for e in range(E):
                while e == E - 1 and not ctx.get(dut.i.last_ok):
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"token": t, "expert": e, "value": int(lg[e]), "par": par,
                                        "last": int(e == E - 1)})
                await ctx.tick()
            ctx.set(dut.i.valid, 0)
        await ctx.tick().until(dut.i.idle)

    async def sink(ctx):
        prev = [(0, 0)] * 3                     # (i_valid, last) one to three cycles before
        async for _, _, iv, il, ov, ordy, pay, idle, last_ok in ctx.tick().sample(
                dut.i.valid, dut.i.payload.last, dut.o.valid, dut.o.ready, dut.o.payload,
                dut.i.idle, dut.i.last_ok):
            if ov and ordy:
                got.append(pay)
            assert idle == (not ov and not any(v for v, _ in prev)), "idle"
            assert last_ok == (not ov and not any(v and lst for v, lst in prev)), "last_ok"
            checked["idle"] += idle
            checked["last_ok"] += last_ok
            prev = [(iv, il)] + prev[:-1]
            ctx.set(dut.o.ready, int(rng.random() < 0.6))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.add_testbench(sink, background=True)
    sim.run()
    assert len(got) == len(cases) and checked["idle"] and checked["last_ok"]
    for (lg, role, mask), r in zip(cases, got):
        exp = gm.route(lg, K, mask if role == TokenRole.DRAFT else None)
        cnt = int(r.count)
        assert [int(r.sel[i]) for i in range(cnt)] == exp
        assert [int(r.logit[i]) for i in range(cnt)] == [int(lg[e]) for e in exp]


def test_softmax_matches_gate_weights():
    """Gate rows against ``gate_weights``; and, every cycle, the
    ``ready_clr`` contract the vector unit relies on: a ``ready`` bit falls
    only in the cycle after ``ready_clr`` names its token, and always then;
    ``ready_keep`` is ``ready`` without that bit, in the same cycle; and
    ``idle`` holds exactly while every result taken has its ``ready`` bit
    set (no token waiting or in progress)."""
    g = _g(experts=16, top_k=5, hb_words=8192)
    dut = Softmax(g)
    rng = np.random.default_rng(2)
    K = g.K
    cases = []
    for i in range(24):
        m = int(rng.integers(0, K + 1))
        lg = sorted(rng.integers(-3000, 3000, m).tolist(), reverse=True)
        if i % 5 == 0 and m:
            lg = [lg[0]] * m                            # all equal
        sel = rng.choice(g.E, size=m, replace=False).tolist()
        cases.append((lg, sel))
    sm_mult, sm_shift = 23000, 12

    async def bench(ctx):
        ctx.set(dut.sm.en, 1)
        ctx.set(dut.sm.par, 0)
        ctx.set(dut.sm.mult, sm_mult)
        ctx.set(dut.sm.shift, sm_shift)
        await ctx.tick()
        ctx.set(dut.sm.en, 0)
        for i, (lg, sel) in enumerate(cases):
            t = i % g.T
            pad = K - len(lg)
            ctx.set(dut.i.payload, {"token": t, "par": 0, "count": len(lg),
                                    "sel": sel + [0] * pad, "logit": lg + [0] * pad})
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)
            await ctx.tick().until(dut.gates.idle)
            assert ctx.get(dut.ready) >> t & 1
            ctx.set(dut.gates.addr, t)
            await ctx.tick()
            row = ctx.get(dut.gates.data)
            exp = gm.gate_weights(lg, sm_mult, sm_shift)
            assert [int(row.gate[r]) for r in range(len(lg))] == list(exp)
            assert [int(row.sel[r]) for r in range(len(lg))] == sel
        assert clears["n"] == len(cases) == keeps["n"] == idles["done"]

    idles = {"done": 0}

    async def idle_monitor(ctx):
        taken, ready = 0, 0
        async for _, _, iv, ir, now, idle in ctx.tick().sample(dut.i.valid, dut.i.ready,
                                                              dut.ready, dut.gates.idle):
            idles["done"] += bin(now & ~ready).count("1")       # one rise per token done
            assert idle == (taken == idles["done"]), "idle"
            taken += iv & ir
            ready = now

    clears = {"n": 0}
    keeps = {"n": 0}

    async def monitor(ctx):
        ready, clr, tok = 0, 0, 0
        while True:
            await ctx.tick()
            now = ctx.get(dut.ready)
            fell = ready & ~now
            if clr:
                assert not now >> tok & 1, f"ready bit {tok} still up after ready_clr"
                assert fell & ~(1 << tok) == 0, f"ready bits {fell:#x} fell, only {tok} named"
                clears["n"] += 1
            else:
                assert fell == 0, f"ready bits {fell:#x} fell without ready_clr"
            ready, clr, tok = now, ctx.get(dut.ready_clr), ctx.get(dut.ready_clr_token)
            assert ctx.get(dut.gates.keep) == ready & ~(clr << tok), "ready_keep"
            keeps["n"] += clr

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.add_testbench(monitor, background=True)
    sim.add_testbench(idle_monitor, background=True)
    sim.run()


@pytest.mark.parametrize("kind", ["queue", "credit", "counter"])
def test_queue_equals_sync_fifo_buffered(kind):
    """``Queue`` (a shape and two streams on a ``QueueFIFO`` / ``CreditFIFO``)
    behaves cycle for cycle as ``SyncFIFOBuffered`` on a named payload:
    random writes (a credit producer only while ``i.ready``) and reads for
    400 cycles, ``i.ready``, ``o.valid``, ``level`` and the payload compared
    every cycle."""
    from amaranth.hdl import Module
    from amaranth.lib import data
    from amaranth.lib.fifo import SyncFIFOBuffered
    shape = data.StructLayout({"a": 3, "b": signed(5)})
    m = Module()
    m.submodules.ref = ref = SyncFIFOBuffered(width=8, depth=5)
    m.submodules.dut = dut = Queue(shape, 5, credit=kind == "credit", counter=kind == "counter")
    rng = random.Random(len(kind))
    seen = {"full": 0, "reads": 0}

    async def bench(ctx):
        for _ in range(400):
            w = rng.random() < 0.6
            if kind != "queue":
                w = w and ctx.get(ref.w_rdy)
            a, b = rng.randrange(8), rng.randrange(-16, 16)
            r = rng.random() < 0.5
            ctx.set(ref.w_en, w)
            ctx.set(ref.w_data, a | (b & 31) << 3)
            ctx.set(ref.r_en, r)
            ctx.set(dut.i.valid, w)
            ctx.set(dut.i.payload, {"a": a, "b": b})
            ctx.set(dut.o.ready, r)
            assert ([ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.level)]
                    == [ctx.get(ref.w_rdy), ctx.get(ref.r_rdy), ctx.get(ref.level)])
            if ctx.get(ref.r_rdy):
                o = ctx.get(dut.o.payload)
                assert o.a | (o.b & 31) << 3 == ctx.get(ref.r_data)
                seen["reads"] += r
            seen["full"] += not ctx.get(ref.w_rdy)
            await ctx.tick()
    _sim(m, bench)
    assert seen["full"] > 5 and seen["reads"] > 50, seen
    with pytest.raises(ValueError, match="queue depth"):
        Queue(shape, 1)


def test_replay_buffer_rules():
    """Space is wp - free < depth (``free`` a cycle old); a word requested at
    cycle ``t`` can be read from ``t + 2`` (the block RAM is written a cycle
    after the request, from registers) and read again (replayed) until it is
    freed."""
    dut = ReplayBuffer(banks=2, width=8, depth=8)

    async def bench(ctx):
        ctx.set(dut.rd.free, 0)
        for i in range(8):
            assert ctx.get(dut.wr.space[0]) and ctx.get(dut.wr.space[1])
            ctx.set(dut.wr.we[0], 1)
            ctx.set(dut.wr.wdata[0], 10 + i)
            ctx.set(dut.wr.we[1], i < 3)
            ctx.set(dut.wr.wdata[1], 20 + i)
            await ctx.tick()
        ctx.set(dut.wr.we[0], 0)
        ctx.set(dut.wr.we[1], 0)
        assert ctx.get(dut.wp[0]) == 8 and not ctx.get(dut.wr.space[0])
        assert ctx.get(dut.wp[1]) == 3 and ctx.get(dut.wr.space[1])
        for rep in range(2):                                   # replay positions 2..5
            for pos in range(2, 6):
                ctx.set(dut.rd.pos, pos)
                await ctx.tick()
                assert ctx.get(dut.rd.data[0]) == 10 + pos
        ctx.set(dut.rd.free, 3)
        assert not ctx.get(dut.wr.space[0])          # `space` sees `free` a cycle later
        await ctx.tick()
        assert ctx.get(dut.wr.space[0])
        ctx.set(dut.wr.we[0], 1)
        ctx.set(dut.wr.wdata[0], 99)
        await ctx.tick()                          # t: the request
        ctx.set(dut.wr.we[0], 0)
        ctx.set(dut.rd.pos, 0)                    # (position 0 now holds word 8's entry)
        await ctx.tick()                          # t + 1: the block RAM's write
        ctx.set(dut.rd.pos, 8)
        await ctx.tick()                          # t + 2: read
        assert ctx.get(dut.rd.data[0]) == 99
    _sim(dut, bench)


@pytest.mark.parametrize("seed", [1, 2])
def test_replay_buffer_flags_random(seed):
    """``space`` and ``wp_all`` against their contract every cycle, under
    random writes (only while ``space``, as every producer does) and a
    ``free`` that moves forward at random: ``space`` is exactly
    ``wp - free_last < depth`` (so never an overflow), ``wp_all`` never
    passes a bank's write pointer, advances by one exactly when every bank
    is past it, and so reaches the slowest bank's pointer. ``room`` is
    exactly "every bank had room for three words two cycles ago", and
    implies that every bank has room for one now (what the LPDDR writer
    relies on)."""
    rng = random.Random(seed)
    depth, banks, P = 8, 3, 16
    dut = ReplayBuffer(banks=banks, width=8, depth=depth)

    async def bench(ctx):
        wp, free, free_last, wall, room, room_b = [0] * banks, 0, 0, 0, True, True
        wp_w = wp                                    # `wp` a cycle ago
        seen = set()
        for cyc in range(600):
            sp = [ctx.get(dut.wr.space[b]) for b in range(banks)]
            assert ctx.get(dut.wr.room) == room, cyc
            seen.add(room)
            if room:
                assert all((w - free) % P < depth for w in wp), cyc
            for b in range(banks):
                assert sp[b] == ((wp[b] - free_last) % P < depth), (cyc, b)
                assert ctx.get(dut.wp[b]) == wp[b]
                assert (wp[b] - free) % P <= depth           # never overflowed
            assert ctx.get(dut.rd.wp) == wall, cyc
            assert all((w - wall) % P <= depth for w in wp)
            we = [sp[b] and rng.random() < (0.9 if b else 0.5) for b in range(banks)]
            for b in range(banks):
                ctx.set(dut.wr.we[b], we[b])
                ctx.set(dut.wr.wdata[b], rng.randrange(256))
            # `free` never passes the oldest word any bank still has to deliver
            lo = min((w - free) % P for w in wp)
            step = rng.randrange(lo + 1) if rng.random() < 0.3 else 0
            ctx.set(dut.rd.free, (free + step) % P)
            await ctx.tick()
            free_last = (free + step) % P
            free = free_last
            room, room_b = room_b, all((w - free) % P <= depth - 3 for w in wp)
            # `wp_all` follows the write pointers as of the block RAMs' writes,
            # a cycle after the requests
            if all(w != wall for w in wp_w):
                wall = (wall + 1) % P
            wp_w = wp
            wp = [(wp[b] + we[b]) % P for b in range(banks)]
        assert seen == {True, False}                 # both values were reached
    _sim(dut, bench)


@pytest.mark.parametrize("stall", [False, True], ids=["flowing", "stalled"])
@pytest.mark.parametrize("name,over", [("tiny", {}), ("default", {})])
def test_record_path(name, over, stall):
    """A job's records become one SegParams per segment row (UP rows pair
    up_rq with prod_rq), from an unaligned start; the pass constants land
    in the output store, the softmax record and the SiLU table. With the
    parameter stream held up at random (and long enough to fill its queue),
    no parameter is lost: the queue's room flag covers the write the former
    has decided but not yet made."""
    cfg = preset(name).replace(**over)
    g = geom(cfg)
    dut = RecordPath(g, 0)
    lay = gm.make_layer(np.random.default_rng(3), hidden=cfg.hidden, ffn=cfg.ffn,
                        experts=cfg.experts, top_k=cfg.top_k, shared=cfg.shared_experts,
                        slice_bits=cfg.slice_bits, calib_tokens=8, stress=True)
    recs = gl.dense_records(cfg, lay, 0)
    sv = cfg.slice_vector_bits
    area = 0
    for i, r in enumerate(recs):
        area |= r << (32 * i)
    d = gl.dense_layout(cfg)
    words = [(area >> (w * sv)) & ((1 << sv) - 1) for w in range(d.param_words)]
    job = 1
    first, per = gb.expert_record_range(cfg, job)
    w0, nw, skip = gb.record_words(cfg, first, per)
    cf = d.record_index["out"]
    nrc = cfg.hidden // cfg.pes + 1 + 64
    cw0, cnw, cskip = gb.record_words(cfg, cf, nrc)
    Gi, Gd = cfg.ffn // cfg.pes, cfg.hidden // cfg.pes
    exp = []
    for gi in range(Gi):
        exp.append((lay.gate_mult[job][gi * cfg.pes], lay.gate_shift[job][gi * cfg.pes], 0, 0))
    for gi in range(Gi):
        r = gi * cfg.pes
        exp.append((lay.up_mult[job][r], lay.up_shift[job][r], lay.prod_mult[job][r],
                    lay.prod_shift[job][r]))
    for gi in range(Gd):
        exp.append((lay.down_mult[job][gi * cfg.pes], lay.down_shift[job][gi * cfg.pes], 0, 0))
    got, outs, luts, sms = [], {}, {}, []
    prng = np.random.default_rng(11)

    async def bench(ctx):
        ctx.set(dut.params.ready, 1)
        for c in ({"const": 1, "skip": cskip, "nrec": nrc, "par": 1},
                  {"const": 0, "skip": skip, "nrec": per, "par": 0}):
            ctx.set(dut.cmd.payload, c)
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick()
        ctx.set(dut.cmd.valid, 0)
        feed = words[cw0:cw0 + cnw] + words[w0:w0 + nw]
        i = 0
        for cyc in range(4000):
            if i < len(feed):
                ctx.set(dut.word.payload, feed[i])
                ctx.set(dut.word.valid, 1)
            else:
                ctx.set(dut.word.valid, 0)
            if ctx.get(dut.out.en):
                outs[ctx.get(dut.out.addr)] = ctx.get(dut.out.data)
            if ctx.get(dut.lut.en):
                luts[ctx.get(dut.lut.addr)] = ctx.get(dut.lut.data)
            if ctx.get(dut.sm.en):
                sms.append((ctx.get(dut.sm.mult), ctx.get(dut.sm.shift)))
            # stalled: nothing taken for the first 300 cycles (the queue
            # fills), then a quarter of the cycles
            prdy = not stall or (cyc >= 300 and prng.random() < 0.25)
            ctx.set(dut.params.ready, prdy)
            if prdy and ctx.get(dut.params.valid):
                p = ctx.get(dut.params.payload)
                got.append((p.mult, p.shift, p.mult2, p.shift2))
            ready = ctx.get(dut.word.ready)
            await ctx.tick()
            if i < len(feed) and ready:
                i += 1
    _sim(dut, bench)
    assert got == [tuple(int(x) for x in e) for e in exp]
    gbits = max(1, (Gd - 1).bit_length())
    assert {k & ((1 << gbits) - 1): v for k, v in outs.items()} == {
        gi: int(lay.out_mult[gi * cfg.pes]) | int(lay.out_shift[gi * cfg.pes]) << 16
        for gi in range(Gd)}
    assert sms == [(lay.sm_mult, lay.sm_shift)]
    assert len(luts) == 64 and all((a >> 6) == 1 for a in luts)          # buffer 1
    table = [luts[(1 << 6) | i] for i in range(64)]
    entries = [((table[i // 4] >> (8 * (i % 4))) & 0xFF) for i in range(256)]
    assert [x - 256 if x > 127 else x for x in entries] == list(lay.lut)


@pytest.mark.parametrize("empty", [False, True], ids=["routed", "none"])
def test_scheduler_announces_heavy_first(empty):
    """The scheduler's announce order, token counts and precisions equal the
    golden pass plan, ``last`` marks the pass's last announcement; decisions
    are taken in order and fill the job table. A pass that routes no expert
    (every token DRAFT, nothing allowed) sends one ``none`` beat with
    ``last`` and the pass's layer and takes no decision. The routings arrive
    from the token lanes' top-k units, one per lane per cycle; each job's
    steps per segment are the golden lane rule's."""
    cfg = preset("tiny").replace(batch_tokens=8, hb_words=8192)
    P = cfg.token_lanes
    g = geom(cfg)
    dut = ExpertScheduler(g)
    rng = np.random.default_rng(4)
    lay = gm.make_layer(rng, hidden=cfg.hidden, ffn=cfg.ffn, experts=cfg.experts,
                        top_k=cfg.top_k, calib_tokens=8)
    roles = [gb.Role(int(r)) for r in rng.integers(0, 3, 8)]
    xs = gm.random_tokens(rng, lay, 8)
    masks = rng.random((8, cfg.experts)) < 0.5
    if empty:
        roles, masks = [gb.Role.DRAFT] * 8, np.zeros((8, cfg.experts), bool)
    plan = gb.plan_pass(lay, xs, roles, masks)
    assert bool(plan.routed) != empty
    needs, entries = [], []

    async def bench(ctx):
        ctx.set(dut.passes.count[0], 8)
        ctx.set(dut.passes.layer[0], 1)
        for t, r in enumerate(roles):
            ctx.set(dut.passes.roles[0][t], TokenRole(int(r)))
        ctx.set(dut.passes.valid, 1)
        ctx.set(dut.passes.seq, 1)
        await ctx.tick()
        for step in range(8 // P):
            for p in range(P):
                s = plan.sel[step * P + p]
                ctx.set(dut.sel[p].payload, {"token": step, "par": 0, "count": len(s),
                                             "sel": s + [0] * (cfg.top_k - len(s)),
                                             "logit": [0] * cfg.top_k})
                ctx.set(dut.sel[p].valid, 1)
            await ctx.tick()
        for p in range(P):
            ctx.set(dut.sel[p].valid, 0)
        ctx.set(dut.need.ready, 1)
        ctx.set(dut.source.valid, 1)
        dec = 0
        for _ in range(200):
            ctx.set(dut.source.payload, {"hb": dec % 2, "slot": dec})
            if ctx.get(dut.need.valid):
                p = ctx.get(dut.need.payload)
                needs.append((p.layer, p.expert, p.tokens, int(p.precision.value), p.last,
                              p.none))
            took = ctx.get(dut.source.ready)
            await ctx.tick()
            dec += took
        prog = dut.progress
        assert ctx.get(prog.total_valid) & 1 and ctx.get(prog.decided[0]) == ctx.get(prog.total[0])
        for j in range(ctx.get(prog.total[0])):
            ctx.set(dut.jobs[2].addr, j)
            await ctx.tick()
            entries.append((ctx.get(dut.jobs[2].entry), ctx.get(dut.jobs[2].src)))
    _sim(dut, bench)
    nr = len(plan.routed)
    exp = [(1, j.expert, len(j.tokens), int(j.precision), int(i == nr - 1), 0)
           for i, j in enumerate(plan.routed)] or [(1, 0, 0, 0, 1, 1)]
    assert needs == exp
    for i, ((e, s), job) in enumerate(zip(entries, plan.routed)):
        assert e.expert == job.expert and e.tok_mask == sum(1 << t for t in job.tokens)
        assert e.steps == len(gb.lane_steps(cfg, job.tokens, roles))
        assert (s.hb, s.slot) == (i % 2, i)

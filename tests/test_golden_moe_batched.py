"""The golden token-batched MoE layer on its own: it equals the per-token
golden layer on every token for every batch composition, its pass plan
keeps the contract (each needed expert once per pass, shared first, heavy
first, precision and plane split per source), the traffic contract and
bound, and the dense-region image builder."""

import itertools

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.golden import layout as L
from elmoe3d.golden import moe_batched as gb
from elmoe3d.golden import moe_layer as gm

pytestmark = [pytest.mark.golden, pytest.mark.moe]

R = gb.Role


def _layer(seed=0, **kw):
    base = dict(hidden=16, ffn=32, experts=8, top_k=2)
    base.update(kw)
    return gm.make_layer(np.random.default_rng(seed), **base)


LAYERS = {
    "tiny": lambda: _layer(0),
    "shared": lambda: _layer(1, ffn=16, top_k=3, shared=2),
    "s2": lambda: _layer(2, ffn=16, top_k=3, shared=1, slice_bits=2),
}


def _per_token(layer, xs, roles, masks):
    return np.array([gm.forward(layer, x, gb.precision_of(r), m).y
                     for x, r, m in zip(xs, roles, masks)])


def _masks(rng, E, n):
    """none, one-hot, all, and random masks."""
    out = []
    for _ in range(n):
        kind = rng.integers(4)
        m = np.zeros(E, bool)
        if kind == 1:
            m[rng.integers(E)] = True
        elif kind == 2:
            m[:] = True
        elif kind == 3:
            m = rng.random(E) < 0.5
        out.append(m)
    return np.array(out)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_role_composition_equals_the_per_token_layer(name):
    """Every sequence of roles of up to three tokens (27 compositions of
    FULL/DRAFT/VERIFY), with none/one-hot/all/random masks, at pass sizes
    1..4 (so also steps of several passes)."""
    layer = LAYERS[name]()
    rng = np.random.default_rng(11)
    for n in (1, 2, 3):
        for roles in itertools.product(list(R), repeat=n):
            xs = gm.random_tokens(rng, layer, n)
            masks = _masks(rng, layer.experts, n)
            exp = _per_token(layer, xs, roles, masks)
            for T in (1, 2, 4):
                res = gb.batched_forward(layer, xs, roles, masks, batch_tokens=T)
                assert np.array_equal(res.y, exp), (roles, T)
                assert len(res.passes) == -(-n // T)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_random_batches_equal_the_per_token_layer(name):
    layer = LAYERS[name]()
    rng = np.random.default_rng(12)
    for _ in range(20):
        n = int(rng.integers(1, 40))
        xs = gm.random_tokens(rng, layer, n)
        if rng.random() < 0.2:
            xs[: n // 2] = rng.choice([-128, 127])           # saturated tokens
        roles = [R(int(v)) for v in rng.integers(0, 3, n)]
        masks = _masks(rng, layer.experts, n)
        T = int(rng.integers(1, 17))
        src = {e: gb.Source(bool(rng.integers(2)), int(rng.integers(8)))
               for e in range(layer.experts)}
        res = gb.batched_forward(layer, xs, roles, masks, batch_tokens=T, sources=src)
        assert np.array_equal(res.y, _per_token(layer, xs, roles, masks))


def test_a_wrong_combine_is_caught():
    """The equality above can fail: a batched layer that drops the gate of
    one token (here: every gate 4096) differs from the per-token layer."""
    layer = _layer(3)
    rng = np.random.default_rng(3)
    xs = gm.random_tokens(rng, layer, 8)
    roles = [R.FULL] * 8
    ok = gb.batched_forward(layer, xs, roles, batch_tokens=4)
    saved = gm.gate_weights
    try:
        gb.gm.gate_weights = lambda lg, m, s: np.full(len(lg), gm.GATE_ONE, np.int64)
        bad = gb.batched_forward(layer, xs, roles, batch_tokens=4)
    finally:
        gb.gm.gate_weights = saved
    assert not np.array_equal(ok.y, bad.y)


def test_plan_streams_each_needed_expert_once_heavy_first():
    layer = _layer(4, shared=1)
    rng = np.random.default_rng(4)
    for _ in range(50):
        n = int(rng.integers(1, 9))
        xs = gm.random_tokens(rng, layer, n)
        roles = [R(int(v)) for v in rng.integers(0, 3, n)]
        masks = _masks(rng, layer.experts, n)
        plan = gb.plan_pass(layer, xs, roles, masks, sources={})
        shared = [j for j in plan.jobs if j.shared]
        routed = plan.routed
        assert plan.jobs[:len(shared)] == shared and [j.expert for j in shared] == [8]
        assert shared[0].tokens == tuple(range(n))
        experts = [j.expert for j in routed]
        assert len(experts) == len(set(experts))                      # once per pass
        want = {e: tuple(t for t in range(n) if e in plan.sel[t]) for e in range(8)}
        assert {j.expert: j.tokens for j in routed} == {e: v for e, v in want.items() if v}
        keys = [(-len(j.tokens), j.expert) for j in routed]
        assert keys == sorted(keys)                                   # heavy first, then index
        for t in range(n):                                            # DRAFT: allowed only
            if roles[t] is R.DRAFT:
                assert all(masks[t][e] for e in plan.sel[t])


@pytest.mark.parametrize("roles,prec", [
    ((R.DRAFT,), R.DRAFT), ((R.DRAFT, R.DRAFT), R.DRAFT), ((R.FULL,), R.FULL),
    ((R.DRAFT, R.FULL), R.FULL), ((R.VERIFY,), R.VERIFY), ((R.FULL, R.VERIFY), R.VERIFY),
    ((R.DRAFT, R.VERIFY), R.VERIFY)])
def test_job_precision(roles, prec):
    assert gb.job_precision(roles) is prec


@pytest.mark.parametrize("s,k", [(4, 1), (2, 2), (2, 1), (1, 4)])
def test_plane_split_per_source(s, k):
    """Which planes each port carries: ``(MSB slot / dense, LPDDR, LSB slot)``."""
    layer = _layer(5, slice_bits=s, draft_keep=k, shared=1)
    n = 8 // s
    hb = gb.Source(True, 3)
    whole = gb.Source(True, 3, lsb_hb=True, lsb_slot=5)
    lo, hi = tuple(range(k)), tuple(range(k, n))
    P = gb._planes
    assert P(layer, R.DRAFT, hb, False) == (lo, (), ())
    assert P(layer, R.VERIFY, hb, False) == (lo, hi, ())                         # split
    assert P(layer, R.FULL, hb, False) == (lo, hi, ())
    assert P(layer, R.VERIFY, whole, False) == (lo, (), hi)                      # whole-resident
    assert P(layer, R.FULL, whole, False) == (lo, (), hi)
    assert P(layer, R.DRAFT, whole, False) == (lo, (), ())                       # MSB only
    assert P(layer, R.FULL, gb.LPDDR, False) == ((), tuple(range(n)), ())
    assert P(layer, R.DRAFT, gb.LPDDR, False) == ((), lo, ())
    assert P(layer, R.DRAFT, None, True) == (lo, (), ())                         # shared
    assert P(layer, R.FULL, None, True) == (tuple(range(n)), (), ())


def test_lsb_from_hb_needs_msb_from_hb():
    with pytest.raises(ValueError, match="lsb_slot=2"):
        gb.Source(False, 0, lsb_hb=True, lsb_slot=2)


def test_traffic_contract_at_default():
    """One weight load per expert per pass: the traffic of a pass counts each
    job's planes once whatever its token count, so beats per token fall
    with T; a whole-resident job reads both its slots from HB and nothing
    from LPDDR; the PE array takes the tokens in steps of ``P`` lanes; the
    bound is the busiest of the three resources."""
    cfg = preset("default")
    P = cfg.token_lanes
    layer = gm.make_layer(np.random.default_rng(6))
    rng = np.random.default_rng(6)
    xs = gm.random_tokens(rng, layer, 16)
    rows, B, n = cfg.expert_rows, cfg.pes, cfg.planes
    whole = gb.Source(True, 0, lsb_hb=True, lsb_slot=1)
    for role, src, hb_planes, ext_planes in ((R.FULL, gb.LPDDR, 0, n),
                                             (R.DRAFT, gb.Source(True, 0), 1, 0),
                                             (R.VERIFY, gb.Source(True, 0), 1, n - 1),
                                             (R.FULL, whole, n, 0)):
        plan = gb.plan_pass(layer, xs, [role] * 16, None, sources=lambda e, p, t: src)
        tr = gb.pass_traffic(cfg, plan)
        J = len(plan.jobs)
        assert tr.ext_beats == J * ext_planes * rows * B // cfg.fill_words
        rec = gb.record_words(cfg, 0, 112)[1]
        assert rec == 56
        # bank 0: out + softmax + SiLU table, records 1792..1872 = 41 words; others 9
        assert tr.hb_words[1] == 32 + 9 + J * (rec + hb_planes * rows)
        assert tr.hb_words[0] == 32 + 41 + J * (rec + hb_planes * rows)
        planes = 1 if role is R.DRAFT else n
        pairs = sum(len(j.tokens) for j in plan.jobs)
        assert pairs == 16 * cfg.top_k
        steps = sum(max(sum(1 for t in j.tokens if t % P == p) for p in range(P))
                    for j in plan.jobs)
        assert steps < pairs                  # some job has tokens in two lanes
        assert tr.mac_beats == (16 // P) * n * 16 + steps * planes * rows
        assert tr.bound == max(tr.hb_beats, tr.ext_beats, tr.mac_beats)
        if role is R.FULL and ext_planes == n:
            assert tr.bound == tr.ext_beats   # an all-LPDDR pass of 16 tokens: LPDDR-bound


def test_lane_steps():
    """A segment's steps: one token per lane per step, lowest position first,
    DRAFT tokens (``k`` planes) never with the others (``n`` planes)."""
    cfg = preset("default")                    # P = 4, n = 2, k = 1
    roles = [R.FULL] * 8 + [R.DRAFT] * 4
    st = gb.lane_steps(cfg, (0, 1, 4, 5, 8, 9, 10, 11), roles)
    assert st == [(1, [8, 9, 10, 11]), (2, [0, 1, None, None]), (2, [4, 5, None, None])]
    assert gb.lane_steps(cfg.replace(token_lanes=1), (2, 3), roles) == [(2, [2]), (2, [3])]
    assert gb.lane_steps(cfg, (), roles) == []


def test_lpddr_bandwidth_scales_its_bound():
    """The LPDDR port's time is its beats at the configured bandwidth."""
    cfg = preset("default")
    assert gb.lpddr_cycles_per_beat(cfg) == 1.0
    slow = cfg.replace(lpddr_bytes_per_cycle=2)              # a 64-bit beat every 4 cycles
    assert gb.lpddr_cycles_per_beat(slow) == 4.0
    layer = gm.make_layer(np.random.default_rng(2))
    xs = gm.random_tokens(np.random.default_rng(2), layer, 4)
    plan = gb.plan_pass(layer, xs, [R.FULL] * 4, None, sources=lambda e, p, t: gb.LPDDR)
    a, b = gb.pass_traffic(cfg, plan), gb.pass_traffic(slow, plan)
    assert b.ext_beats == a.ext_beats and b.ext_cycles == 4 * a.ext_cycles


def test_record_words_alignment():
    cfg = preset("default")                       # 64-bit words: 2 records per word
    assert gb.record_words(cfg, 0, 3) == (0, 2, 0)
    assert gb.record_words(cfg, 1, 2) == (0, 2, 1)
    assert gb.record_words(cfg, 3, 1) == (1, 1, 1)
    tiny = preset("tiny")                         # 16-bit words: 2 words per record
    assert gb.record_words(tiny, 5, 2) == (10, 4, 0)
    assert [list(gb.lut_share(cfg, b)) for b in range(4)] == [list(range(64)), [], [], []]


@pytest.mark.parametrize("name,over", [("tiny", {}), ("tiny", {"shared_experts": 1, "hb_words": 8192}),
                                       ("default", {}),
                                       ("tiny", {"slice_bits": 2, "hb_words": 8192})])
def test_dense_image_round_trips(name, over):
    """The dense image holds exactly the router, shared experts and records
    of every layer where dense_layout says (decoded back here)."""
    cfg = preset(name).replace(**over)
    rng = np.random.default_rng(7)
    layers = [gm.make_layer(rng, hidden=cfg.hidden, ffn=cfg.ffn, experts=cfg.experts,
                            top_k=cfg.top_k, shared=cfg.shared_experts,
                            slice_bits=cfg.slice_bits, calib_tokens=8)
              for _ in range(cfg.layers)]
    img = L.dense_image(cfg, layers)
    d = L.dense_layout(cfg)
    n = cfg.planes
    assert img.shape == (cfg.pes, cfg.dense_words)
    for li, lay in enumerate(layers):
        rw = L.pack_rows(cfg, lay.router, L.Proj.ROUTER)
        for seg, q, c, words in L.weight_beats(cfg, rw, range(n), L.router_segments(cfg)):
            off = d.router_base(li) + L.interleaved_offset(seg, q, c, n)
            assert list(img[:, off]) == words
        for s in range(cfg.shared_experts):
            j = cfg.experts + s
            ww = L.expert_slice_words(cfg, lay.wg[j], lay.wu[j], lay.wd[j])
            for seg, q, c, words in L.weight_beats(cfg, ww, range(n)):
                assert list(img[:, d.shared_base(li, s) + L.interleaved_offset(seg, q, c, n)]) \
                    == words
        sv = cfg.slice_vector_bits
        for b in range(cfg.pes):
            val = sum(int(img[b, d.params_base(li) + w]) << (w * sv)
                      for w in range(d.param_words))
            recs = [(val >> (32 * i)) & 0xFFFFFFFF for i in range(d.records)]
            j = 1 if cfg.experts > 1 else 0
            first, per = gb.expert_record_range(cfg, j)
            g0 = L.unpack_param_record(recs[first])
            assert (g0.mult, g0.shift) == (lay.gate_mult[j][b], lay.gate_shift[j][b])
            up = L.unpack_param_record(recs[first + cfg.ffn // cfg.pes])
            pr = L.unpack_param_record(recs[first + cfg.ffn // cfg.pes + 1])
            assert (up.mult, pr.mult) == (lay.up_mult[j][b], lay.prod_mult[j][b])
            sm = L.unpack_param_record(recs[d.record_index["sm"]])
            assert (sm.mult, sm.shift) == (lay.sm_mult, lay.sm_shift)
            lut = recs[d.record_index["lut"]:]
            got = [((lut[i // 4] >> (8 * (i % 4))) & 0xFF) for i in range(256)]
            assert [v - 256 if v > 127 else v for v in got] == list(lay.lut)


@pytest.mark.parametrize("name", ["tiny", "default", "lm"])
def test_trace_layer_routes_as_the_ranking(name):
    """A routing trace realised as a layer and tokens (what the tile's trace
    bench sends): the batched router's selection equals the RankingRouter's
    for every token, over all experts and over random DRAFT masks, and the
    ranking codes never tie."""
    from elmoe3d.golden.esd import RankingRouter, synthetic_trace
    cfg = preset(name)
    rng = np.random.default_rng(3)
    lay = gb.trace_layer(gm.make_layer(rng, hidden=cfg.hidden, ffn=cfg.ffn, experts=cfg.experts,
                                       top_k=cfg.top_k, calib_tokens=4))
    R = synthetic_trace(rng, requests=1, tokens=200, layers=1, experts=cfg.experts)[0, :, 0]
    xs = gb.trace_tokens(rng, lay, R)
    for role in (gb.Role.FULL, gb.Role.DRAFT, gb.Role.VERIFY):
        for _ in range(20):
            mask = int(rng.integers(0, 1 << cfg.experts))
            m = np.array([[(mask >> e) & 1 for e in range(cfg.experts)]] * len(R), bool)
            sel = gb.route_pass(lay, xs, [role] * len(R), m)[1]
            want = RankingRouter(R, cfg.top_k)(mask if role is gb.Role.DRAFT else None)
            assert sel == want
    logits = xs @ lay.router.T
    assert all(len(set(row)) == cfg.experts for row in logits.tolist())


def test_trace_tokens_refuse_bad_rankings():
    lay = gb.trace_layer(gm.make_layer(np.random.default_rng(0), hidden=16, ffn=8, experts=8,
                                       top_k=2, calib_tokens=2))
    with pytest.raises(ValueError, match="permutation"):
        gb.trace_tokens(np.random.default_rng(0), lay, [[0, 0, 1, 2, 3, 4, 5, 6]])
    with pytest.raises(ValueError, match="Rankings must be"):
        gb.trace_tokens(np.random.default_rng(0), lay, [[0, 1, 2]])
    small = gm.make_layer(np.random.default_rng(0), hidden=4, ffn=8, experts=8, top_k=2,
                          calib_tokens=2)
    with pytest.raises(ValueError, match="hidden >= experts"):
        gb.trace_layer(small)


def test_prefetch_candidates_rule():
    """A DRAFT pass's candidates are each token's best-ranked expert of its
    unrestricted top-k outside its own mask (the lowest-ranked with the
    mutant); a pass with a non-DRAFT token has none; the hardware's shortcut
    (the best outside expert is a candidate iff the restricted top-k has
    fewer than k experts or it ranks above the restricted k-th) agrees on
    random passes."""
    from elmoe3d.golden import moe_layer as gm
    rng = np.random.default_rng(5)
    E, k = 8, 3
    for _ in range(300):
        logits = rng.integers(-4, 5, size=(4, E))
        masks = rng.random((4, E)) < 0.5
        plan = gb.PassPlan(first=0, roles=[gb.Role.DRAFT] * 4, logits=logits, sel=[], gates=[],
                           jobs=[])
        want = {}
        for t in range(4):
            full = gm.route(logits[t], k)
            out = [e for e in full if not masks[t][e]]
            if out:
                want[out[0]] = want.get(out[0], 0) + 1
            # the shortcut the CandidateTracker builds
            outside = [e for e in range(E) if not masks[t][e]]
            best = min(outside, key=lambda e: (-logits[t][e], e)) if outside else None
            r = gm.route(logits[t], k, masks[t])
            short = best is not None and (len(r) < k or (logits[t][best], -best)
                                          > (logits[t][r[-1]], -r[-1]))
            assert short == bool(out) and (not out or best == out[0])
        assert gb.prefetch_candidates(plan, masks, k) == want
    plan.roles[2] = gb.Role.VERIFY
    assert gb.prefetch_candidates(plan, masks, k) is None

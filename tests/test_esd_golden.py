"""The golden Elastic-SD control sequence on its own: hand-computed sequences,
the canonical-order rule, properties of long synthetic decodes checked by an
independent residency tracker, host errors, faults, and mutants that the
comparison must catch."""

import random

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.golden import esd
from elmoe3d.golden import layout as gl
from elmoe3d.golden.esd import (AllocResult, EsdController, EsdHostError, Event, EventKind as K,
                                FillEnd, HostError, InvalidateReason, LookupResult, Mode,
                                ModeReason, Phase, RankingRouter, Source)
from elmoe3d.golden.vocab import ExtError

pytestmark = [pytest.mark.esd, pytest.mark.golden]

TINY = preset("tiny")


def fixed(sel):
    """A route callable that returns ``sel`` whatever the mask."""
    return lambda mask: sel


# -- hand-computed sequences ---------------------------------------------------------------

def test_ar_first_step_exact():
    """Batch 1 (below the SD threshold): AR; two cold misses fill slots 0, 1 in
    ascending expert order; the second layer step hits nothing; exact events."""
    cfg = TINY
    c = EsdController(cfg)
    assert c.begin_round(1) == (Mode.AR, 0)
    c.layer_step(Phase.AR, 0, 0, fixed([[3, 1]]))
    n, m = cfg.planes, (1 << cfg.hb_planes_eff) - 1
    P = dict(phase=Phase.AR, step=0, layer=0, pass_no=0)
    exp = [Event(K.MODE, code=Mode.AR, tag=ModeReason.BATCH),
           Event(K.PASS, **P, value=1)]
    for e, slot in ((1, 0), (3, 1)):
        exp += [Event(K.LOOKUP, **P, expert=e, code=LookupResult.MISS, value=1),
                Event(K.ALLOCATE, **P, expert=e, slot=slot, code=AllocResult.FREE, value=1),
                Event(K.FILL_START, **P, expert=e, slot=slot, value=m),
                Event(K.SOURCE, **P, expert=e, slot=slot, code=Source.LPDDR,
                      value=((1 << n) - 1) << n),
                Event(K.FILL_END, **P, expert=e, slot=slot, code=FillEnd.COMMIT),
                Event(K.UNPIN, **P, expert=e, slot=slot)]
    exp.append(Event(K.LAYER_DONE, phase=Phase.AR))
    assert esd.compare(exp, c.events) is None, esd.compare(exp, c.events)
    assert c.counters["hb_misses"] == 2 and c.counters["fills"] == 2
    assert c.counters["lpddr_bytes"] == 2 * cfg.expert_bytes and c.counters["hb_bytes"] == 0


def test_ar_hit_split_and_touch():
    """A later AR step hits: SPLIT source (HB planes from HB, the rest from
    LPDDR) and a TOUCH by the tokens routed; the layer's other tag misses."""
    cfg = TINY
    c = EsdController(cfg)
    for _ in range(2):
        c.begin_round(1)
        for l in range(cfg.layers):
            c.layer_step(Phase.AR, 0, l, fixed([[2]]))
    evs = [e for e in c.events if e.kind in (K.LOOKUP, K.SOURCE, K.TOUCH)]
    second = evs[4:]
    n, k = cfg.planes, cfg.hb_planes_eff
    hb, lp = (1 << k) - 1, ((1 << n) - 1) & ~((1 << k) - 1)
    assert second[0].kind == K.LOOKUP and second[0].code == LookupResult.HIT
    assert second[1] == Event(K.SOURCE, phase=Phase.AR, expert=2, slot=0, code=Source.SPLIT,
                              value=hb | lp << n)
    assert second[2] == Event(K.TOUCH, phase=Phase.AR, expert=2, slot=0, value=1)
    assert c.counters["hb_hits"] == 2 and c.counters["hb_misses"] == 2
    pb = cfg.expert_bytes // n
    assert c.counters["hb_bytes"] == 2 * k * pb
    assert c.counters["lpddr_bytes"] == 2 * n * pb + 2 * (n - k) * pb


def sd_round(c, cfg, batch, draft_sel, verify_sel, accepted):
    mode, K_ = c.begin_round(batch)
    assert mode == Mode.SD
    for j in range(K_):
        for l in range(cfg.layers):
            c.layer_step(Phase.DRAFT, j, l, draft_sel)
    for l in range(cfg.layers):
        c.layer_step(Phase.VERIFY, 0, l, verify_sel)
    c.accept(accepted)
    return K_


def test_sd_round_eligibility_and_draft_length():
    """SD at the threshold: draft eligibility is the resident set (empty at
    first: nothing selected, ELIGIBLE 0); VERIFY fills; the next round drafts
    with the filled experts (HB source, TOUCH); all accepted -> K + 1; less
    than half accepted -> K - 1."""
    cfg = TINY
    B = cfg.sd_threshold
    c = EsdController(cfg)
    K0 = cfg.draft_len_init

    def draft_route(mask):          # best-first ranking 0, 1, 2, ... restricted to the mask
        return RankingRouter([list(range(cfg.experts))] * B, cfg.top_k)(mask)

    verify = [[0, 1]] * (B * (K0 + 1))
    sd_round(c, cfg, B, draft_route, verify, B * K0)
    elig = [e for e in c.events if e.kind == K.ELIGIBLE]
    assert len(elig) == K0 * cfg.layers and all(e.value == 0 for e in elig)
    assert c.K == K0 + 1 and c.events[-1] == Event(K.DRAFT_LEN, value=K0 + 1)
    assert c.counters["fills"] == 2 * cfg.layers
    start = len(c.events)
    K1 = sd_round(c, cfg, B, draft_route, [[0, 1]] * (B * (K0 + 2)), 0)
    assert K1 == K0 + 1
    new = c.events[start:]
    elig = [e for e in new if e.kind == K.ELIGIBLE]
    assert all(e.value == 0b11 for e in elig)
    src = [e for e in new if e.kind == K.SOURCE and e.phase == Phase.DRAFT]
    assert src and all(e.code == Source.HB for e in src)
    touches = [e for e in new if e.kind == K.TOUCH]
    assert touches and all(e.phase == Phase.DRAFT and e.value == B for e in touches)
    assert [e.kind for e in new[-2:]] == [K.ROLLBACK, K.DRAFT_LEN]
    assert new[-2].value == B * K1 and c.K == K0
    # verification hits: split, no touch, no fill
    vsrc = [e for e in new if e.kind == K.SOURCE and e.phase == Phase.VERIFY]
    assert vsrc and all(e.code == Source.SPLIT for e in vsrc)


def test_draft_length_limits():
    cfg = TINY.replace(draft_len_min=1, draft_len_max=3, draft_len_init=2)
    B = cfg.sd_threshold
    c = EsdController(cfg)
    route = lambda K_: (lambda mask: [[]] * B)
    ks = []
    for acc in ("all", "all", "all", "none", "none", "none", "half"):
        mode, K_ = c.begin_round(B)
        for j in range(K_):
            for l in range(cfg.layers):
                c.layer_step(Phase.DRAFT, j, l, route(K_)(None))
        for l in range(cfg.layers):
            c.layer_step(Phase.VERIFY, 0, l, fixed([[0]] * (B * (K_ + 1))))
        n = {"all": B * K_, "none": 0, "half": (B * K_ + 1) // 2}[acc]
        c.accept(n)
        ks.append(c.K)
    assert ks == [3, 3, 3, 2, 1, 1, 1]


@pytest.mark.parametrize("batch,K0,n,K1", [
    (4, 2, 8, 3), (4, 2, 6, 3),          # three quarters of 8 drafts: grow
    (4, 2, 5, 2), (4, 2, 4, 2),          # half to three quarters: keep
    (4, 2, 3, 1),                        # under half: shrink
    (1, 4, 3, 5), (1, 4, 2, 4),          # batch 1, K = 4: 3 of 4 grows
    (1, 3, 2, 3), (1, 3, 3, 4),          # batch 1, K = 3: only all three grows
    (16, 3, 36, 4), (16, 3, 35, 3),      # 36 of 48 = 3/4
])
def test_draft_length_follows_the_batch_mean(batch, K0, n, K1):
    """The draft length grows when the batch's mean accepted length is at
    least three quarters of ``K`` (``4n >= 3 * batch * K``) and shrinks
    under half, so at batch > 1 one early rejection does not hold ``K``
    down."""
    cfg = TINY.replace(draft_len_min=1, draft_len_max=8, draft_len_init=K0, sd_threshold=1)
    c = EsdController(cfg)
    mode, K_ = c.begin_round(batch, force=Mode.SD)
    assert (mode, K_) == (Mode.SD, K0)
    for j in range(K_):
        for l in range(cfg.layers):
            c.layer_step(Phase.DRAFT, j, l, [[]] * batch)
    for l in range(cfg.layers):
        c.layer_step(Phase.VERIFY, 0, l, fixed([[0]] * (batch * (K_ + 1))))
    c.accept(n)
    assert c.K == K1
    assert (c.events[-1] == Event(K.DRAFT_LEN, value=K1)) == (K1 != K0)


def test_decay_period_counts_decode_steps():
    cfg = TINY.replace(decay_period=3)
    c = EsdController(cfg)
    for _ in range(10):
        c.begin_round(1)
        for l in range(cfg.layers):
            c.layer_step(Phase.AR, 0, l, fixed([[0]]))
    d = [e for e in c.events if e.kind == K.DECAY]
    assert [e.value for e in d] == [3, 6, 9]


def test_kv_move_invalidates_and_backs_off():
    """KV growth covers the highest slots first (their residents are dropped,
    INVALIDATE by slot), victims avoid covered slots, and SD backs off when
    fewer than min_free_slots usable slots remain; shrinking uncovers them."""
    cfg = TINY.replace(min_free_slots=3)
    S, SW = cfg.tag_slots, cfg.slot_words
    c = EsdController(cfg)
    # fill every slot: AR steps with distinct experts per layer
    for r in range(S):
        c.begin_round(1)
        for l in range(cfg.layers):
            e = (r // cfg.layers * 2 + l) % cfg.experts if False else None
        c.layer_step(Phase.AR, 0, 0, fixed([[r % cfg.experts]]))
        c.layer_step(Phase.AR, 0, 1, fixed([[0]]))
    assert all(c.tags.valid)
    free_top = cfg.hb_words - cfg.dense_words - S * SW
    words = free_top + (S - 2) * SW                # covers all but slots 0, 1
    c.context(words // cfg.kv_words_per_token)
    mv = [e for e in c.events if e.kind == K.KV_MOVE][-1]
    assert mv.value == words and mv.tag == 2
    inv = c.events[-(S - 2):]
    assert [e.slot for e in inv] == list(range(2, S))
    assert all(e.kind == K.INVALIDATE and e.code == InvalidateReason.KV for e in inv)
    assert gl.slot_covered_mask(cfg, words) == ((1 << S) - 1) & ~0b11
    c.check_invariants()
    # a batch at the threshold backs off
    assert c.begin_round(cfg.sd_threshold) == (Mode.AR, 0)
    assert c.events[-1] == Event(K.MODE, code=Mode.AR, tag=ModeReason.BACKOFF)
    # a miss now evicts within slots 0, 1 only
    c.layer_step(Phase.AR, 0, 0, fixed([[cfg.experts - 1]] * cfg.sd_threshold))
    al = [e for e in c.events if e.kind == K.ALLOCATE][-1]
    assert al.slot in (0, 1) and al.code == AllocResult.EVICT
    c.layer_step(Phase.AR, 0, 1, fixed([[0]] * cfg.sd_threshold))
    c.context(0)
    assert c.usable_slots == S and c.covered == 0
    assert c.begin_round(cfg.sd_threshold)[0] == Mode.SD


def test_no_victim_when_all_pinned():
    """A pass needing more experts than usable slots: the extra misses stream
    from LPDDR without a fill (ALLOCATE NO_VICTIM)."""
    cfg = TINY.replace(min_free_slots=0)
    S, SW = cfg.tag_slots, cfg.slot_words
    c = EsdController(cfg)
    free_top = cfg.hb_words - cfg.dense_words - S * SW
    c.context((free_top + (S - 1) * SW) // cfg.kv_words_per_token)   # one usable slot
    c.begin_round(1)
    c.layer_step(Phase.AR, 0, 0, fixed([[5, 2]]))
    al = [e for e in c.events if e.kind == K.ALLOCATE]
    assert [(e.expert, e.code) for e in al] == [(2, AllocResult.FREE), (5, AllocResult.NO_VICTIM)]
    src = [e for e in c.events if e.kind == K.SOURCE]
    assert all(e.code == Source.LPDDR for e in src)
    assert c.counters["no_victim"] == 1 and c.counters["fills"] == 1


# -- host errors leave the state unchanged ------------------------------------------------

def _snapshot(c):
    return (list(c.events), dict(c.counters), c.K, c.expect, c.kv_words,
            list(c.tags.valid), list(c.tags.hot), list(c.tags.pins), list(c.tags.tags))


@pytest.mark.parametrize("case", ["batch0", "batch_big", "round_open", "phase", "order",
                                  "accept_ar", "accept_big", "kv", "route_k", "route_dup",
                                  "route_ineligible", "route_count"])
def test_host_errors(case):
    cfg = TINY
    B = cfg.sd_threshold
    c = EsdController(cfg)
    c.begin_round(1)
    c.layer_step(Phase.AR, 0, 0, fixed([[0]]))
    c.layer_step(Phase.AR, 0, 1, fixed([[0]]))
    if case not in ("batch0", "batch_big", "accept_ar", "kv"):
        c.begin_round(B)                       # SD round, expecting DRAFT 0 layer 0
    before = _snapshot(c)
    want, call = {
        "batch0": (HostError.BAD_BATCH, lambda: c.begin_round(0)),
        "batch_big": (HostError.BAD_BATCH, lambda: c.begin_round(esd.MAX_BATCH + 1)),
        "round_open": (HostError.BAD_BATCH, lambda: c.begin_round(B)),
        "phase": (HostError.BAD_PHASE, lambda: c.layer_step(Phase.VERIFY, 0, 0, fixed([]))),
        "order": (HostError.BAD_ORDER, lambda: c.layer_step(Phase.DRAFT, 0, 1, fixed([]))),
        "accept_ar": (HostError.BAD_ACCEPT, lambda: c.accept(0)),
        "accept_big": (HostError.BAD_ACCEPT, lambda: c.accept(0)),
        "kv": (HostError.KV_RANGE, lambda: c.context(gl.kv_limit(cfg) + 1)),
        "route_k": (HostError.BAD_ROUTE,
                    lambda: c.layer_step(Phase.DRAFT, 0, 0, fixed([[0, 1, 2]] * B))),
        "route_dup": (HostError.BAD_ROUTE,
                      lambda: c.layer_step(Phase.DRAFT, 0, 0, fixed([[0, 0]] * B))),
        "route_ineligible": (HostError.BAD_ROUTE,
                             lambda: c.layer_step(Phase.DRAFT, 0, 0, fixed([[1]] * B))),
        "route_count": (HostError.BAD_ROUTE,
                        lambda: c.layer_step(Phase.DRAFT, 0, 0, fixed([[0]] * (B + 1)))),
    }[case]
    with pytest.raises(EsdHostError) as ei:
        call()
    assert ei.value.code == want, str(ei.value)
    assert _snapshot(c) == before


def test_accept_more_than_drafted_refused():
    cfg = TINY
    B = cfg.sd_threshold
    c = EsdController(cfg)
    K_ = c.begin_round(B)[1]
    for j in range(K_):
        for l in range(cfg.layers):
            c.layer_step(Phase.DRAFT, j, l, fixed([[]] * B))
    for l in range(cfg.layers):
        c.layer_step(Phase.VERIFY, 0, l, fixed([[0]] * (B * (K_ + 1))))
    before = _snapshot(c)
    with pytest.raises(EsdHostError) as ei:
        c.accept(B * K_ + 1)
    assert ei.value.code == HostError.BAD_ACCEPT and _snapshot(c) == before
    c.accept(B * K_)                            # the right count is then taken


# -- faults --------------------------------------------------------------------------------

def test_fill_fault_aborts_frees_and_repeats():
    """An LPDDR error on a fill: EXT_ERROR, FILL_END ABORT, INVALIDATE ABORT
    (never resident), LAYER_DONE with code 1; the repeated step fills again."""
    cfg = TINY
    c = EsdController(cfg, faults={0: ExtError.SLVERR})
    c.begin_round(1)
    r = c.layer_step(Phase.AR, 0, 0, fixed([[4]]))
    assert r.error and c.expect == (Phase.AR, 0, 0)
    kinds = [e.kind for e in c.events[1:]]
    assert kinds == [K.PASS, K.LOOKUP, K.ALLOCATE, K.FILL_START, K.SOURCE, K.EXT_ERROR,
                     K.FILL_END, K.INVALIDATE, K.LAYER_DONE]
    assert c.events[6].value == ExtError.SLVERR and c.events[7].code == FillEnd.ABORT
    assert c.events[-1].code == 1 and not any(c.tags.valid)
    c.check_invariants()
    r = c.layer_step(Phase.AR, 0, 0, fixed([[4]]))
    assert not r.error and c.tags.resident(0) and c.counters["fills"] == 1
    assert c.counters["aborts"] == 1 and c.counters["ext_errors"] == 1


def test_split_fault_keeps_slot():
    """An error on the LSB read of a hit: the slot stays resident (its data
    came from a fill that committed), the step is repeated."""
    cfg = TINY
    c = EsdController(cfg, faults={2: ExtError.PROTOCOL})   # round 2, layer 0: the LSB read
    for _ in range(2):
        c.begin_round(1)
        for l, e in ((0, 4), (1, 0)):
            while c.layer_step(Phase.AR, 0, l, fixed([[e]])).error:
                pass
    errs = [e for e in c.events if e.kind == K.EXT_ERROR]
    assert len(errs) == 1 and errs[0].slot == 0 and c.tags.resident(0)
    done = [e.code for e in c.events if e.kind == K.LAYER_DONE]
    assert done == [0, 0, 1, 0, 0]
    assert not any(e.kind in (K.FILL_END, K.INVALIDATE) for e in c.events[-8:])


# -- an independent tracker of residency over long synthetic decodes ------------------------

class Shadow:
    """Residency rebuilt from the events alone (not from the golden's state):
    checks LOOKUP results, ELIGIBLE masks, victims, pins and byte counts."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.where = {}           # (layer, expert) -> slot   (committed)
        self.pending = {}         # slot -> (layer, expert)
        self.holder = {}          # slot -> (layer, expert) valid (pending or committed)
        self.pins = {}
        self.covered = 0
        self.n, self.k = cfg.planes, cfg.hb_planes_eff
        self.bytes = {"hb": 0, "lpddr": 0}

    def feed(self, e):
        cfg, key = self.cfg, (e.layer, e.expert)
        if e.kind not in (K.INVALIDATE, K.KV_MOVE):       # every covered slot was dropped
            assert not any((self.covered >> s) & 1 for s in self.holder), ("covered holder", e)
        if e.kind == K.ELIGIBLE:
            mask = sum(1 << x for (l, x) in self.where if l == e.layer)
            assert e.value == mask, (e, mask)
        elif e.kind == K.LOOKUP:
            if key in self.where:
                assert e.code == LookupResult.HIT and e.slot == self.where[key], e
                self.pins[e.slot] = self.pins.get(e.slot, 0) + 1
            else:
                assert e.code == LookupResult.MISS, e
        elif e.kind == K.ALLOCATE and e.code != AllocResult.NO_VICTIM:
            s = e.slot
            assert not (self.covered >> s) & 1, ("victim covered", e)
            assert not self.pins.get(s), ("victim pinned", e)
            if s in self.holder:
                old = self.holder[s]
                assert e.code == AllocResult.EVICT
                assert e.tag == (old[0] << cfg.expert_bits | old[1])
                self.where.pop(old, None)
            else:
                assert e.code == AllocResult.FREE
                # lowest free enabled slot
                free = [j for j in range(cfg.tag_slots)
                        if j not in self.holder and not (self.covered >> j) & 1]
                assert s == min(free), (e, free)
            self.holder[s] = key
            self.pending[s] = key
            self.pins[s] = 1
        elif e.kind == K.ALLOCATE:
            usable = [j for j in range(cfg.tag_slots) if not (self.covered >> j) & 1]
            assert all(self.pins.get(j) for j in usable), ("no victim though one is free", e)
        elif e.kind == K.SOURCE:
            pb = cfg.expert_bytes // self.n
            hb, lp = e.value & ((1 << self.n) - 1), e.value >> self.n
            self.bytes["hb"] += bin(hb).count("1") * pb
            self.bytes["lpddr"] += bin(lp).count("1") * pb
            if e.code in (Source.HB, Source.SPLIT):
                assert self.where.get(key) == e.slot
        elif e.kind == K.FILL_END:
            assert self.pending.pop(e.slot) == key
            if e.code == FillEnd.COMMIT:
                self.where[key] = e.slot
        elif e.kind == K.UNPIN:
            self.pins[e.slot] -= 1
            assert self.pins[e.slot] >= 0
        elif e.kind == K.INVALIDATE:
            held = self.holder.pop(e.slot)
            if e.code == InvalidateReason.ABORT:
                assert held == key
            else:
                assert (self.covered >> e.slot) & 1 and not self.pins.get(e.slot)
            self.where.pop(held, None)
            self.pins.pop(e.slot, None)
        elif e.kind == K.KV_MOVE:
            self.covered = gl.slot_covered_mask(cfg, e.value)
            assert e.tag == cfg.tag_slots - bin(self.covered).count("1")
        elif e.kind == K.LAYER_DONE:
            assert not any(self.pins.values()) and not self.pending


    def feed_all(self, events):
        """Feed a canonical list in execution order: the canonical order sorts
        a pass by expert, but the hardware does every expert's LOOKUP ..
        EXT_ERROR first (ascending expert), then the fills end, then pins go."""
        late = (K.FILL_END, K.UNPIN, K.INVALIDATE)
        group = []
        for e in list(events) + [Event(K.DECAY)]:
            if e.kind in esd.PASS_MEMBERS and group:
                group.append(e)
                continue
            if group:
                head, body = group[0], group[1:]
                for x in [head] + [x for x in body if x.kind not in late]:
                    self.feed(x)
                for kind in late:
                    for x in body:
                        if x.kind == kind:
                            self.feed(x)
                group = []
            if e.kind == K.PASS:
                group = [e]
            else:
                self.feed(e)


def _events_ok(run, cfg):
    sh = Shadow(cfg)
    sh.feed_all(run.events[:-0 or None])
    c = run.counters
    assert sh.bytes == {"hb": c["hb_bytes"], "lpddr": c["lpddr_bytes"]}
    count = lambda kind, **kw: sum(1 for e in run.events if e.kind == kind and
                                   all(getattr(e, f) == v for f, v in kw.items()))
    assert count(K.FILL_START) == c["fills"] + c["aborts"]
    assert count(K.FILL_END, code=FillEnd.COMMIT) == c["fills"]
    assert count(K.ALLOCATE, code=AllocResult.EVICT) == c["evictions"]
    assert count(K.DECAY) == c["decays"]
    assert sum(map(sum, run.accepted)) == c["accepted_tokens"]
    assert esd.canonical(run.events) == run.events        # the golden emits canonical order
    # draft selections only use eligible experts: every DRAFT lookup hits
    assert all(e.code == LookupResult.HIT for e in run.events
               if e.kind == K.LOOKUP and e.phase == Phase.DRAFT)


@pytest.mark.parametrize("name,batch", [("tiny", 1), ("tiny", 4), ("default", 4),
                                        ("default", 16)])
def test_synthetic_decode_properties(name, batch):
    # passes of 16 tokens: a step of up to 80 tokens is several passes (at
    # the default T = 80 a whole step is one pass, and at batch 16 every
    # verification touches every expert of its layer, see the controller
    # issue's residency policy)
    cfg = preset(name).replace(batch_tokens=min(16, preset(name).batch_tokens))
    rng = np.random.default_rng(7)
    R = esd.synthetic_trace(rng, requests=batch, tokens=400, layers=cfg.layers,
                            experts=cfg.experts)
    run = esd.run_trace(cfg.replace(kv_words_per_token=4), R, batch=batch, steps=300, seed=3)
    _events_ok(run, cfg.replace(kv_words_per_token=4))
    c = run.counters
    assert c["decode_steps"] >= 300
    if batch >= cfg.sd_threshold:
        assert c["rounds_sd"] > 0 and c["accepted_tokens"] > 0
    else:
        assert c["rounds_sd"] == 0
    assert c["hb_hits"] > 0 and c["evictions"] > 0
    assert c["hb_pending"] == 0                              # canonical runs never see PENDING


def test_kv_pressure_run_moves_both_ways():
    """A decode whose context crosses slots: KV moves up and down, slots are
    invalidated, some rounds back off, and the shadow tracker agrees."""
    cfg = preset("tiny")
    SW = cfg.slot_words
    free_top = cfg.hb_words - cfg.dense_words - cfg.tag_slots * SW
    # one context token per 4 KV words; requests up to ~2 slots deep into the experts
    cfg = cfg.replace(kv_words_per_token=max(1, (free_top + 6 * SW) // 400), min_free_slots=4)
    R = esd.synthetic_trace(np.random.default_rng(1), requests=4, tokens=500, layers=cfg.layers,
                            experts=cfg.experts)
    run = esd.run_trace(cfg, R, batch=4, steps=600, seed=5, prompt=(60, 120), length=(30, 120))
    _events_ok(run, cfg)
    c = run.counters
    reasons = [e.tag for e in run.events if e.kind == K.MODE]
    assert ModeReason.BACKOFF in reasons and ModeReason.SD in reasons
    assert c["kv_invalidations"] > 0
    mv = [e.value for e in run.events if e.kind == K.KV_MOVE]
    assert any(b < a for a, b in zip(mv, mv[1:])) and any(b > a for a, b in zip(mv, mv[1:]))


def test_faulty_run_recovers():
    cfg = preset("tiny")
    R = esd.synthetic_trace(np.random.default_rng(2), requests=4, tokens=300, layers=cfg.layers,
                            experts=cfg.experts)
    faults = {i: random.Random(i).choice([ExtError.SLVERR, ExtError.DECERR, ExtError.PROTOCOL])
              for i in range(5, 4000, 97)}
    run = esd.run_trace(cfg, R, batch=4, steps=300, seed=9, faults=faults)
    _events_ok(run, cfg)
    c = run.counters
    assert c["ext_errors"] == sum(1 for i in faults if i < run.controller.ext_reads)
    assert c["aborts"] > 0


# -- the canonical order -------------------------------------------------------------------

def _run_small(**kw):
    cfg = preset("tiny")
    R = esd.synthetic_trace(np.random.default_rng(4), requests=4, tokens=200, layers=cfg.layers,
                            experts=cfg.experts)
    return esd.run_trace(cfg, R, batch=4, steps=120, seed=4, **kw)


def _shuffle_within_passes(events, rng):
    """What the hardware may do: interleave the per-expert events of a pass
    (keeping each expert's own order) and the INVALIDATEs after a KV move."""
    out, i = [], 0
    while i < len(events):
        e = events[i]
        out.append(e)
        i += 1
        members = esd.PASS_MEMBERS if e.kind == K.PASS else \
            (K.INVALIDATE,) if e.kind == K.KV_MOVE else ()
        j = i
        while j < len(events) and events[j].kind in members:
            j += 1
        group = events[i:j]
        queues = {}
        for x in group:
            queues.setdefault(x.expert if e.kind == K.PASS else x.slot, []).append(x)
        keys = [kk for kk, q in queues.items() for _ in q]
        rng.shuffle(keys)
        out.extend(queues[kk].pop(0) for kk in keys)
        i = j
    return out


def test_canonical_order_absorbs_hardware_overlap():
    run = _run_small()
    rng = random.Random(0)
    hw = _shuffle_within_passes(run.events, rng)
    assert hw != run.events
    assert esd.compare(run.events, hw) is None


def test_comparison_fails_on_missing_extra_different_or_moved():
    evs = _run_small().events
    i = next(i for i, e in enumerate(evs) if e.kind == K.FILL_END)
    assert "missing" in esd.compare(evs, evs[:i] + evs[i + 1:]) or \
        "differs" in esd.compare(evs, evs[:i] + evs[i + 1:])
    assert esd.compare(evs, evs + [Event(K.DECAY)]).startswith("extra")
    j = next(i for i, e in enumerate(evs) if e.kind == K.ALLOCATE)
    bad = list(evs)
    bad[j] = Event(**{**{f: getattr(evs[j], f) for f in esd.EVENT_FIELDS}, "slot": evs[j].slot ^ 1})
    assert "differs" in esd.compare(evs, bad)
    # a pass member moved across its barrier (after LAYER_DONE) is a difference
    p = next(i for i, e in enumerate(evs) if e.kind == K.LAYER_DONE)
    moved = evs[:p - 1] + [evs[p], evs[p - 1]] + evs[p + 1:]
    assert esd.compare(evs, moved) is not None


@pytest.mark.parametrize("mutant", ["touch_verify", "order", "no_decay", "adapt", "tie", "decay"])
def test_mutants_are_caught(mutant):
    """Each planted policy bug changes the control sequence of an ordinary run."""
    good = _run_small()
    bad = _run_small(mutant=mutant)
    assert esd.compare(good.events, bad.events) is not None, mutant


# -- the synthetic trace -------------------------------------------------------------------

def test_synthetic_trace_locality():
    rng = np.random.default_rng(0)
    R = esd.synthetic_trace(rng, requests=2, tokens=2000, layers=2, experts=16, zipf=1.1,
                            reuse=0.6)
    assert R.shape == (2, 2000, 2, 16)
    assert (np.sort(R, axis=-1) == np.arange(16)).all()           # permutations
    same = (R[:, 1:, :, :2] == R[:, :-1, :, :2]).all(-1).mean()
    assert 0.45 < same < 0.8                                       # reuse across tokens
    top = np.bincount(R[:, :, 0, 0].ravel(), minlength=16)
    assert top.max() > 4 * np.median(top)                          # Zipf skew
    with pytest.raises(ValueError):
        esd.synthetic_trace(rng, requests=0, tokens=1, layers=1, experts=4)


def test_ranking_router_restricts_in_rank_order():
    r = RankingRouter([[5, 3, 1, 0, 2, 4]], 2)
    assert r(None) == [[5, 3]]
    assert r(0b000011) == [[1, 0]]
    assert r(0b000001) == [[0]]
    assert r(0) == [[]]


def test_announce_order_decides_victims():
    """Experts of a pass are handled heavy first (the datapath's announce
    order): expert 6, chosen by three tokens, takes the first free slot
    before expert 1, chosen by one."""
    cfg = TINY.replace(batch_tokens=4)
    assert esd.announce_order({1: 1, 6: 3, 3: 3}) == [3, 6, 1]
    c = EsdController(cfg.replace(sd_threshold=esd.MAX_BATCH))
    c.begin_round(3)
    c.layer_step(Phase.AR, 0, 0, fixed([[6, 1], [6], [6]]))
    al = {e.expert: e.slot for e in c.events if e.kind == K.ALLOCATE}
    assert al == {6: 0, 1: 1}
    lk = [e.expert for e in c.events if e.kind == K.LOOKUP]
    assert lk == [6, 1]
    bad = EsdController(cfg.replace(sd_threshold=esd.MAX_BATCH), mutant="order")
    bad.begin_round(3)
    bad.layer_step(Phase.AR, 0, 0, fixed([[6, 1], [6], [6]]))
    assert esd.compare(c.events, bad.events) is not None


def test_forced_modes():
    """The host may force AR (reason HOST) or SD below the threshold; a
    forced SD still backs off when the KV region crowds the cache."""
    cfg = TINY.replace(min_free_slots=3)
    c = EsdController(cfg)
    assert c.begin_round(1, Mode.SD) == (Mode.SD, cfg.draft_len_init)
    assert c.events[-1].tag == ModeReason.SD
    c = EsdController(cfg)
    assert c.begin_round(cfg.sd_threshold, Mode.AR) == (Mode.AR, 0)
    assert c.events[-1].tag == ModeReason.HOST
    c = EsdController(cfg)
    S, SW = cfg.tag_slots, cfg.slot_words
    c.context((cfg.hb_words - cfg.dense_words - S * SW + (S - 2) * SW) // cfg.kv_words_per_token)
    assert c.begin_round(1, Mode.SD) == (Mode.AR, 0)
    assert c.events[-1].tag == ModeReason.BACKOFF
    with pytest.raises(EsdHostError):
        EsdController(cfg).begin_round(1, 7)


def test_hb_cache_off_reads_lpddr_and_leaves_the_cache_alone():
    """An AR round with the HB expert cache off (force code 3, reason LPDDR):
    every expert of every pass from LPDDR with no lookup, fill or touch, so
    the tag unit's residency stays as it was (empty here); only a forced AR
    may turn the cache off."""
    cfg = TINY
    R = esd.synthetic_trace(np.random.default_rng(5), requests=2, tokens=200,
                            layers=cfg.layers, experts=cfg.experts)
    assert esd.force_code(Mode.AR, False) == 3 and esd.force_code(None) == 0
    for force in (None, Mode.SD):
        with pytest.raises(EsdHostError) as ex:
            EsdController(cfg).begin_round(2, force, hb_cache=False)
        assert ex.value.code == HostError.BAD_BATCH
    run = esd.run_trace(cfg, R, batch=2, steps=30, seed=5, force=Mode.AR, hb_cache=False)
    assert all(e["force"] == 3 for e in run.script if e["op"] == "ROUND")
    kinds = [K(e.kind) for e in run.events]
    assert K.SOURCE in kinds and not {K.LOOKUP, K.ALLOCATE, K.FILL_START, K.TOUCH,
                                      K.UNPIN} & set(kinds)
    srcs = [e for e in run.events if e.kind == K.SOURCE]
    assert all(e.code == esd.Source.LPDDR and e.slot == 0 for e in srcs)
    n = cfg.planes
    assert run.counters["lpddr_bytes"] == len(srcs) * n * (cfg.expert_bytes // n)
    assert run.counters["hb_bytes"] == run.counters["hb_hits"] == run.counters["fills"] == 0
    # the cache is untouched: residency after the cache-off rounds is the start's (empty)
    assert all(run.controller.resident_mask(l) == 0 for l in range(cfg.layers))


def test_refused_commands_leave_the_sequence_alone():
    """A decode with refused commands sprinkled in (every host-caused error
    code) has the same events and counters as the same decode without them."""
    cfg = TINY
    R = esd.synthetic_trace(np.random.default_rng(3), requests=4, tokens=300,
                            layers=cfg.layers, experts=cfg.experts)
    # the injections draw from the host's generator, so compare with a replay of
    # the legal commands of the same run
    run = esd.run_trace(cfg, R, batch=4, steps=60, seed=3, bad=0.3, check=False)
    codes = {e["refused"] for e in run.script if "refused" in e}
    assert codes >= {1, 2, 3, 4, 5}
    c = EsdController(cfg)
    for e in run.script:
        if "refused" in e:
            continue
        if e["op"] == "ROUND":
            c.begin_round(e["value"])
        elif e["op"] == "STEP":
            c.layer_step(e["phase"], e["step"], e["layer"],
                         RankingRouter(e["rankings"], cfg.top_k))
        elif e["op"] == "ACCEPT":
            c.accept(e["value"])
        else:
            c.context(e["value"])
    assert esd.compare(run.events, c.events) is None and c.counters == run.counters


# -- prefetch during drafts (golden only: the RTL does not build it yet) -------------------

def ranked(full):
    """A route callable from per-token rankings (best first): ``route(None)``
    their top-k, ``route(mask)`` the top-k of the eligible ones."""
    return RankingRouter([r for r in full], TINY.top_k)


def _warm_then_sd(c, experts=(0, 1)):
    """An AR round that makes ``experts`` resident in every layer, then an SD round."""
    c.begin_round(1, Mode.AR)
    for l in range(TINY.layers):
        c.layer_step(Phase.AR, 0, l, fixed([list(experts)]))
    return c.begin_round(1, Mode.SD)


def test_prefetch_exact_sequence():
    """Batch 1, experts 0 and 1 resident. The draft token ranks 2, 0, 1, ...
    (2 not eligible): it drafts with 0 and 1, and after its pass 2 is
    prefetched (PREFETCH, LOOKUP miss, ALLOCATE, FILL_START, SOURCE
    PREFETCH). The second draft step's token ranks 2 first again: its lookup
    finds the prefetch PENDING (no second fill). Before the VERIFY step of
    layer 0 the prefetch retires (PREFETCH_END, FILL_END COMMIT, UNPIN) and
    the verification hits it: SPLIT, a prefetch hit, no fill."""
    cfg = TINY
    c = EsdController(cfg, prefetch=2)
    mode, kd = _warm_then_sd(c)
    assert mode == Mode.SD and kd == 2
    rank = [2, 0, 1, 3, 4, 5, 6, 7]
    other = [0, 1, 2, 3, 4, 5, 6, 7]
    m = (1 << cfg.hb_planes_eff) - 1
    start = len(c.events)
    c.layer_step(Phase.DRAFT, 0, 0, ranked([rank]))
    P = dict(phase=Phase.DRAFT, step=0, layer=0, pass_no=0)
    free = 4                                         # slots 0-3: experts 0, 1 of both layers
    exp = [Event(K.ELIGIBLE, phase=Phase.DRAFT, value=0b11), Event(K.PASS, **P, value=1)]
    for e, slot in ((0, 0), (1, 1)):
        exp += [Event(K.LOOKUP, **P, expert=e, code=LookupResult.HIT, slot=slot, value=1),
                Event(K.SOURCE, **P, expert=e, slot=slot, code=Source.HB, value=m),
                Event(K.TOUCH, **P, expert=e, slot=slot, value=1),
                Event(K.UNPIN, **P, expert=e, slot=slot)]
    exp += [Event(K.PREFETCH, **P, value=1),
            Event(K.LOOKUP, **P, expert=2, code=LookupResult.MISS, value=1),
            Event(K.ALLOCATE, **P, expert=2, slot=free, code=AllocResult.FREE, value=1),
            Event(K.FILL_START, **P, expert=2, slot=free, value=m),
            Event(K.SOURCE, **P, expert=2, slot=free, code=Source.PREFETCH),
            Event(K.LAYER_DONE, phase=Phase.DRAFT)]
    assert esd.compare(exp, c.events[start:]) is None, esd.compare(exp, c.events[start:])
    assert c.counters["lpddr_bytes"] - 4 * cfg.expert_bytes == m.bit_count() * cfg.expert_bytes // cfg.planes
    c.layer_step(Phase.DRAFT, 0, 1, ranked([other]))        # layer 1: nothing to prefetch
    start = len(c.events)
    c.layer_step(Phase.DRAFT, 1, 0, ranked([rank]))
    pf = [e for e in c.events[start:] if e.kind in (K.PREFETCH, K.LOOKUP) and e.expert == 2
          or e.kind == K.PREFETCH]
    assert [(K(e.kind), e.code) for e in pf] == [(K.PREFETCH, 0), (K.LOOKUP, LookupResult.PENDING)]
    assert not any(e.kind == K.ALLOCATE for e in c.events[start:])
    c.check_invariants()                             # the outstanding prefetch is allowed
    c.layer_step(Phase.DRAFT, 1, 1, ranked([other]))
    start = len(c.events)
    c.layer_step(Phase.VERIFY, 0, 0, ranked([rank] * (kd + 1)))
    V = dict(phase=Phase.VERIFY, step=0, layer=0, pass_no=0)
    got = c.events[start:]
    head = [Event(K.PREFETCH_END, value=1),
            Event(K.FILL_END, **P, expert=2, slot=free, code=FillEnd.COMMIT),
            Event(K.UNPIN, **P, expert=2, slot=free), Event(K.PASS, **V, value=3)]
    assert esd.compare(head, got[:4]) is None, esd.compare(head, got[:4])
    hit2 = [e for e in got if e.kind == K.LOOKUP and e.expert == 2]
    assert hit2 and hit2[0].code == LookupResult.HIT and hit2[0].slot == free
    assert not any(e.kind == K.FILL_START for e in got)
    assert c.prefetch_counts == {"prefetch_lookups": 2, "prefetches": 1, "prefetch_hits": 1}
    c.layer_step(Phase.VERIFY, 0, 1, ranked([other] * (kd + 1)))
    c.accept(0)
    c.check_invariants()


def test_prefetch_candidate_rule_and_mutant():
    """A token's candidate is the best-ranked non-eligible expert of its
    unrestricted top-k; none when its whole top-k is eligible. The
    ``prefetch_last`` mutant (the lowest-ranked one) changes the events of a
    decode, so the comparison catches a wrong rule."""
    c = EsdController(TINY, prefetch=4)
    assert c.candidates([[5, 3], [3, 0], [0, 1], [6, 0]], mask=0b11) == {5: 1, 3: 1, 6: 1}
    assert c.candidates([[0, 1]], mask=0b11) == {}
    mut = EsdController(TINY, prefetch=4, mutant="prefetch_last")
    assert mut.candidates([[5, 3]], mask=0b11) == {3: 1}
    R = esd.synthetic_trace(np.random.default_rng(8), requests=4, tokens=300,
                            layers=TINY.layers, experts=TINY.experts)
    good = esd.run_trace(TINY, R, batch=4, steps=40, seed=8, force=Mode.SD, prefetch=4)
    bad = esd.run_trace(TINY, R, batch=4, steps=40, seed=8, force=Mode.SD, prefetch=4,
                        mutant="prefetch_last")
    assert esd.compare(good.events, bad.events) is not None


@pytest.mark.parametrize("depth", [1, 3, 8])
def test_prefetch_properties_on_long_decodes(depth):
    """Long decodes at batch 1, 4 and 16 with KV moves mid-round: the
    invariants hold after every step, never more than ``depth`` prefetches
    outstanding, every prefetch retired exactly once (COMMIT or ABORT), the
    events canonical, and the verification hits prefetched experts; with
    ``prefetch=0`` no prefetch event at all (the RTL's sequence)."""
    cfg = preset("default")
    R = esd.synthetic_trace(np.random.default_rng(11), requests=16, tokens=400,
                            layers=cfg.layers, experts=cfg.experts)
    for B in (1, 4, 16):
        run = esd.run_trace(cfg, R, batch=B, steps=40, seed=B, force=Mode.SD, prefetch=depth)
        ev = run.events
        assert esd.canonical(ev) == ev
        out, issued, retired = 0, 0, 0
        for e in ev:
            if e.kind == K.SOURCE and e.code == Source.PREFETCH:
                out += 1
                issued += 1
                assert out <= depth
            elif e.kind == K.PREFETCH_END:
                out -= e.value
                retired += e.value
                assert out >= 0
        assert issued == retired + out == run.controller.prefetch_counts["prefetches"] > 0
        assert run.controller.prefetch_counts["prefetch_hits"] > 0
        plain = esd.run_trace(cfg, R, batch=B, steps=40, seed=B, force=Mode.SD)
        assert not {K.PREFETCH, K.PREFETCH_END} & {K(e.kind) for e in plain.events}


def test_prefetch_fault_spoils_nothing():
    """An LPDDR error on a prefetch read: at the barrier EXT_ERROR, FILL_END
    ABORT and INVALIDATE ABORT; the expert is not resident, the layer step is
    not an error, and the verification misses it and reads it from LPDDR."""
    cfg = TINY
    c = EsdController(cfg, prefetch=2, faults={0: ExtError.SLVERR})   # the first LPDDR read
    c.begin_round(1, Mode.AR)
    c.ext_reads = 0
    for l in range(cfg.layers):
        c.faults = {}
        c.layer_step(Phase.AR, 0, l, fixed([[0, 1]]))
    c.faults = {c.ext_reads: ExtError.SLVERR}                       # the prefetch's read
    c.begin_round(1, Mode.SD)
    rank = [2, 0, 1, 3, 4, 5, 6, 7]
    res = c.layer_step(Phase.DRAFT, 0, 0, ranked([rank]))
    assert not res.error
    for j, l in ((0, 1), (1, 0), (1, 1)):
        c.layer_step(Phase.DRAFT, j, l, ranked([[0, 1, 2, 3, 4, 5, 6, 7]]))
    start = len(c.events)
    res = c.layer_step(Phase.VERIFY, 0, 0, ranked([rank] * 3))
    got = c.events[start:]
    kinds = [(K(e.kind), e.code) for e in got[:4]]
    assert kinds == [(K.PREFETCH_END, 0), (K.EXT_ERROR, 0), (K.FILL_END, FillEnd.ABORT),
                     (K.INVALIDATE, InvalidateReason.ABORT)]
    assert got[1].value == ExtError.SLVERR and not res.error
    look2 = [e for e in got if e.kind == K.LOOKUP and e.expert == 2]
    assert look2[0].code == LookupResult.MISS
    src2 = [e for e in got if e.kind == K.SOURCE and e.expert == 2]
    assert src2[0].code == Source.LPDDR
    assert c.counters["ext_errors"] == 1 and c.prefetch_counts["prefetch_hits"] == 0
    c.check_invariants()


def test_prefetch_retires_before_a_kv_move_and_checks_its_depth():
    """A KV move mid-round first retires every outstanding prefetch; the
    depth must be 0 .. tag_slots."""
    cfg = TINY
    c = EsdController(cfg, prefetch=2)
    _warm_then_sd(c)
    c.layer_step(Phase.DRAFT, 0, 0, ranked([[2, 0, 1, 3, 4, 5, 6, 7]]))
    assert len(c.prefetching) == 1
    c.context(1)
    i = next(i for i, e in enumerate(c.events) if e.kind == K.PREFETCH_END)
    assert [K(e.kind) for e in c.events[i:i + 4]] == [K.PREFETCH_END, K.FILL_END, K.UNPIN,
                                                       K.KV_MOVE]
    assert not c.prefetching
    c.check_invariants()
    for bad in (-1, cfg.tag_slots + 1):
        with pytest.raises(ValueError, match="Prefetch depth"):
            EsdController(cfg, prefetch=bad)


def test_in_prefetch_retirement_marks_only_the_retirements():
    """A prefetch's retirement events (after PREFETCH_END) are told from a
    pass's: an EXT_ERROR after PREFETCH_END is one, the same kinds after a
    PASS are not."""
    ev = [Event(k) for k in (K.PASS, K.EXT_ERROR, K.FILL_END, K.PREFETCH_END, K.EXT_ERROR,
                             K.FILL_END, K.INVALIDATE, K.PASS, K.EXT_ERROR)]
    assert esd.in_prefetch_retirement(ev) == [False, False, False, False, True, True, True,
                                               False, False]

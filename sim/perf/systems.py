"""The systems compared and the engine that runs one (system, model, batch) point.

Every system's assumptions live in ``data/systems.json`` (with sources);
this module turns them into byte, MAC and time counts per decode step (AR)
or per draft+verify iteration (speculative decoding), replaying a routing
trace through the system's expert cache.

Time model (per step / phase)
-----------------------------
``t = max(HB bytes / HB bandwidth, LPDDR bytes / min(LPDDR, stream link),
MACs / MAC rate)`` - HB reads (and fills), external streaming and compute
overlap (the paper's execution engine streams hits and misses in parallel).
Phases are sequential: an SD iteration is ``K`` draft steps then one
verification. Not modelled: the 32 GB/s aggregation link, rollback cost,
prefill, and per-layer synchronisation.

Energy per token: ``bytes * 8 * pJ/bit`` per memory (HB read/write, LPDDR,
in-DRAM for PIM/NMP), ``MACs * pJ/MAC`` (DRAFT MACs cost
``draft_cycle_ratio`` of a FULL one: one slice plane instead of two),
on-chip SRAM staging of every weight byte, plus static power * time.

ELMoE-3D's cache driver (golden tag unit)
-----------------------------------------
*AR*: whole experts (all planes); per step and layer a LOOKUP for every
expert of the batch's union, ALLOCATE on a miss (initial hotness
``max(tokens * ar_touch_scale, ar_alloc_hot)``), TOUCH on a hit with
``tokens * ar_touch_scale``, PIN while the layer runs, DECAY every
``decay_period_ar`` steps. *Elastic-SD*: MSB slices (all planes when every
routed expert fits); drafting TOUCHes resident experts with their draft
routing counts (hotness = draft routing, as in the paper) and measures the
overlap that sets acceptance; verification LOOKUPs the true union of
B*(K+1) tokens, ALLOCATEs (the MSB fill) on a miss with hotness = tokens
routed, PINs per layer; one DECAY per iteration. ``policy="random"``
preloads a random resident set and never fills (the ablation). Batch
threshold ``"auto"`` runs both modes and keeps the faster.

Sampling
--------
Analytic systems (xPU, PIM, NMP) use every MoE layer of the trace. Cache
systems replay ``sample_layers`` evenly spaced MoE layers (always including
the first MoE layer, where routing is broadest) with the cache capacity
scaled by ``sampled / all`` MoE layers, and scale their expert bytes by
``all / sampled``; per-layer miss rates are reported for the sampled layers
only. The first ``warmup_steps`` decode steps fill the caches and are not
counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .acceptance import AcceptanceModel, sample_accepted, PRECISIONS, POLICIES
from .cache import CacheStats, LRUCache, TagCache
from .hardware import Hardware
from .models import DATA, ModelShape
from .traces import Trace, generate

__all__ = ["SYSTEMS", "PRIOR", "load_systems", "Workload", "run_system", "RunResult"]

SYSTEMS = ("xPU", "xPU-PIM", "xPU-NMP", "HB-xPU", "SD-EAGLE", "SD-Q4", "ELMoE-3D")
#: The "best prior accelerator" of the paper's comparison.
PRIOR = ("xPU-PIM", "xPU-NMP", "HB-xPU")


@lru_cache(maxsize=4)
def load_systems(path: str | None = None) -> dict:
    p = Path(path) if path else DATA / "systems.json"
    return json.loads(p.read_text())


_SYNTH: dict = {}


def _synthetic(model: ModelShape, requests: int, steps: int, seed: int) -> Trace:
    """The model's synthetic trace (memoised: every system of a grid point sees the same one)."""
    key = (model.name, model.layers, model.experts, model.top_k, model.dense_layers,
           json.dumps(model.locality, sort_keys=True), requests, steps, seed)
    if key not in _SYNTH:
        if len(_SYNTH) > 16:
            _SYNTH.clear()
        _SYNTH[key] = generate(model.layers, model.experts, model.top_k, requests=requests,
                               steps=steps, dense_layers=model.dense_layers, seed=seed,
                               model=model.name, **model.locality)
    return _SYNTH[key]


def _check_pos_int(what, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{what} must be an integer >= {lo}, not {v!r}")
    return int(v)


class Workload:
    """One (model, hardware, batch, context) point with its routing streams.

    Raises
    ------
    ValueError
        Batch < 1, context < 1, HB smaller than the model's dense weights, or a
        trace without enough tokens.
    """

    def __init__(self, model: ModelShape, hw: Hardware, batch: int, context: int | None = None,
                 trace: Trace | None = None, common: dict | None = None):
        common = dict(load_systems()["common"], **(common or {}))
        self.model, self.hw = model, hw
        self.batch = _check_pos_int("Batch", batch)
        self.context = _check_pos_int("Context", common["context"] if context is None else context)
        self.common = common
        self.notes: list[str] = []
        if model.dense_bytes > hw.hb_bytes:
            raise ValueError(f"HB capacity {hw.hb_gb:g} GB is smaller than the dense weights of "
                             f"{model.name} ({model.dense_bytes / 2**30:.2f} GB)")
        steps = int(common["steps"])
        if trace is None:
            tr = _synthetic(model, max(int(common["requests"]), self.batch), steps, int(common["seed"]))
            self.trace_source = "synthetic"
        else:
            tr = trace
            self.trace_source = trace.meta.get("source", "file")
        s = tr.streams(self.batch, steps)                       # (B, S, Lt, kt)
        if s.shape[1] < 8:
            raise ValueError(f"Trace gives only {s.shape[1]} decode steps per stream at batch "
                             f"{self.batch}; need >= 8")
        self.streams = self._map_layers(s, tr)
        self.steps = self.streams.shape[1]
        self.warmup = min(int(common["warmup_steps"]), self.steps // 4)
        moe = model.moe_layers
        self.moe = moe
        n = min(int(common["sample_layers"]), len(moe))
        pick = np.unique(np.round(np.linspace(0, len(moe) - 1, n)).astype(int))
        self.sampled = [moe[i] for i in pick]
        self.scale = len(moe) / len(self.sampled)
        self.kv_total = self.batch * model.kv_bytes(self.context, hw.kv_bytes)
        self.macs_per_token = model.active_params + model.attention_ops(self.context) // 2
        # tokens per expert per step over all MoE layers: (S, nMoE, E)
        S = self.steps
        cnt = np.zeros((S, len(moe), model.experts), np.int32)
        ex = self.streams[:, :, moe, :]                          # (B, S, nMoE, k)
        valid = ex >= 0
        bi, si, li, ki = np.nonzero(valid)
        np.add.at(cnt, (si, li, ex[bi, si, li, ki]), 1)
        self.counts = cnt
        self.union = (cnt > 0).sum(axis=2)                      # (S, nMoE)

    def _map_layers(self, s, tr: Trace):
        """Map a trace onto the model's layers (identity when the shapes agree)."""
        m = self.model
        L, E, k = m.layers, m.experts, m.top_k
        if tr.layers == L and tr.num_experts <= E:
            if tr.num_experts < E or tr.top_k != k:
                self.notes.append(f"trace has {tr.num_experts} experts/top-{tr.top_k} vs model "
                                  f"{E}/top-{k}; ids used as is")
            out = s.copy()
            out[:, :, list(m.dense_layers), :] = -1
            return out
        if tr.num_experts > E:
            raise ValueError(f"Trace has {tr.num_experts} experts per layer, more than "
                             f"{m.name}'s {E}")
        # proportional layer mapping: MoE layer j of the model <- trace layer with a routed expert
        tl = [l for l in range(tr.layers) if (s[:, :, l, :] >= 0).any()] or list(range(tr.layers))
        out = np.full(s.shape[:2] + (L, s.shape[3]), -1, np.int32)
        moe = m.moe_layers
        for j, l in enumerate(moe):
            out[:, :, l, :] = s[:, :, tl[j * len(tl) // len(moe)], :]
        self.notes.append(f"trace layers ({tr.layers}) mapped proportionally onto {len(moe)} MoE layers")
        if tr.num_experts < E or tr.top_k != k:
            self.notes.append(f"trace has {tr.num_experts} experts/top-{tr.top_k} vs model {E}/top-{k}")
        return out

    # -- HB budget --------------------------------------------------------------
    def hb_split(self, extra_dense: float = 0.0) -> tuple[float, float, float]:
        """``(kv_in_hb, kv_in_lpddr, expert_cache_bytes)``; KV has priority over the cache."""
        free = self.hw.hb_bytes - self.model.dense_bytes - extra_dense
        if free < 0:
            raise ValueError(f"HB capacity {self.hw.hb_gb:g} GB is smaller than the dense weights "
                             f"(+ draft) of {self.model.name} ({(self.model.dense_bytes + extra_dense) / 2**30:.2f} GB)")
        kv_hb = min(self.kv_total, free)
        return kv_hb, self.kv_total - kv_hb, free - kv_hb

    def slots(self, cache_bytes: float, unit_bytes: float) -> int:
        """Cache entries of ``unit_bytes`` for the sampled layers."""
        return int(cache_bytes // unit_bytes * len(self.sampled) / len(self.moe))


@dataclass
class RunResult:
    system: str
    model: str
    batch: int
    hb_gb: float
    context: int
    mode: str
    tokens_per_s: float
    energy_per_token_mj: float
    bytes_per_token: dict
    energy_breakdown_mj: dict
    cache: dict | None = None
    acceptance: dict | None = None
    notes: list = field(default_factory=list)
    alternative: dict | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class _Acc:
    """Byte / MAC / time accumulator."""

    def __init__(self):
        self.hb = self.hbw = self.lp = self.near = 0.0
        self.macs = self.dmacs = self.time = 0.0
        self.tokens = 0
        self.near_pj = 0.0

    def phase(self, hw: Hardware, hb=0.0, hbw=0.0, lp=0.0, macs=0.0, dmacs=0.0, t_extra=0.0,
              lp_bw=None):
        t = max((hb + hbw) / hw.hb_bw, lp / (lp_bw or hw.ext_bw),
                macs / hw.int8_macs_per_s + dmacs / hw.draft_macs_per_s, t_extra)
        self.hb += hb; self.hbw += hbw; self.lp += lp
        self.macs += macs; self.dmacs += dmacs; self.time += t
        return t


def _finish(sysname, w: Workload, acc: _Acc, mode, cache=None, accept=None, notes=()) -> RunResult:
    hw, n = w.hw, max(acc.tokens, 1)
    pj = dict(
        hb=acc.hb * 8 * hw.hb_pj_per_bit + acc.hbw * 8 * hw.hb_write_pj_per_bit,
        lpddr=acc.lp * 8 * hw.lpddr_pj_per_bit,
        near_memory=acc.near_pj,
        compute=acc.macs * hw.mac_pj + acc.dmacs * hw.mac_pj * hw.rtl["draft_cycle_ratio"],
        sram=(acc.hb + acc.lp + acc.near) * 8 * hw.sram_pj_per_bit,
        static=hw.static_w * acc.time * 1e12,
    )
    e_mj = {k: v / n * 1e-9 for k, v in pj.items()}
    return RunResult(
        system=sysname, model=w.model.name, batch=w.batch, hb_gb=hw.hb_gb, context=w.context,
        mode=mode, tokens_per_s=n / acc.time, energy_per_token_mj=sum(e_mj.values()),
        bytes_per_token=dict(hb_read=acc.hb / n, hb_write=acc.hbw / n, lpddr=acc.lp / n,
                             near_memory=acc.near / n),
        energy_breakdown_mj=e_mj, cache=cache, acceptance=accept, notes=list(w.notes) + list(notes))


# -- analytic AR systems -----------------------------------------------------------

def _run_xpu(w: Workload, spec: dict) -> RunResult:
    m, hw, acc = w.model, w.hw, _Acc()
    bw = hw.lpddr_bw_gbs * 1e9
    for s in range(w.warmup, w.steps):
        lp = m.streamed_dense_params * m.weight_bytes + w.union[s].sum() * m.expert_bytes + w.kv_total
        acc.phase(hw, lp=lp, macs=w.batch * w.macs_per_token, lp_bw=bw)
        acc.tokens += w.batch
    return _finish("xPU", w, acc, "AR", cache=_ws(w))


def _ws(w: Workload) -> dict:
    u = w.union[w.warmup:]
    return dict(working_set_experts=float(u.sum(axis=1).mean()),
                working_set_gb=float(u.sum(axis=1).mean() * w.model.expert_bytes / 2**30))


def _run_near(w: Workload, spec: dict, kind: str) -> RunResult:
    """PIM / NMP: each weight block runs near memory or on the xPU, whichever is faster."""
    m, hw, acc = w.model, w.hw, _Acc()
    bw = hw.lpddr_bw_gbs * 1e9
    ibw = bw * float(spec["internal_bw_mult"])
    near_pj = float(spec["pim_pj_per_bit" if kind == "pim" else "nmp_pj_per_bit"])
    xpu_rate = hw.int8_macs_per_s

    def near_time(W, n):
        if kind == "pim":
            return W * np.ceil(n / float(spec["pim_tokens_per_read"])) / ibw
        return np.maximum(W / ibw, n * W / m.weight_bytes / (float(spec["nmp_tops"]) * 1e12 / 2))

    def xpu_time(W, n):
        return np.maximum(W / bw, n * W / m.weight_bytes / xpu_rate)

    dense = m.streamed_dense_params * m.weight_bytes
    for s in range(w.warmup, w.steps):
        n = w.counts[s][w.counts[s] > 0].astype(np.float64)
        W = float(m.expert_bytes)
        tn, tx = near_time(W, n), xpu_time(W, n)
        use_near = tn < tx
        dn, dx = near_time(dense, w.batch), xpu_time(dense, w.batch)
        t = float(np.where(use_near, tn, tx).sum()) + float(min(dn, dx)) + w.kv_total / bw
        near_bytes = W * use_near.sum() + (dense if dn < dx else 0.0)
        lp_bytes = W * (~use_near).sum() + (0.0 if dn < dx else dense) + w.kv_total
        acc.lp += lp_bytes
        acc.near += near_bytes
        acc.near_pj += near_bytes * 8 * near_pj
        acc.macs += w.batch * w.macs_per_token
        acc.time += t
        acc.tokens += w.batch
    name = "xPU-PIM" if kind == "pim" else "xPU-NMP"
    return _finish(name, w, acc, "AR", cache=_ws(w))


# -- cache systems -------------------------------------------------------------------

def _cache_summary(stats: CacheStats, capacity: int, w: Workload, unit_bytes: float,
                   policy: str) -> dict:
    bel = stats.belady_hit_rate(capacity)
    u = np.array(stats.union_sizes, np.float64) if stats.union_sizes else np.zeros(1)
    return dict(policy=policy, hit_rate=round(stats.hit_rate, 4), belady_hit_rate=round(bel, 4),
                lookups=int(stats.lookups.sum()), capacity_entries_sampled=capacity,
                capacity_gb=capacity * unit_bytes * w.scale / 2**30,
                sampled_layers=list(w.sampled),
                per_layer_miss_rate=stats.per_layer_miss(),
                lookup_set_experts=float(u.mean() * len(w.moe)))


def _ar_cached(w: Workload, name: str, policy: str, spec: dict) -> RunResult:
    """AR with an HB cache of whole INT8 experts: LRU (HB-xPU) or the tag unit (ELMoE-3D)."""
    m, hw, acc = w.model, w.hw, _Acc()
    kv_hb, kv_lp, cache_bytes = w.hb_split()
    E = m.expert_bytes
    cap = w.slots(cache_bytes, E)
    nL = len(w.sampled)
    stats = CacheStats(nL)
    if policy == "lru":
        lru = LRUCache(cap)
    else:
        tc = TagCache(min(cap, 4096), nL, m.experts, spec.get("hot_bits", 8), spec.get("decay_shift", 2)) \
            if cap >= 2 else None
        cap = min(cap, 4096)
    dense = m.streamed_dense_params * m.weight_bytes
    for s in range(w.steps):
        count = s >= w.warmup
        hb = dense + kv_hb
        lp = kv_lp
        hbw = 0.0
        for li, l in enumerate(w.sampled):
            c = w.counts[s, w.moe.index(l)]
            ids = np.flatnonzero(c)
            if count:
                stats.union_sizes.append(len(ids))
            for e in ids.tolist():
                if policy == "lru":
                    hit = lru.access((li, e))
                    filled = not hit and cap > 0
                elif tc is not None:
                    tag = tc.tag(li, e)
                    amount = int(c[e]) * int(spec.get("ar_touch_scale", 8))
                    hit, filled = tc.access(tag, planes=hw.planes,
                                            hot=max(amount, int(spec.get("ar_alloc_hot", 0))))
                    if hit:                       # AR: hotness from the true routing
                        tc.touch(tag, amount)
                else:
                    hit, filled = False, False
                stats.record(li, (li, e), hit, count)
                if hit:
                    hb += E * w.scale
                else:
                    lp += E * w.scale
                    hbw += E * w.scale if filled else 0.0
            if policy != "lru" and tc is not None:
                tc.release()
        if policy != "lru" and tc is not None and (s + 1) % int(spec.get("decay_period_ar", 8)) == 0:
            tc.decay()
        if count:
            acc.phase(hw, hb=hb, hbw=hbw, lp=lp, macs=w.batch * w.macs_per_token)
            acc.tokens += w.batch
    cache = _cache_summary(stats, cap, w, E, "lru" if policy == "lru" else "tag-unit (hotness)")
    cache.update(_ws(w))
    return _finish(name, w, acc, "AR", cache=cache)


def _sd_loop(w: Workload, K: int, draft_fn, verify_fn, accept_fn, rng):
    """Shared SD iteration loop: each request's trace cursor advances by its
    accepted drafts + 1; iterations whose slowest request is still in the
    warm-up are replayed but not counted. Stops when a request runs out of trace."""
    B, S = w.batch, w.steps
    pos = np.zeros(B, np.int64)
    iters = []
    while pos.max() + K + 1 <= S:
        count = pos.min() >= w.warmup
        win = w.streams[np.arange(B)[:, None], pos[:, None] + np.arange(K + 1)[None, :]]   # (B,K+1,L,k)
        d = draft_fn(win[:, :K], count)
        v = verify_fn(win, count)
        a = accept_fn(d)
        n = sample_accepted(a, K, rng)
        pos += n + 1
        if count:
            iters.append((d, v, a, n))
    return iters


def _run_sd(w: Workload, name: str, spec: dict, accm: AcceptanceModel, *, policy="hotness",
            precision="augmented", K=None, seed=0) -> RunResult:
    """SD systems: ELMoE-3D (Elastic-SD), SD-EAGLE and SD-Q4."""
    m, hw, acc = w.model, w.hw, _Acc()
    kind = spec["kind"]
    K = int(K or spec.get("draft_len", 4))
    rng = np.random.default_rng(seed)
    E = m.expert_bytes
    planes = hw.planes
    msb = E / planes
    lsb = E - msb
    dense = m.streamed_dense_params * m.weight_bytes
    nL = len(w.sampled)
    stats = CacheStats(nL)
    extra_dense = 0.0
    if kind == "sd_eagle":
        head = m.attention_params() + 3 * m.hidden * int(spec.get("head_ffn_mult", 4)) * m.hidden
        extra_dense = head * m.weight_bytes
    elif kind == "sd_q4":
        extra_dense = m.dense_bytes / 2
    kv_hb, kv_lp, cache_bytes = w.hb_split(extra_dense)
    notes = []
    # cache per system
    if kind == "elmoe":
        # Resident planes: MSB slices only (the Elastic-SD design), unless every
        # routed expert fits whole, then all planes (no LSB traffic at all).
        fits = cache_bytes >= len(w.moe) * m.experts * E
        res_planes = planes if fits or spec.get("resident_planes") == "full" else 1
        if fits:
            notes.append("whole model fits in the expert cache: all planes resident")
        elif res_planes == planes:
            notes.append("resident_planes=full: whole experts resident (ablation)")
        msb = E * res_planes / planes
        lsb = E - msb
        cap = w.slots(cache_bytes, msb)
        if cap < max(2, nL):               # not even one resident expert per layer: no draft model
            raise _BackOff(f"expert cache holds only {cap} MSB slices on {nL} sampled layers")
        tc = TagCache(min(cap, 4096), nL, m.experts, spec.get("hot_bits", 8), spec.get("decay_shift", 2))
        if cap > 4096:
            notes.append(f"tag-unit slots capped at 4096 (needed {cap})")
        cap = tc.slots
        if policy == "random":
            prng = np.random.default_rng(seed + 1)
            allt = [tc.tag(li, e) for li in range(nL) for e in range(m.experts)]
            prng.shuffle(allt)
            tc.preload(allt, res_planes)
        unit = msb
    else:
        unit = E / 2                                   # LRU capacity in half-expert units
        cap = w.slots(cache_bytes, unit)
        lru = LRUCache(cap)
    precision = precision if kind == "elmoe" else ("rtn4" if kind == "sd_q4" else "full")
    resident_fraction = None

    def draft(win, count):
        """win: (B, K, L, k) true routing of the draft positions; returns per-request overlap and bytes."""
        B = win.shape[0]
        ov = np.ones(B)
        hb = hbw = lp = 0.0
        if kind == "elmoe":
            mask = np.zeros((nL, m.experts), bool)
            for t in tc.tu._where:
                l, e = tc.tu.split_tag(t)
                mask[l, e] = True
            ex = win[:, :, w.sampled, :]                                  # (B, K, nL, k)
            valid = ex >= 0
            res = np.where(valid, mask[np.arange(nL)[None, None, :, None], np.maximum(ex, 0)], False)
            ov = res.sum(axis=(1, 2, 3)) / np.maximum(valid.sum(axis=(1, 2, 3)), 1)
            # hotness: one TOUCH per resident expert with its draft routing count
            for li in range(nL):
                ids, cnt = np.unique(ex[:, :, li][res[:, :, li]], return_counts=True)
                for e, c in zip(ids.tolist(), cnt.tolist()):
                    tc.touch(tc.tag(li, e), c)
            # bytes per draft step (upper bound: each non-resident pick is substituted by a
            # distinct resident expert)
            for j in range(win.shape[1]):
                u = 0
                for li in range(nL):
                    u += len(np.unique(ex[:, j, li][valid[:, j, li]]))
                hb += dense / planes + u * (E / planes) * w.scale + kv_hb
                lp += kv_lp
            return dict(overlap=ov, hb=hb, hbw=0.0, lp=lp)
        if kind == "sd_eagle":
            for j in range(win.shape[1]):
                hb += extra_dense + m.lm_head_params * m.weight_bytes + \
                    B * w.context * m.kv_values_per_token_layer() * hw.kv_bytes
            return dict(overlap=ov, hb=hb, hbw=0.0, lp=0.0)
        # sd_q4: the 4-bit copy routes like the target; its experts share the LRU (half size)
        ex = win[:, :, w.sampled, :]
        for j in range(win.shape[1]):
            hb += dense / 2 + kv_hb
            lp += kv_lp
            for li in range(nL):
                for e in np.unique(ex[:, j, li][ex[:, j, li] >= 0]).tolist():
                    hit = lru.access(("q", li, e), 1)
                    if hit:
                        hb += msb * w.scale
                    else:
                        lp += msb * w.scale
                        hbw += msb * w.scale
        return dict(overlap=ov, hb=hb, hbw=hbw, lp=lp)

    def verify(win, count):
        hb = dense + kv_hb
        lp = kv_lp
        hbw = 0.0
        ex = win[:, :, w.sampled, :]                                      # (B, K+1, nL, k)
        for li in range(nL):
            x = ex[:, :, li].reshape(-1)
            ids, cnt = np.unique(x[x >= 0], return_counts=True)
            if count:
                stats.union_sizes.append(len(ids))
            for e, c in zip(ids.tolist(), cnt.tolist()):
                if kind == "elmoe":
                    hit, filled = tc.access(tc.tag(li, e), planes=res_planes, hot=c,
                                            fill=(policy != "random"))
                    if hit:
                        hb += msb * w.scale
                        lp += lsb * w.scale
                    else:
                        lp += E * w.scale
                        hbw += msb * w.scale if filled else 0.0
                else:
                    hit = lru.access(("t", li, e), 2)
                    filled = not hit
                    if hit:
                        hb += E * w.scale
                    else:
                        lp += E * w.scale
                        hbw += E * w.scale if cap >= 2 else 0.0
                stats.record(li, (li, e), hit, count)
            if kind == "elmoe":
                tc.release()
        if kind == "elmoe":
            tc.decay()
        return dict(hb=hb, hbw=hbw, lp=lp)

    def accept(d):
        if kind == "sd_eagle":
            return np.full(w.batch, float(spec["acceptance"]))
        return accm.rate(d["overlap"], precision, resident_fraction=resident_fraction,
                         policy=policy, draft_len=K)

    if kind == "elmoe":
        resident_fraction = min(1.0, cap / (nL * m.experts))
    iters = _sd_loop(w, K, draft, verify, accept, rng)
    if not iters:
        raise ValueError(f"Trace too short for draft length {K} at batch {w.batch} "
                         f"({w.steps} steps)")
    draft_macs = w.batch * w.macs_per_token
    if kind == "sd_eagle":
        draft_macs = w.batch * (extra_dense / m.weight_bytes + m.lm_head_params)
    for d, v, a, n in iters:
        for _ in range(K):
            acc.phase(hw, hb=d["hb"] / K, hbw=d["hbw"] / K, lp=d["lp"] / K,
                      **({"dmacs": draft_macs} if kind == "elmoe" else {"macs": draft_macs}))
        acc.phase(hw, hb=v["hb"], hbw=v["hbw"], lp=v["lp"], macs=w.batch * (K + 1) * w.macs_per_token)
        acc.tokens += int((n + 1).sum())
    rates = np.concatenate([a for _, _, a, _ in iters])
    nacc = np.concatenate([n for _, _, _, n in iters])
    ovl = np.concatenate([d["overlap"] for d, _, _, _ in iters])
    accept_info = dict(draft_len=K, precision=precision, policy=policy if kind == "elmoe" else None,
                       rate=round(float(rates.mean()), 4),
                       acceptance_length=round(float(nacc.mean() + 1), 4),
                       expected_overlap=round(float(ovl.mean()), 4), source=accm.source
                       if kind != "sd_eagle" else "systems.json SD-EAGLE acceptance",
                       resident_fraction=resident_fraction)
    pol = ("tag-unit (" + policy + ")") if kind == "elmoe" else "lru"
    # Belady in whole entries: MSB slices (ELMoE-3D) or whole target experts (2 half-units)
    cache = _cache_summary(stats, cap if kind == "elmoe" else cap // 2, w,
                           unit if kind == "elmoe" else E, pol)
    cache.update(_ws(w))
    return _finish(name, w, acc, "SD", cache=cache, accept=accept_info, notes=notes)


class _BackOff(Exception):
    pass


def run_system(name: str, w: Workload, accm: AcceptanceModel | None = None, *, mode: str | None = None,
               policy: str = "hotness", precision: str | None = None, draft_len: int | None = None,
               spec_override: dict | None = None) -> RunResult:
    """Run one system on a workload.

    ``mode`` forces ELMoE-3D into ``"AR"`` or ``"SD"`` (default: by the batch
    threshold). ``policy``/``precision``/``draft_len`` are the ELMoE-3D
    ablation knobs.
    """
    cfg = load_systems()
    if name not in cfg["systems"]:
        raise ValueError(f"Unknown system {name!r}; choose one of {', '.join(cfg['systems'])}")
    if policy not in POLICIES:
        raise ValueError(f"Resident-set policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"Draft precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if draft_len is not None and (isinstance(draft_len, bool) or not isinstance(draft_len, (int, np.integer))
                                  or not 1 <= draft_len <= 16):
        raise ValueError(f"Draft length must be an integer in 1..16, not {draft_len!r}")
    spec = dict(cfg["systems"][name], **(spec_override or {}))
    accm = accm or AcceptanceModel.from_config(cfg["acceptance"])
    kind = spec["kind"]
    seed = int(w.common["seed"])
    if kind == "xpu":
        return _run_xpu(w, spec)
    if kind in ("pim", "nmp"):
        return _run_near(w, spec, kind)
    if kind == "hb_lru":
        return _ar_cached(w, name, "lru", spec)
    if kind in ("sd_eagle", "sd_q4"):
        return _run_sd(w, name, spec, accm, K=draft_len, seed=seed)
    # ELMoE-3D
    thr = spec.get("sd_batch_threshold", "auto")
    if mode is None and thr == "auto":
        # the threshold a calibrated controller would use: run both, keep the faster
        ar = run_system(name, w, accm, mode="AR", policy=policy, precision=precision,
                        draft_len=draft_len, spec_override=spec_override)
        sd = run_system(name, w, accm, mode="SD", policy=policy, precision=precision,
                        draft_len=draft_len, spec_override=spec_override)
        best, other = (sd, ar) if sd.tokens_per_s > ar.tokens_per_s else (ar, sd)
        best.notes.append(f"auto threshold: {best.mode} {best.tokens_per_s:.1f} tok/s beat "
                          f"{other.mode} {other.tokens_per_s:.1f} tok/s")
        best.alternative = dict(mode=other.mode, tokens_per_s=other.tokens_per_s,
                                energy_per_token_mj=other.energy_per_token_mj,
                                acceptance=other.acceptance)
        return best
    if mode is None:
        if isinstance(thr, bool) or not isinstance(thr, int) or thr < 1:
            raise ValueError(f"ELMoE-3D sd_batch_threshold must be 'auto' or an integer >= 1, not {thr!r}")
        mode = "SD" if w.batch >= thr else "AR"
    if mode not in ("AR", "SD"):
        raise ValueError(f"ELMoE-3D mode must be 'AR' or 'SD', not {mode!r}")
    if mode == "SD":
        try:
            return _run_sd(w, name, spec, accm, policy=policy,
                           precision=precision or spec.get("precision", "augmented"), K=draft_len,
                           seed=seed)
        except _BackOff as e:
            r = _ar_cached(w, name, "tag", spec)
            r.notes.append(f"backed off from Elastic-SD to AR: {e}")
            return r
    return _ar_cached(w, name, "tag", spec)

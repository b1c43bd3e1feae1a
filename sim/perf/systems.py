"""The systems compared and the engine that runs one (system, model, batch) point.

Every system's assumptions live in ``data/systems.json`` (with sources);
this module turns them into byte, MAC and time counts per decode step (AR)
or per draft+verify iteration (speculative decoding), replaying a routing
trace through the system's expert cache - every MoE layer of the model.

Time model (per step / phase)
-----------------------------
``t = max(HB bytes / HB bandwidth, LPDDR bytes / LPDDR bandwidth, MACs / MAC
rate)`` - HB reads (and fills), external streaming and compute overlap (the
paper's execution engine streams hits and misses in parallel). Phases are
sequential: an SD iteration is ``K`` draft steps then one verification. The
LPDDR bandwidth carries one measured efficiency for every system. Not
modelled: the 32 GB/s aggregation link, rollback cost, prefill, and
per-layer synchronisation.

Energy per token: ``bytes * 8 * pJ/bit`` per memory (HB read/write, LPDDR,
in-DRAM for PIM/NMP), ``MACs * pJ/MAC`` (DRAFT MACs cost
``draft_cycle_ratio`` of a FULL one), on-chip SRAM staging of every weight
byte, plus static power * time.

Bounds reported with every run (``floor``)
------------------------------------------
* **LPDDR floor**: no cache policy can read less from LPDDR per step (AR) or
  verification (SD) than the bytes of the distinct experts that step's tokens
  route to minus what HB can hold (the expert-cache bytes), plus the KV that
  does not fit in HB. Summed over the run's own schedule it gives the least
  LPDDR bytes per token and the tok/s that bandwidth alone would allow.
* **compute floor**: the MACs the run executes at the datapath's peak rate.
* **HB floor**: a perfect cache still reads from HB the dense weights, the KV
  held in HB and the needed experts it holds (at most the cache bytes).
* ``bound_tok_s``: tokens / sum over phases of ``max(LPDDR floor time, HB
  floor time, compute time)`` - what a perfect cache would reach with the
  same schedule and acceptance; ``attainment`` = tok/s / bound.

Cache drivers
-------------
*HB-xPU*: whole INT8 experts; policies ``lru``, ``lfu``, ``static`` (the
most-used experts of the replayed trace, preloaded) - all run, the fastest is
the system's result, the others are in ``policies``. *ELMoE-3D AR*: whole
experts in the tag unit with the driver policies ``hotness``, ``recency``,
``static`` (see ``systems.json``), the fastest kept. *ELMoE-3D Elastic-SD*:
MSB slices (``resident_planes``: ``msb``, ``full`` or ``mixed-F``);
drafting TOUCHes resident experts with their draft routing counts and
measures the overlap that sets acceptance; verification LOOKUPs the true
union of B*(K+1) tokens per layer, PINs hits, ALLOCATEs misses (the MSB
fill, hotness = tokens routed) pinned, UNPINs at the layer's end; one DECAY
per iteration. Batch threshold ``"auto"`` runs AR and SD and keeps the
faster. The SD baselines use the cache policy that won for HB-xPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .acceptance import AcceptanceModel, POLICIES, PRECISIONS, per_token_rate, sample_accepted
from .cache import BatchCache, TagCache, next_use_flat
from .hardware import Hardware
from .models import DATA, ModelShape
from .traces import Trace, generate, map_to_model

__all__ = ["SYSTEMS", "PRIOR", "load_systems", "Workload", "run_system", "RunResult",
           "PLANES_MODES", "AR_POLICIES", "WHOLE_POLICIES"]

SYSTEMS = ("xPU", "xPU-PIM", "xPU-NMP", "HB-xPU", "SD-EAGLE", "SD-Q4", "ELMoE-3D")
#: The prior accelerators of the paper's comparison.
PRIOR = ("xPU-PIM", "xPU-NMP", "HB-xPU")
AR_POLICIES = ("hotness", "recency", "static")
WHOLE_POLICIES = ("lru", "lfu", "static")


def _planes_ok(v) -> bool:
    if v in ("msb", "full"):
        return True
    if isinstance(v, str) and v.startswith("mixed-"):
        try:
            return 0.0 < float(v[6:]) < 1.0
        except ValueError:
            return False
    return False


PLANES_MODES = ("msb", "full", "mixed-0.25", "mixed-0.5")


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
        loc = {k: v for k, v in model.locality.items()
               if k in ("zipf", "early_zipf", "early_layers", "request_spread", "reuse")}
        _SYNTH[key] = generate(model.layers, model.experts, model.top_k, requests=requests,
                               steps=steps, dense_layers=model.dense_layers, seed=seed,
                               model=model.name, **loc)
    return _SYNTH[key]


def _check_pos_int(what, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{what} must be an integer >= {lo}, not {v!r}")
    return int(v)


class Workload:
    """One (model, hardware, batch, context) point with its routing streams.

    ``trace_remap`` allows a trace of another shape (the documented mapping
    of :func:`~elmoe3d.sim.perf.traces.map_to_model`); without it such a
    trace is refused.

    Raises
    ------
    ValueError
        Batch < 1, context < 1, HB smaller than the model's dense weights, a
        trace of another shape (without ``trace_remap``) or without enough tokens.
    """

    def __init__(self, model: ModelShape, hw: Hardware, batch: int, context: int | None = None,
                 trace: Trace | None = None, common: dict | None = None, trace_remap: bool = False):
        common = dict(load_systems()["common"], **(common or {}))
        self.model, self.hw = model, hw
        self.batch = _check_pos_int("Batch", batch)
        self.context = _check_pos_int("Context", common["context"] if context is None else context)
        self.common = common
        self.notes: list[str] = []
        if model.dense_bytes > hw.hb_bytes:
            raise ValueError(f"HB capacity {hw.hb_gb:g} GB is smaller than the dense weights of "
                             f"{model.name} ({model.dense_bytes / 1e9:.2f} GB)")
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
        self.streams, notes = map_to_model(s, tr, model, trace_remap)
        self.notes += notes
        self.steps = self.streams.shape[1]
        self.warmup = min(int(common["warmup_steps"]), self.steps // 4)
        self.moe = model.moe_layers
        nL, E = len(self.moe), model.experts
        self.kv_total = self.batch * model.kv_bytes(self.context, hw.kv_bytes)
        self.macs_per_token = model.active_params + model.attention_ops(self.context) // 2
        self.expert_macs_per_token = len(self.moe) * model.top_k * model.expert_params
        self.mex = self.streams[:, :, self.moe, :].astype(np.int64)          # (B, S, nL, k)
        S = self.steps
        valid = self.mex >= 0
        flat = np.where(valid, np.arange(nL)[None, None, :, None] * E + self.mex, -1)
        si = np.broadcast_to(np.arange(S)[None, :, None, None], flat.shape)
        cnt = np.bincount((si * (nL * E) + flat)[valid], minlength=S * nL * E).astype(np.int32)
        self.counts = cnt.reshape(S, nL, E)                                   # tokens per expert per step
        self.union = (self.counts > 0).sum(axis=2)                           # (S, nL)
        self.profile = self.counts.sum(axis=0).reshape(-1)                   # uses per (layer, expert)
        self._memo: dict = {}

    # -- HB budget --------------------------------------------------------------
    def hb_split(self, extra_dense: float = 0.0) -> tuple[float, float, float]:
        """``(kv_in_hb, kv_in_lpddr, expert_cache_bytes)``; KV has priority over the cache."""
        free = self.hw.hb_bytes - self.model.dense_bytes - extra_dense
        if free < 0:
            raise ValueError(f"HB capacity {self.hw.hb_gb:g} GB is smaller than the dense weights "
                             f"(+ draft) of {self.model.name} "
                             f"({(self.model.dense_bytes + extra_dense) / 1e9:.2f} GB)")
        kv_hb = min(self.kv_total, free)
        return kv_hb, self.kv_total - kv_hb, free - kv_hb

    def hot_order(self) -> np.ndarray:
        """Flat (layer * E + expert) keys, most used over the trace first (ties: lower key)."""
        return np.lexsort((np.arange(self.profile.size), -self.profile))

    def ar_flat(self):
        """The AR access sequence as flat arrays: set ``j`` = (step ``j // nL``,
        layer ``j % nL``) holds ``ids[offsets[j]:offsets[j+1]]`` with token counts
        ``tok``; ``keys = layer * E + ids``."""
        if "ar_flat" not in self._memo:
            S, nL, E = self.counts.shape
            flat = self.counts.reshape(S * nL, E)
            r, e = np.nonzero(flat)
            offsets = np.zeros(S * nL + 1, np.int64)
            offsets[1:] = np.cumsum(np.bincount(r, minlength=S * nL))
            layer = (r % nL).astype(np.int64)
            self._memo["ar_flat"] = dict(offsets=offsets, ids=e.astype(np.int64),
                                         tok=flat[r, e].astype(np.int64), keys=layer * E + e,
                                         set_layer=np.tile(np.arange(nL), S),
                                         set_step=np.repeat(np.arange(S), nL))
        return self._memo["ar_flat"]


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
    floor: dict | None = None
    policies: dict | None = None
    counters: dict | None = None
    options: dict | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class _Acc:
    """Byte / MAC / time accumulator, with the floors."""

    def __init__(self):
        self.hb = self.hbw = self.lp = self.near = 0.0
        self.macs = self.dmacs = self.time = 0.0
        self.tokens = 0
        self.ideal_tokens = 0         # tokens if every draft were accepted
        self.near_pj = 0.0
        self.floor_lp = 0.0           # LPDDR floor bytes
        self.bound_t = 0.0            # sum of max(floor time, compute time)
        self.compute_t = 0.0
        self.phase_t = {"ar": 0.0, "draft": 0.0, "verify": 0.0}
        self.phases = {"ar": 0, "draft": 0, "verify": 0}
        self.phase_lp = {"ar": 0.0, "verify": 0.0}
        self.phase_floor = {"ar": 0.0, "verify": 0.0}

    def phase(self, hw: Hardware, hb=0.0, hbw=0.0, lp=0.0, macs=0.0, dmacs=0.0, t_extra=0.0,
              lp_bw=None, floor_lp=None, floor_hb=None, need=None, kind="ar"):
        """One phase. ``need`` = ``(fixed HB bytes, fixed LPDDR bytes, expert
        bytes needed, HB capacity for them)`` gives the perfect-cache bound:
        the needed experts split between HB (at most the capacity) and LPDDR so
        that the two overlapped streams finish together."""
        ct = macs / hw.int8_macs_per_s + dmacs / hw.draft_macs_per_s
        bw = lp_bw or hw.ext_bw
        t = max((hb + hbw) / hw.hb_bw, lp / bw, ct, t_extra)
        fl = lp if floor_lp is None else floor_lp
        if need is not None:
            D, Lf, N, C = need
            H = hw.hb_bw
            x = (N * H - D * bw + Lf * H) / (H + bw)          # HB share that balances the streams
            x = min(max(x, 0.0, N - C), min(N, C))
            tb = max((D + x) / H, (Lf + N - x) / bw)
        else:
            fh = hb if floor_hb is None else floor_hb
            tb = max(fl / bw, fh / hw.hb_bw)
        self.hb += hb; self.hbw += hbw; self.lp += lp
        self.macs += macs; self.dmacs += dmacs; self.time += t
        self.floor_lp += fl
        self.compute_t += ct
        self.bound_t += max(tb, ct)
        self.phase_t[kind] += t
        self.phases[kind] += 1
        if kind in self.phase_lp:
            self.phase_lp[kind] += lp
            self.phase_floor[kind] += fl
        return t


def _finish(sysname, w: Workload, acc: _Acc, mode, cache=None, accept=None, notes=(),
            counters=None) -> RunResult:
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
    kind = "verify" if acc.phases["verify"] else "ar"
    np_ = max(acc.phases[kind], 1)
    floor = dict(lpddr_bytes_per_token=acc.floor_lp / n,
                 lpddr_vs_floor=(acc.lp / acc.floor_lp) if acc.floor_lp > 0 else None,
                 lpddr_gb_per_phase=acc.phase_lp.get(kind, 0.0) / np_ / 1e9,
                 floor_gb_per_phase=acc.phase_floor.get(kind, 0.0) / np_ / 1e9,
                 phase=("verification" if kind == "verify" else "step"),
                 compute_tok_s=n / acc.compute_t if acc.compute_t else None,
                 bound_tok_s=n / acc.bound_t if acc.bound_t else None,
                 bound_all_accepted_tok_s=(max(acc.ideal_tokens, n) / acc.bound_t) if acc.bound_t else None,
                 attainment=(acc.bound_t / acc.time) if acc.time else None)
    f = hw.freq_ghz * 1e9
    cnt = dict(tokens=int(acc.tokens), lpddr_bytes=acc.lp, hb_bytes=acc.hb, hb_write_bytes=acc.hbw,
               ar_cycles=acc.phase_t["ar"] * f, draft_cycles=acc.phase_t["draft"] * f,
               verify_cycles=acc.phase_t["verify"] * f)
    cnt.update(counters or {})
    return RunResult(
        system=sysname, model=w.model.name, batch=w.batch, hb_gb=hw.hb_gb, context=w.context,
        mode=mode, tokens_per_s=n / acc.time, energy_per_token_mj=sum(e_mj.values()),
        bytes_per_token=dict(hb_read=acc.hb / n, hb_write=acc.hbw / n, lpddr=acc.lp / n,
                             near_memory=acc.near / n),
        energy_breakdown_mj=e_mj, cache=cache, acceptance=accept,
        notes=list(w.notes) + list(notes), floor=floor, counters=cnt)


def _ws(w: Workload) -> dict:
    u = w.union[w.warmup:]
    return dict(working_set_experts=float(u.sum(axis=1).mean()),
                working_set_gb=float(u.sum(axis=1).mean() * w.model.expert_bytes / 1e9))


# -- analytic AR systems -----------------------------------------------------------

def _run_xpu(w: Workload, spec: dict) -> RunResult:
    m, hw, acc = w.model, w.hw, _Acc()
    for s in range(w.warmup, w.steps):
        lp = m.streamed_dense_params * m.weight_bytes + w.union[s].sum() * m.expert_bytes + w.kv_total
        acc.phase(hw, lp=lp, macs=w.batch * w.macs_per_token, lp_bw=hw.lpddr_bw)
        acc.tokens += w.batch
    return _finish("xPU", w, acc, "AR", cache=_ws(w))


def _run_near(w: Workload, spec: dict, kind: str) -> RunResult:
    """PIM / NMP: each weight block runs near memory or on the xPU, whichever is faster."""
    m, hw, acc = w.model, w.hw, _Acc()
    bw = hw.lpddr_bw
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
        acc.compute_t += w.batch * w.macs_per_token / hw.int8_macs_per_s
        acc.bound_t += t
        acc.phase_t["ar"] += t
        acc.phases["ar"] += 1
        acc.tokens += w.batch
    name = "xPU-PIM" if kind == "pim" else "xPU-NMP"
    r = _finish(name, w, acc, "AR", cache=_ws(w))
    r.floor.update(lpddr_bytes_per_token=None, lpddr_vs_floor=None, bound_tok_s=None, attainment=None,
                   note="near-memory system: bound by its internal bandwidth, no LPDDR floor")
    return r


# -- cache systems -------------------------------------------------------------------

def _belady(w: Workload, offsets, keys, counted_sets, capacity_units: float, memo_key=None,
            per_set: bool = False):
    """Belady (farthest next use) hit rate over the counted sets, replaying
    all; with ``per_set`` also the hits of every set."""
    key = ("belady", memo_key, float(capacity_units))
    if memo_key is not None and key in w._memo:
        rate, hits = w._memo[key]
        return (rate, hits) if per_set else rate
    nu = next_use_flat(offsets, keys)
    bc = BatchCache(len(w.moe) * w.model.experts, capacity_units, "belady", 1)
    hits, _ = bc.replay(offsets, keys, None, nu)
    sizes = np.diff(offsets)
    c = np.asarray(counted_sets, bool)
    n = int(sizes[c].sum())
    out = float(hits[c].sum()) / n if n else 0.0
    if memo_key is not None:
        w._memo[key] = (out, hits)
    return (out, hits) if per_set else out


def _belady_tok_s(w: Workload, hits, cache_bytes, kv_hb, kv_lp) -> float:
    """AR tok/s of the same step model with the offline-optimal (Belady,
    demand-fill) cache's hits: the best any AR cache policy could do."""
    hw, m = w.hw, w.model
    E = m.expert_bytes
    dense = m.streamed_dense_params * m.weight_bytes
    hs = np.asarray(hits).reshape(w.steps, len(w.moe)).sum(axis=1)
    us = w.union.sum(axis=1)
    t = 0.0
    for s in range(w.warmup, w.steps):
        ct = w.batch * w.macs_per_token / hw.int8_macs_per_s
        t += max((dense + kv_hb + hs[s] * E + (us[s] - hs[s]) * E) / hw.hb_bw,
                 (kv_lp + (us[s] - hs[s]) * E) / hw.ext_bw, ct)
    return w.batch * (w.steps - w.warmup) / t if t else 0.0


def _ar_floor(w: Workload, s: int, cache_bytes: float, kv_lp: float, kv_hb: float) -> tuple:
    """(LPDDR floor, perfect-cache ``need`` tuple) of AR step ``s``."""
    need = float(w.union[s].sum() * w.model.expert_bytes)
    dense = w.model.streamed_dense_params * w.model.weight_bytes
    return max(0.0, need - cache_bytes) + kv_lp, (dense + kv_hb, kv_lp, need, cache_bytes)


def _cache_info(policy, hits, lookups, per_layer, capacity_entries, capacity_gb, belady=None):
    pl = np.where(per_layer[0] > 0, per_layer[1] / np.maximum(per_layer[0], 1), np.nan)
    return dict(policy=policy, hit_rate=round(hits / lookups, 4) if lookups else 0.0,
                belady_hit_rate=None if belady is None else round(belady, 4),
                lookups=int(lookups), capacity_entries=int(capacity_entries),
                capacity_gb=capacity_gb,
                per_layer_miss_rate=[None if np.isnan(v) else round(float(v), 4) for v in pl])


def _ar_cached(w: Workload, name: str, policy: str, spec: dict, engine: str = "fast",
               belady: bool = True) -> RunResult:
    """AR with an HB cache of whole INT8 experts: ``lru``/``lfu``/``static``
    (HB-xPU) or the tag unit with a driver policy (ELMoE-3D:
    ``tag-hotness``, ``tag-recency``, ``tag-static``). The whole run is one
    replay of the (step, layer) access sequence."""
    m, hw, acc = w.model, w.hw, _Acc()
    kv_hb, kv_lp, cache_bytes = w.hb_split()
    E = m.expert_bytes
    nL, NE = len(w.moe), m.experts
    cap = int(cache_bytes // E)
    dense = m.streamed_dense_params * m.weight_bytes
    tag = policy.startswith("tag-")
    pol = policy[4:] if tag else policy
    if pol == "static":
        return _ar_static(w, name, spec, cap, cache_bytes, kv_hb, kv_lp, tag, belady)
    f = w.ar_flat()
    S = w.steps
    ev = None
    if tag:
        if cap >= 2:
            tc = TagCache(cap, nL, NE, spec.get("hot_bits", 8), spec.get("decay_shift", 2), engine)
            if pol == "recency":
                amount = np.full(f["ids"].size, tc.hot_max, np.int64)
                hots = amount
                period = 1
            else:
                amount = f["tok"] * int(spec.get("ar_touch_scale", 8))
                hots = np.maximum(amount, int(spec.get("ar_alloc_hot", 0)))
                period = int(spec.get("decay_period_ar", 8))
            decay_after = (f["set_layer"] == nL - 1) & ((f["set_step"] + 1) % period == 0)
            hits, fills, ev = tc.replay(f["offsets"], f["set_layer"], f["ids"], hots, amount,
                                        fill=True, planes=hw.planes, decay_after=decay_after)
        else:
            hits = fills = np.zeros(S * nL, np.int64)
    else:
        bc = BatchCache(nL * NE, cap, pol, 1)
        hits, fills = bc.replay(f["offsets"], f["keys"], f["tok"])
    hits = hits.reshape(S, nL)
    fills = fills.reshape(S, nL)
    look = w.union                                                          # (S, nL)
    W = w.warmup
    hs, us, fs = hits.sum(axis=1), look.sum(axis=1), fills.sum(axis=1)
    for s in range(W, S):
        fl, fh = _ar_floor(w, s, cache_bytes, kv_lp, kv_hb)
        acc.phase(hw, hb=dense + kv_hb + hs[s] * E, hbw=fs[s] * E, lp=kv_lp + (us[s] - hs[s]) * E,
                  macs=w.batch * w.macs_per_token, floor_lp=fl, need=fh, kind="ar")
        acc.tokens += w.batch
    bel = bel_tok = None
    if belady and cap > 0:
        bel, bh = _belady(w, f["offsets"], f["keys"], f["set_step"] >= W, cap, memo_key="ar", per_set=True)
        bel_tok = _belady_tok_s(w, bh, cache_bytes, kv_hb, kv_lp)
    label = f"tag-unit ({pol})" if tag else pol
    lk, ms = look[W:].sum(axis=0), (look[W:] - hits[W:]).sum(axis=0)
    cache = _cache_info(label, int(hits[W:].sum()), int(lk.sum()), (lk, ms), cap, cap * E / 1e9, bel)
    cache.update(_ws(w))
    counters = dict(hb_hits=int(hits[W:].sum()), hb_misses=int(ms.sum()), hb_pending=0,
                    fills=int(fills[W:].sum()),
                    evictions=int(ev.reshape(S, nL)[W:].sum()) if ev is not None else None)
    r = _finish(name, w, acc, "AR", cache=cache, counters=counters)
    r.floor["belady_tok_s"] = bel_tok
    return r


def _ar_static(w: Workload, name, spec, cap, cache_bytes, kv_hb, kv_lp, tag, belady) -> RunResult:
    """AR with a static hot set (the ``cap`` most-used experts of the trace
    preloaded, never filled): the same for HB-xPU and the tag unit (a tag unit
    preloaded by ALLOCATE and never filled holds exactly that set), computed
    for all steps at once."""
    m, hw, acc = w.model, w.hw, _Acc()
    E = m.expert_bytes
    nL, NE = len(w.moe), m.experts
    mask = np.zeros(nL * NE, bool)
    mask[w.hot_order()[:max(cap, 0)]] = True
    U = (w.counts > 0).reshape(w.steps, -1)
    H = U & mask[None, :]
    nh_s = H.sum(axis=1)
    nu_s = U.sum(axis=1)
    dense = m.streamed_dense_params * m.weight_bytes
    for s in range(w.warmup, w.steps):
        fl, fh = _ar_floor(w, s, cache_bytes, kv_lp, kv_hb)
        acc.phase(hw, hb=dense + kv_hb + nh_s[s] * E, lp=kv_lp + (nu_s[s] - nh_s[s]) * E,
                  macs=w.batch * w.macs_per_token, floor_lp=fl, need=fh, kind="ar")
        acc.tokens += w.batch
    Hc, Uc = H[w.warmup:].reshape(-1, nL, NE), U[w.warmup:].reshape(-1, nL, NE)
    look, hits = Uc.sum(axis=(0, 2)), Hc.sum(axis=(0, 2))
    bel = bel_tok = None
    if belady and cap > 0:
        f = w.ar_flat()
        bel, bh = _belady(w, f["offsets"], f["keys"], f["set_step"] >= w.warmup, cap, memo_key="ar",
                          per_set=True)
        bel_tok = _belady_tok_s(w, bh, cache_bytes, kv_hb, kv_lp)
    label = "tag-unit (static)" if tag else "static"
    cache = _cache_info(label, int(hits.sum()), int(look.sum()), (look, look - hits), cap, cap * E / 1e9, bel)
    cache.update(_ws(w))
    counters = dict(hb_hits=int(hits.sum()), hb_misses=int((look - hits).sum()), hb_pending=0, fills=0,
                    evictions=0)
    r = _finish(name, w, acc, "AR", cache=cache, counters=counters)
    r.floor["belady_tok_s"] = bel_tok
    return r


class _BackOff(Exception):
    pass


def _adapt(K: int, n: np.ndarray, kmax: int) -> int:
    """Adaptive draft length: the batch's mean accepted fraction >= 0.8 -> K+1,
    < 0.4 -> K-1 (within 1..kmax)."""
    r = float(np.mean(n)) / K
    if r >= 0.8:
        return min(K + 1, kmax)
    if r < 0.4:
        return max(K - 1, 1)
    return K


def _run_sd(w: Workload, name: str, spec: dict, accm: AcceptanceModel, *, policy="hotness",
            precision="augmented", K=None, seed=0, engine="fast", belady=True) -> RunResult:
    """SD systems: ELMoE-3D (Elastic-SD), SD-EAGLE and SD-Q4."""
    m, hw, acc = w.model, w.hw, _Acc()
    kind = spec["kind"]
    K0 = int(K or spec.get("draft_len", 4))
    adaptive = bool(spec.get("adaptive_draft", False)) and kind == "elmoe"
    kmax = int(spec.get("max_draft_len", 8))
    rng = np.random.default_rng(seed)
    E = m.expert_bytes
    P = hw.planes
    dense = m.streamed_dense_params * m.weight_bytes
    nL, NE = len(w.moe), m.experts
    B = w.batch
    extra_dense = 0.0
    if kind == "sd_eagle":
        head = m.attention_params() + 3 * m.hidden * int(spec.get("head_ffn_mult", 4)) * m.hidden
        extra_dense = head * m.weight_bytes
    elif kind == "sd_q4":
        extra_dense = m.dense_bytes / 2
    kv_hb, kv_lp, cache_bytes = w.hb_split(extra_dense)
    notes = []
    opts = {}
    l_idx = np.arange(nL)[None, None, :, None]
    full_pool = None
    if kind == "elmoe":
        keep = int(spec.get("keep", 1))
        msb = E * keep / P
        planes_mode = spec.get("resident_planes", "msb")
        if not _planes_ok(planes_mode):
            raise ValueError(f"resident_planes must be msb, full or mixed-F (0 < F < 1), not {planes_mode!r}")
        fits = cache_bytes >= nL * NE * E
        if fits:
            planes_mode = "full"
            notes.append("whole model fits in the expert cache: all planes resident")
        res_planes = P if planes_mode == "full" else keep
        unit = E if planes_mode == "full" else msb
        frac_full = float(planes_mode[6:]) if planes_mode.startswith("mixed-") else 0.0
        cap_full = int(frac_full * cache_bytes // E)
        cap = int((cache_bytes - cap_full * E) // unit)
        if cap < max(2, nL):               # not even one resident expert per layer: no draft model
            raise _BackOff(f"expert cache holds only {cap} MSB slices on {nL} MoE layers")
        tc = TagCache(cap, nL, NE, spec.get("hot_bits", 8), spec.get("decay_shift", 2), engine)
        if cap_full >= 2:
            full_pool = TagCache(cap_full, nL, NE, spec.get("hot_bits", 8), spec.get("decay_shift", 2),
                                 engine)
        if policy == "random":
            order = np.random.default_rng(seed + 1).permutation(nL * NE)
            tc.preload(order, res_planes)
        elif policy == "static":
            tc.preload(w.hot_order(), res_planes)
        draft_cap = bool(spec.get("draft_cap", True))
        draft_dense = spec.get("draft_dense", "full")
        if draft_dense not in ("full", "msb"):
            raise ValueError(f"draft_dense must be 'full' or 'msb', not {draft_dense!r}")
        dense_draft = dense if draft_dense == "full" else dense * keep / P
        opts = dict(resident_planes=planes_mode, draft_cap=draft_cap, draft_dense=draft_dense,
                    adaptive_draft=adaptive, policy=policy, precision=precision)
        total_slots = cap + (cap_full if full_pool else 0)
        resident_fraction = min(1.0, total_slots / (nL * NE))
    else:
        unit = E / 2                                   # cache capacity in half-expert units
        cap = int(cache_bytes // unit)
        pol = spec.get("cache_policy", "lru")
        static_keys = None
        if pol == "static":
            # target experts (2 units) most used first; the Q4 copy shares the region
            static_keys = w.hot_order() + (nL * NE if kind == "sd_q4" else 0)
        if kind == "sd_q4":
            sizes = np.concatenate([np.ones(nL * NE), np.full(nL * NE, 2.0)])
            bc = BatchCache(2 * nL * NE, cap, pol, sizes, static_keys)
        else:
            bc = BatchCache(nL * NE, cap, pol, 2.0, static_keys)
        resident_fraction = None
        opts = dict(cache_policy=pol)
    precision = precision if kind == "elmoe" else ("rtn4" if kind == "sd_q4" else "full")
    eagle_a = None
    if kind == "sd_eagle":
        eagle_a = per_token_rate(float(spec["acceptance_length"]) - 1.0, K0)
    look = np.zeros(nL, np.int64)
    missn = np.zeros(nL, np.int64)
    hits_n = lookups_n = fills = 0
    promoted = 0
    seq_sets = []
    draft_max = 0.0
    ev0 = None

    pos = np.zeros(B, np.int64)
    Kc = K0
    S = w.steps
    recs = []
    while pos.max() + Kc + 1 <= S:
        count = pos.min() >= w.warmup
        if count and ev0 is None and kind == "elmoe":
            ev0 = tc.evictions
        win = w.mex[np.arange(B)[:, None], pos[:, None] + np.arange(Kc + 1)[None, :]]   # (B,K+1,nL,k)
        d = win[:, :Kc]
        dvalid = d >= 0
        # ---- draft
        ov = np.ones(B)
        if kind == "elmoe":
            R = tc.resident_mask()
            if full_pool is not None:
                R = R | full_pool.resident_mask()
            res = dvalid & R[l_idx, np.maximum(d, 0)]
            ov = res.sum(axis=(1, 2, 3)) / np.maximum(dvalid.sum(axis=(1, 2, 3)), 1)
            flat = (np.arange(nL)[None, None, :, None] * NE + d)
            tcnt = np.bincount(flat[res], minlength=nL * NE)
            keys = np.flatnonzero(tcnt)
            for pool in ([tc] if full_pool is None else [tc, full_pool]):
                pool.touch_flat(keys, tcnt[keys])
            Rl = R.sum(axis=1)                                                  # (nL,)
            # per draft step and layer: distinct resident picks, non-resident picks
            jj = np.broadcast_to(np.arange(Kc)[None, :, None, None], d.shape)
            rk = np.bincount((jj * nL * NE + flat)[res], minlength=Kc * nL * NE).reshape(Kc, nL, NE)
            u_res = (rk > 0).sum(axis=2)                                       # (K, nL)
            n_nr = (dvalid & ~res).sum(axis=(0, 3))                            # (K, nL)
            if draft_cap:
                X = np.minimum(Rl[None, :], u_res + n_nr)
            else:
                tk = np.bincount((jj * nL * NE + flat)[dvalid], minlength=Kc * nL * NE)
                X = (tk.reshape(Kc, nL, NE) > 0).sum(axis=2)
            step_hb = dense_draft + X.sum(axis=1) * msb + kv_hb                 # (K,)
            draft_max = max(draft_max, float(X.sum(axis=1).max()) * msb)
            d_dmacs = B * (w.expert_macs_per_token +
                           (0 if draft_dense == "full" else w.macs_per_token - w.expert_macs_per_token))
            d_macs = 0 if draft_dense != "full" else B * (w.macs_per_token - w.expert_macs_per_token)
            draft_phases = [(float(h), 0.0, kv_lp, d_macs, d_dmacs, kv_lp, float(h)) for h in step_hb]
        elif kind == "sd_eagle":
            h = extra_dense + m.lm_head_params * m.weight_bytes + \
                B * w.context * m.kv_values_per_token_layer() * hw.kv_bytes
            dm = B * (extra_dense / m.weight_bytes + m.lm_head_params)
            draft_phases = [(h, 0.0, 0.0, dm, 0, 0.0, h)] * Kc
        else:   # sd_q4: the 4-bit copy routes like the target; its experts share the cache (half size)
            # one access set per layer for the whole draft phase: an expert not resident at
            # the phase's start is read from LPDDR (and filled) on its first use, then hits
            oh = np.zeros((Kc, nL * NE), bool)
            flat = np.arange(nL)[None, None, :, None] * NE + d                 # (B, K, nL, k)
            jj = np.broadcast_to(np.arange(Kc)[None, :, None, None], d.shape)
            oh[jj[dvalid], flat[dvalid]] = True
            used = oh.any(axis=0)
            first = np.argmax(oh, axis=0)                                      # first draft step of use
            steps_hb = np.full(Kc, float(dense / 2 + kv_hb))
            steps_lp = np.full(Kc, float(kv_lp))
            steps_hw = np.zeros(Kc)
            steps_need = oh.sum(axis=1) * E / 2
            ks = np.flatnonzero(used)                                          # sorted by layer
            per_l = np.bincount(ks // NE, minlength=nL)
            offs = np.zeros(nL + 1, np.int64)
            offs[1:] = np.cumsum(per_l)
            uses = oh[:, ks]                                                    # (K, n)
            _, _, hit, filled = bc.replay(offs, ks, uses.sum(axis=0), flags=True)
            fj = first[ks]
            hb_uses = uses.copy()
            hb_uses[fj[~hit], np.flatnonzero(~hit)] = False                     # misses: 1st use LPDDR
            steps_hb += hb_uses.sum(axis=1) * E / 2
            steps_lp += np.bincount(fj[~hit], minlength=Kc) * E / 2
            steps_hw += np.bincount(fj[filled], minlength=Kc) * E / 2
            draft_phases = []
            for j in range(Kc):
                fl = max(0.0, steps_need[j] - cache_bytes) + kv_lp
                fh = (dense / 2 + kv_hb, kv_lp, float(steps_need[j]), cache_bytes)
                draft_phases.append((float(steps_hb[j]), float(steps_hw[j]), float(steps_lp[j]),
                                     B * w.macs_per_token / 2, 0, fl, fh))
        # ---- verify
        vflat = (np.arange(nL)[None, None, :, None] * NE + win)[win >= 0]
        vcf = np.bincount(vflat, minlength=nL * NE)
        keys_v = np.flatnonzero(vcf)                                  # sorted: layer, then expert
        cnt_v = vcf[keys_v].astype(np.int64)
        lay_v = keys_v // NE
        per_l = np.bincount(lay_v, minlength=nL)
        offs = np.zeros(nL + 1, np.int64)
        offs[1:] = np.cumsum(per_l)
        need = float(keys_v.size) * E
        hb = dense + kv_hb
        lp = kv_lp
        hbw = 0.0
        if kind == "elmoe" and full_pool is None:
            hl, fl_, _ = tc.replay(offs, np.arange(nL), keys_v % NE, cnt_v,
                                   fill=(policy not in ("random", "static")), planes=res_planes)
            nh_tot = int(hl.sum())
            hb += nh_tot * unit
            lp += nh_tot * (E - unit) + (keys_v.size - nh_tot) * E
            hbw += int(fl_.sum()) * unit
            hit_l, fill_l = hl, fl_
        elif kind == "elmoe":
            hit_l = np.zeros(nL, np.int64)
            fill_l = np.zeros(nL, np.int64)
            for li in range(nL):
                ids = keys_v[offs[li]:offs[li + 1]] % NE
                c = cnt_v[offs[li]:offs[li + 1]]
                fh, _ = full_pool.access_layer(li, ids, planes=P, hots=c, fill=False)
                nfh = int(fh.sum())
                hb += nfh * E
                rest, rc = ids[~fh], c[~fh]
                hit, filled = tc.access_layer(li, rest, planes=res_planes, hots=rc,
                                              fill=(policy not in ("random", "static")))
                nh = int(hit.sum())
                hb += nh * unit
                lp += nh * (E - unit) + (rest.size - nh) * E
                hbw += int(filled.sum()) * unit
                tc.release()
                if nh:
                    # promote MSB hits into whole-expert slots: the LSB planes streamed now are
                    # written beside a copy of the MSB planes (no extra LPDDR traffic)
                    ok = full_pool.allocate_layer(li, rest[hit], P, rc[hit])
                    hbw += int(ok.sum()) * E
                    promoted += int(ok.sum())
                    tc.invalidate(li, rest[hit][ok])
                full_pool.release()
                hit_l[li] = nh + nfh
                fill_l[li] = int(filled.sum())
        else:
            kk = keys_v + (nL * NE if kind == "sd_q4" else 0)
            hit_l, fill_l = bc.replay(offs, kk, cnt_v)
            nh_tot = int(hit_l.sum())
            hb += nh_tot * E
            lp += (keys_v.size - nh_tot) * E
            hbw += int(fill_l.sum()) * E
        if count:
            look += per_l
            missn += per_l - hit_l
            hits_n += int(hit_l.sum())
            lookups_n += int(keys_v.size)
            fills += int(fill_l.sum())
        if belady and kind == "elmoe":
            seq_sets.append((offs, keys_v, count))
        if kind == "elmoe":
            tc.decay()
            if full_pool is not None:
                full_pool.decay()
        vfloor = (max(0.0, need - cache_bytes) + kv_lp, (dense + kv_hb, kv_lp, need, cache_bytes))
        # ---- acceptance
        if kind == "sd_eagle":
            a = np.full(B, eagle_a)
        else:
            a = accm.rate(ov, precision, resident_fraction=resident_fraction, policy=policy,
                          draft_len=Kc, dense=opts.get("draft_dense", "full"))
        n = sample_accepted(a, Kc, rng)
        pos += n + 1
        if count:
            recs.append((draft_phases, (hb, hbw, lp) + vfloor, a, n, ov, Kc))
        if adaptive:
            Kc = _adapt(Kc, n, kmax)
    if not recs:
        raise ValueError(f"Trace too short for draft length {K0} at batch {w.batch} "
                         f"({w.steps} steps)")
    for dph, (hb, hbw, lp, vfl, vfh), a, n, ov, k_ in recs:
        for (h, hw_, lp_, mac, dmac, fl, fh) in dph:
            acc.phase(hw, hb=h, hbw=hw_, lp=lp_, macs=mac, dmacs=dmac, floor_lp=fl,
                      **({"need": fh} if isinstance(fh, tuple) else {"floor_hb": fh}), kind="draft")
        acc.phase(hw, hb=hb, hbw=hbw, lp=lp, macs=w.batch * (k_ + 1) * w.macs_per_token,
                  floor_lp=vfl, need=vfh, kind="verify")
        acc.tokens += int((n + 1).sum())
        acc.ideal_tokens += w.batch * (k_ + 1)
    rates = np.concatenate([r[2] for r in recs])
    nacc = np.concatenate([r[3] for r in recs])
    ovl = np.concatenate([r[4] for r in recs])
    ks = np.array([r[5] for r in recs])
    accept_info = dict(draft_len=K0, precision=precision, policy=policy if kind == "elmoe" else None,
                       rate=round(float(rates.mean()), 4),
                       acceptance_length=round(float(nacc.mean() + 1), 4),
                       expected_overlap=round(float(ovl.mean()), 4),
                       source=accm.source if kind != "sd_eagle" else
                       "EAGLE's reported acceptance length (systems.json SD-EAGLE)",
                       resident_fraction=resident_fraction,
                       mean_draft_len=round(float(ks.mean()), 3), adaptive=adaptive,
                       draft_expert_gb_max=draft_max / 1e9 if kind == "elmoe" else None)
    if kind == "elmoe":
        label = f"tag-unit ({policy})"
        bel = None
        if belady:
            offs_all, keys_all, cnt_all = [np.zeros(1, np.int64)], [], []
            base = 0
            for o, k_, c_ in seq_sets:
                offs_all.append(o[1:] + base)
                base += int(o[-1])
                keys_all.append(k_)
                cnt_all += [c_] * (o.size - 1)
            bel = _belady(w, np.concatenate(offs_all), np.concatenate(keys_all), cnt_all, cap)
        cache = _cache_info(label, hits_n, lookups_n, (look, missn), total_slots,
                            (cap * unit + (cap_full * E if full_pool else 0)) / 1e9, bel)
        if full_pool is not None:
            cache["promoted"] = promoted
        counters = dict(hb_hits=hits_n, hb_misses=lookups_n - hits_n, hb_pending=0, fills=fills,
                        evictions=tc.evictions - (ev0 or 0), accepted_tokens=int(nacc.sum()))
    else:
        cache = _cache_info(opts.get("cache_policy", "lru"), hits_n, lookups_n, (look, missn),
                            cap // 2, cap * unit / 1e9)
        counters = dict(hb_hits=hits_n, hb_misses=lookups_n - hits_n, fills=fills,
                        accepted_tokens=int(nacc.sum()))
    cache.update(_ws(w))
    r = _finish(name, w, acc, "SD", cache=cache, accept=accept_info, notes=notes, counters=counters)
    r.options = opts
    return r


def _best(runs: dict, name: str) -> RunResult:
    """The fastest of several policy runs; the others summarised in ``policies``."""
    best_pol = max(runs, key=lambda p: runs[p].tokens_per_s)
    best = runs[best_pol]
    best.policies = {p: dict(tokens_per_s=r.tokens_per_s, energy_per_token_mj=r.energy_per_token_mj,
                             hit_rate=(r.cache or {}).get("hit_rate"),
                             belady_hit_rate=(r.cache or {}).get("belady_hit_rate"))
                     for p, r in runs.items()}
    best.notes.append(f"{name}: strongest cache policy {best_pol} of " + ", ".join(
        f"{p} {r.tokens_per_s:.1f}" for p, r in runs.items()) + " tok/s")
    return best


def run_system(name: str, w: Workload, accm: AcceptanceModel | None = None, *, mode: str | None = None,
               policy: str = "hotness", precision: str | None = None, draft_len: int | None = None,
               spec_override: dict | None = None, engine: str = "fast", belady: bool = True,
               ar_policies=None) -> RunResult:
    """Run one system on a workload.

    ``mode`` forces ELMoE-3D into ``"AR"`` or ``"SD"`` (default: by the batch
    threshold). ``policy`` (Elastic-SD resident set: hotness, random, static),
    ``precision``, ``draft_len`` and ``spec_override`` (e.g.
    ``{"resident_planes": "mixed-0.25"}``, ``{"draft_cap": False}``,
    ``{"adaptive_draft": True}``) are the ablation knobs; ``ar_policies``
    restricts the AR policies tried (HB-xPU: lru/lfu/static; ELMoE-3D:
    hotness/recency/static); ``engine`` picks the tag-unit implementation.
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
        pols = list(ar_policies or spec.get("policies", WHOLE_POLICIES))
        for p in pols:
            if p not in WHOLE_POLICIES:
                raise ValueError(f"HB-xPU cache policy must be one of {', '.join(WHOLE_POLICIES)}, not {p!r}")
        runs = {p: _ar_cached(w, name, p, spec, belady=belady) for p in pols}   # Belady memoised
        return _best(runs, name)
    if kind in ("sd_eagle", "sd_q4"):
        # the SD baselines' cache, like HB-xPU's: LRU, LFU and a static hot set, the fastest kept
        pols = [spec["cache_policy"]] if "cache_policy" in spec else \
            list(ar_policies or spec.get("policies", WHOLE_POLICIES))
        runs = {p: _run_sd(w, name, dict(spec, cache_policy=p), accm, K=draft_len, seed=seed,
                           belady=False) for p in pols}
        return _best(runs, name) if len(runs) > 1 else runs[pols[0]]
    # ELMoE-3D
    thr = spec.get("sd_batch_threshold", "auto")
    if mode is None and thr == "auto":
        # the threshold a calibrated controller would use: run both, keep the faster
        kw = dict(policy=policy, precision=precision, draft_len=draft_len, spec_override=spec_override,
                  engine=engine, belady=belady, ar_policies=ar_policies)
        ar = run_system(name, w, accm, mode="AR", **kw)
        sd = run_system(name, w, accm, mode="SD", **kw)
        best, other = (sd, ar) if sd.tokens_per_s > ar.tokens_per_s else (ar, sd)
        best.notes.append(f"auto threshold: {best.mode} {best.tokens_per_s:.1f} tok/s beat "
                          f"{other.mode} {other.tokens_per_s:.1f} tok/s")
        best.alternative = dict(mode=other.mode, tokens_per_s=other.tokens_per_s,
                                energy_per_token_mj=other.energy_per_token_mj,
                                acceptance=other.acceptance, floor=other.floor,
                                policies=other.policies, cache=other.cache)
        return best
    if mode is None:
        if isinstance(thr, bool) or not isinstance(thr, int) or thr < 1:
            raise ValueError(f"ELMoE-3D sd_batch_threshold must be 'auto' or an integer >= 1, not {thr!r}")
        mode = "SD" if w.batch >= thr else "AR"
    if mode not in ("AR", "SD"):
        raise ValueError(f"ELMoE-3D mode must be 'AR' or 'SD', not {mode!r}")

    def ar_run():
        pols = list(ar_policies or spec.get("ar_policies", AR_POLICIES))
        for p in pols:
            if p not in AR_POLICIES:
                raise ValueError(f"ELMoE-3D AR policy must be one of {', '.join(AR_POLICIES)}, not {p!r}")
        runs = {p: _ar_cached(w, name, "tag-" + p, spec, engine, belady=belady)
                for p in pols}
        return _best(runs, name + " AR")

    if mode == "SD":
        try:
            return _run_sd(w, name, spec, accm, policy=policy,
                           precision=precision or spec.get("precision", "augmented"), K=draft_len,
                           seed=seed, engine=engine, belady=belady)
        except _BackOff as e:
            r = ar_run()
            r.notes.append(f"backed off from Elastic-SD to AR: {e}")
            return r
    return ar_run()

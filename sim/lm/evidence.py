"""Real-model evidence on the small MoE LM: perplexity per precision, routing
statistics, routing traces and Elastic-SD acceptance (issue 7).

Everything here runs on the committed weights with NumPy only
(:mod:`elmoe3d.golden.lm`); :func:`run` is what ``elmoe3d evidence`` calls.

Elastic-SD measurement
----------------------
For each held-out prompt the *target* (INT8 FULL weights, the model being
served) decodes ``gen_len`` bytes greedily; its keys/values and routing are
kept. A draft *round* starts at a fixed position ``t`` of that continuation:
the draft sees the target's cache for positions ``< t`` (verification computes
the true cache), feeds the byte at ``t`` and drafts ``max_draft`` bytes
greedily with the target restricted to its resident experts (the
highest-ranked resident experts per token, as the paper) at a precision
(MSB-truncated, MSB-augmented or FULL); dense weights stay INT8 FULL. Greedy
verification accepts the longest prefix equal to the target's own greedy bytes,
so acceptance is exact, and a draft of length ``L`` accepts
``min(L, matched prefix)``: one 8-byte draft gives every length 1..8.

Resident sets (per prompt, per layer, ``C = fraction * E`` experts):

``hotness``
    The tag-unit golden policy (:class:`elmoe3d.golden.tag_unit.TagUnitModel`,
    ``C`` slots per layer): every processed token's top-k routing touches its
    experts (``+touch_amount``; a miss allocates the coldest slot, as the MSB
    fill on verification), ``decay()`` every ``decay_every`` tokens.
``hotness-rank``
    The same decayed one-hot accumulation kept for *all* experts; the ``C``
    hottest are resident (the paper's hotness ranking without cache mechanics).
``random``
    ``C`` experts drawn uniformly per prompt and layer, fixed for the prompt.
``oracle``
    The ``C`` experts the target itself routes to most often over the bytes the
    round drafts (future knowledge), topped up by hotness rank.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from elmoe3d.golden import lm as glm
from elmoe3d.golden.tag_unit import TagUnitModel

__all__ = ["Setup", "DATA_DIR", "PROMPTS", "WINDOWS", "ACCEPTANCE", "RESULT",
           "heldout_prompts", "heldout_windows", "make_heldout", "perplexities",
           "routing_stats", "working_set", "resident_sets", "acceptance", "run",
           "write_trace", "POLICIES", "DRAFT_PRECISIONS"]

DATA_DIR = glm.DATA_DIR
PROMPTS = "heldout_prompts.npy"
WINDOWS = "heldout_windows.npy"
ACCEPTANCE = "acceptance.json"
RESULT = "evidence.json"
TRACE = "routing_trace.npz"

POLICIES = ("hotness", "hotness-rank", "random", "oracle")
DRAFT_PRECISIONS = ("truncated", "augmented", "full")


@dataclass(frozen=True)
class Setup:
    """Sizes of one evidence run (defaults: the full run)."""
    n_prompts: int = 256
    prompt_len: int = 64
    gen_len: int = 56
    rounds: int = 12
    round_stride: int = 4
    max_draft: int = 8
    fractions: tuple = (0.25, 0.5, 0.75, 1.0)
    policies: tuple = POLICIES
    precisions: tuple = DRAFT_PRECISIONS
    ppl_windows: int = 64
    batch_groups: tuple = (4, 16)
    batch_policies: tuple = ("hotness", "random", "oracle")
    sd_loop_draft: int = 4
    touch_amount: int = 8
    decay_every: int = 8
    decay_shift: int = 1
    hot_bits: int = 8
    seed: int = 2026

    def __post_init__(self):
        for name in ("n_prompts", "prompt_len", "gen_len", "rounds", "round_stride",
                     "max_draft", "ppl_windows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, not {v!r}")
        if self.first_start() + (self.rounds - 1) * self.round_stride + self.max_draft \
                > self.prompt_len + self.gen_len - 1:
            raise ValueError(f"gen_len {self.gen_len} too short for {self.rounds} rounds of "
                             f"stride {self.round_stride} and drafts of {self.max_draft}")
        for f in self.fractions:
            if not 0 < f <= 1:
                raise ValueError(f"Resident fraction must be in (0, 1], not {f!r}")
        for p in self.policies:
            if p not in POLICIES:
                raise ValueError(f"Resident policy must be one of {', '.join(POLICIES)}, not {p!r}")
        for g in self.batch_groups:
            if isinstance(g, bool) or not isinstance(g, int) or g < 2 or self.n_prompts % g:
                raise ValueError(f"Batch group must be an integer >= 2 dividing n_prompts "
                                 f"{self.n_prompts}, not {g!r}")
        for p in self.batch_policies:
            if p not in POLICIES:
                raise ValueError(f"Resident policy must be one of {', '.join(POLICIES)}, not {p!r}")
        for p in self.precisions:
            if p not in DRAFT_PRECISIONS:
                raise ValueError(f"Draft precision must be one of {', '.join(DRAFT_PRECISIONS)}, "
                                 f"not {p!r}")

    def first_start(self) -> int:
        """Position of the first round's fed byte: the last prompt byte."""
        return self.prompt_len - 1

    def starts(self) -> np.ndarray:
        return self.first_start() + self.round_stride * np.arange(self.rounds)


# --- held-out data (committed, so that tests do not depend on the local stdlib) -------

def make_heldout(meta: dict, n_prompts: int = 256, prompt_len: int = 64, n_windows: int = 64,
                 window: int = 129, seed: int = 7, out: Path | None = None):
    """Cut prompts (starting at line starts) and perplexity windows from the
    validation files named in ``meta`` and save them beside the weights."""
    import sysconfig
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [(r, (root / r).read_bytes()) for r in meta["val_files"] if (root / r).is_file()]
    if not files:
        raise FileNotFoundError(f"None of the validation files exist under {root}")
    rng = np.random.default_rng(seed)
    prompts, windows = [], []
    cand = []
    for fi, (_, data) in enumerate(files):
        starts = [0] + [i + 1 for i in range(len(data) - 1) if data[i] == 10]
        cand += [(fi, s) for s in starts
                 if s + prompt_len <= len(data) and data[s:s + prompt_len].strip()
                 and len(data[s:s + prompt_len].strip()) > prompt_len // 2]
    for i in rng.permutation(len(cand))[:n_prompts]:
        fi, s = cand[i]
        prompts.append(np.frombuffer(files[fi][1][s:s + prompt_len], np.uint8))
    joined = b"\0".join(d for _, d in files)
    for s in rng.integers(0, len(joined) - window, n_windows):
        windows.append(np.frombuffer(joined[s:s + window], np.uint8))
    out = Path(out or DATA_DIR)
    np.save(out / PROMPTS, np.stack(prompts))
    np.save(out / WINDOWS, np.stack(windows))
    return np.stack(prompts), np.stack(windows)


def heldout_prompts(n=None) -> np.ndarray:
    p = np.load(DATA_DIR / PROMPTS).astype(np.int64)
    return p if n is None else p[:n]


def heldout_windows(n=None) -> np.ndarray:
    w = np.load(DATA_DIR / WINDOWS).astype(np.int64)
    return w if n is None else w[:n]


# --- perplexity -------------------------------------------------------------------------

def perplexities(weights, meta, windows, precisions=("float", "full", "augmented", "truncated"),
                 batch=32) -> dict:
    """Validation cross-entropy (nats/byte) and perplexity per weight precision.
    ``float``/``full`` apply to every weight; the MSB precisions apply to the
    experts only (dense weights INT8 FULL), which is the draft model at 100 %
    residency."""
    out = {}
    for p in precisions:
        m = glm.MoEModel(weights, meta, "float" if p == "float" else "full", expert_precision=p)
        tot, n = 0.0, 0
        for i in range(0, len(windows), batch):
            w = windows[i:i + batch]
            logits, _ = m.forward(w[:, :-1])
            tot += glm.cross_entropy(logits, w[:, 1:]) * w[:, 1:].size
            n += w[:, 1:].size
        ce = tot / n
        out[p] = dict(nats_per_byte=ce, bits_per_byte=ce / math.log(2), ppl=math.exp(ce))
    return out


# --- routing statistics -------------------------------------------------------------------

def routing_stats(experts: np.ndarray, probs: np.ndarray, E: int) -> list[dict]:
    """Per-layer statistics of routing ``experts[B, T, L, k]`` (and router
    ``probs[B, T, L, E]``):

    * ``top_share``: share of assignments taken by the most popular expert;
      ``skew`` = that over the uniform share ``1/E``;
    * ``top25_share``: share of the most popular 25 % of experts;
    * ``gini`` of the popularity distribution;
    * ``reuse``: mean fraction of a token's top-k experts also chosen by the
      previous token of the same sequence (uniform random routing: ``k/E``);
    * ``pop_entropy``: entropy of the popularity distribution over ``log E``;
    * ``token_entropy``: mean entropy of the per-token router distribution
      over ``log E``.
    """
    B, T, L, k = experts.shape
    out = []
    for l in range(L):
        e = experts[:, :, l, :].astype(np.int64)
        cnt = np.bincount(e.ravel(), minlength=E).astype(np.float64)
        share = cnt / cnt.sum()
        srt = np.sort(share)
        gini = float(1 - 2 * np.sum(np.cumsum(srt)) / (E * srt.sum()) + 1 / E)
        onehot = np.zeros((B, T, E), bool)
        np.put_along_axis(onehot, e, True, axis=-1)
        reuse = float((onehot[:, 1:] & onehot[:, :-1]).sum(-1).mean() / k)
        nz = share[share > 0]
        pe = float(-(nz * np.log(nz)).sum() / math.log(E))
        p = probs[:, :, l, :].astype(np.float64)
        te = float((-(p * np.log(np.maximum(p, 1e-30))).sum(-1)).mean() / math.log(E))
        out.append(dict(layer=l, top_share=float(share.max()), skew=float(share.max() * E),
                        top25_share=float(srt[::-1][:max(1, E // 4)].sum()), gini=gini,
                        reuse=reuse, reuse_uniform=k / E, pop_entropy=pe, token_entropy=te,
                        popularity=[float(s) for s in share]))
    return out


def working_set(experts: np.ndarray, E: int, batches=range(1, 17), positions=None) -> list[dict]:
    """Distinct experts per layer touched in one decode step by ``b``
    independent sequences, ``b`` in ``batches`` (mean over disjoint groups of
    sequences, steps and layers), next to uniform random routing's
    ``E * (1 - (1 - k/E)**b)``."""
    B, T, L, k = experts.shape
    pos = np.arange(T) if positions is None else np.asarray(positions)
    onehot = np.zeros((B, T, L, E), bool)
    np.put_along_axis(onehot, experts.astype(np.int64), True, axis=-1)
    onehot = onehot[:, pos]
    rows = []
    for b in batches:
        g = B // b
        if g < 1:
            continue
        u = onehot[:g * b].reshape(g, b, len(pos), L, E).any(1).sum(-1)    # [g, T, L]
        rows.append(dict(batch=b, distinct=float(u.mean()), fraction=float(u.mean() / E),
                         per_layer=[float(x) for x in u.mean((0, 1))],
                         uniform=E * (1 - (1 - k / E) ** b)))
    return rows


# --- resident sets ---------------------------------------------------------------------------

def _capacity(fraction, E):
    return max(1, int(round(fraction * E)))


def _check_group(B, group):
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or B % group:
        raise ValueError(f"Batch group must be a positive divisor of the {B} sequences, "
                         f"not {group!r}")
    return B // group


def _hot_rank_snapshots(experts, starts, E, s: Setup, group: int = 1):
    """Decayed one-hot accumulation for all experts, ``[B, R, L, E]`` integer
    counters at each round start (tokens ``< start`` processed). With
    ``group > 1`` consecutive sequences form a batch sharing one set of
    counters (every member's routing touches them)."""
    B, T, L, k = experts.shape
    G = _check_group(B, group)
    hmax = (1 << s.hot_bits) - 1
    h = np.zeros((G, L, E), np.int64)
    snaps = np.zeros((G, len(starts), L, E), np.int64)
    onehot = np.zeros((B, T, L, E), np.int64)
    np.put_along_axis(onehot, experts.astype(np.int64), 1, axis=-1)
    onehot = onehot.reshape(G, group, T, L, E).sum(1)
    j = 0
    for t in range(int(starts[-1]) + 1):
        while j < len(starts) and starts[j] == t:
            snaps[:, j] = h
            j += 1
        if t == starts[-1]:
            break
        h = np.minimum(h + s.touch_amount * onehot[:, t], hmax)
        if (t + 1) % s.decay_every == 0:
            h = h - (h >> s.decay_shift)
    return np.repeat(snaps, group, axis=0)


def _tag_unit_snapshots(experts, starts, E, C, s: Setup, group: int = 1):
    """Resident sets ``[B, R, L, E]`` of the tag-unit policy, ``C`` slots per
    layer: touch on hit, allocate (evict coldest) on miss, decay every
    ``decay_every`` tokens. With ``group > 1`` the members of a batch share
    one tag unit (their routing is applied member by member at each step)."""
    B, T, L, k = experts.shape
    G = _check_group(B, group)
    if C < 2:                       # the tag unit has at least 2 slots
        raise ValueError(f"Resident capacity {C} too small for the tag unit")
    res = np.zeros((G, len(starts), L, E), bool)
    last = int(starts[-1])
    ex = experts.astype(np.int64).reshape(G, group, T, L, k)
    for b in range(G):
        for l in range(L):
            tu = TagUnitModel(slots=max(2, C), layer_bits=max(1, (L - 1).bit_length()),
                              expert_bits=max(1, (E - 1).bit_length()), hot_bits=s.hot_bits,
                              decay_shift=s.decay_shift)
            j = 0
            for t in range(last + 1):
                while j < len(starts) and starts[j] == t:
                    for slot in range(tu.slots):
                        if tu.valid[slot]:
                            res[b, j, l, tu.tags[slot] & ((1 << tu.expert_bits) - 1)] = True
                    j += 1
                if t == last:
                    break
                for e in ex[b, :, t, l].ravel():
                    tag = tu.make_tag(l, int(e))
                    if tu.lookup(tag)[0]:
                        tu.touch(tag, s.touch_amount)
                    else:
                        tu.allocate(tag, planes=1, hot=s.touch_amount)
                if (t + 1) % s.decay_every == 0:
                    tu.decay()
    return np.repeat(res, group, axis=0)


def _top_c(score, C, E):
    """Boolean mask of the ``C`` highest scores (ties: lower expert index)."""
    order = np.argsort(-score, axis=-1, kind="stable")[..., :C]
    m = np.zeros(score.shape, bool)
    np.put_along_axis(m, order, True, axis=-1)
    return m


def resident_sets(policy: str, fraction: float, experts: np.ndarray, starts, E: int,
                  s: Setup, hot_snaps=None, group: int = 1) -> np.ndarray:
    """Resident mask ``[B, R, L, E]`` for each round of each sequence. With
    ``group > 1`` every ``group`` consecutive sequences are one batch sharing
    one resident set (one HB expert cache), chosen from all members' routing.
    ``hot_snaps`` must then come from ``_hot_rank_snapshots(..., group)``."""
    B, T, L, k = experts.shape
    R = len(starts)
    G = _check_group(B, group)
    if int(np.max(starts)) + (s.max_draft if policy == "oracle" else 0) > T:
        raise ValueError(f"Round starts reach beyond the {T} routed tokens of the trace")
    C = _capacity(fraction, E)
    if C >= E:
        return np.ones((B, R, L, E), bool)
    if hot_snaps is None and policy in ("hotness-rank", "oracle"):
        hot_snaps = _hot_rank_snapshots(experts, starts, E, s, group)
    if policy == "hotness":
        return _tag_unit_snapshots(experts, starts, E, C, s, group)
    if policy == "hotness-rank":
        return _top_c(hot_snaps.astype(np.float64), C, E)
    if policy == "random":
        rng = np.random.default_rng([s.seed, int(fraction * 1000), group])
        m = np.repeat(_top_c(rng.random((G, 1, L, E)), C, E), group, axis=0)
        return np.broadcast_to(m, (B, R, L, E)).copy()
    if policy == "oracle":
        onehot = np.zeros((B, T, L, E), np.int64)
        np.put_along_axis(onehot, experts.astype(np.int64), 1, axis=-1)
        fut = np.stack([onehot[:, st:st + s.max_draft].sum(1) for st in starts], 1)  # [B,R,L,E]
        fut = np.repeat(fut.reshape((G, group) + fut.shape[1:]).sum(1), group, axis=0)
        return _top_c(fut * 1e6 + hot_snaps, C, E)
    raise ValueError(f"Resident policy must be one of {', '.join(POLICIES)}, not {policy!r}")


# --- acceptance -------------------------------------------------------------------------------

def acceptance(drafts: np.ndarray, target: np.ndarray, starts, max_draft: int) -> np.ndarray:
    """Matched-prefix length ``[B, R]`` of drafts ``[B, R, max_draft]`` against
    the target's greedy bytes (draft byte ``i`` of round ``j`` predicts
    ``target[:, starts[j] + 1 + i]``)."""
    want = np.stack([target[:, st + 1:st + 1 + max_draft] for st in starts], 1)
    ok = drafts == want
    return np.where(ok.all(-1), max_draft, np.argmin(ok, axis=-1))


def accepted_stats(matched: np.ndarray, max_draft: int) -> list[dict]:
    """Per draft length ``L``: mean accepted ``E[min(L, m)]`` and acceptance
    rate (accepted / drafted)."""
    rows = []
    for L in range(1, max_draft + 1):
        a = np.minimum(matched, L)
        rows.append(dict(draft_len=L, mean_accepted=float(a.mean()),
                         acceptance_rate=float(a.mean() / L)))
    return rows


# --- traces -------------------------------------------------------------------------------------

def write_trace(path: Path, experts: np.ndarray, gates: np.ndarray, meta: dict) -> str:
    """Write the routing trace ``experts[B, T, L, k]`` (``B`` requests, every
    byte fed to the target: prompt prefill, then greedy decode) with the
    system model's :func:`elmoe3d.sim.perf.traces.save_trace` (format
    ``elmoe3d-trace`` v1, request/position derived). Falls back to an NPZ
    with ``experts[token, layer, k]`` (int16), ``gates``, ``request``,
    ``position`` and a ``meta`` JSON string if that module is missing.
    Returns which writer was used."""
    try:
        from elmoe3d.sim.perf.traces import save_trace
    except ImportError:
        save_trace = None
    if save_trace is not None:
        save_trace(path, experts, dict(meta))    # gates left out: 1 MB vs 0.1 MB, unused
        return "sim.perf.traces.save_trace"
    B, T, L, k = experts.shape
    np.savez_compressed(path, experts=experts.reshape(B * T, L, k).astype(np.int16),
                        gates=gates.reshape(B * T, L, k).astype(np.float32),
                        request=np.repeat(np.arange(B), T), position=np.tile(np.arange(T), B),
                        meta=np.array(json.dumps(meta)))
    return "npz-fallback"


# --- the whole run ----------------------------------------------------------------------------

def run(setup: Setup | None = None, weights_meta=None, log=print, trace_path: Path | None = None,
        acceptance_path: Path | None = None) -> dict:
    """Measure everything; returns a JSON-able dict (see ``elmoe3d evidence``)."""
    with glm.single_thread_blas():
        return _run(setup, weights_meta, log, trace_path, acceptance_path)


def _run(setup, weights_meta, log, trace_path, acceptance_path) -> dict:
    s = setup or Setup()
    t0 = time.monotonic()
    weights, meta = weights_meta or glm.load_weights()
    shape = meta["shape"]
    E = shape["experts"]
    prompts = heldout_prompts(s.n_prompts)
    if len(prompts) < s.n_prompts:
        raise ValueError(f"Only {len(prompts)} held-out prompts stored, {s.n_prompts} requested")
    prompts = prompts[:, :s.prompt_len]
    setup_d = {k_: (list(v) if isinstance(v, tuple) else v) for k_, v in asdict(s).items()}
    result = dict(setup=setup_d,
                  model=dict(shape=shape, val_loss_float_training=meta.get("val_loss"),
                             params=int(sum(v.size for v in weights.values())),
                             train_wall_s=meta.get("train_wall_s"), corpus=meta.get("corpus"),
                             train_bytes=meta.get("train_bytes"), val_bytes=meta.get("val_bytes"),
                             val_files=len(meta.get("val_files", []))))

    log(f"perplexity on {s.ppl_windows} held-out windows ...")
    result["perplexity"] = perplexities(weights, meta, heldout_windows(s.ppl_windows))

    log(f"target (INT8 FULL) greedy decode of {s.n_prompts} prompts x {s.gen_len} bytes ...")
    target = glm.MoEModel(weights, meta, "full")
    toks, routing, cache = target.generate(prompts, s.gen_len)
    experts = routing.experts                        # [B, P+G-1, L, k] for the bytes fed
    result["routing"] = routing_stats(experts, routing.probs, E)
    result["working_set"] = working_set(experts, E, positions=np.arange(s.prompt_len - 1,
                                                                        experts.shape[1]))
    tmeta = dict(source="elmoe3d.sim.lm.evidence (target INT8 FULL, greedy)",
                 model="elmoe3d small MoE LM (issue 7)", num_experts=E,
                 sequences=int(experts.shape[0]),
                 tokens_per_sequence=int(experts.shape[1]), prompt_len=s.prompt_len,
                 weights_sha256=hashlib.sha256((DATA_DIR / glm.WEIGHTS).read_bytes()).hexdigest()
                 if (DATA_DIR / glm.WEIGHTS).is_file() else None)
    if trace_path is not None:
        result["trace"] = dict(path=str(trace_path), format=write_trace(trace_path, experts,
                                                                       routing.gates, tmeta))

    starts = s.starts()
    first = toks[:, starts]
    hot = _hot_rank_snapshots(experts, starts, E, s)
    rows, detail, matched = [], [], {}
    drafts_models = {p: glm.MoEModel(weights, meta, "full", expert_precision=p)
                     for p in s.precisions}
    for frac in s.fractions:
        pols = ("all",) if _capacity(frac, E) >= E else s.policies
        for pol in pols:
            res = resident_sets(pol if pol != "all" else "random", frac, experts, starts, E, s, hot)
            for prec in s.precisions:
                tt = time.monotonic()
                d = drafts_models[prec].draft_rounds(cache, starts, first, res, s.max_draft)
                m = acceptance(d, toks, starts, s.max_draft)
                st = accepted_stats(m, s.max_draft)
                for pol_out in ((s.policies if pol == "all" else (pol,))):
                    for r in st:
                        rows.append(dict(draft_len=r["draft_len"], resident_fraction=frac,
                                         policy=pol_out, precision=prec,
                                         acceptance_rate=r["acceptance_rate"],
                                         mean_accepted=r["mean_accepted"]))
                matched[(frac, pol, prec)] = m
                detail.append(dict(resident_fraction=frac, policy=pol, precision=prec,
                                   matched_hist=np.bincount(m.ravel(), minlength=s.max_draft + 1)
                                   .tolist(), seconds=time.monotonic() - tt))
                log(f"  residents {frac:.0%} {pol:12s} {prec:9s}: mean accepted at L=4 "
                    f"{st[3]['mean_accepted']:.3f}, L=8 {st[7]['mean_accepted']:.3f} "
                    f"({time.monotonic() - tt:.1f}s)")
    result["acceptance"] = rows
    result["acceptance_detail"] = detail

    # batches sharing one resident set (one HB expert cache), MSB-augmented drafts
    batched, matched_b = [], {}
    aug = drafts_models.get("augmented") or glm.MoEModel(weights, meta, "full",
                                                         expert_precision="augmented")
    for g in s.batch_groups:
        hot_g = _hot_rank_snapshots(experts, starts, E, s, g)
        for frac in [f for f in s.fractions if _capacity(f, E) < E]:
            for pol in s.batch_policies:
                tt = time.monotonic()
                res = resident_sets(pol, frac, experts, starts, E, s, hot_g, group=g)
                m = acceptance(aug.draft_rounds(cache, starts, first, res, s.max_draft), toks,
                               starts, s.max_draft)
                matched_b[(g, frac, pol)] = m
                st = accepted_stats(m, s.max_draft)
                batched += [dict(batch=g, resident_fraction=frac, policy=pol, precision="augmented",
                                 **r) for r in st]
                log(f"  batch {g:2d} residents {frac:.0%} {pol:12s} augmented: mean accepted at "
                    f"L=4 {st[3]['mean_accepted']:.3f} ({time.monotonic() - tt:.1f}s)")
    result["batched"] = batched
    result["batched_ci"] = batched_intervals(matched, matched_b, s)

    # a sequential SD loop with the tag unit fed by draft routing (the hardware policy)
    loop = []
    if s.sd_loop_draft:
        for frac in [f for f in s.fractions if _capacity(f, E) < E]:
            for pol in ("hotness", "random"):
                tt = time.monotonic()
                r = sd_loop(aug, cache, toks, experts, s, frac, pol, s.sd_loop_draft)
                loop.append(r)
                log(f"  SD loop residents {frac:.0%} {pol:8s} augmented L={s.sd_loop_draft}: "
                    f"mean accepted {r['mean_accepted']:.3f} over {r['iterations']} iterations "
                    f"({time.monotonic() - tt:.1f}s)")
    result["sd_loop"] = loop
    result["rounds"] = int(prompts.shape[0] * len(starts))
    result["claims"] = claims(rows, s)
    result["claims_ci"] = gain_intervals(matched, s)
    result["seconds"] = time.monotonic() - t0
    if acceptance_path is not None:
        Path(acceptance_path).write_text(json.dumps(rows, indent=1) + "\n")
    return result


def _new_tag_unit(C, L, E, s: Setup):
    return TagUnitModel(slots=max(2, C), layer_bits=max(1, (L - 1).bit_length()),
                        expert_bits=max(1, (E - 1).bit_length()), hot_bits=s.hot_bits,
                        decay_shift=s.decay_shift)


def _fill(tu, l, experts, amount):
    """Verification of a token: lookup each routed expert; a miss fills its
    MSB slice into HB (allocate, evicting the coldest unpinned slot)."""
    for e in experts:
        tag = tu.make_tag(l, int(e))
        if tu.lookup(tag)[0]:
            tu.touch(tag, amount)
        else:
            tu.allocate(tag, planes=1, hot=amount)


def sd_loop(model, cache, toks, experts, s: Setup, fraction: float, policy: str,
            n_draft: int = 4) -> dict:
    """Sequential Elastic-SD with greedy verification, every prompt on its own.

    Each iteration drafts ``n_draft`` bytes from the last accepted byte with
    the current resident set, accepts the matched prefix ``a`` and advances by
    ``a + 1`` (the target's correction/bonus byte). ``policy``:

    ``hotness``
        One tag unit per prompt and layer (``C`` slots), the hardware policy:
        the prompt prefill fills it; during drafting every drafted byte's
        *unrestricted* router top-k touches its experts (decayed one-hot
        accumulation, no-op for non-resident ones); verification of the
        accepted bytes looks their experts up and fills misses (MSB fill,
        evicting the coldest); ``decay()`` once per iteration.
    ``random``
        A fixed random set per prompt and layer.

    Approximation: verification fills use the target's routing of the
    accepted bytes only (rejected draft bytes are not re-run through the
    target). Returns mean accepted drafts and bytes per iteration.
    """
    B, T, L, k = experts.shape
    E = model.E
    C = _capacity(fraction, E)
    P = s.prompt_len
    last = toks.shape[1] - 1 - n_draft                # last position a draft can start from
    pos = np.full(B, P - 1)
    if policy == "random":
        fixed = resident_sets("random", fraction, experts, s.starts()[:1], E, s)[:, 0]
    elif policy == "hotness":
        tus = [[_new_tag_unit(C, L, E, s) for _ in range(L)] for _ in range(B)]
        for b in range(B):
            for l in range(L):
                for t in range(P - 1):
                    _fill(tus[b][l], l, experts[b, t, l], s.touch_amount)
                    if (t + 1) % s.decay_every == 0:
                        tus[b][l].decay()
    else:
        raise ValueError(f"SD-loop policy must be hotness or random, not {policy!r}")
    acc = []
    hit = [0, 0]
    while True:
        active = pos <= last
        if not active.any():
            break
        p = np.where(active, pos, min(int(pos.min()), last))
        if policy == "random":
            res = fixed
        else:
            res = np.ones((B, L, E), bool)              # finished prompts: anything
            for b in np.flatnonzero(active):
                res[b] = False
                for l in range(L):
                    tu = tus[b][l]
                    for slot in range(tu.slots):
                        if tu.valid[slot]:
                            res[b, l, tu.tags[slot] & ((1 << tu.expert_bits) - 1)] = True
        d, r = model.draft_rounds(cache, p[:, None], toks[np.arange(B), p][:, None],
                                  res[:, None], n_draft, return_routing=True)
        want = np.stack([toks[np.arange(B), p + 1 + i] for i in range(n_draft)], -1)
        ok = d[:, 0] == want
        a = np.where(ok.all(-1), n_draft, np.argmin(ok, -1))
        for b in np.flatnonzero(active):
            acc.append(int(a[b]))
            if policy == "hotness":
                for l in range(L):
                    tu = tus[b][l]
                    for i in range(n_draft):             # drafting: one-hot accumulation
                        for e in r[b, 0, i, l]:
                            hit[0] += 1
                            hit[1] += tu.touch(tu.make_tag(l, int(e)), s.touch_amount)
                    for i in range(min(int(a[b]) + 1, T - p[b])):   # verify accepted bytes
                        _fill(tu, l, experts[b, p[b] + i, l], s.touch_amount)
                    tu.decay()
            pos[b] += int(a[b]) + 1
    acc = np.asarray(acc)
    return dict(resident_fraction=fraction, policy=policy, precision=model.expert_precision,
                draft_len=n_draft, iterations=int(len(acc)), mean_accepted=float(acc.mean()),
                acceptance_rate=float(acc.mean() / n_draft),
                bytes_per_iteration=float(acc.mean() + 1),
                draft_resident_rate=(hit[1] / hit[0]) if hit[0] else None)


def gain_intervals(matched: dict, s: Setup, n_boot: int = 2000) -> dict:
    """95 % bootstrap intervals (resampling prompts) of the relative gains in
    mean accepted length (mean over draft lengths 1..max_draft and the partial
    resident fractions): hotness vs random (augmented) and augmented vs
    truncated (hotness)."""
    fr = [f for f in s.fractions if f < 1]
    Ls = np.arange(1, s.max_draft + 1)

    def per_prompt(pol, prec):
        ms = [matched.get((f, pol, prec)) for f in fr]
        if not ms or any(m is None for m in ms):
            return None
        # mean over rounds, draft lengths and fractions, per prompt
        return np.mean([np.minimum(m[..., None], Ls).mean((1, 2)) for m in ms], axis=0)

    rng = np.random.default_rng(s.seed)
    out = {}
    for name, a, b in (("hotness_vs_random", ("hotness", "augmented"), ("random", "augmented")),
                       ("hotness_rank_vs_random", ("hotness-rank", "augmented"),
                        ("random", "augmented")),
                       ("augmented_vs_truncated", ("hotness", "augmented"),
                        ("hotness", "truncated"))):
        x, y = per_prompt(*a), per_prompt(*b)
        if x is None or y is None:
            continue
        idx = rng.integers(0, len(x), (n_boot, len(x)))
        g = x[idx].mean(1) / y[idx].mean(1) - 1
        out[name] = dict(gain=float(x.mean() / y.mean() - 1), ci95=[float(np.percentile(g, 2.5)),
                                                                    float(np.percentile(g, 97.5))],
                         prompts=int(len(x)))
    return out


def batched_intervals(matched: dict, matched_b: dict, s: Setup, n_boot: int = 2000) -> dict:
    """Hotness vs random gain in mean accepted length (augmented, mean over
    draft lengths and partial fractions) per batch size, with a 95 % bootstrap
    interval resampling batches (members of a batch share residents)."""
    fr = [f for f in s.fractions if f < 1]
    Ls = np.arange(1, s.max_draft + 1)
    rng = np.random.default_rng(s.seed + 1)
    out = {}
    for g in (1,) + tuple(s.batch_groups):
        src = (lambda pol, f: matched.get((f, pol, "augmented"))) if g == 1 else \
              (lambda pol, f, g=g: matched_b.get((g, f, pol)))
        ms = {pol: [src(pol, f) for f in fr] for pol in ("hotness", "random")}
        if any(m is None for v in ms.values() for m in v) or not fr:
            continue
        per = {pol: np.mean([np.minimum(m[..., None], Ls).mean((1, 2)) for m in v], axis=0)
               for pol, v in ms.items()}
        x = per["hotness"].reshape(-1, g).mean(1)
        y = per["random"].reshape(-1, g).mean(1)
        idx = rng.integers(0, len(x), (n_boot, len(x)))
        boot = x[idx].mean(1) / y[idx].mean(1) - 1
        out[str(g)] = dict(hotness=float(x.mean()), random=float(y.mean()),
                           gain=float(x.mean() / y.mean() - 1), batches=int(len(x)),
                           ci95=[float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))])
    return out


def _get(rows, **kw):
    for r in rows:
        if all(r[k] == v for k, v in kw.items()):
            return r
    return None


def claims(rows, s: Setup) -> dict:
    """The paper's claims, checked on the measured rows (mean over draft
    lengths 1..max_draft and the partial resident fractions)."""
    fr = [f for f in s.fractions if f < 1]
    Ls = range(1, s.max_draft + 1)

    def mean_acc(policy, precision, fracs=fr):
        v = [_get(rows, draft_len=L, resident_fraction=f, policy=policy, precision=precision)
             for f in fracs for L in Ls]
        v = [r["mean_accepted"] for r in v if r]
        return float(np.mean(v)) if v else None

    out = {}
    if "hotness" in s.policies and "random" in s.policies and "augmented" in s.precisions:
        h, r = mean_acc("hotness", "augmented"), mean_acc("random", "augmented")
        hr = mean_acc("hotness-rank", "augmented") if "hotness-rank" in s.policies else None
        o = mean_acc("oracle", "augmented") if "oracle" in s.policies else None
        out["hotness_vs_random"] = dict(hotness=h, hotness_rank=hr, random=r, oracle=o,
                                        gain=(h / r - 1) if r else None,
                                        gain_rank=(hr / r - 1) if (r and hr is not None) else None,
                                        paper_gain=0.22)
        per = {}
        for f in fr:
            a, b = mean_acc("hotness", "augmented", [f]), mean_acc("random", "augmented", [f])
            per[str(f)] = (a / b - 1) if b else None
        out["hotness_vs_random"]["gain_per_fraction"] = per
    if "augmented" in s.precisions and "truncated" in s.precisions:
        pol = "hotness" if "hotness" in s.policies else s.policies[0]
        a1 = _get(rows, draft_len=s.max_draft, resident_fraction=1.0, policy=pol, precision="augmented")
        t1 = _get(rows, draft_len=s.max_draft, resident_fraction=1.0, policy=pol, precision="truncated")
        out["augmented_vs_truncated"] = dict(
            policy=pol, augmented=mean_acc(pol, "augmented"), truncated=mean_acc(pol, "truncated"),
            full=mean_acc(pol, "full") if "full" in s.precisions else None,
            all_resident_augmented=a1 and a1["acceptance_rate"],
            all_resident_truncated=t1 and t1["acceptance_rate"])
    return out

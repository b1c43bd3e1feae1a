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

The bit axis
------------
Beside the paper's design point (4-bit slices, keep the MSB plane, INT8
weights with per-channel scales) every model is measured at the bit-slice
*variants* ``Setup.variants``: 2-bit slices keeping 1, 2 or 3 of 4 planes,
and per-tensor instead of per-channel INT8 scales (whose target is then the
per-tensor INT8 model). Per variant and precision (truncated, augmented,
FULL): perplexity and top-1 agreement with the target on held-out windows,
the relative dot-product error of the draft weights (golden bit-slice model
on the activations measured at the experts' inputs), and Elastic-SD
acceptance with hotness residents, draft lengths 1..8. Every row also carries
the measured *overlap*: the fraction of the target's top-k experts at the
drafted positions that were resident - the expert-axis input of the system
model's acceptance fit (:func:`fit_acceptance`).

Across training runs
--------------------
:func:`run` measures every committed model (:func:`elmoe3d.golden.lm.model_paths`:
the original seed-1234 model and the retrained seeds) with the same setup
and reports every conclusion per model (with its within-model bootstrap
interval over prompts) and as the mean and spread across models
(``across_models``); the acceptance table for the system model is the mean
over models.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from elmoe3d.golden import lm as glm
from elmoe3d.golden.lm import PROMPTS, WINDOWS, heldout_prompts, heldout_windows
from elmoe3d.golden.tag_unit import TagUnitModel

__all__ = ["Setup", "DATA_DIR", "PROMPTS", "WINDOWS", "ACCEPTANCE", "RESULT",
           "heldout_prompts", "heldout_windows", "make_heldout", "perplexities",
           "routing_stats", "working_set", "resident_sets", "acceptance", "run",
           "write_trace", "POLICIES", "DRAFT_PRECISIONS", "VARIANTS", "PRIMARY",
           "bit_axis_quality", "precision_errors", "overlap_by_len", "fit_acceptance",
           "variant_name"]

DATA_DIR = glm.DATA_DIR
ACCEPTANCE = "acceptance.json"
RESULT = "evidence.json"
TRACE = "routing_trace.npz"

POLICIES = ("hotness", "hotness-rank", "random", "oracle")
DRAFT_PRECISIONS = ("truncated", "augmented", "full")
#: the paper's design point: 4-bit slices, keep the MSB plane, per-channel INT8 scales
PRIMARY = (4, 1, "channel")
#: bit-slice variants measured beside it: (slice bits, kept planes, INT8 scales)
VARIANTS = (PRIMARY, (4, 1, "tensor"), (2, 1, "channel"), (2, 2, "channel"), (2, 3, "channel"),
            (2, 1, "tensor"), (2, 2, "tensor"), (2, 3, "tensor"))


def variant_name(v) -> str:
    """``s4k1-channel`` for (4, 1, "channel")."""
    return f"s{v[0]}k{v[1]}-{v[2]}"


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
    variants: tuple = VARIANTS
    variant_fractions: tuple = (0.25, 0.5, 0.75, 1.0)
    dense_msb: bool = True
    rtn4: bool = True
    models: tuple = ()
    touch_amount: int = 8
    decay_every: int = 8
    decay_shift: int = 1
    hot_bits: int = 8
    seed: int = 2026

    def planned_steps(self, experts: int) -> int:
        """How many progress lines (``log`` calls) one model's run writes, for
        a progress total: the model line, perplexity, the target decode, each
        measured (variant, residents, policy, precision), each batched point
        and each SD-loop point -- the loops of ``_run_model``, counted."""
        small = [f for f in self.fractions if _capacity(f, experts) < experts]
        n = 3
        n += sum(len(self.precisions) * (1 if _capacity(f, experts) >= experts
                                         else len(self.policies)) for f in self.fractions)
        full_done = {("channel", f) for f in self.fractions}
        for v in self.variants:
            if v == PRIMARY:
                continue
            for f in self.variant_fractions:
                n += 2 + ((v[2], f) not in full_done)
                full_done.add((v[2], f))
        n += len(self.variant_fractions) if self.dense_msb else 0
        n += 1 if self.rtn4 else 0
        n += len(self.batch_groups) * len(small) * len(self.batch_policies)
        n += 2 * len(small) if self.sd_loop_draft else 0
        return n

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
        for v in self.variants:
            if (not isinstance(v, tuple) or len(v) != 3 or v[0] not in (1, 2, 4)
                    or not isinstance(v[1], int) or not 1 <= v[1] < 8 // v[0]
                    or v[2] not in glm.SCALES):
                raise ValueError(f"Bit-slice variant must be (slice bits 1/2/4, kept planes "
                                 f"1..n-1, scales channel/tensor), not {v!r}")
        for f in self.variant_fractions:
            if not 0 < f <= 1:
                raise ValueError(f"Resident fraction must be in (0, 1], not {f!r}")
        known = glm.model_paths()
        for m in self.models:
            if m not in known:
                raise ValueError(f"Unknown trained model {m!r}; committed: {', '.join(known)}")

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


# --- bit axis: quality, errors, overlap --------------------------------------------------------

def _forward_stats(model, windows, batch=32):
    """Cross-entropy (nats/byte) and the argmax byte of every position."""
    tot, n, arg = 0.0, 0, []
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        logits, _ = model.forward(w[:, :-1])
        tot += glm.cross_entropy(logits, w[:, 1:]) * w[:, 1:].size
        n += w[:, 1:].size
        arg.append(np.argmax(logits, -1))
    return tot / n, np.concatenate(arg)


def bit_axis_quality(weights, meta, windows, variants=VARIANTS, extra: bool = True) -> list[dict]:
    """Perplexity and top-1 agreement with the target, per bit-slice variant
    and draft precision, on held-out windows (teacher forced). The target is
    the INT8 FULL model with the variant's scales; the MSB precisions apply to
    the experts (dense weights INT8 FULL, as in the draft at 100 % residency).
    ``extra`` adds float, the independent 4-bit copy (``rtn4``, per channel)
    and the MSB-augmented draft with the dense weights augmented too."""
    rows, target = [], {}
    for sc in sorted({v[2] for v in variants} | {"channel"}):
        ce, arg = _forward_stats(glm.MoEModel(weights, meta, "full", scales=sc), windows)
        target[sc] = arg
        rows.append(dict(slice_bits=None, keep=None, scales=sc, precision="full",
                         dense_precision="full", nats_per_byte=ce, ppl=math.exp(ce), agreement=1.0))

    def add(model, v, prec, dense="full"):
        ce, arg = _forward_stats(model, windows)
        rows.append(dict(slice_bits=v[0] if v else None, keep=v[1] if v else None,
                         scales=v[2] if v else "channel", precision=prec, dense_precision=dense,
                         nats_per_byte=ce, ppl=math.exp(ce),
                         agreement=float(np.mean(arg == target[v[2] if v else "channel"]))))
    for v in variants:
        for prec in ("truncated", "augmented"):
            add(glm.MoEModel(weights, meta, "full", expert_precision=prec, slice_bits=v[0],
                             keep=v[1], scales=v[2]), v, prec)
    if extra:
        add(glm.MoEModel(weights, meta, "float"), None, "float", "float")
        add(glm.MoEModel(weights, meta, "full", expert_precision="rtn4"), None, "rtn4")
        add(glm.MoEModel(weights, meta, "augmented", expert_precision="augmented"), PRIMARY,
            "augmented", "augmented")
    return rows


def precision_errors(weights, meta, windows, variants=VARIANTS) -> dict:
    """Relative RMS error of the experts' dot products with draft weights,
    from the golden bit-slice model on the activations *measured* at the
    experts' inputs (the FFN input of every routed token, and the down
    projection's input), quantised to INT8 per tensor as the PE sees them:
    ``err = ||a @ W_draft - a @ W_int8|| / ||a @ W_int8||`` over every expert
    matrix of every layer. Returns ``{"errors": {name: err}, "activations":
    [per-layer statistics]}`` with names ``s4k1-channel-augmented``, ...,
    ``rtn4``."""
    target = glm.MoEModel(weights, meta, "full")
    target.taps = []
    target.forward(windows[:, :-1])
    taps, target.taps = target.taps, None
    acc: dict = {}
    act = []

    def add(name, y, ref):
        a = acc.setdefault(name, [0.0, 0.0])
        a[0] += float(np.sum((y - ref) ** 2))
        a[1] += float(np.sum(ref ** 2))

    scales = sorted({v[2] for v in variants} | {"channel"})
    for layer, x, ex in taps:
        ex = ex.astype(np.int64)
        hs = []
        for e in np.unique(ex).tolist():
            X = x[(ex == e).any(-1)]
            Wg, Wu, Wd = (weights[f"l{layer}.{n}"][e] for n in ("w_gate", "w_up", "w_down"))
            G = X @ glm.effective_matrix(Wg, "full").T
            H = G / (1.0 + np.exp(-G)) * (X @ glm.effective_matrix(Wu, "full").T)
            hs.append(H)
            for A, W in ((X, Wg), (X, Wu), (H, Wd)):
                amax = float(np.abs(A).max()) or 1.0
                aq = np.rint(A / (amax / 127.0)).astype(np.float32)
                ref = {sc: aq @ glm.effective_matrix(W, "full", scales=sc).T for sc in scales}
                for v in variants:
                    for prec in ("truncated", "augmented"):
                        y = aq @ glm.effective_matrix(W, prec, v[0], v[1], v[2]).T
                        add(f"{variant_name(v)}-{prec}", y, ref[v[2]])
                add("rtn4", aq @ glm.effective_matrix(W, "rtn4").T, ref["channel"])
        H = np.concatenate(hs) if hs else np.zeros((0, 1))
        act.append(dict(layer=layer, tokens=int(len(x)),
                        ffn_in_mean=float(x.mean()), ffn_in_std=float(x.std()),
                        ffn_in_absmax_over_std=float(np.abs(x).max() / (x.std() or 1)),
                        down_in_mean=float(H.mean()), down_in_std=float(H.std()),
                        down_in_absmax_over_std=float(np.abs(H).max() / (H.std() or 1))))
    return dict(errors={k: math.sqrt(a / b) if b else 0.0 for k, (a, b) in acc.items()},
                activations=act)


def overlap_by_len(res: np.ndarray, experts: np.ndarray, starts, max_draft: int) -> np.ndarray:
    """Expert-axis overlap per draft length ``L = 1..max_draft``: the fraction
    of the target's top-k experts at the drafted positions ``start .. start +
    L - 1`` that are resident (``res[B, R, L, E]``), mean over rounds."""
    B, R, Ly, E = res.shape
    pos = np.asarray(starts)[:, None] + np.arange(max_draft)[None, :]            # [R, D]
    ex = experts[:, pos].astype(np.int64)                                       # [B, R, D, Ly, k]
    b = np.arange(B)[:, None, None, None, None]
    r = np.arange(R)[None, :, None, None, None]
    ly = np.arange(Ly)[None, None, None, :, None]
    per_pos = res[b, r, ly, ex].mean(axis=(0, 1, 3, 4))                          # [D]
    return np.cumsum(per_pos) / np.arange(1, max_draft + 1)


def per_token_rate(mean_accepted: float, draft_len: int) -> float:
    """Per-token rate ``a`` with ``sum(a**i, i = 1..L) = mean_accepted``."""
    m = min(max(float(mean_accepted), 0.0), draft_len)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, draft_len + 1)) < m:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _row_error(r, errors):
    if r["precision"] == "full":
        return 0.0
    if r["precision"] == "rtn4":
        return errors.get("rtn4")
    v = (r.get("slice_bits", 4), r.get("keep", 1), r.get("scales", "channel"))
    return errors.get(f"{variant_name(v)}-{r['precision']}")


def fit_acceptance(rows, errors) -> dict:
    """Fit the system model's acceptance model
    ``a = a_max * overlap**beta * exp(-gamma * err**2)`` to measured rows:
    ``a`` = the per-token rate solved from each row's ``mean_accepted``,
    ``overlap`` = the row's measured overlap, ``err`` = the measured
    dot-product error of its precision (:func:`precision_errors`). Least
    squares on ``log a`` (rows with ``a`` >= 0.01), ``a_max`` capped at 1
    (then beta and gamma refitted). Returns the parameters, the number of rows
    and the fit's RMS error on ``a``."""
    X, y, A = [], [], []
    for r in rows:
        if r.get("dense_precision", "full") != "full" or r.get("overlap") is None:
            continue
        err = _row_error(r, errors)
        if err is None:
            continue
        a = per_token_rate(r["mean_accepted"], int(r["draft_len"]))
        ov = max(float(r["overlap"]), 1e-6)
        A.append((a, ov, err))
        if a >= 0.01:
            X.append([1.0, math.log(ov), -err * err])
            y.append(math.log(a))
    if len(X) < 3:
        raise ValueError(f"Too few measured rows ({len(X)}) to fit the acceptance model")
    X, y = np.asarray(X), np.asarray(y)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    a_max, beta, gamma = math.exp(coef[0]), float(coef[1]), float(coef[2])
    if a_max > 1.0:
        a_max = 1.0
        (beta, gamma), *_ = np.linalg.lstsq(X[:, 1:], y, rcond=None)
        beta, gamma = float(beta), float(gamma)
    A = np.asarray(A)
    pred = a_max * A[:, 1] ** beta * np.exp(-gamma * A[:, 2] ** 2)
    return dict(a_max=a_max, beta=beta, gamma=gamma, rows=int(len(A)),
                rmse=float(np.sqrt(np.mean((pred - A[:, 0]) ** 2))),
                max_abs_error=float(np.max(np.abs(pred - A[:, 0]))),
                form="a = a_max * overlap**beta * exp(-gamma * err**2)")


# --- the whole run ----------------------------------------------------------------------------

def run(setup: Setup | None = None, weights_meta=None, log=print, trace_path: Path | None = None,
        acceptance_path: Path | None = None) -> dict:
    """Measure everything on every selected model; returns a JSON-able dict
    (see ``elmoe3d evidence``). ``weights_meta`` (one ``(weights, meta)``
    pair) replaces the committed models by that one model."""
    with glm.single_thread_blas():
        return _run(setup, weights_meta, log, trace_path, acceptance_path)


def _models(s: Setup, weights_meta):
    if weights_meta is not None:
        return [("given", None, weights_meta)]
    paths = glm.model_paths()
    names = list(s.models) or list(paths)
    return [(n, paths[n], None) for n in names]


def _run(setup, weights_meta, log, trace_path, acceptance_path) -> dict:
    s = setup or Setup()
    t0 = time.monotonic()
    setup_d = {k_: (list(v) if isinstance(v, tuple) else v) for k_, v in asdict(s).items()}
    setup_d["variants"] = [list(v) for v in s.variants]
    per_model, models = {}, []
    for i, (name, path, wm) in enumerate(_models(s, weights_meta)):
        w, meta = wm if wm is not None else glm.load_weights(path)
        log(f"model {name} ({i + 1}): seed {meta.get('train', {}).get('seed')}")
        res = _run_model(w, meta, s, log, trace_path if i == 0 else None)
        res["name"] = name
        per_model[name] = res
        models.append(dict(name=name, seed=meta.get("train", {}).get("seed"),
                           path=str(path.relative_to(DATA_DIR)) if path is not None else None,
                           weights_sha256=glm.weights_digest(path) if path is not None else None,
                           val_ppl_training=meta.get("val_ppl"), torch=meta.get("torch"),
                           train_wall_s=meta.get("train_wall_s")))
    primary = models[0]["name"]
    result = dict(per_model[primary])                 # the first model's full result at top level
    result.update(setup=setup_d, models=models, primary=primary,
                  per_model={n: _trim(r) for n, r in per_model.items()})
    result["across_models"] = across_models(per_model, s)
    rows = mean_rows([per_model[n]["acceptance"] for n in per_model])
    errs = _mean_dicts([per_model[n]["precision_error"]["errors"] for n in per_model])
    result["acceptance_mean"] = rows
    result["precision_error_mean"] = errs
    try:
        result["acceptance_fit"] = fit_acceptance(
            [r for n in per_model for r in per_model[n]["acceptance"]], errs)
    except ValueError as e:
        result["acceptance_fit"] = dict(error=str(e))
    result["seconds"] = time.monotonic() - t0
    if acceptance_path is not None:
        Path(acceptance_path).write_text(json.dumps(dict(
            format="elmoe3d-acceptance", version=2,
            source="elmoe3d evidence (small MoE LM, greedy verification; mean over models)",
            models=models, rows=rows, precision_error=errs, fit=result["acceptance_fit"],
            activations=per_model[primary]["precision_error"]["activations"]), indent=1) + "\n")
    return result


def _trim(r: dict) -> dict:
    """A model's result without the bulky parts kept only for the primary model."""
    return {k: v for k, v in r.items() if k not in ("routing", "working_set", "acceptance_detail",
                                                    "trace", "acceptance", "batched")}


def _mean_dicts(ds):
    keys = set().union(*ds) if ds else set()
    return {k: float(np.mean([d[k] for d in ds if k in d])) for k in sorted(keys)}


ROW_KEY = ("slice_bits", "keep", "scales", "dense_precision", "policy", "resident_fraction",
           "precision", "draft_len")


def mean_rows(row_sets) -> list[dict]:
    """Acceptance rows averaged over models (same keys), with the spread
    across models (``*_std``, ``*_min``, ``*_max``) and the model count."""
    groups: dict = {}
    for rows in row_sets:
        for r in rows:
            groups.setdefault(tuple(r.get(k) for k in ROW_KEY), []).append(r)
    out = []
    for key, rs in groups.items():
        row = dict(zip(ROW_KEY, key))
        for f in ("acceptance_rate", "mean_accepted", "overlap"):
            v = [r[f] for r in rs if r.get(f) is not None]
            if v:
                row[f] = float(np.mean(v))
                if len(v) > 1:
                    row[f + "_std"] = float(np.std(v, ddof=1))
                    row[f + "_min"], row[f + "_max"] = float(min(v)), float(max(v))
        row["models"] = len(rs)
        out.append(row)
    return out


def _run_model(weights, meta, s: Setup, log, trace_path) -> dict:
    t0 = time.monotonic()
    shape = meta["shape"]
    E = shape["experts"]
    prompts = heldout_prompts(s.n_prompts)
    if len(prompts) < s.n_prompts:
        raise ValueError(f"Only {len(prompts)} held-out prompts stored, {s.n_prompts} requested")
    prompts = prompts[:, :s.prompt_len]
    result = dict(model=dict(shape=shape, val_loss_float_training=meta.get("val_loss"),
                             params=int(sum(v.size for v in weights.values())),
                             train_wall_s=meta.get("train_wall_s"), corpus=meta.get("corpus"),
                             train_bytes=meta.get("train_bytes"), val_bytes=meta.get("val_bytes"),
                             val_files=len(meta.get("val_files", [])),
                             seed=meta.get("train", {}).get("seed")))
    windows = heldout_windows(s.ppl_windows)
    log(f"  perplexity / agreement on {s.ppl_windows} held-out windows ...")
    result["perplexity"] = perplexities(weights, meta, windows)
    result["bit_axis"] = bit_axis_quality(weights, meta, windows, s.variants)
    result["precision_error"] = precision_errors(weights, meta, windows[:16], s.variants)

    log(f"  target (INT8 FULL) greedy decode of {s.n_prompts} prompts x {s.gen_len} bytes ...")
    targets = {}
    for sc in sorted({v[2] for v in s.variants} | {"channel"}):
        tgt = glm.MoEModel(weights, meta, "full", scales=sc)
        targets[sc] = (tgt,) + tuple(tgt.generate(prompts, s.gen_len))
    _, toks, routing, cache = targets["channel"]
    experts = routing.experts                        # [B, P+G-1, L, k] for the bytes fed
    result["routing"] = routing_stats(experts, routing.probs, E)
    result["working_set"] = working_set(experts, E, positions=np.arange(s.prompt_len - 1,
                                                                        experts.shape[1]))
    tmeta = dict(source="elmoe3d.sim.lm.evidence (target INT8 FULL, greedy)",
                 model="elmoe3d small MoE LM (issue 7)", num_experts=E,
                 sequences=int(experts.shape[0]),
                 tokens_per_sequence=int(experts.shape[1]), prompt_len=s.prompt_len,
                 train_seed=meta.get("train", {}).get("seed"))
    if trace_path is not None:
        result["trace"] = dict(path=str(trace_path), format=write_trace(trace_path, experts,
                                                                       routing.gates, tmeta))

    starts = s.starts()
    rows, detail, matched = [], [], {}

    def measure(v, frac, pol, prec, res, model, tgt_toks, tgt_experts, label_pols, dense="full"):
        tt = time.monotonic()
        cache_ = targets[v[2]][3]
        d = model.draft_rounds(cache_, starts, tgt_toks[:, starts], res, s.max_draft)
        m = acceptance(d, tgt_toks, starts, s.max_draft)
        ov = overlap_by_len(res, tgt_experts, starts, s.max_draft)
        st = accepted_stats(m, s.max_draft)
        for pol_out in label_pols:
            for r in st:
                rows.append(dict(draft_len=r["draft_len"], resident_fraction=frac, policy=pol_out,
                                 precision=prec, acceptance_rate=r["acceptance_rate"],
                                 mean_accepted=r["mean_accepted"], slice_bits=v[0], keep=v[1],
                                 scales=v[2], dense_precision=dense,
                                 overlap=float(ov[r["draft_len"] - 1])))
        matched[(variant_name(v), dense, frac, pol, prec)] = m
        detail.append(dict(variant=variant_name(v), dense_precision=dense, resident_fraction=frac,
                           policy=pol, precision=prec,
                           matched_hist=np.bincount(m.ravel(), minlength=s.max_draft + 1).tolist(),
                           seconds=time.monotonic() - tt))
        log(f"  {variant_name(v)} {dense:9s} residents {frac:.0%} {pol:12s} {prec:9s}: mean "
            f"accepted at L=4 {st[3]['mean_accepted']:.3f}, L=8 {st[-1]['mean_accepted']:.3f} "
            f"({time.monotonic() - tt:.1f}s)")
        return m

    # the design point: every policy, fraction and precision
    hot = _hot_rank_snapshots(experts, starts, E, s)
    res_cache = {}

    def res_for(pol, frac, ex, key):
        k = (pol, frac, key)
        if k not in res_cache:
            res_cache[k] = resident_sets(pol, frac, ex, starts, E, s,
                                         hot if key == "channel" else None)
        return res_cache[k]

    models = {}

    def model_for(prec, v, dense="full"):
        k = (prec, v, dense)
        if k not in models:
            models[k] = glm.MoEModel(weights, meta, dense, expert_precision=prec,
                                     slice_bits=v[0], keep=v[1], scales=v[2])
        return models[k]

    for frac in s.fractions:
        pols = ("all",) if _capacity(frac, E) >= E else s.policies
        for pol in pols:
            res = res_for(pol if pol != "all" else "random", frac, experts, "channel")
            for prec in s.precisions:
                measure(PRIMARY, frac, pol, prec, res, model_for(prec, PRIMARY), toks, experts,
                        s.policies if pol == "all" else (pol,))
    # the bit-slice variants: hotness residents (and all resident), truncated / augmented / FULL.
    # FULL drafts do not depend on the slice width: measured once per scale and fraction.
    full_src = {("channel", f): variant_name(PRIMARY) for f in s.fractions}
    for v in s.variants:
        if v == PRIMARY:
            continue
        _, vt, vr, _ = targets[v[2]]
        for frac in s.variant_fractions:
            full_res = _capacity(frac, E) >= E
            pol = "all" if full_res else "hotness"
            res = res_for("random" if full_res else "hotness", frac, vr.experts, v[2])
            for prec in ("truncated", "augmented", "full"):
                src = full_src.get((v[2], frac)) if prec == "full" else None
                if src is not None:
                    rows.extend([dict(r, slice_bits=v[0], keep=v[1]) for r in rows
                                 if variant_name((r["slice_bits"], r["keep"], r["scales"])) == src
                                 and r["precision"] == "full" and r["resident_fraction"] == frac
                                 and r["policy"] == "hotness" and r["dense_precision"] == "full"])
                    if (src, "full", frac, pol, "full") in matched:
                        matched[(variant_name(v), "full", frac, pol, "full")] = \
                            matched[(src, "full", frac, pol, "full")]
                    continue
                measure(v, frac, pol, prec, res, model_for(prec, v), vt, vr.experts, ("hotness",))
                if prec == "full":
                    full_src[(v[2], frac)] = variant_name(v)
    # one dense precision for drafts: dense weights MSB-augmented as well (hotness)
    if s.dense_msb:
        for frac in s.variant_fractions:
            full_res = _capacity(frac, E) >= E
            res = res_for("random" if full_res else "hotness", frac, experts, "channel")
            measure(PRIMARY, frac, "all" if full_res else "hotness", "augmented", res,
                    model_for("augmented", PRIMARY, "augmented"), toks, experts, ("hotness",),
                    dense="augmented")
    # a separate 4-bit draft model: an independent 4-bit copy of every expert (all resident)
    if s.rtn4:
        res = np.ones((s.n_prompts, len(starts), shape["n_layers"], E), bool)
        measure(PRIMARY, 1.0, "all", "rtn4", res, model_for("rtn4", PRIMARY), toks, experts,
                ("hotness",))
    result["acceptance"] = rows
    result["acceptance_detail"] = detail

    # batches sharing one resident set (one HB expert cache), MSB-augmented drafts
    batched, matched_b = [], {}
    aug = model_for("augmented", PRIMARY)
    for g in s.batch_groups:
        hot_g = _hot_rank_snapshots(experts, starts, E, s, g)
        for frac in [f for f in s.fractions if _capacity(f, E) < E]:
            for pol in s.batch_policies:
                tt = time.monotonic()
                res = resident_sets(pol, frac, experts, starts, E, s, hot_g, group=g)
                m = acceptance(aug.draft_rounds(cache, starts, toks[:, starts], res, s.max_draft),
                               toks, starts, s.max_draft)
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
    prim = [r for r in rows if (r["slice_bits"], r["keep"], r["scales"]) == PRIMARY
            and r["dense_precision"] == "full" and r["precision"] in DRAFT_PRECISIONS]
    result["claims"] = claims(prim, s)
    result["claims_ci"] = gain_intervals(matched, s)
    result["bit_axis_claims"] = bit_axis_claims(rows, matched, result["bit_axis"], s)
    result["seconds"] = time.monotonic() - t0
    return result


def bit_axis_claims(rows, matched, quality, s: Setup, n_boot: int = 2000) -> list[dict]:
    """Per bit-slice variant: perplexity cost of truncated / augmented experts
    over the variant's INT8 target, top-1 agreement, and the augmented vs
    truncated gain in mean accepted length (hotness, partial fractions, mean
    over draft lengths) with a 95 % bootstrap interval over prompts, plus the
    all-resident acceptance rates at the longest draft."""
    out = []
    fr = [f for f in s.variant_fractions if f < 1]
    Ls = np.arange(1, s.max_draft + 1)
    rng = np.random.default_rng(s.seed + 7)
    q = {(r["slice_bits"], r["keep"], r["scales"], r["precision"], r["dense_precision"]): r
         for r in quality}
    for v in s.variants:
        base = q.get((None, None, v[2], "full", "full"))
        row = dict(variant=variant_name(v), slice_bits=v[0], keep=v[1], scales=v[2],
                   draft_bits=v[0] * v[1])
        for prec in ("truncated", "augmented"):
            qq = q.get((v[0], v[1], v[2], prec, "full"))
            if qq and base:
                row[f"{prec}_ppl"] = qq["ppl"]
                row[f"{prec}_ppl_cost"] = qq["ppl"] / base["ppl"] - 1
                row[f"{prec}_agreement"] = qq["agreement"]
            a1 = _get(rows, draft_len=s.max_draft, resident_fraction=1.0, policy="hotness",
                      precision=prec, slice_bits=v[0], keep=v[1], scales=v[2],
                      dense_precision="full")
            row[f"{prec}_all_resident_rate"] = a1 and a1["acceptance_rate"]
        row["target_ppl"] = base and base["ppl"]
        vn = variant_name(v)
        per = {}
        for prec in ("truncated", "augmented"):
            ms = [matched.get((vn, "full", f, "hotness", prec)) for f in fr]
            if ms and all(m is not None for m in ms):
                per[prec] = np.mean([np.minimum(m[..., None], Ls).mean((1, 2)) for m in ms], axis=0)
        if len(per) == 2:
            x, y = per["augmented"], per["truncated"]
            idx = rng.integers(0, len(x), (n_boot, len(x)))
            g = x[idx].mean(1) / np.maximum(y[idx].mean(1), 1e-9) - 1
            row.update(augmented_mean_accepted=float(x.mean()), truncated_mean_accepted=float(y.mean()),
                       gain=float(x.mean() / max(y.mean(), 1e-9) - 1),
                       ci95=[float(np.percentile(g, 2.5)), float(np.percentile(g, 97.5))])
        out.append(row)
    return out


def across_models(per_model: dict, s: Setup) -> dict:
    """Every conclusion as the value per model (with its within-model 95 %
    interval where one exists) and the mean, standard deviation and range
    across models."""
    out = {}

    def put(name, getter):
        vals, cis = {}, {}
        for n, r in per_model.items():
            try:
                v = getter(r)
            except (KeyError, TypeError, IndexError, StopIteration):
                v = None
            if v is None:
                continue
            if isinstance(v, tuple):
                v, ci = v
                cis[n] = ci
            vals[n] = float(v)
        if not vals:
            return
        x = np.array(list(vals.values()))
        out[name] = dict(values=vals, ci95_within=cis, mean=float(x.mean()),
                         std=float(x.std(ddof=1)) if len(x) > 1 else 0.0,
                         min=float(x.min()), max=float(x.max()), models=len(x))

    put("hotness_vs_random", lambda r: (r["claims_ci"]["hotness_vs_random"]["gain"],
                                        r["claims_ci"]["hotness_vs_random"]["ci95"]))
    put("hotness_rank_vs_random", lambda r: (r["claims_ci"]["hotness_rank_vs_random"]["gain"],
                                             r["claims_ci"]["hotness_rank_vs_random"]["ci95"]))
    put("augmented_vs_truncated", lambda r: (r["claims_ci"]["augmented_vs_truncated"]["gain"],
                                             r["claims_ci"]["augmented_vs_truncated"]["ci95"]))
    for b in ("4", "16"):
        put(f"hotness_vs_random_batch{b}", lambda r, b=b: (r["batched_ci"][b]["gain"],
                                                          r["batched_ci"][b]["ci95"]))
    for f in s.fractions:
        if f < 1:
            put(f"sd_loop_hotness_vs_random_{int(f * 100)}pct", lambda r, f=f: (
                next(x for x in r["sd_loop"] if x["resident_fraction"] == f and x["policy"] == "hotness")
                ["mean_accepted"] / next(x for x in r["sd_loop"] if x["resident_fraction"] == f
                                         and x["policy"] == "random")["mean_accepted"] - 1))
    put("ppl_int8_vs_float", lambda r: r["perplexity"]["full"]["ppl"] / r["perplexity"]["float"]["ppl"] - 1)
    for v in s.variants:
        vn = variant_name(v)
        for key in ("gain", "truncated_ppl_cost", "augmented_ppl_cost", "truncated_agreement",
                    "augmented_agreement", "truncated_all_resident_rate",
                    "augmented_all_resident_rate"):
            def g(r, vn=vn, key=key):
                row = next(x for x in r["bit_axis_claims"] if x["variant"] == vn)
                if key == "gain":
                    return (row["gain"], row["ci95"]) if "gain" in row else None
                return row.get(key)
            put(f"{vn}:{key}", g)
    return out


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
        ms = [matched.get((variant_name(PRIMARY), "full", f, pol, prec)) for f in fr]
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
        g = x[idx].mean(1) / np.maximum(y[idx].mean(1), 1e-12) - 1
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
        src = (lambda pol, f: matched.get((variant_name(PRIMARY), "full", f, pol, "augmented"))) \
            if g == 1 else \
              (lambda pol, f, g=g: matched_b.get((g, f, pol)))
        ms = {pol: [src(pol, f) for f in fr] for pol in ("hotness", "random")}
        if any(m is None for v in ms.values() for m in v) or not fr:
            continue
        per = {pol: np.mean([np.minimum(m[..., None], Ls).mean((1, 2)) for m in v], axis=0)
               for pol, v in ms.items()}
        x = per["hotness"].reshape(-1, g).mean(1)
        y = per["random"].reshape(-1, g).mean(1)
        idx = rng.integers(0, len(x), (n_boot, len(x)))
        boot = x[idx].mean(1) / np.maximum(y[idx].mean(1), 1e-12) - 1
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

"""Golden token-batched MoE layer: the specification of the batched MoE
datapath (``hw/moe/``), numerics *and* weight traffic.

A step of ``n`` tokens of one layer runs in ``ceil(n / T)`` *passes* of up to
``T = Config.batch_tokens`` tokens (tokens ``0 .. T-1`` form the first pass,
and so on). Every token has its own **role** and allowed-expert mask:

=========  ================================================================
role       meaning
=========  ================================================================
FULL       INT8 weights, routing over all experts (an AR step)
DRAFT      LSB-augmented top ``k = hb_planes`` planes, routing only over the
           token's allowed (HB-resident) experts, highest-ranked first
VERIFY     as FULL (bit for bit); the role that lets a resident expert run
           *split*: MSB planes from HB, LSB planes from LPDDR
=========  ================================================================

Numerics (:func:`batched_forward`): per pass, router logits of every token
(``Wr @ x``, always FULL), per-token top-k (:func:`~elmoe3d.golden.moe_layer.route`:
ties to the lower index, DRAFT only allowed experts), integer softmax gates
(:func:`~elmoe3d.golden.moe_layer.gate_weights`); the tokens are then grouped
by expert and every expert runs once on its group (shared experts on every
token), each token at its own precision; the combine sums ``gate * d`` per
token and requantises. Integer sums do not depend on the order, so every
token's output equals :func:`elmoe3d.golden.moe_layer.forward` of that token
alone (``tests/test_golden_moe_batched.py`` proves it for every batch
composition); this module only regroups the work, it never re-implements an
integer primitive.

The pass plan (:func:`plan_pass`) — what the datapath announces and streams
---------------------------------------------------------------------------
*Jobs*, in this order (the **announce order**, part of the contract with the
Elastic-SD controller):

1. the shared experts ``E .. E+S-1`` (every token of the pass), from the HB
   dense region: the planes their precision needs (``0 .. k-1`` when every
   token of the pass is DRAFT, else all ``n``); they are not announced;
2. every routed expert that at least one token of the pass selected, once,
   in order of **decreasing token count, ties to the lower index** (heavy
   experts first: while the PEs work through an expert with many tokens the
   LPDDR port runs ahead into the weight buffer, which keeps a step that is
   balanced overall from losing LPDDR time to a heavy expert at its end).

A routed job's **precision** is DRAFT when all its tokens are DRAFT, else
VERIFY when any is VERIFY, else FULL; a DRAFT job needs planes
``0 .. k-1``, any other all ``n``. Its **source** is an input (the
controller's decision, :class:`Source`): ``hb`` with a slot — planes
``0 .. k-1`` from that HB slot and, if the job needs all planes, planes
``k .. n-1`` either from LPDDR (a *split* job: the two ports are consumed
concurrently and the partial sums add to FULL exactly) or, with ``lsb_hb``,
from a second HB slot ``lsb_slot`` that holds the expert's LSB plane group
(the expert is *whole-resident*: every plane from HB, nothing from LPDDR) —
or LPDDR for all the planes the job needs. A slot holds one plane group of
one expert: the MSB group (planes ``0 .. k-1``) or the LSB group (planes
``k .. n-1``, possible when ``n - k <= k``); what a slot holds is the
controller's choice (the bit axis of the elastic cache).

Weight traffic contract (:func:`pass_traffic`), per pass:

* HB (every bank alike, words per bank): the router (all ``n`` planes) and
  the pass constants (the bank's output-requantisation records and the
  softmax record; bank 0 also the SiLU table) once; per job its
  requantisation records once and, for a shared job or an HB-sourced job,
  its HB planes once (the whole slot; the dense expert's needed planes;
  the whole LSB slot of a whole-resident job);
* LPDDR (``ExtBeat`` beats of ``fill_words`` words): per job with LPDDR
  planes, exactly those planes once, in the order of
  :func:`elmoe3d.golden.layout.weight_beats` (bank fastest);
* nothing else, and **no expert's weights twice within a pass**.

Each beat is applied to every token of the job (weight reuse = tokens per
job).

Token lanes (the token-parallel PE array)
------------------------------------------
Each PE multiplies one slice vector with the activations of up to
``P = Config.token_lanes`` tokens in the same cycle. Token ``t`` of a pass
runs in lane ``t mod P`` (:func:`lane_of`); a beat carries at most one token
per lane. Per segment of a job the array takes the job's tokens in
**steps**: in each step every lane takes its next token of the job (lowest
position first), and tokens of different plane counts never share a step
(DRAFT tokens, ``k`` planes, first; then the others, ``n`` planes). A
segment therefore costs ``max over lanes`` of that lane's tokens of the job,
per plane-count class, times the class's planes times the segment's chunks
(:func:`lane_steps`); the router's ``count`` tokens cost
``ceil(count / P)`` steps of ``n`` planes. Numerics do not depend on the
lanes.

The analytic cycle bound of a pass is
``max(HB words per bank, LPDDR beats x cycles per beat, MAC beats per PE)``:
HB delivers one word per bank per cycle, LPDDR one beat per
``cycles_per_beat`` cycles (its bandwidth), a PE one slice vector per cycle
for all its lanes (MAC beats = steps times planes times chunks, over the
router and every job, :func:`pass_traffic`).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

import numpy as np

from ..geometry import expert_record_range, lut_share, record_words
from . import moe_layer as gm

__all__ = ["Role", "Source", "LPDDR", "Job", "PassPlan", "Traffic", "BatchResult",
           "announce_order", "precision_of", "job_precision", "pass_slices", "route_pass", "plan_pass",
           "batched_forward", "pass_traffic", "lut_share", "record_words",
           "expert_record_range", "analytic_pass_cycles", "with_sources", "lane_of",
           "prefetch_candidates",
           "lane_steps", "PlaneGroup"]


class Role(enum.IntEnum):
    """Precision role of one token (the hardware encoding, ``TokenRole``)."""
    FULL = 0
    DRAFT = 1
    VERIFY = 2


def precision_of(role) -> int:
    """The golden layer precision a role computes with (VERIFY is FULL)."""
    role = Role(role)
    return gm.Precision.DRAFT if role is Role.DRAFT else gm.Precision.FULL


def announce_order(counts: dict) -> list:
    """The announce order of a pass's routed experts (the contract with the
    Elastic-SD controller, one definition): decreasing token count, ties to
    the lower expert index. ``counts`` maps an expert to the number of the
    pass's tokens routed to it; returns the experts in that order."""
    return sorted(counts, key=lambda e: (-counts[e], e))


def pass_counts(sel, batch_tokens: int) -> list:
    """A step's passes and their routing: the step's tokens in passes of up to
    ``batch_tokens`` consecutive tokens; per pass ``(first, tokens, counts)``,
    ``counts`` mapping each routed expert to the number of the pass's tokens
    that selected it (``sel[t]`` = the experts of token ``t``). Its keys in
    :func:`announce_order` are the pass's announcements."""
    T = batch_tokens
    out = []
    for p0 in range(0, len(sel), T):
        counts = {}
        for s in sel[p0:p0 + T]:
            for e in s:
                counts[e] = counts.get(e, 0) + 1
        out.append((p0, min(T, len(sel) - p0), counts))
    return out


def job_precision(roles) -> Role:
    """Precision of a job from the roles of its tokens: DRAFT if all are
    DRAFT, else VERIFY if any is VERIFY, else FULL."""
    roles = {Role(r) for r in roles}
    if not roles:
        raise ValueError("A job needs at least one token")
    if roles == {Role.DRAFT}:
        return Role.DRAFT
    return Role.VERIFY if Role.VERIFY in roles else Role.FULL


class PlaneGroup(enum.IntEnum):
    """What an HB slot holds of an expert: its MSB planes ``0 .. k-1`` or its
    LSB planes ``k .. n-1``."""
    MSB = 0
    LSB = 1


@dataclass(frozen=True)
class Source:
    """Where a routed job's weights come from (the controller's decision):
    ``hb=True``: planes ``0 .. k-1`` from HB slot ``slot``; the rest, if
    needed, from HB slot ``lsb_slot`` when ``lsb_hb`` (whole-resident),
    else from LPDDR (split); ``hb=False``: every needed plane from LPDDR
    (``lsb_hb`` must then be ``False``)."""
    hb: bool = False
    slot: int = 0
    lsb_hb: bool = False
    lsb_slot: int = 0

    def __post_init__(self):
        if self.lsb_hb and not self.hb:
            raise ValueError("An LSB plane group from HB needs the MSB group from HB too "
                             f"(hb=False, lsb_hb=True, lsb_slot={self.lsb_slot!r})")


#: All planes from LPDDR.
LPDDR = Source(False, 0)


@dataclass(frozen=True)
class Job:
    """One expert of a pass: ``expert`` is the golden layer's index (routed
    ``< E``, shared ``E + s``); ``tokens`` are positions within the pass
    (ascending); ``hb_planes`` / ``ext_planes`` the planes the HB (MSB slot or
    dense region) and LPDDR ports carry; ``lsb_planes`` the planes read from
    the expert's LSB slot (HB)."""
    expert: int
    shared: bool
    tokens: tuple
    precision: Role
    source: Source | None
    hb_planes: tuple
    ext_planes: tuple
    lsb_planes: tuple = ()

    @property
    def split(self) -> bool:
        return bool(self.hb_planes) and bool(self.ext_planes)

    @property
    def whole_hb(self) -> bool:
        """Every plane the job needs comes from HB slots (MSB and LSB group)."""
        return bool(self.lsb_planes)


@dataclass
class PassPlan:
    """Routing and the job list of one pass (see the module doc)."""
    first: int                     # index of the pass's first token in the step
    roles: list                    # Role per token of the pass
    logits: np.ndarray             # (t, E)
    sel: list                      # selected experts per token, best first
    gates: list                    # Q12 gates per token (rank order)
    jobs: list                     # shared jobs, then routed jobs in announce order

    @property
    def routed(self) -> list:
        return [j for j in self.jobs if not j.shared]


@dataclass
class Traffic:
    """Weight traffic of one pass and its analytic cycle bound."""
    hb_words: list                 # words per bank
    ext_beats: int
    mac_beats: int
    hb_items: list = field(default_factory=list)     # (what, job expert or None, words)
    ext_items: list = field(default_factory=list)    # (expert, planes, beats)
    ext_cycles_per_beat: float = 1.0                 # LPDDR bandwidth (cycles per beat)

    @property
    def hb_beats(self) -> int:
        """HB port time: the busiest bank's words."""
        return max(self.hb_words)

    @property
    def ext_cycles(self) -> float:
        """LPDDR port time: its beats at the configured bandwidth."""
        return self.ext_beats * self.ext_cycles_per_beat

    @property
    def bound(self) -> float:
        return max(self.hb_beats, self.ext_cycles, self.mac_beats)


@dataclass
class BatchResult:
    y: np.ndarray                  # (n, H) int64
    acc: np.ndarray                # (n, H) combine sums
    passes: list                   # PassPlan per pass


def pass_slices(n: int, batch_tokens: int) -> list[range]:
    """Token ranges of the passes of a step of ``n`` tokens."""
    if n < 1:
        raise ValueError(f"A step needs at least one token, not {n!r}")
    return [range(a, min(a + batch_tokens, n)) for a in range(0, n, batch_tokens)]


def _check_inputs(layer, xs, roles, masks):
    xs = np.asarray(xs, dtype=np.int64)
    if xs.ndim != 2 or xs.shape[1] != layer.hidden:
        raise ValueError(f"Tokens must be (n, {layer.hidden}) INT8 values, not {xs.shape}")
    if xs.size and (xs.min() < -128 or xs.max() > 127):
        raise ValueError("Tokens must be INT8 values")
    roles = [Role(r) for r in roles]
    if len(roles) != len(xs):
        raise ValueError(f"{len(roles)} roles for {len(xs)} tokens")
    if masks is None:
        masks = np.ones((len(xs), layer.experts), dtype=bool)
    masks = np.asarray(masks, dtype=bool)
    if masks.shape != (len(xs), layer.experts):
        raise ValueError(f"Masks must be ({len(xs)}, {layer.experts}) bools, not {masks.shape}")
    return xs, roles, masks


def route_pass(layer, xs, roles, masks):
    """Logits, per-token selection (best first) and gates of one pass."""
    logits = xs @ layer.router.T                                  # router always FULL
    sel, gates = [], []
    for t, role in enumerate(roles):
        use = masks[t] if role is Role.DRAFT else None
        s = gm.route(logits[t], layer.top_k, use)
        sel.append(s)
        gates.append(gm.gate_weights(logits[t][s], layer.sm_mult, layer.sm_shift))
    return logits, sel, gates


def _planes(layer, precision: Role, source: Source | None, shared: bool):
    """``(hb_planes, ext_planes, lsb_planes)`` of a job."""
    n = 8 // layer.slice_bits
    k = layer.draft_keep
    need = tuple(range(k)) if precision is Role.DRAFT else tuple(range(n))
    if shared:
        return need, (), ()                      # the dense region holds all planes
    if source is not None and source.hb:
        lo, hi = tuple(p for p in need if p < k), tuple(p for p in need if p >= k)
        return (lo, (), hi) if source.lsb_hb else (lo, hi, ())
    return (), need, ()


def plan_pass(layer, xs, roles, masks, sources=None, first: int = 0) -> PassPlan:
    """Route one pass and list its jobs in announce order.

    ``sources`` maps a routed expert to its :class:`Source` (a dict, or a
    callable ``(expert, precision, tokens) -> Source``); missing means
    LPDDR. ``None`` leaves the sources undecided (numerics only)."""
    xs, roles, masks = _check_inputs(layer, xs, roles, masks)
    logits, sel, gates = route_pass(layer, xs, roles, masks)
    E, S = layer.experts, layer.shared
    all_tok = tuple(range(len(roles)))
    jobs = []
    for s in range(S):
        prec = job_precision(roles)
        hb, ext, lsb = _planes(layer, prec, None, True)
        jobs.append(Job(E + s, True, all_tok, prec, None, hb, ext, lsb))
    groups = {}
    for t, s in enumerate(sel):
        for e in s:
            groups.setdefault(e, []).append(t)
    for e in announce_order({e: len(t) for e, t in groups.items()}):
        toks = tuple(groups[e])
        prec = job_precision([roles[t] for t in toks])
        if sources is None:
            src = None
        elif callable(sources):
            src = sources(e, prec, toks)
        else:
            src = sources.get(e, LPDDR)
        hb, ext, lsb = _planes(layer, prec, src, False)
        jobs.append(Job(e, False, toks, prec, src, hb, ext, lsb))
    return PassPlan(first, list(roles), logits, sel, gates, jobs)


def with_sources(layer, plan: PassPlan, sources) -> PassPlan:
    """``plan`` with the routed jobs' sources set from ``sources`` (a dict
    expert -> :class:`Source`; missing means LPDDR) and the planes per port
    recomputed."""
    import dataclasses
    jobs = []
    for j in plan.jobs:
        if j.shared:
            jobs.append(j)
            continue
        src = sources.get(j.expert, LPDDR)
        hb, ext, lsb = _planes(layer, j.precision, src, False)
        jobs.append(dataclasses.replace(j, source=src, hb_planes=hb, ext_planes=ext,
                                        lsb_planes=lsb))
    return dataclasses.replace(plan, jobs=jobs)


def batched_forward(layer, xs, roles, masks=None, *, batch_tokens: int,
                    sources=None) -> BatchResult:
    """The batched layer on a step of tokens (see the module doc).

    ``xs`` ``(n, H)`` INT8, ``roles`` one :class:`Role` per token, ``masks``
    ``(n, E)`` bools (used by DRAFT tokens only; default all allowed),
    ``sources`` as in :func:`plan_pass` (per pass: a list of them, one per
    pass, or one for all)."""
    xs, roles, masks = _check_inputs(layer, xs, roles, masks)
    H = layer.hidden
    y = np.zeros((len(xs), H), dtype=np.int64)
    acc = np.zeros((len(xs), H), dtype=np.int64)
    plans = []
    for pi, rng_ in enumerate(pass_slices(len(xs), batch_tokens)):
        src = sources[pi] if isinstance(sources, list) else sources
        idx = list(rng_)
        plan = plan_pass(layer, xs[idx], [roles[i] for i in idx], masks[idx], src, rng_.start)
        plans.append(plan)
        px = xs[idx]
        pacc = np.zeros((len(idx), H), dtype=np.int64)
        for job in plan.jobs:
            j = job.expert
            toks = list(job.tokens)
            for prec in (gm.Precision.FULL, gm.Precision.DRAFT):
                grp = [t for t in toks if precision_of(plan.roles[t]) == prec]
                if not grp:
                    continue
                wg, wu, wd = layer.expert_weights(j, prec)
                X = px[grp].T                                          # (H, m)
                g = gm.requant(wg @ X, layer.gate_mult[j][:, None], layer.gate_shift[j][:, None])
                u = gm.requant(wu @ X, layer.up_mult[j][:, None], layer.up_shift[j][:, None])
                a = layer.lut[g + 128]
                h = gm.requant(a * u, layer.prod_mult[j][:, None], layer.prod_shift[j][:, None])
                d = gm.requant(wd @ h, layer.down_mult[j][:, None], layer.down_shift[j][:, None])
                for col, t in enumerate(grp):
                    if job.shared:
                        w = gm.GATE_ONE
                    else:
                        w = int(plan.gates[t][plan.sel[t].index(j)])
                    pacc[t] += w * d[:, col]
        acc[idx] = pacc
        y[idx] = gm.requant(pacc, layer.out_mult[None, :], layer.out_shift[None, :])
    return BatchResult(y, acc, plans)


# --------------------------------------------------------------------------------------
# the weight-traffic contract


def _router_rows(cfg):
    return cfg.experts * cfg.hidden // (cfg.pes * cfg.lanes)


def prefetch_candidates(plan: PassPlan, masks, top_k: int, *, last: bool = False) -> dict | None:
    """A pass's prefetch candidates, the datapath's ``cand`` contract
    (:func:`elmoe3d.golden.esd.prefetch_candidates` on the real router):
    ``None`` unless every token of the pass is DRAFT; else ``{expert:
    tokens}``, per token the best-ranked expert of its unrestricted top-k
    (:func:`elmoe3d.golden.moe_layer.route` without a mask) that its own
    mask (``masks``: the step's, by token) does not allow. ``last`` (a
    mutant) takes the lowest-ranked such expert instead."""
    if any(Role(r) is not Role.DRAFT for r in plan.roles):
        return None
    out = {}
    for t in range(len(plan.roles)):
        m = masks[plan.first + t]
        outside = [e for e in gm.route(plan.logits[t], top_k) if not m[e]]
        if outside:
            e = outside[-1] if last else outside[0]
            out[e] = out.get(e, 0) + 1
    return out


def lane_of(cfg, t: int) -> int:
    """The token lane of a pass's token ``t``: ``t mod P``."""
    return t % cfg.token_lanes


def lane_steps(cfg, tokens, roles) -> list:
    """The steps of one segment of a job (module doc, "Token lanes"): a list
    of ``(planes, [token or None per lane])``, DRAFT tokens first, then the
    others; in each step lane ``p`` takes the lowest of its tokens not taken
    yet. ``tokens`` are pass positions, ``roles`` the pass's roles."""
    P, n, k = cfg.token_lanes, cfg.planes, cfg.hb_planes_eff
    out = []
    for draft in (True, False):
        lanes = [[t for t in sorted(tokens) if t % P == p and
                  (Role(roles[t]) is Role.DRAFT) == draft] for p in range(P)]
        for i in range(max((len(x) for x in lanes), default=0)):
            out.append((k if draft else n, [x[i] if i < len(x) else None for x in lanes]))
    return out


def lpddr_cycles_per_beat(cfg) -> float:
    """Cycles the LPDDR port needs per ``ExtBeat`` (``axi_beat_bits`` bits):
    1 at the default bandwidth (one beat per cycle), more when
    ``Config.lpddr_bytes_per_cycle`` is below a beat (:attr:`Config.lpddr_rate`)."""
    return (cfg.axi_beat_bits // 8) / cfg.lpddr_rate


def pass_traffic(cfg, plan: PassPlan) -> Traffic:
    """The weight traffic of one pass under the contract (module doc) and
    its analytic cycle bound."""
    from .layout import dense_layout, segments
    d = dense_layout(cfg)
    B, n = cfg.pes, cfg.planes
    idx = d.record_index
    hb = [0] * B
    items = []
    for b in range(B):
        words = d.router_words
        out_first, out_n = idx["out"], cfg.hidden // B
        # out records, softmax record and (bank 0) the SiLU table: one contiguous read
        words += record_words(cfg, out_first, out_n + 1 + len(lut_share(cfg, b)))[1]
        hb[b] = words
    items.append(("router", None, d.router_words))
    ext_beats = 0
    ext_items = []
    segs = segments(cfg)
    rows = cfg.expert_rows
    per_plane_beats = rows * B // cfg.fill_words
    for job in plan.jobs:
        first, cnt = expert_record_range(cfg, job.expert)
        rw = record_words(cfg, first, cnt)[1]
        w = rw + (len(job.hb_planes) + len(job.lsb_planes)) * rows
        for b in range(B):
            hb[b] += w
        items.append(("records", job.expert, rw))
        if job.hb_planes:
            items.append(("weights", job.expert, len(job.hb_planes) * rows))
        if job.lsb_planes:
            items.append(("lsb weights", job.expert, len(job.lsb_planes) * rows))
        if job.ext_planes:
            beats = len(job.ext_planes) * per_plane_beats
            ext_beats += beats
            ext_items.append((job.expert, job.ext_planes, beats))
    # MAC beats per PE: the router in steps of P tokens (n planes), each
    # job's segments in the steps of its tokens (lane_steps)
    P = cfg.token_lanes
    mac = -(-len(plan.roles) // P) * n * _router_rows(cfg)
    chunks = sum(s.chunks for s in segs)
    for job in plan.jobs:
        mac += sum(planes for planes, _ in lane_steps(cfg, job.tokens, plan.roles)) * chunks
    return Traffic(hb, ext_beats, mac, items, ext_items, lpddr_cycles_per_beat(cfg))


def analytic_pass_cycles(cfg, plan: PassPlan) -> float:
    """The analytic cycle bound of a pass: ``max(HB words per bank, LPDDR
    beats at the configured bandwidth, MAC beats per PE)``."""
    return pass_traffic(cfg, plan).bound



# ---------------------------------------------------------------------------------------------
# routing traces as real layers and tokens (what replays a routing trace on the RTL tile)


def trace_layer(layer):
    """A copy of ``layer`` whose router realises a routing trace: router row
    ``e`` is the unit vector ``e``, so a token's logit of expert ``e`` is its
    own coordinate ``x[e]`` and a token made by :func:`trace_tokens` ranks the
    experts exactly as its ranking (the experts' weights, the requantisation
    and the gates stay those of ``layer``). ``ValueError`` when ``hidden <
    experts`` (no coordinate per expert)."""
    E, H = layer.experts, layer.hidden
    if H < E:
        raise ValueError(f"A trace layer needs hidden >= experts, not {H} < {E}")
    router = np.zeros((E, H), dtype=np.int64)
    router[np.arange(E), np.arange(E)] = 1
    return dataclasses.replace(layer, router=router)


def trace_tokens(rng: np.random.Generator, layer, rankings) -> np.ndarray:
    """``(n, H)`` INT8 tokens for a :func:`trace_layer`: token ``t`` ranks the
    experts as ``rankings[t]`` (a permutation of ``0 .. E-1``, best first):
    coordinate ``rankings[t][i]`` is ``127 - i`` (distinct, so no tie), the
    other ``H - E`` coordinates come from the calibration distribution
    (:func:`~elmoe3d.golden.moe_layer.random_tokens`). With the router of
    :func:`trace_layer` the top-``k`` of every token, over all experts or
    over any allowed mask (DRAFT: highest-ranked eligible first), is the
    ranking's -- what :class:`elmoe3d.golden.esd.RankingRouter` routes."""
    R = np.asarray(rankings, dtype=np.int64)
    E = layer.experts
    if R.ndim != 2 or R.shape[1] != E or E > 128:
        raise ValueError(f"Rankings must be (n, {E}) permutations of at most 128 experts, "
                         f"not shape {R.shape}")
    if (np.sort(R, axis=1) != np.arange(E)).any():
        raise ValueError("Every ranking must be a permutation of the experts")
    xs = gm.random_tokens(rng, layer, len(R))
    xs[np.arange(len(R))[:, None], R] = 127 - np.arange(E)[None, :]
    return xs

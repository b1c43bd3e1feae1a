"""Golden Elastic-SD controller: the specification of the tile's control
sequence, event for event.

Given a :class:`~elmoe3d.config.Config` (HB slots, dense and KV regions,
batch threshold, draft-length limits, DECAY period and shift, KV words per
token, the minimum usable expert slots), the routing of every layer step
(from the golden MoE router on real token vectors, or from a routing trace)
and the host's acceptance counts, :class:`EsdController` emits the **control
sequence**: an ordered list of :class:`Event` s. The RTL controller
(``hw/esd_ctrl.py``) exports the same events on its ``trace`` stream
(``TraceEvent`` in ``hw/vocab.py``) and the testbench compares the two lists
after putting both in canonical order (:func:`canonical`).

The controller is driven by host commands, the same ones the tile's host
stream carries:

``begin_round(batch, force, hb_cache)``
    Mode decision: SD when ``batch >= sd_threshold`` and at least
    ``min_free_slots`` expert slots lie outside the KV region, else AR
    (reason :class:`ModeReason`); the host may force AR or SD, or ask for
    AR with the HB expert cache off (``hb_cache=False``, reason LPDDR: the
    LPDDR-only xPU analogue). Emits ``MODE`` (and starts the round).
``layer_step(phase, step, layer, route)``
    One layer of one decode step: ``AR`` (``batch`` tokens, FULL),
    ``DRAFT`` step ``j`` (``batch`` tokens, routing restricted to resident
    experts, MSB planes from HB) or ``VERIFY`` (``batch * (K + 1)`` tokens,
    FULL, split MSB/LSB for hits, full LPDDR + MSB fill for misses).
    ``route(mask)`` returns each token's selected experts (best first);
    ``mask`` is the DRAFT eligibility mask (``None`` otherwise).
``accept(n)``
    ``n`` of the ``batch * K`` drafted tokens were accepted (SD only):
    ``ACCEPT``, ``ROLLBACK`` of the rest, draft-length adaptation.
``context(tokens)``
    The KV cache now holds ``tokens`` tokens (all requests together): the KV
    boundary moves to ``tokens * kv_words_per_token`` words; newly covered
    slots are dropped from the tag unit (``KV_MOVE`` then one ``INVALIDATE``
    per dropped slot that held an expert, resident or not).

Rules (the specification)
-------------------------
Passes
    A layer step of ``n`` tokens runs in ``ceil(n / T)`` passes of
    consecutive tokens (``T = batch_tokens``; VERIFY tokens request-major:
    request ``b``'s ``K + 1`` tokens are ``b*(K+1) .. b*(K+1)+K``). A pass
    handles each expert that any of its tokens selected once; ``count`` =
    tokens of the pass routed to it. The experts are handled in the batched
    datapath's announce order (:func:`announce_order`: decreasing count,
    ties to the lower id).
Per expert of a pass
    ``LOOKUP`` (LOOKUP_PIN: a hit is pinned). AR / VERIFY: a hit streams
    its ``k`` HB planes from HB and the other ``n - k`` from LPDDR
    (``SOURCE`` SPLIT); a miss ``ALLOCATE`` s a victim (pinned, PENDING,
    initial hotness ``min(count, hot_max)``), ``FILL_START`` and streams all
    ``n`` planes from LPDDR with the ``k`` HB planes written into the victim
    (``SOURCE`` LPDDR); ``NO_VICTIM`` streams all planes without a fill. A
    PENDING lookup (never seen in a fault-free canonical run, because the
    controller waits for every fill of a pass before the next pass's
    lookups) streams all planes from LPDDR without a fill. DRAFT: only
    eligible experts are selected, so every lookup hits; ``SOURCE`` HB with
    the ``k`` HB planes. AR and DRAFT hits are ``TOUCH`` ed by ``count``
    (hotness = routing decisions accumulated while drafting; in AR the
    decode steps' own decisions); VERIFY does not touch (its tokens were
    drafted already). At the end of the pass each fill ends (``FILL_END``
    COMMIT, or ABORT after an LPDDR error, followed by ``INVALIDATE`` of the
    slot), then every pinned slot is ``UNPIN`` ned. In an AR round with the
    HB expert cache off there is no lookup: every expert streams all ``n``
    planes from LPDDR (``SOURCE`` LPDDR, slot 0), no fill, no touch.
DRAFT eligibility
    At the start of every DRAFT layer step the controller probes the layer's
    ``E`` experts: eligible = resident (committed, enabled). ``ELIGIBLE``
    carries the mask; routing takes the highest-ranked eligible experts
    (fewer than ``k`` when fewer are eligible).
Prefetch during drafts (``prefetch > 0``; off by default)
    While the drafts run from HB, LPDDR is idle; the controller streams into
    HB the MSB planes of experts the verification is likely to need. A DRAFT
    token's *candidate* is the highest-ranked expert of its unrestricted
    top-``k`` (``route(None)``) that is not eligible (none if all are).
    After a DRAFT pass has ended (its ``UNPIN`` s), if any of its tokens has
    a candidate: ``PREFETCH`` (value = distinct candidates), then per
    candidate in announce order of its count (tokens naming it), while
    fewer than ``prefetch`` prefetches are outstanding: ``LOOKUP`` (value =
    count; PENDING: already being prefetched, nothing more), on a miss
    ``ALLOCATE`` (pinned, PENDING, hotness ``min(count, hot_max)``; or
    NO_VICTIM and nothing more), ``FILL_START`` and ``SOURCE`` PREFETCH (the
    ``k`` HB planes read from LPDDR into the victim, value 0: nothing to the
    PE array). The fills run in the background across the following draft
    passes; a prefetched slot stays PENDING (not eligible, never a victim)
    until it retires, whenever its fill ends (the hardware's tag unit holds
    it RESIDENT once HB commits, pinned; the controller still treats it as
    PENDING).
    They end at a barrier: before the VERIFY layer step of their layer
    (every layer's before a ``context`` that moves the KV boundary) the
    controller waits for those prefetches and retires them in issue order,
    so a prefetch is never the victim of an earlier layer's verification:
    ``PREFETCH_END`` (value = how many), then per prefetch (with the fields
    of the pass that issued it) ``EXT_ERROR`` if its read failed, ``FILL_END`` COMMIT then
    ``UNPIN``, or ``FILL_END`` ABORT then ``INVALIDATE`` ABORT. A failed
    prefetch spoils nothing: no slot holds wrong data, and the verification
    reads that expert from LPDDR as any miss. A verification hit on a
    prefetched slot is a *prefetch hit*. Prefetch reads take their fault
    ordinals when issued; their bytes count in ``lpddr_bytes``, their fills
    in ``fills`` / ``aborts`` / ``allocations`` / ``evictions`` /
    ``no_victim``; their lookups, and the hits, in :attr:`EsdController.prefetch_counts`.
DECAY
    After every ``decay_period`` decode steps (an AR step or a DRAFT step,
    counted when its last layer finishes): ``DECAY``.
Draft length
    ``K`` starts at ``draft_len_init``; after ``accept(n)`` with ``batch * K``
    drafted: ``4n >= 3 * batch*K`` (the batch's mean accepted length at
    least three quarters of ``K``) -> ``K + 1``; ``2n < batch*K`` (under
    half) -> ``K - 1``; clamped to ``draft_len_min .. draft_len_max``;
    ``DRAFT_LEN`` when ``K`` changes. The new ``K`` applies from the next
    round. (At batch 1 and ``K <= 3`` growing still needs every draft
    accepted; at batch > 1 one request's early rejection no longer holds
    the whole batch's ``K`` down.)
KV back-off
    ``usable`` = slots not covered by the KV region; a round is AR with
    reason BACKOFF when ``batch >= sd_threshold`` but ``usable <
    min_free_slots``.
Faults
    An LPDDR read that ends in error (``faults`` maps the ordinal of an
    LPDDR expert read, counted from 0 in canonical order, to an
    :class:`~elmoe3d.golden.vocab.ExtError`) emits ``EXT_ERROR``; a fill it
    carried ends ``FILL_END`` ABORT and its slot is freed (``INVALIDATE``
    ABORT): no slot becomes resident with wrong data. The layer step ends
    ``LAYER_DONE`` with ``code = 1`` and the host repeats it (the step's
    position in the round does not advance).

Canonical order (how concurrent hardware events are compared)
--------------------------------------------------------------
The hardware overlaps the per-expert work of one pass: a fill commits while
the next expert's lookup runs, unpins follow commits as they come. The
*canonical order* is therefore a sort key, not the execution order: every
run of events that follows a ``PASS`` (or ``PREFETCH``) event and belongs
to it (kinds in :data:`PASS_MEMBERS`) is stably sorted by ``(announce
position of the expert, kind rank)`` with the rank of :data:`PASS_MEMBERS`
(the announce position comes from the counts the LOOKUPs carry); the
events after ``PREFETCH_END`` keep their (issue) order; the
``INVALIDATE`` s that follow a
``KV_MOVE`` are sorted by slot. Everything else (MODE, PASS, ELIGIBLE,
LAYER_DONE, DECAY, ACCEPT, ROLLBACK, DRAFT_LEN, KV_MOVE) is a barrier that
keeps its place. Within a pass the result does not depend on the overlap:
only ALLOCATEs change what a later ALLOCATE chooses, they are issued in
announce order, and every slot a pass touches or commits is pinned
(never a victim) until the pass ends. An event missing, extra or different
fails the comparison (:func:`compare`).

Byte counters count expert weight bytes only (``expert_bytes / n`` per
plane; dense-region reads are the datapath's and are not counted here).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..config import check_int
from . import layout as gl
from . import moe_batched as _gb
from .tag_unit import SlotState, TagUnitModel, params_from_config
from .vocab import ExtError

__all__ = ["PREFETCH_ONLY", "prefetch_candidates", "in_prefetch_retirement", "EventKind", "Phase", "Mode", "ModeReason", "ForceCode", "force_code", "LookupResult", "AllocResult",
           "Source", "FillEnd", "InvalidateReason", "HostError", "EsdHostError", "Event",
           "EVENT_FIELDS", "PASS_MEMBERS", "announce_order", "canonical", "compare", "EsdController",
           "TagPolicy", "RankingRouter", "synthetic_trace", "run_trace", "TraceRun",
           "MAX_BATCH", "COUNTERS", "complete_rankings", "round_wavedrom"]

#: Largest batch (requests decoded in lock step) the controller accepts.
MAX_BATCH = 16


class EventKind(enum.IntEnum):
    """Kind of one control event (the ``TraceEvent.kind`` encoding, 5 bits)."""
    MODE = 0          # code = Mode, value = K (SD) / 0, tag = ModeReason
    PASS = 1          # phase, step, layer, pass_no; value = tokens in the pass
    ELIGIBLE = 2      # phase DRAFT, step, layer; value = eligible-expert mask
    LOOKUP = 3        # expert, code = LookupResult, slot (hit / pending), value = tokens
    ALLOCATE = 4      # expert, code = AllocResult, slot = victim, tag = evicted tag, value = hot
    FILL_START = 5    # expert, slot, value = HB plane mask written
    SOURCE = 6        # expert, slot, code = Source, value = hb_mask | lpddr_mask << n
    TOUCH = 7         # expert, slot, value = amount
    EXT_ERROR = 8     # expert, slot, value = ExtError of the failed LPDDR read
    FILL_END = 9      # expert, slot, code = FillEnd
    UNPIN = 10        # expert, slot
    INVALIDATE = 11   # slot, code = InvalidateReason; ABORT also names the pass and expert
    LAYER_DONE = 12   # phase, step, layer; code = 1 when an LPDDR error spoilt the step
    DECAY = 13        # value = decode steps so far
    ACCEPT = 14       # value = accepted drafted tokens
    ROLLBACK = 15     # value = rejected drafted tokens
    DRAFT_LEN = 16    # value = new K
    KV_MOVE = 17      # value = new KV words per bank; tag = usable slots
    PREFETCH = 18     # phase DRAFT, step, layer, pass_no; value = candidates (prefetch only)
    PREFETCH_END = 19  # value = prefetches retired here (prefetch only)


class Phase(enum.IntEnum):
    IDLE = 0
    AR = 1
    DRAFT = 2
    VERIFY = 3


class Mode(enum.IntEnum):
    AR = 0
    SD = 1


class ModeReason(enum.IntEnum):
    BATCH = 0         # batch below the SD threshold: AR
    BACKOFF = 1       # the KV region leaves fewer than min_free_slots slots: AR
    SD = 2            # Elastic-SD
    HOST = 3          # the host asked for AR
    LPDDR = 4         # the host asked for AR with the HB expert cache off (the xPU analogue)


class ForceCode(enum.IntEnum):
    """ROUND's force field (``HostCommand.value`` bits 8..10, 3 bits): who
    decides the round's mode. Codes 4..7 are refused (BAD_BATCH)."""
    AUTO = 0          # the batch threshold (and the KV back-off) decides
    AR = 1            # the host asks for AR
    SD = 2            # the host asks for SD (the back-off still applies)
    AR_NO_HB_CACHE = 3   # AR with the HB expert cache off (the xPU analogue)


def force_code(force=None, hb_cache: bool = True) -> int:
    """The :class:`ForceCode` (as an int) for :meth:`EsdController.begin_round`'s
    ``force`` / ``hb_cache``."""
    if not hb_cache:
        return int(ForceCode.AR_NO_HB_CACHE)
    # the forced codes follow Mode's order: AR + Mode.AR = AR, AR + Mode.SD = SD
    return int(ForceCode.AUTO) if force is None else int(ForceCode.AR) + int(force)


class LookupResult(enum.IntEnum):
    MISS = 0
    HIT = 1
    PENDING = 2


class AllocResult(enum.IntEnum):
    FREE = 0          # the victim slot was free
    EVICT = 1         # the victim held another expert (``tag`` = evicted tag)
    NO_VICTIM = 2     # every usable slot is pinned: streamed without a fill


class Source(enum.IntEnum):
    HB = 0            # DRAFT: the k HB planes from HB only
    SPLIT = 1         # FULL from a hit: k planes from HB, n - k from LPDDR, added
    LPDDR = 2         # FULL from LPDDR (all n planes), with or without a fill
    PREFETCH = 3      # a prefetch: the k HB planes from LPDDR into the slot only, no PE stream


class FillEnd(enum.IntEnum):
    COMMIT = 0
    ABORT = 1


class InvalidateReason(enum.IntEnum):
    KV = 0            # covered by a KV boundary move
    ABORT = 1         # its fill failed


class HostError(enum.IntEnum):
    """Error code of a refused host command (the state is unchanged)."""
    OK = 0
    BAD_BATCH = 1     # batch outside 1..MAX_BATCH, or a round already open
    BAD_PHASE = 2     # a layer step of a phase the round is not in
    BAD_ORDER = 3     # a layer step out of sequence (step or layer not the next one)
    BAD_ACCEPT = 4    # ACCEPT outside an SD round after its VERIFY, or n > batch * K
    KV_RANGE = 5      # the context does not fit the KV region
    BAD_ROUTE = 6     # a routing result that breaks the rules (unknown expert, > k, repeats,
                      # an ineligible expert in DRAFT)


class EsdHostError(ValueError):
    """A refused host command; ``code`` is the :class:`HostError`."""

    def __init__(self, code: HostError, message: str):
        super().__init__(message)
        self.code = HostError(code)


EVENT_FIELDS = ("kind", "phase", "step", "layer", "pass_no", "expert", "slot", "tag", "code",
                "value")


@dataclass(frozen=True)
class Event:
    """One control event. Fields an event kind does not define are 0 (see
    :class:`EventKind` for what each kind carries)."""
    kind: int
    phase: int = 0
    step: int = 0
    layer: int = 0
    pass_no: int = 0
    expert: int = 0
    slot: int = 0
    tag: int = 0
    code: int = 0
    value: int = 0

    def as_tuple(self) -> tuple:
        return tuple(int(getattr(self, f)) for f in EVENT_FIELDS)

    @classmethod
    def from_dict(cls, d: dict) -> "Event":
        return cls(**{f: int(d.get(f, 0)) for f in EVENT_FIELDS})

    def __str__(self):
        k = EventKind(self.kind)
        parts = [k.name]
        for f in EVENT_FIELDS[1:]:
            v = getattr(self, f)
            if v:
                if f == "phase":
                    v = Phase(v).name
                parts.append(f"{f}={v}")
        return " ".join(parts)


#: What only prefetch emits (event kinds, and its SOURCE code): a controller
#: built without a prefetcher (``prefetch`` 0) never shows these.
PREFETCH_ONLY = (EventKind.PREFETCH, EventKind.PREFETCH_END, Source.PREFETCH)

#: Events that belong to the pass they follow, in their canonical per-expert rank.
PASS_MEMBERS = (EventKind.LOOKUP, EventKind.ALLOCATE, EventKind.FILL_START, EventKind.SOURCE,
                EventKind.TOUCH, EventKind.EXT_ERROR, EventKind.FILL_END, EventKind.UNPIN,
                EventKind.INVALIDATE)
_RANK = {int(k): i for i, k in enumerate(PASS_MEMBERS)}


#: The order in which a pass's experts are handled: the batched datapath's
#: announce order (decreasing token count, ties to the lower expert id),
#: imported from its golden model (one definition); the controller answers in
#: it and its ALLOCATEs follow it, so victims depend on it.
announce_order = _gb.announce_order


def _sort_pass(members) -> list:
    counts = {x.expert: x.value for x in members if x.kind == EventKind.LOOKUP}
    pos = {e: i for i, e in enumerate(announce_order(counts))}
    return sorted(members, key=lambda x: (pos.get(x.expert, len(pos)), x.expert, _RANK[x.kind]))


def canonical(events) -> list:
    """The canonical order of an event list (see the module doc): pass
    members sorted by ``(expert, kind rank)`` after their ``PASS``, KV
    invalidations by slot after their ``KV_MOVE``; barriers keep their place.
    Accepts :class:`Event` s or dicts; returns :class:`Event` s."""
    evs = [e if isinstance(e, Event) else Event.from_dict(e) for e in events]
    out, i, n = [], 0, len(evs)
    while i < n:
        e = evs[i]
        out.append(e)
        i += 1
        if e.kind in (EventKind.PASS, EventKind.PREFETCH):
            j = i
            while j < n and evs[j].kind in _RANK:
                j += 1
            out.extend(_sort_pass(evs[i:j]))
            i = j
        elif e.kind == EventKind.KV_MOVE:
            j = i
            while j < n and evs[j].kind == EventKind.INVALIDATE:
                j += 1
            out.extend(sorted(evs[i:j], key=lambda x: x.slot))
            i = j
    return out


def compare(expected, got, context: int = 3) -> str | None:
    """``None`` when the two event lists are equal in canonical order, else a
    message naming the first difference (index, both events, the events
    before it)."""
    a, b = canonical(expected), canonical(got)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            before = "\n".join(f"    {str(e)}" for e in a[max(0, i - context):i])
            return (f"event {i} differs:\n  expected {x}\n  got      {y}\n"
                    f"  after:\n{before}")
    if len(a) != len(b):
        i = min(len(a), len(b))
        extra = (a if len(a) > len(b) else b)[i]
        which = "missing" if len(a) > len(b) else "extra"
        return f"{which} event {i}: {extra} ({len(a)} expected, {len(b)} got)"
    return None


# ---------------------------------------------------------------------------------------
# the tag-unit policy with the integration contract (PENDING, disabled slots)


class TagPolicy(TagUnitModel):
    """The golden tag-unit policy, :class:`~elmoe3d.golden.tag_unit.TagUnitModel`
    itself (FREE / PENDING / RESIDENT, ALLOCATE pins its PENDING victim, the
    ``disabled`` mask, HB's commit), built from a Config, with the controller's
    view of a lookup as a :class:`LookupResult`.

    Every decision (victim, hotness, decay, pins, which slots a KV move
    frees) is the base model's: a change of the tag-unit policy changes the
    golden control sequence with it. The methods below only translate.
    """

    def __init__(self, cfg, *, mutant=None):
        super().__init__(**params_from_config(cfg), mutant=mutant)

    def probe(self, tag: int) -> tuple[LookupResult, int]:
        """Result and slot of a tag without side effects (a PENDING slot is
        not a hit; its slot is reported, as the tag unit's LOOKUP does)."""
        state, s = self.state_of(tag)
        return _LOOKUP_OF[state], (0 if s is None else s)

    def lookup_pin(self, tag: int) -> tuple[LookupResult, int]:
        """LOOKUP_PIN: a hit is pinned; a PENDING or missing tag is reported,
        not pinned."""
        r = self.probe(tag)
        self.lookup(tag, pin=True)
        return r

    def allocate_pin(self, tag: int, planes: int, hot: int):
        """The hardware ALLOCATE: ``(ok, victim, evicted_tag)``; the victim is
        PENDING and pinned."""
        return self.allocate(tag, planes, hot, pending=True)

    def commit(self, s: int):
        """HB's commit strobe; the controller only commits PENDING slots."""
        if not super().commit(s):
            raise AssertionError(f"commit of slot {s}, which is not pending")
        return True

    def set_disabled(self, mask: int) -> list:
        """New covered mask; returns ``[(slot, tag)]`` of the slots it frees.
        The controller moves the KV boundary only between passes, so no slot
        it covers may be pinned."""
        for s in range(self.slots):
            if (mask >> s) & 1 and not self.disabled[s] and self.pins[s]:
                raise AssertionError(f"KV move covers pinned slot {s}")
        return super().set_disabled(mask)


_LOOKUP_OF = {SlotState.FREE: LookupResult.MISS, SlotState.PENDING: LookupResult.PENDING,
              SlotState.RESIDENT: LookupResult.HIT}


# ---------------------------------------------------------------------------------------
# the controller


COUNTERS = ("hb_hits", "hb_misses", "hb_pending", "draft_lookups", "hb_bytes", "lpddr_bytes",
            "fills", "aborts", "allocations", "evictions", "no_victim", "touches", "decays",
            "accepted_tokens", "drafted_tokens", "rounds_ar", "rounds_sd", "decode_steps",
            "tokens_out", "kv_moves", "kv_invalidations", "ext_errors")


@dataclass
class PassPlan:
    """What the controller told the datapath for one pass: per expert (announce order)
    ``(expert, source, slot, hb_mask, lpddr_mask, fill)`` and its tokens."""
    tokens: range
    experts: list


@dataclass
class StepResult:
    selections: list            # per token: selected experts, best first
    passes: list                # PassPlan per pass
    error: bool
    mask: int | None = None     # DRAFT: the eligible-expert mask the routing used


class EsdController:
    """Golden Elastic-SD controller (see the module doc for the rules).

    Parameters
    ----------
    cfg : Config
        The tile's configuration.
    faults : dict, optional
        ``{ordinal of an LPDDR expert read: ExtError}`` — reads that end in
        error (test (c) of the fault testbench).
    prefetch : int, optional
        Most prefetches outstanding during a round's drafts (0, the
        default: no prefetch; see "Prefetch during drafts" in the module
        doc). Specified here first; the controller RTL does not build it yet.
    mutant : str, optional
        Self-check of the tests only: ``"touch_verify"`` touches in VERIFY
        too, ``"order"`` allocates in descending expert order,
        ``"no_decay"`` never decays, ``"adapt"`` never lengthens K,
        ``"tie"`` / ``"decay"`` mutate the tag policy, ``"prefetch_last"``
        takes a token's lowest-ranked non-eligible expert of its top-k as
        its prefetch candidate.

    Members
    -------
    events : list of Event
    counters : dict
    K : int
        Current draft length.
    """

    def __init__(self, cfg, *, faults=None, mutant=None, prefetch: int = 0):
        self.cfg = cfg
        self.mutant = mutant
        check_int("Prefetch depth", prefetch, 0, cfg.tag_slots)
        self.prefetch = prefetch
        self.prefetching = []       # outstanding: (pass fields, expert, slot, tag, fault)
        self.prefetched = set()     # tags committed by prefetch since the last verification
        self.prefetch_counts = dict.fromkeys(("prefetch_lookups", "prefetches", "prefetch_hits"), 0)
        tag_mut = mutant if mutant in ("tie", "decay") else None
        self.tags = TagPolicy(cfg, mutant=tag_mut)
        self.n = cfg.planes
        self.k_hb = cfg.hb_planes_eff
        self.hb_mask = (1 << self.k_hb) - 1
        self.all_mask = (1 << self.n) - 1
        self.plane_bytes = cfg.expert_bytes // self.n
        self.faults = dict(faults or {})
        self.ext_reads = 0
        self.events: list[Event] = []
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.K = cfg.draft_len_init
        self.kv_words = 0
        self.covered = 0
        self.steps_since_decay = 0
        # round state
        self.mode = None
        self.hb_cache = True        # False: an AR round with the HB expert cache off
        self.batch = 0
        self.round_K = 0
        self.expect = None          # (phase, step, layer) of the next layer step, or "ACCEPT"
        self.rounds = 0

    # -- helpers ---------------------------------------------------------------------
    def _emit(self, kind, **kw) -> Event:
        e = Event(int(kind), **{k: int(v) for k, v in kw.items()})
        self.events.append(e)
        return e

    @property
    def usable_slots(self) -> int:
        return self.cfg.tag_slots - bin(self.covered).count("1")

    def tag_of(self, layer, expert) -> int:
        return self.tags.make_tag(layer, expert)

    def resident_mask(self, layer) -> int:
        """Mask of the experts of ``layer`` that are resident (no side effects)."""
        m = 0
        for e in range(self.cfg.experts):
            r, _ = self.tags.probe(self.tag_of(layer, e))
            if r == LookupResult.HIT:
                m |= 1 << e
        return m

    # -- host commands ---------------------------------------------------------------
    def begin_round(self, batch: int, force=None, hb_cache: bool = True) -> tuple[Mode, int]:
        """Open a decode round of ``batch`` requests: ``(mode, K)``.

        ``force`` (``Mode.AR`` / ``Mode.SD``, default ``None``) overrides the
        batch threshold (the host asks for a mode; reason HOST for AR); the KV
        back-off still applies to a forced SD. ``hb_cache=False`` (only with
        ``force=Mode.AR``) opens an AR round with the HB expert cache off
        (reason LPDDR): its passes read every expert's planes from LPDDR with
        no lookup, fill or touch (:meth:`_pass`); the tag unit is left as it
        is (DECAY still runs). On the wire it is ROUND's force code 3
        (:func:`force_code`)."""
        try:
            check_int("Batch", batch, 1, MAX_BATCH)
        except (TypeError, ValueError) as e:
            raise EsdHostError(HostError.BAD_BATCH, str(e)) from None
        if self.expect is not None:
            raise EsdHostError(HostError.BAD_BATCH, "A decode round is already open")
        if force is not None and force not in (Mode.AR, Mode.SD):
            raise EsdHostError(HostError.BAD_BATCH, f"Forced mode must be AR or SD, not {force!r}")
        if not hb_cache and force != Mode.AR:
            raise EsdHostError(HostError.BAD_BATCH,
                               f"The HB expert cache can be off only in a forced AR round, "
                               f"not with force={force!r}")
        cfg = self.cfg
        if not hb_cache:
            mode, reason = Mode.AR, ModeReason.LPDDR
        elif force == Mode.AR:
            mode, reason = Mode.AR, ModeReason.HOST
        elif force is None and batch < cfg.sd_threshold:
            mode, reason = Mode.AR, ModeReason.BATCH
        elif self.usable_slots < cfg.min_free_slots:
            mode, reason = Mode.AR, ModeReason.BACKOFF
        else:
            mode, reason = Mode.SD, ModeReason.SD
        self.mode, self.batch, self.hb_cache = mode, batch, bool(hb_cache)
        self.round_K = self.K if mode == Mode.SD else 0
        self._emit(EventKind.MODE, code=mode, value=self.round_K, tag=reason)
        self.counters["rounds_sd" if mode == Mode.SD else "rounds_ar"] += 1
        self.expect = (Phase.AR, 0, 0) if mode == Mode.AR else (Phase.DRAFT, 0, 0)
        self.rounds += 1
        return mode, self.round_K

    def tokens_of(self, phase) -> int:
        """Tokens of one layer step of ``phase`` in the open round."""
        return self.batch * (self.round_K + 1) if phase == Phase.VERIFY else self.batch

    def _advance(self, phase, step, layer):
        L = self.cfg.layers
        if layer + 1 < L:
            self.expect = (phase, step, layer + 1)
            return
        # the last layer of a decode step
        if phase in (Phase.AR, Phase.DRAFT):
            self.counters["decode_steps"] += 1
            self.steps_since_decay += 1
            if self.steps_since_decay >= self.cfg.decay_period and self.mutant != "no_decay":
                self.steps_since_decay = 0
                self.tags.decay()
                self.counters["decays"] += 1
                self._emit(EventKind.DECAY, value=self.counters["decode_steps"])
        if phase == Phase.AR:
            self.counters["tokens_out"] += self.batch
            self.expect = None
        elif phase == Phase.DRAFT:
            self.expect = ((Phase.DRAFT, step + 1, 0) if step + 1 < self.round_K
                           else (Phase.VERIFY, 0, 0))
        else:
            self.expect = "ACCEPT"

    def layer_step(self, phase, step: int, layer: int, route) -> StepResult:
        """One layer step (see the module doc). ``route(mask)`` -> per token a
        list of selected experts, best first (``mask`` = DRAFT eligibility), or
        that list itself."""
        phase = Phase(phase)
        if self.expect is None or self.expect == "ACCEPT" or self.expect[0] != phase:
            raise EsdHostError(HostError.BAD_PHASE,
                               f"Layer step of phase {phase.name} while expecting {self.expect}")
        if self.expect != (phase, step, layer):
            raise EsdHostError(HostError.BAD_ORDER,
                               f"Layer step {(phase.name, step, layer)} while expecting "
                               f"{(self.expect[0].name,) + tuple(self.expect[1:])}")
        cfg = self.cfg
        E, k = cfg.experts, cfg.top_k
        mask = None
        if phase == Phase.DRAFT:
            mask = self.resident_mask(layer)
        sel = [list(map(int, s)) for s in (route(mask) if callable(route) else route)]
        ntok = self.tokens_of(phase)
        if len(sel) != ntok:
            raise EsdHostError(HostError.BAD_ROUTE, f"{len(sel)} routed tokens, {ntok} expected")
        for s in sel:
            if len(s) > k or len(set(s)) != len(s) or any(not 0 <= e < E for e in s):
                raise EsdHostError(HostError.BAD_ROUTE, f"Bad expert selection {s!r}")
            if mask is not None and any(not (mask >> e) & 1 for e in s):
                raise EsdHostError(HostError.BAD_ROUTE,
                                   f"DRAFT selection {s!r} outside the eligible mask {mask:#x}")
        full = None
        if mask is not None and self.prefetch and callable(route):
            full = [list(map(int, s)) for s in route(None)]
            if len(full) != ntok or any(len(s) > k or any(not 0 <= e < E for e in s)
                                        for s in full):
                raise EsdHostError(HostError.BAD_ROUTE, f"Bad unrestricted routing {full!r}")
        if phase == Phase.VERIFY:
            self._retire_prefetches(layer)
        if mask is not None:
            self.counters["draft_lookups"] += E
            self._emit(EventKind.ELIGIBLE, phase=phase, step=step, layer=layer, value=mask)
        passes, error = [], False
        for p, (p0, n, counts) in enumerate(_gb.pass_counts(sel, cfg.batch_tokens)):
            plan, err = self._pass(phase, step, layer, p, range(p0, p0 + n), counts)
            passes.append(plan)
            error |= err
            if full is not None:
                self._prefetch(step, layer, p, full[p0:p0 + n], mask)
        self._emit(EventKind.LAYER_DONE, phase=phase, step=step, layer=layer, code=int(error))
        if not error:
            self._advance(phase, step, layer)
        return StepResult(sel, passes, error, mask)

    def _ext_read(self):
        """Ordinal of the next LPDDR expert read and its fault (ExtError.OK if none)."""
        i = self.ext_reads
        self.ext_reads += 1
        return ExtError(self.faults.get(i, ExtError.OK))

    def _lpddr_source(self, ev, slot):
        """``SOURCE`` LPDDR of an expert (every plane from LPDDR) and its read:
        the read's fault (``EXT_ERROR`` emitted), falsy if none."""
        n = self.n
        self._emit(EventKind.SOURCE, **ev, slot=slot, code=Source.LPDDR,
                   value=self.all_mask << n)
        self.counters["lpddr_bytes"] += n * self.plane_bytes
        fault = self._ext_read()
        if fault:
            self.counters["ext_errors"] += 1
            self._emit(EventKind.EXT_ERROR, **ev, slot=slot, value=fault)
        return fault

    def _pass(self, phase, step, layer, p, toks, counts):
        c = self.counters
        n, khb = self.n, self.k_hb
        self._emit(EventKind.PASS, phase=phase, step=step, layer=layer, pass_no=p,
                   value=len(toks))
        first = len(self.events)
        order = announce_order(counts)
        if self.mutant == "order":
            order = sorted(counts)
        ents, pinned, fills, error = [], [], [], False
        base = dict(phase=phase, step=step, layer=layer, pass_no=p)
        for e in order:
            cnt = counts[e]
            tag = self.tag_of(layer, e)
            ev = dict(base, expert=e)
            if not self.hb_cache:                    # HB expert cache off: LPDDR, no lookup
                error |= bool(self._lpddr_source(ev, 0))
                ents.append((e, Source.LPDDR, 0, 0, self.all_mask, False))
                continue
            res, slot = self.tags.lookup_pin(tag)
            self._emit(EventKind.LOOKUP, **ev, code=res, slot=slot, value=cnt)
            if phase == Phase.DRAFT:
                if res != LookupResult.HIT:          # eligibility guarantees a hit
                    raise AssertionError(f"DRAFT lookup of ineligible expert {e}")
                pinned.append((e, slot))
                self._emit(EventKind.SOURCE, **ev, slot=slot, code=Source.HB,
                           value=self.hb_mask)
                c["hb_bytes"] += khb * self.plane_bytes
                self._touch(ev, tag, slot, cnt)
                ents.append((e, Source.HB, slot, self.hb_mask, 0, False))
                continue
            if res == LookupResult.HIT:
                c["hb_hits"] += 1
                if phase == Phase.VERIFY and tag in self.prefetched:
                    self.prefetch_counts["prefetch_hits"] += 1
                    self.prefetched.discard(tag)
                pinned.append((e, slot))
                lmask = self.all_mask & ~self.hb_mask
                self._emit(EventKind.SOURCE, **ev, slot=slot, code=Source.SPLIT,
                           value=self.hb_mask | lmask << n)
                c["hb_bytes"] += khb * self.plane_bytes
                c["lpddr_bytes"] += (n - khb) * self.plane_bytes
                if phase == Phase.AR or self.mutant == "touch_verify":
                    self._touch(ev, tag, slot, cnt)
                fault = self._ext_read()
                if fault:
                    error = True
                    c["ext_errors"] += 1
                    self._emit(EventKind.EXT_ERROR, **ev, slot=slot, value=fault)
                ents.append((e, Source.SPLIT, slot, self.hb_mask, lmask, False))
                continue
            fill = False
            if res == LookupResult.PENDING:
                c["hb_pending"] += 1
                slot = 0
            else:
                c["hb_misses"] += 1
                hot = min(cnt, self.tags.hot_max)
                ok, v, evicted = self.tags.allocate_pin(tag, khb, hot)
                if ok:
                    c["allocations"] += 1
                    code = AllocResult.FREE if evicted is None else AllocResult.EVICT
                    if evicted is not None:
                        c["evictions"] += 1
                    self._emit(EventKind.ALLOCATE, **ev, code=code, slot=v,
                               tag=evicted or 0, value=hot)
                    self._emit(EventKind.FILL_START, **ev, slot=v, value=self.hb_mask)
                    slot, fill = v, True
                    pinned.append((e, v))
                else:
                    c["no_victim"] += 1
                    self._emit(EventKind.ALLOCATE, **ev, code=AllocResult.NO_VICTIM)
                    slot = 0
            fault = self._lpddr_source(ev, slot)
            error |= bool(fault)
            if fill:
                fills.append((e, slot, fault))
            ents.append((e, Source.LPDDR, slot, 0, self.all_mask, fill))
        # end of the pass: fills end, then every pin is released
        aborted = set()
        for e, slot, fault in fills:
            if not self._fill_end(dict(base, expert=e), slot, fault):
                aborted.add(slot)
        for e, slot in pinned:
            self._release(dict(base, expert=e), slot, slot in aborted)
        # the list keeps the canonical order (executed above in hardware order)
        self.events[first:] = _sort_pass(self.events[first:])
        return PassPlan(toks, ents), error

    # -- prefetch during drafts --------------------------------------------------------
    def candidates(self, full, mask) -> dict:
        """``{expert: tokens}`` of one DRAFT pass's prefetch candidates
        (:func:`prefetch_candidates`)."""
        return prefetch_candidates(full, mask, last=self.mutant == "prefetch_last")

    def _prefetch(self, step, layer, p, full, mask):
        """The prefetches of a DRAFT pass that has ended (see the module doc)."""
        cand = self.candidates(full, mask)
        if not cand:
            return
        c, pc = self.counters, self.prefetch_counts
        base = dict(phase=Phase.DRAFT, step=step, layer=layer, pass_no=p)
        self._emit(EventKind.PREFETCH, **base, value=len(cand))
        first = len(self.events)
        for e in announce_order(cand):
            if len(self.prefetching) >= self.prefetch:
                break
            cnt, tag = cand[e], self.tag_of(layer, e)
            ev = dict(base, expert=e)
            res, slot = self.tags.lookup_pin(tag)
            pc["prefetch_lookups"] += 1
            self._emit(EventKind.LOOKUP, **ev, code=res, slot=slot, value=cnt)
            if res == LookupResult.HIT:              # eligibility was probed this step
                raise AssertionError(f"prefetch candidate {e} of layer {layer} is resident")
            if res == LookupResult.PENDING:          # already being prefetched
                continue
            hot = min(cnt, self.tags.hot_max)
            ok, v, evicted = self.tags.allocate_pin(tag, self.k_hb, hot)
            if not ok:
                c["no_victim"] += 1
                self._emit(EventKind.ALLOCATE, **ev, code=AllocResult.NO_VICTIM)
                continue
            c["allocations"] += 1
            if evicted is not None:
                c["evictions"] += 1
            self._emit(EventKind.ALLOCATE, **ev, code=AllocResult.FREE if evicted is None
                       else AllocResult.EVICT, slot=v, tag=evicted or 0, value=hot)
            self._emit(EventKind.FILL_START, **ev, slot=v, value=self.hb_mask)
            self._emit(EventKind.SOURCE, **ev, slot=v, code=Source.PREFETCH, value=0)
            c["lpddr_bytes"] += self.k_hb * self.plane_bytes
            pc["prefetches"] += 1
            self.prefetching.append((ev, v, tag, self._ext_read()))
        self.events[first:] = _sort_pass(self.events[first:])

    def _retire_prefetches(self, layer=None):
        """The barrier: wait for the outstanding prefetches of ``layer``
        (every layer's when ``None``), retire them in issue order (see the
        module doc)."""
        c = self.counters
        now = [x for x in self.prefetching if layer is None or x[0]["layer"] == layer]
        if not now:
            return
        self._emit(EventKind.PREFETCH_END, value=len(now))
        self.prefetching = [x for x in self.prefetching if x not in now]
        for ev, slot, tag, fault in now:
            if fault:
                c["ext_errors"] += 1
                self._emit(EventKind.EXT_ERROR, **ev, slot=slot, value=fault)
            committed = self._fill_end(ev, slot, fault)
            self._release(ev, slot, not committed)
            if committed:
                self.prefetched.add(tag)

    def _fill_end(self, ev, slot, fault) -> bool:
        """End a fill: FILL_END COMMIT (the slot committed), or ABORT after
        an LPDDR error; True when committed."""
        if fault:
            self.counters["aborts"] += 1
            self._emit(EventKind.FILL_END, **ev, slot=slot, code=FillEnd.ABORT)
            return False
        self.counters["fills"] += 1
        self.tags.commit(slot)
        self._emit(EventKind.FILL_END, **ev, slot=slot, code=FillEnd.COMMIT)
        return True

    def _release(self, ev, slot, aborted: bool):
        """Release a pinned slot: UNPIN, or INVALIDATE ABORT (freed) when its
        fill aborted."""
        if aborted:
            self.tags.abort(slot)
            self._emit(EventKind.INVALIDATE, **ev, slot=slot, code=InvalidateReason.ABORT)
        else:
            self.tags.unpin(slot)
            self._emit(EventKind.UNPIN, **ev, slot=slot)

    def _touch(self, ev, tag, slot, cnt):
        amount = min(cnt, self.tags.hot_max)
        self.tags.touch(tag, amount)
        self.counters["touches"] += 1
        self._emit(EventKind.TOUCH, **ev, slot=slot, value=amount)

    def accept(self, n: int):
        """The host accepted ``n`` of the ``batch * K`` drafted tokens."""
        if self.expect != "ACCEPT":
            raise EsdHostError(HostError.BAD_ACCEPT, "ACCEPT outside an SD round after VERIFY")
        drafted = self.batch * self.round_K
        try:
            check_int("Accepted token count", n, 0, drafted)
        except (TypeError, ValueError) as e:
            raise EsdHostError(HostError.BAD_ACCEPT, str(e)) from None
        c = self.counters
        c["accepted_tokens"] += n
        c["drafted_tokens"] += drafted
        c["tokens_out"] += n + self.batch
        self.prefetched.clear()
        self._emit(EventKind.ACCEPT, value=n)
        if n < drafted:
            self._emit(EventKind.ROLLBACK, value=drafted - n)
        cfg, K = self.cfg, self.K
        if 4 * n >= 3 * drafted and self.mutant != "adapt":
            K = min(K + 1, cfg.draft_len_max)
        elif 2 * n < drafted:
            K = max(K - 1, cfg.draft_len_min)
        if K != self.K:
            self.K = K
            self._emit(EventKind.DRAFT_LEN, value=K)
        self.expect = None

    def context(self, tokens: int):
        """The KV cache holds ``tokens`` tokens: move the KV boundary."""
        cfg = self.cfg
        try:
            check_int("Context length", tokens, 0)
        except (TypeError, ValueError) as e:
            raise EsdHostError(HostError.KV_RANGE, str(e)) from None
        words = tokens * cfg.kv_words_per_token
        if words > gl.kv_limit(cfg):
            raise EsdHostError(HostError.KV_RANGE,
                               f"A context of {tokens} tokens needs {words} KV words per bank; "
                               f"the KV region holds at most {gl.kv_limit(cfg)}")
        if words == self.kv_words:
            return
        if self.prefetching:
            self._retire_prefetches()
        mask = gl.slot_covered_mask(cfg, words)
        dropped = self.tags.set_disabled(mask)
        self.kv_words, self.covered = words, mask
        self.counters["kv_moves"] += 1
        self._emit(EventKind.KV_MOVE, value=words, tag=self.usable_slots)
        for s, _tag in dropped:
            self.counters["kv_invalidations"] += 1
            self._emit(EventKind.INVALIDATE, slot=s, code=InvalidateReason.KV)

    # -- checks --------------------------------------------------------------------------
    def check_invariants(self):
        """The tag policy's invariants plus the integration contract: no slot
        pinned between layer steps, no pending slot (but an outstanding
        prefetch's), nothing in a covered slot."""
        self.tags.check_invariants()
        outstanding = {slot for _, slot, _, _ in self.prefetching}
        for s in range(self.cfg.tag_slots):
            if (self.tags.pins[s] or self.tags.pending[s]) and s not in outstanding:
                raise AssertionError(f"slot {s} pinned/pending between layer steps")
            if (self.covered >> s) & 1 and self.tags.valid[s]:
                raise AssertionError(f"covered slot {s} holds a tag")


def prefetch_candidates(full, mask: int, *, last: bool = False) -> dict:
    """``{expert: tokens}`` of one DRAFT pass's prefetch candidates: per
    token (``full``: each token's unrestricted top-k, best first) the
    highest-ranked expert that is not in the eligible ``mask``; the
    datapath's contract with the controller's prefetcher. ``last`` (a
    mutant) takes the lowest-ranked one instead."""
    out = {}
    for s in full:
        non = [e for e in s if not (mask >> e) & 1]
        if non:
            e = non[-1] if last else non[0]
            out[e] = out.get(e, 0) + 1
    return out


def in_prefetch_retirement(events) -> list[bool]:
    """Per event of a canonical sequence: whether it is one of the
    retirements that follow a ``PREFETCH_END`` (its ``EXT_ERROR``,
    ``FILL_END``, ``UNPIN``, ``INVALIDATE``), not a pass's: a prefetch's
    LPDDR error spoils no pass."""
    out, on = [], False
    for e in events:
        if e.kind == EventKind.PREFETCH_END:
            on = True
        elif e.kind not in (EventKind.EXT_ERROR, EventKind.FILL_END, EventKind.UNPIN,
                            EventKind.INVALIDATE):
            on = False
        out.append(on and e.kind != EventKind.PREFETCH_END)
    return out


# ---------------------------------------------------------------------------------------
# routing traces


class RankingRouter:
    """Routing from per-token expert rankings: ``route(mask)`` takes each
    token's ``k`` highest-ranked experts, only eligible ones when ``mask`` is
    given (fewer when fewer are eligible) — the golden MoE router's rule
    (:func:`elmoe3d.golden.moe_layer.route`) applied to a ranking."""

    def __init__(self, rankings, k: int):
        self.rankings = np.asarray(rankings)
        self.k = k

    def __call__(self, mask):
        out = []
        for r in self.rankings:
            if mask is None:
                out.append([int(e) for e in r[:self.k]])
            else:
                out.append([int(e) for e in r if (mask >> int(e)) & 1][:self.k])
        return out


def synthetic_trace(rng: np.random.Generator, *, requests: int, tokens: int, layers: int,
                    experts: int, zipf: float = 1.1, reuse: float = 0.6,
                    swap: float = 0.3) -> np.ndarray:
    """Expert rankings with locality: ``(requests, tokens, layers, experts)``
    int16, each ``[b, t, l]`` a permutation of the experts, best first.

    Per layer the experts have a Zipf popularity (``1 / rank**zipf`` over a
    random permutation). Per token and layer: with probability ``reuse`` the
    previous token's ranking is kept (with probability ``swap`` two adjacent
    entries among its first ``k + 1`` are swapped), otherwise a fresh ranking
    is drawn without replacement by popularity (Gumbel top-n).
    """
    check_int("Requests", requests, 1)
    check_int("Tokens", tokens, 1)
    check_int("Layers", layers, 1)
    check_int("Experts", experts, 2)
    out = np.zeros((requests, tokens, layers, experts), dtype=np.int16)
    logw = np.zeros((layers, experts))
    for l in range(layers):
        perm = rng.permutation(experts)
        logw[l, perm] = -zipf * np.log(np.arange(1, experts + 1))
    for b in range(requests):
        for t in range(tokens):
            for l in range(layers):
                if t and rng.random() < reuse:
                    r = out[b, t - 1, l].copy()
                    if rng.random() < swap:
                        i = int(rng.integers(0, min(experts - 1, 4)))
                        r[i], r[i + 1] = r[i + 1], r[i]
                else:
                    g = logw[l] + rng.gumbel(size=experts)
                    r = np.argsort(-g, kind="stable")
                out[b, t, l] = r
    return out


@dataclass
class TraceRun:
    """Everything :func:`run_trace` produced."""
    events: list
    counters: dict
    accepted: list              # per SD round: accepted drafts per request
    rounds: list                # per round: (mode, K)
    contexts: list              # per round: context tokens sent
    controller: EsdController
    script: list = None         # the host commands in order, with the rankings routed and
                                # the responses (what a testbench replays on the RTL)


def run_trace(cfg, rankings, *, batch: int, steps: int, seed: int = 0, accept_p: float = 0.7,
              prompt: tuple = (8, 40), length: tuple = (20, 120), faults=None, mutant=None,
              kv_mid_round: bool = True, check: bool = True, force=None,
              hb_cache: bool = True, bad: float = 0.0, prefetch: int = 0) -> TraceRun:
    """The host of a synthetic decode: ``batch`` requests decoded in lock step
    until at least ``steps`` decode steps ran, routing from ``rankings``
    (:func:`synthetic_trace`, one stream per request slot, reused cyclically).

    Acceptance is random: each drafted token is accepted with probability
    ``accept_p`` until the first rejection. Requests have random prompt and
    output lengths (``prompt``, ``length`` ranges); a finished request is
    replaced by a new one, so the context (sent with ``context`` after every
    round, and with ``kv_mid_round`` also in the middle of random draft and
    verify steps) grows and shrinks and the KV boundary moves both ways.
    A layer step that fails (``faults``) is repeated by the host. ``force``
    asks every round for AR or SD, and ``hb_cache=False`` (with ``force =
    Mode.AR``) for AR with the HB expert cache off
    (:meth:`EsdController.begin_round`).
    ``prefetch``: :class:`EsdController`'s prefetch depth.
    With ``bad > 0`` a command that the controller must refuse (every
    :class:`HostError` a host can cause) is sent before a legal one with that
    probability; the script records it with ``refused`` = the error code.
    """
    rng = np.random.default_rng(seed)
    R = np.asarray(rankings)
    if R.shape[0] < batch:
        raise ValueError(f"Rankings have {R.shape[0]} request streams, batch {batch} needs more")
    if R.shape[2] != cfg.layers or R.shape[3] != cfg.experts:
        raise ValueError(f"Rankings shape {R.shape} does not match {cfg.layers} layers x "
                         f"{cfg.experts} experts")
    ctl = EsdController(cfg, faults=faults, mutant=mutant, prefetch=prefetch)
    ntok = R.shape[1]
    pos = [int(rng.integers(0, ntok)) for _ in range(batch)]      # trace position per request
    ctx = [int(rng.integers(*prompt)) for _ in range(batch)]       # context tokens per request
    left = [int(rng.integers(*length)) for _ in range(batch)]      # tokens still to generate
    kv_cap = gl.kv_limit(cfg) // max(1, cfg.kv_words_per_token)

    script = []

    def inject():
        if not bad or rng.random() >= bad:
            return
        ex = ctl.expect
        cands = [("ROUND", 0, 0), ("ROUND", MAX_BATCH + 1, 0), ("ROUND", batch, 4)]
        if ex is not None:
            cands.append(("ROUND", batch, 0))
        if isinstance(ex, tuple):
            ph, j, l = ex
            cands += [("STEP", p, j, l) for p in (Phase.AR, Phase.DRAFT, Phase.VERIFY) if p != ph]
            if cfg.layers > 1:
                cands.append(("STEP", ph, j, (l + 1) % cfg.layers))
            cands.append(("ACCEPT", 0))
        else:
            cands.append(("STEP", Phase.AR, 0, 0))
            if ex == "ACCEPT":
                cands.append(("ACCEPT", ctl.batch * ctl.round_K + 1))
            else:
                cands.append(("ACCEPT", 0))
        if cfg.kv_words_per_token:
            cands.append(("CONTEXT", gl.kv_limit(cfg) // cfg.kv_words_per_token + 1))
        c = cands[int(rng.integers(0, len(cands)))]
        before = (len(ctl.events), dict(ctl.counters), ctl.expect, ctl.K, ctl.kv_words)
        try:
            if c[0] == "ROUND":
                ctl.begin_round(c[1], None if c[2] == 0 else c[2] - 1)
            elif c[0] == "STEP":
                ctl.layer_step(c[1], c[2], c[3], RankingRouter([], cfg.top_k))
            elif c[0] == "ACCEPT":
                ctl.accept(c[1])
            else:
                ctl.context(c[1])
        except EsdHostError as e:
            code = int(e.code)
        else:
            raise AssertionError(f"{c} was not refused")
        assert before == (len(ctl.events), dict(ctl.counters), ctl.expect, ctl.K, ctl.kv_words)
        if c[0] == "ROUND":
            script.append(dict(op="ROUND", value=c[1], force=c[2], refused=code))
        elif c[0] == "STEP":
            script.append(dict(op="STEP", phase=int(c[1]), step=c[2], layer=c[3], refused=code))
        else:
            script.append(dict(op=c[0], value=c[1], refused=code))

    def send_context(extra=0):
        inject()
        total = min(sum(ctx) + extra, kv_cap)
        ctl.context(total)
        script.append(dict(op="CONTEXT", value=total, error=0))
        return total

    def ranking(b, i):
        return R[b, (pos[b] + i) % ntok]

    def step(phase, j, layer, toks):
        ranks = [ranking(b, i)[layer] for b, i in toks]
        router = RankingRouter(ranks, cfg.top_k)
        while True:
            inject()
            res = ctl.layer_step(phase, j, layer, router)
            script.append(dict(op="STEP", phase=int(phase), step=j, layer=layer,
                               rankings=np.asarray(ranks, dtype=np.int16), error=int(res.error),
                               mask=res.mask))
            if check:
                ctl.check_invariants()
            if not res.error:
                return res

    accepted, rounds, contexts = [], [], []
    send_context()
    while ctl.counters["decode_steps"] < steps:
        inject()
        mode, K = ctl.begin_round(batch, force, hb_cache)
        script.append(dict(op="ROUND", value=batch, force=force_code(force, hb_cache),
                           mode=int(mode), k=K, error=0))
        rounds.append((int(mode), K))
        if mode == Mode.AR:
            for l in range(cfg.layers):
                step(Phase.AR, 0, l, [(b, 0) for b in range(batch)])
            gen = [1] * batch
        else:
            for j in range(K):
                for l in range(cfg.layers):
                    step(Phase.DRAFT, j, l, [(b, j) for b in range(batch)])
                    if kv_mid_round and rng.random() < 0.05:
                        send_context(extra=batch * (j + 1))
            for l in range(cfg.layers):
                step(Phase.VERIFY, 0, l, [(b, i) for b in range(batch) for i in range(K + 1)])
                if kv_mid_round and rng.random() < 0.05:
                    send_context(extra=batch * (K + 1))
            a = []
            for b in range(batch):
                n = 0
                while n < K and rng.random() < accept_p:
                    n += 1
                a.append(n)
            inject()
            ctl.accept(sum(a))
            script.append(dict(op="ACCEPT", value=sum(a), error=0))
            accepted.append(a)
            gen = [x + 1 for x in a]
        for b in range(batch):
            pos[b] += gen[b]
            ctx[b] += gen[b]
            left[b] -= gen[b]
            if left[b] <= 0:                        # request done: a new one takes its place
                ctx[b] = int(rng.integers(*prompt))
                left[b] = int(rng.integers(*length))
                pos[b] = int(rng.integers(0, ntok))
        contexts.append(send_context())
    return TraceRun(ctl.events, dict(ctl.counters), accepted, rounds, contexts, ctl, script)


def complete_rankings(experts, num_experts: int) -> np.ndarray:
    """Full rankings from a top-k routing trace ``experts (..., L, k)`` (``-1``
    = none): the trace's picks first, in order, then the remaining experts in
    descending popularity of that layer over the whole trace (ties: lower
    id). A trace keeps only the top-k; drafting needs the next-ranked
    experts when a pick is not resident, and popularity is the best
    estimate the trace offers."""
    ex = np.asarray(experts)
    L, k = ex.shape[-2], ex.shape[-1]
    flat = ex.reshape(-1, L, k)
    out = np.zeros((flat.shape[0], L, num_experts), dtype=np.int16)
    for l in range(L):
        v = flat[:, l][flat[:, l] >= 0]
        pop = np.bincount(v, minlength=num_experts)
        order = sorted(range(num_experts), key=lambda e: (-pop[e], e))
        for t in range(flat.shape[0]):
            picks = [int(e) for e in flat[t, l] if e >= 0]
            seen = set(picks)
            out[t, l] = picks + [e for e in order if e not in seen]
    return out.reshape(ex.shape[:-2] + (L, num_experts))


def round_wavedrom(events, round_no: int = 0, title: str | None = None) -> dict:
    """A WaveDrom picture (JSON-able dict) of the ``round_no``-th Elastic-SD
    round of an event list: one column per pass (draft steps, verify passes,
    the accept), with the lookups that hit / missed, the fills started and
    committed, the touches, the phase and the accept/rollback."""
    evs = list(events)
    starts = [i for i, e in enumerate(evs) if e.kind == EventKind.MODE and e.code == Mode.SD]
    if round_no >= len(starts):
        raise ValueError(f"The event list has {len(starts)} SD rounds, not {round_no + 1}")
    i0 = starts[round_no]
    i1 = next((i for i in range(i0 + 1, len(evs)) if evs[i].kind == EventKind.MODE), len(evs))
    cols = []          # (label, phase, hits, misses, fills_started, commits, touches)
    cur = None
    tail = []
    for e in evs[i0:i1]:
        if e.kind == EventKind.PASS:
            ph = Phase(e.phase)
            lab = (f"D{e.step} L{e.layer}" if ph == Phase.DRAFT else f"V L{e.layer}")
            if e.pass_no:
                lab += f" p{e.pass_no}"
            cur = dict(label=lab, phase=ph.name, hit=0, miss=0, fill=0, commit=0, touch=0)
            cols.append(cur)
        elif cur is not None and e.kind == EventKind.LOOKUP:
            cur["hit" if e.code == LookupResult.HIT else "miss"] += 1
        elif cur is not None and e.kind == EventKind.FILL_START:
            cur["fill"] += 1
        elif cur is not None and e.kind == EventKind.FILL_END and e.code == FillEnd.COMMIT:
            cur["commit"] += 1
        elif cur is not None and e.kind == EventKind.TOUCH:
            cur["touch"] += 1
        elif e.kind in (EventKind.ACCEPT, EventKind.ROLLBACK, EventKind.DRAFT_LEN):
            tail.append({EventKind.ACCEPT: "acc", EventKind.ROLLBACK: "rb",
                         EventKind.DRAFT_LEN: "K="}[EventKind(e.kind)] + str(e.value))
    cols.append(dict(label="accept", phase="ACCEPT", hit=0, miss=0, fill=0, commit=0, touch=0))

    def lane(name, key, fmt=str):
        wave, data, last = "", [], None
        for c in cols:
            v = c[key]
            if key != "phase" and not v:
                wave += "x" if last != "x" else "."
                last = "x"
                continue
            if v == last and key == "phase":
                wave += "."
            else:
                wave += "="
                data.append(fmt(v))
            last = v
        return {"name": name, "wave": wave, "data": data}

    phase = lane("phase", "phase")
    label = {"name": "pass", "wave": "=" * len(cols), "data": [c["label"] for c in cols]}
    res = {"signal": [phase, label, lane("HB hits", "hit"), lane("misses", "miss"),
                      lane("fills started", "fill"), lane("fills committed", "commit"),
                      lane("touches", "touch"),
                      {"name": "host", "wave": "x" * (len(cols) - 1) + "=",
                       "data": [" ".join(tail) or "acc"]}],
           "head": {"text": title or f"Elastic-SD round {round_no}"},
           "config": {"hscale": 2}}
    return res

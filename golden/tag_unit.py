"""Golden expert-cache tag unit: the specification of the HB expert-cache
policy, operation by operation (*what* is chosen; :mod:`elmoe3d.hw.tag_unit`
and ``docs/blocks/tag_unit.md`` state *when*).

The tag unit maps an expert tag ``{layer, expert}`` to a *slot* (the
expert-region index of the HB address map). Every slot is in one of three
states (``docs/architecture.md`` §4, "one definition of resident"):

* **FREE** - holds no tag;
* **PENDING** - allocated to a tag whose fill has not committed yet: not a
  hit, never a victim, pinned once by its ALLOCATE;
* **RESIDENT** - its fill committed in HB: a hit.

Per slot it also keeps ``tag``, ``planes`` (how many MSB slice planes of the
expert HB holds: a count), ``hot`` (a saturating hotness counter fed by draft
routing and decayed by a shift) and ``pins`` (users reading or filling the
slot; a pinned slot is never evicted). A ``disabled`` slot mask (the slots the
KV region covers; an input of the hardware) overrides all of it: a disabled
slot is never a hit and never a victim, and a slot that holds a tag is freed
(tag dropped, pins cleared) when it becomes disabled. The KV region covers the
highest slots first and victims are searched from slot 0 up, so the two never
fight over the same end of the slot range.

Because the resident set *is* the self-draft model (Elastic-SD drafts only
with resident experts), this model is exact and the RTL must equal it event
for event. It is plain Python (no simulator imports).

Operations (values are the 4-bit hardware opcodes)
--------------------------------------------------
A slot *holds* a tag when it is PENDING or RESIDENT (and, necessarily,
enabled).

===============  ===============================================================
LOOKUP (0)       tag -> ``hit`` (RESIDENT) or ``pending`` (PENDING), ``slot``,
                 ``planes``, ``value`` = hotness; all 0 when no slot holds the
                 tag. Counts ``lookups`` and ``hits`` or ``pending``.
LOOKUP_PIN (9)   LOOKUP that also pins a hit (``pins += 1``, ``PIN_LIMIT`` at
                 the limit); a pending or missing tag is reported, not pinned.
TOUCH (1)        tag, amount -> ``hot = min(hot + amount, 2**hot_bits - 1)`` of
                 the slot holding the tag (RESIDENT or PENDING); response as
                 LOOKUP with the new hotness; all 0 (no change) when no slot
                 holds it.
DECAY (2)        every slot ``hot -= hot >> decay_shift``.
ALLOCATE (3)     tag, planes, amount -> victim = the lowest-index FREE enabled
                 slot, else the coldest unpinned RESIDENT enabled slot (ties to
                 the lowest index). The victim becomes PENDING with ``tag``,
                 ``planes``, ``hot = amount`` and ``pins = 1`` - one atomic
                 step, so no second ALLOCATE can take it while its fill is in
                 flight. Response ``slot`` = victim, ``evicted`` /
                 ``evicted_tag`` when it held a RESIDENT tag. Counts
                 ``allocations`` and ``evictions``.
commit (input)   HB's commit strobe (slot): a PENDING enabled slot becomes
                 RESIDENT (its pin stays: the controller UNPINs when done).
                 Counts ``commits``. A strobe naming any other slot is ignored.
ABORT (12)       slot -> a PENDING slot (its fill failed) is freed, pins
                 included. Response ``slot``, ``planes``, ``evicted`` = 1,
                 ``evicted_tag``. Counts ``aborts``.
INVALIDATE (4)   tag -> the slot holding it is freed. Response ``hit`` /
                 ``pending`` (its state before), ``slot``, ``planes``,
                 ``evicted`` = 1, ``evicted_tag`` = tag; all 0 when not held.
INVALIDATE_SLOT  slot -> that slot is freed (10). Response as INVALIDATE
                 (``slot`` echoed; the rest 0 when it was FREE).
INVALIDATE_MASK  slot_mask -> every slot of the mask is freed (11); response
                 ``slot_mask`` = the slots that held a tag.
PIN (5)          slot -> ``pins += 1`` (response ``value`` = new pin count).
UNPIN (6)        slot -> ``pins -= 1`` (response ``value`` = new pin count).
RESET (7)        every slot FREE, hotness and pins 0, statistics 0 (the
                 disabled mask is an input and stays).
STATS (8)        ``slot`` field = counter index (:data:`STAT_NAMES`) -> ``value``;
                 the response's ``slot`` echoes the index.
===============  ===============================================================

Bad commands answer with a :class:`TagError` and change nothing (statistics
included); every field of an error response except ``op`` and ``error`` is 0.
Checked in this order per operation:

* ``BAD_OP``: opcode 13..15;
* ``BAD_SLOT``: PIN / UNPIN / ABORT / INVALIDATE_SLOT of a slot ``>= S``;
  STATS index ``>= len(STAT_NAMES)``;
* ``RESIDENT`` / ``PENDING``: ALLOCATE of a tag that a slot holds RESIDENT /
  PENDING;
* ``NO_VICTIM``: ALLOCATE when no enabled slot is FREE or unpinned RESIDENT;
* ``NOT_VALID``: PIN or UNPIN of a slot that holds no tag;
* ``NOT_PENDING``: ABORT of a slot that is not PENDING;
* ``PIN_LIMIT``: PIN (or LOOKUP_PIN of a hit) at ``2**pin_bits - 1`` pins;
* ``NOT_PINNED``: UNPIN at 0 pins;
* ``PINNED``: INVALIDATE / INVALIDATE_SLOT of a pinned slot, INVALIDATE_MASK
  with a pinned slot in the mask (nothing is freed).

Invariants (checked by :meth:`TagUnitModel.check_invariants` and, on the
RTL, by the formal proof): no two slots hold the same tag; a slot with pins
or hotness holds a tag; a PENDING slot is pinned unless the controller
unpinned it; a disabled slot holds nothing.

Statistics counters are ``stat_bits`` wide and *saturate* (never wrap).

One clock cycle
---------------
The hardware takes ``disabled`` and the commit strobe as inputs while
commands flow; :meth:`TagUnitModel.step` is one cycle of it in the order the
RTL implements: the command that executes in that cycle (if any, on the
state at the start of the cycle), then the cycle's ``disabled`` mask (newly
covered slots are freed), then its commit strobe. Which cycle a command
executes in is the RTL's documented timing.

Python interface for simulations
--------------------------------
The methods :meth:`~TagUnitModel.lookup`, :meth:`~TagUnitModel.touch`,
:meth:`~TagUnitModel.decay`, :meth:`~TagUnitModel.allocate`,
:meth:`~TagUnitModel.invalidate`, :meth:`~TagUnitModel.pin`,
:meth:`~TagUnitModel.unpin`, :meth:`~TagUnitModel.choose_victim`,
:meth:`~TagUnitModel.stats`, :meth:`~TagUnitModel.hit_rate` keep their
earlier signatures. ``allocate(tag, planes, hot)`` is the *pure-cache* form
used by the system model: it is ALLOCATE, commit and UNPIN in one call (the
victim is RESIDENT and unpinned on return, ``commits`` counts it);
``allocate(..., pending=True)`` is the hardware ALLOCATE (PENDING, pinned
once), to be ended with :meth:`commit` or :meth:`abort`.
"""

from __future__ import annotations

import enum

from ..geometry import TAG_STAT_NAMES
from ..geometry import check_tag_params as check_params
from ..geometry import tag_slot_bits as slot_bits
from ..geometry import tag_unit_params as params_from_config
from ..geometry import tag_value_bits as value_bits

__all__ = ["TagOp", "TagError", "SlotState", "TagCodec", "TagUnitModel", "STAT_NAMES",
           "RESPONSE_FIELDS", "COMMAND_FIELDS", "OP_BITS", "ERROR_BITS", "slot_bits",
           "value_bits", "check_params", "params_from_config"]


class TagOp(enum.IntEnum):
    """Tag-unit opcode (the 4-bit hardware encoding); 13..15 are invalid."""
    LOOKUP = 0
    TOUCH = 1
    DECAY = 2
    ALLOCATE = 3
    INVALIDATE = 4
    PIN = 5
    UNPIN = 6
    RESET = 7
    STATS = 8
    LOOKUP_PIN = 9
    INVALIDATE_SLOT = 10
    INVALIDATE_MASK = 11
    ABORT = 12


class TagError(enum.IntEnum):
    """Error code of a response (4-bit hardware encoding); OK = 0."""
    OK = 0
    BAD_OP = 1
    BAD_SLOT = 2
    RESIDENT = 3
    NO_VICTIM = 4
    NOT_VALID = 5
    NOT_PINNED = 6
    PIN_LIMIT = 7
    PINNED = 8
    NOT_PENDING = 9
    PENDING = 10


class SlotState(enum.IntEnum):
    """State of one slot (``docs/architecture.md`` §4)."""
    FREE = 0
    PENDING = 1
    RESIDENT = 2


#: STATS counter order (the index in the command's ``slot`` field; the widths
#: of the fields are :mod:`elmoe3d.geometry`'s).
STAT_NAMES = TAG_STAT_NAMES
COMMAND_FIELDS = ("op", "tag", "slot", "amount", "planes", "slot_mask")
RESPONSE_FIELDS = ("op", "error", "hit", "pending", "slot", "planes", "evicted", "evicted_tag",
                   "value", "slot_mask")

OP_BITS = 4
ERROR_BITS = 4


class TagCodec:
    """The tag encoding (``layer << expert_bits | expert``) and the range
    checks of tags and slots, shared by the golden tag unit and the fast
    NumPy policy (:class:`elmoe3d.sim.perf.fastpolicy.FastTagUnit`). A
    subclass sets ``slots``, ``layer_bits``, ``expert_bits`` and
    ``tag_bits``."""

    def make_tag(self, layer: int, expert: int) -> int:
        if not 0 <= layer < (1 << self.layer_bits):
            raise ValueError(f"Layer {layer!r} does not fit in {self.layer_bits} bits")
        if not 0 <= expert < (1 << self.expert_bits):
            raise ValueError(f"Expert {expert!r} does not fit in {self.expert_bits} bits")
        return (layer << self.expert_bits) | expert

    def split_tag(self, tag: int) -> tuple[int, int]:
        self._check_tag(tag)
        return tag >> self.expert_bits, tag & ((1 << self.expert_bits) - 1)

    def _check_tag(self, tag):
        if not 0 <= tag < (1 << self.tag_bits):
            raise ValueError(f"Tag {tag!r} does not fit in {self.tag_bits} bits")

    def _check_slot(self, slot):
        if not 0 <= slot < self.slots:
            raise ValueError(f"Slot {slot!r} is outside 0..{self.slots - 1}")


class TagUnitModel(TagCodec):
    """Golden model of the tag unit.

    Parameters
    ----------
    slots : int
        ``S``, number of slots (2..4096).
    layer_bits, expert_bits : int
        Tag = ``layer << expert_bits | expert``.
    hot_bits : int
        Hotness counter width (saturating); also the width of ``amount``.
    decay_shift : int
        ``d`` in ``hot -= hot >> d`` (0 clears, ``>= hot_bits`` is a no-op).
    plane_bits : int
        Width of the resident-planes field (a count).
    stat_bits : int
        Width of the saturating statistics counters.
    pin_bits : int
        Width of each slot's pin counter.
    mutant : str, optional
        Testbench self-check only: ``"tie"`` breaks victim ties at the
        *highest* index, ``"decay"`` decays by ``d + 1``, ``"pending_hit"``
        reports PENDING slots as hits. Never use otherwise.

    Members
    -------
    valid : list of int
        1 where the slot holds a tag (PENDING or RESIDENT).
    pending : list of int
        1 where the slot is PENDING.
    disabled : list of int
        The current disabled mask (KV-covered slots), one entry per slot.
    tags, planes, hot, pins : list of int
        Per-slot state, index = slot (read-only for callers; 0 when FREE).
    counters : dict
        The statistics (see :meth:`stats`).

    Raises
    ------
    TypeError, ValueError
        For a parameter of the wrong kind or value, naming it.
    """

    def __init__(self, slots: int = 32, layer_bits: int = 6, expert_bits: int = 7,
                 hot_bits: int = 8, decay_shift: int = 2, plane_bits: int = 2,
                 stat_bits: int = 32, pin_bits: int = 3, *, mutant: str | None = None):
        check_params(slots, layer_bits, expert_bits, hot_bits, decay_shift, plane_bits,
                     stat_bits, pin_bits)
        if mutant not in (None, "tie", "decay", "pending_hit"):
            raise ValueError(f"Unknown mutant {mutant!r}")
        self.slots = slots
        self.layer_bits = layer_bits
        self.expert_bits = expert_bits
        self.tag_bits = layer_bits + expert_bits
        self.hot_bits = hot_bits
        self.hot_max = (1 << hot_bits) - 1
        self.decay_shift = decay_shift
        self.plane_bits = plane_bits
        self.stat_bits = stat_bits
        self.stat_max = (1 << stat_bits) - 1
        self.pin_bits = pin_bits
        self.pin_max = (1 << pin_bits) - 1
        self.slot_bits = slot_bits(slots)
        self.mutant = mutant
        self.disabled = [0] * slots
        self.reset()

    @classmethod
    def from_config(cls, cfg, **kw) -> "TagUnitModel":
        """The model with every parameter taken from a :class:`~elmoe3d.config.Config`."""
        return cls(**params_from_config(cfg), **kw)

    # -- parameters as a dict (what the RTL factory takes) --------------------
    def params(self) -> dict:
        return dict(slots=self.slots, layer_bits=self.layer_bits, expert_bits=self.expert_bits,
                    hot_bits=self.hot_bits, decay_shift=self.decay_shift,
                    plane_bits=self.plane_bits, stat_bits=self.stat_bits, pin_bits=self.pin_bits)

    # -- state views ---------------------------------------------------------------
    def slot_state(self, s: int) -> SlotState:
        """FREE, PENDING or RESIDENT."""
        if not self.valid[s]:
            return SlotState.FREE
        return SlotState.PENDING if self.pending[s] else SlotState.RESIDENT

    def resident(self, s: int) -> bool:
        """Slot ``s`` is RESIDENT (its fill committed; enabled by construction)."""
        return bool(self.valid[s] and not self.pending[s])

    def resident_mask(self) -> int:
        """Bit ``s`` set where slot ``s`` is RESIDENT (the RTL's ``resident`` output)."""
        return sum(1 << s for s in range(self.slots) if self.valid[s] and not self.pending[s])

    def pending_mask(self) -> int:
        """Bit ``s`` set where slot ``s`` is PENDING (the RTL's ``pending`` output)."""
        return sum(1 << s for s in range(self.slots) if self.pending[s])

    def slot_of(self, tag: int) -> int | None:
        """The slot holding ``tag`` (PENDING or RESIDENT), or ``None``."""
        return self._where.get(tag)

    def state_of(self, tag: int) -> tuple[SlotState, int | None]:
        """``(state, slot)`` of the slot holding ``tag``; ``(FREE, None)``
        when no slot holds it. No side effects."""
        s = self._where.get(tag)
        return (SlotState.FREE, None) if s is None else (self.slot_state(s), s)

    # -- operations -------------------------------------------------------------
    def reset(self):
        """RESET: every slot FREE, hotness, pins and statistics 0 (``disabled``
        is an input and stays)."""
        S = self.slots
        self.valid = [0] * S
        self.pending = [0] * S
        self.tags = [0] * S
        self.planes = [0] * S
        self.hot = [0] * S
        self.pins = [0] * S
        self._where = {}                     # tag -> slot of the slots holding a tag
        self.counters = dict.fromkeys(STAT_NAMES, 0)

    def _count(self, name, n=1):
        self.counters[name] = min(self.counters[name] + n, self.stat_max)

    def _is_hit(self, s) -> bool:
        return not self.pending[s] or self.mutant == "pending_hit"

    def lookup(self, tag: int, *, pin: bool = False) -> tuple[bool, int, int]:
        """LOOKUP (``pin=True``: LOOKUP_PIN) as the system model uses it:
        ``(hit, slot, planes)`` of a RESIDENT tag, ``(False, 0, 0)`` for a
        PENDING or absent one (a PENDING tag is not a hit). The counters move
        as in hardware (``lookups``, and ``hits`` or ``pending``).

        The hardware *response* says more for a PENDING tag: ``pending`` = 1
        with its ``slot``, ``planes`` and hotness (the module's table,
        :meth:`execute`); :meth:`state_of` and :meth:`slot_of` give them here.
        ``ValueError`` (hardware: ``PIN_LIMIT``, nothing counted) when a hit
        to pin is at the pin limit."""
        self._check_tag(tag)
        s = self._where.get(tag)
        hit = s is not None and self._is_hit(s)
        if pin and hit and self.pins[s] >= self.pin_max:
            raise ValueError(f"Slot {s} is already pinned {self.pin_max} times")
        self._count("lookups")
        if s is None:
            return False, 0, 0
        if not hit:
            self._count("pending")
            return False, 0, 0
        self._count("hits")
        if pin:
            self.pins[s] += 1
        return True, s, self.planes[s]

    def touch(self, tag: int, amount: int = 1) -> bool:
        """TOUCH: saturating ``hot += amount`` of the slot holding ``tag``
        (RESIDENT or PENDING); False when no slot holds it."""
        self._check_tag(tag)
        if not 0 <= amount <= self.hot_max:
            raise ValueError(f"Touch amount {amount!r} does not fit in {self.hot_bits} bits")
        s = self._where.get(tag)
        if s is None:
            return False
        self.hot[s] = min(self.hot[s] + amount, self.hot_max)
        return True

    def decay(self):
        """DECAY: every counter ``h -= h >> d``."""
        d = self.decay_shift + (1 if self.mutant == "decay" else 0)
        self.hot = [h - (h >> d) for h in self.hot]

    def choose_victim(self) -> int | None:
        """The slot ALLOCATE would take: the lowest-index FREE enabled slot,
        else the coldest unpinned RESIDENT enabled slot (ties: lowest index);
        ``None`` when there is none (PENDING and disabled slots never are)."""
        best = None
        for s in range(self.slots):
            if self.disabled[s]:
                continue
            if not self.valid[s]:
                return s
            if self.pins[s] or self.pending[s]:
                continue
            if best is None or self.hot[s] < self.hot[best] or \
                    (self.mutant == "tie" and self.hot[s] == self.hot[best]):
                best = s
        return best

    def allocate(self, tag: int, planes: int = 0, hot: int = 0, *, pending: bool = False):
        """ALLOCATE: ``(ok, victim, evicted_tag)``; ``ok`` False (and nothing
        changed) when there is no victim. ``ValueError`` when a slot already
        holds ``tag`` (hardware: ``RESIDENT`` / ``PENDING``).

        ``pending=True`` is the hardware ALLOCATE: the victim is PENDING and
        pinned once until :meth:`commit` (then RESIDENT, still pinned) or
        :meth:`abort`. ``pending=False`` (the default, for cache simulations)
        is ALLOCATE, commit and UNPIN in one call: the victim is RESIDENT and
        unpinned on return, and ``commits`` counts it.
        """
        self._check_tag(tag)
        if not 0 <= planes < (1 << self.plane_bits):
            raise ValueError(f"Plane count {planes!r} does not fit in {self.plane_bits} bits")
        if not 0 <= hot <= self.hot_max:
            raise ValueError(f"Initial hotness {hot!r} does not fit in {self.hot_bits} bits")
        if tag in self._where:
            s = self._where[tag]
            raise ValueError(f"Tag {tag!r} is already {self.slot_state(s).name} in slot {s}")
        v = self.choose_victim()
        if v is None:
            return False, None, None
        evicted = None
        if self.valid[v]:
            evicted = self.tags[v]
            del self._where[evicted]
            self._count("evictions")
        self._count("allocations")
        self.valid[v], self.tags[v], self.planes[v] = 1, tag, planes
        self.hot[v] = hot
        self._where[tag] = v
        if pending:
            self.pending[v], self.pins[v] = 1, 1
        else:
            self.pending[v], self.pins[v] = 0, 0
            self._count("commits")
        return True, v, evicted

    def commit(self, slot: int) -> bool:
        """HB's commit strobe: a PENDING slot becomes RESIDENT (pins unchanged).
        Returns False (and changes nothing) for any other slot, as the
        hardware ignores such a strobe."""
        if not 0 <= slot < self.slots or not self.pending[slot]:
            return False
        self.pending[slot] = 0
        self._count("commits")
        return True

    def abort(self, slot: int) -> int:
        """ABORT: free a PENDING slot (its fill failed), pins included; returns
        the tag it held. ``ValueError`` when the slot is not PENDING."""
        self._check_slot(slot)
        if not self.pending[slot]:
            raise ValueError(f"Slot {slot} is {self.slot_state(slot).name}, not PENDING")
        tag = self.tags[slot]
        self._free(slot)
        self._count("aborts")
        return tag

    def invalidate(self, tag: int) -> bool:
        """INVALIDATE: free the slot holding ``tag``; False when no slot holds
        it. ``ValueError`` when that slot is pinned (hardware: ``PINNED``)."""
        self._check_tag(tag)
        s = self._where.get(tag)
        if s is None:
            return False
        if self.pins[s]:
            raise ValueError(f"Slot {s} holding tag {tag!r} is pinned")
        self._free(s)
        return True

    def invalidate_slot(self, slot: int) -> bool:
        """INVALIDATE_SLOT: free ``slot``; False when it held nothing.
        ``ValueError`` when it is pinned."""
        self._check_slot(slot)
        if not self.valid[slot]:
            return False
        if self.pins[slot]:
            raise ValueError(f"Slot {slot} is pinned")
        self._free(slot)
        return True

    def invalidate_mask(self, mask: int) -> int:
        """INVALIDATE_MASK: free every slot of ``mask``; returns the mask of
        those that held a tag. ``ValueError`` (nothing freed) when one of them
        is pinned."""
        if not 0 <= mask < (1 << self.slots):
            raise ValueError(f"Slot mask {mask!r} does not fit in {self.slots} bits")
        held = [s for s in range(self.slots) if (mask >> s) & 1 and self.valid[s]]
        pinned = [s for s in held if self.pins[s]]
        if pinned:
            raise ValueError(f"Slots {pinned} of mask {mask:#x} are pinned")
        for s in held:
            self._free(s)
        return sum(1 << s for s in held)

    def set_disabled(self, mask: int) -> list[tuple[int, int]]:
        """The ``disabled`` input takes the value ``mask``: every slot it
        covers that holds a tag is freed (pins included; counted in
        ``kv_frees``). Returns ``[(slot, tag)]`` of the freed slots."""
        if not 0 <= mask < (1 << self.slots):
            raise ValueError(f"Disabled mask {mask!r} does not fit in {self.slots} bits")
        self.disabled = [(mask >> s) & 1 for s in range(self.slots)]
        dropped = []
        for s in range(self.slots):
            if self.disabled[s] and self.valid[s]:
                dropped.append((s, self.tags[s]))
                self._free(s)
        self._count("kv_frees", len(dropped))
        return dropped

    def disabled_mask(self) -> int:
        return sum(d << s for s, d in enumerate(self.disabled))

    def _free(self, s):
        if self.valid[s]:
            del self._where[self.tags[s]]
        self.valid[s] = self.pending[s] = self.tags[s] = self.planes[s] = 0
        self.hot[s] = self.pins[s] = 0

    def pin(self, slot: int) -> int:
        """PIN: new pin count; ``ValueError`` for a slot holding no tag or at the limit."""
        self._check_slot(slot)
        if not self.valid[slot]:
            raise ValueError(f"Slot {slot} is free and cannot be pinned")
        if self.pins[slot] >= self.pin_max:
            raise ValueError(f"Slot {slot} is already pinned {self.pin_max} times")
        self.pins[slot] += 1
        return self.pins[slot]

    def unpin(self, slot: int) -> int:
        """UNPIN: new pin count; ``ValueError`` for a free or unpinned slot."""
        self._check_slot(slot)
        if not self.valid[slot]:
            raise ValueError(f"Slot {slot} is free")
        if not self.pins[slot]:
            raise ValueError(f"Slot {slot} is not pinned")
        self.pins[slot] -= 1
        return self.pins[slot]

    def stats(self) -> dict:
        """``dict`` of every counter in :data:`STAT_NAMES` (lookups, hits,
        allocations, evictions, pending, commits, aborts, kv_frees)."""
        return dict(self.counters)

    def hit_rate(self) -> float:
        return self.counters["hits"] / self.counters["lookups"] if self.counters["lookups"] else 0.0

    # -- the command/response form the testbench compares with ---------------
    def execute(self, cmd: dict) -> dict:
        """Execute one command dict (fields :data:`COMMAND_FIELDS`, missing
        ones 0) and return the response dict (fields :data:`RESPONSE_FIELDS`).
        Bad commands return an error code and change nothing."""
        op = int(cmd.get("op", 0))
        tag = int(cmd.get("tag", 0))
        slot = int(cmd.get("slot", 0))
        amount = int(cmd.get("amount", 0))
        planes = int(cmd.get("planes", 0))
        mask = int(cmd.get("slot_mask", 0))
        r = dict.fromkeys(RESPONSE_FIELDS, 0)
        r["op"] = op

        def err(code):
            out = dict.fromkeys(RESPONSE_FIELDS, 0)
            out["op"], out["error"] = op, int(code)
            return out

        def held(s):                        # response fields of a slot holding a tag
            return dict(hit=int(self._is_hit(s)), pending=int(not self._is_hit(s)), slot=s,
                        planes=self.planes[s])

        if op in (TagOp.LOOKUP, TagOp.LOOKUP_PIN):
            s = self._where.get(tag)
            if s is not None and self._is_hit(s) and op == TagOp.LOOKUP_PIN \
                    and self.pins[s] >= self.pin_max:
                return err(TagError.PIN_LIMIT)
            self.lookup(tag, pin=op == TagOp.LOOKUP_PIN)
            if s is not None:
                r.update(held(s), value=self.hot[s])
        elif op == TagOp.TOUCH:
            if self.touch(tag, amount):
                s = self._where[tag]
                r.update(held(s), value=self.hot[s])
        elif op == TagOp.DECAY:
            self.decay()
        elif op == TagOp.ALLOCATE:
            s = self._where.get(tag)
            if s is not None:
                return err(TagError.PENDING if self.pending[s] else TagError.RESIDENT)
            ok, v, ev = self.allocate(tag, planes, amount, pending=True)
            if not ok:
                return err(TagError.NO_VICTIM)
            r.update(slot=v, evicted=int(ev is not None), evicted_tag=ev or 0)
        elif op in (TagOp.INVALIDATE, TagOp.INVALIDATE_SLOT):
            if op == TagOp.INVALIDATE:
                s = self._where.get(tag)
            else:
                if slot >= self.slots:
                    return err(TagError.BAD_SLOT)
                s = slot if self.valid[slot] else None
                r["slot"] = slot
            if s is not None:
                if self.pins[s]:
                    return err(TagError.PINNED)
                r.update(held(s), evicted=1, evicted_tag=self.tags[s])
                self._free(s)
        elif op == TagOp.INVALIDATE_MASK:
            held_mask = [s for s in range(self.slots) if (mask >> s) & 1 and self.valid[s]]
            if any(self.pins[s] for s in held_mask):
                return err(TagError.PINNED)
            r["slot_mask"] = self.invalidate_mask(mask)
        elif op in (TagOp.PIN, TagOp.UNPIN):
            if slot >= self.slots:
                return err(TagError.BAD_SLOT)
            if not self.valid[slot]:
                return err(TagError.NOT_VALID)
            if op == TagOp.PIN:
                if self.pins[slot] >= self.pin_max:
                    return err(TagError.PIN_LIMIT)
                self.pins[slot] += 1
            else:
                if not self.pins[slot]:
                    return err(TagError.NOT_PINNED)
                self.pins[slot] -= 1
            r.update(slot=slot, value=self.pins[slot])
        elif op == TagOp.ABORT:
            if slot >= self.slots:
                return err(TagError.BAD_SLOT)
            if not self.pending[slot]:
                return err(TagError.NOT_PENDING)
            r.update(slot=slot, planes=self.planes[slot], evicted=1)
            r["evicted_tag"] = self.abort(slot)
        elif op == TagOp.RESET:
            self.reset()
        elif op == TagOp.STATS:
            if slot >= len(STAT_NAMES):
                return err(TagError.BAD_SLOT)
            r.update(slot=slot, value=self.counters[STAT_NAMES[slot]])
        else:
            return err(TagError.BAD_OP)
        return r

    def step(self, cmd: dict | None = None, *, commit: int | None = None,
             disabled: int | None = None) -> dict | None:
        """One clock cycle of the hardware: the command executing in the cycle
        (if any), then the cycle's ``disabled`` mask (if given), then its
        commit strobe (a slot index, if any). Returns the command's response."""
        r = None if cmd is None else self.execute(cmd)
        if disabled is not None and disabled != self.disabled_mask():
            self.set_disabled(disabled)
        if commit is not None:
            self.commit(commit)
        return r

    # -- invariants (used by tests) --------------------------------------------
    def check_invariants(self):
        """Raise ``AssertionError`` if the state breaks a policy invariant."""
        seen = {}
        for s in range(self.slots):
            if self.valid[s]:
                if self.tags[s] in seen:
                    raise AssertionError(f"tag {self.tags[s]} in slots {seen[self.tags[s]]} and {s}")
                seen[self.tags[s]] = s
                if self.disabled[s]:
                    raise AssertionError(f"disabled slot {s} holds tag {self.tags[s]}")
            else:
                if self.pins[s] or self.hot[s] or self.pending[s] or self.tags[s]:
                    raise AssertionError(f"free slot {s} has pins/hotness/pending/tag")
            if not 0 <= self.hot[s] <= self.hot_max:
                raise AssertionError(f"slot {s} hotness {self.hot[s]} out of range")
        if seen != self._where:
            raise AssertionError("tag index out of sync")

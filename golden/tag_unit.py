"""Golden expert-cache tag unit: the specification of the HB expert-cache
policy, operation by operation.

The tag unit maps an expert tag ``{layer, expert}`` to a *slot* (the
expert-region index in the HB address map ``{slot, plane, row}``). Per slot
it keeps ``valid``, ``tag``, ``planes`` (how many MSB slice planes of that
expert are resident in HB), ``hot`` (a saturating hotness counter fed by
draft routing and decayed by a shift) and ``pins`` (a count of users that
are reading the slot; a pinned slot is never evicted).

Because the resident set *is* the self-draft model (Elastic-SD drafts only
with resident experts), this model is exact and the RTL
(:mod:`elmoe3d.hw.tag_unit`) must equal it event for event. It is plain
Python (no simulator imports), fast enough for million-command traces.

Operations (values are the hardware opcode encoding, 4 bits)
------------------------------------------------------------
==========  ==================================================================
LOOKUP      tag -> hit, slot, planes, hot (``value``). Counts ``lookups``/``hits``.
TOUCH       tag, amount -> ``hot = min(hot + amount, 2**hot_bits - 1)``;
            response like LOOKUP with the new hotness; ``hit = 0`` (no
            change, no error) when the tag is not resident.
DECAY       every slot: ``hot -= hot >> decay_shift``.
ALLOCATE    tag, planes, amount -> victim = lowest-index free slot, else the
            coldest unpinned valid slot (ties: lowest index). The victim
            gets ``valid = 1, tag, planes, hot = amount, pins = 0``.
            Response: ``slot`` = victim, ``evicted``/``evicted_tag`` when
            the victim held a valid tag. Counts ``allocations`` and, when a
            tag was evicted, ``evictions``.
INVALIDATE  tag -> the slot becomes free (``hit`` says whether it was resident;
            response carries its slot and planes).
PIN         slot -> pins += 1 (response ``value`` = new pin count).
UNPIN       slot -> pins -= 1 (response ``value`` = new pin count).
RESET       every slot free, hotness and pins 0, statistics 0.
STATS       ``slot`` field selects a counter (0 lookups, 1 hits,
            2 allocations, 3 evictions) -> ``value``.
==========  ==================================================================

Bad commands answer with a :class:`TagError` and change nothing (statistics
included). Every field of an error response except ``op`` and ``error`` is 0:

* ``BAD_OP``: unknown opcode (9..15);
* ``BAD_SLOT``: PIN/UNPIN of a slot ``>= S``, STATS index ``> 3``;
* ``RESIDENT``: ALLOCATE of a tag that is already resident;
* ``NO_VICTIM``: ALLOCATE when every slot is valid and pinned;
* ``NOT_VALID``: PIN or UNPIN of a free slot (a pinned free slot would be
  the first victim, breaking "a pinned slot is never a victim");
* ``NOT_PINNED``: UNPIN of a slot whose pin count is 0;
* ``PIN_LIMIT``: PIN of a slot whose pin count is ``2**pin_bits - 1``;
* ``PINNED``: INVALIDATE of a pinned slot.

These rules keep three invariants the formal proof checks on the RTL: no two
valid slots hold the same tag, ``pins > 0`` implies ``valid``, and a free
slot has ``hot = 0``.

Statistics counters are ``stat_bits`` wide and *saturate* at
``2**stat_bits - 1`` (they never wrap).

Response fields (one response per command, in order)
----------------------------------------------------
``op, error, hit, slot, planes, evicted, evicted_tag, value``; fields an
operation does not define are 0. :meth:`TagUnitModel.execute` produces this
dict from a command dict ``{op, tag, slot, amount, planes}`` (missing keys
are 0), exactly what the testbench compares with the RTL.
"""

from __future__ import annotations

import enum
import math

from ..config import check_int

__all__ = ["TagOp", "TagError", "TagUnitModel", "STAT_NAMES", "RESPONSE_FIELDS",
           "COMMAND_FIELDS", "slot_bits", "check_params"]


class TagOp(enum.IntEnum):
    """Tag-unit opcode (the 4-bit hardware encoding); 9..15 are invalid."""
    LOOKUP = 0
    TOUCH = 1
    DECAY = 2
    ALLOCATE = 3
    INVALIDATE = 4
    PIN = 5
    UNPIN = 6
    RESET = 7
    STATS = 8


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


#: STATS counter order (the index in the command's ``slot`` field).
STAT_NAMES = ("lookups", "hits", "allocations", "evictions")
COMMAND_FIELDS = ("op", "tag", "slot", "amount", "planes")
RESPONSE_FIELDS = ("op", "error", "hit", "slot", "planes", "evicted", "evicted_tag", "value")

OP_BITS = 4
ERROR_BITS = 4


def check_params(slots, layer_bits, expert_bits, hot_bits, decay_shift, plane_bits,
                 stat_bits, pin_bits) -> None:
    """Validate the tag unit's parameters (shared by the golden model and the
    RTL, so both refuse exactly the same values with the same messages)."""
    check_int("Tag-unit slot count", slots, 2, 4096)
    check_int("Layer id width", layer_bits, 1, 16)
    check_int("Expert id width", expert_bits, 1, 16)
    check_int("Hotness width", hot_bits, 1, 32)
    check_int("Decay shift", decay_shift, 0, hot_bits)
    check_int("Resident-plane width", plane_bits, 1, 8)
    check_int("Statistics counter width", stat_bits, 1, 64)
    check_int("Pin counter width", pin_bits, 1, 16)


def slot_bits(slots: int) -> int:
    """Width of the command/response ``slot`` field: enough for ``slots - 1``
    and for the STATS index 0..3 (so at least 2 bits)."""
    return max(2, math.ceil(math.log2(slots)))


class TagUnitModel:
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
        Width of the resident-planes field.
    stat_bits : int
        Width of the saturating statistics counters.
    pin_bits : int
        Width of each slot's pin counter.
    mutant : str, optional
        Testbench self-check only: ``"tie"`` breaks victim ties at the
        *highest* index, ``"decay"`` decays by ``d + 1``. Never use otherwise.

    Members
    -------
    valid, tags, planes, hot, pins : list of int
        Per-slot state, index = slot (read-only for callers).
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
        if mutant not in (None, "tie", "decay"):
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
        self.reset()

    # -- parameters as a dict (what the RTL factory takes) --------------------
    def params(self) -> dict:
        return dict(slots=self.slots, layer_bits=self.layer_bits, expert_bits=self.expert_bits,
                    hot_bits=self.hot_bits, decay_shift=self.decay_shift,
                    plane_bits=self.plane_bits, stat_bits=self.stat_bits, pin_bits=self.pin_bits)

    # -- tags --------------------------------------------------------------------
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

    # -- operations -------------------------------------------------------------
    def reset(self):
        """RESET: every slot free, hotness, pins and statistics 0."""
        S = self.slots
        self.valid = [0] * S
        self.tags = [0] * S
        self.planes = [0] * S
        self.hot = [0] * S
        self.pins = [0] * S
        self._where = {}                     # tag -> slot of the valid slots
        self.counters = dict.fromkeys(STAT_NAMES, 0)

    def _count(self, name):
        if self.counters[name] < self.stat_max:
            self.counters[name] += 1

    def slot_of(self, tag: int) -> int | None:
        """The slot holding ``tag``, or ``None`` (no side effects)."""
        return self._where.get(tag)

    def lookup(self, tag: int) -> tuple[bool, int, int]:
        """LOOKUP: ``(hit, slot, planes)``; slot and planes are 0 on a miss."""
        self._check_tag(tag)
        self._count("lookups")
        s = self._where.get(tag)
        if s is None:
            return False, 0, 0
        self._count("hits")
        return True, s, self.planes[s]

    def touch(self, tag: int, amount: int = 1) -> bool:
        """TOUCH: saturating ``hot += amount``; False when ``tag`` is not resident."""
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
        """The slot ALLOCATE would take (lowest free, else coldest unpinned,
        ties lowest index), or ``None`` when every slot is pinned."""
        best = None
        for s in range(self.slots):
            if not self.valid[s]:
                return s
            if self.pins[s]:
                continue
            if best is None or self.hot[s] < self.hot[best] or \
                    (self.mutant == "tie" and self.hot[s] == self.hot[best]):
                best = s
        return best

    def allocate(self, tag: int, planes: int = 0, hot: int = 0):
        """ALLOCATE: ``(ok, victim, evicted_tag)``; ``ok`` False (and nothing
        changed) when every slot is pinned. ``ValueError`` when ``tag`` is
        already resident (the hardware answers ``TagError.RESIDENT``)."""
        self._check_tag(tag)
        if not 0 <= planes < (1 << self.plane_bits):
            raise ValueError(f"Plane count {planes!r} does not fit in {self.plane_bits} bits")
        if not 0 <= hot <= self.hot_max:
            raise ValueError(f"Initial hotness {hot!r} does not fit in {self.hot_bits} bits")
        if tag in self._where:
            raise ValueError(f"Tag {tag!r} is already resident in slot {self._where[tag]}")
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
        self.hot[v], self.pins[v] = hot, 0
        self._where[tag] = v
        return True, v, evicted

    def invalidate(self, tag: int) -> bool:
        """INVALIDATE: free the slot holding ``tag``; False when not resident.
        ``ValueError`` when that slot is pinned (hardware: ``PINNED``)."""
        self._check_tag(tag)
        s = self._where.get(tag)
        if s is None:
            return False
        if self.pins[s]:
            raise ValueError(f"Slot {s} holding tag {tag!r} is pinned")
        self._free(s)
        return True

    def _free(self, s):
        del self._where[self.tags[s]]
        self.valid[s] = self.tags[s] = self.planes[s] = self.hot[s] = self.pins[s] = 0

    def pin(self, slot: int) -> int:
        """PIN: new pin count; ``ValueError`` for a free slot or at the limit."""
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

    def _check_slot(self, slot):
        if not 0 <= slot < self.slots:
            raise ValueError(f"Slot {slot!r} is outside 0..{self.slots - 1}")

    def stats(self) -> dict:
        """``dict(lookups, hits, allocations, evictions)``."""
        return dict(self.counters)

    def hit_rate(self) -> float:
        return self.counters["hits"] / self.counters["lookups"] if self.counters["lookups"] else 0.0

    # -- the command/response form the testbench compares with ---------------
    def execute(self, cmd: dict) -> dict:
        """Execute one command dict ``{op, tag, slot, amount, planes}`` and
        return the response dict (fields :data:`RESPONSE_FIELDS`). Bad
        commands return an error code and change nothing."""
        op = int(cmd.get("op", 0))
        tag = int(cmd.get("tag", 0))
        slot = int(cmd.get("slot", 0))
        amount = int(cmd.get("amount", 0))
        planes = int(cmd.get("planes", 0))
        r = dict.fromkeys(RESPONSE_FIELDS, 0)
        r["op"] = op

        def err(code):
            out = dict.fromkeys(RESPONSE_FIELDS, 0)
            out["op"], out["error"] = op, int(code)
            return out

        if op == TagOp.LOOKUP:
            hit, s, p = self.lookup(tag)
            if hit:
                r.update(hit=1, slot=s, planes=p, value=self.hot[s])
        elif op == TagOp.TOUCH:
            if self.touch(tag, amount):
                s = self._where[tag]
                r.update(hit=1, slot=s, planes=self.planes[s], value=self.hot[s])
        elif op == TagOp.DECAY:
            self.decay()
        elif op == TagOp.ALLOCATE:
            if tag in self._where:
                return err(TagError.RESIDENT)
            ok, v, ev = self.allocate(tag, planes, amount)
            if not ok:
                return err(TagError.NO_VICTIM)
            r.update(slot=v, evicted=int(ev is not None), evicted_tag=ev or 0)
        elif op == TagOp.INVALIDATE:
            s = self._where.get(tag)
            if s is not None:
                if self.pins[s]:
                    return err(TagError.PINNED)
                r.update(hit=1, slot=s, planes=self.planes[s])
                self._free(s)
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
        elif op == TagOp.RESET:
            self.reset()
        elif op == TagOp.STATS:
            if slot >= len(STAT_NAMES):
                return err(TagError.BAD_SLOT)
            r.update(slot=slot, value=self.counters[STAT_NAMES[slot]])
        else:
            return err(TagError.BAD_OP)
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
            else:
                if self.pins[s] or self.hot[s]:
                    raise AssertionError(f"free slot {s} has pins/hotness")
            if not 0 <= self.hot[s] <= self.hot_max:
                raise AssertionError(f"slot {s} hotness {self.hot[s]} out of range")
        if seen != self._where:
            raise AssertionError("tag index out of sync")

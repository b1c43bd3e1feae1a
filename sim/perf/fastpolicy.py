"""The tag-unit policy in NumPy: one policy, two implementations.

:class:`FastTagUnit` implements the victim/hotness/decay policy of the golden
tag unit (:class:`elmoe3d.golden.tag_unit.TagUnitModel`, the specification)
with NumPy state arrays, so that :mod:`.rtl_compare` can replay the tile's
recorded routing through a fast cache driver (:class:`~.cache.TagCache`).
It is *not* a second
specification: ``tests/test_fastpolicy.py`` drives both implementations with
the same commands (>= 100,000 random and Zipf-distributed LOOKUP, TOUCH,
DECAY, ALLOCATE, INVALIDATE, PIN and UNPIN commands through the golden's
public ``execute``) and requires identical responses, state and statistics
after every command.

The policy (from the golden model)
----------------------------------
Slots are FREE, PENDING (allocated, fill not committed) or RESIDENT, as
in the golden model (``docs/architecture.md`` §4).

* LOOKUP ``tag`` -> hit (RESIDENT), pending (PENDING), slot, planes; counts
  lookups and hits or pending.
* TOUCH ``tag, amount`` -> saturating ``hot += amount`` of the slot holding
  the tag (RESIDENT or PENDING; no-op when absent).
* DECAY -> ``hot -= hot >> decay_shift`` in every slot.
* ALLOCATE ``tag, planes, hot`` -> victim = the lowest-index free slot, else
  the coldest unpinned RESIDENT slot (ties: lowest index); the victim becomes
  PENDING with the tag and ``pins = 1`` (ALLOCATE pins its victim); counts
  allocations and evictions. :meth:`commit` (HB's commit strobe) makes it
  RESIDENT (counts commits).
* INVALIDATE ``tag`` frees its slot (refused when pinned); PIN/UNPIN count
  users of a slot (a pinned slot is never a victim).

The cache driver has no KV region, so there is no disabled mask here (every
slot is enabled), and its fills commit at once: :meth:`allocate` (no
``pending``) is the golden's pure-cache form, ALLOCATE + commit + UNPIN, and
the batch :meth:`allocate_pinned` is ALLOCATE + commit of each victim (still
pinned once). The batch operations require that no slot is PENDING.

Batch operations (the cache driver's)
-------------------------------------
A layer's verification looks up a whole set of experts at once. The batch
methods are exactly equivalent to the sequence of single operations named in
their docstrings (the test checks this against the golden model too):

* :meth:`lookup_many` = LOOKUP of each tag in order;
* :meth:`touch_many` = TOUCH of each (tag, amount) in order;
* :meth:`pin_many` / :meth:`unpin_many` = PIN / UNPIN of each slot in order;
* :meth:`allocate_pinned` = for each tag in order, ALLOCATE (which pins
  the victim once) then commit of the victim. Because every new slot is pinned at once, the victims of a batch
  are the free slots in index order followed by the unpinned valid slots in
  (hotness, index) order - one sort instead of a search per allocation.

Cost: a single operation is O(1) or one vectorised O(S) pass (victim search,
DECAY); a batch of ``m`` allocations is one O(S log S) sort.

Unlike the golden model (an RTL parameter range of 2..4096 slots), the slot
count may exceed 4096 here, for HB capacities beyond the paper's; the other
parameters are checked by the golden's own :func:`check_params`.
"""

from __future__ import annotations

import math

import numpy as np

from ...golden.tag_unit import (RESPONSE_FIELDS, STAT_NAMES, TagCodec, TagError, TagOp,
                                check_params, slot_bits)
from . import _kernels

__all__ = ["FastTagUnit"]


class FastTagUnit(TagCodec):
    """NumPy implementation of the golden tag-unit policy (same public API
    for the operations the cache driver uses, plus batch operations).

    Parameters
    ----------
    slots, layer_bits, expert_bits, hot_bits, decay_shift, plane_bits, stat_bits, pin_bits
        As :class:`elmoe3d.golden.tag_unit.TagUnitModel` (``slots`` >= 2, may
        exceed 4096).

    Members
    -------
    valid, pending, tags, planes, hot, pins : ndarray (S,)
        Per-slot state (read-only for callers); ``valid`` = holds a tag
        (PENDING or RESIDENT).
    counters : dict
        The golden's :data:`STAT_NAMES` (saturating at ``2**stat_bits - 1``;
        ``aborts`` and ``kv_frees`` stay 0 here).
    """

    def __init__(self, slots: int = 32, layer_bits: int = 6, expert_bits: int = 7,
                 hot_bits: int = 8, decay_shift: int = 2, plane_bits: int = 2,
                 stat_bits: int = 32, pin_bits: int = 3, impl: str | None = None):
        if impl not in (None, "numpy", "numba"):
            raise ValueError(f"FastTagUnit impl must be 'numpy' or 'numba', not {impl!r}")
        self.impl = impl or ("numba" if _kernels.AVAILABLE else "numpy")
        if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)):
            raise TypeError(f"Tag-unit slot count must be an integer, not {slots!r}")
        if slots < 2:
            raise ValueError(f"Tag-unit slot count must be >= 2, not {slots!r}")
        check_params(min(int(slots), 4096), layer_bits, expert_bits, hot_bits, decay_shift,
                     plane_bits, stat_bits, pin_bits)
        self.slots = int(slots)
        self.layer_bits, self.expert_bits = layer_bits, expert_bits
        self.tag_bits = layer_bits + expert_bits
        self.hot_bits, self.hot_max = hot_bits, (1 << hot_bits) - 1
        self.decay_shift = decay_shift
        self.plane_bits = plane_bits
        self.stat_bits, self.stat_max = stat_bits, (1 << stat_bits) - 1
        self.pin_bits, self.pin_max = pin_bits, (1 << pin_bits) - 1
        self.slot_bits = slot_bits(self.slots) if self.slots <= 4096 else \
            max(2, math.ceil(math.log2(self.slots)))
        self.reset()

    # -- tags -----------------------------------------------------------------------
    def _check_tags(self, tags):
        tags = np.asarray(tags, dtype=np.int64).reshape(-1)
        if tags.size and (tags.min() < 0 or tags.max() >= (1 << self.tag_bits)):
            bad = tags[(tags < 0) | (tags >= (1 << self.tag_bits))][0]
            raise ValueError(f"Tag {int(bad)!r} does not fit in {self.tag_bits} bits")
        return tags

    # -- state ----------------------------------------------------------------------
    def reset(self):
        """RESET: every slot free, hotness, pins and statistics 0."""
        S = self.slots
        self.valid = np.zeros(S, bool)
        self.pending = np.zeros(S, bool)
        self.npending = 0
        self.tags = np.zeros(S, np.int64)
        self.planes = np.zeros(S, np.int64)
        self.hot = np.zeros(S, np.int64)
        self.pins = np.zeros(S, np.int64)
        self.where = np.full(1 << self.tag_bits, -1, np.int64)     # tag -> slot, -1 = absent
        self.counters = dict.fromkeys(STAT_NAMES, 0)
        self.nfree = S
        self._idx = np.arange(S, dtype=np.int64)

    def _count(self, name, n=1):
        self.counters[name] = min(self.counters[name] + int(n), self.stat_max)

    def slot_of(self, tag: int) -> int | None:
        s = int(self.where[tag])
        return None if s < 0 else s

    def stats(self) -> dict:
        return dict(self.counters)

    def hit_rate(self) -> float:
        c = self.counters
        return c["hits"] / c["lookups"] if c["lookups"] else 0.0

    def resident_tags(self) -> np.ndarray:
        return self.tags[self.valid & ~self.pending]

    # -- single operations (the golden's semantics) ------------------------------------
    def lookup(self, tag: int) -> tuple[bool, int, int]:
        self._check_tag(tag)
        self._count("lookups")
        s = int(self.where[tag])
        if s < 0:
            return False, 0, 0
        if self.pending[s]:
            self._count("pending")
            return False, 0, 0
        self._count("hits")
        return True, s, int(self.planes[s])

    def touch(self, tag: int, amount: int = 1) -> bool:
        self._check_tag(tag)
        if not 0 <= amount <= self.hot_max:
            raise ValueError(f"Touch amount {amount!r} does not fit in {self.hot_bits} bits")
        s = int(self.where[tag])
        if s < 0:
            return False
        self.hot[s] = min(int(self.hot[s]) + int(amount), self.hot_max)
        return True

    def decay(self):
        self.hot -= self.hot >> self.decay_shift

    def choose_victim(self) -> int | None:
        free = np.flatnonzero(~self.valid)
        if free.size:
            return int(free[0])
        cand = (self.pins == 0) & ~self.pending
        if not cand.any():
            return None
        return int(np.argmin(np.where(cand, self.hot, np.iinfo(np.int64).max)))

    def allocate(self, tag: int, planes: int = 0, hot: int = 0, *, pending: bool = False):
        """The golden's ``allocate``: ``pending=True`` is the hardware ALLOCATE
        (PENDING, pinned once, until :meth:`commit`); the default is ALLOCATE,
        commit and UNPIN in one call (RESIDENT, unpinned, ``commits`` counted)."""
        self._check_tag(tag)
        if not 0 <= planes < (1 << self.plane_bits):
            raise ValueError(f"Plane count {planes!r} does not fit in {self.plane_bits} bits")
        if not 0 <= hot <= self.hot_max:
            raise ValueError(f"Initial hotness {hot!r} does not fit in {self.hot_bits} bits")
        if self.where[tag] >= 0:
            raise ValueError(f"Tag {tag!r} is already resident in slot {int(self.where[tag])}")
        v = self.choose_victim()
        if v is None:
            return False, None, None
        evicted = None
        if self.valid[v]:
            evicted = int(self.tags[v])
            self.where[evicted] = -1
            self._count("evictions")
        else:
            self.nfree -= 1
        self._count("allocations")
        self.valid[v], self.tags[v], self.planes[v], self.hot[v] = True, tag, planes, hot
        self.where[tag] = v
        if pending:
            self.pending[v], self.pins[v] = True, 1
            self.npending += 1
        else:
            self.pins[v] = 0
            self._count("commits")
        return True, v, evicted

    def commit(self, slot: int) -> bool:
        """HB's commit strobe: a PENDING slot becomes RESIDENT (pins
        unchanged); False (nothing changed) for any other slot."""
        if not 0 <= slot < self.slots or not self.pending[slot]:
            return False
        self.pending[slot] = False
        self.npending -= 1
        self._count("commits")
        return True

    def invalidate(self, tag: int) -> bool:
        self._check_tag(tag)
        s = int(self.where[tag])
        if s < 0:
            return False
        if self.pins[s]:
            raise ValueError(f"Slot {s} holding tag {tag!r} is pinned")
        self._free(s)
        return True

    def _free(self, s):
        self.nfree += 1
        self.where[self.tags[s]] = -1
        if self.pending[s]:
            self.pending[s] = False
            self.npending -= 1
        self.valid[s] = False
        self.tags[s] = self.planes[s] = self.hot[s] = self.pins[s] = 0

    def pin(self, slot: int) -> int:
        self._check_slot(slot)
        if not self.valid[slot]:
            raise ValueError(f"Slot {slot} is free and cannot be pinned")
        if self.pins[slot] >= self.pin_max:
            raise ValueError(f"Slot {slot} is already pinned {self.pin_max} times")
        self.pins[slot] += 1
        return int(self.pins[slot])

    def unpin(self, slot: int) -> int:
        self._check_slot(slot)
        if not self.valid[slot]:
            raise ValueError(f"Slot {slot} is free")
        if not self.pins[slot]:
            raise ValueError(f"Slot {slot} is not pinned")
        self.pins[slot] -= 1
        return int(self.pins[slot])

    def execute(self, cmd: dict) -> dict:
        """One command dict ``{op, tag, slot, amount, planes}`` -> response dict
        (the golden's :meth:`~elmoe3d.golden.tag_unit.TagUnitModel.execute`)."""
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

        def held(s):                        # response fields of a slot holding a tag
            p = int(self.pending[s])
            return dict(hit=1 - p, pending=p, slot=s, planes=int(self.planes[s]))

        if op == TagOp.LOOKUP:
            self.lookup(tag)
            s = int(self.where[tag])
            if s >= 0:
                r.update(held(s), value=int(self.hot[s]))
        elif op == TagOp.TOUCH:
            if self.touch(tag, amount):
                s = int(self.where[tag])
                r.update(held(s), value=int(self.hot[s]))
        elif op == TagOp.DECAY:
            self.decay()
        elif op == TagOp.ALLOCATE:
            s = int(self.where[tag])
            if s >= 0:
                return err(TagError.PENDING if self.pending[s] else TagError.RESIDENT)
            ok, v, ev = self.allocate(tag, planes, amount, pending=True)
            if not ok:
                return err(TagError.NO_VICTIM)
            r.update(slot=v, evicted=int(ev is not None), evicted_tag=ev or 0)
        elif op == TagOp.INVALIDATE:
            s = int(self.where[tag])
            if s >= 0:
                if self.pins[s]:
                    return err(TagError.PINNED)
                r.update(held(s), evicted=1, evicted_tag=tag)
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
            r.update(slot=slot, value=int(self.pins[slot]))
        elif op in (TagOp.LOOKUP_PIN, TagOp.INVALIDATE_SLOT, TagOp.INVALIDATE_MASK, TagOp.ABORT):
            raise NotImplementedError(f"FastTagUnit does not implement {TagOp(op).name} "
                                      "(the cache driver does not use it)")
        elif op == TagOp.RESET:
            self.reset()
        elif op == TagOp.STATS:
            if slot >= len(STAT_NAMES):
                return err(TagError.BAD_SLOT)
            r.update(slot=slot, value=self.counters[STAT_NAMES[slot]])
        else:
            return err(TagError.BAD_OP)
        return r

    # -- batch operations ------------------------------------------------------------------
    def _no_pending(self):
        if self.npending:
            raise ValueError(f"{self.npending} slots are PENDING; the batch operations need "
                             "every fill committed")

    def lookup_many(self, tags) -> tuple[np.ndarray, np.ndarray]:
        """LOOKUP of each tag in order: ``(hit[m], slot[m])`` (slot -1 on a miss)."""
        self._no_pending()
        tags = self._check_tags(tags)
        slots = self.where[tags]
        hit = slots >= 0
        self._count("lookups", tags.size)
        self._count("hits", int(hit.sum()))
        return hit, slots

    def touch_many(self, tags, amounts) -> np.ndarray:
        """TOUCH of each (tag, amount) in order; returns the resident mask.
        Saturating adds of non-negative amounts commute, so one scatter-add
        and one clamp give the sequential result."""
        tags = self._check_tags(tags)
        amounts = np.broadcast_to(np.asarray(amounts, dtype=np.int64), tags.shape)
        if amounts.size and (amounts.min() < 0 or amounts.max() > self.hot_max):
            raise ValueError(f"Touch amount outside 0..{self.hot_max}")
        slots = self.where[tags]
        hit = slots >= 0
        add = np.bincount(slots[hit], weights=amounts[hit], minlength=self.slots).astype(np.int64)
        np.minimum(self.hot + add, self.hot_max, out=self.hot)
        return hit

    def pin_many(self, slots):
        """PIN of each slot in order (refused as a whole, nothing changed, if
        any single PIN would be refused)."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if not slots.size:
            return
        if slots.min() < 0 or slots.max() >= self.slots:
            raise ValueError(f"Slot outside 0..{self.slots - 1}")
        if not self.valid[slots].all():
            raise ValueError(f"Slot {int(slots[~self.valid[slots]][0])} is free and cannot be pinned")
        add = np.bincount(slots, minlength=self.slots)
        if (self.pins + add).max() > self.pin_max:
            raise ValueError(f"Pin limit {self.pin_max} exceeded")
        self.pins += add

    def unpin_many(self, slots):
        """UNPIN of each slot in order (refused as a whole if any UNPIN would be)."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if not slots.size:
            return
        if slots.min() < 0 or slots.max() >= self.slots:
            raise ValueError(f"Slot outside 0..{self.slots - 1}")
        sub = np.bincount(slots, minlength=self.slots)
        if ((self.pins - sub) < 0).any() or not self.valid[slots].all():
            raise ValueError("UNPIN of a free or unpinned slot")
        self.pins -= sub

    def allocate_pinned(self, tags, planes, hots) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each tag in order: ALLOCATE (``planes``, initial hotness
        ``hots``; the victim pinned once) then commit of its victim. Returns ``(ok[m], slot[m],
        evicted_tag[m])`` (slot and evicted tag -1 where nothing). Once every
        slot is pinned the remaining allocations fail, as NO_VICTIM would."""
        self._no_pending()
        tags = self._check_tags(tags)
        m = tags.size
        planes = np.broadcast_to(np.asarray(planes, dtype=np.int64), (m,))
        hots = np.broadcast_to(np.asarray(hots, dtype=np.int64), (m,))
        if m and (hots.min() < 0 or hots.max() > self.hot_max):
            raise ValueError(f"Initial hotness outside 0..{self.hot_max}")
        if m and (planes.min() < 0 or planes.max() >= (1 << self.plane_bits)):
            raise ValueError(f"Plane count outside 0..{(1 << self.plane_bits) - 1}")
        if m and (self.where[tags] >= 0).any():
            t = int(tags[self.where[tags] >= 0][0])
            raise ValueError(f"Tag {t!r} is already resident in slot {int(self.where[t])}")
        if m != np.unique(tags).size:
            raise ValueError("allocate_pinned needs distinct tags")
        ok = np.zeros(m, bool)
        slot = np.full(m, -1, np.int64)
        evicted = np.full(m, -1, np.int64)
        if not m:
            return ok, slot, evicted
        free = np.flatnonzero(~self.valid)
        cand = np.flatnonzero(self.valid & (self.pins == 0))
        if len(free) < m and cand.size:
            cand = cand[np.lexsort((cand, self.hot[cand]))]       # coldest first, ties lowest index
            victims = np.concatenate([free, cand[:m - len(free)]])
        else:
            victims = free[:m]
        n = victims.size
        ok[:n] = True
        slot[:n] = victims
        was = self.valid[victims]
        ev = self.tags[victims][was]
        evicted[:n][was] = ev
        self.where[ev] = -1
        self._count("evictions", int(was.sum()))
        self._count("allocations", n)
        self._count("commits", n)
        self.nfree -= n - int(was.sum())
        new = tags[:n]
        self.valid[victims] = True
        self.tags[victims] = new
        self.planes[victims] = planes[:n]
        self.hot[victims] = hots[:n]
        self.pins[victims] = 1
        self.where[new] = victims
        return ok, slot, evicted

    def layer_access(self, tags, planes: int, hots, touch=None, fill: bool = True):
        """The cache driver's per-layer step in one call (see
        :meth:`_layer_access_numpy`); runs the compiled kernel
        (:func:`~elmoe3d.sim.perf._kernels.tag_layer_access`) unless this unit
        was made with ``impl="numpy"`` or numba is absent. Same results either way."""
        self._no_pending()
        if self.impl == "numpy":
            return self._layer_access_numpy(tags, planes, hots, touch, fill)
        n = tags.size
        hit = np.empty(n, bool)
        filled = np.empty(n, bool)
        pinned = np.empty(n, np.int64)
        c = self.counters
        cnt = np.array([c["lookups"], c["hits"], c["allocations"], c["evictions"], self.nfree,
                        c["commits"]], np.int64)
        npin, nev = _kernels.tag_layer_access(
            self.valid, self.tags, self.planes, self.hot, self.pins, self.where, cnt, tags,
            int(planes), hots, touch if touch is not None else hots, touch is not None, bool(fill),
            self.hot_max, self.stat_max, hit, filled, pinned)
        c["lookups"], c["hits"], c["allocations"], c["evictions"] = (int(x) for x in cnt[:4])
        self.nfree, c["commits"] = int(cnt[4]), int(cnt[5])
        return hit, filled, pinned[:npin], int(nev)

    def _layer_access_numpy(self, tags, planes: int, hots, touch=None, fill: bool = True):
        """The cache driver's per-layer step in one call, equal to: LOOKUP of
        each tag, PIN of each hit, TOUCH of each hit by ``touch``, then (when
        ``fill``) ALLOCATE (pins once) + commit of each miss in order with initial hotness
        ``hots`` (:meth:`allocate_pinned`). ``tags`` distinct; ``hots`` and
        ``touch`` int64 arrays already within the counter range (the driver
        guarantees what the single operations check). Returns ``(hit[m],
        filled[m], victims, evicted_count)``."""
        S = self.slots
        slots = self.where[tags]
        hit = slots >= 0
        hs = slots[hit]
        n, nh = tags.size, hs.size
        c = self.counters
        c["lookups"] = min(c["lookups"] + n, self.stat_max)
        c["hits"] = min(c["hits"] + nh, self.stat_max)
        if nh:
            self.pins[hs] += 1
            if touch is not None:
                self.hot[hs] = np.minimum(self.hot[hs] + touch[hit], self.hot_max)
        filled = np.zeros(n, bool)
        if not fill or nh == n:
            return hit, filled, hs, 0
        miss = np.flatnonzero(~hit)
        m = miss.size
        if self.nfree >= m:
            victims = np.flatnonzero(~self.valid)[:m]
        else:
            free = np.flatnonzero(~self.valid) if self.nfree else self._idx[:0]
            cand = np.flatnonzero(self.valid & (self.pins == 0))
            k = min(m - free.size, cand.size)
            if k:
                key = self.hot[cand] * S + cand          # coldest first, ties lowest index
                if k < cand.size:
                    part = np.argpartition(key, k - 1)[:k]
                    part = part[np.argsort(key[part], kind="stable")]
                else:
                    part = np.argsort(key, kind="stable")
                victims = np.concatenate([free, cand[part]])
            else:
                victims = free
        nv = victims.size
        was = self.valid[victims]
        nev = int(np.count_nonzero(was))
        if nev:
            self.where[self.tags[victims[was]]] = -1
        c["evictions"] = min(c["evictions"] + nev, self.stat_max)
        c["allocations"] = min(c["allocations"] + nv, self.stat_max)
        c["commits"] = min(c["commits"] + nv, self.stat_max)
        self.nfree -= nv - nev
        got = miss[:nv]
        new = tags[got]
        self.valid[victims] = True
        self.tags[victims] = new
        self.planes[victims] = planes
        self.hot[victims] = hots[got]
        self.pins[victims] = 1
        self.where[new] = victims
        filled[got] = True
        return hit, filled, np.concatenate([hs, victims]), nev

    # -- invariants (tests) ---------------------------------------------------------------
    def check_invariants(self):
        t = self.tags[self.valid]
        if len(np.unique(t)) != len(t):
            raise AssertionError("a tag is resident in two slots")
        if (self.pins[~self.valid] != 0).any() or (self.hot[~self.valid] != 0).any():
            raise AssertionError("a free slot has pins/hotness")
        w = np.flatnonzero(self.where >= 0)
        if len(w) != len(t) or not np.array_equal(np.sort(self.where[w]), np.flatnonzero(self.valid)):
            raise AssertionError("tag index out of sync")
        if self.nfree != int((~self.valid).sum()):
            raise AssertionError("free-slot count out of sync")
        if (self.pending & ~self.valid).any() or self.npending != int(self.pending.sum()):
            raise AssertionError("pending state out of sync")

"""Expert caches replayed by the performance model.

* :class:`LRUCache` - plain LRU with per-entry sizes (HB-xPU and the SD
  baselines; not the tag unit's policy, which is why it is separate).
* :class:`TagCache` - ELMoE-3D's HB expert cache: a thin driver around the
  golden tag-unit policy :class:`elmoe3d.golden.tag_unit.TagUnitModel`
  (shared code, never a copy): lookup / touch / allocate / pin / unpin /
  decay go straight to the golden model.
* :func:`belady_hits` - the offline optimum (Belady/OPT, demand fill) for the
  same access sequence and capacity, as an upper bound.
* :class:`CacheStats` - hits, lookups, per-layer misses, working set.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

import numpy as np

from elmoe3d.golden.tag_unit import TagUnitModel

__all__ = ["LRUCache", "TagCache", "belady_hits", "CacheStats"]


class CacheStats:
    """Lookup statistics of one run (sampled layers only)."""

    def __init__(self, layers: int):
        self.lookups = np.zeros(layers, np.int64)
        self.misses = np.zeros(layers, np.int64)
        self.sequence: list = []          # (key) in lookup order, for Belady
        self.union_sizes: list = []       # distinct experts per (step, layer)

        self.counted: list = []           # whether each lookup is past the warm-up

    def record(self, layer: int, key, hit: bool, count: bool = True):
        """One lookup; ``count`` False (warm-up) keeps it only for Belady's sequence."""
        self.sequence.append(key)
        self.counted.append(count)
        if count:
            self.lookups[layer] += 1
            self.misses[layer] += not hit

    def belady_hit_rate(self, capacity: int) -> float:
        """Belady hit rate over the counted lookups, replaying the warm-up too."""
        n = sum(self.counted)
        return belady_hits(self.sequence, capacity, self.counted) / n if n else 0.0

    @property
    def hit_rate(self) -> float:
        n = int(self.lookups.sum())
        return 1.0 - self.misses.sum() / n if n else 0.0

    def per_layer_miss(self) -> list:
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(self.lookups > 0, self.misses / np.maximum(self.lookups, 1), np.nan)
        return [None if math.isnan(v) else round(float(v), 4) for v in r]


class LRUCache:
    """LRU over keys with integer sizes; ``capacity`` in the same units."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.used = 0
        self.d: OrderedDict = OrderedDict()

    def access(self, key, size: int = 1) -> bool:
        """Hit -> True (moved to MRU). Miss -> fill (evicting LRU) -> False."""
        if key in self.d:
            self.d.move_to_end(key)
            return True
        if size > self.capacity:
            return False
        while self.used + size > self.capacity:
            _, s = self.d.popitem(last=False)
            self.used -= s
        self.d[key] = size
        self.used += size
        return False


class TagCache:
    """ELMoE-3D expert cache = the golden tag unit, addressed by (layer, expert).

    Parameters
    ----------
    slots : int
        Expert slots (2..4096).
    layers, experts : int
        Sampled layer count and experts per layer (set the tag widths).
    hot_bits, decay_shift : int
        Tag-unit hotness counter width and decay shift.
    """

    def __init__(self, slots: int, layers: int, experts: int, hot_bits: int = 8, decay_shift: int = 2):
        lb = max(1, math.ceil(math.log2(max(layers, 2))))
        eb = max(1, math.ceil(math.log2(max(experts, 2))))
        self.tu = TagUnitModel(slots=slots, layer_bits=lb, expert_bits=eb, hot_bits=hot_bits,
                               decay_shift=decay_shift, plane_bits=2)
        self.slots = slots
        self.layers, self.experts = layers, experts
        self._pinned: list = []

    def tag(self, layer: int, expert: int) -> int:
        return self.tu.make_tag(layer, expert)

    def resident(self, tag: int) -> bool:
        return self.tu.slot_of(tag) is not None

    def resident_mask(self, layer: int) -> np.ndarray:
        m = np.zeros(self.experts, bool)
        for t in self.tu._where:           # read-only view of the valid tags
            l, e = self.tu.split_tag(t)
            if l == layer:
                m[e] = True
        return m

    def touch(self, tag: int, amount: int = 1) -> bool:
        return self.tu.touch(tag, min(int(amount), self.tu.hot_max))

    def access(self, tag: int, planes: int, hot: int = 1, fill: bool = True) -> tuple[bool, bool]:
        """Verify/AR access: LOOKUP, then on a miss ALLOCATE (the fill) when
        ``fill``; the slot is pinned until :meth:`release`. Returns
        ``(hit, filled)``."""
        hit, slot, _ = self.tu.lookup(tag)
        if hit:
            self.tu.pin(slot)
            self._pinned.append(slot)
            return True, False
        if not fill:
            return False, False
        ok, slot, _ = self.tu.allocate(tag, planes, min(int(hot), self.tu.hot_max))
        if ok:
            self.tu.pin(slot)
            self._pinned.append(slot)
        return False, bool(ok)

    def release(self):
        """UNPIN every slot pinned since the last release (end of a layer)."""
        for s in self._pinned:
            self.tu.unpin(s)
        self._pinned.clear()

    def decay(self):
        self.tu.decay()

    def preload(self, tags, planes: int):
        """Fill with ``tags`` (in order) until full (initial resident set)."""
        for t in tags:
            if self.tu.slot_of(t) is None:
                if self.tu.choose_victim() is None or all(self.tu.valid):
                    break
                self.tu.allocate(t, planes, 1)


def belady_hits(sequence, capacity: int, counted=None) -> int:
    """Hits of the optimal offline policy (evict the key reused farthest in the
    future; every miss fills) on ``sequence`` with ``capacity`` entries; with
    ``counted`` (a bool per access) only those accesses' hits are counted."""
    n = len(sequence)
    if capacity <= 0 or n == 0:
        return 0
    nxt = [n] * n
    last = {}
    for i in range(n - 1, -1, -1):
        k = sequence[i]
        nxt[i] = last.get(k, n + i)          # never reused: distinct "infinity"
        last[k] = i
    cache = {}                                # key -> its next use
    heap = []                                 # (-next_use, key)
    hits = 0
    for i, k in enumerate(sequence):
        if k in cache:
            hits += 1 if counted is None or counted[i] else 0
        elif len(cache) >= capacity:
            while True:
                nu, victim = heapq.heappop(heap)
                if cache.get(victim) == -nu:
                    del cache[victim]
                    break
        cache[k] = nxt[i]
        heapq.heappush(heap, (-nxt[i], k))
    return hits

"""Expert caches replayed by the performance model.

* :class:`TagCache` - ELMoE-3D's HB expert cache: the golden tag-unit policy
  addressed by ``(layer, expert)``, with the driver the system model uses.
  ``engine="fast"`` (default) runs the policy's NumPy implementation
  :class:`~elmoe3d.sim.perf.fastpolicy.FastTagUnit` (tested op for op
  against the golden); ``engine="golden"`` runs
  :class:`elmoe3d.golden.tag_unit.TagUnitModel` itself, one operation at a
  time, through the same driver (used by the tests to tie the two).
* :class:`BatchCache` - whole-entry caches of the baselines: ``lru``,
  ``lfu``, ``static`` (a fixed, profiled hot set) and ``belady`` (offline
  farthest-next-use, the reference bound), all vectorised per layer step.
* :class:`LRUCache` and :func:`belady_hits` - the textbook single-access
  forms (reference for the tests).

Driver semantics (one layer of one step or verification)
--------------------------------------------------------
All experts the layer needs are looked up first; hits are pinned (they are
being read); misses are then allocated in expert-id order, each victim pinned
as it is filled; every pin is released when the layer ends. So a layer never
evicts an expert it is using, for every policy alike: :class:`BatchCache`
never evicts an entry of the current access set either.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

import numpy as np

from elmoe3d.golden.tag_unit import TagUnitModel

from . import _kernels
from .fastpolicy import FastTagUnit

__all__ = ["TagCache", "BatchCache", "LRUCache", "belady_hits", "next_use", "next_use_flat",
           "POLICIES_WHOLE"]

#: whole-entry policies of :class:`BatchCache`
POLICIES_WHOLE = ("lru", "lfu", "static", "belady")


def _bits(n: int) -> int:
    return max(1, math.ceil(math.log2(max(int(n), 2))))


class TagCache:
    """ELMoE-3D expert cache = the tag-unit policy, addressed by (layer, expert).

    Parameters
    ----------
    slots : int
        Expert slots (>= 2; the golden engine accepts at most 4096).
    layers, experts : int
        MoE layers and routed experts per layer (set the tag widths).
    hot_bits, decay_shift : int
        Hotness counter width and decay shift of the tag unit.
    engine : ``"fast"`` (NumPy policy, compiled kernel when numba is there),
        ``"numpy"`` / ``"numba"`` (force one path) or ``"golden"``
    """

    def __init__(self, slots: int, layers: int, experts: int, hot_bits: int = 8,
                 decay_shift: int = 2, engine: str = "fast"):
        if engine not in ("fast", "numpy", "numba", "golden"):
            raise ValueError(f"Tag-cache engine must be 'fast', 'numpy', 'numba' or 'golden', "
                             f"not {engine!r}")
        lb, eb = _bits(layers), _bits(experts)
        if engine == "golden":
            self.tu = TagUnitModel(slots=int(slots), layer_bits=lb, expert_bits=eb, hot_bits=hot_bits,
                                   decay_shift=decay_shift, plane_bits=4)
        else:
            self.tu = FastTagUnit(slots=int(slots), layer_bits=lb, expert_bits=eb, hot_bits=hot_bits,
                                  decay_shift=decay_shift, plane_bits=4,
                                  impl=None if engine == "fast" else engine)
            engine = "fast"
        self.engine = engine
        self.slots = int(slots)
        self.layers, self.experts = int(layers), int(experts)
        self.hot_max = self.tu.hot_max
        self.grid = (np.arange(layers, dtype=np.int64)[:, None] << eb) | np.arange(experts)[None, :]
        self._pinned: list = []
        self.evictions = 0

    # -- queries ---------------------------------------------------------------
    def resident_mask(self) -> np.ndarray:
        """``(layers, experts)`` bool: which experts are resident now."""
        if self.engine == "fast":
            return self.tu.where[self.grid] >= 0
        m = np.zeros((self.layers, self.experts), bool)
        for l in range(self.layers):
            for e in range(self.experts):
                m[l, e] = self.tu.slot_of(int(self.grid[l, e])) is not None
        return m

    def stats(self) -> dict:
        return self.tu.stats()

    # -- driver ------------------------------------------------------------------
    def access_layer(self, layer: int, ids, planes: int, hots, fill: bool = True, touch=None):
        """One layer: LOOKUP every expert of ``ids`` (sorted, distinct), PIN the
        hits, TOUCH the hits by ``touch`` (when given), then ALLOCATE the misses
        (initial hotness ``hots``, clipped to the counter) and PIN each victim
        when ``fill``. Returns ``(hit[m], filled[m])``; pins last until
        :meth:`release`."""
        ids = np.asarray(ids, dtype=np.int64)
        tags = self.grid[layer, ids]
        hots = np.minimum(np.broadcast_to(np.asarray(hots, np.int64), ids.shape), self.hot_max)
        tch = None if touch is None else \
            np.minimum(np.broadcast_to(np.asarray(touch, np.int64), ids.shape), self.hot_max)
        if self.engine == "fast":
            hit, filled, pinned, nev = self.tu.layer_access(tags, planes, hots, tch, fill)
            self._pinned.append(pinned)
            self.evictions += nev
            return hit, filled
        filled = np.zeros(ids.shape, bool)
        tu = self.tu
        hit = np.zeros(ids.shape, bool)
        for i, t in enumerate(tags.tolist()):
            h, s, _ = tu.lookup(t)
            hit[i] = h
            if h:
                tu.pin(s)
                self._pinned.append(s)
        if tch is not None:
            for i in np.flatnonzero(hit).tolist():
                tu.touch(int(tags[i]), int(tch[i]))
        if fill:
            for i in np.flatnonzero(~hit).tolist():
                ok, v, ev = tu.allocate(int(tags[i]), planes, int(hots[i]))
                if ok:
                    tu.pin(v)
                    self._pinned.append(v)
                    filled[i] = True
                    self.evictions += ev is not None
        return hit, filled

    def allocate_layer(self, layer: int, ids, planes: int, hots) -> np.ndarray:
        """ALLOCATE (then PIN) experts ``ids`` of ``layer`` that are not
        resident, in order; returns which succeeded. Pins last until
        :meth:`release`."""
        ids = np.asarray(ids, dtype=np.int64)
        tags = self.grid[layer, ids]
        hots = np.minimum(np.broadcast_to(np.asarray(hots, np.int64), ids.shape), self.hot_max)
        if self.engine == "fast":
            ok, vs, ev = self.tu.allocate_pinned(tags, planes, hots)
            self._pinned.append(vs[ok])
            self.evictions += int((ev >= 0).sum())
            return ok
        ok = np.zeros(ids.shape, bool)
        for i, (t, h) in enumerate(zip(tags.tolist(), hots.tolist())):
            good, v, ev = self.tu.allocate(int(t), planes, int(h))
            if good:
                self.tu.pin(v)
                self._pinned.append(v)
                ok[i] = True
                self.evictions += ev is not None
        return ok

    def replay(self, offsets, layers, ids_flat, hots_flat, touch_flat=None, fill: bool = True,
               planes: int = 1, decay_after=None):
        """A sequence of layer accesses: set ``j`` is layer ``layers[j]`` with
        experts ``ids_flat[offsets[j]:offsets[j+1]]``; each is
        :meth:`access_layer` then :meth:`release`, and :meth:`decay` where
        ``decay_after[j]``. Returns per set ``(hits, fills, evictions)``."""
        offsets = np.asarray(offsets, np.int64)
        layers = np.asarray(layers, np.int64)
        ids_flat = np.asarray(ids_flat, np.int64)
        nsets = offsets.size - 1
        lay = np.repeat(layers, np.diff(offsets))
        hots = np.minimum(np.asarray(hots_flat, np.int64), self.hot_max)
        tch = None if touch_flat is None else np.minimum(np.asarray(touch_flat, np.int64), self.hot_max)
        if self.engine == "fast":
            h, f, e = self.tu.replay(offsets, self.grid[lay, ids_flat], hots, tch, fill, planes,
                                     decay_after)
            self.evictions += int(e.sum())
            return h, f, e
        hits, fills, ev = (np.zeros(nsets, np.int64) for _ in range(3))
        decay_after = np.zeros(nsets, bool) if decay_after is None else np.asarray(decay_after, bool)
        for j in range(nsets):
            a, b = offsets[j], offsets[j + 1]
            e0 = self.evictions
            h, f = self.access_layer(int(layers[j]), ids_flat[a:b], planes, hots[a:b], fill,
                                     None if tch is None else tch[a:b])
            self.release()
            hits[j], fills[j], ev[j] = int(h.sum()), int(f.sum()), self.evictions - e0
            if decay_after[j]:
                self.decay()
        return hits, fills, ev

    def touch_flat(self, keys, amounts):
        """TOUCH experts given as flat ``layer * experts + expert`` keys (any
        layers at once: saturating adds of non-negative amounts commute, so
        the order does not matter)."""
        keys = np.asarray(keys, dtype=np.int64)
        tags = self.grid.reshape(-1)[keys]
        am = np.minimum(np.asarray(amounts, np.int64), self.hot_max)
        if self.engine == "fast":
            return self.tu.touch_many(tags, am)
        return np.array([self.tu.touch(int(t), int(a)) for t, a in zip(tags, am)], bool)

    def touch_layer(self, layer: int, ids, amounts):
        """TOUCH resident experts ``ids`` of ``layer`` by ``amounts`` (clipped);
        non-resident ones are no-ops (the tag unit's TOUCH)."""
        ids = np.asarray(ids, dtype=np.int64)
        tags = self.grid[layer, ids]
        am = np.minimum(np.broadcast_to(np.asarray(amounts, np.int64), ids.shape), self.hot_max)
        if self.engine == "fast":
            return self.tu.touch_many(tags, am)
        return np.array([self.tu.touch(int(t), int(a)) for t, a in zip(tags, am)], bool)

    def release(self):
        """UNPIN every slot pinned since the last release (end of a layer)."""
        if self.engine == "fast":
            if self._pinned:
                sl = self._pinned[0] if len(self._pinned) == 1 else np.concatenate(self._pinned)
                np.subtract.at(self.tu.pins, sl, 1)
        else:
            for s in self._pinned:
                self.tu.unpin(s)
        self._pinned.clear()

    def decay(self):
        self.tu.decay()

    def invalidate(self, layer: int, ids):
        """INVALIDATE (unpinned) experts ``ids`` of ``layer``."""
        for t in self.grid[layer, np.asarray(ids, dtype=np.int64)].tolist():
            self.tu.invalidate(int(t))

    def preload(self, keys, planes: int, hot: int = 1) -> int:
        """ALLOCATE ``keys`` (flat ``layer * experts + expert`` ids, in order)
        into the free slots until none is left (initial resident set; nothing
        is evicted). Returns how many were loaded."""
        keys = np.asarray(keys, dtype=np.int64)
        tags = self.grid.reshape(-1)[keys]
        if self.engine == "fast":
            n = min(int((~self.tu.valid).sum()), len(tags))
            ok, vs, _ = self.tu.allocate_pinned(tags[:n], planes, min(hot, self.hot_max))
            self.tu.unpin_many(vs[ok])
            return n
        n = 0
        for t in tags.tolist():
            if all(self.tu.valid):
                break
            self.tu.allocate(int(t), planes, min(hot, self.hot_max))
            n += 1
        return n


class BatchCache:
    """Whole-entry cache over ``n_keys`` keys with per-key sizes, replayed one
    access *set* at a time (one layer of one step).

    Policies: ``lru`` (evict the least recently used), ``lfu`` (evict the
    least frequently used; frequencies count every access so far, weighted
    by tokens), ``static`` (a fixed preloaded set, never filled) and
    ``belady`` (evict the entry used farthest in the future; needs the next
    use of every access). Entries of the current set are never evicted; ties
    go to the lower key. When the misses of one set do not all fit, the ones
    filled are the first in priority order (lru: key order; lfu: most
    frequent first; belady: soonest next use first).
    """

    def __init__(self, n_keys: int, capacity: float, policy: str = "lru", sizes=1,
                 static_keys=None, impl: str | None = None):
        if policy not in POLICIES_WHOLE:
            raise ValueError(f"Cache policy must be one of {', '.join(POLICIES_WHOLE)}, not {policy!r}")
        self.n, self.capacity, self.policy = int(n_keys), float(capacity), policy
        self.size = np.broadcast_to(np.asarray(sizes, dtype=np.float64), (self.n,)).copy()
        if impl not in (None, "numpy", "numba"):
            raise ValueError(f"BatchCache impl must be 'numpy' or 'numba', not {impl!r}")
        self.impl = impl or ("numba" if _kernels.AVAILABLE else "numpy")
        self._code = POLICIES_WHOLE.index(policy)
        self.res = np.zeros(self.n, bool)
        self.prio = np.zeros(self.n, np.float64)     # eviction order: lowest first
        self._ar = np.arange(self.n, dtype=np.float64)
        self.uniform = bool(self.size.min() == self.size.max()) if self.n else True
        self.size0 = float(self.size[0]) if self.n else 1.0
        self.used = 0.0
        self.t = 0
        self.hits = self.lookups = 0
        if policy == "static" and static_keys is not None:
            for k in np.asarray(static_keys, dtype=np.int64).tolist():
                if self.used + self.size[k] <= self.capacity + 1e-9:
                    self.res[k] = True
                    self.used += self.size[k]
        # the compiled path also keeps a list of the resident keys (victim search among them)
        ks = np.flatnonzero(self.res)
        self._rl = np.zeros(max(self.n, 1), np.int64)
        self._rl[:ks.size] = ks
        self._pos = np.full(max(self.n, 1), -1, np.int64)
        self._pos[ks] = np.arange(ks.size)
        self._meta = np.array([ks.size], np.int64)

    def access(self, keys, weights=None, next_use=None, fill: bool = True):
        """Access the distinct ``keys`` of one set. ``weights`` (tokens per key)
        feed LFU; ``next_use`` (the time of each key's next access, larger =
        later) feeds Belady. Returns ``(hit[m], filled[m])``."""
        keys = np.asarray(keys, dtype=np.int64)
        self.t += 1
        if self.impl == "numba":
            n = keys.size
            hit, filled = np.empty(n, bool), np.empty(n, bool)
            wts = np.ones(n) if weights is None else np.asarray(weights, np.float64)
            nu = np.zeros(n) if next_use is None else np.asarray(next_use, np.float64)
            self.used, nh = _kernels.batch_access(
                self.res, self.prio, self.size, self._rl, self._pos, self._meta, keys, wts, nu,
                self._code, float(self.t),
                self.capacity, float(self.used), self.uniform, bool(fill), hit, filled)
            self.lookups += n
            self.hits += int(nh)
            return hit, filled
        hit = self.res[keys]
        nh = int(np.count_nonzero(hit))
        self.lookups += keys.size
        self.hits += nh
        filled = np.zeros(keys.shape, bool)
        pol = self.policy
        if pol == "lru":
            self.prio[keys] = self.t
        elif pol == "lfu":
            self.prio[keys] += 1 if weights is None else np.asarray(weights, np.float64)
        elif pol == "belady":
            self.prio[keys] = -np.asarray(next_use, np.float64)
        if pol == "static" or not fill or nh == keys.size:
            return hit, filled
        miss = np.flatnonzero(~hit)
        mk = keys[miss]
        N = self.n
        if pol in ("lfu", "belady"):          # fill the most frequent / soonest needed first
            order = np.argsort(-self.prio[mk] * N + mk, kind="stable")
            mk, miss = mk[order], miss[order]
        sz = self.size[mk]
        need = float(sz.sum()) - (self.capacity - self.used)
        if need > 1e-9:
            self.res[keys[hit]] = False          # never evict what this set uses (restored below)
            cand = np.flatnonzero(self.res)
            self.res[keys[hit]] = True
            if cand.size:
                key = self.prio[cand] * N + cand
                if self.uniform:
                    k = min(cand.size, int(np.ceil(need / self.size0 - 1e-9)))
                    ev = cand[np.argpartition(key, k - 1)[:k]] if k < cand.size else cand
                else:
                    ordr = cand[np.argsort(key, kind="stable")]
                    cum = np.cumsum(self.size[ordr])
                    k = int(np.searchsorted(cum, need - 1e-9)) + 1
                    ev = ordr[:k]
                self.res[ev] = False
                self.used -= float(self.size[ev].sum())
        room = self.capacity - self.used
        fit = np.cumsum(sz) <= room + 1e-9
        self.res[mk[fit]] = True
        self.used += float(sz[fit].sum())
        filled[miss[fit]] = True
        return hit, filled

    def replay(self, offsets, keys_flat, weights_flat=None, nu_flat=None, fill: bool = True,
               flags: bool = False):
        """A sequence of :meth:`access` calls (set ``j`` = ``keys_flat[offsets[j]:
        offsets[j+1]]``). Returns per set ``(hits, fills)``, and with ``flags``
        also the per-key ``(hit, filled)`` flags."""
        offsets = np.asarray(offsets, np.int64)
        nsets = offsets.size - 1
        hits, fills = np.zeros(nsets, np.int64), np.zeros(nsets, np.int64)
        keys_flat = np.asarray(keys_flat, np.int64)
        hf, ff = np.zeros(keys_flat.size, bool), np.zeros(keys_flat.size, bool)
        if self.impl == "numpy":
            for j in range(nsets):
                a, b = offsets[j], offsets[j + 1]
                h, f = self.access(keys_flat[a:b],
                                   None if weights_flat is None else weights_flat[a:b],
                                   None if nu_flat is None else nu_flat[a:b], fill)
                hits[j], fills[j] = int(h.sum()), int(f.sum())
                hf[a:b], ff[a:b] = h, f
        else:
            w = np.ones(keys_flat.size) if weights_flat is None else np.asarray(weights_flat, np.float64)
            nu = np.zeros(keys_flat.size) if nu_flat is None else np.asarray(nu_flat, np.float64)
            self.used, t = _kernels.batch_replay(self.res, self.prio, self.size, self._rl, self._pos,
                                                 self._meta, offsets, keys_flat, w,
                                                 nu, self._code, float(self.t), self.capacity,
                                                 float(self.used), self.uniform, bool(fill), hf, ff,
                                                 hits, fills)
            self.t = int(t)
            self.lookups += keys_flat.size
            self.hits += int(hits.sum())
        return (hits, fills, hf, ff) if flags else (hits, fills)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def next_use_flat(offsets, keys_flat) -> np.ndarray:
    """:func:`next_use` for sets given as ``offsets`` / ``keys_flat``: the set
    index of each key's next access (``nsets + key`` when never)."""
    offsets = np.asarray(offsets, np.int64)
    keys = np.asarray(keys_flat, np.int64)
    T = offsets.size - 1
    t = np.repeat(np.arange(T, dtype=np.int64), np.diff(offsets))
    order = np.lexsort((t, keys))
    ks, ts = keys[order], t[order]
    nxt_sorted = (T + ks).astype(np.float64)
    same = ks[1:] == ks[:-1]
    nxt_sorted[:-1][same] = ts[1:][same]
    nxt = np.empty_like(nxt_sorted)
    nxt[order] = nxt_sorted
    return nxt


def next_use(sets) -> list:
    """For a sequence of access sets (arrays of distinct keys), the time (set
    index) of each key's next access; a key never used again gets
    ``len(sets) + key`` (a distinct "never"). For :class:`BatchCache` ``belady``."""
    T = len(sets)
    if not T:
        return []
    lens = np.array([len(s) for s in sets], np.int64)
    keys = np.concatenate([np.asarray(s, dtype=np.int64) for s in sets]) if lens.sum() else \
        np.zeros(0, np.int64)
    t = np.repeat(np.arange(T, dtype=np.int64), lens)
    order = np.lexsort((t, keys))
    ks, ts = keys[order], t[order]
    nxt_sorted = (T + ks).astype(np.float64)
    same = ks[1:] == ks[:-1]
    nxt_sorted[:-1][same] = ts[1:][same]
    nxt = np.empty_like(nxt_sorted)
    nxt[order] = nxt_sorted
    return np.split(nxt, np.cumsum(lens)[:-1])


class LRUCache:
    """LRU over keys with integer sizes; ``capacity`` in the same units
    (textbook single-access form)."""

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

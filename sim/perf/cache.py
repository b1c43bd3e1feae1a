"""Expert caches for :mod:`.rtl_compare`'s replay of the tile's routing.

* :class:`TagCache` - ELMoE-3D's HB expert cache: the golden tag-unit policy
  addressed by ``(layer, expert)``, with a per-layer driver.
  ``engine="fast"`` (default) runs the policy's NumPy implementation
  :class:`~elmoe3d.sim.perf.fastpolicy.FastTagUnit` (tested op for op
  against the golden); ``engine="golden"`` runs
  :class:`elmoe3d.golden.tag_unit.TagUnitModel` itself, one operation at a
  time, through the same driver (used by the tests to tie the two).
* :class:`LRUCache` - the textbook single-access LRU (the locality
  statistics of :func:`elmoe3d.sim.perf.traces.lru_hit_rate`).

Driver semantics (one layer of one step or verification)
--------------------------------------------------------
All experts the layer needs are looked up first; hits are pinned (they are
being read); misses are then allocated in expert-id order, each victim pinned
as it is filled; every pin is released when the layer ends. So a layer never
evicts an expert it is using.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from elmoe3d.geometry import bits
from elmoe3d.golden.tag_unit import TagUnitModel

from .fastpolicy import FastTagUnit

__all__ = ["TagCache", "LRUCache"]


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
        lb, eb = bits(layers), bits(experts)
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



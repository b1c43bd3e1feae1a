"""Compiled inner loop of the tag-unit cache driver (numba).

The NumPy implementation in :mod:`.fastpolicy` states the per-layer
semantics; this kernel does exactly the same, element by element, so that
one layer step costs microseconds instead of a few dozen NumPy calls. Both
paths are tested against the golden tag unit (``tests/test_fastpolicy.py``);
``ELMOE_PERF_NUMBA=0`` (or numba absent) selects the NumPy path.
"""

from __future__ import annotations

import os

import numpy as np

try:
    if os.environ.get("ELMOE_PERF_NUMBA", "1") == "0":
        raise ImportError("disabled by ELMOE_PERF_NUMBA=0")
    from numba import njit
    AVAILABLE = True
except ImportError:              # pragma: no cover - exercised with ELMOE_PERF_NUMBA=0
    AVAILABLE = False

    def njit(*a, **k):
        def deco(f):
            return f
        return deco(a[0]) if a and callable(a[0]) else deco

__all__ = ["smallest_k", "AVAILABLE", "tag_layer_access"]


@njit(cache=True)
def smallest_k(key, k):
    """Indices of the ``k`` smallest (distinct) keys, ascending: a bounded
    max-heap pass, O(n log k), for the few victims of one layer step."""
    n = key.size
    if k <= 0:
        return np.empty(0, np.int64)
    if k >= n:
        return np.argsort(key)
    if k * 8 >= n:                   # many victims: select by partition, then sort the k
        thr = np.partition(key, k - 1)[k - 1]
        idx = np.empty(k, np.int64)
        j = 0
        for i in range(n):
            if key[i] <= thr:
                idx[j] = i
                j += 1
        return idx[np.argsort(key[idx])]
    hk = key[:k].copy()
    hi = np.arange(k)
    # heapify (max-heap on hk), then keep the k smallest
    for start in range(k // 2 - 1, -1, -1):
        _sift_down(hk, hi, start, k)
    for j in range(k, n):
        if key[j] < hk[0]:
            hk[0] = key[j]
            hi[0] = j
            _sift_down(hk, hi, 0, k)
    return hi[np.argsort(hk)]


@njit(cache=True)
def _sift_down(hk, hi, i, k):
    """Move entry ``i`` of the max-heap ``hk[:k]`` (indices ``hi``) down to its place."""
    while True:
        l = 2 * i + 1
        if l >= k:
            break
        c = l
        if l + 1 < k and hk[l + 1] > hk[l]:
            c = l + 1
        if hk[c] > hk[i]:
            hk[c], hk[i] = hk[i], hk[c]
            hi[c], hi[i] = hi[i], hi[c]
            i = c
        else:
            break


@njit(cache=True)
def tag_layer_access(valid, tags_arr, planes_arr, hot, pins, where, cnt, tags, planes, hots,
                     touch, has_touch, fill, hot_max, stat_max, out_hit, out_filled, out_pinned):
    """The tag unit's layer access (see ``FastTagUnit.layer_access``).
    ``cnt`` = [lookups, hits, allocations, evictions, nfree, commits]; every
    fill commits at once (no slot is PENDING in the cache driver). Returns
    ``(pinned count, evictions)``; ``out_pinned[:pinned]`` are the pinned slots."""
    S = valid.size
    n = tags.size
    npin = 0
    nh = 0
    for i in range(n):
        s = where[tags[i]]
        out_filled[i] = False
        if s >= 0:
            out_hit[i] = True
            nh += 1
            pins[s] += 1
            out_pinned[npin] = s
            npin += 1
            if has_touch:
                h = hot[s] + touch[i]
                hot[s] = h if h < hot_max else hot_max
        else:
            out_hit[i] = False
    cnt[0] = min(cnt[0] + n, stat_max)
    cnt[1] = min(cnt[1] + nh, stat_max)
    if not fill or nh == n:
        return npin, 0
    m = n - nh
    victims = np.empty(m, np.int64)
    nv = 0
    if cnt[4] > 0:
        for s in range(S):
            if not valid[s]:
                victims[nv] = s
                nv += 1
                if nv == m:
                    break
    if nv < m:
        nc = 0
        for s in range(S):
            if valid[s] and pins[s] == 0:
                nc += 1
        if nc:
            key = np.empty(nc, np.int64)
            idx = np.empty(nc, np.int64)
            j = 0
            for s in range(S):
                if valid[s] and pins[s] == 0:
                    key[j] = hot[s] * S + s
                    idx[j] = s
                    j += 1
            take = min(m - nv, nc)
            order = smallest_k(key, take)
            for j in range(take):
                victims[nv] = idx[order[j]]
                nv += 1
    nev = 0
    v = 0
    for i in range(n):
        if out_hit[i]:
            continue
        if v >= nv:
            break
        s = victims[v]
        v += 1
        if valid[s]:
            where[tags_arr[s]] = -1
            nev += 1
        else:
            cnt[4] -= 1
        valid[s] = True
        tags_arr[s] = tags[i]
        planes_arr[s] = planes
        hot[s] = hots[i]
        pins[s] = 1
        where[tags[i]] = s
        out_filled[i] = True
        out_pinned[npin] = s
        npin += 1
    cnt[2] = min(cnt[2] + nv, stat_max)
    cnt[3] = min(cnt[3] + nev, stat_max)
    cnt[5] = min(cnt[5] + nv, stat_max)
    return npin, nev

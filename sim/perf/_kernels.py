"""Compiled inner loops of the system model's caches (numba).

The NumPy implementations in :mod:`.fastpolicy` and :mod:`.cache` state the
batch semantics; these kernels do exactly the same, element by element, so
that one layer step costs microseconds instead of a few dozen NumPy calls
(the whole paper grid replays about half a million layer steps). Both paths
are tested against the golden tag unit (``tests/test_fastpolicy.py``);
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

__all__ = ["smallest_k", "AVAILABLE", "tag_layer_access", "batch_access", "tag_replay", "batch_replay"]


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
    # heapify (max-heap on hk)
    for start in range(k // 2 - 1, -1, -1):
        i = start
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
    for j in range(k, n):
        if key[j] < hk[0]:
            hk[0] = key[j]
            hi[0] = j
            i = 0
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
    return hi[np.argsort(hk)]


@njit(cache=True)
def tag_layer_access(valid, tags_arr, planes_arr, hot, pins, where, cnt, tags, planes, hots,
                     touch, has_touch, fill, hot_max, stat_max, out_hit, out_filled, out_pinned):
    """The tag unit's layer access (see ``FastTagUnit.layer_access``).
    ``cnt`` = [lookups, hits, allocations, evictions, nfree, commits]; every
    fill commits at once (no slot is PENDING in the system model). Returns
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


@njit(cache=True)
def _rl_add(rl, pos, meta, k):
    rl[meta[0]] = k
    pos[k] = meta[0]
    meta[0] += 1


@njit(cache=True)
def _rl_remove(rl, pos, meta, k):
    j = pos[k]
    last = rl[meta[0] - 1]
    rl[j] = last
    pos[last] = j
    meta[0] -= 1
    pos[k] = -1


@njit(cache=True)
def batch_access(res, prio, size, rl, pos, meta, keys, weights, next_use, policy, t, capacity, used,
                 uniform, fill, out_hit, out_filled):
    """``BatchCache.access`` (policy 0 lru, 1 lfu, 2 static, 3 belady).
    ``rl[:meta[0]]`` lists the resident keys (``pos`` = their index) so that
    victims are searched among residents only. Returns ``(used, hits)``."""
    N = res.size
    n = keys.size
    nh = 0
    for i in range(n):
        k = keys[i]
        out_filled[i] = False
        out_hit[i] = res[k]
        if res[k]:
            nh += 1
        if policy == 0:
            prio[k] = t
        elif policy == 1:
            prio[k] += weights[i]
        elif policy == 3:
            prio[k] = -next_use[i]
    if policy == 2 or not fill or nh == n:
        return used, nh
    m = n - nh
    mk = np.empty(m, np.int64)
    mi = np.empty(m, np.int64)
    j = 0
    for i in range(n):
        if not out_hit[i]:
            mk[j] = keys[i]
            mi[j] = i
            j += 1
    if policy == 1 or policy == 3:
        okey = np.empty(m, np.float64)
        for j in range(m):
            okey[j] = -prio[mk[j]] * N + mk[j]
        order = np.argsort(okey, kind="mergesort")
        mk = mk[order]
        mi = mi[order]
    need = 0.0
    for j in range(m):
        need += size[mk[j]]
    need -= capacity - used
    if need > 1e-9:
        # candidates: resident entries this set does not use
        for i in range(n):
            if out_hit[i]:
                res[keys[i]] = False
        nres = meta[0]
        ck = np.empty(nres, np.float64)
        ci = np.empty(nres, np.int64)
        nc = 0
        for q in range(nres):
            k = rl[q]
            if res[k]:
                ck[nc] = prio[k] * N + k
                ci[nc] = k
                nc += 1
        for i in range(n):
            if out_hit[i]:
                res[keys[i]] = True
        if nc:
            ck = ck[:nc]
            ci = ci[:nc]
            smin = size[ci[0]]
            if not uniform:
                for q in range(nc):
                    if size[ci[q]] < smin:
                        smin = size[ci[q]]
            kk = int(np.ceil(need / smin - 1e-9))     # at most this many victims are needed
            order = smallest_k(ck, min(kk, nc))
            freed = 0.0
            for j in range(order.size):
                if freed >= need - 1e-9:
                    break
                k = ci[order[j]]
                res[k] = False
                _rl_remove(rl, pos, meta, k)
                freed += size[k]
                used -= size[k]
    room = capacity - used
    cum = 0.0
    for j in range(m):
        cum += size[mk[j]]
        if cum <= room + 1e-9:
            res[mk[j]] = True
            _rl_add(rl, pos, meta, mk[j])
            used += size[mk[j]]
            out_filled[mi[j]] = True
        else:
            break
    return used, nh


@njit(cache=True)
def tag_replay(valid, tags_arr, planes_arr, hot, pins, where, cnt, offsets, tags_flat, hots_flat,
               touch_flat, has_touch, fill, planes, hot_max, stat_max, decay_after, decay_shift,
               out_hits, out_fills, out_evict):
    """A sequence of layer accesses (set ``j`` = ``tags_flat[offsets[j]:offsets[j+1]]``):
    each is :func:`tag_layer_access`, then UNPIN of every slot it pinned, then
    DECAY when ``decay_after[j]``."""
    nsets = offsets.size - 1
    mx = 1
    for j in range(nsets):
        if offsets[j + 1] - offsets[j] > mx:
            mx = offsets[j + 1] - offsets[j]
    hit = np.empty(mx, np.bool_)
    filled = np.empty(mx, np.bool_)
    pinned = np.empty(mx, np.int64)
    S = valid.size
    for j in range(nsets):
        a = offsets[j]
        b = offsets[j + 1]
        n = b - a
        npin, nev = tag_layer_access(valid, tags_arr, planes_arr, hot, pins, where, cnt,
                                     tags_flat[a:b], planes, hots_flat[a:b], touch_flat[a:b],
                                     has_touch, fill, hot_max, stat_max, hit[:n], filled[:n], pinned)
        nh = 0
        nf = 0
        for i in range(n):
            if hit[i]:
                nh += 1
            if filled[i]:
                nf += 1
        out_hits[j] = nh
        out_fills[j] = nf
        out_evict[j] = nev
        for q in range(npin):
            pins[pinned[q]] -= 1
        if decay_after[j]:
            for s in range(S):
                hot[s] -= hot[s] >> decay_shift


@njit(cache=True)
def batch_replay(res, prio, size, rl, pos, meta, offsets, keys_flat, weights_flat, nu_flat, policy, t0,
                 capacity, used, uniform, fill, out_hit_flat, out_fill_flat, out_hits, out_fills):
    """A sequence of :func:`batch_access` calls; per-element hit/fill flags in
    ``out_*_flat``, per-set counts in ``out_hits``/``out_fills``. Returns ``(used, t)``."""
    nsets = offsets.size - 1
    t = t0
    for j in range(nsets):
        a = offsets[j]
        b = offsets[j + 1]
        t += 1.0
        used, nh = batch_access(res, prio, size, rl, pos, meta, keys_flat[a:b], weights_flat[a:b],
                                nu_flat[a:b], policy, t, capacity, used, uniform, fill,
                                out_hit_flat[a:b], out_fill_flat[a:b])
        nf = 0
        for i in range(a, b):
            if out_fill_flat[i]:
                nf += 1
        out_hits[j] = nh
        out_fills[j] = nf
    return used, t

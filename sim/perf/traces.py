"""Expert-routing traces: the file format, a loader/saver and a calibrated
synthetic generator.

A *routing trace* records, for every decoded token, which routed experts the
router selected in every MoE layer. The performance model replays traces
through the expert caches; issue 7 writes real traces of a small trained MoE
model in this format.

File format (version 1)
-----------------------
Two encodings carry the same content; :func:`load_trace` picks one by the
file suffix (``.npz`` or ``.jsonl``/``.json``).

**NPZ** (``numpy.savez``), arrays:

``experts``  (required) integer array ``(T, L, k)``: token ``t``, MoE layer
             ``l`` (0-based over *all* decoder layers), ``k`` routed expert ids
             in rank order (highest gate first). ``-1`` marks "no routed
             expert" (a dense layer, or padding when fewer than ``k``).
``request``  (optional) integer ``(T,)``: request (sequence) id of each token;
             default all 0 (one request).
``position`` (optional) integer ``(T,)``: decode step of the token inside
             its request; default the order of appearance. Tokens of one
             request are replayed in ``position`` order.
``gates``    (optional) float ``(T, L, k)``: router weights of those experts.
``meta``     (optional) 0-d string array holding a JSON object:
             ``{"format": "elmoe3d-trace", "version": 1, "model": str,
             "num_experts": E, "top_k": k, "source": str}``. ``num_experts``
             defaults to ``max(experts) + 1``.

**JSON lines**: line 1 is the header (the ``meta`` object above, with
``"format": "elmoe3d-trace"`` required); every further line is one token::

    {"request": 0, "position": 5, "experts": [[3, 17], [0, 9], ...]}

(``experts`` is a list of ``L`` lists of ``k`` ids; optional ``"gates"`` has
the same shape.) Blank lines are ignored.

Replay: a batch of ``B`` is ``B`` requests decoded in lock step. When a trace
has fewer than ``B`` requests, the longest ones are cut into equal segments
so there are ``B`` independent streams (:meth:`Trace.streams`); this
underestimates inter-request diversity, which the model reports.

The synthetic generator (:func:`generate`) models three published locality
effects with per-model parameters (``sim/perf/data/models.json``,
``"locality"``): a Zipf-skewed expert popularity per layer (flatter in early
layers), request-specific preference (a log-normal tilt of the popularity per
request, so a batch's working set grows with batch size), and reuse across
consecutive tokens of one request (each of the ``k`` picks repeats the previous
token's expert with probability ``reuse``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Trace", "load_trace", "save_trace", "generate", "FORMAT", "VERSION"]

FORMAT = "elmoe3d-trace"
VERSION = 1


@dataclass
class Trace:
    """A routing trace (see the module docstring for the file format).

    Members
    -------
    experts : ndarray (T, L, k) int32, -1 = no routed expert
    request, position : ndarray (T,) int64
    num_experts : int
    model : str
    gates : ndarray (T, L, k) float or None
    meta : dict
    """

    experts: np.ndarray
    request: np.ndarray
    position: np.ndarray
    num_experts: int
    model: str = ""
    gates: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        e = np.asarray(self.experts)
        if e.ndim != 3 or not np.issubdtype(e.dtype, np.integer):
            raise ValueError(f"Trace experts must be an integer array (tokens, layers, k), "
                             f"not shape {e.shape} dtype {e.dtype}")
        if e.shape[0] == 0 or e.shape[1] == 0 or e.shape[2] == 0:
            raise ValueError(f"Trace experts array is empty (shape {e.shape})")
        self.experts = e.astype(np.int32)
        T = e.shape[0]
        self.request = np.asarray(self.request, dtype=np.int64).reshape(-1)
        self.position = np.asarray(self.position, dtype=np.int64).reshape(-1)
        if self.request.shape != (T,) or self.position.shape != (T,):
            raise ValueError(f"Trace request/position must have {T} entries, not "
                             f"{self.request.shape[0]}/{self.position.shape[0]}")
        if isinstance(self.num_experts, bool) or int(self.num_experts) < 1:
            raise ValueError(f"Trace num_experts must be >= 1, not {self.num_experts!r}")
        self.num_experts = int(self.num_experts)
        if e.min() < -1 or e.max() >= self.num_experts:
            raise ValueError(f"Trace expert ids must be in -1..{self.num_experts - 1}, "
                             f"got {e.min()}..{e.max()}")
        if self.gates is not None:
            self.gates = np.asarray(self.gates, dtype=np.float64)
            if self.gates.shape != e.shape:
                raise ValueError(f"Trace gates shape {self.gates.shape} != experts shape {e.shape}")

    @property
    def tokens(self) -> int:
        return self.experts.shape[0]

    @property
    def layers(self) -> int:
        return self.experts.shape[1]

    @property
    def top_k(self) -> int:
        return self.experts.shape[2]

    @property
    def requests(self) -> int:
        return len(np.unique(self.request))

    def streams(self, batch: int, steps: int | None = None) -> np.ndarray:
        """``(batch, S, L, k)`` expert ids: ``batch`` streams decoded in lock step.

        Requests are ordered by ``position``; when there are fewer requests
        than ``batch``, requests are cut into segments (longest first) until
        there are ``batch`` streams. ``S`` is the shortest stream length
        (capped at ``steps``).
        """
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"Batch must be a positive integer, not {batch!r}")
        seqs = []
        for r in np.unique(self.request):
            idx = np.flatnonzero(self.request == r)
            idx = idx[np.argsort(self.position[idx], kind="stable")]
            seqs.append(self.experts[idx])
        seqs.sort(key=len, reverse=True)
        while len(seqs) < batch:
            longest = seqs.pop(0)
            if len(longest) < 2:
                raise ValueError(f"Trace has too few tokens ({self.tokens}) for batch {batch}")
            h = len(longest) // 2
            seqs += [longest[:h], longest[h:]]
            seqs.sort(key=len, reverse=True)
        seqs = seqs[:batch]
        S = min(len(s) for s in seqs)
        if steps is not None:
            S = min(S, int(steps))
        return np.stack([s[:S] for s in seqs])


def _fail(path, why):
    raise ValueError(f"Malformed trace file {str(path)!r}: {why}")


def load_trace(path) -> Trace:
    """Read a trace file (``.npz`` or ``.jsonl``/``.json``).

    Raises
    ------
    ValueError
        One line naming the file and what is wrong (missing file, unknown
        suffix, missing or mis-shaped array, bad header, bad JSON).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Trace file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            return _load_npz(path)
        if suffix in (".jsonl", ".json"):
            return _load_jsonl(path)
    except ValueError as e:
        if str(e).startswith("Malformed trace file"):
            raise
        _fail(path, e)
    except (KeyError, TypeError, OSError, EOFError) as e:
        _fail(path, f"{type(e).__name__}: {e}")
    raise ValueError(f"Trace file {str(path)!r} must end in .npz or .jsonl, not {suffix!r}")


def _load_npz(path) -> Trace:
    import zipfile
    try:
        z = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        _fail(path, f"not a readable NPZ ({e})")
    with z:
        if "experts" not in z.files:
            _fail(path, f"no 'experts' array (has {', '.join(z.files) or 'nothing'})")
        experts = z["experts"]
        if experts.ndim != 3:
            _fail(path, f"'experts' must be 3-D (tokens, layers, k), not shape {experts.shape}")
        T = experts.shape[0]
        meta = {}
        if "meta" in z.files:
            try:
                meta = json.loads(str(z["meta"]))
            except json.JSONDecodeError as e:
                _fail(path, f"'meta' is not JSON ({e})")
            if not isinstance(meta, dict):
                _fail(path, "'meta' must be a JSON object")
        request = z["request"] if "request" in z.files else np.zeros(T, np.int64)
        position = z["position"] if "position" in z.files else _order(request)
        gates = z["gates"] if "gates" in z.files else None
    return _make(path, experts, request, position, gates, meta)


def _order(request):
    request = np.asarray(request).reshape(-1)
    pos = np.zeros(len(request), np.int64)
    seen = {}
    for i, r in enumerate(request.tolist()):
        pos[i] = seen.get(r, 0)
        seen[r] = pos[i] + 1
    return pos


def _make(path, experts, request, position, gates, meta):
    if meta.get("format", FORMAT) != FORMAT:
        _fail(path, f"format {meta.get('format')!r} is not {FORMAT!r}")
    if int(meta.get("version", VERSION)) > VERSION:
        _fail(path, f"version {meta.get('version')!r} is newer than {VERSION}")
    experts = np.asarray(experts)
    if not np.issubdtype(experts.dtype, np.integer):
        _fail(path, f"'experts' must be integers, not {experts.dtype}")
    E = meta.get("num_experts")
    if E is None:
        E = int(experts.max()) + 1 if experts.size else 0
    try:
        return Trace(experts, request, position, int(E), str(meta.get("model", "")), gates, meta)
    except ValueError as e:
        _fail(path, e)


def _load_jsonl(path) -> Trace:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    if not lines:
        _fail(path, "empty file")
    try:
        rows = [json.loads(ln) for ln in lines]
    except json.JSONDecodeError as e:
        _fail(path, f"bad JSON ({e})")
    meta, rows = rows[0], rows[1:]
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        _fail(path, f"first line must be a header object with \"format\": \"{FORMAT}\"")
    if not rows:
        _fail(path, "no token lines after the header")
    try:
        experts = np.array([r["experts"] for r in rows])
    except (KeyError, TypeError) as e:
        _fail(path, f"every token line needs an 'experts' list ({e})")
    except ValueError as e:
        _fail(path, f"token lines have ragged 'experts' lists ({e})")
    if experts.ndim != 3:
        _fail(path, f"'experts' must be a list of L lists of k ids, got shape {experts.shape[1:]}")
    request = np.array([int(r.get("request", 0)) for r in rows])
    if all("position" in r for r in rows):
        position = np.array([int(r["position"]) for r in rows])
    else:
        position = _order(request)
    gates = None
    if all("gates" in r for r in rows):
        gates = np.array([r["gates"] for r in rows], dtype=np.float64)
    return _make(path, experts, request, position, gates, meta)


def save_trace(path, experts, request=None, position=None, *, num_experts=None,
               model: str = "", gates=None, source: str = "", **extra_meta) -> Path:
    """Write a trace; the suffix of ``path`` (``.npz`` or ``.jsonl``) picks the encoding.

    ``experts`` is ``(T, L, k)`` with ``request``/``position`` per token, or
    ``(B, T, L, k)`` (``B`` requests of ``T`` decode steps; ``request`` and
    ``position`` are then derived), or a :class:`Trace` (everything taken
    from it). A dict passed as the third argument is taken as metadata
    (``num_experts`` - or ``experts`` when it is an integer -, ``model``,
    ``source`` and any other JSON-able keys). Returns the path. The file
    round-trips through :func:`load_trace`.
    """
    path = Path(path)
    if isinstance(request, dict):
        extra_meta = {**request, **extra_meta}
        request = None
        model = model or str(extra_meta.pop("model", ""))
        source = source or str(extra_meta.pop("source", ""))
        ne = extra_meta.get("num_experts", extra_meta.get("experts"))
        if num_experts is None and isinstance(ne, int) and not isinstance(ne, bool):
            num_experts = ne
        extra_meta.pop("num_experts", None)
    if not isinstance(experts, Trace) and np.ndim(experts) == 4:
        e4 = np.asarray(experts)
        B, T = e4.shape[:2]
        experts = e4.reshape((B * T,) + e4.shape[2:])
        request = np.repeat(np.arange(B), T)
        position = np.tile(np.arange(T), B)
        if gates is not None:
            gates = np.asarray(gates).reshape(experts.shape)
    if isinstance(experts, Trace):
        t = experts
        experts, request, position = t.experts, t.request, t.position
        num_experts, model, gates = t.num_experts, model or t.model, t.gates
        extra_meta = {**{k: v for k, v in t.meta.items()
                         if k not in ("format", "version", "model", "num_experts", "top_k")},
                      **extra_meta}
    experts = np.asarray(experts)
    T = experts.shape[0]
    request = np.zeros(T, np.int64) if request is None else np.asarray(request)
    position = _order(request) if position is None else np.asarray(position)
    if num_experts is None:
        num_experts = int(experts.max()) + 1
    t = Trace(experts, request, position, int(num_experts), model, gates)   # validates
    meta = {k: v for k, v in extra_meta.items() if k not in ("format", "version")}
    meta.update({"format": FORMAT, "version": VERSION, "model": model,
                 "num_experts": t.num_experts, "top_k": t.top_k, "layers": t.layers})
    if source:
        meta["source"] = source
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        arrays = dict(experts=t.experts, request=t.request, position=t.position,
                      meta=np.array(json.dumps(meta)))
        if t.gates is not None:
            arrays["gates"] = t.gates
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)
    elif suffix in (".jsonl", ".json"):
        with open(path, "w") as f:
            f.write(json.dumps(meta) + "\n")
            for i in range(T):
                row = {"request": int(t.request[i]), "position": int(t.position[i]),
                       "experts": t.experts[i].tolist()}
                if t.gates is not None:
                    row["gates"] = np.round(t.gates[i], 6).tolist()
                f.write(json.dumps(row) + "\n")
    else:
        raise ValueError(f"Trace file {str(path)!r} must end in .npz or .jsonl, not {suffix!r}")
    return path


# -- synthetic traces ------------------------------------------------------------

def generate(layers: int, num_experts: int, top_k: int, *, requests: int, steps: int,
             zipf: float = 0.8, early_zipf: float = 0.3, early_layers: int = 2,
             request_spread: float = 1.0, reuse: float = 0.4, dense_layers=(),
             seed: int = 0, model: str = "") -> Trace:
    """A synthetic routing trace with published-style locality.

    Parameters
    ----------
    layers, num_experts, top_k : int
        Decoder layers, routed experts per layer, experts per token.
    requests, steps : int
        Independent requests and decode steps per request (``T = requests * steps``).
    zipf : float
        Popularity skew: expert of popularity rank ``r`` (a random
        permutation per layer) has base weight ``(r + 1) ** -zipf``.
    early_zipf, early_layers : float, int
        The first ``early_layers`` MoE layers use the flatter ``early_zipf``
        (broader routing in early layers).
    request_spread : float
        Std of the per-request log-normal tilt of the popularity: 0 = every
        request prefers the same experts; larger = batch working set grows
        faster with batch.
    reuse : float
        Probability that each of a token's ``k`` picks repeats the previous
        token's expert (same request, same layer).
    dense_layers : iterable of int
        Layers without routed experts (ids ``-1``).
    seed : int

    Returns
    -------
    Trace
        Tokens ordered step-major (all requests' step 0, then step 1, ...).
    """
    for name, v, lo in (("layers", layers, 1), ("num_experts", num_experts, 1), ("top_k", top_k, 1),
                        ("requests", requests, 1), ("steps", steps, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"Trace generator {name} must be an integer >= {lo}, not {v!r}")
    if top_k > num_experts:
        raise ValueError(f"Trace generator top_k {top_k} exceeds num_experts {num_experts}")
    if not 0 <= reuse <= 1:
        raise ValueError(f"Trace generator reuse must be in 0..1, not {reuse!r}")
    rng = np.random.default_rng(seed)
    L, E, k, R = int(layers), int(num_experts), int(top_k), int(requests)
    ranks = np.argsort(rng.random((L, E)), axis=1)          # popularity rank of each expert
    skew = np.where(np.arange(L) < early_layers, early_zipf, zipf)[:, None]
    logp = -skew * np.log1p(ranks)                           # (L, E)
    tilt = rng.normal(0.0, request_spread, (R, L, E))        # per-request preference
    logq = logp[None] + tilt                                 # (R, L, E)
    out = np.empty((steps, R, L, k), np.int32)
    prev = None
    r_idx = np.arange(R)[:, None, None]
    l_idx = np.arange(L)[None, :, None]
    for t in range(steps):
        score = logq - np.log(-np.log(rng.random((R, L, E))))   # Gumbel-top-k sampling
        if prev is not None:
            # each kept pick (probability `reuse`) wins outright with +inf; the
            # other picks compete by Gumbel score (no duplicates by construction)
            keep = rng.random((R, L, k)) < reuse
            score[r_idx, l_idx, prev] = np.where(keep, np.inf, score[r_idx, l_idx, prev])
        top = np.argpartition(-score, k - 1, axis=2)[:, :, :k]
        # rank order (highest score first) so column 0 is the top expert
        order = np.argsort(-np.take_along_axis(score, top, axis=2), axis=2)
        top = np.take_along_axis(top, order, axis=2)
        out[t] = top
        prev = top
    experts = out.reshape(steps * R, L, k)
    for l in dense_layers:
        experts[:, l, :] = -1
    request = np.tile(np.arange(R), steps)
    position = np.repeat(np.arange(steps), R)
    meta = {"format": FORMAT, "version": VERSION, "model": model, "num_experts": E,
            "top_k": k, "source": "synthetic", "seed": seed,
            "params": dict(zipf=zipf, early_zipf=early_zipf, early_layers=early_layers,
                           request_spread=request_spread, reuse=reuse)}
    return Trace(experts, request, position, E, model, None, meta)


# -- locality statistics ---------------------------------------------------------------

def reuse_distances(streams: np.ndarray, num_experts: int) -> np.ndarray:
    """Every reuse distance (tokens since the same expert was last picked in
    the same request and layer) of ``streams[B, S, L, k]``."""
    B, S, L, k = streams.shape
    oh = np.zeros((B, S, L, num_experts), bool)
    b, s_, l, j = np.nonzero(streams >= 0)
    oh[b, s_, l, streams[b, s_, l, j]] = True
    seq, t = np.nonzero(oh.transpose(0, 2, 3, 1).reshape(-1, S))
    same = seq[1:] == seq[:-1]
    return (t[1:] - t[:-1])[same]


def lru_hit_rate(streams: np.ndarray, capacity: int) -> float:
    """Per-request, per-layer LRU hit rate with ``capacity`` experts of a
    layer cached (batch 1 decode: each request alone; a textbook LRU over the
    picks in order, token by token)."""
    from .cache import LRUCache
    B, S, L, k = streams.shape
    hits = n = 0
    for b in range(B):
        for l in range(L):
            seq = streams[b, :, l].reshape(-1)
            seq = seq[seq >= 0]
            if not seq.size:
                continue
            lru = LRUCache(capacity)
            hits += sum(lru.access(int(e)) for e in seq)
            n += seq.size
    return hits / n if n else 0.0


def trace_stats(streams: np.ndarray, num_experts: int, fractions=(0.1, 0.25, 0.4, 0.5),
                warmup: int = 0) -> dict:
    """Locality statistics of ``streams[B, S, L, k]`` (MoE layers only):
    median / mean reuse distance, the fraction of a token's picks also picked
    by the previous token, the most popular expert's share per layer, per-request
    LRU hit rates with a fraction of each layer's experts cached, and the
    distinct experts per layer of one decode step of all ``B`` requests."""
    B, S, L, k = streams.shape
    moe = [l for l in range(L) if (streams[:, :, l] >= 0).any()]
    st = streams[:, :, moe]
    E = num_experts
    d = reuse_distances(st, E)
    oh = np.zeros((B, S, len(moe), E), bool)
    b, s_, l, j = np.nonzero(st >= 0)
    oh[b, s_, l, st[b, s_, l, j]] = True
    reuse = float((oh[:, 1:] & oh[:, :-1]).sum(-1).mean() / k)
    pop = oh.sum((0, 1)).astype(np.float64)
    top_share = float((pop.max(-1) / np.maximum(pop.sum(-1), 1)).mean())
    out = dict(requests=int(B), steps=int(S), moe_layers=len(moe), experts=E, top_k=k,
               median_reuse_distance=float(np.median(d)) if d.size else None,
               mean_reuse_distance=float(d.mean()) if d.size else None,
               reuse_prev_token=reuse, reuse_uniform=k / E, top_expert_share=top_share,
               working_set_all_requests=float(oh.any(0).sum(-1).mean()) / E)
    for f in fractions:
        out[f"lru_hit_{int(round(f * 100))}pct"] = lru_hit_rate(st, max(1, int(round(f * E))))
    return out


def calibrate_locality(num_experts: int, top_k: int, *, lru_target: float, lru_fraction: float,
                       median_distance: float, layers: int = 3, requests: int = 8, steps: int = 80,
                       grid=None, seed: int = 0) -> dict:
    """Search the generator's ``zipf``, ``request_spread`` and ``reuse`` for
    the trace whose per-request LRU hit rate at ``lru_fraction`` residency and
    median reuse distance come closest to published measurements (squared
    error, the hit rate weighted 10x per unit). Returns the best parameters
    and the statistics they give."""
    grid = grid or dict(zipf=(0.6, 0.9, 1.2, 1.5), request_spread=(1.0, 1.5, 2.0, 2.5),
                        reuse=(0.3, 0.45, 0.6, 0.75))
    best = None
    for z in grid["zipf"]:
        for sp in grid["request_spread"]:
            for ru in grid["reuse"]:
                t = generate(layers, num_experts, top_k, requests=requests, steps=steps, zipf=z,
                             early_zipf=z, early_layers=0, request_spread=sp, reuse=ru, seed=seed)
                s = t.streams(requests)
                hit = lru_hit_rate(s, max(1, int(round(lru_fraction * num_experts))))
                med = float(np.median(reuse_distances(s, num_experts)))
                loss = (10 * (hit - lru_target)) ** 2 + (med - median_distance) ** 2
                if best is None or loss < best[0]:
                    best = (loss, dict(zipf=z, request_spread=sp, reuse=ru),
                            dict(lru_hit=hit, median_reuse_distance=med))
    return dict(params=best[1], stats=best[2], loss=best[0])

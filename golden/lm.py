"""NumPy inference of the small MoE language model (issue 7).

The model trained by :mod:`elmoe3d.sim.lm.train` (weights committed as
``sim/lm/data/moe_lm.npz``): a byte-level decoder-only transformer with
RMSNorm, GQA attention with RoPE, a softmax router picking the top-``k`` of
``E`` SwiGLU experts (gates renormalised over the chosen experts) and an
embedding tied to the output head. No torch is needed here.

Precisions
----------
``float``
    The committed float16 weights widened to float32 (the reference).
``full``
    INT8 weight quantisation, symmetric and per output channel
    (``scale = max|w| / 127``), float activations. Bit-sliced with
    :mod:`elmoe3d.golden.bitslice` in mode FULL, which is exact, so this is
    plain INT8 weight-only quantisation.
``augmented``
    Only the top ``keep`` planes of each INT8 weight, LSB-augmented
    (bit-slice mode DRAFT: round to the midpoint of the dropped range).
``truncated``
    Only the top ``keep`` planes, plain truncation (bit-slice mode MSB).
``rtn4``
    An *independent* 4-bit copy (round to nearest, its own scale
    ``max|w| / 7``): a separate 4-bit draft model (speculative decoding with
    a quantised copy), which needs its own storage (not a bit slice of the INT8 weights).

Scales: ``scales="channel"`` (default) quantises symmetrically per output
channel; ``scales="tensor"`` uses one scale per weight matrix (per expert
matrix for the stacked experts). The bit slices are slices of whichever INT8
weights are stored, so a per-tensor model's target (FULL) is itself the
per-tensor INT8 model.

:class:`MoEModel` takes a ``precision`` for the dense part (embedding/head,
attention, router) and one for the routed experts, which is what the
Elastic-SD draft needs: the dense weights stay at the target's INT8 FULL,
the HB-resident experts are read at MSB precision.

The FFN of a layer (router, top-k, routed experts, gated combine) is
computed in one place, :meth:`MoEModel.moe` - the hook a different FFN
implementation (e.g. the golden batched integer MoE layer) replaces.

Inference is batched; the KV cache (:class:`KVCache`) holds
``(batch, kv_heads, positions, head_dim)`` per layer. Decoding is greedy
(ties break towards the lower token id). Routing ties break towards the lower
expert index.

Cost: about 0.43 M weight multiply-adds per token (attention projections
0.20 M, the two chosen experts 0.20 M, head 0.03 M) plus attention over the
context; a full ``elmoe3d evidence`` run (about 40 configurations x 3072
eight-byte draft rounds) takes under a minute of CPU.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import bitslice

__all__ = ["single_thread_blas", "weights_digest", "DATA_DIR", "WEIGHTS", "PRECISIONS", "MODES",
           "SCALES", "PROMPTS", "WINDOWS", "HELD_PROMPT", "heldout_prompts", "heldout_windows", "load_weights",
           "quantize", "effective_matrix", "MoEModel", "KVCache", "Routing", "cross_entropy",
           "model_paths"]

#: the model's committed data (``elmoe3d.sim.lm``'s package data; a path, not an
#: import: ``golden/`` and ``sim/`` are siblings in the source tree and in the
#: installed package alike)
DATA_DIR = Path(__file__).resolve().parent.parent / "sim" / "lm" / "data"
WEIGHTS = "moe_lm.npz"
#: the held-out prompts and perplexity windows (:func:`elmoe3d.sim.lm.evidence.make_heldout`)
PROMPTS = "heldout_prompts.npy"
WINDOWS = "heldout_windows.npy"
#: bytes of a held-out prompt a decode takes (``elmoe3d decode`` when fewer
#: prompts than requests are given; the system model's decode replay)
HELD_PROMPT = 48

#: precision name -> bit-slice PE mode (``None``: float weights, no quantisation)
MODES = {"float": None, "full": bitslice.Mode.FULL, "augmented": bitslice.Mode.DRAFT,
         "truncated": bitslice.Mode.MSB, "rtn4": None}
PRECISIONS = tuple(MODES)
#: weight-scale granularities
SCALES = ("channel", "tensor")


def single_thread_blas():
    """Context manager limiting BLAS to one thread (when ``threadpoolctl`` is
    installed; otherwise a no-op). The matrices here are small: on a shared
    2-core machine a multi-threaded OpenBLAS spends its time at barriers
    (measured 34x slower for a 400x128 @ 128x128 product under load)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def heldout_prompts(n=None) -> np.ndarray:
    """The first ``n`` (default all) held-out prompts (``int64`` bytes)."""
    p = np.load(DATA_DIR / PROMPTS).astype(np.int64)
    return p if n is None else p[:n]


def heldout_windows(n=None) -> np.ndarray:
    """The first ``n`` (default all) held-out perplexity windows (``int64`` bytes)."""
    w = np.load(DATA_DIR / WINDOWS).astype(np.int64)
    return w if n is None else w[:n]


def _check_precision(p, what):
    if p not in MODES:
        raise ValueError(f"{what} precision must be one of {', '.join(MODES)}, not {p!r}")
    return p


def load_weights(path=None, verify: bool = True) -> tuple[dict, dict]:
    """``(weights, meta)`` from the committed ``.npz`` (float32 arrays).

    With ``verify`` the file's SHA-256 must equal the checksum file beside it
    (``moe_lm.sha256``); a mismatch raises ``ValueError``.
    """
    path = Path(path) if path is not None else DATA_DIR / WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"MoE LM weights not found at {path}; train them with "
                                "`python -m elmoe3d.sim.lm.train` (needs torch)")
    if verify:
        sums = path.with_suffix(".sha256")
        if sums.is_file():
            want = sums.read_text().split()[0]
            got = hashlib.sha256(path.read_bytes()).hexdigest()
            if got != want:
                raise ValueError(f"Checksum mismatch for {path}: {got} != {want}")
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        weights = {k: z[k].astype(np.float32) for k in z.files if k != "meta"}
    return weights, meta


def weights_digest(path=None) -> str:
    """SHA-256 over the stored weight arrays (names, dtypes, shapes, bytes),
    not the file: a re-run of the training script reproduces this digest,
    while the ``.npz`` bytes differ (zip timestamps, recorded wall time)."""
    path = Path(path) if path is not None else DATA_DIR / WEIGHTS
    h = hashlib.sha256()
    with np.load(path) as z:
        for k in sorted(f for f in z.files if f != "meta"):
            a = z[k]
            h.update(f"{k}:{a.dtype.str}:{a.shape};".encode())
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def quantize(w: np.ndarray, scales: str = "channel", bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric quantisation of a ``[..., out, in]`` matrix to ``bits`` bits:
    ``(q int8, scale float32)`` with ``w ~ q * scale``; ``scale`` has shape
    ``[..., out]`` (``scales="channel"``) or ``[..., 1]`` (``"tensor"``: one
    scale per ``[out, in]`` matrix), broadcast per output row either way."""
    if scales not in SCALES:
        raise ValueError(f"Weight scales must be one of {', '.join(SCALES)}, not {scales!r}")
    w = np.asarray(w, dtype=np.float32)
    qmax = (1 << (bits - 1)) - 1
    amax = np.abs(w).max(axis=-1)
    if scales == "tensor":
        amax = np.abs(w).max(axis=(-2, -1))[..., None] * np.ones_like(amax)
    scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[..., None]), -qmax, qmax).astype(np.int8)
    return q, scale


def effective_matrix(w: np.ndarray, precision: str, slice_bits: int = 4, keep: int = 1,
                     scales: str = "channel") -> np.ndarray:
    """The float matrix a precision multiplies by: ``w`` itself for ``float``,
    an independent 4-bit RTN copy for ``rtn4``, else
    ``bitslice.effective_weights(q, s, mode, keep) * scale`` of the INT8
    weights ``q`` (scales per channel or per tensor)."""
    _check_precision(precision, "Weight")
    if precision == "float":
        return np.asarray(w, dtype=np.float32)
    if precision == "rtn4":
        q4, sc4 = quantize(w, scales, bits=4)
        return (q4.astype(np.float32) * sc4[..., None]).astype(np.float32)
    q, scale = quantize(w, scales)
    eff = bitslice.effective_weights(q, slice_bits, MODES[precision], keep)
    return (eff.astype(np.float32) * scale[..., None]).astype(np.float32)


def model_paths() -> dict:
    """``{name: path}`` of every committed trained model: ``seed1234`` (the
    original, ``sim/lm/data/moe_lm.npz``) and ``seed<N>`` for the retrained
    ones in ``sim/lm/data/seeds/seed<N>/``."""
    out = {}
    if (DATA_DIR / WEIGHTS).is_file():
        out["seed1234"] = DATA_DIR / WEIGHTS
    seeds = DATA_DIR / "seeds"
    if seeds.is_dir():
        for d in sorted(seeds.iterdir(), key=lambda p: (len(p.name), p.name)):
            if (d / WEIGHTS).is_file():
                out[d.name] = d / WEIGHTS
    return out


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean cross-entropy in nats of ``logits[..., V]`` against ``targets``."""
    lg = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    t = np.asarray(targets).reshape(-1)
    m = lg.max(-1)
    lse = m + np.log(np.exp(lg - m[:, None]).sum(-1))
    return float(np.mean(lse - lg[np.arange(len(t)), t]))


@dataclass
class KVCache:
    """Per-layer keys/values ``[B, kv_heads, capacity, head_dim]`` and the
    number of positions filled (the same for every sequence of the batch)."""
    k: list
    v: list
    length: int = 0

    @classmethod
    def empty(cls, layers, batch, kv_heads, capacity, head_dim):
        z = lambda: np.zeros((batch, kv_heads, capacity, head_dim), dtype=np.float32)
        return cls([z() for _ in range(layers)], [z() for _ in range(layers)], 0)

    @property
    def capacity(self):
        return self.k[0].shape[2]


@dataclass
class Routing:
    """Router decisions of a forward pass: ``experts[..., layer, k]`` (int16,
    highest gate first), ``gates`` (renormalised) and the full router
    ``probs[..., layer, E]`` over all experts."""
    experts: np.ndarray
    gates: np.ndarray
    probs: np.ndarray


class MoEModel:
    """The small MoE LM at a chosen precision.

    Parameters
    ----------
    weights, meta : dict
        From :func:`load_weights`.
    precision : str
        Precision of the dense weights (embedding/head, attention, router):
        one of :data:`PRECISIONS`.
    expert_precision : str, optional
        Precision of the routed experts' weights (default: ``precision``).
    slice_bits, keep : int
        Bit-slice width ``s`` and kept planes for the MSB precisions
        (default 4 and 1: the INT8 weight's MSB nibble).
    scales : str
        INT8 weight scales, ``"channel"`` (default) or ``"tensor"``.

    Raises
    ------
    ValueError
        For an unknown precision or a bad slice width / plane count.
    """

    def __init__(self, weights: dict, meta: dict, precision: str = "float",
                 expert_precision: str | None = None, slice_bits: int = 4, keep: int = 1,
                 scales: str = "channel"):
        self.precision = _check_precision(precision, "Dense")
        if self.precision == "rtn4":
            raise ValueError("Dense precision 'rtn4' is not supported (it is an expert-only draft copy)")
        if scales not in SCALES:
            raise ValueError(f"Weight scales must be one of {', '.join(SCALES)}, not {scales!r}")
        self.scales, self.slice_bits, self.keep = scales, slice_bits, keep
        self.taps = None            # a list to record (layer, ffn input, routing) in moe()
        self.expert_precision = _check_precision(
            precision if expert_precision is None else expert_precision, "Expert")
        bitslice.check_slice_bits(slice_bits)
        if not isinstance(keep, int) or not 1 <= keep < bitslice.n_planes(slice_bits):
            raise ValueError(f"Kept plane count must be in 1..{bitslice.n_planes(slice_bits) - 1} "
                             f"for slice width {slice_bits}, not {keep!r}")
        s = meta["shape"]
        self.meta, self.shape = meta, s
        self.V, self.d, self.L = s["vocab"], s["d_model"], s["n_layers"]
        self.h, self.kvh, self.hd = s["n_heads"], s["n_kv_heads"], s["head_dim"]
        self.E, self.k, self.f = s["experts"], s["top_k"], s["ffn"]
        self.eps, self.theta = s["norm_eps"], s["rope_theta"]
        dense = lambda w: effective_matrix(w, self.precision, slice_bits, keep, scales)
        expert = lambda w: effective_matrix(w, self.expert_precision, slice_bits, keep, scales)
        self.embed = dense(weights["embed"])
        self.final_norm = weights["final_norm"]
        self.layers = []
        for i in range(self.L):
            p = f"l{i}."
            self.layers.append(dict(
                attn_norm=weights[p + "attn_norm"], ffn_norm=weights[p + "ffn_norm"],
                wq=dense(weights[p + "wq"]).T.copy(), wk=dense(weights[p + "wk"]).T.copy(),
                wv=dense(weights[p + "wv"]).T.copy(), wo=dense(weights[p + "wo"]).T.copy(),
                router=dense(weights[p + "router"]).T.copy(),
                w_gate=np.ascontiguousarray(expert(weights[p + "w_gate"]).transpose(0, 2, 1)),
                w_up=np.ascontiguousarray(expert(weights[p + "w_up"]).transpose(0, 2, 1)),
                w_down=np.ascontiguousarray(expert(weights[p + "w_down"]).transpose(0, 2, 1))))
        inv = 1.0 / (self.theta ** (np.arange(0, self.hd, 2, dtype=np.float32) / self.hd))
        self._inv_freq = inv.astype(np.float32)

    # -- pieces -----------------------------------------------------------------
    def rope(self, x, pos):
        """Rotate-half RoPE; ``x[..., T, hd]`` with ``pos`` broadcastable to ``[..., T]``."""
        ang = np.asarray(pos, dtype=np.float32)[..., None] * self._inv_freq
        cos = np.concatenate([np.cos(ang), np.cos(ang)], -1).astype(np.float32)
        sin = np.concatenate([np.sin(ang), np.sin(ang)], -1).astype(np.float32)
        half = self.hd // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def route(self, layer: int, x: np.ndarray, resident: np.ndarray | None = None):
        """Router of ``layer`` on tokens ``x[N, d]``: ``(experts[N, k], gates[N, k],
        probs[N, E])``. With ``resident[N, E]`` (bool) only resident experts may
        be chosen - the highest-ranked resident ones (Elastic-SD drafting);
        ``probs`` stays the unrestricted router distribution."""
        logits = x @ self.layers[layer]["router"]
        probs = _softmax(logits)
        masked = logits if resident is None else np.where(resident, logits, -np.inf)
        experts = np.argsort(-masked, axis=-1, kind="stable")[:, :self.k]
        top = np.take_along_axis(masked, experts, -1)
        gates = _softmax(top)
        return experts.astype(np.int16), gates.astype(np.float32), probs.astype(np.float32)

    def experts_apply(self, layer: int, x: np.ndarray, experts, gates) -> np.ndarray:
        """Gated sum of the chosen SwiGLU experts for tokens ``x[N, d]``."""
        Ly = self.layers[layer]
        out = np.zeros_like(x)
        for e in np.unique(experts):
            tok, slot = np.nonzero(experts == e)
            xe = x[tok]
            hmid = _silu(xe @ Ly["w_gate"][e]) * (xe @ Ly["w_up"][e])
            # a token picks an expert at most once, so ``tok`` has no repeats here
            out[tok] += (hmid @ Ly["w_down"][e]) * gates[tok, slot, None]
        return out

    def moe(self, layer, x, resident=None):
        """The FFN of ``layer`` for tokens ``x[N, d]``: route (restricted to
        ``resident[N, E]`` when given), apply the chosen experts, combine.
        Returns ``(y[N, d], (experts, gates, probs))``. This is the one hook
        where the FFN is computed (forward, generate and draft_rounds all
        call it)."""
        experts, gates, probs = self.route(layer, x, resident)
        if self.taps is not None:
            self.taps.append((layer, x.copy(), experts.copy()))
        return self.experts_apply(layer, x, experts, gates), (experts, gates, probs)

    def _qkv(self, layer, x, pos):
        """Projected, RoPE'd ``q[B, h, T, hd]``, ``k, v[B, kvh, T, hd]``."""
        Ly = self.layers[layer]
        B, T, _ = x.shape
        q = (x @ Ly["wq"]).reshape(B, T, self.h, self.hd).transpose(0, 2, 1, 3)
        k = (x @ Ly["wk"]).reshape(B, T, self.kvh, self.hd).transpose(0, 2, 1, 3)
        v = (x @ Ly["wv"]).reshape(B, T, self.kvh, self.hd).transpose(0, 2, 1, 3)
        return self.rope(q, pos), self.rope(k, pos), v

    # -- whole passes -------------------------------------------------------------
    def forward(self, tokens, cache: KVCache | None = None, resident=None):
        """Run ``tokens[B, T]`` after the ``cache.length`` cached positions.

        Returns ``(logits[B, T, V], Routing)`` and appends the new keys and
        values to ``cache`` (when given). ``resident[B, L, E]`` (bool)
        restricts routing to resident experts (the same set for every
        position of the call).
        """
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"Tokens must be a [batch, time] array, not shape {tokens.shape}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.V):
            raise ValueError(f"Token ids must be in 0..{self.V - 1}")
        B, T = tokens.shape
        start = cache.length if cache is not None else 0
        if cache is not None and start + T > cache.capacity:
            raise ValueError(f"KV cache capacity {cache.capacity} exceeded by {start + T} positions")
        pos = np.arange(start, start + T)
        x = self.embed[tokens]
        rep = self.h // self.kvh
        R = np.zeros((B, T, self.L, self.k), np.int16)
        G = np.zeros((B, T, self.L, self.k), np.float32)
        P = np.zeros((B, T, self.L, self.E), np.float32)
        for i, Ly in enumerate(self.layers):
            q, k, v = self._qkv(i, _rms(x, Ly["attn_norm"], self.eps), pos)
            if cache is not None:
                cache.k[i][:, :, start:start + T] = k
                cache.v[i][:, :, start:start + T] = v
                k, v = cache.k[i][:, :, :start + T], cache.v[i][:, :, :start + T]
            S = k.shape[2]
            qg = q.reshape(B, self.kvh, rep * T, self.hd)
            sc = (qg @ k.transpose(0, 1, 3, 2)).reshape(B, self.kvh, rep, T, S)
            sc = sc * np.float32(1.0 / np.sqrt(self.hd))
            mask = np.arange(S)[None, :] > pos[:, None]
            sc = np.where(mask, np.float32(-np.inf), sc)
            att = _softmax(sc).reshape(B, self.kvh, rep * T, S) @ v
            att = att.reshape(B, self.h, T, self.hd).transpose(0, 2, 1, 3).reshape(B, T, -1)
            x = x + att @ Ly["wo"]
            xn = _rms(x, Ly["ffn_norm"], self.eps).reshape(B * T, self.d)
            res = None
            if resident is not None:
                res = np.repeat(np.asarray(resident, bool)[:, i, :], T, axis=0)
            y, (e, g, p) = self.moe(i, xn, res)
            x = x + y.reshape(B, T, self.d)
            R[:, :, i], G[:, :, i], P[:, :, i] = (e.reshape(B, T, -1), g.reshape(B, T, -1),
                                                  p.reshape(B, T, -1))
        if cache is not None:
            cache.length = start + T
        logits = _rms(x, self.final_norm, self.eps) @ self.embed.T
        return logits.astype(np.float32), Routing(R, G, P)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        return KVCache.empty(self.L, batch, self.kvh, capacity, self.hd)

    def generate(self, prompts, n_new: int, resident=None):
        """Greedy decoding of ``n_new`` tokens after ``prompts[B, P]`` with a KV
        cache. Returns ``(tokens[B, P + n_new], Routing over the P + n_new - 1
        positions fed, cache)``."""
        prompts = np.asarray(prompts)
        B, P = prompts.shape
        if n_new < 1:
            raise ValueError(f"Number of new tokens must be >= 1, not {n_new!r}")
        cache = self.new_cache(B, P + n_new)
        out = np.zeros((B, P + n_new), dtype=np.int64)
        out[:, :P] = prompts
        logits, r = self.forward(prompts, cache, resident)
        routs = [r]
        for t in range(n_new):
            out[:, P + t] = np.argmax(logits[:, -1], axis=-1)
            if t == n_new - 1:
                break
            logits, r = self.forward(out[:, P + t:P + t + 1], cache, resident)
            routs.append(r)
        cat = lambda a: np.concatenate(a, axis=1)
        routing = Routing(cat([r.experts for r in routs]), cat([r.gates for r in routs]),
                          cat([r.probs for r in routs]))
        return out, routing, cache

    def draft_rounds(self, ctx: KVCache, starts, first_tokens, resident, n_draft: int,
                     return_routing: bool = False):
        """Elastic-SD drafting from many positions of many sequences at once.

        ``ctx`` holds the target's keys/values for ``B`` sequences. Round
        ``(b, j)`` drafts ``n_draft`` tokens greedily: it sees the target's
        cache for positions ``< starts[j]`` (or ``starts[b, j]``) and feeds
        ``first_tokens[b, j]`` at that position, then its own tokens.
        ``resident[b, j, L, E]`` restricts each round's routing. Returns the
        drafted tokens ``[B, R, n_draft]``; with ``return_routing`` also the
        router's *unrestricted* top-k for every drafted token,
        ``[B, R, n_draft, L, k]`` (what hotness accumulates during drafting).
        """
        starts = np.asarray(starts, dtype=np.int64)
        first = np.asarray(first_tokens)
        B, R = first.shape
        if starts.shape == (R,):
            starts = np.broadcast_to(starts[None, :], (B, R))
        if starts.shape != (B, R):
            raise ValueError(f"Need one start per round ({R}) or per (sequence, round) "
                             f"({B}, {R}), got shape {starts.shape}")
        if starts.min() < 0 or starts.max() > ctx.length:
            raise ValueError(f"Round starts must lie in 0..{ctx.length} (the cached context)")
        rep = self.h // self.kvh
        N = B * R
        resident = np.asarray(resident, bool).reshape(N, self.L, self.E)
        ctx_mask = np.arange(ctx.capacity)[None, None, :] >= starts[:, :, None]   # [B, R, S]
        dk = [np.zeros((B, R, self.kvh, n_draft, self.hd), np.float32) for _ in range(self.L)]
        dv = [np.zeros((B, R, self.kvh, n_draft, self.hd), np.float32) for _ in range(self.L)]
        tok = first.reshape(N)
        out = np.zeros((B, R, n_draft), np.int64)
        rout = np.zeros((B, R, n_draft, self.L, self.k), np.int16) if return_routing else None
        scale = np.float32(1.0 / np.sqrt(self.hd))
        for i_d in range(n_draft):
            pos = starts + i_d
            x = self.embed[tok]                                                   # [N, d]
            for i, Ly in enumerate(self.layers):
                xn = _rms(x, Ly["attn_norm"], self.eps)
                q = (xn @ Ly["wq"]).reshape(B, R, self.h, self.hd)
                k = (xn @ Ly["wk"]).reshape(B, R, self.kvh, self.hd)
                v = (xn @ Ly["wv"]).reshape(B, R, self.kvh, self.hd)
                q, k = self.rope(q, pos[:, :, None]), self.rope(k, pos[:, :, None])
                dk[i][:, :, :, i_d], dv[i][:, :, :, i_d] = k, v
                qg = q.reshape(B, R, self.kvh, rep, self.hd)
                S = ctx.capacity
                # context part as one batched matmul per (sequence, kv head)
                qc = qg.transpose(0, 2, 1, 3, 4).reshape(B, self.kvh, R * rep, self.hd)
                s_ctx = (qc @ ctx.k[i].transpose(0, 1, 3, 2)) * scale      # [B, g, R*rep, S]
                s_ctx = s_ctx.reshape(B, self.kvh, R, rep, S).transpose(0, 2, 1, 3, 4)
                s_ctx = np.where(ctx_mask[:, :, None, None, :], np.float32(-np.inf), s_ctx)
                own_k = dk[i][:, :, :, :i_d + 1]                             # [B, R, g, i, hd]
                s_own = (qg @ own_k.transpose(0, 1, 2, 4, 3)) * scale        # [B, R, g, rep, i]
                sc = _softmax(np.concatenate([s_ctx, s_own], -1))
                p_ctx = sc[..., :S].transpose(0, 2, 1, 3, 4).reshape(B, self.kvh, R * rep, S)
                att = (p_ctx @ ctx.v[i]).reshape(B, self.kvh, R, rep, self.hd).transpose(0, 2, 1, 3, 4)
                att = att + sc[..., S:] @ dv[i][:, :, :, :i_d + 1]
                x = x + att.reshape(N, self.h * self.hd) @ Ly["wo"]
                xn = _rms(x, Ly["ffn_norm"], self.eps)
                y, (_, _, probs) = self.moe(i, xn, resident[:, i, :])
                if rout is not None:
                    top = np.argsort(-probs, axis=-1, kind="stable")[:, :self.k]
                    rout[:, :, i_d, i] = top.reshape(B, R, self.k)
                x = x + y
            logits = _rms(x, self.final_norm, self.eps) @ self.embed.T
            tok = np.argmax(logits, axis=-1)
            out[:, :, i_d] = tok.reshape(B, R)
        return (out, rout) if return_routing else out

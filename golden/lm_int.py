"""Integer-MoE mode of the golden MoE language model, and its decode loop
through the golden tile (Elastic-SD controller + integer MoE layers).

The host (this module, in NumPy) runs the embedding, attention, norms and
LM head of :class:`elmoe3d.golden.lm.MoEModel` in float; every MoE FFN layer
is the golden integer MoE layer (:mod:`elmoe3d.golden.moe_layer`) with the
model's own expert weights quantised to INT8:

* the FFN input ``x`` (float, after the FFN norm) is quantised per tensor,
  ``xq = clamp(round(x / s_x))`` with ``s_x`` = max-abs / 127 of the layer's
  inputs on calibration prompts;
* the router is INT8 per tensor (the integer ranking is the float ranking of
  the quantised router), gate / up / down INT8 per output row (the same INT8
  weights as the LM's ``full`` precision), every requantisation scale
  calibrated on the same prompts through the layer's float reference;
* the layer's INT8 output ``yq`` is de-quantised, ``y = yq * s_y``, and
  added to the residual stream.

So the tile receives INT8 token vectors and returns INT8 layer outputs, the
same values the RTL computes; everything else stays on the host.

Decoding (:func:`decode`) is greedy. In AR each round feeds one token per
request through the tile (phase AR). In Elastic-SD a round drafts ``K``
tokens per request with the tile in DRAFT (routing restricted to the
resident experts the controller reports, MSB planes with LSB augmentation),
then verifies the ``K + 1`` tokens per request in one VERIFY step (FULL) and
accepts the longest prefix the target agrees with; greedy verification is
exact, so SD and AR give the same tokens. The prompt is prefilled by the
host with the same integer MoE layers (not through the controller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import esd as gesd
from . import lm as glm
from . import moe_layer as gml
from ..config import preset

__all__ = ["CALIB_PROMPTS", "IntMoE", "calibrate_layer", "IntMoEModel", "GoldenTile", "ragged_forward",
           "decode", "DecodeResult", "perplexity", "calibration_inputs"]


#: Held-out prompts (64 bytes each) the activation scales are calibrated on.
CALIB_PROMPTS = 32


def calibrate_layer(router_f, wg_f, wu_f, wd_f, calib_x, *, top_k, slice_bits=4,
                    draft_keep=None) -> gml.MoELayer:
    """A golden integer :class:`~elmoe3d.golden.moe_layer.MoELayer` from float
    weights (``router (E, H)``, ``wg/wu (E, I, H)``, ``wd (E, H, I)``) and
    float calibration inputs ``calib_x (N, H)``: the scale rules of
    :func:`elmoe3d.golden.moe_layer.make_layer` (max-abs / 127 of every
    intermediate of the float reference), applied to given weights and real
    inputs instead of random ones."""
    E, I, H = wg_f.shape
    n = 8 // slice_bits
    draft_keep = max(1, n // 2) if draft_keep is None else draft_keep
    sr = float(np.abs(router_f).max()) / 127
    router = np.clip(np.round(router_f / sr), -127, 127).astype(np.int64)
    (wg, sg), (wu, su), (wd, sd) = (glm.quantize(w) for w in (wg_f, wu_f, wd_f))
    wg, wu, wd = (w.astype(np.int64) for w in (wg, wu, wd))
    sg, su, sd = (s.astype(np.float64) for s in (sg, su, sd))
    calib_x = np.asarray(calib_x, dtype=np.float64)
    s_x = float(np.abs(calib_x).max()) / 127
    z = np.zeros
    layer = gml.MoELayer(H, I, E, top_k, 0, slice_bits, draft_keep, router, wg, wu, wd,
                         *(z((E, I), np.int64) for _ in range(6)), z((E, H), np.int64),
                         z((E, H), np.int64), z(H, np.int64), z(H, np.int64), z(256, np.int64),
                         0, 1, scales={"x": s_x, "router": sr, "wg": sg, "wu": su, "wd": sd})
    mx = dict.fromkeys("guhdy", 0.0)
    xq = np.clip(np.round(calib_x / s_x), -128, 127) * s_x
    for xf in xq:
        y, inter = gml.float_forward(layer, xf, return_all=True)
        for key in "guhd":
            for v in inter[key]:
                mx[key] = max(mx[key], float(np.abs(v).max()))
        mx["y"] = max(mx["y"], float(np.abs(y).max()))
    s_g, s_u, s_h, s_d, s_y = (mx[c] / 127 for c in "guhdy")
    s_a = s_g
    layer.scales.update(g=s_g, u=s_u, a=s_a, h=s_h, d=s_d, y=s_y)
    ms = gml.to_mult_shift
    layer.gate_mult, layer.gate_shift = (a.reshape(E, I) for a in ms((s_x * sg / s_g).ravel()))
    layer.up_mult, layer.up_shift = (a.reshape(E, I) for a in ms((s_x * su / s_u).ravel()))
    layer.prod_mult, layer.prod_shift = (a.reshape(E, I) for a in
                                         ms(np.full(E * I, s_a * s_u / s_h)))
    layer.down_mult, layer.down_shift = (a.reshape(E, H) for a in ms((s_h * sd / s_d).ravel()))
    layer.out_mult, layer.out_shift = ms(np.full(H, s_d / (gml.GATE_ONE * s_y)))
    layer.lut = gml.silu_lut(s_g, s_a)
    m, s = ms(16 * math.log2(math.e) * s_x * sr)
    layer.sm_mult, layer.sm_shift = int(m[0]), int(s[0])
    return layer


class _Capture(glm.MoEModel):
    """The float model, recording every MoE layer's input."""

    def moe(self, layer, x, resident=None):
        self.seen.setdefault(layer, []).append(np.array(x))
        return super().moe(layer, x, resident)


def calibration_inputs(weights, meta, prompts) -> dict:
    """``{layer: (N, H)}`` FFN inputs of the float model on ``prompts``."""
    m = _Capture(weights, meta, "float")
    m.seen = {}
    with glm.single_thread_blas():
        m.forward(np.asarray(prompts))
    return {l: np.concatenate(v) for l, v in m.seen.items()}


@dataclass
class IntMoE:
    """The model's MoE layers as golden integer layers (one per LM layer)."""
    layers: list
    cfg: object = None

    @classmethod
    def from_model(cls, weights, meta, calib_prompts=None, cfg=None):
        """Quantise the model's MoE layers, calibrated on ``calib_prompts``
        (default: the first :data:`CALIB_PROMPTS` held-out prompts); slice
        width and draft planes from ``cfg`` (default the ``lm`` preset)."""
        cfg = cfg or preset("lm")
        if calib_prompts is None:
            calib_prompts = glm.heldout_prompts(CALIB_PROMPTS)
        slice_bits, draft_keep = cfg.slice_bits, cfg.hb_planes_eff
        xs = calibration_inputs(weights, meta, calib_prompts)
        k = meta["shape"]["top_k"]
        layers = [calibrate_layer(weights[f"l{i}.router"], weights[f"l{i}.w_gate"],
                                  weights[f"l{i}.w_up"], weights[f"l{i}.w_down"], xs[i],
                                  top_k=k, slice_bits=slice_bits, draft_keep=draft_keep)
                  for i in range(meta["shape"]["n_layers"])]
        return cls(layers, cfg)

    def quant(self, layer, x) -> np.ndarray:
        s = self.layers[layer].scales["x"]
        return np.clip(np.round(np.asarray(x, np.float64) / s), -128, 127).astype(np.int64)

    def dequant(self, layer, yq) -> np.ndarray:
        return (np.asarray(yq, np.float64) * self.layers[layer].scales["y"]).astype(np.float32)

    def logits(self, layer, xq) -> np.ndarray:
        return np.asarray(xq, np.int64) @ self.layers[layer].router.T

    def compute(self, layer, xq, precision, masks=None):
        """INT8 outputs ``(N, H)`` and selections of tokens ``xq (N, H)``
        (``masks``: per-token allowed experts in DRAFT)."""
        L = self.layers[layer]
        ys, sels = [], []
        for t, x in enumerate(np.asarray(xq, np.int64)):
            m = None if masks is None else masks[t]
            r = gml.forward(L, x, precision, m)
            ys.append(r.y)
            sels.append(list(r.sel))
        return np.stack(ys) if ys else np.zeros((0, L.hidden), np.int64), sels


class IntMoEModel(glm.MoEModel):
    """The LM with integer MoE layers (float dense weights): the golden
    integer-MoE mode. ``resident`` (DRAFT) restricts routing and computes
    the experts at draft precision."""

    def __init__(self, weights, meta, intmoe: IntMoE):
        super().__init__(weights, meta, "float")
        self.intmoe = intmoe

    def moe(self, layer, x, resident=None):
        xq = self.intmoe.quant(layer, x)
        if resident is None:
            y, sel = self.intmoe.compute(layer, xq, gml.Precision.FULL)
        else:
            y, sel = self.intmoe.compute(layer, xq, gml.Precision.DRAFT, list(resident))
        k = self.k
        experts = np.array([s + [0] * (k - len(s)) for s in sel], np.int16).reshape(-1, k)
        z = np.zeros((len(sel), k), np.float32)
        return self.intmoe.dequant(layer, y), (experts, z, np.zeros((len(sel), self.E),
                                                                   np.float32))


def perplexity(model, windows, batch=16) -> dict:
    """Cross-entropy (nats and bits per byte) and perplexity of ``model`` on
    ``windows (N, T+1)``."""
    tot, n = 0.0, 0
    with glm.single_thread_blas():
        for i in range(0, len(windows), batch):
            w = windows[i:i + batch]
            logits, _ = model.forward(w[:, :-1])
            tot += glm.cross_entropy(logits, w[:, 1:]) * w[:, 1:].size
            n += w[:, 1:].size
    ce = tot / n
    return dict(nats_per_byte=ce, bits_per_byte=ce / math.log(2), ppl=math.exp(ce))


# ---------------------------------------------------------------------------------------
# decoding through the golden tile


class GoldenTile:
    """The tile as the golden model sees it: the Elastic-SD controller
    (:class:`~elmoe3d.golden.esd.EsdController`) deciding routing
    eligibility, cache and sources, and the integer MoE layers computing the
    outputs (FULL for AR / VERIFY, DRAFT with the eligibility mask)."""

    def __init__(self, cfg, intmoe: IntMoE, **kw):
        self.cfg = cfg
        self.intmoe = intmoe
        self.ctl = gesd.EsdController(cfg, **kw)

    def layer(self, phase, step, layer, xq):
        im, k = self.intmoe, self.cfg.top_k
        logits = im.logits(layer, xq)

        def route(mask):
            m = None if mask is None else np.array([(mask >> e) & 1 for e in range(self.cfg.experts)],
                                                   bool)
            return [gml.route(lg, k, m) for lg in logits]

        while True:
            res = self.ctl.layer_step(phase, step, layer, route)
            if not res.error:
                break
        if phase == gesd.Phase.DRAFT:
            mb = np.array([(res.mask >> e) & 1 for e in range(self.cfg.experts)], bool)
            y, sel = im.compute(layer, xq, gml.Precision.DRAFT, [mb] * len(xq))
        else:
            y, sel = im.compute(layer, xq, gml.Precision.FULL)
        if sel != res.selections:
            raise AssertionError("controller and datapath disagree on routing")
        return y


def ragged_forward(model: glm.MoEModel, tokens, caches, moe_fn):
    """One forward of several requests with their own KV caches (lengths may
    differ), every MoE layer computed for all requests at once by
    ``moe_fn(layer, x (N, d)) -> y (N, d)`` (rows request-major). Returns the
    logits per request ``[(T_b, V)]``. The attention is
    :meth:`MoEModel.forward`'s, per request (a test checks the two agree)."""
    eps = model.eps
    rms = glm._rms
    xs = [model.embed[np.asarray(t)][None] for t in tokens]
    starts = [c.length for c in caches]
    rep = model.h // model.kvh
    for i, Ly in enumerate(model.layers):
        xns = []
        for b, c in enumerate(caches):
            x, start = xs[b], starts[b]
            T = x.shape[1]
            pos = np.arange(start, start + T)
            q, k, v = model._qkv(i, rms(x, Ly["attn_norm"], eps), pos)
            c.k[i][:, :, start:start + T] = k
            c.v[i][:, :, start:start + T] = v
            k, v = c.k[i][:, :, :start + T], c.v[i][:, :, :start + T]
            S = k.shape[2]
            qg = q.reshape(1, model.kvh, rep * T, model.hd)
            sc = (qg @ k.transpose(0, 1, 3, 2)).reshape(1, model.kvh, rep, T, S)
            sc = sc * np.float32(1.0 / np.sqrt(model.hd))
            sc = np.where(np.arange(S)[None, :] > pos[:, None], np.float32(-np.inf), sc)
            att = glm._softmax(sc).reshape(1, model.kvh, rep * T, S) @ v
            att = att.reshape(1, model.h, T, model.hd).transpose(0, 2, 1, 3).reshape(1, T, -1)
            xs[b] = x + att @ Ly["wo"]
            xns.append(rms(xs[b], Ly["ffn_norm"], eps).reshape(T, model.d))
        y = moe_fn(i, np.concatenate(xns))
        o = 0
        for b in range(len(caches)):
            T = xs[b].shape[1]
            xs[b] = xs[b] + y[o:o + T].reshape(1, T, model.d)
            o += T
    for b, c in enumerate(caches):
        c.length = starts[b] + xs[b].shape[1]
    return [(rms(x, model.final_norm, eps) @ model.embed.T)[0] for x in xs]


@dataclass
class DecodeResult:
    tokens: list                      # per request: the generated token ids
    events: list
    counters: dict
    rounds: list                      # per round: (mode, K, accepted per request)


def decode(weights, meta, intmoe: IntMoE, prompts, n_tokens: int, *, mode="auto", cfg=None,
           tile=None, progress=None) -> DecodeResult:
    """Greedy decode of ``n_tokens`` after each prompt (``prompts``: list of
    1-D token arrays, one request each) with the MoE layers on ``tile``
    (default: a :class:`GoldenTile` of the ``lm`` preset).

    ``mode``: ``"ar"`` / ``"sd"`` asks the controller for AR / Elastic-SD in
    every round (ROUND's force field; the KV back-off still applies),
    ``"auto"`` leaves the decision to its batch threshold. ``progress(done, total)``
    is called after every round (``done``: tokens of the slowest request).
    """
    if mode not in ("ar", "sd", "auto"):
        raise ValueError(f"Decode mode must be ar, sd or auto, not {mode!r}")
    B = len(prompts)
    cfg = cfg or preset("lm")
    force = {"ar": gesd.Mode.AR, "sd": gesd.Mode.SD, "auto": None}[mode]
    tile = tile or GoldenTile(cfg, intmoe)
    ctl = getattr(tile, "ctl", None)
    model = IntMoEModel(weights, meta, intmoe)
    # KV cache per request: the requests of a batch drift apart. A round adds
    # one token to every request and up to K + 1 (every draft accepted) to
    # some; the decode runs until the slowest has n_tokens, which takes at
    # most n_tokens - 1 rounds, so a request may end up to K * (n_tokens - 1)
    # tokens ahead; a verify step feeds K + 1 more before the rollback.
    K = cfg.draft_len_max
    cap = max(len(p) for p in prompts) + (n_tokens - 1) * (K + 1) + K + 2
    caches = [model.new_cache(1, cap) for _ in range(B)]
    out = [[] for _ in range(B)]
    rounds = []
    with glm.single_thread_blas():
        # prefill on the host (integer MoE, not through the controller)
        last = []
        for b, p in enumerate(prompts):
            lg, _ = model.forward(np.asarray(p)[None], caches[b])
            last.append(int(np.argmax(lg[0, -1])))
        for b in range(B):
            out[b].append(last[b])

        def moe_fn(phase, step):
            def f(layer, x):
                xq = intmoe.quant(layer, x)
                return intmoe.dequant(layer, tile.layer(phase, step, layer, xq))
            return f

        while min(len(o) for o in out) < n_tokens:
            tile.context(sum(c.length for c in caches))
            m, K = tile.begin_round(B, force)
            if m == gesd.Mode.AR:
                lgs = ragged_forward(model, [[t] for t in last], caches, moe_fn(gesd.Phase.AR, 0))
                last = [int(np.argmax(lg[-1])) for lg in lgs]
                for b in range(B):
                    out[b].append(last[b])
                rounds.append((int(m), 0, None))
                if progress:
                    progress(min(len(o) for o in out), n_tokens)
                continue
            L0 = [c.length for c in caches]
            drafts = [[] for _ in range(B)]
            cur = list(last)
            for j in range(K):
                lgs = ragged_forward(model, [[t] for t in cur], caches,
                                     moe_fn(gesd.Phase.DRAFT, j))
                cur = [int(np.argmax(lg[-1])) for lg in lgs]
                for b in range(B):
                    drafts[b].append(cur[b])
            for b, c in enumerate(caches):
                c.length = L0[b]
            feed = [[last[b]] + drafts[b] for b in range(B)]
            lgs = ragged_forward(model, feed, caches, moe_fn(gesd.Phase.VERIFY, 0))
            acc = []
            for b in range(B):
                tgt = [int(t) for t in np.argmax(lgs[b], axis=-1)]          # K + 1 targets
                a = 0
                while a < K and drafts[b][a] == tgt[a]:
                    a += 1
                acc.append(a)
                out[b].extend(drafts[b][:a] + [tgt[a]])
                caches[b].length = L0[b] + a + 1
                last[b] = tgt[a]
            tile.accept(sum(acc))
            rounds.append((int(m), K, acc))
            if progress:
                progress(min(len(o) for o in out), n_tokens)
    events = list(ctl.events) if ctl is not None else []
    counters = dict(ctl.counters) if ctl is not None else {}
    return DecodeResult([o[:n_tokens] for o in out], events, counters, rounds)


# the GoldenTile's host commands (the same as the RTL tile's host stream)
GoldenTile.begin_round = lambda self, batch, force=None: self.ctl.begin_round(batch, force)
GoldenTile.accept = lambda self, n: self.ctl.accept(n)
GoldenTile.context = lambda self, tokens: self.ctl.context(tokens)

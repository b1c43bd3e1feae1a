"""cocotb testbench: the MoE layer datapath against the golden integer MoE
layer (:mod:`elmoe3d.golden.moe_layer`), bit for bit (outputs) and event for
event (weight requests = experts used, in order).

The testbench plays the weight source: every request seen on ``req`` is
answered with the beats :mod:`elmoe3d.hw.moe_layer` defines, sliced from the
golden layer's INT8 weights, queued on ``w`` in request order. One
coroutine drives and samples all four streams each cycle (the simulation is
Python-bound; one coroutine is several times faster than one per stream)
and checks the stream rules on the DUT's outputs.

Parameters come from ``$ELMOE_PARAMS`` (the elaboration parameters of
:class:`elmoe3d.hw.moe_layer.MoELayer`). Knobs: ``ELMOE_MOE_TOKENS`` (tokens
per mode in each random test, default 40), ``ELMOE_MOE_THROUGHPUT_TOKENS``
(per mode, default 6), ``ELMOE_MEASURE_OUT`` (JSON for the cycle figures),
``ELMOE_GOLDEN_MUTATION``.
"""

from __future__ import annotations

import collections
import enum
import json
import os
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge

from ..golden import bitslice as gbs
from ..golden import moe_layer as gm
from ..hw.moe_layer import (ReqKind, config_layout, output_layout, request_layout, token_layout,
                            weight_layout)
from .common import golden_mutation, knob, pack, params, rng, start_clock_and_reset, unpack


def _field_offsets(layout):
    return {name: f.offset for name, f in layout}


def _pack_rows(vals: np.ndarray, bits: int) -> list[int]:
    """Each row of unsigned ``vals`` (``bits`` each, element 0 lowest) -> int."""
    vals = np.asarray(vals, dtype=np.int64)
    b = ((vals[..., None] >> np.arange(bits)) & 1).astype(np.uint8)
    b = b.reshape(vals.shape[0], -1)
    packed = np.packbits(b, axis=1, bitorder="little")
    return [int.from_bytes(r.tobytes(), "little") for r in packed]


class MoETB:
    """Clock, reset, weight server, token driver, output monitor, scoreboard."""

    def __init__(self, dut, *, stress=False, w_idle=0.0, o_bp=0.0, req_bp=0.0, tok_idle=0.0):
        self.dut = dut
        self.p = params()
        p = self.p
        self.H, self.I, self.E, self.k = p["hidden"], p["ffn"], p["experts"], p["top_k"]
        self.S, self.P, self.L, self.s = p["shared"], p["pes"], p["lanes"], p["slice_bits"]
        self.n = gbs.n_planes(self.s)
        self.keep = p.get("draft_keep") or max(1, self.n // 2)
        self.rand = rng()
        self.np_rng = np.random.default_rng(self.rand.getrandbits(32))
        self.layer = gm.make_layer(self.np_rng, hidden=self.H, ffn=self.I, experts=self.E,
                                   top_k=self.k, shared=self.S, slice_bits=self.s,
                                   draft_keep=self.keep, stress=stress, calib_tokens=64)
        self.w_idle, self.o_bp, self.req_bp, self.tok_idle = w_idle, o_bp, req_bp, tok_idle
        self.wl = weight_layout(self.P, self.L, self.s)
        self.woff = _field_offsets(self.wl)
        self.req_layout = request_layout(self.E, self.S)
        self.tok_layout = token_layout(self.H, self.E)
        self.out_layout = output_layout(self.H)
        self.mutate = golden_mutation()
        self.beat_cache = {}
        self.w_queue = collections.deque()
        self.tok_queue = collections.deque()
        self.tokens = []                    # (x, mode, mask, golden Result)
        self.requests = []                  # (cycle, payload dict)
        self.outputs = []                   # (cycle, y list)
        self.tok_cycles = []                # accept cycle per token
        self.errors = []
        self.cycle = 0
        self.w_busy_cycles = 0

    # -- weight beats --------------------------------------------------------------------
    def _proj_beats(self, w, planes, mult, shift, mult2, shift2) -> list[int]:
        R, C = w.shape
        P, L, s = self.P, self.L, self.s
        G, Cc, nq = R // P, C // L, len(planes)
        sl = gbs.split(w, s) & ((1 << s) - 1)                       # (n, R, C)
        sl = sl[list(planes)].reshape(nq, G, P, Cc, L).transpose(1, 0, 3, 2, 4)
        sl_int = _pack_rows(sl.reshape(G * nq * Cc, P * L), s)
        o = self.woff

        def grp(v, bits):
            return _pack_rows(np.asarray(v).reshape(G, P), bits)
        mi, si, m2, s2 = (grp(mult, gm.MULT_BITS), grp(shift, gm.SHIFT_BITS),
                          grp(mult2, gm.MULT_BITS), grp(shift2, gm.SHIFT_BITS))
        beats = []
        b = 0
        for gi in range(G):
            extra = ((mi[gi] << o["mult"]) | (si[gi] << o["shift"]) | (m2[gi] << o["mult2"])
                     | (s2[gi] << o["shift2"]))
            for q in planes:
                for _ in range(Cc):
                    beats.append((sl_int[b] << o["slices"]) | (q << o["plane"]) | extra)
                    b += 1
        return beats

    def beats_for(self, req) -> list[int]:
        kind, shared, e, mode = req["kind"], req["shared"], req["expert"], req["mode"]
        key = (int(kind), shared, e, int(mode))
        if key in self.beat_cache:
            return self.beat_cache[key]
        L_ = self.layer
        z = np.zeros
        if int(kind) == ReqKind.ROUTER.value:
            beats = self._proj_beats(L_.router, range(self.n), z(self.E), z(self.E), z(self.E),
                                     z(self.E))
        else:
            j = self.E + e if shared else e
            planes = range(self.n) if int(mode) == gm.Precision.FULL else range(self.keep)
            beats = (self._proj_beats(L_.wg[j], planes, L_.gate_mult[j], L_.gate_shift[j],
                                      z(self.I), z(self.I))
                     + self._proj_beats(L_.wu[j], planes, L_.up_mult[j], L_.up_shift[j],
                                        L_.prod_mult[j], L_.prod_shift[j])
                     + self._proj_beats(L_.wd[j], planes, L_.down_mult[j], L_.down_shift[j],
                                        L_.out_mult, L_.out_shift))
        self.beat_cache[key] = beats
        return beats

    # -- tokens ------------------------------------------------------------------------------
    def add_token(self, x, mode, mask):
        res = gm.forward(self.layer, x, mode, mask)
        self.tokens.append((x, mode, mask, res))
        self.tok_queue.append(pack(self.tok_layout, {
            "x": [int(v) for v in x], "mode": int(mode),
            "mask": int(sum(1 << e for e in range(self.E) if mask[e]))}))

    async def start(self):
        d = self.dut
        lay = self.layer
        d.cfg.value = pack(config_layout(), {"lut": [int(v) for v in lay.lut],
                                             "sm_mult": lay.sm_mult, "sm_shift": lay.sm_shift})
        d.tok__valid.value = 0
        d.tok__payload.value = 0                # no X from idle inputs (Icarus)
        d.w__valid.value = 0
        d.w__payload.value = 0
        d.req__ready.value = 0
        d.o__ready.value = 0
        await start_clock_and_reset(d)
        cocotb.start_soon(self._run())

    def _chance(self, p):
        return p > 0 and self.rand.random() < p

    async def _run(self):
        d = self.dut
        w_item = tok_item = None
        w_fired = tok_fired = False
        pend = {"req": None, "o": None}
        while True:
            await RisingEdge(d.clk)
            self.cycle += 1
            if w_fired:
                w_item = None
            if tok_fired:
                tok_item = None
            if w_item is None and self.w_queue and not self._chance(self.w_idle):
                w_item = self.w_queue.popleft()
                d.w__payload.value = w_item
            d.w__valid.value = w_item is not None
            if tok_item is None and self.tok_queue and not self._chance(self.tok_idle):
                tok_item = self.tok_queue.popleft()
                d.tok__payload.value = tok_item
            d.tok__valid.value = tok_item is not None
            req_rdy = not self._chance(self.req_bp)
            o_rdy = not self._chance(self.o_bp)
            d.req__ready.value = req_rdy
            d.o__ready.value = o_rdy
            await ReadOnly()
            w_fired = w_item is not None and bool(d.w__ready.value)
            if w_fired:
                self.w_busy_cycles += 1
            tok_fired = tok_item is not None and bool(d.tok__ready.value)
            if tok_fired:
                self.tok_cycles.append(self.cycle)
            for name, rdy, layout in (("req", req_rdy, self.req_layout),
                                      ("o", o_rdy, self.out_layout)):
                valid = bool(getattr(d, f"{name}__valid").value)
                raw = getattr(d, f"{name}__payload").value.to_unsigned() if valid else None
                if pend[name] is not None and (not valid or raw != pend[name]):
                    self.errors.append(f"{name}: valid dropped or payload changed before ready "
                                       f"at cycle {self.cycle}")
                if valid and rdy:
                    pl = {key: (v.value if isinstance(v, enum.Enum) else v)
                          for key, v in unpack(layout, raw).items()}
                    if name == "req":
                        self.requests.append((self.cycle, pl))
                        self.w_queue.extend(self.beats_for(pl))
                    else:
                        self.outputs.append((self.cycle, pl["y"]))
                    pend[name] = None
                else:
                    pend[name] = raw if valid else None

    # -- checking ----------------------------------------------------------------------------
    async def drain(self):
        # generous: 20x the FULL analytic count per token, plus stalls
        per_token = 20 * gm.analytic_cycles(
            hidden=self.H, ffn=self.I, experts=self.E, top_k=self.k, shared=self.S,
            slice_bits=self.s, draft_keep=self.keep, pes=self.P, lanes=self.L) + 500
        last_progress, done = self.cycle, len(self.outputs)
        while len(self.outputs) < len(self.tokens):
            await RisingEdge(self.dut.clk)
            if len(self.outputs) != done:
                last_progress, done = self.cycle, len(self.outputs)
            if self.cycle - last_progress > per_token:
                raise AssertionError(
                    f"timeout: {len(self.outputs)} of {len(self.tokens)} outputs, "
                    f"{len(self.requests)} requests, {len(self.w_queue)} beats queued "
                    f"(seed {cocotb.RANDOM_SEED})")
        for _ in range(20):
            await RisingEdge(self.dut.clk)

    def expected_requests(self):
        out = []
        for x, mode, mask, res in self.tokens:
            out.append((ReqKind.ROUTER.value, 0, 0, int(gm.Precision.FULL)))
            out += [(ReqKind.EXPERT.value, 1, s, int(mode)) for s in range(self.S)]
            out += [(ReqKind.EXPERT.value, 0, e, int(mode)) for e in res.sel]
        return out

    def check(self):
        errors = list(self.errors)
        if len(self.outputs) != len(self.tokens):
            errors.append(f"{len(self.outputs)} outputs for {len(self.tokens)} tokens")
        for i, ((_, y), (x, mode, mask, res)) in enumerate(zip(self.outputs, self.tokens)):
            exp = [int(v) ^ 1 if self.mutate else int(v) for v in res.y]
            if list(y) != exp:
                bad = [h for h in range(self.H) if y[h] != exp[h]]
                errors.append(f"token {i} ({'DRAFT' if mode else 'FULL'}): {len(bad)} outputs "
                              f"differ, first y[{bad[0]}]={y[bad[0]]} expected {exp[bad[0]]}")
        got = [(int(r["kind"]), r["shared"], r["expert"], int(r["mode"])) for _, r in self.requests]
        exp = self.expected_requests()
        if got != exp:
            first = next((i for i, (a, b) in enumerate(zip(got, exp)) if a != b),
                         min(len(got), len(exp)))
            errors.append(f"weight requests differ from the golden routing at request {first} "
                          f"of {len(exp)}: got {got[first:first + 3]} expected {exp[first:first + 3]}")
        if self.w_queue:
            errors.append(f"{len(self.w_queue)} weight beats left unconsumed")
        if int(self.dut.error.value):
            errors.append("the DUT raised its sticky PE error flag")
        if errors:
            raise AssertionError(f"{len(errors)} mismatches (seed {cocotb.RANDOM_SEED}); first: "
                                 + "; ".join(errors[:5]))

    def draft_mask_violations(self):
        return mask_violations([r for _, r in self.requests],
                               [(mode, mask) for _, mode, mask, _ in self.tokens])


def mask_violations(requests, tokens):
    """Routed experts requested for a DRAFT token outside its allowed mask,
    as ``(token, expert)``; independent of the golden model (the routing
    property itself). ``requests`` are request payload dicts in order (each
    token's begin with its ROUTER request), ``tokens`` ``(mode, mask)``."""
    viol = []
    t = -1
    for r in requests:
        if r["kind"] == ReqKind.ROUTER.value:
            t += 1
            continue
        mode, mask = tokens[t]
        if mode == gm.Precision.DRAFT and not r["shared"] and not mask[r["expert"]]:
            viol.append((t, r["expert"]))
    return viol


def _random_run(tb, count):
    """Queue ``count`` FULL and ``count`` DRAFT tokens in random order."""
    modes = [gm.Precision.FULL] * count + [gm.Precision.DRAFT] * count
    tb.rand.shuffle(modes)
    for mode in modes:
        x = gm.random_tokens(tb.np_rng, tb.layer, 1)[0]
        if tb.rand.random() < 0.05:
            x[:] = tb.rand.choice((-128, 127))
        mask = gm.random_mask(tb.np_rng, tb.E)
        tb.add_token(x, mode, mask)


async def _random_test(dut, stress):
    tb = MoETB(dut, stress=stress, w_idle=0.25, o_bp=0.3, req_bp=0.3, tok_idle=0.3)
    await tb.start()
    _random_run(tb, knob("moe_tokens", 40))
    await tb.drain()
    tb.check()
    viol = tb.draft_mask_violations()
    assert not viol, f"DRAFT used experts outside the allowed mask: {viol[:5]}"
    nd = sum(1 for t in tb.tokens if t[1] == gm.Precision.DRAFT)
    sat = sum(int(np.sum(np.abs(t[3].y) >= 127)) for t in tb.tokens)
    dut._log.info("%s: %d tokens (%d FULL, %d DRAFT) bit-exact, %d requests, %d saturated outputs",
                  "stress" if stress else "random", len(tb.tokens), len(tb.tokens) - nd, nd,
                  len(tb.requests), sat)


@cocotb.test()
async def random_tokens(dut):
    """Random calibrated layer, random tokens in FULL and DRAFT with random
    allowed masks (including fewer than k and none), random stalls on all
    streams; outputs and weight requests against the golden layer."""
    await _random_test(dut, stress=False)


@cocotb.test()
async def stress_tokens(dut):
    """As random_tokens with requantisation multipliers scaled up to 4x, so
    that every requantiser saturates often."""
    await _random_test(dut, stress=True)


@cocotb.test()
async def draft_mask(dut):
    """DRAFT tokens only, with masks of few (often fewer than k) or no allowed
    experts: no routed expert outside a token's mask is ever requested, and
    outputs stay bit-exact."""
    tb = MoETB(dut, w_idle=0.1, o_bp=0.1)
    await tb.start()
    rng = tb.np_rng
    for x in gm.random_tokens(rng, tb.layer, knob("moe_tokens", 40)):
        mask = np.zeros(tb.E, dtype=bool)
        if tb.rand.random() > 0.1:
            mask[rng.choice(tb.E, size=int(rng.integers(1, tb.k + 2)), replace=False)] = True
        tb.add_token(x, gm.Precision.DRAFT, mask)
    await tb.drain()
    tb.check()
    viol = tb.draft_mask_violations()
    assert not viol, f"DRAFT used experts outside the allowed mask: {viol[:5]}"
    routed = sum(1 for _, r in tb.requests if r["kind"] == ReqKind.EXPERT.value and not r["shared"])
    dut._log.info("draft_mask: %d DRAFT tokens, %d routed expert requests, all allowed",
                  len(tb.tokens), routed)


@cocotb.test()
async def throughput(dut):
    """No stalls: cycles per token in FULL and DRAFT (all experts allowed)
    against the analytic count; the figures go to ``$ELMOE_MEASURE_OUT``."""
    tb = MoETB(dut)
    await tb.start()
    count = knob("moe_throughput_tokens", 6)
    figures = {}
    for name, mode in (("FULL", gm.Precision.FULL), ("DRAFT", gm.Precision.DRAFT)):
        first = len(tb.tokens)
        for x in gm.random_tokens(tb.np_rng, tb.layer, count):
            tb.add_token(x, mode, np.ones(tb.E, dtype=bool))
        await tb.drain()
        outs = [c for c, _ in tb.outputs[first:]]
        per_token = (outs[-1] - outs[0]) / (len(outs) - 1)
        analytic = gm.analytic_cycles(hidden=tb.H, ffn=tb.I, experts=tb.E, top_k=tb.k,
                                      shared=tb.S, slice_bits=tb.s, draft_keep=tb.keep,
                                      pes=tb.P, lanes=tb.L, precision=mode)
        figures[name] = {"tokens": count, "cycles_per_token": per_token,
                         "analytic_cycles_per_token": analytic,
                         "efficiency": analytic / per_token,
                         "overhead_cycles": per_token - analytic}
    tb.check()
    figures["DRAFT_over_FULL"] = (figures["DRAFT"]["cycles_per_token"]
                                  / figures["FULL"]["cycles_per_token"])
    dut._log.info("throughput: %s", figures)
    out = os.environ.get("ELMOE_MEASURE_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"params": tb.p, "figures": figures}, indent=2))

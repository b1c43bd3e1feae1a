"""cocotb testbench of the PE family: ``pe`` and ``pe_plain`` (bit-slice),
``mac_int8`` and ``bitfusion``, against their golden models, bit for bit
and result for result.

The scoreboard states the contract, it does not replay the RTL: for every
beat sequence the testbench sends, well formed or not, the golden model
(:func:`elmoe3d.golden.bitslice.pe_result`, ``mac_result``,
:func:`elmoe3d.golden.bitfusion.result`) says what the one result of that
sequence must be (its value, or ``error``), and the RTL must give exactly one
result per ``last`` beat, in order, nothing more. How the stimulus was made
(which rule it meant to break) only steers the generator and the coverage.

Parameters come from the harness (``$ELMOE_PARAMS``): the block's
elaboration parameters plus ``kind`` (``"bitslice"``, ``"int8"`` or
``"bitfusion"``). Knobs: ``ELMOE_PE_DOTS`` (random dot products in
``random_vectors``, default 10000), ``ELMOE_MEASURE_OUT`` (JSON file for the
throughput figures), ``ELMOE_GOLDEN_MUTATION`` (flip bit 0 of every golden
value: the comparison must then fail).

Functional coverage (``cocotb-coverage``, written to
``build/coverage/<block>.json``): mode, keep, the golden rule's verdict
(every :class:`~elmoe3d.golden.bitslice.SeqError`), chunk count (1 .. the
limit and one past it), extreme operands, and the flow seen by each dot
product (input idle, input stalled by full result slots, result held by
back-pressure), and crosses of these.
"""

from __future__ import annotations

import collections
import json
import math
import operator
import os
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from ..blocks import get_block
from ..golden import bitfusion as gbf
from ..golden import bitslice as gbs
from ..golden.bitslice import Mode, SeqError
from ..hw import vocab as hv
from .common import (CycleLoop, Scoreboard, Sink, Source, golden_mutation, knob, pack, params,
                     rng, start_clock_and_reset)
from .coverage import write_coverage
from .kit import IdleBackpressure, per_cycle

CORNERS = (-128, 127, 0, -1, 1, -127)


def block_of(p: dict) -> str:
    """Registry name of the block these parameters build."""
    kind = p.get("kind", "bitslice")
    if kind == "bitslice":
        return "pe" if p.get("augment", True) else "pe_plain"
    return {"int8": "mac_int8", "bitfusion": "bitfusion"}[kind]


# -- a fast packer (the generic tb.common.pack walks the layout for every beat) -------------

def compile_pack(layout):
    """A function packing Python values into an integer for ``layout`` (a
    ``data.Struct`` class, a layout or a shape), equal to
    :func:`elmoe3d.tb.common.pack` but with the layout walked once. Values
    are masked to their field width, not range-checked: the generators below
    only make values in range (``pack`` checks the first beat of each run)."""
    from amaranth.hdl import Shape
    from amaranth.lib import data
    from amaranth.lib import enum as aenum
    if isinstance(layout, type) and issubclass(layout, data.View):
        layout = data.Layout.cast(layout)
    if isinstance(layout, data.ArrayLayout):
        elem = layout.elem_shape
        if isinstance(elem, type) and issubclass(elem, aenum.Enum):
            elem = Shape.cast(elem)
        if isinstance(elem, Shape):
            w, mask = elem.width, (1 << elem.width) - 1
            if w == 8:
                return lambda v: int.from_bytes(
                    bytes([x & 0xFF for x in (v.tolist() if hasattr(v, "tolist") else v)]),
                    "little")

            def pack_array(v):
                out, sh = 0, 0
                for x in (v.tolist() if hasattr(v, "tolist") else v):
                    out |= (x & mask) << sh
                    sh += w
                return out
            return pack_array
        sub, w = compile_pack(elem), data.Layout.cast(elem).size
        return lambda v: sum(sub(x) << (w * i) for i, x in enumerate(v))
    if isinstance(layout, data.StructLayout):
        fields = [(name, f.offset, compile_pack(f.shape)) for name, f in layout]
        return lambda d: sum(fn(d[name]) << off for name, off, fn in fields)
    mask = (1 << Shape.cast(layout).width) - 1
    return lambda v: int(v) & mask


# -- idle and back-pressure patterns, the input stream with its flow ---------------------------

class Pattern:
    """A per-cycle on/off generator (idle on a source, back-pressure on a
    sink) that moves between phases: off, random at a rate, long bursts on,
    and a fixed cycle, so that short and long stalls both occur."""

    def __init__(self, rand, rates=(0.0, 0.3), burst=0.0, phase_cycles=(200, 800)):
        self.rand, self.rates, self.burst = rand, rates, burst
        self.phase_cycles = phase_cycles
        self.left, self.mode, self.run = 0, ("rate", 0.0), 0

    def __call__(self) -> bool:
        r = self.rand
        if self.left <= 0:
            self.left = r.randint(*self.phase_cycles)
            if self.burst and r.random() < self.burst:
                self.mode = ("burst", r.randint(20, 80))
            elif r.random() < 0.15:
                self.mode = ("cycle", r.randint(2, 4))
            else:
                self.mode = ("rate", r.choice(self.rates))
        self.left -= 1
        kind, arg = self.mode
        if kind == "rate":
            return arg > 0 and r.random() < arg
        if kind == "cycle":
            self.run += 1
            return self.run % arg == 0
        # burst: on for `arg` cycles, then off for as long
        self.run += 1
        return (self.run // arg) % 2 == 0


class BeatSource(Source):
    """The kit's :class:`~elmoe3d.tb.kit.Source` on ``i`` that also notes the
    flow each dot product saw (the coverage's ``flow``): items are ``(packed
    beat, dot index, is_last)`` (the payload is the packed beat); a dot
    product gets ``"stall"`` when one of its beats waits for ``ready`` and
    ``"idle"`` when an idle cycle is drawn between two of its beats.

    Parameters
    ----------
    dut
        The DUT.
    rand : random.Random
        Drawn from for idle cycles when ``idle`` is a probability.
    idle : float or callable
        As for :class:`~elmoe3d.tb.kit.Source` (e.g. a :class:`Pattern`).

    Attributes
    ----------
    flags : collections.defaultdict
        Dot index -> the subset of ``{"idle", "stall"}`` it saw.
    """

    def __init__(self, dut, rand, idle=0.0):
        super().__init__(dut, "i", None, rand, idle, encode=operator.itemgetter(0))
        self.flags = collections.defaultdict(set)
        self.mid = False                    # the last beat taken was not its dot's last

    def sample(self):
        """The kit's sample, then this cycle's flow: a stall of the held
        beat, or (nothing held though beats are queued) an idle cycle drawn."""
        super().sample()
        item = self.item
        if self.fired:
            self.mid = not item[2]
        elif item is not None:
            self.flags[item[1]].add("stall")
        elif self.queue and self.mid:
            self.flags[self.queue[0][1]].add("idle")


# -- coverage ---------------------------------------------------------------------------------

_COVER = {}


def chunk_bins(limits) -> list[str]:
    """Chunk-count bins: ``1``, ``2-3``, ``mid`` (4 .. limit-1), ``max``, ``over``
    (limit + 1 and more); bins that no limit in ``limits`` can reach are left out."""
    bins = ["1"]
    if any(x > 2 for x in limits):
        bins.append("2-3")
    if any(x > 4 for x in limits):
        bins.append("mid")
    if any(x > 1 for x in limits):
        bins.append("max")
    return bins + ["over"]


def chunk_bin(c: int, limit: int) -> str:
    if c > limit:
        return "over"
    if c == limit:
        return "max" if limit > 1 else "1"
    if c == 1:
        return "1"
    return "2-3" if c <= 3 else "mid"


CORNER_BINS = ["min*min", "min*max", "max*min", "max*max", "zero"]
FLOW_BINS = ["none", "idle", "stall", "wait"]


def coverage_sampler(block: str, kind: str, n: int, limits):
    """One sampling function per block: coverpoints and crosses under ``block.``."""
    if block in _COVER:
        return _COVER[block]
    from cocotb_coverage.coverage import CoverCross, CoverPoint
    if kind == "bitslice":
        modes = [m.name for m in Mode]
        keeps = list(range(1, n + 1))
        reasons = [r.name for r in SeqError]
        multi = n > 2                       # a partial mode can span two or more planes
        ign_reason = [("FULL", "BAD_KEEP")]
        if not multi:
            ign_reason += [(m, r) for m in ("DRAFT", "MSB", "LSB")
                           for r in ("CHUNK_MISMATCH", "MISSING_PLANE")]
        ign_keep = [("FULL", k) for k in keeps[:-1]] + [(m, n) for m in ("DRAFT", "MSB", "LSB")]
    elif kind == "int8":
        modes, keeps, reasons = ["INT8"], None, ["OK", "TOO_LONG"]
        ign_reason, ign_keep = [], []
    else:
        modes, keeps, reasons = ["W8", "W4"], None, ["OK", "MODE_CHANGE", "TOO_LONG"]
        ign_reason, ign_keep = [], []
    p = f"{block}."
    points = [CoverPoint(p + "mode", xf=lambda d: d["mode"], bins=modes),
              CoverPoint(p + "reason", xf=lambda d: d["reason"], bins=reasons),
              CoverPoint(p + "chunks", xf=lambda d: d["chunks"], bins=chunk_bins(limits)),
              CoverPoint(p + "corner", xf=lambda d: d["corners"], bins=CORNER_BINS,
                         rel=lambda val, b: b in val),
              CoverPoint(p + "flow", xf=lambda d: d["flow"], bins=FLOW_BINS,
                         rel=lambda val, b: b in val)]
    if keeps:
        points.append(CoverPoint(p + "keep", xf=lambda d: d["keep"], bins=keeps))
    crosses = [CoverCross(p + "modeXreason", items=[p + "mode", p + "reason"],
                          ign_bins=ign_reason),
               CoverCross(p + "modeXchunks", items=[p + "mode", p + "chunks"]),
               CoverCross(p + "modeXcorner", items=[p + "mode", p + "corner"]),
               CoverCross(p + "modeXflow", items=[p + "mode", p + "flow"]),
               CoverCross(p + "reasonXflow", items=[p + "reason", p + "flow"])]
    if keeps:
        crosses.append(CoverCross(p + "modeXkeep", items=[p + "mode", p + "keep"],
                                  ign_bins=ign_keep))

    def sample(d):
        pass

    f = sample
    for item in crosses + points:
        f = item(f)
    _COVER[block] = f
    return f


# -- the testbench ----------------------------------------------------------------------------

class PETB(IdleBackpressure):
    """One PE-family block on the testbench kit (:mod:`elmoe3d.tb.kit`).

    :meth:`start` starts the clock, resets, and runs from then on, in one
    :class:`~elmoe3d.tb.kit.CycleLoop`, the beats on ``i``
    (:class:`BeatSource`) and the results on ``o`` (a
    :class:`~elmoe3d.tb.kit.Sink`: its stream-rule check). :meth:`queue`
    puts a dot product's beats on ``i`` and its golden result on the
    :class:`~elmoe3d.tb.kit.Scoreboard`, which checks the results in order
    as they arrive; :meth:`drain` waits for them, :meth:`check` fails on a
    wrong, extra or missing one. Idle cycles on ``i`` and back-pressure on
    ``o``: ``set_idle_generator``, ``set_backpressure_generator``
    (:class:`~elmoe3d.tb.kit.IdleBackpressure`; default none).

    Parameters
    ----------
    dut
        The cocotb handle of the PE-family block.

    Attributes
    ----------
    src : BeatSource
        Its ``sent`` holds ``(cycle, (packed beat, dot index, is_last))``
        per beat, ``stalls`` the cycles a beat waited for ``ready``.
    sink : elmoe3d.tb.kit.Sink
    loop : elmoe3d.tb.kit.CycleLoop
        Its ``cycle`` counts from the end of reset.
    scoreboard : elmoe3d.tb.kit.Scoreboard
        The golden ``(value or None, error, features)`` not yet matched.
    expected : list
        ``(value or None, error, features)`` of every dot product queued.
    received : list
        ``(cycle, payload, waited)`` per result (``waited``: offered at
        least once without ``ready``).
    """

    def __init__(self, dut):
        self.dut = dut
        self.p = params()
        self.kind = self.p.get("kind", "bitslice")
        self.block = block_of(self.p)
        b = get_block(self.block)
        self.comp = b.factory(**{k: v for k, v in self.p.items() if k != "kind"})
        self.L = self.p["lanes"]
        self.max_len = self.p["max_len"]
        self.s = self.p.get("slice_bits", 4)
        self.n = gbs.n_planes(self.s) if self.kind == "bitslice" else 1
        self.augment = self.p.get("augment", True)
        self.maxc = gbs.max_chunks(self.max_len, self.L)
        self.rand = rng()
        self.np_rng = np.random.default_rng(self.rand.getrandbits(32))
        self.in_type = {"bitslice": lambda: hv.pe_beat(self.s, self.L),
                        "int8": lambda: hv.int8_beat(self.L),
                        "bitfusion": lambda: hv.bitfusion_beat(self.L)}[self.kind]()
        self.out_type = hv.pe_result(self.max_len, self.L)
        self.fast = compile_pack(self.in_type)
        self.mutate = golden_mutation()
        self.expected = []
        self.received = []
        self.scoreboard = Scoreboard("result", compare=self._compare)
        self._waited = False                # the result on o was offered without ready
        self.keep_bits = self.n.bit_length()
        limits = ([gbf.max_beats(md, max_len=self.max_len, lanes=self.L) for md in gbf.Mode]
                  if self.kind == "bitfusion" else [self.maxc])
        self.cover = coverage_sampler(self.block, self.kind, self.n, limits)

    async def start(self):
        """Clock and reset, then the streams, cycle by cycle for the rest of
        the test (drawing from the generators set so far)."""
        await start_clock_and_reset(self.dut)
        self.src = BeatSource(self.dut, self.rand, self.idle)
        self.sink = Sink(self.dut, "o", self.out_type, self.rand, self.backpressure,
                         self._result, on_stall=self._held)
        self.loop = CycleLoop(self.dut.clk)
        cocotb.start_soon(self.loop.run([self.src], [self.sink], limit=math.inf))

    # -- operands -------------------------------------------------------------------------
    _POOL = 1 << 16

    def _pool(self, lo, hi):
        """A large array of values in ``lo..hi``: uniform, a quarter of them
        corner values (drawn once; dot products take random windows of it)."""
        key = (lo, hi)
        pools = self.__dict__.setdefault("_pools", {})
        if key not in pools:
            g = self.np_rng
            v = g.integers(lo, hi + 1, size=self._POOL)
            corners = np.array([c for c in CORNERS if lo <= c <= hi] + [lo, hi])
            v = np.where(g.random(self._POOL) < 0.25, g.choice(corners, size=self._POOL), v)
            pools[key] = np.concatenate([v, v]).astype(np.int64)
        return pools[key]

    def rand_int8(self, size, lo=-128, hi=127):
        """Values in ``lo..hi``: mostly uniform, with corner values and, for
        some dot products, rows of one extreme."""
        pool = self._pool(lo, hi)
        start = self.rand.randrange(self._POOL)
        if size <= self._POOL:
            v = pool[start:start + size].copy()
        else:
            v = self.np_rng.integers(lo, hi + 1, size=size)
        style = self.rand.random()
        if style < 0.06:
            v[:] = lo
        elif style < 0.10:
            v[:] = hi
        elif style < 0.12:
            v[:] = 0
        return v.astype(np.int64)

    def pick_chunks(self, limit=None) -> int:
        limit = self.maxc if limit is None else limit
        r = self.rand.random()
        if r < 0.003:
            return limit + 1
        if r < 0.006:
            return limit
        if r < 0.018 and limit > 16:
            return int(round(math.exp(self.rand.uniform(math.log(16), math.log(limit - 1)))))
        if r < 0.22:
            return self.rand.randint(1, max(1, min(15, limit - 1)))
        return self.rand.randint(1, max(1, min(3, limit - 1)))

    @staticmethod
    def corners(a, w, wlo=-128, whi=127) -> set:
        """Extreme operand pairs present in one dot product (coverage)."""
        out = set()
        amin, amax = a == -128, a == 127
        wmin, wmax = w == wlo, w == whi
        for am, xn in ((amin, "min"), (amax, "max")):
            if am.any():
                for wm, yn in ((wmin, "min"), (wmax, "max")):
                    if (am & wm).any():
                        out.add(f"{xn}*{yn}")
        if not (a.all() and w.all()):
            out.add("zero")
        return out

    # -- dot products ---------------------------------------------------------------------
    def random_mode(self):
        mode = self.rand.choice(list(Mode))
        keep = self.n if mode is Mode.FULL else self.rand.randint(1, self.n - 1)
        return mode, keep

    def bitslice_dot(self, mode, keep, chunks, *, inject=None, a=None, w=None):
        """Beats of one weight row (consumption order), then an optional
        violation of the rule. Returns the beats (payload dicts)."""
        L, s, n = self.L, self.s, self.n
        a = self.rand_int8(chunks * L) if a is None else np.asarray(a, dtype=np.int64)
        w = self.rand_int8(chunks * L) if w is None else np.asarray(w, dtype=np.int64)
        planes = gbs.split(w, s) & ((1 << s) - 1)
        pr = list(gbs.plane_range(s, mode, keep))
        seq = [(q, c) for q in pr for c in range(chunks)]
        fkeep = keep if mode is not Mode.FULL else self.rand.randrange(1 << self.keep_bits)
        fields = [{"mode": int(mode), "keep": fkeep} for _ in seq]
        r = self.rand
        if inject == "keep" and mode is not Mode.FULL:
            bad = r.choice([0] + list(range(n, 1 << self.keep_bits)))
            for f in fields:
                f["keep"] = bad
        elif inject == "mode" and len(seq) > 1:
            i = r.randrange(1, len(seq))
            other = r.choice([m for m in Mode if m is not mode])
            if mode is not Mode.FULL and r.random() < 0.4 and n > 2:
                fields[i]["keep"] = r.choice([k for k in range(1, n) if k != keep])
            else:
                fields[i]["mode"] = int(other)
                if other is not Mode.FULL:
                    fields[i]["keep"] = r.randint(1, n - 1)
        elif inject == "start":
            if len(pr) > 1 and r.random() < 0.5:
                seq = seq[chunks:]
                fields = fields[chunks:]
            else:
                q = r.choice([x for x in range(n) if x != pr[0]])
                seq[0] = (q, seq[0][1])
        elif inject == "order":
            choice = r.randrange(4)
            if choice == 0 and len(pr) > 1 and chunks > 1:        # chunk-major
                seq = [(q, c) for c in range(chunks) for q in pr]
            elif choice == 1 and len(pr) > 2:                     # a plane skipped
                skip = r.randrange(1, len(pr) - 1)
                seq = [(q, c) for q, c in seq if q != pr[skip]]
            elif choice == 2 and len(pr) > 1:                     # a plane repeated later
                seq = seq + [(pr[0], c) for c in range(chunks)]
            else:                                                 # past the last plane / back
                q = pr[-1] + 1 if pr[-1] + 1 < n else max(0, pr[0] - 1)
                if q == pr[-1]:
                    q = (pr[-1] + 1) % n
                seq = seq + [(q, 0)]
            fields = [dict(fields[0]) for _ in seq]
        elif inject == "chunks" and len(pr) > 1:
            q = r.choice(pr[1:])
            idx = [i for i, (p, _) in enumerate(seq) if p == q]
            if r.random() < 0.5 and chunks > 1:
                del seq[r.choice(idx)]
            else:
                i = r.choice(idx)
                seq.insert(i, seq[i])
            fields = [dict(fields[0]) for _ in seq]
        elif inject == "missing" and len(pr) > 1:
            drop = pr[-1] if r.random() < 0.7 else r.choice(pr[1:])
            seq = [(q, c) for q, c in seq if q != drop] or seq[:1]
            fields = [dict(fields[0]) for _ in seq]
        beats = []
        for i, ((q, c), f) in enumerate(zip(seq, fields)):
            beats.append({"act": a[c * L:(c + 1) * L],
                          "sv": {"slices": planes[q, c * L:(c + 1) * L], "plane": q},
                          "mode": f["mode"], "keep": f["keep"], "last": int(i == len(seq) - 1)})
        feats = {"mode": mode.name, "keep": keep if mode is not Mode.FULL else n,
                 "chunks": chunk_bin(chunks, self.maxc), "corners": self.corners(a, w)}
        # the row, for the golden model's arithmetic when the rule holds
        row = (a, w, mode, keep) if inject is None else None
        return beats, feats, row

    def golden(self, beats, row=None):
        """The golden model's ``(value, error, reason)`` for a beat sequence.

        For the bit-slice PE: the rule (``check_beats``) on the sequence, and
        the value from ``dot`` of the row when the testbench built the beats
        from one (the same as ``pe_result``, which reassembles the row from the
        beats and is used when a violation was injected), else
        ``pe_result``."""
        if self.kind == "bitslice":
            if row is not None:
                reason = gbs.check_beats(self.s, [(b["sv"]["plane"], b["mode"], b["keep"])
                                                  for b in beats],
                                         max_len=self.max_len, lanes=self.L)
                if reason is not SeqError.OK:
                    return None, 1, reason
                a, w, mode, keep = row
                if mode is Mode.DRAFT and not self.augment:
                    mode = Mode.MSB
                return int(gbs.dot(a, w, self.s, mode, keep)), 0, reason
            seq = [(b["act"], b["sv"]["slices"], b["sv"]["plane"], b["mode"], b["keep"])
                   for b in beats]
            return gbs.pe_result(self.s, seq, max_len=self.max_len, lanes=self.L,
                                 augment=self.augment)
        if self.kind == "int8":
            return gbs.mac_result([(b["act"], b["weight"]) for b in beats],
                                  max_len=self.max_len, lanes=self.L)
        return gbf.result([(b["act"], b["weight"], b["mode"]) for b in beats],
                          max_len=self.max_len, lanes=self.L)

    def int8_dot(self, chunks, a=None, w=None):
        L = self.L
        a = self.rand_int8(chunks * L) if a is None else np.asarray(a)
        w = self.rand_int8(chunks * L) if w is None else np.asarray(w)
        beats = [{"act": a[c * L:(c + 1) * L], "weight": w[c * L:(c + 1) * L],
                  "last": int(c == chunks - 1)} for c in range(chunks)]
        return beats, {"mode": "INT8", "chunks": chunk_bin(chunks, self.maxc),
                       "corners": self.corners(a, w)}

    def bitfusion_dot(self, mode, chunks, *, inject=None, extreme=None):
        L = self.L
        limit = gbf.max_beats(mode, max_len=self.max_len, lanes=L)
        beats, corners = [], set()
        flip = self.rand.randrange(1, chunks) if inject == "mode" and chunks > 1 else None
        for c in range(chunks):
            md = gbf.Mode(1 - mode) if c == flip else gbf.Mode(mode)
            a = self.rand_int8(2 * L) if extreme is None else np.full(2 * L, extreme[0])
            if md is gbf.W8:
                wv = self.rand_int8(L) if extreme is None else np.full(L, extreme[1])
                wb = wv & 0xFF
                corners |= self.corners(a[:L], wv)
            else:
                wv = (self.rand_int8(2 * L, -8, 7) if extreme is None
                      else np.full(2 * L, max(-8, min(7, extreme[1]))))
                wb = gbf.pack_w4(wv)
                corners |= self.corners(a, wv, -8, 7)
            beats.append({"act": a, "weight": wb, "mode": int(md),
                          "last": int(c == chunks - 1)})
        return beats, {"mode": gbf.Mode(mode).name, "chunks": chunk_bin(chunks, limit),
                       "corners": corners}

    def random_dot(self):
        """One random dot product (sometimes breaking the rule); queued."""
        r = self.rand
        if self.kind == "bitslice":
            mode, keep = self.random_mode()
            inject = None
            if r.random() < 0.12:
                inject = r.choice(["keep", "mode", "start", "order", "chunks", "missing"])
                if inject == "keep" and mode is Mode.FULL:
                    mode, keep = Mode.MSB, r.randint(1, self.n - 1)
            chunks = self.pick_chunks()
            return self.queue(*self.bitslice_dot(mode, keep, chunks, inject=inject))
        if self.kind == "int8":
            return self.queue(*self.int8_dot(self.pick_chunks()))
        mode = r.choice(list(gbf.Mode))
        limit = gbf.max_beats(mode, max_len=self.max_len, lanes=self.L)
        inject = "mode" if r.random() < 0.05 else None
        return self.queue(*self.bitfusion_dot(mode, self.pick_chunks(limit), inject=inject))

    def queue(self, beats, feats, row=None):
        value, error, reason = self.golden(beats, row)
        if value is not None and self.mutate:
            value ^= 1
        idx = len(self.expected)
        want = (value, error, dict(feats, reason=reason.name))
        self.expected.append(want)
        self.scoreboard.expect(want)
        if not self.src.sent and not self.src.queue:
            assert pack(self.in_type, beats[0]) == self.fast(beats[0]), "fast packer disagrees"
        self.src.send((self.fast(b), idx, bool(b["last"])) for b in beats)
        return len(beats)

    # -- checking -------------------------------------------------------------------------
    @staticmethod
    def _compare(want, got):
        value, error, feats = want
        if got["error"] != error or (value is not None and got["value"] != value):
            return (f"got value={got['value']} error={got['error']}, expected value={value} "
                    f"error={error} ({feats['reason']}, mode {feats['mode']})")
        return None

    def _held(self, prefix):
        self._waited = True

    def _result(self, got):
        """A result taken from ``o``: onto the scoreboard, and its dot
        product's features and flow into the coverage."""
        i = self.scoreboard.checked
        waited, self._waited = self._waited, False
        self.received.append((self.sink.cycle, got, waited))
        self.scoreboard.check(got)
        if i < len(self.expected):
            flow = set(self.src.flags.get(i, ())) | ({"wait"} if waited else set())
            self.cover(dict(self.expected[i][2], flow=flow or {"none"}))

    async def drain(self, timeout_cycles=2_000_000):
        """Wait until a result arrived for every dot product queued, then
        ``latency + 8`` cycles more (nothing extra may arrive)."""
        start = self.loop.cycle
        while len(self.received) < len(self.expected):
            await RisingEdge(self.dut.clk)
            if self.loop.cycle - start > timeout_cycles:
                raise AssertionError(f"timeout: {len(self.received)} of "
                                     f"{len(self.expected)} results (seed {cocotb.RANDOM_SEED})")
        for _ in range(self.comp.latency + 8):
            await RisingEdge(self.dut.clk)

    def check(self, run: str):
        """Write the coverage; fail on a stream-rule violation on ``o``, on a
        wrong, extra or missing result, or on beats left unsent."""
        write_coverage(self.block, run=f"{run} {self.p}", transactions=len(self.expected))
        rules = [f"cycle {c}: {m}" for c, m in self.sink.rule_violations]
        assert not rules, (f"{len(rules)} stream-rule violations on o (seed "
                           f"{cocotb.RANDOM_SEED}); first: " + "; ".join(rules[:5]))
        self.scoreboard.finish(f"cycle {self.loop.cycle}, seed {cocotb.RANDOM_SEED}")
        assert self.src.empty(), "input not drained"


def _flow_tb(dut):
    """A :class:`PETB` with idle and back-pressure phases (:class:`Pattern`)."""
    r = rng()
    tb = PETB(dut)
    tb.set_idle_generator(per_cycle(Pattern(r, rates=(0.0, 0.2, 0.5), burst=0.1)))
    tb.set_backpressure_generator(per_cycle(Pattern(r, rates=(0.0, 0.3, 0.6), burst=0.25)))
    return tb


@cocotb.test()
async def random_vectors(dut):
    """Random dot products (about 12 % breaking the rule) in every mode,
    chunk counts from 1 to one past the limit, corner operands, with idle,
    stall and back-pressure phases on the streams."""
    tb = _flow_tb(dut)
    await tb.start()
    target = knob("pe_dots", 10000)
    beats = 0
    for _ in range(target):
        beats += tb.random_dot()
        if len(tb.src.queue) > 4000:                # keep the queue (and memory) short
            while len(tb.src.queue) > 1000:
                await RisingEdge(dut.clk)
    await tb.drain()
    tb.check("random_vectors")
    dut._log.info("random_vectors: %d dot products, %d beats, %d cycles, %d input stalls",
                  len(tb.expected), beats, tb.loop.cycle, tb.src.stalls)


@cocotb.test()
async def limits(dut):
    """The longest accepted dot product of every mode with the operands of
    largest magnitude (exact, no overflow), one chunk more (error), and a
    clean dot product after each."""
    tb = _flow_tb(dut)
    await tb.start()
    L = tb.L
    if tb.kind == "bitslice":
        combos = [(Mode.FULL, tb.n)] + [(m, k) for m in (Mode.DRAFT, Mode.MSB, Mode.LSB)
                                        for k in range(1, tb.n)]
        for mode, keep in combos:
            for av, wv in ((-128, -128), (-128, 127), (127, -128), (127, 127)):
                for chunks in (tb.maxc, tb.maxc + 1):
                    n_el = chunks * L
                    tb.queue(*tb.bitslice_dot(mode, keep, chunks, a=np.full(n_el, av),
                                              w=np.full(n_el, wv)))
                tb.queue(*tb.bitslice_dot(mode, keep, 1))
    elif tb.kind == "int8":
        for av, wv in ((-128, -128), (-128, 127), (127, -128), (127, 127)):
            for chunks in (tb.maxc, tb.maxc + 1):
                tb.queue(*tb.int8_dot(chunks, np.full(chunks * L, av), np.full(chunks * L, wv)))
            tb.queue(*tb.int8_dot(1))
    else:
        for mode in gbf.Mode:
            limit = gbf.max_beats(mode, max_len=tb.max_len, lanes=L)
            for ext in ((-128, -128), (-128, 127), (127, -128), (127, 127)):
                for chunks in (limit, limit + 1):
                    tb.queue(*tb.bitfusion_dot(mode, chunks, extreme=ext))
                tb.queue(*tb.bitfusion_dot(mode, 1))
    await tb.drain()
    tb.check("limits")
    bad = [e for e in tb.expected if e[2]["chunks"] == "over" and not e[1]]
    assert not bad, "a dot product past the limit was expected to pass"


@cocotb.test()
async def errors_recover(dut):
    """Every way of breaking the rule, each followed by a well-formed dot
    product and some back to back: one result per ``last``, the error on the
    broken one only, the next one clean (no reset in between)."""
    tb = _flow_tb(dut)
    await tb.start()
    r = tb.rand
    if tb.kind == "bitslice":
        kinds = ["keep", "mode", "start", "order", "chunks", "missing"]
        for rep in range(30):
            for inject in kinds:
                mode, keep = tb.random_mode()
                if inject == "keep" and mode is Mode.FULL:
                    mode, keep = Mode.LSB, r.randint(1, tb.n - 1)
                if inject in ("chunks", "missing") and len(gbs.plane_range(tb.s, mode, keep)) < 2:
                    mode, keep = Mode.FULL, tb.n
                tb.queue(*tb.bitslice_dot(mode, keep, r.randint(2, 4), inject=inject))
                if rep % 3:
                    tb.queue(*tb.bitslice_dot(*tb.random_mode(), r.randint(1, 3)))
        reasons = {e[2]["reason"] for e in tb.expected if e[1]}
        assert reasons >= {"BAD_KEEP", "MODE_CHANGE", "BAD_START", "PLANE_ORDER",
                           "CHUNK_MISMATCH", "MISSING_PLANE"}, reasons
    elif tb.kind == "bitfusion":
        for rep in range(40):
            tb.queue(*tb.bitfusion_dot(r.choice(list(gbf.Mode)), r.randint(2, 4), inject="mode"))
            tb.queue(*tb.bitfusion_dot(r.choice(list(gbf.Mode)), r.randint(1, 3)))
    for rep in range(10):                          # too long, then clean
        if tb.kind == "bitslice":
            mode, keep = tb.random_mode()
            tb.queue(*tb.bitslice_dot(mode, keep, tb.maxc + 1 + r.randrange(3)))
            tb.queue(*tb.bitslice_dot(mode, keep, 1))
        elif tb.kind == "int8":
            tb.queue(*tb.int8_dot(tb.maxc + 1 + r.randrange(3)))
            tb.queue(*tb.int8_dot(1))
        else:
            mode = r.choice(list(gbf.Mode))
            lim = gbf.max_beats(mode, max_len=tb.max_len, lanes=tb.L)
            tb.queue(*tb.bitfusion_dot(mode, lim + 1 + r.randrange(3)))
            tb.queue(*tb.bitfusion_dot(mode, 1))
    await tb.drain()
    tb.check("errors_recover")
    assert any(e[1] for e in tb.expected) and not all(e[1] for e in tb.expected)


@cocotb.test()
async def stall_recovery(dut):
    """``o.ready`` low for long stretches: the input stops once every result
    slot is taken (``i.ready`` low), nothing is lost or reordered, and the
    stream resumes at full rate."""
    tb = PETB(dut)
    tb.set_backpressure_generator(per_cycle(Pattern(rng(), rates=(0.0,), burst=1.0,
                                                    phase_cycles=(400, 400))))
    await tb.start()
    for _ in range(400):
        if tb.kind == "bitslice":
            tb.queue(*tb.bitslice_dot(Mode.MSB, 1, 1))          # one beat, one result
        elif tb.kind == "int8":
            tb.queue(*tb.int8_dot(1))
        else:
            tb.queue(*tb.bitfusion_dot(gbf.W8, 1))
    await tb.drain()
    tb.check("stall_recovery")
    assert tb.src.stalls > 0, "back-pressure never reached the input"
    # while stalled, at most `depth` results were ever outstanding
    assert max_outstanding(tb) <= tb.comp.depth


def max_outstanding(tb) -> int:
    """Most results accepted (their ``last`` beat) but not yet delivered."""
    ev = [(c, 1) for c, (_, _, last) in tb.src.sent if last] + [(c, -1) for c, _, _ in
                                                                tb.received]
    ev.sort(key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


@cocotb.test()
async def throughput(dut):
    """Back-to-back beats with an always-ready sink: cycles per beat (must be
    1: no bubble, no stall), the DRAFT/FULL cycle ratio for every k, dot
    products of a single beat at full rate, and the latency of every result
    (must equal the block's documented ``latency``)."""
    tb = PETB(dut)
    await tb.start()
    chunks, count = 4, 32
    if tb.kind == "bitslice":
        groups = [("FULL", Mode.FULL, tb.n, chunks)]
        groups += [(f"DRAFT_k{k}", Mode.DRAFT, k, chunks) for k in range(1, tb.n)]
        groups += [("SINGLE", Mode.MSB, 1, 1)]
    elif tb.kind == "int8":
        groups = [("FULL", None, None, chunks), ("SINGLE", None, None, 1)]
    else:
        groups = [("FULL", gbf.W8, None, chunks), ("W4", gbf.W4, None, chunks),
                  ("SINGLE", gbf.W8, None, 1)]
    figures = {}
    for name, mode, keep, ch in groups:
        first, nres = len(tb.src.sent), len(tb.received)
        n0 = len(tb.expected)
        beats = 0
        for _ in range(count if name != "SINGLE" else 64):
            if tb.kind == "bitslice":
                beats += tb.queue(*tb.bitslice_dot(mode, keep, ch))
            elif tb.kind == "int8":
                beats += tb.queue(*tb.int8_dot(ch))
            else:
                beats += tb.queue(*tb.bitfusion_dot(mode, ch))
        await tb.drain()
        sent, got = tb.src.sent[first:], tb.received[nres:]
        span = sent[-1][0] - sent[0][0] + 1            # cycles the input was busy
        last_cycles = [c for c, (_, _, last) in sent if last]
        lat = sorted({g[0] - c for g, c in zip(got, last_cycles)})
        dots = len(tb.expected) - n0
        figures[name] = {"beats": beats, "dot_products": dots, "chunks": ch,
                         "input_cycles": span, "cycles_per_dot": span / dots,
                         "latency": lat[0] if len(lat) == 1 else lat}
        assert span == beats, f"{name}: {beats} beats took {span} cycles (bubbles)"
        assert lat == [tb.comp.latency], f"{name}: latencies {lat}, documented {tb.comp.latency}"
    assert tb.src.stalls == 0, f"input stalled {tb.src.stalls} cycles with o always ready"
    tb.check("throughput")
    full = figures["FULL"]["input_cycles"]
    for name, fig in figures.items():
        fig["ratio_to_full"] = fig["input_cycles"] / full
        if name.startswith("DRAFT_k"):
            k = int(name[7:])
            assert fig["input_cycles"] * tb.n == full * k, f"{name}: not exactly k/n of FULL"
    dut._log.info("throughput: %s", figures)
    out = os.environ.get("ELMOE_MEASURE_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"params": tb.p, "latency": tb.comp.latency,
                                         "figures": figures}, indent=2))


@cocotb.test()
async def repro_issue10(dut):
    """Issue 10, defect 1, at this build's geometry (bit-slice PEs only): the
    longest FULL dot product of (-128)(-128) is exact (it wrapped to a
    negative value with error 0); one chunk more, and a one-plane (MSB, DRAFT)
    dot product of 2 C beats (the old limit counted beats over all planes:
    512 at the default) are errors; C one-plane beats are exact; FULL with a
    repeated, missing, reversed or interleaved plane is an error. A clean dot
    product follows each. The golden model gives every expected result; the
    issue's figures are asserted against it as well."""
    tb = _flow_tb(dut)
    if tb.kind != "bitslice":
        return
    await tb.start()
    L, s, n, C = tb.L, tb.s, tb.n, tb.maxc
    mask = (1 << s) - 1

    def raw(planes_seq, mode, keep, av=-128, wv=-128):
        w = np.full(L, wv, dtype=np.int64)
        sl = gbs.split(w, s) & mask
        beats = [{"act": np.full(L, av, dtype=np.int64), "sv": {"slices": sl[q], "plane": q},
                  "mode": int(mode), "keep": keep, "last": int(i == len(planes_seq) - 1)}
                 for i, q in enumerate(planes_seq)]
        chunks = max(planes_seq.count(q) for q in set(planes_seq))
        feats = {"mode": mode.name, "keep": keep if mode is not Mode.FULL else n,
                 "chunks": chunk_bin(chunks, C), "corners": tb.corners(w, w)}
        return beats, feats

    want = []                                   # (index in tb.expected, value or None, error)

    def case(beats_feats, value, error):
        want.append((len(tb.expected), value, error))
        tb.queue(*beats_feats)
        tb.queue(*tb.bitslice_dot(Mode.FULL, n, 1))

    full = [q for q in range(n) for _ in range(C)]
    case(raw(full, Mode.FULL, n), 16384 * C * L, 0)
    case(raw([q for q in range(n) for _ in range(C + 1)], Mode.FULL, n), None, 1)
    d = s * (n - 1)
    m_min = -(1 << (s - 1))
    for mode in (Mode.MSB, Mode.DRAFT):
        eff = (m_min << d) + ((1 << (d - 1)) if mode is Mode.DRAFT and tb.augment else 0)
        case(raw([0] * (2 * C), mode, 1), None, 1)
        case(raw([0] * C, mode, 1), C * L * (-128) * eff, 0)
    bad = [[0, 0] + list(range(1, n)), [0], list(range(n))[::-1],
           list(range(n)) * 2, [0] + list(range(1, n)) + [n - 1]]
    for seq in bad:
        case(raw(seq, Mode.FULL, n, av=3, wv=85), None, 1)
    await tb.drain()
    tb.check("repro_issue10")
    for k, value, error in want:
        got_v, got_e, _ = tb.expected[k]
        assert got_e == error and (value is None or got_v == value), \
            f"golden model disagrees with issue 10 at case {k}: {got_v, got_e} != {value, error}"

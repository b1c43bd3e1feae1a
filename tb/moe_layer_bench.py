"""cocotb testbench: the token-batched MoE datapath (block ``moe_layer``)
against the golden batched layer (:mod:`elmoe3d.golden.moe_batched`).

The testbench plays everything around the datapath:

* the host: steps of tokens (random roles FULL/DRAFT/VERIFY, allowed masks
  none / one-hot / all / random subsets of the resident experts) on ``tok``;
* HB: ``B`` bank servers holding the dense region (``layout.dense_image``)
  and the resident experts' slots (``layout.hb_slot_image``); a read of a
  slot that is not resident returns one ``error`` beat, like HB;
* the Elastic-SD controller: it answers every ``need`` with a source
  decision on ``source`` (a policy per test: HB, split, LPDDR or random),
  after a random delay;
* the external-memory stream engine: for every decided expert with LPDDR
  planes it queues exactly those planes' ``ExtBeat``\\ s (``weight_beats``
  order, bank fastest), after a latency.

Checks (contracts, not replays): every output bit for bit against the
golden layer; every announcement (expert, token count, precision, order)
against the golden pass plan; every HB word read exactly once per pass and
only if the pass needs it (so no expert's weights twice in a pass); the
per-pass counters against the golden traffic contract; the stream rules on
every output port. Random idle on every input and back-pressure on every
output. Knobs: ``ELMOE_MOE_TOKENS`` (tokens per mode), ``ELMOE_MEASURE_OUT``,
``ELMOE_MOE_PASSES`` (throughput passes per point), ``ELMOE_MOE_POINTS`` (throughput
points, e.g. ``FULL_T16,DRAFT_T1``), ``ELMOE_GOLDEN_MUTATION``.
"""

from __future__ import annotations

import bisect
import collections
import json
import os
from pathlib import Path

import cocotb
import numpy as np
from amaranth.lib import data
from cocotb.triggers import ReadOnly, RisingEdge

from ..config import Config
from ..golden import layout as gl
from ..golden import moe_batched as gb
from ..golden import moe_layer as gm
from ..hw.vocab import vocab
from ..sim.run.tile_script import random_layers
from .common import golden_mutation, knob, pack, params, rng, start_clock_and_reset
from .coverage import write_coverage
from .kit import Bench, Scoreboard, Sink, Source

R = gb.Role
_COVER = {}
#: handshakes checked per geometry (T, PEs, lanes) in this simulation (see ``volume``)
_TRANSFERS = collections.Counter()


def _coverage():
    """The functional coverage model (cocotb-coverage, prefix ``moe_layer``).

    Sampled per token (role, mask, pass size), per job (its source -- the
    ports that carry its planes --, precision, token count, decision delay,
    whether the HB data / LPDDR port was held idle while its pass was in
    flight) and per pass (the fault injected, the error the RTL's counters
    report). Cross bins that the contract makes impossible are declared
    ``ign_bins`` (each with its reason), so they are neither misses nor
    hits."""
    if "sample" in _COVER:
        return _COVER["sample"]
    from cocotb_coverage.coverage import CoverCross, CoverPoint
    P = "moe_layer"
    yn = [False, True]
    faults = ["hb_refused", "hb_error", "hb_early_last", "ext_error", "ext_early_last"]

    @CoverPoint(f"{P}.role", xf=lambda c: c["role"], bins=["FULL", "DRAFT", "VERIFY"])
    @CoverPoint(f"{P}.mask", xf=lambda c: c["mask"], bins=["none", "one", "all", "some"])
    @CoverPoint(f"{P}.pass_size", xf=lambda c: c["pass_size"], bins=["1", "some", "T"])
    @CoverPoint(f"{P}.experts", xf=lambda c: c["experts"], bins=["none", "some"])
    @CoverPoint(f"{P}.o_backpressure", xf=lambda c: c["o_bp"], bins=yn)
    @CoverPoint(f"{P}.tok_idle", xf=lambda c: c["tok_idle"], bins=yn)
    @CoverCross(f"{P}.roleXmask", items=[f"{P}.role", f"{P}.mask"])
    @CoverCross(f"{P}.roleXpass_size", items=[f"{P}.role", f"{P}.pass_size"])
    def sample_token(c):
        pass

    # source: shared = a shared expert (dense HB region); hb = every plane
    # the job needs from an HB slot; split = MSB planes from HB, the others
    # from LPDDR; whole = MSB planes from the MSB slot, the others from the
    # expert's LSB slot (whole-resident); lpddr = every plane from LPDDR.
    @CoverPoint(f"{P}.job.source", xf=lambda c: c["source"],
                bins=["shared", "hb", "split", "whole", "lpddr"])
    @CoverPoint(f"{P}.job.precision", xf=lambda c: c["precision"], bins=["FULL", "DRAFT", "VERIFY"])
    @CoverPoint(f"{P}.job.tokens", xf=lambda c: c["tokens"], bins=["1", "some", "T"])
    @CoverPoint(f"{P}.job.decision_delay", xf=lambda c: c["delay"], bins=yn)
    @CoverPoint(f"{P}.job.hb_idle", xf=lambda c: c["hb_idle"], bins=yn)
    @CoverPoint(f"{P}.job.ext_idle", xf=lambda c: c["ext_idle"], bins=yn)
    # Illegal by the contract (golden/moe_batched._planes): a FULL or VERIFY
    # job needs all n planes and an HB slot holds only k of them (Config:
    # hb_planes <= planes - 1 whenever planes > 1), so an HB-sourced FULL /
    # VERIFY job is always split or whole (two slots), never one slot; a
    # DRAFT job needs planes 0 .. k-1, all in the MSB slot, so an
    # HB-sourced DRAFT job is never split nor whole. (Only slice_bits = 8,
    # one plane, would make one-slot FULL possible; no parameter set here
    # has it.)
    @CoverCross(f"{P}.job.sourceXprecision", items=[f"{P}.job.source", f"{P}.job.precision"],
                ign_bins=[("hb", "FULL"), ("hb", "VERIFY"), ("split", "DRAFT"),
                          ("whole", "DRAFT")])
    @CoverCross(f"{P}.job.sourceXtokens", items=[f"{P}.job.source", f"{P}.job.tokens"])
    def sample_job(c):
        pass

    @CoverPoint(f"{P}.fault", xf=lambda c: c["fault"], bins=["none"] + faults)
    @CoverPoint(f"{P}.pass_error", xf=lambda c: c["error"], bins=yn)
    # pass_error is the RTL's PassStats.error; the contract (checked in
    # check_stats) is error == "a fault hit this pass", so a clean pass with
    # error and a faulted pass without it are illegal.
    @CoverCross(f"{P}.faultXpass_error", items=[f"{P}.fault", f"{P}.pass_error"],
                ign_bins=[("none", True)] + [(f, False) for f in faults])
    def sample_pass(c):
        pass

    _COVER["sample"] = (sample_token, sample_job, sample_pass)
    return _COVER["sample"]


def _offsets(layout):
    return {name: f.offset for name, f in data.Layout.cast(layout)}


class _In(Source):
    """An input port of the datapath: the kit's :class:`~elmoe3d.tb.kit.Source`
    (items packed already) with the bench's bookkeeping: every idle cycle
    drawn is logged (``<tag>_idle``, the coverage's "held back"), every
    transfer counted, and ``ready`` must never be X/Z."""

    def __init__(self, tb, prefix, tag, later=None):
        super().__init__(tb.dut, prefix, None, tb.rand, tb.streams.idle, later=later)
        self.tb, self.tag = tb, tag

    def drive(self, cycle: int):
        super().drive(cycle)
        if self.item is None and self.queue:        # an item waits: the draw said idle
            self.tb.log[self.tag + "_idle"].append(cycle)

    def sample(self):
        v = self.ready.value
        if not v.is_resolvable:
            raise AssertionError(f"{self.tag}.ready is {v} at cycle {self.cycle}")
        super().sample()
        if self.fired:
            tb = self.tb
            tb.transfers += 1
            tb.fired_count[self.tag] += 1
            if self.tag == "tok":
                tb.tok_cycles.append(self.cycle)


class _Out(Sink):
    """An output port of the datapath: the kit's :class:`~elmoe3d.tb.kit.Sink`
    (stream rules, X/Z payloads) whose ``valid`` must never be X/Z either;
    each transfer counted and handed to :meth:`MoETB._take`, each
    back-pressured cycle logged (``<tag>_bp``)."""

    def __init__(self, tb, prefix, tag, layout):
        def take(p):
            tb.transfers += 1
            tb._take(tag, p)
        super().__init__(tb.dut, prefix, layout, tb.rand, tb.streams.backpressure, take,
                         on_stall=lambda _name: tb.log[tag + "_bp"].append(self.cycle))

    def sample(self):
        v = self.valid.value
        if not v.is_resolvable:
            raise AssertionError(f"{self.name}.valid is {v} at cycle {self.cycle}")
        super().sample()


class MoETB(Bench):
    """Clock, reset, host, HB banks, controller, LPDDR, monitors, scoreboard:
    the bench on the testbench kit (:class:`~elmoe3d.tb.kit.Bench`). Its
    ports (:meth:`start`, in driving order ``tok``, ``source``, ``ext``,
    ``hb_data__<b>``, then ``need``, ``o``, ``stats``, ``cand``,
    ``hb_cmd__<b>``) run in the kit's cycle loop; ``idle`` / ``bp`` are the
    idle and back-pressure probabilities of every input / output
    (:meth:`~elmoe3d.tb.kit.Bench.set_idle` and
    :meth:`~elmoe3d.tb.kit.Bench.set_backpressure` change them, per port
    too); the models' queues are the sources' ``later`` deques. Constructed
    without :meth:`start` (a bench of a larger DUT using its layers and
    models), it touches no port."""

    def __init__(self, dut, *, stress=False, idle=0.0, bp=0.0, policy="random",
                 decision_delay=(0, 0), ext_latency=20, hb_latency=3, resident=None,
                 free_slots=0, lsb_slots=None):
        super().__init__(dut, rng(), idle=idle, backpressure=bp)
        self.cfg = cfg = Config(**params()["config"])
        self.v = vocab(cfg)
        self.np_rng = np.random.default_rng(self.rand.getrandbits(32))
        self.T, self.B, self.E, self.n, self.k = (cfg.batch_tokens, cfg.pes, cfg.experts,
                                                  cfg.planes, cfg.hb_planes_eff)
        self.layers = random_layers(cfg, self.np_rng, stress=stress)
        self.dense = gl.dense_image(cfg, self.layers)                  # (B, D)
        # residency: which (layer, expert) sits in which slot
        pairs = [(l, e) for l in range(cfg.layers) for e in range(cfg.experts)]
        # ``lsb_slots`` slots hold the LSB plane group of a resident expert
        # (whole-resident: every plane from HB), by default a quarter of them
        # where an LSB group fits a slot
        if lsb_slots is None:
            lsb_slots = cfg.tag_slots // 4 if resident is None and gl.lsb_group_fits(cfg) else 0
        if resident is None:
            self.rand.shuffle(pairs)
            # ``free_slots`` slots hold no expert (an HB read of one is refused)
            resident = pairs[:cfg.tag_slots - free_slots - lsb_slots]
        self.slot_of = {p: s for s, p in enumerate(resident)}
        self.lsb_of = {p: len(resident) + i for i, p in enumerate(resident[:lsb_slots])}
        self.slots = {}
        for (l, e), s in self.slot_of.items():
            lay = self.layers[l]
            self.slots[s] = gl.hb_slot_image(cfg, lay.wg[e], lay.wu[e], lay.wd[e])
        for (l, e), s in self.lsb_of.items():
            lay = self.layers[l]
            self.slots[s] = gl.hb_slot_image(cfg, lay.wg[e], lay.wu[e], lay.wd[e], group=1)
        self.words = {}
        self.policy = policy
        self.decision_delay, self.ext_latency, self.hb_latency = (decision_delay, ext_latency,
                                                                  hb_latency)
        self.mutate = golden_mutation()
        self.fault = None                   # (kind, probability) in the fault test
        # layouts and offsets
        v = self.v
        self.hbbeat_off = _offsets(v.HBBeat)
        self.sv_bits = cfg.slice_vector_bits
        self.extbeat_off = _offsets(v.ExtBeat)
        # queues and records
        self.tok_q = collections.deque()
        self.src_q = collections.deque()                 # (ready_cycle, payload int)
        self.ext_q = collections.deque()                 # (ready_cycle, payload int)
        self._ext_next = 0.0                             # LPDDR: the next beat's earliest cycle
        self.hb_q = [collections.deque() for _ in range(self.B)]   # (ready_cycle, payload)
        self.steps = []                                  # (layer, xs, roles, masks, facts)
        self.needs = []                                  # (cycle, payload dict), routed experts
        self.need_beats = []                             # every beat on `need` (with `none`)
        self.cand_beats = None if not hasattr(dut, "cand__valid") else []   # on `cand`
        self.decisions = []                              # Source per need
        self.hb_cmds = [[] for _ in range(self.B)]       # per bank: payload dicts
        self.outputs = []                                # (cycle, y, error, last)
        self.stats = []
        self.errors = []
        self.log = collections.defaultdict(list)         # stall events by kind
        self.transfers = 0
        self.tok_cycles = []                             # cycle each token was accepted
        self.need_pass, self.n_passes = [], 0            # pass of each announcement to come
        self.refused_passes = set()                      # passes with an hb_refused job
        # HB short reads: slot -> EXPERT reads of it decided so far, and
        # (slot, read index) -> (kind, bank, word) for a faulted one
        self.hb_reads_decided = {}
        self.hb_reads_served = {}
        self.hb_short = {}
        self.fired_count = collections.Counter()

    # -- host --------------------------------------------------------------------------------
    def add_step(self, layer, xs, roles, masks, facts=None):
        xs = np.asarray(xs, dtype=np.int64)
        self.steps.append((layer, xs, list(roles), np.asarray(masks, bool), facts or []))
        # the pass of every announcement to come (the router only), so that the
        # fault injection names the empty slot for at most one job per pass
        for p0 in range(0, len(xs), self.T):
            plan = gb.plan_pass(self.layers[layer], xs[p0:p0 + self.T], list(roles)[p0:p0 + self.T],
                                np.asarray(masks, bool)[p0:p0 + self.T])
            self.need_pass += [self.n_passes] * len(plan.routed)
            self.n_passes += 1
        for i, (x, r, mk) in enumerate(zip(xs, roles, masks)):
            self.tok_q.append(pack(data.Layout.cast(self.v.MoEToken), {
                "x": [int(a) for a in x], "role": int(r),
                "mask": int(sum(1 << e for e in range(self.E) if mk[e])), "layer": layer,
                "last": int(i == len(xs) - 1)}))

    def resident_mask(self, layer):
        return np.array([(layer, e) in self.slot_of for e in range(self.E)])

    # -- the environment --------------------------------------------------------------------
    def _decide(self, need):
        l, e, prec = need["layer"], need["expert"], R(need["precision"])
        res = (l, e) in self.slot_of
        p = self.policy
        if p == "lpddr":
            hb = False
        elif p in ("hb", "split", "whole"):
            hb = res
        else:
            hb = res and self.rand.random() < 0.7
        slot = self.slot_of.get((l, e), 0)
        fault = None
        if self.fault and self.rand.random() < self.fault[1]:
            fault = self.fault[0]
            if fault == "hb_refused":
                # a controller never gives two experts of one pass the same
                # slot: the empty slot goes to one job per pass at most
                pid = self.need_pass[len(self.decisions)]
                if pid in self.refused_passes:
                    fault = None
                else:
                    self.refused_passes.add(pid)
                    hb, slot = True, self._free_slot()
            elif fault in ("hb_error", "hb_early_last"):
                # a resident expert's slot read cut short on one bank: an error
                # beat or a `last` before the command's count
                if res:
                    hb = True
                    self.hb_short[(slot, self.hb_reads_decided.get(slot, 0))] = (
                        fault, self.rand.randrange(self.B), self.rand.randrange(1 << 20))
                else:
                    fault = None
        # a whole-resident expert: its LSB planes from its LSB slot too
        lsb = (hb and fault is None and prec is not R.DRAFT and (l, e) in self.lsb_of
               and (p == "whole" or (p == "random" and self.rand.random() < 0.5)))
        lsb_slot = self.lsb_of.get((l, e), 0) if lsb else 0
        # HB commands of the decision: one read of the slot, or one per
        # segment of each slot for a whole-resident expert (the reads of a
        # slot are counted so that a fault names the decision's first read)
        reads = len(gl.segments(self.cfg)) if lsb else 1
        if hb and slot in self.slots:
            self.hb_reads_decided[slot] = self.hb_reads_decided.get(slot, 0) + reads
        if lsb:
            self.hb_reads_decided[lsb_slot] = self.hb_reads_decided.get(lsb_slot, 0) + reads
        src = gb.Source(hb, slot, lsb, lsb_slot)
        self.decisions.append((src, fault))
        d0, d1 = self.decision_delay
        delay = self.rand.randint(d0, d1) if d1 else 0
        self.src_q.append((self.cycle + delay, pack(data.Layout.cast(self.v.ExpertSource),
                                                    {"hb": int(hb), "slot": slot,
                                                     "lsb_hb": int(lsb), "lsb_slot": lsb_slot})))
        n, k = self.n, self.k
        need_planes = range(k) if prec is R.DRAFT else range(n)
        ext = [q for q in need_planes if not (hb and q < k) and not (lsb and q >= k)]
        if ext:
            self._queue_ext(l, e, ext, fault if fault in ("ext_error", "ext_early_last") else None)
        return delay

    def _free_slot(self):
        used = set(self.slot_of.values()) | set(self.lsb_of.values())
        free = [s for s in range(self.cfg.tag_slots) if s not in used]
        return free[0] if free else None

    def _queue_ext(self, layer, e, planes, fault):
        cfg = self.cfg
        key = (layer, e)
        if key not in self.words:
            lay = self.layers[layer]
            self.words[key] = gl.expert_slice_words(cfg, lay.wg[e], lay.wu[e], lay.wd[e])
        words = self.words[key]
        fw, B, sv = cfg.fill_words, self.B, self.sv_bits
        off = self.extbeat_off
        beats = []
        for seg, q, c, ws in gl.weight_beats(cfg, words, planes):
            for b0 in range(0, B, fw):
                w = 0
                for i in range(fw):
                    w |= ws[b0 + i] << (i * sv)
                beats.append([w, q, seg.row0 + c, b0])
        cut = None
        if fault == "ext_error":
            cut = self.rand.randrange(len(beats))
        elif fault == "ext_early_last" and len(beats) > 1:
            # an early last: at the command's last beat it would be a complete,
            # correct command (not a fault)
            cut = self.rand.randrange(len(beats) - 1)
        # LPDDR bandwidth (Config.lpddr_bytes_per_cycle): a beat every
        # `cpb` cycles at most, after the read latency
        cpb = gb.lpddr_cycles_per_beat(cfg)
        t = max(self.cycle + self.ext_latency, self._ext_next)
        for i, (w, q, row, b0) in enumerate(beats):
            last = i == len(beats) - 1
            err = 0
            if cut is not None and i == cut:
                last, err = True, int(fault == "ext_error")
            raw = ((w << off["words"]) | (q << off["plane"]) | (row << off["row"])
                   | (b0 << off["bank"]) | (int(last) << off["last"]) | (err << off["error"]))
            self.ext_q.append((int(t), raw))
            t += cpb
            self._ext_next = t
            if cut is not None and i == cut:
                break

    def _hb_words(self, cmd):
        region, slot, offset, count = cmd["region"], cmd["slot"], cmd["offset"], cmd["count"]
        return region, slot, offset, count

    def _hb_serve(self, b, cmd):
        cfg = self.cfg
        off = self.hbbeat_off
        t0 = self.cycle + self.hb_latency
        region, slot, offset, count = self._hb_words(cmd)
        if region == 0:                                    # EXPERT
            img = self.slots.get(slot)
            if img is None or offset + count > cfg.slot_words:
                self.hb_q[b].append((t0, (1 << off["last"]) | (1 << off["error"])))
                return
            words = img[b, offset:offset + count]
            ri = self.hb_reads_served.get((b, slot), 0)
            self.hb_reads_served[(b, slot)] = ri + 1
            short = self.hb_short.get((slot, ri))
            if short is not None and short[1] == b:
                kind, _, rnd = short
                cut = rnd % max(1, count - 1)          # the read ends at word `cut` < count - 1
                for w in words[:cut]:
                    self.hb_q[b].append((t0, int(w) << off["sv"]))
                if kind == "hb_error":            # the word at `cut` refused: ends the read
                    self.hb_q[b].append((t0, (1 << off["last"]) | (1 << off["error"])))
                else:                             # a word with `last` at `cut` < count - 1
                    self.hb_q[b].append((t0, (int(words[cut]) << off["sv"]) | (1 << off["last"])))
                return
        else:
            if offset + count > cfg.dense_words:
                self.hb_q[b].append((t0, (1 << off["last"]) | (1 << off["error"])))
                return
            words = self.dense[b, offset:offset + count]
        for i, w in enumerate(words):
            raw = (int(w) << off["sv"]) | (int(i == count - 1) << off["last"])
            self.hb_q[b].append((t0, raw))

    # -- the cycle loop ----------------------------------------------------------------------
    async def start(self):
        """Quiet every port, start the clock, reset, and run the ports in the
        kit's cycle loop from now on (one coroutine for every port)."""
        d = self.dut
        B = self.B
        for name in ("tok", "source", "ext") + tuple(f"hb_data__{b}" for b in range(B)):
            getattr(d, f"{name}__valid").value = 0
            getattr(d, f"{name}__payload").value = 0
        for name in ("need", "o", "stats") + tuple(f"hb_cmd__{b}" for b in range(B)):
            getattr(d, f"{name}__ready").value = 0
        tok = self.add(_In(self, "tok", "tok"))
        tok.queue = self.tok_q                   # add_step queues packed tokens here
        self.add(_In(self, "source", "source", later=self.src_q))
        self.add(_In(self, "ext", "ext", later=self.ext_q))
        for b in range(B):
            self.add(_In(self, f"hb_data__{b}", f"hb{b}", later=self.hb_q[b]))
        lay, v = data.Layout.cast, self.v
        outs = [("need", v.ExpertNeed), ("o", v.MoEOutput), ("stats", v.PassStats)]
        if hasattr(d, "cand__valid"):       # built for prefetch: the candidates too
            outs.append(("cand", v.PrefetchCandidate))
        for name, layout in outs:
            self.add(_Out(self, name, name, lay(layout)))
        for b in range(B):
            self.add(_Out(self, f"hb_cmd__{b}", f"hb_cmd{b}", lay(v.HBRead)))
        await start_clock_and_reset(d)
        cocotb.start_soon(self.run(limit=1 << 62))
        if knob("moe_trace", False):
            cocotb.start_soon(self._trace())

    async def _trace(self):
        """Debug: the issue stage's job and buffer positions whenever they change."""
        d = self.dut
        last = None
        self.trace = []
        while True:
            await RisingEdge(d.clk)
            await ReadOnly()
            cur = tuple(int(getattr(d.issue, n).value) for n in
                        ("pi", "j", "hb_free", "ext_free", "hbn", "extn", "issue_state"))
            if cur[:4] != (last or (None,) * 7)[:4]:
                self.trace.append((self.cycle,) + cur)
            last = cur

    def _take(self, name, pl):
        if name == "need":
            pl = {k: (x.value if hasattr(x, "value") else x) for k, x in pl.items()}
            self.need_beats.append(pl)
            if pl["none"]:                   # a pass without routed experts: no decision
                return
            self.needs.append((self.cycle, pl))
            delay = self._decide(pl)
            self.log["decision_delay"].append((self.cycle, delay))
        elif name == "o":
            self.outputs.append((self.cycle, pl["y"], pl["error"], pl["last"]))
        elif name == "stats":
            self.stats.append((self.cycle, pl))
        elif name == "cand":
            self.cand_beats.append({k: (x.value if hasattr(x, "value") else x)
                                    for k, x in pl.items()})
        else:
            b = int(name[6:])
            pl = {k: (x.value if hasattr(x, "value") else x) for k, x in pl.items()}
            self.hb_cmds[b].append((self.cycle, pl))
            self._hb_serve(b, pl)

    # -- checking ------------------------------------------------------------------------
    def n_tokens(self):
        return sum(len(s[1]) for s in self.steps)

    async def drain(self, limit=None):
        """Run until every output and every pass's counters are out. A hang
        is ``limit`` cycles without a handshake on any port. (Counting only
        outputs and announcements as progress, as before, timed out in the
        middle of a legal pass of 16 tokens at ``default``: such a pass
        computes for about 50,000 cycles before its first output, more than
        that limit; the "T = 16 hang" at ``default``.) The longest legal
        stretch without a handshake is the replay of the two weight buffers
        to every token of a pass after their last word arrived."""
        from ..hw.moe.common import geom
        g = geom(self.cfg)
        last_progress, done = self.cycle, -1
        limit = limit or (20000 + 40 * self.cfg.expert_rows * self.cfg.planes
                          + 2 * self.T * (g.hb_depth + g.ext_depth))
        while len(self.outputs) < self.n_tokens() or len(self.stats) < self._passes():
            await RisingEdge(self.dut.clk)
            prog = self.transfers
            if prog != done:
                last_progress, done = self.cycle, prog
            if self.cycle - last_progress > limit:
                self.dut._log.error("state at timeout: %s", self.debug_state())
                for row in getattr(self, "trace", [])[-60:]:
                    self.dut._log.error("trace %s", row)
                for b in range(self.B):
                    self.dut._log.error("bank %d commands %s", b, [(c, x["region"], x["slot"],
                                        x["offset"], x["count"]) for c, x in self.hb_cmds[b][-40:]])
                self.dut._log.error("decisions %s", [(n["expert"], n["tokens"], n["precision"],
                                    s_.hb, s_.slot) for (_, n), (s_, _f) in
                                    zip(self.needs[-20:], self.decisions[-20:])])
                raise AssertionError(
                    f"no handshake on any port for {limit} cycles, at cycle {self.cycle}: "
                    f"{len(self.outputs)} of {self.n_tokens()} "
                    f"outputs, {len(self.stats)} of {self._passes()} passes, {len(self.needs)} "
                    f"announcements (seed {cocotb.RANDOM_SEED})")
        for _ in range(30):
            await RisingEdge(self.dut.clk)

    def debug_state(self):
        """Internal FSM states and a few registers (for a timeout report)."""
        out = {}
        for path in ("issue.issue_state", "issue.running", "issue.in_router", "issue.j",
                     "issue.pi", "issue.up_inflight", "issue.slack", "issue.t", "issue.rem",
                     "scheduler.scheduler_state", "scheduler.ps", "scheduler.announced",
                     "scheduler.progress__decided__0", "scheduler.progress__decided__1", "scheduler.level",
                     "hb_reader.hb_reader_state", "hb_reader.j", "hb_reader.ph",
                     "hb_reader.acc", "ext_writer.ext_state", "ext_writer.running",
                     "ext_writer.j", "softmax.softmax_state", "output.output_state",
                     "tokens.tokens_state", "tokens.passes__valid", "vector_unit.ser_valid",
                     "vector_unit.bi", "topk.o__valid", "hb_reader.pad0", "hb_reader.pad1",
                     "issue.q", "issue.c", "issue.grp", "issue.proj", "issue.hb_buf__pos",
                     "issue.ext_buf__pos", "issue.hb_buf__free", "issue.ext_buf__free", "issue.hbn",
                     "issue.extn", "issue.tp", "issue.ent", "issue.src", "ext_writer.pe",
                     "ext_writer.planes", "ext_writer.p0", "ext_writer.proj", "ext_writer.grp",
                     "hb_buffer.wp__0", "hb_buffer.wp__1", "ext_buffer.wp__0", "ext_buffer.wp__1",
                     "issue.s1_valid", "issue.s2_valid", "pe_array.o__valid",
                     "vector_unit.i__ready", "issue.fifo.level", "issue.fifo.o__valid",
                     "pe_array.tags.level", "pe_array.tags.o__valid", "pe_array.out.skid_valid",
                     "ext_buffer.wp__2", "ext_buffer.wp__3", "hb_reader.rp0.raw.inner_level",
                     "hb_reader.rp0.pq.level", "hb_reader.rp1.pq.level",
                     "vector_unit.ser", "vector_unit.ends", "output.y__out_done",
                     "hb_reader.consts__out_loaded", "hb_reader.consts__lut_loaded", "softmax.ready",
                     "hb_reader.const_busy", "hb_reader.loaded0", "hb_reader.loaded1",
                     "vector_unit.gates_ready", "vector_unit.gates__0__idle",
                     "vector_unit.logits__0__idle", "issue.progress__sel_done", "issue.progress__no_routed__1"):
            h = self.dut
            try:
                for part in path.split("."):
                    h = getattr(h, part)
                out[path] = hex(int(h.value))
            except Exception:
                out[path] = "?"
        out["queues"] = {"tok": len(self.tok_q), "src": len(self.src_q), "ext": len(self.ext_q),
                         "hb": [len(q) for q in self.hb_q]}
        for b in range(self.B):
            served = self.fired_count[f"hb{b}"]
            tot, rows = 0, []
            for cyc, c in self.hb_cmds[b]:
                n = 1 if (c["region"] == 0 and c["slot"] not in self.slots) else c["count"]
                rows.append((cyc, c["region"], c["slot"], c["offset"], c["count"], tot))
                tot += n
            out[f"hb{b}_served"] = served
            out[f"hb{b}_last_cmds"] = rows[-6:]
        for path in ("hb_reader.recvd0", "hb_reader.recvd1", "hb_reader.dq0.level",
                     "hb_reader.dq0.o__valid", "hb_reader.rp0.cmdq.level",
                     "hb_reader.rp0.unpack_state", "hb_reader.rp0.ri", "hb_reader.rp0.cur",
                     "hb_reader.rp0.have"):
            h = self.dut
            try:
                for part in path.split("."):
                    h = getattr(h, part)
                out[path] = hex(int(h.value))
            except Exception:
                out[path] = "?"
        return out

    def _passes(self):
        return sum(-(-len(s[1]) // self.T) for s in self.steps)

    def golden(self):
        """Golden results per step, with the recorded decisions as sources."""
        out, plans = [], []
        di = 0
        for layer, xs, roles, masks, _ in self.steps:
            lay = self.layers[layer]
            res = gb.batched_forward(lay, xs, roles, masks, batch_tokens=self.T)
            srcs = []
            for plan in res.passes:
                s = {}
                for job in plan.routed:
                    src, fault = self.decisions[di] if di < len(self.decisions) else (gb.LPDDR, None)
                    s[job.expert] = (src, fault)
                    di += 1
                srcs.append(s)
            res2 = gb.batched_forward(lay, xs, roles, masks, batch_tokens=self.T,
                                      sources=[{e: v[0] for e, v in s.items()} for s in srcs])
            assert np.array_equal(res.y, res2.y)
            out.append(res2)
            plans.append(srcs)
        return out, plans

    def check(self, *, faults=False):
        """Everything against the golden, with the recorded decisions as
        sources: every output (:meth:`output_board`), announcement, prefetch
        candidate, HB read and pass counter, the stream rules on every
        output port. Raises AssertionError naming the first mismatches;
        returns the golden ``(results, sources)``."""
        errors = list(self.errors)
        errors += [f"{s.name}: {msg} at cycle {c}" for s in self.sinks
                   for c, msg in s.rule_violations]
        results, srcs = self.golden()
        board = self.output_board(results, srcs)
        for o in self.outputs:
            board.check(o)
        try:
            board.finish(f"{self.n_tokens()} tokens")
        except AssertionError:
            errors += board.errors
        errors += self.check_announcements(results)
        if self.cand_beats is not None:
            errors += self.check_candidates(results)
        errors += self.check_hb_reads(results, srcs)
        errors += self.check_stats(results, srcs, faults)
        if errors:
            raise AssertionError(f"{len(errors)} mismatches (seed {cocotb.RANDOM_SEED}); first: "
                                 + "; ".join(errors[:6]))
        return results, srcs

    def output_board(self, results, srcs):
        """A kit :class:`~elmoe3d.tb.kit.Scoreboard` expecting every token's
        output in order: ``last`` on each step's final token; a faulted pass's
        outputs (a recorded decision with a fault) must carry ``error``, every
        other output no ``error`` and ``y`` bit for bit the golden layer's
        (bit 0 flipped with ``$ELMOE_GOLDEN_MUTATION``)."""
        cfg = self.cfg

        def differs(want, got):
            exp, exp_last, fault, plan, pass_srcs, t = want
            _, y, err, last = got
            msgs = []
            if last != exp_last:
                msgs.append(f"last={last}, expected {exp_last}")
            if fault:
                if not err:
                    msgs.append("a faulted pass must flag error")
            else:
                if err:
                    msgs.append("unexpected error")
                if list(y) != exp:
                    bad = [h for h in range(cfg.hidden) if y[h] != exp[h]]
                    jobs = [(j.expert, j.tokens, j.hb_planes, j.ext_planes, j.lsb_planes,
                             pass_srcs.get(j.expert, (None,))[0])
                            for j in plan.jobs if t in j.tokens]
                    msgs.append(f"{len(bad)} outputs differ, first y[{bad[0]}]={y[bad[0]]} "
                                f"expected {exp[bad[0]]}; its jobs (expert, tokens, HB, LPDDR, "
                                f"LSB planes, source): {jobs}")
            return "; ".join(msgs) or None

        board = Scoreboard("output", compare=differs)
        for si, ((layer, xs, roles, masks, _), res) in enumerate(zip(self.steps, results)):
            for pi, plan in enumerate(res.passes):
                fault = any(f for _, f in srcs[si][pi].values())
                for t in range(len(plan.roles)):
                    exp = [int(a) ^ 1 if self.mutate else int(a) for a in res.y[plan.first + t]]
                    board.expect((exp, int(plan.first + t == len(xs) - 1), fault, plan,
                                  srcs[si][pi], t),
                                 f"(step {si} pass {pi} token {t}, {R(plan.roles[t]).name})")
        return board

    def check_announcements(self, results):
        """Every beat on ``need`` against the golden pass plan: per pass its
        routed experts in announce order, ``last`` on the final one, or one
        ``none`` beat (``last``) for a pass that routes no expert."""
        errors = []
        exp = []
        for (layer, *_), res in zip(self.steps, results):
            for plan in res.passes:
                nr = len(plan.routed)
                got_pass = [(layer, j.expert, len(j.tokens), int(j.precision), int(i == nr - 1), 0)
                            for i, j in enumerate(plan.routed)]
                if len({x[1] for x in got_pass}) != len(got_pass):
                    errors.append("golden plan repeats an expert")          # cannot happen
                exp += got_pass or [(layer, 0, 0, 0, 1, 1)]
        got = [(p["layer"], p["expert"], p["tokens"], p["precision"], p["last"], p["none"])
               for p in self.need_beats]
        if got != exp:
            i = next((i for i, (a, b) in enumerate(zip(got, exp)) if a != b), min(len(got), len(exp)))
            errors.append(f"announcements differ from the golden plan at {i} of {len(exp)}: "
                          f"got {got[i:i + 2]} expected {exp[i:i + 2]}")
        return errors

    def check_candidates(self, results):
        """Every beat on ``cand`` (a datapath built for prefetch) against the
        golden candidates of each DRAFT pass
        (:func:`elmoe3d.golden.moe_batched.prefetch_candidates`): announce
        order, ``count`` on each, ``last``, or one ``none`` beat; nothing for
        another pass. ``$ELMOE_MOE_PF_LAST`` mutates the golden (each token's
        lowest-ranked outside expert): the check must then fail."""
        last = knob("moe_pf_last", False)
        exp = []
        for (layer, xs, roles, masks, _), res in zip(self.steps, results):
            for plan in res.passes:
                c = gb.prefetch_candidates(plan, masks, self.cfg.top_k, last=last)
                if c is None:
                    continue
                order = gb.announce_order(c)
                exp += [(e, c[e], len(c), int(i == len(order) - 1), 0)
                        for i, e in enumerate(order)] or [(0, 0, 0, 1, 1)]
        got = [(p["expert"], p["tokens"], p["count"], p["last"], p["none"])
               for p in self.cand_beats]
        if got != exp:
            i = next((i for i, (a, b) in enumerate(zip(got, exp)) if a != b),
                     min(len(got), len(exp)))
            return [f"prefetch candidates differ from the golden at {i} of {len(exp)}: "
                    f"got {got[i:i + 2]} expected {exp[i:i + 2]}"]
        self.cand_checked = len(got)
        return []

    def needed_hb_words(self, layer, plan, srcs):
        """Per bank, the set of HB words the contract lets a pass read."""
        cfg = self.cfg
        d = gl.dense_layout(cfg)
        idx = d.record_index
        out = []
        for b in range(self.B):
            need = set()
            need |= {(1, None, d.router_base(layer) + w) for w in range(d.router_words)}
            w0, nw, _ = gb.record_words(cfg, idx["out"],
                                        cfg.hidden // cfg.pes + 1 + len(gb.lut_share(cfg, b)))
            need |= {(1, None, d.params_base(layer) + w0 + w) for w in range(nw)}
            for job in plan.jobs:
                f, c = gb.expert_record_range(cfg, job.expert)
                w0, nw, _ = gb.record_words(cfg, f, c)
                need |= {(1, None, d.params_base(layer) + w0 + w) for w in range(nw)}
                if job.shared:
                    base = d.shared_base(layer, job.expert - cfg.experts)
                    need |= {(1, None, base + gl.interleaved_offset(seg, q, c, cfg.planes))
                             for seg in gl.segments(cfg) for q in job.hb_planes
                             for c in range(seg.chunks)}
                else:
                    src = srcs.get(job.expert, (gb.LPDDR, None))[0]
                    if src.hb:
                        need |= {(0, src.slot, w) for w in range(cfg.slot_words)}
                    if job.lsb_planes:
                        need |= {(0, src.lsb_slot, w)
                                 for w in range(len(job.lsb_planes) * cfg.expert_rows)}
            out.append(need)
        return out

    def check_hb_reads(self, results, srcs):
        """Every HB word a pass reads is one it needs, read once; every
        needed word is read (so no expert's weights are requested twice
        within a pass, and nothing is fetched on the side)."""
        errors = []
        passes = []
        for si, ((layer, *_), res) in enumerate(zip(self.steps, results)):
            for pi, plan in enumerate(res.passes):
                passes.append(self.needed_hb_words(layer, plan, srcs[si][pi]))
        self.hb_reads_checked = 0
        for b in range(self.B):
            pi = 0
            left = set(passes[0][b]) if passes else set()
            for cyc, cmd in self.hb_cmds[b]:
                while not left and pi + 1 < len(passes):
                    pi += 1
                    left = set(passes[pi][b])
                words = {(cmd["region"], cmd["slot"] if cmd["region"] == 0 else None,
                          cmd["offset"] + w) for w in range(cmd["count"])}
                extra = words - left
                if extra:
                    errors.append(f"bank {b} pass {pi}: read of words not needed or read before "
                                  f"in this pass at cycle {cyc}: {sorted(extra)[:3]}")
                left -= words
                self.hb_reads_checked += len(words)
            if left or pi + 1 != len(passes):
                errors.append(f"bank {b}: {len(left)} needed HB words never read "
                              f"(pass {pi} of {len(passes)})")
        return errors

    def check_stats(self, results, srcs, faults):
        errors = []
        cfg = self.cfg
        i = 0
        for si, ((layer, *_), res) in enumerate(zip(self.steps, results)):
            for pi, plan in enumerate(res.passes):
                if i >= len(self.stats):
                    errors.append(f"missing stats of pass {i}")
                    return errors
                _, st = self.stats[i]
                s = {e: v[0] for e, v in srcs[si][pi].items()}
                fault = any(f for _, f in srcs[si][pi].values())
                tr = gb.pass_traffic(cfg, gb.with_sources(self.layers[layer], plan, s))
                exp = {"hb_words": sum(tr.hb_words), "ext_beats": tr.ext_beats,
                       "mac_beats": tr.mac_beats, "experts": len(plan.routed),
                       "expert_tokens": sum(len(j.tokens) for j in plan.routed),
                       "tokens": len(plan.roles), "error": int(fault)}
                for key, val in exp.items():
                    if fault and key in ("hb_words", "ext_beats"):
                        continue
                    if st[key] != val:
                        errors.append(f"pass {i} stats: {key}={st[key]}, expected {val}")
                i += 1
        return errors

    def sample_coverage(self, name, results, srcs, fault_kind="none"):
        """Sample the coverage model over every token, job and pass of the
        test. Idle and back-pressure are per pass: ``tok_idle`` if a token
        of the pass was held back, ``o_backpressure`` if one of its outputs
        waited, ``hb_idle`` / ``ext_idle`` if HB data / an LPDDR beat was
        held back while the pass was in flight (its first token accepted ..
        its counters out)."""
        st, sj, sp = _coverage()
        T = self.T
        log = self.log

        def size_bin(x):
            return "1" if x == 1 else ("T" if x == T else "some")

        def any_in(events, lo, hi):           # an event in (lo, hi]; events ascending
            i = bisect.bisect_right(events, lo)
            return i < len(events) and events[i] <= hi
        hb_ev = sorted(c for b in range(self.B) for c in log[f"hb{b}_idle"])
        ext_ev, tok_ev, o_ev = log["ext_idle"], log["tok_idle"], log["o_bp"]
        tokc = self.tok_cycles
        delays = [dl for _, dl in log["decision_delay"]]
        di = 0
        g0 = 0                                  # global index of the step's first token
        pi_all = 0                              # global pass index (= stats order)
        for si, ((layer, xs, roles, masks, facts), res) in enumerate(zip(self.steps, results)):
            for pi, plan in enumerate(res.passes):
                n = len(plan.roles)
                g, gl_ = g0 + plan.first, g0 + plan.first + n - 1
                end = self.stats[pi_all][0]
                pass_err = bool(self.stats[pi_all][1]["error"])
                tok_idle = any_in(tok_ev, tokc[g - 1] if g else -1, tokc[gl_])
                o_bp = any_in(o_ev, self.outputs[g - 1][0] if g else -1, self.outputs[gl_][0])
                hb_idle = any_in(hb_ev, tokc[g] - 1, end)
                ext_idle = any_in(ext_ev, tokc[g] - 1, end)
                for t in range(n):
                    gi = plan.first + t
                    mk = masks[gi]
                    mkind = ("none" if not mk.any() else "all" if mk.all() or
                             (mk == self.resident_mask(layer)).all() and mk.sum() > 1
                             else "one" if mk.sum() == 1 else "some")
                    st({"role": R(roles[gi]).name, "mask": mkind,
                        "pass_size": size_bin(n),
                        "experts": "some" if plan.sel[t] or plan.jobs else "none",
                        "o_bp": o_bp, "tok_idle": tok_idle})
                for job in plan.jobs:
                    if job.shared:
                        source, delay = "shared", False
                    else:
                        # the golden plan carries the recorded decision's planes per port
                        source = ("whole" if job.whole_hb else "split" if job.split
                                  else "hb" if job.hb_planes else "lpddr")
                        delay = di < len(delays) and delays[di] > 0
                        di += 1
                    sj({"source": source, "precision": job.precision.name,
                        "tokens": size_bin(len(job.tokens)), "delay": delay,
                        "hb_idle": hb_idle, "ext_idle": ext_idle})
                fault = next((f for _, f in srcs[si][pi].values() if f), None)
                sp({"fault": fault or "none", "error": pass_err})
                pi_all += 1
            g0 += len(xs)
        _TRANSFERS[self.cfg.batch_tokens, self.cfg.pes, self.cfg.lanes] += self.transfers
        write_coverage("moe_layer", run=f"{name} {self.cfg.slice_bits}-{self.cfg.pes}-"
                       f"{self.cfg.batch_tokens}", transactions=self.transfers)


# ---------------------------------------------------------------------------------------------
# stimulus


def _mask(tb, layer, kind):
    res = tb.resident_mask(layer)
    ids = np.flatnonzero(res)
    m = np.zeros(tb.E, bool)
    if kind == "one" and len(ids):
        m[tb.rand.choice(list(ids))] = True
    elif kind == "all":
        m = res.copy()
    elif kind == "some" and len(ids):
        pick = tb.np_rng.choice(ids, size=int(tb.np_rng.integers(1, len(ids) + 1)), replace=False)
        m[pick] = True
    return m


def random_steps(tb, tokens_per_mode, *, roles=(R.FULL, R.DRAFT, R.VERIFY), max_step=None,
                 layers=None, mixed=0.3, same=0.15):
    """Steps of 1 .. 1.5 T tokens (so also steps of two passes), mostly one
    role per step (as the controller sends them), sometimes mixed. A share
    ``same`` of the steps are one token repeated min(T, max_step) times with
    one mask (so every expert the pass runs has all its tokens -- all T at
    the default step size --: for DRAFT with a one-hot mask one expert,
    otherwise the token's top-k)."""
    T = tb.T
    max_step = max_step or max(1, T + T // 2)
    left = {r: tokens_per_mode for r in roles}
    layers = layers or list(range(tb.cfg.layers))
    kinds = ["none", "one", "all", "some", "some"]
    while any(v > 0 for v in left.values()):
        if same and tb.rand.random() < same:
            layer = tb.rand.choice(layers)
            n = min(T, max_step)
            r = tb.rand.choice([r for r in roles if left[r] > 0])
            xs = np.repeat(gm.random_tokens(tb.np_rng, tb.layers[layer], 1), n, axis=0)
            mk = _mask(tb, layer, tb.rand.choice(["one", "one", "all", "some"]))
            tb.add_step(layer, xs, [r] * n, [mk] * n)
            left[r] -= n
            continue
        # (same = 0 draws exactly the steps of the earlier version of this
        # generator, so a recorded seed replays its steps)
        n = tb.rand.randint(1, max_step)
        if tb.rand.random() < 0.3:
            n = tb.rand.choice([1, min(T, max_step)])
        layer = tb.rand.choice(layers)
        if tb.rand.random() < mixed:
            rs = [tb.rand.choice(roles) for _ in range(n)]
        else:
            r = tb.rand.choice([r for r in roles if left[r] > 0])
            rs = [r] * n
        xs = gm.random_tokens(tb.np_rng, tb.layers[layer], n)
        if tb.rand.random() < 0.05:
            xs[:] = tb.rand.choice((-128, 127))
        masks = [_mask(tb, layer, tb.rand.choice(kinds)) for _ in range(n)]
        tb.add_step(layer, xs, rs, masks)
        for r in rs:
            left[r] -= 1


async def _run_random(dut, name, *, stress=False, policy="random", faults=None, hb_idle=0.2):
    tb = MoETB(dut, stress=stress, idle=0.2, bp=0.25, policy=policy, decision_delay=(0, 12),
               ext_latency=12)
    if faults:
        tb.fault = faults
    await tb.start()
    tb.set_idle(hb_idle, names={f"hb_data__{b}" for b in range(tb.B)})
    max_step = knob("moe_max_step", 0) or None
    if knob("moe_none_step", True):
        # a DRAFT step with no allowed expert: its tokens run no routed expert
        # (and, without shared experts, none at all: the router and the combine only)
        n = tb.rand.randint(1, max_step or tb.T)
        none = np.zeros(tb.E, bool)
        tb.add_step(0, gm.random_tokens(tb.np_rng, tb.layers[0], n), [R.DRAFT] * n, [none] * n)
    random_steps(tb, knob("moe_tokens", 20), max_step=max_step, same=knob("moe_same", 0.15))
    await tb.drain()
    results, srcs = tb.check(faults=bool(faults))
    tb.sample_coverage(name, results, srcs)
    counts = collections.Counter(R(r).name for s in tb.steps for r in s[2])
    dut._log.info("%s: %d tokens bit-exact (%s), %d passes, %d announcements, %d HB words "
                  "checked once each, %d transfers", name, tb.n_tokens(), dict(counts),
                  len(tb.stats), len(tb.needs), tb.hb_reads_checked, tb.transfers)
    return tb


@cocotb.test()
async def random_batches(dut):
    """Random steps (1 .. 1.5 T tokens, roles FULL/DRAFT/VERIFY, masks
    none/one-hot/all/some of the resident experts), random HB / split /
    LPDDR decisions after random delays, random idle and back-pressure on
    every port: outputs, announcements, HB reads and counters against the
    golden batched layer."""
    await _run_random(dut, "random")


@cocotb.test()
async def stress_batches(dut):
    """As random_batches on a layer whose requantisers saturate often, with
    HB data never held back (the other inputs idle at random), so passes
    also run with the HB port at full rate."""
    await _run_random(dut, "stress", stress=True, hb_idle=0.0)


@cocotb.test()
async def faults(dut):
    """Faults end streams cleanly: an HB read of a slot that is not resident
    (one error beat), a resident slot's read cut short on one bank by an
    error beat or by an early last (the reader pads the rest of the count),
    an LPDDR command cut short by an error beat, or by an early last. The pass's outputs carry ``error``; every other pass is bit
    exact and the datapath carries on without a reset."""
    # one slot left empty: the controller's "HB" decision naming it is refused
    tb = MoETB(dut, idle=0.1, bp=0.1, policy="random", decision_delay=(0, 4), ext_latency=8,
               free_slots=1)
    await tb.start()
    for kind in ("hb_refused", "hb_error", "hb_early_last", "ext_error", "ext_early_last"):
        if kind == "hb_refused" and tb._free_slot() is None:
            continue
        # an HB short read needs a resident expert read from HB: asked more often
        tb.fault = (kind, 0.6 if kind in ("hb_error", "hb_early_last") else 0.3)
        random_steps(tb, knob("moe_fault_tokens", 12), roles=(R.FULL, R.VERIFY))
        await tb.drain()
        tb.fault = None
    results, srcs = tb.check(faults=True)
    tb.sample_coverage("faults", results, srcs)
    nf = sum(1 for s in srcs for p in s for v in p.values() if v[1])
    assert nf > 0, "no fault was injected"
    dut._log.info("faults: %d faulted jobs flagged, %d tokens, others bit-exact", nf, tb.n_tokens())


@cocotb.test()
async def late_constants(dut):
    """HB bank 0 slow (90 % idle): passes that run no expert (DRAFT tokens
    with no allowed expert) end their issue long before bank 0's pass
    constants (output records, SiLU table) have arrived; then passes with
    experts on the other layer. The pass's counters must count every HB
    word of the pass, and the next pass in the same buffer must not start
    on the constants of the previous one (regression: the HB word count
    was taken when the issue stage ended the pass, and the pass's end
    could clear the constants' "loaded" flags before the last constant
    arrived)."""
    tb = MoETB(dut, policy="random", decision_delay=(0, 3))
    await tb.start()
    tb.set_idle(0.9, names={"hb_data__0"})
    none = np.zeros(tb.E, bool)
    for rep in range(knob("moe_late_steps", 2)):
        for layer in range(tb.cfg.layers):
            n = tb.rand.randint(1, tb.T)
            xs = gm.random_tokens(tb.np_rng, tb.layers[layer], n)
            tb.add_step(layer, xs, [R.DRAFT] * n, [none] * n)
            other = (layer + 1) % tb.cfg.layers
            n = tb.rand.randint(1, tb.T)
            xs = gm.random_tokens(tb.np_rng, tb.layers[other], n)
            tb.add_step(other, xs, [tb.rand.choice([R.FULL, R.VERIFY, R.DRAFT]) for _ in range(n)],
                        [_mask(tb, other, "all")] * n)
    await tb.drain()
    results, srcs = tb.check()
    tb.sample_coverage("late_constants", results, srcs)
    dut._log.info("late_constants: %d tokens, %d passes exact with bank 0 slow", tb.n_tokens(),
                  len(tb.stats))


@cocotb.test()
async def split_equals_full(dut):
    """Split VERIFY equals FULL bit for bit: the same tokens run once as FULL
    with every expert from LPDDR and once as VERIFY with every resident
    expert split (MSB planes from HB, LSB planes from LPDDR, concurrently);
    the two output streams are identical (and equal to the golden layer)."""
    tb = MoETB(dut, idle=0.1, bp=0.1, policy="lpddr", decision_delay=(0, 3))
    await tb.start()
    layer = 0
    steps = []
    for _ in range(knob("moe_split_steps", 4)):
        n = tb.rand.randint(1, tb.T)
        steps.append(gm.random_tokens(tb.np_rng, tb.layers[layer], n))
    none = np.zeros((tb.T, tb.E), bool)
    for xs in steps:
        tb.add_step(layer, xs, [R.FULL] * len(xs), none[:len(xs)])
    await tb.drain()
    first = len(tb.outputs)
    tb.policy = "split"
    for xs in steps:
        tb.add_step(layer, xs, [R.VERIFY] * len(xs), none[:len(xs)])
    await tb.drain()
    tb.check()
    full = [o[1] for o in tb.outputs[:first]]
    split = [o[1] for o in tb.outputs[first:]]
    assert full == split, "split VERIFY differs from FULL"
    nsplit = sum(1 for (src, _), (_, nd) in zip(tb.decisions, tb.needs) if src.hb)
    assert nsplit > 0, "no expert ran split"
    dut._log.info("split_equals_full: %d tokens, %d split jobs, identical", len(full), nsplit)


#: throughput points: (name, token role, decision policy, experts the tokens
#: route to): every expert from LPDDR; DRAFT from HB; split VERIFY (MSB
#: planes from HB, LSB from LPDDR); whole-resident VERIFY and AR (both plane
#: groups from HB slots, nothing from LPDDR)
THROUGHPUT_POINTS = (("FULL", R.FULL, "lpddr", "all"), ("DRAFT", R.DRAFT, "hb", "all"),
                     ("VERIFY", R.VERIFY, "split", "all"),
                     ("VERIFY_whole", R.VERIFY, "whole", "whole"),
                     ("FULL_whole", R.FULL, "whole", "whole"))


@cocotb.test()
async def throughput(dut):
    """No stalls: cycles per pass for passes of 1, 4, 16 and ``T`` tokens
    (``T`` = a whole verification of 16 requests at the longest draft) for
    each of :data:`THROUGHPUT_POINTS`, against the analytic bound (HB words
    per bank, LPDDR beats at the configured bandwidth, PE steps); figures to
    ``$ELMOE_MEASURE_OUT``.

    Layer 0 has a routing-trace router (:func:`elmoe3d.golden.moe_batched.trace_layer`)
    and its tokens rank the experts at random, so every expert is routed to
    about equally; the whole-resident points rank the ``S / 2`` experts that
    hold both plane groups first (MSB groups in slots ``0 .. S/2-1``, LSB
    groups in ``S/2 .. S-1``), the others all ``S`` experts MSB-resident."""
    cfg = Config(**params()["config"])
    S, E = cfg.tag_slots, cfg.experts
    half = [(0, e) for e in range(min(E, S // 2))]
    msb_all = [(0, e) for e in range(E)][:S]
    tb = MoETB(dut, policy="hb", ext_latency=knob("moe_ext_latency", 20), resident=msb_all,
               lsb_slots=0)
    tb.layers[0] = gb.trace_layer(tb.layers[0])
    tb.dense = gl.dense_image(cfg, tb.layers)

    def residency(whole):
        res = half if whole else msb_all
        tb.slot_of = {p: s for s, p in enumerate(res)}
        tb.lsb_of = {p: len(res) + i for i, p in enumerate(res)} if whole else {}
        tb.slots = {}
        for (l, e), s in tb.slot_of.items():
            lay = tb.layers[l]
            tb.slots[s] = gl.hb_slot_image(cfg, lay.wg[e], lay.wu[e], lay.wd[e])
        for (l, e), s in tb.lsb_of.items():
            lay = tb.layers[l]
            tb.slots[s] = gl.hb_slot_image(cfg, lay.wg[e], lay.wu[e], lay.wd[e], group=1)
    await tb.start()
    T = tb.T
    figures = {}
    npass = knob("moe_passes", 4)
    sizes = sorted({1, min(4, T), min(16, T), T})
    # ELMOE_MOE_POINTS: only these points, e.g. "FULL_T16,DRAFT_T1" (default: all)
    only = {p for p in knob("moe_points", "").split(",") if p}
    for name, role, policy, route in THROUGHPUT_POINTS:
        if policy == "whole" and not gl.lsb_group_fits(cfg):
            continue
        residency(policy == "whole")
        for size in sizes:
            key = f"{name}_T{size}"
            if only and key not in only:
                continue
            tb.policy = policy
            s0, o0 = len(tb.steps), len(tb.stats)
            allowed = tb.resident_mask(0)
            pool = [e for _, e in half] if route == "whole" else list(range(E))
            for _ in range(npass):
                ranks = []
                for _t in range(size):
                    first = list(tb.np_rng.permutation(pool))
                    ranks.append(first + [e for e in range(E) if e not in first])
                xs = gb.trace_tokens(tb.np_rng, tb.layers[0], ranks)
                tb.add_step(0, xs, [role] * size, [allowed] * size)
            await tb.drain()
            results, srcs = tb.check()
            ends = [c for c, st in tb.stats[o0:]]
            bounds = []
            for res, s in zip(results[s0:], srcs[s0:]):
                for plan, src in zip(res.passes, s):
                    tr = gb.pass_traffic(tb.cfg, gb.with_sources(tb.layers[0], plan,
                                                                 {e: v[0] for e, v in src.items()}))
                    bounds.append((tr.bound, tr.hb_beats, tr.ext_cycles, tr.mac_beats,
                                   sum(tr.hb_words), tr.ext_beats, len(plan.routed)))
            stats = [st for _, st in tb.stats[o0:]]
            # steady state: the interval between consecutive pass completions
            per_pass = (ends[-1] - ends[0]) / (len(ends) - 1)
            bound = float(np.mean([b[0] for b in bounds[1:]]))
            which = ("HB", "LPDDR", "PE")[int(np.argmax([np.mean([b[i] for b in bounds[1:]])
                                                          for i in (1, 2, 3)]))]
            figures[key] = {
                "tokens_per_pass": size, "passes": len(ends), "role": role.name,
                "policy": policy,
                "cycles_per_pass": per_pass, "bound_cycles_per_pass": bound,
                "efficiency": bound / per_pass, "bound_by": which,
                "hb_beats_per_pass": float(np.mean([b[1] for b in bounds])),
                "ext_cycles_per_pass": float(np.mean([b[2] for b in bounds])),
                "ext_beats_per_pass": float(np.mean([b[5] for b in bounds])),
                "mac_beats_per_pass": float(np.mean([b[3] for b in bounds])),
                "ext_beats_per_expert": float(sum(b[5] for b in bounds)
                                              / max(1, sum(b[6] for b in bounds))),
                "hb_words_per_token": float(np.mean([st["hb_words"] for st in stats])) / size,
                "ext_beats_per_token": float(np.mean([st["ext_beats"] for st in stats])) / size,
                "experts_per_pass": float(np.mean([st["experts"] for st in stats])),
                "tokens_per_expert": float(sum(st["expert_tokens"] for st in stats)
                                           / max(1, sum(st["experts"] for st in stats))),
                "counter_cycles_per_pass": float(np.mean([st["cycles"] for st in stats]))}
            dut._log.info("%s: %.1f cycles/pass, bound %.1f (%s), efficiency %.3f", key,
                          per_pass, bound, which, bound / per_pass)
    out = os.environ.get("ELMOE_MEASURE_OUT")
    if out:
        # a run of some points (ELMOE_MOE_POINTS) updates those of an earlier
        # run at the same geometry
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(path.read_text()) if path.exists() else {}
        if old.get("config") == tb.cfg.to_dict():
            figures = {**old.get("figures", {}), **figures}
        path.write_text(json.dumps({"config": tb.cfg.to_dict(), "figures": figures}, indent=2))


@cocotb.test(skip=os.environ.get("ELMOE_SPEED") is None)
async def speed_probe(dut):
    import time
    from cocotb.triggers import ClockCycles
    await start_clock_and_reset(dut)
    t = time.time()
    await ClockCycles(dut.clk, 20000)
    a = time.time() - t
    t = time.time()
    for _ in range(20000):
        await RisingEdge(dut.clk)
        await ReadOnly()
    b = time.time() - t
    dut._log.info("speed: idle %.0f cycles/s, edge+readonly %.0f cycles/s", 20000 / a, 20000 / b)


@cocotb.test()
async def volume(dut):
    """Run after the random tests of a simulation: their checked handshakes
    (a *transaction* of this block: one handshake on any of its ports -- a
    token, a source decision, an LPDDR beat, an HB read command, an HB data
    word, an announcement, an output, a pass's counters --, every one under
    random idle / back-pressure and checked by the scoreboard) reach
    ``$ELMOE_MOE_MIN_TRANSFERS`` at this geometry."""
    need = knob("moe_min_transfers", 0)
    cfg = Config(**params()["config"])
    got = _TRANSFERS[cfg.batch_tokens, cfg.pes, cfg.lanes]
    dut._log.info("volume: %d transactions (handshakes) checked at T=%d, %d PEs x %d lanes",
                  got, cfg.batch_tokens, cfg.pes, cfg.lanes)
    assert got >= need, f"only {got} transactions checked at this geometry, need {need}"

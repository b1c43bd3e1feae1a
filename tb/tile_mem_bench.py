"""cocotb testbench of the memory side of the tile (``hw/tile.TileMem``, top
``elmoe3d_tile_mem``): the Elastic-SD controller with the real tag unit, the
real HB bank controller and the real stream engine, cocotbext-axi's
``AxiRamRead`` as LPDDR holding the golden LPDDR image
(:func:`elmoe3d.golden.layout.expert_image` of random INT8 experts at
:func:`~elmoe3d.golden.layout.lpddr_expert_base`).

The host script and the golden events come from
:func:`elmoe3d.golden.esd.run_trace` (as for ``tb/esd_ctrl_bench.py``, whose
stream maker, case replay, step routing, host script and end-of-case checks
this bench imports; the bench is a :class:`TB` on its
:class:`~elmoe3d.tb.esd_ctrl_bench.CtrlBench`, the testbench kit's
:class:`~elmoe3d.tb.kit.Bench`: ports, cycle loop, response scoreboard). The bench models only the datapath:

* ``dp_step`` / ``dp_announce`` / ``dp_source`` / ``dp_done``: the golden
  routing of the step's rankings with the controller's mask, announced per
  pass in announce order (``tb/esd_ctrl_bench.StepRouter``);
* per HB-sourced expert (``ExpertSource.hb``): the whole slot read through HB's
  read port of every bank; every word must equal
  :func:`~elmoe3d.golden.layout.hb_slot_image` of the expert the answer names
  (its ``k`` MSB planes), no error beat;
* per expert with LPDDR planes (DRAFT without HB: planes ``0..k-1``; AR /
  VERIFY: all planes, or the ``n-k`` LSB planes of a split): the ``ExtBeat`` s
  on ``ext_pe`` must equal :func:`elmoe3d.golden.ext_stream.split_command` of
  that command on the image, beat for beat (``id`` = the expert's position in
  the pass);
* ``dp_done`` only once every read and every LPDDR beat of the pass is in.

Faults follow the golden's rule (``faults`` maps the ordinal of an LPDDR
expert read, from 0 in canonical = command order, to an ``ExtError``): the
LPDDR model counts commands on the AR channel (a command's bursts are
increasing addresses inside one expert's image; a new command starts at
another expert or at an address not above the last one -- consecutive reads
of one expert always restart at its first segment) and corrupts the first
beat of the faulted command's first burst: ``RRESP`` SLVERR / DECERR, or for
PROTOCOL a wrong ``RLAST`` (early on a longer burst, missing on a 1-beat one)
-- cocotbext-axi cannot, so the bench wraps its R channel's ``send``.

Residency ("no resident slot with wrong data"): before every CONTEXT command
(a KV move) the host waits until the tile is idle (every response in, the
trace quiet), and again after its response, and at the end: then the tag
unit's ``resident`` must equal HB's ``slot_valid`` and the slots the trace
made resident (ALLOCATE -> FILL_END COMMIT, minus INVALIDATE / eviction),
``pending`` must be 0, and every resident slot is read back through the read
ports and must hold exactly the golden MSB planes of its expert.

Random idle cycles and back-pressure on every stream (``$ELMOE_ESD_IDLE``,
default 0.2) and cocotbext-axi pause generators on AR and R
(``$ELMOE_TILE_AXI_PAUSE``, default 0.2). ``$ELMOE_TILE_PLANT`` = ``addr``
plants a wrong fill source (the LPDDR model answers one filled expert's
first burst from another expert's image): the bench must fail.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os

import cocotb
import numpy as np
from amaranth.lib import data
from cocotbext.axi import AxiRamRead, AxiReadBus
from cocotbext.axi.constants import AxiResp

from elmoe3d.config import Config
from elmoe3d.golden import esd as gesd
from elmoe3d.golden import ext_stream as gext
from elmoe3d.golden import layout as gl
from elmoe3d.golden.vocab import ExtError, ExtKind, HBRegion
from elmoe3d.hw import vocab as hv
from elmoe3d.hw.esd_ctrl import HostOp, esd_ports
from elmoe3d.tb.common import params, rng
from elmoe3d.tb.esd_ctrl_bench import CtrlBench, StepRouter, _case, host_script, replay_cases

EK = gesd.EventKind


def lpddr_image(cfg, seed=1):
    """``(mem, slot_images)``: the LPDDR window with every expert's golden image
    (random INT8 weights) and, per ``(layer, expert)``, its HB slot image
    (``(B, slot_words)`` words)."""
    g = np.random.default_rng(seed)
    H, I = cfg.hidden, cfg.ffn
    ws = {(layer, e): [g.integers(-128, 128, size=s, dtype=np.int64)
                       for s in ((I, H), (I, H), (H, I))]
          for layer in range(cfg.layers) for e in range(cfg.experts)}
    return gl.lpddr_image(cfg, ws), {k: gl.hb_slot_image(cfg, *w) for k, w in ws.items()}


def _r_pauses(r, pause, meter, beat):
    """The R channel's pause pattern: random pauses (``pause``), and with a
    bandwidth limit (``meter`` bytes per cycle, ``Config.lpddr_bytes_per_cycle``)
    a fixed pattern that lets a beat through in cycle ``c`` only when
    ``floor((c + 1) * meter / beat) > floor(c * meter / beat)``: never more
    than ``meter`` bytes per cycle on average, whatever the traffic."""
    for c in itertools.count():
        metered = bool(meter) and (c + 1) * meter // beat == c * meter // beat
        yield bool(pause and r.random() < pause) or metered


class FaultyRam:
    """cocotbext-axi ``AxiRamRead`` on the tile's ``m_axi`` port, with pause
    generators, the LPDDR bandwidth of ``cfg`` (an R-channel pause pattern)
    and the golden fault rule (module doc)."""

    def __init__(self, dut, cfg, mem, r, pause, faults, plant=None):
        self.cfg, self.faults, self.plant = cfg, faults, plant
        self.ram = AxiRamRead(AxiReadBus.from_prefix(dut, "m_axi"), dut.clk, None, mem=mem)
        self.ram.log.setLevel(logging.WARNING)      # a log line per burst slows the run
        if pause:
            self.ram.ar_channel.set_pause_generator(r.random() < pause for _ in itertools.count())
        meter = cfg.lpddr_bytes_per_cycle
        if pause or meter:
            self.ram.r_channel.set_pause_generator(_r_pauses(r, pause, meter,
                                                             cfg.axi_beat_bits // 8))
        self.lay = gl.lpddr_layout(cfg)
        self.reset()
        recv, send = self.ram.ar_channel.recv, self.ram.r_channel.send

        async def ar_recv():
            ar = await recv()
            self._burst(int(ar.araddr), int(ar.arlen) + 1)
            return ar

        async def r_send(tr):
            kind, at = self.cur_fault
            if kind is not None and self.beat == at:
                if kind == "plant":
                    tr.rdata = tr.rdata ^ 1
                elif kind == ExtError.PROTOCOL:
                    tr.rlast = not tr.rlast
                else:
                    tr.rresp = AxiResp.SLVERR if kind == ExtError.SLVERR else AxiResp.DECERR
                self.corrupted.append((self.cmd, kind))
            self.beat += 1
            await send(tr)
        self.ram.ar_channel.recv = ar_recv
        self.ram.r_channel.send = r_send

    def reset(self):
        self.cmd = -1                 # ordinal of the command the last burst belongs to
        self.last = None              # (expert region, address) of the last burst
        self.cur_fault = (None, 0)
        self.beat = 0
        self.corrupted = []
        self.bursts = 0

    def _burst(self, addr, n):
        region = (addr - self.lay.base) // self.cfg.expert_bytes
        first = self.last is None or self.last[0] != region or addr <= self.last[1]
        if first:
            self.cmd += 1
        self.last = (region, addr)
        self.bursts += 1
        self.beat = 0
        kind = self.faults.get(self.cmd) if first else None
        if kind is None and first and self.plant == self.cmd:
            kind = "plant"
        self.cur_fault = (kind, 0)


@cocotb.test()
async def replay(dut):
    """Every case of ``$ELMOE_ESD_CASE`` (one, or a list under ``cases``), the
    tile reset between cases; ``$ELMOE_ESD_OUT`` gets one result each."""
    loaded = _case()
    cfg = Config(**params())
    r = rng()
    idle = float(os.environ.get("ELMOE_ESD_IDLE", "0.2"))
    pause = float(os.environ.get("ELMOE_TILE_AXI_PAUSE", "0.2"))
    plant = os.environ.get("ELMOE_TILE_PLANT")
    mem, images = lpddr_image(cfg, seed=int(loaded.get("image_seed", 1)))
    ram = FaultyRam(dut, cfg, bytes(mem), r, pause, {}, None)

    async def run_one(case):
        ram.reset()
        ram.faults = {int(k): ExtError(v) for k, v in (case.get("faults") or {}).items()}
        ram.plant = int(plant) if plant else None
        return await TB(dut, case, cfg, r, idle, ram, mem, images).run_case()
    await replay_cases(dut, loaded, run_one)


class _Pass:
    """One pass of the datapath model: its experts in announce order (the
    order of the source answers: ``ExpertSource`` does not name the expert),
    what is still to come of it (source answers, HB reads, LPDDR commands)."""

    def __init__(self, order, ntok, pairs):
        self.order, self.ntok, self.pairs = order, ntok, pairs
        self.sources, self.reads, self.ext, self.pos = len(order), 0, 0, 0
        self.done = not order


class TB(CtrlBench):
    """The tile memory side's bench for one case (module doc): the host, the
    datapath model and the residency checks on the kit's ports, one cycle
    loop, the response scoreboard (:class:`~elmoe3d.tb.esd_ctrl_bench.CtrlBench`).

    Parameters
    ----------
    dut
        ``elmoe3d_tile_mem``.
    case : dict
        The golden case.
    cfg : Config
    rand : random.Random
    idle : float
        Idle and back-pressure probability of every stream.
    ram : FaultyRam
        The LPDDR model (its faults set for the case).
    mem, images
        :func:`lpddr_image`.
    """

    def __init__(self, dut, case, cfg, rand, idle, ram, mem, images):
        super().__init__(dut, rand, idle)
        self.case, self.cfg, self.ram, self.mem, self.images = case, cfg, ram, mem, images
        self.t = t = {k: data.Layout.cast(v) for k, v in esd_ports(cfg).items()}
        v = hv.vocab(cfg)
        B, S = cfg.pes, cfg.tag_slots
        self.hb_mask = (1 << cfg.hb_planes_eff) - 1
        self.all_mask = (1 << cfg.planes) - 1
        self.problems = []
        self.faults = ram.faults
        read_t = data.Layout.cast(dut_layout(v, "HBRead", cfg))
        beat_t = data.Layout.cast(dut_layout(v, "HBBeat", cfg))

        self.host = self.source("host_cmd", t["HostCommand"])
        self.announce = self.source("dp_announce", t["ExpertNeed"])
        self.dp_done = self.source("dp_done", t["PassStats"])
        self.rd_cmd = [self.source(f"hb_rd_cmd__{b}", read_t) for b in range(B)]
        self.sink("host_rsp", t["HostResponse"], self.on_response)
        self.sink("trace", t["TraceEvent"], self.on_event)
        self.sink("dp_step", t["StepInfo"], self.on_step)
        self.sink("dp_source", t["ExpertSource"], self.on_source)
        self.sink("ext_pe", data.Layout.cast(v.ExtBeat), self.on_ext)
        for b in range(B):
            self.sink(f"hb_rd__{b}", beat_t, lambda p, b=b: self.on_hb_beat(b, p))

        # residency tracker (from the trace as it comes)
        self.owner = [None] * S             # (layer, expert) allocated into the slot
        self.valid = [False] * S
        # the datapath model
        self.passes = collections.deque()   # announced passes whose experts are not all sourced
        self.open_passes = []               # passes without their dp_done yet
        self.hb_expect = [collections.deque() for _ in range(B)]   # [pass, words, index, what]
        self.ext_expect = collections.deque()    # [pass, beats, index, what]
        self.ext_got = collections.deque()
        self.lpddr_cmds = 0
        self.stats = collections.Counter()
        self.router = StepRouter(case, cfg, self.announce, self.problems)
        # residency checks at idle points; the host's state
        self.check_reads = 0
        self.checks = 0
        self.script = host_script(case)
        self.sent = 0
        self.st = {"mode": "run", "checked": None, "next": "run"}
        self.last_traffic = 0

    # ---- residency tracker --------------------------------------------------------------
    def on_event(self, p):
        self.events.append(p)
        kind, s = p["kind"], p["slot"]
        if kind == EK.ALLOCATE and p["code"] != gesd.AllocResult.NO_VICTIM:
            self.owner[s], self.valid[s] = (p["layer"], p["expert"]), False
        elif kind == EK.FILL_END and p["code"] == gesd.FillEnd.COMMIT:
            self.valid[s] = True
        elif kind == EK.INVALIDATE:
            self.valid[s] = False

    # ---- the datapath model -------------------------------------------------------------
    def pass_stats(self, **fields):
        st = {name: 0 for name, _ in self.t["PassStats"]}
        st.update(fields)
        return st

    def settle(self, rec):
        """``rec``'s ``dp_done`` once its sources, reads and beats are all in."""
        if not rec.done and rec.sources == 0 and rec.reads == 0 and rec.ext == 0:
            rec.done = True
            self.open_passes.remove(rec)
            self.dp_done.put(self.pass_stats(tokens=rec.ntok, experts=len(rec.order),
                                             expert_tokens=rec.pairs),
                             self.later(self.rand.randint(1, 12)))

    def on_step(self, c):
        for ntok, counts, order in self.router.passes(c):
            rec = _Pass(order, ntok, sum(counts.values()))
            if order:
                self.passes.append(rec)
                self.open_passes.append(rec)
            else:
                self.dp_done.put(self.pass_stats(tokens=ntok),
                                 self.later(self.rand.randint(1, 12)))

    def read_slot(self, slot, img, rec, what):
        """A read of the whole of ``slot`` on every bank, each word to equal
        ``img`` (``rec``: the pass waiting for it, or None: a residency
        check's)."""
        for b in range(self.cfg.pes):
            self.rd_cmd[b].put(dict(region=int(HBRegion.EXPERT), slot=slot, offset=0,
                                    count=self.cfg.slot_words, plane=0))
            self.hb_expect[b].append([rec, img[b], 0, f"{what} bank {b}"])

    def on_source(self, c):
        cfg = self.cfg
        if not self.passes:
            self.problems.append("a source answer outside a pass")
            return
        rec = self.passes[0]
        pos = rec.pos
        rec.pos += 1
        rec.sources -= 1
        if rec.sources == 0:
            self.passes.popleft()
        layer, e, ph = self.router.layer, rec.order[pos], self.router.phase
        if c["hb"]:
            self.read_slot(c["slot"], self.images[layer, e], rec,
                           f"L{layer} E{e} slot {c['slot']}")
            rec.reads += cfg.pes
            self.stats["hb_reads"] += 1
        if ph == gesd.Phase.DRAFT:
            lmask = 0 if c["hb"] else self.hb_mask
        else:
            lmask = self.all_mask & ~self.hb_mask if c["hb"] else self.all_mask
        if lmask:
            i = self.lpddr_cmds
            self.lpddr_cmds += 1
            cmd = gext.command(kind=ExtKind.EXPERT, addr=gl.lpddr_expert_base(cfg, layer, e),
                               plane_mask=lmask, id=pos)
            err = self.faults.get(i)
            pe, _fill, _rsp = gext.split_command(cfg, self.mem, cmd, None if err is None
                                                 else (0, err))
            self.ext_expect.append([rec, pe, 0, f"LPDDR read {i} (L{layer} E{e} mask "
                                    f"{lmask:#x}{' fault ' + err.name if err else ''})"])
            rec.ext += 1
            self.stats["lpddr_reads"] += 1
        self.settle(rec)
        self.pump_ext()

    def on_hb_beat(self, b, p):
        if not self.hb_expect[b]:
            self.problems.append(f"bank {b}: an HB beat nobody asked for")
            return
        x = self.hb_expect[b][0]
        rec, words, i, what = x
        sbits = self.cfg.slice_bits
        word = sum(int(s_) << (j * sbits) for j, s_ in enumerate(p["sv"]["slices"]))
        if p["error"] or word != int(words[i]) or p["last"] != (i == len(words) - 1):
            self.problems.append(f"cycle {self.cycle}: HB read {what} word {i}: got {word:#x} "
                                 f"error {p['error']} last {p['last']}, golden "
                                 f"{int(words[i]):#x}")
        x[2] += 1
        self.stats["hb_words"] += 1
        if x[2] == len(words):
            self.hb_expect[b].popleft()
            if rec is not None:
                rec.reads -= 1
                self.settle(rec)
            else:
                self.check_reads -= 1

    def pump_ext(self):
        while self.ext_got and self.ext_expect:
            p = self.ext_got.popleft()
            x = self.ext_expect[0]
            rec, beats, i, what = x
            want = beats[i]
            if p != want:
                self.problems.append(f"cycle {self.cycle}: {what} beat {i}: {p} != golden {want}")
            x[2] += 1
            self.stats["ext_beats"] += 1
            if x[2] == len(beats):
                self.ext_expect.popleft()
                rec.ext -= 1
                self.settle(rec)

    def on_ext(self, p):
        self.ext_got.append(p)
        self.pump_ext()

    # ---- residency checks at idle points ------------------------------------------------
    def check_residency(self, where):
        dut, S = self.dut, self.cfg.tag_slots
        res = dut.resident.value.to_unsigned()
        pend = dut.pending.value.to_unsigned()
        hbv = dut.slot_valid.value.to_unsigned()
        mine = sum(1 << s_ for s_ in range(S) if self.valid[s_])
        if not (res == hbv == mine) or pend or int(dut.fill_done_overflow.value):
            self.problems.append(f"{where} (cycle {self.cycle}): tag unit resident {res:#x} "
                                 f"pending {pend:#x}, HB valid {hbv:#x}, trace says {mine:#x}, "
                                 f"FillDone overflow {int(dut.fill_done_overflow.value)}")
            return
        for s_ in range(S):
            if self.valid[s_]:
                lay, e = self.owner[s_]
                self.read_slot(s_, self.images[self.owner[s_]], None,
                               f"{where}: resident slot {s_} (L{lay} E{e})")
                self.check_reads += self.cfg.pes
        self.checks += 1
        self.stats["resident_checked"] += bin(mine).count("1")

    # ---- the host: commands in order; idle points around every CONTEXT ------------------
    def busy(self):
        return (any(x.busy() for x in self.sources) or any(self.hb_expect) or self.ext_expect
                or self.ext_got or any(not p.done for p in self.open_passes))

    def host_cycle(self):
        """Feed the host queue in order; hold a CONTEXT until the tile is idle
        and the residency check is done, check again once it has been
        answered, and at the end."""
        st, script = self.st, self.script
        mode = st["mode"]
        if mode == "run":
            while self.sent < len(script):
                cmd = script[self.sent][0]
                if cmd["op"] == HostOp.CONTEXT and st["checked"] != self.sent:
                    st["mode"], st["where"] = "idle", f"before CONTEXT {cmd['value']}"
                    return
                self.host.put(cmd)
                self.sent += 1
                if cmd["op"] == HostOp.CONTEXT:
                    st["mode"], st["where"] = "idle", f"after CONTEXT {cmd['value']}"
                    return
            st["mode"], st["where"] = "idle", "end"
        elif mode == "idle":
            if (len(self.responses) == self.sent and not self.busy()
                    and self.cycle - self.last_traffic > 40):
                if st["where"].startswith("before"):
                    st["checked"] = self.sent
                self.check_residency(st["where"])
                st["mode"] = "checking"
        elif mode == "checking" and self.check_reads == 0 and not self.busy():
            st["mode"] = "finished" if st["where"] == "end" else "run"

    def before(self, cycle):
        if int(self.dut.trace__valid.value) or self.busy():
            self.last_traffic = cycle
        self.host_cycle()

    async def run_case(self):
        """Run the case to its end (module doc) and check it; the result record."""
        case, ram, faults = self.case, self.ram, self.faults
        expected = [w for _, w in self.script if w is not None]
        self.expect_responses(case, expected)
        limit = int(os.environ.get("ELMOE_ESD_MAX_CYCLES", "50000000"))
        cycles = await self.run(limit=limit, before=self.before,
                                stop=lambda: self.problems or self.st["mode"] == "finished")
        assert not self.problems, self.problems[:5]
        assert not self.ext_got, f"{len(self.ext_got)} LPDDR beats nobody asked for"
        assert self.st["mode"] == "finished", f"not finished by cycle {cycles} (limit {limit})"
        lost = [(c, kd) for c, kd in ram.corrupted if kd != "plant"]
        assert len({c for c, _ in lost}) == len([i for i in faults if i < self.lpddr_cmds]), (
            f"faults injected {lost}, planned {sorted(faults)[:8]}... of {self.lpddr_cmds} reads")
        out = self.check_results(case, expected, cycles)
        out.update(self.stats)
        out.update(residency_checks=self.checks, lpddr_cmds=self.lpddr_cmds, bursts=ram.bursts,
                   ram_cmds=ram.cmd + 1)
        assert ram.cmd + 1 == self.lpddr_cmds, (f"the LPDDR model saw {ram.cmd + 1} commands, "
                                                f"the datapath expected {self.lpddr_cmds}")
        return out


def dut_layout(v, name, cfg):
    """HB's read-port payload types for ``cfg`` (as ``hw.hb_bank`` builds them)."""
    if name == "HBRead":
        return hv.hb_read(cfg.tag_slots, cfg.slot_words, cfg.dense_words, cfg.planes)
    return hv.hb_beat(cfg.slice_bits, cfg.lanes)

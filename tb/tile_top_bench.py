"""cocotb testbench of the tile top ``elmoe3d_tile`` (``hw/tile.Tile``): the
Elastic-SD controller, the tag unit, the HB bank controller, the stream
engine and the token-batched MoE datapath, driven only through the host
command stream, the response stream, ``trace`` and the AXI4 master.

LPDDR is cocotbext-axi's ``AxiRamRead`` (:class:`elmoe3d.tb.tile_mem_bench.FaultyRam`,
pause generators on AR and R) holding the golden LPDDR image of the bench's
golden MoE layers (:class:`elmoe3d.tb.moe_layer_bench.MoETB` makes them):
every expert's :func:`~elmoe3d.golden.layout.expert_image` at
:func:`~elmoe3d.golden.layout.lpddr_expert_base` and the dense image
(:func:`~elmoe3d.golden.layout.dense_image`, row by row, bank fastest) at
``lpddr_layout(cfg).dense_base``.

The host script and the checks are :mod:`elmoe3d.sim.run.tile_script`'s (the
native harness, :mod:`elmoe3d.sim.run.native`, sends and checks the same).
The host: LOAD_DENSE (answer OK), then the decode of
:func:`elmoe3d.sim.run.tile_script.golden_script` (``$ELMOE_TILE_ROUNDS``,
default ``SD,AR``, batch ``$ELMOE_TILE_BATCH``, default 2): every STEP
followed by its token vectors (TOKEN); after the first STEP and before its
vectors a LOAD_DENSE the tile must refuse (BUSY: the step is running) and an
unknown opcode (BAD_OP); at the end every counter (COUNTER). Random idle
cycles on the command stream and back-pressure on the response and trace
streams (``$ELMOE_TILE_IDLE``, default 0.2).

Checks: every controller response and counter equals the golden's and the
trace the golden control sequence event for event
(:meth:`elmoe3d.tb.esd_ctrl_bench.CtrlBench.check_results`); every layer output bit for
bit the golden batched layer (:func:`elmoe3d.golden.moe_batched.batched_forward`),
``last`` on each step's final token, no ``error``; the tile's own answers
(LOAD_DENSE OK, BUSY, BAD_OP); at the end the tag unit's ``resident`` equals
HB's ``slot_valid``, nothing pending, the FillDone FIFO never overflowed, no
stream rule broken. ``$ELMOE_TILE_PLANT_DENSE`` corrupts one word of the
dense image in the LPDDR model: ``out`` bit 14 of layer 0's first output
requantisation multiplier (the outputs differ), ``router`` bit 14 of layer
0's first router word (the routing, hence the trace, differs): the bench
must fail. ``$ELMOE_TILE_FAULTS`` (e.g. ``2:SLVERR``): LPDDR faults by the
golden's rule (ordinal of an expert read -> error; the LPDDR model of
:class:`~elmoe3d.tb.tile_mem_bench.FaultyRam` corrupts that read's first
beat): the spoilt step answers ``value`` 1 and the host repeats it; outputs
of a spoilt pass must carry ``error``, every other output is exact.
``$ELMOE_TILE_OUT``: a JSON summary. ``$ELMOE_TILE_LPDDR`` = ``model``
replaces cocotbext-axi by the cycle-level LPDDR model of the native harness
(:class:`elmoe3d.tb.lpddr.LpddrPort`, latency ``$ELMOE_TILE_LPDDR_LATENCY``),
so a run here and a native run of the same scenario take the same cycles.
With ``Config.lpddr_bytes_per_cycle`` set, both LPDDR models meter the R
channel to that bandwidth.

The ``trace`` test replays golden routing-trace decodes
(:func:`elmoe3d.golden.esd.run_trace`: synthetic Zipf + reuse or a real
model's routing, random acceptance, CONTEXT commands that move the KV
boundary between rounds and in the middle of drafting and verification,
LPDDR faults) on the tile: the bench's layers get a trace router
(:func:`elmoe3d.golden.moe_batched.trace_layer`, router row ``e`` the unit
vector ``e``) and every STEP's rankings go in as token vectors whose
logits rank the experts as the trace does
(:func:`elmoe3d.golden.moe_batched.trace_tokens`), so the tile's own router
routes the trace; the expected outputs are the golden batched layer's with
the eligibility mask the golden controller used. Same checks as the
random-token decode; the cases come from ``$ELMOE_ESD_CASE`` (the
controller benches' pickle), reset and LOAD_DENSE before each, and
``$ELMOE_TILE_OUT`` gets a list of result records (cycles, the tile's
counters, events).
"""

from __future__ import annotations

import collections
import json
import os
import time

import cocotb
import numpy as np
from amaranth.lib import data
from cocotb.triggers import RisingEdge

from ..config import Config
from ..golden import esd as gesd
from ..golden import layout as gl
from ..golden import moe_batched as gb
from ..golden.vocab import ExtError
from ..hw.esd_ctrl import HostOp
from ..hw.tile import TileRspKind, tile_command, tile_response
from ..hw.vocab import vocab
from ..sim.run import tile_script as ts
from ..sim.run.tile_script import Plan, lpddr_image, plant_dense, trace_plan  # noqa: F401
from .common import params, rng, start_clock_and_reset
from .lpddr import LpddrPort
from .esd_ctrl_bench import CtrlBench
from .moe_layer_bench import MoETB
from .tile_mem_bench import FaultyRam


def random_plan(cfg, env, rounds, batch, np_rng, faults) -> Plan:
    """Random token vectors through the bench's golden layers
    (:func:`elmoe3d.sim.run.tile_script.random_plan`; the golden controller's
    mutant from ``$ELMOE_JOIN_MUTANT``)."""
    return ts.random_plan(cfg, env.layers, rounds, batch, np_rng, faults,
                          mutant=os.environ.get("ELMOE_JOIN_MUTANT") or None)


def lpddr_model(dut, cfg, mem, r, pause):
    """LPDDR for the bench: cocotbext-axi (:class:`~elmoe3d.tb.tile_mem_bench.FaultyRam`,
    pauses ``pause`` on AR and R) by default; with ``$ELMOE_TILE_LPDDR`` =
    ``model`` the cycle-level :class:`~elmoe3d.tb.lpddr.LpddrPort` (the
    native harness's rule; latency ``$ELMOE_TILE_LPDDR_LATENCY``, default
    1; the same pauses)."""
    if os.environ.get("ELMOE_TILE_LPDDR", "axi") == "model":
        return LpddrPort(dut, cfg, mem, r=r, ar_pause=pause, r_pause=pause,
                         latency=int(os.environ.get("ELMOE_TILE_LPDDR_LATENCY", "1")))
    return FaultyRam(dut, cfg, bytes(mem), r, pause, {}, None)


class TB(CtrlBench):
    """The tile top's bench for one plan (module doc): the host stream, the
    response and trace streams on the kit's ports, the LPDDR model, one
    cycle loop, the controller responses' scoreboard
    (:class:`~elmoe3d.tb.esd_ctrl_bench.CtrlBench`).

    Parameters
    ----------
    dut
        ``elmoe3d_tile``.
    cfg : Config
    ram : FaultyRam or LpddrPort
        The LPDDR model (an :class:`~elmoe3d.tb.lpddr.LpddrPort` is clocked
        by this bench's loop, after the streams: cocotbext-axi runs itself).
    plan : Plan
        What to send and what to expect.
    rand : random.Random
    idle : float
        Idle probability of the command stream, back-pressure of the
        response and trace streams.
    stamps : dict, optional
        Gets the cycle of every response (``rsp``) and trace event (``trace``).

    Attributes
    ----------
    outputs, tile_rsp : list
        The layer outputs and the tile's own answers, as they arrived.
    """

    def __init__(self, dut, cfg, ram, plan: Plan, rand, idle, stamps=None):
        super().__init__(dut, rand, idle)
        self.cfg, self.ram, self.plan, self.stamps = cfg, ram, plan, stamps
        hs = ts.host_commands(cfg, plan)
        self.tile_want, self.counter_cmds = hs.tile_want, hs.counter_cmds
        self.case = dict(script=plan.cmds + hs.counter_cmds, events=plan.events,
                         counters=plan.counters, name=plan.name)
        self.outputs, self.tile_rsp = [], []
        if stamps is not None:
            stamps.update(rsp=[], trace=[])
        self.host = self.source("host_cmd", data.Layout.cast(tile_command(cfg)))
        for c in hs.commands:
            self.host.put(c)
        self.sink("host_rsp", data.Layout.cast(tile_response(cfg)), self.on_rsp)
        self.sink("trace", data.Layout.cast(vocab(cfg).TraceEvent), self.on_event)
        self.expect_responses(self.case, plan.want_rsp)
        self.clocked = [ram] if isinstance(ram, LpddrPort) else []

    def on_event(self, p):
        self.events.append(p)
        if self.stamps is not None:
            self.stamps["trace"].append(self.cycle)

    def on_rsp(self, p):
        if self.stamps is not None:
            self.stamps["rsp"].append(self.cycle)
        kind = p["kind"]
        if kind == TileRspKind.TILE.value and not self.tile_rsp:
            # the dense load's reads are the LPDDR model's first commands; the
            # golden counts expert reads only
            self.ram.faults = {i + self.ram.cmd + 1: e for i, e in self.plan.faults.items()}
        if kind == TileRspKind.OUTPUT.value:
            self.outputs.append(p["out"])
        elif kind == TileRspKind.CTRL.value:
            self.on_response(p["rsp"])
        else:
            self.tile_rsp.append(p["rsp"])

    async def run_plan(self, limit):
        """Run until every response and output is in (or ``limit`` cycles),
        check (module doc); the result record (``check_results``'s, plus the
        tile's own numbers)."""
        plan, ram, dut = self.plan, self.ram, self.dut
        n_ctrl = len(plan.want_rsp) + len(self.counter_cmds)
        load = []

        def done():
            if not load and self.tile_rsp:
                load.append(self.cycle)
            return (len(self.responses) >= n_ctrl and len(self.outputs) >= len(plan.want_y)
                    and len(self.tile_rsp) >= len(self.tile_want))
        cyc = await self.loop.run(self.sources, [*self.sinks, *self.clocked], limit=limit,
                                  done=done)
        bad = ts.tile_answer_mismatch(self.tile_rsp, self.tile_want)
        assert bad is None, bad[1]
        bad = ts.fault_mismatch([c for c, _ in ram.corrupted], plan)
        assert bad is None, bad[1]
        out = self.check_results(self.case, plan.want_rsp, cyc)
        bad = ts.output_mismatch(plan.want_y, self.outputs)
        assert bad is None, bad[1]
        res, pend = dut.resident.value.to_unsigned(), dut.pending.value.to_unsigned()
        hbv = dut.slot_valid.value.to_unsigned()
        bad = ts.state_mismatch(res, pend, hbv, int(dut.fill_done_overflow.value))
        assert bad is None, bad[1]
        kinds = collections.Counter(gesd.EventKind(e.kind).name for e in plan.events)
        return dict(out, name=plan.name, load_dense_cycles=load[0] if load else None,
                    tokens=len(plan.want_y),
                    spoilt_outputs=sum(1 for y, _ in plan.want_y if y is None),
                    lpddr_faults_injected=len(ram.corrupted),
                    faults={k: v.name for k, v in plan.faults.items()},
                    steps=sum(1 for c in plan.cmds if c["op"] == HostOp.STEP),
                    kinds=dict(kinds), bursts=ram.bursts, resident=res)


async def run_plan(dut, cfg, ram, plan: Plan, r, idle, limit, stamps=None):
    """Send ``plan`` through the host stream (LOAD_DENSE first, every STEP
    followed by its vectors, every COUNTER at the end), take every response
    and trace event, and check them (module doc): :meth:`TB.run_plan`."""
    return await TB(dut, cfg, ram, plan, r, idle, stamps).run_plan(limit)


@cocotb.test()
async def decode(dut):
    """The random-token decode of the module doc."""
    cfg = Config(**params()["config"])
    env = MoETB(dut, resident=[])
    r = env.rand
    idle = float(os.environ.get("ELMOE_TILE_IDLE", "0.2"))
    pause = float(os.environ.get("ELMOE_TILE_AXI_PAUSE", "0.2"))
    rounds = os.environ.get("ELMOE_TILE_ROUNDS", "SD,AR").split(",")
    batch = int(os.environ.get("ELMOE_TILE_BATCH", "2"))
    faults = {int(k): ExtError[v] for k, v in
              (x.split(":") for x in os.environ.get("ELMOE_TILE_FAULTS", "").split(",") if x)}
    plan = random_plan(cfg, env, rounds, batch, np.random.default_rng(r.getrandbits(32)), faults)
    mem = lpddr_image(cfg, env.layers, env.dense)
    plant = os.environ.get("ELMOE_TILE_PLANT_DENSE")
    if plant:
        plant_dense(cfg, mem, plant)
    ram = lpddr_model(dut, cfg, mem, r, pause)
    await start_clock_and_reset(dut)
    out = await run_plan(dut, cfg, ram, plan, r, idle,
                         int(os.environ.get("ELMOE_TILE_MAX_CYCLES", "400000")))
    summary = os.environ.get("ELMOE_TILE_OUT")
    if summary:
        with open(summary, "w") as f:
            json.dump(dict(out, rounds=rounds, batch=batch), f)


@cocotb.test()
async def trace(dut):
    """Golden routing-trace decodes (``$ELMOE_ESD_CASE``, a pickle of one case
    or a list under ``cases``, as ``tb/esd_ctrl_bench.py`` reads them) on the
    tile, reset and LOAD_DENSE before each: the bench's layers with a trace
    router (:func:`elmoe3d.golden.moe_batched.trace_layer`), each STEP's
    rankings sent as token vectors (:func:`trace_plan`). Same checks as
    :func:`decode`; ``$ELMOE_TILE_OUT`` gets a list of result records."""
    import pickle
    with open(os.environ["ELMOE_ESD_CASE"], "rb") as f:
        loaded = pickle.load(f)
    cases = loaded["cases"] if "cases" in loaded else [loaded]
    cfg = Config(**params()["config"])
    env = MoETB(dut, resident=[])
    r = env.rand
    idle = float(os.environ.get("ELMOE_TILE_IDLE", "0.2"))
    pause = float(os.environ.get("ELMOE_TILE_AXI_PAUSE", "0.2"))
    layers = [gb.trace_layer(lay) for lay in env.layers]
    mem = lpddr_image(cfg, layers, gl.dense_image(cfg, layers))
    ram = lpddr_model(dut, cfg, mem, r, pause)
    np_rng = np.random.default_rng(r.getrandbits(32))
    await start_clock_and_reset(dut)
    outs = []
    limit = int(os.environ.get("ELMOE_TILE_MAX_CYCLES", "50000000"))
    for i, case in enumerate(cases):
        if i:
            await RisingEdge(dut.clk)           # leave the ReadOnly phase of the last case
            dut.rst.value = 1
            for _ in range(3):
                await RisingEdge(dut.clk)
            dut.rst.value = 0
        ram.reset()
        ram.faults = {}
        t0 = time.process_time()
        plan = trace_plan(cfg, layers, case, np_rng)
        out = await run_plan(dut, cfg, ram, plan, r, idle, limit)
        outs.append(dict(out, cpu_s=round(time.process_time() - t0, 1)))
        summary = os.environ.get("ELMOE_TILE_OUT")
        if summary:
            with open(summary, "w") as f:
                json.dump(outs, f)


@cocotb.test()
async def replay(dut):
    """One plan and LPDDR image from ``$ELMOE_TILE_PLAN`` (a pickle:
    ``plan``, ``image``, ``idle``, ``pause``; what the native harness runs,
    ``tests/test_tile_native.py``), with the stamps of every response and
    trace event in the ``$ELMOE_TILE_OUT`` record. Same checks as
    :func:`decode`."""
    import pickle
    with open(os.environ["ELMOE_TILE_PLAN"], "rb") as f:
        job = pickle.load(f)
    cfg = Config(**params()["config"])
    r = rng()
    ram = lpddr_model(dut, cfg, job["image"], r, job.get("pause", 0.0))
    await start_clock_and_reset(dut)
    t0 = time.process_time()
    stamps = {}
    out = await run_plan(dut, cfg, ram, job["plan"], r, job.get("idle", 0.0),
                         int(os.environ.get("ELMOE_TILE_MAX_CYCLES", "50000000")), stamps)
    with open(os.environ["ELMOE_TILE_OUT"], "w") as f:
        json.dump(dict(out, stamps=stamps, sim_cpu_s=time.process_time() - t0), f)

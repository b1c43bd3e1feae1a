"""cocotb testbench of the tile top ``elmoe3d_tile`` (``hw/tile.Tile``): the
Elastic-SD controller, the tag unit, the HB bank controller, the stream
engine and the token-batched MoE datapath, driven only through the host
command stream, the response stream, ``trace`` and the AXI4 master.

LPDDR is cocotbext-axi's ``AxiRamRead`` (:class:`elmoe3d.tb.test_tile_mem.FaultyRam`,
pause generators on AR and R) holding the golden LPDDR image of the bench's
golden MoE layers (:class:`elmoe3d.tb.test_moe_layer.MoETB` makes them):
every expert's :func:`~elmoe3d.golden.layout.expert_image` at
:func:`~elmoe3d.golden.layout.lpddr_expert_base` and the dense image
(:func:`~elmoe3d.golden.layout.dense_image`, row by row, bank fastest) at
``lpddr_layout(cfg).dense_base``.

The host: LOAD_DENSE (answer OK), then the decode of
:func:`elmoe3d.tb.test_esd_dp_join.golden_script` (``$ELMOE_TILE_ROUNDS``,
default ``SD,AR``, batch ``$ELMOE_TILE_BATCH``, default 2): every STEP
followed by its token vectors (TOKEN); after the first STEP and before its
vectors a LOAD_DENSE the tile must refuse (BUSY: the step is running) and an
unknown opcode (BAD_OP); at the end every counter (COUNTER). Random idle
cycles on the command stream and back-pressure on the response and trace
streams (``$ELMOE_TILE_IDLE``, default 0.2).

Checks: every controller response and counter equals the golden's and the
trace the golden control sequence event for event
(:func:`elmoe3d.tb.test_esd_ctrl.check_results`); every layer output bit for
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
:class:`~elmoe3d.tb.test_tile_mem.FaultyRam` corrupts that read's first
beat): the spoilt step answers ``value`` 1 and the host repeats it; outputs
of a spoilt pass must carry ``error``, every other output is exact.
``$ELMOE_TILE_OUT``: a JSON summary.

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
from dataclasses import dataclass, field

import cocotb
import numpy as np
from amaranth.lib import data
from cocotb.triggers import ReadOnly, RisingEdge

from ..config import Config
from ..golden import esd as gesd
from ..golden import layout as gl
from ..golden import moe_batched as gb
from ..golden.vocab import ExtError
from ..hw.esd_ctrl import COUNTERS, HostOp
from ..hw.esd_feed import ROLE_OF_PHASE
from ..hw.tile import TileError, TileOp, TileRspKind, tile_command, tile_response
from ..hw.vocab import vocab
from .common import params, start_clock_and_reset
from .test_esd_ctrl import Snk, Src, check_results, host_script
from .test_esd_dp_join import golden_script
from .test_moe_layer import MoETB
from .test_tile_mem import FaultyRam


def lpddr_image(cfg, layers, dense) -> bytearray:
    """The LPDDR window of ``layers`` (golden layers with ``wg``/``wu``/``wd``)
    and the dense image (:func:`elmoe3d.golden.layout.lpddr_image`)."""
    return gl.lpddr_image(cfg, {(li, e): (ly.wg[e], ly.wu[e], ly.wd[e])
                                for li, ly in enumerate(layers) for e in range(cfg.experts)},
                          dense)


def plant_dense(cfg, mem, which):
    """Corrupt one word of the dense image in ``mem`` (bank 0's word, bit 14):
    ``out`` = layer 0's first output requantisation multiplier, ``router`` =
    layer 0's first router word."""
    d = gl.dense_layout(cfg)
    row = (d.params_base(0) + d.record_index["out"] * 32 // cfg.slice_vector_bits
           if which == "out" else d.router_base(0))
    a = gl.lpddr_layout(cfg).dense_base + row * cfg.pes * cfg.slice_vector_bits // 8
    mem[a + 1] ^= 0x40


@dataclass
class Plan:
    """What the host sends and what it must get back: controller commands
    (``HostOp`` dicts) with their expected responses, the token vectors of
    every STEP in order, the expected outputs (``(y or None for a spoilt
    pass, last)``), the golden events and counters, LPDDR faults by the
    golden's rule, and whether to probe BUSY / BAD_OP after the first STEP."""
    cmds: list
    want_rsp: list
    vecs: list
    want_y: list
    events: list
    counters: dict
    faults: dict = field(default_factory=dict)
    probe: bool = True
    name: str = ""
    ext_reads: int | None = None      # the golden's LPDDR expert reads (faults beyond: none)


def random_plan(cfg, env, rounds, batch, np_rng, faults) -> Plan:
    """Random token vectors through the bench's golden layers
    (:func:`elmoe3d.tb.test_esd_dp_join.golden_script`)."""
    cmds, vecs, want_rsp, want_y, ctl = golden_script(cfg, env, rounds, batch, np_rng,
                                                      faults=faults)
    return Plan(cmds, want_rsp, vecs, want_y, ctl.events, ctl.counters, faults, True,
                f"tile {','.join(rounds)} B{batch}", ctl.ext_reads)


def trace_plan(cfg, layers, case, np_rng) -> Plan:
    """A golden :func:`elmoe3d.golden.esd.run_trace` decode (``case``: its
    script, events, counters, faults) replayed on the tile: every STEP's
    rankings become token vectors of the trace layers
    (:func:`elmoe3d.golden.moe_batched.trace_tokens`; their router ranks the
    experts as the trace), whose outputs are the golden batched layer's with
    the mask the golden controller used; a pass with an ``EXT_ERROR`` event
    has spoilt outputs."""
    T = cfg.batch_tokens
    bad_passes, cur = [], set()
    for ev in case["events"]:
        if ev.kind == gesd.EventKind.EXT_ERROR:
            cur.add(ev.pass_no)
        elif ev.kind == gesd.EventKind.LAYER_DONE:
            bad_passes.append(cur)
            cur = set()
    pairs = [p for p in host_script(case) if p[1] is not None]      # counters come later
    cmds, want_rsp, vecs, want_y = [], [], [], []
    steps = iter(bad_passes)
    for e, (cmd, want) in zip(case["script"], pairs):
        cmds.append(cmd)
        want_rsp.append(want)
        if e["op"] != "STEP" or "refused" in e:
            continue
        lay = layers[e["layer"]]
        xs = gb.trace_tokens(np_rng, lay, e["rankings"])
        n, E = len(xs), cfg.experts
        mask = e.get("mask")
        m = np.array([[(mask >> x) & 1 for x in range(E)]] * n, bool) if mask is not None else None
        y = gb.batched_forward(lay, xs, [ROLE_OF_PHASE[gesd.Phase(e["phase"])]] * n, m,
                               batch_tokens=T).y
        bad = next(steps)
        vecs.extend(xs.tolist())
        want_y.extend((None if i // T in bad else y[i].tolist(), int(i == n - 1))
                      for i in range(n))
    assert next(steps, None) is None, "golden steps and LAYER_DONE events do not pair up"
    return Plan(cmds, want_rsp, vecs, want_y, case["events"], case["counters"],
                {int(k): ExtError(v) for k, v in (case.get("faults") or {}).items()}, False,
                case.get("name") or "trace", case.get("ext_reads"))


async def run_plan(dut, cfg, ram, plan: Plan, r, idle, limit):
    """Send ``plan`` through the host stream (LOAD_DENSE first, every STEP
    followed by its vectors, every COUNTER at the end), take every response
    and trace event, and check them (module doc). Returns the result record
    (``check_results``'s, plus the tile's own numbers)."""
    H = cfg.hidden
    zero = [0] * H

    def ctrl_cmd(c):
        return dict(op=c["op"], phase=c["phase"], step=c["step"], layer=c["layer"],
                    value=c["value"], x=zero)

    def tile_cmd(op):
        return dict(op=int(op), phase=0, step=0, layer=0, value=0, x=zero)

    # the host script: STEP + its vectors; the tile's own commands; counters
    script, tile_want = [tile_cmd(TileOp.LOAD_DENSE)], [(TileOp.LOAD_DENSE, TileError.OK)]
    per_step = [i for i, (_, last) in enumerate(plan.want_y) if last]
    vi, first = 0, plan.probe
    for c, want in zip(plan.cmds, plan.want_rsp):
        script.append(ctrl_cmd(c))
        if c["op"] == HostOp.STEP and not want.get("error"):       # a STEP the tile runs
            if first:
                script += [tile_cmd(TileOp.LOAD_DENSE), tile_cmd(7)]
                tile_want += [(TileOp.LOAD_DENSE, TileError.BUSY), (7, TileError.BAD_OP)]
                first = False
            end = per_step.pop(0) + 1
            script += [dict(tile_cmd(TileOp.TOKEN), x=x) for x in plan.vecs[vi:end]]
            vi = end
    assert vi == len(plan.vecs) and not per_step
    counter_cmds = [dict(op=HostOp.COUNTER, phase=0, step=0, layer=0, value=i)
                    for i in range(len(COUNTERS))]
    script += [ctrl_cmd(c) for c in counter_cmds]

    responses, outputs, tile_rsp, events = [], [], [], []

    def on_rsp(p):
        kind = p["kind"]
        if kind == TileRspKind.TILE.value and not tile_rsp:
            # the dense load's reads are the LPDDR model's first commands; the
            # golden counts expert reads only
            ram.faults = {i + ram.cmd + 1: e for i, e in plan.faults.items()}
        if kind == TileRspKind.OUTPUT.value:
            outputs.append(p["out"])
        elif kind == TileRspKind.CTRL.value:
            responses.append(p["rsp"])
        else:
            tile_rsp.append(p["rsp"])

    host = Src(dut, "host_cmd", data.Layout.cast(tile_command(cfg)), r, idle)
    for c in script:
        host.put(c)
    sinks = [Snk(dut, "host_rsp", data.Layout.cast(tile_response(cfg)), r, idle, on_rsp),
             Snk(dut, "trace", data.Layout.cast(vocab(cfg).TraceEvent), r, idle, events.append)]
    n_ctrl = len(plan.want_rsp) + len(COUNTERS)
    cyc, after, load_cycles = 0, 0, None
    while cyc < limit:
        await RisingEdge(dut.clk)
        cyc += 1
        host.drive(cyc)
        for x in sinks:
            x.drive(cyc)
        await ReadOnly()
        host.sample()
        for x in sinks:
            x.sample()
        if load_cycles is None and tile_rsp:
            load_cycles = cyc
        if (len(responses) >= n_ctrl and len(outputs) >= len(plan.want_y)
                and len(tile_rsp) >= len(tile_want)):
            after += 1
            if after > 50:
                break
    got = [(x["op"], x["error"]) for x in tile_rsp]
    assert got == [(int(o), int(e)) for o, e in tile_want], \
        f"tile answers {got}, expected {tile_want} ({[x['value'] for x in tile_rsp]})"
    assert tile_rsp[0]["value"] == 0, f"LOAD_DENSE answered value {tile_rsp[0]['value']:#x}"
    hit = {c for c, _ in ram.corrupted}
    planned = [i for i in plan.faults if plan.ext_reads is None or i < plan.ext_reads]
    assert len(hit) == len(planned), \
        f"LPDDR faults injected on commands {sorted(hit)}, planned {planned}"
    case = dict(script=plan.cmds + counter_cmds, events=plan.events, counters=plan.counters,
                name=plan.name)
    out = check_results(case, plan.want_rsp, responses, events, sinks, cyc)
    assert len(outputs) == len(plan.want_y), f"{len(outputs)} outputs, {len(plan.want_y)} expected"
    bad = [i for i, ((y, last), o) in enumerate(zip(plan.want_y, outputs))
           if o["last"] != last or (o["error"] != 1 if y is None
                                    else [int(a) for a in o["y"]] != y or o["error"])]
    assert not bad, (f"{len(bad)} of {len(plan.want_y)} outputs differ, first token {bad[0]}: "
                     f"{outputs[bad[0]]} != golden {plan.want_y[bad[0]]} (None: a spoilt pass, "
                     f"error 1)")
    res, pend = dut.resident.value.to_unsigned(), dut.pending.value.to_unsigned()
    hbv = dut.slot_valid.value.to_unsigned()
    assert res == hbv and not pend and not int(dut.fill_done_overflow.value), \
        f"tag unit resident {res:#x} pending {pend:#x}, HB valid {hbv:#x}"
    kinds = collections.Counter(gesd.EventKind(e.kind).name for e in plan.events)
    return dict(out, name=plan.name, load_dense_cycles=load_cycles, tokens=len(plan.want_y),
                spoilt_outputs=sum(1 for y, _ in plan.want_y if y is None),
                lpddr_faults_injected=len(ram.corrupted),
                faults={k: v.name for k, v in plan.faults.items()},
                steps=sum(1 for c in plan.cmds if c["op"] == HostOp.STEP), kinds=dict(kinds),
                bursts=ram.bursts, resident=res)


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
    ram = FaultyRam(dut, cfg, bytes(mem), r, pause, {}, None)
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
    or a list under ``cases``, as ``tb/test_esd_ctrl.py`` reads them) on the
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
    ram = FaultyRam(dut, cfg, bytes(mem), r, pause, {}, None)
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

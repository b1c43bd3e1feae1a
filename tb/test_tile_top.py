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
"""

from __future__ import annotations

import collections
import json
import os

import cocotb
import numpy as np
from amaranth.lib import data
from cocotb.triggers import ReadOnly, RisingEdge

from ..config import Config
from ..golden import esd as gesd
from ..golden import layout as gl
from ..golden.vocab import ExtError
from ..hw.esd_ctrl import COUNTERS, HostOp
from ..hw.tile import TileError, TileOp, TileRspKind, tile_command, tile_response
from .common import params, start_clock_and_reset
from .test_esd_ctrl import Snk, Src, check_results
from .test_esd_dp_join import golden_script
from .test_moe_layer import MoETB
from .test_tile_mem import FaultyRam


def lpddr_image(cfg, layers, dense) -> bytearray:
    """The LPDDR window of ``layers`` (golden layers with ``wg``/``wu``/``wd``)
    and the dense image (:func:`elmoe3d.golden.layout.lpddr_image`)."""
    return gl.lpddr_image(cfg, {(li, e): (ly.wg[e], ly.wu[e], ly.wd[e])
                                for li, ly in enumerate(layers) for e in range(cfg.experts)},
                          dense)


@cocotb.test()
async def decode(dut):
    """The decode of the module doc."""
    cfg = Config(**params()["config"])
    env = MoETB(dut, resident=[])
    r = env.rand
    idle = float(os.environ.get("ELMOE_TILE_IDLE", "0.2"))
    pause = float(os.environ.get("ELMOE_TILE_AXI_PAUSE", "0.2"))
    rounds = os.environ.get("ELMOE_TILE_ROUNDS", "SD,AR").split(",")
    batch = int(os.environ.get("ELMOE_TILE_BATCH", "2"))
    faults = {int(k): ExtError[v] for k, v in
              (x.split(":") for x in os.environ.get("ELMOE_TILE_FAULTS", "").split(",") if x)}
    cmds, vecs, want_rsp, want_y, ctl = golden_script(cfg, env, rounds, batch,
                                                      np.random.default_rng(r.getrandbits(32)),
                                                      faults=faults)
    mem = lpddr_image(cfg, env.layers, env.dense)
    plant = os.environ.get("ELMOE_TILE_PLANT_DENSE")
    if plant:
        d = gl.dense_layout(cfg)
        row = (d.params_base(0) + d.record_index["out"] * 32 // cfg.slice_vector_bits
               if plant == "out" else d.router_base(0))
        a = gl.lpddr_layout(cfg).dense_base + row * cfg.pes * cfg.slice_vector_bits // 8
        mem[a + 1] ^= 0x40                      # bank 0's word: bit 14
    ram = FaultyRam(dut, cfg, bytes(mem), r, pause, {}, None)
    await start_clock_and_reset(dut)

    H = cfg.hidden
    zero = [0] * H

    def ctrl_cmd(c):
        return dict(op=c["op"], phase=c["phase"], step=c["step"], layer=c["layer"],
                    value=c["value"], x=zero)

    def tile_cmd(op):
        return dict(op=int(op), phase=0, step=0, layer=0, value=0, x=zero)

    # the host script: STEP + its vectors; the tile's own commands; counters
    script, tile_want = [tile_cmd(TileOp.LOAD_DENSE)], [(TileOp.LOAD_DENSE, TileError.OK)]
    per_step = [i for i, (_, last) in enumerate(want_y) if last]
    vi, first = 0, True
    for c in cmds:
        script.append(ctrl_cmd(c))
        if c["op"] == HostOp.STEP:
            if first:
                script += [tile_cmd(TileOp.LOAD_DENSE), tile_cmd(7)]
                tile_want += [(TileOp.LOAD_DENSE, TileError.BUSY), (7, TileError.BAD_OP)]
                first = False
            end = per_step.pop(0) + 1
            script += [dict(tile_cmd(TileOp.TOKEN), x=x) for x in vecs[vi:end]]
            vi = end
    assert vi == len(vecs) and not per_step
    counter_cmds = [dict(op=HostOp.COUNTER, phase=0, step=0, layer=0, value=i)
                    for i in range(len(COUNTERS))]
    script += [ctrl_cmd(c) for c in counter_cmds]

    responses, outputs, tile_rsp, events = [], [], [], []

    def on_rsp(p):
        kind = p["kind"]
        if kind == TileRspKind.TILE.value and not tile_rsp:
            # the dense load's reads are the LPDDR model's first commands; the
            # golden counts expert reads only
            ram.faults = {i + ram.cmd + 1: e for i, e in faults.items()}
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
             Snk(dut, "trace", data.Layout.cast(env.v.TraceEvent), r, idle, events.append)]
    n_ctrl = len(want_rsp) + len(COUNTERS)
    limit = int(os.environ.get("ELMOE_TILE_MAX_CYCLES", "400000"))
    cyc, after = 0, 0
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
        if (len(responses) >= n_ctrl and len(outputs) >= len(want_y)
                and len(tile_rsp) >= len(tile_want)):
            after += 1
            if after > 50:
                break
    got = [(x["op"], x["error"]) for x in tile_rsp]
    assert got == [(int(o), int(e)) for o, e in tile_want], \
        f"tile answers {got}, expected {tile_want} ({[x['value'] for x in tile_rsp]})"
    assert tile_rsp[0]["value"] == 0, f"LOAD_DENSE answered value {tile_rsp[0]['value']:#x}"
    hit = {c for c, _ in ram.corrupted}
    assert len(hit) == len([i for i in faults if i < ctl.ext_reads]), \
        f"LPDDR faults injected on commands {sorted(hit)}, planned {faults} of {ctl.ext_reads} reads"
    case = dict(script=cmds + counter_cmds, events=ctl.events, counters=ctl.counters,
                name=f"tile {','.join(rounds)} B{batch}")
    out = check_results(case, want_rsp, responses, events, sinks, cyc)
    assert len(outputs) == len(want_y), f"{len(outputs)} outputs, {len(want_y)} expected"
    bad = [i for i, ((y, last), o) in enumerate(zip(want_y, outputs))
           if o["last"] != last or (o["error"] != 1 if y is None
                                    else [int(a) for a in o["y"]] != y or o["error"])]
    assert not bad, (f"{len(bad)} of {len(want_y)} outputs differ, first token {bad[0]}: "
                     f"{outputs[bad[0]]} != golden {want_y[bad[0]]} (None: a spoilt pass, error 1)")
    res, pend = dut.resident.value.to_unsigned(), dut.pending.value.to_unsigned()
    hbv = dut.slot_valid.value.to_unsigned()
    assert res == hbv and not pend and not int(dut.fill_done_overflow.value), \
        f"tag unit resident {res:#x} pending {pend:#x}, HB valid {hbv:#x}"
    summary = os.environ.get("ELMOE_TILE_OUT")
    if summary:
        kinds = collections.Counter(gesd.EventKind(e.kind).name for e in ctl.events)
        with open(summary, "w") as f:
            json.dump(dict(cycles=cyc, faults={k: v.name for k, v in faults.items()},
                           spoilt_outputs=sum(1 for y, _ in want_y if y is None),
                           lpddr_faults_injected=len(ram.corrupted), events=out["events"], tokens=len(want_y),
                           steps=sum(1 for c in cmds if c["op"] == HostOp.STEP),
                           rounds=rounds, batch=batch, kinds=dict(kinds),
                           counters=out["counters"]), f)

"""cocotb test behind ``elmoe3d decode --rtl``: the in-project MoE LM decoded
by :func:`elmoe3d.golden.lm_int.decode` with every MoE layer on the RTL tile
``elmoe3d_tile`` (``hw/tile.Tile``, the ``lm`` preset) in Verilator.

The host (embedding, attention, norms, LM head, greedy acceptance) is the
golden decode itself, run in a :func:`cocotb.task.bridge` thread; its tile
is :class:`RtlTile`, whose ROUND / STEP (+ TOKEN vectors) / ACCEPT / CONTEXT
calls become commands on the tile's host stream (:func:`cocotb.task.resume`)
and whose layer outputs are the tile's OUTPUT responses. LPDDR is
cocotbext-axi's ``AxiRamRead`` holding the LM's integer experts
(:func:`elmoe3d.golden.layout.expert_image`) and dense image; the dense
region is loaded first with LOAD_DENSE. The same decode with the golden tile
(:class:`~elmoe3d.golden.lm_int.GoldenTile`) is the reference: the tokens,
the trace (event for event) and the counters are compared and written to
``$ELMOE_DECODE_OUT`` (JSON); the job (prompts, tokens, mode) comes from
``$ELMOE_DECODE_JOB``; ``$ELMOE_DECODE_PROGRESS`` (optional) gets the tokens
decoded so far, for the command's progress bar.
"""

from __future__ import annotations

import json
import os

import cocotb
import numpy as np
from amaranth.lib import data
from cocotb.task import bridge, resume
from cocotb.triggers import RisingEdge

from ..config import Config
from ..golden import esd as gesd
from ..golden import layout as gl
from ..golden import lm as glm
from ..golden import lm_int as li
from ..hw.esd_ctrl import COUNTERS, HostOp
from ..hw.vocab import vocab
from ..hw.tile import TileError, TileOp, TileRspKind, tile_command, tile_response
from ..sim.run.tile_script import lpddr_image
from .common import params, rng, start_clock_and_reset
from .esd_ctrl_bench import CtrlBench
from .tile_mem_bench import FaultyRam


class TileHost(CtrlBench):
    """The tile's host side, a bench on the kit (:class:`CtrlBench`: no idle
    cycles, no back-pressure): one command queue, responses sorted by kind,
    the kit's cycle loop (start :meth:`run` as a task)."""

    def __init__(self, dut, cfg, r):
        super().__init__(dut, r, 0.0)
        self.cfg = cfg
        self.zero = [0] * cfg.hidden
        self.src = self.source("host_cmd", data.Layout.cast(tile_command(cfg)))
        self.ctrl, self.outs, self.tile = [], [], []
        self.sink("host_rsp", data.Layout.cast(tile_response(cfg)), self._rsp)
        self.sink("trace", data.Layout.cast(vocab(cfg).TraceEvent), self.events.append)

    def _rsp(self, p):
        k = p["kind"]
        if k == TileRspKind.OUTPUT.value:
            self.outs.append(p["out"])
        elif k == TileRspKind.CTRL.value:
            self.ctrl.append(p["rsp"])
        else:
            self.tile.append(p["rsp"])

    async def run(self, *, limit: int = 1 << 62, **kw):
        """Clock the host's streams (the kit's loop) until cycle ``limit``:
        for ever by default."""
        return await super().run(limit=limit, **kw)

    def put(self, op, phase=0, step=0, layer=0, value=0, x=None):
        self.src.put(dict(op=int(op), phase=int(phase), step=int(step), layer=int(layer),
                          value=int(value), x=self.zero if x is None else [int(v) for v in x]))

    async def until(self, fn, limit=20_000_000):
        while not fn():
            if self.cycle > limit:
                raise AssertionError(f"tile host: no answer by cycle {self.cycle}")
            await RisingEdge(self.dut.clk)

    async def ctrl_cmd(self, op, **kw):
        n = len(self.ctrl)
        self.put(op, **kw)
        await self.until(lambda: len(self.ctrl) > n)
        return self.ctrl[n]

    async def step(self, phase, step, layer, xq):
        n, m = len(self.ctrl), len(self.outs)
        self.put(HostOp.STEP, phase=phase, step=step, layer=layer)
        for x in xq:
            self.put(TileOp.TOKEN, x=x)
        await self.until(lambda: len(self.ctrl) > n and len(self.outs) >= m + len(xq))
        return self.ctrl[n], self.outs[m:m + len(xq)]


class RtlTile:
    """The tile interface :func:`elmoe3d.golden.lm_int.decode` drives
    (``layer``, ``begin_round``, ``accept``, ``context``), on the RTL."""

    def __init__(self, host):
        self.h = host
        self.layer_calls = 0
        self.repeats = 0

    def begin_round(self, batch, force=None, hb_cache=True):
        v = batch | gesd.force_code(force, hb_cache) << 8
        r = resume(self.h.ctrl_cmd)(HostOp.ROUND, value=v)
        if r["error"]:
            raise AssertionError(f"ROUND refused: {r}")
        return gesd.Mode(r["mode"]), r["k"]

    def accept(self, n):
        r = resume(self.h.ctrl_cmd)(HostOp.ACCEPT, value=n)
        if r["error"]:
            raise AssertionError(f"ACCEPT {n} refused: {r}")

    def context(self, tokens):
        r = resume(self.h.ctrl_cmd)(HostOp.CONTEXT, value=tokens)
        if r["error"]:
            raise AssertionError(f"CONTEXT {tokens} refused: {r}")

    def layer(self, phase, step, layer, xq):
        self.layer_calls += 1
        while True:
            r, outs = resume(self.h.step)(int(phase), step, layer, np.asarray(xq))
            if r["error"]:
                raise AssertionError(f"STEP refused: {r}")
            if not r["value"]:
                break
            self.repeats += 1                     # a spoilt step: the host repeats it
        if any(o["error"] for o in outs):
            raise AssertionError("an output of a clean step carries error")
        return np.array([[int(a) for a in o["y"]] for o in outs], np.int64)


def _progress_file(path):
    """``progress(done, total)`` for :func:`elmoe3d.golden.lm_int.decode` that
    writes ``"done total"`` to ``path`` (``elmoe3d decode --rtl`` draws its
    progress bar from it), or ``None``."""
    if not path:
        return None

    def progress(done, total):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{done} {total}")
        os.replace(tmp, path)
    return progress


@cocotb.test()
async def decode_rtl(dut):
    """The decode of the module doc."""
    cfg = Config(**params()["config"])
    job = json.loads(open(os.environ["ELMOE_DECODE_JOB"]).read())
    prompts = [np.array(p) for p in job["prompts"]]
    weights, meta = glm.load_weights()
    intmoe = li.IntMoE.from_model(weights, meta, cfg=cfg)
    gold = li.decode(weights, meta, intmoe, prompts, job["tokens"], mode=job["mode"], cfg=cfg)
    mem = lpddr_image(cfg, intmoe.layers, gl.dense_image(cfg, intmoe.layers))
    r = rng()
    ram = FaultyRam(dut, cfg, bytes(mem), r, 0.0, {}, None)
    await start_clock_and_reset(dut)
    host = TileHost(dut, cfg, r)
    cocotb.start_soon(host.run())
    host.put(TileOp.LOAD_DENSE)
    await host.until(lambda: host.tile)
    assert host.tile[0]["error"] == TileError.OK, f"LOAD_DENSE answered {host.tile[0]}"
    c0 = host.cycle
    tile = RtlTile(host)
    res = await bridge(li.decode)(weights, meta, intmoe, prompts, job["tokens"],
                                  mode=job["mode"], cfg=cfg, tile=tile,
                                  progress=_progress_file(os.environ.get("ELMOE_DECODE_PROGRESS")))
    cycles = host.cycle - c0
    counters = {}
    for i, name in enumerate(COUNTERS):
        counters[name] = (await host.ctrl_cmd(HostOp.COUNTER, value=i))["value"]
    evs = [gesd.Event.from_dict(p) for p in host.events]
    trace_msg = gesd.compare(gold.events, evs)
    diff = {k: (counters[k], v) for k, v in gold.counters.items() if counters.get(k) != v}
    out = dict(tokens_rtl=res.tokens, tokens_golden=gold.tokens,
               match=res.tokens == gold.tokens, trace_equal=trace_msg is None,
               trace_first_difference=trace_msg, counters_rtl=counters,
               counters_differ=diff, cycles=cycles, load_dense_cycles=c0,
               layer_calls=tile.layer_calls, events=len(evs),
               rounds=[{"mode": ["AR", "SD"][m], "draft_len": k, "accepted": a}
                       for m, k, a in gold.rounds])
    with open(os.environ["ELMOE_DECODE_OUT"], "w") as f:
        json.dump(out, f, indent=1, default=str)
    assert out["match"] and out["trace_equal"] and not diff, \
        f"RTL decode differs: tokens {out['match']}, trace {trace_msg}, counters {diff}"

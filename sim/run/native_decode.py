"""``elmoe3d decode --rtl`` on the native harness: the in-project MoE LM
decoded with every MoE layer on the RTL tile (``lm`` preset), the tile a
Verilated C++ model (:mod:`elmoe3d.sim.run.native`).

Open loop: the golden decode (:func:`elmoe3d.golden.lm_int.decode` through
the golden tile) defines the host script -- every CONTEXT, ROUND, STEP with
its token vectors, ACCEPT -- and the layer outputs the tile must return
(:class:`ScriptTile` records them as a :class:`~elmoe3d.sim.run.tile_script.Plan`).
The native tile runs that script with no host in the loop, and every
response, counter, trace event and layer output is compared with the
golden's. This is sound because the script is what the host would send if
the tile were right: the host's next command depends on the tile only
through its responses and outputs, and while those equal the golden's the
host sends exactly the golden's commands. So an RTL that equals the golden
everywhere passes, and one that does not fails at its first difference
(after it, the script is no longer what a real host would send; nothing
after the first difference is trusted). The RTL's tokens come from the same
decode run again with the RTL's outputs (:class:`ReplayTile`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...golden import esd as gesd
from ...golden import layout as gl
from ...golden import lm_int as li
from ...hw.esd_ctrl import HostOp
from . import tile_script as ts

__all__ = ["ScriptTile", "ReplayTile", "NativeDecode", "decode"]


class ScriptTile(li.GoldenTile):
    """The golden tile, recording the host script it is driven with and the
    outputs it returns: ``plan()`` is that script as a
    :class:`~elmoe3d.sim.run.tile_script.Plan`."""

    def __init__(self, cfg, intmoe, **kw):
        super().__init__(cfg, intmoe, **kw)
        self.cmds, self.want_rsp, self.vecs, self.want_y = [], [], [], []

    def _cmd(self, op, want, **kw):
        self.cmds.append(dict(dict(op=op, phase=0, step=0, layer=0, value=0), **kw))
        self.want_rsp.append(dict(dict(op=op, error=0), **want))

    def context(self, tokens):
        self.ctl.context(tokens)
        self._cmd(HostOp.CONTEXT, {}, value=int(tokens))

    def begin_round(self, batch, force=None, hb_cache=True):
        mode, K = self.ctl.begin_round(batch, force, hb_cache)
        self._cmd(HostOp.ROUND, dict(mode=int(mode), k=int(K)),
                  value=int(batch) | gesd.force_code(force, hb_cache) << 8)
        return mode, K

    def accept(self, n):
        self.ctl.accept(n)
        self._cmd(HostOp.ACCEPT, {}, value=int(n))

    def layer(self, phase, step, layer, xq):
        y = super().layer(phase, step, layer, xq)
        self._cmd(HostOp.STEP, dict(value=0), phase=int(phase), step=int(step), layer=int(layer))
        n = len(xq)
        self.vecs.extend(np.asarray(xq, np.int64).tolist())
        self.want_y.extend((y[i].tolist(), int(i == n - 1)) for i in range(n))
        return y

    def plan(self) -> ts.Plan:
        return ts.Plan(self.cmds, self.want_rsp, self.vecs, self.want_y, list(self.ctl.events),
                       dict(self.ctl.counters), {}, False, "decode", self.ctl.ext_reads)


class ReplayTile:
    """The tile :func:`~elmoe3d.golden.lm_int.decode` drives, answering with
    what the RTL returned: ROUND's mode and draft length from its responses,
    each layer step's outputs from its OUTPUT beats, in order. ``DivergedError``
    when the decode asks for more than the RTL answered."""

    class DivergedError(Exception):
        pass

    def __init__(self, rounds, steps):
        self.rounds, self.steps = iter(rounds), iter(steps)

    def _next(self, it, what):
        try:
            return next(it)
        except StopIteration:
            raise ReplayTile.DivergedError(f"the decode asked for more {what} than the RTL "
                                           f"answered") from None

    def begin_round(self, batch, force=None, hb_cache=True):
        mode, K = self._next(self.rounds, "rounds")
        return gesd.Mode(mode), K

    def layer(self, phase, step, layer, xq):
        y = self._next(self.steps, "layer steps")
        if len(y) != len(xq):
            raise ReplayTile.DivergedError(f"{len(y)} outputs for {len(xq)} tokens")
        return np.asarray(y, np.int64)

    def accept(self, n):
        pass

    def context(self, tokens):
        pass


@dataclass
class NativeDecode:
    """A native ``decode --rtl``: ``record`` (JSON-able: the keys of the cocotb
    path's ``tb/tile_decode.py`` plus the native run's timing), the golden
    decode (``golden``, :class:`~elmoe3d.golden.lm_int.DecodeResult`) and the
    RTL's trace (``events``)."""
    record: dict
    golden: object
    events: list


def decode(prompts, n_tokens: int, mode: str, *, cfg=None, options=None, exe=None,
           build_progress=None, progress=None, prefetch: int = 0) -> NativeDecode:
    """The decode of the module doc: golden decode (the script), native run,
    comparison, RTL tokens, on the tile with ``prefetch`` depth during drafts
    (0: none). ``progress(cycle, responses, total)`` while the tile runs."""
    from ...config import preset
    from ...golden import lm as glm
    from . import native
    cfg = cfg or preset("lm")
    t0 = time.monotonic()
    if exe is None:
        exe = native.build(cfg, progress=build_progress, prefetch=prefetch)
    build_s = time.monotonic() - t0
    t1 = time.monotonic()
    weights, meta = glm.load_weights()
    intmoe = li.IntMoE.from_model(weights, meta, cfg=cfg)
    arrays = [np.asarray(p) for p in prompts]
    tile = ScriptTile(cfg, intmoe, prefetch=prefetch)
    gold = li.decode(weights, meta, intmoe, arrays, n_tokens, mode=mode, cfg=cfg, tile=tile)
    plan = tile.plan()
    image = ts.lpddr_image(cfg, intmoe.layers, gl.dense_image(cfg, intmoe.layers))
    golden_s = time.monotonic() - t1
    total = len(plan.want_rsp) + len(plan.want_y)

    def tick(cycle, responses):
        if progress:
            progress(cycle, responses, total)
    rep = native.replay(cfg, plan, image, exe=exe, options=options, progress=tick)
    # the RTL's answers, in order, and the tokens the host decodes from them
    ctrl = [p for _, p in rep.responses]
    rounds = [(r["mode"], r["k"]) for c, r in zip(plan.cmds, ctrl) if c["op"] == HostOp.ROUND]
    steps, cur = [], []
    for _, o in rep.outputs:
        cur.append([int(a) for a in o["y"]])
        if o["last"]:
            steps.append(cur)
            cur = []
    try:
        tokens_rtl = li.decode(weights, meta, intmoe, arrays, n_tokens, mode=mode, cfg=cfg,
                               tile=ReplayTile(rounds, steps)).tokens
    except ReplayTile.DivergedError as e:
        tokens_rtl, diverged = None, str(e)
    else:
        diverged = None
    load = rep.tile_rsp[0][0] if rep.tile_rsp else 0
    n_dec = len(plan.want_rsp)
    # the decode ends with its last response or output (the counter reads follow)
    end = max([load] + [c for c, _ in rep.responses[:n_dec][-1:]]
              + [c for c, _ in rep.outputs[-1:]])
    trace = next((d for d in rep.differences if d["kind"] == "trace"), None)
    counters_rtl = rep.counters
    diff = {k: (counters_rtl.get(k), v) for k, v in gold.counters.items()
            if k in counters_rtl and counters_rtl[k] != v}
    r = rep.run
    record = dict(tokens_rtl=tokens_rtl, tokens_golden=gold.tokens,
                match=tokens_rtl == gold.tokens, outputs_equal=rep.match,
                first_difference=rep.first, rtl_diverged=diverged,
                trace_equal=trace is None,
                trace_first_difference=trace and trace["message"],
                counters_rtl=counters_rtl, counters_differ=diff, cycles=end - load,
                load_dense_cycles=load, total_cycles=r.cycles,
                layer_calls=sum(1 for c in plan.cmds if c["op"] == HostOp.STEP),
                events=len(rep.events),
                rounds=[{"mode": ["AR", "SD"][m], "draft_len": k, "accepted": a}
                        for m, k, a in gold.rounds],
                sim="native", sim_cpu_s=round(r.sim_cpu_s, 3), sim_wall_s=round(r.wall_s, 3),
                cycles_per_cpu_s=round(r.cycles / r.sim_cpu_s) if r.sim_cpu_s else None,
                build_s=round(build_s, 2), golden_s=round(golden_s, 2))
    return NativeDecode(record, gold, [e for _, e in rep.events])

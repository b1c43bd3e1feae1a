"""cocotb testbench of ``elmoe3d_esd_dp_join`` (``tb/esd_dp_join.EsdDpJoin``:
the Elastic-SD controller + the real tag unit + the token feed + the real
batched MoE datapath, joined by the one handshake of ``docs/architecture.md``
section 8).

The host decodes a few rounds (Elastic-SD rounds with random acceptance and
an AR round) of random INT8 token vectors through every layer; the golden is
:class:`elmoe3d.golden.esd.EsdController` routing with the golden batched
router (:func:`elmoe3d.golden.moe_batched.route_pass`) on the same vectors,
and :func:`elmoe3d.golden.moe_batched.batched_forward` for the outputs.

Served by testbench models (imported, not copied):

* HB banks and the stream engine's LPDDR beats:
  :class:`elmoe3d.tb.moe_layer_bench.MoETB` (``_hb_serve``: the dense region
  and the slots HB holds, a read of a slot that is not valid refused with an
  error beat; ``_queue_ext``: exactly the command's planes in
  ``weight_beats`` order), built with no expert resident;
* fills: the expert region of a fill's slot is invalid from its command on;
  after the command's beats the slot holds the expert's image
  (``layout.hb_slot_image``), HB strobes ``commit`` into the tag unit (one
  per cycle) and reports ``fill_done`` 1-4 cycles later;
* ``ExtResponse`` per command after its beats; no KV moves (``disabled`` 0);
* the controller's other streams: the testbench kit's
  :class:`~elmoe3d.tb.kit.Source` / :class:`~elmoe3d.tb.kit.Sink` (random
  idle and back-pressure, stream rules), the HB and LPDDR beats fed from
  :class:`MoETB`'s queues; all of it the bench class :class:`TB` (the kit's
  :class:`~elmoe3d.tb.kit.Bench`: ports, one cycle loop, the host
  responses' scoreboard).

Checks: the trace equals the golden control sequence event for event
(:func:`elmoe3d.golden.esd.compare`), every host response the golden's,
every layer output bit for bit and its ``last``, no ``error``; the tag
unit's ``resident`` equals the HB model's valid bits at the end.
``$ELMOE_JOIN_ROUNDS`` (default ``SD,SD,AR``), ``$ELMOE_JOIN_BATCH``
(default 2), ``$ELMOE_JOIN_OUT`` (a JSON summary), ``$ELMOE_GOLDEN_MUTATION``
(the golden outputs' bit 0 flipped), ``$ELMOE_JOIN_MUTANT`` (a mutant of the
golden controller, e.g. ``touch_verify``).
"""

from __future__ import annotations

import collections
import json
import os

import cocotb
import numpy as np
from amaranth.lib import data

from ..config import Config
from ..golden import esd as gesd
from ..golden import layout as gl
from ..hw.esd_ctrl import HostOp, esd_ports
from ..hw.vocab import host_token
from ..sim.run import tile_script
from .common import golden_mutation, params, start_clock_and_reset
from .esd_ctrl_bench import _response_differs, _stall
from .kit import Bench
from .moe_layer_bench import MoETB


def _plain(d):
    return {k: (x.value if hasattr(x, "value") else x) for k, x in d.items()}


def golden_script(cfg, env, rounds, batch, np_rng, faults=None):
    """:func:`elmoe3d.sim.run.tile_script.golden_script` on the bench's layers
    (``env.layers``), the golden controller's mutant from
    ``$ELMOE_JOIN_MUTANT``."""
    return tile_script.golden_script(cfg, env.layers, rounds, batch, np_rng, faults=faults,
                                     mutant=os.environ.get("ELMOE_JOIN_MUTANT") or None)


class TB(Bench):
    """The joined decode's bench (module doc): the host, the HB / LPDDR /
    fill models around :class:`MoETB`'s queues, on the kit's ports, one
    cycle loop, the response scoreboard.

    Parameters
    ----------
    dut
        ``elmoe3d_esd_dp_join``.
    env : MoETB
        The layers, and the HB and LPDDR beat queues (``hb_q``, ``ext_q``),
        built with no expert resident.
    idle : float
        Idle and back-pressure probability of every stream.
    """

    def __init__(self, dut, env, idle):
        # MoETB's loop: its cycle is the time base of the HB and LPDDR queues
        super().__init__(dut, env.rand, idle=idle, on_stall=_stall, loop=env.loop)
        self.env, self.cfg = env, env.cfg
        cfg = env.cfg
        t = {k: data.Layout.cast(v) for k, v in esd_ports(cfg).items()}
        v = env.v
        self.problems, self.events, self.outputs = [], [], []
        self.hb_valid = [0] * cfg.tag_slots
        self.ends, self.commits = [], collections.deque()
        self.responses = self.scoreboard("response", compare=_response_differs)

        self.host = self.source("host_cmd", t["HostCommand"])
        self.xin = self.source("x", data.Layout.cast(host_token(cfg.hidden)))
        self.ext_rsp = self.source("ext_rsp", t["ExtResponse"])
        self.fill_done = self.source("fill_done", t["FillDone"])
        self.kv_move = self.source("kv_move", t["KVMove"])
        # HB and LPDDR beats: MoETB's queues of (due cycle, packed payload)
        self.ext_in = self.source("ext", None, later=env.ext_q)
        self.hb_in = [self.source(f"hb_data__{b}", None, later=env.hb_q[b])
                      for b in range(env.B)]
        self.sink("host_rsp", t["HostResponse"], self.responses.check)
        self.sink("trace", t["TraceEvent"], self.events.append)
        self.sink("ext_cmd", t["ExtCommand"], lambda c: self.on_ext(_plain(c)))
        self.sink("kv_req", t["KVRequest"], self.on_kv)
        self.sink("o", data.Layout.cast(v.MoEOutput), self.outputs.append)
        for b in range(env.B):
            self.sink(f"hb_cmd__{b}", data.Layout.cast(v.HBRead), self.on_hb(b))

    def send(self, cmds, vecs, want_rsp):
        """Queue the host commands and token vectors; expect the responses."""
        for c in cmds:
            self.host.put(c)
        for i, want in enumerate(want_rsp):
            self.responses.expect(want, f"({cmds[i] if i < len(cmds) else '?'})")
        for x in vecs:
            self.xin.put(dict(x=x))

    def on_ext(self, c):
        env, cfg, r = self.env, self.cfg, self.rand
        rel = c["addr"] - cfg.lpddr_base
        le, off = divmod(rel, cfg.expert_bytes)
        layer, e = divmod(le, cfg.experts)
        if off:
            self.problems.append(f"ExtCommand address {c['addr']:#x} is not an expert's base")
        planes = [q for q in range(cfg.planes) if (c["plane_mask"] >> q) & 1]
        before = len(env.ext_q)
        env._queue_ext(layer, e, planes, None)
        nb = len(env.ext_q) - before
        done = self.later(env.ext_latency + nb + r.randint(0, 8))
        self.ext_rsp.put(dict(id=c["id"], error=0, resident=int(bool(c["fill"])),
                              slot=c["slot"]), done)
        if c["fill"]:
            s = c["slot"]
            self.hb_valid[s] = 0                  # HB: the slot is invalid from the fill on
            env.slots.pop(s, None)
            self.ends.append((done + r.randint(0, 6), s, layer, e))

    def hb_cycle(self, cycle):
        """Fills whose time came end: the slot holds the expert's image, HB
        strobes ``commit`` (one per cycle) and reports FillDone later."""
        env, dut = self.env, self.dut
        for x in [x for x in self.ends if x[0] <= cycle]:
            self.ends.remove(x)
            self.commits.append(x[1:])
        drive = None
        if self.commits:
            s, layer, e = self.commits.popleft()
            lay = env.layers[layer]
            env.slots[s] = gl.hb_slot_image(self.cfg, lay.wg[e], lay.wu[e], lay.wd[e])
            self.hb_valid[s] = 1
            drive = s
            self.fill_done.put(dict(slot=s, ok=1), self.later(1 + self.rand.randint(0, 3)))
        dut.commit__valid.value = drive is not None
        dut.commit__slot.value = drive or 0

    def on_hb(self, b):
        def fn(c):
            self.env._hb_serve(b, _plain(c))
        return fn

    def on_kv(self, c):
        self.problems.append(f"unexpected KV request {c}")


@cocotb.test()
async def join(dut):
    """The joined decode (see the module doc)."""
    cfg = Config(**params()["config"])
    env = MoETB(dut, resident=[], ext_latency=8)
    r = env.rand
    idle = float(os.environ.get("ELMOE_JOIN_IDLE", "0.2"))
    rounds = os.environ.get("ELMOE_JOIN_ROUNDS", "SD,SD,AR").split(",")
    batch = int(os.environ.get("ELMOE_JOIN_BATCH", "2"))
    cmds, vecs, want_rsp, want_y, ctl = golden_script(cfg, env, rounds, batch,
                                                      np.random.default_rng(r.getrandbits(32)))
    mutate = golden_mutation()

    dut.commit__valid.value = 0
    dut.commit__slot.value = 0
    dut.disabled.value = 0
    for b in range(env.B):
        getattr(dut, f"hb_data__{b}__valid").value = 0
    dut.ext__valid.value = 0
    await start_clock_and_reset(dut)

    tb = TB(dut, env, idle)
    tb.send(cmds, vecs, want_rsp)
    outputs = tb.outputs
    limit = int(os.environ.get("ELMOE_JOIN_MAX_CYCLES", "3000000"))
    cycles = await tb.run(limit=limit, before=tb.hb_cycle, stop=lambda: tb.problems,
                          done=lambda: (tb.responses.checked >= len(want_rsp)
                                        and len(outputs) >= len(want_y)))
    assert not tb.problems, tb.problems[:5]
    tb.responses.finish(f"{len(outputs)} of {len(want_y)} outputs by cycle {cycles}")
    # the control sequence first: a different decision (e.g. another DRAFT
    # eligibility mask) changes the outputs too, and the trace names it
    evs = [gesd.Event.from_dict(p) for p in tb.events]
    msg = gesd.compare(ctl.events, evs)
    assert msg is None, msg
    assert len(outputs) == len(want_y), f"{len(outputs)} outputs, {len(want_y)} expected"
    bad = []
    for i, ((y, last), o) in enumerate(zip(want_y, outputs)):
        exp = [a ^ 1 for a in y] if mutate else y
        if [int(a) for a in o["y"]] != exp or o["last"] != last or o["error"]:
            bad.append(i)
    assert not bad, f"{len(bad)} of {len(want_y)} outputs differ, first token {bad[0]}"
    res, pend = dut.resident.value.to_unsigned(), dut.pending.value.to_unsigned()
    mine = sum(x << s for s, x in enumerate(tb.hb_valid))
    assert res == mine and not pend, f"tag unit resident {res:#x} pending {pend:#x}, HB {mine:#x}"
    viol = tb.rule_violations()
    assert viol == 0, f"{viol} stream-rule violations on the outputs"
    out = os.environ.get("ELMOE_JOIN_OUT")
    if out:
        kinds = collections.Counter(gesd.EventKind(e.kind).name for e in evs)
        with open(out, "w") as f:
            json.dump(dict(cycles=cycles, events=len(evs), tokens=len(want_y),
                           steps=sum(1 for c in cmds if c["op"] == HostOp.STEP),
                           kinds=dict(kinds)), f)

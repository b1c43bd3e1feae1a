"""The tile's host script and its check: what the host sends the tile top
(``hw/tile.Tile``) and what it must get back, from the golden models alone.

Shared by the cocotb tile benches (``tb/tile_top_bench.py``,
``tb/tile_decode.py``, ``tb/esd_ctrl_bench.py``) and the native harness
(:mod:`elmoe3d.sim.run.native`), so both paths send the same commands and apply
the same checks:

* plans (:class:`Plan`): :func:`random_plan` (random token vectors through
  random golden layers, :func:`golden_script`) and :func:`trace_plan` (a
  golden :func:`~elmoe3d.golden.esd.run_trace` decode whose rankings become
  token vectors of trace layers); :func:`host_commands` frames a plan as the
  tile's commands (LOAD_DENSE, every STEP followed by its TOKEN vectors,
  COUNTER for every counter at the end);
* the LPDDR window (:func:`lpddr_image`) and the planted dense-image fault
  (:func:`plant_dense`);
* the checks, each returning ``None`` or ``(index, message)`` for its first
  difference: :func:`response_mismatch`, :func:`counter_mismatch`,
  :func:`output_mismatch`, :func:`tile_answer_mismatch`,
  :func:`fault_mismatch`, :func:`state_mismatch`, and the trace through
  :func:`elmoe3d.golden.esd.compare`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...golden import esd as gesd
from ...golden import layout as gl
from ...golden import moe_batched as gb
from ...golden import moe_layer as gm
from ...golden.vocab import ExtError
from ...hw.esd_ctrl import COUNTERS, HostOp
from ...hw.esd_feed import ROLE_OF_PHASE
from ...hw.tile import TileError, TileOp

__all__ = ["random_layers", "lpddr_image", "plant_dense", "host_script", "golden_script",
           "Plan", "random_plan", "trace_plan", "HostScript", "host_commands",
           "response_mismatch", "counters_of", "counter_mismatch", "output_mismatch",
           "tile_answer_mismatch", "fault_mismatch", "state_mismatch", "trace_mismatch",
           "canonical_cycles", "round_tokens"]


def random_layers(cfg, np_rng, *, stress=False) -> list:
    """One random golden MoE layer per ``cfg.layers``
    (:func:`elmoe3d.golden.moe_layer.make_layer`, calibrated on 32 tokens):
    the layers the tile benches and the self-test run."""
    return [gm.make_layer(np_rng, hidden=cfg.hidden, ffn=cfg.ffn, experts=cfg.experts,
                          top_k=cfg.top_k, shared=cfg.shared_experts, slice_bits=cfg.slice_bits,
                          draft_keep=cfg.hb_planes_eff, stress=stress, calib_tokens=32)
            for _ in range(cfg.layers)]


def lpddr_image(cfg, layers, dense) -> bytearray:
    """The LPDDR window of ``layers`` (golden layers with ``wg``/``wu``/``wd``)
    and the dense image (:func:`elmoe3d.golden.layout.lpddr_image`)."""
    return gl.lpddr_image(cfg, {(li, e): (ly.wg[e], ly.wu[e], ly.wd[e])
                                for li, ly in enumerate(layers) for e in range(cfg.experts)},
                          dense)


def plant_dense(cfg, mem, which):
    """Corrupt the dense image in ``mem``: ``out`` flips bit 14 of layer 0's
    first output requantisation multiplier (bank 0's word); ``router`` flips
    bit 6 of every byte of layer 0's first router row (every weight it holds
    moves by 64, so that expert's logits move for any token, whatever the
    bench's random layers and tokens are)."""
    d = gl.dense_layout(cfg)
    row = (d.params_base(0) + d.record_index["out"] * 32 // cfg.slice_vector_bits
           if which == "out" else d.router_base(0))
    row_bytes = cfg.pes * cfg.slice_vector_bits // 8
    a = gl.lpddr_layout(cfg).dense_base + row * row_bytes
    for i in ([1] if which == "out" else range(row_bytes)):
        mem[a + i] ^= 0x40


def host_script(case):
    """The host commands of a case's script in order, each with the response
    the golden expects (``None`` for the counter readouts at the end: their
    values are compared with the golden counters)."""
    out = []
    for e in case["script"]:
        op = e["op"]
        if "refused" in e:                          # a command the controller must refuse
            code = getattr(HostOp, op)
            out.append((dict(op=code, phase=e.get("phase", 0), step=e.get("step", 0),
                             layer=e.get("layer", 0),
                             value=e.get("value", 0) | e.get("force", 0) << 8 if op == "ROUND"
                             else e.get("value", 0)),
                        dict(op=code, error=e["refused"])))
        elif op == "ROUND":
            out.append((dict(op=HostOp.ROUND, phase=0, step=0, layer=0,
                             value=e["value"] | e.get("force", 0) << 8),
                        dict(op=HostOp.ROUND, error=0, mode=e["mode"], k=e["k"])))
        elif op == "STEP":
            out.append((dict(op=HostOp.STEP, phase=e["phase"], step=e["step"],
                             layer=e["layer"], value=0),
                        dict(op=HostOp.STEP, error=0, value=e["error"])))
        elif op == "ACCEPT":
            out.append((dict(op=HostOp.ACCEPT, phase=0, step=0, layer=0, value=e["value"]),
                        dict(op=HostOp.ACCEPT, error=0)))
        elif op == "CONTEXT":
            out.append((dict(op=HostOp.CONTEXT, phase=0, step=0, layer=0, value=e["value"]),
                        dict(op=HostOp.CONTEXT, error=e.get("error", 0))))
    for i in range(len(COUNTERS)):
        out.append((dict(op=HostOp.COUNTER, phase=0, step=0, layer=0, value=i), None))
    return out


def golden_script(cfg, layers, rounds, batch, np_rng, faults=None, mutant=None):
    """The host script and the golden of a random-token decode: commands,
    token vectors per STEP, expected responses, outputs and the control
    sequence (``rounds``: ``"SD"`` / ``"AR"`` forced per round, random
    acceptance). ``faults`` (the golden's rule: ordinal of an LPDDR expert
    read -> ``ExtError``) spoil steps: such a step answers ``value`` 1 and is
    repeated (same vectors); its outputs in a pass with an ``EXT_ERROR``
    event are ``(None, last)`` (the datapath flags them ``error``; every
    other pass is exact). ``mutant``: a mutant of the golden controller."""
    PH = gesd.Phase
    ctl = gesd.EsdController(cfg, faults=faults, mutant=mutant)
    E, T = cfg.experts, cfg.batch_tokens
    cmds, vecs, want_rsp, want_y = [], [], [], []

    def step(phase, j, layer):
        lay = layers[layer]
        n = ctl.tokens_of(phase)
        xs = gm.random_tokens(np_rng, lay, n)
        roles = [ROLE_OF_PHASE[phase]] * n
        box = {}

        def route(mask):
            m = np.ones((n, E), bool) if mask is None else np.array(
                [[(mask >> e) & 1 for e in range(E)]] * n, bool)
            box["masks"] = m
            return gb.route_pass(lay, xs, roles, m)[1]

        while True:
            before = len(ctl.events)
            res = ctl.layer_step(phase, j, layer, route)
            bad = {ev.pass_no for ev in ctl.events[before:] if ev.kind == gesd.EventKind.EXT_ERROR}
            assert bool(bad) == bool(res.error)
            y = gb.batched_forward(lay, xs, roles, box["masks"], batch_tokens=T).y
            cmds.append(dict(op=HostOp.STEP, phase=int(phase), step=j, layer=layer, value=0))
            want_rsp.append(dict(op=HostOp.STEP, error=0, value=int(res.error)))
            vecs.extend(xs.tolist())
            want_y.extend((None if i // T in bad else y[i].tolist(), int(i == n - 1))
                          for i in range(n))
            if not res.error:
                break

    for kind in rounds:
        force = gesd.Mode.SD if kind == "SD" else gesd.Mode.AR
        mode, K = ctl.begin_round(batch, force)
        cmds.append(dict(op=HostOp.ROUND, phase=0, step=0, layer=0,
                         value=batch | gesd.force_code(force) << 8))
        want_rsp.append(dict(op=HostOp.ROUND, error=0, mode=int(mode), k=K))
        if mode == gesd.Mode.AR:
            for layer in range(cfg.layers):
                step(PH.AR, 0, layer)
            continue
        for j in range(K):
            for layer in range(cfg.layers):
                step(PH.DRAFT, j, layer)
        for layer in range(cfg.layers):
            step(PH.VERIFY, 0, layer)
        n = int(np_rng.integers(0, batch * K + 1))
        ctl.accept(n)
        cmds.append(dict(op=HostOp.ACCEPT, phase=0, step=0, layer=0, value=n))
        want_rsp.append(dict(op=HostOp.ACCEPT, error=0))
    return cmds, vecs, want_rsp, want_y, ctl


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


def random_plan(cfg, layers, rounds, batch, np_rng, faults, mutant=None) -> Plan:
    """Random token vectors through golden ``layers`` (:func:`golden_script`)."""
    cmds, vecs, want_rsp, want_y, ctl = golden_script(cfg, layers, rounds, batch, np_rng,
                                                      faults=faults, mutant=mutant)
    return Plan(cmds, want_rsp, vecs, want_y, ctl.events, ctl.counters, faults, True,
                f"tile {','.join(rounds)} B{batch}", ctl.ext_reads)


def trace_plan(cfg, layers, case, np_rng) -> Plan:
    """A golden :func:`elmoe3d.golden.esd.run_trace` decode (``case``: its
    script, events, counters, faults) replayed on the tile: every STEP's
    rankings become token vectors of the trace layers
    (:func:`elmoe3d.golden.moe_batched.trace_tokens`; their router ranks the
    experts as the trace), whose outputs are the golden batched layer's with
    the mask the golden controller used; a pass with an ``EXT_ERROR`` event
    has spoilt outputs (a prefetch's, retired after ``PREFETCH_END``, spoils
    none)."""
    T = cfg.batch_tokens
    EK = gesd.EventKind
    bad_passes, cur = [], set()
    prefetch = gesd.in_prefetch_retirement(case["events"])
    for ev, retiring in zip(case["events"], prefetch):
        if ev.kind == EK.EXT_ERROR and not retiring:       # a prefetch's spoils no pass
            cur.add(ev.pass_no)
        elif ev.kind == EK.LAYER_DONE:
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


@dataclass
class HostScript:
    """A plan framed as the tile's host stream: ``commands`` (``TileCommand``
    dicts, in order), ``tile_want`` (the tile's own answers in order,
    ``(TileOp, TileError)``), ``counter_cmds`` (the COUNTER commands at the
    end, as ``HostCommand`` dicts), ``steps`` (per STEP the tile runs: its
    index in ``commands`` and its number of outputs) and ``responses`` (how
    many ``host_rsp`` transfers the plan expects)."""
    commands: list
    tile_want: list
    counter_cmds: list
    steps: list
    responses: int


def host_commands(cfg, plan: Plan) -> HostScript:
    """LOAD_DENSE first (answer OK), every command of ``plan`` with every STEP
    followed by its token vectors (TOKEN), after the first STEP (``probe``)
    a LOAD_DENSE the tile must refuse (BUSY) and opcode 7 (BAD_OP), every
    COUNTER at the end."""
    zero = [0] * cfg.hidden

    def ctrl_cmd(c):
        return dict(op=c["op"], phase=c["phase"], step=c["step"], layer=c["layer"],
                    value=c["value"], x=zero)

    def tile_cmd(op):
        return dict(op=int(op), phase=0, step=0, layer=0, value=0, x=zero)

    script, tile_want = [tile_cmd(TileOp.LOAD_DENSE)], [(TileOp.LOAD_DENSE, TileError.OK)]
    per_step = [i for i, (_, last) in enumerate(plan.want_y) if last]
    vi, first, steps = 0, plan.probe, []
    for c, want in zip(plan.cmds, plan.want_rsp):
        script.append(ctrl_cmd(c))
        if c["op"] == HostOp.STEP and not want.get("error"):       # a STEP the tile runs
            at = len(script) - 1
            if first:
                script += [tile_cmd(TileOp.LOAD_DENSE), tile_cmd(7)]
                tile_want += [(TileOp.LOAD_DENSE, TileError.BUSY), (7, TileError.BAD_OP)]
                first = False
            end = per_step.pop(0) + 1
            script += [dict(tile_cmd(TileOp.TOKEN), x=x) for x in plan.vecs[vi:end]]
            steps.append((at, end - vi))
            vi = end
    assert vi == len(plan.vecs) and not per_step
    counter_cmds = [dict(op=HostOp.COUNTER, phase=0, step=0, layer=0, value=i)
                    for i in range(len(COUNTERS))]
    script += [ctrl_cmd(c) for c in counter_cmds]
    n = len(plan.want_rsp) + len(COUNTERS) + len(plan.want_y) + len(tile_want)
    return HostScript(script, tile_want, counter_cmds, steps, n)


# -- the checks (each: None, or (index, message) of the first difference) -------------------

def response_mismatch(case, expected, responses):
    """The first controller response whose fields differ from the golden's."""
    for i, (want, got) in enumerate(zip(expected, responses)):
        for k, v in want.items():
            if got[k] != v:
                return i, (f"response {i} ({case['script'][i]}): {k} {got[k]} != {v}; "
                           f"got {got}")
    return None


def counters_of(expected, responses) -> dict:
    """The counter values read at the end (the responses after ``expected``)."""
    return {name: responses[len(expected) + i]["value"] for i, name in enumerate(COUNTERS)
            if len(expected) + i < len(responses)}


def counter_mismatch(golden: dict, counters: dict):
    """The first counter the tile keeps whose value differs from the golden's."""
    for k, v in golden.items():
        if k in counters and counters[k] != v:
            return COUNTERS.index(k), f"counter {k}: RTL {counters[k]} != golden {v}"
    return None


def output_mismatch(want_y, outputs):
    """Layer outputs against the golden's ``(y or None, last)``: a spoilt
    pass's (``None``) must carry ``error``, every other equal bit for bit
    with no ``error``; ``last`` on each step's final token."""
    if len(outputs) != len(want_y):
        return min(len(outputs), len(want_y)), f"{len(outputs)} outputs, {len(want_y)} expected"
    bad = [i for i, ((y, last), o) in enumerate(zip(want_y, outputs))
           if o["last"] != last or (o["error"] != 1 if y is None
                                    else [int(a) for a in o["y"]] != y or o["error"])]
    if bad:
        return bad[0], (f"{len(bad)} of {len(want_y)} outputs differ, first token {bad[0]}: "
                        f"{outputs[bad[0]]} != golden {want_y[bad[0]]} (None: a spoilt pass, "
                        f"error 1)")
    return None


def tile_answer_mismatch(tile_rsp, tile_want):
    """The tile's own answers (LOAD_DENSE OK with ``value`` 0, BUSY, BAD_OP)."""
    got = [(x["op"], x["error"]) for x in tile_rsp]
    if got != [(int(o), int(e)) for o, e in tile_want]:
        i = next((j for j, (a, b) in enumerate(zip(got, tile_want))
                  if a != (int(b[0]), int(b[1]))), min(len(got), len(tile_want)))
        return i, (f"tile answers {got}, expected {tile_want} "
                   f"({[x['value'] for x in tile_rsp]})")
    if tile_rsp[0]["value"] != 0:
        return 0, f"LOAD_DENSE answered value {tile_rsp[0]['value']:#x}"
    return None


def fault_mismatch(corrupted_cmds, plan: Plan):
    """Every planned LPDDR fault (of an expert read the golden makes) was
    injected, and no other."""
    hit = set(corrupted_cmds)
    planned = [i for i in plan.faults if plan.ext_reads is None or i < plan.ext_reads]
    if len(hit) != len(planned):
        return 0, f"LPDDR faults injected on commands {sorted(hit)}, planned {planned}"
    return None


def state_mismatch(resident, pending, slot_valid, overflow):
    """At the end: the tag unit's resident slots are HB's valid ones, none is
    pending, the FillDone FIFO never overflowed."""
    if resident != slot_valid or pending or overflow:
        return 0, f"tag unit resident {resident:#x} pending {pending:#x}, HB valid {slot_valid:#x}"
    return None


def trace_mismatch(expected, got, cycles=None):
    """The trace in canonical order against the golden events
    (:func:`elmoe3d.golden.esd.compare`): ``(index, message)`` of the first
    difference, the message naming the cycle the tile sent the differing
    event in when ``cycles`` (one per event of ``got``) is given."""
    msg = gesd.compare(expected, got)
    if msg is None:
        return None
    a, b = gesd.canonical(expected), gesd.canonical(got)
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if cycles is not None and i < len(b):
        msg += f"\n  (the tile sent event {i} in cycle {canonical_cycles(got, cycles)[i]})"
    return i, msg


def canonical_cycles(got, cycles) -> list:
    """The cycles of ``got`` (:class:`~elmoe3d.golden.esd.Event` s, one cycle
    each) in the canonical order of :func:`elmoe3d.golden.esd.canonical`."""
    at = {id(e): c for e, c in zip(got, cycles)}
    return [at[id(e)] for e in gesd.canonical(got)]


def round_tokens(script, batch: int) -> list:
    """Per round of a golden :func:`~elmoe3d.golden.esd.run_trace` script
    (refused commands left out): ``(decode steps, output tokens)`` -- an AR
    round 1 step and ``batch`` tokens, an Elastic-SD round ``K`` steps and
    its accepted drafts + ``batch`` tokens."""
    out = []
    for e in script:
        if "refused" in e:
            continue
        if e["op"] == "ROUND":
            if e["mode"] == int(gesd.Mode.AR):
                out.append([1, batch])
            else:
                out.append([e["k"], batch])
        elif e["op"] == "ACCEPT":
            out[-1][1] += e["value"]
    return [tuple(x) for x in out]

"""The tile's cycle model: a layer step costs what the tile's passes cost.

The tile runs every layer step in the passes its controller decides
(:class:`elmoe3d.golden.esd.EsdController`: ``ceil(n / T)`` passes of up to
``T = Config.batch_tokens`` tokens; per expert of a pass HB, split
HB + LPDDR, or LPDDR with an MSB fill). This module takes those passes from
the golden controller itself (:func:`record_steps` captures every layer step
it runs, whatever drives it: :func:`elmoe3d.golden.esd.run_trace`, the LM
decode through :class:`elmoe3d.golden.lm_int.GoldenTile`) and prices each
pass with the datapath's own traffic contract,
:func:`elmoe3d.golden.moe_batched.pass_traffic`: HB words per bank, LPDDR
beats at the configured bandwidth and PE beats with the token-lane array
(lane collisions included). The model's cycles of one pass are ::

    bound  = max(HB words per bank, LPDDR beats x cycles per beat, PE beats)
    cycles = bound + c_overlap * (serial - bound) + c_pass
             + c_pe_expert * experts [if the PE term bounds the pass]

(``serial``: :func:`serial_cycles`, the pass with its experts one after
another) and of a layer step the sum over its passes plus
``c_token * tokens + c_step`` (and ``c_probe`` for a DRAFT step's
eligibility probe). The bound has no free parameter; the constants
(:class:`Constants`) are the costs the RTL shows beyond it -- the datapath's
pipeline fill and drain per pass and per expert, the controller's per-step
and per-token work -- and are fitted by least squares on one named set of
runs (:mod:`elmoe3d.sim.perf.validate`). Residency is the controller's (MSB
planes of resident experts; ``whole=True`` prices every resident expert as
whole-resident, all planes from HB).

What the model does not time separately: the overlap of the next pass's
announcements with this pass's tail and the host's gaps between steps --
both are inside the fitted constants.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from dataclasses import dataclass

import numpy as np

__all__ = ["Constants", "PassRecord", "record_steps", "step_passes", "pass_features",
           "features", "predict", "FEATURES"]

#: per-pass feature columns (see :func:`pass_features`)
FEATURES = ("bound", "overlap", "passes", "pe_experts", "tokens", "steps", "draft_probe")


@dataclass(frozen=True)
class Constants:
    """The costs beyond the bound, in cycles (:data:`FEATURES` after the
    bound): the share of the serial excess (:func:`serial_cycles` minus the
    bound) the tile loses; the datapath's fixed costs, which the MoE layer
    alone shows too: per pass (pipeline fill and drain), per expert of a
    pass whose bound is the PE array (the array drains between two
    experts' segments); the controller's, which only the tile shows: per
    token of a layer step, per layer step, per DRAFT layer step's
    eligibility probe."""
    c_overlap: float = 0.0
    c_pass: float = 0.0
    c_pe_expert: float = 0.0
    c_token: float = 0.0
    c_step: float = 0.0
    c_probe: float = 0.0

    def vector(self) -> np.ndarray:
        """Coefficients in :data:`FEATURES` order (the bound's is 1)."""
        return np.array([1.0] + [getattr(self, f.name) for f in dataclasses.fields(self)])

    @classmethod
    def from_vector(cls, v) -> "Constants":
        return cls(*(float(x) for x in v[1:]))

    def as_dict(self) -> dict:
        return {f.name: round(getattr(self, f.name), 2) for f in dataclasses.fields(self)}


@dataclass
class PassRecord:
    """One layer step as the tile ran it: its phase name, the controller's
    round (1-based) and per pass the traffic
    (:class:`elmoe3d.golden.moe_batched.Traffic`) and the plan it prices;
    ``fill_bytes``: the weight bytes its HB fills wrote (the controller's
    fills of the step times the planes a fill writes: the MSB planes, every
    plane with ``whole``; none with the cache off)."""
    phase: str
    round: int
    tokens: int
    traffic: list
    plans: list = None
    fill_bytes: float = 0.0


class StepLog(list):
    """What :func:`record_steps` captured: ``(cfg, phase, StepResult, round)``
    per layer step; ``accepted`` maps an SD round (1-based) to its accepted
    drafts."""

    def __init__(self):
        super().__init__()
        self.accepted = {}


@contextlib.contextmanager
def record_steps():
    """Capture every layer step the golden controller runs inside the block:
    yields a :class:`StepLog` that receives ``(cfg, phase, StepResult,
    round)`` per successful layer step and the accept counts. Works by giving :mod:`elmoe3d.golden.esd` a controller
    subclass for the duration (every driver builds its controller from
    there)."""
    from ...golden import esd as gesd
    log = StepLog()
    base = gesd.EsdController

    class Recording(base):
        def layer_step(self, phase, step, layer, route):
            res = super().layer_step(phase, step, layer, route)
            if not res.error:
                log.append((self.cfg, gesd.Phase(phase), res, self.rounds))
            return res

        def accept(self, n):
            super().accept(n)
            log.accepted[self.rounds] = int(n)

    gesd.EsdController = Recording
    try:
        yield log
    finally:
        gesd.EsdController = base


def _role(phase):
    from ...golden import esd as gesd
    from ...golden import moe_batched as gb
    return {gesd.Phase.AR: gb.Role.FULL, gesd.Phase.DRAFT: gb.Role.DRAFT,
            gesd.Phase.VERIFY: gb.Role.VERIFY}[phase]


def step_passes(cfg, phase, res, *, whole: bool = False, cache: bool = True) -> list:
    """The datapath's pass plans (:class:`elmoe3d.golden.moe_batched.PassPlan`)
    of one controller layer step: jobs in the controller's announce order,
    each with the source the controller chose (``whole``: a resident expert's
    LSB planes from HB too; ``cache=False``: every expert from LPDDR, the
    tile with its HB cache off)."""
    from ...golden import esd as gesd
    from ...golden import moe_batched as gb
    shim = types.SimpleNamespace(slice_bits=cfg.slice_bits, draft_keep=cfg.hb_planes_eff)
    role = _role(phase)
    out = []
    for pp in res.passes:
        toks = pp.tokens
        sel = res.selections[toks.start:toks.stop]
        roles = [role] * len(sel)
        groups = {}
        for t, s in enumerate(sel):
            for e in s:
                groups.setdefault(int(e), []).append(t)
        jobs, sources = [], {}
        for s in range(cfg.shared_experts):
            hb, ext, lsb = gb._planes(shim, role, None, True)
            jobs.append(gb.Job(cfg.experts + s, True, tuple(range(len(sel))), role, None,
                               hb, ext, lsb))
        for e, src, slot, *_ in pp.experts:
            jobs.append(gb.Job(int(e), False, tuple(groups[int(e)]), role, None, (), (), ()))
            if cache and src in (gesd.Source.HB, gesd.Source.SPLIT):
                sources[int(e)] = gb.Source(True, int(slot), whole, int(slot))
        plan = gb.PassPlan(toks.start, roles, None, sel, None, jobs)
        out.append(gb.with_sources(shim, plan, sources))
    return out


def records(log, *, whole: bool = False, cache: bool = True) -> list:
    """:class:`PassRecord` s of a :func:`record_steps` log (``whole``,
    ``cache``: :func:`step_passes`)."""
    from ...golden import moe_batched as gb
    out = []
    for cfg, phase, res, rnd in log:
        tr, plans = [], step_passes(cfg, phase, res, whole=whole, cache=cache)
        for p in plans:
            t = gb.pass_traffic(cfg, p)
            t.serial = serial_cycles(cfg, p, t)
            tr.append(t)
        fills = sum(1 for pp in res.passes for x in pp.experts if x[5]) if cache else 0
        planes = cfg.planes if whole else cfg.hb_planes_eff
        out.append(PassRecord(phase.name, rnd, len(res.selections), tr, plans,
                              fills * cfg.expert_bytes * planes / cfg.planes))
    return out


def serial_cycles(cfg, plan, traffic) -> float:
    """The pass's cycles if its experts did not overlap one another: the
    router's PE beats, then per job the longer of its LPDDR time (its
    ``ext_items`` entry of :func:`~elmoe3d.golden.moe_batched.pass_traffic`)
    and its PE beats (its :func:`~elmoe3d.golden.moe_batched.lane_steps`
    over the layer's segments, as ``pass_traffic`` counts them). Where
    LPDDR and the PE array are balanced the tile loses part of the gap
    between this and the bound (the weight buffer lets LPDDR run ahead by a
    bounded amount)."""
    from ...golden import layout as gl
    from ...golden import moe_batched as gb
    chunks = sum(s.chunks for s in gl.segments(cfg))
    ext = {e: beats * traffic.ext_cycles_per_beat for e, _, beats in traffic.ext_items}
    mac = {j.expert: sum(p for p, _ in gb.lane_steps(cfg, j.tokens, plan.roles)) * chunks
           for j in plan.jobs}
    router = traffic.mac_beats - sum(mac.values())
    return router + sum(max(ext.get(e, 0.0), m) for e, m in mac.items())


def pass_features(tr, *, compute: bool = True, serial: float | None = None) -> np.ndarray:
    """Feature row of one pass (:data:`FEATURES`; ``steps`` and
    ``draft_probe`` are 0). ``compute=False`` is a planted model change the
    validation must catch: the bound without its PE term."""
    bound = max(tr.hb_beats, tr.ext_cycles, tr.mac_beats if compute else 0)
    jobs = [e for what, e, _ in tr.hb_items if what == "records"]
    pe = tr.mac_beats >= max(tr.hb_beats, tr.ext_cycles) if compute else False
    serial = getattr(tr, "serial", bound) if serial is None else serial
    over = max(0.0, serial - bound) if compute else 0.0
    return np.array([bound, over, 1.0, len(jobs) if pe else 0, 0.0, 0.0, 0.0])


def features(recs, *, compute: bool = True, restream: bool = True) -> dict:
    """Per phase (``AR``, ``DRAFT``, ``VERIFY``) the summed feature vector of
    the layer steps in ``recs``.
    ``restream=False`` is the other planted change: a layer step's LPDDR
    traffic priced as if each expert were streamed once per step, not once
    per pass of ``T`` tokens (later passes carry only experts no earlier
    pass of the step streamed)."""
    out = {p: np.zeros(len(FEATURES)) for p in ("AR", "DRAFT", "VERIFY")}
    for r in recs:
        f = np.zeros(len(FEATURES))
        seen = set()
        for tr in r.traffic:
            serial = getattr(tr, "serial", None)
            if not restream:
                new = [it for it in tr.ext_items if it[0] not in seen]
                seen.update(it[0] for it in tr.ext_items)
                tr = dataclasses.replace(tr, ext_beats=sum(b for _, _, b in new), ext_items=new)
            f += pass_features(tr, compute=compute, serial=serial)
        f[4] += r.tokens
        f[5] += 1.0
        if r.phase == "DRAFT":
            f[6] += 1.0
        out[r.phase] += f
    return out


def predict(feats: dict, c: Constants) -> dict:
    """Cycles per phase from :func:`features` and the constants."""
    v = c.vector()
    return {p: float(f @ v) for p, f in feats.items()}

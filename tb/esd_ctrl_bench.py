"""cocotb testbench of the Elastic-SD controller (``elmoe3d_esd_ctrl``, alone or
joined with the real tag unit as ``elmoe3d_esd_tag_join``): its trace stream
against the golden control sequence, event for event.

The host script (commands, the rankings each layer step routes, the
responses) and the golden events come from :func:`elmoe3d.golden.esd.run_trace`,
prepared by the pytest wrapper (``$ELMOE_ESD_CASE``, a pickle). Around the
controller the testbench models the blocks it drives, each by its golden
model or contract:

* tag unit: its golden model (:class:`elmoe3d.golden.tag_unit.TagUnitModel`,
  ``execute``: every response field) with 1..4 cycles latency; the controller
  may only issue LOOKUP, LOOKUP_PIN, TOUCH, ALLOCATE, UNPIN, ABORT, DECAY;
* stream engine: one ``ExtResponse`` per ``ExtCommand`` after a random delay
  (the fault plan's ordinals answer with an error);
* HB: the fill of a slot ends (``fill_done``, and the tag unit's commit)
  after its read's response; KV moves computed with
  :func:`elmoe3d.golden.layout.slot_covered_mask`, the tag unit's disabled
  mask updated;
* datapath (``hw/moe/datapath.MoEDatapath``'s ``need`` / ``source`` /
  ``stats`` contract, ``docs/architecture.md`` section 8): the golden
  routing of the step's rankings with the mask the controller sends
  (:class:`~elmoe3d.golden.esd.RankingRouter`), announced per pass as
  ``ExpertNeed`` s in the batched golden's announce order
  (:func:`elmoe3d.golden.moe_batched.announce_order`) with ``layer``,
  ``tokens``, the job's ``precision``, ``last`` on the final one, or one
  ``none`` beat for a pass without routed experts; the pass's ``PassStats``
  after all its decisions and a random delay. With a prefetcher (a
  ``dp_cand`` port): each DRAFT pass's ``PrefetchCandidate`` s
  (:func:`~elmoe3d.golden.esd.prefetch_candidates` of the step's
  unrestricted routing, announce order, ``count`` on each, or one ``none``
  beat); a prefetch's fill-only read answers like any other.

Joined with the real tag unit (``tb/esd_join.EsdTagJoin``, detected by its
``commit`` port) the tag-unit model is gone: the HB model keeps its own
``slot_valid`` bits (cleared when a fill into the slot begins or the KV
region covers it, set at its commit), strobes ``commit`` into the tag unit
one fill per cycle before reporting ``fill_done``, drives ``disabled`` with
the covered mask, and at every KV move (between passes) and at the end the
tag unit's ``resident`` must equal those bits and ``pending`` be 0.

Every stream has random idle cycles and back-pressure (``$ELMOE_ESD_IDLE``,
default 0.2); the bench is a :class:`TB` on the testbench kit
(:class:`~elmoe3d.tb.kit.Bench`: the ports, one cycle loop driving and
sampling every port each cycle -- about twice as fast as one coroutine per
port --, the host responses' scoreboard). ``$ELMOE_ESD_FAST=1`` replaces every
random choice by the fastest one (no idle cycles, no back-pressure, every
modelled block at its minimum latency): a deterministic environment in which
two controller designs' cycle counts compare directly; the result then also
lists the cycle and kind (op) of every trace event (host response)
(``times``). At the end the trace
(in canonical order) must equal the golden events, every host response the
golden's, and the controller's counters the golden counters.
"""

from __future__ import annotations

import collections
import json
import os
import pickle

import cocotb
from amaranth.lib import data
from cocotb.triggers import RisingEdge

from elmoe3d.config import Config
from elmoe3d.golden import esd as gesd
from elmoe3d.golden import layout as gl
from elmoe3d.golden import moe_batched as gb
from elmoe3d.hw.esd_ctrl import COUNTERS, TagOp, esd_ports
from elmoe3d.hw.esd_feed import ROLE_OF_PHASE as _ROLE_OF
from elmoe3d.sim.run.tile_script import (counter_mismatch, counters_of, host_script,
                                         response_mismatch)
from elmoe3d.tb.common import params, reset, rng, start_clock_and_reset
from elmoe3d.tb.kit import Bench


# -- functional coverage (cocotb-coverage, written by tb/coverage.py) ----------------------
from cocotb_coverage.coverage import CoverCross, CoverPoint  # noqa: E402

EK, PH = gesd.EventKind, gesd.Phase
_PHASES = [int(PH.AR), int(PH.DRAFT), int(PH.VERIFY)]


#: event kinds and SOURCE codes the RTL emits (prefetch's: the prefetch tests)
_KINDS = [int(k) for k in EK]
_SOURCES = [int(x) for x in gesd.Source]


@CoverPoint("esd_ctrl.event.kind", xf=lambda e: e["kind"], bins=_KINDS)
@CoverPoint("esd_ctrl.lookup.code", xf=lambda e: e["code"] if e["kind"] == EK.LOOKUP else None,
            bins=[int(gesd.LookupResult.MISS), int(gesd.LookupResult.HIT)])
@CoverPoint("esd_ctrl.lookup.phase", xf=lambda e: e["phase"] if e["kind"] == EK.LOOKUP else None,
            bins=_PHASES)
@CoverCross("esd_ctrl.lookup.phaseXcode", items=["esd_ctrl.lookup.phase", "esd_ctrl.lookup.code"],
            ign_bins=[(int(PH.DRAFT), int(gesd.LookupResult.MISS))])
@CoverPoint("esd_ctrl.allocate.code",
            xf=lambda e: e["code"] if e["kind"] == EK.ALLOCATE else None,
            bins=[int(x) for x in gesd.AllocResult])
@CoverPoint("esd_ctrl.source.code", xf=lambda e: e["code"] if e["kind"] == EK.SOURCE else None,
            bins=_SOURCES)
@CoverPoint("esd_ctrl.source.phase", xf=lambda e: e["phase"] if e["kind"] == EK.SOURCE else None,
            bins=_PHASES)
@CoverCross("esd_ctrl.source.phaseXcode", items=["esd_ctrl.source.phase", "esd_ctrl.source.code"],
            ign_bins=[(int(PH.DRAFT), int(gesd.Source.SPLIT)),
                      (int(PH.DRAFT), int(gesd.Source.LPDDR)),
                      (int(PH.AR), int(gesd.Source.HB)), (int(PH.VERIFY), int(gesd.Source.HB)),
                      (int(PH.AR), int(gesd.Source.PREFETCH)),
                      (int(PH.VERIFY), int(gesd.Source.PREFETCH))])
@CoverPoint("esd_ctrl.fill_end.code",
            xf=lambda e: e["code"] if e["kind"] == EK.FILL_END else None,
            bins=[int(x) for x in gesd.FillEnd])
@CoverPoint("esd_ctrl.invalidate.code",
            xf=lambda e: e["code"] if e["kind"] == EK.INVALIDATE else None,
            bins=[int(x) for x in gesd.InvalidateReason])
@CoverPoint("esd_ctrl.mode.reason", xf=lambda e: e["tag"] if e["kind"] == EK.MODE else None,
            bins=[int(x) for x in gesd.ModeReason])
@CoverPoint("esd_ctrl.ext_error.code",
            xf=lambda e: e["value"] if e["kind"] == EK.EXT_ERROR else None,
            bins=[1, 2, 3])
def _cover_event(e):
    pass


@CoverPoint("esd_ctrl.host.op", xf=lambda op, err: op, bins=list(range(5)))
@CoverPoint("esd_ctrl.host.error", xf=lambda op, err: err, bins=[int(x) for x in gesd.HostError
                                                                 if x != gesd.HostError.BAD_ROUTE])
def _cover_response(op, err):
    pass


@CoverPoint("esd_ctrl.stream.stall", xf=lambda name: name,
            bins=["host_cmd", "trace", "tag_cmd", "ext_cmd", "dp_source", "dp_announce"])
def _cover_stall(name):
    pass


def _case():
    with open(os.environ["ELMOE_ESD_CASE"], "rb") as f:
        return pickle.load(f)


_TAG_OPS = {getattr(TagOp, n).value for n in ("LOOKUP", "LOOKUP_PIN", "TOUCH", "ALLOCATE",
                                               "UNPIN", "ABORT", "DECAY")}
_STALL_NAMES = {"host_cmd", "trace", "tag_cmd", "ext_cmd", "dp_source", "dp_announce"}


def _stall(name):
    if name in _STALL_NAMES:
        _cover_stall(name)


class StepRouter:
    """The datapath model's routing of the controller's ``dp_step`` beats.

    Per beat (:meth:`passes`): the next STEP of the host script, its
    rankings routed by the golden router
    (:class:`~elmoe3d.golden.esd.RankingRouter`, with the mask the beat
    carries in DRAFT), cut into passes
    (:func:`~elmoe3d.golden.moe_batched.pass_counts`); each pass's
    ``ExpertNeed`` beats go onto the ``announce`` source in announce order
    with ``layer``, ``tokens``, the phase's ``precision`` and ``last``, or one
    ``none`` beat for a pass without experts. With a ``cand`` source (a
    prefetcher's ``dp_cand``), each DRAFT pass's ``PrefetchCandidate`` s go
    onto it first (:func:`~elmoe3d.golden.esd.prefetch_candidates` of the
    step's unrestricted routing, announce order, ``count`` on each, or one
    ``none`` beat). A beat beyond the script or with the wrong token count
    is a problem (appended to ``problems``).
    """

    def __init__(self, case, cfg, announce, problems, cand=None):
        self.steps = [e for e in case["script"] if e["op"] == "STEP" and "refused" not in e]
        self.cfg, self.announce, self.problems, self.cand = cfg, announce, problems, cand
        self.i = 0
        self.phase, self.layer = 0, 0            # of the last step routed

    def passes(self, c):
        """Yield ``(tokens, counts, order)`` per pass of step beat ``c``
        (``counts``: expert -> tokens; ``order``: the announce order), its
        announcements queued."""
        if self.i >= len(self.steps):
            self.problems.append("dp_step beyond the script")
            return
        e = self.steps[self.i]
        self.i += 1
        ph = gesd.Phase(c["phase"])
        self.phase, self.layer = ph, c["layer"]
        sel = gesd.RankingRouter(e["rankings"], self.cfg.top_k)(
            c["mask"] if ph == gesd.Phase.DRAFT else None)
        if c["tokens"] != len(sel):
            self.problems.append(f"step tokens {c['tokens']} != {len(sel)}")
        prec = int(_ROLE_OF[ph])            # every token of the step has the phase's role
        full = (gesd.RankingRouter(e["rankings"], self.cfg.top_k)(None)
                if self.cand is not None and ph == gesd.Phase.DRAFT else None)
        put = self.announce.put
        for p0, ntok, counts in gb.pass_counts(sel, self.cfg.batch_tokens):
            if full is not None:
                self._candidates(gesd.prefetch_candidates(full[p0:p0 + ntok], c["mask"]))
            order = gb.announce_order(counts)
            if not order:
                put(dict(layer=c["layer"], expert=0, tokens=0, precision=0, none=1, last=1))
            for i, x in enumerate(order):
                put(dict(layer=c["layer"], expert=x, tokens=counts[x], precision=prec, none=0,
                         last=int(i == len(order) - 1)))
            yield ntok, counts, order

    def _candidates(self, cands):
        corder = gb.announce_order(cands)
        if not corder:
            self.cand.put(dict(expert=0, tokens=0, count=0, last=1, none=1))
        for i, x in enumerate(corder):
            self.cand.put(dict(expert=x, tokens=cands[x], count=len(cands),
                               last=int(i == len(corder) - 1), none=0))


def check_results(case, expected, responses, events, sinks, cycles):
    """The end-of-case checks shared by the benches: every host response, the
    trace (canonical order) and the counters equal the golden's, no stream
    rule broken; coverage written. Returns the case's result record."""
    total = len(expected) + len(COUNTERS)
    bad = response_mismatch(case, expected, responses)
    assert bad is None, bad[1]
    assert len(responses) == total, f"{len(responses)} of {total} responses by cycle {cycles}"
    counters = counters_of(expected, responses)
    for p in events:
        _cover_event(p)
    for rr in responses:
        _cover_response(rr["op"], rr["error"])
    from elmoe3d.tb.coverage import write_coverage
    write_coverage("esd_ctrl", run=f"{case.get('name') or 'replay'} seed {cocotb.RANDOM_SEED}",
                   transactions=len(events) + len(responses))
    evs = [gesd.Event.from_dict(p) for p in events]
    msg = gesd.compare(case["events"], evs)
    viol = sum(len(x.rule_violations) for x in sinks)
    assert viol == 0, f"{viol} stream-rule violations on the outputs"
    assert msg is None, msg
    bad = counter_mismatch(case["counters"], counters)
    assert bad is None, bad[1]
    return dict(cycles=cycles, counters=counters, events=len(evs), rule_violations=viol,
                name=case.get("name"))


def _response_differs(want, got):
    """The response scoreboard's comparison: ``None`` for a counter readout
    (its value is compared with the golden counter at the end), else the
    first field of the golden response ``want`` that ``got`` differs in."""
    if want is None:
        return None
    for k, v in want.items():
        if got[k] != v:
            return f"{k} {got[k]} != {v}; got {got}"
    return None


class CtrlBench(Bench):
    """The base of the benches around the controller (this one, the tile's
    memory side, the tile top): the kit's ports and loop with idle cycles
    and back-pressure ``idle`` drawn from ``rand`` (a stall of a covered
    stream a coverage sample), the host responses' scoreboard and the
    end-of-case checks.

    Attributes
    ----------
    responses, events : list
        Host responses and trace events, as they arrived.
    board : Scoreboard
        The host responses against the golden's (:meth:`expect_responses`).
    """

    def __init__(self, dut, rand, idle):
        super().__init__(dut, rand, idle=idle, on_stall=_stall)
        self.responses, self.events = [], []
        self.board = self.scoreboard("response", compare=_response_differs)

    def expect_responses(self, case, expected):
        """The golden responses ``expected`` to the case's script, in order,
        then one counter readout per counter (values checked at the end)."""
        script = case["script"]
        for i, want in enumerate(expected):
            self.board.expect(want, f"({script[i] if i < len(script) else '?'})")
        for _ in COUNTERS:
            self.board.expect(None, "(COUNTER)")

    def on_response(self, p):
        """A host response: recorded and checked."""
        self.responses.append(p)
        self.board.check(p)

    def check_results(self, case, expected, cycles):
        """The end-of-case checks: every host response arrived and was the
        golden's (the scoreboard), then :func:`check_results`. Returns the
        case's result record."""
        self.board.finish(f"by cycle {cycles}")
        return check_results(case, expected, self.responses, self.events, self.sinks, cycles)


@cocotb.test()
async def replay(dut):
    """Every case of ``$ELMOE_ESD_CASE`` (one, or a list under ``cases``), the
    controller reset between cases; ``$ELMOE_ESD_OUT`` gets one result each."""
    p = dict(params())
    p.pop("prefetch", None)                        # the DUT's, not the Config's
    cfg = Config(**p)
    t = {k: data.Layout.cast(v) for k, v in esd_ports(cfg).items()}
    fast = os.environ.get("ELMOE_ESD_FAST", "") not in ("", "0")
    r = _Fastest() if fast else rng()
    idle = 0.0 if fast else float(os.environ.get("ELMOE_ESD_IDLE", "0.2"))
    if hasattr(dut, "commit__valid"):              # joined: HB's inputs defined from time 0
        dut.commit__valid.value = 0
        dut.commit__slot.value = 0
        dut.disabled.value = 0
    await replay_cases(dut, _case(), lambda case: TB(dut, case, cfg, t, r, idle).run_case())


async def replay_cases(dut, loaded, run_one):
    """Start the clock, then per case of ``loaded`` (the
    ``$ELMOE_ESD_CASE`` pickle: one case, or a list under ``cases``): reset
    the DUT, ``await run_one(case)`` for its result, and write the results
    so far to ``$ELMOE_ESD_OUT`` (a list, or the one result)."""
    cases = loaded["cases"] if "cases" in loaded else [loaded]
    await start_clock_and_reset(dut)
    outs = []
    for case in cases:
        await RisingEdge(dut.clk)                  # leave the ReadOnly phase of the last case
        await reset(dut)
        outs.append(await run_one(case))
        with open(os.environ["ELMOE_ESD_OUT"], "w") as f:
            json.dump(outs if "cases" in loaded else outs[0], f)


class _Fastest:
    """Stands in for ``random.Random`` in the fast environment: every delay
    its minimum, never an idle cycle."""

    @staticmethod
    def randint(a, b):
        return a

    @staticmethod
    def random():
        return 1.0


class TB(CtrlBench):
    """The controller's bench for one case (module doc): the host, the
    modelled tag unit (unless joined), stream engine, HB and datapath on the
    kit's ports, one cycle loop, the response scoreboard.

    Parameters
    ----------
    dut
        ``elmoe3d_esd_ctrl`` or ``elmoe3d_esd_tag_join`` (detected by its
        ``commit`` port: the real tag unit inside).
    case : dict
        The golden case (script, events, counters, faults).
    cfg : Config
    t : dict
        The controller's port layouts (:func:`~elmoe3d.hw.esd_ctrl.esd_ports`).
    rand : random.Random or _Fastest
        Every random choice of the bench.
    idle : float
        Idle and back-pressure probability of every stream.
    """

    def __init__(self, dut, case, cfg, t, rand, idle):
        super().__init__(dut, rand, idle)
        self.case, self.cfg, self.t = case, cfg, t
        self.joined = joined = hasattr(dut, "commit__valid")
        self.tags = None if joined else gesd.TagPolicy(cfg)
        self.hb_valid = [0] * cfg.tag_slots      # the HB model's slot_valid bits (joined)
        self.commits = collections.deque()       # fills ended, HB commits one per cycle
        self.ends = []                           # (cycle, slot, ok) of fills to end (joined)
        self.disabled = None                     # the covered mask to drive next (joined)
        if joined:
            dut.commit__valid.value = 0
            dut.commit__slot.value = 0
            dut.disabled.value = 0
        self.faults = dict(case.get("faults") or {})
        self.ext_seen = 0
        self.kv_state = 0
        self.problems = []
        self.passes = collections.deque()        # experts still to be sourced, per pass
        self.times = dict(responses=[], events=[])

        # sources in driving order (fixes the sequence of idle draws)
        self.host = self.source("host_cmd", t["HostCommand"])
        self.ext_rsp = self.source("ext_rsp", t["ExtResponse"])
        self.fill_done = self.source("fill_done", t["FillDone"])
        self.kv_move = self.source("kv_move", t["KVMove"])
        self.announce = self.source("dp_announce", t["ExpertNeed"])
        self.dp_done = self.source("dp_done", t["PassStats"])
        self.cand = (self.source("dp_cand", t["PrefetchCandidate"])
                     if hasattr(dut, "dp_cand__valid") else None)
        # (joined: tag_cmd / tag_rsp are inner wires; a write would stick on Icarus)
        self.tag_rsp = None if joined else self.source("tag_rsp", t["TagResponse"])
        self.sink("host_rsp", t["HostResponse"], self._timed(self.on_response, "responses"))
        self.sink("trace", t["TraceEvent"], self._timed(self.events.append, "events"))
        if not joined:
            self.sink("tag_cmd", t["TagCommand"], self.on_tag)
        self.sink("ext_cmd", t["ExtCommand"], self.on_ext)
        self.sink("kv_req", t["KVRequest"], self.on_kv)
        self.sink("dp_step", t["StepInfo"], self.on_step)
        self.sink("dp_source", t["ExpertSource"], self.on_source)
        self.router = StepRouter(case, cfg, self.announce, self.problems, self.cand)

    def _timed(self, fn, key):
        def put(x):
            fn(x)
            self.times[key].append((self.cycle, x.get("kind", x.get("op"))))
        return put

    # ---- tag unit -----------------------------------------------------------------
    def on_tag(self, c):
        if c["op"] not in _TAG_OPS:
            self.problems.append(f"unexpected tag op {c['op']}")
        self.tag_rsp.put(self.tags.execute(c), self.later(self.rand.randint(1, 4)))

    # ---- stream engine and HB fills -------------------------------------------------
    def on_ext(self, c):
        r = self.rand
        i = self.ext_seen
        self.ext_seen += 1
        err = int(self.faults.get(i, 0))
        d = r.randint(2, 25)
        self.ext_rsp.put(dict(id=c["id"], error=err, resident=int(bool(c["fill"]) and not err),
                              slot=c["slot"]), self.later(d))
        if c["fill"]:
            slot, ok = c["slot"], not err
            if self.joined:
                self.hb_valid[slot] = 0              # HB: a fill into the slot began
                self.ends.append((self.later(d + r.randint(0, 6)), slot, ok))
                return
            tags = self.tags

            def fire(slot=slot, ok=ok):
                if ok:
                    tags.commit(slot)
                return dict(slot=slot, ok=int(ok))
            self.fill_done.put(fire, self.later(d + r.randint(0, 6)))

    def hb_cycle(self, cycle):
        """Joined: fills whose time came queue up; HB commits one per cycle (the
        strobe into the tag unit) and reports FillDone from the cycle after;
        the commit strobe and the disabled mask driven."""
        due = [x for x in self.ends if x[0] <= cycle]
        for x in due:
            self.ends.remove(x)
            self.commits.append(x[1:])
        commit = None
        while self.commits:
            slot, ok = self.commits.popleft()
            self.fill_done.put(dict(slot=slot, ok=int(ok)), self.later(1 + self.rand.randint(0, 3)))
            if ok:
                self.hb_valid[slot] = 1
                commit = slot
                break
        dut = self.dut
        dut.commit__valid.value = commit is not None
        dut.commit__slot.value = commit or 0
        if self.disabled is not None:
            dut.disabled.value = self.disabled
            self.disabled = None

    def hb_mismatch(self):
        """Joined: ``(resident, pending, HB valid)`` if the tag unit's
        resident slots differ from HB's valid bits or a fill is pending,
        else ``None``."""
        res = self.dut.resident.value.to_unsigned()
        pend = self.dut.pending.value.to_unsigned()
        mine = sum(v << s_ for s_, v in enumerate(self.hb_valid))
        return (res, pend, mine) if res != mine or pend else None

    def on_kv(self, c):
        cfg, S = self.cfg, self.cfg.tag_slots
        words = c["kv_words"]
        if words > gl.kv_limit(cfg):                 # HB would refuse it (KVMove.error)
            self.problems.append(f"KV request of {words} words beyond the limit "
                                 f"{gl.kv_limit(cfg)}")
        mask = gl.slot_covered_mask(cfg, words)
        newly = mask & ~self.kv_state
        if self.joined:
            # between passes: HB's valid bits are the tag unit's RESIDENT slots
            bad = self.hb_mismatch()
            if bad:
                self.problems.append(f"cycle {self.cycle}: tag unit resident {bad[0]:#x} "
                                     f"pending {bad[1]:#x}, HB valid {bad[2]:#x} at a KV move")
            mine = sum(v << s_ for s_, v in enumerate(self.hb_valid))
            inv = newly & mine
            for s_ in range(S):
                if (mask >> s_) & 1:
                    self.hb_valid[s_] = 0
            self.disabled = mask
        else:
            inv = sum(1 << s_ for s_ in range(S) if (newly >> s_) & 1 and self.tags.valid[s_])
            self.tags.set_disabled(mask)
        self.kv_state = mask
        self.kv_move.put(dict(kv_words=words, covered=newly, invalidated=inv, error=0),
                         self.later(self.rand.randint(1, 8)))

    # ---- datapath -------------------------------------------------------------------
    def on_step(self, c):
        for ntok, counts, order in self.router.passes(c):
            self.passes.append([len(order), ntok, len(order), sum(counts.values())])
        self.pass_check()

    def pass_check(self):
        while self.passes and self.passes[0][0] == 0:
            _, ntok, nexp, pairs = self.passes.popleft()
            st = {name: 0 for name, _ in self.t["PassStats"]}
            st.update(tokens=ntok, experts=nexp, expert_tokens=pairs)
            self.dp_done.put(st, self.later(self.rand.randint(1, 30)))

    def on_source(self, c):
        if not self.passes:
            self.problems.append("a source answer outside a pass")
            return
        self.passes[0][0] -= 1
        self.pass_check()

    # ---- the host -------------------------------------------------------------------
    async def run_case(self):
        """Send the case's host script, run until every response is in (or a
        problem, or ``$ELMOE_ESD_MAX_CYCLES``), check; the result record (in
        the fast environment with the cycle and kind of every response and
        event, ``times``)."""
        case = self.case
        expected = []
        for cmd, want in host_script(case):
            self.host.put(cmd)
            if want is not None:
                expected.append(want)
        self.expect_responses(case, expected)
        total = len(expected) + len(COUNTERS)
        limit = int(os.environ.get("ELMOE_ESD_MAX_CYCLES", "50000000"))
        cycles = await self.run(limit=limit, before=self.hb_cycle if self.joined else None,
                                stop=lambda: self.problems,
                                done=lambda: len(self.responses) >= total)
        assert not self.problems, self.problems[:5]
        if self.joined:
            bad = self.hb_mismatch()
            assert bad is None, (f"end: tag unit resident {bad[0]:#x} pending {bad[1]:#x}, "
                                 f"HB valid {bad[2]:#x}")
        out = self.check_results(case, expected, cycles)
        if isinstance(self.rand, _Fastest):
            out["times"] = self.times
        return out

"""pytest entry points: the Elastic-SD controller RTL in cocotb, its trace
event for event against the golden control sequence (blocks modelled by
their golden models; see ``tb/esd_ctrl_bench.py``)."""

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from elmoe3d.config import Config, preset
from elmoe3d.golden import esd as gesd
from elmoe3d.golden.vocab import ExtError
from elmoe3d.hw.esd_ctrl import EsdCtrl
from elmoe3d.sim.run.harness import simulate

from conftest import sim_params

pytestmark = pytest.mark.esd

TB = "elmoe3d.tb.esd_ctrl_bench"


def _factory(prefetch=0, **fields):
    return EsdCtrl(Config(**fields), prefetch=prefetch)


def _join_factory(prefetch=0, **fields):
    from elmoe3d.tb.esd_join import EsdTagJoin
    return EsdTagJoin(Config(**fields), prefetch=prefetch)


#: (factory, block, top) of the controller alone and joined with the real tag unit
ALONE = (_factory, "esd_ctrl", "elmoe3d_esd_ctrl")
JOINED = (_join_factory, "esd_tag_join", "elmoe3d_esd_tag_join")


def _case(cfg, batch, steps, seed, faults=None, tokens=400, mutant=None, **kw):
    R = gesd.synthetic_trace(np.random.default_rng(seed), requests=batch, tokens=tokens,
                             layers=cfg.layers, experts=cfg.experts)
    run = gesd.run_trace(cfg, R, batch=batch, steps=steps, seed=seed, faults=faults,
                         check=False, mutant=mutant, **kw)
    return run, dict(script=run.script, events=run.events, counters=run.counters,
                     faults={int(k): int(v) for k, v in (faults or {}).items()},
                     ext_reads=run.controller.ext_reads)


def _simulate(tmp_path, cfg, cases, *, dut=ALONE, simulator="verilator", seed=1, env=None,
              prefetch=0):
    """One simulation of ``cases`` (a dict, or a list run one after the other
    with a reset between) on the controller with ``prefetch`` depth: the
    testbench's result(s)."""
    f = tmp_path / "case.pkl"
    f.write_bytes(pickle.dumps(cases if isinstance(cases, dict) else dict(cases=cases)))
    out = tmp_path / "out.json"
    e = {"ELMOE_ESD_CASE": str(f), "ELMOE_ESD_OUT": str(out)}
    e.update(env or {})
    factory, block, top = dut
    params = dict(cfg.to_dict(), **({"prefetch": prefetch} if prefetch else {}))
    simulate(factory, block=block, params=params, top=top, simulator=simulator,
             test_module=TB, env=e, seed=seed)
    return json.loads(out.read_text())


def _run(tmp_path, cfg, batch, steps, seed=1, faults=None, simulator="verilator", env=None,
         dut=ALONE, prefetch=0, **kw):
    run, case = _case(cfg, batch, steps, seed, faults, prefetch=prefetch, **kw)
    return run, _simulate(tmp_path, cfg, case, dut=dut, simulator=simulator, seed=seed, env=env,
                          prefetch=prefetch)


def _tiny_kv():
    cfg = preset("tiny")
    free_top = cfg.hb_words - cfg.dense_words - cfg.tag_slots * cfg.slot_words
    return cfg.replace(kv_words_per_token=max(1, (free_top + 6 * cfg.slot_words) // 400),
                       min_free_slots=4)


TINY_KV = _tiny_kv()
KV_PRESSURE = dict(prompt=(60, 120), length=(30, 120))


@pytest.mark.parametrize("simulator", sim_params())
def test_esd_ctrl_tiny(tmp_path, simulator):
    """tiny geometry, batch 4: Elastic-SD and AR rounds (KV back-off), KV
    moves both ways that invalidate slots, moves in the middle of drafting
    and verification: the trace equals the golden sequence, every response
    and counter too."""
    run, out = _run(tmp_path, TINY_KV, 4, 50 if simulator == "verilator" else 20,
                    simulator=simulator, **KV_PRESSURE)
    c = run.counters
    assert out["events"] == len(run.events)
    assert c["rounds_ar"] and c["rounds_sd"] and c["kv_invalidations"]


def test_esd_ctrl_refuses_bad_commands(tmp_path):
    """Every host error a host can cause (BAD_BATCH, BAD_PHASE, BAD_ORDER,
    BAD_ACCEPT, KV_RANGE) sprinkled through a decode: the RTL answers each
    with the golden's code and nothing else changes (the trace and counters
    still equal the golden's)."""
    run, out = _run(tmp_path, TINY_KV, 4, 20, seed=11, bad=0.3, **KV_PRESSURE)
    codes = {e["refused"] for e in run.script if "refused" in e}
    assert codes >= {1, 2, 3, 4, 5}, codes


def test_esd_ctrl_hb_cache_off(tmp_path):
    """AR rounds with the HB expert cache off (ROUND force code 3, the
    LPDDR-only xPU analogue) with refused commands sprinkled in (force code
    4 among them): no LOOKUP, ALLOCATE, FILL or TOUCH, every expert from
    LPDDR, the MODE reason LPDDR; trace, responses and counters equal the
    golden's."""
    run, out = _run(tmp_path, TINY_KV, 4, 20, seed=13, bad=0.2, force=gesd.Mode.AR,
                    hb_cache=False, **KV_PRESSURE)
    kinds = {gesd.EventKind(e.kind) for e in run.events}
    assert gesd.EventKind.SOURCE in kinds and not kinds & {
        gesd.EventKind.LOOKUP, gesd.EventKind.ALLOCATE, gesd.EventKind.FILL_START,
        gesd.EventKind.TOUCH}
    assert {e.tag for e in run.events if e.kind == gesd.EventKind.MODE} == {
        int(gesd.ModeReason.LPDDR)}
    assert run.counters["lpddr_bytes"] and not run.counters["hb_bytes"]
    assert any(e.get("force") == 4 for e in run.script if "refused" in e)
    assert out["events"] == len(run.events)


def test_esd_ctrl_catches_wrong_golden(tmp_path):
    """A golden sequence from a mutated policy (VERIFY touches too) makes the
    same testbench fail: the comparison can fail."""
    from elmoe3d.sim.run.harness import SimulationFailed
    with pytest.raises(SimulationFailed):
        _run(tmp_path, TINY_KV, 4, 12, mutant="touch_verify")


def _report(tmp_path, measured_dir, traces, steps):
    """The report's runs (AR and SD forced by the host, batch 1, 4, 16) on the
    controller joined with the real tag unit (the joined `default` test's
    build), one simulation per geometry; writes
    ``build/measured/esd_ctrl_report.json``."""
    from elmoe3d.commands import decode as dec
    runs = dec.report_runs(steps=steps, traces=traces)
    cases = [dict(script=r["run"].script, events=r["run"].events, counters=r["counters"],
                  faults={}, name=f"{r['trace']} B{r['batch']} {r['mode']}") for r in runs]
    res = _simulate(tmp_path, runs[0]["cfg"], cases, dut=JOINED)
    outs = [dict(trace=r["trace"], batch=r["batch"], mode=r["mode"], steps=steps,
                 rtl=o["counters"], cycles=o["cycles"], events=o["events"])
            for r, o in zip(runs, res)]
    path = measured_dir / "esd_ctrl_report.json"
    old = json.loads(path.read_text())["runs"] if path.is_file() else []
    keep = [o for o in old if o["trace"] not in traces]
    path.write_text(json.dumps({"source": "tests/test_esd_ctrl.py (Verilator)",
                                "runs": keep + outs}, indent=1))
    return runs, outs


def test_esd_ctrl_report(tmp_path, measured_dir):
    """`default` geometry, the synthetic Zipf trace, batch 1, 4 and 16 in AR
    and in Elastic-SD, through the real tag unit: trace, responses and
    counters equal the golden's."""
    from elmoe3d.commands.decode import report_traces
    name = report_traces(quick=True)[0][0]
    runs, outs = _report(tmp_path, measured_dir, [name], 24)
    assert len(outs) == 6 and all(o["events"] > 0 for o in outs)


def test_esd_ctrl_faults(tmp_path):
    faults = {i: [ExtError.SLVERR, ExtError.DECERR, ExtError.PROTOCOL][i % 3]
              for i in range(3, 600, 37)}
    run, out = _run(tmp_path, TINY_KV, 4, 40, seed=5, faults=faults, **KV_PRESSURE)
    assert run.counters["aborts"] > 0 and out["counters"]["aborts"] == run.counters["aborts"]
    # batch 1 (AR below the threshold, reason BATCH) with faults too
    run, out = _run(tmp_path, TINY_KV, 1, 30, seed=6, faults=faults)
    assert run.counters["ext_errors"] > 0


@pytest.mark.parametrize("dut", [ALONE, JOINED], ids=["alone", "joined"])
def test_esd_ctrl_prefetch(tmp_path, dut):
    """Prefetch during drafts (depth 3) at tiny, batch 4, KV moves in the
    middle of drafting and verification, LPDDR faults (some of them on
    prefetch reads): the trace equals the golden event for event (PREFETCH,
    the prefetches' lookups, allocations and fills, PREFETCH_END and their
    retirement), every response and counter too; joined with the real tag
    unit, its resident and pending slots equal HB's at every KV move."""
    # LPDDR reads 29 and 85 are prefetches (the first fault shifts the later ones)
    faults = {29: ExtError.SLVERR, 85: ExtError.DECERR, 140: ExtError.PROTOCOL,
              300: ExtError.SLVERR, 450: ExtError.DECERR, 601: ExtError.PROTOCOL}
    run, out = _run(tmp_path, TINY_KV, 4, 40, seed=21, faults=faults, prefetch=3, dut=dut,
                    **KV_PRESSURE)
    kinds = [gesd.EventKind(e.kind) for e in run.events]
    pc = run.controller.prefetch_counts
    assert kinds.count(gesd.EventKind.PREFETCH) and kinds.count(gesd.EventKind.PREFETCH_END)
    assert pc["prefetches"] and pc["prefetch_hits"], pc
    srcs = [e for e in run.events if e.kind == gesd.EventKind.SOURCE
            and e.code == gesd.Source.PREFETCH]
    faulted = sum(r and e.kind == gesd.EventKind.EXT_ERROR       # a prefetch's LPDDR error
                  for e, r in zip(run.events, gesd.in_prefetch_retirement(run.events)))
    assert srcs and faulted, "no fault hit a prefetch read"
    assert out["events"] == len(run.events)


def test_esd_ctrl_prefetch_catches_wrong_golden(tmp_path):
    """A golden that prefetches each token's lowest-ranked non-eligible
    expert (mutant ``prefetch_last``) instead of its best makes the prefetch
    bench fail: the comparison of prefetch events can fail."""
    from elmoe3d.sim.run.harness import SimulationFailed
    with pytest.raises(SimulationFailed):
        _run(tmp_path, TINY_KV, 4, 12, seed=21, prefetch=3, mutant="prefetch_last",
             **KV_PRESSURE)


@pytest.mark.slow
def test_esd_ctrl_report_lm(tmp_path, measured_dir):
    """The LM's own routing trace on the `lm` geometry, batch 1, 4, 16, AR and SD."""
    from elmoe3d.commands.decode import report_traces
    name = report_traces(quick=True)[1][0]
    _report(tmp_path, measured_dir, [name], 60)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_esd_ctrl_2000_steps(tmp_path, batch):
    cfg = preset("default").replace(kv_words_per_token=8)
    run, out = _run(tmp_path, cfg, batch, 2000, seed=batch)
    assert run.counters["decode_steps"] >= 2000


# ---------------------------------------------------------------------------------------
# the controller joined with the real tag unit (tb/esd_join.py; issue 13 item 4(a))
# HB, stream engine and datapath are modelled; HB's commit strobe and covered
# mask drive the tag unit, whose resident/pending outputs must equal HB's
# valid bits at every KV move and at the end.

def _faults(every, n=10 ** 6):
    """LPDDR errors (SLVERR, DECERR, PROTOCOL in turn) on every ``every``-th read."""
    return {i: [ExtError.SLVERR, ExtError.DECERR, ExtError.PROTOCOL][i % 3]
            for i in range(3, n, every)}


FAULTS = _faults(37)


@pytest.mark.parametrize("simulator", sim_params())
def test_esd_tag_join_tiny(tmp_path, simulator):
    """tiny, batch 4, KV pressure (SD and back-off AR rounds, moves that
    invalidate slots) and LPDDR faults (ABORTs in the real tag unit): the
    trace equals the golden sequence, every response and counter too."""
    run, out = _run(tmp_path, TINY_KV, 4, 60 if simulator == "verilator" else 20, seed=3,
                    faults=FAULTS, simulator=simulator, dut=JOINED, **KV_PRESSURE)
    c = run.counters
    assert out["events"] == len(run.events)
    assert c["rounds_ar"] and c["rounds_sd"] and c["kv_invalidations"] and c["aborts"]


def _join_cases(cfg, steps, batches=(1, 4, 16), tokens=400):
    """Synthetic Zipf + reuse decodes with random acceptance; Elastic-SD asked
    for every round (the batch threshold would keep batch 1 and 16 in AR; the
    KV back-off still applies) and LPDDR faults every 997th read."""
    runs, cases = [], []
    for b in batches:
        run, case = _case(cfg, b, steps, seed=100 + b, tokens=tokens, faults=_faults(997),
                          force=gesd.Mode.SD)
        case["name"] = f"B{b}"
        runs.append(run)
        cases.append(case)
    return runs, cases


#: the `default` preset as it is: the report's runs (test_esd_ctrl_report)
#: share this simulator build
DEFAULT_JOIN = preset("default")


def test_esd_tag_join_default(tmp_path, measured_dir):
    """`default` geometry, synthetic Zipf + reuse routing, random acceptance,
    batch 1, 4 and 16 (one simulation, reset between): event for event."""
    runs, cases = _join_cases(DEFAULT_JOIN, 30)
    t0 = _cpu()
    outs = _simulate(tmp_path, DEFAULT_JOIN, cases, dut=JOINED)
    _record_join(measured_dir, "default", runs, outs, _cpu() - t0)
    assert [o["events"] for o in outs] == [len(r.events) for r in runs]
    for r in runs:
        c = r.counters
        assert c["rounds_sd"] and c["accepted_tokens"] and c["evictions"] and c["aborts"], c


def test_esd_tag_join_catches_wrong_policy(tmp_path):
    """The golden sequence of a mutated tag-unit policy (victim ties to the
    highest index) differs from the real one, and the joined testbench fails
    on it: the real tag unit's decisions are compared."""
    from elmoe3d.sim.run.harness import SimulationFailed
    good, _ = _case(TINY_KV, 4, 30, 3, faults=FAULTS, **KV_PRESSURE)
    bad, case = _case(TINY_KV, 4, 30, 3, faults=FAULTS, mutant="tie", **KV_PRESSURE)
    assert gesd.compare(good.events, bad.events) is not None
    with pytest.raises(SimulationFailed):
        _simulate(tmp_path, TINY_KV, case, dut=JOINED, seed=3)


def _cpu():
    """CPU seconds of the finished child processes (the simulator)."""
    import resource
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def _record_join(measured_dir, name, runs, outs, cpu):
    """Measured figures of joined runs -> ``build/measured/esd_tag_join.json``
    (one entry per case name, replaced when run again); ``sim_cpu_s`` is the
    simulation's CPU time (Verilator + the Python testbench; with a fresh
    build it includes the build), shared by the cases of one simulation."""
    import fcntl
    path = measured_dir / "esd_tag_join.json"
    lock = open(measured_dir / ".esd_tag_join.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)              # the slow runs may end together
    old = json.loads(path.read_text())["runs"] if path.is_file() else []
    new = [dict(test=name, case=o["name"], steps=r.counters["decode_steps"],
                events=o["events"], cycles=o["cycles"], rounds_sd=r.counters["rounds_sd"],
                rounds_ar=r.counters["rounds_ar"], evictions=r.counters["evictions"],
                aborts=r.counters["aborts"], kv_invalidations=r.counters["kv_invalidations"],
                sim_cpu_s=round(cpu, 1))
           for r, o in zip(runs, outs)]
    keep = [x for x in old if (x["test"], x["case"]) not in {(y["test"], y["case"]) for y in new}]
    path.write_text(json.dumps({"source": "tests/test_esd_ctrl.py -k join (Verilator)",
                                "runs": keep + new}, indent=1))
    lock.close()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_esd_tag_join_2000_steps(tmp_path, measured_dir, batch):
    """2,000 decode steps at `default`, batch 1, 4, 16, through the real tag
    unit: event for event (writes build/measured/esd_tag_join.json)."""
    runs, cases = _join_cases(DEFAULT_JOIN, 2000, batches=(batch,))
    t0 = _cpu()
    outs = _simulate(tmp_path, DEFAULT_JOIN, cases, dut=JOINED, seed=batch)
    _record_join(measured_dir, "2000_steps", runs, outs, _cpu() - t0)
    assert runs[0].counters["decode_steps"] >= 2000
    assert outs[0]["events"] == len(runs[0].events)


@pytest.mark.parametrize("amount_bits", [2, 4, 6])
def test_saturating_add_every_value(amount_bits):
    """The statistics counters' bump, ``min(c + a, 2**n - 1)``, at every
    counter value and every amount of a 4-bit counter (amounts narrower,
    as wide and wider than it), and with constant amounts; a mutant whose
    overflow test misses the sum's top bit fails here."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator
    from elmoe3d.hw.esd_ctrl import saturating_add
    m = Module()
    c, a = Signal(4), Signal(amount_bits)
    out, out1, out7 = Signal(4), Signal(4), Signal(4)
    m.d.comb += [out.eq(saturating_add(c, a)), out1.eq(saturating_add(c, 1)),
                 out7.eq(saturating_add(c, 7))]
    seen = []

    async def bench(ctx):
        for cv in range(16):
            for av in range(1 << amount_bits):
                ctx.set(c, cv)
                ctx.set(a, av)
                seen.append((cv, av, ctx.get(out), ctx.get(out1), ctx.get(out7)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert len(seen) == 16 << amount_bits
    for cv, av, o, o1, o7 in seen:
        assert (o, o1, o7) == (min(cv + av, 15), min(cv + 1, 15), min(cv + 7, 15)), (cv, av)


# ---------------------------------------------------------------------------------------
# cycles in the fast environment (no idle, no back-pressure, every modelled block at its
# minimum latency): the controller's own cost per command, per pass and per expert


def _cycle_figures(out, script):
    """Per-command mean cycles (response to response, by op and phase), the
    cycles of a pass by its experts (its ``PASS`` to the next ``PASS`` or
    ``LAYER_DONE``: lookups, decisions, the pass end) with a line fit
    (fixed + per expert), and the cycles of a STEP outside its passes."""
    ek = gesd.EventKind
    rs, evs = out["times"]["responses"], out["times"]["events"]
    names = {0: "ROUND", 1: "STEP", 2: "ACCEPT", 3: "CONTEXT", 4: "COUNTER"}
    per, prev = {}, 0
    steps = [e for e in script]
    for i, (c, op) in enumerate(rs):
        e = steps[i] if i < len(steps) else {}
        key = names[op] + (f"/{gesd.Phase(e['phase']).name}" if op == 1 and "refused" not in e
                           else "") + (" refused" if "refused" in e else "")
        per.setdefault(key, []).append(c - prev)
        prev = c
    passes, groups, cur, first = [], [], None, None
    for c, k in evs:
        if k in (ek.PASS, ek.LAYER_DONE) and cur is not None:
            passes.append((cur[1], c - cur[0]))
        if k == ek.PASS:
            first = c if first is None else first
            cur = (c, 0)
        elif k == ek.LAYER_DONE:
            groups.append(c - (first if first is not None else c))
            cur, first = None, None
        elif k == ek.LOOKUP and cur is not None:
            cur = (cur[0], cur[1] + 1)
    x = np.array([p[0] for p in passes], float)
    y = np.array([p[1] for p in passes], float)
    fixed, per_expert = np.linalg.lstsq(np.vstack([np.ones_like(x), x]).T, y, rcond=None)[0]
    outside, gi, prev = {}, 0, 0
    for i, (c, op) in enumerate(rs):
        e = steps[i] if i < len(steps) else {}
        if op == 1 and "refused" not in e:
            outside.setdefault(gesd.Phase(e["phase"]).name, []).append(c - prev - groups[gi])
            gi += 1
        prev = c
    mean = lambda v: round(float(np.mean(v)), 2)   # noqa: E731
    by_n = {}
    for n, d in passes:
        by_n.setdefault(n, []).append(d)
    return dict(cycles=out["cycles"], commands={k: [len(v), mean(v)] for k, v in sorted(per.items())},
                pass_fixed=round(float(fixed), 2), pass_per_expert=round(float(per_expert), 2),
                pass_by_experts={int(n): mean(v) for n, v in sorted(by_n.items())},
                step_outside_passes={k: mean(v) for k, v in sorted(outside.items())})


def test_esd_ctrl_cycles(tmp_path, measured_dir):
    """The fast environment (``ELMOE_ESD_FAST=1``): `tiny` with KV pressure
    (the controller alone) and `default` at batch 1 / 4 / 16 (joined with
    the real tag unit, SD forced): trace, responses and counters equal the
    golden's; the cycles per command, per pass and per expert go to
    ``build/measured/esd_ctrl_cycles.json`` (``docs/blocks/esd_ctrl.md``,
    Numbers)."""
    fast = {"ELMOE_ESD_FAST": "1"}
    res = {}
    for d in ("tiny", "default"):
        (tmp_path / d).mkdir()
    run, case = _case(TINY_KV, 4, 40, 1, **KV_PRESSURE)
    out = _simulate(tmp_path / "tiny", TINY_KV, case, env=fast)
    res["tiny B4 alone"] = _cycle_figures(out, case["script"])
    runs, cases = _join_cases(DEFAULT_JOIN, 12)
    outs = _simulate(tmp_path / "default", DEFAULT_JOIN, cases, dut=JOINED, env=fast)
    for c, o in zip(cases, outs):
        res[f"default {c['name']} joined"] = _cycle_figures(o, c["script"])
    (measured_dir / "esd_ctrl_cycles.json").write_text(json.dumps(
        {"source": "tests/test_esd_ctrl.py -k cycles (Verilator, ELMOE_ESD_FAST=1)",
         "runs": res}, indent=1))
    assert all(r["pass_per_expert"] > 0 for r in res.values())


# ---------------------------------------------------------------------------------------
# no later than the recorded cycles: the records (the cycle and kind of every host response
# and trace event of each case, in the fast environment) are tests/data/esd_ctrl_cycles_ref.json;
# ELMOE_ESD_WRITE_REF=1 records this controller's and rewrites the file first (after a
# change that is meant to move the cycles, or a golden change that changes the cases).

CYCLE_FIXTURE = Path(__file__).resolve().parent / "data" / "esd_ctrl_cycles_ref.json"


def _cycle_runs():
    """``(name, cfg, cases, joined)``: `tiny` alone with KV pressure and LPDDR
    faults (SD and back-off AR rounds, KV moves that invalidate slots, aborts,
    LPDDR errors) and with refused commands; `default` joined with the real
    tag unit at batch 1 / 4 / 16, SD forced (lookups, evictions, touches,
    DECAYs)."""
    _, faults = _case(TINY_KV, 4, 40, 5, faults=FAULTS, **KV_PRESSURE)
    _, bad = _case(TINY_KV, 4, 20, 11, bad=0.3, **KV_PRESSURE)
    faults["name"], bad["name"] = "B4 faults", "B4 refusals"
    _, joined = _join_cases(DEFAULT_JOIN, 12)
    return [("tiny", TINY_KV, [faults, bad], False), ("default", DEFAULT_JOIN, joined, True)]


def _plain(x):
    """A NumPy value (array or scalar) as JSON can write it."""
    return x.tolist() if hasattr(x, "tolist") else int(x)


def _digest(case):
    """What a case asks of the controller (its host script and faults)."""
    import hashlib
    return hashlib.sha256(json.dumps([case["script"], case["faults"]], sort_keys=True,
                                     default=_plain).encode()).hexdigest()[:16]


def _cycle_records(tmp_path, duts):
    """``{case: {digest, responses, events}}`` in the fast environment, the
    records as ``[cycle, kind or op]``."""
    out = {}
    for name, cfg, cases, joined in _cycle_runs():
        d = tmp_path / f"{duts[joined][1]}-{name}"
        d.mkdir(parents=True)
        res = _simulate(d, cfg, cases, dut=duts[joined], env={"ELMOE_ESD_FAST": "1"})
        for c, o in zip(cases, res):
            out[f"{name} {c['name']}"] = dict(digest=_digest(c), **{
                k: [list(map(int, x)) for x in v] for k, v in o["times"].items()})
    return out


def _first_difference(want, got):
    """The first record where two runs of one case part (kind, order or
    cycle), or None."""
    for key in ("responses", "events"):
        w, g = want[key], got[key]
        for i, (a, b) in enumerate(zip(w, g)):
            if a != b:
                return f"{key}[{i}]: reference {a}, this controller {b}"
        if len(w) != len(g):
            return f"{key}: reference {len(w)} records, this controller {len(g)}"
    return None


def _first_later(want, got):
    """The first response or event that differs in kind or order from the
    reference's, or leaves later than the reference's; None if every record
    has the reference's kind and position and a cycle no later."""
    for key in ("responses", "events"):
        w, g = want[key], got[key]
        if len(w) != len(g):
            return f"{key}: reference {len(w)} records, this controller {len(g)}"
        for i, ((ca, ka), (cb, kb)) in enumerate(zip(w, g)):
            if ka != kb or cb > ca:
                return f"{key}[{i}]: reference {[ca, ka]}, this controller {[cb, kb]}"
    return None


def test_first_later_flags_a_late_or_changed_record():
    """The comparison of :func:`test_esd_ctrl_cycles_no_later_than_reference`
    fails on one record a cycle late, on a changed kind and on a missing
    record, and passes on records that are sooner."""
    ref = {"responses": [[10, 1], [20, 2]], "events": [[5, 3], [15, 4]]}
    assert _first_later(ref, ref) is None
    assert _first_later(ref, {"responses": [[9, 1], [19, 2]], "events": [[5, 3], [1, 4]]}) is None
    assert "responses[1]" in _first_later(ref, {"responses": [[10, 1], [21, 2]],
                                                "events": ref["events"]})
    assert "events[0]" in _first_later(ref, {"responses": ref["responses"],
                                             "events": [[5, 4], [15, 4]]})
    assert "records" in _first_later(ref, {"responses": ref["responses"][:1],
                                           "events": ref["events"]})


def test_esd_ctrl_cycles_no_later_than_reference(tmp_path, measured_dir):
    """The controller answers every host command and emits every trace
    event in the recorded order (``tests/data/esd_ctrl_cycles_ref.json``)
    and no later than its recorded cycle, in the fast environment
    (``ELMOE_ESD_FAST=1``: no idle, no back-pressure, every modelled block
    at its minimum latency), alone and joined with the real tag unit; the
    bench checks trace, commands, responses and counters against the golden
    as always. The golden contract is event for event; the cycles are the
    RTL's, and this keeps a change from making the controller slower
    unnoticed (:func:`test_first_later_flags_a_late_or_changed_record`)."""
    if os.environ.get("ELMOE_ESD_WRITE_REF", "") not in ("", "0"):
        ref = _cycle_records(tmp_path / "ref", (ALONE, JOINED))
        CYCLE_FIXTURE.parent.mkdir(exist_ok=True)
        CYCLE_FIXTURE.write_text(json.dumps(
            {"source": "tests/test_esd_ctrl.py -k reference with ELMOE_ESD_WRITE_REF=1 "
                       "(Verilator, ELMOE_ESD_FAST=1)",
             "runs": ref}, separators=(",", ":")))
    want = json.loads(CYCLE_FIXTURE.read_text())["runs"]
    got = _cycle_records(tmp_path, (ALONE, JOINED))
    (measured_dir / "esd_ctrl_cycles_vs_ref.json").write_text(json.dumps(
        {"source": "tests/test_esd_ctrl.py -k reference (Verilator, ELMOE_ESD_FAST=1)",
         "runs": {name: dict(responses=len(got[name]["responses"]),
                             events=len(got[name]["events"]),
                             last_response=dict(reference=want[name]["responses"][-1][0],
                                                now=got[name]["responses"][-1][0]),
                             first_difference=_first_difference(want[name], got[name]))
                  for name in want if name in got}}, indent=1))
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name]["digest"] == want[name]["digest"], (
            f"{name}: the case changed since the reference was recorded; rerun with "
            "ELMOE_ESD_WRITE_REF=1")
        late = _first_later(want[name], got[name])
        assert late is None, f"{name}: {late}"

"""pytest entry points: the memory side of the tile (``hw/tile.TileMem``:
controller + tag unit + HB bank controller + stream engine, cocotbext-axi as
LPDDR), its trace event for event against the golden control sequence and
every HB / LPDDR word against the golden images (``tb/tile_mem_bench.py``);
and the tile top (``hw/tile.Tile``: TileMem + token feed + batched datapath,
one host command / response stream): a short decode at ``tiny`` with the
dense region loaded from LPDDR, trace event for event, outputs bit for bit
(``tb/tile_top_bench.py``)."""

import json
import pickle

import pytest

from elmoe3d.config import Config, preset
from elmoe3d.golden import esd as gesd
from elmoe3d.golden.vocab import ExtError
from elmoe3d.sim.run.harness import simulate

from test_esd_ctrl import KV_PRESSURE, TINY_KV, _case, _cpu, _faults

pytestmark = pytest.mark.tile

TB = "elmoe3d.tb.tile_mem_bench"


def _factory(**fields):
    from elmoe3d.hw.tile import TileMem
    return TileMem(Config(**fields))


def _simulate(tmp_path, cfg, cases, *, seed=1, env=None):
    """One simulation of ``cases`` (a list, reset between): the results."""
    f = tmp_path / "case.pkl"
    f.write_bytes(pickle.dumps(dict(cases=cases)))
    out = tmp_path / "out.json"
    e = {"ELMOE_ESD_CASE": str(f), "ELMOE_ESD_OUT": str(out)}
    e.update(env or {})
    simulate(_factory, block="tile_mem", params=cfg.to_dict(), top="elmoe3d_tile_mem",
             test_module=TB, env=e, seed=seed)
    return json.loads(out.read_text())


#: LPDDR faults on three reads of a short run: SLVERR, DECERR and PROTOCOL (a
#: wrong RLAST); the spoilt step is repeated by the host (faults on every
#: n-th read with a small n would spoil every step of a large batch)
FAULTS = {3: ExtError.SLVERR, 10: ExtError.DECERR, 17: ExtError.PROTOCOL}


def _cases(cfg, steps, batches, *, faults=FAULTS, tokens=400, seeds=None, **kw):
    """Golden runs and bench cases per batch (trace seed ``100 + batch``
    unless ``seeds`` names one)."""
    runs, cases = [], []
    for b in batches:
        run, case = _case(cfg, b, steps, (seeds or {}).get(b, 100 + b), faults, tokens=tokens,
                          force=gesd.Mode.SD, **kw)
        case["name"] = f"B{b}"
        runs.append(run)
        cases.append(case)
    return runs, cases


def _record(measured_dir, name, cfg_name, runs, outs, cpu):
    """Measured figures -> ``build/measured/tile_mem.json`` (replaced per case)."""
    path = measured_dir / "tile_mem.json"
    old = json.loads(path.read_text())["runs"] if path.is_file() else []
    new = [dict(test=name, config=cfg_name, case=o["name"],
                steps=r.counters["decode_steps"], events=o["events"], cycles=o["cycles"],
                lpddr_reads=o["lpddr_cmds"], bursts=o["bursts"], ext_beats=o.get("ext_beats", 0),
                hb_reads=o.get("hb_reads", 0), hb_words=o.get("hb_words", 0),
                residency_checks=o["residency_checks"],
                resident_checked=o.get("resident_checked", 0),
                rounds_sd=r.counters["rounds_sd"], evictions=r.counters["evictions"],
                aborts=r.counters["aborts"], ext_errors=r.counters["ext_errors"],
                kv_invalidations=r.counters["kv_invalidations"], sim_cpu_s=round(cpu, 1))
           for r, o in zip(runs, outs)]
    keys = {(x["test"], x["case"]) for x in new}
    keep = [x for x in old if (x["test"], x["case"]) not in keys]
    path.write_text(json.dumps({"source": "tests/test_tile.py (Verilator)",
                                "runs": keep + new}, indent=1))


def _check(runs, outs):
    assert [o["events"] for o in outs] == [len(r.events) for r in runs]
    for r, o in zip(runs, outs):
        assert o["lpddr_cmds"] > 0 and o["residency_checks"] >= 1, o


def test_tile_mem_tiny(tmp_path, measured_dir):
    """tiny, KV pressure (SD and back-off AR rounds, moves that invalidate
    slots), LPDDR faults, batch 1 and 4 in one simulation (batch 16 at
    `tiny` with this KV pressure is all back-off AR: it runs at `default`,
    below): trace, host
    responses and counters equal the golden's, every HB and LPDDR word the
    golden image's, every resident slot holds its expert at every KV move."""
    # trace seed 7 at batch 4: a KV move there invalidates a resident slot
    # (the golden's kv_invalidations; seed 104 had none)
    runs, cases = _cases(TINY_KV, 4, (1, 4), seeds={4: 7}, **KV_PRESSURE)
    t0 = _cpu()
    outs = _simulate(tmp_path, TINY_KV, cases, seed=3)
    _record(measured_dir, "tiny", "tiny (KV pressure)", runs, outs, _cpu() - t0)
    _check(runs, outs)
    c = [r.counters for r in runs]
    assert sum(x["aborts"] for x in c) and sum(x["ext_errors"] for x in c)
    assert sum(x["evictions"] for x in c) and sum(x["kv_moves"] for x in c)
    assert sum(x["kv_invalidations"] for x in c), "no KV move invalidated a resident slot"


DEFAULT = preset("default")


def _default(tmp_path, measured_dir, batches, name):
    runs, cases = _cases(DEFAULT, 1, batches)
    t0 = _cpu()
    outs = _simulate(tmp_path, DEFAULT, cases, seed=5)
    _record(measured_dir, name, "default", runs, outs, _cpu() - t0)
    _check(runs, outs)


@pytest.mark.slow
def test_tile_mem_default(tmp_path, measured_dir):
    """`default` geometry, batch 1, a short trace with three LPDDR faults
    (about 130,000 cycles: every LPDDR expert read is 1,536 or 3,072 beats;
    with its own Verilator build about 3.5 minutes, so `slow`: the default
    run's test budget)."""
    _default(tmp_path, measured_dir, (1,), "default")


@pytest.mark.slow
def test_tile_mem_default_batches(tmp_path, measured_dir):
    """`default` geometry, batch 4 and 16, short traces with LPDDR faults (one
    simulation; several CPU-minutes)."""
    _default(tmp_path, measured_dir, (4, 16), "default_batches")


def test_tile_mem_catches_wrong_golden(tmp_path):
    """A golden from a mutated tag policy (victim ties to the highest index)
    differs from the real one and the tile bench fails on it."""
    from elmoe3d.sim.run.harness import SimulationFailed
    good, _ = _cases(TINY_KV, 2, (4,), **KV_PRESSURE)
    bad, cases = _cases(TINY_KV, 2, (4,), mutant="tie", **KV_PRESSURE)
    assert gesd.compare(good[0].events, bad[0].events) is not None
    with pytest.raises(SimulationFailed):
        _simulate(tmp_path, TINY_KV, cases, seed=3)


def test_tile_mem_catches_wrong_data(tmp_path):
    """A planted LPDDR data error (one bit of the first beat of read 2) makes
    the bench fail: the words are compared."""
    from elmoe3d.sim.run.harness import SimulationFailed
    _, cases = _cases(TINY_KV, 2, (4,), faults={}, **KV_PRESSURE)
    with pytest.raises(SimulationFailed):
        _simulate(tmp_path, TINY_KV, cases, seed=3, env={"ELMOE_TILE_PLANT": "2"})


@pytest.mark.slow
def test_tile_mem_2000_steps(tmp_path, measured_dir):
    """2,000 decode steps at batch 1 (tiny, KV pressure, LPDDR faults every
    997th read): event for event, every word checked."""
    runs, cases = _cases(TINY_KV, 2000, (1,), faults=_faults(997), **KV_PRESSURE)
    t0 = _cpu()
    outs = _simulate(tmp_path, TINY_KV, cases, seed=7)
    _record(measured_dir, "2000_steps", "tiny (KV pressure)", runs, outs, _cpu() - t0)
    _check(runs, outs)
    assert runs[0].counters["decode_steps"] >= 2000


def test_tile_mem_bad_config():
    """A TileMem needs a Config (TypeError naming the value); the FillDone FIFO
    depth is the most fills one pass can start."""
    from elmoe3d.hw.tile import TileMem, fill_done_depth
    with pytest.raises(TypeError, match="Config"):
        TileMem({"pes": 4})
    for name in ("tiny", "default"):
        cfg = preset(name)
        assert fill_done_depth(cfg) == min(cfg.experts, cfg.batch_tokens * cfg.top_k,
                                           cfg.tag_slots)


# -- the tile top (hw/tile.Tile, top elmoe3d_tile) -------------------------------------------

TOP_TB = "elmoe3d.tb.tile_top_bench"
#: the datapath's C++ takes minutes at Verilator's -Os (as tests/test_esd_dp_join.py)
TOP_BUILD = {"extra_build_args": ["-CFLAGS", "-O0"]}
TINY = preset("tiny")


def _top_factory(config):
    from elmoe3d.hw.tile import Tile
    return Tile(Config(**config))


def _top(tmp_path, env=None, seed=1):
    out = tmp_path / "tile.json"
    e = {"ELMOE_TILE_OUT": str(out)}
    e.update(env or {})
    simulate(_top_factory, block="tile", params={"config": preset("tiny").to_dict()},
             top="elmoe3d_tile", test_module=TOP_TB, testcase="decode", env=e, seed=seed,
             **TOP_BUILD)
    return json.loads(out.read_text())


def test_tile_top_tiny(tmp_path, measured_dir):
    """The tile top at `tiny`: dense region loaded from LPDDR through the
    host stream, an Elastic-SD round and an AR round at batch 2 with random
    idle / back-pressure / AXI pauses: trace event for event, every layer
    output bit for bit, every host response and counter the golden's, the
    tile's own answers (LOAD_DENSE OK, BUSY while a step runs, BAD_OP)."""
    t0 = _cpu()
    res = _top(tmp_path)
    res["sim_cpu_s"] = round(_cpu() - t0, 1)
    assert res["kinds"].get("FILL_END", 0) > 0 and res["tokens"] > 0
    (measured_dir / "tile_top.json").write_text(json.dumps(res, indent=1))


def _top_trace(tmp_path, cfg, cases, *, seed=1, env=None, build=None):
    """One simulation of the tile top's ``trace`` test over ``cases`` (golden
    :func:`~elmoe3d.golden.esd.run_trace` decodes, reset between): the
    result records."""
    f, out = tmp_path / "cases.pkl", tmp_path / "trace.json"
    f.write_bytes(pickle.dumps(dict(cases=cases)))
    e = {"ELMOE_ESD_CASE": str(f), "ELMOE_TILE_OUT": str(out)}
    e.update(env or {})
    simulate(_top_factory, block="tile", params={"config": cfg.to_dict()}, top="elmoe3d_tile",
             test_module=TOP_TB, testcase="trace", env=e, seed=seed, **(build or TOP_BUILD))
    return json.loads(out.read_text())


#: run_trace's request lengths that press the KV region into the expert slots
#: at `tiny` (kv_words_per_token 1; the `TINY_KV` pressure of the controller
#: tests, without another build)
TINY_TOP_KV = dict(prompt=(180, 360), length=(90, 360))


def test_tile_top_trace_kv_faults(tmp_path, measured_dir):
    """A synthetic routing trace (Zipf + reuse) replayed on the tile top at
    `tiny`, batch 4, with KV pressure and LPDDR faults: KV moves between
    rounds, in the middle of drafting and of verification, one invalidating
    a resident slot; SLVERR, DECERR and a wrong RLAST on expert reads (one
    during a fill, which aborts). Trace event for event, every output bit
    for bit (spoilt passes flagged), every response and counter the
    golden's, and at the end the tag unit's resident slots equal HB's."""
    runs, cases = _cases(TINY, 6, (4,), seeds={4: 177}, **TINY_TOP_KV)
    c = runs[0].counters
    assert c["kv_invalidations"] and c["ext_errors"] == 3 and c["aborts"], c
    sc = runs[0].script                     # CONTEXTs between two layer steps of a round
    mid = {sc[i - 1]["phase"] for i in range(1, len(sc) - 1) if sc[i]["op"] == "CONTEXT"
           and sc[i - 1]["op"] == "STEP" and sc[i + 1]["op"] == "STEP"}
    assert mid >= {int(gesd.Phase.DRAFT), int(gesd.Phase.VERIFY)}, mid
    t0 = _cpu()
    res = _top_trace(tmp_path, TINY, cases, seed=4)
    assert len(res) == 1 and res[0]["events"] == len(runs[0].events)
    assert res[0]["lpddr_faults_injected"] == 3 and res[0]["spoilt_outputs"] > 0
    res[0]["sim_cpu_s"] = round(_cpu() - t0, 1)
    (measured_dir / "tile_top_trace.json").write_text(json.dumps(res, indent=1))


def test_tile_top_trace_catches_wrong_golden(tmp_path):
    """The trace bench compares the real tile's decisions: a golden decode
    from a mutated tag-unit policy (victim ties to the highest index)
    differs from the real one, and the same bench fails on it."""
    from elmoe3d.sim.run.harness import SimulationFailed
    good, _ = _case(TINY, 4, 3, 187, tokens=400, force=gesd.Mode.SD, **TINY_TOP_KV)
    bad, case = _case(TINY, 4, 3, 187, tokens=400, force=gesd.Mode.SD, mutant="tie",
                      **TINY_TOP_KV)
    assert gesd.compare(good.events, bad.events) is not None
    with pytest.raises(SimulationFailed):
        _top_trace(tmp_path, TINY, [case], seed=4)


#: decode steps of each tile report run (the golden table runs 400 steps, the
#: controller RTL's 24; the tile computes every layer, so fewer)
TILE_REPORT_STEPS = 8


@pytest.mark.slow
def test_tile_report(measured_dir):
    """The report's traces on the tile top (the synthetic Zipf trace at
    `default`, the LM's own routing at `lm`): batch 1, 4 and 16, AR and
    Elastic-SD forced, on the native harness (`elmoe3d tile-run --report`,
    :func:`elmoe3d.sim.run.tile_run.report_set`); trace, outputs, responses and
    counters equal the golden's; the tile's counters and cycles ->
    ``build/measured/tile_report.json`` (the report's tile table) and
    ``build/measured/tile_counters.json`` (what the system model compares
    with, ``sim/perf/rtl_compare.py``)."""
    from elmoe3d.cli import main
    from elmoe3d.sim.perf import rtl_compare as rc
    assert main(["tile-run", "--report", "--no-progress", "--json",
                 str(measured_dir / "tile_report.json")]) == 0
    rep = json.loads((measured_dir / "tile_report.json").read_text())
    assert len(rep["runs"]) == 12
    assert rc.compare(measured_dir / "tile_counters.json")["available"]


def test_tile_top_fault(tmp_path, measured_dir):
    """An LPDDR error (SLVERR) on the tile's third expert read, a VERIFY
    fill: the fill aborts, the step answers its error and is repeated by the
    host, the spoilt pass's outputs carry ``error``, everything else (trace,
    counters, the repeated step's outputs) equals the golden's."""
    res = _top(tmp_path, {"ELMOE_TILE_FAULTS": "2:SLVERR"}, seed=2)
    assert res["counters"]["aborts"] >= 1 and res["counters"]["ext_errors"] == 1
    assert res["spoilt_outputs"] > 0 and res["lpddr_faults_injected"] == 1
    (measured_dir / "tile_top_fault.json").write_text(json.dumps(res, indent=1))


@pytest.mark.parametrize("word,says", [("out", "outputs differ"), ("router", "differ")])
def test_tile_top_catches_wrong_dense(tmp_path, word, says):
    """A corrupted dense image in the LPDDR model (bit 14 of layer 0's first
    output requantisation multiplier; or every weight of layer 0's first
    router row moved by 64, :func:`elmoe3d.sim.run.tile_script.plant_dense`;
    an AR round): the bench fails on the outputs (the gates changed), or on
    the trace (the routing changed), whatever the bench's random layers."""
    from elmoe3d.sim.run.harness import SimulationFailed
    with pytest.raises(SimulationFailed) as exc:
        _top(tmp_path, {"ELMOE_TILE_PLANT_DENSE": word, "ELMOE_TILE_ROUNDS": "AR"})
    log = open(str(exc.value).split("log=")[1].split()[0]).read()
    assert says in log, log[-2000:]


def test_tile_bad_config():
    """A Tile needs a Config (TypeError naming the value)."""
    from elmoe3d.hw.tile import Tile
    with pytest.raises(TypeError, match="Config"):
        Tile({"pes": 4})


@pytest.mark.slow
@pytest.mark.parametrize("sim", ["native", "cocotb"])
def test_decode_rtl(tmp_path, sim):
    """`elmoe3d decode --rtl` (the `lm` preset tile, one Elastic-SD round of
    the in-project LM) on the native harness (the default) and in cocotb:
    RTL tokens, trace and counters equal the golden tile's (cocotb: about 2
    minutes with the build cached)."""
    from elmoe3d.cli import main
    out = tmp_path / "dec.json"
    assert main(["decode", "--rtl", "--sim", sim, "--mode", "sd", "--tokens", "2",
                 "--batch", "1", "--quiet", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["match"] and r["trace_equal"] and not r["counters_differ"] and r["sim"] == sim


@pytest.mark.slow
def test_decode_rtl_batch_16(tmp_path):
    """`elmoe3d decode --rtl --mode sd --batch 16 --tokens 16` on the native
    harness: 16 requests that drift apart (the golden's KV caches sized for
    it), every layer output, response, counter and event equal to the
    golden's, the RTL's tokens the golden's."""
    from elmoe3d.cli import main
    out = tmp_path / "dec16.json"
    assert main(["decode", "--rtl", "--mode", "sd", "--batch", "16", "--tokens", "16",
                 "--quiet", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["match"] and r["outputs_equal"] and r["trace_equal"] and not r["counters_differ"]
    assert len(r["tokens_rtl"]) == 16 and all(len(t) == 16 for t in r["tokens_rtl"])


def test_recorded_tile_report_equals_the_golden():
    """The tile's report runs recorded in the repository
    (`sim/data/tile_report.json`, `sim/data/tile_counters.json`: copies of
    what `test_tile_report` wrote) cover both traces at batch 1, 4 and 16 in
    AR and SD, and their counters still equal the golden's recomputed now (a
    golden change that alters the sequence makes the record stale here)."""
    from elmoe3d.commands import decode as dec
    from elmoe3d.sim.perf import rtl_compare as rc
    rows = dec.rtl_rows(dec.recorded_tile_report(), cycles=True)
    names = {n for n, *_ in dec.report_traces(quick=True)}
    assert {(r[0], r[1], r[2]) for r in rows} == {(n, b, m) for n in names for b in dec.BATCHES
                                                  for m in ("AR", "SD")}
    assert all(r[-1] == "yes" and r[-2] > 0 for r in rows), rows
    c = rc.compare(rc.RECORDED)
    assert c["available"] and len(c["runs"]) == len(rows)

"""pytest entry points: the native harness of the tile top (``sim/run/native.py``:
``elmoe3d_tile`` as a plain Verilated C++ model, ``sim/native/tile_main.cpp``
clocking it, no Python in the cycle loop) replaying golden host scripts, every
response, counter, trace event and layer output checked against the golden;
the same scenario on the cocotb bench (with the native harness's LPDDR model,
``tb/lpddr.py``) in the same cycles; planted faults that must fail.

One native build at ``tiny`` serves the default tests (about 30 s the first
time, cached after); each run simulates for well under a second."""

import json
import pickle

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.golden import esd as gesd
from elmoe3d.golden import layout as gl
from elmoe3d.golden import moe_batched as gb
from elmoe3d.golden.vocab import ExtError
from elmoe3d.sim.run import native
from elmoe3d.sim.run import tile_script as ts
from elmoe3d.sim.run.harness import simulate

from test_esd_ctrl import _case, _faults
from test_tile import TINY_TOP_KV, TOP_BUILD, _cases, _top_factory

pytestmark = pytest.mark.tile

TINY = preset("tiny")


@pytest.fixture(scope="module")
def exe():
    return native.build(TINY)


def _random(cfg=TINY, seed=1, rounds=("SD", "AR"), batch=2, faults=None):
    """Random golden layers, a random-token decode through them and their
    LPDDR image (the cocotb bench's ``decode`` scenario)."""
    rng = np.random.default_rng(seed)
    layers = ts.random_layers(cfg, rng)
    plan = ts.random_plan(cfg, layers, list(rounds), batch, rng, dict(faults or {}))
    return plan, ts.lpddr_image(cfg, layers, gl.dense_image(cfg, layers))


def _trace(cfg, case, seed=1):
    """A golden ``run_trace`` case on trace layers (the ``trace`` bench's
    scenario): the plan and the LPDDR image."""
    rng = np.random.default_rng(seed)
    layers = [gb.trace_layer(lay) for lay in ts.random_layers(cfg, rng)]
    return ts.trace_plan(cfg, layers, case, rng), ts.lpddr_image(cfg, layers,
                                                                 gl.dense_image(cfg, layers))


def _cocotb(tmp_path, cfg, plan, image, build=None):
    """The same plan on the cocotb tile bench (``tb/tile_top_bench.py``'s
    ``replay``) with the native harness's LPDDR model, no idle, no pauses:
    its result record with the cycle of every response and event."""
    f, out = tmp_path / "plan.pkl", tmp_path / "cocotb.json"
    f.write_bytes(pickle.dumps(dict(plan=plan, image=bytes(image))))
    simulate(_top_factory, block="tile", params={"config": cfg.to_dict()}, top="elmoe3d_tile",
             test_module="elmoe3d.tb.tile_top_bench", testcase="replay", seed=1,
             env={"ELMOE_TILE_PLAN": str(f), "ELMOE_TILE_OUT": str(out),
                  "ELMOE_TILE_LPDDR": "model", "ELMOE_TILE_LPDDR_LATENCY": "1"},
             **(build or TOP_BUILD))
    return json.loads(out.read_text())


def _identical(coco, rep):
    """Both paths equal the golden, in the same cycles, every response and
    every trace event in the same cycle."""
    assert rep.match, rep.first
    assert coco["cycles"] == rep.run.cycles
    assert coco["stamps"]["rsp"] == [c for c, _ in rep.run.rsp]
    assert coco["stamps"]["trace"] == [c for c, _ in rep.run.trace]
    assert coco["counters"] == rep.counters


def test_native_equals_cocotb(tmp_path, exe, measured_dir):
    """One scenario on both paths: an Elastic-SD round and an AR round at
    batch 2 with an LPDDR fault (SLVERR on expert read 2, a spoilt and
    repeated step), LPDDR latency 1, no random pauses: the cocotb bench
    (its LPDDR the Python twin of the native model) and the native harness
    both equal the golden, take the same cycles, and every response and
    trace event comes in the same cycle on both."""
    plan, mem = _random(faults={2: ExtError.SLVERR})
    rep = native.replay(TINY, plan, mem, exe=exe)
    coco = _cocotb(tmp_path, TINY, plan, mem)
    _identical(coco, rep)
    assert rep.counters["aborts"] >= 1 and rep.counters["ext_errors"] == 1
    (measured_dir / "tile_native_identity.json").write_text(json.dumps(dict(
        config="tiny", scenario="SD,AR batch 2, SLVERR on expert read 2", cycles=rep.run.cycles,
        events=len(rep.events), cocotb_sim_cpu_s=round(coco["sim_cpu_s"], 2),
        native_sim_cpu_s=round(rep.run.sim_cpu_s, 3)), indent=1))


def test_native_faults_kv_moves(exe):
    """A synthetic routing trace (Zipf + reuse) at `tiny`, batch 4, with KV
    pressure (KV moves between rounds and in the middle of drafting and
    verification, one invalidating a resident slot), SLVERR, DECERR and a
    wrong RLAST on expert reads 3, 10 and 17, random AR / R pauses, random
    back-pressure on the responses and the trace, idle cycles on the
    commands: every response, counter, event and output equals the
    golden's."""
    runs, cases = _cases(TINY, 6, (4,), seeds={4: 187}, **TINY_TOP_KV)
    c = runs[0].counters
    assert c["kv_invalidations"] and c["ext_errors"] == 3 and c["aborts"], c
    plan, mem = _trace(TINY, cases[0])
    opts = native.NativeOptions(latency=12, ar_pause=0.2, r_pause=0.2, rsp_bp=0.2,
                                trace_bp=0.2, cmd_idle=0.2, seed=5)
    rep = native.replay(TINY, plan, mem, exe=exe, options=opts)
    assert rep.match, rep.first
    assert len(rep.run.corrupted) == 3 and rep.counters["kv_moves"] == c["kv_moves"]
    assert sum(1 for y, _ in plan.want_y if y is None) > 0


def test_native_catches_wrong_golden(exe):
    """A golden from a mutated tag-unit policy (victim ties to the highest
    index) differs from the real one: the native comparison fails, at the
    first differing event, and names its cycle; the real golden passes."""
    good, g = _case(TINY, 4, 3, 187, tokens=400, force=gesd.Mode.SD, **TINY_TOP_KV)
    bad, b = _case(TINY, 4, 3, 187, tokens=400, force=gesd.Mode.SD, mutant="tie",
                   **TINY_TOP_KV)
    assert gesd.compare(good.events, bad.events) is not None
    rep = native.replay(TINY, *_trace(TINY, g), exe=exe)
    assert rep.match, rep.first
    rep = native.replay(TINY, *_trace(TINY, b), exe=exe)
    assert not rep.match and rep.first["kind"] == "trace", rep.differences
    assert "differs" in rep.first["message"]
    assert f"in cycle {rep.first['cycle']})" in rep.first["message"]


@pytest.fixture(scope="module")
def exe_prefetch():
    return native.build(TINY, prefetch=3)


#: LPDDR faults of the prefetch scenario: read 0 is a prefetch (the first DRAFT
#: pass's), 10 and 17 verification reads, 27 another prefetch's
PREFETCH_FAULTS = {0: ExtError.SLVERR, 10: ExtError.DECERR, 17: ExtError.PROTOCOL,
                   27: ExtError.SLVERR}


def _retired_errors(events):
    """EXT_ERRORs among the retirements that follow a PREFETCH_END."""
    return sum(r and e.kind == gesd.EventKind.EXT_ERROR
               for e, r in zip(events, gesd.in_prefetch_retirement(events)))


def test_native_builds_kept_apart(exe, exe_prefetch):
    """The tile with prefetch and the one without are two builds, each found
    again under its own key (they had shared one index entry: the second
    build asked for got the first's executable)."""
    assert exe != exe_prefetch
    assert native.build(TINY) == exe and native.build(TINY, prefetch=3) == exe_prefetch


def test_native_prefetch(exe_prefetch):
    """Prefetch during drafts on the whole tile (`tiny`, depth 3: the
    datapath's candidates, the controller's prefetcher, fill-only LPDDR
    reads into HB): the Zipf trace at batch 4 with KV pressure (moves in the
    middle of drafting retire every prefetch first), LPDDR faults on a
    prefetch read and on verification reads, random AR / R pauses,
    back-pressure on the responses and the trace, idle command cycles:
    every response, counter, event (PREFETCH, the prefetches' lookups and
    fills, PREFETCH_END and their retirement) and layer output equals the
    golden's."""
    runs, cases = _cases(TINY, 6, (4,), seeds={4: 187}, faults=PREFETCH_FAULTS, prefetch=3,
                         **TINY_TOP_KV)
    run = runs[0]
    pc = run.controller.prefetch_counts
    assert pc["prefetches"] and pc["prefetch_hits"], pc
    assert _retired_errors(run.events) and run.counters["kv_moves"], run.counters
    plan, mem = _trace(TINY, cases[0])
    opts = native.NativeOptions(latency=12, ar_pause=0.2, r_pause=0.2, rsp_bp=0.2,
                                trace_bp=0.2, cmd_idle=0.2, seed=5)
    rep = native.replay(TINY, plan, mem, exe=exe_prefetch, options=opts)
    assert rep.match, rep.first


def test_native_prefetch_catches_wrong_candidates(exe_prefetch):
    """A golden whose candidates are each token's lowest-ranked outside
    expert (mutant ``prefetch_last``) differs from the tile's: the native
    comparison fails on the trace."""
    _, cases = _cases(TINY, 3, (4,), seeds={4: 187}, faults={}, prefetch=3,
                      mutant="prefetch_last", **TINY_TOP_KV)
    rep = native.replay(TINY, *_trace(TINY, cases[0]), exe=exe_prefetch)
    assert not rep.match and rep.first["kind"] == "trace", rep.differences


@pytest.mark.parametrize("word", ["expert", "dense"])
def test_native_catches_wrong_lpddr_word(exe, word):
    """One corrupted word of the LPDDR image makes the native comparison fail
    on the outputs (the image as it should be passes): ``expert`` flips the
    sign bit of one weight slice in the first expert the decode reads from
    LPDDR (bank 1's first word: gate row 1; row 0's SiLU input is saturated
    for these tokens, so a word there changes no output), ``dense`` bit 14 of
    layer 0's first output requantisation multiplier (the cocotb bench's
    ``plant_dense``)."""
    plan, mem = _random(rounds=("AR",))
    assert native.replay(TINY, plan, mem, exe=exe).match
    if word == "expert":
        first = next(e for e in plan.events if e.kind == gesd.EventKind.SOURCE
                     and e.code != gesd.Source.HB)
        mem[gl.lpddr_expert_base(TINY, first.layer, first.expert)
            + TINY.slice_vector_bits // 8] ^= 0x80
    else:
        ts.plant_dense(TINY, mem, "out")
    rep = native.replay(TINY, plan, mem, exe=exe)
    assert not rep.match and rep.first["kind"] == "output", rep.differences
    assert "outputs differ" in rep.first["message"]


def test_native_stuck_tile_ends(exe):
    """A run that waits for a response the tile never sends ends after
    ``stall_limit`` cycles in which nothing moved, as incomplete (a replay
    reports it as a ``timeout`` difference)."""
    from amaranth.lib import data

    from elmoe3d.hw.tile import tile_command
    from elmoe3d.sim.run.payload import pack
    plan, mem = _random(rounds=("AR",))
    hs = ts.host_commands(TINY, plan)
    cmds = [pack(data.Layout.cast(tile_command(TINY)), c) for c in hs.commands]
    r = native.run(exe, TINY, cmds, mem, expect_rsp=hs.responses + 1,
                   options=native.NativeOptions(stall_limit=500))
    last = max(c for c, _ in r.rsp + r.trace)
    assert not r.complete and len(r.rsp) == hs.responses and last + 500 < r.cycles <= last + 502


def test_native_lpddr_bandwidth(exe):
    """`Config.lpddr_bytes_per_cycle` meters the native LPDDR model: at 1
    byte per cycle (a quarter of the 4-byte beat at `tiny`) the same decode
    still equals the golden, takes longer, and never moves more than a byte
    per cycle on average (plus the one beat the credit starts with)."""
    plan, mem = _random()
    fast = native.replay(TINY, plan, mem, exe=exe)
    slow_cfg = TINY.replace(lpddr_bytes_per_cycle=1)
    slow = native.replay(slow_cfg, plan, mem, exe=exe)
    assert fast.match and slow.match, slow.first
    assert slow.run.cycles > fast.run.cycles
    assert slow.run.beats == fast.run.beats                 # the same reads, more slowly
    assert slow.run.beats * 4 <= slow.run.cycles + 4 and fast.run.beats * 4 > fast.run.cycles


def test_lpddr_model_rule():
    """The LPDDR model's rule (tb/lpddr.py, the C++ model's twin): a burst's
    first beat ``latency`` cycles after its AR handshake, one beat per cycle
    (or one per ``beat / bytes_per_cycle`` with a bandwidth limit); the
    golden's fault rule on expert reads only (a burst of the same expert at
    a higher address continues a command, the dense image is not counted);
    cocotbext-axi's R-channel pattern meters the same rate."""
    import itertools
    import random

    from elmoe3d.tb.lpddr import LpddrModel
    from elmoe3d.tb.tile_mem_bench import _r_pauses
    lay = gl.lpddr_layout(TINY)
    mem = bytes(range(256)) * (lay.base + lay.total_bytes // 256 + 1)

    def serve(cfg, bursts, latency, faults=None):
        """Issue ``bursts`` ((addr, beats), AR back to back, R always ready):
        the cycles of the beats, their (resp, last) and the corruptions."""
        m = LpddrModel(cfg, mem, latency=latency, faults=faults)
        todo, got = list(bursts), []
        for n in itertools.count(1):
            m.drive(n)
            head = todo[0] if todo else None
            if m.rvalid:
                got.append((n, m.beat[1], m.beat[2], m.beat[0]))
            m.sample(n, bool(head), head[0] if head else 0, head[1] - 1 if head else 0, 0, True)
            if head and m.arready:
                todo.pop(0)
            if not todo and not m.queue and n > 5:
                return got, m
    beat = TINY.axi_beat_bits // 8
    e0, e1 = gl.lpddr_expert_base(TINY, 0, 0), gl.lpddr_expert_base(TINY, 0, 1)
    got, _ = serve(TINY, [(e0, 4)], latency=5)
    assert [g[0] for g in got] == [6, 7, 8, 9] and [g[2] for g in got] == [0, 0, 0, 1]
    assert got[1][3] == int.from_bytes(mem[e0 + beat:e0 + 2 * beat], "little")
    got, _ = serve(TINY.replace(lpddr_bytes_per_cycle=1), [(e0, 4)], latency=1)
    assert [g[0] for g in got] == [2, 6, 10, 14]            # one 4-byte beat per 4 cycles
    bursts = [(lay.dense_base, 2), (e0, 2), (e0 + 2 * beat, 2), (e1, 2), (e0, 2)]
    got, m = serve(TINY, bursts, latency=1, faults={1: ExtError.SLVERR, 2: ExtError.PROTOCOL})
    assert m.corrupted == [(1, ExtError.SLVERR), (2, ExtError.PROTOCOL)] and m.cmd == 2
    assert [(g[1], g[2]) for g in got] == [(0, 0), (0, 1), (0, 0), (0, 1), (0, 0), (0, 1),
                                          (2, 0), (0, 1), (0, 1), (0, 1)]
    g = _r_pauses(random.Random(1), 0.0, 1, beat)
    assert [bool(next(g)) for _ in range(8)] == [True, True, True, False] * 2


@pytest.mark.slow
def test_native_speed_default(tmp_path, measured_dir):
    """The speed of both paths on one scenario at `default`: the report's
    Zipf trace, batch 4, Elastic-SD forced, 8 decode steps, LPDDR latency 1
    and no pauses, on the cocotb bench (its `decode --rtl` build,
    OPT_FAST=-O1; the LPDDR model of the native harness) and natively. Both
    equal the golden in the same cycles; the simulated cycles per CPU-second
    of each go to ``build/measured/tile_native_speed.json`` (a benchmark,
    not a timed test: the figures are recorded, not asserted)."""
    import resource
    import time

    from elmoe3d.commands.decode import RTL_BUILD, report_traces
    name, cfg, R = report_traces()[0]
    run = gesd.run_trace(cfg, R, batch=4, steps=8, seed=4, check=False, kv_mid_round=False,
                         force=gesd.Mode.SD)
    case = dict(script=run.script, events=run.events, counters=run.counters, faults={},
                ext_reads=run.controller.ext_reads, name="zipf B4 SD")
    plan, mem = _trace(cfg, case, seed=7)
    exe = native.build(cfg)
    t0, c0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    rep = native.replay(cfg, plan, mem, exe=exe)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    e2e = time.process_time() - t0 + (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
    coco = _cocotb(tmp_path, cfg, plan, mem, build=RTL_BUILD)
    _identical(coco, rep)
    cyc = rep.run.cycles
    rec = dict(config="default", scenario=f"{name}, batch 4, SD forced, 8 decode steps",
               cycles=cyc, events=len(rep.events), outputs=len(rep.outputs),
               cocotb_sim_cpu_s=round(coco["sim_cpu_s"], 1),
               cocotb_cycles_per_cpu_s=round(cyc / coco["sim_cpu_s"]),
               native_loop_cpu_s=round(rep.run.sim_cpu_s, 2),
               native_cycles_per_cpu_s=round(cyc / rep.run.sim_cpu_s),
               native_end_to_end_cpu_s=round(e2e, 2),
               native_end_to_end_cycles_per_cpu_s=round(cyc / e2e),
               ratio=round(coco["sim_cpu_s"] / rep.run.sim_cpu_s, 1),
               ratio_end_to_end=round(coco["sim_cpu_s"] / e2e, 1),
               command="pytest -m slow tests/test_tile_native.py -k speed_default")
    (measured_dir / "tile_native_speed.json").write_text(json.dumps(rec, indent=1))


@pytest.mark.slow
def test_native_2000_steps(measured_dir):
    """The tile top at `tiny` for 2,000 decode steps (batch 1, Elastic-SD
    asked every round, KV pressure, LPDDR faults every 997th read), random
    pauses and back-pressure: equal to the golden everywhere."""
    runs, cases = _cases(TINY, 2000, (1,), faults=_faults(997), **TINY_TOP_KV)
    assert runs[0].counters["decode_steps"] >= 2000
    plan, mem = _trace(TINY, cases[0], seed=7)
    opts = native.NativeOptions(latency=12, ar_pause=0.1, r_pause=0.1, rsp_bp=0.1,
                                trace_bp=0.1, cmd_idle=0.1, seed=7)
    rep = native.replay(TINY, plan, mem, options=opts)
    assert rep.match, rep.first
    rec = rep.record()
    rec.update(steps=runs[0].counters["decode_steps"], config="tiny (KV pressure)", batch=1)
    (measured_dir / "tile_native_2000.json").write_text(json.dumps(rec, indent=1))



# -- elmoe3d tile-run ----------------------------------------------------------------------

def test_tile_run_set_on_dask(tmp_path, exe):
    """`elmoe3d tile-run` for a small set (the Zipf trace on the `tiny` tile,
    batch 1 and 4, LPDDR-only AR, AR and SD, 6 warm-up + 8 measured steps) on
    an embedded Dask LocalCluster: every run equal to the golden, the
    measurement window after the warm-up (its phases add up to it; its tokens
    are the rounds' after the warm-up), the JSON written; the LPDDR-only runs
    read nothing from HB and look nothing up."""
    from elmoe3d.cli import main
    from elmoe3d.sim.run import tile_run as tr
    out = tmp_path / "runs.json"
    assert main(["tile-run", "--trace", "zipf", "--preset", "tiny", "--batch", "1,4",
                 "--mode", "lpddr,ar,sd", "--steps", "8", "--warmup", "6", "--seed", "3",
                 "--workers", "2", "--no-progress", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert len(d["runs"]) == 6 and all(r["match"] for r in d["runs"])
    assert d["command"].startswith("elmoe3d tile-run --trace zipf")
    for r in d["runs"]:
        m = r["measured"]
        assert sum(m["phase_cycles"].values()) == m["cycles"] > 0
        assert m["steps"] >= 8 and m["cycles_per_token"] == round(m["cycles"] / m["tokens"], 1)
        s = tr.spec("zipf", r["batch"], r["mode"], 8, 6, 3, preset="tiny")
        warm = tr.golden_run(s, 6)
        full = tr.golden_run(s, warm.counters["decode_steps"] + 8)
        got = ts.round_tokens(full.script, r["batch"])[r["warmup_rounds"]:]
        assert m["tokens"] == sum(t for _, t in got)
        assert r["warmup_rounds"] == len(ts.round_tokens(warm.script, r["batch"]))
        assert m["counters_golden"]["tokens_out"] == m["tokens"]
        if r["mode"] == "lpddr":
            c = r["counters_rtl"]
            assert c["hb_bytes"] == c["hb_hits"] == c["hb_misses"] == c["fills"] == 0
            assert c["lpddr_bytes"] > 0 and m["hb_hit_rate"] is None
    rows = tr.summary_rows(d["runs"])
    assert [(x[1], x[2]) for x in rows] == [(b, m) for b in (1, 4)
                                            for m in ("LPDDR", "AR", "SD")]
    table = tr.readme_table(dict(runs=d["runs"], summary=rows))
    assert table.count("\n") == 3 and "x, " in table.splitlines()[2], table


@pytest.mark.parametrize("argv,msg", [
    (["--trace", "gpt"], "--trace must be one of zipf, lm, not 'gpt'"),
    (["--batch", "17"], "--batch must be in 1..16, not 17"),
    (["--mode", "fast"], "--mode must be one of lpddr, ar, sd, auto, not 'fast'"),
    (["--steady-state", "--mode", "auto"], "--mode auto is not in the steady-state set"),
    (["--steps", "0"], "--steps must be >= 1, not 0"),
    (["--steps", "1:8", "--batch", "4"], "no step count for batch 4"),
    (["--seed", "x"], "--seed: expected integers"),
    (["--trace", "lm", "--preset", "tiny"], "runs on its own tile only"),
    (["--lpddr-bytes-per-cycle", "9"], "LPDDR bytes per cycle 9 exceeds one 64-bit AXI beat"),
    (["--workers", "0"], "--workers must be >= 1, not 0"),
])
def test_tile_run_bad_input(argv, msg, capsys):
    """Bad input: one line, exit 2, nothing run."""
    from elmoe3d.cli import main
    assert main(["tile-run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("elmoe3d: error:") and msg in err and err.count("\n") == 1, err


def test_report_reads_steady_state(tmp_path):
    """The report's steady-state table (`elmoe3d build`): per trace, batch and
    mode the mean and spread of cycles per output token over the seeds, SD
    over AR, whether every run equalled the golden; from
    ``build/measured/steady_state.json``, else the recorded
    ``sim/data/steady_state.json`` (which covers the whole set)."""
    import types

    from elmoe3d.commands import tile_run as cmd
    from elmoe3d.sim.run import tile_run as tr

    def rec(mode, seed, cpt, match=True):
        return dict(trace="zipf-1.1 (default)", batch=4, mode=mode, seed=seed, match=match,
                    measured=dict(cycles_per_token=cpt, hb_hit_rate=0.5, steps=64,
                                  mean_accepted_len=2.0 if mode == "sd" else 1.0))
    runs = [rec("ar", 1, 1000), rec("ar", 2, 1200), rec("sd", 1, 900), rec("sd", 2, 700, False)]
    (tmp_path / "measured").mkdir()
    (tmp_path / "measured" / cmd.STEADY_FILE).write_text(json.dumps({"runs": runs}))
    sec = cmd.build_section(types.SimpleNamespace(outdir=tmp_path))
    rows = sec.data["rows"]
    assert [r["cycles / token mean"] for r in rows] == [1100, 800]
    assert rows[0]["spread (min-max)"] == "1000-1200" and rows[1]["SD / AR"] == round(800 / 1100, 3)
    assert [r["all = golden"] for r in rows] == ["yes", "NO"] and not sec.data["recorded"]
    sec = cmd.build_section(types.SimpleNamespace(outdir=tmp_path / "none"))
    d = json.loads(cmd.recorded_steady_state().read_text())
    # the set's 54 runs, and its 18 SD runs on the tile that prefetches 8
    assert sec.data["recorded"] and len(d["runs"]) == 72 and all(r["match"] for r in d["runs"])
    ss = tr.STEADY_STATE
    assert {(r["trace_key"], r["batch"], r["mode"], r.get("prefetch", 0), r["seed"])
            for r in d["runs"]} == {
        (t, b, m, p, s) for t in ss["traces"] for b in ss["batches"] for s in ss["seeds"]
        for m, p in [(m, 0) for m in ss["modes"]] + [("sd", 8)]}


def test_steady_state_part_replaces_its_runs():
    """`tile-run --steady-state --mode M --record` merges: a run of the part
    replaces the set's run with the same trace, batch, mode and seed; the
    others stay; the order is the set's."""
    from elmoe3d.sim.run import tile_run as tr

    def r(mode, seed, cpt):
        return dict(trace_key="zipf", batch=4, mode=mode, seed=seed, cpt=cpt)
    old = [r("ar", 1, 10), r("sd", 1, 8), r("lpddr", 1, 99)]
    got = tr.merge_runs(old, [r("lpddr", 1, 12), r("lpddr", 2, 13)])
    assert [(x["mode"], x["seed"], x["cpt"]) for x in got] == [
        ("lpddr", 1, 12), ("lpddr", 2, 13), ("ar", 1, 10), ("sd", 1, 8)]

"""pytest entry points: the AXI4 stream engine in cocotb against its
contract (``tb/ext_stream_bench.py``: cocotbext-axi's stock ``AxiRamRead`` and
a misbehaving LPDDR model) and its formal checks (``tb/formal/ext_stream.py``).

One simulator run per (simulator, geometry)
-------------------------------------------
The cocotb tests of a geometry (random volume, directed, stock RAM, defect
3, bandwidth, the golden-mutation check) run as *one* cocotb run on one
build (:data:`RUNS`); each pytest test below reports the verdict of its own
cocotb test from that run's ``results.xml``. The run starts with the first
test of its group that pytest reaches (its duration includes the whole
run; the others then take no time). Under xdist the run happens once per
session too (a file lock and a verdict file, see :func:`_verdict`).
"""

import contextlib
import fcntl
import json
import os
import re
from pathlib import Path

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.hw.ext_stream import ExtStream, ext_params
from elmoe3d.sim.run.harness import SimulationFailed, build_root, simulate
from elmoe3d.tb.ext_mutants import mutant_factory

from conftest import ROOT, sim_params

pytestmark = pytest.mark.ext

#: Geometries: `default` and `tiny` (users build these), one with 4 planes
#: (2 in HB, interleaved) and the LPDDR window not at 0, and one with 3 banks
#: (a dense row of 6 bytes: the row offset needs a division).
CFGS = {
    "default": preset("default"),
    "tiny": preset("tiny"),
    "tiny-s2": preset("tiny").replace(slice_bits=2, hb_words=8192, lpddr_base=0x10000),
    "tiny-B3": preset("tiny").replace(pes=3, hidden=12, ffn=24, experts=6, top_k=2),
}

DEFECT3_FAULTS = ("slverr", "decerr", "early_rlast", "missing_rlast", "bad_rid", "exokay",
                  "range")
_MEASURED = ROOT / "build" / "measured"

#: Commands the scoreboard must check per default random run at `default`
#: and at `tiny` (Verilator): issue 10, item 10.
MIN_COMMANDS = 10_000


def _volume_out(simulator, name):
    return _MEASURED / f"ext_random-{simulator}-{name}.json"


def _random_knobs(simulator, name, cmds, long_fraction, check=False):
    """Knobs of a random run: ``cmds`` commands, ``long_fraction`` of them
    from the long mix (whole experts, long dense copies), the rest short;
    with ``check`` the run must check at least :data:`MIN_COMMANDS`."""
    knobs = {"ELMOE_EXT_CMDS": str(cmds), "ELMOE_EXT_LONG": str(long_fraction),
             "ELMOE_EXT_BATCH": "40", "ELMOE_EXT_VOLUME_OUT": str(_volume_out(simulator, name))}
    if check:
        knobs["ELMOE_EXT_MIN_CHECKED"] = str(MIN_COMMANDS)
    return knobs


#: The default runs: ``{(simulator, geometry): {cocotb test: knobs}}``.
#: Volume: at least 10,000 random *commands* (each checked by the
#: scoreboard) at `default` and at `tiny` on Verilator, mostly short (one
#: or two bursts, one beat, across 4 KiB, the dense image's edges, refused
#: at the window's edges, nothing to read) with 0.6 % long ones
#: (whole experts: more than `axi_outstanding` bursts each); short Icarus
#: runs at `tiny` and `tiny-s2` (4 planes: 16 plane masks, a PE stream that
#: ends before the read); `tiny-B3` the directed test only, also on Icarus.
RUNS = {
    ("verilator", "default"): {
        "random_commands": _random_knobs("verilator", "default", MIN_COMMANDS, 0.006, True),
        "directed": {},
        "fill_held_past_response": {},
        "stock_axi_ram": {"ELMOE_EXT_STOCK_CMDS": "8"},
        "bandwidth": {"ELMOE_MEASURE_OUT": str(_MEASURED / "ext_bandwidth.json"),
                      "ELMOE_EXT_BW_CMDS": "3"}},
    ("verilator", "tiny"): {
        "random_commands": _random_knobs("verilator", "tiny", MIN_COMMANDS, 0.006, True),
        "directed": {},
        "stock_axi_ram": {"ELMOE_EXT_STOCK_CMDS": "30"},
        "defect3": {"ELMOE_EXT_DEFECT": ",".join(DEFECT3_FAULTS)},
        "golden_mutation_fails": {},
        "bandwidth": {"ELMOE_MEASURE_OUT": str(_MEASURED / "ext_bandwidth-tiny.json")}},
    ("icarus", "tiny"): {
        "random_commands": _random_knobs("icarus", "tiny", 200, 0.05),
        "directed": {},
        "fill_held_past_response": {},
        "stock_axi_ram": {"ELMOE_EXT_STOCK_CMDS": "10"},
        "defect3": {"ELMOE_EXT_DEFECT": ",".join(DEFECT3_FAULTS)}},
    ("icarus", "tiny-s2"): {
        "random_commands": _random_knobs("icarus", "tiny-s2", 300, 0.25),
        "directed": {}},
    ("icarus", "tiny-B3"): {
        "directed": {}},
}

#: The longer runs (`-m slow`), one cocotb run each.
RUNS_SLOW = {
    ("verilator", "tiny-s2"): {
        "random_commands": {"ELMOE_EXT_MIN_BURSTS": "5000", "ELMOE_EXT_CMDS": "20"},
        "directed": {}},
    ("verilator", "tiny-B3"): {
        "random_commands": {"ELMOE_EXT_MIN_BURSTS": "5000", "ELMOE_EXT_CMDS": "20"},
        "directed": {}},
    ("icarus", "default"): {
        "random_commands": {"ELMOE_EXT_MIN_BURSTS": "500", "ELMOE_EXT_CMDS": "20"},
        "directed": {}, "stock_axi_ram": {"ELMOE_EXT_STOCK_CMDS": "8"}},
    ("icarus", "tiny-B3"): {
        "random_commands": {"ELMOE_EXT_MIN_BURSTS": "2000", "ELMOE_EXT_CMDS": "20"}},
}


def _run(name, simulator, testcase, env=None, cfg=None, seed=None, bug=None):
    """One cocotb run of the engine at geometry ``name`` (``cfg`` overrides
    its Config); with ``bug``, of that planted-bug engine (``tb/ext_mutants.py``)."""
    b = get_block("ext_stream")
    cfg = cfg or CFGS[name]
    env = dict(env or {}, ELMOE_EXT_GEOMETRY=name)
    factory, block = b.factory, "ext_stream"
    if bug:
        factory, block = mutant_factory(bug), f"ext_stream-bug-{bug}"
    return simulate(factory, block=block, params=b.params(cfg), top=b.top,
                    simulator=simulator, test_module="elmoe3d.tb.ext_stream_bench",
                    testcase=testcase, env=env, seed=seed)


_DONE = {}


def _verdict(runs, simulator, name, case):
    """Run the group's cocotb tests once, then fail if ``case`` failed.

    Once per session even across xdist workers: the first worker to reach a
    group runs it under a file lock and leaves the verdicts in a file named
    by the xdist test-run id; a worker that reaches the group later waits for
    the lock and reads them. (``xdist_group`` with ``--dist loadgroup`` does
    not keep a group on one worker with pytest 9.2 and pytest-xdist 3.8: the
    group suffix never reaches the node ids, so the run would repeat.)"""
    key = (id(runs), simulator, name)
    if key not in _DONE:
        group = runs[(simulator, name)]
        env = {k: v for knobs in group.values() for k, v in knobs.items()}
        run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        shared = None
        if run_id:
            tag = "slow" if runs is RUNS_SLOW else "default"
            shared = build_root() / f".ext-{tag}-{simulator}-{name}-{run_id}.json"
            shared.parent.mkdir(parents=True, exist_ok=True)
        with (open(shared.with_suffix(".lock"), "w") if shared else contextlib.nullcontext()) \
                as lock:
            if lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
            if shared and shared.exists():
                got = json.loads(shared.read_text())
                _DONE[key] = (got["cases"], got["error"])
            else:
                _volume_out(simulator, name).unlink(missing_ok=True)    # never a stale count
                try:
                    _DONE[key] = (_run(name, simulator, ",".join(group), env).cases, None)
                except SimulationFailed as e:
                    _DONE[key] = (e.cases, str(e))
                if shared:
                    shared.write_text(json.dumps({"cases": _DONE[key][0],
                                                  "error": _DONE[key][1]}))
    cases, error = _DONE[key]
    if not cases.get(case, False):
        raise SimulationFailed(f"cocotb test {case} failed or did not run: {error}")


def _params(runs, case):
    out = []
    for (sim, name), group in runs.items():
        if case not in group:
            continue
        marks = [m for p in sim_params() if p.values[0] == sim for m in p.marks]
        out.append(pytest.param(sim, name, id=f"{sim}-{name}", marks=marks))
    return out


@pytest.mark.parametrize("simulator,name", _params(RUNS, "random_commands"))
def test_ext_random(simulator, name):
    """Random commands, short and long (faults, pauses, back-pressure,
    refused commands); at `default` and `tiny` on Verilator the scoreboard
    must have checked at least :data:`MIN_COMMANDS` commands."""
    _verdict(RUNS, simulator, name, "random_commands")
    if "ELMOE_EXT_MIN_CHECKED" in RUNS[(simulator, name)]["random_commands"]:
        _check_volume(_volume_out(simulator, name), MIN_COMMANDS, RUNS[(simulator, name)])


def _check_volume(path, minimum, group=None):
    """The counts a random run wrote (``ELMOE_EXT_VOLUME_OUT``): at least
    ``minimum`` commands checked, and long commands among them (more than
    ``axi_outstanding`` bursts: the in-flight limit is exercised)."""
    vol = json.loads(path.read_text())
    assert vol["commands_checked"] >= minimum, \
        f"{vol['commands_checked']} commands checked, fewer than {minimum} (seed {vol['seed']})"
    assert vol["commands_by_bursts"]["over_outstanding"] >= 20, \
        f"only {vol['commands_by_bursts']['over_outstanding']} long commands (seed {vol['seed']})"
    return vol


def test_ext_volume_check_can_fail(tmp_path):
    """The volume check fails on 9,999 commands and on a run without long commands."""
    p = tmp_path / "v.json"
    base = {"seed": 1, "commands_checked": MIN_COMMANDS,
            "commands_by_bursts": {"over_outstanding": 20}}
    p.write_text(json.dumps(base))
    _check_volume(p, MIN_COMMANDS)
    p.write_text(json.dumps(dict(base, commands_checked=MIN_COMMANDS - 1)))
    with pytest.raises(AssertionError, match="fewer than 10000"):
        _check_volume(p, MIN_COMMANDS)
    p.write_text(json.dumps(dict(base, commands_by_bursts={"over_outstanding": 0})))
    with pytest.raises(AssertionError, match="long commands"):
        _check_volume(p, MIN_COMMANDS)


@pytest.mark.parametrize("simulator,name", _params(RUNS, "stock_axi_ram"))
def test_ext_stock_axi_ram(simulator, name):
    """cocotbext-axi's stock AxiRamRead with pause generators on AR and R."""
    _verdict(RUNS, simulator, name, "stock_axi_ram")


@pytest.mark.parametrize("simulator,name", _params(RUNS, "directed"))
def test_ext_directed(simulator, name):
    """Every fault at the first, a middle and the last burst; every range
    limit and one past it; the longest commands; bounded response wait."""
    _verdict(RUNS, simulator, name, "directed")


@pytest.mark.parametrize("simulator,name", _params(RUNS, "fill_held_past_response"))
def test_ext_fill_held_past_response(simulator, name):
    """The bench's drain waits for every output: fill beats held behind
    back-pressure past the response are still checked (the default random
    run at seed 1379572705 ended two fill beats short before)."""
    _verdict(RUNS, simulator, name, "fill_held_past_response")


@pytest.mark.parametrize("simulator,name", _params(RUNS, "defect3"))
def test_ext_defect3_regression(simulator, name):
    """Issue 10 defect 3, every reproducer in one run: SLVERR, DECERR, an early
    and a missing RLAST, an unexpected RID, EXOKAY on a normal read, a command
    outside the LPDDR window. On the engine before the rework each of these
    failed (commit 5683fc1: strict xfail, every case failing); now they pass."""
    _verdict(RUNS, simulator, name, "defect3")


#: The random run that catches the run-tag alias (hw/ext_stream.TAG_BITS):
#: the short command mix at `tiny`, 80 commands in batches of 40
#: (:data:`TAG_ALIAS_KNOBS`), this seed. The engine with a 2-bit tag
#: (``tb/ext_mutants.py``, ``"tag2"``) hangs on it: 79 of 80 responses, then
#: ``m_axi_rvalid`` high and ``m_axi_rready`` low until the bench's
#: 300,000-cycle timeout; the engine passes.
TAG_ALIAS_SEED = 4
TAG_ALIAS_KNOBS = {"ELMOE_EXT_CMDS": "80", "ELMOE_EXT_LONG": "0.03", "ELMOE_EXT_BATCH": "40",
                   "ELMOE_EXT_MIN_CHECKED": "80"}


@pytest.mark.parametrize("simulator", [p for p in sim_params() if p.values[0] == "verilator"])
def test_ext_tag_alias_regression(simulator, tmp_path):
    """Regression: a refused or empty command's flush must not drop the runs
    of the command 4 after it. The run at :data:`TAG_ALIAS_SEED` fails on
    the 2-bit-tag mutant (a hang or wrong responses: the scoreboard's
    timeout or mismatch, not a build or volume failure) and passes on the
    engine. The mutant's coverage goes to a scratch folder."""
    with pytest.raises(SimulationFailed, match="failed: random_commands") as exc:
        _run("tiny", simulator, "random_commands",
             dict(TAG_ALIAS_KNOBS, ELMOE_COVERAGE_DIR=str(tmp_path)),
             seed=TAG_ALIAS_SEED, bug="tag2")
    log = Path(re.search(r"log=(\S+)", str(exc.value)).group(1)).read_text()
    assert re.search(r"AssertionError: (timeout|\d+ mismatches) \(seed", log), log[-3000:]
    _run("tiny", simulator, "random_commands", TAG_ALIAS_KNOBS, seed=TAG_ALIAS_SEED)


@pytest.mark.parametrize("simulator,name", _params(RUNS, "golden_mutation_fails"))
def test_ext_golden_mutation_fails(simulator, name):
    """The scoreboard can fail: a golden model off by one bit is caught (the
    cocotb test passes only if the check raises)."""
    _verdict(RUNS, simulator, name, "golden_mutation_fails")


@pytest.mark.slow
@pytest.mark.parametrize("simulator,name", [
    pytest.param(sim, name, id=f"{sim}-{name}",
                 marks=[m for p in sim_params() if p.values[0] == sim for m in p.marks])
    for sim, name in RUNS_SLOW])
def test_ext_long(simulator, name):
    """The longer runs (Verilator at tiny-s2 and tiny-B3, Icarus at default and tiny-B3)."""
    for case in RUNS_SLOW[(simulator, name)]:
        _verdict(RUNS_SLOW, simulator, name, case)


#: Latencies stated in hw/ext_stream.py and docs/blocks/ext_stream.md: the
#: first AR handshake after the command's (always-ready slave), a PE beat
#: after its R handshake (whole-expert commands; measured, then frozen here).
FIRST_AR_CYCLES = {"default": 15, "tiny": 18}
PE_AFTER_R_CYCLES = 4


def _check_bandwidth(path, name):
    fig = json.loads(path.read_text())["figures"]
    for lat in (10, 50, 100):
        for kind in ("full", "full_with_fill"):
            assert fig[f"{kind}_lat{lat}"]["beats_per_cycle_steady"] >= 0.99, fig
        # the latencies stated in the docstring and docs
        assert fig[f"full_lat{lat}"]["first_ar_after_cmd"] == FIRST_AR_CYCLES[name], fig
        assert fig[f"full_lat{lat}"]["pe_beat_after_r"] == PE_AFTER_R_CYCLES, fig


@pytest.mark.parametrize("simulator,name", _params(RUNS, "bandwidth"))
def test_ext_bandwidth(simulator, name):
    """R beats per cycle at read latencies 10/50/100 (bus peak 1 beat/cycle)."""
    _verdict(RUNS, simulator, name, "bandwidth")
    _check_bandwidth(Path(RUNS[(simulator, name)]["bandwidth"]["ELMOE_MEASURE_OUT"]), name)


@pytest.mark.slow
@pytest.mark.parametrize("outstanding,burst", [(1, 16), (2, 16), (4, 16), (8, 4), (8, 16),
                                               (16, 16), (16, 64)])
def test_ext_bandwidth_sweep(outstanding, burst, measured_dir):
    """Beats/cycle at latencies 10/50/100 against outstanding bursts and burst length."""
    out = measured_dir / f"ext_bandwidth-out{outstanding}-burst{burst}.json"
    cfg = CFGS["default"].replace(axi_outstanding=outstanding, axi_max_burst=burst)
    _run("default", "verilator", "bandwidth", {"ELMOE_MEASURE_OUT": str(out)}, cfg=cfg)
    assert json.loads(out.read_text())["figures"]


def test_ext_bad_params():
    with pytest.raises(TypeError, match="needs a Config, not"):
        ExtStream({"pes": 4})
    assert ext_params(preset("tiny"))["config"]["pes"] == 2


# -- formal (SymbiYosys BMC on tb/formal/ext_stream.FORMAL_CONFIG) ------------------------

from elmoe3d.sim.run.formal import formal_available, run_sby  # noqa: E402
from elmoe3d.tb.formal.ext_stream import ExtStreamFormal  # noqa: E402

_fok, _fwhy = formal_available()

#: BMC depths in clock cycles. A command's first AR leaves 8 cycles after it
#: is accepted; at depth 24 the solver reaches refused, dense and
#: partly-read expert commands with faults on any beat, and two bursts in
#: flight (the `Cover`s say so).
FORMAL_DEPTH = 24


@pytest.mark.formal
@pytest.mark.skipif(not _fok, reason=_fwhy)
@pytest.mark.parametrize("single", [False, True], ids=["free", "single"])
def test_ext_formal_bmc(single):
    r = run_sby(ExtStreamFormal(single=single), name=f"ext_stream_bmc_{single}",
                depth=FORMAL_DEPTH)
    assert r.status == "PASS"


@pytest.mark.formal
@pytest.mark.skipif(not _fok, reason=_fwhy)
@pytest.mark.parametrize("bug,single", [("hide_rlast", True), ("outstanding", False)])
def test_ext_formal_catches_bug(bug, single):
    r = run_sby(ExtStreamFormal(single=single, bug=bug), name=f"ext_stream_bug_{bug}",
                depth=FORMAL_DEPTH, expect="FAIL")
    assert r.status == "FAIL"

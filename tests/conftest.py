"""Shared pytest fixtures: simulator parametrisation (Icarus skips cleanly
when it is not installed) and one sim_build folder for the whole session."""

import os
from pathlib import Path

import pytest

from elmoe3d.sim.run.harness import simulator_available

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("ELMOE_SIM_BUILD", str(ROOT / "sim_build"))
os.environ.setdefault("ELMOE_COVERAGE_DIR", str(ROOT / "build" / "coverage"))


def pytest_configure(config):
    """Start every pytest session with empty functional-coverage files (the
    controller only, not each xdist worker): ``build/coverage/*.json`` then
    hold what this session's testbenches reached."""
    if hasattr(config, "workerinput"):
        return
    d = Path(os.environ["ELMOE_COVERAGE_DIR"])
    for f in d.glob("*.json") if d.is_dir() else ():
        f.unlink()


def pytest_collection_modifyitems(config, items):
    """Leave `slow` tests out unless the -m expression mentions `slow`, so
    `pytest -m tag` runs the tag unit's default tests and `pytest -m slow`
    (or `-m "tag and slow"`) the long sweeps."""
    if "slow" in (config.option.markexpr or ""):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("slow") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def sim_params(slow=()):
    """``pytest.param`` per simulator; Icarus is skipped with a reason where
    absent. Simulators named in ``slow`` are marked ``slow`` (their run is
    left out of ``make test``, e.g. a second simulator on a long case)."""
    out = []
    for sim in ("verilator", "icarus"):
        ok, why = simulator_available(sim)
        marks = [] if ok else [pytest.mark.skip(reason=why)]
        if sim in slow:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(sim, id=sim, marks=marks))
    return out


def cross_sims(cases, slow=lambda case_id: ()):
    """``cases`` (``pytest.param``s, or plain ids) x :func:`sim_params`: one
    param per (case, simulator), id ``<case>-<simulator>``, the case's values
    then the simulator's name, the marks of both. ``slow(case_id)`` names
    the simulators that are ``slow`` on that case."""
    out = []
    for c in cases:
        if not isinstance(c, type(pytest.param(None))):
            c = pytest.param(c, id=str(c))
        for sim in sim_params(slow=slow(c.id)):
            out.append(pytest.param(*c.values, sim.values[0], id=f"{c.id}-{sim.id}",
                                    marks=[*c.marks, *sim.marks]))
    return out


@pytest.fixture
def measured_dir():
    """Where RTL tests write measured figures for the report and the system model."""
    d = ROOT / "build" / "measured"
    d.mkdir(parents=True, exist_ok=True)
    return d

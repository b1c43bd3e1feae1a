"""Functional coverage for the testbenches (``cocotb-coverage``), written to
``build/coverage/<block>.json`` and merged across runs.

A testbench declares its coverpoints and crosses with ``cocotb-coverage``'s
decorators under a name prefix equal to the block name (``"hb_bank.read.region"``,
``"hb_bank.read.regionXerror"``), samples them from its monitors, and calls
:func:`write_coverage` (``"hb_bank"``) at the end of the test. Every run
(tests, simulators, parameter sets) adds its bin hits to the same JSON file
under a file lock, so the file holds the union of everything the default
``make test`` reached. ``elmoe3d coverage`` (and the report) summarises the
files (:mod:`elmoe3d.sim.run.coverage_files`): percentage of coverpoint bins hit
and of cross bins hit, per block.

The sign-off bar (OpenTitan V2): 100 % of coverpoint bins, at least 75 % of
cross bins.

A run against a deliberately wrong golden model (``ELMOE_GOLDEN_MUTATION``,
``ELMOE_TAG_MUTANT``: the tests that prove a scoreboard can fail) writes
nothing: its bins were reached, but the run checked nothing worth counting.

Where: ``$ELMOE_COVERAGE_DIR`` (the harness sets it to ``build/coverage`` of
the repository), else ``./build/coverage``.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from ..sim.run.coverage_files import (COVERPOINT_BAR, CROSS_BAR, coverage_dir, load_coverage,
                                      summarise)

__all__ = ["coverage_dir", "write_coverage", "mutant_run", "MUTANT_KNOBS", "load_coverage",
           "summarise", "COVERPOINT_BAR", "CROSS_BAR"]


def _items(prefix: str):
    """(name, kind, {bin: hits}) for every coverpoint and cross under ``prefix.``."""
    from cocotb_coverage.coverage import CoverCross, CoverPoint, coverage_db
    out = []
    for name in list(coverage_db):
        if not name.startswith(prefix + "."):
            continue
        item = coverage_db[name]
        if isinstance(item, CoverCross):
            kind = "cross"
        elif isinstance(item, CoverPoint):
            kind = "coverpoint"
        else:
            continue
        bins = {repr(k) if not isinstance(k, str) else k: int(v)
                for k, v in item.detailed_coverage.items()}
        out.append((name, kind, bins))
    return out


#: environment knobs that make a run check against a wrong golden model
MUTANT_KNOBS = ("ELMOE_GOLDEN_MUTATION", "ELMOE_TAG_MUTANT")


def mutant_run() -> bool:
    """True in a run against a mutated golden model (its coverage does not count)."""
    return any(os.environ.get(k, "") not in ("", "0") for k in MUTANT_KNOBS)


#: bin hits already written by this process (a cocotb module calling
#: write_coverage after each of its tests adds only what is new)
_WRITTEN: dict = {}


def write_coverage(block: str, *, run: str = "", transactions: int | None = None,
                   directory: Path | None = None) -> Path:
    """Merge this run's coverage of ``block`` into ``<dir>/<block>.json``.

    ``run`` names the run (test, simulator, parameter set) and
    ``transactions`` the random transactions it checked; both are recorded.
    Returns the file path. A mutant run (:func:`mutant_run`) writes nothing."""
    d = Path(directory) if directory is not None else coverage_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{block}.json"
    if mutant_run():
        return path
    items = _items(block)
    with open(d / f".{block}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            old = json.loads(path.read_text()) if path.exists() else {}
        except json.JSONDecodeError:
            old = {}
        cov = {"block": block, "coverpoints": old.get("coverpoints", {}),
               "crosses": old.get("crosses", {}), "runs": old.get("runs", [])}
        for name, kind, bins in items:
            group = cov["coverpoints" if kind == "coverpoint" else "crosses"]
            merged = group.setdefault(name, {})
            done = _WRITTEN.setdefault((str(d), name), {})
            for b, hits in bins.items():
                merged[b] = merged.get(b, 0) + hits - done.get(b, 0)
                done[b] = hits
        cov["runs"].append({"run": run, "transactions": transactions, "time": time.time()})
        cov["summary"] = summarise(cov)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cov, indent=1, sort_keys=True))
        tmp.replace(path)
        fcntl.flock(lock, fcntl.LOCK_UN)
    return path

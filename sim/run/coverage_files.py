"""The functional-coverage files the testbenches write
(``build/coverage/<block>.json``, see :mod:`elmoe3d.tb.coverage`), read
back: the sign-off bars, a file's summary and the whole folder. The CLI
(``elmoe3d coverage``) and the report read coverage through this module,
never through the testbench package.

The sign-off bar (OpenTitan V2): 100 % of coverpoint bins, at least 75 % of
cross bins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["COVERPOINT_BAR", "CROSS_BAR", "coverage_dir", "summarise", "load_coverage"]

COVERPOINT_BAR = 100.0
CROSS_BAR = 75.0


def coverage_dir() -> Path:
    """``$ELMOE_COVERAGE_DIR`` (the harness sets it to the repository's
    ``build/coverage``), else ``./build/coverage``."""
    return Path(os.environ.get("ELMOE_COVERAGE_DIR", Path.cwd() / "build" / "coverage"))


def summarise(cov: dict) -> dict:
    """Percentages of bins hit: coverpoints and crosses, plus the misses."""
    def pct(group):
        total = sum(len(b) for b in group.values())
        hit = sum(1 for b in group.values() for v in b.values() if v > 0)
        return (100.0 * hit / total if total else 100.0), hit, total
    cp, cp_hit, cp_total = pct(cov.get("coverpoints", {}))
    cr, cr_hit, cr_total = pct(cov.get("crosses", {}))
    missed = sorted(f"{name}[{b}]" for name, bins in cov.get("coverpoints", {}).items()
                    for b, v in bins.items() if v == 0)
    tx = sum(r.get("transactions") or 0 for r in cov.get("runs", []))
    return {"coverpoint_pct": round(cp, 2), "coverpoint_bins": [cp_hit, cp_total],
            "cross_pct": round(cr, 2), "cross_bins": [cr_hit, cr_total],
            "coverpoints_missed": missed, "transactions": tx,
            "meets_bar": cp >= COVERPOINT_BAR and cr >= CROSS_BAR}


def load_coverage(directory: Path | None = None) -> dict:
    """``{block: coverage dict}`` of every file in the coverage folder."""
    d = Path(directory) if directory is not None else coverage_dir()
    out = {}
    for p in sorted(d.glob("*.json")):
        try:
            cov = json.loads(p.read_text())
        except json.JSONDecodeError:
            continue
        cov["summary"] = summarise(cov)
        out[cov.get("block", p.stem)] = cov
    return out

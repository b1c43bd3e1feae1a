"""Report plumbing shared by ``elmoe3d build`` and the command modules.

A report is a list of :class:`Section`: a title, Markdown for
``build/report.md`` and JSON-able data for ``build/report.json``. Command
modules contribute sections through ``build_section(ctx)`` (see
:mod:`elmoe3d.commands`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import Config

__all__ = ["Section", "BuildContext", "Progress", "md_table", "text_table", "save_png"]


@dataclass
class Section:
    title: str
    markdown: str
    data: dict = field(default_factory=dict)
    stdout: str = ""          # short text for the terminal summary (optional)


class Progress:
    """Step progress on stderr: ``[3/7 12.4s] synthesising pe ...``.

    ``total`` may start unknown (``None``) and grow with :meth:`expect` as a
    command learns how many steps it has. Every call is also a safe point for
    a Ctrl-C that arrived where it could not be raised (:mod:`elmoe3d.interrupt`).
    """

    def __init__(self, total: int | None = None, stream=None, quiet: bool = False):
        self.total, self.count = total, 0
        self.t0 = time.monotonic()
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def expect(self, steps: int):
        """Add ``steps`` to the total (which becomes known if it was not)."""
        self.total = (self.total or 0) + steps

    def __call__(self, msg: str, step: bool = True):
        from .interrupt import check
        check()
        if step:
            self.count += 1
        if self.quiet:
            return
        pos = f"{self.count}/{self.total}" if self.total else f"{self.count}"
        print(f"[{pos} {time.monotonic() - self.t0:6.1f}s] {msg}", file=self.stream, flush=True)


@dataclass
class BuildContext:
    """What a ``build_section(ctx)`` hook gets."""
    cfg: Config
    outdir: Path                     # build/ (report, verilog/, measured/, plots)
    progress: Progress
    quick: bool = False              # `elmoe3d build --quick`: smallest useful work


def save_png(fig, path, written: list | None = None, dpi: int = 110):
    """Lay out, save and close a matplotlib figure; append its path to ``written``."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    if written is not None:
        written.append(path)
    return path


def md_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub Markdown table."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def text_table(headers: list[str], rows: list[list]) -> str:
    """A fixed-width table for the terminal."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(out)

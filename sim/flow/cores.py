"""FuseSoC CAPI2 ``.core`` files for the generated Verilog.

``elmoe3d verilog --out DIR`` writes, next to each block's ``<top>.v``, a core
``<top>.core`` (VLNV ``elmoe3d:ip:<block>:<version>``, the block name with any
``--suffix``; the description holds the interface sheet: configuration,
clock and reset, payload bit maps) with the Verilog as its ``rtl`` fileset, a ``default`` target naming the top, and a ``lint``
target that runs Verilator ``--lint-only -Wall`` with the project's committed
waivers (``lint_waivers.vlt``, copied into DIR and shared by every core
through the ``elmoe3d:ip:lint_waivers`` core). A user adds DIR to a FuseSoC
library (``fusesoc library add elmoe3d DIR`` or ``--cores-root DIR``) and
depends on ``elmoe3d:ip:pe``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["VENDOR", "vlnv", "write_core", "write_waiver_core"]

VENDOR, LIBRARY = "elmoe3d", "ip"


def _version() -> str:
    from ... import __version__
    return __version__


def vlnv(name: str) -> str:
    return f"{VENDOR}:{LIBRARY}:{name}:{_version()}"


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_waiver_core(out: Path) -> Path:
    from .lint import waiver_file
    shutil.copyfile(waiver_file(), out / "lint_waivers.vlt")
    core = out / "lint_waivers.core"
    core.write_text(
        "CAPI=2:\n"
        f"name: {vlnv('lint_waivers')}\n"
        f"description: {_q('Verilator lint waivers for Amaranth-generated Verilog (each explained)')}\n"
        "filesets:\n"
        "  vlt:\n"
        "    files:\n"
        "      - lint_waivers.vlt\n"
        "    file_type: vlt\n"
        "targets:\n"
        "  default:\n"
        "    filesets: [vlt]\n")
    return core


def _description(description: str, sheet: dict | None) -> str:
    """The core's description: the block's one-line description and, with a
    sheet, the whole interface sheet (configuration, clock and reset, the
    payload bit maps) as a YAML literal block."""
    if sheet is None:
        return f"description: {_q(description)}\n"
    from .sheet import header
    body = [ln[3:] if ln.startswith("// ") else ln.lstrip("/")
            for ln in header(sheet).splitlines()[1:-1]]
    lines = [description, ""] + [ln for ln in body if ln != description]
    return "description: |\n" + "".join(f"  {ln}\n" if ln else "\n" for ln in lines)


def write_core(out: Path, name: str, top: str, vfile: Path, description: str,
               sheet: dict | None = None) -> Path:
    """One CAPI2 core for one generated Verilog file (in the same folder);
    ``name`` is the VLNV's name (the block name and any ``--suffix``), and
    ``sheet`` (:func:`elmoe3d.sim.flow.sheet.sheet`) puts the interface sheet into
    the description."""
    core = out / f"{top}.core"
    core.write_text(
        "CAPI=2:\n"
        f"name: {vlnv(name)}\n"
        + _description(description, sheet) +
        "filesets:\n"
        "  rtl:\n"
        "    files:\n"
        f"      - {vfile.name}\n"
        "    file_type: verilogSource\n"
        "  waivers:\n"
        f"    depend: [\"{VENDOR}:{LIBRARY}:lint_waivers\"]\n"
        "targets:\n"
        "  default: &default\n"
        "    filesets: [rtl]\n"
        f"    toplevel: {top}\n"
        "  lint:\n"
        "    <<: *default\n"
        "    default_tool: verilator\n"
        "    filesets: [waivers, rtl]\n"
        "    tools:\n"
        "      verilator:\n"
        "        mode: lint-only\n"
        "        verilator_options: [-Wall]\n")
    return core

"""``elmoe3d verilog --out DIR``: one Verilog file per block with its
interface sheet (a header comment naming the configuration, the clock and
reset convention and every port's payload bit map; the same as JSON in
``<top>.json``; :mod:`elmoe3d.sim.flow.sheet`), and a FuseSoC CAPI2 core
(``<top>.core``: the Verilog, a default and a Verilator ``lint`` target, the
bit map in its description; :mod:`elmoe3d.sim.flow.cores`).

``--suffix config`` (or any identifier text) is appended to every module
name, file name and core name, so that the same block at two configurations
can sit in one FPGA project."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ._common import (add_blocks_arg, add_config_args, blocks_from_args, config_from_args,
                      writable_dir)

NAME = "verilog"
HELP = ("write one Verilog file per block (distinct top names) with its interface sheet "
        "(configuration, clock/reset, payload bit maps; also <top>.json) and its FuseSoC "
        ".core into --out DIR")


def register(p):
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--no-cores", action="store_true", help="do not write FuseSoC .core files")
    p.add_argument("--suffix", default="", metavar="TEXT|config",
                   help="append TEXT to every module, file and core name (letters, digits, _); "
                        "'config' appends _c<8 hex digits of the configuration's hash>, so two "
                        "configurations can sit in one FPGA project")
    add_config_args(p)
    add_blocks_arg(p)


_SUFFIX = re.compile(r"^[A-Za-z0-9_]*$")


def resolve_suffix(text: str, cfg) -> str:
    """``--suffix``: ``config`` -> the configuration's suffix, else ``text``
    itself once it is a valid piece of a Verilog identifier."""
    from ..sim.flow.sheet import suffix_for
    if text == "config":
        return suffix_for(cfg)
    if not _SUFFIX.match(text or ""):
        raise ValueError(f"--suffix must be letters, digits and '_' (or 'config'), not {text!r}")
    return text


def write_all(cfg, blocks, out: Path, progress=None, cores: bool = True, suffix: str = "",
              preset: str | None = None) -> dict:
    """Verilog (with its interface sheet), ``<top>.json`` and, with
    ``cores``, a FuseSoC core per block into ``out``; ``{block: path}``."""
    from ..sim.flow.cores import write_core, write_waiver_core
    from ..sim.run.harness import write_verilog
    from ..sim.flow.sheet import header, sheet
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    if cores:
        write_waiver_core(out)
    for b in blocks:
        top = b.top + suffix
        if progress:
            progress(f"verilog {b.name} -> {out / (top + '.v')}")
        comp = b.shared(b.params(cfg))
        sh = sheet(b, comp, cfg, top=top, preset=preset, suffix=suffix)
        (out / f"{top}.json").write_text(json.dumps(sh, indent=1) + "\n")
        written[b.name] = write_verilog(comp, top, out / f"{top}.v", header=header(sh))
        if cores:
            write_core(out, b.name + suffix, top, written[b.name], b.description, sheet=sh)
    return written


def run(args) -> int:
    from ..report import Progress
    cfg = config_from_args(args)
    blocks = blocks_from_args(args)
    suffix = resolve_suffix(args.suffix, cfg)
    out = writable_dir(args.out, "--out")
    preset = args.preset if not args.set else f"{args.preset} with {' '.join(args.set)}"
    written = write_all(cfg, blocks, out, Progress(len(blocks)), cores=not args.no_cores,
                        suffix=suffix, preset=preset)
    for name, path in written.items():
        print(f"{name:12s} {path}  {path.with_suffix('.json')}"
              + ("" if args.no_cores else f"  {path.with_suffix('.core')}"))
    return 0

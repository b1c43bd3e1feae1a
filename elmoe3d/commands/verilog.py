"""``elmoe3d verilog --out DIR``: one Verilog file per block, each with a
FuseSoC CAPI2 core (``<top>.core``: the Verilog, a default and a Verilator
``lint`` target; :mod:`elmoe3d.sim.cores`)."""

from __future__ import annotations

from pathlib import Path

from ._common import add_blocks_arg, add_config_args, blocks_from_args, config_from_args

NAME = "verilog"
HELP = ("write one Verilog file per block (distinct top names) and its FuseSoC .core "
        "into --out DIR")


def register(p):
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--no-cores", action="store_true", help="do not write FuseSoC .core files")
    add_config_args(p)
    add_blocks_arg(p)


def write_all(cfg, blocks, out: Path, progress=None, cores: bool = True) -> dict:
    from ..sim.cores import write_core, write_waiver_core
    from ..sim.harness import write_verilog
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    if cores:
        write_waiver_core(out)
    for b in blocks:
        if progress:
            progress(f"verilog {b.name} -> {out / (b.top + '.v')}")
        written[b.name] = write_verilog(b.build(cfg), b.top, out / f"{b.top}.v")
        if cores:
            write_core(out, b.name, b.top, written[b.name], b.description)
    return written


def run(args) -> int:
    from ..report import Progress
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out!r} exists and is not a directory")
    cfg = config_from_args(args)
    blocks = blocks_from_args(args)
    written = write_all(cfg, blocks, out, Progress(len(blocks)), cores=not args.no_cores)
    for name, path in written.items():
        print(f"{name:12s} {path}" + ("" if args.no_cores else f"  {path.with_suffix('.core')}"))
    return 0

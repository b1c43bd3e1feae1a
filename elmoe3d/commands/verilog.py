"""``elmoe3d verilog --out DIR``: one Verilog file per block."""

from __future__ import annotations

from pathlib import Path

from ._common import add_blocks_arg, add_config_args, blocks_from_args, config_from_args

NAME = "verilog"
HELP = "write one Verilog file per block (distinct top names) into --out DIR"


def register(p):
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    add_config_args(p)
    add_blocks_arg(p)


def write_all(cfg, blocks, out: Path, progress=None) -> dict:
    from ..sim.harness import write_verilog
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for b in blocks:
        if progress:
            progress(f"verilog {b.name} -> {out / (b.top + '.v')}")
        written[b.name] = write_verilog(b.build(cfg), b.top, out / f"{b.top}.v")
    return written


def run(args) -> int:
    from ..report import Progress
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out!r} exists and is not a directory")
    cfg = config_from_args(args)
    blocks = blocks_from_args(args)
    written = write_all(cfg, blocks, out, Progress(len(blocks)))
    for name, path in written.items():
        print(f"{name:12s} {path}")
    return 0

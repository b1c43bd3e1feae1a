"""Argument helpers shared by command modules (not a command itself)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..config import PRESETS, Config, preset

__all__ = ["add_config_args", "config_from_args", "add_blocks_arg", "blocks_from_args",
           "writable_file"]


def add_config_args(p):
    p.add_argument("--preset", default="default", metavar="NAME",
                   help=f"configuration preset: {', '.join(PRESETS)} (default: default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one Config field, e.g. --set lanes=8 (repeatable)")


def config_from_args(args) -> Config:
    cfg = preset(args.preset)
    fields = {f.name: f.type for f in dataclasses.fields(Config)}
    changes = {}
    for item in args.set:
        if "=" not in item:
            raise ValueError(f"--set needs KEY=VALUE, not {item!r}")
        key, _, val = item.partition("=")
        key = key.strip()
        if key not in fields:
            raise ValueError(f"--set: unknown Config field {key!r}; fields: {', '.join(fields)}")
        try:
            changes[key] = int(val, 0)
        except ValueError:
            raise ValueError(f"--set {key}: expected an integer, not {val!r}") from None
    return cfg.replace(**changes) if changes else cfg


def add_blocks_arg(p):
    p.add_argument("--blocks", default=None, metavar="A,B",
                   help="comma-separated block names (default: all)")


def blocks_from_args(args):
    from ..blocks import blocks, get_block
    if not args.blocks:
        return list(blocks().values())
    return [get_block(name.strip()) for name in args.blocks.split(",") if name.strip()]


def writable_file(path: str) -> Path:
    p = Path(path)
    if p.exists() and p.is_dir():
        raise ValueError(f"{path!r} is a directory, expected a file name")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p

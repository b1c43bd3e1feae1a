"""Argument helpers shared by command modules (not a command itself)."""

from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path

from ..config import PRESETS, Config, preset

__all__ = ["add_config_args", "config_from_args", "add_blocks_arg", "blocks_from_args",
           "parse_blocks", "writable_file", "writable_dir"]


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


def parse_blocks(text: str | None, flag: str = "--blocks") -> list[str]:
    """Block names of a ``--blocks A,B`` value: ``None`` (the option not given)
    is every block; a value that names no block (``""``, ``","``) or an
    unknown block is refused, naming it."""
    from ..blocks import block_names, get_block
    if text is None:
        return block_names()
    names = [n.strip() for n in text.split(",")]
    if not any(names):
        raise ValueError(f"{flag} {text!r} names no block; choose from {', '.join(block_names())} "
                         f"(leave {flag} out for every block)")
    if not all(names):
        raise ValueError(f"{flag} {text!r} has an empty name between commas")
    return list(dict.fromkeys(get_block(n).name for n in names))


def blocks_from_args(args):
    from ..blocks import get_block
    return [get_block(n) for n in parse_blocks(args.blocks)]


def _unwritable(what: str, path, e: OSError) -> ValueError:
    return ValueError(f"{what} {str(path)!r} is not writable: {e.strerror or e}")


def writable_file(path: str, what: str = "output file") -> Path:
    """``path`` as a ``Path`` once it is known that the file can be written:
    its folder is created and the file opened for writing (and removed again
    if it did not exist), so an unwritable output stops a command before its
    work, not after. ``what`` names the option in the error (``--json``)."""
    p = Path(path)
    if p.exists() and p.is_dir():
        raise ValueError(f"{what} {path!r} is a directory, expected a file name")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        existed = p.exists()
        with open(p, "a"):
            pass
        if not existed:
            p.unlink()
    except OSError as e:
        raise _unwritable(what, path, e) from None
    return p


def writable_dir(path, what: str = "output folder") -> Path:
    """``path`` as a ``Path`` once the folder exists (created if needed) and a
    file can be created in it; errors name ``what`` (``--out``, ``--plot``)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what} {str(path)!r} exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".elmoe3d-write-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with open(probe, "w"):
            pass
        probe.unlink()
    except OSError as e:
        raise _unwritable(what, path, e) from None
    return p

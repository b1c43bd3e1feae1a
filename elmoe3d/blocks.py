"""Registry of the RTL blocks: name, Verilog top, how to build one from a
:class:`~elmoe3d.config.Config`, and what it is. ``elmoe3d verilog``,
``elmoe3d synth`` and the report iterate over it.

A block registers itself: any module in ``elmoe3d.hw`` that defines a list
``BLOCK_SPECS`` of :class:`Block` is picked up (ordered by ``Block.order``),
so adding a block never means editing this file.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from .config import Config

__all__ = ["Block", "blocks", "block_names", "get_block"]


@dataclass(frozen=True)
class Block:
    """One synthesisable block.

    ``params(cfg)`` gives its elaboration parameters (a JSON-able dict) from a
    Config; ``factory(**params)`` builds the Amaranth component. Baselines
    name the block they are compared with in ``baseline_of``. ``sweep`` is
    an optional list of Config overrides reported as a size sweep. ``synth``
    False keeps a block out of the default synthesis of ``make demo`` /
    ``elmoe3d build`` (``elmoe3d synth --blocks NAME`` still runs it).
    ``timing`` states latency and throughput for README's block table (a
    string, or a function of the built component, e.g. reading its
    ``latency``); say only what the block's tests assert or measure.
    ``part_of`` names the block this one is a unit of (its figures go to
    that block's page, not a row of README's table).
    """
    name: str
    top: str
    description: str
    params: Callable[[Config], dict]
    factory: Callable[..., object]
    baseline_of: str | None = None
    order: int = 100
    sweep: tuple = ()
    synth: bool = True
    timing: str | Callable[[object], str] = ""
    part_of: str | None = None

    def build(self, cfg: Config):
        return self.factory(**self.params(cfg))

    def shared(self, params: dict):
        """One component per block and parameters, for the synthesis flow and
        ``elmoe3d verilog`` in one process: its Verilog is converted once
        (``sim.harness.verilog_text`` keeps it per component) however many
        targets, wrappers and reports ask for it. Not for simulation, which
        builds its own."""
        import json
        key = (self.name, json.dumps(params, sort_keys=True, default=str))
        if key not in _SHARED:
            _SHARED[key] = self.factory(**params)
        return _SHARED[key]


_CACHE: dict[str, Block] | None = None
_SHARED: dict = {}


def blocks() -> dict[str, Block]:
    """All registered blocks, in report order."""
    global _CACHE
    if _CACHE is None:
        from . import hw
        found = []
        for info in pkgutil.iter_modules(hw.__path__):
            mod = importlib.import_module(f"{hw.__name__}.{info.name}")
            found.extend(getattr(mod, "BLOCK_SPECS", ()))
        names = [b.name for b in found]
        dups = {n for n in names if names.count(n) > 1}
        if dups:
            raise RuntimeError(f"Duplicate block names registered: {sorted(dups)}")
        _CACHE = {b.name: b for b in sorted(found, key=lambda b: (b.order, b.name))}
    return _CACHE


def block_names() -> list[str]:
    return list(blocks())


def get_block(name: str) -> Block:
    try:
        return blocks()[name]
    except KeyError:
        raise ValueError(f"Unknown block {name!r}; choose from {', '.join(blocks())}") from None

"""Registry of the RTL blocks: name, Verilog top, how to build one from a
:class:`~elmoe3d.config.Config`, and what it is. ``elmoe3d verilog``,
``elmoe3d synth`` and the report iterate over it; a new block is one entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import Config

__all__ = ["Block", "BLOCKS", "block_params", "get_block"]


@dataclass(frozen=True)
class Block:
    name: str
    top: str
    description: str
    params: Callable[[Config], dict]        # elaboration parameters from a Config
    factory: Callable[..., object]          # factory(**params) -> Amaranth component
    baseline_of: str | None = None          # for baselines: the block they compare with


def _pe(**kw):
    from .hw.pe import BitSlicePE
    return BitSlicePE(**kw)


def _mac(**kw):
    from .hw.pe import Int8MacVector
    return Int8MacVector(**kw)


BLOCKS: dict[str, Block] = {b.name: b for b in [
    Block("pe", "elmoe3d_pe", "LSB-augmented bit-slice PE (FULL/DRAFT/MSB/LSB modes)",
          lambda c: dict(lanes=c.lanes, slice_bits=c.slice_bits, max_len=c.max_len,
                         augment=True), _pe),
    Block("pe_plain", "elmoe3d_pe_plain", "baseline: the same bit-slice PE without augmentation",
          lambda c: dict(lanes=c.lanes, slice_bits=c.slice_bits, max_len=c.max_len,
                         augment=False), _pe, baseline_of="pe"),
    Block("mac_int8", "elmoe3d_mac_int8", "baseline: bit-parallel INT8xINT8 MAC vector, same lanes",
          lambda c: dict(lanes=c.lanes, max_len=c.max_len), _mac, baseline_of="pe"),
]}


def get_block(name: str) -> Block:
    try:
        return BLOCKS[name]
    except KeyError:
        raise ValueError(f"Unknown block {name!r}; choose from {', '.join(BLOCKS)}") from None


def block_params(name: str, cfg: Config) -> dict:
    return get_block(name).params(cfg)

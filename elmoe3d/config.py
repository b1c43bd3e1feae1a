"""One configuration object for every block, golden model, testbench and report.

Every architectural parameter of ELMoE-3D lives in :class:`Config`, a frozen
dataclass validated on construction. Amaranth components, the golden models,
the cocotb testbenches, the synthesis flow and (later) the system model all
take their parameters from it, so a block never disagrees with its golden
model about a width.

Named presets: ``tiny`` (fast tests), ``default`` (the size ``make demo``
reports), ``fpga`` (smallest that fits an FPGA), ``paper`` (the paper's chip,
for the system model only).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["Config", "PRESETS", "preset", "check_int", "SLICE_WIDTHS", "WEIGHT_BITS", "ACT_BITS"]

#: Weight and activation precision of the target models (INT8 x INT8).
WEIGHT_BITS = 8
ACT_BITS = 8
#: Slice widths that divide an INT8 weight into equal planes.
SLICE_WIDTHS = (1, 2, 4)


def check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    """Validate an integer parameter: ``TypeError`` for a non-integer (bools
    included), ``ValueError`` naming the value when out of range. Shared by
    the Config, the Amaranth blocks and the golden models."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{name} must be {rng}, not {value!r}")
    return value


def _check_pow2(name, value):
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, not {value!r}")


@dataclass(frozen=True)
class Config:
    """Architectural parameters of one ELMoE-3D tile.

    Parameters
    ----------
    slice_bits : int
        Slice width ``s`` in bits (1, 2 or 4). An INT8 weight is ``n = 8 // s``
        planes; plane 0 (MSB) is signed, the others unsigned.
    lanes : int
        ``L``, lanes per PE: slices (and INT8 activations) consumed per cycle.
    pes : int
        ``B``, PEs in the tile; also the number of HB banks (paired 1:1).
    max_len : int
        Longest dot product (reduction length, in elements) one PE
        accumulates; sets the accumulator width so it can never overflow.
    hb_words : int
        Words per HB bank (one word = one slice vector).
    tag_slots : int
        ``S``, slots of the expert-cache tag unit.
    layer_bits, expert_bits : int
        Widths of the ``{layer, expert}`` expert tag.
    hidden, ffn, experts, top_k, shared_experts : int
        MoE layer shape ``H``, ``I``, ``E``, ``k`` and shared experts.
    axi_data_bits : int
        AXI4 data width of the external-memory port.
    """

    slice_bits: int = 4
    lanes: int = 16
    pes: int = 4
    max_len: int = 4096
    hb_words: int = 4096
    tag_slots: int = 32
    layer_bits: int = 6
    expert_bits: int = 7
    hidden: int = 64
    ffn: int = 128
    experts: int = 16
    top_k: int = 4
    shared_experts: int = 0
    axi_data_bits: int = 64

    def __post_init__(self):
        if isinstance(self.slice_bits, bool) or not isinstance(self.slice_bits, int):
            raise TypeError(f"Slice width must be an integer, not {self.slice_bits!r}")
        if self.slice_bits not in SLICE_WIDTHS:
            raise ValueError(f"Slice width must be 1, 2 or 4, not {self.slice_bits!r}")
        check_int("Lane count", self.lanes, 1, 1024)
        check_int("PE count", self.pes, 1, 1024)
        check_int("Maximum dot-product length", self.max_len, 1)
        check_int("HB words per bank", self.hb_words, 2)
        _check_pow2("HB words per bank", self.hb_words)
        check_int("Tag-unit slot count", self.tag_slots, 2, 4096)
        check_int("Layer id width", self.layer_bits, 1, 16)
        check_int("Expert id width", self.expert_bits, 1, 16)
        check_int("Hidden size", self.hidden, 1)
        check_int("Expert FFN width", self.ffn, 1)
        check_int("Routed expert count", self.experts, 1)
        check_int("Top-k", self.top_k, 1)
        check_int("Shared expert count", self.shared_experts, 0)
        if self.top_k > self.experts:
            raise ValueError(f"Top-k must not exceed the expert count {self.experts}, not {self.top_k!r}")
        if self.experts > (1 << self.expert_bits):
            raise ValueError(
                f"Expert count {self.experts!r} does not fit in expert id width {self.expert_bits}")
        check_int("AXI data width", self.axi_data_bits, 8, 1024)
        _check_pow2("AXI data width", self.axi_data_bits)

    # -- derived quantities -------------------------------------------------
    @property
    def planes(self) -> int:
        """``n``: slice planes per INT8 weight."""
        return WEIGHT_BITS // self.slice_bits

    @property
    def slice_vector_bits(self) -> int:
        """Bits of one slice vector (``L`` slices, lane 0 in the low bits)."""
        return self.lanes * self.slice_bits

    @property
    def tag_bits(self) -> int:
        return self.layer_bits + self.expert_bits

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


PRESETS = {
    # fast simulation: every test that needs a full block
    "tiny": Config(lanes=4, pes=2, max_len=256, hb_words=256, tag_slots=8,
                   hidden=16, ffn=32, experts=8, top_k=2),
    # what `make demo` reports
    "default": Config(),
    # the smallest useful build, fits an ECP5-85F / iCE40 UP5K per block
    "fpga": Config(lanes=8, pes=2, max_len=1024, hb_words=1024, tag_slots=16,
                   hidden=32, ffn=64, experts=8, top_k=2),
    # the paper's chip (8 GB config): 32 PEs, 16x32x32 bit-slice arrays; for the system model
    "paper": Config(lanes=32, pes=32, max_len=16384, hb_words=1 << 20, tag_slots=4096,
                    layer_bits=6, expert_bits=8, hidden=2048, ffn=768, experts=128, top_k=8),
}


def preset(name: str) -> Config:
    """The named preset; ``ValueError`` naming the choices for an unknown name."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"Unknown configuration preset {name!r}; choose one of {', '.join(PRESETS)}") from None

"""Derived widths and sizes of a :class:`~elmoe3d.config.Config`: the layer
below ``Config`` and the golden models.

``Config`` computes its derived sizes from the functions here, and the
golden models, the blocks and the testbenches use the same functions, so
no width or region size has two formulas; the blocks take their widths
from here and from ``Config``, never from the NumPy models. This module
imports nothing from the package but :mod:`elmoe3d.checks` (it takes a
``Config`` as any object with its attributes), so ``elmoe3d.config`` and
``elmoe3d.golden`` both import it without a loop.

* :func:`bits`: the width of an unsigned field holding ``0 .. n-1``;
* :func:`acc_width` (with :func:`max_chunks`, :func:`max_abs_product`): the
  PE accumulator width (also :mod:`elmoe3d.golden.bitslice`'s);
* :func:`dense_layout` / :func:`lpddr_layout`: the sizes of HB's dense region
  and of the LPDDR window (also :mod:`elmoe3d.golden.layout`'s, whose
  docstring describes both layouts), :func:`kv_limit`, :func:`row_bytes`,
  :func:`segments` (an expert's row groups), the dense records' words
  (:func:`record_words`, :func:`expert_record_range`, :func:`lut_share`);
* the bit-slice planes (:func:`n_planes`, :func:`field_shift`), the tag
  unit's fields (:func:`tag_unit_params`, :func:`tag_slot_bits`,
  :func:`tag_value_bits`), the MoE layer's number formats (:data:`GATE_FRAC`,
  :data:`MULT_BITS`, ...), and the peers' (:func:`serial_acc_width`,
  :func:`fusion_max_beats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import enum

import numpy as np

from .checks import check_int

__all__ = ["bits", "floor_log2", "PARAM_BITS", "WEIGHT_BITS", "SLICE_WIDTHS", "max_abs_product",
           "max_chunks", "acc_width", "DenseLayout", "dense_layout", "LpddrLayout", "lpddr_layout",
           "kv_limit", "row_bytes", "Proj", "Segment", "segments", "lut_share", "record_words",
           "expert_record_range", "check_slice_bits", "n_planes", "field_shift",
           "TAG_STAT_NAMES", "check_tag_params", "tag_unit_params", "tag_slot_bits",
           "tag_value_bits", "GATE_FRAC", "GATE_ONE", "MULT_BITS", "SHIFT_BITS", "SHIFT_MAX",
           "T_MAX", "DIGIT_BITS", "MAX_WEIGHT_BITS", "check_digit_bits", "serial_acc_width",
           "serial_max_groups", "fusion_max_beats"]

#: Bits of one requantisation-parameter record in the dense HB region
#: (``mult`` 16 bits, ``shift`` 6 bits, padding; see ``golden/layout.py``).
PARAM_BITS = 32

#: Weight precision of the target models (INT8).
WEIGHT_BITS = 8
#: Slice widths that divide an INT8 weight into equal planes.
SLICE_WIDTHS = (1, 2, 4)


def bits(n: int) -> int:
    """Width of an unsigned field holding ``0 .. n-1`` (at least 1).

    Not ``amaranth.utils.ceil_log2``, which is 0 for ``n`` = 0 and 1 (a
    field here is never 0 bits wide); ``bits(n) == bits_for(n - 1)`` for
    ``n >= 0``."""
    return max(1, (int(n) - 1).bit_length())


def floor_log2(n: int) -> int:
    """``floor(log2(n))`` for ``n >= 1`` (the largest power of two not above
    ``n`` is ``1 << floor_log2(n)``; ``amaranth.utils.exact_log2`` when ``n``
    must be one)."""
    check_int("floor_log2 argument", n, 1)
    return int(n).bit_length() - 1


# --------------------------------------------------------------------------------------
# PE accumulator


def max_abs_product() -> int:
    """Largest ``|a * w_eff|`` of any mode: ``(-128) * (-128)``."""
    return 128 * 128


def max_chunks(max_len: int, lanes: int = 1) -> int:
    """Chunks (beats per plane) a dot product may have: ``ceil(max_len / L)``.

    This is the *real* length limit of a PE: a dot product of ``C`` chunks
    carries ``C * L`` elements, which is more than ``max_len`` when ``L``
    does not divide it (``L = 4, max_len = 7``: 2 chunks, 8 elements)."""
    _check_len(max_len, lanes)
    return -(-max_len // lanes)


def _check_len(max_len, lanes):
    for name, v in (("Maximum dot-product length", max_len), ("Lane count", lanes)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, not {v!r}")
        if v < 1:
            raise ValueError(f"{name} must be >= 1, not {v!r}")


def acc_width(max_len: int, lanes: int = 1) -> int:
    """Signed accumulator width that holds every dot product a PE with ``L =
    lanes`` accepts (``max_chunks(max_len, L) * L`` elements), in any mode,
    and every partial sum on the way.

    The largest magnitude is ``128 * 128`` per element (``(-128) * (-128)``:
    every mode's effective weight is in ``-128 .. 127``), so ``N``
    elements need ``bit_length(16384 * N) + 1`` bits. This is the one formula
    behind ``PEResult.value``, ``Config.acc_bits`` and every PE's
    accumulator."""
    elements = max_chunks(max_len, lanes) * lanes
    return (max_abs_product() * elements).bit_length() + 1


# --------------------------------------------------------------------------------------
# dense region (HB words per bank)


@dataclass(frozen=True)
class DenseLayout:
    """Word offsets (per bank) of the dense region.

    Per layer ``l`` (``layer_base[l]``): the router (``n`` planes,
    segment-interleaved, ``router_words``), then each shared expert (``n``
    planes, ``expert_words_all`` each), then the parameter records
    (``param_words``). Parameter records (32 bits,
    :func:`~elmoe3d.golden.layout.pack_param_record`) are packed little-endian
    into consecutive words of the bank (record ``i`` at bit ``32 i`` of the
    area). Per bank ``b`` the records are, in order:
    for every expert ``j`` in ``0 .. E+S-1`` (routed, then shared — the
    golden layer's indexing): its GATE rows ``g*B+b`` (``gate_rq``), its UP
    rows (``up_rq`` then ``prod_rq``), its DOWN rows (``down_rq``); then the
    layer's output rows (``out_rq``), one softmax record (``sm_mult``,
    ``sm_shift``) and the SiLU table (256 INT8 entries, 4 per record, entry
    0 = code -128, in every bank).

    Within an expert's UP rows the two records of a row are adjacent
    (``up_rq`` of row ``g*B+b``, then its ``prod_rq``, then the next row), so
    every segment's records are consecutive and in segment order
    (:func:`~elmoe3d.golden.layout.dense_records` builds them;
    :func:`~elmoe3d.golden.layout.dense_image` the region).
    """
    words: int
    layer_base: tuple
    router_words: int
    expert_words_all: int
    shared: int
    param_base: int           # offset of the records within a layer
    records: int              # records per bank per layer
    param_words: int
    layer_words: int
    record_index: dict        # name -> record offset within a layer's records

    def router_base(self, layer: int) -> int:
        return self.layer_base[layer]

    def shared_base(self, layer: int, j: int) -> int:
        return self.layer_base[layer] + self.router_words + j * self.expert_words_all

    def params_base(self, layer: int) -> int:
        return self.layer_base[layer] + self.param_base


def _param_counts(cfg):
    B, H, I, E, S = cfg.pes, cfg.hidden, cfg.ffn, cfg.experts, cfg.shared_experts
    per_expert = (I + 2 * I + H) // B
    idx = {"experts": 0, "per_expert": per_expert,
           "out": (E + S) * per_expert}
    idx["sm"] = idx["out"] + H // B
    idx["lut"] = idx["sm"] + 1
    total = idx["lut"] + 256 // 4
    return idx, total


@lru_cache(maxsize=64)
def _dense_layout(cfg) -> DenseLayout:
    n, sv = cfg.planes, cfg.slice_vector_bits
    router_words = n * cfg.experts * cfg.hidden // (cfg.pes * cfg.lanes)
    expert_all = n * cfg.expert_rows
    idx, records = _param_counts(cfg)
    param_words = -(-records * PARAM_BITS // sv)
    param_base = router_words + cfg.shared_experts * expert_all
    layer_words = param_base + param_words
    bases = tuple(l * layer_words for l in range(cfg.layers))
    return DenseLayout(layer_words * cfg.layers, bases, router_words, expert_all,
                       cfg.shared_experts, param_base, records, param_words, layer_words, idx)


def dense_layout(cfg) -> DenseLayout:
    """The dense region's layout for a configuration (see :class:`DenseLayout`)."""
    return _dense_layout(cfg)


# --------------------------------------------------------------------------------------
# LPDDR window (bytes)


@dataclass(frozen=True)
class LpddrLayout:
    base: int
    expert_bytes: int
    dense_base: int
    dense_bytes: int
    total_bytes: int


@lru_cache(maxsize=64)
def _lpddr_layout(cfg) -> LpddrLayout:
    eb = cfg.expert_bytes
    experts = cfg.layers * cfg.experts * eb
    dense = cfg.dense_words * cfg.pes * cfg.slice_vector_bits // 8
    return LpddrLayout(cfg.lpddr_base, eb, cfg.lpddr_base + experts, dense, experts + dense)


def lpddr_layout(cfg) -> LpddrLayout:
    return _lpddr_layout(cfg)


def kv_limit(cfg) -> int:
    """Largest KV region in words per bank (it never enters the dense region)."""
    return cfg.hb_words - cfg.dense_words


def row_bytes(cfg) -> int:
    """Bytes of one dense-image row (one word per bank)."""
    return cfg.pes * cfg.slice_vector_bits // 8


# --------------------------------------------------------------------------------------
# An expert's row groups and the dense region's records


class Proj(enum.IntEnum):
    """Projection of an expert (hardware encoding)."""
    ROUTER = 0
    GATE = 1
    UP = 2
    DOWN = 3


@dataclass(frozen=True)
class Segment:
    """One ``(projection, row group)``: ``chunks`` beats per plane; its words
    are rows ``row0 .. row0 + chunks - 1`` of every plane."""
    proj: Proj
    group: int
    chunks: int
    row0: int


@lru_cache(maxsize=64)
def _segments(H, I, B, L) -> tuple:
    out, row = [], 0
    for proj, groups, chunks in ((Proj.GATE, I // B, H // L), (Proj.UP, I // B, H // L),
                                 (Proj.DOWN, H // B, I // L)):
        for g in range(groups):
            out.append(Segment(proj, g, chunks, row))
            row += chunks
    return tuple(out)


def segments(cfg) -> tuple:
    """The segments of one expert, in consumption order."""
    return _segments(cfg.hidden, cfg.ffn, cfg.pes, cfg.lanes)


def lut_share(cfg, bank: int) -> range:
    """SiLU-table records (0..63, 4 entries each) that bank ``bank`` supplies:
    the table is in every bank; bank 0 supplies all of it (the pass
    constants are read while the router computes, off the critical path)."""
    return range(0, 64) if bank == 0 else range(0)


def record_words(cfg, first: int, count: int) -> tuple[int, int, int]:
    """``(word offset, words, records to skip)`` of the words of a layer's
    record area that hold records ``first .. first+count-1`` (record ``i`` at
    bit ``32 i``)."""
    sv = cfg.slice_vector_bits
    if count <= 0:
        return 0, 0, 0
    lo_bit, hi_bit = 32 * first, 32 * (first + count)
    w0 = lo_bit // sv
    w1 = -(-hi_bit // sv)
    skip = (lo_bit - w0 * sv) // 32
    return w0, w1 - w0, skip


def expert_record_range(cfg, j: int) -> tuple[int, int]:
    """``(first record, count)`` of expert ``j``'s records (routed then shared)."""
    d = dense_layout(cfg)
    per = d.record_index["per_expert"]
    return d.record_index["experts"] + j * per, per


# --------------------------------------------------------------------------------------
# Bit-slice planes


def check_slice_bits(s) -> int:
    """``s`` as an int, or ``TypeError`` / ``ValueError`` unless it is one of
    :data:`SLICE_WIDTHS`."""
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
        raise TypeError(f"Slice width must be an integer, not {s!r}")
    if int(s) not in SLICE_WIDTHS:
        raise ValueError(f"Slice width must be 1, 2 or 4, not {s!r}")
    return int(s)


def n_planes(s: int) -> int:
    """Planes per INT8 weight for slice width ``s``."""
    return WEIGHT_BITS // check_slice_bits(s)


def field_shift(plane: int, s: int) -> int:
    """Left shift applied to a plane's partial sum: ``s*(n-1-p)``, one less for
    the MSB plane because its field counts half-units."""
    n = n_planes(s)
    return s * (n - 1 - plane) - (1 if plane == 0 else 0)


# --------------------------------------------------------------------------------------
# The tag unit's fields

#: The tag unit's STATS counters in index order (the index in the command's
#: ``slot`` field). The first four keep the indices they had before PENDING
#: existed.
TAG_STAT_NAMES = ("lookups", "hits", "allocations", "evictions", "pending", "commits", "aborts",
                  "kv_frees")


def check_tag_params(slots, layer_bits, expert_bits, hot_bits, decay_shift, plane_bits,
                     stat_bits, pin_bits) -> None:
    """Validate the tag unit's parameters (shared by the golden model and the
    RTL, so both refuse exactly the same values with the same messages)."""
    check_int("Tag-unit slot count", slots, 2, 4096)
    check_int("Layer id width", layer_bits, 1, 16)
    check_int("Expert id width", expert_bits, 1, 16)
    check_int("Hotness width", hot_bits, 1, 32)
    check_int("Decay shift", decay_shift, 0, hot_bits)
    check_int("Resident-plane width", plane_bits, 1, 8)
    check_int("Statistics counter width", stat_bits, 1, 64)
    check_int("Pin counter width", pin_bits, 1, 16)


def tag_unit_params(cfg) -> dict:
    """The tag unit's parameters from a :class:`~elmoe3d.config.Config` (the
    block registry, the golden model and the testbenches use this one
    function). ``plane_bits`` holds a plane *count* ``0 .. n``."""
    return dict(slots=cfg.tag_slots, layer_bits=cfg.layer_bits, expert_bits=cfg.expert_bits,
                hot_bits=cfg.hot_bits, decay_shift=cfg.decay_shift,
                plane_bits=max(1, cfg.planes.bit_length()), stat_bits=cfg.stat_bits,
                pin_bits=cfg.pin_bits)


def tag_slot_bits(slots: int) -> int:
    """Width of the tag unit's command/response ``slot`` field: enough for
    ``slots - 1`` and for every STATS index (``len(TAG_STAT_NAMES) - 1``)."""
    return max((len(TAG_STAT_NAMES) - 1).bit_length(), bits(slots))


def tag_value_bits(hot_bits: int, stat_bits: int, pin_bits: int) -> int:
    """Width of the tag unit's response ``value`` field (hotness, pin count or
    counter)."""
    return max(hot_bits, stat_bits, pin_bits)


# --------------------------------------------------------------------------------------
# The MoE layer's number formats (the arithmetic itself: golden/moe_layer.py)

#: Fraction bits of a gate weight (Q12: 4096 is 1.0).
GATE_FRAC = 12
GATE_ONE = 1 << GATE_FRAC
#: Requantisation multiplier width (unsigned) and largest shift.
MULT_BITS = 16
SHIFT_BITS = 6
SHIFT_MAX = 47
#: Softmax exponent clamp (t in 1/16 octaves).
T_MAX = 255


# --------------------------------------------------------------------------------------
# The peers' widths (golden/bitserial.py, golden/bitfusion.py)

#: Digit widths the bit-serial peer is built for (bits of weight per lane per cycle).
DIGIT_BITS = (1, 2, 4)
#: Widest weight the bit-serial peer takes.
MAX_WEIGHT_BITS = 8


def check_digit_bits(b) -> int:
    """``b``, or ``TypeError`` / ``ValueError`` unless it is one of :data:`DIGIT_BITS`."""
    if isinstance(b, bool) or not isinstance(b, int):
        raise TypeError(f"Digit width must be an integer, not {b!r}")
    if b not in DIGIT_BITS:
        raise ValueError(f"Digit width must be 1, 2 or 4, not {b!r}")
    return b


def serial_acc_width(max_len: int) -> int:
    """The bit-serial peer's signed accumulator width: it holds any dot
    product of up to ``max_len`` products of an INT8 activation and an (at
    most) 8-bit weight, and every partial sum on the way."""
    check_int("Maximum dot-product length", max_len, 1)
    return (128 * 128 * max_len).bit_length() + 1


def serial_max_groups(max_len: int, lanes: int) -> int:
    """Lane groups of the bit-serial peer's longest dot product."""
    return -(-max_len // lanes)


def fusion_max_beats(w4: bool, *, max_len: int, lanes: int) -> int:
    """The Bit Fusion peer's longest dot product in beats: ``ceil(max_len /
    L)`` (W8) or ``ceil(max_len / 2L)`` (W4, ``w4``)."""
    return max_chunks(max_len, lanes * (2 if w4 else 1))

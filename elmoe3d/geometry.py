"""Derived widths and sizes of a :class:`~elmoe3d.config.Config`: the layer
below ``Config`` and the golden models.

``Config`` computes its derived sizes from the functions here, and the
golden models, the blocks and the testbenches use the same functions, so
no width or region size has two formulas. This module imports nothing from
the package (it takes a ``Config`` as any object with its attributes), so
``elmoe3d.config`` and ``elmoe3d.golden`` both import it without a loop.

* :func:`bits`: the width of an unsigned field holding ``0 .. n-1``;
* :func:`acc_width` (with :func:`max_chunks`, :func:`max_abs_product`): the
  PE accumulator width (also :mod:`elmoe3d.golden.bitslice`'s);
* :func:`dense_layout` / :func:`lpddr_layout`: the sizes of HB's dense region
  and of the LPDDR window (also :mod:`elmoe3d.golden.layout`'s, whose
  docstring describes both layouts).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["bits", "PARAM_BITS", "max_abs_product", "max_chunks", "acc_width",
           "DenseLayout", "dense_layout", "LpddrLayout", "lpddr_layout"]

#: Bits of one requantisation-parameter record in the dense HB region
#: (``mult`` 16 bits, ``shift`` 6 bits, padding; see ``golden/layout.py``).
PARAM_BITS = 32


def bits(n: int) -> int:
    """Width of an unsigned field holding ``0 .. n-1`` (at least 1).

    Not ``amaranth.utils.ceil_log2``, which is 0 for ``n`` = 0 and 1 (a
    field here is never 0 bits wide); ``bits(n) == bits_for(n - 1)`` for
    ``n >= 0``."""
    return max(1, (int(n) - 1).bit_length())


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

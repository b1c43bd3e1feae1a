"""Memory layouts and beat orders: the one definition every block, golden
model, testbench and the system model uses.

Everything that says *where a weight lives* or *in which order beats travel*
is a function here; RTL documentation refers to these functions, testbenches
build memory images with them, and the system model counts bytes with them.
The geometry (sizes) comes from :class:`elmoe3d.config.Config` and
:mod:`elmoe3d.geometry`.

Vocabulary: a *slice vector* is ``L`` slices of ``s`` bits of ``L``
consecutive weights of one weight row (lane 0 in the low bits); ``plane`` is a
plane index (0 = MSB, signed), ``planes`` a count, ``plane_mask`` a bit mask.

Expert rows and segments
------------------------
An expert's three projections are cut the way the PE array consumes them:
``B`` PEs, PE ``b`` computes weight rows ``g*B + b`` of row group ``g``, one
chunk of ``L`` reduction elements per beat::

    projection  matrix   row groups   chunks per row
    GATE        I x H    I / B        H / L
    UP          I x H    I / B        H / L
    DOWN        H x I    H / B        I / L

A *segment* is one ``(projection, row group)``; it has ``chunks`` beats per
plane. Per bank (= per PE) and per plane an expert is
``expert_rows = 3 H I / (B L)`` words; the *row* of a word is its index
``0 .. expert_rows-1`` in ``(projection, row group, chunk)`` order. The
router (``E x H``) is cut the same way (``E / B`` row groups of ``H / L``
chunks).

The weight-beat order a datapath consumes
-----------------------------------------
For one expert and a set of planes (``planes_for(mode)``): for every segment
in order, for every plane in increasing order, for every chunk: one beat of
``B`` slice vectors (bank/PE ``b`` gets row ``g*B + b``). See
:func:`weight_beats`. All planes of one segment arrive before the next
segment, so a PE finishes a dot product (all chunks and planes of one row)
before the next starts.

HB address map (every bank the same; words)
-------------------------------------------
::

    0 .......... D-1 | D ............ D + S*SW - 1 | ...... | W-kv ...... W-1
    dense region     | expert slots 0 .. S-1       | free   | KV region
                                                            ^ W - kv (boundary)

* the dense region (:func:`dense_layout`, ``D`` words) holds every served
  layer's router weights (all planes), shared experts (all planes) and the
  requantisation parameters; it is loaded once;
* slot ``j`` holds one *plane group* of one expert at ``D + j*SW``
  (``SW = k * expert_rows``): its MSB group, the ``k = hb_planes`` planes
  ``0 .. k-1``, or its LSB group, planes ``k .. n-1`` (when ``n - k <= k``,
  :func:`group_planes`), *segment-interleaved*: the words of segment ``σ``
  for a plane follow those of the group's previous plane of the same
  segment (:func:`hb_addr`, :func:`group_offset`), so a DRAFT (and the MSB
  half of a split VERIFY) reads an MSB slot, and a whole-resident expert
  its LSB slot, as one contiguous range in consumption order;
* the KV region occupies the top ``kv`` words and grows *downwards*: it covers
  the highest slots first, while the tag unit's victim search prefers the
  lowest free slot, so KV growth and victim choice do not fight. Slot ``j`` is
  covered (disabled) when ``D + (j+1)*SW > W - kv``. The KV region never
  enters the dense region (``kv <= W - D``).

LPDDR image (bytes from ``lpddr_base``)
---------------------------------------
::

    expert (layer l, expert e) at  lpddr_base + (l*E + e) * expert_bytes
    dense image                at  lpddr_base + layers*E*expert_bytes

Within an expert, all ``n`` planes, segment-interleaved like HB, bank
fastest: word ``((seg_row0 * n + q * chunks + c) * B + b)`` (see
:func:`lpddr_word_index`). One AXI beat carries ``fill_words`` consecutive
words (banks ``b0 .. b0+fill_words-1`` of one ``{plane, row}``). A
``(segment, plane)`` is therefore ``chunks * B`` contiguous words. The
dense image is the dense region word by word, bank fastest.

Everything here is plain Python / NumPy with explicit integer types.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..geometry import (DenseLayout, LpddrLayout, Proj, Segment, dense_layout, kv_limit,
                        lpddr_layout, segments)
from . import bitslice as gbs

__all__ = [
    "Proj", "Segment", "segments", "router_segments", "planes_for", "segment_of_row",
    "hb_addr", "hb_decode", "slot_covered_mask", "kv_limit",
    "lpddr_word_index", "lpddr_expert_base", "lpddr_plane_runs", "lpddr_layout", "LpddrLayout",
    "lpddr_image",
    "DenseLayout", "dense_layout", "pack_rows", "slice_words", "expert_slice_words",
    "expert_image", "hb_slot_image", "weight_beats", "ParamRecord", "pack_param_record",
    "group_planes", "group_offset", "lsb_group_fits",
    "unpack_param_record", "pack_lut_record", "dense_records", "dense_image",
    "interleaved_offset",
]


def router_segments(cfg) -> tuple:
    """The router's segments (``E / B`` row groups of ``H / L`` chunks)."""
    E, H, B, L = cfg.experts, cfg.hidden, cfg.pes, cfg.lanes
    return tuple(Segment(Proj.ROUTER, g, H // L, g * (H // L)) for g in range(E // B))


def segment_of_row(cfg, row: int) -> tuple[Segment, int]:
    """``(segment, chunk)`` of an expert row (``0 .. expert_rows-1``)."""
    if not 0 <= row < cfg.expert_rows:
        raise ValueError(f"Expert row {row!r} outside 0..{cfg.expert_rows - 1}")
    segs = segments(cfg)
    lo, hi = 0, len(segs) - 1
    while lo < hi:                                   # last segment with row0 <= row
        mid = (lo + hi + 1) // 2
        if segs[mid].row0 <= row:
            lo = mid
        else:
            hi = mid - 1
    s = segs[lo]
    return s, row - s.row0


def planes_for(cfg, mode) -> range:
    """Planes a PE mode streams for an expert: FULL all ``n``, DRAFT and MSB
    the ``k`` HB planes, LSB the others (:func:`elmoe3d.golden.bitslice.plane_range`)."""
    return gbs.plane_range(cfg.slice_bits, mode, cfg.hb_planes_eff)


# --------------------------------------------------------------------------------------
# HB


def lsb_group_fits(cfg) -> bool:
    """Whether a slot can hold an expert's LSB plane group (``n - k <= k``)."""
    return cfg.planes - cfg.hb_planes_eff <= cfg.hb_planes_eff


def group_planes(cfg, group: int) -> range:
    """The planes of plane group ``group`` (0: MSB ``0 .. k-1``, 1: LSB
    ``k .. n-1``); ``ValueError`` for an LSB group that does not fit a slot."""
    k, n = cfg.hb_planes_eff, cfg.planes
    if group == 0:
        return range(k)
    if group != 1:
        raise ValueError(f"Plane group must be 0 (MSB) or 1 (LSB), not {group!r}")
    if not lsb_group_fits(cfg):
        raise ValueError(f"An LSB group of {n - k} planes does not fit a slot of {k} planes")
    return range(k, n)


def group_offset(cfg, group: int, plane: int, row: int) -> int:
    """Word offset within a slot of ``{plane, row}`` of a slot holding plane
    group ``group`` (segment-interleaved over the group's planes)."""
    planes = group_planes(cfg, group)
    if plane not in planes or not 0 <= row < cfg.expert_rows:
        raise ValueError(f"(plane, row) = {(plane, row)!r} outside plane group {group!r}")
    seg, c = segment_of_row(cfg, row)
    return seg.row0 * len(planes) + (plane - planes.start) * seg.chunks + c


def hb_addr(cfg, slot: int, plane: int, row: int) -> int:
    """Bank word address of ``{slot, plane, row}`` (segment-interleaved)."""
    k = cfg.hb_planes_eff
    if not (0 <= slot < cfg.tag_slots and 0 <= plane < k and 0 <= row < cfg.expert_rows):
        raise ValueError(f"{{slot, plane, row}} = {(slot, plane, row)!r} outside the HB map "
                         f"({cfg.tag_slots} slots, {k} planes, {cfg.expert_rows} rows)")
    seg, c = segment_of_row(cfg, row)
    return cfg.expert_base + slot * cfg.slot_words + seg.row0 * k + plane * seg.chunks + c


def hb_decode(cfg, addr: int) -> tuple[int, int, int]:
    """Inverse of :func:`hb_addr` for an expert-region address: ``(slot, plane, row)``."""
    k = cfg.hb_planes_eff
    off = addr - cfg.expert_base
    if not 0 <= off < cfg.tag_slots * cfg.slot_words:
        raise ValueError(f"HB address {addr!r} is not in the expert region")
    slot, w = divmod(off, cfg.slot_words)
    for seg in segments(cfg):
        base = seg.row0 * k
        if w < base + k * seg.chunks:
            plane, c = divmod(w - base, seg.chunks)
            return slot, plane, seg.row0 + c
    raise AssertionError("unreachable")


def slot_covered_mask(cfg, kv_words: int) -> int:
    """Bit mask of the slots a KV region of ``kv_words`` (top of every bank)
    covers: slot ``j`` when ``D + (j+1)*SW > W - kv_words``."""
    if not 0 <= kv_words <= kv_limit(cfg):
        raise ValueError(f"KV region {kv_words!r} words outside 0..{kv_limit(cfg)}")
    top = cfg.hb_words - kv_words
    mask = 0
    for j in range(cfg.tag_slots):
        if cfg.expert_base + (j + 1) * cfg.slot_words > top:
            mask |= 1 << j
    return mask


# --------------------------------------------------------------------------------------
# dense region (its sizes, :class:`DenseLayout` and :func:`dense_layout`, are
# :mod:`elmoe3d.geometry`'s: ``Config.dense_words`` needs them)


@dataclass(frozen=True)
class ParamRecord:
    mult: int
    shift: int


def pack_param_record(mult: int, shift: int) -> int:
    """32-bit record: ``mult`` in bits 0..15, ``shift`` in bits 16..21."""
    if not (0 <= mult < 1 << 16 and 0 <= shift < 1 << 6):
        raise ValueError(f"Requantisation parameters (mult={mult!r}, shift={shift!r}) do not "
                         "fit a record (16-bit mult, 6-bit shift)")
    return int(mult) | (int(shift) << 16)


def unpack_param_record(rec: int) -> ParamRecord:
    return ParamRecord(rec & 0xFFFF, (rec >> 16) & 0x3F)


def pack_lut_record(entries) -> int:
    """32-bit SiLU-table record: four INT8 entries, entry ``i`` in bits
    ``8i .. 8i+7`` (two's complement)."""
    entries = [int(v) for v in entries]
    if len(entries) != 4 or any(not -128 <= v <= 127 for v in entries):
        raise ValueError(f"A SiLU-table record holds four INT8 entries, not {entries!r}")
    return sum((v & 0xFF) << (8 * i) for i, v in enumerate(entries))


def interleaved_offset(seg: Segment, plane: int, chunk: int, planes: int) -> int:
    """Word offset of ``{plane, chunk}`` of segment ``seg`` in an area that
    holds ``planes`` planes segment-interleaved (an HB slot with ``k``
    planes, a dense router or shared expert with all ``n``)."""
    return seg.row0 * planes + plane * seg.chunks + chunk


def dense_records(cfg, layer, bank: int) -> list[int]:
    """The 32-bit records of one layer in bank ``bank`` (the order of
    :class:`DenseLayout`): ``layer`` is a golden MoE layer
    (:class:`elmoe3d.golden.moe_layer.MoELayer`: ``*_mult``/``*_shift``,
    ``lut``, ``sm_mult``/``sm_shift``) of this Config's shape."""
    B, H, I = cfg.pes, cfg.hidden, cfg.ffn
    X = cfg.experts + cfg.shared_experts
    recs = []
    for j in range(X):
        for g in range(I // B):
            r = g * B + bank
            recs.append(pack_param_record(layer.gate_mult[j][r], layer.gate_shift[j][r]))
        for g in range(I // B):
            r = g * B + bank
            recs.append(pack_param_record(layer.up_mult[j][r], layer.up_shift[j][r]))
            recs.append(pack_param_record(layer.prod_mult[j][r], layer.prod_shift[j][r]))
        for g in range(H // B):
            r = g * B + bank
            recs.append(pack_param_record(layer.down_mult[j][r], layer.down_shift[j][r]))
    for g in range(H // B):
        r = g * B + bank
        recs.append(pack_param_record(layer.out_mult[r], layer.out_shift[r]))
    recs.append(pack_param_record(layer.sm_mult, layer.sm_shift))
    lut = [int(v) for v in layer.lut]
    recs += [pack_lut_record(lut[4 * i:4 * i + 4]) for i in range(64)]
    d = dense_layout(cfg)
    assert len(recs) == d.records and d.record_index["lut"] == d.records - 64
    return recs


def dense_image(cfg, layers) -> np.ndarray:
    """``(B, dense_words)`` words of the dense region for ``cfg.layers``
    golden MoE layers (routers and shared experts with all ``n`` planes,
    segment-interleaved; then the records, :func:`dense_records`)."""
    layers = list(layers)
    if len(layers) != cfg.layers:
        raise ValueError(f"The dense region holds {cfg.layers} layers, not {len(layers)}")
    d = dense_layout(cfg)
    n, B, sv = cfg.planes, cfg.pes, cfg.slice_vector_bits
    E = cfg.experts
    out = np.zeros((B, d.words), dtype=object)
    for li, lay in enumerate(layers):
        rw = pack_rows(cfg, lay.router, Proj.ROUTER)                  # (n, B, rows)
        base = d.router_base(li)
        for seg in router_segments(cfg):
            for q in range(n):
                for c in range(seg.chunks):
                    out[:, base + interleaved_offset(seg, q, c, n)] = rw[q, :, seg.row0 + c]
        for s in range(cfg.shared_experts):
            j = E + s
            words = expert_slice_words(cfg, lay.wg[j], lay.wu[j], lay.wd[j])
            base = d.shared_base(li, s)
            for seg in segments(cfg):
                for q in range(n):
                    for c in range(seg.chunks):
                        out[:, base + interleaved_offset(seg, q, c, n)] = words[q, :, seg.row0 + c]
        base = d.params_base(li)
        for b in range(B):
            val = 0
            for i, rec in enumerate(dense_records(cfg, lay, b)):
                val |= rec << (32 * i)
            mask = (1 << sv) - 1
            for w in range(d.param_words):
                out[b, base + w] = (val >> (w * sv)) & mask
    return out


# --------------------------------------------------------------------------------------
# LPDDR (:class:`LpddrLayout` and :func:`lpddr_layout` are :mod:`elmoe3d.geometry`'s)


def lpddr_expert_base(cfg, layer: int, expert: int) -> int:
    """Byte address of expert ``expert`` of layer ``layer``."""
    if not (0 <= layer < cfg.layers and 0 <= expert < cfg.experts):
        raise ValueError(f"(layer, expert) = {(layer, expert)!r} outside "
                         f"{cfg.layers} layers x {cfg.experts} experts")
    return cfg.lpddr_base + (layer * cfg.experts + expert) * cfg.expert_bytes


def lpddr_image(cfg, experts, dense=None) -> bytearray:
    """The whole LPDDR window (``lpddr_base`` on, ``total_bytes`` long) as
    bytes: ``experts`` maps ``(layer, expert)`` to its ``(wg, wu, wd)``,
    each written as :func:`expert_image` at :func:`lpddr_expert_base`
    (experts left out stay zero); ``dense`` (``(B, dense_words)`` words, e.g.
    :func:`dense_image`) at ``dense_base``, row by row, bank fastest - the
    order the stream engine's DENSE read fills HB in."""
    lay = lpddr_layout(cfg)
    mem = bytearray(lay.base + lay.total_bytes)
    for (layer, e), w in experts.items():
        a = lpddr_expert_base(cfg, layer, e)
        mem[a:a + cfg.expert_bytes] = expert_image(cfg, *w)
    if dense is not None:
        dense = np.asarray(dense)
        if dense.shape != (cfg.pes, cfg.dense_words):
            raise ValueError(f"dense image shape {dense.shape} is not "
                             f"{(cfg.pes, cfg.dense_words)} (banks, dense words)")
        wb = cfg.slice_vector_bits // 8
        a = lay.dense_base
        for r in range(cfg.dense_words):
            for b in range(cfg.pes):
                mem[a:a + wb] = int(dense[b, r]).to_bytes(wb, "little")
                a += wb
    return mem


def lpddr_word_index(cfg, plane: int, row: int, bank: int) -> int:
    """Index of word ``{plane, row, bank}`` within an expert's LPDDR image
    (times ``slice_vector_bits / 8`` bytes from the expert's base)."""
    if not (0 <= plane < cfg.planes and 0 <= bank < cfg.pes):
        raise ValueError(f"(plane, bank) = {(plane, bank)!r} outside the expert image")
    seg, c = segment_of_row(cfg, row)
    return ((seg.row0 * cfg.planes + plane * seg.chunks + c) * cfg.pes) + bank


def lpddr_plane_runs(cfg, plane_mask: int) -> list[tuple[int, int, Segment, int]]:
    """The contiguous byte runs of an expert image that hold the planes in
    ``plane_mask``, in consumption order: ``(offset, length, segment, plane)``
    (offset from the expert base). Adjacent runs are *not* merged here; a
    reader may merge them. Every byte of the selected planes is in exactly
    one run."""
    n, B, svb = cfg.planes, cfg.pes, cfg.slice_vector_bits // 8
    out = []
    for seg in segments(cfg):
        for q in range(n):
            if (plane_mask >> q) & 1:
                off = (seg.row0 * n + q * seg.chunks) * B * svb
                out.append((off, seg.chunks * B * svb, seg, q))
    return out


# --------------------------------------------------------------------------------------
# images from weights


def slice_words(w_row_chunks: np.ndarray, slice_bits: int) -> np.ndarray:
    """Slice-vector words of INT8 weights grouped ``(..., L)``: returns
    ``(n, ...)`` unsigned integers (object dtype), lane 0 in the low bits."""
    planes = gbs.split(np.asarray(w_row_chunks), slice_bits)        # (n, ..., L)
    L = planes.shape[-1]
    mask = (1 << slice_bits) - 1
    out = np.zeros(planes.shape[:-1], dtype=object)
    for lane in range(L):
        out = out + ((planes[..., lane].astype(np.int64) & mask).astype(object)
                     << (lane * slice_bits))
    return out


def pack_rows(cfg, w: np.ndarray, proj: Proj) -> np.ndarray:
    """``(n, B, rows)`` slice words of one matrix in the row order of its
    segments: ``w`` is ``(R, C)`` INT8 with ``R`` a multiple of ``B`` and ``C``
    of ``L``; bank ``b`` row ``g*(C/L) + c`` holds ``w[g*B+b, c*L:(c+1)*L]``."""
    B, L = cfg.pes, cfg.lanes
    w = np.asarray(w)
    R, C = w.shape
    if R % B or C % L:
        raise ValueError(f"{proj.name} matrix {w.shape} does not cut into {B} PEs x {L} lanes")
    blocks = w.reshape(R // B, B, C // L, L).transpose(1, 0, 2, 3)   # (B, G, chunks, L)
    words = slice_words(blocks, cfg.slice_bits)                      # (n, B, G, chunks)
    return words.reshape(words.shape[0], B, (R // B) * (C // L))


def expert_slice_words(cfg, wg, wu, wd) -> np.ndarray:
    """``(n, B, expert_rows)`` slice words of one expert (rows in
    ``(projection, row group, chunk)`` order)."""
    parts = [pack_rows(cfg, wg, Proj.GATE), pack_rows(cfg, wu, Proj.UP),
             pack_rows(cfg, wd, Proj.DOWN)]
    return np.concatenate(parts, axis=2)


def expert_image(cfg, wg, wu, wd) -> bytes:
    """The LPDDR image (``expert_bytes``) of one expert."""
    words = expert_slice_words(cfg, wg, wu, wd)
    n, B, R = words.shape
    sv = cfg.slice_vector_bits
    flat = [0] * (n * B * R)
    for q in range(n):
        for r in range(R):
            for b in range(B):
                flat[lpddr_word_index(cfg, q, r, b)] = int(words[q, b, r])
    val = 0
    for i, x in enumerate(flat):
        val |= x << (i * sv)
    return val.to_bytes(cfg.expert_bytes, "little")


def hb_slot_image(cfg, wg, wu, wd, group: int = 0) -> np.ndarray:
    """``(B, slot_words)`` words of a slot holding this expert's plane group
    ``group`` (0: the ``k`` MSB planes, 1: the LSB planes), in HB address
    order (:func:`group_offset`; unused words of an LSB slot are 0)."""
    words = expert_slice_words(cfg, wg, wu, wd)
    out = np.zeros((cfg.pes, cfg.slot_words), dtype=object)
    for q in group_planes(cfg, group):
        for r in range(cfg.expert_rows):
            out[:, group_offset(cfg, group, q, r)] = words[q, :, r]
    return out


def weight_beats(cfg, words: np.ndarray, planes, segs=None):
    """The beats a datapath consumes for one expert (or the router with
    ``segs=router_segments(cfg)``): yields ``(segment, plane, chunk,
    [word per bank])`` in consumption order for the planes in ``planes``
    (an iterable of plane indices, increasing). ``words`` is
    ``(n, B, rows)`` from :func:`expert_slice_words` / :func:`pack_rows`."""
    planes = sorted(planes)
    for seg in (segments(cfg) if segs is None else segs):
        for q in planes:
            for c in range(seg.chunks):
                r = seg.row0 + c
                yield seg, q, c, [int(words[q, b, r]) for b in range(words.shape[1])]

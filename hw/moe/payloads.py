"""Named payloads that travel *inside* the batched MoE datapath (between its
components); the boundary types are in :mod:`elmoe3d.hw.vocab`. Each is a
cached ``data.Struct`` constructor of a :class:`~elmoe3d.hw.moe.common.Geom`."""

from __future__ import annotations

from functools import lru_cache

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum

from ...geometry import GATE_FRAC, MULT_BITS, SHIFT_BITS
from ..vocab import PEMode, TokenRole, bits, slice_vector, struct

__all__ = ["Kind", "lane_tag", "desc", "array_beat", "array_result", "seg_params", "logit",
           "topk_result", "gate_row", "rec_cmd", "act_chunk", "job_entry", "job_source", "pass_summary"]


class Kind(enum.Enum, shape=2):
    """What a dot product computes (the projection of its segment)."""
    ROUTER = 0
    GATE = 1
    UP = 2
    DOWN = 3


@lru_cache(maxsize=None)
def lane_tag(g) -> type:
    """``LaneTag``: what one token lane of a beat carries: whether the lane
    has a token in this step (``valid``), its lane-local index (``token``:
    pass position ``token * P + lane``) and whether this expert is the
    token's first (the combine starts) and last (the output is written)."""
    return struct("LaneTag", {"valid": unsigned(1), "token": unsigned(bits(g.Tl)),
                              "first": unsigned(1), "last": unsigned(1)})


@lru_cache(maxsize=None)
def desc(g) -> type:
    """``Desc``: the tag of one ``(segment, step)`` dot product (a step holds
    up to ``P`` tokens, one per lane), from the issue stage through the PE
    array to the vector unit."""
    return struct("Desc", {
        "kind": Kind, "end": unsigned(1), "par": unsigned(1),
        "group": unsigned(bits(max(g.g_router, g.g_in, g.g_down))),
        "expert": unsigned(bits(g.E)), "routed": unsigned(1), "seg_last": unsigned(1),
        "lanes": data.ArrayLayout(lane_tag(g), g.P)})


@lru_cache(maxsize=None)
def array_beat(g) -> type:
    """``ArrayBeat``: one beat for all ``B`` PEs and ``P`` token lanes (the
    lanes' activations; mode, keep and last shared; one slice vector per PE,
    shared by the lanes) and the dot product's tag."""
    return struct("ArrayBeat", {"act": data.ArrayLayout(data.ArrayLayout(signed(8), g.L), g.P),
                                "sv": data.ArrayLayout(slice_vector(g.s, g.L), g.B),
                                "mode": PEMode,
                                "keep": unsigned(g.n.bit_length()), "last": unsigned(1),
                                "desc": desc(g)})


@lru_cache(maxsize=None)
def array_result(g) -> type:
    """``ArrayResult``: the ``P x B`` results of one dot product step (lane
    ``p``, PE ``b``: row ``group * B + b`` for the lane's token) and its tag."""
    return struct("ArrayResult", {"value": data.ArrayLayout(data.ArrayLayout(signed(g.W), g.B),
                                                            g.P),
                                  "error": unsigned(1), "desc": desc(g)})


@lru_cache(maxsize=None)
def seg_params() -> type:
    """``SegParams``: requantisation of one segment row (``mult``/``shift``)
    and, for an UP row, the product requantisation (``mult2``/``shift2``)."""
    return struct("SegParams", {"mult": unsigned(MULT_BITS), "shift": unsigned(SHIFT_BITS),
                                "mult2": unsigned(MULT_BITS),
                                "shift2": unsigned(SHIFT_BITS)})


@lru_cache(maxsize=None)
def logit(g) -> type:
    """``Logit``: one router logit from the vector unit to top-k."""
    return struct("Logit", {"token": unsigned(bits(g.T)), "expert": unsigned(bits(g.E)),
                            "value": signed(g.W), "par": unsigned(1), "last": unsigned(1)})


@lru_cache(maxsize=None)
def topk_result(g) -> type:
    """``TopKResult``: a token's selected experts best first, their logits
    and how many (``count <= k``)."""
    return struct("TopKResult", {"token": unsigned(bits(g.T)), "par": unsigned(1),
                                 "count": unsigned(g.K.bit_length()),
                                 "sel": data.ArrayLayout(unsigned(bits(g.E)), g.K),
                                 "logit": data.ArrayLayout(signed(g.W), g.K)})


@lru_cache(maxsize=None)
def gate_row(g) -> type:
    """``GateRow``: a gate-table row: ``gate[k]`` (Q12) and ``sel[k]``
    (expert) in rank order."""
    return struct("GateRow", {"gate": data.ArrayLayout(unsigned(GATE_FRAC + 1), g.K),
                              "sel": data.ArrayLayout(unsigned(bits(g.E)), g.K)})


@lru_cache(maxsize=None)
def rec_cmd(g) -> data.StructLayout:
    """A record command of the HB reader's record path: ``const`` (pass
    constants) or a job's records, ``skip`` records of the first word,
    ``nrec`` records, buffer ``par``. A layout, not a ``data.Struct``: a
    Struct's ``const`` (its constant constructor) would shadow the field."""
    return data.StructLayout({
        "const": 1, "skip": unsigned(max(1, bits(max(1, g.sv // 32)))),
        "nrec": unsigned(max(g.dense.record_index["per_expert"], g.g_down + 65).bit_length()),
        "par": 1})


def act_chunk(g) -> data.ArrayLayout:
    """One chunk of a token's activations: ``L`` INT8 values (a word of the
    token store's ``x``, the vector unit's ``h`` and ``y``)."""
    return data.ArrayLayout(signed(8), g.L)


@lru_cache(maxsize=None)
def job_entry(g) -> type:
    """``JobEntry``: one job of a pass in the job table (shared or routed
    expert, its tokens, first/last-job masks, token count, steps per
    segment (:func:`elmoe3d.golden.moe_batched.lane_steps`), precision)."""
    return struct("JobEntry", {"shared": unsigned(1),
                               "expert": unsigned(bits(max(g.E, g.S, 2))),
                               "tok_mask": unsigned(g.T), "first_mask": unsigned(g.T),
                               "last_mask": unsigned(g.T), "count": unsigned(g.T.bit_length()),
                               "steps": unsigned(g.T.bit_length()),
                               "precision": TokenRole})


@lru_cache(maxsize=None)
def job_source(g) -> type:
    """``JobSource``: the decision of a job (``hb``, ``slot``, ``lsb_hb``,
    ``lsb_slot``: :class:`~elmoe3d.golden.moe_batched.Source`); shared jobs
    read the dense region (``hb`` = 1)."""
    sb = bits(g.cfg.tag_slots)
    return struct("JobSource", {"hb": unsigned(1), "slot": unsigned(sb),
                                "lsb_hb": unsigned(1), "lsb_slot": unsigned(sb)})


@lru_cache(maxsize=None)
def pass_summary(g) -> type:
    """``PassSummary``: what the output stage needs of a pass once its
    issue ends (token count, step end, tokens with no expert, the LPDDR
    error and counters, final by then). The HB word count and HB error are
    taken later, when the vector unit reports the pass done (the last
    records and constants of a pass may still be arriving when its issue
    ends)."""
    sb = g.cfg.stat_bits
    return struct("PassSummary", {"count": unsigned(g.T.bit_length()), "step_last": unsigned(1),
                                  "zero_mask": unsigned(g.T), "error": unsigned(1),
                                  "start": unsigned(sb),
                                  "ext_beats": unsigned(sb), "mac_beats": unsigned(sb),
                                  "experts": unsigned((g.E + g.S).bit_length()),
                                  "expert_tokens": unsigned((g.T * (g.E + g.S)).bit_length())})

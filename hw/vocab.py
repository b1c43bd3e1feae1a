"""The shared vocabulary of the RTL: shaped enums and named ``data.Struct``
payloads, defined once and used by every block, golden model and testbench.

This module is the one home of every payload type that crosses a block
boundary (a port of a block in the registry, or a port joined between two
blocks: the tile's host streams, the controller's ports, HB's, the stream
engine's, the MoE datapath's) and of the opcodes and codes they carry: each
is one of the ``data.Struct`` types below (a class named after what it
carries) or a shaped enum. Payloads that travel only between the parts of
one block live beside those parts: :mod:`elmoe3d.hw.esd_ctrl_units.payloads`
(between the controller's units), :mod:`elmoe3d.hw.moe.payloads` (between
the MoE datapath's components), ``FillOp`` in :mod:`elmoe3d.hw.hb_bank`
(HB's fill decoder to its fill queue) and the stream engine's stage
payloads in :class:`elmoe3d.hw.ext_stream.ExtGeometry`. Because their sizes depend
on parameters, each type is made by a small cached constructor: the same
parameters always give the *same class*, so two blocks built from one
:class:`~elmoe3d.config.Config` have identical stream signatures and
``wiring.connect`` joins them directly. :func:`vocab` bundles every type for
one Config.

Encodings come from :mod:`elmoe3d.golden.vocab` (the golden side), and the
field words follow one rule: ``plane`` is a plane index (0 = MSB),
``planes`` a count, ``plane_mask`` a bit mask.

Types
-----
``SliceVector``  ``slices[L]`` (``s`` bits each, lane 0 lowest) + ``plane``: one
                 word of one plane of ``L`` consecutive weights of a row.
``PEBeat``       one PE input beat: ``act[L]`` (INT8) with a ``SliceVector``,
                 ``mode``, ``keep`` (planes kept in DRAFT/MSB/LSB), ``last``.
``PEResult``     ``value`` (signed accumulator), ``error``.
``Int8Beat`` / ``BitFusionBeat``  input beats of the PE's baselines (INT8 MAC,
                 Bit-Fusion); their results are ``PEResult`` too.
``HBRead``       a read of ``count`` consecutive words of one HB region
                 (``region``, ``slot``, word ``offset``) for one bank; ``plane``
                 is copied into the beats.
``HBBeat``       one word read from HB: ``sv`` (``SliceVector``), ``last``, ``error``.
``FillBeat``     HB fill beat: ``kind`` (DATA/COMMIT/ABORT), ``region``, ``slot``,
                 word ``offset``, first ``bank``, ``words[fill_words]``.
``ExtCommand``   external-memory command: ``kind``, byte ``addr``, ``plane_mask``
                 (planes to the PE stream), ``fill`` (write the HB planes into
                 ``slot``), ``length`` (words, DENSE only), ``id``.
``ExtBeat``      one AXI beat for the PEs: ``words[fill_words]`` of banks
                 ``bank ..``, ``plane``, ``row``, ``id``, ``last``, ``error``.
``ExtResponse``  ``id``, ``error`` (:class:`ExtErrorCode`), ``resident``, ``slot``.
``FillDone``     HB's report (a strobe) of how a fill ended (``result``).
``HBCommit``     HB's commit strobe (``valid``, ``slot``) for the tag unit.
``KVAccess`` / ``KVResponse`` / ``KVMove``  HB's KV-region port and its
                 boundary-move report.
``TagCommand``   tag-unit command: ``op`` (:class:`TagOpcode`), ``tag``, ``slot``
                 (also the STATS index), ``amount``, ``planes`` (a count),
                 ``slot_mask``.
``TagResponse``  ``op``, ``error`` (:class:`TagErrorCode`), ``hit``, ``pending``,
                 ``slot``, ``planes``, ``evicted``, ``evicted_tag``, ``value``,
                 ``slot_mask``.
``SlotStrobe``   (a ``wiring.Signature``, not a payload) ``valid`` + ``slot``: HB's
                 commit strobe into the tag unit (no back-pressure).

``BitSerialBeat`` / ``BitSerialResult``  the bit-serial MAC baseline's input
                 beat (``act[L]``, ``digits[L]``, ``msd``, ``lsd``, ``last``) and
                 result (``value``, ``error``).

Host and controller ports (the Elastic-SD controller, the token feed, the tile):

``HostCommand``  ``op`` (:class:`HostOp`), ``phase``, ``step``, ``layer``, ``value``
                 (ROUND's is a ``RoundValue``).
``RoundValue``   ROUND's ``value`` read as ``{batch, force}``
                 (:class:`ForceCode`) and the bits that must be 0.
``HostResponse`` ``op``, ``error`` (``HostError``), ``mode``, ``k``, ``value``.
``StepInfo``     the controller's layer step for the token feed: ``phase``,
                 ``layer``, ``mask`` (eligible experts), ``tokens``.
``KVRequest``    the controller asks HB to move the KV boundary to ``kv_words``.
``FillReport``   (type name ``FillDone``) HB's ``FillDone`` of an expert fill as the
                 controller takes it: ``slot``, ``ok`` (committed).
``HostToken``    one token vector ``x[H]`` INT8 from the host to the token feed.
``TileCommand``  the tile's host command: ``HostCommand``'s fields (``op`` a
                 :class:`TileOp`) and ``x[H]`` (TOKEN).
``TileResponse`` ``kind`` (:class:`TileRspKind`), ``rsp`` (``HostResponse``),
                 ``out`` (``MoEOutput``).

``TraceEvent``    one control event of the Elastic-SD controller (``kind``,
                 ``phase``, ``step``, ``layer``, ``pass_no``, ``expert``, ``slot``,
                 ``tag``, ``code``, ``value``; ``golden/esd.py`` defines them).

Block-specific payloads (the tag unit's commands, the datapath's token
batches, the controller's trace events) live in this module too, in the
section of their block.

Batched MoE datapath (``hw/moe/``, ``docs/blocks/moe_layer.md``):

``MoEToken``     one token of a step: ``x[H]`` INT8, ``role`` (:class:`TokenRole`),
                 ``mask[E]`` (allowed experts, DRAFT), ``layer``, ``last`` (ends the step).
``ExpertNeed``   the datapath announces an expert of a pass: ``layer``, ``expert``,
                 ``tokens`` (how many tokens of the pass use it), ``precision``,
                 ``last`` (the pass's last one), ``none`` (a pass without routed experts).
``ExpertSource`` the controller's decision for it: ``hb`` (planes ``0..k-1`` from
                 HB ``slot``; split if the precision needs all planes) or LPDDR.
``MoEOutput``    ``y[H]`` INT8 of one token, ``error``, ``last``.
``PassStats``    per-pass counters: ``cycles``, ``hb_words``, ``ext_beats``,
                 ``mac_beats``, ``experts``, ``expert_tokens``, ``tokens``, ``error``.
"""

from __future__ import annotations

from functools import lru_cache

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import Out

from ..geometry import acc_width, bits, tag_slot_bits, tag_unit_params, tag_value_bits
from ..golden import bitfusion as gbf
from ..golden import esd as gesd
from ..golden import vocab as gv
from ..golden import tag_unit as gtu
from ..golden.moe_batched import Role as _Role

__all__ = ["PEMode", "BitFusionMode", "FillBeatKind", "HBRegionKind", "FillResultCode", "ExtKindCode",
           "ExtErrorCode", "TagOpcode", "TagErrorCode", "bits", "struct", "slice_vector",
           "pe_beat", "pe_result", "int8_beat", "bitfusion_beat", "hb_read", "hb_beat",
           "fill_beat", "fill_done", "hb_commit", "ext_command", "ext_beat", "ext_response",
           "kv_access", "kv_response", "kv_move", "tag_command", "tag_response", "slot_strobe",
           "bitserial_beat", "bitserial_result",
           "TraceEventKind", "TracePhase", "trace_event",
           "HostOp", "ForceCode", "VALUE_BITS", "RoundValue", "host_command", "host_response",
           "verify_tokens_max", "step_info", "kv_request", "fill_report", "host_token",
           "TileOp", "TileRspKind", "TileError", "tile_command", "tile_response",
           "TokenRole", "moe_token", "expert_need", "expert_source", "moe_output", "pass_stats",
           "Vocab", "vocab"]


def struct(name: str, fields: dict) -> type:
    """A named ``data.Struct`` subclass with ``fields`` (in order, first field
    in the low bits). Use through the cached constructors below."""
    return type(name, (data.Struct,), {"__annotations__": dict(fields),
                                       "__module__": __name__, "__qualname__": name})


# -- shaped enums ----------------------------------------------------------------------

class PEMode(enum.Enum, shape=2):
    """PE precision mode (values of :class:`elmoe3d.golden.bitslice.Mode`)."""
    FULL = int(gv.PEMode.FULL)
    DRAFT = int(gv.PEMode.DRAFT)
    MSB = int(gv.PEMode.MSB)
    LSB = int(gv.PEMode.LSB)


class FillBeatKind(enum.Enum, shape=2):
    DATA = int(gv.FillKind.DATA)
    COMMIT = int(gv.FillKind.COMMIT)
    ABORT = int(gv.FillKind.ABORT)


class HBRegionKind(enum.Enum, shape=1):
    EXPERT = int(gv.HBRegion.EXPERT)
    DENSE = int(gv.HBRegion.DENSE)


class FillResultCode(enum.Enum, shape=3):
    """How HB ended a fill (values of :class:`elmoe3d.golden.vocab.FillResult`)."""
    COMMITTED = int(gv.FillResult.COMMITTED)
    ABORTED = int(gv.FillResult.ABORTED)
    MALFORMED = int(gv.FillResult.MALFORMED)
    BUSY = int(gv.FillResult.BUSY)
    COVERED = int(gv.FillResult.COVERED)
    STRAY = int(gv.FillResult.STRAY)


class ExtKindCode(enum.Enum, shape=1):
    EXPERT = int(gv.ExtKind.EXPERT)
    DENSE = int(gv.ExtKind.DENSE)


class ExtErrorCode(enum.Enum, shape=3):
    OK = int(gv.ExtError.OK)
    SLVERR = int(gv.ExtError.SLVERR)
    DECERR = int(gv.ExtError.DECERR)
    PROTOCOL = int(gv.ExtError.PROTOCOL)
    RANGE = int(gv.ExtError.RANGE)


# -- slice data --------------------------------------------------------------------------

@lru_cache(maxsize=None)
def slice_vector(slice_bits: int, lanes: int) -> type:
    """``SliceVector``: ``slices[L]`` of ``s`` bits (lane 0 lowest) and ``plane``."""
    n = 8 // slice_bits
    return struct("SliceVector", {"slices": data.ArrayLayout(unsigned(slice_bits), lanes),
                                  "plane": unsigned(bits(n))})


@lru_cache(maxsize=None)
def pe_beat(slice_bits: int, lanes: int, tokens: int = 1) -> type:
    """``PEBeat``: ``act[L]`` INT8 (``act[P][L]`` for a token-parallel PE of
    ``P = tokens`` token lanes: one activation vector per token), ``sv``,
    ``mode``, ``keep``, ``last``."""
    n = 8 // slice_bits
    act = data.ArrayLayout(signed(8), lanes)
    return struct("PEBeat", {"act": act if tokens == 1 else data.ArrayLayout(act, tokens),
                             "sv": slice_vector(slice_bits, lanes),
                             "mode": PEMode, "keep": unsigned(n.bit_length()),
                             "last": unsigned(1)})


@lru_cache(maxsize=None)
def pe_result(max_len: int, lanes: int, tokens: int = 1) -> type:
    """``PEResult``: ``value`` (signed, ``acc_width(max_len, L)`` bits: holds
    every dot product a PE with ``L`` lanes accepts; ``value[P]`` for a
    token-parallel PE), ``error``."""
    v = signed(acc_width(max_len, lanes))
    return struct("PEResult", {"value": v if tokens == 1 else data.ArrayLayout(v, tokens),
                               "error": unsigned(1)})


# -- PE-family baselines (not in the tile; compared with the PE) ------------------------

class BitFusionMode(enum.Enum, shape=1):
    """Bit-Fusion baseline weight mode (values of :mod:`elmoe3d.golden.bitfusion`)."""
    W8 = int(gbf.Mode.W8)      # one INT8 weight per lane
    W4 = int(gbf.Mode.W4)      # two INT4 weights per lane (a separate low-precision copy)


@lru_cache(maxsize=None)
def int8_beat(lanes: int) -> type:
    """``Int8Beat`` (INT8 MAC baseline): ``act[L]``, ``weight[L]`` (INT8), ``last``."""
    return struct("Int8Beat", {"act": data.ArrayLayout(signed(8), lanes),
                               "weight": data.ArrayLayout(signed(8), lanes),
                               "last": unsigned(1)})


@lru_cache(maxsize=None)
def bitfusion_beat(lanes: int) -> type:
    """``BitFusionBeat`` (Bit-Fusion baseline): ``act[2L]`` (INT8; W8 uses the
    first ``L``), ``weight[L]`` bytes (W8: one INT8; W4: two INT4, low nibble
    for ``act[2j]``), ``mode``, ``last``."""
    return struct("BitFusionBeat", {"act": data.ArrayLayout(signed(8), 2 * lanes),
                                    "weight": data.ArrayLayout(unsigned(8), lanes),
                                    "mode": BitFusionMode, "last": unsigned(1)})


@lru_cache(maxsize=None)
def bitserial_beat(lanes: int, digit_bits: int) -> type:
    """``BitSerialBeat`` (bit-serial MAC baseline): ``act[L]`` (INT8),
    ``digits[L]`` (``b`` bits each, lane 0 lowest), ``msd`` (first, most
    significant and signed digit of a weight group), ``lsd`` (its last
    digit), ``last`` (closes the dot product; only on an ``lsd`` beat)."""
    return struct("BitSerialBeat", {"act": data.ArrayLayout(signed(8), lanes),
                                    "digits": data.ArrayLayout(unsigned(digit_bits), lanes),
                                    "msd": unsigned(1), "lsd": unsigned(1), "last": unsigned(1)})


@lru_cache(maxsize=None)
def bitserial_result(acc_width: int) -> type:
    """``BitSerialResult``: ``value`` (signed, ``acc_width`` bits), ``error``."""
    return struct("BitSerialResult", {"value": signed(acc_width), "error": unsigned(1)})


# -- HB ----------------------------------------------------------------------------------
# (owned by the HB bank controller, hw/hb_bank.py; rules in golden/hb_map.py)

def _offset_bits(slot_words: int, dense_words: int) -> int:
    return bits(max(slot_words, dense_words, 2))


@lru_cache(maxsize=None)
def hb_read(slots: int, slot_words: int, dense_words: int, planes: int) -> type:
    """``HBRead``: ``count`` words (1 .. region size) from word ``offset`` of
    ``region`` (an expert ``slot``, or the dense region), for one bank.
    ``plane`` (an index of the ``planes`` planes) is copied into every beat's
    ``SliceVector``: HB stores slice bits only and does not decode the
    segment-interleaved slot layout, so a reader that wants per-beat plane
    indices reads one ``(segment, plane)`` run per command (with ``k = 1`` a
    whole slot is one plane)."""
    ob = _offset_bits(slot_words, dense_words)
    return struct("HBRead", {"region": HBRegionKind, "slot": unsigned(bits(slots)),
                             "offset": unsigned(ob),
                             "count": unsigned((max(slot_words, dense_words)).bit_length()),
                             "plane": unsigned(bits(planes))})


@lru_cache(maxsize=None)
def hb_beat(slice_bits: int, lanes: int) -> type:
    """``HBBeat``: one word to the paired PE. A refused read is one beat with
    ``last`` and ``error`` (and zero ``sv``)."""
    return struct("HBBeat", {"sv": slice_vector(slice_bits, lanes), "last": unsigned(1),
                             "error": unsigned(1)})


@lru_cache(maxsize=None)
def fill_beat(sv_bits: int, fill_words: int, slots: int, slot_words: int, dense_words: int,
              banks: int) -> type:
    """``FillBeat``: ``fill_words`` words for banks ``bank .. bank+fill_words-1``
    at word ``offset`` of ``region`` (DATA), or the end of a fill (COMMIT /
    ABORT; their ``region``/``slot`` name the fill they end)."""
    return struct("FillBeat", {"kind": FillBeatKind, "region": HBRegionKind,
                               "slot": unsigned(bits(slots)),
                               "offset": unsigned(_offset_bits(slot_words, dense_words)),
                               "bank": unsigned(bits(banks)),
                               "words": data.ArrayLayout(unsigned(sv_bits), fill_words)})


@lru_cache(maxsize=None)
def fill_done(slots: int) -> type:
    """``FillDone``: a strobe (``valid`` for one cycle, no ``ready``) saying how
    one fill ended (``result``, :class:`FillResultCode`), shown by HB in the
    cycle the fill's COMMIT/ABORT takes effect."""
    return struct("FillDone", {"valid": unsigned(1), "region": HBRegionKind,
                               "slot": unsigned(bits(slots)), "result": FillResultCode})


@lru_cache(maxsize=None)
def hb_commit(slots: int) -> type:
    """``HBCommit``: a strobe (``valid`` for one cycle) naming the slot whose
    fill commits; ``slot_valid`` rises at the end of that cycle (the tag
    unit's commit input: PENDING becomes RESIDENT on the same edge)."""
    return struct("HBCommit", {"valid": unsigned(1), "slot": unsigned(bits(slots))})


@lru_cache(maxsize=None)
def kv_access(sv_bits: int, banks: int, words: int) -> type:
    """``KVAccess``: one KV-region word of one bank (``addr`` is the bank word
    address; the KV region is the top ``kv_words`` words)."""
    return struct("KVAccess", {"write": unsigned(1), "bank": unsigned(bits(banks)),
                               "addr": unsigned(bits(words)), "data": unsigned(sv_bits)})


@lru_cache(maxsize=None)
def kv_response(sv_bits: int) -> type:
    return struct("KVResponse", {"data": unsigned(sv_bits), "error": unsigned(1)})


@lru_cache(maxsize=None)
def kv_move(words: int, slots: int) -> type:
    """``KVMove``: the report of a KV boundary move: the new KV size, the
    slots it newly covers, which of those were resident, and ``error`` for a
    refused move (a size beyond the KV limit; nothing changed)."""
    return struct("KVMove", {"kv_words": unsigned(words.bit_length()),
                             "covered": unsigned(slots), "invalidated": unsigned(slots),
                             "error": unsigned(1)})


# -- external memory ----------------------------------------------------------------------

@lru_cache(maxsize=None)
def ext_command(addr_bits: int, planes: int, slots: int, dense_words: int, id_bits: int) -> type:
    return struct("ExtCommand", {"kind": ExtKindCode, "addr": unsigned(addr_bits),
                                 "plane_mask": unsigned(planes), "fill": unsigned(1),
                                 "slot": unsigned(bits(slots)),
                                 "length": unsigned(max(2, dense_words).bit_length()),
                                 "id": unsigned(id_bits)})


@lru_cache(maxsize=None)
def ext_beat(sv_bits: int, fill_words: int, planes: int, rows: int, banks: int,
             id_bits: int) -> type:
    return struct("ExtBeat", {"words": data.ArrayLayout(unsigned(sv_bits), fill_words),
                              "plane": unsigned(bits(planes)), "row": unsigned(bits(rows)),
                              "bank": unsigned(bits(banks)), "id": unsigned(id_bits),
                              "last": unsigned(1), "error": unsigned(1)})


@lru_cache(maxsize=None)
def ext_response(slots: int, id_bits: int) -> type:
    return struct("ExtResponse", {"id": unsigned(id_bits), "error": ExtErrorCode,
                                  "resident": unsigned(1), "slot": unsigned(bits(slots))})


# -- Elastic-SD controller: trace events -------------------------------------------------

class TraceEventKind(enum.Enum, shape=5):
    """Kind of a control event (values of :class:`elmoe3d.golden.esd.EventKind`)."""
    MODE = int(gesd.EventKind.MODE)
    PASS = int(gesd.EventKind.PASS)
    ELIGIBLE = int(gesd.EventKind.ELIGIBLE)
    LOOKUP = int(gesd.EventKind.LOOKUP)
    ALLOCATE = int(gesd.EventKind.ALLOCATE)
    FILL_START = int(gesd.EventKind.FILL_START)
    SOURCE = int(gesd.EventKind.SOURCE)
    TOUCH = int(gesd.EventKind.TOUCH)
    EXT_ERROR = int(gesd.EventKind.EXT_ERROR)
    FILL_END = int(gesd.EventKind.FILL_END)
    UNPIN = int(gesd.EventKind.UNPIN)
    INVALIDATE = int(gesd.EventKind.INVALIDATE)
    LAYER_DONE = int(gesd.EventKind.LAYER_DONE)
    DECAY = int(gesd.EventKind.DECAY)
    ACCEPT = int(gesd.EventKind.ACCEPT)
    ROLLBACK = int(gesd.EventKind.ROLLBACK)
    DRAFT_LEN = int(gesd.EventKind.DRAFT_LEN)
    KV_MOVE = int(gesd.EventKind.KV_MOVE)


class TracePhase(enum.Enum, shape=2):
    """Decode phase of an event (values of :class:`elmoe3d.golden.esd.Phase`)."""
    IDLE = int(gesd.Phase.IDLE)
    AR = int(gesd.Phase.AR)
    DRAFT = int(gesd.Phase.DRAFT)
    VERIFY = int(gesd.Phase.VERIFY)


#: Width of a TraceEvent's pass index (passes of one layer step).
TRACE_PASS_BITS = 8
#: Width of a TraceEvent's small result code (the golden enums fit 4 bits).
TRACE_CODE_BITS = 4


def trace_value_bits(slots: int, experts: int, hb_words: int, planes: int) -> int:
    """Width of ``TraceEvent.value``: a count (32 bits), an eligible-expert
    mask (``E``), a KV size in words, or two plane masks (``2 n``)."""
    return max(32, experts, hb_words.bit_length(), 2 * planes, slots)


@lru_cache(maxsize=None)
def trace_event(layer_bits: int, expert_bits: int, slots: int, draft_len_max: int,
                experts: int, hb_words: int, planes: int) -> type:
    """``TraceEvent``: one control event of the Elastic-SD controller
    (``golden/esd.py`` says what every kind carries; unused fields are 0).

    Fields: ``kind``, ``phase``, ``step`` (draft step), ``layer``, ``pass_no``
    (pass of the layer step), ``expert``, ``slot``, ``tag`` (an evicted tag,
    the mode reason, or the usable slots after a KV move), ``code`` (a small
    result code), ``value`` (a count, a mask or a size)."""
    tag_bits = layer_bits + expert_bits
    return struct("TraceEvent", {
        "kind": TraceEventKind, "phase": TracePhase,
        "step": unsigned(max(1, draft_len_max.bit_length())),
        "layer": unsigned(layer_bits), "pass_no": unsigned(TRACE_PASS_BITS),
        "expert": unsigned(expert_bits), "slot": unsigned(bits(slots)),
        "tag": unsigned(max(tag_bits, bits(slots + 1))), "code": unsigned(TRACE_CODE_BITS),
        "value": unsigned(trace_value_bits(slots, experts, hb_words, planes))})


# -- host and controller ports (Elastic-SD controller, token feed, tile) -------------------

class HostOp(enum.IntEnum, shape=3):
    """``HostCommand.op`` / ``HostResponse.op``: the controller's host commands."""
    ROUND = 0         #: open a decode round (``value``: a :class:`RoundValue`)
    STEP = 1          #: run one layer step (``phase``, ``step``, ``layer``)
    ACCEPT = 2        #: close an SD round (``value``: accepted drafted tokens)
    CONTEXT = 3       #: the context length (``value``: tokens; moves the KV boundary)
    COUNTER = 4       #: read a statistics counter (``value``: its index)


class ForceCode(enum.IntEnum, shape=3):
    """``RoundValue.force`` (values of :class:`elmoe3d.golden.esd.ForceCode`;
    4..7 are refused)."""
    AUTO = int(gesd.ForceCode.AUTO)
    AR = int(gesd.ForceCode.AR)
    SD = int(gesd.ForceCode.SD)
    AR_NO_HB_CACHE = int(gesd.ForceCode.AR_NO_HB_CACHE)


#: Width of ``HostCommand.value`` (a count, a ``RoundValue``, a counter index).
VALUE_BITS = 32


#: ``RoundValue``: ROUND's ``HostCommand.value``: ``batch`` (1 .. ``MAX_BATCH``),
#: ``force`` (:class:`ForceCode`) and ``zero`` (must be 0). Read it as
#: ``RoundValue(cmd.value)``; the host writes ``batch | force << 8``.
RoundValue = struct("RoundValue", {"batch": unsigned(8), "force": ForceCode,
                                   "zero": unsigned(VALUE_BITS - 11)})


@lru_cache(maxsize=None)
def host_command(layer_bits: int, draft_len_max: int) -> type:
    """``HostCommand``: ``op`` (:class:`HostOp`), ``phase``, ``step``,
    ``layer`` (STEP), ``value`` (ROUND: a :class:`RoundValue`; ACCEPT:
    accepted tokens; CONTEXT: context tokens; COUNTER: counter index)."""
    return struct("HostCommand", {"op": HostOp, "phase": unsigned(2),
                                  "step": unsigned(max(1, draft_len_max.bit_length())),
                                  "layer": unsigned(layer_bits),
                                  "value": unsigned(VALUE_BITS)})


@lru_cache(maxsize=None)
def host_response(draft_len_max: int, stat_bits: int) -> type:
    """``HostResponse``: ``op`` of the command, ``error`` (``HostError``),
    ``mode`` and ``k`` of the open round, ``value``."""
    return struct("HostResponse", {"op": HostOp, "error": unsigned(3),
                                   "mode": unsigned(1),
                                   "k": unsigned(draft_len_max.bit_length() + 1),
                                   "value": unsigned(max(VALUE_BITS, stat_bits))})


def verify_tokens_max(cfg) -> int:
    """Most tokens of one layer step: a VERIFY step of the largest batch."""
    return gesd.MAX_BATCH * (cfg.draft_len_max + 1)


@lru_cache(maxsize=None)
def step_info(layer_bits: int, experts: int, tokens_max: int) -> type:
    """``StepInfo``: an admitted layer step for the token feed: ``phase``,
    ``layer``, ``mask`` (experts eligible in DRAFT), ``tokens`` (1 .. ``tokens_max``)."""
    return struct("StepInfo", {"phase": unsigned(2), "layer": unsigned(layer_bits),
                               "mask": unsigned(experts),
                               "tokens": unsigned(tokens_max.bit_length())})


@lru_cache(maxsize=None)
def kv_request(hb_words: int) -> type:
    """``KVRequest``: move HB's KV boundary to ``kv_words`` words per bank."""
    return struct("KVRequest", {"kv_words": unsigned(hb_words.bit_length())})


@lru_cache(maxsize=None)
def fill_report(slots: int) -> type:
    """``FillDone`` as the controller takes it (a stream): the expert fill
    of ``slot`` ended, ``ok`` = committed. The tile reduces HB's
    :func:`fill_done` strobe to it (expert region only)."""
    return struct("FillDone", {"slot": unsigned(bits(slots)), "ok": unsigned(1)})


@lru_cache(maxsize=None)
def host_token(hidden: int) -> type:
    """``HostToken``: one token vector ``x[H]`` INT8 from the host."""
    return struct("HostToken", {"x": data.ArrayLayout(signed(8), hidden)})


class TileOp(enum.IntEnum, shape=3):
    """``TileCommand.op``. ROUND .. COUNTER are the controller's
    (:class:`HostOp`, same values), forwarded to it."""
    ROUND = int(HostOp.ROUND)
    STEP = int(HostOp.STEP)
    ACCEPT = int(HostOp.ACCEPT)
    CONTEXT = int(HostOp.CONTEXT)
    COUNTER = int(HostOp.COUNTER)
    TOKEN = 5                #: one token vector ``x`` of the running step
    LOAD_DENSE = 6           #: fill HB's dense region from the LPDDR dense image


class TileRspKind(enum.Enum, shape=2):
    """``TileResponse.kind``: which field carries the answer."""
    CTRL = 0                 #: ``rsp``: the controller's ``HostResponse``
    OUTPUT = 1               #: ``out``: one layer output (``MoEOutput``)
    TILE = 2                 #: ``rsp``: the tile's own answer (LOAD_DENSE, a refusal)


class TileError(enum.IntEnum):
    """``rsp.error`` of a TILE response."""
    OK = 0
    BUSY = 1                 #: LOAD_DENSE while the controller has a command in hand
    LOAD_FAILED = 2          #: the dense load ended with an LPDDR error or not committed
    BAD_OP = 3               #: an opcode the tile does not know (7)


@lru_cache(maxsize=None)
def _tile_types(cfg) -> tuple:
    hc = host_command(cfg.layer_bits, cfg.draft_len_max)
    hr = host_response(cfg.draft_len_max, cfg.stat_bits)
    cmd = struct("TileCommand", {
        **{name: (TileOp if name == "op" else f.shape) for name, f in data.Layout.cast(hc)},
        "x": data.Layout.cast(host_token(cfg.hidden))["x"].shape})
    rsp = struct("TileResponse", {"kind": TileRspKind, "rsp": hr, "out": vocab(cfg).MoEOutput})
    return cmd, rsp


def tile_command(cfg) -> type:
    """``TileCommand``: the controller's ``HostCommand`` fields (``op`` a
    :class:`TileOp`) and ``x[H]`` INT8 (TOKEN only)."""
    return _tile_types(cfg)[0]


def tile_response(cfg) -> type:
    """``TileResponse``: ``kind`` (:class:`TileRspKind`), ``rsp``
    (``HostResponse``: CTRL and TILE), ``out`` (``MoEOutput``: OUTPUT)."""
    return _tile_types(cfg)[1]


# -- batched MoE datapath -----------------------------------------------------------------

class TokenRole(enum.Enum, shape=2):
    """Precision role of a token (values of :class:`elmoe3d.golden.moe_batched.Role`)."""
    FULL = int(_Role.FULL)
    DRAFT = int(_Role.DRAFT)
    VERIFY = int(_Role.VERIFY)


@lru_cache(maxsize=None)
def moe_token(hidden: int, experts: int, layer_bits: int) -> type:
    """``MoEToken``: ``x[H]`` INT8 (element 0 lowest), ``role``, ``mask[E]``,
    ``layer``, ``last`` (the last token of a step)."""
    return struct("MoEToken", {"x": data.ArrayLayout(signed(8), hidden), "role": TokenRole,
                               "mask": unsigned(experts), "layer": unsigned(layer_bits),
                               "last": unsigned(1)})


@lru_cache(maxsize=None)
def expert_need(layer_bits: int, expert_bits: int, tokens: int) -> type:
    """``ExpertNeed``: ``{layer, expert}``, ``tokens`` (1 .. T) of the pass
    routed to it, ``precision`` (DRAFT: planes ``0..k-1``; FULL/VERIFY: all),
    ``last`` (the pass's last announcement), ``none`` (the one beat of a pass
    that routes no expert: ``last`` = 1, ``layer`` = the pass's layer, no
    decision follows; ``expert``, ``tokens`` and ``precision`` are 0)."""
    return struct("ExpertNeed", {"layer": unsigned(layer_bits), "expert": unsigned(expert_bits),
                                 "tokens": unsigned(tokens.bit_length()),
                                 "precision": TokenRole, "last": unsigned(1),
                                 "none": unsigned(1)})


@lru_cache(maxsize=None)
def prefetch_candidate(expert_bits: int, tokens: int, experts: int) -> type:
    """``PrefetchCandidate``: one prefetch candidate of a DRAFT pass (the
    datapath's contract with the controller's prefetcher,
    :func:`elmoe3d.golden.esd.prefetch_candidates`), in announce order:
    ``expert``, ``tokens`` (1 .. T: the pass's tokens whose best-ranked
    non-eligible expert of the unrestricted top-k it is), ``count`` (the
    pass's distinct candidates, the same on every beat), ``last``, or the
    one ``none`` beat of a pass without candidates (``last`` = 1)."""
    return struct("PrefetchCandidate", {
        "expert": unsigned(expert_bits), "tokens": unsigned(tokens.bit_length()),
        "count": unsigned(min(experts, tokens).bit_length()), "last": unsigned(1),
        "none": unsigned(1)})


@lru_cache(maxsize=None)
def expert_source(slots: int) -> type:
    """``ExpertSource``: ``hb`` = 1: planes ``0..k-1`` from HB ``slot``, the
    others (if needed) from HB ``lsb_slot`` when ``lsb_hb`` = 1 (the slot
    holding the expert's LSB plane group: whole-resident, nothing from
    LPDDR), else from LPDDR (split); ``hb`` = 0: every needed plane from
    LPDDR (``lsb_hb`` must be 0)."""
    return struct("ExpertSource", {"hb": unsigned(1), "slot": unsigned(bits(slots)),
                                   "lsb_hb": unsigned(1), "lsb_slot": unsigned(bits(slots))})


@lru_cache(maxsize=None)
def moe_output(hidden: int) -> type:
    """``MoEOutput``: ``y[H]`` INT8, ``error`` (the pass lost data), ``last``."""
    return struct("MoEOutput", {"y": data.ArrayLayout(signed(8), hidden), "error": unsigned(1),
                                "last": unsigned(1)})


@lru_cache(maxsize=None)
def pass_stats(stat_bits: int, tokens: int, experts: int) -> type:
    """``PassStats``: counters of one pass (see ``docs/blocks/moe_layer.md``)."""
    return struct("PassStats", {"cycles": unsigned(stat_bits), "hb_words": unsigned(stat_bits),
                                "ext_beats": unsigned(stat_bits),
                                "mac_beats": unsigned(stat_bits),
                                "experts": unsigned(experts.bit_length()),
                                "expert_tokens": unsigned((tokens * experts).bit_length()),
                                "tokens": unsigned(tokens.bit_length()),
                                "error": unsigned(1)})


# -- tag unit --------------------------------------------------------------------------

class TagOpcode(enum.Enum, shape=gtu.OP_BITS):
    """Tag-unit opcode; values equal :class:`elmoe3d.golden.tag_unit.TagOp`."""
    LOOKUP = int(gtu.TagOp.LOOKUP)
    TOUCH = int(gtu.TagOp.TOUCH)
    DECAY = int(gtu.TagOp.DECAY)
    ALLOCATE = int(gtu.TagOp.ALLOCATE)
    INVALIDATE = int(gtu.TagOp.INVALIDATE)
    PIN = int(gtu.TagOp.PIN)
    UNPIN = int(gtu.TagOp.UNPIN)
    RESET = int(gtu.TagOp.RESET)
    STATS = int(gtu.TagOp.STATS)
    LOOKUP_PIN = int(gtu.TagOp.LOOKUP_PIN)
    INVALIDATE_SLOT = int(gtu.TagOp.INVALIDATE_SLOT)
    INVALIDATE_MASK = int(gtu.TagOp.INVALIDATE_MASK)
    ABORT = int(gtu.TagOp.ABORT)


class TagErrorCode(enum.Enum, shape=gtu.ERROR_BITS):
    """Response error code; values equal :class:`elmoe3d.golden.tag_unit.TagError`."""
    OK = int(gtu.TagError.OK)
    BAD_OP = int(gtu.TagError.BAD_OP)
    BAD_SLOT = int(gtu.TagError.BAD_SLOT)
    RESIDENT = int(gtu.TagError.RESIDENT)
    NO_VICTIM = int(gtu.TagError.NO_VICTIM)
    NOT_VALID = int(gtu.TagError.NOT_VALID)
    NOT_PINNED = int(gtu.TagError.NOT_PINNED)
    PIN_LIMIT = int(gtu.TagError.PIN_LIMIT)
    PINNED = int(gtu.TagError.PINNED)
    NOT_PENDING = int(gtu.TagError.NOT_PENDING)
    PENDING = int(gtu.TagError.PENDING)


@lru_cache(maxsize=None)
def tag_command(slots: int, tag_bits: int, hot_bits: int, plane_bits: int) -> type:
    """``TagCommand``: ``op``, ``tag`` (``{layer, expert}``), ``slot`` (PIN, UNPIN,
    ABORT, INVALIDATE_SLOT; the counter index of STATS), ``amount`` (TOUCH
    increment, ALLOCATE initial hotness), ``planes`` (ALLOCATE: planes HB
    will hold, a count), ``slot_mask`` (INVALIDATE_MASK)."""
    return struct("TagCommand", {"op": TagOpcode, "tag": unsigned(tag_bits),
                                 "slot": unsigned(tag_slot_bits(slots)),
                                 "amount": unsigned(hot_bits), "planes": unsigned(plane_bits),
                                 "slot_mask": unsigned(slots)})


@lru_cache(maxsize=None)
def tag_response(slots: int, tag_bits: int, plane_bits: int, value_bits: int) -> type:
    """``TagResponse``: see :data:`elmoe3d.golden.tag_unit.RESPONSE_FIELDS`."""
    return struct("TagResponse", {"op": TagOpcode, "error": TagErrorCode,
                                  "hit": unsigned(1), "pending": unsigned(1),
                                  "slot": unsigned(tag_slot_bits(slots)),
                                  "planes": unsigned(plane_bits), "evicted": unsigned(1),
                                  "evicted_tag": unsigned(tag_bits),
                                  "value": unsigned(value_bits), "slot_mask": unsigned(slots)})


@lru_cache(maxsize=None)
def slot_strobe(slots: int) -> wiring.Signature:
    """``SlotStrobe``: ``valid`` and ``slot`` (a slot index), driven by the
    producer, no ``ready``: an event the consumer must take in the cycle it
    is valid (HB's commit strobe into the tag unit)."""
    return wiring.Signature({"valid": Out(1), "slot": Out(unsigned(bits(slots)))})


# -- one Config, every type ---------------------------------------------------------------

#: Width of the command id carried by ExtCommand / ExtBeat / ExtResponse.
CMD_ID_BITS = 4


class Vocab:
    """Every payload type for one :class:`~elmoe3d.config.Config` (attributes
    named after the types). Build with :func:`vocab` (cached)."""

    def __init__(self, cfg):
        self.cfg = cfg
        s, L, B = cfg.slice_bits, cfg.lanes, cfg.pes
        sv, fw = cfg.slice_vector_bits, cfg.fill_words
        S, SW, D = cfg.tag_slots, cfg.slot_words, cfg.dense_words
        self.SliceVector = slice_vector(s, L)
        self.PEBeat = pe_beat(s, L)
        self.PEResult = pe_result(cfg.max_len, L)
        self.HBRead = hb_read(S, SW, D, cfg.planes)
        self.HBBeat = hb_beat(s, L)
        self.FillBeat = fill_beat(sv, fw, S, SW, D, B)
        self.FillDone = fill_done(S)
        self.HBCommit = hb_commit(S)
        self.KVAccess = kv_access(sv, B, cfg.hb_words)
        self.KVResponse = kv_response(sv)
        self.KVMove = kv_move(cfg.hb_words, S)
        self.ExtCommand = ext_command(cfg.axi_addr_bits, cfg.planes, S, D, CMD_ID_BITS)
        self.ExtBeat = ext_beat(sv, fw, cfg.planes, cfg.expert_rows, B, CMD_ID_BITS)
        self.ExtResponse = ext_response(S, CMD_ID_BITS)
        self.TraceEvent = trace_event(cfg.layer_bits, cfg.expert_bits, S, cfg.draft_len_max,
                                      cfg.experts, cfg.hb_words, cfg.planes)
        T, E = cfg.batch_tokens, cfg.experts
        self.MoEToken = moe_token(cfg.hidden, E, cfg.layer_bits)
        self.ExpertNeed = expert_need(cfg.layer_bits, cfg.expert_bits, T)
        self.PrefetchCandidate = prefetch_candidate(cfg.expert_bits, T, E)
        self.ExpertSource = expert_source(S)
        self.MoEOutput = moe_output(cfg.hidden)
        self.PassStats = pass_stats(cfg.stat_bits, T, E + cfg.shared_experts)
        tp = tag_unit_params(cfg)
        self.TagCommand = tag_command(S, cfg.tag_bits, cfg.hot_bits, tp["plane_bits"])
        self.TagResponse = tag_response(S, cfg.tag_bits, tp["plane_bits"],
                                        tag_value_bits(cfg.hot_bits, cfg.stat_bits, cfg.pin_bits))
        self.SlotStrobe = slot_strobe(S)
        self.HostCommand = host_command(cfg.layer_bits, cfg.draft_len_max)
        self.HostResponse = host_response(cfg.draft_len_max, cfg.stat_bits)
        self.StepInfo = step_info(cfg.layer_bits, E, verify_tokens_max(cfg))
        self.KVRequest = kv_request(cfg.hb_words)
        self.FillReport = fill_report(S)
        self.HostToken = host_token(cfg.hidden)


@lru_cache(maxsize=64)
def vocab(cfg) -> Vocab:
    """The :class:`Vocab` of a Config (the same object for equal Configs)."""
    return Vocab(cfg)

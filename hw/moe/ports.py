"""The side channels of the batched MoE datapath as named signatures.

Every join between two components of :mod:`elmoe3d.hw.moe` that is not a
stream is one of the signatures below: a memory read port, a job-table
read, the pass in each buffer, a pass's counters. Each is a
``wiring.Signature`` built by one constructor from the datapath's
:class:`~elmoe3d.hw.moe.common.Geom` (or a buffer's own parameters), the
same way by both ends (amaranth-soc's one parameterised
``wishbone.Signature`` per bus), so :class:`~elmoe3d.hw.moe.MoEDatapath`
joins its components with ``wiring.connect`` and a width or direction
mistake fails at elaboration.

Flows are stated from the side that owns the channel (the producer, or the
reader of a memory): that side has ``Out(sig)``, the other ``In(sig)``.
A channel with one producer and several readers (the pass view, the pass
progress, the pass done) is joined by one ``wiring.connect`` of all of
them; every reader takes the whole signature and reads what it needs.

==================  ===================  ===========================  =======================
signature           owner (``Out``)      other ends (``In``)          what
==================  ===================  ===========================  =======================
``PassView``        token store          scheduler, HB reader, issue  the pass in each buffer
``LaneTokens``      token store (x P)    top-k of each lane           the lane's roles, masks
``PassRelease``     issue                token store                  a buffer is free
``ReadPort``        issue                token store (``x``, x P)     activation chunks
``JobRead``         HB reader, LPDDR     scheduler (``jobs[r]``)      job-table read port
                    writer, issue
``PassProgress``    scheduler            HB reader, LPDDR writer,     decisions, totals, pass
                                         issue                        counts
``BufferWrite``     HB reader, LPDDR     replay buffer                weight words in
                    writer
``BufferRead``      issue (x 2)          replay buffer                weight words out
``HiddenRead``      issue                vector unit                  ``h`` per lane, ``up_done``
``YRead``           output stage         vector unit                  ``y`` per lane, ``out_done``
``GateRead``        vector unit (x P)    softmax of each lane         gate table, ``ready``
``LogitFlow``       vector unit (x P)    top-k of each lane           logits, top-k's room
``RoutingFlow``     top-k (x P)          scheduler (``sel[p]``)       each routing as taken
``OutsideFlow``     top-k (x P)          candidate tracker (x P)      logits, outside the mask
``CandFlow``        candidate tracker    scheduler (``cands[p]``)     a routing's candidate
                    (x P)                                             (``OutsideFlow`` and
                                                                      ``CandFlow``: prefetch only)
``SoftmaxRecord``   HB reader            softmax (x P)                the softmax record
``PassConstants``   HB reader            vector unit                  output records, SiLU table
``PassDone``        vector unit          HB reader, output stage,     a pass's last write done
                                         softmax (x P)
``PassCounters``    HB reader, LPDDR     output stage, issue          words / beats, error
                    writer
``CycleCount``      cycle counter        issue, output stage          the time base
==================  ===================  ===========================  =======================
"""

from __future__ import annotations

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ...geometry import MULT_BITS, SHIFT_BITS
from ..vocab import TokenRole, bits
from .common import CycleCount, pow2ceil
from .payloads import act_chunk, gate_row, job_entry, job_source, logit, topk_result

__all__ = ["PassView", "LaneTokens", "PassRelease", "ReadPort", "WritePort", "x_read",
           "JobRead", "PassProgress", "BufferWrite", "BufferRead", "HiddenRead", "YRead",
           "GateRead", "LogitFlow", "RoutingFlow", "OutsideFlow", "CandFlow", "SoftmaxRecord", "out_record_write",
           "silu_table_write", "PassConstants", "PassDone", "PassCounters", "CycleCount"]


class _Signature(wiring.Signature):
    """A signature with parameters: equal to another of its class with the
    same parameters (as amaranth-soc's bus signatures are)."""

    def __init__(self, members, *params):
        self._params = params
        super().__init__(members)

    def __eq__(self, other):
        return type(self) is type(other) and self._params == other._params

    def __repr__(self):
        return f"{type(self).__name__}{self._params!r}"


class PassView(_Signature):
    """The pass in each of the token store's two buffers (index ``par``).

    Members (from the token store)
    ------------------------------
    valid, seq : ``Out(2)``
        Buffer ``par`` holds a complete pass; ``seq[par]`` toggles every time
        the buffer is filled.
    count, layer : ``Out.array(2)``
        Its tokens and layer.
    step_last : ``Out(2)``
        Its last token ends the step.
    roles, masks : ``Out.array(2)``
        Per token position: role and allowed-expert mask.
    """

    def __init__(self, g):
        T, E = g.T, g.E
        super().__init__({
            "valid": Out(2), "seq": Out(2),
            "count": Out(unsigned(T.bit_length())).array(2),
            "layer": Out(unsigned(g.cfg.layer_bits)).array(2),
            "step_last": Out(2),
            "roles": Out(data.ArrayLayout(TokenRole, T)).array(2),
            "masks": Out(data.ArrayLayout(unsigned(E), T)).array(2),
        }, g)


class LaneTokens(_Signature):
    """Roles and masks of one token lane's tokens in both buffers, by
    lane-local index (``g`` is the lane's geometry, ``Geom.lane()``).

    Members (from the token store): ``roles``, ``masks`` : ``Out.array(2)``.
    """

    def __init__(self, g):
        super().__init__({
            "roles": Out(data.ArrayLayout(TokenRole, g.T)).array(2),
            "masks": Out(data.ArrayLayout(unsigned(g.E), g.T)).array(2),
        }, g)


class PassRelease(_Signature):
    """The issue stage frees a pass buffer: ``en`` (a pulse), ``par`` (the buffer)."""

    def __init__(self):
        super().__init__({"en": Out(1), "par": Out(1)})


def _dim(member, n):
    return member if n is None else member.array(n)


class ReadPort(_Signature):
    """A memory read port: ``addr`` (from the reader), ``data`` one cycle
    later; with ``n``, ``n`` such ports side by side (each member an array).

    (Side by side rather than an array of ports inside another signature:
    Amaranth 0.5 cannot flip an array of interfaces nested in an interface,
    so ``wiring.connect`` refuses one on an ``In`` member.)"""

    def __init__(self, addr_shape, data_shape, n: int | None = None):
        super().__init__({"addr": _dim(Out(addr_shape), n), "data": _dim(In(data_shape), n)},
                         addr_shape, data_shape, n)


class WritePort(_Signature):
    """A memory write port: ``en``, ``addr``, ``data`` (from the writer);
    with ``n``, ``n`` such ports side by side (see :class:`ReadPort`)."""

    def __init__(self, addr_shape, data_shape, n: int | None = None):
        super().__init__({"en": _dim(Out(1), n), "addr": _dim(Out(addr_shape), n),
                          "data": _dim(Out(data_shape), n)}, addr_shape, data_shape, n)


def x_read(g) -> ReadPort:
    """One token lane's read port of the token store's ``x``: address
    ``{chunk, lane-local token, par}``, data an activation chunk."""
    return ReadPort(unsigned(1 + bits(g.Tl) + bits(g.c_in)), act_chunk(g))


class JobRead(_Signature):
    """A read port of the scheduler's job table: ``addr`` ``{par, job}`` (from
    the reader); ``entry`` (``JobEntry``) and ``src`` (``JobSource``) one
    cycle later."""

    def __init__(self, g):
        super().__init__({"addr": Out(unsigned(1 + bits(pow2ceil(g.jobs)))),
                          "entry": In(job_entry(g)), "src": In(job_source(g))}, g)


class PassProgress(_Signature):
    """The scheduler's progress on each pass buffer (``par``).

    Members (from the scheduler)
    ----------------------------
    decided, total : ``Out.array(2)``
        Jobs whose decision is in; jobs of the pass (valid with ``total_valid``).
    total_valid, sel_done : ``Out(2)``
        Every routed expert is announced; every token's routing is in.
    epoch : ``Out(2)``
        Toggles when the scheduler starts a pass in the buffer: a reader
        takes a buffer's jobs only once its epoch has moved on from the pass
        it last finished there.
    no_routed : ``Out.array(2)``
        Tokens that selected no routed expert.
    experts, expert_tokens : ``Out.array(2)``
        Routed jobs and the sum of their tokens (valid with ``total_valid``).
    """

    def __init__(self, g):
        J = g.jobs
        super().__init__({
            "decided": Out(unsigned(J.bit_length())).array(2),
            "total": Out(unsigned(J.bit_length())).array(2),
            "total_valid": Out(2), "sel_done": Out(2), "epoch": Out(2),
            "no_routed": Out(unsigned(g.T)).array(2),
            "experts": Out(unsigned((g.E + g.S).bit_length())).array(2),
            "expert_tokens": Out(unsigned((g.T * (g.E + g.S)).bit_length())).array(2),
        }, g)


class BufferWrite(_Signature):
    """The write side of a replay buffer of ``banks`` banks of ``width``-bit
    words (see :class:`~elmoe3d.hw.moe.buffers.ReplayBuffer`).

    Members (from the producer)
    ---------------------------
    we, wdata : ``Out.array(banks)``
        Write ``wdata[b]`` into bank ``b`` (only while ``space[b]``).
    space : ``In(1).array(banks)``
        Bank ``b`` can take a word (a flip-flop, a safe bound).
    room : ``In(1)``
        Every bank can take a word (a flip-flop, for a producer that writes
        all banks at once).
    """

    def __init__(self, banks: int, width: int):
        super().__init__({"we": Out(1).array(banks), "wdata": Out(unsigned(width)).array(banks),
                          "space": In(1).array(banks), "room": In(1, init=1)}, banks, width)


class BufferRead(_Signature):
    """The read side of a replay buffer of ``depth`` words per bank
    (positions modulo ``2 depth``).

    Members (from the reader)
    -------------------------
    pos : ``Out``
        Read position; ``data[b]`` holds bank ``b``'s word one cycle later.
    free : ``Out``
        Oldest position still needed.
    data : ``In.array(banks)``
    wp : ``In``
        The buffer's ``wp_all``: every bank holds its word below it.
    """

    def __init__(self, banks: int, width: int, depth: int):
        pb = depth.bit_length()
        super().__init__({"pos": Out(unsigned(pb)), "free": Out(unsigned(pb)),
                          "data": In(unsigned(width)).array(banks), "wp": In(unsigned(pb))},
                         banks, width, depth)


class HiddenRead(_Signature):
    """The issue stage's side of the vector unit's ``h`` (a DOWN beat's
    activations).

    Members (from the issue stage)
    ------------------------------
    rd : ``Out(ReadPort(n=P))``
        Lane ``p``'s ``h`` memory (``addr[p]``, ``data[p]``): address
        ``{chunk, lane-local token}``.
    up_done : ``In(1)``
        One pulse per UP dot-product step after its last row.
    """

    def __init__(self, g):
        super().__init__({
            "rd": Out(ReadPort(unsigned(bits(g.Tl) + bits(g.c_down)), act_chunk(g), g.P)),
            "up_done": In(1),
        }, g)


class YRead(_Signature):
    """The output stage's side of the vector unit's ``y``.

    Members (from the output stage)
    -------------------------------
    addr : ``Out`` ``{chunk, lane-local token}`` (all lanes)
    data : ``In.array(P)``
        Lane ``p``'s word, one cycle later.
    out_done : ``Out(2)``
        Passes whose ``y`` has been read (modulo 4): ``y`` is free again.
    """

    def __init__(self, g):
        super().__init__({"addr": Out(unsigned(bits(g.Tl) + bits(g.c_in))),
                          "data": In(act_chunk(g)).array(g.P), "out_done": Out(2)}, g)


class GateRead(_Signature):
    """The vector unit's side of one softmax unit's gate table (``g`` the
    lane's geometry).

    Members (from the vector unit)
    ------------------------------
    addr : ``Out`` token; data : ``In(gate_row)``
        Gate-table read, one cycle later.
    keep : ``In(T)``
        The softmax's ``ready_keep``: tokens whose gates are in the table and
        stay there next cycle (a register).
    idle : ``In(1)``
        No token waiting or in progress (a register).
    """

    def __init__(self, g):
        super().__init__({"addr": Out(range(max(2, g.T))), "data": In(gate_row(g)),
                          "keep": In(g.T), "idle": In(1)}, g)


class LogitFlow(_Signature):
    """Router logits into one lane's top-k (``g`` the lane's geometry): a
    flow with no ``ready``, and top-k's room.

    Members (from the vector unit)
    ------------------------------
    valid : ``Out(1)``; payload : ``Out(Logit)``
        A logit; any but a token's last is always taken.
    last_ok : ``In(1)``
        Top-k can take a token's last logit (registers only).
    idle : ``In(1)``
        No logit in top-k's stages and no result waiting (a register).
    """

    def __init__(self, g):
        super().__init__({"valid": Out(1), "payload": Out(logit(g)),
                          "last_ok": In(1), "idle": In(1)}, g)


class RoutingFlow(_Signature):
    """Each top-k result as the softmax takes it (``g`` the lane's geometry):
    ``valid`` (a pulse, one per handshake of top-k's ``o``) and ``payload``
    (the ``TopKResult``); a flow, no ``ready``.

    (Not an always-ready ``stream.Signature``: Amaranth 0.5 cannot make a
    top-level port of its constant ``ready``, so a component that has one
    could not be converted on its own, for its formal check or synthesis.)"""

    def __init__(self, g):
        super().__init__({"valid": Out(1), "payload": Out(topk_result(g))}, g)


class OutsideFlow(_Signature):
    """Each logit of one lane's top-k as its insertion stage takes it (``g``
    the lane's geometry; a flow, no ``ready``): ``value``, ``expert``,
    ``last`` (its token's last), ``outside`` (a DRAFT token's logit of an
    expert its mask does not allow). Built only for prefetch."""

    def __init__(self, g):
        super().__init__({"valid": Out(1), "value": Out(signed(g.W)),
                          "expert": Out(bits(g.E)), "last": Out(1), "outside": Out(1)}, g)


class CandFlow(_Signature):
    """One lane's prefetch candidate per routing (a flow, no ``ready``):
    ``valid`` a cycle after the routing's handshake, ``par`` its pass
    buffer, ``ok`` whether the token has a candidate, ``expert`` it."""

    def __init__(self, g):
        super().__init__({"valid": Out(1), "par": Out(1), "expert": Out(bits(g.E)),
                          "ok": Out(1)}, g)


class SoftmaxRecord(_Signature):
    """A write of the pass's softmax record (``en``, buffer ``par``,
    ``mult``, ``shift``), from the record path of bank 0."""

    def __init__(self):
        super().__init__({"en": Out(1), "par": Out(1), "mult": Out(MULT_BITS),
                          "shift": Out(SHIFT_BITS)})


def out_record_write(g, n: int | None = None) -> WritePort:
    """A write of one bank's output-requantisation store: address ``{group, par}``,
    a 22-bit record (``mult``, ``shift``); with ``n``, one per bank side by side."""
    return WritePort(unsigned(1 + bits(g.g_down)), unsigned(22), n)


def silu_table_write() -> WritePort:
    """A write of the SiLU table: address ``{word, par}`` (64 words per
    buffer), four 8-bit entries a word."""
    return WritePort(unsigned(7), unsigned(32))


class PassConstants(_Signature):
    """A pass's constants, from the HB reader to the vector unit.

    Members (from the HB reader)
    ----------------------------
    out : ``Out(WritePort(n=B))``
        Bank ``b``'s output-requantisation records (``en[b]``, ``addr[b]``,
        ``data[b]``).
    lut : ``Out(WritePort)``
        The SiLU table.
    out_loaded, lut_loaded : ``Out(2)``
        Buffer ``par``'s constants are complete (cleared by the pass's done).
    """

    def __init__(self, g):
        super().__init__({"out": Out(out_record_write(g, g.B)),
                          "lut": Out(silu_table_write()),
                          "out_loaded": Out(2), "lut_loaded": Out(2)}, g)


class PassDone(_Signature):
    """A pass's END element left the vector unit (every write of the pass is
    done): ``done`` (a pulse), buffer ``par``, ``error`` (a PE result of the
    pass was in error)."""

    def __init__(self):
        super().__init__({"done": Out(1), "par": Out(1), "error": Out(1)})


class PassCounters(_Signature):
    """A port's counters per pass buffer: ``count`` (words or beats
    received), ``error`` (a read of the pass ended in error)."""

    def __init__(self, g):
        super().__init__({"count": Out(unsigned(g.cfg.stat_bits)).array(2),
                          "error": Out(2)}, g)

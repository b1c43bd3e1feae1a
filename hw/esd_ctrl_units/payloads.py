"""Named payloads and interfaces between the Elastic-SD controller's units,
and ``esd_ports``: the payload types of the controller's ports (declared in
:mod:`elmoe3d.hw.vocab`, bundled here for the controller, the tile, the
token feed and the testbenches).

Every payload is a cached ``data.Struct`` constructor (equal parameters give
the same class, so two units built from one Config join with
``wiring.connect``); every side channel between units is a named
``wiring.Signature`` built by one function used by both ends.

Between the units
-----------------
``CommandResult``  ``{error, value}``: a unit's answer to a host command it
                   was handed (the host front end turns it into a
                   ``HostResponse``).
``StepOrder``      ``{phase, step, layer, tokens}``: one admitted layer step.
``PassOrder``      ``{ctx, tokens}``: one pass of a layer step; ``ctx`` is a
                   ``PassContext`` ``{phase, step, layer, pass_no}`` (the
                   fields every pass event carries).
``PassEntry``      ``{ctx, expert, slot, pin, fill, read, last, none}``: what
                   the pass engine did for one announced expert (``pin``:
                   the slot is pinned, ``fill``: a fill into it was started,
                   ``read``: an LPDDR read was issued), ``last`` on the pass's
                   final entry, or the one ``none`` entry of a pass without
                   experts; the pass end retires them.
``PrefetchOrder``  ``{ctx, retire, all}``: to the prefetcher: issue the
                   prefetches of the DRAFT pass ``ctx`` (``retire`` 0), or
                   retire the outstanding ones of ``ctx.layer`` (every
                   layer's with ``all``).
``Done``           ``{error}``: a layer step or a pass has ended (``error``:
                   an LPDDR error spoilt it).
``CounterBump``    one field per statistics counter of a producer: the amount
                   it adds this cycle (a 1-bit field is a strobe).

Interfaces (from the side that starts the exchange)
---------------------------------------------------
:func:`tag_port`       ``cmd`` (out) / ``rsp`` (in): one tag-unit round trip.
:func:`prefetch_port`  ``order`` (out, ``PrefetchOrder``) / ``done`` (in,
                       ``Done``): one job of the prefetcher.
:func:`counter_port`   ``inc`` (out, ``CounterBump``): a producer's increments.
:func:`command_port`   ``order`` (out, ``HostCommand``) / ``result`` (in,
                       ``CommandResult``): a host command handed to the unit
                       that executes it (round, KV boundary, counters).
:func:`round_status`   ``mode``, ``k``: the open round (for host responses).
:func:`kv_status`      ``usable``: expert slots outside the KV region.
:func:`counter_watch`  ``decode_steps``: the counter's value (DECAY events).
"""

from __future__ import annotations

from functools import lru_cache

from amaranth.hdl import unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from .. import vocab as hv

__all__ = ["esd_ports", "command_result", "step_order", "pass_context", "pass_order", "pass_entry",
           "prefetch_order", "prefetch_port", "done", "tag_port", "counter_bump", "counter_port", "command_port", "round_status",
           "kv_status", "counter_watch"]


def esd_ports(cfg: Config) -> dict:
    """The payload types of every controller port for ``cfg`` (all of
    :mod:`elmoe3d.hw.vocab`)."""
    v = hv.vocab(cfg)
    return dict(
        HostCommand=v.HostCommand, HostResponse=v.HostResponse,
        TraceEvent=v.TraceEvent, TagCommand=v.TagCommand, TagResponse=v.TagResponse,
        ExtCommand=v.ExtCommand, ExtResponse=v.ExtResponse,
        FillDone=v.FillReport, KVRequest=v.KVRequest, KVMove=v.KVMove, StepInfo=v.StepInfo,
        # the batched datapath's own types: the ports join it directly
        ExpertNeed=v.ExpertNeed, ExpertSource=v.ExpertSource, PassStats=v.PassStats,
        PrefetchCandidate=v.PrefetchCandidate,
    )


# -- between the units -----------------------------------------------------------------

@lru_cache(maxsize=None)
def command_result(stat_bits: int) -> type:
    """``CommandResult``: ``error`` (``HostError``) and ``value`` of one host
    command, from the unit that executed it."""
    return hv.struct("CommandResult", {"error": unsigned(3),
                                       "value": unsigned(max(hv.VALUE_BITS, stat_bits))})


@lru_cache(maxsize=None)
def step_order(layer_bits: int, draft_len_max: int, tokens_max: int) -> type:
    """``StepOrder``: an admitted layer step and its token count."""
    return hv.struct("StepOrder", {"phase": unsigned(2),
                                   "step": unsigned(max(1, draft_len_max.bit_length())),
                                   "layer": unsigned(layer_bits),
                                   "tokens": unsigned(tokens_max.bit_length())})


@lru_cache(maxsize=None)
def pass_context(layer_bits: int, draft_len_max: int) -> type:
    """``PassContext``: the fields every event of a pass carries."""
    return hv.struct("PassContext", {"phase": unsigned(2),
                                     "step": unsigned(max(1, draft_len_max.bit_length())),
                                     "layer": unsigned(layer_bits),
                                     "pass_no": unsigned(hv.TRACE_PASS_BITS)})


@lru_cache(maxsize=None)
def pass_order(layer_bits: int, draft_len_max: int, batch_tokens: int) -> type:
    """``PassOrder``: one pass (``ctx``) of ``tokens`` (1 .. T) tokens."""
    return hv.struct("PassOrder", {"ctx": pass_context(layer_bits, draft_len_max),
                                   "tokens": unsigned(batch_tokens.bit_length())})


@lru_cache(maxsize=None)
def pass_entry(layer_bits: int, draft_len_max: int, expert_bits: int, slots: int) -> type:
    """``PassEntry``: one announced expert of a pass as the pass engine
    handled it (see the module doc)."""
    return hv.struct("PassEntry", {"ctx": pass_context(layer_bits, draft_len_max),
                                   "expert": unsigned(expert_bits),
                                   "slot": unsigned(hv.bits(slots)),
                                   "pin": unsigned(1), "fill": unsigned(1), "read": unsigned(1),
                                   "last": unsigned(1), "none": unsigned(1)})


@lru_cache(maxsize=None)
def prefetch_order(layer_bits: int, draft_len_max: int) -> type:
    """``PrefetchOrder``: issue the prefetches of the DRAFT pass ``ctx``
    (``retire`` = 0), or retire the outstanding prefetches of ``ctx.layer``
    (``retire`` = 1; every layer's with ``all``)."""
    return hv.struct("PrefetchOrder", {"ctx": pass_context(layer_bits, draft_len_max),
                                       "retire": unsigned(1), "all": unsigned(1)})


@lru_cache(maxsize=None)
def done() -> type:
    """``Done``: a layer step or a pass ended; ``error``: an LPDDR error
    spoilt it (the host repeats the step)."""
    return hv.struct("Done", {"error": unsigned(1)})


# -- interfaces --------------------------------------------------------------------------

@lru_cache(maxsize=None)
def tag_port(cfg: Config) -> wiring.Signature:
    """One tag-unit round trip: ``cmd`` (``TagCommand``) out, ``rsp``
    (``TagResponse``) in; a unit's view (the tag client takes it flipped)."""
    v = hv.vocab(cfg)
    return wiring.Signature({"cmd": Out(stream.Signature(v.TagCommand)),
                             "rsp": In(stream.Signature(v.TagResponse))})


@lru_cache(maxsize=None)
def prefetch_port(layer_bits: int, draft_len_max: int) -> wiring.Signature:
    """One job of the prefetcher: ``order`` (``PrefetchOrder``) out, ``done``
    (``Done``) in when its events have left."""
    return wiring.Signature({
        "order": Out(stream.Signature(prefetch_order(layer_bits, draft_len_max))),
        "done": In(stream.Signature(done()))})


@lru_cache(maxsize=None)
def counter_bump(fields: tuple) -> type:
    """``CounterBump``: ``fields`` = ``((counter, width), ...)``; each field
    is the amount added to that counter in this cycle."""
    return hv.struct("CounterBump", {name: unsigned(w) for name, w in fields})


@lru_cache(maxsize=None)
def counter_port(fields: tuple) -> wiring.Signature:
    """A producer's counter increments: ``inc`` (``CounterBump`` of
    ``fields``), registered by the producer, 0 when nothing happens."""
    return wiring.Signature({"inc": Out(counter_bump(fields))})


@lru_cache(maxsize=None)
def command_port(layer_bits: int, draft_len_max: int, stat_bits: int) -> wiring.Signature:
    """A host command handed to the unit that executes it: ``order``
    (``HostCommand``) out, ``result`` (``CommandResult``) in, one per order."""
    return wiring.Signature({
        "order": Out(stream.Signature(hv.host_command(layer_bits, draft_len_max))),
        "result": In(stream.Signature(command_result(stat_bits)))})


@lru_cache(maxsize=None)
def round_status(draft_len_max: int) -> wiring.Signature:
    """The open round as host responses show it: ``mode`` (1 = SD) and ``k``."""
    return wiring.Signature({"mode": Out(1), "k": Out(range(draft_len_max + 1))})


@lru_cache(maxsize=None)
def kv_status(slots: int) -> wiring.Signature:
    """``usable``: expert slots outside the KV region (registered)."""
    return wiring.Signature({"usable": Out(range(slots + 1))})


@lru_cache(maxsize=None)
def counter_watch(stat_bits: int) -> wiring.Signature:
    """``decode_steps``: that counter's value (the DECAY event carries it)."""
    return wiring.Signature({"decode_steps": Out(stat_bits)})

"""Formal wrappers of the batched MoE datapath's components
(:mod:`elmoe3d.hw.moe`) and of the whole layer
(:class:`~elmoe3d.hw.moe.MoEDatapath`), for SymbiYosys. Test scaffolding,
not blocks.

Properties (``Assert``): the stream rules on every stream port
(:func:`.common.stream_rules_all`): on an output, once ``valid`` is high
without ``ready`` it stays high and the payload stays unchanged until the
transfer.

Environment (``Assume``): reset is never asserted; every input stream obeys
the same rules; every other input (the side channels from the neighbouring
components, :mod:`elmoe3d.hw.moe.ports`, ``ready`` of the outputs) is free,
except where a component's documented contract restricts it (``TopK``: a
token's last logit only while ``last_ok``; ``Issue``: the pass counters it
copies into the summary hold while the summary waits - see
:class:`IssueFormal`).

One wrapper class per component that drives a stream:

==================  ============================  =========================
wrapper             component                     output streams
==================  ============================  =========================
PEArrayFormal       ``pe_array.PEArray``          ``o`` (``i`` assumed)
TopKFormal          ``topk.TopK``                 ``o``
SchedulerFormal     ``scheduler.ExpertScheduler`` ``need`` (``source``)
IssueFormal         ``issue.Issue``               ``o``, ``summary``
OutputStageFormal   ``output.OutputStage``        ``o``, ``stats`` (``summary``)
RecordPathFormal    ``hb_reader.RecordPath``      ``params`` (``word``, ``cmd``)
HBReaderFormal      ``hb_reader.HBReader``        ``hb_cmd[b]``, ``params[b]``,
                                                  ``lsb[b]`` (``hb_data[b]``)
MoEDatapathFormal   ``MoEDatapath`` (the layer)   ``need``, ``hb_cmd[b]``,
                                                  ``o``, ``stats`` (``tok``,
                                                  ``source``, ``hb_data[b]``,
                                                  ``ext``)
==================  ============================  =========================

``TokenStore`` (``tok``), ``Softmax`` (``i``), ``VectorUnit`` (``i``,
``params[b]``) and ``ExtWriter`` (``ext``, ``lsb[b]``) only *take* streams:
the rules are an assumption on them and there is nothing of theirs to
assert; their input streams are covered as outputs of their producers above
(and at the layer's boundary).

Planted bugs (``bug=``, every wrapper): ``drop_valid`` (the wrapper drops
the first covered output stream's ``valid`` after it has waited one cycle) and
``payload`` (it flips a payload bit of that stream while it waits). Both
must fail; they show the checker sees the port the DUT drives.
"""

from __future__ import annotations

from amaranth.hdl import Assume, Cover, Module, ResetSignal, Signal
from amaranth.lib import stream, wiring

from ...config import Config
from ...hw.moe import MoEDatapath
from ...hw.moe.common import geom
from ...hw.moe.hb_reader import HBReader, RecordPath
from ...hw.moe.issue import Issue
from ...hw.moe.output import OutputStage
from ...hw.moe.pe_array import PEArray
from ...hw.moe.scheduler import ExpertScheduler
from ...hw.moe.topk import TopK
from .common import stream_rules_all

__all__ = ["BUGS", "FORMAL_CONFIG", "WRAPPERS", "PEArrayFormal", "TopKFormal", "SchedulerFormal",
           "SchedulerPrefetchFormal",
           "IssueFormal", "OutputStageFormal", "RecordPathFormal", "HBReaderFormal",
           "MoEDatapathFormal"]

BUGS = ("drop_valid", "payload")

#: The smallest geometry the datapath elaborates at: 2 PEs of 4 lanes, H = I = 4
#: (one chunk per row), 2 experts top-1, 2-token passes, n = 2 planes (k = 1).
#: A pass's router is then 2 beats a token, so a whole pass fits a short BMC;
#: 2 token lanes (both tokens of a pass in one step).
FORMAL_CONFIG = Config(lanes=4, pes=2, max_len=64, hb_words=1024, tag_slots=4, layers=1,
                       hidden=4, ffn=4, experts=2, expert_bits=1, top_k=1, batch_tokens=2,
                       token_lanes=2, sd_threshold=1, draft_len_max=2, draft_len_init=1, min_free_slots=1,
                       stat_bits=8)


def _members(sig):
    return sig.members.items()


def _is_stream(member) -> bool:
    return not member.is_port and isinstance(member.signature, stream.Signature)


class _UnitFormal(wiring.Component):
    """Pass-through of a component's ports with the stream rules on every
    stream port, an optional planted bug on the first covered output stream,
    and a ``Cover`` of every covered output waiting (the rules are not
    vacuous)."""

    #: Output streams whose waiting is covered (``None``: every output).
    COVERS = None

    def __init__(self, dut, *, bug: str | None = None):
        if bug is not None and bug not in BUGS:
            raise ValueError(f"Unknown planted bug {bug!r}; choose from {', '.join(BUGS)}")
        self.dut, self.bug = dut, bug
        outs = [n for n, mb in _members(dut.signature)
                if not mb.is_port and isinstance(mb.signature, stream.Signature)
                and mb.flow == wiring.Out]
        if not outs:
            raise ValueError(f"{type(dut).__name__} drives no stream")
        self.bug_port = self.COVERS[0] if self.COVERS else outs[0]
        super().__init__(dut.signature)

    def environment(self, m, dut):
        """Extra assumptions of a component's contract (none by default)."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        for name, member in _members(dut.signature):
            ours, theirs = getattr(self, name), getattr(dut, name)
            n = member.dimensions[0] if member.dimensions else None
            pairs = [(ours, theirs)] if n is None else [(ours[i], theirs[i]) for i in range(n)]
            for k, (a, b) in enumerate(pairs):
                if member.is_port:
                    if member.flow == wiring.In:
                        m.d.comb += b.eq(a)
                    else:
                        m.d.comb += a.eq(b)
                elif member.flow == wiring.In:
                    wiring.connect(m, wiring.flipped(a), b)
                elif self.bug is not None and name == self.bug_port and k == 0:
                    self._plant(m, b, a)
                else:
                    wiring.connect(m, b, wiring.flipped(a))
        m.d.comb += Assume(~ResetSignal())
        self.environment(m, dut)
        self.covered = stream_rules_all(m, self)
        for name, member in _members(dut.signature):
            if not _is_stream(member) or member.flow != wiring.Out or \
                    (self.COVERS is not None and name not in self.COVERS):
                continue
            s = getattr(self, name)
            s = s if not member.dimensions else s[0]
            m.d.comb += Cover(s.valid & ~s.ready, f"{name} stalled")
        return m

    def _plant(self, m, src, dst):
        waited = Signal(name="bug_waited")
        m.d.sync += waited.eq(src.valid & ~dst.ready & ~waited)
        pv, dv = src.payload.as_value(), dst.payload.as_value()
        m.d.comb += [dst.valid.eq(src.valid), dv.eq(pv), src.ready.eq(dst.ready)]
        if self.bug == "drop_valid":
            m.d.comb += [dst.valid.eq(src.valid & ~waited), src.ready.eq(dst.ready & ~waited)]
        else:
            m.d.comb += dv[0].eq(pv[0] ^ waited)


def _g(cfg):
    return geom(cfg)


class PEArrayFormal(_UnitFormal):
    """:class:`PEArray` (``B`` PEs, tag FIFO, result register slice)."""

    def __init__(self, cfg: Config, *, bug=None):
        super().__init__(PEArray(_g(cfg)), bug=bug)


class TopKFormal(_UnitFormal):
    """:class:`TopK`. Contract assumed: a token's last logit arrives only
    while ``last_ok`` (the vector unit's rule)."""

    def __init__(self, cfg: Config, *, bug=None):
        super().__init__(TopK(_g(cfg)), bug=bug)

    def environment(self, m, dut):
        m.d.comb += Assume(~(self.i.valid & self.i.payload.last) | dut.i.last_ok)


class SchedulerFormal(_UnitFormal):
    """:class:`ExpertScheduler` (announcements on ``need``, decisions on ``source``)."""

    def __init__(self, cfg: Config, *, bug=None):
        super().__init__(ExpertScheduler(_g(cfg)), bug=bug)


class SchedulerPrefetchFormal(_UnitFormal):
    """:class:`ExpertScheduler` built for prefetch: ``need``, ``source`` and
    the DRAFT passes' candidates on ``pf`` (its bug and cover)."""

    COVERS = ("pf",)

    def __init__(self, cfg: Config, *, bug=None):
        super().__init__(ExpertScheduler(_g(cfg), prefetch=True), bug=bug)


class IssueFormal(_UnitFormal):
    """:class:`Issue` (PE beats on ``o``, the pass summary on ``summary``).

    Contract assumed: the summary's payload is not all registers - it copies
    the pass counters of its neighbours (the LPDDR writer's ``error`` and
    ``count``, the scheduler's ``experts``, ``expert_tokens``,
    ``no_routed``; the HB count and error are latched by the output stage)
    as they are; those are assumed to hold while the summary waits (in the
    layer they belong to the pass being ended, whose buffer is released
    only by the summary's handshake)."""

    HOLD = (("ext_counters", "error"), ("ext_counters", "count"), ("progress", "experts"),
            ("progress", "expert_tokens"), ("progress", "no_routed"))

    def __init__(self, cfg: Config, *, bug=None):
        super().__init__(Issue(_g(cfg)), bug=bug)

    def environment(self, m, dut):
        waiting = Signal(name="summary_waiting")
        m.d.sync += waiting.eq(self.summary.valid & ~self.summary.ready)
        for port, field in self.HOLD:
            v = getattr(getattr(self, port), field)
            name = f"{port}_{field}"
            for i, x in enumerate(v if isinstance(v, list) else [v]):
                p = Signal.like(x, name=f"p_{name}{i}")
                m.d.sync += p.eq(x)
                with m.If(waiting):
                    m.d.comb += Assume(x == p)


class OutputStageFormal(_UnitFormal):
    """:class:`OutputStage` (outputs on ``o``, statistics on ``stats``)."""

    def __init__(self, cfg: Config, *, bug=None):
        super().__init__(OutputStage(_g(cfg)), bug=bug)


class RecordPathFormal(_UnitFormal):
    """:class:`RecordPath` of bank 0 (records out on ``params``)."""

    def __init__(self, cfg: Config, *, bug=None):
        super().__init__(RecordPath(_g(cfg), 0), bug=bug)


class HBReaderFormal(_UnitFormal):
    """:class:`HBReader` (``hb_cmd[b]`` out, ``hb_data[b]`` in, ``params[b]`` out).
    ``params[b]`` is :class:`RecordPath` ``b``'s output, wired through (its
    rules are proved unbounded on :class:`RecordPathFormal`); a record needs
    a pass's first commands answered first, past the BMC depth, so only
    ``hb_cmd`` is covered here."""

    COVERS = ("hb_cmd",)

    def __init__(self, cfg: Config, *, bug=None):
        super().__init__(HBReader(_g(cfg)), bug=bug)


class MoEDatapathFormal(_UnitFormal):
    """The whole batched layer (:class:`MoEDatapath`) at its boundary.
    Within a BMC of a few tens of cycles a pass gets as far as its first HB
    commands (an output needs a whole pass), so only ``hb_cmd`` is covered."""

    COVERS = ("hb_cmd",)

    def __init__(self, cfg: Config, *, bug=None):
        super().__init__(MoEDatapath(cfg), bug=bug)


#: name -> wrapper class, in data-flow order.
WRAPPERS = {"pe_array": PEArrayFormal, "topk": TopKFormal, "scheduler": SchedulerFormal,
            "scheduler_pf": SchedulerPrefetchFormal,
            "issue": IssueFormal, "output": OutputStageFormal, "record_path": RecordPathFormal,
            "hb_reader": HBReaderFormal, "layer": MoEDatapathFormal}

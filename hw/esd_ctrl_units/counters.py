"""Statistics counters of the controller: increments in, the COUNTER
readout out.

Every unit that counts something has a counter port
(:func:`~.payloads.counter_port`): one field per counter it owns, the
amount added in this cycle (a 1-bit field is a strobe). The unit declares
the counters it owns (``COUNTS``) and drives the fields from registers,
0 when nothing happens; :class:`Counters` adds every field to its counter,
saturating. Adding a counter is adding a name to :data:`COUNTERS` (its
readout index), to the owner's ``COUNTS`` and a strobe in the owner.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from ...golden import esd as gesd
from ..common import adder_tree
from .common import Emit, check_config, saturating_add
from .payloads import command_port, counter_port, counter_watch

__all__ = ["COUNTERS", "counter_fields", "Counters"]

#: Counter order of the COUNTER command (index = ``HostCommand.value``).
COUNTERS = ("hb_hits", "hb_misses", "hb_pending", "hb_bytes", "lpddr_bytes", "fills",
            "evictions", "accepted_tokens", "draft_cycles", "verify_cycles", "ar_cycles",
            "aborts", "allocations", "no_victim", "touches", "decays", "drafted_tokens",
            "rounds_ar", "rounds_sd", "decode_steps", "tokens_out", "kv_moves",
            "kv_invalidations", "ext_errors", "draft_lookups")


def counter_fields(cfg: Config, names) -> tuple:
    """``((name, width), ...)`` of a counter port owning ``names``: the
    width of the largest amount the counter takes in one cycle (1 for a
    strobe)."""
    plane_bytes = cfg.expert_bytes // cfg.planes
    tokens = gesd.MAX_BATCH * (cfg.draft_len_max + 1)
    widest = {"hb_bytes": cfg.hb_planes_eff * plane_bytes,
              "lpddr_bytes": cfg.planes * plane_bytes,
              "accepted_tokens": tokens, "drafted_tokens": tokens, "tokens_out": tokens}
    out = []
    for name in names:
        if name not in COUNTERS:
            raise ValueError(f"Unknown counter {name!r}; the counters are {', '.join(COUNTERS)}")
        out.append((name, max(1, int(widest.get(name, 1)).bit_length())))
    return tuple(out)


class Counters(wiring.Component):
    """The statistics counters (``stat_bits`` each, saturating).

    Parameters
    ----------
    cfg : Config
    sources : dict, optional
        ``{port name: counter names}``: one input port per producer, named
        ``<port name>``, owning those counters (default: one port ``counts``
        owning all of :data:`COUNTERS`). Every counter has exactly one owner,
        but those named in ``shared``.
    shared : tuple, optional
        Counters that several producers bump (the prefetcher's fills beside
        the pass end's): their amounts in one cycle add up.

    Members
    -------
    <port name> : ``In(counter_port(...))``
        A producer's increments (``inc``), one field per counter it owns.
    read : ``In(command_port(...))``
        A COUNTER command in (``order``; its ``value`` is the index); its
        ``result`` out: ``value`` = counter ``index`` of :data:`COUNTERS`,
        or ``error`` BAD_ORDER past the last one.
    watch : ``Out(counter_watch(stat_bits))``
        ``decode_steps``: that counter's value.

    Raises
    ------
    ValueError
        For a counter with no owner or two (not ``shared``), or an unknown one.

    Latency and throughput: an increment in cycle ``t`` shows in the
    counter (and on ``watch``) from ``t + 1``; a readout answers two cycles
    after its index is taken, one per two cycles.
    """

    def __init__(self, cfg: Config, sources: dict | None = None, shared: tuple = ()):
        check_config("Counters", cfg)
        sources = dict(sources) if sources is not None else {"counts": COUNTERS}
        owned = [n for names in sources.values() for n in names]
        twice = sorted({n for n in owned if owned.count(n) > 1 and n not in shared})
        missing = [n for n in COUNTERS if n not in owned]
        if twice or missing:
            raise ValueError(f"Every counter needs one owner: counted twice {twice}, "
                             f"by nobody {missing}")
        self.cfg = cfg
        self.sources = {k: counter_fields(cfg, v) for k, v in sources.items()}
        members = {k: In(counter_port(f)) for k, f in self.sources.items()}
        members.update(read=In(command_port(cfg.layer_bits, cfg.draft_len_max, cfg.stat_bits)),
                       watch=Out(counter_watch(cfg.stat_bits)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        ctr = {name: Signal(self.cfg.stat_bits, name=f"ctr_{name}") for name in COUNTERS}
        amounts = {}
        for port, fields in self.sources.items():
            for name, _ in fields:
                amounts.setdefault(name, []).append(getattr(getattr(self, port).inc, name))
        for name, a in amounts.items():                # a shared counter adds every amount
            m.d.sync += ctr[name].eq(saturating_add(ctr[name],
                                                    a[0] if len(a) == 1 else adder_tree(a)))
        m.d.comb += self.watch.decode_steps.eq(ctr["decode_steps"])

        # readout: the index registered as a one-hot select (all zero past
        # the last counter), then an AND-OR of the counters straight into the
        # result register: its payload depends on registers only (no state
        # or handshake in the select), three LUT levels for 25 counters
        result = Emit(m, self.read.result, "result")
        order = self.read.order
        index = order.payload.value
        onehot = Signal(len(COUNTERS))
        bad, busy = Signal(), Signal()
        m.d.comb += order.ready.eq(~busy)
        with m.If(order.valid & order.ready):
            m.d.sync += [onehot.eq(Cat(index == i for i in range(len(COUNTERS)))),
                         bad.eq(index >= len(COUNTERS)), busy.eq(1)]
        picked = 0
        for i, name in enumerate(COUNTERS):
            picked = picked | (ctr[name] & onehot[i].replicate(len(ctr[name])))
        result.stage(m, value=picked, error=Mux(bad, gesd.HostError.BAD_ORDER, 0))
        with m.If(busy & result.empty):
            m.d.sync += busy.eq(0)
            result.send(m)
        return m

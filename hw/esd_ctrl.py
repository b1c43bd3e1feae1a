"""Elastic-SD controller: the phase sequencer of the tile.

It produces the control sequence of :mod:`elmoe3d.golden.esd` (the
specification; read its module doc for the rules) by driving the tag unit,
the HB bank controller (KV boundary moves, fill reports), the external-memory
stream engine and the batched MoE datapath, and exports every event on its
``trace`` stream (``TraceEvent``). The testbench compares that stream with
the golden sequence in canonical order (:func:`elmoe3d.golden.esd.canonical`).

Ports (every one through a :class:`~elmoe3d.hw.streams.RegisterSlice` or a
FIFO, so no ``ready`` crosses the block combinationally)
------------------------------------------------------------------------------
``host_cmd`` / ``host_rsp``
    Host commands (``HostCommand``: ROUND, STEP, ACCEPT, CONTEXT, COUNTER) and
    one response each (``HostResponse``: error code, mode, draft length, a
    value).
``trace``
    ``TraceEvent`` s, in execution order (canonical after sorting).
``tag_cmd`` / ``tag_rsp``
    The tag unit's command and response streams (one command in flight).
``ext_cmd`` / ``ext_rsp``
    ``ExtCommand`` (EXPERT reads with ``plane_mask``, ``fill`` and ``slot``;
    ``id`` = the expert's position in the pass) and ``ExtResponse``.
``fill_done``
    HB's report that the fill of a slot ended (``ok`` = committed).
``kv_req`` / ``kv_move``
    A KV boundary request (KV words per bank) and HB's ``KVMove`` report.
``dp_step`` / ``dp_announce`` / ``dp_source`` / ``dp_done``
    The batched datapath's per-expert source handshake
    (``docs/architecture.md`` section 8), in the datapath's own types so the
    ports join ``MoEDatapath`` directly: ``dp_announce`` <- its ``need``
    (``ExpertNeed``: per pass each routed expert in announce order with
    ``tokens``, ``last`` on the final one; one ``none`` beat for a pass
    without routed experts), ``dp_source`` -> its ``source``
    (``ExpertSource``: ``hb`` + ``slot``, or LPDDR; one per announced
    expert, in order), ``dp_done`` <- its ``stats`` (``PassStats``, one per
    pass: the pass is done, its weights all consumed). ``dp_step``
    (``StepInfo``: phase, layer, eligibility mask, tokens) starts a layer
    step; the tile's token feed (``hw/esd_feed.TokenFeed``) turns it and the
    host's token vectors into the datapath's ``tok`` stream.

Latency: one tag-unit round trip per tag operation (the controller has one
command in flight), a few cycles per event; a pass ends when the datapath,
every LPDDR read and every fill of it have ended.
"""

from __future__ import annotations

from functools import lru_cache

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import Config
from ..golden import esd as gesd
from ..golden import layout as gl
from . import vocab as hv
from .streams import RegisterSlice

__all__ = ["HostOp", "TagOp", "EsdCtrl", "host_command", "host_response", "esd_ports",
           "saturating_add", "BLOCK_SPECS"]

#: Host command opcodes (``HostCommand.op``).
class HostOp:
    ROUND = 0
    STEP = 1
    ACCEPT = 2
    CONTEXT = 3
    COUNTER = 4


#: Tag-unit opcodes the controller issues (LOOKUP, LOOKUP_PIN, TOUCH, ALLOCATE,
#: UNPIN, ABORT, DECAY): :class:`elmoe3d.hw.vocab.TagOpcode`.
TagOp = hv.TagOpcode

VALUE_BITS = 32


def _clamp(v, hi: int):
    """``min(v, hi)`` for an unsigned value; ``v`` itself when it cannot
    exceed ``hi`` (no constant comparison in the Verilog: Verilator's lint
    flags those)."""
    return v if (1 << len(v)) - 1 <= hi else Mux(v > hi, hi, v)


def _bits(n):
    return max(1, (int(n) - 1).bit_length())


@lru_cache(maxsize=None)
def host_command(layer_bits: int, draft_len_max: int) -> type:
    return hv.struct("HostCommand", {"op": unsigned(3), "phase": unsigned(2),
                                     "step": unsigned(max(1, draft_len_max.bit_length())),
                                     "layer": unsigned(layer_bits),
                                     "value": unsigned(VALUE_BITS)})


@lru_cache(maxsize=None)
def host_response(draft_len_max: int, stat_bits: int) -> type:
    return hv.struct("HostResponse", {"op": unsigned(3), "error": unsigned(3),
                                      "mode": unsigned(1),
                                      "k": unsigned(draft_len_max.bit_length() + 1),
                                      "value": unsigned(max(VALUE_BITS, stat_bits))})


def esd_ports(cfg: Config) -> dict:
    """The payload types of every controller port for ``cfg``."""
    S, E = cfg.tag_slots, cfg.experts
    v = hv.vocab(cfg)
    tok_bits = (gesd.MAX_BATCH * (cfg.draft_len_max + 1)).bit_length()
    return dict(
        HostCommand=host_command(cfg.layer_bits, cfg.draft_len_max),
        HostResponse=host_response(cfg.draft_len_max, cfg.stat_bits),
        TraceEvent=v.TraceEvent, TagCommand=v.TagCommand, TagResponse=v.TagResponse,
        ExtCommand=v.ExtCommand, ExtResponse=v.ExtResponse,
        FillDone=hv.struct("FillDone", {"slot": unsigned(_bits(S)), "ok": unsigned(1)}),
        KVRequest=hv.struct("KVRequest", {"kv_words": unsigned(cfg.hb_words.bit_length())}),
        KVMove=v.KVMove,
        StepInfo=hv.struct("StepInfo", {"phase": unsigned(2), "layer": unsigned(cfg.layer_bits),
                                        "mask": unsigned(E), "tokens": unsigned(tok_bits)}),
        # the batched datapath's own types (hw/vocab.py): the ports join it directly
        ExpertNeed=v.ExpertNeed, ExpertSource=v.ExpertSource, PassStats=v.PassStats,
    )


#: Counter order of the COUNTER command (index = ``HostCommand.value``).
COUNTERS = ("hb_hits", "hb_misses", "hb_pending", "hb_bytes", "lpddr_bytes", "fills",
            "evictions", "accepted_tokens", "draft_cycles", "verify_cycles", "ar_cycles",
            "aborts", "allocations", "no_victim", "touches", "decays", "drafted_tokens",
            "rounds_ar", "rounds_sd", "decode_steps", "tokens_out", "kv_moves",
            "kv_invalidations", "ext_errors", "draft_lookups")


def saturating_add(counter, amount):
    """``min(counter + amount, 2**len(counter) - 1)`` for an unsigned
    ``counter`` and a non-negative ``amount`` (a value or an int). The sum's
    bits above the counter are its overflow: an OR of the adder's top bits,
    not a compare chain behind it (the statistics counters' bumps are on the
    controller's longest paths)."""
    n = len(counter)
    s = counter + amount
    if len(s) <= n:
        return s
    return Mux(s[n:].any(), (1 << n) - 1, s[:n])


class EsdCtrl(wiring.Component):
    """Elastic-SD controller for one :class:`~elmoe3d.config.Config`.

    Parameters
    ----------
    cfg : Config

    Members
    -------
    host_cmd, host_rsp, trace, tag_cmd, tag_rsp, ext_cmd, ext_rsp, fill_done,
    kv_req, kv_move, dp_step, dp_announce, dp_source, dp_done : streams
        See the module doc.

    Raises
    ------
    TypeError, ValueError
        For a Config that is not one, or a pass that can name more experts
        than the ExtCommand id can count.
    """

    def __init__(self, cfg: Config):
        if not isinstance(cfg, Config):
            raise TypeError(f"EsdCtrl needs a Config, not {cfg!r}")
        self.cfg = cfg
        self.entries = min(cfg.experts, cfg.batch_tokens * cfg.top_k)
        if self.entries > (1 << hv.CMD_ID_BITS):
            raise ValueError(f"A pass can name {self.entries} experts, more than the "
                             f"{1 << hv.CMD_ID_BITS} ExtCommand ids")
        self.t = t = esd_ports(cfg)
        S = stream.Signature
        super().__init__({
            "host_cmd": In(S(t["HostCommand"])), "host_rsp": Out(S(t["HostResponse"])),
            "trace": Out(S(t["TraceEvent"])),
            "tag_cmd": Out(S(t["TagCommand"])), "tag_rsp": In(S(t["TagResponse"])),
            "ext_cmd": Out(S(t["ExtCommand"])), "ext_rsp": In(S(t["ExtResponse"])),
            "fill_done": In(S(t["FillDone"])),
            "kv_req": Out(S(t["KVRequest"])), "kv_move": In(S(t["KVMove"])),
            "dp_step": Out(S(t["StepInfo"])), "dp_announce": In(S(t["ExpertNeed"])),
            "dp_source": Out(S(t["ExpertSource"])), "dp_done": In(S(t["PassStats"])),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, t = self.cfg, self.t
        S, E, L, T = cfg.tag_slots, cfg.experts, cfg.layers, cfg.batch_tokens
        n, khb = cfg.planes, cfg.hb_planes_eff
        hb_mask = (1 << khb) - 1
        all_mask = (1 << n) - 1
        plane_bytes = cfg.expert_bytes // n
        hot_max = (1 << cfg.hot_bits) - 1
        P = self.entries
        Ph = gesd.Phase

        # ---- register slices / FIFO on every port --------------------------------
        def out_slice(name):
            s = RegisterSlice(t[self._shape_name(name)])
            m.submodules[f"{name}_slice"] = s
            wiring.connect(m, s.o, wiring.flipped(getattr(self, name)))
            return s.i

        def in_slice(name):
            s = RegisterSlice(t[self._shape_name(name)])
            m.submodules[f"{name}_slice"] = s
            wiring.connect(m, wiring.flipped(getattr(self, name)), s.i)
            return s.o

        tq = fifo.SyncFIFOBuffered(width=data.Layout.cast(t["TraceEvent"]).size, depth=8)
        m.submodules.trace_fifo = tq
        m.d.comb += [self.trace.valid.eq(tq.r_stream.valid),
                     self.trace.payload.eq(tq.r_stream.payload),
                     tq.r_stream.ready.eq(self.trace.ready)]
        # Events enter the FIFO through a register slice: the FSM's event
        # multiplexer (every state's fields) ends at the slice's registers,
        # not at the FIFO's distributed-RAM storage, and ``emit``'s handshake
        # is the slice's ``i.ready`` (a flip-flop) instead of the FIFO's
        # level compare. An event reaches ``trace`` one cycle later; the
        # order and the FSM's cycles are unchanged while the trace is read.
        ts = RegisterSlice(t["TraceEvent"])
        m.submodules.trace_slice = ts
        m.d.comb += [tq.w_stream.valid.eq(ts.o.valid), tq.w_stream.payload.eq(ts.o.payload),
                     ts.o.ready.eq(tq.w_stream.ready)]
        ev = Signal(t["TraceEvent"])
        m.d.comb += ts.i.payload.eq(ev)

        host_i, host_o = in_slice("host_cmd"), out_slice("host_rsp")
        tag_o, tag_i = out_slice("tag_cmd"), in_slice("tag_rsp")
        ext_o, ext_i = out_slice("ext_cmd"), in_slice("ext_rsp")
        fill_i = in_slice("fill_done")
        kv_o, kv_i = out_slice("kv_req"), in_slice("kv_move")
        step_o, ann_i = out_slice("dp_step"), in_slice("dp_announce")
        src_o, done_i = out_slice("dp_source"), in_slice("dp_done")

        # ---- architectural state ---------------------------------------------------
        K = Signal(range(cfg.draft_len_max + 1), init=cfg.draft_len_init)
        round_open = Signal()
        expect_accept = Signal()
        mode = Signal()
        batch = Signal(range(gesd.MAX_BATCH + 1))
        round_k = Signal(range(cfg.draft_len_max + 1))
        ex_phase = Signal(2)
        ex_step = Signal(range(cfg.draft_len_max + 1))
        ex_layer = Signal(range(max(2, L)))
        kv_words = Signal(cfg.hb_words.bit_length())
        covered = Signal(S)
        since_decay = Signal(range(cfg.decay_period + 1))
        ctr = {name: Signal(cfg.stat_bits, name=f"ctr_{name}") for name in COUNTERS}

        def bump(name, amount=1):
            return ctr[name].eq(saturating_add(ctr[name], amount))

        # registered derived values (they change only with ROUND / KV moves, long
        # before they are used): keep the multiply and the popcount off the FSM
        usable = Signal(range(S + 1))
        m.d.sync += usable.eq(S - sum(covered[j] for j in range(S)))

        # ---- the command being executed ------------------------------------------
        cmd = Signal(t["HostCommand"])
        drafted = Signal(range(gesd.MAX_BATCH * cfg.draft_len_max + 1))
        verify_tok = Signal(range(gesd.MAX_BATCH * (cfg.draft_len_max + 1) + 1))
        m.d.sync += [drafted.eq(batch * round_k), verify_tok.eq(batch * (round_k + 1))]
        words = Signal(VALUE_BITS + 8)
        acc = Signal(data.StructLayout({
            "over": 1, "all": 1, "low": 1,
            "out": VALUE_BITS + 1,
            "back": len(drafted)}), name="acc")
        err = Signal(3)
        rsp_value = Signal(max(VALUE_BITS, cfg.stat_bits))
        phase = Signal(2)
        ntok = Signal(range(gesd.MAX_BATCH * (cfg.draft_len_max + 1) + 1))
        tok_left = Signal.like(ntok)
        pass_no = Signal(8)
        mask = Signal(E)
        probe = Signal(range(E + 1))
        probe_e = Signal(cfg.expert_bits)
        m.d.comb += probe_e.eq(probe)
        step_err = Signal()

        # pass table
        # packed vectors indexed with bit_select / word_select (continuous shifts in
        # Verilog, unlike Array's case blocks, which Icarus leaves X until an index changes)
        eb, sbits = cfg.expert_bits, _bits(S)
        t_exp, t_slot = Signal(P * eb), Signal(P * sbits)
        t_pin, t_fill, t_read, t_done = Signal(P), Signal(P), Signal(P), Signal(P)
        t_err = Signal(P * 3)
        e_exp = lambda i: t_exp.word_select(i, eb)
        e_slot = lambda i: t_slot.word_select(i, sbits)
        e_pin = lambda i: t_pin.bit_select(i, 1)
        e_fill = lambda i: t_fill.bit_select(i, 1)
        e_read = lambda i: t_read.bit_select(i, 1)
        e_done = lambda i: t_done.bit_select(i, 1)
        e_err = lambda i: t_err.word_select(i, 3)
        nent = Signal(range(P + 1))
        idx = Signal(range(P + 1))
        fill_seen = Signal(S)
        fill_ok = Signal(S)
        pass_done = Signal()

        ann = Signal(t["ExpertNeed"])
        trsp = Signal(t["TagResponse"])
        kvm = Signal(t["KVMove"])
        cur = Signal(range(P + 1))           # table index of the expert in hand
        # the expert in hand (front half) and the entry being ended (back half) as plain
        # registers: no dynamically indexed table read sits on a FSM decision path
        c_slot, c_pin, c_fill = Signal(_bits(S)), Signal(), Signal()
        x_exp, x_slot = Signal(cfg.expert_bits), Signal(_bits(S))
        x_pin, x_fill, x_read, x_err, x_ok = Signal(), Signal(), Signal(), Signal(3), Signal()
        inv_j = Signal(range(S + 1))

        # asynchronous reports: always accepted
        m.d.comb += [ext_i.ready.eq(1), fill_i.ready.eq(1)]
        with m.If(ext_i.valid):
            m.d.sync += [e_done(ext_i.payload.id).eq(1), e_err(ext_i.payload.id).eq(
                ext_i.payload.error)]
        # written as Mux expressions, not m.If: an `always @*` whose inputs have not
        # changed since time 0 is never evaluated by Icarus (X)
        fs_set = Signal(S)
        fo_set = Signal(S)
        one = Const(1, S)
        m.d.comb += [fs_set.eq(Mux(fill_i.valid, one << fill_i.payload.slot, 0)),
                     fo_set.eq(Mux(fill_i.valid & fill_i.payload.ok, one << fill_i.payload.slot,
                                   0))]
        fs_clr = Signal(S)
        m.d.sync += [fill_seen.eq((fill_seen & ~fs_clr) | fs_set),
                     fill_ok.eq((fill_ok & ~fs_clr) | fo_set)]

        # cycles per phase (while a STEP of that phase runs)
        in_step = Signal()
        with m.If(in_step):
            with m.Switch(phase):
                with m.Case(Ph.AR):
                    m.d.sync += bump("ar_cycles")
                with m.Case(Ph.DRAFT):
                    m.d.sync += bump("draft_cycles")
                with m.Case(Ph.VERIFY):
                    m.d.sync += bump("verify_cycles")

        tag_of = Signal(cfg.tag_bits)
        m.d.comb += tag_of.eq(Cat(ann.expert, cmd.layer))

        # Every field of a driven payload is assigned in the driving state, the
        # unused ones to 0: a field left to its comb default comes from an
        # `always @*` with no changing input, which Icarus never evaluates (X).
        ev_fields = [name for name, _ in data.Layout.cast(t["TraceEvent"])]
        tag_fields = [name for name, _ in data.Layout.cast(t["TagCommand"])]

        def emit(kind, **fields):
            """Drive one trace event this cycle; returns the handshake."""
            m.d.comb += [ts.i.valid.eq(1), ev.kind.eq(kind)]
            for f in ev_fields:
                if f != "kind":
                    m.d.comb += getattr(ev, f).eq(fields.get(f, 0))
            return ts.i.ready

        def tag(op, **fields):
            m.d.comb += [tag_o.valid.eq(1), tag_o.payload.op.eq(op)]
            for f in tag_fields:
                if f != "op":
                    m.d.comb += getattr(tag_o.payload, f).eq(fields.get(f, 0))
            return tag_o.ready

        P_ = dict(phase=phase, step=cmd.step, layer=cmd.layer, pass_no=pass_no)
        EK = gesd.EventKind

        with m.FSM(name="esd", init="START") as fsm:
            # one cycle out of reset first: the state register changes, so every
            # `always @*` that reads it is evaluated (Icarus 11 leaves a block whose
            # inputs never changed since time 0 at X)
            with m.State("START"):
                m.next = "IDLE"
            with m.State("IDLE"):
                m.d.comb += host_i.ready.eq(1)
                with m.If(host_i.valid):
                    m.d.sync += [cmd.eq(host_i.payload), err.eq(0), rsp_value.eq(0)]
                    # ACCEPT's arithmetic, from the command as it is taken
                    # (``batch`` and ``drafted`` change only with ROUND, long
                    # before): ACCEPT, ROLLBACK and ADAPT test registers
                    nv = host_i.payload.value
                    m.d.sync += [acc.over.eq(nv > drafted), acc.all.eq(nv == drafted),
                                 acc.low.eq(nv * 2 < drafted), acc.out.eq(nv + batch),
                                 acc.back.eq(drafted - nv)]
                    with m.Switch(host_i.payload.op):
                        with m.Case(HostOp.ROUND):
                            m.next = "ROUND"
                        with m.Case(HostOp.STEP):
                            m.next = "STEP"
                        with m.Case(HostOp.ACCEPT):
                            m.next = "ACCEPT"
                        with m.Case(HostOp.CONTEXT):
                            m.next = "CONTEXT"
                        with m.Case(HostOp.COUNTER):
                            m.next = "COUNTER"
                        with m.Default():
                            m.d.sync += err.eq(gesd.HostError.BAD_PHASE)
                            m.next = "RESPOND"

            # ---- ROUND: the mode decision ------------------------------------------
            with m.State("ROUND"):
                b = cmd.value[:8]
                force = cmd.value[8:10]                 # 0 auto, 1 AR, 2 SD
                with m.If((b < 1) | (b > gesd.MAX_BATCH) | round_open | (force == 3) |
                          (cmd.value[10:] != 0)):
                    m.d.sync += err.eq(gesd.HostError.BAD_BATCH)
                    m.next = "RESPOND"
                with m.Else():
                    want = Mux(force == 0, b >= cfg.sd_threshold, force == 2)
                    sd = want & (usable >= cfg.min_free_slots)
                    reason = Mux(force == 1, gesd.ModeReason.HOST,
                                 Mux(~want, gesd.ModeReason.BATCH,
                                     Mux(sd, gesd.ModeReason.SD, gesd.ModeReason.BACKOFF)))
                    with m.If(emit(EK.MODE, code=sd, value=Mux(sd, K, 0), tag=reason)):
                        m.d.sync += [mode.eq(sd), batch.eq(b), round_k.eq(Mux(sd, K, 0)),
                                     round_open.eq(1), ex_phase.eq(Mux(sd, Ph.DRAFT, Ph.AR)),
                                     ex_step.eq(0), ex_layer.eq(0)]
                        with m.If(sd):
                            m.d.sync += bump("rounds_sd")
                        with m.Else():
                            m.d.sync += bump("rounds_ar")
                        m.next = "RESPOND"

            # ---- STEP: one layer step ----------------------------------------------
            with m.State("STEP"):
                with m.If(~round_open | expect_accept | (cmd.phase != ex_phase)):
                    m.d.sync += err.eq(gesd.HostError.BAD_PHASE)
                    m.next = "RESPOND"
                with m.Elif((cmd.step != ex_step) | (cmd.layer != ex_layer)):
                    m.d.sync += err.eq(gesd.HostError.BAD_ORDER)
                    m.next = "RESPOND"
                with m.Else():
                    tok = Mux(cmd.phase == Ph.VERIFY, verify_tok, batch)
                    m.d.sync += [phase.eq(cmd.phase), ntok.eq(tok), tok_left.eq(tok),
                                 pass_no.eq(0), mask.eq(0), probe.eq(0), step_err.eq(0),
                                 in_step.eq(1)]
                    m.next = "STEP_KIND"
            with m.State("STEP_KIND"):
                with m.If(phase == Ph.DRAFT):
                    m.next = "PROBE"
                with m.Else():
                    m.d.sync += mask.eq((1 << E) - 1)
                    m.next = "DP_STEP"

            # DRAFT eligibility: LOOKUP every expert of the layer
            with m.State("PROBE"):
                with m.If(tag(TagOp.LOOKUP, tag=Cat(probe_e, cmd.layer))):
                    m.next = "PROBE_RSP"
            with m.State("PROBE_RSP"):
                m.d.comb += tag_i.ready.eq(1)
                with m.If(tag_i.valid):
                    hit = tag_i.payload.hit & (tag_i.payload.error == hv.TagErrorCode.OK)
                    m.d.sync += [mask.eq(mask | (hit << probe)), probe.eq(probe + 1),
                                 bump("draft_lookups")]
                    m.next = "PROBE_NEXT"
            with m.State("PROBE_NEXT"):
                m.next = "ELIGIBLE"
                with m.If(probe < E):
                    m.next = "PROBE"
            with m.State("ELIGIBLE"):
                with m.If(emit(EK.ELIGIBLE, phase=phase, step=cmd.step, layer=cmd.layer,
                               value=mask)):
                    m.next = "DP_STEP"

            with m.State("DP_STEP"):
                m.d.comb += [step_o.valid.eq(1), step_o.payload.phase.eq(phase),
                             step_o.payload.layer.eq(cmd.layer), step_o.payload.mask.eq(mask),
                             step_o.payload.tokens.eq(ntok)]
                with m.If(step_o.ready):
                    m.next = "PASS"

            # ---- a pass ------------------------------------------------------------
            with m.State("PASS"):
                ptok = Mux(tok_left > T, T, tok_left)
                with m.If(emit(EK.PASS, **P_, value=ptok)):
                    m.d.sync += [nent.eq(0), pass_done.eq(0)]
                    m.d.sync += [t_pin.eq(0), t_fill.eq(0), t_read.eq(0), t_done.eq(0),
                                 t_err.eq(0)]
                    m.next = "ANNOUNCE"
            with m.State("ANNOUNCE"):
                m.d.comb += ann_i.ready.eq(1)
                with m.If(ann_i.valid):
                    m.d.sync += [ann.eq(ann_i.payload), cur.eq(nent), c_slot.eq(0), c_pin.eq(0),
                                 c_fill.eq(0)]
                    with m.If(ann_i.payload.none):
                        m.next = "PASS_WAIT"
                    with m.Else():
                        m.d.sync += [nent.eq(nent + 1), e_exp(nent).eq(ann_i.payload.expert)]
                        m.next = "LOOKUP_PIN"
            with m.State("LOOKUP_PIN"):
                with m.If(tag(TagOp.LOOKUP_PIN, tag=tag_of)):
                    m.next = "LOOKUP_RSP"
            with m.State("LOOKUP_RSP"):
                m.d.comb += tag_i.ready.eq(1)
                with m.If(tag_i.valid):
                    m.d.sync += trsp.eq(tag_i.payload)
                    m.next = "EV_LOOKUP"
            with m.State("EV_LOOKUP"):
                hit = trsp.hit & (trsp.error == hv.TagErrorCode.OK)
                code = Mux(hit, gesd.LookupResult.HIT,
                           Mux(trsp.pending, gesd.LookupResult.PENDING, gesd.LookupResult.MISS))
                with m.If(emit(EK.LOOKUP, **P_, expert=ann.expert, code=code,
                               slot=Mux(hit | trsp.pending, trsp.slot, 0), value=ann.tokens)):
                    m.d.sync += [e_slot(cur).eq(trsp.slot), c_slot.eq(trsp.slot)]
                    with m.If(hit):
                        m.d.sync += [e_pin(cur).eq(1), c_pin.eq(1)]
                        with m.If(phase != Ph.DRAFT):
                            m.d.sync += bump("hb_hits")
                        m.next = "EV_SOURCE_HB"
                    with m.Elif(trsp.pending & (phase != Ph.DRAFT)):
                        m.d.sync += [bump("hb_pending"), e_slot(cur).eq(0), c_slot.eq(0)]
                        m.next = "EV_SOURCE_LPDDR"
                    with m.Else():
                        m.d.sync += bump("hb_misses")
                        m.next = "ALLOCATE"
            # hit: HB (DRAFT) or SPLIT (AR / VERIFY)
            with m.State("EV_SOURCE_HB"):
                draft = phase == Ph.DRAFT
                lmask = all_mask & ~hb_mask
                with m.If(emit(EK.SOURCE, **P_, expert=ann.expert, slot=c_slot,
                               code=Mux(draft, gesd.Source.HB, gesd.Source.SPLIT),
                               value=Mux(draft, hb_mask, hb_mask | (lmask << n)))):
                    with m.If(draft):
                        m.d.sync += bump("hb_bytes", khb * plane_bytes)
                    with m.Else():
                        m.d.sync += [bump("hb_bytes", khb * plane_bytes),
                                     bump("lpddr_bytes", (n - khb) * plane_bytes)]
                    m.next = "HIT_TOUCH?"
            with m.State("HIT_TOUCH?"):
                with m.If((phase == Ph.DRAFT) | (phase == Ph.AR)):
                    m.next = "TOUCH"
                with m.Else():
                    m.next = "EXT_SPLIT"
            with m.State("TOUCH"):
                amt = _clamp(ann.tokens, hot_max)
                with m.If(tag(TagOp.TOUCH, tag=tag_of, amount=amt)):
                    m.next = "TOUCH_RSP"
            with m.State("TOUCH_RSP"):
                m.d.comb += tag_i.ready.eq(1)
                with m.If(tag_i.valid):
                    m.next = "EV_TOUCH"
            with m.State("EV_TOUCH"):
                amt = _clamp(ann.tokens, hot_max)
                with m.If(emit(EK.TOUCH, **P_, expert=ann.expert, slot=c_slot, value=amt)):
                    m.d.sync += bump("touches")
                    m.next = "TOUCH_NEXT"
            with m.State("TOUCH_NEXT"):
                with m.If(phase == Ph.DRAFT):
                    m.next = "SOURCE_OUT"
                with m.Else():
                    m.next = "EXT_SPLIT"
            with m.State("EXT_SPLIT"):
                m.d.comb += [ext_o.valid.eq(1),
                             ext_o.payload.kind.eq(hv.ExtKindCode.EXPERT),
                             ext_o.payload.addr.eq(self._expert_addr(cmd.layer, ann.expert)),
                             ext_o.payload.plane_mask.eq(all_mask & ~hb_mask),
                             ext_o.payload.fill.eq(0), ext_o.payload.slot.eq(c_slot),
                             ext_o.payload.id.eq(cur), ext_o.payload.length.eq(0)]
                with m.If(ext_o.ready):
                    m.d.sync += e_read(cur).eq(1)
                    m.next = "SOURCE_OUT"
            # miss: ALLOCATE a victim
            with m.State("ALLOCATE"):
                amt = _clamp(ann.tokens, hot_max)
                with m.If(tag(TagOp.ALLOCATE, tag=tag_of, planes=khb, amount=amt)):
                    m.next = "ALLOCATE_RSP"
            with m.State("ALLOCATE_RSP"):
                m.d.comb += tag_i.ready.eq(1)
                with m.If(tag_i.valid):
                    m.d.sync += trsp.eq(tag_i.payload)
                    m.next = "EV_ALLOCATE"
            with m.State("EV_ALLOCATE"):
                amt = _clamp(ann.tokens, hot_max)
                ok = trsp.error == hv.TagErrorCode.OK
                code = Mux(ok, Mux(trsp.evicted, gesd.AllocResult.EVICT, gesd.AllocResult.FREE),
                           gesd.AllocResult.NO_VICTIM)
                with m.If(emit(EK.ALLOCATE, **P_, expert=ann.expert, code=code,
                               slot=Mux(ok, trsp.slot, 0),
                               tag=Mux(ok & trsp.evicted, trsp.evicted_tag, 0),
                               value=Mux(ok, amt, 0))):
                    with m.If(ok):
                        m.d.sync += [e_slot(cur).eq(trsp.slot), e_pin(cur).eq(1),
                                     e_fill(cur).eq(1), c_slot.eq(trsp.slot), c_pin.eq(1),
                                     c_fill.eq(1), bump("allocations")]
                        with m.If(trsp.evicted):
                            m.d.sync += bump("evictions")
                        m.next = "EV_FILL_START"
                    with m.Else():
                        m.d.sync += [e_slot(cur).eq(0), c_slot.eq(0), bump("no_victim")]
                        m.next = "EV_SOURCE_LPDDR"
            with m.State("EV_FILL_START"):
                with m.If(emit(EK.FILL_START, **P_, expert=ann.expert, slot=c_slot,
                               value=hb_mask)):
                    m.next = "EV_SOURCE_LPDDR"
            with m.State("EV_SOURCE_LPDDR"):
                with m.If(emit(EK.SOURCE, **P_, expert=ann.expert, slot=c_slot,
                               code=gesd.Source.LPDDR, value=all_mask << n)):
                    m.d.sync += bump("lpddr_bytes", n * plane_bytes)
                    m.next = "EXT_FULL"
            with m.State("EXT_FULL"):
                m.d.comb += [ext_o.valid.eq(1),
                             ext_o.payload.kind.eq(hv.ExtKindCode.EXPERT),
                             ext_o.payload.addr.eq(self._expert_addr(cmd.layer, ann.expert)),
                             ext_o.payload.plane_mask.eq(all_mask),
                             ext_o.payload.fill.eq(c_fill),
                             ext_o.payload.slot.eq(c_slot), ext_o.payload.id.eq(cur),
                             ext_o.payload.length.eq(0)]
                with m.If(ext_o.ready):
                    m.d.sync += e_read(cur).eq(1)
                    m.next = "SOURCE_OUT"
            with m.State("SOURCE_OUT"):
                # (no LSB plane group is HB-resident for this controller)
                m.d.comb += [src_o.valid.eq(1),
                             src_o.payload.hb.eq(c_pin & ~c_fill),
                             src_o.payload.slot.eq(c_slot),
                             src_o.payload.lsb_hb.eq(0), src_o.payload.lsb_slot.eq(0)]
                with m.If(src_o.ready):
                    m.next = "NEXT_EXPERT"
            with m.State("NEXT_EXPERT"):
                with m.If(ann.last):
                    m.next = "PASS_WAIT"
                with m.Else():
                    m.next = "ANNOUNCE"

            # the end of a pass: the datapath, every read and every fill ended
            with m.State("PASS_WAIT"):
                m.d.comb += done_i.ready.eq(~pass_done)
                with m.If(done_i.valid & ~pass_done):
                    m.d.sync += pass_done.eq(1)
                reads_done = Const(1)
                for i in range(P):
                    live = i < nent
                    need_fill = e_fill(i) & ~fill_seen.bit_select(e_slot(i), 1)
                    reads_done = reads_done & ~(live & ((e_read(i) & ~e_done(i)) | need_fill))
                with m.If(pass_done & reads_done):
                    m.d.sync += idx.eq(0)
                    m.next = "END_LOAD"
            with m.State("END_LOAD"):
                m.d.sync += [x_exp.eq(e_exp(idx)), x_slot.eq(e_slot(idx)), x_pin.eq(e_pin(idx)),
                             x_fill.eq(e_fill(idx)), x_read.eq(e_read(idx)),
                             x_err.eq(e_err(idx)),
                             x_ok.eq(fill_ok.bit_select(e_slot(idx), 1) & (e_err(idx) == 0))]
                m.next = "PASS_NEXT"
                with m.If(idx != nent):
                    m.next = "END_ENTRY"
            with m.State("END_ENTRY"):
                with m.If(x_read & (x_err != 0)):
                    m.next = "EV_EXT_ERROR"
                with m.Elif(x_fill):
                    m.next = "EV_FILL_END"
                with m.Elif(x_pin):
                    m.next = "UNPIN"
                with m.Else():
                    m.d.sync += idx.eq(idx + 1)
                    m.next = "END_LOAD"
            with m.State("EV_EXT_ERROR"):
                with m.If(emit(EK.EXT_ERROR, **P_, expert=x_exp, slot=x_slot,
                               value=x_err)):
                    m.d.sync += [bump("ext_errors"), step_err.eq(1)]
                    m.next = "AFTER_ERROR"
            with m.State("AFTER_ERROR"):
                with m.If(x_fill):
                    m.next = "EV_FILL_END"
                with m.Elif(x_pin):
                    m.next = "UNPIN"
                with m.Else():
                    m.d.sync += idx.eq(idx + 1)
                    m.next = "END_LOAD"
            with m.State("EV_FILL_END"):
                good = x_ok
                with m.If(emit(EK.FILL_END, **P_, expert=x_exp, slot=x_slot,
                               code=Mux(good, gesd.FillEnd.COMMIT, gesd.FillEnd.ABORT))):
                    with m.If(good):
                        m.d.sync += bump("fills")
                        m.next = "UNPIN"
                    with m.Else():
                        m.d.sync += [bump("aborts"), step_err.eq(1)]
                        m.next = "ABORT"
            with m.State("ABORT"):
                with m.If(tag(TagOp.ABORT, slot=x_slot)):
                    m.next = "ABORT_RSP"
            with m.State("ABORT_RSP"):
                m.d.comb += tag_i.ready.eq(1)
                with m.If(tag_i.valid):
                    m.next = "EV_INVALIDATE_ABORT"
            with m.State("EV_INVALIDATE_ABORT"):
                with m.If(emit(EK.INVALIDATE, **P_, expert=x_exp, slot=x_slot,
                               code=gesd.InvalidateReason.ABORT)):
                    m.d.sync += idx.eq(idx + 1)
                    m.next = "END_LOAD"
            with m.State("UNPIN"):
                with m.If(tag(TagOp.UNPIN, slot=x_slot)):
                    m.next = "UNPIN_RSP"
            with m.State("UNPIN_RSP"):
                m.d.comb += tag_i.ready.eq(1)
                with m.If(tag_i.valid):
                    m.next = "EV_UNPIN"
            with m.State("EV_UNPIN"):
                with m.If(emit(EK.UNPIN, **P_, expert=x_exp, slot=x_slot)):
                    m.d.sync += idx.eq(idx + 1)
                    m.next = "END_LOAD"
            with m.State("PASS_NEXT"):
                with m.If(tok_left > T):
                    m.d.sync += [tok_left.eq(tok_left - T), pass_no.eq(pass_no + 1)]
                    m.next = "PASS"
                with m.Else():
                    m.next = "LAYER_DONE"

            # ---- the end of a layer step -------------------------------------------
            with m.State("LAYER_DONE"):
                with m.If(emit(EK.LAYER_DONE, phase=phase, step=cmd.step, layer=cmd.layer,
                               code=step_err)):
                    m.d.sync += [in_step.eq(0), rsp_value.eq(step_err)]
                    with m.If(step_err):
                        m.next = "RESPOND"
                    with m.Elif(cmd.layer + 1 < L):
                        m.d.sync += ex_layer.eq(cmd.layer + 1)
                        m.next = "RESPOND"
                    with m.Else():
                        m.next = "STEP_END"
            with m.State("STEP_END"):
                m.d.sync += ex_layer.eq(0)
                with m.If(phase == Ph.VERIFY):
                    m.d.sync += expect_accept.eq(1)
                    m.next = "RESPOND"
                with m.Else():
                    m.d.sync += [bump("decode_steps"), since_decay.eq(since_decay + 1)]
                    with m.If(phase == Ph.AR):
                        m.d.sync += [round_open.eq(0), bump("tokens_out", batch)]
                    with m.Elif(cmd.step + 1 < round_k):
                        m.d.sync += ex_step.eq(cmd.step + 1)
                    with m.Else():
                        m.d.sync += [ex_phase.eq(Ph.VERIFY), ex_step.eq(0)]
                    m.next = "DECAY?"
            with m.State("DECAY?"):
                with m.If(since_decay >= cfg.decay_period):
                    m.next = "DECAY"
                with m.Else():
                    m.next = "RESPOND"
            with m.State("DECAY"):
                with m.If(tag(TagOp.DECAY)):
                    m.next = "DECAY_RSP"
            with m.State("DECAY_RSP"):
                m.d.comb += tag_i.ready.eq(1)
                with m.If(tag_i.valid):
                    m.next = "EV_DECAY"
            with m.State("EV_DECAY"):
                with m.If(emit(EK.DECAY, value=ctr["decode_steps"])):
                    m.d.sync += [since_decay.eq(0), bump("decays")]
                    m.next = "RESPOND"

            # ---- ACCEPT n ----------------------------------------------------------
            with m.State("ACCEPT"):
                with m.If(~round_open | ~expect_accept | acc.over):
                    m.d.sync += err.eq(gesd.HostError.BAD_ACCEPT)
                    m.next = "RESPOND"
                with m.Else():
                    with m.If(emit(EK.ACCEPT, value=cmd.value)):
                        m.d.sync += [bump("accepted_tokens", cmd.value),
                                     bump("drafted_tokens", drafted),
                                     bump("tokens_out", acc.out)]
                        m.next = "ROLLBACK"
            with m.State("ROLLBACK"):
                with m.If(acc.all):
                    m.next = "ADAPT"
                with m.Else():
                    with m.If(emit(EK.ROLLBACK, value=acc.back)):
                        m.next = "ADAPT"
            with m.State("ADAPT"):
                newk = Signal.like(K)
                with m.If(acc.all & (K < cfg.draft_len_max)):
                    m.d.comb += newk.eq(K + 1)
                with m.Elif(acc.low & (K > cfg.draft_len_min)):
                    m.d.comb += newk.eq(K - 1)
                with m.Else():
                    m.d.comb += newk.eq(K)
                with m.If(newk == K):
                    m.d.sync += [round_open.eq(0), expect_accept.eq(0)]
                    m.next = "RESPOND"
                with m.Else():
                    with m.If(emit(EK.DRAFT_LEN, value=newk)):
                        m.d.sync += [K.eq(newk), round_open.eq(0), expect_accept.eq(0)]
                        m.next = "RESPOND"

            # ---- CONTEXT: the KV boundary ------------------------------------------
            with m.State("CONTEXT"):
                m.d.sync += words.eq(cmd.value * cfg.kv_words_per_token)
                m.next = "CONTEXT_CHECK"
            with m.State("CONTEXT_CHECK"):
                with m.If(words > gl.kv_limit(cfg)):
                    m.d.sync += err.eq(gesd.HostError.KV_RANGE)
                    m.next = "RESPOND"
                with m.Elif(words == kv_words):
                    m.next = "RESPOND"
                with m.Else():
                    m.next = "KV_REQ"
            with m.State("KV_REQ"):
                m.d.comb += [kv_o.valid.eq(1), kv_o.payload.kv_words.eq(words)]
                with m.If(kv_o.ready):
                    m.next = "KV_WAIT"
            with m.State("KV_WAIT"):
                m.d.comb += kv_i.ready.eq(1)
                with m.If(kv_i.valid):
                    newcov = Signal(S)
                    for j in range(S):
                        lim = cfg.hb_words - cfg.expert_base - (j + 1) * cfg.slot_words
                        m.d.comb += newcov[j].eq(words > lim) if lim >= 0 else newcov[j].eq(1)
                    m.d.sync += [kvm.eq(kv_i.payload), kv_words.eq(words), covered.eq(newcov),
                                 bump("kv_moves"), inv_j.eq(0)]
                    m.next = "KV_SETTLE"
            with m.State("KV_SETTLE"):                # `usable` follows `covered` a cycle later
                m.next = "EV_KV_MOVE"
            with m.State("EV_KV_MOVE"):
                with m.If(emit(EK.KV_MOVE, value=kv_words, tag=usable)):
                    m.next = "KV_INV"
            with m.State("KV_INV"):
                with m.If(inv_j == S):
                    m.next = "RESPOND"
                with m.Elif(~kvm.invalidated.bit_select(inv_j, 1)):
                    m.d.sync += inv_j.eq(inv_j + 1)
                with m.Else():
                    with m.If(emit(EK.INVALIDATE, slot=inv_j, code=gesd.InvalidateReason.KV)):
                        m.d.sync += [inv_j.eq(inv_j + 1), bump("kv_invalidations")]

            # ---- COUNTER readout ---------------------------------------------------
            with m.State("COUNTER"):
                sel = Array(ctr[c] for c in COUNTERS)
                with m.If(cmd.value >= len(COUNTERS)):
                    m.d.sync += err.eq(gesd.HostError.BAD_ORDER)
                with m.Else():
                    m.d.sync += rsp_value.eq(sel[cmd.value[:_bits(len(COUNTERS))]])
                m.next = "RESPOND"

            with m.State("RESPOND"):
                m.d.comb += [host_o.valid.eq(1), host_o.payload.op.eq(cmd.op),
                             host_o.payload.error.eq(err), host_o.payload.mode.eq(mode),
                             host_o.payload.k.eq(round_k), host_o.payload.value.eq(rsp_value)]
                with m.If(host_o.ready):
                    m.next = "IDLE"
        m.d.comb += fs_clr.eq(Mux(fsm.ongoing("EV_FILL_END") & ts.i.ready,
                                  Const(1, S) << x_slot, 0))
        return m

    # -- helpers -----------------------------------------------------------------------
    _NAMES = {"host_cmd": "HostCommand", "host_rsp": "HostResponse", "tag_cmd": "TagCommand",
              "tag_rsp": "TagResponse", "ext_cmd": "ExtCommand", "ext_rsp": "ExtResponse",
              "fill_done": "FillDone", "kv_req": "KVRequest", "kv_move": "KVMove",
              "dp_step": "StepInfo", "dp_announce": "ExpertNeed", "dp_source": "ExpertSource",
              "dp_done": "PassStats"}

    def _shape_name(self, port):
        return self._NAMES[port]

    def _expert_addr(self, layer, expert):
        cfg = self.cfg
        return cfg.lpddr_base + (layer * cfg.experts + expert) * cfg.expert_bytes


def _from_params(**fields):
    return EsdCtrl(Config(**fields))


def _params(cfg):
    return cfg.to_dict()


def _block_specs():
    from ..blocks import Block
    return [Block("esd_ctrl", "elmoe3d_esd_ctrl",
                  "Elastic-SD controller: AR/SD sequencer, draft eligibility, fills, pins, "
                  "DECAY, draft length, KV back-off",
                  params=_params, factory=_from_params, order=70,
                  timing="one tag-unit command in flight; events in the golden control "
                         "sequence's order")]


BLOCK_SPECS = _block_specs()

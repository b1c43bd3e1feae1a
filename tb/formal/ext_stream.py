"""Formal wrapper of :class:`elmoe3d.hw.ext_stream.ExtStream` (the AXI4 read
master), for SymbiYosys bounded model checks on a small geometry.

Properties (``Assert``), against every legal environment (``Assume``):

* ``ar_stable``: once ``arvalid`` is high without ``arready``, ``arvalid``
  stays high and ``araddr``/``arlen``/``arsize``/``arburst``/``arid`` stay
  unchanged until the handshake;
* ``ar_legal``: INCR, full-width beats, ID 0, at most ``axi_max_burst`` beats,
  and no burst crosses a 4 KiB boundary;
* ``outstanding``: at most ``axi_outstanding`` bursts in flight (a shadow
  queue of the ``ARLEN`` of every accepted burst frames the R beats);
* ``rlast`` (with ``single=True``: one command in flight at a time): a
  command during which any R beat had ``RLAST`` not on exactly its burst's
  ``ARLEN``-th beat, an ``RID`` other than 0, or ``RRESP`` other than OKAY
  gets an error response; a command with only good beats gets OK or RANGE;
  a RANGE command issued no burst; every response of a command whose PE
  stream was open ends that stream with ``last`` (``error`` when it failed);
* stream rules on every stream port (:func:`~elmoe3d.tb.formal.common.stream_rules_all`).

The environment: ``m_axi_r*`` obeys the AXI handshake (``rvalid`` held with
its payload until ``rready``) and sends a beat only while a burst is in
flight; everything else (data, ``RRESP``, ``RLAST``, ``RID``, pauses,
commands, back-pressure) is free.

Planted bugs (``bug=``) that must fail: ``hide_rlast`` (the DUT is shown a
correct ``RLAST`` whatever the slave sent: a master that ignores RLAST) and
``outstanding`` (the DUT is built with one more outstanding burst than the
property allows).
"""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Cover, Module, ResetSignal, Signal
from amaranth.lib import wiring

from ...config import Config
from ...golden.vocab import AXI_4K
from ...hw.ext_stream import ExtStream
from ...hw.vocab import ExtErrorCode
from .common import history_ok, stream_rules_all

__all__ = ["ExtStreamFormal", "FORMAL_CONFIG"]

#: A geometry small enough for BMC whose LPDDR window still spans a 4 KiB
#: boundary: 8-bit slice vectors, 2 banks, 16-bit AXI (2 words per beat),
#: 24-beat experts of 12 two-beat runs, 96 experts, 4-beat bursts, 2 in flight.
FORMAL_CONFIG = Config(slice_bits=4, lanes=2, pes=2, max_len=8, hb_words=4096, tag_slots=2,
                       layer_bits=1, expert_bits=7, layers=1, hidden=4, ffn=4, experts=96,
                       top_k=1, batch_tokens=1, token_lanes=1, axi_data_bits=16, axi_addr_bits=14,
                       axi_id_bits=1, axi_max_burst=4, axi_outstanding=2, sd_threshold=1,
                       draft_len_max=1, draft_len_init=1, min_free_slots=0)


class ExtStreamFormal(wiring.Component):
    def __init__(self, cfg: Config = FORMAL_CONFIG, *, single: bool = False,
                 bug: str | None = None):
        if bug not in (None, "hide_rlast", "outstanding"):
            raise ValueError(f"Unknown planted bug {bug!r}")
        self.cfg, self.single, self.bug = cfg, single, bug
        built = cfg.replace(axi_outstanding=cfg.axi_outstanding + 1) if bug == "outstanding" \
            else cfg
        self.dut = ExtStream(built)
        super().__init__(self.dut.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        cfg = self.cfg
        N = cfg.axi_outstanding
        bb = cfg.axi_beat_bits // 8
        m.d.comb += Assume(~ResetSignal())
        ok = history_ok(m)
        for name in ("cmd",):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(dut, name))
        for name in ("rsp", "pe", "fill"):
            wiring.connect(m, getattr(dut, name), wiring.flipped(getattr(self, name)))
        for name in ("m_axi_arid", "m_axi_araddr", "m_axi_arlen", "m_axi_arsize",
                     "m_axi_arburst", "m_axi_arvalid", "m_axi_rready"):
            m.d.comb += getattr(self, name).eq(getattr(dut, name))
        for name in ("m_axi_arready", "m_axi_rid", "m_axi_rdata", "m_axi_rresp",
                     "m_axi_rvalid"):
            m.d.comb += getattr(dut, name).eq(getattr(self, name))
        stream_rules_all(m, self)
        with m.If(self.pe.valid & self.pe.payload.error):
            m.d.comb += Assert(self.pe.payload.last, "a PE error beat without last")

        # -- AR channel ---------------------------------------------------------------
        ar = [self.m_axi_araddr, self.m_axi_arlen, self.m_axi_arsize, self.m_axi_arburst,
              self.m_axi_arid]
        p_wait = Signal()
        p_ar = [Signal.like(s, name=f"p_{i}") for i, s in enumerate(ar)]
        m.d.sync += [p_wait.eq(self.m_axi_arvalid & ~self.m_axi_arready)]
        m.d.sync += [p.eq(s) for p, s in zip(p_ar, ar)]
        with m.If(ok & p_wait):
            m.d.comb += Assert(self.m_axi_arvalid, "ar_stable: arvalid dropped")
            for p, s in zip(p_ar, ar):
                m.d.comb += Assert(s == p, "ar_stable: AR payload changed before arready")
        with m.If(self.m_axi_arvalid):
            m.d.comb += [
                Assert((self.m_axi_arburst == 1) & (self.m_axi_arsize == bb.bit_length() - 1)
                       & (self.m_axi_arid == 0), "ar_legal: burst type, size or id"),
                Assert(self.m_axi_arlen < cfg.axi_max_burst, "ar_legal: burst too long"),
                Assert(self.m_axi_araddr[:12] + (self.m_axi_arlen + 1) * bb <= AXI_4K,
                       "ar_legal: burst crosses 4 KiB"),
            ]

        # -- R channel: shadow framing ------------------------------------------------
        depth = N + 2
        lens = [Signal(8, name=f"q_len{i}") for i in range(depth)]
        count = Signal(range(depth + 1))
        cnt = Signal(8)                          # beats of the head burst already seen
        ar_fire = self.m_axi_arvalid & self.m_axi_arready
        r_fire = self.m_axi_rvalid & self.m_axi_rready
        head_done = r_fire & (cnt == lens[0])
        expect_last = cnt == lens[0]
        m.d.comb += Assert(count <= N, "outstanding: more bursts in flight than allowed")
        m.d.comb += Assume(~self.m_axi_rvalid | (count != 0))
        # R handshake rule for the environment
        p_rwait = Signal()
        p_r = [Signal.like(s, name=f"p_r{i}") for i, s in
               enumerate((self.m_axi_rid, self.m_axi_rdata, self.m_axi_rresp, self.m_axi_rlast))]
        m.d.sync += p_rwait.eq(self.m_axi_rvalid & ~self.m_axi_rready)
        m.d.sync += [p.eq(s) for p, s in zip(p_r, (self.m_axi_rid, self.m_axi_rdata,
                                                   self.m_axi_rresp, self.m_axi_rlast))]
        with m.If(ok & p_rwait):
            m.d.comb += Assume(self.m_axi_rvalid)
            for p, s in zip(p_r, (self.m_axi_rid, self.m_axi_rdata, self.m_axi_rresp,
                                  self.m_axi_rlast)):
                m.d.comb += Assume(s == p)
        with m.If(r_fire):
            m.d.sync += cnt.eq(cnt + 1)
        with m.If(head_done):
            m.d.sync += cnt.eq(0)
        # the queue of ARLENs
        pop = head_done
        with m.If(pop):
            for i in range(depth - 1):
                m.d.sync += lens[i].eq(lens[i + 1])
        idx = count - pop
        with m.If(ar_fire):
            for i in range(depth):
                with m.If(idx == i):
                    m.d.sync += lens[i].eq(self.m_axi_arlen)
        m.d.sync += count.eq(count + ar_fire - pop)
        # what the DUT sees on RLAST
        if self.bug == "hide_rlast":
            m.d.comb += dut.m_axi_rlast.eq(expect_last)
        else:
            m.d.comb += dut.m_axi_rlast.eq(self.m_axi_rlast)

        # -- one command at a time: the error rules -------------------------------------
        if self.single:
            busy = Signal()                     # a command accepted, its response not yet
            bad = Signal()                      # a bad beat during the command
            issued = Signal()                   # a burst issued during the command
            pe_last = Signal()                  # the PE stream delivered a `last`
            pe_err = Signal()
            cmd_fire = self.cmd.valid & self.cmd.ready
            rsp_fire = self.rsp.valid & self.rsp.ready
            m.d.comb += Assume(~self.cmd.valid | ~busy | rsp_fire)
            beat_bad = r_fire & ((self.m_axi_rlast != expect_last) | (self.m_axi_rid != 0)
                                 | (self.m_axi_rresp != 0))
            with m.If(cmd_fire):
                m.d.sync += [busy.eq(1), bad.eq(0), issued.eq(0), pe_last.eq(0), pe_err.eq(0)]
            with m.Else():
                with m.If(beat_bad):
                    m.d.sync += bad.eq(1)
                with m.If(ar_fire):
                    m.d.sync += issued.eq(1)
                with m.If(self.pe.valid & self.pe.ready & self.pe.payload.last):
                    m.d.sync += [pe_last.eq(1), pe_err.eq(self.pe.payload.error)]
            with m.If(rsp_fire & ~cmd_fire):
                m.d.sync += busy.eq(0)
            e = self.rsp.payload.error
            with m.If(rsp_fire):
                m.d.comb += [
                    Assert(busy, "a response without a command"),
                    Assert(~(bad | beat_bad) | (e != ExtErrorCode.OK),
                           "rlast: a bad beat (RLAST, RID, RRESP) but an OK response"),
                    Assert((bad | beat_bad) | (e == ExtErrorCode.OK) | (e == ExtErrorCode.RANGE),
                           "only good beats but a bus error in the response"),
                    Assert((e != ExtErrorCode.RANGE) | ~issued, "a refused command issued a burst"),
                ]
                # a failed command whose PE stream was open ended it with last+error
                with m.If(pe_last):
                    m.d.comb += Assert(~pe_err | (e != ExtErrorCode.OK),
                                       "a PE error beat on an OK command")
            m.d.comb += Cover(rsp_fire & (e == ExtErrorCode.PROTOCOL))
            m.d.comb += Cover(rsp_fire & (e == ExtErrorCode.OK) & issued)
        m.d.comb += Cover(count == N)
        return m

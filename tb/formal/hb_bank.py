"""Formal wrapper of :class:`elmoe3d.hw.hb_bank.HBBank` (SymbiYosys).

The environment is free (every legal stream behaviour, any PE readiness,
any fill beat sequence -- malformed ones included --, any KV access and
boundary write) except for two things that make the data self-describing:

* every word of a fill DATA beat is ``{id, region, offset, bank}`` of the word
  it is written to, ``id`` being the fill's number (its END's position in
  the fill stream, plus one, modulo 16);
* every KV write carries region code 3 (no region has it).

With that, the properties are local:

* **one fill only, none dropped**: every word of a successful read is the
  word of the region, offset and bank it was read from, of the fill that
  last committed that region when the read was accepted (a torn read, a
  stale word, a word of an aborted or malformed fill, a dropped beat or a
  write into the wrong region all break it);
* **no read of a covered or pending slot succeeds**: a read is accepted only
  while its region is resident (``slot_valid``/``dense_valid``), and a
  resident slot is never covered; a refused read is one ``last`` + ``error``
  beat;
* **regions stay isolated**: a KV access is refused exactly when it is
  outside the KV region, and a KV word (an arbitrary bank and address)
  reads back what was last written to it as long as it stayed in the KV
  region (no fill or slot read touches it);
* **fills make progress**: ``fill.ready`` is never low for more than
  ``FILL_READY_BOUND`` consecutive cycles, whatever the PEs, the KV port and
  boundary moves do (no deadlock between fills, reads and moves: the fill
  path never waits for any of them);
* the ``commit`` strobe names a committed expert slot and ``slot_valid``
  rises on that edge; ``covered`` is the golden mask of ``kv_words``;
  one SRAM access per bank and cycle; the stream rules on every port
  (``stream_rules_all``).

``bug`` plants a mistake that must make the check fail: ``"no_resident_check"``
(reads of non-resident regions accepted), ``"no_busy_refusal"`` (a fill of a
slot being read is not refused: the read is torn), ``"commit_incomplete"``
(a COMMIT before the last word makes the slot resident), ``"fifo_short"``
(an output FIFO one entry shorter than the read credits: a word is written
into a full FIFO), ``"part_select_early"`` (with ``mem_parts=2``: a bank's
output taken from the memory part of the next access, a cycle early).
"""

from __future__ import annotations

from amaranth.asserts import AnyConst
from amaranth.hdl import Assert, Assume, Cat, Const, Module, Mux, ResetSignal, Signal, Value
from amaranth.lib import wiring

from ...hw.hb_bank import FILL_READY_BOUND, FillDecoder, HBBank, ReadSession
from ...hw.vocab import FillBeatKind, FillResultCode, HBRegionKind
from .common import history_ok, stream_rules_all

__all__ = ["HBBankFormal", "FORMAL_PARAMS", "BUGS"]

#: the geometry the proof runs at: 2 banks of 8 words, dense region of 2 words,
#: 2 slots of 2 words, KV up to 6 words from the top; 12-bit words; 2-deep
#: fill queue, 3-deep output FIFOs (the smallest legal; depths only change
#: throughput)
FORMAL_PARAMS = dict(banks=2, words=8, slots=2, slot_words=2, dense_words=2, lanes=3,
                     slice_bits=4, fill_words=2, fill_depth=2, out_depth=3)
BUGS = ("no_resident_check", "no_busy_refusal", "commit_incomplete", "fifo_short",
        "part_select_early")
#: read commands a bank may have outstanding in the environment
OUTSTANDING = 3


class _CommitIncomplete(FillDecoder):
    def commit_ok(self, *, good, complete, same, is_commit):
        return good & same & is_commit


class _FifoShort(ReadSession):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.fifo_depth = self.out_depth - 1


class _BuggyHB(HBBank):
    def __init__(self, bug, **kw):
        self.bug = bug
        super().__init__(**kw)
        if bug == "commit_incomplete":
            self.fill_decoder_cls = _CommitIncomplete
        if bug == "fifo_short":
            self.read_session_cls = _FifoShort

    def open_regions(self, valid, pend, dense_valid):
        if self.bug == "no_resident_check":
            return Const(-1, self.slots + 1)
        return super().open_regions(valid, pend, dense_valid)

    def busy_at_check(self, hit):
        if self.bug == "no_busy_refusal":
            return Const(0)
        return super().busy_at_check(hit)

    def part_select(self, part_rd, part_q):
        if self.bug == "part_select_early":
            return part_rd
        return super().part_select(part_rd, part_q)


def _fix(v, w):
    v = Value.cast(v)
    return v[:w] if len(v) >= w else Cat(v, Const(0, w - len(v)))


def _enc(fid, region, offset, bank):
    """A self-describing word: id (4 bits), region (2), offset (2), bank (2)."""
    return Cat(_fix(fid, 4), _fix(region, 2), _fix(offset, 2), _fix(bank, 2))


class HBBankFormal(wiring.Component):
    def __init__(self, *, bug: str | None = None, **params):
        if bug is not None and bug not in BUGS:
            raise ValueError(f"Planted bug must be one of {', '.join(BUGS)}, not {bug!r}")
        p = {**FORMAL_PARAMS, **params}
        self.dut = _BuggyHB(bug, **p) if bug else HBBank(**p)
        self.bug = bug
        super().__init__(self.dut.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        for name, member in dut.signature.members.items():
            outer, inner = getattr(self, name), getattr(dut, name)
            if member.is_port:
                if member.flow == wiring.In:
                    m.d.comb += inner.eq(outer)
                else:
                    m.d.comb += outer.eq(inner)
            elif member.dimensions:
                for i in range(member.dimensions[0]):
                    wiring.connect(m, wiring.flipped(outer[i]), inner[i])
            else:
                wiring.connect(m, wiring.flipped(outer), inner)
        m.d.comb += Assume(~ResetSignal())
        stream_rules_all(m, self)
        ok = history_ok(m)

        B, S, W, SW, D = dut.banks, dut.slots, dut.words, dut.slot_words, dut.dense_words
        FW = dut.fill_words
        sv = dut.sv_bits

        # ---- the environment's data: fill words and KV words describe themselves ----
        ends = Signal(4)                       # END beats accepted so far (mod 16)
        f = self.fill
        f_fire = f.valid & f.ready
        is_end = (f.payload.kind == FillBeatKind.COMMIT) | (f.payload.kind == FillBeatKind.ABORT)
        with m.If(f_fire & is_end):
            m.d.sync += ends.eq(ends + 1)
        fid = Signal(4)
        m.d.comb += fid.eq(ends + 1)
        f_reg = Mux(f.payload.region == HBRegionKind.EXPERT, f.payload.slot, S)
        with m.If(f.valid & (f.payload.kind != FillBeatKind.COMMIT)
                  & (f.payload.kind != FillBeatKind.ABORT)):
            for i in range(FW):
                m.d.comb += Assume(f.payload.words[i] ==
                                   _enc(fid, f_reg, f.payload.offset, f.payload.bank + i))
        with m.If(self.kv.valid & self.kv.payload.write):
            m.d.comb += Assume(self.kv.payload.data[4:6] == 3)

        # ---- the committed fill of every region (from the fill_done reports) ----------
        dones = Signal(4)
        cid = [Signal(4, name=f"cid{r}") for r in range(S + 1)]
        dmask = Signal(16)                     # ids of committed dense fills
        fd = self.fill_done
        d_reg = Mux(fd.region == HBRegionKind.EXPERT, fd.slot, S)
        with m.If(fd.valid):
            m.d.sync += dones.eq(dones + 1)
            with m.If(fd.result == FillResultCode.COMMITTED):
                for r in range(S + 1):
                    with m.If(d_reg == r):
                        m.d.sync += cid[r].eq(dones + 1)
                with m.If(d_reg == S):
                    m.d.sync += dmask.eq(dmask | (1 << (dones + 1)[:4]))

        resident = Signal(S + 1)
        m.d.comb += resident.eq(Cat(self.slot_valid, self.dense_valid))
        m.d.comb += Assert((self.slot_valid & self.covered) == 0, "a covered slot is resident")

        # ---- per bank: the outstanding read commands, checked beat by beat ------------
        qd = [("reg", 2), ("off", 2), ("cnt", 2), ("plane", 1), ("k", 2), ("dec", 1),
              ("okd", 1), ("snap", 4)]
        for b in range(B):
            cmd, out = self.rd_cmd[b], self.rd[b]
            q = [{n: Signal(w, name=f"q{b}_{i}_{n}") for n, w in qd} for i in range(OUTSTANDING)]
            n = Signal(range(OUTSTANDING + 1), name=f"n{b}")
            ndec = Signal(range(OUTSTANDING + 1), name=f"ndec{b}")
            m.d.comb += Assume(~cmd.valid | (n < OUTSTANDING))
            push = cmd.valid & cmd.ready
            get = out.valid & out.ready
            start, start_ok = dut.probe_start[b], dut.probe_start_ok[b]
            h = q[0]
            beat = out.payload
            word = beat.sv.slices.as_value()
            # decode: the oldest undecoded command, on a resident region
            m.d.comb += Assert(~start | (ndec < n), f"bank {b}: decode without a command")
            dreg = Signal(2, name=f"dreg{b}")
            m.d.comb += dreg.eq(0)
            for i in range(OUTSTANDING):
                with m.If(ndec == i):
                    m.d.comb += dreg.eq(q[i]["reg"])
            with m.If(start_ok):
                m.d.comb += Assert(resident.bit_select(dreg, 1),
                                   f"bank {b}: read accepted on a region that is not resident")
            snap_now = Signal(4, name=f"snap{b}")
            m.d.comb += snap_now.eq(0)
            for r in range(S + 1):
                with m.If(dreg == r):
                    m.d.comb += snap_now.eq(cid[r])
            # delivery
            last_beat = Signal(name=f"lastbeat{b}")
            m.d.comb += last_beat.eq(0)
            with m.If(get):
                m.d.comb += Assert((n != 0) & h["dec"], f"bank {b}: a beat with no decoded read")
                with m.If(~h["okd"]):
                    m.d.comb += [Assert(beat.error & beat.last & (word == 0),
                                        f"bank {b}: a refusal is one zero last+error beat"),
                                 last_beat.eq(1)]
                with m.Else():
                    # a slot holds one whole fill: the last committed one. The
                    # dense region is loaded in pieces (any rows, by several
                    # fills): a word is one of a committed dense fill, of the
                    # right address, or was never written (0)
                    exp = _enc(h["snap"], h["reg"], h["off"] + h["k"], Const(b, 2))
                    addr_ok = word[4:10] == exp[4:10]
                    dense = h["reg"] == S
                    id_ok = Mux(dense, dmask.bit_select(word[:4], 1), word[:4] == exp[:4])
                    unwritten = dense & (word == 0)
                    m.d.comb += [
                        Assert(~beat.error, f"bank {b}: error beat in an accepted read"),
                        Assert(addr_ok | unwritten, f"bank {b}: word of another region or address"),
                        Assert(id_ok | unwritten, f"bank {b}: word not of the last committed fill"),
                        Assert(word[10:] == 0, f"bank {b}: stray bits"),
                        Assert(beat.sv.plane == h["plane"], f"bank {b}: plane"),
                        Assert(beat.last == (h["k"] + 1 == h["cnt"]), f"bank {b}: last flag"),
                        last_beat.eq(beat.last)]
            # queue update: pop (head done), decode, push
            pop = get & last_beat
            c = cmd.payload
            new = {"reg": Mux(c.region == HBRegionKind.EXPERT, c.slot, S), "off": c.offset,
                   "cnt": c.count, "plane": c.plane, "k": 0, "dec": 0, "okd": 0, "snap": 0}
            for i in range(OUTSTANDING):
                src = q[i + 1] if i + 1 < OUTSTANDING else None
                base = {k: (Mux(pop, src[k], q[i][k]) if src is not None else
                            Mux(pop, 0, q[i][k])) for k, _ in qd}
                if i == 0:
                    base["k"] = Mux(pop, src["k"] if src is not None else 0,
                                    Mux(get, q[0]["k"] + 1, q[0]["k"]))
                slot_after = i                     # index after the pop
                dec_here = start & ((ndec - pop) == slot_after)
                push_here = push & ((n - pop) == slot_after)
                for k, _ in qd:
                    v = base[k]
                    if k == "dec":
                        v = Mux(dec_here, 1, v)
                    elif k == "okd":
                        v = Mux(dec_here, start_ok, v)
                    elif k == "snap":
                        v = Mux(dec_here, snap_now, v)
                    v = Mux(push_here, new[k], v)
                    m.d.sync += q[i][k].eq(v)
            m.d.sync += [n.eq(n + push - pop), ndec.eq(ndec + start - pop)]
            # a decode of a command pushed in the same cycle cannot happen (slice)
            m.d.comb += Assert(~(dut.probe_ren[b] & dut.probe_wen[b]),
                               f"bank {b}: two SRAM accesses in one cycle")
            m.d.comb += Assert(~dut.probe_out_overrun[b],
                               f"bank {b}: a read word written into a full output FIFO")

        # ---- KV: refusals and one shadow word -------------------------------------------
        kb = Signal(range(B))
        ka = Signal(range(W))
        m.d.comb += [kb.eq(AnyConst(kb.shape())), ka.eq(AnyConst(ka.shape()))]
        lo = Signal(range(W + 1))
        m.d.comb += lo.eq(W - self.kv_words)
        in_kv = Signal()
        m.d.comb += in_kv.eq(ka >= lo)
        known = Signal()
        shadow = Signal(sv)
        pend_v, pend_w, pend_hit, pend_err = Signal(), Signal(), Signal(), Signal()
        pend_d = Signal(sv)
        kvp = self.kv.payload
        with m.If(self.kv.valid & self.kv.ready):
            m.d.comb += Assert(~pend_v, "two KV accesses in flight")
            m.d.sync += [pend_v.eq(1), pend_w.eq(kvp.write), pend_d.eq(kvp.data),
                         pend_hit.eq((kvp.bank == kb) & (kvp.addr == ka)),
                         pend_err.eq((kvp.addr < lo) | (kvp.bank >= B))]
        rsp = self.kv_rsp
        m.d.sync += known.eq(known & in_kv)
        with m.If(rsp.valid & rsp.ready):
            m.d.comb += [Assert(pend_v, "KV response without an access"),
                         Assert(rsp.payload.error == pend_err,
                                "KV refused iff outside the KV region")]
            m.d.sync += pend_v.eq(0)
            with m.If(pend_hit & ~pend_err):
                with m.If(pend_w):
                    m.d.sync += [shadow.eq(pend_d), known.eq(in_kv)]
                with m.Elif(known):
                    m.d.comb += Assert(rsp.payload.data == shadow,
                                       "a KV word changed while in the KV region")

        # ---- covered follows kv_words; the commit strobe ------------------------------------
        thr = dut.covered_thresholds()
        m.d.comb += Assert(self.covered == Cat(*[self.kv_words > t for t in thr]),
                           "covered is not the mask of kv_words")
        m.d.comb += Assert(self.kv_words <= W - D, "KV region beyond its limit")
        p_commit, p_slot = Signal(), Signal(range(max(2, S)))
        m.d.sync += [p_commit.eq(self.commit.valid), p_slot.eq(self.commit.slot)]
        with m.If(self.commit.valid):
            m.d.comb += Assert(fd.valid & (fd.result == FillResultCode.COMMITTED)
                               & (fd.region == HBRegionKind.EXPERT) & (fd.slot == self.commit.slot),
                               "commit strobe without a committed expert fill")
        with m.If(ok & p_commit):
            m.d.comb += Assert(self.slot_valid.bit_select(p_slot, 1),
                               "slot_valid did not rise with the commit")
        with m.If(fd.valid & (fd.result == FillResultCode.COMMITTED)
                  & (fd.region == HBRegionKind.EXPERT)):
            m.d.comb += Assert(self.commit.valid, "committed expert fill without a strobe")

        # ---- fill progress --------------------------------------------------------------------
        low = Signal(range(FILL_READY_BOUND + 2))
        with m.If(f.valid & ~f.ready):
            m.d.sync += low.eq(Mux(low == FILL_READY_BOUND + 1, low, low + 1))
        with m.Else():
            m.d.sync += low.eq(0)
        m.d.comb += Assert(low <= FILL_READY_BOUND, "fill.ready held low too long")
        return m

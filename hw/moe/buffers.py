"""Weight buffer with replay: the memory that turns one weight load per
expert into one slice vector per token.

Why a replay buffer
-------------------
A PE accumulates one dot product at a time. To apply a segment of weights
(all planes and chunks of one row per PE) to ``T_e`` tokens, the issue stage
reads the segment ``T_e`` times, once per token, from this buffer; the port
that delivered it (HB or LPDDR) delivered it once. The buffer is a FIFO
whose read side may *rewind*: words are written in arrival order at the
write position ``wp`` of their bank, read at any position the issue stage
names, and overwritten only once the issue stage has moved its ``free``
position past them (after the segment's last token). Deep buffers also let
a port run ahead of the PEs (the LPDDR buffer holds two experts, so the
LPDDR port keeps streaming while the PEs work through a heavy expert).

Positions are counters modulo ``2 * depth``; ``free <= read < wp`` always, so
"available" is ``read != wp`` and "space" is ``wp - free < depth``.

For 125 MHz both are flip-flops, each a safe bound one cycle old:
``space`` is worked out a cycle ahead from this cycle's ``free`` (which only
moves forward, so a freed word is seen a cycle later), and ``wp_all``, the
position below which *every* bank holds its word, follows the banks' write
pointers one word per cycle (a word requested at cycle ``t`` counts in
``wp_all`` from ``t + 3``, a cycle after its block-RAM write; each bank's distance ahead of it is a counter of
its own, so the step is an AND of flip-flops). A reader compares its position with one register
instead of ``banks`` of them. Latency, not throughput: ``space`` stays up
while words stream, and ``wp_all`` advances one word per cycle.

A producer that writes one beat across the banks (the LPDDR writer) reads
one flip-flop instead of the AND of ``banks`` of them: ``room`` says every
bank had room for three words two cycles ago (each bank's flag is a
flip-flop, worked out from its ``wp`` and ``free`` alone, ``we`` plays no
part; ``room`` is their AND a cycle later), so each has room for at least
one now (a bank takes at most one word a cycle, and ``free`` only moves
forward). It costs two words of depth and two cycles of latency after a
word is freed, not throughput.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from .ports import BufferRead, BufferWrite

__all__ = ["ReplayBuffer"]


class ReplayBuffer(wiring.Component):
    """``banks`` replay FIFOs of ``depth`` words of ``width`` bits, read in
    lockstep at one position.

    Parameters
    ----------
    banks, width, depth : int
        ``depth`` a power of two.

    Members
    -------
    wr : ``In(BufferWrite(banks, width))``
        ``we``, ``wdata``: write ``wdata[b]`` at ``wp[b]`` (only while
        ``space[b]``; a producer that feeds several banks at once checks all
        their ``space`` first, or ``room``).
        ``space[b]``: a flip-flop, ``wp - free' < depth`` with ``free'``
        last cycle's ``free`` (a safe bound): bank ``b`` can take a word.
        ``room``: a flip-flop, two cycles ago every bank had room for three
        words (``wp[b] - free'' <= depth - 3``), so every bank can take a
        word now.
    rd : ``In(BufferRead(banks, width, depth))``
        ``pos``: read position; ``data[b]`` holds the word one cycle later.
        ``free``: oldest position still needed; words before it may be
        overwritten. ``wp`` (``wp_all``): a flip-flop, every bank holds its
        word at every position before it (``wp_all <= wp[b]`` for all
        ``b``); it advances by one when every bank's ``wp`` is past it.
        Positions are ``P = log2(depth) + 1`` bits, modulo ``2 depth``.
    wp : ``Out(unsigned(P)).array(banks)``
        Write position per bank.

    Latency: one cycle from ``rd_pos`` to ``rd_data``; a word requested at
    cycle ``t`` (``we``) is in the block RAM from ``t + 2`` (it is written at
    ``t + 1`` from registers); ``wp_all`` counts it from ``t + 3`` (the
    bank's lead follows the registered write). One write per bank
    and one read per cycle.
    """

    def __init__(self, *, banks: int, width: int, depth: int):
        if depth < 4 or depth & (depth - 1):
            raise ValueError(f"Buffer depth must be a power of two >= 4, not {depth!r}")
        self.banks, self.width, self.depth = banks, width, depth
        self.pbits = depth.bit_length()          # log2(depth) + 1
        super().__init__({
            "wr": In(BufferWrite(banks, width)),
            "rd": In(BufferRead(banks, width, depth)),
            "wp": Out(unsigned(self.pbits)).array(banks),
        })

    def elaborate(self, platform):
        m = Module()
        ab = self.pbits - 1
        wr, rd = self.wr, self.rd
        room = Const(1)
        w_ens = []
        for b in range(self.banks):
            # `no_rw_check`: a read never meets a write of the same entry
            # (reads stay below `wp_all`, writes at `wp`, and `wp - free <
            # depth`), so Yosys need not emulate the read-old-data rule with a
            # bypass multiplexer behind the block RAM: the reader's register
            # can become the EBR's output register
            mem = m.submodules[f"mem{b}"] = memory.Memory(shape=unsigned(self.width),
                                                           depth=self.depth, init=[],
                                                           attrs={"no_rw_check": 1})
            wport = mem.write_port()
            rport = mem.read_port()
            # both outcomes from registers and this cycle's `free`; `we`,
            # which comes late, only selects
            used_n = Signal(self.pbits, name=f"used_n{b}")
            used_w = Signal(self.pbits, name=f"used_w{b}")
            m.d.comb += [used_n.eq(self.wp[b] - rd.free),
                         used_w.eq(self.wp[b] + 1 - rd.free)]
            space = Signal(name=f"space_r{b}", init=1)
            m.d.sync += space.eq(Mux(wr.we[b], used_w < self.depth, used_n < self.depth))
            m.d.comb += wr.space[b].eq(space)
            # (a flip-flop per bank next to its pointer; their AND a cycle later)
            room_b = Signal(name=f"room_r{b}", init=1)
            m.d.sync += room_b.eq(used_n <= self.depth - 3)
            room = room & room_b
            # The block RAMs are written a cycle after the request, from
            # registers of their own bank: the producer's decision (`we`,
            # from a stream handshake) and its data end at flip-flops here,
            # and only a route leads on to the bank's DP16KDs, which sit in
            # the die's block-RAM rows (timing round 17: the LPDDR writer's
            # beat select -> a bank's write data over 8.2 ns of routing, and
            # the buffer's `room` -> the handshake -> the write enables). The
            # data register loads only with a write, so the banks' copies are
            # distinct (a bank's data is another bank's word in some passes,
            # and registers with one input and no enable would be merged).
            w_en = Signal(name=f"w_en{b}")
            w_ens.append(w_en)
            w_addr = Signal(ab, name=f"w_addr{b}", reset_less=True)
            w_data = Signal(self.width, name=f"w_data{b}", reset_less=True)
            m.d.sync += w_en.eq(wr.we[b])
            with m.If(wr.we[b]):
                m.d.sync += [w_addr.eq(self.wp[b][:ab]), w_data.eq(wr.wdata[b])]
            m.d.comb += [wport.addr.eq(w_addr), wport.data.eq(w_data), wport.en.eq(w_en),
                         rport.addr.eq(rd.pos[:ab]), rd.data[b].eq(rport.data)]
            with m.If(wr.we[b]):
                m.d.sync += self.wp[b].eq(self.wp[b] + 1)
        m.d.sync += wr.room.eq(room)
        # `wp_all` steps while every bank's `wp` is past it. Each bank keeps
        # its distance `wp[b] - wp_all` (`wp` as of the registered write
        # `w_en`, a cycle after the request) and whether it is zero as
        # registers (`lead`, `nz`), their next values one of four worked out
        # from `lead` alone, which the bank's write and the step only select
        # (the registered write, not the producer's `we`: the handshake ->
        # `we` -> `lead`'s enable crossed the die to the block-RAM rows,
        # timing round 17, HB reader -> HB buffer, 12 endpoints); the step is
        # the AND of ``banks`` flip-flops, not of ``banks`` pointer compares
        # (the banks' pointers sit by their block RAMs, across the die:
        # pointer -> compare -> the AND -> `wp_all`'s enable was 5 LUTs and
        # 6.8 ns of routing in timing round 17). The same steps a cycle later.
        nz = [Signal(name=f"nz{b}") for b in range(self.banks)]
        step = Signal()
        m.d.comb += step.eq(Cat(*nz).all())
        for b in range(self.banks):
            lead = Signal(self.pbits, name=f"lead{b}")
            up, dn = Signal.like(lead), Signal.like(lead)
            m.d.comb += [up.eq(lead + 1), dn.eq(lead - 1)]
            m.d.sync += [lead.eq(Mux(w_ens[b], Mux(step, lead, up), Mux(step, dn, lead))),
                         nz[b].eq(Mux(w_ens[b], Mux(step, lead != 0, 1),
                                      Mux(step, lead != 1, lead != 0)))]
        with m.If(step):
            m.d.sync += rd.wp.eq(rd.wp + 1)
        return m

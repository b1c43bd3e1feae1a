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
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

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
    space : ``Out(1).array(banks)``
        ``wp - free < depth``: bank ``b`` can take a word (registers only).
    we, wdata : ``In.array(banks)``
        Write ``wdata[b]`` at ``wp[b]`` (only while ``space[b]``; a producer
        that feeds several banks at once checks all their ``space`` first).
    wp : ``Out(unsigned(P)).array(banks)``
        Write position per bank (``P = log2(depth) + 1`` bits, modulo ``2 depth``).
    rd_pos : ``In(unsigned(P))``
        Read position; ``rd_data[b]`` holds the word one cycle later.
    rd_data : ``Out(unsigned(width)).array(banks)``
    free : ``In(unsigned(P))``
        Oldest position still needed; words before it may be overwritten.

    Latency: one cycle from ``rd_pos`` to ``rd_data``; a written word can be
    read the cycle after its write. One write per bank and one read per cycle.
    """

    def __init__(self, *, banks: int, width: int, depth: int):
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"Buffer depth must be a power of two >= 2, not {depth!r}")
        self.banks, self.width, self.depth = banks, width, depth
        self.pbits = depth.bit_length()          # log2(depth) + 1
        super().__init__({
            "space": Out(1).array(banks),
            "we": In(1).array(banks),
            "wdata": In(unsigned(width)).array(banks),
            "wp": Out(unsigned(self.pbits)).array(banks),
            "rd_pos": In(unsigned(self.pbits)),
            "rd_data": Out(unsigned(width)).array(banks),
            "free": In(unsigned(self.pbits)),
        })

    def elaborate(self, platform):
        m = Module()
        ab = self.pbits - 1
        for b in range(self.banks):
            mem = m.submodules[f"mem{b}"] = memory.Memory(shape=unsigned(self.width),
                                                           depth=self.depth, init=[])
            wport = mem.write_port()
            rport = mem.read_port()
            used = Signal(self.pbits, name=f"used{b}")
            m.d.comb += [used.eq(self.wp[b] - self.free),
                         self.space[b].eq(used < self.depth)]
            m.d.comb += [wport.addr.eq(self.wp[b][:ab]), wport.data.eq(self.wdata[b]),
                         wport.en.eq(self.we[b]),
                         rport.addr.eq(self.rd_pos[:ab]), self.rd_data[b].eq(rport.data)]
            with m.If(self.we[b]):
                m.d.sync += self.wp[b].eq(self.wp[b] + 1)
        return m

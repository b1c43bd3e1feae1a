"""Small stream components shared by the blocks (Glasgow's
``gateware/stream.py`` style): each is a tiny ``wiring.Component`` with an
``i`` and an ``o`` ``amaranth.lib.stream`` port.

Why a register slice at every block boundary
--------------------------------------------
Inside the tile no ``ready`` may travel combinationally through more than one
block (``docs/architecture.md``). A block whose input ``ready`` is a function
of its output ``ready`` (a global-stall pipeline, a pass-through FIFO head)
chains its consumer's timing into its producer's; three such blocks in a row
put three blocks' worth of logic on one path. :class:`RegisterSlice` breaks
both directions: ``o.valid``/``o.payload`` come from registers, and
``i.ready`` is a register (the "skid" slot is empty), at full throughput.

:class:`BlockFIFO` is the same promise for a deep queue in block RAM: the
block RAM's read data passes a plain register (which the ECP5 flow packs
into the EBR's own output register, :func:`elmoe3d.sim.flow.synth.pack_ebr_outreg`)
before any logic, and every flag is a flip-flop.

:class:`CreditFIFO` and :class:`QueueFIFO` are ``SyncFIFOBuffered`` with the
same ports and cycle behaviour, rewritten so that a wide FIFO's storage
enables do not pass its level logic (first written for ``hb_bank``).

:class:`StreamArbiter` merges several streams into one.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Elaboratable, Module, Mux, Signal, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .common import check_int

__all__ = ["RegisterSlice", "BlockFIFO", "CreditFIFO", "QueueFIFO", "StreamArbiter"]


def _ring_next(ptr, depth: int):
    """The position after ``ptr`` in a ring of ``depth`` entries."""
    return Mux(ptr == depth - 1, 0, ptr + 1)


def _ring_step(m: Module, en, ptr, depth: int):
    """``ptr`` steps to the next position of its ring in cycles with ``en``."""
    with m.If(en):
        m.d.sync += ptr.eq(_ring_next(ptr, depth))


class RegisterSlice(wiring.Component):
    """Full-throughput register slice (skid buffer) for one stream.

    Parameters
    ----------
    shape : shape-castable
        The payload shape (a ``data.Struct`` of the shared vocabulary).

    Members
    -------
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``

    Latency and throughput: a payload accepted on ``i`` is valid on ``o`` the
    next cycle; one transfer per cycle in steady state, whatever the pattern of
    ``o.ready``. ``i.ready`` and ``o.valid`` are flip-flop outputs (no
    combinational path from ``o.ready`` to ``i.ready`` or from ``i.valid`` to
    ``o.valid``). Cost: two payload registers.
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})
        #: the skid register and its valid bit (exposed for the formal wrapper)
        self.skid = Signal(shape, name="skid")
        self.skid_valid = Signal(name="skid_valid")

    def elaborate(self, platform):
        m = Module()
        skid, skid_valid = self.skid, self.skid_valid
        # i.ready is the skid slot being empty: a register
        m.d.comb += self.i.ready.eq(~skid_valid)
        accept = self.i.valid & ~skid_valid
        out_free = ~self.o.valid | self.o.ready
        # Payload registers are enabled by as few signals as possible, since
        # the enable of a wide register fans out to every bit and is the
        # late arrival: the skid slot loads whenever it is empty (its enable
        # is the flip-flop ``~skid_valid``; what it holds matters only once
        # ``skid_valid`` is set), and ``o.payload`` loads whenever ``o`` is
        # free (enable ``out_free``, select ``skid_valid``; with nothing to
        # send it loads don't-care data under ``o.valid = 0``). Neither
        # enable depends on ``i.valid``. Transfers are those of the textbook
        # skid buffer, cycle for cycle.
        with m.If(~skid_valid):
            m.d.sync += skid.eq(self.i.payload)
        with m.If(out_free):
            m.d.sync += self.o.payload.eq(Mux(skid_valid, skid, self.i.payload))
            m.d.sync += self.o.valid.eq(skid_valid | self.i.valid)
            with m.If(skid_valid):
                m.d.sync += skid_valid.eq(0)
        with m.Elif(accept):
            m.d.sync += skid_valid.eq(1)
        return m


class BlockFIFO(wiring.Component):
    """A stream FIFO in block RAM with registered flags and a registered
    read path.

    Parameters
    ----------
    width : int
        Payload bits.
    depth : int
        Entries of the block RAM (>= 2). Four more wait in the output queue,
        so up to ``depth + 4`` payloads are held.

    Members
    -------
    i : ``In(stream.Signature(unsigned(width)))``
    o : ``Out(stream.Signature(unsigned(width)))``

    Structure: the block RAM (written at ``i``'s handshake) -> its
    synchronous read port -> a register with neither enable nor reset (on
    ECP5 the flow packs it into the EBR's output register, so the EBR's slow
    clock-to-output never meets logic) -> a four-entry ring queue whose head
    is ``o.payload``. A read is started only while the queue, counting the
    two reads in flight, has room (a credit counter), so nothing is lost.

    ``i.ready`` and ``o.valid`` are flip-flops, ``o.payload`` a 4:1 select of
    flip-flops by a head pointer (a pop steps the pointer and moves no
    payload); the read start is one LUT of flip-flops. Throughput: one payload per cycle in and
    out. Latency: a payload written at cycle ``t`` is on ``o`` at ``t + 4``
    (an empty FIFO), against ``t + 2`` for ``SyncFIFOBuffered``.
    """

    #: entries of the output queue (the credit: two reads in flight, one
    #: being taken, one of slack)
    QUEUE = 4

    def __init__(self, width: int, depth: int):
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"BlockFIFO width must be a positive int, not {width!r}")
        if not isinstance(depth, int) or depth < 2:
            raise ValueError(f"BlockFIFO depth must be an int >= 2, not {depth!r}")
        self.width, self.depth = width, depth
        super().__init__({"i": In(stream.Signature(unsigned(width))),
                          "o": Out(stream.Signature(unsigned(width)))})

    def elaborate(self, platform):
        m = Module()
        D, Q = self.depth, self.QUEUE
        # `no_rw_check`: a read never meets a write of the same entry (an entry
        # is read only after its write is counted), so Yosys need not emulate
        # the read-old-data rule with a bypass multiplexer behind the block RAM
        mem = m.submodules.storage = memory.Memory(shape=unsigned(self.width), depth=D, init=[],
                                                   attrs={"no_rw_check": 1})
        wport = mem.write_port()
        rport = mem.read_port()             # always enabled: `v1` says which data counts

        wp = Signal(range(D))
        rp = Signal(range(D))
        cnt = Signal(range(D + 1))          # entries in the block RAM not yet read
        full = Signal()                     # cnt == D, a flip-flop
        has = Signal()                      # cnt != 0, a flip-flop
        room = Signal(range(Q + 1), init=Q)  # queue entries not held nor in flight
        v1, v2 = Signal(), Signal()          # a read in flight: port data, register
        d2 = Signal(self.width, reset_less=True)   # behind the port (no reset: OUTREG)
        write = Signal()
        read = Signal()
        m.d.comb += [self.i.ready.eq(~full), write.eq(self.i.valid & ~full),
                     read.eq(has & (room != 0)),
                     wport.addr.eq(wp), wport.data.eq(self.i.payload), wport.en.eq(write),
                     rport.addr.eq(rp)]
        _ring_step(m, write, wp, D)
        _ring_step(m, read, rp, D)
        # the flags from registers; `write`/`read` only select
        with m.If(write & ~read):
            m.d.sync += [cnt.eq(cnt + 1), full.eq(cnt == D - 1), has.eq(1)]
        with m.Elif(read & ~write):
            m.d.sync += [cnt.eq(cnt - 1), full.eq(0), has.eq(cnt != 1)]
        m.d.sync += [v1.eq(read), v2.eq(v1), d2.eq(rport.data)]

        # the output queue: a ring of `Q` entries, `held` of them valid from
        # `head` on. A push writes entry `tail` (both registers), a pop only
        # steps `head`: the consumer's `ready`, the latest signal here, drives
        # a few pointer and count bits, not every payload bit (it had been the
        # MoE layer's worst path as the enable of a 4 x 64-bit shift queue)
        q = [Signal(self.width, name=f"q{x}") for x in range(Q)]
        head = Signal(range(Q))
        tail = Signal(range(Q))
        held = Signal(range(Q + 1))
        push = v2
        pop = self.o.valid & self.o.ready
        m.d.comb += self.o.payload.eq(Array(q)[head])
        for x in range(Q):
            with m.If(push & (tail == x)):
                m.d.sync += q[x].eq(d2)
        _ring_step(m, push, tail, Q)
        _ring_step(m, pop, head, Q)
        m.d.sync += held.eq(held + push - pop)
        m.d.sync += self.o.valid.eq(push | Mux(pop, held >= 2, self.o.valid))
        m.d.sync += room.eq(room - read + pop)
        return m


class CreditFIFO(Elaboratable):
    """``amaranth.lib.fifo.SyncFIFOBuffered`` (``depth`` >= 2, same ports and
    the same cycle behaviour) for a writer that never writes into a full
    FIFO: the write is ``w_en`` alone, not ``w_en & w_rdy``.

    A read session writes its output FIFO only with a read credit (one per
    entry), so ``w_rdy`` is never low when ``w_en`` is high. In
    ``SyncFIFOBuffered`` the write enable of the storage still goes through
    the level compare; at the default geometry nextpnr placed the storage
    27-30 columns from the level register, and the level -> ``w_rdy`` ->
    storage enable -> level loop (two long routes) limited ``hb_bank`` to
    108-116 MHz on two seeds of three. Here the storage's write enable is the
    writer's own register. ``w_rdy`` is still an output (the level
    compare), for assertions: ``w_en & ~w_rdy`` is a broken credit rule.
    """

    _what = "credit FIFO depth"

    def __init__(self, *, width: int, depth: int):
        check_int(self._what, depth, 2, 1 << 16)
        self.width, self.depth = width, depth
        self.w_data = Signal(width)
        self.w_en = Signal()
        self.w_rdy = Signal()
        self.r_data = Signal(width)
        self.r_rdy = Signal()
        self.r_en = Signal()
        self.level = Signal(range(depth + 1))

    def elaborate(self, platform):
        m = Module()
        inner_depth = self.depth - 1
        inner_level = Signal(range(inner_depth + 1))
        inner_r_rdy = Signal()
        m.d.comb += [self.w_rdy.eq(inner_level != inner_depth),
                     inner_r_rdy.eq(inner_level != 0)]
        do_write = self.w_en
        do_inner_read = inner_r_rdy & (~self.r_rdy | self.r_en)
        m.submodules.storage = storage = Memory(shape=self.width, depth=inner_depth, init=[])
        w_port = storage.write_port()
        r_port = storage.read_port(domain="sync")
        produce = Signal(range(inner_depth))
        consume = Signal(range(inner_depth))

        m.d.comb += [w_port.addr.eq(produce), w_port.data.eq(self.w_data),
                     w_port.en.eq(do_write),
                     r_port.addr.eq(consume), self.r_data.eq(r_port.data),
                     r_port.en.eq(do_inner_read)]
        _ring_step(m, do_write, produce, inner_depth)
        _ring_step(m, do_inner_read, consume, inner_depth)
        with m.If(do_write & ~do_inner_read):
            m.d.sync += inner_level.eq(inner_level + 1)
        with m.If(do_inner_read & ~do_write):
            m.d.sync += inner_level.eq(inner_level - 1)
        with m.If(do_inner_read):
            m.d.sync += self.r_rdy.eq(1)
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        m.d.comb += self.level.eq(inner_level + self.r_rdy)
        return m


class QueueFIFO(CreditFIFO):
    """``amaranth.lib.fifo.SyncFIFOBuffered`` (``depth`` >= 2, same ports and
    the same cycle behaviour) whose fill level is the distance of two
    pointers with wrap bits instead of a level counter.

    The fill queue's read enable is the head's decision (fill granted,
    beat discarded, fill ended), the latest signal of the block: in
    ``SyncFIFOBuffered`` it passes the inner read enable and then the level
    counter's up/down enable, one LUT and one route more than the pointer
    and output-register enables here, and that last LUT limited ``hb_bank``
    to 124.6-125.0 MHz on two seeds of three (``docs/blocks/hb_bank.md``).
    Its writes are gated by ``w_rdy`` (the fill decoder waits on it); the
    ports are ``CreditFIFO``'s. With ``credit=True`` the writer never writes
    into a full FIFO (as for :class:`CreditFIFO`) and the write is ``w_en``
    alone: both ends then start at the user's own registers (the MoE issue
    stage's beat FIFO).
    """

    _what = "queue FIFO depth"

    def __init__(self, *, width: int, depth: int, credit: bool = False):
        super().__init__(width=width, depth=depth)
        self.credit = bool(credit)

    def elaborate(self, platform):
        m = Module()
        inner_depth = self.depth - 1
        produce = Signal(range(inner_depth))
        consume = Signal(range(inner_depth))
        p_wrap, c_wrap = Signal(), Signal()
        same = produce == consume
        inner_r_rdy = Signal()
        m.d.comb += [self.w_rdy.eq(~same | (p_wrap == c_wrap)),
                     inner_r_rdy.eq(~same | (p_wrap != c_wrap))]
        do_write = self.w_en if self.credit else self.w_en & self.w_rdy
        do_inner_read = inner_r_rdy & (~self.r_rdy | self.r_en)
        m.submodules.storage = storage = Memory(shape=self.width, depth=inner_depth, init=[])
        w_port = storage.write_port()
        r_port = storage.read_port(domain="sync")

        def step(ptr, wrap):
            return [ptr.eq(_ring_next(ptr, inner_depth)), wrap.eq(wrap ^ (ptr == inner_depth - 1))]

        m.d.comb += [w_port.addr.eq(produce), w_port.data.eq(self.w_data),
                     w_port.en.eq(do_write),
                     r_port.addr.eq(consume), self.r_data.eq(r_port.data),
                     r_port.en.eq(do_inner_read)]
        with m.If(do_write):
            m.d.sync += step(produce, p_wrap)
        with m.If(do_inner_read):
            m.d.sync += step(consume, c_wrap)
            m.d.sync += self.r_rdy.eq(1)
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        inner_level = Mux(p_wrap == c_wrap, produce - consume, produce + inner_depth - consume)
        m.d.comb += self.level.eq(inner_level[:len(self.level)] + self.r_rdy)
        return m


class StreamArbiter(wiring.Component):
    """``n`` streams into one: the lowest-numbered valid input wins, and the
    choice is held while the output waits.

    Parameters
    ----------
    shape : shape-castable
        The payload shape of every stream.
    n : int
        Inputs (>= 1).
    hold : bool
        Hold the choice while ``o`` waits (default): ``o`` follows the stream
        rules. Without it the lowest-numbered valid input is shown in every
        cycle, for a consumer that takes a payload only when it has room
        and does not need it to stay (a :class:`RegisterSlice`): one LUT
        less between the inputs' ``valid`` and their ``ready``.

    Members
    -------
    i : ``In(stream.Signature(shape)).array(n)``
    o : ``Out(stream.Signature(shape))``
    grant : ``Out(n)``
        One-hot: the input ``o`` shows (valid with ``o.valid``).

    Latency and throughput: combinational (``o`` is a multiplexer of the
    inputs, ``i[k].ready = o.ready & grant[k]``); one transfer per cycle.

    Why the choice is held: the stream rules let a producer count on its
    payload staying on ``o`` once ``o.valid`` is high; an input of a lower
    number that becomes valid while ``o`` waits must not replace it. A
    register remembers the grant of a cycle in which ``o`` was valid and not
    taken; a transfer releases it. The rules on the inputs keep the held
    input valid.
    """

    def __init__(self, shape, n: int, *, hold: bool = True):
        check_int("Arbiter inputs", n, 1)
        self._shape, self.n, self.hold = shape, n, bool(hold)
        super().__init__({"i": In(stream.Signature(shape)).array(n),
                          "o": Out(stream.Signature(shape)), "grant": Out(n)})

    def elaborate(self, platform):
        m = Module()
        n = self.n
        valid = Cat(s.valid for s in self.i)
        first = Signal(n)               # one-hot: the lowest-numbered valid input
        m.d.comb += first.eq(Cat(valid[k] & ~valid[:k].any() if k else valid[0]
                                 for k in range(n)))
        # the held input as an index (its one-hot decode is one input, whatever
        # the register holds)
        hold, held = Signal(), Signal(range(n))
        m.d.comb += self.grant.eq(Mux(hold, Cat(held == k for k in range(n)), first)
                                  if self.hold else first)
        m.d.comb += self.o.valid.eq((self.grant & valid).any())
        raw = [s.payload.as_value() if hasattr(s.payload, "as_value") else s.payload
               for s in self.i]
        pick = Const(0, len(raw[0]))
        for k in range(n):
            pick = pick | Mux(self.grant[k], raw[k], 0)
        m.d.comb += self.o.payload.eq(pick)
        for k in range(n):
            m.d.comb += self.i[k].ready.eq(self.o.ready & self.grant[k])
        m.d.sync += hold.eq(self.o.valid & ~self.o.ready)
        for k in range(n):
            with m.If(self.grant[k]):
                m.d.sync += held.eq(k)
        return m

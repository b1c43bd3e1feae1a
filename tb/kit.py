"""The testbench kit: one stream source, one stream sink, one per-cycle loop
and one in-order scoreboard, shared by the cocotb benches (re-exported by
:mod:`elmoe3d.tb.common`).

A stream port ``<prefix>`` is the ``<prefix>__valid``, ``<prefix>__ready``
and ``<prefix>__payload`` signals Amaranth makes of a ``wiring`` stream
member. Every cycle has two halves, after the rising edge of the clock:

1. *drive*: each :class:`Source` offers an item (``valid``, ``payload``),
   each :class:`Sink` sets ``ready``;
2. *sample* (in ``ReadOnly``, the settled values of that cycle): a transfer
   happened on a port where ``valid`` and ``ready`` are both 1.

:class:`CycleLoop` runs both halves for many ports from one coroutine (a
coroutine per port costs about twice as much simulation time);
:class:`StreamSource` / :class:`StreamSink` (in :mod:`elmoe3d.tb.common`)
run one port each from a coroutine of its own. Idle cycles and
back-pressure are probabilities drawn from the bench's
:class:`random.Random` (or a callable deciding each cycle), so a seed
replays a run.
"""

from __future__ import annotations

import collections

from cocotb.triggers import ReadOnly, RisingEdge

from ..sim.run.payload import pack, unpack

__all__ = ["chance", "reset", "Source", "Sink", "Streams", "CycleLoop", "Scoreboard",
           "Bench", "IdleBackpressure", "deciders", "per_cycle"]


def chance(p, rand) -> bool:
    """One cycle's draw of an idle cycle or of back-pressure.

    Parameters
    ----------
    p : float or callable
        A probability, or a callable returning the decision for this cycle.
    rand : random.Random
        Drawn from only when ``p`` is a non-zero number.

    Returns
    -------
    bool
    """
    if callable(p):
        return bool(p())
    return bool(p) and rand.random() < p


async def reset(dut, cycles: int = 3):
    """Hold ``dut.rst`` high for ``cycles`` rising edges of ``dut.clk``, then
    release it (the clock must be running)."""
    dut.rst.value = 1
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


class _Port:
    """The ``valid`` / ``ready`` / ``payload`` handles of stream ``prefix``."""

    def __init__(self, dut, prefix: str, layout):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.name, self.layout = prefix, layout


class Source(_Port):
    """Drives the DUT input stream ``prefix`` from a queue of items.

    Per cycle, :meth:`drive`: items whose due cycle has come move from
    :attr:`later` to :attr:`queue`; the item that transferred last cycle is
    dropped; with no item held and one queued, an idle cycle is drawn
    (``idle``), and if none, the next item is packed onto ``payload``;
    ``valid`` = an item is held. :meth:`sample` (ReadOnly): the item
    transferred if ``ready``; else, with ``valid`` up, the cycle is a stall.
    So ``valid`` is held with the payload unchanged until ``ready`` (the
    stream rules).

    Parameters
    ----------
    dut, prefix
        The DUT and the stream's port name.
    layout
        Amaranth layout or shape of the payload (:func:`pack`); ``None``:
        items are already packed integers.
    rand : random.Random
        The draws for idle cycles.
    idle : float or callable
        Probability of an idle cycle before an item (see :func:`chance`).
    later : collections.deque, optional
        Deque of ``(due cycle, item)`` to take items from (default: a new
        one, filled by :meth:`put`); an item may be a callable, called for
        the item when due.
    on_stall : callable, optional
        Called with ``prefix`` on every cycle the item waits for ``ready``.
    encode : callable, optional
        ``encode(item)`` -> the packed payload integer, instead of
        ``layout``: a packer compiled once for a long run, or items that
        carry the bench's bookkeeping beside their payload (``sent`` keeps
        the whole item).

    Attributes
    ----------
    sent : list
        ``(cycle, item)`` of each transfer.
    stalls : int
        Cycles with ``valid`` up and ``ready`` down.
    """

    def __init__(self, dut, prefix: str, layout, rand, idle=0.0, *, later=None,
                 on_stall=None, encode=None):
        super().__init__(dut, prefix, layout)
        self.rand, self.idle, self.on_stall = rand, idle, on_stall
        self.encode = encode
        self.queue = collections.deque()
        self.later = collections.deque() if later is None else later
        self.item = None
        self.fired = False
        self.cycle = 0
        self.sent = []
        self.stalls = 0
        self.valid.value = 0

    def send(self, items):
        """Queue ``items`` for the next cycles."""
        self.queue.extend(items)

    def put(self, item, due: int = 0):
        """Queue ``item`` from cycle ``due`` on (never before an item put
        earlier: one source keeps its order)."""
        if self.later and self.later[-1][0] > due:
            due = self.later[-1][0]
        self.later.append((due, item))

    def drive(self, cycle: int):
        """This cycle's ``valid`` and ``payload`` (after the rising edge)."""
        self.cycle = cycle
        later = self.later
        while later and later[0][0] <= cycle:
            it = later.popleft()[1]
            self.queue.append(it() if callable(it) else it)
        if self.fired:
            self.item = None
        if self.item is None and self.queue and not chance(self.idle, self.rand):
            self.item = self.queue.popleft()
            self.payload.value = (self.encode(self.item) if self.encode is not None
                                  else self.item if self.layout is None
                                  else pack(self.layout, self.item))
        self.valid.value = self.item is not None

    def sample(self):
        """Whether the held item transferred this cycle (in ReadOnly)."""
        item = self.item
        self.fired = item is not None and bool(self.ready.value)
        if self.fired:
            self.sent.append((self.cycle, item))
        elif item is not None:
            self.stalls += 1
            if self.on_stall is not None:
                self.on_stall(self.name)

    def busy(self) -> bool:
        """An item is held, queued or due later."""
        return bool(self.item is not None or self.queue or self.later)

    def empty(self) -> bool:
        """Nothing held or queued (items due later not counted)."""
        return not self.queue and self.item is None


class Sink(_Port):
    """Takes the DUT output stream ``prefix`` with random back-pressure and
    checks the stream rules.

    Per cycle, :meth:`drive`: a back-pressure draw sets ``ready``.
    :meth:`sample` (ReadOnly): with ``valid`` up, the payload must have no
    X/Z bits (else AssertionError); a payload offered last cycle and not
    taken must still be offered, unchanged (else a rule violation); with
    ``ready`` up the payload is unpacked and handed to ``fn``.

    Parameters
    ----------
    dut, prefix, layout
        As for :class:`Source` (``layout`` unpacks the payload).
    rand : random.Random
        The draws for back-pressure.
    backpressure : float or callable
        Probability of ``ready`` low in a cycle (see :func:`chance`).
    fn : callable, optional
        Called with each transferred payload (a dict for a struct); default:
        ``(cycle, payload)`` appended to :attr:`received`.
    on_stall : callable, optional
        Called with ``prefix`` on every cycle ``valid`` waits for ``ready``.
    decode : callable, optional
        ``decode(raw)`` -> what ``fn`` receives, instead of
        ``unpack(layout, raw)``: e.g. a :class:`~elmoe3d.sim.run.payload.Decoder`,
        or ``int`` for the packed integer itself.

    Attributes
    ----------
    received : list
        ``(cycle, payload)`` of each transfer, when no ``fn`` is given.
    rule_violations : list
        ``(cycle, message)`` per cycle a stream rule was broken.
    """

    def __init__(self, dut, prefix: str, layout, rand, backpressure=0.0, fn=None, *,
                 on_stall=None, decode=None):
        super().__init__(dut, prefix, layout)
        self.rand, self.backpressure, self.on_stall = rand, backpressure, on_stall
        self.decode = decode
        self.received = []
        self.fn = fn if fn is not None else (lambda p: self.received.append((self.cycle, p)))
        self.rule_violations = []
        self.rdy = False
        self.held = None                    # payload offered, not taken
        self.cycle = 0
        self.ready.value = 0

    def drive(self, cycle: int):
        """This cycle's ``ready`` (after the rising edge)."""
        self.cycle = cycle
        self.rdy = not chance(self.backpressure, self.rand)
        self.ready.value = self.rdy

    def sample(self):
        """This cycle's transfer and stream-rule check (in ReadOnly)."""
        if not self.valid.value:
            if self.held is not None:
                self.rule_violations.append((self.cycle, "valid dropped before ready"))
            self.held = None
            return
        v = self.payload.value
        if not v.is_resolvable:
            raise AssertionError(f"{self.name}: payload {v} has X/Z bits while valid")
        raw = v.to_unsigned()
        if self.held is not None and raw != self.held:
            self.rule_violations.append((self.cycle, "payload changed before ready"))
        if self.rdy:
            self.held = None
            self.fn(unpack(self.layout, raw) if self.decode is None else self.decode(raw))
        else:
            self.held = raw
            if self.on_stall is not None:
                self.on_stall(self.name)


class Streams:
    """Makes a bench's :class:`Source` s and :class:`Sink` s with shared
    settings: one ``rand``, the ``idle`` probability of every source, the
    ``backpressure`` of every sink (default: ``idle``), one ``on_stall``
    hook. (The bench lists them for :meth:`CycleLoop.run` in the order it
    wants them driven: that order fixes the sequence of draws.)"""

    def __init__(self, dut, rand, idle=0.0, backpressure=None, on_stall=None):
        self.dut, self.rand, self.idle, self.on_stall = dut, rand, idle, on_stall
        self.backpressure = idle if backpressure is None else backpressure

    def source(self, prefix: str, layout, **kw) -> Source:
        """A :class:`Source` for ``prefix`` (``kw``: ``later``)."""
        return Source(self.dut, prefix, layout, self.rand, self.idle, on_stall=self.on_stall,
                      **kw)

    def sink(self, prefix: str, layout, fn=None) -> Sink:
        """A :class:`Sink` for ``prefix`` handing each payload to ``fn``."""
        return Sink(self.dut, prefix, layout, self.rand, self.backpressure, fn,
                    on_stall=self.on_stall)


class CycleLoop:
    """Runs a bench's streams cycle by cycle from one coroutine.

    Per cycle, :meth:`run`: waits for the rising edge of ``clk`` and counts
    the cycle (:attr:`cycle`, from 1); calls ``before(cycle)`` (the bench's
    own models driving non-stream inputs); drives every source, then every
    sink; waits for ReadOnly; samples every source, then every sink (their
    callbacks run here); then asks ``done()``.

    Parameters
    ----------
    clk
        The clock handle.

    Attributes
    ----------
    cycle : int
        The cycles run so far (the bench's time base: :meth:`later`).
    """

    def __init__(self, clk):
        self.clk = clk
        self.cycle = 0

    def later(self, d: int) -> int:
        """The cycle ``d`` cycles from now."""
        return self.cycle + d

    async def run(self, sources, sinks, *, limit: int, before=None, stop=None, done=None,
                  grace: int = 50) -> int:
        """Run cycles until ``stop()`` (asked before each cycle), until
        ``done()`` has held for ``grace`` + 1 cycles (asked after each), or
        until cycle ``limit``.

        Parameters
        ----------
        sources, sinks : list
            :class:`Source` and :class:`Sink` objects (anything with
            ``drive(cycle)`` and ``sample()``).
        limit : int
            The last cycle.
        before, stop, done : callable, optional
            See above.
        grace : int
            Cycles run on after ``done()`` first holds (late or extra
            transfers still show up).

        Returns
        -------
        int
            :attr:`cycle` at the end.
        """
        after = 0
        while self.cycle < limit and not (stop is not None and stop()):
            await RisingEdge(self.clk)
            self.cycle += 1
            cycle = self.cycle
            if before is not None:
                before(cycle)
            for x in sources:
                x.drive(cycle)
            for x in sinks:
                x.drive(cycle)
            await ReadOnly()
            for x in sources:
                x.sample()
            for x in sinks:
                x.sample()
            if done is not None and done():
                after += 1
                if after > grace:
                    break
        return self.cycle


class Scoreboard:
    """Expected items, checked in order as the DUT's items arrive; fails at
    the end if any was wrong, extra, or left unchecked.

    Per arriving item (:meth:`check`, typically a :class:`Sink`'s ``fn``):
    compared with the oldest expected item not yet checked; a mismatch, or
    an item with nothing expected, is recorded (not raised: the bench runs
    on and :meth:`finish` reports it with the rest).

    Parameters
    ----------
    name : str
        Names the items in messages (e.g. ``"response"``).
    compare : callable, optional
        ``compare(want, got)`` -> ``None`` for a match, else a message;
        default: equality.

    Attributes
    ----------
    expected : collections.deque
        ``(item, label)`` not yet checked.
    errors : list of str
    checked : int
        Items that arrived so far.
    """

    def __init__(self, name: str, compare=None):
        self.name = name
        self.compare = compare or (lambda want, got: None if want == got
                                   else f"{got!r} != expected {want!r}")
        self.expected = collections.deque()
        self.errors = []
        self.checked = 0

    def expect(self, item, label: str = ""):
        """Add ``item`` to the expected ones (``label`` goes into messages)."""
        self.expected.append((item, label))

    def check(self, got) -> bool:
        """Compare ``got`` with the oldest expected item; True if it matched."""
        i = self.checked
        self.checked += 1
        if not self.expected:
            self.errors.append(f"{self.name} {i}: {got!r} arrived, none expected")
            return False
        want, label = self.expected.popleft()
        msg = self.compare(want, got)
        if msg is not None:
            self.errors.append(f"{self.name} {i}{' ' + label if label else ''}: {msg}")
            return False
        return True

    def finish(self, context: str = ""):
        """Raise AssertionError if an item was wrong or extra, or one is still
        expected; ``context`` (e.g. the cycle) goes into the message."""
        left = len(self.expected)
        if left:
            self.errors.append(f"{left} {self.name}(s) expected but not received "
                               f"({self.checked} of {self.checked + left} arrived"
                               f"{', ' + context if context else ''})")
        if self.errors:
            raise AssertionError(f"{len(self.errors)} {self.name} error(s): "
                                 + "; ".join(self.errors[:5]))


class IdleBackpressure:
    """Mixin of a bench's ``TB`` class: idle and back-pressure setters in
    the style of verilog-axi's benches.

    A setting is kept in :attr:`idle` / :attr:`backpressure`, for the ports
    the bench makes afterwards (it passes them to :class:`Source` and
    :class:`Sink`), and applied at once to every :class:`Source` /
    :class:`Sink` that already is an attribute of the bench.

    Attributes
    ----------
    idle : float or callable
        Of the sources made afterwards (see :func:`chance`); default 0.0.
    backpressure : float or callable
        Of the sinks made afterwards; default 0.0.
    """

    idle = 0.0
    backpressure = 0.0

    def set_idle_generator(self, generator=None):
        """Idle cycles before an item on the bench's sources (:func:`deciders`:
        a probability per cycle, or verilog-axi's generator function);
        ``None``: none."""
        ports = self._kit_ports(Source)
        for port, d in zip(ports, deciders(generator, len(ports))):
            port.idle = d
        self.idle = deciders(generator, 1)[0]

    def set_backpressure_generator(self, generator=None):
        """Back-pressure (``ready`` low) on the bench's sinks, as for
        :meth:`set_idle_generator`; ``None``: always ready."""
        ports = self._kit_ports(Sink)
        for port, d in zip(ports, deciders(generator, len(ports))):
            port.backpressure = d
        self.backpressure = deciders(generator, 1)[0]

    def _kit_ports(self, kind):
        return [v for v in vars(self).values() if isinstance(v, kind)]


class Bench:
    """The base of a bench's ``TB`` class (the verilog-axi benches' style):
    its ports, its cycle loop and its scoreboards in one object, idle cycles
    and back-pressure set on every port at once.

    The bench makes its ports with :meth:`source` / :meth:`sink` (or adds
    its own :class:`Source` / :class:`Sink` subclasses with :meth:`add`),
    in the order they are to be driven (that order fixes the sequence of
    draws); :meth:`run` runs them all with one :class:`CycleLoop`;
    :meth:`finish` ends every scoreboard made with :meth:`scoreboard` and
    fails on any stream-rule violation.

    Parameters
    ----------
    dut
        The DUT (``dut.clk`` clocks the loop).
    rand : random.Random
        The draws for idle cycles and back-pressure.
    idle : float or callable
        Idle probability of every source (:meth:`set_idle`).
    backpressure : float or callable, optional
        Back-pressure of every sink (default: ``idle``).
    on_stall : callable, optional
        Called with the port name on every stalled cycle (:class:`Source`).
    loop : CycleLoop, optional
        Another bench's loop to share (its cycle count is this bench's
        time base); default a new one on ``dut.clk``.

    Attributes
    ----------
    sources, sinks : list
        The ports, in driving order.
    scoreboards : list of Scoreboard
    loop : CycleLoop
    """

    def __init__(self, dut, rand, *, idle=0.0, backpressure=None, on_stall=None, loop=None):
        self.dut, self.rand = dut, rand
        self.streams = Streams(dut, rand, idle, backpressure, on_stall)
        self.loop = loop if loop is not None else CycleLoop(dut.clk)
        self.sources, self.sinks, self.scoreboards = [], [], []

    @property
    def cycle(self) -> int:
        """The cycles run so far (:attr:`CycleLoop.cycle`)."""
        return self.loop.cycle

    def later(self, d: int) -> int:
        """The cycle ``d`` cycles from now."""
        return self.loop.later(d)

    def add(self, port):
        """Run ``port`` (a :class:`Source` or :class:`Sink`, or a subclass)
        in this bench's loop, after the ports added so far. Returns it."""
        (self.sinks if isinstance(port, Sink) else self.sources).append(port)
        return port

    def source(self, prefix: str, layout, **kw) -> Source:
        """A :class:`Source` for ``prefix`` with the bench's settings
        (``kw``: ``later``), added to the loop."""
        return self.add(self.streams.source(prefix, layout, **kw))

    def sink(self, prefix: str, layout, fn=None) -> Sink:
        """A :class:`Sink` for ``prefix`` handing each payload to ``fn``,
        added to the loop."""
        return self.add(self.streams.sink(prefix, layout, fn))

    def scoreboard(self, name: str, compare=None) -> Scoreboard:
        """A :class:`Scoreboard` that :meth:`finish` ends."""
        sb = Scoreboard(name, compare)
        self.scoreboards.append(sb)
        return sb

    def set_idle(self, p=0.0, names=None):
        """Idle probability (or callable, :func:`chance`) of the sources named
        in ``names`` (default: every source, and those made later)."""
        for s in self.sources:
            if names is None or s.name in names:
                s.idle = p
        if names is None:
            self.streams.idle = p

    def set_backpressure(self, p=0.0, names=None):
        """Back-pressure probability (or callable) of the sinks named in
        ``names`` (default: every sink, and those made later)."""
        for s in self.sinks:
            if names is None or s.name in names:
                s.backpressure = p
        if names is None:
            self.streams.backpressure = p

    def set_idle_generator(self, generator=None):
        """verilog-axi's setter (:func:`deciders`): a probability, or each
        source draws its idle decisions from its own ``generator()`` (an
        iterator of truth values, advanced once per cycle an item waits to
        be offered); ``None``: no idle cycles."""
        for s, d in zip(self.sources, deciders(generator, len(self.sources))):
            s.idle = d

    def set_backpressure_generator(self, generator=None):
        """verilog-axi's setter (:func:`deciders`): a probability, or each
        sink draws ``ready`` low from its own ``generator()`` (advanced once
        per cycle); ``None``: always ready."""
        for s, d in zip(self.sinks, deciders(generator, len(self.sinks))):
            s.backpressure = d

    async def run(self, *, limit: int, before=None, stop=None, done=None,
                  grace: int = 50) -> int:
        """Run every port (:meth:`CycleLoop.run`, same arguments)."""
        return await self.loop.run(self.sources, self.sinks, limit=limit, before=before,
                                   stop=stop, done=done, grace=grace)

    def rule_violations(self) -> int:
        """Stream-rule violations seen on the sinks so far."""
        return sum(len(s.rule_violations) for s in self.sinks)

    def finish(self, context: str = ""):
        """End every scoreboard (:meth:`Scoreboard.finish`, ``context`` into
        its message), then raise AssertionError on any stream-rule
        violation."""
        for sb in self.scoreboards:
            sb.finish(context)
        viol = self.rule_violations()
        assert viol == 0, f"{viol} stream-rule violations on the outputs"


def deciders(generator, n: int) -> list:
    """``n`` per-cycle decisions (:func:`chance`'s ``p``) from a
    ``set_*_generator`` setting: ``None`` -> never; a number -> that
    probability (drawn from the bench's random generator, so a seed replays
    it); a callable -> verilog-axi's generator function: each port its own
    iterator ``generator()``, one value taken per decision."""
    if generator is None:
        return [0.0] * n
    if not callable(generator):
        return [generator] * n
    out = []
    for _ in range(n):
        it = generator()
        out.append(lambda it=it: bool(next(it)))
    return out


def per_cycle(fn):
    """A ``set_*_generator`` setting (verilog-axi's generator function) from
    ``fn``, a callable deciding each cycle (True: idle / not ready): every
    port's iterator calls the same ``fn``, so the decisions keep ``fn``'s
    order of draws."""
    return lambda: iter(fn, None)

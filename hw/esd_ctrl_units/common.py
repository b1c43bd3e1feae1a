"""Helpers shared by the controller's units: the registered stream output
every unit drives, and two small arithmetic helpers.

Why every unit output is a register
-----------------------------------
A unit's finite-state machine decides *what* to send; :class:`Emit` holds
it. The FSM loads the output's ``valid`` and payload registers (``put``)
in a cycle in which the output is ``free`` (empty, or emptied by a transfer
in this cycle), and goes on; the register drains by itself. So

* the payload is a register: no state decode or field multiplexer of one
  unit sits in front of another unit's logic (such paths would be the
  controller's longest);
* the stream rules hold by construction (``valid`` falls only with
  ``ready``, the payload loads only when ``free``), whatever the FSM does;
* one state can load several outputs at once (an event, a tag command and
  an LPDDR command) without the double transfer that two combinational
  handshakes in one state would risk: each is loaded exactly once, when all
  of them are free.

``free`` is ``~valid | ready``: the consumer's ``ready`` reaches the FSM's
decision, never another unit's ``valid``. A unit's *input* ``ready``
depends on its own registers only (``empty``, not ``free``, of the outputs
the input's transfer loads), so no handshake chains through two units: a
path starts at one unit's flip-flops and ends at its neighbour's. Where an
output is known to have drained before a state (a result taken before the
next order, the one LPDDR command of an expert), the state tests ``empty``
too: fewer of the consumer's signals in the unit's load enables. Handing over to another unit
(a result, an order) waits for the unit's own events to have left
(``Emit.free`` of its event output), so an event that must precede the
other unit's events in the trace always does.

Why every FSM starts in a START state: Icarus 11 does not evaluate an
``always @*`` process whose inputs have not changed since time 0, so a
signal assigned in a state from registers only would read X after reset;
the state register changes once out of reset (START -> the first state)
and every such process runs. Signals assigned outside the FSM are written
as ``Mux`` expressions for the same reason.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data

from ...config import require_config
from ...golden import esd as gesd

__all__ = ["Emit", "check_config", "clear_counts", "saturating_add", "clamp", "allocate_fields"]


class Emit:
    """A registered ``amaranth.lib.stream`` output of a unit.

    Parameters
    ----------
    m : Module
        The unit's module (the register logic goes there).
    port : stream.Interface
        The unit's output stream (``Out(stream.Signature(...))``); its
        ``valid`` and ``payload`` become registers.
    name : str
        Prefix of the helper signals.

    Members
    -------
    free : Signal
        The output can take a payload in this cycle (``~valid | ready``);
        also "everything put so far has left or leaves now".
    empty : Value
        The register holds nothing (``~valid``, a flip-flop).

    Latency: a payload put in cycle ``t`` is valid from ``t + 1``;
    throughput one per cycle while ``ready`` is high.

    Why the payload loads whenever the output is free: its enable is then
    ``free`` alone (a flip-flop and the consumer's ``ready``), not the OR of
    every condition under which the unit sends; what it loads while nothing
    is sent is never seen (``valid`` stays low). A state that knows what it
    would send before it knows whether it sends (an event whose fields come
    from registers and a response that may not have arrived yet) calls
    :meth:`stage` at the state's level and :meth:`send` under the
    condition: the payload's data then depends on the state only.
    """

    def __init__(self, m: Module, port, name: str):
        self.port = port
        self.free = Signal(name=f"{name}_free")
        m.d.comb += self.free.eq(~port.valid | port.ready)
        self.empty = ~port.valid
        self._fields = ([f for f, _ in data.Layout.cast(port.payload.shape())]
                        if isinstance(port.payload, data.View) else None)
        self.staged = Signal.like(port.payload, name=f"{name}_staged")
        with m.If(port.ready):
            m.d.sync += port.valid.eq(0)
        with m.If(self.free):
            m.d.sync += port.payload.eq(self.staged)

    def stage(self, m: Module, whole=None, /, **fields):
        """What the output takes if this cycle sends: ``whole`` (the whole
        payload), or the named fields of a ``data.Struct`` payload (fields
        not named are 0)."""
        if whole is not None or self._fields is None:
            m.d.comb += self.staged.eq(whole)
            return
        unknown = set(fields) - set(self._fields)
        if unknown:
            raise KeyError(f"Unknown payload fields {sorted(unknown)}")
        for f in self._fields:
            m.d.comb += getattr(self.staged, f).eq(fields.get(f, 0))

    def send(self, m: Module):
        """Send what is staged (call where ``free`` is true)."""
        m.d.sync += self.port.valid.eq(1)

    def put(self, m: Module, whole=None, /, **fields):
        """:meth:`stage` and :meth:`send` in one (call where ``free`` is true)."""
        self.stage(m, whole, **fields)
        self.send(m)


#: ``TypeError`` naming the unit unless ``cfg`` is a Config
check_config = require_config


def clear_counts(m: Module, inc, names) -> None:
    """Every counter increment of ``names`` is 0 in a cycle that does not set
    it (the default of a unit's registered ``CounterBump``)."""
    m.d.sync += [getattr(inc, name).eq(0) for name in names]


def saturating_add(counter, amount):
    """``min(counter + amount, 2**len(counter) - 1)`` for an unsigned
    ``counter`` and a non-negative ``amount`` (a value or an int). The sum's
    bits above the counter are its overflow: an OR of the adder's top bits,
    not a compare chain behind it."""
    n = len(counter)
    s = counter + amount
    if len(s) <= n:
        return s
    return Mux(s[n:].any(), (1 << n) - 1, s[:n])


def clamp(v, hi: int):
    """``min(v, hi)`` for an unsigned value; ``v`` itself when it cannot
    exceed ``hi`` (no constant comparison in the Verilog: Verilator's lint
    flags those)."""
    return v if (1 << len(v)) - 1 <= hi else Mux(v > hi, hi, v)


def allocate_fields(rsp, ok, amount) -> dict:
    """The ``ALLOCATE`` event's fields from the tag unit's response ``rsp``
    (``ok``: a victim was found): FREE / EVICT with the victim ``slot``, the
    evicted ``tag`` and the hotness ``amount``, or NO_VICTIM with zeros (the
    pass engine's and the prefetcher's, one definition)."""
    AR = gesd.AllocResult
    return dict(code=Mux(ok, Mux(rsp.evicted, AR.EVICT, AR.FREE), AR.NO_VICTIM),
                slot=Mux(ok, rsp.slot, 0), tag=Mux(ok & rsp.evicted, rsp.evicted_tag, 0),
                value=Mux(ok, amount, 0))

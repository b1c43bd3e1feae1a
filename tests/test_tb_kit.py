"""The testbench kit (``tb/kit.py``) without a simulator: the scoreboard
fails on an item left unchecked, an out-of-order item and an extra one; the
stream source holds its item until ``ready``; the stream sink flags a
payload changed or dropped before ``ready``. Signals are stand-ins with a
``value``."""

import random

import pytest

from elmoe3d.tb.kit import Scoreboard, Sink, Source


class _Value(int):
    """A resolved signal value as cocotb reads it."""

    is_resolvable = True

    def to_unsigned(self):
        return int(self)


class _Sig:
    def __init__(self, v=0):
        self.value = _Value(v)


class _Dut:
    def __init__(self, prefix):
        for s in ("valid", "ready", "payload"):
            setattr(self, f"{prefix}__{s}", _Sig())


def test_scoreboard_passes_in_order():
    sb = Scoreboard("beat")
    for x in (1, 2, 3):
        sb.expect(x)
    assert all(sb.check(x) for x in (1, 2, 3))
    sb.finish()


def test_scoreboard_fails_on_an_unchecked_item():
    sb = Scoreboard("beat")
    sb.expect(1)
    sb.expect(2, "the planted one")
    assert sb.check(1)
    with pytest.raises(AssertionError, match="1 beat.* expected but not received"):
        sb.finish("cycle 9")


def test_scoreboard_fails_on_an_out_of_order_item():
    sb = Scoreboard("beat")
    for x in (1, 2):
        sb.expect(x)
    assert not sb.check(2)
    assert not sb.check(1)
    with pytest.raises(AssertionError, match=r"beat 0: 2 != expected 1"):
        sb.finish()


def test_scoreboard_fails_on_an_extra_item_and_uses_compare():
    sb = Scoreboard("response", compare=lambda w, g: None if g["op"] == w["op"] else "op")
    sb.expect({"op": 1})
    assert sb.check({"op": 1, "x": 5})          # only the compared fields count
    assert not sb.check({"op": 2})
    with pytest.raises(AssertionError, match="none expected"):
        sb.finish()


def test_source_holds_its_item_until_ready():
    dut = _Dut("i")
    src = Source(dut, "i", None, random.Random(0))
    src.put(7, due=2)
    src.drive(1)
    assert not dut.i__valid.value                    # not due yet
    src.sample()
    for cycle in (2, 3):                              # offered, not taken
        src.drive(cycle)
        assert dut.i__valid.value and dut.i__payload.value == 7
        src.sample()
    dut.i__ready.value = _Value(1)
    src.drive(4)
    src.sample()
    src.drive(5)
    assert not dut.i__valid.value and not src.busy()
    assert src.sent == [(4, 7)] and src.stalls == 2


def test_sink_flags_stream_rule_breaks():
    dut = _Dut("o")
    seen = []
    snk = Sink(dut, "o", 8, random.Random(0), lambda: True, seen.append)   # never ready
    dut.o__valid.value, dut.o__payload.value = _Value(1), _Value(3)
    snk.drive(1)
    snk.sample()
    dut.o__payload.value = _Value(4)                  # changed before ready
    snk.drive(2)
    snk.sample()
    dut.o__valid.value = _Value(0)                    # dropped before ready
    snk.drive(3)
    snk.sample()
    assert [c for c, _ in snk.rule_violations] == [2, 3] and not seen
    snk.backpressure = 0.0
    dut.o__valid.value = _Value(1)
    snk.drive(4)
    snk.sample()
    assert seen == [4] and len(snk.rule_violations) == 2


def test_source_encode_and_sink_decode():
    """``encode`` packs an item that carries bookkeeping beside its payload
    (``sent`` keeps the whole item); ``decode`` replaces ``unpack`` (here:
    the raw integer)."""
    dut = _Dut("s")
    src = Source(dut, "s", None, random.Random(0), encode=lambda it: it[0] * 2)
    src.send([(5, "dot 0")])
    src.drive(1)
    assert dut.s__valid.value and dut.s__payload.value == 10
    dut.s__ready.value = _Value(1)
    src.sample()
    assert src.sent == [(1, (5, "dot 0"))]
    seen = []
    snk = Sink(dut, "s", 8, random.Random(0), 0.0, seen.append, decode=lambda raw: ("raw", raw))
    dut.s__payload.value = _Value(200)
    snk.drive(2)
    snk.sample()
    assert seen == [("raw", 200)]


def test_idle_backpressure_setters():
    """The mixin keeps a setting for ports made later and applies it to the
    ports the bench already has; ``None`` switches it off."""
    import itertools

    from elmoe3d.tb.kit import IdleBackpressure

    class TB(IdleBackpressure):
        pass

    tb = TB()
    assert tb.idle == tb.backpressure == 0.0
    tb.set_idle_generator(0.25)
    dut = _Dut("i")
    tb.src = Source(dut, "i", None, random.Random(0), tb.idle)
    tb.snk = Sink(dut, "i", 8, random.Random(0), tb.backpressure)
    assert tb.src.idle == 0.25 and tb.snk.backpressure == 0.0
    tb.set_backpressure_generator(lambda: itertools.cycle([1, 0]))   # verilog-axi's
    tb.set_idle_generator()
    assert tb.src.idle == 0.0 == tb.idle
    ready = []
    for cycle in (1, 2, 3):
        tb.snk.drive(cycle)
        ready.append(bool(dut.i__ready.value))
    assert ready == [False, True, False]


def test_bench_owns_ports_setters_and_scoreboards():
    """The ``TB`` base (``kit.Bench``): ports made or added join the loop in
    order; ``set_idle`` / ``set_backpressure`` reach every port (or the named
    ones) and the ports made later; the generator setters take each port's
    decisions from its own iterator; ``finish`` fails on a scoreboard item
    left unchecked and on a stream-rule break."""
    import itertools

    from elmoe3d.tb.kit import Bench

    dut = _Dut("i")
    for s in ("valid", "ready", "payload"):
        setattr(dut, f"o__{s}", _Sig())
    tb = Bench(dut, random.Random(0), idle=0.1, loop=object())
    src = tb.source("i", None)
    extra = tb.add(Sink(dut, "o", 8, tb.rand))
    assert tb.sources == [src] and tb.sinks == [extra]
    assert src.idle == 0.1 and tb.streams.backpressure == 0.1
    tb.set_idle(0.5, names={"x"})
    assert src.idle == 0.1
    tb.set_idle(0.0)
    tb.set_backpressure(1.0)
    assert src.idle == 0.0 and extra.backpressure == 1.0 and tb.streams.backpressure == 1.0
    tb.set_backpressure_generator(lambda: itertools.cycle([1, 0]))
    tb.set_idle_generator(lambda: itertools.cycle([0, 1]))
    rdy = []
    for cycle in (1, 2, 3):
        extra.drive(cycle)
        rdy.append(extra.rdy)
    assert rdy == [False, True, False]
    src.put(5)
    src.drive(1)
    assert dut.i__valid.value and dut.i__payload.value == 5   # first draw 0: offered
    tb.set_idle_generator(None)
    tb.set_backpressure_generator(None)
    assert src.idle == 0.0 and extra.backpressure == 0.0
    sb = tb.scoreboard("beat")
    sb.expect(1)
    sb.check(1)
    tb.finish()
    tb.scoreboard("beat").expect(2)                   # left unchecked
    with pytest.raises(AssertionError, match="expected but not received"):
        tb.finish()
    tb.scoreboards.pop()
    extra.rule_violations.append((3, "payload changed before ready"))
    with pytest.raises(AssertionError, match="1 stream-rule violations"):
        tb.finish()

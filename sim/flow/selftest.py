"""Built-in self-test designs for FPGA boards.

:class:`StreamSelfTest` wraps any block whose ports are ``amaranth.lib.stream``
interfaces (plus static inputs): a ROM per input stream replays golden input
beats, a ROM per output stream holds the golden model's expected beats, and
every output beat is compared as it arrives. When every expected beat has
arrived (or a timeout passes) the wrapper lights a PASS or FAIL LED and sends
one UART line, ``ELMOE3D <block> PASS n=<beats checked, hex>`` (or ``FAIL``,
with the count of mismatched beats), 8N1.

The vectors come from the golden models (:data:`VECTORS`, one provider per
block): the ROM is the specification, the block under test runs on the
fabric. Generic over the block: a block whose outputs are a deterministic
function of its input beat sequences (not of their timing) needs only a
vector provider.
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["UARTTx", "RomSource", "RomChecker", "Verdict", "StreamSelfTest", "VECTORS", "pe_vectors",
           "vectors_for", "decode_uart"]


class UARTTx(wiring.Component):
    """Sends a constant byte string (one of two, chosen by ``sel``) once,
    8N1, ``divisor`` clock cycles per bit, when ``start`` is pulsed."""

    def __init__(self, messages: list[bytes], divisor: int):
        if divisor < 1:
            raise ValueError(f"UART divisor must be >= 1, not {divisor!r}")
        self.messages, self.divisor = messages, divisor
        super().__init__({"start": In(1), "sel": In(range(len(messages))),
                          "hex": In(16), "tx": Out(1, init=1), "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        # a message may contain b"%%%%": replaced by the 4 hex digits of `hex`
        L = max(len(x) for x in self.messages)
        msgs = [x.ljust(L, b"\0") for x in self.messages]
        rom = memory.Memory(shape=8, depth=len(msgs) * L,
                            init=[c for x in msgs for c in x])
        m.submodules.rom = rom
        rd = rom.read_port(domain="comb")
        idx = Signal(range(L + 1))
        sel = Signal.like(self.sel)
        m.d.comb += rd.addr.eq(sel * L + idx)
        hexpos = [x.find(b"%%%%") for x in msgs]
        char = Signal(8)
        digit = Signal(4)
        m.d.comb += char.eq(rd.data)
        for k, pos in enumerate(hexpos):
            if pos < 0:
                continue
            for d in range(4):
                with m.If((sel == k) & (idx == pos + d)):
                    m.d.comb += digit.eq(self.hex[(3 - d) * 4:(4 - d) * 4])
                    m.d.comb += char.eq(Mux(digit < 10, ord("0") + digit, ord("A") - 10 + digit))
        shift = Signal(10)
        bits = Signal(range(11))
        tick = Signal(range(self.divisor))
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [idx.eq(0), sel.eq(self.sel)]
                    m.next = "LOAD"
            with m.State("LOAD"):
                with m.If((idx == L) | (char == 0)):
                    m.next = "DONE"
                with m.Else():
                    m.d.sync += [shift.eq((1 << 9) | (char << 1)), bits.eq(10), tick.eq(0)]
                    m.next = "SEND"
            with m.State("SEND"):
                m.d.comb += self.busy.eq(1)
                m.d.comb += self.tx.eq(shift[0])
                with m.If(tick == self.divisor - 1):
                    m.d.sync += [tick.eq(0), shift.eq(shift >> 1), bits.eq(bits - 1)]
                    with m.If(bits == 1):
                        m.d.sync += idx.eq(idx + 1)
                        m.next = "LOAD"
                with m.Else():
                    m.d.sync += tick.eq(tick + 1)
            with m.State("DONE"):
                pass
        return m


class RomSource(wiring.Component):
    """Replays ``words`` on the stream ``o``, one per transfer, from a ROM
    read combinationally (LUTs: keep it short); ``done`` once every word
    was taken. ``valid`` never waits for ``ready`` (the stream rules)."""

    def __init__(self, width: int, words: list[int]):
        self.width, self.words = width, list(words)
        super().__init__({"o": Out(stream.Signature(width)), "done": Out(1)})

    def elaborate(self, platform):
        m = Module()
        n = len(self.words)
        m.submodules.rom = rom = memory.Memory(shape=self.width, depth=max(n, 1),
                                               init=self.words or [0])
        rd = rom.read_port(domain="comb")
        idx = Signal(range(n + 1))
        m.d.comb += [rd.addr.eq(idx), self.o.payload.eq(rd.data), self.o.valid.eq(idx < n),
                     self.done.eq(idx == n)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += idx.eq(idx + 1)
        return m


class RomChecker(wiring.Component):
    """Checks the beats of the stream ``i`` (always ready) against ``words``
    in order: beat ``j`` must equal ``words[j]`` on the bits set in
    ``masks[j]`` (every bit when ``masks`` is ``None``). ``error`` is a
    strobe: a beat that differed, or one more beat than expected; ``done``
    once every expected beat arrived."""

    def __init__(self, width: int, words: list[int], masks: list[int] | None = None):
        if masks is not None and len(masks) != len(words):
            raise ValueError(f"{len(masks)} masks for {len(words)} expected words")
        self.width, self.words = width, list(words)
        self.masks = None if masks is None else list(masks)
        super().__init__({"i": In(stream.Signature(width)), "done": Out(1), "error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        n, full = len(self.words), (1 << self.width) - 1
        masks = self.masks if self.masks is not None else [full] * n
        # the mask beside the word in one ROM row (upper half) when any bit is masked
        masked = any(x != full for x in masks)
        init = [w | (mk << self.width) if masked else w for w, mk in zip(self.words, masks)]
        m.submodules.rom = rom = memory.Memory(shape=self.width * (2 if masked else 1),
                                               depth=max(n, 1), init=init or [0])
        rd = rom.read_port(domain="comb")
        idx = Signal(range(n + 1))
        want = rd.data[:self.width]
        mask = rd.data[self.width:] if masked else Const(full, self.width)
        m.d.comb += [rd.addr.eq(idx), self.i.ready.eq(1), self.done.eq(idx == n)]
        with m.If(self.i.valid):
            m.d.comb += self.error.eq((idx == n) | (((self.i.payload ^ want) & mask) != 0))
            with m.If(idx != n):
                m.d.sync += idx.eq(idx + 1)
        return m


class Verdict(wiring.Component):
    """The end of a self-test: counts ``error`` strobes (saturating at
    0xFFFF, registered once on the way in); once ``finished`` has held for 64 cycles (so that excess beats
    show) or ``timeout`` cycles have passed (a timeout with no error counts
    one), ``done`` rises and stays; ``passed`` / ``failed`` follow and one
    UART line goes out: ``ELMOE3D <name> PASS n=<total, 4 hex digits>`` or
    ``ELMOE3D <name> FAIL bad=<errors, 4 hex digits>``, CR LF, 8N1."""

    def __init__(self, *, name: str, total: int, uart_divisor: int, timeout: int):
        if timeout < 1:
            raise ValueError(f"Self-test timeout must be >= 1 cycle, not {timeout!r}")
        self.name, self.total = name, total
        self.uart_divisor, self.timeout = uart_divisor, timeout
        super().__init__({"finished": In(1), "error": In(1), "passed": Out(1),
                          "failed": Out(1), "done": Out(1), "uart_tx": Out(1, init=1),
                          "mismatches": Out(16)})

    def elaborate(self, platform):
        m = Module()
        errors = Signal(16)
        timer = Signal(range(self.timeout + 1))
        done = Signal()
        settle = Signal(range(64))
        # the error strobe is registered first: the checkers' compare logic
        # and this counter's adder are a cycle apart (the 64 settling cycles
        # cover the delay)
        error = Signal()
        m.d.sync += error.eq(self.error)
        with m.If(~done & error):
            m.d.sync += errors.eq(errors + (errors != 0xFFFF))
        with m.If(~done):
            m.d.sync += timer.eq(timer + 1)
            with m.If(self.finished):
                m.d.sync += settle.eq(settle + 1)
                with m.If(settle == 63):
                    m.d.sync += done.eq(1)
            with m.If(timer == self.timeout):
                m.d.sync += [done.eq(1), errors.eq(errors | (errors == 0))]
        ok = done & (errors == 0)
        m.d.comb += [self.done.eq(done), self.passed.eq(ok), self.failed.eq(done & ~ok),
                     self.mismatches.eq(errors)]
        msg_pass = f"ELMOE3D {self.name} PASS n=%%%%\r\n".encode()
        msg_fail = f"ELMOE3D {self.name} FAIL bad=%%%%\r\n".encode()
        m.submodules.uart = uart = UARTTx([msg_pass, msg_fail], self.uart_divisor)
        sent = Signal()
        m.d.comb += [uart.start.eq(done & ~sent), uart.sel.eq(~ok),
                     uart.hex.eq(Mux(ok, self.total, errors)), self.uart_tx.eq(uart.tx)]
        with m.If(done):
            m.d.sync += sent.eq(1)
        return m


class StreamSelfTest(wiring.Component):
    """Self-test wrapper: ROM-driven input streams, ROM-checked output streams.

    Parameters
    ----------
    dut : wiring.Component
        The block; every port is a stream (``valid``/``ready``/``payload``)
        or a static input named in ``statics``.
    inputs, expected : dict of str to list of int
        Raw payload words per input / output stream, in order
        (:class:`RomSource` / :class:`RomChecker` each).
    statics : dict of str to int
        Constant values of the other input ports.
    name : str
        Block name for the UART line.
    uart_divisor : int
        Clock cycles per UART bit (e.g. 12 MHz / 115200 = 104).
    timeout : int
        Cycles after which a missing beat fails the test.

    Members
    -------
    passed, failed, done : Out(1)
        Result (LEDs); ``done`` once every expected beat arrived or on timeout
        (:class:`Verdict`).
    uart_tx : Out(1)
        The result line.
    mismatches : Out(16)
        Output beats that differed (or arrived in excess).
    """

    def __init__(self, dut, *, inputs: dict, expected: dict, statics: dict | None = None,
                 name: str = "dut", uart_divisor: int = 104, timeout: int = 1 << 20):
        self.dut, self.inputs, self.expected = dut, inputs, expected
        self.statics = statics or {}
        self.name, self.uart_divisor, self.timeout = name, uart_divisor, timeout
        members = dut.signature.members
        for k in list(inputs) + list(expected):
            if k not in members:
                raise ValueError(f"{name} has no port {k!r}")
        super().__init__({"passed": Out(1), "failed": Out(1), "done": Out(1),
                          "uart_tx": Out(1, init=1), "mismatches": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        for k, v in self.statics.items():
            m.d.comb += getattr(dut, k).eq(v)
        finished, error = Const(1), Const(0)
        for k, words in self.inputs.items():
            port = getattr(dut, k)
            m.submodules[f"rom_{k}"] = src = RomSource(len(port.payload.as_value()), words)
            m.d.comb += [port.payload.as_value().eq(src.o.payload), port.valid.eq(src.o.valid),
                         src.o.ready.eq(port.ready)]
            finished = finished & src.done
        for k, words in self.expected.items():
            port = getattr(dut, k)
            m.submodules[f"exp_{k}"] = chk = RomChecker(len(port.payload.as_value()), words)
            m.d.comb += [chk.i.payload.eq(port.payload.as_value()), chk.i.valid.eq(port.valid),
                         port.ready.eq(chk.i.ready)]
            finished, error = finished & chk.done, error | chk.error
        m.submodules.verdict = v = Verdict(name=self.name,
                                           total=sum(len(w) for w in self.expected.values()),
                                           uart_divisor=self.uart_divisor, timeout=self.timeout)
        m.d.comb += [v.finished.eq(finished), v.error.eq(error), self.passed.eq(v.passed),
                     self.failed.eq(v.failed), self.done.eq(v.done), self.uart_tx.eq(v.uart_tx),
                     self.mismatches.eq(v.mismatches)]
        return m


# ---------------------------------------------------------------------------
# golden vectors


def _layout(dut, port):
    return dut.signature.members[port].signature.members["payload"].shape


def pe_vectors(dut, *, dots: int = 12, seed: int = 1) -> dict:
    """Golden vectors for the bit-slice PE family: FULL and DRAFT dot
    products of random INT8 activations and weights (one to three chunks)."""
    from ...golden import bitslice as gbs
    from ..run.payload import pack
    rng = np.random.default_rng(seed)
    L, s = dut.lanes, dut.slice_bits
    n = gbs.n_planes(s)
    in_l, out_l = _layout(dut, "i"), _layout(dut, "o")
    beats, results = [], []
    for k in range(dots):
        chunks = int(rng.integers(1, 4))
        act = rng.integers(-128, 128, chunks * L)
        w = rng.integers(-128, 128, chunks * L)
        mode = gbs.Mode.FULL if k % 2 == 0 else gbs.Mode.DRAFT
        keep = 1
        planes = gbs.split(w, s)                     # (n, len)
        seq = list(range(n)) if mode == gbs.Mode.FULL else list(range(keep))
        # the dot-product rule (golden.bitslice.check_beats): plane-major,
        # every chunk of a plane before the next plane
        for j, q in enumerate(seq):
            for c in range(chunks):
                beats.append(pack(in_l, {
                    "act": [int(x) for x in act[c * L:(c + 1) * L]],
                    "sv": {"slices": [int(x) & ((1 << s) - 1)
                                      for x in planes[q][c * L:(c + 1) * L]],
                           "plane": q},
                    "mode": int(mode), "keep": keep,
                    "last": int(c == chunks - 1 and j == len(seq) - 1)}))
        if mode == gbs.Mode.FULL:
            v = int(np.dot(act, w))
        else:
            v = int(gbs.dot(act, w, s, mode, keep)) if dut.augment else \
                int(gbs.dot(act, w, s, gbs.Mode.MSB, keep))
        results.append(pack(out_l, {"value": v, "error": 0}))
    return {"inputs": {"i": beats}, "expected": {"o": results}, "statics": {}}


#: block name -> vector provider ``f(dut, **kw) -> {"inputs", "expected", "statics"}``
VECTORS = {"pe": pe_vectors, "pe_plain": pe_vectors}


def vectors_for(name: str, dut, **kw) -> dict:
    if name not in VECTORS:
        raise ValueError(f"No self-test vectors for block {name!r}; blocks with vectors: "
                         f"{', '.join(VECTORS)}")
    return VECTORS[name](dut, **kw)


def decode_uart(samples: list[int], divisor: int) -> bytes:
    """Decode an 8N1 line sampled once per clock (for simulation tests)."""
    out, i = bytearray(), 0
    while i < len(samples):
        if samples[i] == 0:                          # start bit
            mid = i + divisor // 2
            byte = 0
            for b in range(8):
                pos = mid + (b + 1) * divisor
                if pos >= len(samples):
                    return bytes(out)
                byte |= samples[pos] << b
            out.append(byte)
            i = mid + 9 * divisor
        else:
            i += 1
    return bytes(out)

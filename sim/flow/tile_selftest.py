"""Built-in self-test of the whole tile (``hw/tile.Tile``) for an FPGA board.

:class:`TileSelfTest` is the tile with everything its host and LPDDR would
give it held on chip:

* LPDDR is :class:`AxiReadMemory`, a read-only AXI4 slave over block RAM
  initialised with the golden LPDDR image (every expert's
  :func:`~elmoe3d.golden.layout.expert_image` and the dense image,
  :func:`~elmoe3d.golden.layout.lpddr_image`), joined to the tile's
  ``m_axi_*`` master;
* the host is a ROM of ``TileCommand`` words (:class:`~elmoe3d.sim.flow.selftest.RomSource`):
  LOAD_DENSE, then a short decode (each STEP followed by its TOKEN vectors),
  then a COUNTER command for every counter the golden model keeps;
* the answers are checked as they arrive, by the contract of ``host_rsp``:
  each response kind (OUTPUT, CTRL, TILE) in its own order against its own
  ROM (:class:`~elmoe3d.sim.flow.selftest.RomChecker`; the order *between* kinds
  is the RTL's choice, not the golden's), on the fields the golden model
  defines (a mask per word); and the ``trace`` stream by
  :class:`TraceSignature`: the count and the sum of the event words, which
  do not depend on the order the tile emits a pass's concurrent events in
  (the golden compares those in a canonical order).

The expected words come from the golden models, computed in Python at
elaboration (:func:`tile_scenario`): the golden Elastic-SD controller
(:class:`~elmoe3d.golden.esd.EsdController`) and the golden batched MoE layer
(:func:`~elmoe3d.golden.moe_batched.batched_forward`), through the same
host script the tile's cocotb bench uses
(:func:`elmoe3d.sim.run.tile_script.golden_script`). The verdict is the PE
self-test's (:class:`~elmoe3d.sim.flow.selftest.Verdict`): PASS / FAIL LEDs and
one UART line, ``ELMOE3D tile PASS n=<beats checked>`` or ``... FAIL
bad=<mismatched beats>``; a timeout is a FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import Config
from .selftest import RomChecker, RomSource, Verdict

__all__ = ["AxiReadMemory", "TraceSignature", "TileScenario", "tile_scenario", "TileSelfTest",
           "SCENARIO_ROUNDS"]

#: the decode the board runs: one Elastic-SD round (drafting, verification,
#: acceptance) and one AR round, batch 2 (``tile_scenario``'s defaults)
SCENARIO_ROUNDS = ("SD", "AR")

_AXI_OKAY, _AXI_SLVERR, _AXI_DECERR = 0, 2, 3


class AxiReadMemory(wiring.Component):
    """A read-only AXI4 slave over one block RAM (the LPDDR stand-in).

    Parameters
    ----------
    image : bytes
        Contents from byte address ``base`` on (little-endian beats).
    data_bits, addr_bits, id_bits : int
        AXI widths (the master's).
    base : int
        Byte address of ``image[0]``.

    Members
    -------
    ar{id,addr,len,size,burst,valid} : In; arready : Out
    r{id,data,resp,last,valid} : Out; rready : In
        The read channels, named as the master's ``m_axi_*`` ports without
        the prefix.

    One burst at a time: ``arready`` is high while no beat of a burst is
    left to read. INCR bursts of full-width beats; any other ``arsize`` or
    ``arburst`` answers SLVERR, a beat outside the image DECERR. Latency:
    the first beat is valid two cycles after the AR transfer (one to take
    the address, one through the RAM's read register); then one beat per
    cycle while ``rready`` is high. The RAM's read port is enabled only when
    the output beat moves, so back-pressure holds the beat.

    Raises
    ------
    ValueError
        For a data width that is not a whole number of bytes.
    """

    def __init__(self, image: bytes, *, data_bits: int, addr_bits: int, id_bits: int,
                 base: int = 0):
        if data_bits % 8 or data_bits & (data_bits - 1):
            raise ValueError(f"AXI data width must be a power of two of whole bytes, "
                             f"not {data_bits!r}")
        self.data_bits, self.addr_bits, self.id_bits, self.base = (data_bits, addr_bits,
                                                                   id_bits, base)
        bb = data_bits // 8
        image = bytes(image) + bytes(-len(image) % bb)
        self.words = [int.from_bytes(image[i:i + bb], "little") for i in range(0, len(image), bb)]
        super().__init__({
            "arid": In(id_bits), "araddr": In(addr_bits), "arlen": In(8), "arsize": In(3),
            "arburst": In(2), "arvalid": In(1), "arready": Out(1),
            "rid": Out(id_bits), "rdata": Out(data_bits), "rresp": Out(2), "rlast": Out(1),
            "rvalid": Out(1), "rready": In(1)})

    def elaborate(self, platform):
        m = Module()
        n = len(self.words)
        lbb = (self.data_bits // 8).bit_length() - 1
        m.submodules.ram = ram = memory.Memory(shape=self.data_bits, depth=max(n, 1),
                                               init=self.words or [0])
        rd = ram.read_port()
        left = Signal(9)                          # beats of the burst still to read
        ptr = Signal(self.addr_bits)              # word index of the next beat
        cur_id = Signal(self.id_bits)
        bad_burst = Signal()
        r_resp = Signal(2)
        m.d.comb += self.arready.eq(left == 0)
        with m.If(self.arvalid & self.arready):
            m.d.sync += [ptr.eq((self.araddr - self.base) >> lbb), left.eq(self.arlen + 1),
                         cur_id.eq(self.arid),
                         bad_burst.eq((self.arsize != lbb) | (self.arburst != 1))]
        move = ~self.rvalid | self.rready
        m.d.comb += [rd.en.eq(move), rd.addr.eq(ptr), self.rdata.eq(rd.data),
                     self.rresp.eq(r_resp)]
        with m.If(move):
            m.d.sync += self.rvalid.eq(left != 0)
            with m.If(left != 0):
                m.d.sync += [self.rlast.eq(left == 1), self.rid.eq(cur_id),
                             r_resp.eq(Mux(bad_burst, _AXI_SLVERR,
                                           Mux(ptr >= n, _AXI_DECERR, _AXI_OKAY))),
                             ptr.eq(ptr + 1), left.eq(left - 1)]
        return m


class TraceSignature(wiring.Component):
    """Checks the ``trace`` stream (always ready) by an order-free signature:
    after ``count`` events their payload words must sum to ``total``
    (modulo ``2**width``). ``error`` strobes once, the cycle after the event
    that completes the count, when the sum differs, and on every event
    beyond the count; ``done`` once ``count`` events arrived. The sum and
    the compare are a cycle apart (the adder does not feed the verdict in
    the same cycle)."""

    def __init__(self, width: int, count: int, total: int):
        self.width, self.count, self.total = width, count, total % (1 << width)
        super().__init__({"i": In(stream.Signature(width)), "done": Out(1), "error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        seen = Signal(range(self.count + 1))
        acc = Signal(self.width)
        compared = Signal()
        full = seen == self.count
        m.d.comb += [self.i.ready.eq(1), self.done.eq(full)]
        with m.If(self.i.valid & ~full):
            m.d.sync += [seen.eq(seen + 1), acc.eq(acc + self.i.payload)]
        with m.If(full & ~compared):
            m.d.sync += compared.eq(1)
        m.d.comb += self.error.eq((self.i.valid & full) |
                                  (full & ~compared & (acc != self.total)))
        return m


@dataclass
class TileScenario:
    """What the self-test ROMs hold (:func:`tile_scenario`): the host
    commands (``TileCommand`` words), per response kind the expected
    ``TileResponse`` words and their masks, the trace's event count and word
    sum, the LPDDR image, and a description."""
    commands: list
    responses: dict                         # TileRspKind name -> (words, masks)
    trace_count: int
    trace_sum: int
    image: bytes
    summary: dict = field(default_factory=dict)

    @property
    def checked(self) -> int:
        """Beats the self-test checks (what a PASS line's ``n=`` counts)."""
        return sum(len(w) for w, _ in self.responses.values()) + self.trace_count


def _mask(layout, want: dict) -> int:
    """The bits of the fields named in ``want`` (nested dicts for structs)."""
    out = 0
    for name, f in data.Layout.cast(layout):
        if name not in want:
            continue
        if isinstance(want[name], dict):
            out |= _mask(f.shape, want[name]) << f.offset
        else:
            out |= ((1 << f.width) - 1) << f.offset
    return out


def _fill(layout, want: dict) -> dict:
    """``want`` with every field it leaves out set to 0 (for ``pack``)."""
    out = {}
    for name, f in data.Layout.cast(layout):
        shape = f.shape
        if isinstance(shape, type) and issubclass(shape, data.View):
            shape = data.Layout.cast(shape)
        v = want.get(name)
        if isinstance(shape, data.StructLayout):
            out[name] = _fill(shape, v or {})
        elif isinstance(shape, data.ArrayLayout):
            out[name] = v if v is not None else [0] * shape.length
        else:
            out[name] = 0 if v is None else v
    return out


def tile_scenario(cfg: Config, *, rounds=SCENARIO_ROUNDS, batch: int = 2,
                  seed: int = 1) -> TileScenario:
    """The golden self-test of ``cfg``: random golden layers (seeded), the
    LPDDR image, and the host script of
    :func:`elmoe3d.sim.run.tile_script.golden_script` (``rounds``, Elastic-SD
    or AR forced, at ``batch``), framed as the tile's commands: LOAD_DENSE
    first, each STEP followed by its TOKEN vectors, then a COUNTER for each
    counter the golden controller keeps. Expected: LOAD_DENSE answered OK
    (TILE), every CTRL response's golden fields (the counters' values), every
    layer output bit for bit with its ``last``, no ``error`` (OUTPUT), and the
    golden control events (count and word sum)."""
    from ...golden import esd as gesd
    from ...golden import layout as gl
    from ...hw.esd_ctrl import COUNTERS, HostOp
    from ...hw.tile import TileError, TileOp, TileRspKind, tile_command, tile_response
    from ...hw.vocab import vocab
    from ..run.payload import pack
    from ..run.tile_script import golden_script, lpddr_image, random_layers

    np_rng = np.random.default_rng(seed)
    layers = random_layers(cfg, np_rng)
    dense = gl.dense_image(cfg, layers)
    cmds, vecs, want_rsp, want_y, ctl = golden_script(cfg, layers, list(rounds), batch, np_rng)
    counters = [(i, name) for i, name in enumerate(COUNTERS) if name in ctl.counters]

    cmd_t, rsp_t = data.Layout.cast(tile_command(cfg)), data.Layout.cast(tile_response(cfg))
    zero = [0] * cfg.hidden

    def command(op, x=zero, **kw):
        return pack(cmd_t, dict(dict(op=int(op), phase=0, step=0, layer=0, value=0, x=x), **kw))

    words = [command(TileOp.LOAD_DENSE)]
    vi = 0
    ends = iter(i + 1 for i, (_, last) in enumerate(want_y) if last)
    for c in cmds:
        words.append(command(c["op"], phase=c["phase"], step=c["step"], layer=c["layer"],
                             value=c["value"]))
        if c["op"] == HostOp.STEP:
            end = next(ends)
            words += [command(TileOp.TOKEN, x=[int(a) for a in x]) for x in vecs[vi:end]]
            vi = end
    words += [command(HostOp.COUNTER, value=i) for i, _ in counters]
    assert vi == len(vecs)

    def expect(kind, **fields):
        want = dict(kind=kind.value, **fields)
        return pack(rsp_t, _fill(rsp_t, want)), _mask(rsp_t, want)

    ctrl = [expect(TileRspKind.CTRL, rsp={k: int(v) for k, v in w.items()}) for w in want_rsp]
    ctrl += [expect(TileRspKind.CTRL, rsp=dict(op=int(HostOp.COUNTER), error=0,
                                               value=int(ctl.counters[name])))
             for _, name in counters]
    outs = [expect(TileRspKind.OUTPUT, out=dict(y=[int(a) for a in y], error=0, last=last))
            for y, last in want_y]
    tile = [expect(TileRspKind.TILE, rsp=dict(op=int(TileOp.LOAD_DENSE),
                                              error=int(TileError.OK), value=0))]
    ev_t = data.Layout.cast(vocab(cfg).TraceEvent)
    ev_words = [pack(ev_t, {f: int(getattr(e, f)) for f in gesd.EVENT_FIELDS})
                for e in ctl.events]
    image = lpddr_image(cfg, layers, dense)[cfg.lpddr_base:]
    summary = dict(rounds=list(rounds), batch=batch, seed=seed, commands=len(words),
                   layer_steps=sum(1 for c in cmds if c["op"] == HostOp.STEP),
                   tokens=len(want_y), ctrl_responses=len(ctrl), outputs=len(outs),
                   events=len(ev_words), counters=[n for _, n in counters],
                   image_bytes=len(image))
    return TileScenario(
        commands=words,
        responses={k.name: ([w for w, _ in v], [mk for _, mk in v])
                   for k, v in ((TileRspKind.OUTPUT, outs), (TileRspKind.CTRL, ctrl),
                                (TileRspKind.TILE, tile))},
        trace_count=len(ev_words), trace_sum=sum(ev_words), image=bytes(image),
        summary=summary)


class TileSelfTest(wiring.Component):
    """The tile with its host and LPDDR on chip, checking itself (module doc).

    Parameters
    ----------
    cfg : Config
        The tile's configuration (the board's preset; ``tiny`` on the ULX3S).
    scenario : TileScenario or None
        The ROM contents; ``None``: :func:`tile_scenario` of ``cfg``.
    uart_divisor : int
        Clock cycles per UART bit.
    timeout : int
        Cycles after which a missing answer fails the test.

    Members
    -------
    passed, failed, done : Out(1)
        The verdict (LEDs), :class:`~elmoe3d.sim.flow.selftest.Verdict`'s.
    uart_tx : Out(1)
        The result line.
    mismatches : Out(16)
        Beats that differed, arrived in excess, or (1) a timeout.

    Latency: the dense load (``dense_words * B`` slice vectors from the
    memory at one AXI beat per cycle), then the decode at the tile's own
    speed (about 20,000 cycles at ``tiny`` for the default scenario), then
    64 cycles of settling and the UART line.

    Raises
    ------
    TypeError
        For a ``cfg`` that is not a Config.
    """

    def __init__(self, cfg: Config, scenario: TileScenario | None = None, *,
                 uart_divisor: int = 217, timeout: int = 1 << 20, name: str = "tile"):
        if not isinstance(cfg, Config):
            raise TypeError(f"TileSelfTest needs a Config, not {cfg!r}")
        self.cfg, self.name = cfg, name
        self.scenario = scenario if scenario is not None else tile_scenario(cfg)
        self.uart_divisor, self.timeout = uart_divisor, timeout
        super().__init__({"passed": Out(1), "failed": Out(1), "done": Out(1),
                          "uart_tx": Out(1, init=1), "mismatches": Out(16)})

    def elaborate(self, platform):
        from ...hw.tile import Tile, TileRspKind
        m = Module()
        cfg, sc = self.cfg, self.scenario
        m.submodules.tile = tile = Tile(cfg)
        m.submodules.lpddr = mem = AxiReadMemory(
            sc.image, data_bits=cfg.axi_beat_bits, addr_bits=cfg.axi_addr_bits,
            id_bits=cfg.axi_id_bits, base=cfg.lpddr_base)
        for name, member in mem.signature.members.items():
            theirs = getattr(tile, f"m_axi_{name}")
            if member.flow == In:
                m.d.comb += getattr(mem, name).eq(theirs)
            else:
                m.d.comb += theirs.eq(getattr(mem, name))

        cmd_w = len(tile.host_cmd.payload.as_value())
        m.submodules.host = host = RomSource(cmd_w, sc.commands)
        m.d.comb += [tile.host_cmd.payload.eq(host.o.payload),
                     tile.host_cmd.valid.eq(host.o.valid), host.o.ready.eq(tile.host_cmd.ready)]

        rsp = tile.host_rsp
        rsp_w = len(rsp.payload.as_value())
        m.d.comb += rsp.ready.eq(1)
        finished, error = host.done, Const(0)
        for kind in TileRspKind:
            words, masks = sc.responses[kind.name]
            chk = RomChecker(rsp_w, words, masks)
            m.submodules[f"check_{kind.name.lower()}"] = chk
            m.d.comb += [chk.i.payload.eq(rsp.payload.as_value()),
                         chk.i.valid.eq(rsp.valid & (rsp.payload.kind == kind))]
            finished, error = finished & chk.done, error | chk.error
        bad_kind = Signal()
        m.d.comb += bad_kind.eq(rsp.valid & (rsp.payload.kind.as_value() > max(k.value for k in TileRspKind)))

        tr = tile.trace
        m.submodules.check_trace = sig = TraceSignature(len(tr.payload.as_value()),
                                                        sc.trace_count, sc.trace_sum)
        m.d.comb += [sig.i.payload.eq(tr.payload.as_value()), sig.i.valid.eq(tr.valid),
                     tr.ready.eq(sig.i.ready)]
        finished, error = finished & sig.done, error | sig.error | bad_kind

        m.submodules.verdict = v = Verdict(name=self.name, total=sc.checked,
                                           uart_divisor=self.uart_divisor, timeout=self.timeout)
        m.d.comb += [v.finished.eq(finished), v.error.eq(error), self.passed.eq(v.passed),
                     self.failed.eq(v.failed), self.done.eq(v.done), self.uart_tx.eq(v.uart_tx),
                     self.mismatches.eq(v.mismatches)]
        return m

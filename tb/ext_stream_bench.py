"""cocotb testbench: the external-memory stream engine against its contract
(:mod:`elmoe3d.golden.ext_stream`).

The bench on the kit
--------------------
:class:`ExtTB` is the bench's ``TB`` class (verilog-axi's pattern): the
``cmd`` stream a kit :class:`~elmoe3d.tb.kit.Source`, ``pe`` / ``fill`` /
``rsp`` kit :class:`~elmoe3d.tb.kit.Sink` s, idle and back-pressure set by
:meth:`ExtTB.set_idle`, :meth:`ExtTB.set_backpressure` and
:meth:`ExtTB.set_axi_pause` (on/off processes, :class:`OnOff`: runs of
stalls, not single cycles). Everything the bench does per cycle -- the
streams, the LPDDR model's AR/R channels and the AXI monitor
(:class:`AxiMonitor`) -- runs in one kit
:class:`~elmoe3d.tb.kit.CycleLoop` with two triggers per cycle
(``RisingEdge``: drive, ``ReadOnly``: sample). (A coroutine per stream plus
cocotbext-axi's per-channel coroutines, about ten trigger waits per cycle,
ran the same stimulus several times slower.)

LPDDR models
------------
* cocotbext-axi's ``AxiRamRead`` as shipped (``stock_axi_ram``): one burst at
  a time, with cocotbext-axi's pause generators on AR (``arready``) and R
  (``rvalid``); the bench then only monitors the AXI ports.
* :class:`Lpddr`, a cycle model in the bench's loop: many bursts in
  flight, the first beat of a burst no earlier than ``latency`` cycles after
  its AR handshake, random pauses on ``arready`` and ``rvalid`` (R is a kit
  :class:`~elmoe3d.tb.kit.Source`: ``rvalid`` held until ``rready``, as AXI
  requires), and on a random fraction of bursts one fault on one random
  beat -- SLVERR, DECERR, EXOKAY, an early RLAST, a missing RLAST or a wrong
  RID. It records every beat it corrupted.

Scoreboard (contracts, not a replay of the RTL's choices)
---------------------------------------------------------
* AXI, every cycle: AR payload stable from ``arvalid`` until ``arready``;
  at most ``axi_outstanding`` bursts in flight (bursts framed by their
  ``ARLEN``).
* Per command: its bursts obey :func:`~elmoe3d.golden.ext_stream.burst_violations`
  (every byte of the read exactly once, in order, no 4 KiB crossing, at most
  ``axi_max_burst`` beats; a failed command's bursts a prefix reaching its
  first bad beat, at most ``axi_outstanding - 1`` bursts past the failing
  one). The bursts are split between commands by matching them against each
  command's read (consecutive commands never read the same bytes).
* Every PE beat, fill beat and response equals
  :func:`~elmoe3d.golden.ext_stream.split_command` given the command's first
  bad beat (classified by the golden :func:`beat_error`), item for item (a
  kit :class:`~elmoe3d.tb.kit.Scoreboard` per stream, filled after the run:
  a command's expected items depend on the bursts the RTL cut).
* Stream rules on ``pe``, ``fill``, ``rsp`` (valid held, payload stable
  until ready).

Functional coverage (``build/coverage/ext_stream.json``; ``transactions``
of a run = commands checked): command kind, bursts issued, a read across 4 KiB,
plane mask, fill, response code, fault kind, failing burst, how the PE
stream ended, AR/R pauses and back-pressure on every output, and crosses.

Parameters: ``$ELMOE_PARAMS`` = ``{"config": Config.to_dict()}``. Knobs:
``ELMOE_EXT_CMDS`` / ``ELMOE_EXT_MIN_BURSTS`` / ``ELMOE_EXT_LONG`` (fraction
of long commands) / ``ELMOE_EXT_BATCH`` / ``ELMOE_EXT_MIN_CHECKED`` /
``ELMOE_EXT_VOLUME_OUT`` (random run), ``ELMOE_EXT_REPLAY``,
``ELMOE_EXT_WATCH`` / ``ELMOE_EXT_SIGS`` / ``ELMOE_EXT_DUMP`` (debug aids),
``ELMOE_EXT_STOCK_CMDS``, ``ELMOE_EXT_LATENCY``, ``ELMOE_EXT_ERR`` (fault
probability per burst), ``ELMOE_EXT_BW_CMDS``, ``ELMOE_EXT_DEFECT``,
``ELMOE_MEASURE_OUT``, ``ELMOE_GOLDEN_MUTATION``.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import json
import os
import re
import time
import types
from pathlib import Path

import cocotb
from cocotb.triggers import ClockCycles, Event, ReadOnly, RisingEdge
from cocotbext.axi import AxiRamRead, AxiReadBus
from cocotbext.axi.constants import AxiResp

from ..config import Config
from ..golden import ext_stream as ge
from ..golden import layout as gl
from ..golden.vocab import ExtError, ExtKind
from ..hw import vocab as hv
from .common import (CycleLoop, Scoreboard, Sink, Source, chance, golden_mutation, knob, params,
                     rng, start_clock_and_reset)
from ..sim.run.payload import Decoder
from .coverage import write_coverage

#: Bounded wait with outputs always ready (docs/blocks/ext_stream.md): a
#: response follows its command's last R beat within WAIT_AFTER_READ cycles,
#: or, for a command that reads nothing (refused or empty), its acceptance
#: within WAIT_NO_READ cycles, plus the range check's row division
#: (:func:`wait_no_read`) when a dense row is not a power of two of bytes.
WAIT_AFTER_READ = 6
WAIT_NO_READ = 18


def wait_no_read(cfg) -> int:
    """The bound for a command that reads nothing: WAIT_NO_READ, plus the
    ``bits(dense_words) + 1`` cycles of CommandCheck's restoring division when
    a dense row is not a power of two of bytes."""
    rb = ge.row_bytes(cfg)
    return WAIT_NO_READ + (0 if rb & (rb - 1) == 0 else max(cfg.dense_words, 2).bit_length() + 1)

#: How many bursts a command issued (coverpoint ``bursts``): none (refused,
#: or nothing to read), one, two, several (up to ``axi_outstanding``), more
#: than ``axi_outstanding`` (the limit on bursts in flight is reached).
BURST_BINS = ("none", "one", "two", "several", "over_outstanding")


def burst_bin(n, outstanding):
    return ("none", "one", "two")[n] if n < 3 else \
        ("several" if n <= outstanding else "over_outstanding")


FAULTS = ("slverr", "decerr", "exokay", "early_rlast", "missing_rlast", "bad_rid")


class OnOff:
    """A random on/off process with a stationary "off" fraction ``p`` and a
    mean run of ``run`` cycles (runs of stalls and of idle cycles, not only
    single ones). ``off()`` advances one cycle and says whether this cycle
    is "off"; it is the per-cycle callable the kit's :class:`Source` (idle)
    and :class:`Sink` (back-pressure) take (:func:`~elmoe3d.tb.kit.chance`).

    Parameters
    ----------
    rand : callable
        Returns a uniform draw in [0, 1) (``random.Random.random``).
    p : float
        The fraction of "off" cycles; 0: never off, no draws.
    run : float
        Mean length of a run of "off" (and of "on") cycles.
    """

    def __init__(self, rand, p, run=4.0):
        self.rand, self.state = rand, False
        self.to_off = p / run if p else 0.0
        self.to_on = (1 - p) / run if p else 1.0

    def off(self) -> bool:
        if self.to_off:
            if self.rand() < (self.to_on if self.state else self.to_off):
                self.state = not self.state
        return self.state


def _reader(handle):
    """A fast integer read of a port. ``handle.value`` builds a ``Logic`` /
    ``LogicArray`` per read, a third of the bench's time in a profile;
    the simulator's bit string is read directly instead (an X or Z bit still
    raises, as ``int(handle.value)`` would)."""
    get = handle._handle.get_signal_val_binstr
    return lambda: int(get(), 2)


class _Bits:
    """A port's value as the kit's :class:`Source` / :class:`Sink` read it
    (``bool``, ``is_resolvable``, ``to_unsigned``), from the simulator's bit
    string (an X or Z bit: not resolvable; ``bool`` raises, as cocotb's
    ``Logic`` does)."""

    __slots__ = ("bits",)

    def __init__(self, bits):
        self.bits = bits

    def __bool__(self):
        return int(self.bits, 2) != 0

    @property
    def is_resolvable(self):
        return not self.bits.strip("01")

    def to_unsigned(self):
        return int(self.bits, 2)

    def __str__(self):
        return self.bits


class _Fast:
    """A port handle for the kit's drivers at the cost of the old hand-made
    loop: ``value`` reads the simulator's bit string (:class:`_Bits`, no
    ``Logic`` / ``LogicArray`` built), and a write that does not change the
    value is skipped (only the bench drives these ports, so its own last
    write is the port's value). The kit's :class:`Source` / :class:`Sink`
    write ``valid`` / ``ready`` every cycle and read ``valid`` every cycle;
    on plain handles the bench ran three times the CPU time."""

    __slots__ = ("handle", "_get", "_last")

    def __init__(self, handle):
        self.handle, self._get, self._last = handle, handle._handle.get_signal_val_binstr, None

    @property
    def value(self):
        return _Bits(self._get())

    @value.setter
    def value(self, v):
        if v != self._last:
            self._last = v
            self.handle.value = v


def _fast_port(dut, prefix):
    """``prefix``'s ``valid`` / ``ready`` / ``payload`` as :class:`_Fast`
    handles, under the names the kit looks for (``dut`` for the kit's
    :class:`Source` / :class:`Sink`)."""
    return types.SimpleNamespace(**{f"{prefix}__{s}": _Fast(getattr(dut, f"{prefix}__{s}"))
                                    for s in ("valid", "ready", "payload")})


class _Fields:
    """Several ports written as one payload: ``value = (v0, v1, ...)`` writes
    ``v0`` to the first handle, ``v1`` to the second, ... (only the ones that
    changed: a write costs more than the comparison). Lets a kit
    :class:`Source` drive the AXI R channel, whose payload is four ports."""

    def __init__(self, *handles):
        self.handles = handles
        self.driven = [None] * len(handles)

    @property
    def value(self):
        return tuple(self.driven)

    @value.setter
    def value(self, items):
        for i, (h, v) in enumerate(zip(self.handles, items)):
            if v != self.driven[i]:
                self.driven[i] = v
                h.value = v


class Lpddr:
    """The LPDDR as an AXI4 read slave: read latency, many bursts in flight,
    pauses on AR and R, fault injection. Driven each cycle by the bench's
    :class:`~elmoe3d.tb.kit.CycleLoop` (``drive`` / ``sample``, listed with
    the sinks); an AR handshake reaches it from :class:`AxiMonitor`
    (:meth:`accept`).

    Why a model of its own: the kit's :class:`Source` / :class:`Sink` are
    valid/ready streams with one payload, the LPDDR is a timing model -- a
    burst's beats may not start before ``latency`` cycles after its AR,
    bursts queue behind each other, and a beat may be corrupted by one of
    six faults. It is built on the kit where the AXI channels are plain
    streams: R is a kit :class:`Source` (the beats of a burst put at their
    due cycle, :meth:`Source.put`; ``rvalid`` held with the payload
    unchanged until ``rready``, as AXI requires; ``r_pause`` its idle
    cycles before a beat), ``arready`` is a kit back-pressure draw
    (:func:`~elmoe3d.tb.kit.chance`). cocotbext-axi's ``AxiRamRead`` has
    none of the latency, the bursts in flight or the faults (the stock test
    uses it as shipped).

    Parameters
    ----------
    dut
        The DUT (its ``m_axi_*`` ports).
    mem : bytearray
        The memory image, byte-addressed.
    byte_lanes : int
        Bytes per R beat.
    latency : int
        Cycles from an AR handshake to the first beat of its burst (may be
        changed between commands).
    rand : random.Random
        The draws for faults and pauses.
    err_prob : float
        Probability of a fault on a burst.
    ar_pause, r_pause : float or callable
        ``arready`` low in a cycle / an idle cycle before an R beat
        (:func:`~elmoe3d.tb.kit.chance`; :meth:`ExtTB.set_axi_pause` sets
        on/off processes).

    Attributes
    ----------
    records : list
        One entry per burst served, in AR order: ``(cycle, addr, beats,
        faults)`` with ``faults`` ``{beat: (kind, rid, rresp, rlast)}`` for
        every beat it corrupts.
    force : list
        Faults for the next bursts (``[kind or None, ...]``), ahead of the
        random ones.
    end_faults : dict
        ``{end address: kind}``: a fault on the last beat of the next burst
        that ends at that address (a command's last burst, whatever the
        RTL's burst cut).
    r : Source
        The R channel.
    """

    def __init__(self, dut, mem, byte_lanes, *, latency, rand, err_prob=0.0, ar_pause=0.0,
                 r_pause=0.0):
        self.mem, self.byte_lanes, self.id_bits = mem, byte_lanes, len(dut.m_axi_arid)
        self.latency, self.rand, self.err_prob = latency, rand, err_prob
        self.ar_pause = ar_pause
        self.arready = dut.m_axi_arready
        self.arready.value = 0
        self._ready = False
        port = types.SimpleNamespace(
            r__valid=_Fast(dut.m_axi_rvalid), r__ready=_Fast(dut.m_axi_rready),
            r__payload=_Fields(dut.m_axi_rdata, dut.m_axi_rresp, dut.m_axi_rlast,
                               dut.m_axi_rid))
        self.r = Source(port, "r", None, rand, r_pause)
        self.records = []
        self.force = []
        self.end_faults = {}

    def _fault(self, addr, n):
        end = addr + n * self.byte_lanes
        if self.force:
            kind = self.force.pop(0)
        elif end in self.end_faults:
            kind = self.end_faults.pop(end)
            if kind is None:
                return None, None
            return kind, (n - 2 if kind == "early_rlast" and n > 1 else n - 1)
        elif self.err_prob and self.rand.random() < self.err_prob:
            kind = self.rand.choice(FAULTS if n > 1 else
                                    tuple(f for f in FAULTS if f != "early_rlast"))
        else:
            return None, None
        if kind is None:
            return None, None
        if kind == "early_rlast" and n == 1:
            kind = "missing_rlast"        # a 1-beat burst cannot end early; still a fault
        if kind == "missing_rlast":
            return kind, n - 1
        if kind == "early_rlast":
            return kind, self.rand.randrange(n - 1)
        return kind, self.rand.randrange(n)

    def accept(self, cycle, arid, addr, n):
        """An AR handshake in ``cycle``: the burst's beats are due from cycle
        ``cycle + latency`` on, behind the bursts accepted before."""
        kind, at = self._fault(addr, n)
        faults = {}
        if kind is not None:
            rid, rresp, rlast = arid, int(AxiResp.OKAY), int(at == n - 1)
            if kind == "slverr":
                rresp = int(AxiResp.SLVERR)
            elif kind == "decerr":
                rresp = int(AxiResp.DECERR)
            elif kind == "exokay":
                rresp = int(AxiResp.EXOKAY)
            elif kind in ("early_rlast", "missing_rlast"):
                rlast = int(not rlast)
            else:
                rid = self.rand.randrange(1, 1 << self.id_bits) if self.id_bits else arid
            faults[at] = (kind, rid, rresp, rlast)
        self.records.append((cycle, addr, n, faults))
        due, bl, mem = cycle + self.latency, self.byte_lanes, self.mem
        for j in range(n):
            f = faults.get(j)
            a = addr + j * bl

            def beat(a=a, last=int(j == n - 1), f=f):      # read when due, not at AR
                data = int.from_bytes(mem[a:a + bl], "little")
                return (data, f[2], f[3], f[1]) if f else (data, 0, last, arid)
            self.r.put(beat, due)

    def drive(self, cycle: int):
        """This cycle's ``arready`` (a pause draw) and R beat."""
        ready = not chance(self.ar_pause, self.rand)
        if ready != self._ready:
            self._ready = ready
            self.arready.value = ready
        self.r.drive(cycle)

    def sample(self):
        """Whether the R beat transferred (in ReadOnly)."""
        self.r.sample()


class AxiMonitor:
    """Watches the AXI read ports every cycle (``sample`` in ReadOnly; with
    either LPDDR model): AR payload stable from ``arvalid`` until
    ``arready``, at most ``outstanding`` bursts in flight (bursts framed by
    their ``ARLEN``); logs every AR handshake, R beat and pause for the
    scoreboard and coverage, and hands each AR handshake to ``on_ar``
    (``cycle, arid, addr, beats``: :meth:`Lpddr.accept`).

    Attributes
    ----------
    ar : list
        ``(cycle, addr, beats, size, burst, id)`` per AR handshake.
    rbeats : list
        The cycle of every R handshake.
    ar_pause, r_pause : list
        Cycles with ``arvalid`` waiting for ``arready``; with ``rready`` up,
        a burst in flight and no ``rvalid``.
    errors : list of str
    """

    def __init__(self, dut, outstanding, on_ar=None):
        self.outstanding, self.on_ar = outstanding, on_ar
        self.ar_pay = [_reader(h) for h in (dut.m_axi_araddr, dut.m_axi_arlen, dut.m_axi_arsize,
                                            dut.m_axi_arburst, dut.m_axi_arid)]
        self.read_arvalid, self.read_arready = _reader(dut.m_axi_arvalid), _reader(dut.m_axi_arready)
        self.read_rvalid, self.read_rready = _reader(dut.m_axi_rvalid), _reader(dut.m_axi_rready)
        self.ar, self.rbeats, self.ar_pause, self.r_pause, self.errors = [], [], [], [], []
        self.cycle = 0
        self._prev_ar = None
        self._lens, self._done, self._done_beats = [], 0, 0

    def drive(self, cycle: int):
        """Nothing to drive (a monitor); notes the cycle."""
        self.cycle = cycle

    def sample(self):
        """This cycle's AR and R handshakes and the AXI checks (in ReadOnly)."""
        cyc, prev = self.cycle, self._prev_ar
        av = self.read_arvalid()
        if av or prev is not None:
            pay = tuple(f() for f in self.ar_pay) if av else None
            if prev is not None and pay != prev:
                self.errors.append(f"cycle {cyc}: AR dropped or changed before arready")
            if av and self.read_arready():
                n = pay[1] + 1
                self.ar.append((cyc, pay[0], n, pay[2], pay[3], pay[4]))
                self._lens.append(n)
                if len(self._lens) - self._done > self.outstanding:
                    self.errors.append(f"cycle {cyc}: {len(self._lens) - self._done} bursts in "
                                       f"flight, more than {self.outstanding}")
                if self.on_ar is not None:
                    self.on_ar(cyc, pay[4], pay[0], n)
                self._prev_ar = None
            elif av:
                self.ar_pause.append(cyc)
                self._prev_ar = pay
            else:
                self._prev_ar = None
        rr = self.read_rready()
        if rr and self.read_rvalid():
            self.rbeats.append(cyc)
            self._done_beats += 1
            if self._done < len(self._lens) and self._done_beats == self._lens[self._done]:
                self._done, self._done_beats = self._done + 1, 0
        elif rr and self._done < len(self._lens):
            self.r_pause.append(cyc)


class _Wake:
    """The last step of each cycle (after the sinks' samples): sets ``event``
    once ``cond()`` holds or cycle ``until`` is reached (:meth:`ExtTB.drain`
    waits on it instead of a trigger of its own per cycle)."""

    def __init__(self):
        self.cycle, self.wait = 0, None

    def drive(self, cycle: int):
        """Notes the cycle."""
        self.cycle = cycle

    def sample(self):
        """Sets the event when its condition holds or its time is up."""
        w = self.wait
        if w is not None and (self.cycle >= w[2] or w[1]()):
            self.wait = None
            w[0].set()


def _pause(rand, prob):
    """A cocotbext-axi pause generator: paused with probability ``prob`` per cycle."""
    if not prob:
        return None
    return (rand.random() < prob for _ in itertools.count())


_COVER = {}


def _coverage(n):
    """Declare the coverpoints once per process (bins depend on the plane count)."""
    if "sample" in _COVER:
        return _COVER["sample"]
    from cocotb_coverage.coverage import CoverCross, CoverPoint
    P = "ext_stream"
    yes_no = [False, True]

    @CoverPoint(f"{P}.kind", xf=lambda c: c["kind"], bins=["EXPERT", "DENSE"])
    @CoverPoint(f"{P}.plane_mask", xf=lambda c: c["plane_mask"], bins=list(range(1 << n)))
    @CoverPoint(f"{P}.fill", xf=lambda c: c["fill"], bins=[0, 1])
    @CoverPoint(f"{P}.error", xf=lambda c: c["error"],
                bins=["OK", "SLVERR", "DECERR", "PROTOCOL", "RANGE"])
    @CoverPoint(f"{P}.fault", xf=lambda c: c["fault"], bins=list(FAULTS))
    @CoverPoint(f"{P}.fail_burst", xf=lambda c: c["fail_burst"], bins=["first", "later"])
    @CoverPoint(f"{P}.fail_beat", xf=lambda c: c["fail_beat"], bins=["first", "middle", "last"])
    @CoverPoint(f"{P}.pe_end", xf=lambda c: c["pe_end"],
                bins=["last", "error_beat", "ended_before_error", "none"])
    @CoverPoint(f"{P}.dense_len", xf=lambda c: c["dense_len"], bins=["one", "some", "all"])
    @CoverPoint(f"{P}.ar_pause", xf=lambda c: c["ar_pause"], bins=yes_no)
    @CoverPoint(f"{P}.r_pause", xf=lambda c: c["r_pause"], bins=yes_no)
    @CoverPoint(f"{P}.pe_backpressure", xf=lambda c: c["pe_bp"], bins=yes_no)
    @CoverPoint(f"{P}.fill_backpressure", xf=lambda c: c["fill_bp"], bins=yes_no)
    @CoverPoint(f"{P}.rsp_backpressure", xf=lambda c: c["rsp_bp"], bins=yes_no)
    @CoverPoint(f"{P}.cmd_idle", xf=lambda c: c["cmd_idle"], bins=yes_no)
    @CoverPoint(f"{P}.bursts", xf=lambda c: c["bursts"], bins=list(BURST_BINS))
    @CoverPoint(f"{P}.crosses_4k", xf=lambda c: c["crosses_4k"], bins=yes_no)
    @CoverCross(f"{P}.kindXerror", items=[f"{P}.kind", f"{P}.error"])
    @CoverCross(f"{P}.plane_maskXfill", items=[f"{P}.plane_mask", f"{P}.fill"])
    @CoverCross(f"{P}.fillXerror", items=[f"{P}.fill", f"{P}.error"])
    @CoverCross(f"{P}.faultXfail_burst", items=[f"{P}.fault", f"{P}.fail_burst"])
    @CoverCross(f"{P}.ar_pauseXr_pause", items=[f"{P}.ar_pause", f"{P}.r_pause"])
    @CoverCross(f"{P}.pe_bpXfill_bp", items=[f"{P}.pe_backpressure", f"{P}.fill_backpressure"])
    @CoverCross(f"{P}.errorXr_pause", items=[f"{P}.error", f"{P}.r_pause"])
    def sample(c):
        pass

    _COVER["sample"] = sample
    return sample




class ExtTB:
    """The stream engine's bench on the testbench kit (verilog-axi's ``TB``).

    Ports: ``cmd`` a kit :class:`Source`; ``pe``, ``fill``, ``rsp`` kit
    :class:`Sink` s (the stream-rule checks, every transfer in
    ``received``); the AXI read ports an LPDDR model (:class:`Lpddr`, or
    cocotbext-axi's ``AxiRamRead`` with ``start(stock=True)``) and an
    :class:`AxiMonitor`. One :class:`CycleLoop` (:attr:`loop`, the bench's
    time base) runs them all from one coroutine: two trigger waits per
    cycle. The scoreboard (:meth:`check`) compares each output stream with
    the golden model's, in order (kit :class:`Scoreboard`).

    Idle cycles and back-pressure are on/off processes (:class:`OnOff`: runs
    of idle and stalled cycles) drawn from one :class:`random.Random`
    seeded by ``COCOTB_RANDOM_SEED``, so a seed replays a run; the setters
    change them at any time.

    Parameters
    ----------
    dut
        The ``ext_stream`` DUT; its build parameters come from
        ``$ELMOE_PARAMS`` (:func:`params`).
    idle, backpressure, axi_pause : float or callable
        :meth:`set_idle`, :meth:`set_backpressure`, :meth:`set_axi_pause`.
    latency : int, optional
        :class:`Lpddr` read latency in cycles (default ``ELMOE_EXT_LATENCY``
        or 20).
    err_prob : float, optional
        :class:`Lpddr` fault probability per burst (default
        ``ELMOE_EXT_ERR`` or 0.05).
    """

    def __init__(self, dut, *, idle=0.0, backpressure=0.0, axi_pause=0.0, latency=None,
                 err_prob=None):
        self.dut = dut
        self.cfg = cfg = Config(**params()["config"])
        self.v = v = hv.vocab(cfg)
        self.rand = rng()
        self.latency = knob("ext_latency", 20) if latency is None else latency
        self.err_prob = knob("ext_err", 0.05) if err_prob is None else err_prob
        self.mutate = golden_mutation()
        self.cmds = []
        self.last_reader = None
        self.last_runs = []
        self.p_long = 1.0             # fraction of commands drawn from the long mix
        lay = gl.lpddr_layout(cfg)
        self.lo, self.hi = lay.base, lay.base + lay.total_bytes
        # memory beyond the window (a guard) so that a stray read would be seen
        self.mem_bytes = self.hi + 8192
        self.image = bytearray(self.rand.randbytes(self.mem_bytes))
        self.loop = CycleLoop(dut.clk)
        self.axi = AxiMonitor(dut, cfg.axi_outstanding)
        self.ar, self.rbeats = self.axi.ar, self.axi.rbeats
        # cycle logs for coverage: AR/R pauses, back-pressure on each output
        self.log = {"ar_pause": self.axi.ar_pause, "r_pause": self.axi.r_pause,
                    "pe_bp": [], "fill_bp": [], "rsp_bp": []}
        r = self.rand
        self.cmd = Source(_fast_port(dut, "cmd"), "cmd", v.ExtCommand.as_shape(), r)
        self.pe, self.fill, self.rsp = (self._sink(name, lay.as_shape()) for name, lay in
                                        (("pe", v.ExtBeat), ("fill", v.FillBeat),
                                         ("rsp", v.ExtResponse)))
        self.sinks = (self.pe, self.fill, self.rsp)
        self.ram = None
        self._wake = _Wake()
        self.set_idle(idle)
        self.set_backpressure(backpressure)
        self.set_axi_pause(axi_pause)
        self._combos = []
        self.p_any = 0.0 if cfg.planes <= 2 else 0.3     # more (mask, fill) variety at 4 planes

    def _sink(self, name, layout) -> Sink:
        """A kit :class:`Sink` on output ``name``: ``received`` holds
        ``(cycle, payload dict)``. The payload is unpacked by a
        :class:`~elmoe3d.sim.run.payload.Decoder` (the sink is given the
        payload's width, so it hands on the raw integer): the same dicts as
        the kit's :func:`unpack`, ten times faster, for the 10,000-command
        runs' hundred thousand fill beats."""
        dec = Decoder(layout)
        s = Sink(_fast_port(self.dut, name), name, len(getattr(self.dut, f"{name}__payload")),
                 self.rand, on_stall=self._stalled)
        s.fn = lambda raw: s.received.append((s.cycle, dec(raw)))
        return s

    # -- idle and back-pressure (verilog-axi's set_idle_generator /
    #    set_backpressure_generator) ------------------------------------------
    def _process(self, p, run=4.0):
        """``p`` as the kit's per-cycle draw: a callable as it is, 0 as 0
        (no draws), a fraction as an :class:`OnOff` process with mean runs
        of ``run`` cycles."""
        if callable(p) or not p:
            return p if callable(p) else 0.0
        return OnOff(self.rand.random, p, run).off

    def set_idle(self, idle=0.0):
        """Idle cycles on ``cmd`` before a command.

        Parameters
        ----------
        idle : float or callable
            The fraction of idle cycles (an :class:`OnOff` process, runs of
            2 cycles on average), or a callable returning True for an idle
            cycle.
        """
        self.cmd.idle = self._process(idle, 2.0)

    def set_backpressure(self, backpressure=0.0, ports=("pe", "fill", "rsp")):
        """Back-pressure (``ready`` low) on output streams.

        Parameters
        ----------
        backpressure : float or callable
            The fraction of not-ready cycles (an :class:`OnOff` process per
            port, runs of 4 cycles on average), or a callable returning True
            for a not-ready cycle (shared by ``ports``).
        ports : str or tuple of str
            Which of ``pe``, ``fill``, ``rsp``.
        """
        for name in (ports,) if isinstance(ports, str) else ports:
            getattr(self, name).backpressure = self._process(backpressure)

    def set_axi_pause(self, pause=0.0):
        """Pauses on the LPDDR's AR (``arready`` low) and R (no beat) channels.

        Parameters
        ----------
        pause : float or callable
            For :class:`Lpddr`: the fraction of paused cycles (an
            :class:`OnOff` process per channel), or a callable returning
            True for a paused cycle. For ``AxiRamRead`` (a fraction): a
            cocotbext-axi pause generator per channel, paused with that
            probability per cycle. Before :meth:`start`: kept for the model
            it makes.
        """
        self.axi_pause = pause
        if isinstance(self.ram, Lpddr):
            self.ram.ar_pause, self.ram.r.idle = self._process(pause), self._process(pause)
        elif self.ram is not None:
            self.ram.ar_channel.set_pause_generator(_pause(self.rand, pause))
            self.ram.r_channel.set_pause_generator(_pause(self.rand, pause))

    def _stalled(self, name):
        """A sink's ``on_stall``: ``valid`` waited for ``ready`` this cycle."""
        self.log[f"{name}_bp"].append(self.loop.cycle)

    def last_valid(self, sink) -> int:
        """The last cycle ``sink``'s ``valid`` was high: every such cycle is a
        transfer or a stall (the drain waits for quiet outputs)."""
        bp = self.log[f"{sink.name}_bp"]
        return max(sink.received[-1][0] if sink.received else 0, bp[-1] if bp else 0)

    async def start(self, stock=False):
        """Start the clock, reset, make the LPDDR model (``stock``:
        cocotbext-axi's ``AxiRamRead`` as shipped, the bench only monitors
        AXI; else :class:`Lpddr`) and start the cycle loop."""
        d = self.dut
        await start_clock_and_reset(d)
        if stock:
            self.ram = AxiRamRead(AxiReadBus.from_prefix(d, "m_axi"), d.clk, None, mem=self.image)
        else:
            self.ram = Lpddr(d, self.image, ge.beat_bytes(self.cfg), latency=self.latency,
                             rand=self.rand, err_prob=self.err_prob)
            self.axi.on_ar = self.ram.accept
        self.set_axi_pause(self.axi_pause)
        models = [self.ram] if not stock else []
        self._task = cocotb.start_soon(self.loop.run(
            [self.cmd], [*self.sinks, *models, self.axi, self._wake], limit=1 << 62))
        if os.environ.get("ELMOE_EXT_WATCH"):
            cocotb.start_soon(self._watch())

    async def _watch(self):
        """Debug aid: ``ELMOE_EXT_WATCH=from,to`` logs ``ELMOE_EXT_SIGS``
        (dotted paths, internal ones too) every cycle in that range."""
        lo, hi = map(int, os.environ["ELMOE_EXT_WATCH"].split(","))
        hs = []
        for path in os.environ["ELMOE_EXT_SIGS"].split(","):
            h = self.dut
            for part in path.split("."):
                h = h._id(part, extended=False)
            hs.append((path, h))
        while self.loop.cycle <= hi:
            await RisingEdge(self.dut.clk)
            await ReadOnly()
            if self.loop.cycle >= lo:
                self.dut._log.info("w %d %s", self.loop.cycle, " ".join(
                    f"{p.split('.')[-1]}={int(h.value) if h.value.is_resolvable else h.value}"
                    for p, h in hs))

    # -- stimulus ------------------------------------------------------------
    def send(self, cmd):
        cmd = dict(cmd, id=len(self.cmds) % (1 << hv.CMD_ID_BITS))
        self.cmds.append(cmd)
        self.cmd.send([cmd])
        runs = ge.read_runs(self.cfg, cmd)
        if runs:
            self.last_reader = (cmd["kind"], cmd["addr"])
            self.last_runs = runs
        return cmd

    def dense_ok(self, addr):
        """A dense read may start at ``addr``: not inside the bytes the
        previous reading command reads. (The scoreboard gives a command the
        bursts that continue its read; a failed command's bursts are a
        prefix of its read, so the next command must not start where that
        prefix could stop.)"""
        return not any(a <= addr < a + n for a, n in self.last_runs)

    def expert_addr(self):
        cfg = self.cfg
        while True:
            a = gl.lpddr_expert_base(cfg, self.rand.randrange(cfg.layers),
                                     self.rand.randrange(cfg.experts))
            if self.last_reader != (ExtKind.EXPERT, a):
                return a

    def any_mask(self):
        """The next ``(plane_mask, fill)`` of a shuffled cycle through all of
        them (with 4 planes, 32 pairs: a uniform draw would need hundreds of
        commands to reach each)."""
        if not self._combos:
            self._combos = [(m, f) for m in range(1 << self.cfg.planes) for f in (0, 1)]
            self.rand.shuffle(self._combos)
        return self._combos.pop()

    def random_command(self):
        """A long command (``p_long``: whole experts, long dense copies,
        refused commands) or a short one (:meth:`short_command`)."""
        if self.p_long >= 1.0 or self.rand.random() < self.p_long:
            return self.long_command()
        return self.short_command()

    def dense_at(self, o0, length, slot=0):
        """A DENSE command of ``length`` rows from row ``o0``, or None when it
        would start inside the previous reader's bytes."""
        cfg, r = self.cfg, self.rand
        addr = gl.lpddr_layout(cfg).dense_base + o0 * ge.row_bytes(cfg)
        if not self.dense_ok(addr):
            return None
        return ge.command(kind=ExtKind.DENSE, addr=addr, length=length,
                          plane_mask=r.randrange(1 << cfg.planes), fill=r.randrange(2), slot=slot)

    def short_command(self):
        """A short command: one or two bursts, one beat, a read across a
        4 KiB boundary, the first and last rows of the dense image, a
        refused command at a window edge (reads nothing), or an EXPERT with
        no planes and no fill (reads nothing, responds OK). Dense copies
        always fill HB. (An EXPERT command always reads whole planes:
        1,536 beats at `default`, 192 at `tiny`; there is no short one.)"""
        cfg, r = self.cfg, self.rand
        lay = gl.lpddr_layout(cfg)
        D, rb, bb = cfg.dense_words, ge.row_bytes(cfg), ge.beat_bytes(cfg)
        beats_per_row = rb // bb
        short_rows = max(1, cfg.axi_max_burst // beats_per_row) + 1   # 1-2 bursts
        slot = r.randrange(cfg.tag_slots)
        for _ in range(8):
            x = r.random()
            if x < 0.25:                                   # one row (1 beat at tiny)
                c = self.dense_at(r.randrange(D), 1, slot)
            elif x < 0.55:                                 # 1-2 bursts
                length = r.randint(2, short_rows)
                c = self.dense_at(r.randrange(D - length + 1), length, slot)
            elif x < 0.7 and self.edges_4k:                # across a 4 KiB boundary
                edge = r.choice(self.edges_4k)             # first row at or past the edge
                before = r.randint(1, min(edge, short_rows))
                length = r.randint(before + 1, min(D - edge + before, before + short_rows))
                c = self.dense_at(edge - before, length, slot)
            elif x < 0.8:                                  # the window edges of the dense image
                length = r.randint(1, short_rows)
                c = self.dense_at(D - length if r.random() < 0.5 else 0, length, slot)
            elif x < 0.9:                                  # refused: every kind of limit
                return self.refused_command(slot)
            else:                                          # nothing to read
                c = ge.command(addr=self.expert_addr(), plane_mask=0, fill=0, slot=slot)
            if c is not None:
                return self.send(c)
        return self.refused_command(slot)

    @property
    def edges_4k(self):
        """The first dense row at or after each 4 KiB boundary inside the dense image."""
        if not hasattr(self, "_edges_4k"):
            lay, rb = gl.lpddr_layout(self.cfg), ge.row_bytes(self.cfg)
            lo, D = lay.dense_base, self.cfg.dense_words
            hi = lo + D * rb
            # the first row starting at or after each 4 KiB boundary inside the image
            self._edges_4k = [-(-(b - lo) // rb)
                              for b in range((lo // ge.AXI_4K + 1) * ge.AXI_4K, hi, ge.AXI_4K)
                              if -(-(b - lo) // rb) < D]
        return self._edges_4k

    def long_command(self):
        cfg, r = self.cfg, self.rand
        n, hbm = cfg.planes, ge.hb_mask(cfg)
        full = (1 << n) - 1
        x = r.random()
        slot = r.randrange(cfg.tag_slots)
        if x < 0.75:
            y = r.random()
            if y < 0.25:
                mask, fill = full, 1                    # miss, cached on the way
            elif y < 0.45:
                mask, fill = full & ~hbm, 0             # hit: the LSB planes only
            elif y < 0.55:
                mask, fill = full, 0                    # miss, not cached
            elif y < 0.7 - self.p_any:
                mask, fill = 0, 1                       # prefetch into HB only
            else:
                mask, fill = self.any_mask()            # every (plane_mask, fill) in turn
            c = ge.command(addr=self.expert_addr(), plane_mask=mask, fill=fill, slot=slot)
            k = cfg.hb_planes_eff
            if k >= 2 and r.random() < 0.04:
                # PE planes all below the last HB plane, with a fill: the PE
                # stream ends before the read does; a fault on the read's last
                # beat fails the command after its PE stream ended
                c["plane_mask"], c["fill"] = r.randrange(1, 1 << (k - 1)), 1
                if isinstance(self.ram, Lpddr):
                    a, ln = ge.read_runs(cfg, c)[-1]
                    self.ram.end_faults[a + ln] = r.choice(FAULTS)
            return self.send(c)
        lay = gl.lpddr_layout(cfg)
        D, rb = cfg.dense_words, ge.row_bytes(cfg)
        if x < 0.87:
            for _ in range(8):
                y = r.random()
                if y < 0.1:
                    o0, length = 0, D
                elif y < 0.3:
                    o0, length = r.randrange(D), 1
                else:
                    o0 = r.randrange(D)
                    length = r.randint(1, min(D - o0, 48))
                c = self.dense_at(o0, length, slot)
                if c is not None:
                    return self.send(c)
        return self.refused_command(slot)

    def refused_command(self, slot):
        """A command the engine must refuse (RANGE), each kind of violation."""
        cfg, r = self.cfg, self.rand
        n, full = cfg.planes, (1 << cfg.planes) - 1
        lay = gl.lpddr_layout(cfg)
        D, rb = cfg.dense_words, ge.row_bytes(cfg)
        bb = ge.beat_bytes(cfg)
        y = r.randrange(8)
        if y == 6:                                     # dense: one row past the end
            o0 = r.randrange(D)
            c = ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + rb * o0, length=D - o0 + 1,
                           slot=slot)
        elif y == 7:                                   # expert: at or past the window's top
            c = ge.command(addr=self.hi + bb * r.randrange(4), plane_mask=r.randrange(1 << n),
                           fill=r.randrange(2), slot=slot)
        elif y == 0:
            c = ge.command(addr=self.hi - cfg.expert_bytes + bb * r.randint(1, 4), plane_mask=full,
                           fill=1, slot=slot)
        elif y == 1 and bb > 1:
            c = ge.command(addr=self.expert_addr() + r.randrange(1, bb), plane_mask=full,
                           slot=slot)
        elif y == 2 and self.lo:
            c = ge.command(addr=self.lo - bb * r.randint(1, 8), plane_mask=1, slot=slot)
        elif y == 3:
            c = ge.command(kind=ExtKind.DENSE, addr=lay.dense_base, length=D + 1, slot=slot)
        elif y == 4:
            c = ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + rb * r.randrange(D),
                           length=0, slot=slot)
        else:
            c = ge.command(kind=ExtKind.DENSE, addr=lay.dense_base - rb, length=1, slot=slot,
                           plane_mask=r.randrange(1 << n))
        return self.send(c)

    # -- checking --------------------------------------------------------------
    async def drain(self, timeout=300_000, quiet=40):
        """Until every command sent has its response (the loop wakes us),
        then ``quiet`` more cycles (a stray beat after the last response
        would show)."""
        ev, want = Event(), len(self.cmds)
        self._wake.wait = (ev, lambda: self.cmd.empty() and len(self.rsp.received) >= want,
                           self.loop.cycle + timeout)
        await ev.wait()
        if not (self.cmd.empty() and len(self.rsp.received) >= len(self.cmds)):
            got = len(self.rsp.received)
            if os.environ.get("ELMOE_EXT_DUMP"):
                Path(os.environ["ELMOE_EXT_DUMP"]).write_text(json.dumps(
                    {"cmds": self.cmds, "rsp": [x for _, x in self.rsp.received],
                     "ar": self.ar, "records": [(c, a, n, {str(k): v for k, v in f.items()})
                                                for c, a, n, f in self.ram.records],
                     "rbeats": self.rbeats}))
                for path in os.environ.get("ELMOE_EXT_SIGS", "").split(","):
                    try:
                        h = self.dut
                        for part in path.split("."):
                            h = h._id(part, extended=False)
                        self.dut._log.info("sig %s = %s", path, h.value)
                    except Exception as e:  # noqa: BLE001 - a debug aid
                        self.dut._log.info("sig %s: %s", path, e)
            raise AssertionError(f"timeout (seed {cocotb.RANDOM_SEED}): "
                                 f"{got} of {len(self.cmds)} responses; first unanswered "
                                 f"command {got}: {self.cmds[got] if got < len(self.cmds) else None}"
                                 f", the one before: {self.cmds[got - 1] if got else None}; "
                                 f"{len(self.ar)} bursts, last {self.ar[-3:]}; "
                                 f"{len(self.rbeats)} R beats, last at {self.rbeats[-1:]}; "
                                 f"cycle {self.loop.cycle}; burst beats "
                                 f"{sum(x[2] for x in self.ar)}; ports "
                                 + ", ".join(f"{h}={getattr(self.dut, h).value}" for h in (
                                     "m_axi_rvalid", "m_axi_rready", "m_axi_arvalid",
                                     "pe__valid", "pe__ready", "fill__valid", "fill__ready",
                                     "rsp__valid", "rsp__ready", "cmd__valid", "cmd__ready"))
                                 + f"; faults {[r for r in getattr(self.ram, 'records', [])[-4:]]}")
        # then until no output has shown ``valid`` for ``quiet`` cycles: the
        # response leaves beside its fill's COMMIT, but a back-pressured
        # fill (or PE) FIFO may still hold beats of earlier commands
        deadline = self.loop.cycle + timeout
        while quiet and self.loop.cycle - max(self.last_valid(s) for s in self.sinks) < quiet:
            if self.loop.cycle >= deadline:
                raise AssertionError(f"timeout (seed {cocotb.RANDOM_SEED}): outputs still "
                                     f"valid {timeout} cycles after the last response")
            await ClockCycles(self.dut.clk, quiet)

    def golden(self):
        """Expected PE beats, fill beats and responses, per-command facts for
        coverage, and every contract violation found."""
        cfg, bb = self.cfg, ge.beat_bytes(self.cfg)
        recs = getattr(self.ram, "records", None)
        errors = list(self.axi.errors)
        if recs is not None and [(a, n) for _, a, n, _ in recs] != \
                [(a, n) for _, a, n, *_ in self.ar]:
            errors.append("the memory model and the AR monitor disagree")
        exp_pe, exp_fill, exp_rsp, facts = [], [], [], []
        k = 0
        r_at = 0
        for ci, c in enumerate(self.cmds):
            runs = ge.read_runs(cfg, c)
            # the command's bursts: those that continue its read in order
            pos = [runs[0][0], 0] if runs else None
            mine = []
            ri = 0
            while runs and k < len(self.ar):
                _, a, n, *_ = self.ar[k]
                if ri < len(runs) and a == pos[0] and a + n * bb <= runs[ri][0] + runs[ri][1]:
                    mine.append(k)
                    pos[0] = a + n * bb
                    k += 1
                    if pos[0] == runs[ri][0] + runs[ri][1]:
                        ri += 1
                        if ri < len(runs):
                            pos[0] = runs[ri][0]
                else:
                    break
            bursts = [self.ar[i][1:] for i in mine]
            bad = {}
            fault_of = {}
            if recs is not None:
                for bi, i in enumerate(mine):
                    _, a, n, faults = recs[i]
                    for j, (kind, rid, rresp, rlast) in faults.items():
                        code = ge.beat_error(cfg, rid, rresp, rlast, j == n - 1)
                        if code != ExtError.OK:
                            bad[(bi, j)] = code
                            fault_of[(bi, j)] = kind
            err = ge.error_beat(cfg, c, [(a, n) for a, n, *_ in bursts], bad)
            msgs = ge.burst_violations(cfg, c, bursts, failed_beat=None if err is None else err[0])
            errors.extend(f"command {ci} {c}: {m}" for m in msgs)
            fact = {"kind": ExtKind(c["kind"]).name,
                    "plane_mask": c["plane_mask"] if c["kind"] == ExtKind.EXPERT else None,
                    "fill": c["fill"] if c["kind"] == ExtKind.EXPERT else None,
                    "fault": None, "fail_burst": None, "fail_beat": None,
                    "window": (self.ar[mine[0]][0] if mine else None)}
            nbeats = sum(n for _a, n, *_ in bursts)
            fact["n_bursts"] = len(bursts)
            fact["bursts"] = burst_bin(len(bursts), cfg.axi_outstanding)
            fact["crosses_4k"] = (any(a // ge.AXI_4K != (a + n - 1) // ge.AXI_4K for a, n in runs)
                                  if runs else None)
            fact["last_r"] = self.rbeats[r_at + nbeats - 1] if nbeats else None
            r_at += nbeats
            if err is not None:
                bi, j, left = 0, err[0], err[0]
                while left >= bursts[bi][1]:
                    left -= bursts[bi][1]
                    bi += 1
                j = left
                n_b = bursts[bi][1]
                fact.update(fault=fault_of[(bi, j)], fail_burst="first" if bi == 0 else "later",
                            fail_beat="last" if j == n_b - 1 else ("first" if j == 0 else "middle"))
                after = len(mine) - bi - 1
                if after > cfg.axi_outstanding - 1:
                    errors.append(f"command {ci}: {after} bursts issued after the failing one "
                                  f"(at most {cfg.axi_outstanding - 1})")
            pe, fl, rsp = ge.split_command(cfg, self.image, c, err)
            if c["kind"] == ExtKind.DENSE and rsp["error"] != ExtError.RANGE:
                L = c["length"]
                fact["dense_len"] = "one" if L == 1 else ("all" if L == cfg.dense_words else "some")
            else:
                fact["dense_len"] = None
            fact["error"] = ExtError(rsp["error"]).name
            pe_stream = c["kind"] == ExtKind.EXPERT and c["plane_mask"] != 0
            if not pe_stream:
                fact["pe_end"] = "none"
            elif pe[-1]["error"]:
                fact["pe_end"] = "error_beat"
            elif rsp["error"] != ExtError.OK:
                fact["pe_end"] = "ended_before_error"
            else:
                fact["pe_end"] = "last"
            facts.append(fact)
            exp_pe += pe
            exp_fill += fl
            exp_rsp.append(rsp)
        if k != len(self.ar) and not errors:
            errors.append(f"{len(self.ar) - k} bursts belong to no command, first {self.ar[k]}")
        if self.mutate:
            for x in exp_pe:
                x["words"][0] ^= 1
        return exp_pe, exp_fill, exp_rsp, facts, errors

    def check(self, name="random"):
        """The scoreboard: every PE beat, fill beat and response against the
        golden model's, in order (a kit :class:`Scoreboard` per stream: a
        wrong, extra or missing item fails), the stream rules on every
        output, and the AXI and burst contracts (:meth:`golden`); raises
        AssertionError with them all. Then the coverage of the commands.

        Returns
        -------
        tuple
            The expected fill beats and the per-command facts.
        """
        exp_pe, exp_fill, exp_rsp, facts, errors = self.golden()
        for sink, exp in ((self.pe, exp_pe), (self.rsp, exp_rsp), (self.fill, exp_fill)):
            errors.extend(_scoreboard(sink.name, exp, [x for _, x in sink.received]))
            errors.extend(f"{sink.name} stream rule at {c}: {m}" for c, m in sink.rule_violations)
        if errors:
            raise AssertionError(f"{len(errors)} mismatches (seed {cocotb.RANDOM_SEED}): "
                                 + "; ".join(errors[:6]))
        self.cover(facts, name)
        return exp_fill, facts

    def cover(self, facts, name):
        sample = _coverage(self.cfg.planes)
        rsp_cycles = [cyc for cyc, _ in self.rsp.received]
        sent = [cyc for cyc, _ in self.cmd.sent]
        logs = {k: sorted(v) for k, v in self.log.items()}

        def any_in(key, lo, hi):
            a = logs[key]
            i = bisect.bisect_left(a, lo)
            return i < len(a) and a[i] <= hi

        for i, f in enumerate(facts):
            lo = f["window"] if f["window"] is not None else sent[i]
            hi = rsp_cycles[i]
            sample({**f, "ar_pause": any_in("ar_pause", lo, hi),
                    "r_pause": any_in("r_pause", lo, hi), "pe_bp": any_in("pe_bp", lo, hi),
                    "fill_bp": any_in("fill_bp", lo, hi),
                    "rsp_bp": any_in("rsp_bp", lo, hi),
                    "cmd_idle": i > 0 and sent[i] - sent[i - 1] > 1})
        # transactions = commands checked (every one compared against the
        # golden model and the burst rules above)
        geo = os.environ.get("ELMOE_EXT_GEOMETRY", f"s{self.cfg.slice_bits}-B{self.cfg.pes}")
        write_coverage("ext_stream", run=f"{name} {cocotb.SIM_NAME.split()[0].lower()} {geo}",
                       transactions=len(facts))


def _scoreboard(name, expected, got):
    """The kit :class:`Scoreboard` of ``got`` against ``expected`` (in
    order): its error message, or nothing when every item matched and none
    is missing or extra.

    Parameters
    ----------
    name : str
        Names the items (``"pe"``: messages ``pe 3: ... != expected ...``).
    expected, got : list

    Returns
    -------
    list of str
    """
    sb = Scoreboard(name)
    for x in expected:
        sb.expect(x)
    for x in got:
        sb.check(x)
    try:
        sb.finish()
    except AssertionError as e:
        return [str(e)]
    return []


async def _random_run(tb, n_cmds, target, batch=20):
    """Batches of random commands until both targets are met (``n_cmds``
    commands, ``target`` bursts). Every ``(plane_mask, fill)`` pair is also
    sent once, as an expert command at a random place among the first
    commands (16 masks x 2 at 4 planes: the plane-mask coverpoint is reached
    in every run, not by luck)."""
    sweep = [(m, f) for m in range(1 << tb.cfg.planes) for f in (0, 1)]
    tb.rand.shuffle(sweep)
    sent = 0
    while sent < n_cmds or len(tb.ar) < target or sweep:
        for _ in range(batch):
            if sweep and tb.rand.random() < 0.5:
                m, f = sweep.pop()
                tb.send(ge.command(addr=tb.expert_addr(), plane_mask=m, fill=f,
                                   slot=tb.rand.randrange(tb.cfg.tag_slots)))
            else:
                tb.random_command()
            sent += 1
        await tb.drain(quiet=0)
    await tb.drain()


@cocotb.test()
async def random_commands(dut):
    """Random commands: a mix of short ones (``ELMOE_EXT_LONG`` is the
    fraction drawn from the long mix: whole experts, long dense copies) --
    one or two bursts, one beat, across a 4 KiB boundary, the dense image's
    edges, refused at every window edge, nothing to read -- with read
    latency, pauses on AR and R, back-pressure on every output, idle on
    ``cmd``, faults on random bursts; at least ``ELMOE_EXT_CMDS`` commands
    and ``ELMOE_EXT_MIN_BURSTS`` bursts. Fails unless the scoreboard checked
    at least ``ELMOE_EXT_MIN_CHECKED`` commands; writes the counts to
    ``ELMOE_EXT_VOLUME_OUT`` (the pytest test asserts them too)."""
    tb = ExtTB(dut, idle=0.2, backpressure=0.25, axi_pause=0.15)
    tb.p_long = knob("ext_long", 1.0)
    await tb.start()
    target = knob("ext_min_bursts", 0)
    w0, c0 = time.monotonic(), time.process_time()
    await _random_run(tb, knob("ext_cmds", 100), target, batch=knob("ext_batch", 20))
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    exp_fill, facts = tb.check("random")
    failed = sum(1 for f in facts if f["error"] not in ("OK", "RANGE"))
    hist = collections.Counter(f["bursts"] for f in facts)
    volume = {"seed": cocotb.RANDOM_SEED, "commands_sent": len(tb.cmds),
              "commands_checked": len(facts), "bursts": len(tb.ar), "r_beats": len(tb.rbeats),
              "cycles": tb.loop.cycle, "failed_by_faults": failed,
              "refused": sum(f["error"] == "RANGE" for f in facts),
              "over_outstanding": hist["over_outstanding"],
              "commands_by_bursts": {b: hist[b] for b in BURST_BINS},
              "across_4k": sum(bool(f["crosses_4k"]) for f in facts),
              "pe_beats": len(tb.pe.received), "fill_beats": len(exp_fill),
              "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    dut._log.info("random_commands: %d commands checked (by bursts issued: %s; %d across "
                  "4 KiB), %d bursts, %d R beats, %d failed by faults, %d refused, %d PE beats, "
                  "%d fill beats; %d cycles in %.1f s wall / %.1f s CPU (%.0f commands/s, "
                  "%.0f cycles/s of CPU)", len(facts), volume["commands_by_bursts"],
                  volume["across_4k"], len(tb.ar), len(tb.rbeats), failed, volume["refused"],
                  len(tb.pe.received), len(exp_fill), tb.loop.cycle, wall, cpu,
                  len(tb.cmds) / cpu, tb.loop.cycle / cpu)
    out = os.environ.get("ELMOE_EXT_VOLUME_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(volume, indent=1))
    need = knob("ext_min_checked", 0)
    assert len(facts) >= need, f"the scoreboard checked {len(facts)} commands, fewer than " \
        f"{need} (seed {cocotb.RANDOM_SEED})"
    assert len(tb.ar) >= target, f"{len(tb.ar)} bursts, fewer than {target} " \
        f"(seed {cocotb.RANDOM_SEED})"
    if tb.err_prob >= 0.02 and len(tb.ar) >= 500:
        assert failed > 0, "no command failed: fault injection did not happen"


@cocotb.test()
async def fill_held_past_response(dut):
    """The drain waits for every output, not only for the responses. A
    one-row dense copy (its fill: a few DATA beats and COMMIT, room in the
    fill FIFO, so the response leaves) with ``fill`` held not-ready until three
    quiet windows after the response: the scoreboard must see both fill
    beats. (Before the drain waited for quiet outputs it checked 40 cycles
    after the last response; the default random run at seed 1379572705
    failed so, two fill beats still in the FIFO behind back-pressure.)"""
    tb = ExtTB(dut, idle=0.0, backpressure=0.0, axi_pause=0.0, err_prob=0.0)
    await tb.start()
    held = [True]                          # fill not ready until release() clears it
    tb.set_backpressure(lambda: held[0], "fill")
    quiet = 40

    async def release():
        while not tb.rsp.received:
            await RisingEdge(dut.clk)
        await ClockCycles(dut.clk, 3 * quiet)
        assert not tb.fill.received, "a fill beat passed while fill was held"
        held[0] = False

    waiter = cocotb.start_soon(release())
    lay = gl.lpddr_layout(tb.cfg)
    tb.send(ge.command(kind=ExtKind.DENSE, addr=lay.dense_base, length=1, slot=1))
    await tb.drain(quiet=quiet)
    await waiter
    exp_fill, _ = tb.check("fill_held")
    assert len(exp_fill) >= 2 and len(tb.fill.received) == len(exp_fill), \
        f"{len(tb.fill.received)} fill beats, {len(exp_fill)} expected"


@cocotb.test()
async def golden_mutation_fails(dut):
    """The scoreboard can fail: with the golden model off by one bit
    (bit 0 of every expected PE word flipped) a short random run must be
    reported as a mismatch."""
    tb = ExtTB(dut, idle=0.1, backpressure=0.1, axi_pause=0.1, err_prob=0.0)
    tb.mutate = True
    await tb.start()
    for _ in range(knob("ext_mutation_cmds", 10)):
        tb.random_command()
    await tb.drain()
    try:
        tb.check("mutation")
    except AssertionError as e:
        assert re.search(r"\bpe \d+: .* != expected", str(e)), e     # a PE beat differs
        dut._log.info("golden mutation caught: %s", str(e)[:200])
        return
    raise AssertionError("a golden model off by one bit was not caught")


@cocotb.test()
async def stock_axi_ram(dut):
    """cocotbext-axi's AxiRamRead as shipped, with its pause generators on AR
    and R, and random back-pressure: every command delivers exactly its bytes."""
    tb = ExtTB(dut, idle=0.1, backpressure=0.2, axi_pause=0.3, err_prob=0.0)
    await tb.start(stock=True)
    for _ in range(knob("ext_stock_cmds", 40)):
        tb.random_command()
    await tb.drain()
    _, facts = tb.check("stock")
    assert any(f["error"] == "OK" for f in facts)


@cocotb.test()
async def directed(dut):
    """Every fault on the first, a middle and the last burst of a command,
    each followed by a clean command (later commands are unaffected); every
    refused-command limit and one past it; the longest legal commands.
    Outputs always ready, so the run also checks a bounded wait: every
    response within ``ELMOE_EXT_WAIT`` cycles of its command's last R beat
    (or of its acceptance, for a command that reads nothing)."""
    tb = ExtTB(dut, err_prob=0.0, latency=6)
    await tb.start()
    cfg = tb.cfg
    full = (1 << cfg.planes) - 1
    lay = gl.lpddr_layout(cfg)
    bb, rb, D = ge.beat_bytes(cfg), ge.row_bytes(cfg), cfg.dense_words
    for kind in FAULTS:
        for where in ("first", "middle", "last"):
            c = ge.command(addr=tb.expert_addr(), plane_mask=full, fill=1, slot=1)
            if where == "last":            # the burst that ends the command's read
                a, ln = ge.read_runs(cfg, c)[-1]
                tb.ram.end_faults[a + ln] = kind
            else:
                tb.ram.force = [None] * (0 if where == "first" else 3) + [kind]
            tb.send(c)
            await tb.drain(quiet=0)
            tb.ram.force = []
            tb.ram.end_faults.clear()
            # a clean command next (short: a few dense rows; the next faulted
            # command's PE beats before its fault check the PE side)
            tb.send(ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + rb * (D // 3),
                               length=min(D // 3, 2 * cfg.axi_max_burst)))
            await tb.drain(quiet=0)
    # a fault on a dense copy; a fault on the last beat of an expert read whose
    # PE stream (plane 0 only) ended before it (with 4 planes, 2 in HB)
    for kind in FAULTS:
        tb.ram.force = [kind]
        tb.send(ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + rb * (D // 2),
                           length=min(D // 2, 3 * cfg.axi_max_burst)))
        await tb.drain(quiet=0)
        c = ge.command(addr=tb.expert_addr(), plane_mask=1, fill=1, slot=1)
        a, ln = ge.read_runs(cfg, c)[-1]
        tb.ram.end_faults[a + ln] = "missing_rlast" if kind == "early_rlast" else kind
        tb.send(c)
        await tb.drain(quiet=0)
        tb.ram.end_faults.clear()
    tb.send(ge.command(addr=tb.expert_addr(), plane_mask=full, fill=1, slot=2))   # clean
    await tb.drain()
    top = tb.hi - cfg.expert_bytes
    top -= top % bb
    for c in (ge.command(addr=top, plane_mask=full, fill=1, slot=5),            # the highest
              ge.command(addr=top + bb, plane_mask=full, fill=1, slot=5),       # one past
              ge.command(addr=tb.lo + 1, plane_mask=1),                         # unaligned
              ge.command(addr=tb.lo - bb if tb.lo else tb.hi, plane_mask=1),    # below / above
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base, length=D),    # the longest
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base, length=D + 1),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + (D - 1) * rb, length=1),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + (D - 1) * rb, length=2),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base - rb, length=1),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base + 1, length=1),
              ge.command(kind=ExtKind.DENSE, addr=lay.dense_base, length=0),
              ge.command(addr=tb.expert_addr(), plane_mask=0, fill=0),
              ge.command(addr=tb.expert_addr(), plane_mask=full, fill=1, slot=6)):
        tb.send(c)
        await tb.drain()
    _, facts = tb.check("directed")
    errs = [f["error"] for f in facts]
    for code in ("SLVERR", "DECERR", "PROTOCOL", "RANGE", "OK"):
        assert code in errs, f"no {code} response in the directed run"
    assert {f["fault"] for f in facts} >= set(FAULTS)
    rsp_cycles = [cyc for cyc, _ in tb.rsp.received]
    w_read = [rsp_cycles[i] - f["last_r"] for i, f in enumerate(facts) if f["last_r"] is not None]
    w_none = [rsp_cycles[i] - tb.cmd.sent[i][0] for i, f in enumerate(facts)
              if f["last_r"] is None]
    dut._log.info("directed: %d commands, response waits max %d (after the last R beat) / %d "
                  "(after acceptance, commands that read nothing)", len(facts), max(w_read),
                  max(w_none))
    assert max(w_read) <= WAIT_AFTER_READ, f"a response waited {max(w_read)} cycles after its " \
        f"last R beat (bound {WAIT_AFTER_READ})"
    bound = wait_no_read(cfg)
    assert max(w_none) <= bound, f"a response waited {max(w_none)} cycles after its " \
        f"command (bound {bound})"


@cocotb.test()
async def defect3(dut):
    """Issue 10, defect 3 (the reproducers, on the ports), one fault after the
    other in one run (``ELMOE_EXT_DEFECT``: comma-separated faults): a fault
    on the first burst of an expert read with a fill -- its PE stream must end
    with a ``last`` beat that carries ``error``, its fill with ABORT, its
    response with the fault's code; a command outside the LPDDR window must
    issue nothing and be refused; the next command must be exact."""
    faults = os.environ["ELMOE_EXT_DEFECT"].split(",")
    tb = ExtTB(dut, err_prob=0.0, latency=5)
    await tb.start()
    cfg = tb.cfg
    full = (1 << cfg.planes) - 1
    for fault in faults:
        n_rsp, n_pe, n_fl, n_ar = (len(tb.rsp.received), len(tb.pe.received),
                                   len(tb.fill.received), len(tb.ar))
        if fault == "range":
            tb.send(ge.command(addr=tb.hi, plane_mask=full, fill=1, slot=1))
        else:
            tb.ram.force = [fault]
            tb.send(ge.command(addr=tb.expert_addr(), plane_mask=full, fill=1, slot=1))
        await tb.drain()
        tb.ram.force = []
        rsp = tb.rsp.received[n_rsp][1]
        pe = [x for _, x in tb.pe.received[n_pe:]]
        fl = [x for _, x in tb.fill.received[n_fl:]]
        want = {"slverr": "SLVERR", "decerr": "DECERR", "range": "RANGE"}.get(fault, "PROTOCOL")
        assert ExtError(rsp["error"]).name == want and rsp["resident"] == 0, f"{fault}: {rsp}"
        assert pe and pe[-1]["last"] == 1 and pe[-1]["error"] == 1, \
            f"{fault}: the failed command's PE stream has no last beat with error"
        assert fl and fl[-1]["kind"] == 2, f"{fault}: the fill did not end with ABORT"
        if fault == "range":
            assert len(tb.ar) == n_ar, "a command outside the LPDDR window was issued"
        n_pe = len(tb.pe.received)
        tb.send(ge.command(addr=tb.expert_addr(), plane_mask=full, fill=0, slot=2))
        await tb.drain()
        exp_pe, _, exp_rsp = ge.split_command(cfg, tb.image, tb.cmds[-1])
        errs = (_scoreboard("pe", exp_pe, [x for _, x in tb.pe.received[n_pe:]])
                + _scoreboard("rsp", [exp_rsp], [tb.rsp.received[-1][1]]))
        assert not errs, f"{fault}: the next command was affected: {errs}"
        dut._log.info("defect3 %s: %s, PE stream ended with last+error, fill ABORT, next "
                      "command exact", fault, want)
    tb.check("defect3")


@cocotb.test()
async def bandwidth(dut):
    """R beats per cycle vs the bus peak (1 beat/cycle) at read latencies 10,
    50 and 100 cycles: whole experts without and with a fill, and LSB-plane
    hits; outputs always ready, no faults. Also the latencies: first AR after
    the command, PE beat after its R beat."""
    tb = ExtTB(dut, err_prob=0.0, latency=10)
    await tb.start()
    cfg = tb.cfg
    figures = {}
    n_cmds = knob("ext_bw_cmds", 6)
    full = (1 << cfg.planes) - 1
    lsb = full & ~ge.hb_mask(cfg)
    for lat in (10, 50, 100):
        for name, mask, fill in (("full", full, 0), ("full_with_fill", full, 1),
                                 ("lsb_hit", lsb, 0)):
            tb.ram.latency = lat
            r0, b0, c0, a0 = len(tb.rbeats), len(tb.pe.received), len(tb.cmds), len(tb.ar)
            for _ in range(n_cmds):
                tb.send(ge.command(addr=tb.expert_addr(), plane_mask=mask, fill=fill))
            await tb.drain()
            beats = tb.rbeats[r0:]
            span = beats[-1] - beats[0] + 1
            first_ar = tb.ar[a0][0]
            figures[f"{name}_lat{lat}"] = {
                "latency": lat, "beats": len(beats), "bursts": len(tb.ar) - a0,
                "beats_per_cycle_steady": round(len(beats) / span, 4),
                "beats_per_cycle_incl_first_latency": round(len(beats) / (beats[-1] - first_ar + 1), 4),
                "first_ar_after_cmd": first_ar - tb.cmd.sent[c0][0],
                "pe_beat_after_r": tb.pe.received[b0][0] - beats[0],
                "pe_beats": len(tb.pe.received) - b0}
            dut._log.info("bandwidth %s lat %d: %s", name, lat, figures[f"{name}_lat{lat}"])
    tb.check("bandwidth")
    out = os.environ.get("ELMOE_MEASURE_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"config": cfg.to_dict(), "bus_peak_beats_per_cycle": 1.0,
                                         "figures": figures}, indent=2))


@cocotb.test(skip=os.environ.get("ELMOE_EXT_TRACE") is None)
async def trace(dut):
    """Debug aid: one command, a few internal signals per cycle."""
    tb = ExtTB(dut, err_prob=0.0, latency=3)
    await tb.start()
    tb.send(ge.command(addr=tb.expert_addr(), plane_mask=1, fill=1, slot=1))
    for _ in range(int(os.environ["ELMOE_EXT_TRACE"])):
        await RisingEdge(dut.clk)
        await ReadOnly()
        vals = []
        for path in os.environ.get("ELMOE_EXT_SIGS", "cmd__ready,m_axi_arvalid").split(","):
            h = dut
            for part in path.split("."):
                h = getattr(h, part)
            vals.append(f"{path}={h.value}")
        dut._log.info("%d %s", tb.loop.cycle, " ".join(vals))


@cocotb.test(skip=os.environ.get("ELMOE_EXT_REPLAY") is None)
async def replay(dut):
    """Debug aid: the commands of ``ELMOE_EXT_REPLAY`` (a JSON list of
    ``ExtCommand`` dicts) with outputs always ready, no faults, latency
    ``ELMOE_EXT_LATENCY``; then the scoreboard."""
    tb = ExtTB(dut, err_prob=0.0, idle=knob("ext_idle", 0.0), backpressure=knob("ext_bp", 0.0),
               axi_pause=knob("ext_axi_pause", 0.0))
    await tb.start()
    for c in json.loads(os.environ["ELMOE_EXT_REPLAY"]):
        tb.send(ge.command(**{k: v for k, v in c.items() if k != "id"}))
    await tb.drain(timeout=20_000)
    tb.check("replay")

"""A cycle-level LPDDR model for the tile benches: an AXI4 read slave over
the LPDDR image, the Python twin of the native harness's C++ model
(``sim/native/lpddr.h``), with the same rule cycle for cycle, so a cocotb
bench and the native harness run the same scenario in the same number of
cycles (``tests/test_tile_native.py`` requires it).

Per clock cycle ``n`` (cycle 1 is the first edge after reset):

* :meth:`LpddrModel.drive` (after the edge): with a bandwidth limit
  (``Config.lpddr_bytes_per_cycle``) ``credit = min(credit +
  bytes_per_cycle, beat_bytes)``; ``arready`` while fewer than ``depth``
  bursts are queued and no AR pause; if no beat is held, the head burst's
  next beat is presented (``rvalid``) once its data is due (AR cycle +
  ``latency``), without an R pause and, metered, with ``credit >=
  beat_bytes`` (then ``credit -= beat_bytes``);
* :meth:`LpddrModel.sample` (before the next edge): ``rvalid & rready``
  takes the beat (the burst ends at its last one); ``arvalid & arready``
  queues a burst, due at ``n + latency``.

Faults follow the golden's rule (as :class:`elmoe3d.tb.tile_mem_bench.FaultyRam`):
the bursts inside the expert region form commands -- a burst starts a new
command when its expert differs from the last burst's or its address is not
above it -- and the first beat of command ``N``'s first burst is corrupted by
``faults[N]``: ``RRESP`` SLVERR / DECERR, or a wrong ``RLAST`` (PROTOCOL).
Only expert reads count, so the dense load before them leaves the ordinals
alone. Pauses are drawn from the bench's generator (the C++ model draws its
own), so the two agree cycle for cycle when the pause probabilities are 0.

:class:`LpddrPort` drives the model on a DUT's ``m_axi_*`` port inside a
bench's clock loop (``drive(cycle)`` after the edge, ``sample()`` in
``ReadOnly``), like the testbench kit's :class:`~elmoe3d.tb.kit.Source` /
:class:`~elmoe3d.tb.kit.Sink`.
"""

from __future__ import annotations

import collections

from ..golden import layout as gl
from ..golden.vocab import ExtError

__all__ = ["LpddrModel", "LpddrPort"]

_RESP = {ExtError.SLVERR: 2, ExtError.DECERR: 3}


class LpddrModel:
    """The model of the module doc over ``image`` (bytes from address 0),
    ``cfg``'s expert region and beat, ``latency`` (>= 1) cycles from an AR
    handshake to its first beat, ``depth`` bursts queued at most, pause
    probabilities ``ar_pause`` / ``r_pause`` drawn from ``r``
    (``random.Random``)."""

    def __init__(self, cfg, image, *, latency=1, depth=16, ar_pause=0.0, r_pause=0.0, r=None,
                 faults=None):
        if latency < 1:
            raise ValueError(f"LPDDR latency must be at least 1 cycle, not {latency!r}")
        lay = gl.lpddr_layout(cfg)
        self.image = bytes(image)
        self.expert_base, self.expert_end = lay.base, lay.dense_base
        self.expert_bytes = cfg.expert_bytes
        self.beat_bytes = cfg.axi_beat_bits // 8
        self.bpc = cfg.lpddr_bytes_per_cycle or 0
        self.latency, self.depth = latency, depth
        self.ar_pause, self.r_pause, self.r = ar_pause, r_pause, r
        self.faults = dict(faults or {})
        self.reset()

    def reset(self):
        self.queue = collections.deque()          # [addr, beats, beat, id, due, fault, cmd]
        self.held = False
        self.credit = self.beat_bytes
        self.last = None                          # (expert, address) of the last expert burst
        self.cmd = -1                             # expert command of the last burst
        self.corrupted = []                       # (command, fault)
        self.bursts = self.beats = 0
        self.arready = self.rvalid = False
        self.beat = (0, 0, False, 0)              # (data, resp, last, id)

    def _chance(self, p):
        return bool(p) and self.r.random() < p

    def drive(self, n: int):
        if self.bpc:
            self.credit = min(self.credit + self.bpc, self.beat_bytes)
        ar_pause, r_pause = self._chance(self.ar_pause), self._chance(self.r_pause)
        self.arready = len(self.queue) < self.depth and not ar_pause
        if (not self.held and self.queue and self.queue[0][4] <= n and not r_pause
                and (not self.bpc or self.credit >= self.beat_bytes)):
            if self.bpc:
                self.credit -= self.beat_bytes
            self._present()
        self.rvalid = self.held

    def sample(self, n: int, arvalid, araddr, arlen, arid, rready):
        if self.held and rready:
            self.held = False
            b = self.queue[0]
            b[2] += 1
            if b[2] == b[1]:
                self.queue.popleft()
            self.beats += 1
        if arvalid and self.arready:
            self._accept(n, araddr, arlen + 1, arid)

    def _accept(self, n, addr, beats, arid):
        fault, mine = None, -1
        if self.expert_base <= addr < self.expert_end:
            region = (addr - self.expert_base) // self.expert_bytes
            if self.last is None or self.last[0] != region or addr <= self.last[1]:
                self.cmd += 1
                fault = self.faults.get(self.cmd)
            mine = self.cmd
            self.last = (region, addr)
        self.queue.append([addr, beats, 0, arid, n + self.latency, fault, mine])
        self.bursts += 1

    def _present(self):
        addr, beats, i, arid, _, fault, cmd = self.queue[0]
        a = addr + i * self.beat_bytes
        inside = a + self.beat_bytes <= len(self.image)
        data = int.from_bytes(self.image[a:a + self.beat_bytes], "little") if inside else 0
        resp, last = (0 if inside else 3), i + 1 == beats
        if i == 0 and fault is not None:
            if fault == ExtError.PROTOCOL:
                last = not last
            else:
                resp = _RESP[ExtError(fault)]
            self.corrupted.append((cmd, fault))
        self.beat = (data, resp, last, arid)
        self.held = True


class LpddrPort(LpddrModel):
    """:class:`LpddrModel` on a DUT's ``m_axi_*`` port: call :meth:`drive`
    after each clock edge and :meth:`sample` in ``ReadOnly`` (the bench's
    clock loop); the model's inputs are 0 until the first drive."""

    def __init__(self, dut, cfg, image, **kw):
        super().__init__(cfg, image, **kw)
        self.dut = dut
        self.n = 0
        for name in ("arready", "rvalid", "rdata", "rresp", "rlast", "rid"):
            getattr(dut, f"m_axi_{name}").value = 0

    def drive(self, n: int):
        super().drive(n)
        self.n = n
        d = self.dut
        d.m_axi_arready.value = int(self.arready)
        d.m_axi_rvalid.value = int(self.rvalid)
        if self.rvalid:
            data, resp, last, arid = self.beat
            d.m_axi_rdata.value = data
            d.m_axi_rresp.value = resp
            d.m_axi_rlast.value = int(last)
            d.m_axi_rid.value = arid

    def sample(self):
        d = self.dut
        super().sample(self.n, int(d.m_axi_arvalid.value), int(d.m_axi_araddr.value),
                       int(d.m_axi_arlen.value), int(d.m_axi_arid.value),
                       int(d.m_axi_rready.value))

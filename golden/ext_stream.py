"""Golden model of the external-memory stream engine (:mod:`elmoe3d.hw.ext_stream`):
what one command delivers, what a failed command delivers, and the rules
the AXI4 read bursts obey. It states the *contract*; where the RTL makes a
choice (how a read is cut into bursts, how many are in flight, when a beat
is accepted) the model gives the rule, never a replay of the choice.

Addresses and orders all come from :mod:`elmoe3d.golden.layout` (the LPDDR
image, the HB address map, the dense region); nothing here re-derives one.

Commands (``ExtCommand``, fields as in :mod:`elmoe3d.hw.vocab`)
---------------------------------------------------------------
``kind`` EXPERT
    ``addr`` is the byte address of an expert image (``lpddr_expert_base``).
    The engine reads exactly the bytes of the planes in the *read mask*
    ``plane_mask | (fill ? hb_mask : 0)`` (``hb_mask`` = planes ``0 .. k-1``)
    — the ``(segment, plane)`` runs of :func:`~elmoe3d.golden.layout.lpddr_plane_runs`,
    in address order, which is consumption order: segment by segment, planes
    increasing within a segment. Every beat of a plane in ``plane_mask`` goes
    to the PE stream as an ``ExtBeat`` (``plane``, expert ``row``, first
    ``bank``), ``last`` on the final one. When ``fill`` is set every beat of
    an HB plane also goes to the HB fill stream as a DATA ``FillBeat``
    (region EXPERT, ``slot``, word ``offset = hb_addr(slot, plane, row) -
    slot base``, ``bank``), and the fill ends with COMMIT.
``kind`` DENSE
    ``addr`` is the byte address of a row of the dense image (a row = one
    word per bank, ``B * L*s/8`` bytes; the dense image is the dense region
    row by row, bank fastest). ``length`` rows are copied into the HB dense
    region from word ``offset = (addr - dense_base) / row_bytes``, as DATA
    beats of region DENSE, then COMMIT (region DENSE). ``plane_mask``,
    ``fill`` and ``slot`` are ignored; nothing goes to the PE stream.

Every command gets one ``ExtResponse`` (in command order): ``id``, ``error``
(:class:`~elmoe3d.golden.vocab.ExtError`), ``resident`` (an EXPERT fill that
committed) and ``slot``.

Errors (the engine never needs a reset)
---------------------------------------
* RANGE: an EXPERT whose ``[addr, addr + expert_bytes)`` is outside the
  LPDDR window ``[lpddr_base, lpddr_base + lpddr_bytes)`` or whose ``addr`` is
  not beat aligned; a DENSE whose rows are not whole rows of the dense image
  (``addr`` below ``dense_base`` or not on a row, ``length`` 0, or past the
  end). Refused: no burst is issued.
* A beat that comes back bad (:func:`beat_error`) fails its command: SLVERR,
  DECERR (from ``RRESP``) or PROTOCOL (``RID`` not the engine's ID, ``RLAST``
  not on exactly the last beat of its burst, EXOKAY on a normal read). The
  first bad beat (in read order) decides the code; it and every later beat
  of the command are discarded.

A failed command delivers every beat before its first bad beat, then: its PE
stream (if it has one and it has not ended yet) ends with one beat carrying
``last`` and ``error`` (words, plane, row, bank zero); its fill (if any) ends
with ABORT instead of COMMIT; its response carries the code and ``resident
= 0``. A refused command's PE stream is that single error beat. Later
commands are unaffected.

Burst rules (:func:`burst_violations`)
--------------------------------------
INCR bursts of full-width beats with ID 0, beat aligned, at most
``axi_max_burst`` beats, never crossing a 4 KiB boundary; the bytes of a
command's bursts, concatenated in issue order, are exactly its read bytes in
order (:func:`read_runs`) — or, for a failed command, a prefix of them that
reaches the failing beat. At most ``axi_outstanding`` bursts are in flight.

Everything here is plain Python with explicit integers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..geometry import row_bytes
from . import layout as L
from .vocab import AXI_4K, AxiResp, ExtError, ExtKind, FillKind, HBRegion

__all__ = ["command", "BeatPos", "read_mask", "hb_mask", "row_bytes", "beat_bytes",
           "check_command", "dense_offset", "read_runs", "read_beats", "beat_error",
           "split_command", "burst_violations", "error_beat", "AXI_ID"]

#: The engine reads with one AXI ID; data of its bursts returns in issue order.
AXI_ID = 0


def command(kind=ExtKind.EXPERT, addr=0, plane_mask=0, fill=0, slot=0, length=0, id=0) -> dict:
    """An ``ExtCommand`` as a dict with every field (the testbench packs it)."""
    return {"kind": int(kind), "addr": int(addr), "plane_mask": int(plane_mask),
            "fill": int(bool(fill)), "slot": int(slot), "length": int(length), "id": int(id)}


def beat_bytes(cfg) -> int:
    return cfg.axi_beat_bits // 8


def hb_mask(cfg) -> int:
    """Plane mask of the planes kept in HB (``0 .. k-1``)."""
    return (1 << cfg.hb_planes_eff) - 1


def read_mask(cfg, cmd: dict) -> int:
    """Planes an EXPERT command reads: its ``plane_mask``, plus the HB planes
    when it fills a slot."""
    full = (1 << cfg.planes) - 1
    return (cmd["plane_mask"] | (hb_mask(cfg) if cmd["fill"] else 0)) & full


def dense_offset(cfg, addr: int) -> int | None:
    """HB dense-region word offset of a dense-image byte address, or ``None``
    when ``addr`` is not the start of a dense row."""
    lay = L.lpddr_layout(cfg)
    off = addr - lay.dense_base
    if off < 0 or off % row_bytes(cfg):
        return None
    return off // row_bytes(cfg)


def check_command(cfg, cmd: dict) -> ExtError:
    """OK, or RANGE for a command the engine refuses (see the module docstring)."""
    lay = L.lpddr_layout(cfg)
    lo, hi = lay.base, lay.base + lay.total_bytes
    addr = cmd["addr"]
    if cmd["kind"] == ExtKind.EXPERT:
        ok = addr % beat_bytes(cfg) == 0 and lo <= addr and addr + cfg.expert_bytes <= hi
    else:
        o = dense_offset(cfg, addr)
        ok = o is not None and 1 <= cmd["length"] and o + cmd["length"] <= cfg.dense_words
    return ExtError.OK if ok else ExtError.RANGE


@dataclass(frozen=True)
class BeatPos:
    """Where one beat of a command's read comes from and where it goes."""
    addr: int            # byte address in LPDDR
    plane: int
    row: int             # expert row (EXPERT) / 0 (DENSE)
    bank: int            # first bank of the beat's words
    to_pe: bool
    to_fill: bool
    region: int          # HBRegion of the fill beat
    offset: int          # fill word offset (slot-relative / dense-region)


def read_beats(cfg, cmd: dict) -> list[BeatPos]:
    """Every beat a command reads, in read (= address = consumption) order;
    empty for a refused command."""
    if check_command(cfg, cmd) != ExtError.OK:
        return []
    fw, B, bb = cfg.fill_words, cfg.pes, beat_bytes(cfg)
    out = []
    if cmd["kind"] == ExtKind.DENSE:
        o0 = dense_offset(cfg, cmd["addr"])
        for j in range(cmd["length"] * B // fw):
            w = j * fw
            out.append(BeatPos(cmd["addr"] + j * bb, 0, 0, w % B, False, True,
                               int(HBRegion.DENSE), o0 + w // B))
        return out
    k = cfg.hb_planes_eff
    slot_base = cfg.expert_base + cmd["slot"] * cfg.slot_words
    for off, length, seg, q in L.lpddr_plane_runs(cfg, read_mask(cfg, cmd)):
        to_pe = bool((cmd["plane_mask"] >> q) & 1)
        to_fill = bool(cmd["fill"]) and q < k
        for j in range(length // bb):
            c, b = divmod(j * fw, B)
            row = seg.row0 + c
            hb = L.hb_addr(cfg, cmd["slot"], q, row) - slot_base if to_fill else 0
            out.append(BeatPos(cmd["addr"] + off + j * bb, q, row, b, to_pe, to_fill,
                               int(HBRegion.EXPERT), hb))
    return out


def read_runs(cfg, cmd: dict) -> list[tuple[int, int]]:
    """The bytes a command reads as maximal contiguous ``(addr, length)``
    runs, in read order (adjacent ``(segment, plane)`` runs merged)."""
    if check_command(cfg, cmd) != ExtError.OK:
        return []
    if cmd["kind"] == ExtKind.DENSE:
        return [(cmd["addr"], cmd["length"] * row_bytes(cfg))]
    out = []
    for off, length, _seg, _q in L.lpddr_plane_runs(cfg, read_mask(cfg, cmd)):
        a = cmd["addr"] + off
        if out and out[-1][0] + out[-1][1] == a:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((a, length))
    return out


def beat_error(cfg, rid: int, rresp: int, rlast: int, expect_last: bool) -> ExtError:
    """The check the engine applies to every R beat (priority as listed):
    PROTOCOL for an ID other than :data:`AXI_ID`, an ``RLAST`` that is not on
    exactly the last beat of its burst, or EXOKAY; else SLVERR / DECERR from
    ``RRESP``; else OK. (Bursts are framed by their ``ARLEN``, so a wrong
    ``RLAST`` fails one command and never shifts later data.)"""
    if rid != AXI_ID or bool(rlast) != bool(expect_last) or rresp == AxiResp.EXOKAY:
        return ExtError.PROTOCOL
    if rresp == AxiResp.SLVERR:
        return ExtError.SLVERR
    if rresp == AxiResp.DECERR:
        return ExtError.DECERR
    return ExtError.OK


def _words(cfg, mem, addr):
    bb, sv = beat_bytes(cfg), cfg.slice_vector_bits
    raw = int.from_bytes(bytes(mem[addr:addr + bb]), "little")
    return [(raw >> (i * sv)) & ((1 << sv) - 1) for i in range(cfg.fill_words)]


def split_command(cfg, mem, cmd: dict, error: tuple[int, ExtError] | None = None):
    """Golden delivery of one command: ``(pe_beats, fill_beats, response)``.

    ``mem`` is indexable by LPDDR byte address (bytes, bytearray, or
    cocotbext-axi's memory). ``error`` is ``(beat, code)``: the first bad beat
    in read order (an index into :func:`read_beats`) and its code, or
    ``None``. A refused command (RANGE) ignores ``error``.
    """
    fw = cfg.fill_words
    zero = [0] * fw
    is_expert = cmd["kind"] == ExtKind.EXPERT
    region = int(HBRegion.EXPERT if is_expert else HBRegion.DENSE)
    slot = cmd["slot"] if is_expert else 0
    fills = bool(cmd["fill"]) or not is_expert
    pe_stream = is_expert and cmd["plane_mask"] != 0
    code = check_command(cfg, cmd)
    full = read_beats(cfg, cmd)
    n = len(full)
    if code == ExtError.OK and error is not None:
        if not 0 <= error[0] < len(full) or ExtError(error[1]) == ExtError.OK:
            raise ValueError(f"error {error!r} is not a bad beat of a {len(full)}-beat read")
        code = ExtError(error[1])
        n = error[0]
    failed = code != ExtError.OK
    # index of the PE stream's final beat in the full read
    last_pe = max((i for i, b in enumerate(full) if b.to_pe), default=None)
    pe, fill = [], []
    for i, b in enumerate(full[:n]):
        words = _words(cfg, mem, b.addr)
        if b.to_pe:
            pe.append({"words": words, "plane": b.plane, "row": b.row, "bank": b.bank,
                       "id": cmd["id"], "last": int(i == last_pe), "error": 0})
        if b.to_fill:
            fill.append({"kind": int(FillKind.DATA), "region": b.region, "slot": slot,
                         "offset": b.offset, "bank": b.bank, "words": list(words)})
    if failed and pe_stream and not (last_pe is not None and last_pe < n):
        pe.append({"words": zero, "plane": 0, "row": 0, "bank": 0, "id": cmd["id"],
                   "last": 1, "error": 1})
    if fills:
        fill.append({"kind": int(FillKind.ABORT if failed else FillKind.COMMIT),
                     "region": region, "slot": slot, "offset": 0, "bank": 0, "words": zero})
    rsp = {"id": cmd["id"], "error": int(code),
           "resident": int(is_expert and bool(cmd["fill"]) and not failed), "slot": cmd["slot"]}
    return pe, fill, rsp


def error_beat(cfg, cmd: dict, bursts: list[tuple[int, int]], bad: dict) -> tuple | None:
    """The first bad beat of a command in read order, from the bursts it
    issued (``(addr, beats)`` in issue order) and the bad beats the memory
    returned (``{(burst index, beat): code}``): ``(beat index, code)`` or ``None``."""
    idx = 0
    for i, (_a, n) in enumerate(bursts):
        for j in range(n):
            if (i, j) in bad:
                return idx, ExtError(bad[(i, j)])
            idx += 1
    return None


def burst_violations(cfg, cmd: dict, bursts: list[tuple], *, failed_beat: int | None = None
                     ) -> list[str]:
    """Check a command's AR bursts against the burst rules.

    ``bursts``: ``(addr, len, size, burst, id)`` in issue order (``len`` in
    beats). ``failed_beat``: for a failed command, the index of its first bad
    beat in read order — its bursts must then be a prefix of the read that
    reaches that beat; otherwise they must cover the read exactly. Returns a
    list of messages (empty when every rule holds)."""
    bb = beat_bytes(cfg)
    msgs = []
    for a, n, size, kind, arid in bursts:
        if not 1 <= n <= cfg.axi_max_burst:
            msgs.append(f"burst at {a:#x}: {n} beats (max {cfg.axi_max_burst})")
        if a % bb or (1 << size) != bb or kind != 1 or arid != AXI_ID:
            msgs.append(f"burst at {a:#x}: size {size}, type {kind}, id {arid}, or unaligned")
        if a // AXI_4K != (a + n * bb - 1) // AXI_4K:
            msgs.append(f"burst at {a:#x} of {n} beats crosses a 4 KiB boundary")
    got = [(a, n * bb) for a, n, *_ in bursts]
    want = read_runs(cfg, cmd)

    def flatten(runs):
        out = []
        for a, n in runs:
            if out and out[-1][1] == a:
                out[-1][1] = a + n
            else:
                out.append([a, a + n])
        return out
    g, w = flatten(got), flatten(want)
    if failed_beat is None:
        if g != w:
            msgs.append(f"bursts read {g[:4]}..., the command reads {w[:4]}...")
    else:
        total = sum(n for _a, n in got)
        need = (failed_beat + 1) * bb
        ok = total >= need
        # a prefix: every run equal but the last, which may stop short
        for i, (lo, hi) in enumerate(g):
            if i >= len(w) or w[i][0] != lo or hi > w[i][1] or (hi < w[i][1] and i != len(g) - 1):
                ok = False
                break
        if not ok:
            msgs.append(f"a failed command's bursts {g[:4]}... are not a prefix of its read "
                        f"{w[:4]}... reaching beat {failed_beat}")
    return msgs

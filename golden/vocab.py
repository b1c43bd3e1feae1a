"""The shared vocabulary on the golden side: every opcode, kind and error code
that crosses a block boundary, as plain ``enum.IntEnum`` (their values are the
hardware encodings). :mod:`elmoe3d.hw.vocab` builds the Amaranth shaped enums
and the ``data.Struct`` payloads from these, so golden models, testbenches
and RTL can never disagree about an encoding.

Field names are the same on both sides: ``plane`` is a plane index
(0 = MSB), ``planes`` a count, ``plane_mask`` a bit mask (bit ``q`` = plane
``q``); ``slot`` an expert-slot index; ``tag`` the ``{layer, expert}`` tag
(``layer << expert_bits | expert``).
"""

from __future__ import annotations

import enum

from .bitslice import Mode as PEMode
from .tag_unit import TagError, TagOp

__all__ = ["PEMode", "TagOp", "TagError", "FillKind", "HBRegion", "FillResult", "ExtKind",
           "ExtError", "AxiResp", "AXI_4K"]

#: AXI4 bursts never cross a 4 KiB boundary.
AXI_4K = 4096


class FillKind(enum.IntEnum):
    """Kind of one HB fill beat."""
    DATA = 0      # words to write
    COMMIT = 1    # the fill of a slot is complete: the slot becomes resident
    ABORT = 2     # the fill failed (the stream ended with an error): the slot stays invalid


class HBRegion(enum.IntEnum):
    """Which HB region a read or a fill addresses (``golden/layout.py``)."""
    EXPERT = 0    # an expert slot: {slot, word offset within the slot}
    DENSE = 1     # the dense region: word address within it


class FillResult(enum.IntEnum):
    """How HB ended one fill (``FillDone.result``; ``golden/hb_map.py`` states
    the rules). Only COMMITTED makes the region resident."""
    COMMITTED = 0  # every word written, COMMIT taken: the region is resident
    ABORTED = 1    # the fill ended with ABORT: the region stays invalid
    MALFORMED = 2  # a beat broke the fill rules (order, range, region, early COMMIT, kind)
    BUSY = 3       # the slot was being read when the fill started: refused, nothing written
    COVERED = 4    # the slot was covered, or being covered, by the KV region: refused
    STRAY = 5      # COMMIT/ABORT with no fill open: ignored, nothing changed


class ExtKind(enum.IntEnum):
    """What an external-memory command reads."""
    EXPERT = 0    # planes of one expert (to the PE stream and/or an HB slot)
    DENSE = 1     # a range of the dense image (into the HB dense region)


class ExtError(enum.IntEnum):
    """Result of an external-memory command (``ExtResponse.error``)."""
    OK = 0
    SLVERR = 1    # a beat came back with RRESP = SLVERR
    DECERR = 2    # a beat came back with RRESP = DECERR
    PROTOCOL = 3  # early or missing RLAST, unexpected RID, EXOKAY on a normal read
    RANGE = 4     # the command's address range is outside the LPDDR window: never issued


class AxiResp(enum.IntEnum):
    OKAY = 0
    EXOKAY = 1
    SLVERR = 2
    DECERR = 3

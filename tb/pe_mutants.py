"""Planted bugs in the PE family, for tests that must fail (test scaffolding:
nothing here is in ``hw/``). Each is a subclass of a real block that changes
one thing, built by :func:`mutant`.

* ``"chunks"``: the rule checker's chunk-count comparison always agrees
  (planes with different chunk counts pass).
* ``"limit"``: the beat limit counts beats over all planes, as before issue
  10 (a one-plane dot product may have ``n`` times too many chunks, and the
  accumulator overflows).
* ``"round"``: the augmented PE rounds on the wrong plane (``keep`` instead
  of ``keep - 1``), so DRAFT results are off.
"""

from __future__ import annotations

from amaranth.hdl import Const

from ..blocks import get_block
from ..hw.pe import BitSlicePE, PEMode
from ..hw.pe_pipeline import SequenceCheck

__all__ = ["MUTANTS", "mutant"]

MUTANTS = ("chunks", "limit", "round")


class _AlwaysSameCount(SequenceCheck):
    @staticmethod
    def same_count(a, b):
        return Const(1)


def mutant(block: str, bug: str, **params):
    """The block ``block`` built from ``params`` with ``bug`` planted."""
    cls = get_block(block).factory
    if bug == "chunks":
        if not issubclass(cls, BitSlicePE):
            raise ValueError(f"bug 'chunks' needs a bit-slice PE, not {block!r}")

        class Mutant(cls):
            check_cls = _AlwaysSameCount
        return Mutant(**params)
    if bug == "limit":
        dut = cls(**params)
        dut.max_chunks *= getattr(dut, "planes", 2)
        if hasattr(dut, "max_beats"):
            dut.max_beats = tuple(b * 2 for b in dut.max_beats)
        return dut
    if bug == "round":
        if not issubclass(cls, BitSlicePE):
            raise ValueError(f"bug 'round' needs a bit-slice PE, not {block!r}")
        class Mutant(cls):
            @staticmethod
            def rounds(beat):
                return (beat.mode == PEMode.DRAFT) & (beat.sv.plane == beat.keep)
        return Mutant(**params)
    raise ValueError(f"bug must be one of {', '.join(MUTANTS)}, not {bug!r}")

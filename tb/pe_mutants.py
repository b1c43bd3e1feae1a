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
* ``"corner"``: FULL mode sets the MSB field's rounding bit for one operand
  pair only (lane 0: activation -128 and MSB slice 0b10..0), so FULL differs
  from the INT8 MAC at one corner of the operand space (the equivalence
  check of ``tb/formal/pe_equiv.py`` must find it).
* ``"msb_round"``: MSB-partial mode rounds like DRAFT, so MSB + LSB differs
  from FULL while FULL stays exact.
* ``"lane0"``: a token-parallel PE multiplies every token lane's slice
  vector with lane 0's activations.
"""

from __future__ import annotations

from amaranth.hdl import Const

from ..blocks import get_block
from ..hw.pe import BitSlicePE, PEMode
from ..hw.pe_pipeline import SequenceCheck

__all__ = ["MUTANTS", "mutant"]

MUTANTS = ("chunks", "limit", "round", "corner", "msb_round", "lane0")


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
    if bug in ("corner", "msb_round"):
        if not (issubclass(cls, BitSlicePE) and params.get("augment", True)):
            raise ValueError(f"bug {bug!r} needs the augmented PE, not {block!r}")
        s = params.get("slice_bits", 4)
        if bug == "corner":
            def rounds(beat):
                return ((beat.mode == PEMode.FULL) & (beat.sv.plane == 0)
                        & (beat.act[0] == -128) & (beat.sv.slices[0] == 1 << (s - 1)))
        else:
            def rounds(beat):
                return (((beat.mode == PEMode.DRAFT) | (beat.mode == PEMode.MSB))
                        & (beat.sv.plane + 1 == beat.keep))

        class Mutant(cls):
            pass
        Mutant.rounds = staticmethod(rounds)
        return Mutant(**params)
    if bug == "lane0":
        if not (issubclass(cls, BitSlicePE) and params.get("tokens", 1) > 1):
            raise ValueError(f"bug 'lane0' needs a token-parallel PE, not {block!r}")

        class Mutant(cls):
            @staticmethod
            def lane_act(beat, p):
                return beat.act[0]
        return Mutant(**params)
    raise ValueError(f"bug must be one of {', '.join(MUTANTS)}, not {bug!r}")

"""Planted bugs in the AXI4 stream engine, for tests that must fail (test
scaffolding: nothing here is in ``hw/``). Each is a subclass of
:class:`~elmoe3d.hw.ext_stream.ExtStream` that changes one thing, built by
:func:`mutant`.

* ``"tag2"``: a 2-bit command tag instead of ``TAG_BITS`` (3). A refused or
  empty command's flush then also drops the runs of the command 4 after
  it, when that command already sits in the data side's walker or the
  register slice in front of the router: its beats go to the next
  command's runs, responses are wrong or lost and the engine hangs.
"""

from __future__ import annotations

from ..config import Config
from ..hw.ext_stream import ExtStream

__all__ = ["MUTANTS", "mutant", "mutant_factory"]

MUTANTS = ("tag2",)


class _Tag2(ExtStream):
    tag_bits = 2


def mutant(bug: str, cfg: Config) -> ExtStream:
    """The engine for ``cfg`` with ``bug`` planted."""
    if bug == "tag2":
        return _Tag2(cfg)
    raise ValueError(f"bug must be one of {', '.join(MUTANTS)}, not {bug!r}")


def mutant_factory(bug: str):
    """A factory of the planted-bug engine taking :func:`~elmoe3d.hw.ext_stream.ext_params`
    (for :func:`~elmoe3d.sim.run.harness.simulate`)."""
    return lambda config: mutant(bug, Config(**config))

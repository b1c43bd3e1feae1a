"""Formal checks of the Elastic-SD controller's units (SymbiYosys via
YoWASP): the stream rules on every stream of each unit
(:mod:`elmoe3d.tb.formal.esd_units`), proved by k-induction, and each
unit's planted bug, which must fail."""

import pytest

from elmoe3d.hw.esd_ctrl_units import UNITS
from elmoe3d.sim.run.formal import formal_available, run_sby
from elmoe3d.tb.formal.esd_units import BUGS, UnitFormal

_ok, _why = formal_available()
pytestmark = [pytest.mark.formal, pytest.mark.esd, pytest.mark.skipif(not _ok, reason=_why)]

#: k-induction length: every output leaves a register that holds until it
#: is taken (or a multiplexer of held inputs), so the rules close at once
PROVE_K = 3
#: BMC depth of the planted bugs (each fails within a few cycles of a stall)
BUG_DEPTH = 10


@pytest.mark.parametrize("unit", list(UNITS))
def test_esd_unit_stream_rules(unit):
    """Stream rules on every stream of the unit: unbounded (k-induction)."""
    f = UnitFormal(unit)
    r = run_sby(f, name=f"esd_unit_prove_{unit}", depth=PROVE_K, mode="prove")
    assert r.status == "PASS"
    assert f.covered


@pytest.mark.parametrize("unit", list(UNITS))
def test_esd_unit_catches_bug(unit):
    """The unit's planted bug gives a counterexample."""
    r = run_sby(UnitFormal(unit, bug=BUGS[unit]), name=f"esd_unit_bug_{unit}",
                depth=BUG_DEPTH, expect="FAIL")
    assert r.status == "FAIL"


def test_esd_unit_bad_names():
    with pytest.raises(ValueError, match="Unknown unit"):
        UnitFormal("nope")
    with pytest.raises(ValueError, match="planted bug"):
        UnitFormal("round", bug="no_hold")


def test_no_controller_elaborate_over_250_lines():
    """The controller stays small units: no ``elaborate()`` in
    ``hw/esd_ctrl.py`` or ``hw/esd_ctrl_units/`` is over 250 lines."""
    import ast
    from pathlib import Path
    hw = Path(__file__).resolve().parent.parent / "hw"
    files = [hw / "esd_ctrl.py", *sorted((hw / "esd_ctrl_units").glob("*.py"))]
    sizes = {}
    for f in files:
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.FunctionDef) and n.name == "elaborate":
                sizes[f"{f.name}:{n.lineno}"] = n.end_lineno - n.lineno + 1
    assert len(sizes) >= 10, sizes
    assert max(sizes.values()) <= 250, sizes

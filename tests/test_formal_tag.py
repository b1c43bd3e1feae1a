"""Formal checks of the expert-cache tag unit (SymbiYosys via YoWASP):
bounded model checks of the properties in :mod:`elmoe3d.tb.formal.tag_unit`
on small instances, reachability covers, and planted bugs that must fail."""

import pytest

from elmoe3d.sim.run.formal import formal_available, run_sby
from elmoe3d.tb.formal.tag_unit import BUGS, TagUnitFormal

_ok, _why = formal_available()
pytestmark = [pytest.mark.formal, pytest.mark.tag,
              pytest.mark.skipif(not _ok, reason=_why)]

# S = 4 slots, 3-bit tags (8 tags > S: evictions), 3-bit hotness (saturates
# after one large TOUCH), 2-bit pins (PIN_LIMIT at 3), 3-bit statistics.
SMALL = dict(slots=4, layer_bits=1, expert_bits=2, hot_bits=3, decay_shift=1, plane_bits=1,
             stat_bits=3, pin_bits=2)
# S = 3: not a power of two, so the slot-addressed ops can name slot 3
# (BAD_SLOT) and the argmin tree has an unpaired leaf.
ODD = dict(SMALL, slots=3, decay_shift=0)
# S = 2: the shortest counterexamples for the planted bugs.
TWO = dict(SMALL, slots=2)

#: BMC depths in clock cycles (a command's response comes 4 cycles after it,
#: an ALLOCATE 5..4+P; the properties check a response in the response stage,
#: 3 cycles after its command; filling every slot of S = 4 takes 4 ALLOCATEs).
DEPTH = 20
DEPTH_ODD = 16


@pytest.mark.parametrize("params,depth,name", [(SMALL, DEPTH, "S4"), (ODD, DEPTH_ODD, "S3")],
                         ids=["S4", "S3"])
def test_tag_formal_bmc(params, depth, name):
    """unique, disabled_free, victim, lookup, pins_hold, commit, no_wrap,
    stream: no counterexample within ``depth`` cycles from reset."""
    r = run_sby(TagUnitFormal(**params), name=f"tag_unit_bmc_{name}_d{depth}", depth=depth)
    assert r.status == "PASS"


def test_tag_formal_cover():
    """Every Cover (no victim, eviction, pending lookup, hit on the slot
    committed in the same cycle, saturated TOUCH, pin limit, covered slot
    freed, stalled hit) is reachable, so the assertions are not vacuous."""
    r = run_sby(TagUnitFormal(**SMALL), name="tag_unit_cover_d16", depth=16, mode="cover")
    assert r.status == "PASS"


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_tag_formal_catches_bug(bug):
    """A planted bug (pinned slots as victims; TOUCH wrapping; PENDING slots
    reported as hits; ALLOCATE not waiting for the victim pipeline) must
    produce a counterexample."""
    r = run_sby(TagUnitFormal(bug=bug, **TWO), name=f"tag_unit_bug_{bug}", depth=14,
                expect="FAIL")
    assert r.status == "FAIL"

"""Formal checks of the expert-cache tag unit (SymbiYosys via YoWASP):
bounded model checks of the properties in :mod:`elmoe3d.hw.tag_unit_formal`
on small instances, reachability covers, and planted bugs that must fail."""

import pytest

from elmoe3d.hw.tag_unit_formal import TagUnitFormal
from elmoe3d.sim.formal import formal_available, run_sby

_ok, _why = formal_available()
pytestmark = [pytest.mark.formal, pytest.mark.tag,
              pytest.mark.skipif(not _ok, reason=_why)]

# S = 4 slots, 3-bit tags (8 tags > S: evictions), 3-bit hotness (saturates
# after one large TOUCH), 2-bit pins (PIN_LIMIT at 3), 3-bit statistics.
SMALL = dict(slots=4, layer_bits=1, expert_bits=2, hot_bits=3, decay_shift=1, plane_bits=1,
             stat_bits=3, pin_bits=2)
# S = 3: not a power of two, so PIN/UNPIN can name slot 3 (BAD_SLOT) and the
# argmin tree has an unpaired leaf.
ODD = dict(SMALL, slots=3, decay_shift=0)

#: BMC depths in clock cycles. Depth 30 at S = 4 covers every command sequence
#: of up to 28 commands (2-cycle latency): filling and pinning every slot
#: takes 8 commands, reaching the pin limit 3 more.
DEPTH = 30
DEPTH_ODD = 20


@pytest.mark.parametrize("params,depth,name", [(SMALL, DEPTH, "S4"), (ODD, DEPTH_ODD, "S3")],
                         ids=["S4", "S3"])
def test_tag_formal_bmc(params, depth, name):
    """unique, lookup_sound/complete, victim_unpinned, no_wrap, slot_state,
    stream: no counterexample within ``depth`` cycles from reset."""
    r = run_sby(TagUnitFormal(**params), name=f"tag_unit_bmc_{name}_d{depth}", depth=depth)
    assert r.status == "PASS"


def test_tag_formal_cover():
    """Every Cover (all pinned, eviction, saturated TOUCH, stalled hit, pin
    limit) is reachable within 16 cycles, so the assertions are not vacuous."""
    r = run_sby(TagUnitFormal(**SMALL), name="tag_unit_cover_d16", depth=16, mode="cover")
    assert r.status == "PASS"


@pytest.mark.parametrize("bug", ["victim_ignores_pins", "hot_wraps"])
def test_tag_formal_catches_bug(bug):
    """A planted bug (pinned slots allowed as victims; TOUCH wrapping instead
    of saturating) must produce a counterexample."""
    r = run_sby(TagUnitFormal(bug=bug, **SMALL), name=f"tag_unit_bug_{bug}", depth=12,
                expect="FAIL")
    assert r.status == "FAIL"

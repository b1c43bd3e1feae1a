"""Formal checks of the Elastic-SD controller (SymbiYosys via YoWASP): the
stream rules on all 14 stream ports (:mod:`elmoe3d.tb.formal.esd_ctrl`),
proved by k-induction, their reachability, and planted bugs that must fail."""

import pytest

from elmoe3d.config import preset
from elmoe3d.sim.run.formal import formal_available, run_sby
from elmoe3d.tb.formal.esd_ctrl import BUGS, FORMAL_CONFIG, EsdCtrlFormal

_ok, _why = formal_available()
pytestmark = [pytest.mark.formal, pytest.mark.esd, pytest.mark.skipif(not _ok, reason=_why)]

#: k-induction length: the rules close at k = 3 (every output leaves through a
#: register slice or the trace FIFO's output register), so the proof is unbounded.
PROVE_K = 3
#: cover depth: every output is seen waiting by step 16 (host_rsp 3, trace 4,
#: kv_req 5, tag_cmd and dp_step 8, ext_cmd 15, dp_source 16: ROUND, STEP, the
#: datapath step, a pass, an announcement, the tag round trips).
COVER_DEPTH = 20
#: BMC depth of the planted bugs (they fail within a few cycles of a stall).
BUG_DEPTH = 8


@pytest.mark.parametrize("geometry", ["formal", "tiny", "default"])
def test_esd_formal_stream_rules(geometry):
    """Stream rules on every port: unbounded (k-induction, k = PROVE_K)."""
    cfg = FORMAL_CONFIG if geometry == "formal" else preset(geometry)
    f = EsdCtrlFormal(cfg)
    r = run_sby(f, name=f"esd_ctrl_prove_{geometry}", depth=PROVE_K, mode="prove")
    assert r.status == "PASS"
    assert len(f.covered) == 14


def test_esd_formal_cover():
    """Every output stream is reachable while waiting (the rules are not vacuous)."""
    r = run_sby(EsdCtrlFormal(), name="esd_ctrl_cover", depth=COVER_DEPTH, mode="cover")
    assert r.status == "PASS"


@pytest.mark.parametrize("bug", BUGS)
def test_esd_formal_catches_bug(bug):
    """A register slice that drops valid while stalled, and a trace payload
    that changes while stalled, must give a counterexample."""
    r = run_sby(EsdCtrlFormal(bug=bug), name=f"esd_ctrl_bug_{bug}", depth=BUG_DEPTH,
                expect="FAIL")
    assert r.status == "FAIL"


def test_esd_formal_bad_bug():
    with pytest.raises(ValueError, match="planted bug"):
        EsdCtrlFormal(bug="nope")

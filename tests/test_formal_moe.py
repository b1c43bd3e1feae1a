"""Formal checks of the batched MoE datapath (SymbiYosys via YoWASP): the
stream rules on every stream port of every component that drives a stream,
and of the whole layer (:mod:`elmoe3d.tb.formal.moe`), at the formal
geometry (``FORMAL_CONFIG``: the smallest the datapath elaborates at);
reachability covers; a planted bug per wrapper that must fail."""

import pytest

from elmoe3d.sim.run.formal import formal_available, run_sby
from elmoe3d.tb.formal.moe import BUGS, FORMAL_CONFIG, WRAPPERS

_ok, _why = formal_available()
pytestmark = [pytest.mark.formal, pytest.mark.moe, pytest.mark.skipif(not _ok, reason=_why)]

slow = pytest.mark.slow

#: (wrapper, mode, depth). ``prove``: k-induction closes at k = 3 (the output
#: leaves a register slice / FIFO / a register held by its FSM state; top-k's
#: at k = 4: a last logit reaches its result register through three stages,
#: since round 16's input register), an unbounded proof. ``bmc``: induction does not close at k <= 10 (it would need
#: invariants on the component's FSM state); the depth covers at least one
#: transfer on every output (see COVER) and is what runs in seconds: beyond
#: it the solver time grows steeply (Issue: step 14 ~5 s, step 20 ~4 min).
CHECKS = [
    ("pe_array", "prove", 3),
    ("topk", "prove", 4),
    ("output", "prove", 3),
    ("record_path", "prove", 3),
    ("scheduler", "bmc", 20),
    ("scheduler_pf", "bmc", 28),
    ("issue", "bmc", 14),
    ("hb_reader", "bmc", 16),
    ("layer", "bmc", 10),
    pytest.param("scheduler", "bmc", 28, marks=slow),
    pytest.param("issue", "bmc", 18, marks=slow),
    pytest.param("hb_reader", "bmc", 30, marks=slow),
    pytest.param("layer", "bmc", 30, marks=slow),
]

#: cover depth per wrapper: every covered output is seen waiting within it.
COVER = {"pe_array": 16, "topk": 6, "scheduler": 14, "scheduler_pf": 18, "issue": 8,
         "output": 12,
         "record_path": 12, "hb_reader": 6, "layer": 8}


def _wrapper(name, bug=None):
    return WRAPPERS[name](FORMAL_CONFIG, bug=bug)


@pytest.mark.parametrize("name,mode,depth", CHECKS)
def test_moe_formal_stream_rules(name, mode, depth):
    """Stream rules on every stream port of the component (or the layer)."""
    f = _wrapper(name)
    r = run_sby(f, name=f"moe_{name}_{mode}_d{depth}", depth=depth, mode=mode)
    assert r.status == "PASS"
    from amaranth.lib import stream
    want = sum((mb.dimensions[0] if mb.dimensions else 1)
               for mb in f.dut.signature.members.values()
               if not mb.is_port and isinstance(mb.signature, stream.Signature))
    assert len(f.covered) == want, "a stream port without the rules"


@pytest.mark.parametrize("name", [n if n != "layer" else pytest.param(n, marks=slow)
                                  for n in sorted(COVER)])
def test_moe_formal_cover(name):
    """Every covered output is reachable while waiting (the rules are not
    vacuous). The layer's under ``slow``: its planted-bug test shows the same
    (a bug on ``hb_cmd`` that acts only while it waits fails within 10 cycles)."""
    r = run_sby(_wrapper(name), name=f"moe_{name}_cover", depth=COVER[name], mode="cover")
    assert r.status == "PASS"


#: one planted bug per wrapper (alternating), on its first output stream
PLANTED = [(name, BUGS[i % len(BUGS)]) for i, name in enumerate(WRAPPERS)]


@pytest.mark.parametrize("name,bug", PLANTED)
def test_moe_formal_catches_bug(name, bug):
    """An output that drops valid, or changes its payload, while it waits
    must give a counterexample."""
    r = run_sby(_wrapper(name, bug), name=f"moe_{name}_bug_{bug}", depth=COVER[name] + 2,
                expect="FAIL")
    assert r.status == "FAIL"


def test_moe_formal_bad_bug():
    with pytest.raises(ValueError, match="planted bug"):
        _wrapper("topk", "nope")

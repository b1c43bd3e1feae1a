"""The peer list of the PE comparison (``sim/flow/peers.py``): which designs are
compared and how many MACs per cycle each is credited with."""

from elmoe3d.config import preset
from elmoe3d.sim.flow import peers as pr


def test_token_lane_pe_is_credited_with_its_tokens():
    """The MoE array's PE applies one weight beat to P tokens: P x lanes MACs
    per beat (W4: one beat per chunk, W8: two); every other peer gets its
    own rate, whatever ``tokens`` says."""
    cfg = preset("default").replace(slice_bits=4)
    by = {p.block: p for p in pr.peers(cfg)}
    assert set(pr.BIT_SLICE) <= set(by)
    L, P = cfg.lanes, cfg.token_lanes
    assert pr._macs_per_cycle(by["pe_lanes"], L, True, P) == P * L
    assert pr._macs_per_cycle(by["pe_lanes"], L, False, P) == P * L / 2
    assert pr._macs_per_cycle(by["pe"], L, True) == L
    assert pr._macs_per_cycle(by["bitfusion"], L, True, P) == 2 * L

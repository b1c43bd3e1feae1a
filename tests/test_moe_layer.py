"""pytest entry points: the MoE layer datapath in cocotb against the golden
integer MoE layer (FULL and DRAFT, random stalls, cycles per token).

Default run: three parameter sets (tiny; a shared expert with 2-bit slices
and a 2-of-4-plane draft; the default size) with a modest token count each.
``pytest -m slow`` runs the full count: at least 500 tokens per mode per
parameter set.
"""

import json

import pytest

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.golden import moe_layer as gm
from elmoe3d.sim.harness import SimulationFailed, simulate

from conftest import sim_params

pytestmark = pytest.mark.moe

BLOCK = get_block("moe_layer")

# (id, Config overrides, tokens per mode per random test in the default run)
SETS = {
    "tiny": ({"hidden": 16, "ffn": 32, "experts": 8, "top_k": 2, "pes": 2, "lanes": 4}, 30),
    "shared-s2": ({"hidden": 16, "ffn": 16, "experts": 8, "top_k": 3, "shared_experts": 1,
                   "pes": 2, "lanes": 8, "slice_bits": 2}, 40),
    "default": ({}, 8),
}
# full count (slow): 2 random tests x FULL/DRAFT x this many tokens >= 500 per mode
SLOW_TOKENS = 250


def _params(name):
    over = SETS[name][0]
    base = BLOCK.params(preset("default"))
    keys = {"hidden": "hidden", "ffn": "ffn", "experts": "experts", "top_k": "top_k",
            "shared_experts": "shared", "pes": "pes", "lanes": "lanes",
            "slice_bits": "slice_bits"}
    return {**base, **{keys[k]: v for k, v in over.items()}}


def _run(name, simulator, testcase, env=None, **kw):
    return simulate(BLOCK.factory, block=BLOCK.name, params=_params(name), top=BLOCK.top,
                    simulator=simulator, test_module="elmoe3d.tb.test_moe_layer",
                    testcase=testcase, env=env or {}, **kw)


@pytest.mark.parametrize("simulator", sim_params())
def test_moe_random_shared(simulator):
    """A shared expert, 2-bit slices, DRAFT keeping 2 of 4 planes; on every
    simulator (fewer tokens on Icarus, which is much slower)."""
    tokens = SETS["shared-s2"][1] if simulator == "verilator" else 4
    _run("shared-s2", simulator, "random_tokens,stress_tokens,draft_mask",
         {"ELMOE_MOE_TOKENS": str(tokens)})


@pytest.mark.parametrize("name", ["tiny", "default"])
def test_moe_random(name):
    _run(name, "verilator", "random_tokens,stress_tokens,draft_mask",
         {"ELMOE_MOE_TOKENS": str(SETS[name][1])})


def test_moe_throughput_default(measured_dir):
    """Cycles per token at the default size; efficiency (analytic/measured)
    must be at least 0.9 in FULL and DRAFT."""
    out = measured_dir / "moe_cycles.json"
    _run("default", "verilator", "throughput", {"ELMOE_MEASURE_OUT": str(out)})
    fig = json.loads(out.read_text())["figures"]
    for mode in ("FULL", "DRAFT"):
        f = fig[mode]
        assert f["cycles_per_token"] >= f["analytic_cycles_per_token"], mode
        assert f["efficiency"] >= 0.9, f"{mode}: efficiency {f['efficiency']:.3f} < 0.9"


def test_moe_golden_mutation_fails():
    """A wrong golden layer (bit 0 of every expected output flipped) must
    make the testbench fail: the comparison is live."""
    with pytest.raises(SimulationFailed) as exc:
        _run("shared-s2", "verilator", "random_tokens",
             {"ELMOE_MOE_TOKENS": "2", "ELMOE_GOLDEN_MUTATION": "1"})
    # ... and fail for the right reason: the output comparison, not a crash
    log = str(exc.value).split("log=")[1].split()[0]
    text = open(log).read()
    assert "outputs differ" in text and "weight requests differ" not in text


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETS))
def test_moe_random_full_count(name):
    """>= 500 tokens per mode per parameter set: random_tokens and
    stress_tokens each run ``SLOW_TOKENS`` FULL and ``SLOW_TOKENS`` DRAFT."""
    _run(name, "verilator", "random_tokens,stress_tokens,draft_mask",
         {"ELMOE_MOE_TOKENS": str(SLOW_TOKENS)})


def test_mask_checker_catches_a_violation():
    """The DRAFT-mask checker the cocotb tests use flags a routed expert
    outside the mask (and ignores FULL tokens and shared experts)."""
    from elmoe3d.tb.test_moe_layer import mask_violations
    R = {"kind": 0, "shared": 0, "expert": 0, "mode": 0}
    def ex(e, shared=0, mode=1):
        return {"kind": 1, "shared": shared, "expert": e, "mode": mode}
    mask = [True, False, True]
    toks = [(gm.Precision.DRAFT, mask), (gm.Precision.FULL, mask), (gm.Precision.DRAFT, mask)]
    reqs = [R, ex(0), ex(2), R, ex(1, mode=0), R, ex(1, shared=1), ex(1)]
    assert mask_violations(reqs, toks) == [(2, 1)]
    assert mask_violations(reqs[:-1], toks) == []


def test_analytic_count_formula():
    """The analytic count the efficiency is measured against."""
    p = _params("default")
    full = gm.analytic_cycles(hidden=p["hidden"], ffn=p["ffn"], experts=p["experts"],
                              top_k=p["top_k"], shared=p["shared"], slice_bits=p["slice_bits"],
                              draft_keep=1, pes=p["pes"], lanes=p["lanes"])
    # router 16x64 MACs x 2 planes + 4 experts x 3 x 64x128 x 2 planes, over 64 MAC lanes
    assert full == (16 * 64 * 2 + 4 * 3 * 64 * 128 * 2) / 64


@pytest.mark.parametrize("over,msg", [
    ({"top_k": 17}, "Top-k"),
    ({"hidden": 60}, "Hidden size 60"),
    ({"ffn": 100}, "Expert FFN width 100"),
    ({"experts": 18}, "Routed expert count 18"),
    ({"shared": 9}, "Shared expert count"),
    ({"draft_keep": 2}, "Draft kept plane count"),
])
def test_moe_bad_params(over, msg):
    kw = _params("default")
    kw.update(over)
    with pytest.raises(ValueError, match=msg):
        BLOCK.factory(**kw)


def test_moe_bad_param_type():
    kw = _params("default")
    kw["pes"] = 4.0
    with pytest.raises(TypeError, match="PE count"):
        BLOCK.factory(**kw)

"""The tile's token feed (``hw/esd_feed.TokenFeed``): the controller's
``StepInfo`` plus the host's token vectors become the datapath's ``tok``
stream (Amaranth simulation, random steps, idle and back-pressure)."""

import random

import pytest
from amaranth.sim import Simulator

from elmoe3d.config import preset
from elmoe3d.golden import esd as gesd
from elmoe3d.hw.esd_feed import ROLE_OF_PHASE, TokenFeed

pytestmark = pytest.mark.tile


def _run(cfg, steps, seed, early=True, mutate=None):
    """Drive ``steps`` [(StepInfo dict, vectors)]; returns the MoETokens out."""
    dut = TokenFeed(cfg)
    r = random.Random(seed)
    got = []
    H = cfg.hidden

    async def steps_in(ctx):
        for info, _ in steps:
            while r.random() < 0.3:
                await ctx.tick()
            ctx.set(dut.step.payload, info)
            ctx.set(dut.step.valid, 1)
            await ctx.tick().until(dut.step.ready)
            ctx.set(dut.step.valid, 0)

    async def x_in(ctx):
        for _, vecs in steps:
            for v in vecs:
                while r.random() < 0.3:
                    await ctx.tick()
                ctx.set(dut.x.payload, {"x": v})
                ctx.set(dut.x.valid, 1)
                await ctx.tick().until(dut.x.ready)
                ctx.set(dut.x.valid, 0)

    async def sink(ctx):
        want = sum(len(v) for _, v in steps)
        held = None
        for _ in range(40 * want + 100):
            rdy = r.random() < 0.7
            ctx.set(dut.tok.ready, rdy)
            await ctx.delay(1e-9)
            valid = ctx.get(dut.tok.valid)
            if held is not None:
                assert valid and ctx.get(dut.tok.payload.as_value()) == held, \
                    "tok changed or dropped while stalled"
            if valid:
                p = ctx.get(dut.tok.payload)
                if rdy:
                    got.append(dict(x=[int(a) for a in p.x], role=int(p.role.value),
                                    mask=int(p.mask), layer=int(p.layer), last=int(p.last)))
                    held = None
                else:
                    held = ctx.get(dut.tok.payload.as_value())
            await ctx.tick()
            if len(got) == want:
                break
        assert len(got) == want, f"{len(got)} of {want} tokens"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(steps_in)
    sim.add_testbench(x_in)
    sim.add_testbench(sink)
    sim.run()
    return got


def _steps(cfg, r, n):
    out = []
    E = cfg.experts
    for _ in range(n):
        ph = r.choice([gesd.Phase.AR, gesd.Phase.DRAFT, gesd.Phase.VERIFY])
        k = r.randint(1, 2 * cfg.batch_tokens + 1)
        mask = r.getrandbits(E) if ph == gesd.Phase.DRAFT else (1 << E) - 1
        info = dict(phase=int(ph), layer=r.randrange(cfg.layers), mask=mask, tokens=k)
        vecs = [[r.randint(-128, 127) for _ in range(cfg.hidden)] for _ in range(k)]
        out.append((info, vecs))
    return out


def _expected(steps):
    exp = []
    for info, vecs in steps:
        for i, v in enumerate(vecs):
            exp.append(dict(x=v, role=int(ROLE_OF_PHASE[gesd.Phase(info["phase"])]),
                            mask=info["mask"], layer=info["layer"],
                            last=int(i == len(vecs) - 1)))
    return exp


@pytest.mark.parametrize("seed", [1, 2])
def test_token_feed(seed):
    """Every vector leaves once, in order, with the step's role, mask, layer
    and ``last`` on the step's final token; stream rules under idle and
    back-pressure."""
    cfg = preset("tiny")
    r = random.Random(seed)
    steps = _steps(cfg, r, 12)
    assert _run(cfg, steps, seed) == _expected(steps)


def test_token_feed_check_can_fail():
    """The comparison catches a wrong ``last`` (expected list shifted)."""
    cfg = preset("tiny")
    r = random.Random(3)
    steps = _steps(cfg, r, 3)
    exp = _expected(steps)
    exp[0]["last"] ^= 1
    assert _run(cfg, steps, 3) != exp


def test_token_feed_needs_config():
    with pytest.raises(TypeError, match="Config"):
        TokenFeed("tiny")

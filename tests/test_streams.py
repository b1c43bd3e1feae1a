"""The shared stream components (:mod:`elmoe3d.hw.streams`): the register slice's
formal proof of lossless in-order delivery and the stream rules, a planted
bug that must fail, and full throughput in simulation; the block-RAM FIFO's
order, capacity, rate and latency in simulation; the credit and queue FIFOs
cycle for cycle against ``SyncFIFOBuffered``."""

import pytest
from amaranth.hdl import unsigned
from amaranth.sim import Simulator

from elmoe3d.hw.streams import BlockFIFO, RegisterSlice
from elmoe3d.sim.run.formal import formal_available, run_sby
from elmoe3d.tb.formal.streams import RegisterSliceFormal

_ok, _why = formal_available()


@pytest.mark.formal
@pytest.mark.skipif(not _ok, reason=_why)
def test_register_slice_formal():
    r = run_sby(RegisterSliceFormal(4), name="register_slice_prove", depth=12, mode="prove")
    assert r.status == "PASS"


@pytest.mark.formal
@pytest.mark.skipif(not _ok, reason=_why)
def test_register_slice_formal_catches_bug():
    r = run_sby(RegisterSliceFormal(4, bug="drop"), name="register_slice_bug", depth=8,
                expect="FAIL")
    assert r.status == "FAIL"


async def _step(ctx, dut, valid, ready, nxt, sent, got):
    """One cycle of a stream component with ``i``/``o``: offer payload
    ``nxt`` (if ``valid``), take ``o`` (if ``ready``); record both
    handshakes; the next payload number."""
    ctx.set(dut.i.valid, valid)
    ctx.set(dut.i.payload, nxt & 0xFF)
    ctx.set(dut.o.ready, ready)
    _, _, iv, ir, ov, orr, op = await ctx.tick().sample(
        dut.i.valid, dut.i.ready, dut.o.valid, dut.o.ready, dut.o.payload)
    if iv and ir:
        sent.append(nxt & 0xFF)
        nxt += 1
    if ov and orr:
        got.append(op)
    return nxt


def test_register_slice_throughput_and_order():
    """Random ready on the output, always-valid input: everything arrives in
    order, and with ``o.ready`` high the slice moves one payload per cycle."""
    import random
    dut = RegisterSlice(unsigned(8))
    rnd = random.Random(1)
    got, sent = [], []

    async def bench(ctx):
        nxt = 0
        for cyc in range(400):
            ready = 1 if cyc < 200 else rnd.random() < 0.6
            nxt = await _step(ctx, dut, 1, ready, nxt, sent, got)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == sent[:len(got)] and len(sent) - len(got) <= 2
    assert len(got) >= 198 + 100           # full rate while o.ready is high


@pytest.mark.parametrize("depth,seed", [(2, 1), (5, 2), (16, 3), (16, 4)])
def test_block_fifo_order_capacity_and_rate(depth, seed):
    """:class:`BlockFIFO` under random ``i.valid`` / ``o.ready``: every
    payload arrives once and in order; ``i.ready`` is low only while at least
    ``depth`` payloads are held (the block RAM is full), never more than
    ``depth + 4`` are held, and a stalled output fills it to ``depth + 4``; with both sides always ready it moves
    one payload per cycle; a payload reaches ``o`` 4 cycles after its write
    into an empty FIFO."""
    import random
    dut = BlockFIFO(8, depth)
    rnd = random.Random(seed)
    got, sent = [], []
    cap = depth + BlockFIFO.QUEUE

    async def bench(ctx):
        nxt = 0
        # latency into an empty FIFO
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, 0xA5)
        await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for lat in range(1, 8):
            if ctx.get(dut.o.valid):
                break
            await ctx.tick()
        assert lat == 4 and ctx.get(dut.o.payload) == 0xA5
        ctx.set(dut.o.ready, 1)
        await ctx.tick()
        ctx.set(dut.o.ready, 0)
        for cyc in range(1500):
            phase = cyc // 300
            iv = 1 if phase == 0 else rnd.random() < (0.9 if phase in (1, 3) else 0.4)
            ready = 1 if phase == 0 else (0 if phase == 1 else rnd.random() < 0.5)
            held = len(sent) - len(got)
            assert held <= cap and (ctx.get(dut.i.ready) or held >= depth), (cyc, held)
            if cyc == 599:
                assert held == cap and not ctx.get(dut.i.ready)   # stalled output: full
            nxt = await _step(ctx, dut, iv, ready, nxt, sent, got)
            if cyc == 299:
                assert len(got) >= 290, len(got)       # full rate, both sides ready

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == sent[:len(got)] and len(got) > 200


def test_block_fifo_bad_parameters():
    with pytest.raises(ValueError, match="depth must be an int >= 2, not 1"):
        BlockFIFO(8, 1)
    with pytest.raises(ValueError, match="width must be a positive int, not 0"):
        BlockFIFO(0, 4)


@pytest.mark.parametrize("cls_name", ["CreditFIFO", "QueueFIFO", "QueueFIFO_credit"])
@pytest.mark.parametrize("depth", [2, 3, 5, 8])
def test_credit_and_queue_fifos_equal_sync_fifo_buffered(cls_name, depth):
    """The hand-written FIFOs of ``hw/streams.py`` (written for timing, used
    by hb_bank and the MoE issue stage) behave cycle for cycle as
    ``amaranth.lib.fifo.SyncFIFOBuffered``: random writes and reads for 600
    cycles, every output compared every cycle (a credit FIFO's writer never
    writes into a full FIFO, as its contract says)."""
    import random
    from amaranth.hdl import Module
    from amaranth.lib.fifo import SyncFIFOBuffered
    from elmoe3d.hw import streams
    m = Module()
    m.submodules.ref = ref = SyncFIFOBuffered(width=8, depth=depth)
    extra = {"credit": True} if cls_name.endswith("_credit") else {}
    m.submodules.dut = dut = getattr(streams, cls_name.split("_")[0])(width=8, depth=depth,
                                                                      **extra)
    credit = cls_name != "QueueFIFO"
    rng = random.Random(depth * 7 + len(cls_name))
    seen = {"cycles": 0, "full": 0, "reads": 0}

    async def tb(ctx):
        for _ in range(600):
            w = rng.random() < 0.6
            if credit:
                w = w and ctx.get(ref.w_rdy)
            data_ = rng.randrange(256)
            r = rng.random() < 0.5
            for f in (ref, dut):
                ctx.set(f.w_en, w)
                ctx.set(f.w_data, data_)
                ctx.set(f.r_en, r)
            got = [ctx.get(getattr(dut, n)) for n in ("w_rdy", "r_rdy", "level")]
            want = [ctx.get(getattr(ref, n)) for n in ("w_rdy", "r_rdy", "level")]
            assert got == want, (seen, got, want)
            if want[1]:
                assert ctx.get(dut.r_data) == ctx.get(ref.r_data), seen
                seen["reads"] += r
            seen["full"] += not want[0]
            seen["cycles"] += 1
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert seen["full"] > 10 and seen["reads"] > 100, seen

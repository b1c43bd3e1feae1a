"""FPGA self-test designs: the wrapper in simulation (PASS on golden
vectors, FAIL on a corrupted ROM) and, under ``slow``, board bitstreams."""

import pytest
from amaranth.sim import Simulator

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.sim.selftest import StreamSelfTest, decode_uart, vectors_for

pytestmark = pytest.mark.fpga

DIV = 4


def _run(block, vec, cycles=6000):
    dut = block
    top = StreamSelfTest(dut, **vec, name="pe", uart_divisor=DIV, timeout=4000)
    sim = Simulator(top)
    sim.add_clock(1e-6)
    trace = {"tx": [], "done": 0, "passed": 0, "failed": 0}

    async def bench(ctx):
        for _ in range(cycles):
            await ctx.tick()
            trace["tx"].append(ctx.get(top.uart_tx))
        trace.update(done=ctx.get(top.done), passed=ctx.get(top.passed),
                     failed=ctx.get(top.failed), bad=ctx.get(top.mismatches))
    sim.add_testbench(bench)
    sim.run()
    trace["line"] = decode_uart(trace["tx"], DIV)
    return trace


def _pe():
    b = get_block("pe")
    return b.build(preset("tiny"))


def test_selftest_passes_on_golden_vectors():
    dut = _pe()
    vec = vectors_for("pe", dut, dots=6)
    t = _run(dut, vec)
    assert t["done"] and t["passed"] and not t["failed"], t
    n = len(vec["expected"]["o"])
    assert t["line"] == f"ELMOE3D pe PASS n={n:04X}\r\n".encode(), t["line"]


@pytest.mark.parametrize("where", ["expected", "input", "missing"])
def test_selftest_fails_on_a_corrupted_rom(where):
    dut = _pe()
    vec = vectors_for("pe", dut, dots=6)
    if where == "expected":
        vec["expected"]["o"][2] ^= 1 << 3           # a wrong golden result
    elif where == "input":
        vec["inputs"]["i"][0] ^= 1                  # a flipped activation bit
    else:
        vec["expected"]["o"].append(vec["expected"]["o"][0])   # a result that never comes
    t = _run(dut, vec)
    assert t["done"] and t["failed"] and not t["passed"], t
    assert t["line"].startswith(b"ELMOE3D pe FAIL bad="), t["line"]


@pytest.mark.slow
@pytest.mark.parametrize("board,ext", [("icebreaker", "bin"), ("ulx3s-85f", "bit")])
def test_board_bitstream(board, ext, tmp_path):
    """Both boards build a bitstream whose routed timing meets the board clock."""
    from elmoe3d.sim.boards import build_board
    r = build_board(board, tmp_path / board)
    assert r["bitstream"].endswith(f".{ext}") and r["bytes"] > 10000
    clocks = r["timing"]["clocks"]
    assert clocks and all(c["pass"] for c in clocks.values()), clocks

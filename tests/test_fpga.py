"""FPGA self-test designs: the wrappers in simulation (PASS on golden
vectors, FAIL on a corrupted ROM) and, under ``slow``, board bitstreams.

The PE's wrapper (``StreamSelfTest``) and the tile's (``TileSelfTest``: the
whole `tiny` tile, its LPDDR image behind an on-chip AXI4 read slave, a ROM
of host commands, the golden responses; what the ULX3S builds) run in
Amaranth's simulator. The tile's runs about 20,000 cycles to its verdict
(about 30 s each on this machine: Amaranth's simulator, no build), so its
PASS run and its two FAIL runs are three tests that xdist can spread."""

import dataclasses
import random
import time

import pytest
from amaranth.sim import Simulator

from elmoe3d.blocks import get_block
from elmoe3d.config import preset
from elmoe3d.sim.flow.selftest import StreamSelfTest, decode_uart, vectors_for

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


# -- the tile's self-test (what `elmoe3d fpga --board ulx3s-85f` builds) --------------------

TINY = preset("tiny")


@pytest.fixture(scope="module")
def scenario():
    """The board's scenario (an Elastic-SD round and an AR round, batch 2)."""
    from elmoe3d.sim.flow.tile_selftest import tile_scenario
    return tile_scenario(TINY)


@pytest.fixture(scope="module")
def short():
    """A shorter scenario for the planted faults: the dense load and one AR
    round at batch 1 (about a fifth of the board's cycles)."""
    from elmoe3d.sim.flow.tile_selftest import tile_scenario
    return tile_scenario(TINY, rounds=("AR",), batch=1)


def _run_tile(sc, *, timeout=40_000):
    """Simulate ``TileSelfTest`` on ``sc`` until its UART line is out (or
    ``timeout`` + a line's worth of cycles); the verdict, the line, cycles."""
    from elmoe3d.sim.flow.tile_selftest import TileSelfTest
    top = TileSelfTest(TINY, sc, uart_divisor=DIV, timeout=timeout)
    sim = Simulator(top)
    sim.add_clock(1e-6)
    line_cycles = 40 * 10 * DIV                   # a UART line of up to 40 characters
    t = {"tx": [], "done_at": None}

    async def bench(ctx):
        for cyc in range(timeout + line_cycles + 100):
            await ctx.tick()
            t["tx"].append(ctx.get(top.uart_tx))
            if t["done_at"] is None and ctx.get(top.done):
                t["done_at"] = cyc
            if t["done_at"] is not None and cyc > t["done_at"] + line_cycles:
                break
        t.update(passed=ctx.get(top.passed), failed=ctx.get(top.failed),
                 bad=ctx.get(top.mismatches))
    sim.add_testbench(bench)
    t0 = time.process_time()
    sim.run()
    t["cpu_s"] = round(time.process_time() - t0, 1)
    t["line"] = decode_uart(t.pop("tx"), DIV)
    return t


def test_tile_scenario_is_the_golden_decode(scenario):
    """The ROMs hold a dense load, an Elastic-SD round and an AR round at
    batch 2 (8 layer steps, 24 tokens) and every golden counter; LPDDR is
    the whole `tiny` window (16 experts and the dense image)."""
    from elmoe3d.golden import layout as gl
    sm = scenario.summary
    assert sm["rounds"] == ["SD", "AR"] and sm["layer_steps"] == 8 and sm["tokens"] == 24
    assert [len(w) for w, _ in scenario.responses.values()] == [24, sm["ctrl_responses"], 1]
    assert len(scenario.image) == gl.lpddr_layout(TINY).total_bytes
    assert scenario.trace_count == sm["events"] > 100
    assert scenario.checked == 24 + sm["ctrl_responses"] + 1 + sm["events"]


def test_tile_selftest_passes(scenario):
    """The tile, its LPDDR image and host script on chip: PASS, and the UART
    line counts every checked beat (responses and trace events)."""
    t = _run_tile(scenario)
    assert t["passed"] and not t["failed"] and t["bad"] == 0, t
    assert t["line"] == f"ELMOE3D tile PASS n={scenario.checked:04X}\r\n".encode(), t
    assert 10_000 < t["done_at"] < 30_000, t


def _corrupt(sc, where):
    """A copy of ``sc`` with one planted fault: ``expected``: a bit of the
    first layer output's ``y`` in the OUTPUT ROM; ``image``: bit 14 of
    layer 0's first output requantisation multiplier in the LPDDR image (the
    tile bench's ``plant_dense``); ``trace``: the trace signature's sum."""
    from elmoe3d.hw.tile import tile_response
    from elmoe3d.tb.tile_top_bench import plant_dense
    from amaranth.lib import data
    if where == "expected":
        words, masks = sc.responses["OUTPUT"]
        bit = data.Layout.cast(tile_response(TINY))["out"].offset + 3
        assert masks[0] >> bit & 1
        words = [words[0] ^ (1 << bit)] + words[1:]
        return dataclasses.replace(sc, responses=dict(sc.responses, OUTPUT=(words, masks)))
    if where == "image":
        mem = bytearray(sc.image)
        assert TINY.lpddr_base == 0
        plant_dense(TINY, mem, "out")
        assert mem != bytearray(sc.image)
        return dataclasses.replace(sc, image=bytes(mem))
    return dataclasses.replace(sc, trace_sum=sc.trace_sum + 1)


def test_tile_selftest_passes_short(short):
    """The shorter scenario of the planted-fault tests passes as it is."""
    t = _run_tile(short)
    assert t["passed"] and t["line"] == f"ELMOE3D tile PASS n={short.checked:04X}\r\n".encode(), t


@pytest.mark.parametrize("where", ["expected", "image", "trace"])
def test_tile_selftest_fails_on_a_planted_fault(short, where):
    """A wrong golden word, a corrupted LPDDR word or a wrong trace
    signature: FAIL, with the count of mismatched beats on the UART line
    (one for a single wrong expected word or signature)."""
    t = _run_tile(_corrupt(short, where))
    assert t["failed"] and not t["passed"], t
    assert t["line"].startswith(b"ELMOE3D tile FAIL bad="), t
    bad = int(t["line"].split(b"bad=")[1][:4], 16)
    assert bad == t["bad"] and (bad == 1 if where != "image" else bad >= 1), t


def test_axi_read_memory():
    """The on-chip LPDDR stand-in alone: bursts of 1-16 beats with random
    back-pressure return the image's words in order with RLAST on the last
    and the burst's id; a burst past the end answers DECERR, a narrow
    ``arsize`` SLVERR."""
    from elmoe3d.sim.flow.tile_selftest import AxiReadMemory
    r = random.Random(5)
    image = bytes(r.randrange(256) for _ in range(4 * 64))
    dut = AxiReadMemory(image, data_bits=32, addr_bits=16, id_bits=4, base=0x100)
    words = [int.from_bytes(image[i:i + 4], "little") for i in range(0, len(image), 4)]
    bursts = [(0x100 + 4 * a, n - 1, 2, i % 16, [(w, 0) for w in words[a:a + n]])
              for i, (a, n) in enumerate((r.randrange(48), r.randint(1, 16)) for _ in range(12))]
    bursts.append((0x100 + 4 * 62, 3, 2, 7, [(words[62], 0), (words[63], 0), (None, 3), (None, 3)]))
    bursts.append((0x100, 1, 1, 3, [(None, 2), (None, 2)]))
    got = []

    async def bench(ctx):
        for addr, ln, size, ident, want in bursts:
            ctx.set(dut.arvalid, 1)
            ctx.set(dut.araddr, addr)
            ctx.set(dut.arlen, ln)
            ctx.set(dut.arsize, size)
            ctx.set(dut.arburst, 1)
            ctx.set(dut.arid, ident)
            await ctx.tick().until(dut.arready)
            ctx.set(dut.arvalid, 0)
            beats = []
            while len(beats) < ln + 1:
                ready = r.random() < 0.6
                ctx.set(dut.rready, ready)
                await ctx.delay(1e-7)
                if ready and ctx.get(dut.rvalid):
                    beats.append((ctx.get(dut.rdata), ctx.get(dut.rresp), ctx.get(dut.rlast),
                                  ctx.get(dut.rid)))
                await ctx.tick()
            ctx.set(dut.rready, 0)
            got.append((want, ident, beats))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert len(got) == len(bursts)
    for want, ident, beats in got:
        assert [b[3] for b in beats] == [ident] * len(want)
        assert [b[2] for b in beats] == [0] * (len(want) - 1) + [1]
        for (w, resp), (d, rr, *_) in zip(want, beats):
            assert rr == resp and (w is None or d == w), (want, beats)


#: the end of a nextpnr-ecp5 log (the ULX3S tile build's, shortened)
_TIM = """Info: Max frequency for clock '$glbnet$clk': 76.66 MHz (PASS at 25.00 MHz)
Info: Critical path report for clock '$glbnet$clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  5.61  5.61 Source selftest.lpddr.ram.0.6.DOA8
Info:    routing  2.87  8.48 Net selftest.lpddr.ram.0.6_DOA8[0] (6,46) -> (4,71)
Info:      logic  0.24 12.07 Source selftest.tile.mem.ext.r_slice.o__payload_FF_Q_12_DI_LUT4_Z.F
Info:      setup  0.00 12.20 Source selftest.tile.mem.ext.r_slice.o__payload_FF_Q_12.DI
Info: 6.79 ns logic, 5.41 ns routing

Info: Critical path report for cross-domain path '<async>' -> '<async>':
Info: Max frequency for clock '$glbnet$clk': 81.94 MHz (PASS at 25.00 MHz)
Info: Device utilisation:
Info:             DP16KD:      31/    208    14%
Info:       TRELLIS_COMB:   21427/  83640    25%
"""


def test_timing_summary_reads_the_routed_figures(tmp_path):
    """The summary takes the last (routed) Fmax line, the critical path's
    start and end, its logic / routing split, and the utilisation."""
    from elmoe3d.sim.flow.boards import timing_summary
    (tmp_path / "top.tim").write_text(_TIM)
    t = timing_summary(tmp_path)
    c = t["clocks"]["$glbnet$clk"]
    assert c["fmax_mhz"] == 81.94 and c["target_mhz"] == 25.0 and c["pass"]
    assert c["critical_path"] == {"from": "selftest.lpddr.ram.0.6.DOA8",
                                  "to": "selftest.tile.mem.ext.r_slice.o__payload_FF_Q_12.DI",
                                  "logic_ns": 6.79, "routing_ns": 5.41}
    assert t["utilization"] == {"DP16KD": (31, 208), "TRELLIS_COMB": (21427, 83640)}


@pytest.mark.slow
@pytest.mark.parametrize("board,ext,design", [("icebreaker", "bin", "pe"),
                                              ("ulx3s-85f", "bit", "tile")])
def test_board_bitstream(board, ext, design, tmp_path):
    """Both boards build a bitstream whose routed timing meets the board
    clock: the PE's self-test on the iCEBreaker, the tile's on the ULX3S
    (about 6 minutes wall on the shared machine)."""
    from elmoe3d.sim.flow.boards import build_board
    r = build_board(board, tmp_path / board)
    assert r["block"] == design
    assert r["bitstream"].endswith(f".{ext}") and r["bytes"] > 10000
    clocks = r["timing"]["clocks"]
    assert clocks and all(c["pass"] for c in clocks.values()), clocks
    assert all("from" in c["critical_path"] for c in clocks.values()), clocks
    if design == "tile":
        assert r["expected"]["OUTPUT"] == 24 and r["scenario"]["layer_steps"] == 8
        util = r["timing"]["utilization"]
        assert 0 < util["DP16KD"][0] <= util["DP16KD"][1], util

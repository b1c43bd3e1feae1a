"""The synthesis flow: targets from constraints/, every path timed through
the I/O-register wrapper, median Fmax over seeds, iCE40 fit checks, caching."""

import json

import pytest
from amaranth.hdl import Module, Signal, signed
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from elmoe3d.blocks import blocks, get_block
from elmoe3d.config import preset
from elmoe3d.sim.flow import synth as fl
from elmoe3d.sim.run.harness import write_verilog

pytestmark = pytest.mark.synth


class CombMul(wiring.Component):
    """No register at all: an OOC run of it bare times nothing."""
    a: In(signed(12))
    b: In(signed(12))
    y: Out(signed(24))

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.y.eq(self.a * self.b)
        return m


def test_targets_come_from_constraints():
    want = {"pe": 200, "pe_plain": 200, "mac_int8": 200, "bitfusion": 125, "tag_unit": 125,
            "hb_bank": 125, "ext_stream": 125, "moe_layer": 125, "tile": 125}
    for name, mhz in want.items():
        got, src = fl.target_mhz("ecp5", name)
        assert got == mhz and src.endswith(f"blocks.{name}")
    # a block nobody named gets the file's default, and says so
    got, src = fl.target_mhz("ecp5", "some_future_block")
    assert got == fl.load_target("ecp5")["default_mhz"] and src.endswith("default_mhz")
    for name in blocks():                        # every registered block has a target
        assert fl.target_mhz("ecp5", name)[0] > 0 and fl.target_mhz("ice40", name)[0] > 0
    with pytest.raises(ValueError, match="Target must be one of"):
        fl.load_target("virtex")


def test_placer_comes_from_constraints(monkeypatch):
    """nextpnr's placer is data of the constraints file: the MoE layer's own,
    every other block (and every other target) nextpnr's default, and a
    placer nextpnr does not have is refused, naming it."""
    assert fl.target_placer("ecp5", "moe_layer") == "static"
    for name in blocks():
        if name != "moe_layer":
            assert fl.target_placer("ecp5", name) == "heap", name
        assert fl.target_placer("ice40", name) == "heap"
    real = fl.load_target
    monkeypatch.setattr(fl, "load_target", lambda t: {**real(t), "placer": {
        "default": "heap", "blocks": {"pe": "quantum"}}})
    with pytest.raises(ValueError, match="'quantum'"):
        fl.target_placer("ecp5", "pe")


def test_wrapper_times_every_path(tmp_path):
    """Bare, a purely combinational block has no register-to-register path
    and nextpnr reports no Fmax; wrapped, the multiplier is timed between
    the wrapper's registers."""
    bare = write_verilog(CombMul(), "combmul", tmp_path / "bare" / "combmul.v")
    with pytest.raises(fl.SynthError, match="no Fmax"):
        fl.place_and_route(bare, "combmul", tmp_path / "bare", "ecp5", mhz=200, seed=1)
    w = write_verilog(fl.IORegistered(CombMul()), "combmul_ooc", tmp_path / "w" / "combmul_ooc.v")
    r = fl.place_and_route(w, "combmul_ooc", tmp_path / "w", "ecp5", mhz=200, seed=1)
    assert 10 < r["fmax_mhz"] < 400
    cp = r["critical_path"]
    # from an input register of the wrapper to its output register (the port)
    assert cp["start"] in ("ooc_a", "ooc_b") and cp["end"] == "y", cp
    assert cp["logic_levels"] > 2
    # the SDF analysis redoes nextpnr's: the same worst path, to the
    # picosecond, and at 200 MHz the endpoints behind it miss it
    ms = r["misses"]
    assert ms["fmax_mhz"] == pytest.approx(r["fmax_mhz"], abs=0.01)
    assert (ms["failing"] > 0) == (r["fmax_mhz"] < 200)
    if ms["failing"]:
        g = ms["groups"][0]
        assert g["start"] in ("ooc_a", "ooc_b") and g["end"].startswith("y"), g


def test_tiny_pe_on_every_target(tmp_path):
    b = get_block("pe")
    r = fl.synth_block(b.build(preset("tiny")), b.top, tmp_path, name="pe",
                       targets=("generic", "ecp5"), seeds=[1, 2, 3])
    # iCE40 with one seed: nextpnr-ice40 is the slow one
    r["ice40"] = fl.fpga_target(b.build(preset("tiny")), "pe", b.top, tmp_path, "ice40", seeds=[1])
    assert r["cells"] > 100 and r["flip_flops"] > 10 and r["logic_depth"] > 5
    assert sum(r["cells_by_type"].values()) == r["cells"]
    e = r["ecp5"]
    assert e["lut4"] > 0 and e["dsp"] == 0
    # the same flip-flops, except memory bits: the generic flow maps the PE's
    # result FIFO to flip-flops, ECP5 to distributed RAM (TRELLIS_DPR16X4,
    # 16 x 4 bits each; tiny PE: 838 generic FFs = 538 FFs + 7 DPR16X4)
    if e["dist_ram"] == 0:
        assert e["ff"] == r["flip_flops"]
    else:
        assert e["ff"] < r["flip_flops"] <= e["ff"] + 64 * e["dist_ram"]
    assert e["target_mhz"] == 200 and "ecp5-85f.json" in e["target_from"]
    assert len(e["fmax_seeds"]) == 3 and e["fmax_mhz"] == sorted(e["fmax_seeds"])[1]
    assert e["meets_target"] == (e["fmax_mhz"] >= 200)
    assert e["critical_path"]["start"] and e["critical_path"]["end"]
    assert e["pnr_utilization"]["TRELLIS_FF"] > e["ff"]      # the wrapper's registers
    assert (tmp_path / "ecp5_seed3_nextpnr.log").exists()
    # the routed figure, not the placement estimate: the last Fmax line of the log
    for s in (1, 2, 3):
        run = json.loads((tmp_path / f"ecp5_pnr_seed{s}.json").read_text())["result"]
        assert run["routed_log_mhz"] == pytest.approx(run["fmax_mhz"], abs=0.01)
    i = r["ice40"]
    assert i["fits"] and 5 < i["fmax_mhz"] < 300 and i["wrapper"] == "ScanWrapped"
    assert i["target_mhz"] == fl.target_mhz("ice40", "pe")[0]


def test_results_are_cached_by_verilog_hash(tmp_path):
    b = get_block("pe")
    comp = b.build(preset("tiny"))
    fl.synth_block(comp, b.top, tmp_path, name="pe", targets=("generic", "ecp5"), seeds=[1])
    stamp = (tmp_path / "ecp5_seed1_nextpnr.log").stat().st_mtime_ns
    again = fl.synth_block(b.build(preset("tiny")), b.top, tmp_path, name="pe",
                           targets=("generic", "ecp5"), seeds=[1])
    assert (tmp_path / "ecp5_seed1_nextpnr.log").stat().st_mtime_ns == stamp
    assert again["ecp5"]["fmax_seeds"]
    # a different RTL is synthesised again
    fl.synth_block(b.factory(**{**b.params(preset("tiny")), "lanes": 2}), b.top, tmp_path, name="pe",
                   targets=("generic", "ecp5"), seeds=[1])
    assert (tmp_path / "ecp5_seed1_nextpnr.log").stat().st_mtime_ns != stamp


def test_an_interrupted_netlist_is_made_again(tmp_path, monkeypatch):
    """A mapped netlist left without its stamp (a run stopped between Yosys
    and the stamp) is made again, neither a crash nor a cache hit; with its
    stamp it is reused."""
    v = tmp_path / "top.v"
    v.write_text("module top; endmodule\n")
    (tmp_path / "top_ecp5.json").write_text("half written")
    calls = []

    def fake_run(cmd, cwd, log):
        calls.append(cmd)
        (tmp_path / "top_ecp5.json").write_text("{}")
    monkeypatch.setattr(fl, "_run", fake_run)
    monkeypatch.setattr(fl, "pack_ebr_outreg", lambda path: 0)
    fl.pnr_netlist(v, "top", tmp_path, "ecp5")
    assert len(calls) == 1 and (tmp_path / "top_ecp5.json").read_text() == "{}"
    fl.pnr_netlist(v, "top", tmp_path, "ecp5")
    assert len(calls) == 1


def test_memory_still_maps_to_block_ram(tmp_path):
    """The wrapper sits at the ports: hb_bank's SRAM is EBR on ECP5, both in
    the block's area and in the wrapped netlist that nextpnr places (the
    DP16KD cells of that netlist are counted; nextpnr itself is not run,
    it would take most of this test's time)."""
    b = get_block("hb_bank")
    comp = b.build(preset("tiny"))
    r = fl.fpga_target(comp, "hb_bank", b.top, tmp_path, "ecp5", pnr=False)
    assert r["ebr"] > 0
    wtop = f"{b.top}_ooc"
    wfile = fl._write(fl.IORegistered(comp), wtop, tmp_path / f"{wtop}.v")
    path = fl.pnr_netlist(wfile, wtop, tmp_path, "ecp5")
    net = json.loads(path.read_text())
    cells = [c for mod in net["modules"].values() for c in mod.get("cells", {}).values()]
    ebr = [c for c in cells if c["type"] == "DP16KD"]
    assert len(ebr) == r["ebr"]
    # hb_bank registers every RAM output right behind the RAM (ram_q): the
    # flow packs that flip-flop into the port's output register
    outreg = sum(c["parameters"].get(f"REGMODE_{x}") == "OUTREG" for c in ebr for x in "AB")
    assert outreg == int((tmp_path / f"{path.name}.packed").read_text()) > 0


def _ff(clk, d, q, **par):
    p = {"CEMUX": "1", "CLKMUX": "CLK"}
    p.update(par)
    return {"type": "TRELLIS_FF", "parameters": p, "port_directions": {
        "CLK": "input", "DI": "input", "LSR": "input", "Q": "output"},
        "connections": {"CLK": [clk], "DI": [d], "LSR": ["0"], "Q": [q]}}


def test_pack_ebr_outreg_rules(tmp_path):
    """A DP16KD port's data outputs are packed into its output register only
    when each drives exactly one flip-flop on the same clock, with no clock
    enable, no set/reset and the port's own reset tied low; otherwise the
    netlist is left as it was."""
    def netlist(**ff_par):
        ram = {"type": "DP16KD", "parameters": {"REGMODE_A": "NOREG", "REGMODE_B": "NOREG"},
               "port_directions": {"CLKA": "input", "DOA0": "output", "DOA1": "output",
                                   "RSTA": "input"},
               "connections": {"CLKA": [2], "DOA0": [10], "DOA1": [11], "RSTA": ["0"]}}
        cells = {"ram": ram, "f0": _ff(2, 10, 20), "f1": _ff(2, 11, 21, **ff_par)}
        return {"modules": {"top": {"ports": {"q": {"direction": "output", "bits": [20, 21]}},
                                    "cells": cells}}}

    def packed(d):
        f = tmp_path / "n.json"
        f.write_text(json.dumps(d))
        n = fl.pack_ebr_outreg(f)
        return n, json.loads(f.read_text())["modules"]["top"]["cells"]

    n, cells = packed(netlist())
    assert n == 1 and set(cells) == {"ram"}
    assert cells["ram"]["parameters"]["REGMODE_A"] == "OUTREG"
    assert cells["ram"]["connections"]["DOA0"] == [20] and cells["ram"]["connections"]["DOA1"] == [21]
    for bad in ({"CEMUX": "CE"}, {"CLKMUX": "INV"}, {"REGSET": "SET"}):
        n, cells = packed(netlist(**bad))
        assert n == 0 and set(cells) == {"ram", "f0", "f1"}
        assert cells["ram"]["parameters"]["REGMODE_A"] == "NOREG"
    d = netlist()
    d["modules"]["top"]["cells"]["f1"]["connections"]["LSR"] = [5]        # a reset
    assert packed(d)[0] == 0
    d = netlist()
    d["modules"]["top"]["cells"]["f1"]["connections"]["CLK"] = [3]        # another clock
    assert packed(d)[0] == 0
    d = netlist()
    d["modules"]["top"]["cells"]["ram"]["connections"]["RSTA"] = [7]      # the port's reset used
    assert packed(d)[0] == 0
    d = netlist()
    d["modules"]["top"]["cells"]["g"] = _ff(2, 10, 30)                    # DOA0 drives two loads
    assert packed(d)[0] == 0


def test_too_big_for_ice40_is_reported(tmp_path):
    """The INT8 MAC at 32 lanes: its 4,772 LUT4s are under the UP5K's 5,280,
    but packed with its flip-flops and carries, and the scan wrapper's port
    registers, it needs 5,961 logic cells; nextpnr fails, and the flow reports
    that it does not fit (before this test: fits = True and "place and route
    failed")."""
    b = get_block("mac_int8")
    cfg = preset("default").replace(lanes=32, axi_data_bits=128)     # one 128-bit slice vector
    r = fl.fpga_target(b.build(cfg), "mac_int8", b.top,
                       tmp_path, "ice40", seeds=[1])
    assert r["lut4"] <= 5280
    assert not r["fits"] and "does not fit iCE40UP5K after packing, with the ScanWrapped" in r["fit_reason"]
    assert "ICESTORM_LC > 5280" in r["fit_reason"] and "fmax_mhz" not in r


def test_capacity_check_names_the_resource():
    """The cell-count check (before place and route) names each resource over."""
    c = fl.load_target("ice40")
    r = fl._fit({"lut4": 6000, "ff": 10, "ebr": 31, "dsp": 0}, c)
    assert not r["fits"]
    assert r["fit_reason"] == "does not fit iCE40UP5K: 6000 LUT4 > 5280, 31 EBR > 30"
    assert fl._fit({"lut4": 5280, "ff": 5280, "ebr": 30, "dsp": 8}, c)["fits"]


def test_area_grows_with_lanes(tmp_path):
    """The PE's area has a fixed part (control, result FIFO, accumulator) and
    a per-lane part (multipliers, adder tree): 4 more lanes add cells, and 8
    more lanes add about twice as many (tiny: 2672, 3895, 6586 cells at 4, 8,
    16 lanes; increments 1223 and 2691)."""
    b = get_block("pe")
    p = b.params(preset("tiny"))
    c = {L: fl.synth_block(b.factory(**{**p, "lanes": L}), b.top, tmp_path / f"L{L}")["cells"]
         for L in (4, 8, 16)}
    d1, d2 = c[8] - c[4], c[16] - c[8]
    assert d1 > 0 and 1.6 < d2 / d1 < 2.6, c


@pytest.mark.cli
def test_no_generic_skips_the_generic_run(tmp_path, capsys):
    """`--no-generic`: FPGA figures only, no generic Yosys run (its cache file
    is not written), the same ECP5 area as with it."""
    from elmoe3d.cli import main
    out = tmp_path / "r.json"
    argv = ["synth", "--preset", "tiny", "--blocks", "mac_int8", "--target", "ecp5", "--no-pnr",
            "--workdir", str(tmp_path / "w")]
    assert main(argv + ["--no-generic", "--json", str(out)]) == 0
    assert "generic synthesis skipped" in capsys.readouterr().out
    r = json.loads(out.read_text())["blocks"]["mac_int8"]
    assert "cells" not in r and r["ecp5"]["lut4"] > 0
    assert not (tmp_path / "w" / "mac_int8" / "generic.json").exists()
    assert main(argv + ["--json", str(out)]) == 0
    full = json.loads(out.read_text())["blocks"]["mac_int8"]
    assert full["cells"] > 0 and full["ecp5"]["lut4"] == r["ecp5"]["lut4"]


@pytest.mark.cli
@pytest.mark.parametrize("argv,msg", [
    (["synth", "--no-generic"], "--no-generic needs an FPGA target"),
    (["synth", "--no-generic", "--fmax", "--sweep"], "--no-generic cannot be combined"),
    (["synth", "--target", "virtex"], "unknown target 'virtex'"),
    (["synth", "--seeds", "a"], "--seeds needs comma-separated integers"),
    (["synth", "--sweep-only", "tag_slots=16"], "--sweep-only needs --sweep"),
    (["synth", "--sweep", "--sweep-only", "slots=16"], "--sweep-only: unknown Config field 'slots'"),
    (["synth", "--sweep", "--sweep-only", "lanes=x"], "--sweep-only lanes: expected integers"),
    (["synth", "--tool-timeout", "1h"], "--tool-timeout needs a number of seconds, not '1h'"),
    (["synth", "--tool-timeout", "-5"], "--tool-timeout needs a finite number of seconds >= 0"),
    (["fpga", "--board", "nope"], "invalid choice: 'nope'"),
    (["sweep", "--set", "lanes"], "--set needs KEY=V1,V2"),
    (["sweep", "--blocks", "nope"], "Unknown block 'nope'"),
])
def test_cli_errors_are_one_line(argv, msg, capsys):
    from elmoe3d.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err


@pytest.mark.cli
@pytest.mark.parametrize("argv,limit", [([], 3600), (["--tool-timeout", "0"], 0),
                                        (["--tool-timeout", "7200"], 7200)])
def test_tool_timeout_reaches_the_flow(argv, limit, monkeypatch, capsys):
    """`--tool-timeout SECONDS` sets the limit every Yosys / nextpnr call of
    the run gets (0: none, for the whole tile's place and route); without it
    the flow keeps its one-hour default."""
    from elmoe3d.cli import main
    from elmoe3d.commands import synth as cmd
    monkeypatch.setattr(fl, "TOOL_TIMEOUT_S", 3600)
    seen = []
    monkeypatch.setattr(cmd, "run_synth", lambda *a, **k: seen.append(fl.TOOL_TIMEOUT_S) or {})
    assert main(["synth", "--blocks", "pe", "--fmax", *argv]) == 0
    assert seen == [limit]


def test_tool_run_logs_live_and_stops_at_the_timeout(tmp_path):
    """A tool's stderr is in its log while it runs (a long nextpnr run can be
    followed); a finished run's log is stdout + stderr; a run over the limit
    is stopped and reported as a SynthError that names the limit."""
    import sys
    log = tmp_path / "t.log"
    py = [sys.executable, "-c"]
    out = fl._run(py + ["import sys; print('out'); print('err', file=sys.stderr)"], tmp_path, log)
    assert out == "out\n" and log.read_text() == "out\nerr\n"
    with pytest.raises(fl.SynthError, match=r"took longer than 1 s \(--tool-timeout\)"):
        fl._run(py + ["import sys, time; print('placing', file=sys.stderr, flush=True); "
                      "time.sleep(60)"], tmp_path, log, timeout=1)
    assert log.read_text().startswith("placing\n") and "stopped after 1 s" in log.read_text()


def test_sweep_only_keeps_the_listed_points(tmp_path, monkeypatch):
    """`--sweep-only tag_slots=16,32` sweeps the tag unit at 16 and 32 slots
    only (its 64- and 128-slot points take long to place); a field the
    block's sweep does not vary leaves the sweep whole."""
    from elmoe3d.sim.flow.scaling import run_sweeps
    monkeypatch.setattr(fl, "synth_block", lambda *a, **k: {"cells": 1, "logic_depth": 1})
    cfg = preset("default")

    def slots(only):
        pts = run_sweeps(cfg, ["tag_unit"], tmp_path, only=only)["tag_unit"]
        return [p["overrides"]["tag_slots"] for p in pts]
    assert slots({"tag_slots": [16, 32]}) == [16, 32]
    whole = slots(None)
    assert {16, 32, 64, 128} <= set(whole) and slots({"lanes": [8]}) == whole


def test_sweep_on_request_and_own_folder(tmp_path, monkeypatch):
    """The MoE layer's batch-size sweep (``T`` = 16, 80) runs only when the
    caller sets no ``max_cells`` cap (``elmoe3d synth --sweep``; ``make demo``
    passes one and gets the reason instead); a point at the block's own
    parameters (``T`` = 80 under ``default``, the tag unit at 16 slots) is
    synthesised in the block's own folder, so its caches serve it."""
    from elmoe3d.sim.flow.scaling import ON_REQUEST, run_sweeps
    seen = {}

    def fake(comp, top, wd, **k):
        seen[wd.name] = wd
        return {"cells": 1, "logic_depth": 1}
    monkeypatch.setattr(fl, "synth_block", fake)
    cfg = preset("default")
    demo = run_sweeps(cfg, ["moe_layer"], tmp_path, max_cells=30000)["moe_layer"]
    assert [p["overrides"] for p in demo] == [{"batch_tokens": 16}, {"batch_tokens": 80}]
    assert all(ON_REQUEST["moe_layer"] in p["error"] for p in demo) and not seen
    pts = run_sweeps(cfg, ["moe_layer"], tmp_path)["moe_layer"]
    assert [p["overrides"]["batch_tokens"] for p in pts] == [16, 80]
    assert sorted(seen) == ["moe_layer", "moe_layer-batch_tokens16"]
    seen.clear()
    run_sweeps(cfg, ["tag_unit"], tmp_path, only={"tag_slots": [16, 32]})
    assert sorted(seen) == ["tag_unit", "tag_unit-tag_slots32"]


class AndTree(wiring.Component):
    """A registered ``n``-input AND: its least LUT4 depth is ceil(log4 n).
    ``into``: the AND ends at a flip-flop (``"ff"``), or is the write data
    of a 16-entry memory with an asynchronous read (``"lutram"``: a
    distributed RAM on ECP5) or of a 1024-entry one with a synchronous read
    (``"bram"``: a block RAM)."""

    def __init__(self, n, into="ff"):
        self.n, self.into = n, into
        super().__init__({"a": In(n), "y": Out(1)})

    def elaborate(self, platform):
        m = Module()
        a = Signal(self.n)
        m.d.sync += a.eq(self.a)
        if self.into == "ff":
            m.d.sync += self.y.eq(a.all())
            return m
        lut = self.into == "lutram"
        mem = m.submodules.mem = memory.Memory(shape=1, depth=16 if lut else 1024, init=[])
        wp, rp = mem.write_port(), mem.read_port(domain="comb" if lut else "sync")
        addr = Signal(range(mem.depth))
        m.d.sync += addr.eq(addr + 1)
        m.d.comb += [wp.addr.eq(addr), wp.en.eq(1), wp.data.eq(a.all()),
                     rp.addr.eq(~addr), self.y.eq(rp.data)]
        return m


@pytest.mark.parametrize("n, depth", [(4, 1), (16, 2), (17, 3)])
def test_logic_depth_counts_lut_levels(tmp_path, n, depth, capsys):
    """`sim/flow/logic_depth.py` on a real mapped netlist: a registered AND of
    ``n`` inputs is ``depth`` LUT4 levels deep (one more input than 16 needs
    a third level), and the CLI names that depth and the path to it."""
    from elmoe3d.sim.flow import logic_depth as ld
    wfile = fl._write(fl.IORegistered(AndTree(n)), "andtree_ooc", tmp_path / "andtree_ooc.v")
    path = fl.pnr_netlist(wfile, "andtree_ooc", tmp_path, "ecp5")
    nl = ld.Netlist(json.loads(path.read_text()))
    assert max(e[0] for e in nl.endpoints()) == depth
    assert ld.main([str(path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert f"components at the deepest level ({depth})" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("    ")]) == depth + 1


@pytest.mark.parametrize("into, cell", [("lutram", "TRELLIS_DPR16X4"), ("bram", "DP16KD")])
def test_logic_depth_ends_at_memory_writes(tmp_path, into, cell):
    """A memory's write data is a timing endpoint (round 11's worst paths
    ended at a block RAM's and a distributed RAM's write data): a 17-input
    AND written into a memory is 3 levels deep at the memory's input."""
    from elmoe3d.sim.flow import logic_depth as ld
    wfile = fl._write(fl.IORegistered(AndTree(17, into)), "andmem_ooc", tmp_path / "andmem_ooc.v")
    nl = ld.Netlist(json.loads(fl.pnr_netlist(wfile, "andmem_ooc", tmp_path, "ecp5").read_text()))
    at_mem = [e[0] for e in nl.endpoints() if nl.cells[e[1]]["type"] == cell]
    assert at_mem and max(at_mem) == 3


def test_logic_depth_rejects_what_is_not_a_mapped_netlist(tmp_path, capsys):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"modules": {"top": {"cells": {}}}}))
    from elmoe3d.sim.flow import logic_depth as ld
    with pytest.raises(SystemExit) as e:
        ld.main([str(f)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("no module with TRELLIS_FF cells: not a mapped ECP5 netlist")


def test_fpga_table_names_a_placer_other_than_heap():
    from elmoe3d.commands.synth import fpga_table
    t = {"lut4": 1, "ff": 1, "ebr": 0, "dsp": 0, "target_mhz": 125, "fmax_mhz": 130.0,
         "fmax_seeds": [130.0], "seeds": [1], "meets_target": True, "device": "LFE5U-85F"}
    _, rows, notes = fpga_table({"a": {"ecp5": {**t, "placer": "heap"}},
                                 "b": {"ecp5": {**t, "placer": "static"}}}, "ecp5")
    assert len(rows) == 2 and notes == [
        "b: placed with nextpnr's `--placer static` (the constraints file's `placer`; "
        "every other block: heap)"]
    _, _, notes = fpga_table({"c": {"ecp5": {**t, "router_args": ["--tmg-ripup"]}}}, "ecp5")
    assert notes == ["c: routed with nextpnr's `--tmg-ripup` (the constraints file's `router`)"]


def test_router_options_come_from_constraints(monkeypatch):
    """nextpnr's router options are data of the constraints file: the MoE
    layer's own (timing-driven rip-up), none for every other block and
    target; an option outside the accepted list is refused, naming it."""
    assert fl.target_router_args("ecp5", "moe_layer") == ["--tmg-ripup"]
    for name in blocks():
        if name != "moe_layer":
            assert fl.target_router_args("ecp5", name) == [], name
        assert fl.target_router_args("ice40", name) == []
    real = fl.load_target
    monkeypatch.setattr(fl, "load_target", lambda t: {**real(t), "router": {
        "blocks": {"pe": ["--placer", "sa"]}}})
    with pytest.raises(ValueError, match=r"'--placer', 'sa'"):
        fl.target_router_args("ecp5", "pe")


#: a hand-written SDF in nextpnr's dialect: ff_a -> (1.0 ns) -> a LUT ->
#: (2.0 ns) -> ff_b, a constant driving the LUT's other input over 5 ns
#: (never timed), and ff_c -> (0.1 ns) -> ff_d inside another component
_SDF_HEAD = r"""(DELAYFILE
  (SDFVERSION "3.0")
  (CELL
    (CELLTYPE "top")
    (INSTANCE )
    (DELAY
      (ABSOLUTE
        (INTERCONNECT dut.p.ff_a/Q dut.q.lut/A (900:950:1000) (900:950:1000))
        (INTERCONNECT \$PACKER_GND/F dut.q.lut/B (0:0:5000) (0:0:5000))
        (INTERCONNECT dut.q.lut/F dut.q.ff_b/DI (1800:1900:2000) (1800:1900:2000))
        (INTERCONNECT dut.r.ff_c/Q dut.r.ff_d/DI (90:95:100) (90:95:100))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_COMB")
    (INSTANCE dut.q.lut)
    (DELAY (ABSOLUTE
        (IOPATH A F (200:218:236) (200:218:236))
        (IOPATH B F (200:218:236) (200:218:236))
    ))
  )
"""
_SDF_FF = """  (CELL
    (CELLTYPE "TRELLIS_FF")
    (INSTANCE {ff})
    (DELAY (ABSOLUTE (IOPATH CLK Q (430:477:525) (430:477:525))))
    (TIMINGCHECK
      (SETUPHOLD (posedge DI) (posedge CLK) (0:0:{setup}) (267:285:303))
    )
  )
"""
_SDF = _SDF_HEAD + "".join(_SDF_FF.format(ff=ff, setup=su) for ff, su in (
    ("dut.p.ff_a", 0), ("dut.q.ff_b", 10), ("dut.r.ff_c", 0), ("dut.r.ff_d", 0))) + ")\n"


def test_sta_times_every_endpoint_of_an_sdf(tmp_path, capsys):
    """`sim/flow/sta.py` on a hand-written SDF: arrival = clock-to-Q + every arc
    + setup; a constant driver starts no path; the endpoints that miss the
    period are grouped by (start, end) component, with the path."""
    from elmoe3d.sim.flow import sta
    t = sta.load(_SDF)
    # 525 + 1000 + 236 + 2000 + 10 (setup); not 5000 + 236 + ... from the constant
    assert {p: a for a, p in t.endpoints()} == {"dut.q.ff_b/DI": 3771, "dut.r.ff_d/DI": 625}
    assert t.path("dut.q.ff_b/DI") == ["dut.p.ff_a/Q", "dut.q.lut/A", "dut.q.lut/F",
                                       "dut.q.ff_b/DI"]
    s = sta.summary(t, 3.0)
    assert (s["worst_ns"], s["fmax_mhz"], s["failing"]) == (3.771, 265.18, 1)
    assert s["groups"] == [{"start": "dut.p", "end": "dut.q", "endpoints": 1, "worst_ns": 3.771,
                            "levels": 1, "route_ns": 3.0, "from": "dut.p.ff_a/Q",
                            "to": "dut.q.ff_b/DI"}]
    assert sta.summary(t, 4.0)["failing"] == 0
    f = tmp_path / "x.sdf"
    f.write_text(_SDF)
    assert sta.main([str(f), "--period", "3", "--paths", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 endpoints; worst 3.771 ns (265.18 MHz); 1 miss 3 ns"
    assert out[-1].split() == ["3.761", "dut.q.ff_b/DI"]      # arrival (setup not added)


@pytest.mark.parametrize("argv, msg", [(["nope.sdf"], "nope.sdf: No such file or directory"),
                                       (["x.sdf", "--period", "0"], "--period must be > 0, not 0.0"),
                                       (["empty.sdf"], "no timed endpoint (not an SDF of a clocked design?)")])
def test_sta_errors_are_one_line(tmp_path, monkeypatch, argv, msg, capsys):
    from elmoe3d.sim.flow import sta
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.sdf").write_text(_SDF)
    (tmp_path / "empty.sdf").write_text("(DELAYFILE )")
    with pytest.raises(SystemExit) as e:
        sta.main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(msg)

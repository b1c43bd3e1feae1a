"""The elmoe3d command line: outputs, and one-line errors for bad input."""

import json
import subprocess
import sys

import pytest

from elmoe3d.cli import main

pytestmark = pytest.mark.cli


def run_cli(*args):
    r = subprocess.run([sys.executable, "-m", "elmoe3d.cli", *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("args,needle", [
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["verilog"], "the following arguments are required: --out"),
    (["verilog", "--out", "x", "--preset", "huge"], "Unknown configuration preset 'huge'"),
    (["verilog", "--out", "x", "--set", "lanes=zero"], "--set lanes: expected an integer, not 'zero'"),
    (["verilog", "--out", "x", "--set", "bogus=1"], "unknown Config field 'bogus'"),
    (["verilog", "--out", "x", "--set", "slice_bits=3"], "Slice width must be 1, 2 or 4, not 3"),
    (["synth", "--blocks", "nope"], "Unknown block 'nope'"),
    (["quant", "--seed", "x"], "invalid int value: 'x'"),
])
def test_bad_arguments_one_line(args, needle, tmp_path):
    code, out, err = run_cli(*args)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("elmoe3d: error:") and needle in lines[0], err
    assert "Traceback" not in err


def test_verilog_one_file_per_block(tmp_path):
    assert main(["verilog", "--out", str(tmp_path), "--preset", "tiny",
                 "--blocks", "pe,pe_plain,mac_int8"]) == 0
    files = sorted(p.name for p in tmp_path.glob("*.v"))
    assert files == ["elmoe3d_mac_int8.v", "elmoe3d_pe.v", "elmoe3d_pe_plain.v"]
    for f in tmp_path.glob("*.v"):
        assert f"module {f.stem}(" in f.read_text()


def test_quant_json_properties(tmp_path):
    out = tmp_path / "q.json"
    assert main(["quant", "--json", str(out), "--no-real"]) == 0
    study = json.loads(out.read_text())
    rows = study["results"]["int8_all_256"]
    for r in rows:
        if r["k"] * r["s"] == 8:                      # full precision: exact
            assert r["max_abs"] == 0 and r["bias"] == 0
        elif r["scheme"] == "augmented":
            assert abs(r["bias"]) <= 0.5
            assert r["max_abs"] <= r["half_dropped_range"]
        elif r["scheme"] == "truncate":
            assert r["bias"] <= -0.5 * (2 ** r["dropped_bits"] - 1) + 1e-9
    # Augmented bias is +1/2 whatever is dropped (the true midpoint 2^(d-1) - 1/2
    # is not an integer); truncation's is -(2^d - 1)/2.
    for d in ("gaussian", "laplacian"):
        for r in study["results"][d]:
            if r["scheme"] == "augmented" and r["k"] * r["s"] < 8:
                assert r["max_abs"] <= r["half_dropped_range"]
                # for non-uniform low bits (big drops of peaked data) the bias
                # moves off +1/2 but stays a small fraction of the dropped range
                assert abs(r["bias"]) <= max(0.55, 0.05 * 2 ** r["dropped_bits"])
                t = next(x for x in study["results"][d] if x["s"] == r["s"] and x["k"] == r["k"]
                         and x["scheme"] == "truncate")
                assert t["bias"] <= -0.9 * (2 ** r["dropped_bits"] - 1) / 2
                if r["dropped_bits"] >= 2:
                    assert abs(r["bias"]) < abs(t["bias"]) / 2
                    assert r["matvec_rel_err"] < t["matvec_rel_err"]


@pytest.mark.synth
def test_synth_json_lists_pe_and_baselines(tmp_path):
    out = tmp_path / "s.json"
    assert main(["synth", "--json", str(out), "--blocks", "pe,pe_plain,mac_int8",
                 "--workdir", str(tmp_path / "w")]) == 0
    res = json.loads(out.read_text())["blocks"]
    assert set(res) == {"pe", "pe_plain", "mac_int8"}
    for r in res.values():
        assert r["cells"] > 0 and r["transistors"] > 0 and r["logic_depth"] > 0
    ratio = res["pe"]["augmented_vs_plain"]["cells"]
    assert 1.0 <= ratio < 1.05          # augmentation costs (almost) nothing
    assert res["pe_plain"]["baseline_of"] == "pe"

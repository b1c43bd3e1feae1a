"""Recorded synthesis results (``sim/data/synth``): keys, reuse, resynthesis,
the catalogue and its freshness against the committed Verilog."""

import json

import pytest

from elmoe3d.sim.flow import records
from elmoe3d.sim.flow.synth import _cached, load_target

pytestmark = pytest.mark.synth


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty record folder in place of the shipped one."""
    d = tmp_path / "records"
    d.mkdir()
    monkeypatch.setattr(records, "RECORD_DIR", d)
    monkeypatch.setattr(records, "CATALOGUE", d / "blocks.json")
    monkeypatch.setattr(records, "_INDEX", None)
    monkeypatch.setattr(records, "_BY_SHA", None)
    monkeypatch.setitem(records.settings, "into", None)
    monkeypatch.setitem(records.settings, "resynth", False)
    return d


def _pnr_key(c, sha="ab" * 32):
    return {"verilog_sha256": sha, "mhz": 125.0, "seed": 1, "target": c, "flow": "x"}


def test_norm_key_keeps_what_the_stage_depends_on():
    c = load_target("ecp5")
    other = json.loads(json.dumps(c))
    other["blocks"]["pe"] = 150                           # another block's clock
    other["placer_why"] = "a different explanation"
    assert records.norm_key(_pnr_key(c), "tag_unit") == records.norm_key(_pnr_key(other), "tag_unit")
    moe = records.norm_key(_pnr_key(c), "moe_layer")["target"]
    assert moe["placer"] == "static" and moe["router"] == ["--tmg-ripup"]
    assert records.norm_key(_pnr_key(c), "pe")["target"]["placer"] == "heap"
    n = records.norm_key(_pnr_key(c), "moe_layer")
    assert records.norm_key(n, "moe_layer") == n                 # idempotent
    dev = json.loads(json.dumps(c))
    dev["device"] = "LFE5U-45F"
    assert records.norm_key(_pnr_key(dev), "pe") != records.norm_key(_pnr_key(c), "pe")


def test_recorded_stage_is_reused_and_resynth_redoes_it(store, tmp_path, monkeypatch):
    key = {"verilog_sha256": "cd" * 32, "generic": load_target("generic")}
    runs = []

    def work():
        runs.append(1)
        return {"cells": 7}

    monkeypatch.setitem(records.settings, "into", store)
    prov = {}
    assert _cached(tmp_path / "w1", "generic", key, work, block="x", top="t",
                   verilog_sha256="cd" * 32, prov=prov) == {"cells": 7}
    assert len(runs) == 1 and prov["generic"]["source"] == "run"
    assert list(store.glob("t-*.json"))
    monkeypatch.setitem(records.settings, "into", None)

    def must_not_run():
        raise AssertionError("a recorded stage ran again")
    prov = {}
    assert _cached(tmp_path / "w2", "generic", key, must_not_run, block="x", prov=prov) == {"cells": 7}
    assert prov["generic"]["source"] == "record" and prov["generic"]["date"]
    other = dict(key, verilog_sha256="ef" * 32)            # changed logic: runs again
    assert _cached(tmp_path / "w3", "generic", other, work, block="x") == {"cells": 7}
    assert len(runs) == 2
    monkeypatch.setitem(records.settings, "resynth", True)  # --resynth: records and caches ignored
    _cached(tmp_path / "w2", "generic", key, work, block="x")
    assert len(runs) == 3


def test_shipped_records_serve_a_block_without_synthesis(tmp_path):
    """The committed PE's every stage comes from sim/data/synth: generic,
    both FPGA areas and each recorded seed, with when and where recorded."""
    from elmoe3d.blocks import get_block
    from elmoe3d.config import preset
    from elmoe3d.sim.flow.synth import synth_block
    b = get_block("pe")
    r = synth_block(b.build(preset("default")), b.top, tmp_path, name="pe",
                    targets=("generic", "ecp5", "ice40"), seeds="recorded")
    assert r["provenance"] and all(p["source"] == "record" for p in r["provenance"].values())
    assert all(p.get("commit") and p.get("date") for p in r["provenance"].values())
    assert r["ecp5"]["fmax_mhz"] and len(r["ecp5"]["fmax_seeds"]) == 3
    cat = records.load_catalogue()["blocks"]["pe"]
    assert r["ecp5"]["fmax_mhz"] == cat["ecp5"]["fmax_mhz"] and r["cells"] == cat["cells"]


def test_catalogue_matches_the_committed_verilog():
    """Every block's recorded results are for the Verilog the tree writes
    today; after a change to hw/, `elmoe3d record` refreshes them."""
    from elmoe3d.blocks import block_names
    from elmoe3d.commands.record import stale
    cat = records.load_catalogue()
    assert set(cat["blocks"]) == set(block_names())
    bad = stale(block_names(), cat)
    assert not bad, f"recorded results are stale for {bad}: run `elmoe3d record` (--no-pnr)"


def test_record_check_reports_a_stale_block(store, tmp_path, capsys):
    from elmoe3d.cli import main
    from elmoe3d.sim.flow.catalogue import BEGIN, END, table
    cat = {"blocks": {"pe": {"verilog_sha256": "0" * 64, "description": "x"}}}
    records.CATALOGUE.write_text(json.dumps(cat))
    readme = tmp_path / "README.md"
    readme.write_text(f"{BEGIN}\n{table(cat)}\n{END}\n")
    assert main(["record", "--check", "--blocks", "pe", "--readme", str(readme)]) == 1
    out = capsys.readouterr().out
    assert "pe" in out and "CHANGED" in out and "matches" in out
    readme.write_text(f"{BEGIN}\n| other |\n{END}\n")
    assert main(["record", "--check", "--blocks", "pe", "--readme", str(readme)]) == 1
    assert "DIFFERS" in capsys.readouterr().out


@pytest.mark.parametrize("resynth", [False, True])
def test_build_resynth_ignores_records_and_caches(resynth, tmp_path, monkeypatch):
    """`elmoe3d build --resynth` runs its synthesis with records and caches
    switched off (and `make demo` without it reads them); the switch is reset
    afterwards."""
    from elmoe3d import cli
    from elmoe3d.commands import build, verilog
    seen = {}

    def sections(ctx, bl, *, fmax, sweep, resynth):
        seen.update(flag=records.settings["resynth"], arg=resynth)
        return []
    monkeypatch.setattr(build, "synthesis_sections", sections)
    monkeypatch.setattr(verilog, "write_all", lambda *a, **k: {})
    monkeypatch.setattr(cli, "commands", lambda: {"build": build})     # no report hooks
    argv = ["build", "--no-sim", "--out", str(tmp_path)] + (["--resynth"] if resynth else [])
    assert cli.main(argv) == 0
    assert seen == {"flag": resynth, "arg": resynth}
    assert records.settings["resynth"] is False


def test_block_table_names_the_verilog_of_its_figures():
    """Every row of the README's block table with a recorded figure names the
    Verilog it was measured on (the first 8 hex digits of its SHA-256), and a
    changed hash changes the row (issue 43: "a README figure always names the
    Verilog it was measured on")."""
    import copy

    from elmoe3d.sim.flow.catalogue import table
    cat = records.load_catalogue()
    rows = {line.split("|")[1].strip().split("`")[1]: line
            for line in table(cat).splitlines()[2:]}
    assert rows
    for name, row in rows.items():
        sha = cat["blocks"][name]["verilog_sha256"]
        assert f"Verilog `{sha[:8]}`" in row, (name, row)
    other = copy.deepcopy(cat)
    other["blocks"]["pe"]["verilog_sha256"] = "f" * 64
    assert "Verilog `ffffffff`" in table(other) and "Verilog `ffffffff`" not in table(cat)

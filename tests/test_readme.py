"""The front door: README and the docs say what the recorded data and the
tree say today, and README's quick-start commands run as written."""

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elmoe3d.commands.record import doc_pages, stale_pages
from elmoe3d.sim.flow.catalogue import MAX_CELL, readme_table, table
from elmoe3d.sim.flow.records import load_catalogue

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
pytestmark = pytest.mark.cli

MANUALS = ["pe", "tag_unit", "hb_bank", "ext_stream", "moe_layer", "esd_ctrl", "tile", "perf",
           "lm"]
SECTIONS = ["## Interface", "## Contract", "## Implementation", "## Verification", "## Numbers"]


def _cells(text):
    for line in text.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            yield from (c.strip() for c in line.strip().strip("|").split("|"))


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    longest = max(_cells(text), key=len)
    assert len(longest) <= 200, longest
    for needle in ("make demo", "make test", "## Quick start", "## Blocks", "## Command line",
                   "## Adding a block", "## Toolchain"):
        assert needle in text, needle
    for preset in ("tiny", "default", "fpga", "lm", "paper"):
        assert f"`{preset}`" in text, preset


def test_readme_block_table_is_the_recorded_data():
    """README's catalogue equals what sim/data/synth/blocks.json says; no
    generated cell is longer than the generator's limit."""
    cat = load_catalogue()
    assert cat.get("blocks"), "no catalogue: run `elmoe3d record`"
    got = readme_table(README.read_text())
    assert got == table(cat), "README's block table differs: run `elmoe3d record`"
    assert max(len(c) for c in _cells(got)) <= MAX_CELL


def test_block_pages_numbers_are_the_recorded_data():
    """Every registered block's figures appear in a page's generated Numbers,
    equal to the recorded data."""
    from elmoe3d.blocks import block_names
    from elmoe3d.sim.flow.catalogue import doc_numbers
    assert not stale_pages(load_catalogue()), "run `elmoe3d record`"
    named = set()
    for p in doc_pages():
        named |= set(doc_numbers(p.read_text()))
    assert set(block_names()) | {"all"} == named


@pytest.mark.parametrize("page", MANUALS + ["../synthesis"])
def test_block_pages_are_manuals(page):
    text = (ROOT / "docs" / "blocks" / f"{page}.md").read_text()
    heads = [h for h in SECTIONS if h in text.splitlines()]
    assert heads == SECTIONS, (page, heads)
    assert text.count("\n## ") == len(SECTIONS), page          # no other top section


def _hex_words(text):
    return set(re.findall(r"(?<![0-9a-zA-Z_/.-])[0-9a-f]{7,40}(?![0-9a-zA-Z_])", text))


def _is_commit(word):
    r = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{word}^{{commit}}"],
                       cwd=ROOT, capture_output=True, text=True)
    return r.returncode == 0


def test_docs_hold_no_history():
    """No commit hashes, clock times or "beside other runs" in README and the
    pages (that is what git history is for); docs/patches is gone."""
    assert not (ROOT / "docs" / "patches").exists()
    pages = [README, ROOT / "docs" / "synthesis.md", ROOT / "docs" / "architecture.md",
             *sorted((ROOT / "docs" / "blocks").glob("*.md"))]
    for p in pages:
        text = p.read_text()
        commits = sorted(w for w in _hex_words(text) if _is_commit(w))
        assert not commits, (p.name, commits)
        assert not re.search(r"\b\d\d:\d\d(-\d\d:\d\d)? UTC\b", text), p.name
        for phrase in ("beside other runs", "timing round", "Timing round", "before this change"):
            assert phrase not in text, (p.name, phrase)


def _quick_start():
    text = README.read_text()
    block = text[text.index("## Quick start"):]
    block = block[block.index("```sh") + 5:]
    return block[:block.index("```")].strip().splitlines()


def test_quick_start_commands_run_as_written(tmp_path):
    """Every quick-start line that takes under a minute (the lines not marked
    "minutes", beyond `make install` and the venv's activation) runs as
    written from the checkout and does what the README says."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTEST_XDIST_WORKER", None)
    ran = []
    for line in _quick_start():
        cmd = line.split("#", 1)[0].strip()
        if not cmd or cmd.startswith(("make install", ". .venv")) or "minutes" in line:
            continue
        if " pytest " in f" {cmd} ":
            # the test line must select exactly one test, and it writes waves
            words = shlex.split(cmd)
            sel = [w for w in words if w.startswith("tests/")]
            r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *sel],
                               cwd=ROOT, capture_output=True, text=True, env=env)
            assert re.search(r"^1 test collected", r.stdout, re.M), r.stdout[-500:]
        t0 = time.time()
        r = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=600)
        assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])
        ran.append(cmd)
        if cmd.startswith("elmoe3d verilog"):
            assert (ROOT / "build" / "verilog" / "elmoe3d_pe.json").stat().st_mtime >= t0 - 1
        if "WAVES=1" in cmd:
            waves = [p for p in (ROOT / "sim_build").glob("pe-*-verilator-waves/runs/*/dump.vcd")
                     if p.stat().st_mtime >= t0]
            assert waves, "the waves run wrote no dump.vcd"
    assert len(ran) >= 4, ran


def test_readme_sweep_example_is_accepted():
    """The sweep example's points are all accepted at `default` (none refused)."""
    from elmoe3d.sim.flow.sweep import check_points, parse_sets, points
    text = " ".join(README.read_text().split())
    m = re.search(r"`(elmoe3d sweep [^`]*)`", text)
    words = shlex.split(m.group(1))
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    blocks = words[words.index("--blocks") + 1].split(",")
    pts = points(blocks, parse_sets(sets))
    assert pts and not check_points(pts, "default")


def test_readme_steady_state_table_is_the_recorded_one():
    """README's steady-state table is what the recorded set says
    (`elmoe3d tile-run --steady-state --record` writes both)."""
    import json
    from elmoe3d.sim.run import tile_run as tr
    rec = json.loads((ROOT / "sim" / "data" / "steady_state.json").read_text())
    from elmoe3d.sim.flow.generated import between
    for page in (README, ROOT / "docs" / "blocks" / "tile.md"):
        assert between(page.read_text(), tr.README_MARKERS) == tr.readme_table(rec), page
    assert all(r["match"] for r in rec["runs"]), "a recorded run differs from the golden"


def test_moe_pass_tables_are_the_recorded_ones():
    """README's and the MoE page's pass tables are what the recorded
    benchmark says (`elmoe3d moe-bench --record` writes all three), and the
    recording covers every role at T = 1, 4, 16 and the whole step at both
    presets."""
    import json
    from elmoe3d.sim.run import moe_bench as mb
    rec = json.loads(mb.recorded_path().read_text())
    assert set(rec["presets"]) == set(mb.PRESETS)
    for name, r in rec["presets"].items():
        T = r["config"]["batch_tokens"]
        want = mb.POINTS[name] or [f"{role}_T{t}" for role in mb.ROLES for t in (1, 4, 16, T)]
        assert set(want) <= set(r["figures"]), (name, sorted(set(want) - set(r["figures"])))
    from elmoe3d.sim.flow.generated import between
    for path in (README, ROOT / "docs" / "blocks" / "moe_layer.md"):
        assert between(path.read_text(), mb.MARKERS) == mb.readme_table(rec), path


def test_tile_report_tables_are_the_recorded_ones():
    """docs/blocks/tile.md's report table and perf.md's model-vs-RTL table
    are what `sim/data/tile_report.json` and `tile_counters.json` say
    (`elmoe3d tile-run --report --record` writes all four)."""
    import json
    from elmoe3d.sim.run import tile_run as tr
    from elmoe3d.sim.flow.generated import between
    from elmoe3d.sim.perf import rtl_compare as rc
    rep = json.loads((ROOT / "sim" / "data" / "tile_report.json").read_text())
    docs = ROOT / "docs" / "blocks"
    assert between((docs / "tile.md").read_text(), tr.REPORT_MARKERS) == tr.report_table(rep)
    assert between((docs / "perf.md").read_text(), rc.DOC_MARKERS) == \
        rc.doc_table(rc.compare(rc.RECORDED))

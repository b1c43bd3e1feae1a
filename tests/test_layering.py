"""Which package may import which: the product never imports the
testbenches, and the golden models import neither the hardware nor the
simulation drivers (issue 42: "no test code in the product").

A static check over every module's imports (module level and inside
functions), relative ones resolved against the module's package. Naming a
cocotb module as a string (``test_module="elmoe3d.tb.tile_decode"``) is how
the drivers run a bench and is not an import."""

import ast
from pathlib import Path

import pytest

from conftest import ROOT

#: elmoe3d's sub-packages and the folders that hold them
PACKAGES = {"golden": ROOT / "golden", "hw": ROOT / "hw", "sim": ROOT / "sim",
            "tb": ROOT / "tb", "commands": ROOT / "elmoe3d" / "commands"}

#: package -> sub-packages of elmoe3d it must not import
FORBIDDEN = {"golden": {"hw", "sim", "tb", "commands"},
             "hw": {"sim", "tb", "commands"},
             "sim": {"tb", "commands"},
             "commands": {"tb"}}


def _module_name(pkg: str, path: Path) -> list[str]:
    rel = path.relative_to(PACKAGES[pkg]).with_suffix("")
    parts = ["elmoe3d", pkg, *rel.parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported(pkg: str, path: Path) -> set[str]:
    """Dotted names ``path`` imports, relative imports resolved."""
    name = _module_name(pkg, path)
    package = name if path.name == "__init__.py" else name[:-1]
    out = set()
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = package[:len(package) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in n.names)
    return out


def violations(pkg: str, files) -> list[str]:
    bad = []
    for f in files:
        for mod in sorted(imported(pkg, f)):
            parts = mod.split(".")
            if len(parts) > 1 and parts[0] == "elmoe3d" and parts[1] in FORBIDDEN[pkg]:
                bad.append(f"{pkg}/{f.relative_to(PACKAGES[pkg]).as_posix()} imports {mod}")
    return bad


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_package_imports_follow_the_layers(pkg):
    files = sorted(PACKAGES[pkg].rglob("*.py"))
    assert files
    bad = violations(pkg, files)
    assert not bad, "\n".join(bad)


def test_layer_check_can_fail(tmp_path, monkeypatch):
    """A product module that reaches into the benches is caught, relative
    (two levels up from a sub-package) or absolute, also inside a function."""
    sim = tmp_path / "sim"
    (sim / "perf").mkdir(parents=True)
    (sim / "perf" / "bad.py").write_text("def f():\n    from ...tb.coverage import x\n")
    (sim / "ok.py").write_text("from .perf import bad\nT = 'elmoe3d.tb.pe_bench'\n")
    (sim / "abs.py").write_text("import elmoe3d.tb.common\n")
    monkeypatch.setitem(PACKAGES, "sim", sim)
    bad = violations("sim", sorted(sim.rglob("*.py")))
    assert bad == ["sim/abs.py imports elmoe3d.tb.common",
                   "sim/perf/bad.py imports elmoe3d.tb.coverage",
                   "sim/perf/bad.py imports elmoe3d.tb.coverage.x"], bad


def test_one_name_one_file():
    """A bench and its pytest entry have different names (``tb/pe_bench.py``
    beside ``tests/test_pe.py``): no module name is used twice."""
    names = {}
    for d in ("tb", "tests", "sim", "golden", "hw"):
        for f in (ROOT / d).glob("*.py"):
            if f.name != "__init__.py":
                names.setdefault(f.name, []).append(d)
    twice = {n: ds for n, ds in names.items() if len(ds) > 1 and "tests" in ds}
    assert not twice, f"same file name in tests/ and elsewhere: {twice}"

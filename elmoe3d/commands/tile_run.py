"""``elmoe3d tile-run``: long runs of the tile top on the native harness --
the report's routing traces for hundreds of decode steps, every response,
counter, trace event and layer output checked against the golden, cycles per
output token measured after a warm-up (:mod:`elmoe3d.sim.run.tile_run`).

One run: ``elmoe3d tile-run --trace zipf --batch 4 --mode sd --steps 64
--warmup 32 --seed 1 --json F``. A set: comma lists (``--trace zipf,lm
--batch 1,4,16 --mode ar,sd --seed 1,2,3``) run as independent Dask tasks,
the cross product; ``--steady-state`` is the set the report shows (54 runs).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

NAME = "tile-run"
HELP = ("long runs of the tile on the native harness: the report's traces, checked against "
        "the golden, cycles per output token in steady state (Dask for a set)")

#: Where ``--steady-state`` writes by default, and the recorded copy the report
#: falls back to (``sim/data/steady_state.json``)
STEADY_FILE = "steady_state.json"


def register(p):
    p.add_argument("--trace", default="zipf", metavar="T[,T]",
                   help="zipf (synthetic Zipf + reuse on the default tile) or lm (the LM's own "
                        "routing on the lm tile); a comma list runs each (default zipf)")
    p.add_argument("--batch", default="1", metavar="B[,B]",
                   help="requests decoded together, 1..16 (comma list; default 1)")
    p.add_argument("--mode", default=None, metavar="M[,M]",
                   help="ar, sd (forced every round), lpddr (AR with the HB expert cache off: "
                        "the LPDDR-only baseline) or auto (the controller decides); comma list "
                        "(default sd; with --steady-state: only these modes of the set)")
    p.add_argument("--steps", default="64", metavar="N|B:N,...",
                   help="measured decode steps after the warm-up, or per batch (1:128,4:64); "
                        "default 64")
    p.add_argument("--warmup", type=int, default=32, metavar="W",
                   help="decode steps before the measurement (default 32)")
    p.add_argument("--seed", default="1", metavar="S[,S]",
                   help="seed of the decode (acceptance, requests) and the trace layers; comma "
                        "list (default 1)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="run the zipf trace on another tile configuration (e.g. tiny, for a "
                        "quick check; default: the trace's own, default / lm)")
    p.add_argument("--latency", type=int, default=12, metavar="CYCLES",
                   help="LPDDR read latency in cycles (default 12: about 100 ns at 125 MHz)")
    p.add_argument("--lpddr-bytes-per-cycle", type=int, default=None, metavar="N",
                   help="LPDDR bandwidth (default: one AXI beat per cycle)")
    p.add_argument("--prefetch", type=int, default=0, metavar="N",
                   help="the tile prefetches during drafts, at most N outstanding (0: none, the "
                        "default; at most the tile's expert slots); with --steady-state: the "
                        "set's SD runs on that tile, added to the set's file")
    p.add_argument("--steady-state", action="store_true",
                   help="the steady-state set: traces zipf,lm x batch 1,4,16 x lpddr,ar,sd x seeds "
                        "1,2,3, 32 warm-up steps, 128 measured at batch 1 and 64 at 4 and 16 "
                        f"(default --json build/measured/{STEADY_FILE})")
    p.add_argument("--report", action="store_true",
                   help="the report runs instead: both traces x batch 1,4,16 x AR,SD, 8 decode "
                        "steps from a cold cache, to tile_report.json and tile_counters.json "
                        "(the folder of --json; default build/measured)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="an existing Dask scheduler (tcp://host:8786); default: an embedded "
                        "LocalCluster")
    p.add_argument("--workers", type=int, default=2,
                   help="LocalCluster worker processes (default 2)")
    p.add_argument("--json", metavar="FILE", help="results as JSON")
    p.add_argument("--record", action="store_true",
                   help="with --steady-state: write the recorded copy (sim/data/steady_state.json) "
                        "and README's steady-state table from it; with --report: "
                        "sim/data/tile_report.json, tile_counters.json and the tables of "
                        "docs/blocks/tile.md and perf.md")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")


def _list(text, flag, kind=str):
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"{flag} names nothing")
    if kind is int:
        try:
            return [int(x) for x in items]
        except ValueError:
            raise ValueError(f"{flag}: expected integers, not {text!r}") from None
    return items


def _steps(text):
    """``N`` or ``{batch: N}`` from ``B:N,B:N``."""
    if ":" not in text:
        vals = _list(text, "--steps", int)
        if len(vals) != 1:
            raise ValueError(f"--steps: one number or B:N pairs, not {text!r}")
        return vals[0]
    out = {}
    for item in _list(text, "--steps"):
        b, _, n = item.partition(":")
        try:
            out[int(b)] = int(n)
        except ValueError:
            raise ValueError(f"--steps: expected B:N pairs of integers, not {item!r}") from None
    return out


def _command(args) -> str:
    """The command line that reproduces the runs (for the JSON)."""
    if args.steady_state:
        parts = ["--steady-state"] + ([f"--mode {args.mode}"] if args.mode else [])
    else:
        parts = [f"--trace {args.trace}", f"--batch {args.batch}", f"--mode {args.mode or 'sd'}",
                 f"--steps {args.steps}", f"--warmup {args.warmup}", f"--seed {args.seed}"]
    parts.append(f"--latency {args.latency}")
    if args.preset is not None:
        parts.append(f"--preset {args.preset}")
    if args.lpddr_bytes_per_cycle is not None:
        parts.append(f"--lpddr-bytes-per-cycle {args.lpddr_bytes_per_cycle}")
    if args.prefetch:
        parts.append(f"--prefetch {args.prefetch}")
    return "elmoe3d tile-run " + " ".join(parts)


def _specs(args):
    from ..sim.run import tile_run as tr
    kw = dict(latency=args.latency, lpddr_bytes_per_cycle=args.lpddr_bytes_per_cycle,
              preset=args.preset, prefetch=args.prefetch)
    if args.preset is not None:
        from ..config import preset
        preset(args.preset)
    if args.steady_state:
        ss = tr.STEADY_STATE
        modes = ss["modes"]
        if args.mode:
            modes = _list(args.mode, "--mode")
            bad = [m for m in modes if m not in ss["modes"]]
            if bad:
                raise ValueError(f"--mode {bad[0]} is not in the steady-state set "
                                 f"({', '.join(ss['modes'])})")
        if args.prefetch and not args.mode:
            modes = ["sd"]                     # the set's Elastic-SD runs on a prefetching tile
        return tr.specs(ss["traces"], ss["batches"], modes, ss["seeds"], ss["steps"],
                        ss["warmup"], **kw)
    steps = _steps(args.steps)
    batches = _list(args.batch, "--batch", int)
    if isinstance(steps, dict):
        missing = [b for b in batches if b not in steps]
        if missing:
            raise ValueError(f"--steps gives no step count for batch {missing[0]}")
    return tr.specs(_list(args.trace, "--trace"), batches, _list(args.mode or "sd", "--mode"),
                    _list(args.seed, "--seed", int), steps, args.warmup, **kw)


def run(args) -> int:
    from ..report import text_table
    from ..sim.run import tile_run as tr
    from ._common import writable_file
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, not {args.workers}")
    if args.report:
        if args.steady_state:
            raise ValueError("--report and --steady-state are two different sets: give one")
        return _report(args)
    if args.record and not args.steady_state:
        raise ValueError("--record records the steady-state set or the report runs: give "
                         "--steady-state or --report too")
    specs = _specs(args)
    path = args.json or (f"build/measured/{STEADY_FILE}" if args.steady_state else None)
    if args.record:
        path = str(recorded_steady_state())
    out = writable_file(path) if path else None
    quiet = args.no_progress
    t0 = time.monotonic()

    def say(text):
        if not quiet:
            print(f"[{time.monotonic() - t0:6.1f} s] {text}", file=sys.stderr, flush=True)
    from ..sim.flow.sweep import text_bar
    say(f"{len(specs)} run(s); native tile models built or found first")
    res = tr.run_set(specs, scheduler=args.scheduler, workers=args.workers,
                     progress=None if quiet else text_bar("tile runs"), build_progress=say)
    secs = time.monotonic() - t0
    head = ["trace", "batch", "mode", "seed", "steps", "tokens", "cycles", "cycles / token",
            "AR / DRAFT / VERIFY cycles", "HB hit", "acc len", "match", "Mcycles/CPU-s"]
    rows = []
    for r in res:
        m = r["measured"]
        ph = m["phase_cycles"]
        rows.append([r["trace_key"], r["batch"], r["mode"].upper(), r["seed"], m["steps"],
                     m["tokens"], m["cycles"], round(m["cycles_per_token"] or 0),
                     f"{ph['AR']}/{ph['DRAFT']}/{ph['VERIFY']}", m["hb_hit_rate"],
                     m["mean_accepted_len"], "yes" if r["match"] else "NO",
                     round((r["cycles_per_cpu_s"] or 0) / 1e6, 3)])
    print(text_table(head, rows))
    summary = tr.summary_rows(res)
    if len(res) > 1:
        print(text_table(tr.SUMMARY_HEAD, summary))
    for r in res:
        if not r["match"]:
            d = r["first_difference"]
            print(f"{r['trace_key']} B{r['batch']} {r['mode']} seed {r['seed']}: first "
                  f"difference ({d['kind']}, cycle {d['cycle']}): {d['message']}")
    total = sum(r["cycles"] for r in res)
    cpu = sum(r["sim_cpu_s"] for r in res)
    print(f"{len(res)} run(s), {total:,} tile cycles in {cpu:.0f} CPU-s of simulation "
          f"({total / max(cpu, 1e-9):,.0f} cycles per CPU-second); {secs:.0f} s wall; every "
          f"run equal to the golden: {'yes' if all(r['match'] for r in res) else 'NO'}")
    if out:
        rec = {"command": _command(args), "wall_s": round(secs, 1), "runs": res}
        if args.steady_state and (args.mode or args.prefetch) and out.is_file():
            # a part of the set: its runs replace their own in the file's set
            old = json.loads(out.read_text())
            parts = [p for p in old.get("parts", [{"command": old["command"],
                                                    "wall_s": old["wall_s"],
                                                    "runs": len(old["runs"])}])
                     if p["command"] != rec["command"]]
            runs = tr.merge_runs(old["runs"], res)
            rec = {"command": "elmoe3d tile-run --steady-state", "wall_s": round(
                sum(p["wall_s"] for p in parts) + secs, 1), "runs": runs,
                "parts": parts + [{"command": rec["command"], "wall_s": round(secs, 1),
                                   "runs": len(res)}]}
            summary = tr.summary_rows(runs)
        rec.update(summary_head=tr.SUMMARY_HEAD, summary=summary)
        out.write_text(json.dumps(rec, indent=1))
        print(f"wrote {out}")
    if args.record:
        from .record import repo_readme
        rec = json.loads(out.read_text())
        for page in (repo_readme(), repo_readme().parent / "docs" / "blocks" / "tile.md"):
            changed = tr.write_readme_table(page, rec)
            print(f"{'rewrote' if changed else 'unchanged:'} {page}'s steady-state table")
    return 0 if all(r["match"] for r in res) else 1


def recorded_steady_state() -> Path:
    """The steady-state set recorded in the repository (``sim/data/``)."""
    from .. import sim
    return Path(sim.__file__).resolve().parent / "data" / STEADY_FILE


def build_section(ctx):
    from ..report import Section, md_table, text_table
    from ..sim.run import tile_run as tr
    f = ctx.outdir / "measured" / STEADY_FILE
    recorded = not f.is_file()
    if recorded:
        f = recorded_steady_state()
    if not f.is_file():
        return Section("Tile in steady state (native harness)",
                       "No steady-state runs (`elmoe3d tile-run --steady-state` writes "
                       f"`build/measured/{STEADY_FILE}`).")
    d = json.loads(f.read_text())
    rows = tr.summary_rows(d["runs"])
    md = ("The tile top (`elmoe3d_tile`) on the native harness (Verilated C++ model, "
          "`sim/native/`) replaying the report's traces for hundreds of decode steps, every "
          "response, counter, trace event and layer output equal to the golden's; cycles per "
          "output token measured after a warm-up (`elmoe3d tile-run --steady-state`; "
          + (f"the recorded runs in `sim/data/{STEADY_FILE}`" if recorded
             else f"`build/measured/{STEADY_FILE}`") + "):\n\n"
          + md_table(tr.SUMMARY_HEAD, rows))
    return Section("Tile in steady state (native harness)", md,
                   {"rows": [dict(zip(tr.SUMMARY_HEAD, r)) for r in rows],
                    "recorded": recorded}, text_table(tr.SUMMARY_HEAD, rows))


def _report(args) -> int:
    """``--report``: the report runs of both traces on the native tile."""
    from ..sim.run import tile_run as tr
    from ..sim.perf import rtl_compare as rc
    from ._common import writable_file
    if args.record:
        folder = recorded_steady_state().parent
    else:
        folder = Path(args.json).parent if args.json else Path("build/measured")
    rep_path = writable_file(str(folder / "tile_report.json"), "--json")
    cnt_path = writable_file(str(folder / "tile_counters.json"), "--json")
    t0 = time.monotonic()
    outs, counter_runs = [], []
    for which, name in ((0, "zipf"), (1, "lm")):
        if not args.no_progress:
            print(f"[{time.monotonic() - t0:6.1f} s] {name}: the native tile built or found, "
                  "6 runs", file=sys.stderr, flush=True)
        o, c = tr.report_set(which)
        outs += o
        counter_runs += c
    report = {"source": "elmoe3d tile-run --report (native harness, LPDDR latency 12)",
              "runs": outs}
    rep_path.write_text(json.dumps(report, indent=1))
    cnt_path.write_text(json.dumps({"format": rc.FORMAT, "version": 2,
                                    "source": "elmoe3d tile-run --report (elmoe3d_tile, native)",
                                    "runs": counter_runs}))
    print(tr.report_table(report))
    print(f"wrote {rep_path} and {cnt_path} ({time.monotonic() - t0:.0f} s); every run equal "
          "to the golden: yes")
    if args.record:
        from ..sim.flow.generated import replace_between
        from .record import repo_readme
        docs = repo_readme().parent / "docs" / "blocks"
        replace_between(docs / "tile.md", tr.REPORT_MARKERS, tr.report_table(report))
        replace_between(docs / "perf.md", rc.DOC_MARKERS, rc.doc_table(rc.compare(cnt_path)))
        print(f"rewrote the tables of {docs / 'tile.md'} and {docs / 'perf.md'}")
    return 0

"""``elmoe3d decode``: greedy decoding of the in-project MoE language model
with its MoE layers on the tile (golden model, or the RTL with ``--rtl``)."""

from __future__ import annotations

import json
import sys
import time

from ..golden.lm import HELD_PROMPT
from ._common import writable_file

NAME = "decode"
HELP = "decode text with the MoE LM, its MoE layers on the tile (AR or Elastic-SD)"


#: The LM's context in bytes (it was trained on 128-byte windows): a prompt
#: and the bytes decoded after it fit in it
CONTEXT = 128
#: Longest prompt in bytes (the rest of the context is for decoding)
MAX_PROMPT = 96


def register(p):
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="prompt text (repeatable: one request each)")
    p.add_argument("--prompt-file", metavar="FILE",
                   help="prompts, one per line (one request each; blank lines are skipped, "
                        "a file without a prompt is refused)")
    p.add_argument("--tokens", type=int, default=16, metavar="N",
                   help=f"bytes to generate per request (default 16). The LM's context is "
                        f"{CONTEXT} bytes, the prompt included, so N is at most {CONTEXT} "
                        f"minus the longest prompt's bytes ({CONTEXT - HELD_PROMPT} for the "
                        f"default {HELD_PROMPT}-byte held-out prompts)")
    p.add_argument("--mode", choices=("ar", "sd", "auto"), default="auto",
                   help="ar: plain decoding; sd: Elastic-SD; auto: the controller's batch "
                        "threshold decides (default)")
    p.add_argument("--batch", type=int, default=None, metavar="B",
                   help="requests decoded together (default: the number of prompts, at least 1; "
                        "missing prompts are taken from the held-out set)")
    p.add_argument("--rtl", action="store_true",
                   help="run the MoE layers on the RTL tile (default: golden model)")
    p.add_argument("--sim", choices=("native", "cocotb"), default=None,
                   help="with --rtl: the native harness (default: the tile as a Verilated C++ "
                        "model replaying the golden decode's host script, every response and "
                        "output compared) or cocotb (the host in the loop, about 20x slower)")
    p.add_argument("--prefetch", type=int, default=0, metavar="N",
                   help="with --rtl (native): the tile prefetches during drafts, at most N "
                        "outstanding (default 0: none)")
    p.add_argument("--json", metavar="FILE", help="write tokens, match and counters as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--picture", metavar="FILE",
                   help="write a WaveDrom SVG of one Elastic-SD round of this decode "
                        "(the round with the longest draft; needs an Elastic-SD round, so not "
                        "with --mode ar)")
    p.add_argument("--perplexity", type=int, default=None, metavar="W",
                   help="instead of decoding: perplexity of the float, INT8 and integer-MoE "
                        "model on the first W held-out windows (64 = all)")


def _output(path, flag):
    """An output file named by ``flag``, checked before the (long) run: not a
    folder, its folder creatable and writable, the file writable if it
    exists; ``PermissionError`` / ``ValueError`` naming it otherwise."""
    return writable_file(path, flag)


def _prompts(args):
    from ..sim.lm.evidence import heldout_prompts
    texts = list(args.prompt)
    if args.prompt_file:
        from pathlib import Path
        p = Path(args.prompt_file)
        if not p.is_file():
            raise FileNotFoundError(f"Prompt file {args.prompt_file!r} does not exist")
        lines = [line for line in p.read_text(errors="replace").splitlines() if line.strip()]
        if not lines:
            raise ValueError(f"Prompt file {args.prompt_file!r} has no prompt (it is empty or "
                             f"blank)")
        texts += lines
    batch = args.batch if args.batch is not None else max(1, len(texts))
    from ..golden.esd import MAX_BATCH
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"--batch must be in 1..{MAX_BATCH}, not {batch}")
    if len(texts) > batch:
        raise ValueError(f"{len(texts)} prompts given for --batch {batch}")
    prompts = []
    for t in texts:
        b = t.encode("utf-8")
        if not b:
            raise ValueError("An empty prompt cannot be decoded")
        if len(b) > MAX_PROMPT:
            raise ValueError(f"Prompt of {len(b)} bytes is longer than {MAX_PROMPT} (the LM's "
                             f"context is {CONTEXT} bytes)")
        prompts.append(list(b))
    held = heldout_prompts()
    i = 200
    while len(prompts) < batch:
        prompts.append([int(x) for x in held[i][:HELD_PROMPT]])
        i += 1
    return prompts


def _check_tokens(args, prompts):
    longest = max(len(p) for p in prompts)
    top = CONTEXT - longest
    if not 1 <= args.tokens <= top:
        raise ValueError(f"--tokens must be in 1..{top} (the LM's context is {CONTEXT} bytes "
                         f"and the longest prompt has {longest}), not {args.tokens}")


def _show(prompts, tokens, label=""):
    """Each request's text, the prompt and the decoded bytes marked (and the
    decoded bytes in bold on a terminal)."""
    tty = sys.stdout.isatty()
    for b, (p, toks) in enumerate(zip(prompts, tokens)):
        print(f"--- request {b}{label}: {len(p)} prompt bytes, {len(toks)} decoded")
        print("[prompt]  " + bytes(p).decode("utf-8", "replace"))
        print("[decoded] " + "\033[1m" * tty + bytes(toks).decode("utf-8", "replace")
              + "\033[0m" * tty)


def _perplexity(args) -> int:
    from ..golden import lm as glm
    from ..golden import lm_int as li
    from ..report import text_table
    from ..sim.lm.evidence import heldout_windows
    if not 1 <= args.perplexity <= 64:
        raise ValueError(f"--perplexity must be in 1..64 windows, not {args.perplexity}")
    out = writable_file(args.json) if args.json else None
    w, meta = glm.load_weights()
    im = li.IntMoE.from_model(w, meta)
    W = heldout_windows(args.perplexity)
    res = {name: li.perplexity(m, W) for name, m in (
        ("float", glm.MoEModel(w, meta, "float")), ("int8", glm.MoEModel(w, meta, "full")),
        ("integer_moe", li.IntMoEModel(w, meta, im)))}
    print(f"perplexity on {len(W)} held-out windows ({W[:, 1:].size} bytes); integer-MoE "
          f"activation scales calibrated on {li.CALIB_PROMPTS} held-out prompts")
    print(text_table(["model", "perplexity", "bits/byte"],
                     [[k, f"{v['ppl']:.4f}", f"{v['bits_per_byte']:.4f}"]
                      for k, v in res.items()]))
    if out:
        out.write_text(json.dumps(res, indent=1))
        print(f"wrote {out}")
    return 0


def _picture(res, batch, path):
    from ..golden import esd
    sd = [r for r in res.rounds if r[0] == 1]
    if not sd:
        raise ValueError("--picture needs an Elastic-SD round and this decode ran only AR "
                         "rounds (--mode auto chose AR at this batch; use --mode sd)")
    # the round with the most drafted-from-HB experts (a warm cache), then the longest draft
    starts = [i for i, e in enumerate(res.events)
              if e.kind == esd.EventKind.MODE and e.code == esd.Mode.SD] + [len(res.events)]
    hits = [sum(1 for e in res.events[a:b] if e.kind == esd.EventKind.LOOKUP
                and e.phase == esd.Phase.DRAFT) for a, b in zip(starts, starts[1:])]
    i = max(range(len(sd)), key=lambda j: (hits[j], sd[j][1], -j))
    k = sd[i][1]
    wd = esd.round_wavedrom(res.events, i, title=f"Elastic-SD round {i} of this decode "
                            f"(batch {batch}, K = {k})")
    import wavedrom
    wavedrom.render(json.dumps(wd)).saveas(str(path))
    print(f"wrote {path}")


def _bar(done, total, t0, stream=None):
    stream = stream or sys.stderr           # the stream of now (a redirected stderr too)
    w = 30
    f = min(1.0, done / total)
    stream.write(f"\r[{'#' * int(w * f):<{w}}] {min(done, total)}/{total} tokens "
                 f"{time.monotonic() - t0:5.1f}s")
    stream.flush()


#: Verilator build of the tile for `decode --rtl` and the report's tile runs:
#: Verilator's run-time files at -O1, its symbol table and constructors
#: unoptimised (docs/blocks/tile.md: the same 2-token decode simulated in
#: 30.5 s instead of 189.5 s at -O0; the build takes a few minutes more)
RTL_BUILD = {"make_vars": ["OPT_FAST=-O1"]}


def _progress_thread(path, t0, quiet):
    """Draw the progress bar from the file the cocotb decode writes (``done
    total``) every half second; returns the function that stops it."""
    import threading
    if quiet:
        return lambda: None
    done = threading.Event()

    def poll():
        last = None
        while True:
            stopping = done.wait(0.5)       # one more look after stop(): the final count
            try:
                d, n = map(int, path.read_text().split())
            except (OSError, ValueError):
                d = n = None
            if d is not None and (d, n) != last:
                _bar(d, n, t0)
                last = (d, n)
            if stopping:
                break
        if last:
            sys.stderr.write("\n")

    th = threading.Thread(target=poll, daemon=True)
    th.start()

    def stop():
        done.set()
        th.join()
    return stop


def _rtl(args, prompts, out, picture) -> int:
    """``--rtl``: the MoE layers on the RTL tile (``lm`` preset), natively
    (default) or in cocotb; the same decode with the golden tile is the
    reference."""
    t0 = time.monotonic()
    r, gold_like = (_rtl_cocotb if args.sim == "cocotb" else _rtl_native)(args, prompts)
    secs = time.monotonic() - t0
    toks = r["tokens_rtl"] or [[] for _ in prompts]
    _show(prompts, toks, " (RTL tile)")
    c = r["counters_rtl"]
    n_out = c.get("tokens_out", 0)
    sim_s = r.get("sim_cpu_s") or r.get("sim_wall_s")
    print(f"rounds: {len(r['rounds'])}; tokens through the tile: {n_out}; simulated cycles "
          f"{r['cycles']:,} ({r['cycles'] / max(1, n_out):,.0f} per output token; dense load "
          f"{r['load_dense_cycles']:,} cycles before)")
    if sim_s:
        what = "CPU-second" if r.get("sim_cpu_s") else "second"
        print(f"simulated {r['total_cycles']:,} tile cycles in {sim_s:.1f} s "
              f"({r['total_cycles'] / sim_s:,.0f} cycles per {what}, {r['sim']} harness)")
    print(f"RTL tokens equal golden tokens: {'yes' if r['match'] else 'NO'}; trace equal: "
          f"{'yes' if r['trace_equal'] else 'NO: ' + str(r['trace_first_difference'])}; "
          f"counters differ: {r['counters_differ'] or 'none'}")
    if r.get("first_difference"):
        d = r["first_difference"]
        print(f"first difference ({d['kind']}, cycle {d['cycle']}, index {d['index']}): "
              f"{d['message']}")
    print("tile counters (RTL, read over the host port): "
          + ", ".join(f"{k} {c[k]:,}" for k in c))
    n_dec = args.tokens * len(prompts)
    if "build_s" in r:
        build = r["build_s"]
        print(f"decode --rtl took {secs:.1f} s: {build:.1f} s building or finding the model, "
              f"then {(secs - build) / n_dec:.2f} s per output token ({args.tokens} bytes x "
              f"{len(prompts)} requests)")
    else:
        print(f"decode --rtl took {secs:.1f} s (a Verilator build included when one ran)")
    r = dict(r, mode=args.mode, batch=len(prompts), tokens=args.tokens,
             prefetch=getattr(args, "prefetch", 0), seconds=round(secs, 2))
    if out:
        out.write_text(json.dumps(r, indent=1, default=str))
        print(f"wrote {out}")
    if picture and gold_like is not None:
        _picture(gold_like, len(prompts), picture)
    ok = r["match"] and r["trace_equal"] and not r["counters_differ"] and \
        r.get("outputs_equal", True)
    return 0 if ok else 1


def _rtl_native(args, prompts):
    """The native harness (:mod:`elmoe3d.sim.run.native_decode`)."""
    import types

    from ..sim.run import native_decode
    quiet = args.quiet
    t0 = time.monotonic()

    def say(text):
        if not quiet:
            print(f"[{time.monotonic() - t0:6.1f} s] {text}", file=sys.stderr, flush=True)

    if not quiet:
        say("the lm tile as a native Verilated model (built once, then cached: a few "
            "minutes the first time)")
    state = {"t": None}

    def progress(cycle, done, total):
        if quiet:
            return
        if state["t"] is None:
            state["t"] = time.monotonic()
        sys.stderr.write(f"\r[tile] cycle {cycle:,}: {done:,} of {total:,} responses")
        sys.stderr.flush()
    res = native_decode.decode(prompts, args.tokens, args.mode, build_progress=say,
                               progress=progress, prefetch=args.prefetch)
    if state["t"] is not None:
        sys.stderr.write("\n")
    g = res.golden
    return res.record, types.SimpleNamespace(rounds=g.rounds, events=res.events)


def _rtl_cocotb(args, prompts):
    """The cocotb path (``tb/tile_decode.py``): the golden decode in a cocotb
    thread driving the tile, host in the loop."""
    import tempfile
    from pathlib import Path

    from ..config import Config, preset
    from ..sim.run.harness import SimulationFailed, simulate

    def factory(config):
        from ..hw.tile import Tile
        return Tile(Config(**config))

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        job, res, prog = Path(d) / "job.json", Path(d) / "out.json", Path(d) / "progress"
        job.write_text(json.dumps({"prompts": prompts, "tokens": args.tokens,
                                   "mode": args.mode}))
        failed = None
        if not args.quiet:
            print("the lm tile in Verilator under cocotb (built once, then cached: several "
                  "minutes the first time; the golden decode runs first as the reference)",
                  file=sys.stderr)
        stop = _progress_thread(prog, t0, args.quiet)
        try:
            simulate(factory, block="tile", params={"config": preset("lm").to_dict()},
                     top="elmoe3d_tile", test_module="elmoe3d.tb.tile_decode",
                     env={"ELMOE_DECODE_JOB": str(job), "ELMOE_DECODE_OUT": str(res),
                          "ELMOE_DECODE_PROGRESS": str(prog)},
                     **RTL_BUILD)
        except SimulationFailed as e:
            failed = e
        finally:
            stop()
        if not res.is_file():
            raise RuntimeError(f"the RTL decode produced no result: {failed}")
        r = json.loads(res.read_text())
    r.update(sim="cocotb", total_cycles=r["cycles"] + r["load_dense_cycles"],
             sim_wall_s=round(time.monotonic() - t0, 2))
    if failed is not None:
        r["match"] = False
    return r, None


def run(args) -> int:
    import numpy as np

    from ..config import preset
    from ..golden import lm as glm
    from ..golden import lm_int as li
    from ..report import text_table

    if args.perplexity is not None:
        return _perplexity(args)
    if args.sim and not args.rtl:
        raise ValueError(f"--sim {args.sim} needs --rtl (the golden model is no simulation)")
    if args.prefetch and (not args.rtl or args.sim == "cocotb"):
        raise ValueError(f"--prefetch {args.prefetch} needs --rtl on the native harness")
    from ..config import check_int
    check_int("--prefetch", args.prefetch, 0, preset("lm").tag_slots)
    if args.tokens < 1:
        raise ValueError(f"--tokens must be at least 1, not {args.tokens}")
    if args.picture and args.mode == "ar":
        raise ValueError("--picture draws an Elastic-SD round and --mode ar has none "
                         "(use --mode sd, or auto at a batch the controller runs SD for)")
    if args.picture and args.rtl and args.sim == "cocotb":
        raise ValueError("--picture with --rtl needs the native harness (drop --sim cocotb)")
    out = _output(args.json, "--json") if args.json else None
    picture = _output(args.picture, "--picture") if args.picture else None
    prompts = _prompts(args)
    _check_tokens(args, prompts)
    if args.rtl:
        return _rtl(args, prompts, out, picture)
    weights, meta = glm.load_weights()
    cfg = preset("lm")
    t0 = time.monotonic()
    intmoe = li.IntMoE.from_model(weights, meta, cfg=cfg)
    progress = None if args.quiet else (lambda d, n: _bar(d, n, t0))
    res = li.decode(weights, meta, intmoe, [np.array(p) for p in prompts], args.tokens,
                    mode=args.mode, cfg=cfg, progress=progress)
    if progress:
        sys.stderr.write("\n")
    secs = time.monotonic() - t0
    _show(prompts, res.tokens)
    modes = [r[0] for r in res.rounds]
    sd = [r for r in res.rounds if r[0] == 1]
    c = res.counters
    n_out = c["tokens_out"]
    print(f"rounds: {len(modes)} ({len(sd)} Elastic-SD, {len(modes) - len(sd)} AR); "
          f"tokens through the tile: {n_out}; "
          f"mean accepted length {(c['accepted_tokens'] + c['rounds_sd'] * len(prompts)) / max(1, c['rounds_sd'] * len(prompts)):.2f}"
          if sd else f"rounds: {len(modes)} AR; tokens through the tile: {n_out}")
    look = c["hb_hits"] + c["hb_misses"] + c["hb_pending"]
    rows = [[k, v] for k, v in c.items() if v]
    rows.append(["hb_hit_rate", round(c["hb_hits"] / look, 4) if look else 0.0])
    print(text_table(["tile counter (golden)", "value"], rows))
    print("simulated cycles per token: n/a (golden model; --rtl measures them)")
    print("RTL tokens equal golden tokens: n/a (golden model only)")
    print(f"decode took {secs:.1f} s")
    if out:
        out.write_text(json.dumps({
            "mode": args.mode, "batch": len(prompts), "tokens": args.tokens,
            "prompts": [bytes(p).decode("utf-8", "replace") for p in prompts],
            "tokens_golden": res.tokens, "tokens_rtl": None, "match": None,
            "text_golden": [bytes(t).decode("utf-8", "replace") for t in res.tokens],
            "rounds": [{"mode": ["AR", "SD"][m], "draft_len": k, "accepted": a}
                       for m, k, a in res.rounds],
            "counters": c, "seconds": round(secs, 2)}, indent=1))
        print(f"wrote {out}")
    if picture:
        _picture(res, len(prompts), picture)        # after the JSON: a refusal keeps it
    return 0


# -- report: Elastic-SD vs AR from the control sequence --------------------------------------

from ..sim.run.report_runs import (BATCHES, RTL_REPORT, TILE_REPORT, cycles_per_token, figures,
                                   recorded_tile_report, report_runs, report_traces)

REPORT_HEAD = ["trace", "batch", "mode", "HB hit rate", "mean accepted len", "HB MB", "LPDDR MB",
               "HB share", "LPDDR KB / token", "cycles / token (RTL)"]


def report_rows(runs):
    return [[r["trace"], r["batch"], r["mode"], *figures(r["counters"], r["batch"]),
             "tile table"] for r in runs]


RTL_HEAD = ["trace", "batch", "mode", "steps", "HB hit rate RTL", "golden",
            "mean accepted len RTL", "golden", "HB MB RTL", "LPDDR MB RTL", "HB share",
            "RTL = golden"]


TILE_HEAD = RTL_HEAD[:-1] + ["cycles / token (RTL)", "RTL = golden"]


def rtl_rows(path, cycles=False):
    """Rows for the RTL report runs in ``path`` (JSON written by
    ``tests/test_esd_ctrl.py``, or with ``cycles`` by ``tests/test_tile.py``:
    then a column of :func:`cycles_per_token` from the RTL counters) beside
    the golden runs recomputed here."""
    import json as _json
    from pathlib import Path
    p = Path(path)
    if not p.is_file():
        return None
    d = _json.loads(p.read_text())
    rows, golden = [], {}
    for r in d["runs"]:
        key = (r["steps"], r["trace"])
        if key not in golden:
            golden[key] = report_runs(steps=r["steps"], traces=[r["trace"]])
        g = next(x for x in golden[key] if x["batch"] == r["batch"] and x["mode"] == r["mode"])
        fr, fg = figures(r["rtl"], r["batch"]), figures(g["counters"], r["batch"])
        same = all(r["rtl"][k] == g["counters"][k] for k in r["rtl"] if k in g["counters"])
        rows.append([r["trace"], r["batch"], r["mode"], r["steps"], fr[0], fg[0], fr[1], fg[1],
                     fr[2], fr[3], fr[4]]
                    + ([round(cycles_per_token(r["rtl"]))] if cycles else [])
                    + ["yes" if same else "NO"])
    return rows


#: Written by ``elmoe3d decode --rtl --json build/measured/decode_rtl_<name>.json``
#: (the real model through the RTL tile); the report's table reads them.
RTL_DECODE_GLOB = "decode_rtl_*.json"

DECODE_HEAD = ["run", "harness", "mode", "batch", "tokens out", "HB hit rate", "mean accepted len",
               "HB MB", "LPDDR MB", "HB share", "LPDDR KB / token", "cycles / token (RTL)",
               "RTL tokens = golden", "trace, counters = golden"]


def rtl_decode_rows(folder):
    """Rows for the ``decode --rtl`` results in ``folder``
    (:data:`RTL_DECODE_GLOB`): the tile's own counters, read over its host
    port, and whether the tokens, the trace and every counter equalled the
    golden tile's. ``cycles / token`` is the decode's simulated cycles (after
    the dense load) per token that left the tile. ``ValueError`` (naming the
    file) for a file that is not such a result."""
    import json as _json
    from pathlib import Path
    rows = []
    for f in sorted(Path(folder).glob(RTL_DECODE_GLOB)):
        try:
            r = _json.loads(f.read_text())
            c, B = r["counters_rtl"], int(r["batch"])
            fig = figures(c, B)
            rows.append([f.stem[len("decode_rtl_"):], r.get("sim", "cocotb"), r["mode"].upper(),
                         B, c["tokens_out"], *fig,
                         round(r["cycles"] / max(1, c["tokens_out"])),
                         "yes" if r["match"] else "NO",
                         "yes" if r["trace_equal"] and not r["counters_differ"] else "NO"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{f}: not an `elmoe3d decode --rtl --json` result ({e!r})") from None
    return rows


def build_section(ctx):
    import json as _json

    from ..golden import esd
    from ..report import Section, md_table, text_table
    ctx.progress("Elastic-SD control sequence (golden)")
    runs = report_runs(ctx.quick)
    rows = report_rows(runs)
    pic = next(r for r in runs if r["mode"] == "SD" and r["batch"] == 4)["run"]
    rounds = [i for i, (m, k) in enumerate(pic.rounds) if m == 1]
    ks = [pic.rounds[i][1] for i in rounds]
    pick = max(range(len(ks)), key=lambda i: (ks[i], -i)) if ks else 0
    wd = esd.round_wavedrom(pic.events, pick, title=f"Elastic-SD round {pick} (batch 4, "
                            f"K = {ks[pick] if ks else 0}, golden control sequence)")
    svg = ctx.outdir / "esd_round.svg"
    (ctx.outdir / "esd_round.json").write_text(_json.dumps(wd, indent=1))
    try:
        import wavedrom
        wavedrom.render(_json.dumps(wd)).saveas(str(svg))
        pic_md = f"\n\n![one Elastic-SD round]({svg.name})"
    except ImportError:
        pic_md = "\n\n(`wavedrom` is not installed: the round picture is esd_round.json)"
    md = ("Golden Elastic-SD control sequence (`golden/esd.py`) replaying routing traces with "
          "random acceptance (each drafted token accepted with p = 0.7 until the first "
          "rejection); AR and SD forced per row (the host's ROUND force field). Bytes are "
          "expert weight bytes; cycles come only from the RTL tile (its table below, "
          "the same traces over fewer decode steps).\n\n" + md_table(REPORT_HEAD, rows) + pic_md)
    rrows = rtl_rows(ctx.outdir / "measured" / RTL_REPORT)
    if rrows:
        md += ("\n\nThe controller RTL (`elmoe3d_esd_ctrl`, Verilator, the blocks it drives "
               "modelled by their golden contracts) replaying the same traces, its counters "
               "read over the host port (`pytest tests/test_esd_ctrl.py -k report` writes "
               f"`build/measured/{RTL_REPORT}`):\n\n" + md_table(RTL_HEAD, rrows))
    else:
        md += (f"\n\nNo controller RTL runs (`build/measured/{RTL_REPORT}`; "
               "`pytest tests/test_esd_ctrl.py -k report` writes it).")
    tile_file = ctx.outdir / "measured" / TILE_REPORT
    recorded = not tile_file.is_file()
    if recorded:
        tile_file = recorded_tile_report()
    trows = rtl_rows(tile_file, cycles=True)
    if trows:
        md += ("\n\nThe tile (`elmoe3d_tile`: controller, tag unit, HB, stream engine and "
               "batched datapath; cocotbext-axi as LPDDR, no idle or back-pressure) replaying "
               "the same traces: each step's rankings sent as token vectors that the tile's "
               "own router routes as the trace (`golden.moe_batched.trace_layer`), every "
               "output bit for bit and every event equal to the golden's; the counters are "
               "the tile's, read over its host port; cycles / token = the tile's cycles in "
               "layer steps per token produced (`pytest -m slow tests/test_tile.py -k "
               f"tile_report` writes `build/measured/{TILE_REPORT}`"
               + ("; this run has none, so these are the recorded runs in "
                  "`sim/data/tile_report.json`, checked against the golden now" if recorded
                  else "") + "):\n\n" + md_table(TILE_HEAD, trows))
    else:
        md += (f"\n\nNo tile runs of the traces (`build/measured/{TILE_REPORT}`; `elmoe3d "
               "tile-run --report` writes it).")
    drows = rtl_decode_rows(ctx.outdir / "measured")
    if drows:
        md += ("\n\nThe in-project MoE LM decoded with every MoE layer on the RTL tile "
               "(`elmoe3d_tile`, `lm` preset, Verilator; `elmoe3d decode --rtl --mode sd|ar "
               "--tokens 8 --json build/measured/decode_rtl_<name>.json`, not run by `make "
               "demo`): the tile's counters, and whether tokens, trace and counters equal the "
               "golden tile's. Harness `native` (the default, seconds per decode) replays the "
               "golden decode's host script open loop; `cocotb` (`--sim cocotb`, minutes) has "
               "the host in the loop, waiting for each answer, so its cycles per token are "
               "higher:\n\n" + md_table(DECODE_HEAD, drows))
    else:
        md += ("\n\nNo RTL decodes of the LM in `build/measured/` (`elmoe3d decode --rtl "
               "--mode sd --tokens 8 --json build/measured/decode_rtl_sd8.json` writes one).")
    data = {"rows": [dict(zip(REPORT_HEAD, r)) for r in rows], "rtl_rows": rrows,
            "tile_rows": [dict(zip(TILE_HEAD, r)) for r in trows or []],
            "rtl_decode_rows": [dict(zip(DECODE_HEAD, r)) for r in drows],
            "counters": [{k: r[k] for k in ("trace", "batch", "mode", "counters")} for r in runs]}
    return Section("Elastic-SD control sequence", md, data, text_table(REPORT_HEAD, rows))

"""``elmoe3d perf``: the paper's claims on the validated tile cycle model.

The tile cycle model's constants, fitted on the report runs and the MoE
layer's T = 1 / 16 passes (:mod:`elmoe3d.sim.perf.validate`; ``--validate``
also checks every other recorded RTL run), then the claims table
(:mod:`elmoe3d.sim.perf.claims`): ELMoE-3D against the LPDDR-only xPU,
xPU-PIM, xPU-NMP, HB-xPU and the per-point best prior, per model and batch,
for the tile's structure today and before the token-lane datapath, beside
the paper's 6.6x / 12.0x / 4.4x / 2.2x / 1.4x, and the acceptance sweep.
``--json F`` writes it; ``--record`` validates and writes
``sim/data/perf_claims.json`` and the tables of README.md and
docs/blocks/perf.md. ``--prefetch N`` instead projects the golden
controller's prefetch during drafts on the steady-state runs
(:mod:`elmoe3d.sim.perf.prefetch`). See ``docs/blocks/perf.md``.
"""

from __future__ import annotations

import json
import time

from ..report import text_table
from ._common import writable_file

NAME = "perf"
HELP = "the paper's claims on the tile cycle model validated against every recorded RTL run"


def register(p):
    p.add_argument("--record", action="store_true",
                   help="write the claims to sim/data/perf_claims.json and regenerate the tables of "
                        "README.md and docs/blocks/perf.md (the paper's four models, the recorded "
                        "batches)")
    p.add_argument("--validate", action="store_true",
                   help="first check the tile cycle model against every recorded RTL run (about "
                        "20 s more)")
    p.add_argument("--model", action="append", default=None, metavar="NAME",
                   help="model name (repeatable or comma-separated; default: the paper's four)")
    p.add_argument("--batch", action="append", default=None, metavar="N",
                   help="batch size in 1..16 (repeatable or comma-separated; default: the "
                        "recorded batches)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes (default 2); results do not depend on it")
    p.add_argument("--json", metavar="FILE", help="write the claims as JSON")
    p.add_argument("--prefetch", type=int, default=None, metavar="N",
                   help="instead of the claims: project prefetch during drafts (the golden "
                        "controller's, N outstanding) on the steady-state runs with the tile "
                        "cycle model, beside the RTL's recorded runs of the tile built with "
                        "--prefetch N where there are any (about a minute)")


def _split(values, conv, what):
    out = []
    for v in values or []:
        for item in str(v).split(","):
            item = item.strip()
            if not item:
                continue
            try:
                out.append(conv(item))
            except ValueError:
                raise ValueError(f"{what} must be an integer, not {item!r}") from None
    return out


def _inputs(args):
    """The models (``None``: the paper's four) and batches (``None``: the
    recorded ones) asked for; ``ValueError`` (one line) on a bad one."""
    from ..golden.esd import MAX_BATCH
    from ..sim.perf.claims import _hw
    from ..sim.perf.models import get_model
    models = [get_model(m).name for m in _split(args.model, str, "Model")] or None
    batches = _split(args.batch, int, "Batch") or None
    for b in batches or []:
        if b < 1:
            raise ValueError(f"Batch must be a positive integer, not {b!r}")
        if b > MAX_BATCH:
            raise ValueError(f"Batch must be in 1..{MAX_BATCH} (the controller's), not {b!r}")
    if args.jobs is not None and not 1 <= args.jobs <= 64:
        raise ValueError(f"--jobs must be in 1..64, not {args.jobs!r}")
    hw, _ = _hw()
    for name in models or []:
        m = get_model(name)
        if m.dense_bytes > hw.hb_bytes:
            raise ValueError(f"HB capacity {hw.hb_gb:g} GB is smaller than the dense weights of "
                             f"{m.name} ({m.dense_bytes / 1e9:.2f} GB)")
    return models, batches


def run(args) -> int:
    if args.prefetch is not None:
        return _prefetch(args)
    return _claims(args)


def _prefetch(args) -> int:
    """``--prefetch N``: the projection table (:mod:`elmoe3d.sim.perf.prefetch`)."""
    from ..config import preset
    from ..sim.perf import prefetch as pf
    slots = min(preset("default").tag_slots, preset("lm").tag_slots)
    if not 1 <= args.prefetch <= slots:
        raise ValueError(f"--prefetch must be in 1..{slots} (the tiles' tag slots), "
                         f"not {args.prefetch!r}")
    if args.record or args.validate or args.model or args.batch:
        raise ValueError("--prefetch projects the steady-state runs only: drop --record, "
                         "--validate, --model and --batch")
    out = writable_file(args.json, "--json") if args.json else None
    t0 = time.monotonic()
    rows = pf.project(args.prefetch)
    print(pf.table(rows, args.prefetch))
    print(f"({time.monotonic() - t0:.1f} s)")
    if out:
        out.write_text(json.dumps({"prefetch": args.prefetch, "rows": rows}, indent=1))
        print(f"wrote {out}")
    return 0


VAL_HEAD = ["set", "role", "runs", "rms error", "max error"]
CLAIMS_HEAD = ["", "x vs xPU mean (max)", "energy vs xPU", "x vs PIM / NMP / HB-xPU",
               "x / energy vs per-point best prior"]


def _claims(args) -> int:
    """The default: validation, then the claims table (module doc)."""
    from ..sim.perf import claims as cl
    from ..sim.perf import validate as val
    models, batches = _inputs(args)
    batches = batches or list(cl.BATCHES)
    if args.record and (models or args.batch):
        raise ValueError("--record writes the recorded table (the paper's four models, batch "
                         f"{', '.join(map(str, cl.BATCHES))}): drop --model and --batch")
    out = writable_file(args.json, "--json") if args.json else None
    t0 = time.monotonic()
    res = None
    if args.validate or args.record:
        res = val.validate()
        print(f"tile cycle model vs the RTL (fit on {', '.join(res['fit_sets'])}; bound "
              f"{res['bound']:.0%} on every other run; {time.monotonic() - t0:.1f} s):")
        print(text_table(VAL_HEAD, [[s, "fit" if x["fit"] else "validation", x["rows"],
                                     f"{x['rms']:.2%}", f"{x['max']:.2%}"]
                                    for s, x in res["sets"].items()]))
        print("every run (cycles; fit rows marked):")
        print(text_table(["set", "run", "phase", "RTL", "model", "error"],
                         [[x["set"] + (" (fit)" if x["fit"] else ""), x["run"], x["phase"],
                           f"{x['rtl']:,.0f}", f"{x['model']:,.0f}", f"{x['error']:+.2%}"]
                          for x in res["rows"]]))
        w = res["worst"]
        print(f"validation rms {res['rms']:.2%}; worst {w['set']} {w['run']} {w['phase']} "
              f"{w['error']:+.2%}")
        if not res["ok"]:
            raise ValueError("The tile cycle model misses a validation run by more than "
                             f"{res['bound']:.0%}: {w['run']} {w['phase']} {w['error']:+.2%}")
        res["three_way"] = val.three_way()
        print("\nthe tile's three ways at its own scale (cycles per output token, steady state; "
              "LPDDR-only AR is the model's alone):")
        print(val.three_way_table(res["three_way"]))
    else:
        print("tile cycle model: constants fitted on the report runs and the MoE layer's T = 1 / 16 "
              "passes; its validation against every other recorded RTL run is `elmoe3d perf "
              "--validate` (and pytest -m perf)")
    jobs = args.jobs or 2
    t1 = time.monotonic()
    rec = cl.jsonable(cl.claims(models, batches, jobs=jobs))
    t_cl = time.monotonic() - t1
    print(f"\nthe paper's claims on the validated model ({', '.join(rec['models'])}; batch "
          f"{', '.join(map(str, rec['batches']))}; MoE layers only, {rec['sim_layers']} simulated "
          f"per model; {t_cl:.1f} s):")
    rows = [["paper", "6.6x (12.0x)", "4.4x", "-", "2.2x / 1.4x"]]
    for name, s in rec["structures"].items():
        m = s["summary"]
        rows.append([name, f"{m['speedup_vs_xpu_mean']:.2f}x ({m['speedup_vs_xpu_max']:.2f}x)",
                     f"{m['energy_vs_xpu_mean']:.2f}x",
                     " / ".join(f"{m[f'speedup_vs_{p}_mean']:.2f}x" for p in cl.PRIORS),
                     f"{m['speedup_vs_best_prior_mean']:.2f}x / {m['energy_vs_best_prior_mean']:.2f}x"])
    print(text_table(CLAIMS_HEAD, rows))
    print("\nper model and batch:")
    print(cl.points_table(rec))
    if rec["sweep"]:
        print("\nacceptance sweep (the paper's 0.33-0.91), ELMoE-3D today:")
        print(text_table(["model", "B", "acceptance", "mode", "x vs xPU", "x vs best prior"],
                         [[r["model"], r["batch"], r["rate"], r["mode"],
                           f"{r['speedup_vs_xpu']:.2f}x",
                           f"{r['speedup_vs_best']:.2f}x ({r['best_prior']})"]
                          for r in rec["sweep"]]))
    if res is not None:
        rec["validation"] = res
    print("constants (cycles): " + ", ".join(f"{k} {v:g}" for k, v in rec["constants"].items()))
    rec["seconds"] = round(time.monotonic() - t0, 1)
    rec["command"] = "elmoe3d perf --validate --record" if args.record else "elmoe3d perf"
    print(f"\nperf took {rec['seconds']} s ({jobs} worker processes)")
    text = json.dumps(cl.jsonable(rec), indent=1)
    if out:
        out.write_text(text + "\n")
        print(f"wrote {out}")
    if args.record:
        from .. import sim
        from pathlib import Path
        cl.recorded_path().write_text(text + "\n")
        print(f"wrote {cl.recorded_path()}")
        root = Path(sim.__file__).resolve().parent.parent
        for f in (root / "README.md", root / "docs" / "blocks" / "perf.md"):
            if f.is_file() and cl.write_tables(f, rec):
                print(f"updated {f}")
        from ..sim.flow.generated import replace_between
        doc = root / "docs" / "blocks" / "perf.md"
        if replace_between(doc, val.THREE_WAY_MARKERS, val.three_way_table(res["three_way"])):
            print(f"updated {doc} (three ways)")
        if replace_between(doc, val.VALIDATION_MARKERS, val.validation_table(res)):
            print(f"updated {doc} (validation)")
    return 0


def _recorded_claims_md() -> list:
    """The recorded claims on the validated tile model
    (``sim/data/perf_claims.json``, ``elmoe3d perf --record``) as report
    lines: the validation and the headline table."""
    from ..sim.perf import claims as cl
    try:
        rec = json.loads(cl.recorded_path().read_text())
    except (OSError, ValueError):
        return ["No recorded claims (`elmoe3d perf --record` writes sim/data/perf_claims.json).\n"]
    val = rec.get("validation") or {}
    sets = ", ".join(f"{k} {x['rms']:.2%} rms / {x['max']:.2%} max"
                     for k, x in (val.get("sets") or {}).items() if not x["fit"])
    return [f"The paper's claims on the tile cycle model validated against every recorded RTL run "
            f"(`{rec.get('command', 'elmoe3d perf --record')}`; validation: {sets}):\n",
            cl.readme_table(rec), ""]


def build_section(ctx):
    """Short summary for ``make demo``: the recorded claims on the validated
    tile model (``sim/data/perf_claims.json``), per point and beside the
    paper."""
    from ..report import Section
    from ..sim.perf import claims as cl
    ctx.progress("performance model (recorded claims)")
    md = _recorded_claims_md()
    try:
        rec = json.loads(cl.recorded_path().read_text())
    except (OSError, ValueError):
        rec = None
    if rec:
        md += ["Per model and batch:\n", cl.points_table(rec), "",
               "Details, the validation run by run and what the model reproduces or refutes: "
               "docs/blocks/perf.md; `elmoe3d perf` recomputes the table (about a minute on 2 "
               "cores).", ""]
    stdout = cl.readme_table(rec) if rec else md[0]
    return Section("System performance model vs the paper", "\n".join(md),
                   {"claims": {k: rec[k] for k in ("structures", "acceptance", "sweep", "constants",
                                                   "batches", "models") if k in rec}
                    if rec else None}, stdout)

"""``elmoe3d moe-bench``: the MoE layer's cycles per pass against each pass's
bound (HB, LPDDR or PE), per role and residency, for passes of 1, 4, 16 tokens
and a whole verification step (:mod:`elmoe3d.sim.run.moe_bench`).

``elmoe3d moe-bench`` runs ``default`` (about ten minutes, plus the
Verilator build the first time); ``--record`` writes the recorded copy and
the README's and the block page's tables from it. ``--preset paper-ratio``
measures the paper's ratios (an hour or more).
"""

from __future__ import annotations

import json
import sys
import time

NAME = "moe-bench"
HELP = ("the MoE layer's cycles per pass against the pass's HB / LPDDR / PE bound "
        "(Verilator), per role, T = 1, 4, 16 and a whole verification")


def register(p):
    p.add_argument("--preset", default="default", metavar="P[,P]",
                   help="presets to measure (comma list; default: default; paper-ratio runs "
                        "DRAFT and VERIFY passes, an hour or more)")
    p.add_argument("--points", default=None, metavar="NAME[,NAME]",
                   help="only these points, e.g. DRAFT_T16,VERIFY_T80 (default: all at default; "
                        "DRAFT and VERIFY at 16 tokens and a whole step at paper-ratio)")
    p.add_argument("--seed", type=int, default=1, help="the bench's random seed (default 1)")
    p.add_argument("--json", metavar="FILE",
                   help="results as JSON (default build/measured/moe_bench.json)")
    p.add_argument("--record", action="store_true",
                   help="write sim/data/moe_cycles.json and the tables of README.md and "
                        "docs/blocks/moe_layer.md from it (the default points of both presets)")


def run(args) -> int:
    from ..config import preset
    from ..report import text_table
    from ..sim.run import moe_bench as mb
    from ._common import writable_file
    names = [x.strip() for x in args.preset.split(",") if x.strip()]
    if not names:
        raise ValueError("--preset names nothing")
    for n in names:
        preset(n)                       # an unknown name fails here, before any build
    points = [x.strip() for x in args.points.split(",") if x.strip()] if args.points else None
    if args.record and (points or set(names) != set(mb.PRESETS)):
        raise ValueError(f"--record records every point of {', '.join(mb.PRESETS)}: "
                         "drop --points and --preset")
    out = writable_file(str(mb.recorded_path()) if args.record
                        else (args.json or "build/measured/moe_bench.json"), "--json")
    t0 = time.monotonic()
    rec = {"command": "elmoe3d moe-bench" + (f" --preset {args.preset}"
                                              if set(names) != set(mb.PRESETS) else "")
           + (f" --points {args.points}" if points else "") + f" --seed {args.seed}",
           "presets": {}}
    for n in names:
        print(f"[{time.monotonic() - t0:6.1f} s] {n}: building (cached after the first run) "
              "and measuring", file=sys.stderr, flush=True)
        rec["presets"][n] = mb.run(n, writable_file(f"build/measured/moe_bench-{n}.json"),
                                   points=points, seed=args.seed)
        rows = [[k, f["role"], f["policy"], f["tokens_per_pass"], round(f["cycles_per_pass"]),
                 round(f["bound_cycles_per_pass"]), f["bound_by"], f"{f['efficiency']:.3f}",
                 round(f["ext_beats_per_expert"]), round(f["hb_words_per_token"], 1)]
                for k, f in rec["presets"][n]["figures"].items()]
        print(f"{n}:")
        print(text_table(["point", "role", "weights", "tokens", "cycles / pass", "bound",
                          "bound by", "efficiency", "LPDDR beats / expert",
                          "HB words / token"], rows))
    out.write_text(json.dumps(rec, indent=1))
    print(f"wrote {out} ({time.monotonic() - t0:.0f} s; each preset's figures also in "
          "build/measured/moe_bench-<preset>.json)")
    if args.record:
        from .record import repo_readme
        readme = repo_readme()
        for path in (readme, readme.parent / "docs" / "blocks" / "moe_layer.md"):
            changed = mb.write_readme_table(path, rec)
            print(f"{'rewrote' if changed else 'unchanged:'} {path}'s pass table")
    return 0

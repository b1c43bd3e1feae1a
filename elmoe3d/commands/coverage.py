"""``elmoe3d coverage``: functional-coverage summary per block, from the
``build/coverage/<block>.json`` files that ``make test`` writes
(:mod:`elmoe3d.tb.coverage`), read by :mod:`elmoe3d.sim.run.coverage_files`."""

from __future__ import annotations

from pathlib import Path

from ..report import md_table, text_table

NAME = "coverage"
HELP = "functional coverage per block (coverpoint and cross bins hit), from build/coverage/"

HEAD = ["block", "coverpoints %", "bins", "crosses %", "cross bins", "transactions",
        "meets bar", "coverpoint bins missed"]


def register(p):
    p.add_argument("--dir", default="build/coverage", metavar="DIR",
                   help="coverage folder (default: build/coverage, written by `make test`)")


def rows(covs: dict) -> list[list]:
    out = []
    for block, cov in covs.items():
        s = cov["summary"]
        missed = s["coverpoints_missed"]
        out.append([block, s["coverpoint_pct"], "{}/{}".format(*s["coverpoint_bins"]),
                    s["cross_pct"], "{}/{}".format(*s["cross_bins"]), s["transactions"],
                    "yes" if s["meets_bar"] else "no",
                    ", ".join(missed[:6]) + (" ..." if len(missed) > 6 else "")])
    return out


def run(args) -> int:
    from ..sim.run.coverage_files import load_coverage
    d = Path(args.dir)
    if not d.is_dir():
        raise ValueError(f"no coverage folder {args.dir!r}; run `make test` first")
    covs = load_coverage(d)
    if not covs:
        raise ValueError(f"no coverage files in {args.dir!r}; run `make test` first")
    print(text_table(HEAD, rows(covs)))
    print("bar: 100% of coverpoint bins, >= 75% of cross bins (OpenTitan V2)")
    return 0


def build_section(ctx):
    from ..report import Section
    from ..sim.run.coverage_files import load_coverage
    ctx.progress("functional coverage (from make test's files)")
    d = ctx.outdir / "coverage"
    covs = load_coverage(d) if d.is_dir() else {}
    if not covs:
        return Section("Functional coverage", f"No coverage files in `{d}`: run `make test` "
                       "(its cocotb testbenches write them) and then `make demo`.", {})
    r = rows(covs)
    md = ("Bins hit by the default `make test` run (all tests, both simulators, every "
          "parameter set, merged), from `build/coverage/<block>.json`; bar: 100% of "
          "coverpoint bins and >= 75% of cross bins.\n\n" + md_table(HEAD, r))
    return Section("Functional coverage", md, {b: c["summary"] for b, c in covs.items()},
                   text_table(HEAD, r))

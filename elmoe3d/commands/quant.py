"""``elmoe3d quant --json FILE``: the bit-axis quantisation study."""

from __future__ import annotations

import json

from ..report import Progress, md_table, text_table
from ._common import writable_file

NAME = "quant"
HELP = "bit-axis study: MSB truncation vs LSB-augmented vs re-quantised copy, per s/k"


def register(p):
    p.add_argument("--json", metavar="FILE", help="write the full study as JSON")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic tensors (default 0)")
    p.add_argument("--no-real", action="store_true",
                   help="skip the real transformer weights even if installed")


HEAD = ["dataset", "s", "k", "scheme", "bias", "max|e|", "SQNR dB", "matvec rel err"]


def rows(study, datasets=None, ks=None):
    out = []
    for dname, rs in study["results"].items():
        if datasets and not any(dname.startswith(d) for d in datasets):
            continue
        for r in rs:
            if r["k"] * r["s"] == 8 or (ks and (r["s"], r["k"]) not in ks):
                continue
            out.append([dname, r["s"], r["k"], r["scheme"], round(r["bias"], 3),
                        round(r["max_abs"], 3),
                        "inf" if r["sqnr_db"] is None else round(r["sqnr_db"], 2),
                        "-" if "matvec_rel_err" not in r else round(r["matvec_rel_err"], 4)])
    return out


def run(args) -> int:
    from ..sim.quant_study import run_study
    out = writable_file(args.json) if args.json else None
    study = run_study(seed=args.seed, real=not args.no_real, progress=Progress())
    for note in study["notes"]:
        print(note)
    first_real = [d for d in study["results"] if d.startswith("minilm")][:1]
    print(text_table(HEAD, rows(study, ["int8_all", "gaussian", "laplacian"] + first_real,
                                ks={(4, 1), (2, 1), (2, 2), (2, 3)})))
    if out:
        out.write_text(json.dumps(study, indent=2))
        print(f"wrote {out}")
    return 0


def build_section(ctx):
    from ..report import Section
    from ..sim.quant_study import run_study
    ctx.progress("quantisation study")
    study = run_study(real=True)
    first_real = [d for d in study["results"] if d.startswith("minilm")][:1]
    r = rows(study, ["int8_all", "gaussian"] + first_real, ks={(4, 1), (2, 2)})
    md = ("Error in INT8 units vs the INT8 weights (`elmoe3d quant --json build/quant.json` "
          "prints the full grid). `requant` needs its own storage; `augmented` does not.\n\n"
          + "\n".join(f"- {n}" for n in study["notes"]) + "\n\n" + md_table(HEAD, r))
    return Section("Bit-axis quantisation study", md, study, text_table(HEAD, r))

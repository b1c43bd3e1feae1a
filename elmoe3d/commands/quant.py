"""``elmoe3d quant --json FILE``: the bit-axis quantisation study - weight
errors per slice width / kept planes / scale granularity, and the same rows
on the small MoE LM (perplexity, top-1 agreement, Elastic-SD acceptance)."""

from __future__ import annotations

import json

from ..report import Progress, md_table, text_table
from ._common import writable_file

NAME = "quant"
HELP = ("bit-axis study: MSB truncation vs LSB-augmented vs re-quantised copy, per s/k and scales, "
        "on weights and on the small MoE LM")


def register(p):
    p.add_argument("--json", metavar="FILE", help="write the full study as JSON")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic tensors (default 0)")
    p.add_argument("--no-real", action="store_true",
                   help="skip the real transformer weights even if installed")
    p.add_argument("--no-lm", action="store_true", help="skip the small MoE LM rows")
    p.add_argument("--lm-windows", type=int, default=16, metavar="N",
                   help="held-out windows for the LM perplexity/agreement (1..64, default 16)")


HEAD = ["dataset", "s", "k", "scheme", "bias", "max|e|", "SQNR dB", "matvec rel err"]
KS = {(4, 1), (2, 1), (2, 2), (2, 3)}
LM_HEAD = ["s", "kept", "draft bits", "scales", "scheme", "ppl", "vs INT8", "top-1 agree",
           "accepted 50% L=4", "accepted 100% L=8"]


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


def lm_rows(lm):
    f = lambda v, d=3: "-" if v is None else round(v, d)
    return [[r["s"], r["k"], r["bits"], r["scales"], r["scheme"], round(r["ppl"], 3),
             f"{r['ppl_vs_int8']:+.1%}", round(r["agreement"], 3), f(r["accepted_50pct_L4"]),
             f(r["accepted_100pct_L8"])] for r in lm["rows"]]


def _evidence():
    try:
        from ..sim.lm.evidence import DATA_DIR, RESULT
        return json.loads((DATA_DIR / RESULT).read_text())
    except (OSError, ValueError, ImportError):
        return None


def run(args) -> int:
    from ..sim.lm.quant_study import lm_bit_axis, run_study
    if not 1 <= args.lm_windows <= 64:
        raise ValueError(f"--lm-windows must be in 1..64, not {args.lm_windows!r}")
    out = writable_file(args.json, "--json") if args.json else None
    prog = Progress(0 if args.no_lm else 1)  # run_study adds one step per dataset
    study = run_study(seed=args.seed, real=not args.no_real, progress=prog)
    for note in study["notes"]:
        print(note)
    first_real = [d for d in study["results"] if d.startswith("minilm")][:1]
    print(text_table(HEAD, rows(study, ["int8_all", "gaussian", "laplacian"] + first_real, ks=KS)))
    if not args.no_lm:
        prog(f"quant study: the small MoE LM's experts at each slice configuration "
             f"({args.lm_windows} windows)")
        lm = lm_bit_axis(args.lm_windows, evidence=_evidence())
        study["lm"] = lm
        print("\n" + "\n".join(lm["notes"]))
        print(text_table(LM_HEAD, lm_rows(lm)))
    if out:
        out.write_text(json.dumps(study, indent=2))
        print(f"wrote {out}")
    return 0


def build_section(ctx):
    from ..report import Section
    from ..sim.lm.quant_study import lm_bit_axis, run_study
    ctx.progress("quantisation study")
    study = run_study(real=True)
    first_real = [d for d in study["results"] if d.startswith("minilm")][:1]
    r = rows(study, ["int8_all", "gaussian"] + first_real, ks=KS)
    md = ("Error in INT8 units vs the INT8 weights (`elmoe3d quant --json build/quant.json` "
          "prints the full grid). `requant` needs its own storage; `augmented` does not. "
          "`:tensor` datasets use one INT8 scale per matrix.\n\n"
          + "\n".join(f"- {n}" for n in study["notes"]) + "\n\n" + md_table(HEAD, r))
    stdout = text_table(HEAD, r)
    try:
        ev = _evidence()
        lm = lm_bit_axis(0 if ev and ev.get("bit_axis") else 8, evidence=ev)
        study["lm"] = lm
        md += ("\n\nThe same bit-slice rows on the small MoE LM (experts at the draft precision):\n\n"
               + "\n".join(f"- {n}" for n in lm["notes"]) + "\n\n" + md_table(LM_HEAD, lm_rows(lm)))
        stdout += "\n" + text_table(LM_HEAD, lm_rows(lm))
    except (OSError, ValueError) as e:               # no LM weights: the weight study alone
        md += f"\n\n(small MoE LM rows skipped: {e})"
    return Section("Bit-axis quantisation study", md, study, stdout)

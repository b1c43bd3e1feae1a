"""``elmoe3d evidence --json FILE --plot DIR``: real-model evidence on the
small MoE LM trained here (perplexity per precision, routing statistics,
routing traces, Elastic-SD acceptance). See :mod:`elmoe3d.sim.lm.evidence`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from ..extras import require
from ..report import Progress, Section, md_table, save_png, text_table
from ._common import writable_dir, writable_file

NAME = "evidence"
HELP = "small MoE LM trained here: routing statistics and Elastic-SD acceptance (real model)"

#: the cached result of the full run (written by `elmoe3d evidence --update-data`)
CACHE = "evidence.json"


def register(p):
    p.add_argument("--json", metavar="FILE", help="write the full result as JSON")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--prompts", type=int, default=None,
                   help="held-out prompts (default: all 256 stored)")
    p.add_argument("--quick", action="store_true",
                   help="a fast slice: 32 prompts, hotness/random at 50%% residents, the bit-axis "
                        "variants s4k1/s2k1 per channel and s4k1 per tensor, the committed model only")
    p.add_argument("--models", default=None, metavar="A,B",
                   help="trained models to measure (default: every committed one; e.g. seed1234,seed1)")
    p.add_argument("--acceptance", metavar="FILE", default=None,
                   help="also write the acceptance rows for the system model to FILE")
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="also write the real routing trace (system-model format) to FILE")
    p.add_argument("--update-data", action="store_true",
                   help="refresh the committed copies in sim/lm/data: acceptance.json, "
                        "routing_trace.npz and evidence.json (the report reads them)")


def _setup(args):
    from ..golden.lm import model_paths
    from ..sim.lm.evidence import PRIMARY, Setup
    n = args.prompts
    if n is not None and (isinstance(n, bool) or n < 1 or n > 256):
        raise ValueError(f"--prompts must be in 1..256, not {n!r}")
    known = model_paths()
    models = tuple(m.strip() for m in (args.models or "").split(",") if m.strip())
    for m in models:
        if m not in known:
            raise ValueError(f"Unknown trained model {m!r}; committed: {', '.join(known)}")
    if args.quick:
        return Setup(n_prompts=n or 32, fractions=(0.5, 1.0), policies=("hotness", "random"),
                     variants=(PRIMARY, (4, 1, "tensor"), (2, 1, "channel")),
                     variant_fractions=(0.5, 1.0), ppl_windows=16,
                     batch_groups=tuple(g for g in (4,) if (n or 32) % g == 0),
                     batch_policies=("hotness", "random"), models=models or ("seed1234",))
    n = n or 256
    return Setup(n_prompts=n, batch_groups=tuple(g for g in (4, 16) if n % g == 0 and g < n),
                 models=models)


def _model_names(s) -> list[str]:
    from ..golden.lm import model_paths
    return list(s.models) or list(model_paths())


def _experts() -> int:
    """Routed experts of the committed LM (every trained model has the same shape)."""
    from ..golden.lm import load_weights, model_paths
    _, meta = load_weights(next(iter(model_paths().values())))
    return int(meta["shape"]["experts"])


def run(args) -> int:
    from ..sim.lm import evidence as ev
    s = _setup(args)
    if args.update_data and args.quick:
        raise ValueError("--update-data needs the full run, not --quick")
    # every output is checked before the run (minutes), not after it
    out = writable_file(args.json, "--json") if args.json else None
    plot_dir = None
    if args.plot:
        require("plot", "elmoe3d evidence --plot", ("matplotlib",))
        plot_dir = writable_dir(args.plot, "--plot")
    acc = writable_file(args.acceptance, "--acceptance") if args.acceptance else \
        (ev.DATA_DIR / ev.ACCEPTANCE if args.update_data else None)
    trace = writable_file(args.trace, "--trace") if args.trace else \
        (ev.DATA_DIR / ev.TRACE if args.update_data else None)
    if args.update_data:
        for f in (ev.DATA_DIR / ev.ACCEPTANCE, ev.DATA_DIR / ev.TRACE, ev.DATA_DIR / CACHE):
            writable_file(f, "--update-data")
    prog = Progress(len(_model_names(s)) * s.planned_steps(_experts()))
    res = ev.run(s, log=lambda m: prog(m), trace_path=trace, acceptance_path=acc)
    print(summary_text(res))
    if out:
        out.write_text(json.dumps(res, indent=1))
        print(f"wrote {out}")
    if args.update_data:
        (ev.DATA_DIR / CACHE).write_text(json.dumps(res, indent=1))
        print(f"wrote {ev.DATA_DIR / CACHE}")
    if acc is not None:
        print(f"wrote {acc}")
    if trace is not None:
        print(f"wrote {trace} ({res['trace']['format']})")
    if plot_dir is not None:
        for p in plots(res, plot_dir):
            print(f"wrote {p}")
    return 0


# --- rendering ------------------------------------------------------------------------

def _row(rows, **kw):
    for r in rows:
        if all(r[k] == v for k, v in kw.items()):
            return r
    return None


def _primary(rows):
    """Rows of the design point (4-bit slices, keep 1, per-channel, dense INT8)."""
    return [r for r in rows if (r.get("slice_bits", 4), r.get("keep", 1), r.get("scales", "channel"),
                                r.get("dense_precision", "full")) == (4, 1, "channel", "full")
            and r["precision"] in ("truncated", "augmented", "full")]


def acceptance_table(res, lens=(2, 4, 8)):
    head = ["residents", "policy", "precision"] + [f"accepted L={L}" for L in lens] + \
           [f"rate L={L}" for L in lens]
    rows = _primary(res["acceptance"])
    keys, seen_all = [], set()
    for r in rows:
        k = (r["resident_fraction"], r["policy"], r["precision"])
        if r["resident_fraction"] >= 1:          # every policy gives the same residents
            if r["precision"] in seen_all and k not in keys:
                continue
            seen_all.add(r["precision"])
        if k not in keys:
            keys.append(k)
    out = []
    for f, pol, prec in keys:
        rr = [_row(rows, resident_fraction=f, policy=pol, precision=prec, draft_len=L) for L in lens]
        out.append([f"{f:.0%}", pol if f < 1 else "(all)", prec]
                   + [round(x["mean_accepted"], 3) for x in rr]
                   + [round(x["acceptance_rate"], 3) for x in rr])
    return head, out


def routing_table(res):
    head = ["layer", "top expert share", "skew (x uniform)", "top-25% share", "gini",
            "reuse (uniform k/E)", "popularity entropy", "token entropy"]
    out = [[r["layer"], round(r["top_share"], 3), round(r["skew"], 2), round(r["top25_share"], 3),
            round(r["gini"], 3), f"{r['reuse']:.3f} ({r['reuse_uniform']:.3f})",
            round(r["pop_entropy"], 3), round(r["token_entropy"], 3)] for r in res["routing"]]
    return head, out


def working_set_table(res, batches=(1, 2, 4, 8, 16)):
    head = ["batch", "distinct experts/layer", "fraction of E", "uniform routing"]
    out = [[w["batch"], round(w["distinct"], 2), round(w["fraction"], 3), round(w["uniform"], 2)]
           for w in res["working_set"] if w["batch"] in batches]
    return head, out


def batched_table(res):
    """Mean accepted bytes (augmented, mean over draft lengths 1-8) per batch
    size sharing one resident set, per resident fraction and policy."""
    rows = [dict(r, batch=1) for r in _primary(res["acceptance"]) if r["precision"] == "augmented"]
    rows += res.get("batched", [])
    batches = sorted({r["batch"] for r in rows})
    pols = [p for p in ("hotness", "random", "oracle") if any(r["policy"] == p for r in rows)]
    fr = sorted({r["resident_fraction"] for r in res.get("batched", [])})
    head = ["batch", "residents"] + pols + ["hotness vs random"]
    out = []
    for b in batches:
        for f in fr:
            vals = {}
            for p in pols:
                v = [r["mean_accepted"] for r in rows if r["batch"] == b and r["policy"] == p
                     and r["resident_fraction"] == f]
                vals[p] = float(np.mean(v)) if v else None
            if vals.get("hotness") is None:
                continue
            gain = (f"{vals['hotness'] / vals['random'] - 1:+.1%}" if vals.get("random") else "-")
            out.append([b, f"{f:.0%}"] + [round(vals[p], 3) if vals[p] is not None else "-"
                                          for p in pols] + [gain])
    return head, out


def sd_loop_table(res):
    rows = res.get("sd_loop", [])
    fr = sorted({r["resident_fraction"] for r in rows})
    head = ["residents", "draft length", "hotness (tag unit, draft-fed)", "random",
            "hotness vs random", "drafted experts resident"]
    out = []
    for f in fr:
        h = next((r for r in rows if r["resident_fraction"] == f and r["policy"] == "hotness"), None)
        r_ = next((r for r in rows if r["resident_fraction"] == f and r["policy"] == "random"), None)
        if not h or not r_:
            continue
        out.append([f"{f:.0%}", h["draft_len"], round(h["mean_accepted"], 3),
                    round(r_["mean_accepted"], 3), f"{h['mean_accepted'] / r_['mean_accepted'] - 1:+.1%}",
                    round(h["draft_resident_rate"], 3)])
    return head, out


def bit_axis_table(res):
    """Per bit-slice variant (the first model): perplexity, top-1 agreement
    with the INT8 target, and acceptance (hotness residents)."""
    head = ["slices", "kept", "draft bits", "scales", "target ppl", "truncated ppl", "augmented ppl",
            "truncated agree", "augmented agree", "trunc accepted", "aug accepted", "aug vs trunc",
            "trunc rate 100% L=8", "aug rate 100% L=8"]
    out = []
    for r in res.get("bit_axis_claims", []):
        f = lambda k, d=3: "-" if r.get(k) is None else round(r[k], d)
        out.append([r["slice_bits"], r["keep"], r["draft_bits"], r["scales"], f("target_ppl"),
                    f("truncated_ppl", 2), f("augmented_ppl", 3), f("truncated_agreement"),
                    f("augmented_agreement"), f("truncated_mean_accepted"),
                    f("augmented_mean_accepted"),
                    "-" if r.get("gain") is None else f"{r['gain']:+.1%}",
                    f("truncated_all_resident_rate"), f("augmented_all_resident_rate")])
    return head, out


def bit_axis_acceptance_table(res, lens=(1, 4, 8)):
    """Mean accepted bytes per bit-slice variant, hotness residents, truncated /
    augmented / FULL (mean over models when several were measured)."""
    rows = res.get("acceptance_mean") or res["acceptance"]
    head = ["slices", "kept", "scales", "residents", "precision"] + [f"accepted L={L}" for L in lens] \
        + ["overlap L=4", "models"]
    keys = []
    for r in rows:
        if r.get("dense_precision", "full") != "full" or r["policy"] != "hotness" or \
                r["precision"] not in ("truncated", "augmented", "full"):
            continue
        k = (r.get("slice_bits", 4), r.get("keep", 1), r.get("scales", "channel"),
             r["resident_fraction"], r["precision"])
        if k not in keys:
            keys.append(k)
    out = []
    order = {"truncated": 0, "augmented": 1, "full": 2}
    for sb, kp, sc, f, prec in sorted(keys, key=lambda k: (-k[0], k[1], k[2], k[3], order[k[4]])):
        rr = [_row(rows, slice_bits=sb, keep=kp, scales=sc, resident_fraction=f, precision=prec,
                   policy="hotness", dense_precision="full", draft_len=L) for L in lens]
        r4 = _row(rows, slice_bits=sb, keep=kp, scales=sc, resident_fraction=f, precision=prec,
                  policy="hotness", dense_precision="full", draft_len=4)
        out.append([sb, kp, sc, f"{f:.0%}", prec] + [round(x["mean_accepted"], 3) if x else "-" for x in rr]
                   + [round(r4["overlap"], 3) if r4 and r4.get("overlap") is not None else "-",
                      (r4 or {}).get("models", 1)])
    return head, out


ACROSS_KEYS = (("hotness_vs_random", "hotness vs random residents (batch 1)"),
               ("hotness_vs_random_batch4", "hotness vs random, batch 4 sharing a cache"),
               ("hotness_vs_random_batch16", "hotness vs random, batch 16 sharing a cache"),
               ("augmented_vs_truncated", "augmented vs truncated, s=4 per-channel"),
               ("s4k1-tensor:gain", "augmented vs truncated, s=4 per-tensor"),
               ("s2k1-channel:gain", "augmented vs truncated, s=2 keep 1"),
               ("s2k2-channel:gain", "augmented vs truncated, s=2 keep 2"),
               ("s2k1-channel:truncated_all_resident_rate", "truncated acceptance, s=2 keep 1, all resident, L=8"),
               ("s2k1-channel:augmented_all_resident_rate", "augmented acceptance, s=2 keep 1, all resident, L=8"),
               ("s4k1-channel:truncated_ppl_cost", "truncated perplexity cost, s=4 per-channel"),
               ("s4k1-channel:augmented_ppl_cost", "augmented perplexity cost, s=4 per-channel"),
               ("s4k1-tensor:truncated_ppl_cost", "truncated perplexity cost, s=4 per-tensor"),
               ("s4k1-tensor:augmented_ppl_cost", "augmented perplexity cost, s=4 per-tensor"),
               ("s2k1-channel:truncated_agreement", "truncated top-1 agreement, s=2 keep 1"),
               ("s2k1-channel:augmented_agreement", "augmented top-1 agreement, s=2 keep 1"),
               ("ppl_int8_vs_float", "INT8 perplexity cost vs float"))


def across_table(res):
    """Every conclusion per trained model (with its within-model 95% CI) and
    the mean and spread across models."""
    am = res.get("across_models", {})
    names = [m["name"] for m in res.get("models", [])]
    head = ["conclusion"] + names + ["mean", "std", "range"]
    out = []
    for key, label in ACROSS_KEYS:
        a = am.get(key)
        if not a:
            continue
        pct = "rate" not in key and "agreement" not in key
        fmt = (lambda v: f"{v:+.1%}") if pct else (lambda v: f"{v:.3f}")
        cells = []
        for n in names:
            v = a["values"].get(n)
            ci = a["ci95_within"].get(n)
            cells.append("-" if v is None else fmt(v) + (f" [{fmt(ci[0])}..{fmt(ci[1])}]" if ci else ""))
        out.append([label] + cells + [fmt(a["mean"]), (f"{a['std'] * 100:.1f} pp" if pct else
                                                         f"{a['std']:.3f}"),
                                      f"{fmt(a['min'])}..{fmt(a['max'])}"])
    return head, out


def _across(res, key, pct=True) -> str:
    a = res.get("across_models", {}).get(key)
    if not a or a["models"] < 2:
        return ""
    f = (lambda v: f"{v:+.1%}") if pct else (lambda v: f"{v:.3f}")
    sd = f"{a['std'] * 100:.1f} pp" if pct else f"{a['std']:.3f}"
    return (f"; across {a['models']} trained models mean {f(a['mean'])} (range {f(a['min'])}.."
            f"{f(a['max'])}, std {sd})")


def verdicts(res) -> list[str]:
    """Plain statements of which paper claims hold, from the measured numbers."""
    out = []
    rows = _primary(res["acceptance"])
    c = res.get("claims", {})
    pols = {r["policy"] for r in rows}
    pol = "hotness" if "hotness" in pols else sorted(pols)[0]
    fr = sorted({r["resident_fraction"] for r in rows if r["resident_fraction"] < 1})
    mid = 0.5 if 0.5 in fr else (fr[len(fr) // 2] if fr else 1.0)
    a = _row(rows, resident_fraction=mid, policy=pol, precision="augmented", draft_len=4)
    if a:
        rate = a["acceptance_rate"]
        verdict = "HOLDS" if rate >= 0.33 else "DOES NOT HOLD"
        out.append(f"**Self-draft alignment: {verdict}.** The MSB-augmented draft restricted to "
                   f"{mid:.0%} resident experts ({pol}) accepts {rate:.1%} of drafted bytes at "
                   f"draft length 4 (mean {a['mean_accepted']:.2f} of 4); the paper reports "
                   f"0.33-0.91 on its models (criterion: >= 0.33).")
    ci = res.get("claims_ci", {})

    def _ci(name):
        if name not in ci:
            return ""
        lo, hi = ci[name]["ci95"]
        return f", 95% CI {lo:+.1%}..{hi:+.1%} over prompts"

    avt = c.get("augmented_vs_truncated")
    if avt and avt.get("truncated"):
        g = avt["augmented"] / avt["truncated"] - 1
        t_all = avt["all_resident_truncated"]
        lo = ci.get("augmented_vs_truncated", {}).get("ci95", [g, g])[0]
        if g <= 0.0:
            verdict = "DOES NOT HOLD"
        elif lo <= 0.0:
            verdict = "NOT SHOWN (the gain's 95% interval includes zero)"
        elif t_all is not None and t_all < 0.33:
            verdict = "HOLDS"
        else:
            verdict = ("PARTLY HOLDS: augmentation helps, but truncated MSB drafts do not fail "
                       "on this model")
        out.append(f"**LSB augmentation needed for MSB-only drafts (4-bit slices, per-channel "
                   f"scales - the design point): {verdict}.** Mean accepted "
                   f"length (draft lengths 1-8, partial resident fractions, {avt['policy']}): "
                   f"augmented {avt['augmented']:.3f} vs truncated {avt['truncated']:.3f} "
                   f"({g:+.1%}{_ci('augmented_vs_truncated')}"
                   f"{_across(res, 'augmented_vs_truncated')}); FULL-precision residents "
                   f"{avt['full']:.3f}. With every expert resident, draft length 8: acceptance "
                   f"rate augmented {avt['all_resident_augmented']:.3f} vs truncated "
                   f"{t_all:.3f} (FULL: 1.0 by construction).")
    hvr = c.get("hotness_vs_random")
    if hvr and hvr.get("gain") is not None:
        g = hvr["gain"]
        lo = ci.get("hotness_vs_random", {}).get("ci95", [g, g])[0]
        verdict = ("DOES NOT HOLD" if g <= 0.02 else
                   "NOT SHOWN (the gain's 95% interval includes zero)" if lo <= 0 else
                   "HOLDS" if g >= 0.15 else "HOLDS IN DIRECTION, SMALLER")
        per = ", ".join(f"{float(f):.0%}: {v:+.1%}" for f, v in hvr["gain_per_fraction"].items()
                        if v is not None)
        extra = ""
        if hvr.get("gain_rank") is not None:
            extra += f"; hotness ranking of all experts {hvr['gain_rank']:+.1%}"
        if hvr.get("oracle") is not None and hvr.get("random"):
            extra += f"; oracle {hvr['oracle'] / hvr['random'] - 1:+.1%}"
        bci = res.get("batched_ci", {})
        batch_txt = "; ".join(f"batch {b}: {v['gain']:+.1%} (95% CI {v['ci95'][0]:+.1%}.."
                              f"{v['ci95'][1]:+.1%})" for b, v in bci.items() if b != "1")
        if batch_txt:
            batch_txt = (" With a batch of independent prompts sharing one resident set "
                         f"(one HB cache): {batch_txt}.")
        h_, r_ = sd_loop_table(res)
        if r_:
            loop_txt = ", ".join(f"{row[0]}: {row[4]}" for row in r_)
            batch_txt += (f" In a sequential SD loop whose tag unit is fed by the draft's own "
                          f"routing (draft length {r_[0][1]}): {loop_txt}.")
        out.append(f"**Hotness vs random residents (~+22% accepted length in the paper): "
                   f"{verdict}.** Tag-unit hotness policy vs random, MSB-augmented, mean over "
                   f"draft lengths 1-8, one request per cache: {g:+.1%}"
                   f"{_ci('hotness_vs_random')}{_across(res, 'hotness_vs_random')} (per resident "
                   f"fraction: {per}){extra}.{batch_txt}")
    out += bit_axis_verdicts(res)
    return out


def bit_axis_verdicts(res) -> list[str]:
    """Where on the bit axis truncation fails and augmentation rescues it
    (criterion, as above: an acceptance rate below the paper's 0.33 fails)."""
    out = []
    bc = {r["variant"]: r for r in res.get("bit_axis_claims", [])}
    for vn, label in (("s2k1-channel", "2-bit slices, keep the top plane (2-bit drafts)"),
                      ("s2k2-channel", "2-bit slices, keep 2 planes (4-bit drafts)"),
                      ("s4k1-tensor", "4-bit slices, per-tensor scales")):
        r = bc.get(vn)
        if not r or r.get("truncated_all_resident_rate") is None:
            continue
        t, a = r["truncated_all_resident_rate"], r["augmented_all_resident_rate"]
        fails, rescued = t < 0.33, a is not None and a >= 0.33
        lo = (r.get("ci95") or [None])[0]
        verdict = ("HOLDS: truncation fails, augmentation rescues it" if fails and rescued else
                   "truncation fails and augmentation does not rescue it" if fails else
                   "augmentation helps (interval excludes zero), truncation does not fail"
                   if lo is not None and lo > 0 else "not shown")
        ppl = ""
        if r.get("truncated_ppl") is not None:
            ppl = (f" Perplexity (target {r['target_ppl']:.3f}): truncated {r['truncated_ppl']:.2f} "
                   f"({r['truncated_ppl_cost']:+.1%}), augmented {r['augmented_ppl']:.3f} "
                   f"({r['augmented_ppl_cost']:+.1%}); top-1 agreement with the target "
                   f"{r['truncated_agreement']:.3f} vs {r['augmented_agreement']:.3f}.")
        gain = "" if r.get("gain") is None else (
            f" Mean accepted length with hotness residents: augmented {r['gain']:+.1%} over "
            f"truncated (95% CI {r['ci95'][0]:+.1%}..{r['ci95'][1]:+.1%}){_across(res, vn + ':gain')}.")
        out.append(f"**Bit axis, {label}: {verdict}.** All experts resident, draft length "
                   f"{res['setup'].get('max_draft', 8)}: acceptance rate truncated {t:.3f} vs "
                   f"augmented {a:.3f}{_across(res, vn + ':truncated_all_resident_rate', False)}."
                   f"{ppl}{gain}")
    return out


def summary_text(res) -> str:
    ppl = res["perplexity"]
    lines = ["validation perplexity (bytes): " + ", ".join(
        f"{k} {v['ppl']:.3f} ({v['bits_per_byte']:.3f} bits/byte)" for k, v in ppl.items())]
    h, r = routing_table(res)
    lines += ["", text_table(h, r)]
    h, r = working_set_table(res)
    lines += ["", text_table(h, r)]
    h, r = acceptance_table(res)
    lines += ["", text_table(h, r)]
    h, r = bit_axis_table(res)
    if r:
        lines += ["", "bit axis (first model; perplexity / agreement on held-out windows, "
                  "acceptance with hotness residents):", text_table(h, r)]
    h, r = bit_axis_acceptance_table(res)
    if r:
        lines += ["", "bit-axis acceptance, hotness residents (mean over models):", text_table(h, r)]
    h, r = across_table(res)
    if r and len(res.get("models", [])) > 1:
        lines += ["", "every conclusion per trained model [within-model 95% CI] and across models:",
                  text_table(h, r)]
    if res.get("batched"):
        h, r = batched_table(res)
        lines += ["", "batches sharing one resident set (augmented, mean accepted over L=1..8):",
                  text_table(h, r)]
    if res.get("sd_loop"):
        h, r = sd_loop_table(res)
        lines += ["", "sequential SD loop (augmented, mean accepted per iteration):",
                  text_table(h, r)]
    lines.append("")
    lines += [v.replace("**", "") for v in verdicts(res)]
    lines.append(f"({res['rounds']} draft rounds per configuration, {res['seconds']:.0f} s)")
    return "\n".join(lines)


def markdown(res) -> str:
    m = res["model"]
    s = m["shape"]
    ppl = res["perplexity"]
    md = [f"A byte-level MoE transformer trained here on {m['corpus']} "
          f"({m['train_bytes']} training bytes; {m['val_files']} held-out files, "
          f"{m['val_bytes']} bytes): {s['n_layers']} layers, d_model {s['d_model']}, "
          f"{s['experts']} routed SwiGLU experts (FFN {s['ffn']}) top-{s['top_k']}, GQA "
          f"{s['n_heads']} Q / {s['n_kv_heads']} KV heads, RMSNorm, {m['params']} parameters. "
          "Weights: `sim/lm/data/moe_lm.npz`; numbers from `elmoe3d evidence --json "
          "build/evidence.json --plot build/evidence` (cached in `sim/lm/data/evidence.json`).",
          "", md_table(["weights", "nats/byte", "bits/byte", "perplexity"],
                       [[k, round(v["nats_per_byte"], 4), round(v["bits_per_byte"], 4),
                         round(v["ppl"], 4)] for k, v in ppl.items()]),
          "", "`augmented`/`truncated` rows: experts at MSB-nibble precision, dense weights INT8.",
          "", "### Claims of the paper on this model", ""]
    md += [f"- {v}" for v in verdicts(res)]
    h, r = routing_table(res)
    md += ["", "### Routing (target INT8, held-out prompts + greedy continuations)", "",
           md_table(h, r)]
    h, r = working_set_table(res)
    md += ["", "Working set: distinct experts per layer touched in one decode step by a batch "
           "of independent prompts.", "", md_table(h, r)]
    h, r = acceptance_table(res)
    md += ["", f"### Elastic-SD acceptance ({res['rounds']} rounds per row, greedy verification)",
           "", "Accepted = draft bytes accepted per round (the target's bonus byte not counted).",
           "", md_table(h, r)]
    h, r = bit_axis_table(res)
    if r:
        md += ["", "### The bit axis: 2-bit slices and per-tensor scales", "",
               "Per bit-slice variant: perplexity and top-1 agreement with the INT8 target on "
               "held-out windows (experts at the draft precision, all resident), and mean accepted "
               "bytes with hotness residents (partial fractions, draft lengths 1-8).", "",
               md_table(h, r)]
        h, r = bit_axis_acceptance_table(res)
        md += ["", "Acceptance per variant, hotness residents (mean over the trained models):", "",
               md_table(h, r)]
    h, r = across_table(res)
    if r and len(res.get("models", [])) > 1:
        md += ["", "### Across training runs", "",
               "Every conclusion per trained model (its 95% bootstrap interval over prompts in "
               "brackets) and the mean and spread across models:", "", md_table(h, r)]
    if res.get("batched"):
        h, r = batched_table(res)
        md += ["", "A batch of independent prompts sharing one resident set (one HB expert "
               "cache; hotness fed by every member): mean accepted bytes, MSB-augmented, mean "
               "over draft lengths 1-8.", "", md_table(h, r)]
    if res.get("sd_loop"):
        h, r = sd_loop_table(res)
        md += ["", "Sequential Elastic-SD loop per prompt (draft, accept the matched prefix, "
               "advance by accepted + 1), MSB-augmented; `hotness` is the tag unit filled on "
               "verification misses and touched by the draft's unrestricted routing, decayed "
               "once per iteration. Mean accepted drafts per iteration:", "", md_table(h, r)]
    return "\n".join(md)


def plots(res, outdir: Path) -> list[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    rows = res["acceptance"]
    fr = sorted({r["resident_fraction"] for r in rows})
    pols = sorted({r["policy"] for r in rows})
    precs = [p for p in ("truncated", "augmented", "full") if any(r["precision"] == p for r in rows)]
    Ls = sorted({r["draft_len"] for r in rows})
    fig, axes = plt.subplots(1, len(precs), figsize=(4 * len(precs), 3.4), sharey=True)
    for ax, prec in zip(list(axes) if len(precs) > 1 else [axes], precs):
        for pol in pols:
            y = [_row(rows, resident_fraction=f, policy=pol, precision=prec, draft_len=4)
                 for f in fr]
            ax.plot([f * 100 for f in fr], [r["mean_accepted"] for r in y], "o-", label=pol)
        ax.set_title(f"{prec} residents, draft length 4")
        ax.set_xlabel("resident experts (%)")
        ax.grid(alpha=0.3)
    (axes[0] if len(precs) > 1 else axes).set_ylabel("mean accepted bytes")
    (axes[0] if len(precs) > 1 else axes).legend(fontsize=8)
    save_png(fig, outdir / "acceptance_vs_residents.png", written)

    mid = 0.5 if 0.5 in fr else fr[0]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for pol in pols:
        for prec, ls in (("augmented", "-"), ("truncated", ":")):
            y = [_row(rows, resident_fraction=mid, policy=pol, precision=prec, draft_len=L)
                 for L in Ls]
            if all(y):
                ax.plot(Ls, [r["mean_accepted"] for r in y], ls, marker="o", label=f"{pol} {prec}")
    ax.set_xlabel("draft length")
    ax.set_ylabel("mean accepted bytes")
    ax.set_title(f"{mid:.0%} resident experts")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_png(fig, outdir / "acceptance_vs_draft_len.png", written)

    ws = res["working_set"]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.plot([w["batch"] for w in ws], [w["distinct"] for w in ws], "o-", label="measured")
    ax.plot([w["batch"] for w in ws], [w["uniform"] for w in ws], "--", label="uniform routing")
    ax.set_xlabel("batch (independent prompts)")
    ax.set_ylabel("distinct experts / layer / step")
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, outdir / "working_set.png", written)

    fig, ax = plt.subplots(figsize=(6, 3.4))
    for r in res["routing"]:
        ax.plot(sorted(r["popularity"], reverse=True), "o-", label=f"layer {r['layer']}")
    ax.set_xlabel("expert rank")
    ax.set_ylabel("share of routing assignments")
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, outdir / "expert_popularity.png", written)

    from ..sim.lm.evidence import DATA_DIR
    curve = DATA_DIR / "train_curve.png"
    if curve.is_file():
        shutil.copy(curve, outdir / "train_curve.png")
        written.append(outdir / "train_curve.png")
    return written


def build_section(ctx):
    from ..sim.lm import evidence as ev
    cache = ev.DATA_DIR / CACHE
    if cache.is_file():
        ctx.progress("real-model evidence (cached full run)")
        res = json.loads(cache.read_text())
        note = (f"Cached full run (`sim/lm/data/{CACHE}`, regenerate with `elmoe3d evidence "
                "--json build/evidence.json --plot build/evidence --update-data`, several minutes).\n\n")
    else:
        ctx.progress("real-model evidence (quick slice, no cached full run)")
        res = ev.run(ev.Setup(n_prompts=16, fractions=(0.5, 1.0), policies=("hotness", "random"),
                              ppl_windows=8, batch_groups=(4,),
                              batch_policies=("hotness", "random")), log=lambda m: None)
        note = "Quick slice (16 prompts): no cached full run was found.\n\n"
    plots(res, Path(ctx.outdir) / "evidence")
    md = note + markdown(res)
    return Section("Real-model evidence: small MoE LM", md, res, "\n".join(
        v.replace("**", "") for v in verdicts(res)))

"""``elmoe3d decode``: greedy decoding of the in-project MoE language model
with its MoE layers on the tile (golden model, or the RTL with ``--rtl``)."""

from __future__ import annotations

import json
import sys
import time

from ._common import writable_file

NAME = "decode"
HELP = "decode text with the MoE LM, its MoE layers on the tile (AR or Elastic-SD)"


def register(p):
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="prompt text (repeatable: one request each)")
    p.add_argument("--prompt-file", metavar="FILE",
                   help="prompts, one per line (one request each)")
    p.add_argument("--tokens", type=int, default=16, metavar="N",
                   help="bytes to generate per request (default 16)")
    p.add_argument("--mode", choices=("ar", "sd", "auto"), default="auto",
                   help="ar: plain decoding; sd: Elastic-SD; auto: the controller's batch "
                        "threshold decides (default)")
    p.add_argument("--batch", type=int, default=None, metavar="B",
                   help="requests decoded together (default: the number of prompts, at least 1; "
                        "missing prompts are taken from the held-out set)")
    p.add_argument("--rtl", action="store_true",
                   help="run the MoE layers on the RTL tile in Verilator (default: golden model)")
    p.add_argument("--json", metavar="FILE", help="write tokens, match and counters as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _prompts(args):
    from ..sim.lm.evidence import heldout_prompts
    texts = list(args.prompt)
    if args.prompt_file:
        from pathlib import Path
        p = Path(args.prompt_file)
        if not p.is_file():
            raise FileNotFoundError(f"Prompt file {args.prompt_file!r} does not exist")
        texts += [line for line in p.read_text(errors="replace").splitlines() if line.strip()]
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
        if len(b) > 96:
            raise ValueError(f"Prompt of {len(b)} bytes is longer than 96 (the LM's context "
                             f"is 128 bytes)")
        prompts.append(list(b))
    held = heldout_prompts()
    i = 200
    while len(prompts) < batch:
        prompts.append([int(x) for x in held[i][:48]])
        i += 1
    return prompts


def _bar(done, total, t0, stream=sys.stderr):
    w = 30
    f = min(1.0, done / total)
    stream.write(f"\r[{'#' * int(w * f):<{w}}] {min(done, total)}/{total} tokens "
                 f"{time.monotonic() - t0:5.1f}s")
    stream.flush()


def run(args) -> int:
    import numpy as np

    from ..config import preset
    from ..golden import lm as glm
    from ..golden import lm_int as li
    from ..report import text_table

    if args.tokens < 1 or args.tokens > 24:
        raise ValueError(f"--tokens must be in 1..24 (the LM's context is 128 bytes), "
                         f"not {args.tokens}")
    out = writable_file(args.json) if args.json else None
    prompts = _prompts(args)
    if args.rtl:
        raise ValueError("--rtl: the RTL tile (elmoe3d_tile) is not built on this branch yet; "
                         "run without --rtl for the golden tile")
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
    for b, (p, toks) in enumerate(zip(prompts, res.tokens)):
        text = bytes(p).decode("utf-8", "replace") + "\033[1m" * sys.stdout.isatty() + \
            bytes(toks).decode("utf-8", "replace") + "\033[0m" * sys.stdout.isatty()
        print(f"--- request {b}:\n{text}")
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
    return 0

"""Train the small MoE language model used as real-model evidence (issue 7).

A decoder-only byte-level MoE transformer shaped like the target models
(Qwen3-30B-A3B / Mixtral style, scaled down): RMSNorm, GQA attention with
RoPE, a softmax router with top-k selection and renormalised gates, SwiGLU
experts, a Switch-style load-balancing loss, embedding tied to the output
head. The corpus is the Python standard library's own source files (code,
like the paper's HumanEval workload), split into train and validation by
file. Fixed seeds (``--seed``, default 1234: the committed model); one torch
thread by default.

This script needs PyTorch (the optional ``train`` extra); nothing else in the
project does. The committed weights ``data/moe_lm.npz`` (float16) and their
checksum ``data/moe_lm.sha256`` come from::

    python -m elmoe3d.sim.lm.train --out sim/lm/data

:mod:`elmoe3d.golden.lm` is the NumPy inference of the same model; the
``lm`` tests check that both give the same logits when torch is present.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

# --- model shape (kept in the .npz meta; golden/lm.py reads it from there) ----------
SHAPE = dict(vocab=256, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32,
             experts=16, top_k=2, ffn=64, rope_theta=10000.0, norm_eps=1e-6, context=128)
TRAIN = dict(seed=1234, steps=800, batch=32, seq=128, lr=3e-3, warmup=60, min_lr=3e-4,
             weight_decay=0.05, aux_coef=0.01, eval_every=100, eval_windows=256, grad_clip=1.0)

EXCLUDE_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "encodings",
                 "pydoc_data"}


def corpus_files(root: Path | None = None) -> list[Path]:
    """The standard-library ``.py`` files used as the corpus, sorted by path
    (tests, third-party packages, codec tables and the pydoc topic dump left out)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        parts = set(p.relative_to(root).parts[:-1])
        if parts & EXCLUDE_PARTS or "config-" in str(p.parent.name):
            continue
        out.append(p)
    return out


def is_validation(rel: str) -> bool:
    """Train/validation split by file: about 10 % of files, chosen by a hash of
    the path relative to the stdlib root (stable across machines)."""
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 10 == 0


def load_corpus(root: Path | None = None):
    """``(train_bytes, val_bytes, val_files)``; each file ends with a NUL
    separator byte. ``val_files`` is ``[(rel_path, bytes)]``."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    train, val, val_files = [], [], []
    for p in corpus_files(root):
        rel = p.relative_to(root).as_posix()
        data = p.read_bytes() + b"\0"
        if is_validation(rel):
            val.append(data)
            val_files.append((rel, data))
        else:
            train.append(data)
    return b"".join(train), b"".join(val), val_files


# --- the model (torch) ----------------------------------------------------------------

def build_model(shape: dict):
    import torch
    from torch import nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, d, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def rope(x, pos, theta):
        # x: (B, H, T, D); rotate-half form, as golden/lm.py
        D = x.shape[-1]
        inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        ang = pos[:, None].float() * inv[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        cos = torch.cat([cos, cos], -1)
        sin = torch.cat([sin, sin], -1)
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    class Attention(nn.Module):
        def __init__(self, s):
            super().__init__()
            d, h, kv, hd = s["d_model"], s["n_heads"], s["n_kv_heads"], s["head_dim"]
            self.h, self.kv, self.hd, self.theta = h, kv, hd, s["rope_theta"]
            self.wq = nn.Linear(d, h * hd, bias=False)
            self.wk = nn.Linear(d, kv * hd, bias=False)
            self.wv = nn.Linear(d, kv * hd, bias=False)
            self.wo = nn.Linear(h * hd, d, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            q = self.wq(x).view(B, T, self.h, self.hd).transpose(1, 2)
            k = self.wk(x).view(B, T, self.kv, self.hd).transpose(1, 2)
            v = self.wv(x).view(B, T, self.kv, self.hd).transpose(1, 2)
            pos = torch.arange(T)
            q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
            rep = self.h // self.kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(y.transpose(1, 2).reshape(B, T, self.h * self.hd))

    class MoE(nn.Module):
        def __init__(self, s):
            super().__init__()
            d, E, f = s["d_model"], s["experts"], s["ffn"]
            self.E, self.k = E, s["top_k"]
            self.router = nn.Linear(d, E, bias=False)
            self.w_gate = nn.Parameter(torch.randn(E, f, d) * d ** -0.5)
            self.w_up = nn.Parameter(torch.randn(E, f, d) * d ** -0.5)
            self.w_down = nn.Parameter(torch.randn(E, d, f) * f ** -0.5 / math.sqrt(2 * s["n_layers"]))
            self.last_aux = None
            self.last_topi = None

        def forward(self, x):
            B, T, d = x.shape
            xf = x.reshape(-1, d)
            probs = torch.softmax(self.router(xf).float(), -1)
            topv, topi = probs.topk(self.k, -1)
            gates = topv / topv.sum(-1, keepdim=True)
            # Switch-style balance loss: E * sum_e (fraction routed to e) * (mean prob of e)
            frac = torch.zeros(self.E).index_add_(0, topi.reshape(-1),
                                                  torch.ones(topi.numel())) / topi.numel()
            self.last_aux = self.E * (frac * probs.mean(0)).sum()
            self.last_topi = topi.detach()
            out = torch.zeros_like(xf)
            for e in range(self.E):
                tok, slot = (topi == e).nonzero(as_tuple=True)
                if tok.numel() == 0:
                    continue
                xe = xf[tok]
                h = F.silu(xe @ self.w_gate[e].t()) * (xe @ self.w_up[e].t())
                ye = (h @ self.w_down[e].t()) * gates[tok, slot, None]
                out.index_add_(0, tok, ye)
            return out.view(B, T, d)

    class Block(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.attn_norm = RMSNorm(s["d_model"], s["norm_eps"])
            self.attn = Attention(s)
            self.ffn_norm = RMSNorm(s["d_model"], s["norm_eps"])
            self.moe = MoE(s)

        def forward(self, x):
            x = x + self.attn(self.attn_norm(x))
            return x + self.moe(self.ffn_norm(x))

    class MoELM(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.shape = dict(s)
            self.embed = nn.Embedding(s["vocab"], s["d_model"])
            nn.init.normal_(self.embed.weight, std=0.5 * s["d_model"] ** -0.5 * 4)
            self.layers = nn.ModuleList(Block(s) for _ in range(s["n_layers"]))
            self.final_norm = RMSNorm(s["d_model"], s["norm_eps"])

        def forward(self, idx):
            x = self.embed(idx)
            for blk in self.layers:
                x = blk(x)
            return self.final_norm(x) @ self.embed.weight.t()

        def aux_loss(self):
            return sum(b.moe.last_aux for b in self.layers) / len(self.layers)

    return MoELM(shape)


def state_to_numpy(model) -> dict:
    """Model parameters under the names :mod:`elmoe3d.golden.lm` reads
    (``[out, in]`` matrices, experts stacked on axis 0)."""
    w = {"embed": model.embed.weight, "final_norm": model.final_norm.weight}
    for i, b in enumerate(model.layers):
        p = f"l{i}."
        w.update({p + "attn_norm": b.attn_norm.weight, p + "wq": b.attn.wq.weight,
                  p + "wk": b.attn.wk.weight, p + "wv": b.attn.wv.weight,
                  p + "wo": b.attn.wo.weight, p + "ffn_norm": b.ffn_norm.weight,
                  p + "router": b.moe.router.weight, p + "w_gate": b.moe.w_gate,
                  p + "w_up": b.moe.w_up, p + "w_down": b.moe.w_down})
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in w.items()}


def load_numpy_into(model, weights: dict):
    """Inverse of :func:`state_to_numpy` (used by the logits-match test)."""
    import torch
    names = state_to_numpy(model)
    params = {"embed": model.embed.weight, "final_norm": model.final_norm.weight}
    for i, b in enumerate(model.layers):
        p = f"l{i}."
        params.update({p + "attn_norm": b.attn_norm.weight, p + "wq": b.attn.wq.weight,
                       p + "wk": b.attn.wk.weight, p + "wv": b.attn.wv.weight,
                       p + "wo": b.attn.wo.weight, p + "ffn_norm": b.ffn_norm.weight,
                       p + "router": b.moe.router.weight, p + "w_gate": b.moe.w_gate,
                       p + "w_up": b.moe.w_up, p + "w_down": b.moe.w_down})
    assert set(names) == set(params)
    with torch.no_grad():
        for k, t in params.items():
            t.copy_(torch.from_numpy(np.asarray(weights[k], dtype=np.float32)))
    return model


# --- training ---------------------------------------------------------------------------

def _flush(log):
    def f(*a, **k):
        log(*a, **k)
        sys.stdout.flush()
        sys.stderr.flush()
    return f


def _windows(data: np.ndarray, rng: np.random.Generator, n: int, seq: int) -> np.ndarray:
    starts = rng.integers(0, len(data) - seq - 1, size=n)
    return np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64)


def train(out: Path, steps: int | None = None, log=print, threads: int = 1,
          seed: int | None = None, heldout: bool = True) -> dict:
    log = _flush(log)
    import torch
    import torch.nn.functional as F

    # One thread by default: on a shared, loaded 2-core machine two OpenMP
    # threads stall at every barrier (measured > 4 s/step with 2 threads vs
    # about 1 s/step with 1 under the same load; 0.2 s/step idle). Bit-exact
    # reproduction of the committed weights needs the same thread count (1):
    # a different reduction order changes float rounding.
    torch.set_num_threads(threads)
    hp = dict(TRAIN)
    if steps is not None:
        hp["steps"] = steps
    if seed is not None:
        hp["seed"] = int(seed)
    torch.manual_seed(hp["seed"])
    rng = np.random.default_rng(hp["seed"])
    tr_b, va_b, val_files = load_corpus()
    tr = np.frombuffer(tr_b, dtype=np.uint8)
    va = np.frombuffer(va_b, dtype=np.uint8)
    log(f"corpus: train {len(tr)} bytes, validation {len(va)} bytes in {len(val_files)} files")
    val_set = torch.from_numpy(_windows(va, np.random.default_rng(7), hp["eval_windows"], hp["seq"]))

    model = build_model(SHAPE)
    decay, no_decay = [], []
    for n_, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in n_ else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(0.9, 0.95))

    def lr_at(s):
        if s < hp["warmup"]:
            return hp["lr"] * (s + 1) / hp["warmup"]
        t = (s - hp["warmup"]) / max(1, hp["steps"] - hp["warmup"])
        return hp["min_lr"] + 0.5 * (hp["lr"] - hp["min_lr"]) * (1 + math.cos(math.pi * t))

    def evaluate():
        model.eval()
        with torch.no_grad():
            tot = 0.0
            for i in range(0, len(val_set), 64):
                b = val_set[i:i + 64]
                tot += F.cross_entropy(model(b[:, :-1]).reshape(-1, SHAPE["vocab"]),
                                       b[:, 1:].reshape(-1), reduction="sum").item()
        model.train()
        return tot / (val_set.shape[0] * hp["seq"])

    curve = {"step": [], "train_loss": [], "val_step": [], "val_loss": []}
    t0 = time.monotonic()
    run = 0.0
    for s in range(hp["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        b = torch.from_numpy(_windows(tr, rng, hp["batch"], hp["seq"]))
        logits = model(b[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, SHAPE["vocab"]), b[:, 1:].reshape(-1))
        loss = ce + hp["aux_coef"] * model.aux_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
        opt.step()
        run = ce.item() if s == 0 else 0.95 * run + 0.05 * ce.item()
        if s % 20 == 0 or s == hp["steps"] - 1:
            curve["step"].append(s)
            curve["train_loss"].append(run)
        if s % 25 == 0:
            log(f"step {s}  train {run:.4f}  {time.monotonic() - t0:.0f}s", file=sys.stderr)
        if (s + 1) % hp["eval_every"] == 0 or s == hp["steps"] - 1:
            vl = evaluate()
            curve["val_step"].append(s + 1)
            curve["val_loss"].append(vl)
            log(f"step {s + 1}/{hp['steps']}  train {run:.4f}  val {vl:.4f} nats/byte  "
                f"ppl {math.exp(vl):.3f}  {time.monotonic() - t0:.0f}s")
    wall = time.monotonic() - t0

    # Store float16 weights; the float reference (NumPy and torch alike) is these
    # weights widened back to float32, so the reported val loss is re-measured on them.
    w16 = {k: v.astype(np.float16) for k, v in state_to_numpy(model).items()}
    load_numpy_into(model, w16)
    val_loss = evaluate()
    log(f"final validation loss (float16 weights): {val_loss:.4f} nats/byte, "
        f"perplexity {math.exp(val_loss):.3f}, {val_loss / math.log(2):.3f} bits/byte")
    meta = dict(shape=SHAPE, train=hp, corpus="python stdlib .py files "
                f"({sysconfig.get_paths()['stdlib']}, Python {sys.version.split()[0]})",
                train_bytes=int(len(tr)), val_bytes=int(len(va)),
                val_files=[r for r, _ in val_files], val_loss=val_loss,
                val_ppl=math.exp(val_loss), train_wall_s=wall, torch=torch.__version__,
                threads=threads,
                reproduce="python -m elmoe3d.sim.lm.train --out sim/lm/data" if
                hp["seed"] == TRAIN["seed"] else
                f"python -m elmoe3d.sim.lm.train --out sim/lm/data/seeds/seed{hp['seed']} "
                f"--seed {hp['seed']} --no-heldout")
    out.mkdir(parents=True, exist_ok=True)
    npz = out / "moe_lm.npz"
    np.savez_compressed(npz, meta=np.array(json.dumps(meta)), **w16)
    digest = hashlib.sha256(npz.read_bytes()).hexdigest()
    (out / "moe_lm.sha256").write_text(f"{digest}  moe_lm.npz\n")
    from elmoe3d.golden.lm import weights_digest
    (out / "moe_lm.weights.sha256").write_text(f"{weights_digest(npz)}  moe_lm.npz arrays\n")
    (out / "train_curve.json").write_text(json.dumps(curve))
    _plot_curve(curve, out / "train_curve.png")
    log(f"wrote {npz} ({npz.stat().st_size} bytes, sha256 {digest}) in {wall:.0f}s of training")
    if heldout:
        write_heldout(meta, out)
    return meta


def write_heldout(meta: dict, out: Path):
    """Cut the held-out prompts and perplexity windows (from the validation
    files only) that the evidence run and the tests use."""
    from .evidence import make_heldout
    make_heldout(meta, out=out)


def _plot_curve(curve: dict, path: Path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(curve["step"], curve["train_loss"], label="train (EMA)")
    ax.plot(curve["val_step"], curve["val_loss"], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title("Small MoE LM on the Python stdlib")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    ap.add_argument("--steps", type=int, default=None, help=f"default {TRAIN['steps']}")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, max 2)")
    ap.add_argument("--seed", type=int, default=None,
                    help=f"training seed (default {TRAIN['seed']}, the committed model)")
    ap.add_argument("--no-heldout", action="store_true",
                    help="do not (re)write the held-out prompt/window files into --out "
                         "(they depend only on the corpus split, not on the seed)")
    ap.add_argument("--heldout-only", action="store_true",
                    help="only re-cut the held-out prompts/windows (no torch needed)")
    args = ap.parse_args(argv)
    if args.heldout_only:
        import json as _json
        with np.load(args.out / "moe_lm.npz") as z:
            write_heldout(_json.loads(str(z["meta"])), args.out)
        return 0
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, not {args.steps}")
    if args.threads not in (1, 2):
        raise SystemExit(f"--threads must be 1 or 2, not {args.threads}")
    if args.seed is not None and args.seed < 0:
        raise SystemExit(f"--seed must be >= 0, not {args.seed}")
    train(args.out, args.steps, threads=args.threads, seed=args.seed, heldout=not args.no_heldout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

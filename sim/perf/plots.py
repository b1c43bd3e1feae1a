"""PNG plots of a grid (and its ablations) with matplotlib (Agg backend)."""

from __future__ import annotations

from pathlib import Path

from ...report import save_png

__all__ = ["plot_grid"]


def plot_grid(grid: dict, outdir, abl: dict | None = None) -> list[Path]:
    """Speedup and energy efficiency vs batch (one panel per model) and, when
    given, the HB-size and context ablations. Returns the files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    if outdir.exists() and not outdir.is_dir():
        raise ValueError(f"Plot directory {str(outdir)!r} is a file")
    outdir.mkdir(parents=True, exist_ok=True)
    models = grid["models"]
    systems = [s for s in grid["systems"] if s != "xPU"]
    files = []
    for metric, label, fname in (("tokens_per_s", "speedup vs xPU", "speedup_vs_batch.png"),
                                 ("energy_per_token_mj", "energy efficiency vs xPU", "energy_vs_batch.png")):
        cols = min(3, len(models))
        rows = (len(models) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
        for i, m in enumerate(models):
            ax = axes[i // cols][i % cols]
            pts = sorted((p for p in grid["points"] if p["model"] == m), key=lambda p: p["batch"])
            bs = [p["batch"] for p in pts]
            for s in systems:
                if metric == "tokens_per_s":
                    ys = [p["results"][s][metric] / p["results"]["xPU"][metric] for p in pts]
                else:
                    ys = [p["results"]["xPU"][metric] / p["results"][s][metric] for p in pts]
                ax.plot(bs, ys, marker="o", lw=2.2 if s == "ELMoE-3D" else 1.2, label=s)
            ax.set_xscale("log", base=2)
            ax.set_xticks(bs, [str(b) for b in bs])
            ax.set_title(m, fontsize=9)
            ax.set_xlabel("batch")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        for j in range(len(models), rows * cols):
            axes[j // cols][j % cols].axis("off")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"{label} ({grid['hb_gb']:g} GB HB, context {grid['context']})", fontsize=10)
        save_png(fig, outdir / fname, files)
    abl = abl or {}
    if abl.get("context", {}).get("rows"):
        rows_ = abl["context"]["rows"]
        fig, ax = plt.subplots(figsize=(5, 3.4))
        cx = [r["context"] for r in rows_]
        for key, lab in (("elmoe_tok_s", "ELMoE-3D"), ("hbxpu_tok_s", "HB-xPU"), ("xpu_tok_s", "xPU")):
            ax.plot(cx, [r[key] for r in rows_], marker="o", label=lab)
        ax2 = ax.twinx()
        ax2.plot(cx, [r["expert_cache_gb"] for r in rows_], "k--", label="expert cache GB")
        ax2.set_ylabel("expert cache (GB)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"KV pressure: {rows_[0]['model']}, batch {rows_[0]['batch']}", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
        save_png(fig, outdir / "ablation_context.png", files)
    if abl.get("hb", {}).get("rows"):
        rows_ = [r for r in abl["hb"]["rows"] if "error" not in r]
        fig, ax = plt.subplots(figsize=(5, 3.4))
        for m in sorted({r["model"] for r in rows_}):
            for gb, ls in ((4.0, "--"), (8.0, "-")):
                rr = sorted((r for r in rows_ if r["model"] == m and r["hb_gb"] == gb), key=lambda r: r["batch"])
                if rr:
                    ax.plot([r["batch"] for r in rr], [r["speedup_vs_xpu"] for r in rr], ls, marker="o",
                            label=f"{m} {gb:g} GB")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_ylabel("ELMoE-3D speedup vs xPU")
        ax.legend(fontsize=6)
        save_png(fig, outdir / "ablation_hb.png", files)
    return files

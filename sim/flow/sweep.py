"""Design-space sweeps on Dask (``distributed``).

Every point (one block at one set of Config overrides) is an independent
task: Verilog, generic synthesis, optionally ECP5 place and route. Tasks run
on an embedded ``LocalCluster`` by default, or on an existing Dask cluster
named by its scheduler address. Each point's work folder is named after the
block and its overrides, so the flow's per-stage cache (keyed by the Verilog
hash) makes a repeated sweep, on any worker that sees the folder, reuse what
it already computed.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

__all__ = ["parse_sets", "points", "check_points", "run_point", "run_sweep", "run_tasks",
           "text_bar", "pareto", "write_outputs"]


def parse_sets(items: list[str], flag: str = "--set") -> dict[str, list[int]]:
    """``["lanes=8,16", "slice_bits=2,4"]`` -> ``{"lanes": [8, 16], ...}``; errors
    name ``flag``, the option the items came from."""
    import dataclasses

    from ...config import Config
    fields = {f.name for f in dataclasses.fields(Config)}
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"{flag} needs KEY=V1,V2,..., not {item!r}")
        key, _, vals = item.partition("=")
        key = key.strip()
        if key not in fields:
            raise ValueError(f"{flag}: unknown Config field {key!r}")
        try:
            out[key] = [int(v, 0) for v in vals.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"{flag} {key}: expected integers, not {vals!r}") from None
        if not out[key]:
            raise ValueError(f"{flag} {key}: no values")
    return out


def points(blocks: list[str], sets: dict[str, list[int]]) -> list[dict]:
    """The cross product of the values, per block (a point is
    ``{"block", "overrides"}``)."""
    keys = list(sets)
    combos = list(itertools.product(*(sets[k] for k in keys))) if keys else [()]
    return [{"block": b, "overrides": dict(zip(keys, c))} for b in blocks for c in combos]


def check_points(pts: list[dict], preset_name: str) -> list[dict]:
    """The points the configuration refuses (each with ``error``), found by
    building each point's ``Config`` and component here, before any worker
    starts: a sweep of refused points fails at once, not after a cluster."""
    from ...blocks import get_block
    from ...config import preset
    refused = []
    for p in pts:
        try:
            get_block(p["block"]).build(preset(preset_name).replace(**p["overrides"]))
        except (TypeError, ValueError) as e:
            refused.append({**p, "error": str(e)})
    return refused


def run_point(point: dict, preset_name: str, workroot: str, fmax: bool, seeds) -> dict:
    """One task (runs in a Dask worker): synthesise one block at one point.
    A configuration the Config refuses is a result with ``error``, not a
    failed sweep."""
    from ...blocks import get_block
    from ...config import preset
    from .synth import synth_block
    over = point["overrides"]
    b = get_block(point["block"])
    tag = "-".join(f"{k}{v}" for k, v in over.items()) or "base"
    try:
        cfg = preset(preset_name).replace(**over)
        comp = b.build(cfg)
    except (TypeError, ValueError) as e:
        return {**point, "error": str(e)}
    r = synth_block(comp, b.top, Path(workroot) / f"{b.name}-{tag}", name=b.name,
                    targets=("generic", "ecp5") if fmax else ("generic",), seeds=seeds)
    out = {**point, "cells": r["cells"], "flip_flops": r["flip_flops"],
           "logic_depth": r["logic_depth"], "transistors": r["transistors"]}
    if fmax:
        e = r["ecp5"]
        out.update(lut4=e["lut4"], ff=e["ff"], fmax_mhz=e.get("fmax_mhz"),
                   target_mhz=e["target_mhz"], meets_target=e.get("meets_target"))
    out["draft_macs_per_cycle"] = _draft_macs(point["block"], cfg)
    if out["draft_macs_per_cycle"] and out.get("fmax_mhz"):
        out["draft_gmacs_per_s"] = out["draft_macs_per_cycle"] * out["fmax_mhz"] / 1000
    return out


def _draft_macs(block: str, cfg) -> float | None:
    """Draft-precision (top plane) MACs per cycle of the MAC blocks; None for
    blocks that are not MAC arrays."""
    if block in ("pe", "pe_plain", "bitserial"):
        return float(cfg.lanes)
    if block == "mac_int8":
        return float(cfg.lanes)
    if block == "bitfusion":
        return 2.0 * cfg.lanes
    return None


def run_sweep(pts: list[dict], *, preset_name: str, workroot: Path, fmax: bool = False,
              seeds=None, scheduler: str | None = None, n_workers: int = 2,
              progress=True) -> list[dict]:
    """Run every point as a Dask task; results in point order. ``progress``:
    ``True`` for progress lines on stderr, ``False`` for none, or an
    :class:`elmoe3d.report.Progress` (one step per finished point)."""
    from ...report import Progress
    if progress is True:
        progress = Progress()
    root = str(Path(workroot).resolve())
    keys = [f"sweep-{i}-{p['block']}-" + "-".join(f"{k}{v}" for k, v in p["overrides"].items())
            for i, p in enumerate(pts)]

    def step(done, total):
        if done == 0:
            progress.expect(total)
        else:
            progress(f"sweep point {done} of {total} done")
    return run_tasks(run_point, [(p, preset_name, root, fmax, seeds) for p in pts], keys=keys,
                     scheduler=scheduler, n_workers=n_workers,
                     progress=step if progress else None)


def run_tasks(fn, args: list[tuple], *, keys=None, scheduler: str | None = None,
              n_workers: int = 2, progress=None) -> list:
    """``fn(*a)`` for every ``a`` in ``args``, each an independent Dask task:
    on the cluster at ``scheduler`` (``tcp://host:8786``), or on an embedded
    ``LocalCluster`` of ``n_workers`` processes (one thread each). Results in
    the order of ``args``; ``progress(done, total)`` before the first and
    after each task ends. The sweep and ``elmoe3d tile-run`` share it."""
    from distributed import Client, LocalCluster, as_completed
    cluster = None
    if scheduler:
        client = Client(scheduler)
    else:
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
    try:
        futs = [client.submit(fn, *a, key=None if keys is None else keys[i], pure=False)
                for i, a in enumerate(args)]
        if progress:
            progress(0, len(futs))
        for n, _ in enumerate(as_completed(futs), 1):
            if progress:
                progress(n, len(futs))
        return client.gather(futs)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def text_bar(label: str, stream=None):
    """A progress bar on stderr: ``bar(done, total)`` redraws it, a newline
    when done reaches total."""
    import sys
    import time
    t0 = time.monotonic()

    def bar(done, total):
        out = stream or sys.stderr
        w = 30
        f = done / total if total else 1.0
        out.write(f"\r{label} [{'#' * int(w * f):<{w}}] {done}/{total} "
                  f"{time.monotonic() - t0:7.1f}s")
        if done >= total:
            out.write("\n")
        out.flush()
    return bar


def pareto(results: list[dict], x: str = "cells", y: str = "draft_gmacs_per_s") -> list[dict]:
    """Points not dominated in (smaller ``x``, larger ``y``)."""
    pts = [r for r in results if r.get(x) is not None and r.get(y) is not None]
    front = []
    for r in pts:
        if not any(o[x] <= r[x] and o[y] >= r[y] and (o[x] < r[x] or o[y] > r[y]) for o in pts):
            front.append(r)
    return sorted(front, key=lambda r: r[x])


def write_outputs(results: list[dict], *, json_path: Path | None, csv_path: Path | None,
                  png_path: Path | None) -> list[Path]:
    written = []
    if json_path:
        json_path.write_text(json.dumps({"points": results}, indent=2))
        written.append(json_path)
    if csv_path:
        keys = []
        for r in results:
            for k in r:
                if k not in keys and k != "overrides":
                    keys.append(k)
        okeys = sorted({k for r in results for k in r["overrides"]})
        with csv_path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(okeys + keys)
            for r in results:
                w.writerow([r["overrides"].get(k, "") for k in okeys] + [r.get(k, "") for k in keys])
        written.append(csv_path)
    if png_path:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ...report import save_png
        have_f = any(r.get("fmax_mhz") for r in results)
        xk = "lut4" if have_f else "cells"
        yk = "draft_gmacs_per_s" if have_f else "draft_macs_per_cycle"
        fig, ax = plt.subplots(figsize=(6, 4))
        for block in dict.fromkeys(r["block"] for r in results):
            rs = [r for r in results if r["block"] == block and r.get(xk) is not None]
            if not rs:
                continue
            ys = [r.get(yk) or 0 for r in rs]
            sc = ax.scatter([r[xk] for r in rs], ys, label=block,
                            c=[r.get("fmax_mhz") or 0 for r in rs] if have_f else None,
                            cmap="viridis" if have_f else None)
            for r, yv in zip(rs, ys):
                ax.annotate(",".join(f"{k}={v}" for k, v in r["overrides"].items()),
                            (r[xk], yv), fontsize=6)
        front = pareto(results, xk, yk)
        if front:
            ax.plot([r[xk] for r in front], [r[yk] for r in front], "k--", lw=0.8,
                    label="Pareto front")
        if have_f:
            fig.colorbar(sc, ax=ax, label="Fmax MHz (ECP5)")
        ax.set_xlabel("ECP5 LUT4" if have_f else "generic cells")
        ax.set_ylabel("draft GMAC/s" if have_f else "draft MACs/cycle (0: not a MAC array)")
        ax.set_xscale("log")
        ax.legend(fontsize=7)
        ax.set_title("design-space sweep")
        written.append(save_png(fig, png_path))
    return written

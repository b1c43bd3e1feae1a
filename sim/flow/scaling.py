"""Scaling sweeps: area and Fmax of a block as one Config field grows.

:data:`SCALING` names the sweeps issue 14 asks for (PE lanes 8-64, tag-unit
slots 16-128); every registered block's own ``Block.sweep`` (a tuple of
Config overrides, e.g. a batched datapath's batch sizes) is swept too, so a
new block joins by declaring its sweep, with no change here.

A point whose block parameters equal the block's own at the swept Config
(the tag unit at 16 slots, the PE at 16 lanes, the MoE layer at ``T = 16``
under ``default``) is synthesised in the block's own work folder
(``WORKROOT/NAME``, where ``elmoe3d synth`` puts the block), so the stage
caches there (keyed by the Verilog's hash) serve it when the same run, or an
earlier one, synthesised the block.

The blocks in :data:`ON_REQUEST` are swept only when the caller puts no cap
on the run's cost (``max_cells`` None: ``elmoe3d synth --sweep``, e.g.
``elmoe3d synth --sweep --no-pnr --target generic,ecp5 --blocks
moe_layer``); ``make demo`` / ``elmoe3d build``, which pass ``max_cells``,
leave them out and record why under the block's ``sweep_refused``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SCALING", "ON_REQUEST", "sweep_points", "run_sweeps", "plot_sweeps",
           "growth_sentence"]

#: block -> (Config field, values, the block parameter it sets). Where the
#: Config refuses a point (its cross-block geometry checks: e.g. 64 lanes
#: with a hidden size of 16), the value is applied to the block parameter
#: directly: the block alone is still well defined.
SCALING = {
    "pe": ("lanes", (8, 16, 32, 64), "lanes"),
    "tag_unit": ("tag_slots", (16, 32, 64, 128), "slots"),
}

#: block -> why its sweep runs only on request (see the module docstring)
ON_REQUEST = {
    "moe_layer": "one Yosys ECP5 run of the whole layer takes 10-30 min on the 2-core "
                 "machine, too long for make demo: run `elmoe3d synth --sweep --no-pnr "
                 "--target generic,ecp5 --blocks moe_layer`",
}


def sweep_points(block) -> list[dict]:
    """Config overrides to sweep for one registered block."""
    pts = []
    if block.name in SCALING:
        key, values, _ = SCALING[block.name]
        pts += [{key: v} for v in values]
    for over in block.sweep:
        if dict(over) not in pts:
            pts.append(dict(over))
    return pts


def run_sweeps(cfg, names, workroot: Path, *, targets=("generic",), pnr=True, seeds=None,
               progress=None, max_cells: int | None = None,
               only: dict[str, list] | None = None) -> dict:
    """``{block: [point result, ...]}`` for the named blocks that have a sweep.

    ``only`` (``{field: values}``, ``elmoe3d synth --sweep-only``) keeps just
    the points whose value of a listed field is one of its values, e.g. the
    tag unit at 16 and 32 slots when its larger points take too long to place.
    A block in :data:`ON_REQUEST` is swept only when ``max_cells`` is None;
    otherwise its points come back with an ``error`` saying why.
    """
    from ...blocks import get_block
    from .synth import fpga_target, synth_block
    out = {}
    for name in names:
        b = get_block(name)
        pts, seen = [], []
        for over in sweep_points(b):
            if any(k in (only or {}) and v not in only[k] for k, v in over.items()):
                continue
            if name in ON_REQUEST and max_cells is not None:
                pts.append({"overrides": over, "error": f"not swept here: {ON_REQUEST[name]}"})
                continue
            tag = "-".join(f"{k}{v}" for k, v in over.items())
            note = None
            try:
                comp = b.shared(b.params(cfg.replace(**over)))
                mk = lambda: comp                               # noqa: E731
            except ValueError as e:
                pname = SCALING.get(name, (None, None, None))[2]
                key = next(iter(over))
                if pname is None or len(over) != 1 or key != SCALING[name][0]:
                    pts.append({"overrides": over, "error": str(e)})
                    continue
                params = {**b.params(cfg), pname: over[key]}
                comp = b.shared(params)
                mk = lambda: comp                               # noqa: E731
                note = f"block parameter {pname}={over[key]} (Config refuses: {e})"
            params_now = b.params(cfg.replace(**over)) if note is None else params
            if params_now in seen:          # same block, other Config fields: nothing new
                continue
            seen.append(params_now)
            if progress:
                progress(f"sweep {name} {tag}", step=False)
            # the block at its own parameters: its own folder, so its caches serve
            wd = workroot / name if params_now == b.params(cfg) else workroot / f"{name}-{tag}"
            r = synth_block(comp, b.top, wd, name=name,
                            targets=targets if pnr else ("generic",), seeds=seeds,
                            fmax_max_cells=max_cells, progress=progress)
            if not pnr and "ecp5" in targets:
                r["ecp5"] = fpga_target(mk(), name, b.top, wd, "ecp5", pnr=False,
                                        prov=r["provenance"])
            r["overrides"] = over
            if note:
                r["note"] = note
            pts.append(r)
        keys = {tuple(p["overrides"]) for p in pts}
        if len(keys) == 1 and len(next(iter(keys))) == 1:
            k = next(iter(keys))[0]
            pts.sort(key=lambda p: p["overrides"][k])
        if pts:
            out[name] = pts
    return out


def growth_sentence(name: str, pts: list[dict]) -> str:
    """How cost grows, from the first and last point: the exponent of
    ``cost ~ x^k`` between them, for cells and (where present) LUT4."""
    import math
    if len(pts) < 2 or len(pts[0]["overrides"]) != 1:
        return ""
    key = next(iter(pts[0]["overrides"]))
    x0, x1 = pts[0]["overrides"][key], pts[-1]["overrides"][key]
    if not (isinstance(x0, int) and isinstance(x1, int) and x1 > x0 > 0):
        return ""
    k = math.log(pts[-1]["cells"] / pts[0]["cells"]) / math.log(x1 / x0)
    s = (f"{name}: {key} {x0} -> {x1} (x{x1 / x0:g}) multiplies cells by "
         f"x{pts[-1]['cells'] / pts[0]['cells']:.2f} (~{key}^{k:.2f})")
    e0, e1 = pts[0].get("ecp5", {}), pts[-1].get("ecp5", {})
    if e0.get("lut4") and e1.get("lut4"):
        s += f", LUT4 x{e1['lut4'] / e0['lut4']:.2f}"
    if e0.get("fmax_mhz") and e1.get("fmax_mhz"):
        s += f", Fmax {e0['fmax_mhz']:g} -> {e1['fmax_mhz']:g} MHz"
    d0, d1 = pts[0]["logic_depth"], pts[-1]["logic_depth"]
    return s + f", logic depth {d0} -> {d1}."


def plot_sweeps(sweeps: dict, outdir: Path) -> list[Path]:
    """One PNG per swept block: cells and LUT4 (left axis), Fmax (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ...report import save_png
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, pts in sweeps.items():
        if not pts or len(pts[0]["overrides"]) != 1:
            continue
        key = next(iter(pts[0]["overrides"]))
        xs = [p["overrides"][key] for p in pts]
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        ax.plot(xs, [p["cells"] for p in pts], "o-", label="generic cells")
        luts = [p.get("ecp5", {}).get("lut4") for p in pts]
        if all(luts):
            ax.plot(xs, luts, "s-", label="ECP5 LUT4")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(key)
        ax.set_ylabel("area")
        fm = [p.get("ecp5", {}).get("fmax_mhz") for p in pts]
        if any(fm):
            ax2 = ax.twinx()
            ax2.plot([x for x, f in zip(xs, fm) if f], [f for f in fm if f], "^--",
                     color="tab:red", label="Fmax (ECP5)")
            ax2.set_ylabel("Fmax MHz", color="tab:red")
            ax2.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize=8)
        ax.set_title(f"{name}: area and Fmax vs {key}")
        written.append(save_png(fig, outdir / f"scaling-{name}.png"))
    return written

"""Long runs of the tile top on the native harness: the report's routing
traces decoded for hundreds of steps, every response, counter, trace event
and layer output checked against the golden, cycles measured in steady
state (``elmoe3d tile-run``).

A run (:func:`run_one`, a dict ``spec``) is a golden
:func:`~elmoe3d.golden.esd.run_trace` decode of one of the report's traces
(:data:`TRACES`: the synthetic Zipf + reuse trace on the ``default`` tile,
the in-project LM's own routing on the ``lm`` tile;
:func:`elmoe3d.sim.run.report_runs.report_traces`) at a batch, AR or Elastic-SD
forced every round (or the controller's choice, ``auto``; ``lpddr``: AR
with the HB expert cache off, every expert from LPDDR -- the LPDDR-only xPU
analogue of the paper's baseline, on the same tile), the golden's
random acceptance (each draft accepted with ``accept_p`` = 0.7, as the
report runs), for ``warmup + steps`` decode steps. The tile runs it on trace
layers (:func:`~elmoe3d.golden.moe_batched.trace_layer`: each step's
rankings become token vectors its router ranks as the trace;
:func:`elmoe3d.sim.run.tile_script.trace_plan`), natively
(:func:`elmoe3d.sim.run.native.replay`).

Measured over the rounds after the warm-up (the warm-up ends with the round
in which the decode steps reach ``warmup``; the window starts at the cycle
its last layer step ended -- its last output or its response, whichever
came later -- and ends with the last step's end): cycles, output tokens and
cycles per output token, the cycles each phase's layer steps took (a step
from the later of the cycle the tile took its STEP and the previous step's
end, to its own end: the phases add up to the window), and the golden counters over the
window (the run's minus the warm-up's: a ``run_trace`` of ``warmup`` steps
is a prefix of the longer one). The tile's own counters over the whole run
are read over its host port and compared with the golden's, as everything
else.

Independent runs go to Dask (:func:`run_set`, :func:`elmoe3d.sim.flow.sweep.run_tasks`:
an embedded LocalCluster, or a scheduler address to scale out).
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time

__all__ = ["TRACES", "MODES", "STEADY_STATE", "spec", "specs", "golden_run", "run_one", "run_set",
           "summary_rows", "SUMMARY_HEAD"]

#: ``--trace`` name -> index in :func:`elmoe3d.sim.run.report_runs.report_traces`
TRACES = {"zipf": 0, "lm": 1}
MODES = ("lpddr", "ar", "sd", "auto")
#: The steady-state set: 32 warm-up steps, then 128 measured steps at batch 1
#: and 64 at batch 4 and 16; both traces, LPDDR-only AR, HB-cached AR and SD,
#: seeds 1-3 (54 runs)
STEADY_STATE = dict(traces=("zipf", "lm"), batches=(1, 4, 16), modes=("lpddr", "ar", "sd"),
                    seeds=(1, 2, 3), warmup=32, steps={1: 128, 4: 64, 16: 64})


@functools.lru_cache(maxsize=None)
def _trace(name: str, preset: str | None = None):
    """``(label, cfg, rankings)`` of a trace; ``preset`` puts the Zipf trace on
    another tile (the same generator, that tile's layers and experts)."""
    from .report_runs import report_traces
    if name not in TRACES:
        raise ValueError(f"Trace must be one of {', '.join(TRACES)}, not {name!r}")
    label, cfg, R = report_traces()[TRACES[name]]
    if preset is None or preset == _preset_name(cfg):
        return label, cfg, R
    if name != "zipf":
        raise ValueError(f"The {name} trace runs on its own tile only, not on preset {preset!r}")
    import numpy as np

    from ...config import preset as get
    from ...golden import esd
    cfg = get(preset)
    R = esd.synthetic_trace(np.random.default_rng(2026), requests=16, tokens=1200,
                            layers=cfg.layers, experts=cfg.experts)
    return f"zipf-1.1 ({preset})", cfg, R


def spec(trace: str, batch: int, mode: str, steps: int, warmup: int, seed: int, *,
         latency: int = 12, lpddr_bytes_per_cycle: int | None = None,
         accept_p: float = 0.7, preset: str | None = None, prefetch: int = 0) -> dict:
    """One run, validated (``ValueError`` naming the value): ``latency`` LPDDR
    read latency in cycles (12: about 100 ns at the 125 MHz target clock),
    ``lpddr_bytes_per_cycle`` the LPDDR bandwidth (``None``: one AXI beat
    per cycle), ``preset`` another tile for the Zipf trace (default: the
    trace's own, ``default``), ``prefetch`` the tile's prefetch depth during
    drafts (0: none; at most the tile's expert slots)."""
    from ...config import check_int
    from ...golden.esd import MAX_BATCH
    if trace not in TRACES:
        raise ValueError(f"--trace must be one of {', '.join(TRACES)}, not {trace!r}")
    if mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    check_int("--batch", batch, 1, MAX_BATCH)
    check_int("--steps", steps, 1)
    check_int("--warmup", warmup, 0)
    check_int("--seed", seed, 0)
    check_int("--latency", latency, 1, 100_000)
    if not 0.0 <= accept_p <= 1.0:
        raise ValueError(f"accept_p must be in 0..1, not {accept_p!r}")
    s = dict(trace=trace, batch=batch, mode=mode, steps=steps, warmup=warmup, seed=seed,
             latency=latency, lpddr_bytes_per_cycle=lpddr_bytes_per_cycle, accept_p=accept_p,
             preset=preset, prefetch=prefetch)
    cfg = _config(s)                                     # the bandwidth checked by Config
    check_int("--prefetch", prefetch, 0, cfg.tag_slots)
    return s


def specs(traces, batches, modes, seeds, steps, warmup, **kw) -> list[dict]:
    """The cross product traces x batches x modes x seeds; ``steps`` an int or
    ``{batch: steps}``."""
    out = []
    for t, b, m, s in itertools.product(traces, batches, modes, seeds):
        n = steps[b] if isinstance(steps, dict) else steps
        out.append(spec(t, b, m, n, warmup, s, **kw))
    return out


def _config(s):
    _, cfg, _ = _trace(s["trace"], s.get("preset"))
    if s.get("lpddr_bytes_per_cycle") is not None:
        cfg = cfg.replace(lpddr_bytes_per_cycle=s["lpddr_bytes_per_cycle"])
    return cfg


def golden_run(s, steps: int, prefetch: int | None = None):
    """The golden ``run_trace`` decode of spec ``s`` for ``steps`` decode steps
    (``prefetch``: the golden controller's prefetch depth; default the
    spec's, 0 if it names none)."""
    if prefetch is None:
        prefetch = s.get("prefetch", 0)
    from ...golden import esd as gesd
    _, cfg, R = _trace(s["trace"], s.get("preset"))
    force = {"ar": gesd.Mode.AR, "lpddr": gesd.Mode.AR, "sd": gesd.Mode.SD,
             "auto": None}[s["mode"]]
    return gesd.run_trace(cfg, R, batch=s["batch"], steps=steps, seed=s["seed"],
                          accept_p=s["accept_p"], check=False, kv_mid_round=False, force=force,
                          hb_cache=s["mode"] != "lpddr", prefetch=prefetch)


def _window(a: dict, b: dict) -> dict:
    return {k: a[k] - b.get(k, 0) for k in a}


def run_one(s: dict, exe=None) -> dict:
    """One run of ``s`` (:func:`spec`): the result record (module doc)."""
    import numpy as np

    from ...golden import esd as gesd
    from ...golden import layout as gl
    from ...golden import moe_batched as gb
    from ...hw.esd_ctrl import HostOp
    from . import native
    from . import tile_script as ts
    t0 = time.monotonic()
    name, _, _ = _trace(s["trace"], s.get("preset"))
    cfg = _config(s)
    B = s["batch"]
    # the warm-up ends with a whole round (it may pass `warmup` steps): the run
    # goes on for `steps` more after it
    warm = golden_run(s, s["warmup"]) if s["warmup"] else None
    run = golden_run(s, (warm.counters["decode_steps"] if warm else 0) + s["steps"])
    case = dict(script=run.script, events=run.events, counters=run.counters, faults={},
                ext_reads=run.controller.ext_reads,
                name=f"{s['trace']} B{B} {s['mode']} seed {s['seed']}")
    rng = np.random.default_rng(s["seed"])
    layers = [gb.trace_layer(lay) for lay in ts.random_layers(cfg, rng)]
    plan = ts.trace_plan(cfg, layers, case, rng)
    image = ts.lpddr_image(cfg, layers, gl.dense_image(cfg, layers))
    golden_s = time.monotonic() - t0
    opts = native.NativeOptions(latency=s["latency"], seed=s["seed"])
    rep = native.replay(cfg, plan, image,
                        exe=exe or native.build(cfg, prefetch=s.get("prefetch", 0)), options=opts)

    # per layer step the tile ran: its round, phase, taken cycle, end cycle
    rounds = ts.round_tokens(run.script, B)
    per_round_steps = []                 # round of each STEP the tile ran, in order
    rnd = -1
    ctrl_of_step = []
    for i, c in enumerate(plan.cmds):
        if c["op"] == HostOp.ROUND and not plan.want_rsp[i].get("error"):
            rnd += 1
        if c["op"] == HostOp.STEP and not plan.want_rsp[i].get("error"):
            per_round_steps.append(rnd)
            ctrl_of_step.append(i)
    ends, cur = [], None
    for cyc, o in rep.outputs:
        cur = cyc
        if o["last"]:
            ends.append(cur)
    steps = []
    for k, (at, _) in enumerate(rep.script.steps):
        ctrl = rep.responses[ctrl_of_step[k]][0] if ctrl_of_step[k] < len(rep.responses) else 0
        out = ends[k] if k < len(ends) else 0
        steps.append(dict(round=per_round_steps[k], phase=plan.cmds[ctrl_of_step[k]]["phase"],
                          taken=int(rep.run.cmd_cycles[at]) if at < len(rep.run.cmd_cycles)
                          else 0, end=max(ctrl, out)))
    cum, w_rounds = 0, 0
    if s["warmup"]:
        for w_rounds, (n, _) in enumerate(rounds, 1):
            cum += n
            if cum >= s["warmup"]:
                break
    start = (max(x["end"] for x in steps if x["round"] < w_rounds) if w_rounds
              else (rep.tile_rsp[0][0] if rep.tile_rsp else 0))
    meas = [x for x in steps if x["round"] >= w_rounds]
    end = max((x["end"] for x in meas), default=start)
    m_rounds = rounds[w_rounds:]
    tokens = sum(t for _, t in m_rounds)
    # a step's cycles run from the later of its STEP being taken and the previous
    # step's end (the host sends ahead: a STEP may be taken while the last runs)
    prev = start
    for x in meas:
        x["from"] = max(x["taken"], prev)
        prev = max(prev, x["end"])
    phase = {p.name: sum(x["end"] - x["from"] for x in meas if x["phase"] == int(p))
             for p in (gesd.Phase.AR, gesd.Phase.DRAFT, gesd.Phase.VERIFY)}
    gw = _window(run.counters, warm.counters if warm else {})
    look = gw["hb_hits"] + gw["hb_misses"] + gw["hb_pending"]
    sd_rounds = gw["rounds_sd"]
    r = rep.run
    return dict(
        trace=name, trace_key=s["trace"], config=_preset_name(cfg), batch=B, mode=s["mode"],
        prefetch=s.get("prefetch", 0),
        seed=s["seed"], warmup=s["warmup"], steps_asked=s["steps"], latency=s["latency"],
        lpddr_bytes_per_cycle=cfg.lpddr_rate, accept_p=s["accept_p"],
        match=rep.match, first_difference=rep.first,
        measured=dict(rounds=len(m_rounds), steps=sum(n for n, _ in m_rounds), tokens=tokens,
                      cycles=end - start, start_cycle=start, end_cycle=end,
                      cycles_per_token=round((end - start) / tokens, 1) if tokens else None,
                      phase_cycles=phase,
                      hb_hit_rate=round(gw["hb_hits"] / look, 4) if look else None,
                      mean_accepted_len=(round((gw["accepted_tokens"] + sd_rounds * B)
                                               / (sd_rounds * B), 3) if sd_rounds else 1.0),
                      counters_golden=gw),
        warmup_rounds=w_rounds, rounds=len(rounds), counters_rtl=rep.counters,
        cycles=r.cycles, events=len(rep.events), outputs=len(rep.outputs),
        sim_cpu_s=round(r.sim_cpu_s, 2),
        cycles_per_cpu_s=round(r.cycles / r.sim_cpu_s) if r.sim_cpu_s else None,
        golden_s=round(golden_s, 2), wall_s=round(time.monotonic() - t0, 2))


#: Weight-access energy per bit (the brief's figures, pJ): HB, LPDDR
PJ_PER_BIT = {"hb": 0.43, "lpddr": 3.88}


def energy_pj(counters: dict) -> float:
    """Weight-access energy of a run's counters (``hb_bytes``, ``lpddr_bytes``)
    at :data:`PJ_PER_BIT`, in pJ."""
    return 8 * (counters["hb_bytes"] * PJ_PER_BIT["hb"]
                + counters["lpddr_bytes"] * PJ_PER_BIT["lpddr"])


def _preset_name(cfg) -> str:
    from ...config import PRESETS
    base = cfg.replace(lpddr_bytes_per_cycle=None)
    return next((n for n, c in PRESETS.items() if c == base), "custom")


def run_set(run_specs: list[dict], *, scheduler: str | None = None, workers: int = 2,
            progress=None, build_progress=None) -> list[dict]:
    """Every run of ``run_specs`` as a Dask task (:func:`elmoe3d.sim.flow.sweep.run_tasks`);
    the native models are built (or found) here first, once per
    configuration. Results in the order of ``run_specs``."""
    from . import native
    from ..flow.sweep import run_tasks
    seen = set()
    for s in run_specs:
        cfg = _config(s).replace(lpddr_bytes_per_cycle=None)
        key = (cfg, s.get("prefetch", 0))
        if key not in seen:
            seen.add(key)
            native.build(cfg, progress=build_progress, prefetch=key[1])
    if len(run_specs) == 1 and not scheduler:
        out = [run_one(run_specs[0])]
        if progress:
            progress(1, 1)
        return out
    keys = [f"tile-run-{i}-{s['trace']}-B{s['batch']}-{s['mode']}-s{s['seed']}"
            for i, s in enumerate(run_specs)]
    return run_tasks(run_one, [(s,) for s in run_specs], keys=keys, scheduler=scheduler,
                     n_workers=workers, progress=progress)


SUMMARY_HEAD = ["trace", "batch", "mode", "seeds", "measured steps", "cycles / token mean",
                "spread (min-max)", "HB hit rate", "mean accepted len", "SD / AR",
                "all = golden"]


def mode_label(r: dict) -> str:
    """A run's mode as the tables name it: ``SD``, or ``SD+PF8`` for SD on a
    tile that prefetches up to 8 during drafts."""
    p = r.get("prefetch", 0)
    return r["mode"].upper() + (f"+PF{p}" if p else "")


def summary_rows(results: list[dict]) -> list[list]:
    """Per trace, batch and mode (:func:`mode_label`): cycles per output token
    over the seeds (mean and min-max), the window's hit rate and accepted
    length (means), cycles per token over AR's, and whether every run
    equalled the golden."""
    groups = {}
    for r in results:
        groups.setdefault((r["trace"], r["batch"], r["mode"], r.get("prefetch", 0)),
                          []).append(r)
    means = {k: statistics.mean(x["measured"]["cycles_per_token"] for x in v)
             for k, v in groups.items()}
    rows = []
    for (t, b, m, pf), v in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                  MODES.index(kv[0][2]),
                                                                  kv[0][3])):
        cpt = [x["measured"]["cycles_per_token"] for x in v]
        hit = [x["measured"]["hb_hit_rate"] for x in v if x["measured"]["hb_hit_rate"]]
        ar = means.get((t, b, "ar", 0))
        rows.append([t, b, mode_label(v[0]), len(v), statistics.mean(x["measured"]["steps"] for x in v),
                     round(statistics.mean(cpt)), f"{round(min(cpt))}-{round(max(cpt))}",
                     round(statistics.mean(hit), 3) if hit else "-",
                     round(statistics.mean(x["measured"]["mean_accepted_len"] for x in v), 2),
                     round(means[(t, b, m, pf)] / ar, 3) if ar and m != "ar" else "-",
                     "yes" if all(x["match"] for x in v) else "NO"])
    return rows


def readme_table(recorded: dict) -> str:
    """The steady-state table of the README and docs/blocks/tile.md from a
    recorded set (``sim/data/steady_state.json``): per trace and batch, the
    cycles per output token (mean over the seeds, min-max) of LPDDR-only AR
    (the HB expert cache off), HB-cached AR and Elastic-SD, SD / AR, the
    speed-ups over LPDDR-only AR, the weight-access energy per token
    (:func:`energy_pj`) and SD's mean accepted length; with prefetch runs
    in the set (``SD+PF<n>``), Elastic-SD on the tile that prefetches too."""
    rows = {}
    for r in recorded["summary"]:
        trace, batch, mode, _, _, mean, spread = r[:7]
        rows.setdefault((trace, batch), {})[mode] = (mean, spread, r[8])
    energy = {}
    for r in recorded["runs"]:
        m = r["measured"]
        if m["tokens"]:
            energy.setdefault((r["trace"], r["batch"], mode_label(r)), []).append(
                energy_pj(m["counters_golden"]) / m["tokens"])
    pf = sorted({mode for v in rows.values() for mode in v if "+PF" in mode})
    pf = pf[0] if pf else None                # (one prefetch depth in a table)
    sds = ["SD"] + ([pf] if pf else [])
    names = "SD" + (f", SD prefetch {pf.split('+PF')[1]}" if pf else "")
    out = ["| trace | batch | LPDDR-only AR cycles / token | HB-cached AR | Elastic-SD | "
           + (f"Elastic-SD, prefetch {pf.split('+PF')[1]} | " if pf else "")
           + ("SD / AR (without / with prefetch) | " if pf else "SD / AR | ")
           + f"speed-up over LPDDR-only: AR, {names} | "
           f"nJ / token: LPDDR-only, AR, {names} | mean accepted length (SD) |",
           "|---|---|---|---|---|---|---|---|---|" + ("---|" if pf else "")]

    def cell(v, mode):
        return f"{v[mode][0]:,} ({v[mode][1]})" if mode in v else "-"

    def nj(trace, batch, mode):
        e = energy.get((trace, batch, mode))
        return f"{statistics.mean(e) / 1000:,.0f}" if e else "-"
    for (trace, batch), v in sorted(rows.items()):
        if "AR" not in v or "SD" not in v:
            continue
        ar = v["AR"][0]
        lp = v["LPDDR"][0] if "LPDDR" in v else None
        over = " / ".join(f"{v[x][0] / ar:.2f}" if x in v else "-" for x in sds)
        up = (", ".join([f"{lp / ar:.2f}x"] + [f"{lp / v[x][0]:.2f}x" if x in v else "-"
                                               for x in sds]) if lp else "-")
        energies = ", ".join(nj(trace, batch, x) for x in ["LPDDR", "AR"] + sds)
        out.append(f"| {trace} | {batch} | {cell(v, 'LPDDR')} | {cell(v, 'AR')} | "
                   f"{cell(v, 'SD')} | " + (f"{cell(v, pf)} | " if pf else "")
                   + f"{over} | {up} | {energies} | {v['SD'][2]} |")
    return "\n".join(out)


def merge_runs(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` runs with those of ``new`` added or replaced (same trace, batch,
    mode and seed), in the steady-state set's order."""
    key = lambda r: (r["trace_key"], r["batch"], r["mode"], r.get("prefetch", 0),  # noqa: E731
                     r["seed"])
    byk = {key(r): r for r in old}
    byk.update((key(r), r) for r in new)
    order = {m: i for i, m in enumerate(MODES)}
    return sorted(byk.values(), key=lambda r: (r["trace_key"], r["batch"], order[r["mode"]],
                                               r.get("prefetch", 0), r["seed"]))


#: markers around the generated table in README.md
README_MARKERS = ("<!-- steady-state: generated from sim/data/steady_state.json -->",
                  "<!-- end of steady-state -->")


def write_readme_table(readme, recorded: dict) -> bool:
    """Rewrite the table between :data:`README_MARKERS` (in README.md and
    docs/blocks/tile.md); ``True`` if it changed."""
    from ..flow.generated import replace_between
    return replace_between(readme, README_MARKERS, readme_table(recorded))


# -- the report runs: 8 decode steps per trace, batch and mode, from a cold cache ----------

#: decode steps of each report run (the golden table runs 400 steps, the
#: controller RTL's 24; the tile computes every layer, so fewer)
REPORT_STEPS = 8


def report_set(which: int, steps: int = REPORT_STEPS, exe=None):
    """The report's runs of trace ``which`` (0: Zipf at ``default``, 1: the
    LM's routing at ``lm``) on the native tile, batch 1, 4 and 16, AR and SD
    forced, LPDDR latency 12 cycles, no pauses: ``(records, counter_runs)``
    -- per run the record of ``tile_report.json`` (the tile's counters and
    cycles) and of ``tile_counters.json`` (:func:`elmoe3d.sim.perf.rtl_compare.tile_run`).
    ``AssertionError`` naming the run and its first difference if a run
    differs from the golden."""
    import numpy as np

    from . import report_runs as dec
    from ...golden import layout as gl
    from ...golden import moe_batched as gb
    from . import native
    from . import tile_script as ts
    from ..perf import rtl_compare as rc
    name, cfg, _ = dec.report_traces()[which]
    runs = dec.report_runs(steps=steps, traces=[name])
    exe = exe or native.build(cfg)
    outs, counter_runs = [], []
    for r in runs:
        case = dict(script=r["run"].script, events=r["run"].events, counters=r["counters"],
                    faults={}, ext_reads=r["run"].controller.ext_reads,
                    name=f"B{r['batch']} {r['mode']}")
        rng = np.random.default_rng(7)
        layers = [gb.trace_layer(lay) for lay in ts.random_layers(cfg, rng)]
        plan = ts.trace_plan(cfg, layers, case, rng)
        image = ts.lpddr_image(cfg, layers, gl.dense_image(cfg, layers))
        rep = native.replay(cfg, plan, image, exe=exe,
                            options=native.NativeOptions(latency=12, seed=7))
        if not rep.match or len(rep.events) != len(r["run"].events):
            raise AssertionError(f"{name} B{r['batch']} {r['mode']}: the tile differs from the "
                                 f"golden: {rep.first}")
        outs.append(dict(trace=name, batch=r["batch"], mode=r["mode"], steps=steps,
                         config=cfg.to_dict(), rtl=rep.counters, cycles=rep.run.cycles,
                         events=len(rep.events), sim_cpu_s=round(rep.run.sim_cpu_s, 2)))
        counter_runs.append(rc.tile_run(cfg, name, r["batch"], r["mode"], r["run"].script,
                                        rep.counters))
    return outs, counter_runs


#: markers around the tile report's table in docs/blocks/tile.md
REPORT_MARKERS = ("<!-- tile-report: generated from sim/data/tile_report.json -->",
                  "<!-- end of tile-report -->")


def report_table(report: dict) -> str:
    """docs/blocks/tile.md's table of the recorded report runs: per trace and
    batch, AR's HB hit rate and cycles per output token, SD's hit rate, mean
    accepted length and cycles per output token (the tile's own counters)."""
    from .report_runs import cycles_per_token, figures
    rows = {}
    for r in report["runs"]:
        rows.setdefault((r["trace"], r["batch"]), {})[r["mode"]] = r
    out = ["| trace | batch | AR: HB hit rate | AR: cycles / token | SD: HB hit rate | "
           "SD: mean accepted length | SD: cycles / token | SD / AR |",
           "|---|---|---|---|---|---|---|---|"]
    for (trace, batch), v in sorted(rows.items()):
        if "AR" not in v or "SD" not in v:
            continue
        a, s = v["AR"]["rtl"], v["SD"]["rtl"]
        fa, fs = figures(a, batch), figures(s, batch)
        ca, cs = cycles_per_token(a), cycles_per_token(s)
        out.append(f"| {trace} | {batch} | {fa[0]:.3f} | {ca:,.0f} | {fs[0]:.3f} | "
                   f"{fs[1]:.2f} | {cs:,.0f} | {cs / ca:.2f} |")
    return "\n".join(out)

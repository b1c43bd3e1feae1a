"""The paper's claims recomputed on the validated tile model.

Every system is the tile -- the ``paper`` preset (32 PEs of 32 lanes, 16
token lanes, HB 16x LPDDR bandwidth) with a published model's MoE shape --
and every cycle comes from :mod:`.tile_model` with the constants fitted in
:mod:`.validate` (the model that predicts every recorded RTL run within
5 %). The controller's passes come from the golden controller
(:func:`elmoe3d.golden.esd.run_trace`) on a synthetic routing trace with
the model's published locality (:func:`elmoe3d.sim.perf.traces.generate`).

Systems (the same logic die and the same pass costs; what differs is where
weights come from and how a pass is bounded):

``xPU``
    The tile with its HB cache off: AR, every expert from LPDDR.
``HB-xPU``
    AR with the HB cache holding whole INT8 experts (half as many slots as
    MSB planes take; every plane of a hit from HB), the controller's
    allocation and hotness policy.
``xPU-PIM``
    AR, weights in LPDDR-PIM: an expert's GEMV runs in the DRAM banks at
    ``internal_bw_mult`` x the LPDDR bandwidth, each weight read serving at
    most ``pim_tokens_per_read`` tokens; a pass takes the faster of PIM and
    the xPU (``systems.json``, ``xPU-PIM``: the parameters and their
    sources).
``xPU-NMP``
    AR, near-memory processing on the LPDDR buffer die: ``internal_bw_mult``
    x bandwidth and ``nmp_tops`` of compute; the faster of NMP and the xPU.
``ELMoE-3D``
    The tile as it is: the controller's own mode (AR below
    ``sd_threshold``, Elastic-SD from it), MSB planes of hot experts in HB.

Every system keeps the tile's dense region (router rows, requantisation
records) in HB and on the same logic die, so the systems differ in where
the expert weights come from, not in that.

Energy: HB and LPDDR bytes read at ``hardware.json``'s pJ per bit (PIM and
NMP reads at their own), the bytes HB fills write (the controller's fills
times the planes a fill writes: MSB planes, whole experts for HB-xPU) at
its HB write pJ per bit, slice MACs at the 7 nm-scaled INT8 MAC energy over
two, and the static power over the run's time. The clock is the paper's
LPDDR bandwidth over the preset's LPDDR bytes per cycle (3.2 GHz at
``paper``): the ratios are the paper's, so the time base only scales the
static energy.

Only the MoE layers are modelled (what the tile runs): attention, dense
layers and the KV cache are outside the RTL and outside this table, so
the ratios are those of the MoE layers. To keep ``elmoe3d perf --json``
under a minute, :data:`SIM_LAYERS` MoE layers are simulated with the
model's share of HB slots per layer (HB expert capacity x the simulated
layers over the model's MoE layers); a layer's cache behaviour depends on
its own slots and routing only, so the per-layer figures carry over.

Acceptance: per model, the draft's overlap with the target's experts is
measured in a calibration run (the share of the VERIFY picks whose expert
was resident, batch 16, today's structure) and the per-token acceptance is
:class:`~elmoe3d.sim.perf.acceptance.AcceptanceModel`'s rate at that
overlap (fitted to the in-project LM, not to any figure it predicts); the
same rate serves both structures. :func:`claims` also repeats ELMoE-3D
over the paper's 0.33-0.91 (:data:`SWEEP`).
"""

from __future__ import annotations

import functools
import math
import statistics

import numpy as np

from . import tile_model as tm

__all__ = ["PAPER", "STRUCTURES", "SYSTEMS", "PRIORS", "BATCHES", "SIM_LAYERS", "SWEEP", "load_systems",
           "jsonable", "model_config", "price", "run_point", "calibrate_acceptance", "claims"]

#: the paper's headline (ELMoE-3D.md): mean / max speedup and mean energy
#: efficiency vs the LPDDR-only xPU, mean speedup and energy vs the best prior
PAPER = {"speedup_vs_xpu_mean": 6.6, "speedup_vs_xpu_max": 12.0, "energy_vs_xpu_mean": 4.4,
         "speedup_vs_best_prior_mean": 2.2, "energy_vs_best_prior_mean": 1.4}
#: the tile's structure today, and before the token-lane datapath (one token
#: per PE beat, passes of 16 tokens)
STRUCTURES = {"token lanes (today)": {},
              "before token lanes": {"token_lanes": 1, "batch_tokens": 16}}
SYSTEMS = ("xPU", "xPU-PIM", "xPU-NMP", "HB-xPU", "ELMoE-3D")
PRIORS = ("xPU-PIM", "xPU-NMP", "HB-xPU")
BATCHES = (1, 2, 4, 8, 16)
#: MoE layers simulated per model (module doc)
SIM_LAYERS = 4
#: decode steps: warm-up (not counted), then measured
WARMUP, STEPS = 12, 12
#: the paper's acceptance range, swept
SWEEP = (0.33, 0.5, 0.7, 0.91)


@functools.lru_cache(maxsize=1)
def load_systems() -> dict:
    """``data/systems.json``: the priors' parameters with their sources and
    the acceptance model's configuration."""
    import json
    from .models import DATA
    return json.loads((DATA / "systems.json").read_text())


def _hw():
    from .hardware import get_hardware
    return get_hardware(hb_gb=8.0), load_systems()


def jsonable(x):
    """``x`` with NumPy scalars as Python numbers and non-finite floats as
    ``None`` (for ``json.dumps``)."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return jsonable(x.item())
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def model_config(name: str, structure: dict, *, whole: bool = False):
    """The ``paper`` preset with model ``name``'s MoE shape on
    :data:`SIM_LAYERS` layers and its share of HB expert slots (``whole``:
    whole experts, two slots each)."""
    from ...config import preset
    from .models import get_model
    m = get_model(name)
    hw, _ = _hw()
    base = preset("paper").replace(**structure)
    cfg = base.replace(layers=SIM_LAYERS, hidden=m.hidden, ffn=m.expert_ffn, experts=m.experts,
                       top_k=m.top_k, shared_experts=m.shared_experts, tag_slots=16)
    free = hw.hb_gb * 1e9 - m.dense_bytes
    msb = cfg.expert_bytes * cfg.hb_planes_eff / cfg.planes
    slots = int(free / msb * SIM_LAYERS / len(m.moe_layers))
    if whole:
        slots //= cfg.planes // cfg.hb_planes_eff
    slots = max(cfg.min_free_slots + 1, min(slots, m.experts * SIM_LAYERS))
    return cfg.replace(tag_slots=slots)


def _rankings(name: str, cfg, seed: int = 0):
    from ...golden import esd
    from .models import get_model
    from .traces import generate
    m = get_model(name)
    loc = dict(m.locality)
    loc["early_layers"] = round(loc.get("early_layers", 0) * SIM_LAYERS / len(m.moe_layers))
    tr = generate(SIM_LAYERS, m.experts, m.top_k, requests=16, steps=160, seed=seed,
                  model=name, **loc)
    return esd.complete_rankings(tr.streams(16), m.experts)


def _run(cfg, R, batch, force, accept_p, seed=1):
    """Golden controller run: ``WARMUP + STEPS`` decode steps; the log and
    the first measured round."""
    from ...golden import esd
    with tm.record_steps() as log:
        run = esd.run_trace(cfg, R, batch=batch, steps=WARMUP + STEPS, seed=seed,
                            accept_p=accept_p, check=False, kv_mid_round=False, force=force,
                            prompt=(8, 9), length=(10 ** 6, 10 ** 6 + 1))
    # the warm-up ends with the round in which the decode steps reach WARMUP
    steps, first = 0, len(run.rounds) + 1
    for i, (mode, K) in enumerate(run.rounds, 1):
        steps += 1 if mode == int(esd.Mode.AR) else K
        if steps >= WARMUP:
            first = i + 1
            break
    return log, run, first


def _tokens(log, run, first, batch) -> int:
    from ...golden import esd
    n = 0
    for i, (mode, _) in enumerate(run.rounds, 1):
        if i >= first:
            n += batch + (log.accepted.get(i, 0) if mode == int(esd.Mode.SD) else 0)
    return n


def _alt_pass(kind, cfg, plan, tr, sysd):
    """Cycles of a PIM / NMP pass's expert work, or ``None`` (the xPU's)."""
    if kind == "pim":
        per = sysd["pim_tokens_per_read"]
        mult = sysd["internal_bw_mult"]
        ext = {e: b * tr.ext_cycles_per_beat for e, _, b in tr.ext_items}
        return sum(ext.get(j.expert, 0.0) * math.ceil(len(j.tokens) / per) / mult
                   for j in plan.jobs)
    if kind == "nmp":
        mult = sysd["internal_bw_mult"]
        # NMP MACs per cycle of this clock: nmp_tops (2 ops per MAC)
        macs_per_cycle = sysd["nmp_tops"] * 1e12 / 2 / _clock_hz(cfg)
        ext = {e: b * tr.ext_cycles_per_beat for e, _, b in tr.ext_items}
        per_tok = 3 * cfg.hidden * cfg.ffn
        return sum(max(ext.get(j.expert, 0.0) / mult, len(j.tokens) * per_tok / macs_per_cycle)
                   for j in plan.jobs)
    return None


def _clock_hz(cfg) -> float:
    hw, _ = _hw()
    return hw.lpddr_bw_gbs * 1e9 / cfg.lpddr_rate


def price(recs, cfg, c: tm.Constants, kind: str = "tile", sysd=None, first: int = 1) -> dict:
    """Cycles and energy of the records from round ``first`` on: the tile
    model's pass cycles (``kind`` ``pim`` / ``nmp``: the pass's bound is the
    faster of the xPU's and the PIM's / NMP's expert work), bytes, MACs."""
    hw, _ = _hw()
    v = c.vector()
    word_bytes = cfg.slice_vector_bits / 8
    beat_bytes = cfg.axi_beat_bits / 8
    cyc = hb = hbw = lp = near = macs = 0.0
    for r in recs:
        if r.round < first:
            continue
        hbw += r.fill_bytes
        for plan, tr in zip(r.plans, r.traffic):
            f = tm.pass_features(tr)
            alt = _alt_pass(kind, cfg, plan, tr, sysd)
            if alt is not None and max(alt, tr.hb_beats) < f[0]:
                f[0], f[1] = max(alt, tr.hb_beats), 0.0
                near += tr.ext_beats * beat_bytes
            else:
                lp += tr.ext_beats * beat_bytes
            cyc += float(f @ v)
            hb += sum(tr.hb_words) * word_bytes
            macs += tr.mac_beats * cfg.pes * cfg.lanes * cfg.token_lanes
        cyc += v[tm.FEATURES.index("tokens")] * r.tokens + v[tm.FEATURES.index("steps")]
        if r.phase == "DRAFT":
            cyc += v[tm.FEATURES.index("draft_probe")]
    secs = cyc / _clock_hz(cfg)
    near_pj = sysd.get(f"{kind}_pj_per_bit", hw.lpddr_pj_per_bit) if sysd else hw.lpddr_pj_per_bit
    mac_pj = hw.mac8_pj_45nm * hw.tech_scale / 2
    energy = (hb * 8 * hw.hb_pj_per_bit + hbw * 8 * hw.hb_write_pj_per_bit
              + lp * 8 * hw.lpddr_pj_per_bit + near * 8 * near_pj + macs * mac_pj) * 1e-12 \
        + hw.static_w * secs
    return dict(cycles=cyc, seconds=secs, hb_bytes=hb, hb_write_bytes=hbw, lpddr_bytes=lp + near,
                energy_j=energy)


def _measured_overlap(recs, first) -> float:
    """The draft's overlap with the target: the share of the VERIFY steps'
    (token, expert) picks whose expert was resident (its job split, MSB
    planes from HB)."""
    hit = tot = 0
    for r in recs:
        if r.round < first or r.phase != "VERIFY":
            continue
        for plan in r.plans:
            for j in plan.routed:
                tot += len(j.tokens)
                hit += len(j.tokens) if j.hb_planes else 0
    return hit / tot if tot else 0.0


def _priors(cfg_w, R, batch, c, sysj) -> dict:
    """xPU, HB-xPU, xPU-PIM and xPU-NMP from one AR run of the controller with
    whole experts cached (HB-xPU; with the cache off the xPU and the PIM /
    NMP machines)."""
    from ...golden import esd
    S = sysj["systems"]
    log, run, first = _run(cfg_w, R, batch, esd.Mode.AR, 0.0)
    n = _tokens(log, run, first, batch)
    recs_w = tm.records(log, whole=True)
    recs_off = tm.records(log, cache=False)
    out = {"xPU": price(recs_off, cfg_w, c, first=first),
           "xPU-PIM": price(recs_off, cfg_w, c, "pim", S["xPU-PIM"], first),
           "xPU-NMP": price(recs_off, cfg_w, c, "nmp", S["xPU-NMP"], first),
           "HB-xPU": price(recs_w, cfg_w, c, first=first)}
    for v in out.values():
        v["tokens"] = n
    return out


def _elmoe(cfg, R, batch, c, accept_p) -> dict:
    """ELMoE-3D: the controller's own mode at this batch."""
    log, run, first = _run(cfg, R, batch, None, accept_p)
    recs = tm.records(log)
    e = price(recs, cfg, c, first=first)
    e["tokens"] = _tokens(log, run, first, batch)
    e["mode"] = "SD" if run.counters["rounds_sd"] else "AR"
    e["overlap"] = round(_measured_overlap(recs, first), 3)
    e["acceptance_rate"] = accept_p
    return e


def _per_token(res) -> dict:
    for s in res.values():
        s["cycles_per_token"] = s["cycles"] / max(1, s["tokens"])
        s["joules_per_token"] = s["energy_j"] / max(1, s["tokens"])
    return res


def run_point(name, structure, batch, c, accept_p, R=None) -> dict:
    """Every system at one (model, structure, batch): per system cycles and
    energy per output token."""
    _, sysj = _hw()
    cfg = model_config(name, structure)
    R = _rankings(name, cfg) if R is None else R
    out = _priors(model_config(name, structure, whole=True), R, batch, c, sysj)
    out["ELMoE-3D"] = _elmoe(cfg, R, batch, c, accept_p)
    return _per_token(out)


def _ratios(res) -> dict:
    e = res["ELMoE-3D"]
    sp = {s: res[s]["cycles_per_token"] / e["cycles_per_token"] for s in SYSTEMS[:-1]}
    en = {s: res[s]["joules_per_token"] / e["joules_per_token"] for s in SYSTEMS[:-1]}
    best = min(PRIORS, key=lambda s: res[s]["cycles_per_token"])
    return dict(speedup_vs=sp, energy_vs=en, best_prior=best,
                speedup_vs_best=sp[best], energy_vs_best=en[best])


def calibrate_acceptance(name, structure, R=None) -> dict:
    """The per-token acceptance of model ``name``: the overlap of a batch-16
    Elastic-SD calibration run (at the LM fit's rate for full overlap), and
    the fitted model's rate at that overlap."""
    from ...golden import esd
    from .acceptance import AcceptanceModel
    _, sysj = _hw()
    accm = AcceptanceModel.from_config(sysj["acceptance"])
    cfg = model_config(name, structure)
    R = _rankings(name, cfg) if R is None else R
    a0 = float(accm.rate(1.0, "augmented"))
    log, _, first = _run(cfg, R, 16, esd.Mode.SD, a0)
    o = _measured_overlap(tm.records(log), first)
    return dict(overlap=round(o, 3), rate=round(float(accm.rate(o, "augmented")), 3),
                source=accm.source)


@functools.lru_cache(maxsize=None)
def _trace_of(name: str):
    return _rankings(name, model_config(name, {}))


def _calibrate_task(name):
    return name, calibrate_acceptance(name, {}, _trace_of(name))


def _point_task(sname, name, batch, c, rate, sweep):
    """A point (every system), or with ``sweep`` ELMoE-3D alone (the priors
    do not depend on the acceptance)."""
    st = STRUCTURES[sname]
    if sweep:
        res = {"ELMoE-3D": _elmoe(model_config(name, st), _trace_of(name), batch, c, rate)}
    else:
        res = run_point(name, st, batch, c, rate, _trace_of(name))
    return sname, name, batch, rate, sweep, res


def _map(fn, tasks, jobs):
    if jobs > 1 and len(tasks) > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            return list(ex.map(fn, *zip(*tasks)))
    return [fn(*t) for t in tasks]


def claims(models=None, batches=BATCHES, structures=None, jobs: int = 2,
           sweep_model: str | None = "Qwen3-30B-A3B", sweep_batches=(16,)) -> dict:
    """The claims table: per structure, model and batch every system's cycles
    and energy per token and ELMoE-3D's ratios; per structure the means and
    maxima beside :data:`PAPER`; the acceptance sweep of ``sweep_model``
    (today's structure). The acceptance of a model is calibrated once, on
    today's structure, and used for both (the draft's quality is the
    controller's residency, not the datapath's). ``jobs`` worker processes
    (results do not depend on it)."""
    from .models import get_model, model_names
    c = _fit_rows_constants()
    models = models or [n for n in model_names() if get_model(n).paper_eval]
    structures = structures or list(STRUCTURES)
    acc = dict(_map(_calibrate_task, [(m,) for m in models], jobs))
    tasks = [(s, m, b, c, acc[m]["rate"], False) for s in structures for m in models
             for b in batches]
    if sweep_model in models:
        tasks += [(structures[0], sweep_model, b, c, a, True) for b in sweep_batches
                  for a in SWEEP if b in batches]
    tasks.sort(key=lambda t: -t[2])                 # the long (large-batch) runs first
    done = _map(_point_task, tasks, jobs)
    out = dict(constants=c.as_dict(), paper=PAPER, sim_layers=SIM_LAYERS, warmup=WARMUP,
               steps=STEPS, batches=list(batches), models=models, acceptance=acc,
               structures={}, sweep=[])
    main = {(s, name, b): res for s, name, b, a, sweep, res in done if not sweep}
    for s, name, b, a, sweep, res in done:
        if sweep:
            res = _per_token(dict({k: v for k, v in main[(s, name, b)].items()
                                   if k != "ELMoE-3D"}, **res))
            r = _ratios(res)
            out["sweep"].append(dict(model=name, batch=b, rate=a, mode=res["ELMoE-3D"]["mode"],
                                     speedup_vs_xpu=r["speedup_vs"]["xPU"],
                                     speedup_vs_best=r["speedup_vs_best"],
                                     best_prior=r["best_prior"]))
    out["sweep"].sort(key=lambda r: (r["model"], r["batch"], r["rate"]))
    for sname in structures:
        points = [dict(model=name, batch=b, systems=res, **_ratios(res))
                  for s, name, b, a, sweep, res in done if s == sname and not sweep]
        points.sort(key=lambda p: (models.index(p["model"]), p["batch"]))
        sp_x = [p["speedup_vs"]["xPU"] for p in points]
        out["structures"][sname] = dict(
            config=STRUCTURES[sname], points=points,
            summary=dict(
                speedup_vs_xpu_mean=statistics.mean(sp_x), speedup_vs_xpu_max=max(sp_x),
                energy_vs_xpu_mean=statistics.mean(p["energy_vs"]["xPU"] for p in points),
                speedup_vs_best_prior_mean=statistics.mean(p["speedup_vs_best"] for p in points),
                energy_vs_best_prior_mean=statistics.mean(p["energy_vs_best"] for p in points),
                **{f"speedup_vs_{s}_mean": statistics.mean(p["speedup_vs"][s] for p in points)
                   for s in PRIORS}))
    return out


def _fit_rows():
    """The fit set's rows only (the fit needs no validation run)."""
    from . import validate as v
    return v.report_rows() + [r for r in v.bench_rows() if r["set"] in v.TRAIN]


def _fit_rows_constants():
    from .validate import fit
    return fit(_fit_rows())


# -- the recorded table (README.md and docs/blocks/perf.md) -----------------------------------

#: markers around the headline table and the per-point table
MARKERS = ("<!-- perf-claims: generated from sim/data/perf_claims.json -->",
           "<!-- end of perf-claims -->")
POINT_MARKERS = ("<!-- perf-points: generated from sim/data/perf_claims.json -->",
                 "<!-- end of perf-points -->")


def recorded_path():
    from pathlib import Path
    return Path(__file__).resolve().parent.parent / "data" / "perf_claims.json"


def _x(v) -> str:
    return f"{v:.2f}x"


def readme_table(rec: dict) -> str:
    """The headline: the paper's claims beside each structure's means."""
    out = ["| | speedup vs xPU, mean (max) | energy vs xPU | speedup vs xPU-PIM / xPU-NMP / "
           "HB-xPU | vs the per-point best prior: speedup / energy |",
           "|---|---|---|---|---|",
           "| paper | 6.6x (12.0x) | 4.4x | - | 2.2x / 1.4x |"]
    for name, s in rec["structures"].items():
        m = s["summary"]
        out.append(f"| this model, {name} | {_x(m['speedup_vs_xpu_mean'])} "
                   f"({_x(m['speedup_vs_xpu_max'])}) | {_x(m['energy_vs_xpu_mean'])} | "
                   + " / ".join(_x(m[f"speedup_vs_{p}_mean"]) for p in PRIORS)
                   + f" | {_x(m['speedup_vs_best_prior_mean'])} / "
                     f"{_x(m['energy_vs_best_prior_mean'])} |")
    return "\n".join(out)


def points_table(rec: dict) -> str:
    """Per structure, model and batch: ELMoE-3D's mode and acceptance, its
    speedup vs each system, the per-point best prior and the energy ratios."""
    out = ["| structure | model | B | mode (acceptance) | vs xPU | vs xPU-PIM | vs xPU-NMP | "
           "vs HB-xPU | best prior | energy vs xPU / best |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in rec["structures"].items():
        for p in s["points"]:
            e = p["systems"]["ELMoE-3D"]
            mode = e["mode"] + (f" ({e['acceptance_rate']:.2f})" if e["mode"] == "SD" else "")
            sp = p["speedup_vs"]
            out.append(f"| {name} | {p['model']} | {p['batch']} | {mode} | "
                       + " | ".join(_x(sp[k]) for k in SYSTEMS[:-1])
                       + f" | {p['best_prior']} | {_x(p['energy_vs']['xPU'])} / "
                         f"{_x(p['energy_vs_best'])} |")
    return "\n".join(out)


def write_tables(path, rec: dict) -> bool:
    """Rewrite both generated tables in ``path`` (where present); ``True`` if
    it changed."""
    from ..flow.generated import replace_between
    text = path.read_text()
    a = replace_between(path, MARKERS, readme_table(rec)) if MARKERS[0] in text else False
    b = (replace_between(path, POINT_MARKERS, points_table(rec))
         if POINT_MARKERS[0] in text else False)
    return a or b


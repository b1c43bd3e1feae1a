"""The MoE layer's pass benchmark: cycles per pass against the pass's bound.

Runs the cocotb test ``throughput`` of ``tb/moe_layer_bench.py`` on the
``moe_layer`` block (Verilator, ``OPT_FAST=-O1``; the same build as the
default-size tests): passes of 1, 4, 16 and ``T`` tokens (``T`` = a whole
verification, 16 requests x (K_max + 1)) per role and residency --

* ``FULL``: every expert from LPDDR;
* ``DRAFT``: MSB planes from HB;
* ``VERIFY``: split, MSB planes from HB, LSB planes from LPDDR;
* ``VERIFY_whole`` / ``FULL_whole``: experts whose every plane group is
  resident in HB (nothing from LPDDR);

with no stalls, the steady-state interval between pass completions against
the analytic bound ``max(HB words per bank, LPDDR beats at the configured
bandwidth, PE steps)`` of :func:`elmoe3d.golden.moe_batched.pass_traffic`.

``elmoe3d moe-bench`` is the command; ``--record`` writes
``sim/data/moe_cycles.json`` and the README's table from it
(:func:`write_readme_table`).
"""

from __future__ import annotations

import json
from pathlib import Path

#: the Verilator build of the default-size MoE tests and this benchmark: at
#: ``default`` the model dominates the run time (-O0: about 400 cycles per
#: second; ``OPT_FAST=-O1`` on the run-time-critical files: about 5,500)
BUILD_FAST = {"make_vars": ["OPT_FAST=-O1"], "icarus_always_comb": True}

#: the presets the recorded benchmark covers (``--record``), and the points of
#: each preset (``None``: all, four passes each). ``paper-ratio`` (16 token
#: lanes, LPDDR at a sixteenth of HB) runs with ``--preset paper-ratio``: its
#: model is four times the size and simulates at about a hundred cycles per
#: second in cocotb, its LPDDR-bound passes are four times as long, so it
#: takes the passes that show its operating point -- a DRAFT and a split
#: VERIFY of 16 tokens and of a whole step -- two passes each, and is not
#: part of the recorded table.
PRESETS = ("default",)
POINTS = {"default": None,
          "paper-ratio": ("DRAFT_T16", "DRAFT_T80", "VERIFY_T16", "VERIFY_T80")}
PASSES = {"default": 4, "paper-ratio": 2}

#: point names of the cocotb bench (``THROUGHPUT_POINTS``), in table order
ROLES = ("FULL", "DRAFT", "VERIFY", "VERIFY_whole", "FULL_whole")

#: markers around the generated table in README.md and docs/blocks/moe_layer.md
MARKERS = ("<!-- moe-bench: generated from sim/data/moe_cycles.json -->",
           "<!-- end of moe-bench -->")


def recorded_path() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "moe_cycles.json"


def run(preset_name: str, out, points=None, seed: int | None = None,
        passes: int | None = None) -> dict:
    """Run the benchmark at a preset; the figures also go to ``out`` (JSON,
    ``{"config", "figures"}``). ``points`` selects some, e.g.
    ``["DRAFT_T16"]`` (default: :data:`POINTS` of the preset); ``passes``
    per point (default :data:`PASSES`, else 4). Raises :class:`~elmoe3d.sim.run.harness.SimulationFailed`
    when the layer's outputs differ from the golden's."""
    from ...blocks import get_block
    from ...config import preset
    from .harness import simulate
    cfg = preset(preset_name)
    block = get_block("moe_layer")
    out = Path(out)
    out.unlink(missing_ok=True)
    env = {"ELMOE_MEASURE_OUT": str(out.resolve()),
           "ELMOE_MOE_PASSES": str(passes or PASSES.get(preset_name, 4))}
    points = points or POINTS.get(preset_name)
    if points:
        env["ELMOE_MOE_POINTS"] = ",".join(points)
    simulate(block.factory, block=block.name, params=block.params(cfg), top=block.top,
             simulator="verilator", test_module="elmoe3d.tb.moe_layer_bench",
             testcase="throughput", env=env, seed=seed, **BUILD_FAST)
    return json.loads(out.read_text())


def _cell(f) -> str:
    return f"{f['cycles_per_pass']:,.0f} ({f['efficiency']:.2f}, {f['bound_by']})"


def readme_table(recorded: dict) -> str:
    """Per preset and point, cycles per pass at T = 1, 4, 16 and T (with the
    efficiency against the bound and what bounds it), and LPDDR beats per
    expert of the T-token pass."""
    out = []
    for name, rec in recorded["presets"].items():
        fig = rec["figures"]
        T = rec["config"]["batch_tokens"]
        sizes = sorted({1, min(4, T), min(16, T), T})
        if not out:
            out += ["| preset | pass | " + " | ".join(f"T = {t}" if t != T else "T = whole step"
                                                     for t in sizes)
                    + " | LPDDR beats / expert (whole step) |",
                    "|---|---|" + "---|" * len(sizes) + "---|"]
        for role in ROLES:
            if not any(f"{role}_T{t}" in fig for t in sizes):
                continue
            cells = [_cell(fig[f"{role}_T{t}"]) if f"{role}_T{t}" in fig else "-" for t in sizes]
            whole = fig.get(f"{role}_T{T}")
            beats = f"{whole['ext_beats_per_expert']:,.0f}" if whole else "-"
            out.append(f"| {name} | {role} | " + " | ".join(cells) + f" | {beats} |")
    return "\n".join(out)


def write_readme_table(path, recorded: dict) -> bool:
    """Rewrite the table between :data:`MARKERS` in ``path``; ``True`` if it changed."""
    from ..flow.generated import replace_between
    return replace_between(path, MARKERS, readme_table(recorded))

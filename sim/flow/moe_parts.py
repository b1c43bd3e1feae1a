"""Out-of-context ECP5 place and route of single components of the batched
MoE datapath (``hw/moe/``) at a preset's geometry, through the flow of
:func:`elmoe3d.sim.flow.synth.fpga_target` (I/O-registered wrapper, the
constraints file's 125 MHz target). Faster than the whole layer (minutes
instead of hours) and names the component that limits it.

    python -m elmoe3d.sim.flow.moe_parts issue vector_unit --seeds 1 [--preset default]

Prints one line per component: name, Fmax (MHz), critical path, seconds.
Results are cached under ``build/moe_parts/<name>`` like every flow stage.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ...config import preset
from ...hw.moe.common import geom
from ...hw.moe.ext_port import ExtWriter
from ...hw.moe.hb_reader import HBReader
from ...hw.moe.issue import Issue
from ...hw.moe.scheduler import ExpertScheduler
from ...hw.moe.softmax import Softmax
from ...hw.moe.tokens import TokenStore
from ...hw.moe.topk import TopK
from ...hw.moe.vector_unit import VectorUnit
from . import synth as fl


def parts(g):
    """Component name -> a factory at geometry ``g``."""
    return {"issue": lambda: Issue(g), "scheduler": lambda: ExpertScheduler(g),
            "vector_unit": lambda: VectorUnit(g), "hb_reader": lambda: HBReader(g),
            "softmax": lambda: Softmax(g), "topk": lambda: TopK(g),
            "ext_writer": lambda: ExtWriter(g), "tokens": lambda: TokenStore(g)}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m elmoe3d.sim.flow.moe_parts")
    p.add_argument("names", nargs="+")
    p.add_argument("--preset", default="default")
    p.add_argument("--seeds", default="1")
    p.add_argument("--workdir", default="build/moe_parts")
    a = p.parse_args(argv)
    mk = parts(geom(preset(a.preset)))
    bad = [n for n in a.names if n not in mk]
    if bad:
        p.error(f"unknown component {bad[0]!r}; one of {', '.join(mk)}")
    seeds = [int(x) for x in a.seeds.split(",")]
    for name in a.names:
        t = time.time()
        r = fl.fpga_target(mk[name](), name, f"moe_{name}", Path(a.workdir) / name, "ecp5",
                           seeds=seeds)
        print(name, r.get("fmax_mhz"), r.get("fmax_seeds"), r.get("fmax_skipped") or "",
              json.dumps(r.get("critical_path")), f"{time.time() - t:.0f} s", flush=True)


if __name__ == "__main__":
    main()

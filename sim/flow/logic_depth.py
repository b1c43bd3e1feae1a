"""LUT levels per flip-flop and memory input of a mapped ECP5 netlist (the JSON Yosys
writes for nextpnr, e.g. ``build/synth/moe_layer/elmoe3d_moe_layer_ooc_ecp5.json``).

Why it matters: the flow maps LUTs with classic ``abc -lut 4``, which maps
for the least depth and then recovers area on every path that is not the
deepest, up to the *deepest* one. So the design's deepest cone sets how
deep most other cones become, and with 0.24 ns per LUT and about 1 ns per
route on ECP5, every level costs some 1.3 ns on every one of those paths
(the MoE layer had hundreds of 7-level paths in six components; removing
the few inherently 7-level cones moved the whole distribution to 6).

    python -m elmoe3d.sim.flow.logic_depth NETLIST.json [--top N] [--match TEXT]

Prints the histogram of depths over all endpoints (flip-flop inputs, and
the inputs of block RAMs and of distributed-RAM write ports, which are
timing endpoints too: the MoE layer's round-11 critical paths ended at a
block RAM's write data and a distributed RAM's write data), the deepest
depth per component (the first two name levels), and the ``--top``
deepest endpoints (those whose cell name contains ``--match``) with the
path to them. Depth: a LUT4 or distributed-RAM read adds 1; a carry-chain
cell adds 1 from its LUT inputs and 0 along the chain; flip-flops, block
RAMs and ports start at 0.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from .. import run_cli
from .sta import component

__all__ = ["Netlist", "main"]

_SOURCES = ("TRELLIS_FF", "DP16KD")
#: cells whose inputs (but the clocks; a distributed RAM's write side only)
#: end a timing path
_ENDPOINTS = ("TRELLIS_FF", "DP16KD", "TRELLIS_DPR16X4")


class Netlist:
    """The top module of a Yosys JSON netlist, with LUT depths."""

    def __init__(self, data: dict):
        mods = [m for m in data.get("modules", {}).values()
                if any(c.get("type") == "TRELLIS_FF" for c in m.get("cells", {}).values())]
        if not mods:
            raise ValueError("no module with TRELLIS_FF cells: not a mapped ECP5 netlist")
        self.mod = max(mods, key=lambda m: len(m["cells"]))
        self.cells = self.mod["cells"]
        self.drv: dict[int, str] = {}
        for cn, c in self.cells.items():
            for p, bits in c["connections"].items():
                if c["port_directions"].get(p) == "output":
                    for b in bits:
                        if isinstance(b, int):
                            self.drv[b] = cn
        self._depth: dict[int, int] = {}
        self._pred: dict[int, int | None] = {}
        self._names: dict[int, str] | None = None       # net bit -> name, on first use

    def _inputs(self, c):
        for q, bits in c["connections"].items():
            if c["port_directions"].get(q) != "input":
                continue
            if c["type"] == "TRELLIS_DPR16X4" and not q.startswith("RAD"):
                continue
            for b in bits:
                if isinstance(b, int):
                    yield q, b

    def depth(self, bit: int) -> int:
        """LUT levels from the nearest sources to net bit ``bit``."""
        stack = [bit]
        while stack:
            b = stack[-1]
            if b in self._depth:
                stack.pop()
                continue
            cn = self.drv.get(b)
            if cn is None or self.cells[cn]["type"] in _SOURCES:
                self._depth[b], self._pred[b] = 0, None
                stack.pop()
                continue
            c = self.cells[cn]
            todo = [x for _, x in self._inputs(c) if x not in self._depth]
            if todo:
                stack.extend(todo)
                continue
            best, pred = 0, None
            for q, x in self._inputs(c):
                v = self._depth[x] + (0 if (c["type"] == "CCU2C" and q == "CIN") else 1)
                if v > best:
                    best, pred = v, x
            self._depth[b], self._pred[b] = best, pred
            stack.pop()
        return self._depth[bit]

    def endpoints(self):
        """``(depth, cell, port, bit)`` of every clocked input: a flip-flop's
        data/enable/reset, a block RAM's address/data/enables, a distributed
        RAM's write address/data/enable."""
        for cn, c in self.cells.items():
            t = c["type"]
            if t not in _ENDPOINTS:
                continue
            for p, bits in c["connections"].items():
                if c["port_directions"].get(p) != "input" or p.startswith("CLK"):
                    continue
                if t == "TRELLIS_DPR16X4" and p not in ("DI", "WAD", "WRE"):
                    continue
                for b in bits:
                    if isinstance(b, int):
                        yield self.depth(b), cn, p, b

    def path(self, bit: int) -> list[str]:
        """Net names along the deepest path to ``bit``, endpoint first."""
        if self._names is None:
            self._names = {}
            for n, v in self.mod.get("netnames", {}).items():
                for x in v["bits"]:
                    if isinstance(x, int) and (x not in self._names or not v.get("hide_name", 0)):
                        self._names[x] = n
        names = self._names
        out = []
        b: int | None = bit
        while b is not None:
            out.append(f"{self._depth.get(b, 0)} {names.get(b, '?')}")
            b = self._pred.get(b)
        return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m elmoe3d.sim.flow.logic_depth",
                                description="LUT levels per flip-flop input of a mapped "
                                            "ECP5 netlist (Yosys JSON)")
    p.add_argument("netlist", type=Path)
    p.add_argument("--top", type=int, default=5, help="deepest endpoints to print (default 5)")
    p.add_argument("--match", default="", help="only endpoints whose cell name contains TEXT")
    a = p.parse_args(argv)
    if a.top < 0:
        p.error(f"--top must be >= 0, not {a.top}")
    try:
        nl = Netlist(json.loads(a.netlist.read_text()))
    except (OSError, ValueError) as e:
        p.error(f"{a.netlist}: {e}")
    ends = sorted(nl.endpoints(), key=lambda e: -e[0])
    hist = Counter(e[0] for e in ends)
    print("depth histogram (LUT levels: flip-flop and memory inputs):",
          ", ".join(f"{d}: {hist[d]}" for d in sorted(hist)))
    worst: dict[str, int] = {}
    for d, cn, _, _ in ends:
        worst[component(cn)] = max(worst.get(component(cn), 0), d)
    deepest = max(worst.values(), default=0)
    print("components at the deepest level "
          f"({deepest}): {', '.join(sorted(k for k, v in worst.items() if v == deepest))}")
    for d, cn, port, b in [e for e in ends if a.match in e[1]][:a.top]:
        print(f"--- {d} {cn}.{port}")
        for line in nl.path(b):
            print(f"    {line}")
    return 0


if __name__ == "__main__":
    run_cli(main)

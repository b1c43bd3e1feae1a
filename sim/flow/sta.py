"""Every failing endpoint of a routed design, from nextpnr's SDF.

nextpnr prints one critical path per clock; closing timing on a large block
needs all of them. With ``--sdf FILE`` nextpnr writes every delay it timed:
``INTERCONNECT`` (a routed arc, driver pin to sink pin), ``IOPATH`` (a
cell's arc, clock to output for a register or a block RAM, input to output
for a LUT, carry or mux) and ``SETUPHOLD`` (a register's or a memory's
timed input). This module redoes nextpnr's setup analysis on that graph for
one clock (arrival = the longest path from a clock-to-output arc, plus the
input's setup; pins that no clock reaches, such as the constant drivers of
carry chains, are not timed) and groups the endpoints that miss a period by
the component of their start and end register (``dut.<component>``, the
first two name levels of nextpnr's cell names, three inside ``pe_array``).
On the flow's designs its worst arrival equals nextpnr's critical path to
the picosecond (``tests/test_synth.py``), so the list is the one nextpnr
would print if it printed more than one path.

    python -m elmoe3d.sim.flow.sta ROUTED.sdf [--period NS] [--groups N] [--paths N]

Delays are SDF maxima (the slow corner nextpnr times), in picoseconds
internally; results are in nanoseconds. One clock domain only: the flow
times every block on its one ``clk``.
"""

from __future__ import annotations

import argparse
import collections
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import run_cli

__all__ = ["Timing", "load", "summary", "component", "net_of", "main"]

#: input pins that clock a cell (their IOPATHs are launch arcs)
CLOCK_PINS = frozenset({"CLK", "CLKA", "CLKB", "WCK"})

_INTERCONNECT = re.compile(r"\(INTERCONNECT (\S+) (\S+) \((\d+):(\d+):(\d+)\)")
_IOPATH = re.compile(r"\(IOPATH (\S+) (\S+) \((\d+):(\d+):(\d+)\)")
_SETUP = re.compile(r"\(SETUPHOLD \((?:posedge|negedge) (\S+)\) \((?:posedge|negedge) \S+\) "
                    r"\((\d+):(\d+):(\d+)\)")
_INSTANCE = re.compile(r"\(INSTANCE ([^)]*)\)")
#: pins that count as a logic level along a path (LUT, mux and carry outputs,
#: block-RAM data)
_LEVEL_PINS = re.compile(r"^(F|OFX|FCO|DO[AB]?\d+)$")
_CELL_SUFFIX = re.compile(r"_(TRELLIS|SB|CCU2C|LUT4|DP16KD|MULT18X18D|PFUMX|L6MUX21)_?.*$")


def component(cell: str) -> str:
    """The component a nextpnr cell belongs to: ``dut.<name>`` (the block's
    direct submodule; ``dut.pe_array.pe<b>`` inside the PE array), a
    wrapper register (``ooc_<port>``) or the block itself (``dut``)."""
    name = re.sub(r"^\$nextpnr_\w+?\$", "", cell)
    parts = name.split(".")
    if name.startswith("dut.pe_array.") and len(parts) > 3:
        return ".".join(parts[:3])
    if len(parts) > 2:
        return ".".join(parts[:2])
    return net_of(name)          # a top-level cell (a wrapper register)


def net_of(cell: str) -> str:
    """The net a packed cell is named after: nextpnr names it after the net
    it drives plus the cell types it was packed from
    (``dut.s1_prod1_TRELLIS_FF_Q_12``, ``ooc_a_TRELLIS_FF_Q_4``)."""
    return _CELL_SUFFIX.sub("", cell) or cell


@dataclass
class Timing:
    """The timing graph of one SDF and the arrival time of every pin."""
    edges: dict = field(default_factory=lambda: collections.defaultdict(list))
    launch: dict = field(default_factory=dict)
    setup: dict = field(default_factory=dict)
    arrival: dict = field(default_factory=dict)
    pred: dict = field(default_factory=dict)

    def at(self, pin: str):
        """Arrival (ps) at ``pin``, or ``None`` if no clocked start reaches it."""
        if pin in self.arrival:
            return self.arrival[pin]
        stack = [pin]
        while stack:
            x = stack[-1]
            if x in self.arrival:
                stack.pop()
                continue
            if x in self.launch:
                self.arrival[x], self.pred[x] = self.launch[x], None
                stack.pop()
                continue
            todo = [f for f, _ in self.edges.get(x, ()) if f not in self.arrival]
            if todo:
                stack.extend(todo)
                continue
            best = bp = None
            for f, d in self.edges.get(x, ()):
                a = self.arrival[f]
                if a is not None and (best is None or a + d > best):
                    best, bp = a + d, f
            self.arrival[x], self.pred[x] = best, bp
            stack.pop()
        return self.arrival[pin]

    def endpoints(self):
        """``[(required arrival in ps, pin)]`` of every timed input, latest first."""
        out = []
        for pin, s in self.setup.items():
            a = self.at(pin)
            if a is not None:
                out.append((a + s, pin))
        out.sort(reverse=True)
        return out

    def path(self, pin: str) -> list[str]:
        """Pins of the latest path into ``pin``, start first."""
        out = [pin]
        while self.pred.get(out[-1]):
            out.append(self.pred[out[-1]])
        return out[::-1]

    def route_ps(self, path: list[str]) -> int:
        """Delay of the routed arcs (between two cells) along ``path``."""
        total = 0
        for a, b in zip(path, path[1:]):
            if a.split("/")[0] != b.split("/")[0]:
                total += max(d for f, d in self.edges[b] if f == a)
        return total


def load(text: str) -> Timing:
    """The timing graph of an SDF's text (nextpnr's dialect: one cell per
    ``(CELL``, escaped names)."""
    text = text.replace("\\", "")
    t = Timing()
    for m in _INTERCONNECT.finditer(text):
        t.edges[m.group(2)].append((m.group(1), int(m.group(5))))
    for chunk in text.split("(CELL")[1:]:
        mi = _INSTANCE.search(chunk)
        if not mi or not mi.group(1).strip():
            continue
        inst = mi.group(1).strip()
        for m in _IOPATH.finditer(chunk):
            a, b, d = m.group(1), m.group(2), int(m.group(5))
            if a in CLOCK_PINS:
                pin = f"{inst}/{b}"
                t.launch[pin] = max(d, t.launch.get(pin, 0))
            else:
                t.edges[f"{inst}/{b}"].append((f"{inst}/{a}", d))
        for m in _SETUP.finditer(chunk):
            pin = f"{inst}/{m.group(1)}"
            t.setup[pin] = max(t.setup.get(pin, 0), int(m.group(4)))
    return t


def levels(path: list[str]) -> int:
    return sum(1 for p in path if _LEVEL_PINS.match(p.split("/")[-1]))


def summary(t: Timing, period_ns: float, groups: int = 10) -> dict:
    """Worst arrival, the endpoints that miss ``period_ns``, and those grouped
    by (start component, end component), most numerous first."""
    period = round(period_ns * 1000)
    ends = t.endpoints()
    if not ends:
        return {"endpoints": 0, "worst_ns": None, "fmax_mhz": None, "period_ns": period_ns,
                "failing": 0, "groups": []}
    fail = [e for e in ends if e[0] > period]
    agg = collections.Counter()
    worst = {}
    for a, pin in fail:
        p = t.path(pin)
        key = (component(p[0].split("/")[0]), component(pin.split("/")[0]))
        agg[key] += 1
        if key not in worst:
            worst[key] = (a, p)
    rows = []
    for key, n in agg.most_common(groups):
        a, p = worst[key]
        rows.append({"start": key[0], "end": key[1], "endpoints": n,
                     "worst_ns": round(a / 1000, 3), "levels": levels(p),
                     "route_ns": round(t.route_ps(p) / 1000, 3),
                     "from": p[0], "to": p[-1]})
    return {"endpoints": len(ends), "worst_ns": round(ends[0][0] / 1000, 3),
            "fmax_mhz": round(1e6 / ends[0][0], 2), "period_ns": period_ns,
            "failing": len(fail), "groups": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m elmoe3d.sim.flow.sta",
                                description="every endpoint of a routed nextpnr design that "
                                            "misses a clock period, from its SDF")
    p.add_argument("sdf", type=Path)
    p.add_argument("--period", type=float, default=8.0, help="clock period in ns (default 8.0)")
    p.add_argument("--groups", type=int, default=20,
                   help="component pairs to list (default 20)")
    p.add_argument("--paths", type=int, default=0,
                   help="print the path of the worst endpoint of this many groups")
    a = p.parse_args(argv)
    if a.period <= 0:
        p.error(f"--period must be > 0, not {a.period}")
    if a.groups < 0 or a.paths < 0:
        p.error("--groups and --paths must be >= 0")
    try:
        t = load(a.sdf.read_text())
    except OSError as e:
        p.error(f"{a.sdf}: {e.strerror}")
    s = summary(t, a.period, max(a.groups, a.paths))
    if not s["endpoints"]:
        p.error(f"{a.sdf}: no timed endpoint (not an SDF of a clocked design?)")
    print(f"{s['endpoints']} endpoints; worst {s['worst_ns']:.3f} ns ({s['fmax_mhz']:.2f} MHz); "
          f"{s['failing']} miss {a.period:g} ns")
    for g in s["groups"][:a.groups]:
        print(f"{g['endpoints']:6d}  {g['start']:28s} -> {g['end']:28s} worst {g['worst_ns']:.3f} ns, "
              f"{g['levels']} levels, {g['route_ns']:.2f} ns of routing")
    for g in s["groups"][:a.paths]:
        print(f"--- {g['start']} -> {g['end']}: {g['worst_ns']:.3f} ns")
        for pin in t.path(g["to"]):
            print(f"    {t.arrival[pin] / 1000:7.3f}  {pin}")
    return 0


if __name__ == "__main__":
    run_cli(main)

"""``elmoe3d fpga --board icebreaker|ulx3s-85f``: a self-testing bitstream.

The design runs ROM-held golden vectors through the design under test on the
fabric and shows the verdict on two LEDs and one UART line; pins and the
design of each board from ``constraints/boards.json``: on the ULX3S-85F the
whole tile at ``tiny`` with its LPDDR image and host script on chip
(:mod:`elmoe3d.sim.flow.tile_selftest`), on the iCEBreaker one PE
(:mod:`elmoe3d.sim.flow.selftest`). Built with amaranth-boards and the YoWASP tools
(:mod:`elmoe3d.sim.flow.boards`). Prints the routed timing summary.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..extras import require
from ._common import add_config_args, config_from_args, writable_dir, writable_file

NAME = "fpga"
HELP = "build a self-testing bitstream for a board (iCEBreaker .bin, ULX3S-85F .bit) and print its timing"


def register(p):
    from ..sim.flow.boards import BOARDS
    p.add_argument("--board", required=True, choices=BOARDS, help="target board")
    p.add_argument("--block", default=None,
                   help="design under test: 'tile' (the whole tile) or a block with golden "
                        "vectors, e.g. pe (default: the board's entry in constraints/boards.json: "
                        "ulx3s-85f tile, icebreaker pe)")
    p.add_argument("--dots", type=int, default=8,
                   help="golden dot products in a PE self-test's ROM (default 8; not the tile's)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="build folder (default: build/fpga/<board>)")
    p.add_argument("--json", metavar="FILE", help="write the build summary as JSON")
    add_config_args(p)
    p.set_defaults(preset=None)


def run(args) -> int:
    from ..sim.flow.boards import build_board, load_boards
    if args.dots < 1:
        raise ValueError(f"--dots must be >= 1, not {args.dots}")
    board = load_boards()[args.board]
    if args.preset is None:
        args.preset = board["preset"]
    cfg = config_from_args(args)
    out = writable_dir(args.out or f"build/fpga/{args.board}", "--out")
    js = writable_file(args.json, "--json") if args.json else None
    require("flow", "elmoe3d fpga")
    r = build_board(args.board, out, block=args.block, cfg=cfg, dots=args.dots)
    print(f"{r['board']} ({r['device']}): self-test of {r['block']} "
          f"({sum(r['vectors'].values())} input beats, {sum(r['expected'].values())} results)")
    sc = r.get("scenario")
    if sc:
        print(f"scenario: dense load, rounds {','.join(sc['rounds'])} at batch {sc['batch']} "
              f"({sc['layer_steps']} layer steps, {sc['tokens']} tokens, {sc['events']} trace "
              f"events), {len(sc['counters'])} counters; LPDDR image {sc['image_bytes']} bytes "
              f"in block RAM")
    print(f"bitstream: {r['bitstream']} ({r['bytes']} bytes)")
    for clk, t in r["timing"]["clocks"].items():
        print(f"timing: clock {clk}: Fmax {t['fmax_mhz']:.2f} MHz vs {t['target_mhz']:.2f} MHz "
              f"-> {'PASS' if t['pass'] else 'FAIL'}")
        cp = t.get("critical_path")
        if cp and "from" in cp:
            print(f"  critical path: {cp['from']} -> {cp['to']} "
                  f"({cp.get('logic_ns', 0):.2f} ns logic, {cp.get('routing_ns', 0):.2f} ns routing)")
    for res, (used, avail) in sorted(r["timing"]["utilization"].items()):  # nextpnr's names
        if used:
            print(f"  {res:>16s}: {used}/{avail}")
    if js:
        js.write_text(json.dumps(r, indent=2))
    return 0

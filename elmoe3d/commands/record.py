"""``elmoe3d record``: refresh the recorded synthesis results in ``sim/data/synth/``.

For every block at the ``default`` configuration (and the points ``make
demo`` also synthesises: the peers and the area sweeps), run the synthesis
flow on the generic, ECP5 and iCE40 targets -- a stage whose result is
already recorded for the same Verilog logic is read, not run -- and record
every new stage result; then rewrite the catalogue (``blocks.json``) and
README's block table from it. After a change to ``hw/``, this one command
brings the recorded figures back to the committed Verilog (place and route
of the large blocks takes hours: ``--no-pnr`` records area only, and the
table says "not recorded" for their Fmax until it is run).

``--check`` only compares: every block's Verilog logic against the
catalogue and README's table against the catalogue; exit status 1 lists
what is stale.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._common import add_blocks_arg, parse_blocks, writable_dir

NAME = "record"
HELP = ("refresh the recorded synthesis results (sim/data/synth) for blocks whose Verilog "
        "changed, then the block catalogue and README's table; --check only compares")

#: the configuration the catalogue describes
PRESET = "default"


def register(p):
    p.add_argument("--check", action="store_true",
                   help="compare only: list blocks whose Verilog has no recorded results and "
                        "whether README's table matches the catalogue (exit 1 if stale)")
    p.add_argument("--no-pnr", action="store_true",
                   help="record area only (Yosys); no place and route of changed blocks")
    p.add_argument("--seeds", default=None, metavar="N,N",
                   help="nextpnr seeds for changed blocks (default: the constraints file's)")
    p.add_argument("--target", default="generic,ecp5,ice40", metavar="T[,T]",
                   help="targets to record (default generic,ecp5,ice40; a block too large for "
                        "the iCE40 UP5K can leave it out: its table cell then says so)")
    p.add_argument("--no-demo-points", action="store_true",
                   help="skip the peers and sweep points `make demo` also synthesises")
    p.add_argument("--workdir", default="build/record", metavar="DIR",
                   help="work folder of the flow (its caches; default build/record)")
    p.add_argument("--tool-timeout", default="0", metavar="SECONDS",
                   help="stop any one Yosys or nextpnr call after SECONDS (default 0: no limit)")
    p.add_argument("--readme", default=None, metavar="FILE",
                   help="README whose table to rewrite or check (default: the checkout's README.md)")
    add_blocks_arg(p)


def repo_readme() -> Path:
    from ..sim.flow.records import RECORD_DIR
    return RECORD_DIR.parent.parent.parent / "README.md"


def current_hashes(names) -> dict:
    """``{block: SHA-256 of its Verilog logic}`` at the catalogue's configuration."""
    import hashlib

    from ..blocks import get_block
    from ..config import preset
    from ..sim.run.harness import verilog_text
    cfg = preset(PRESET)
    out = {}
    for n in names:
        b = get_block(n)
        out[n] = hashlib.sha256(verilog_text(b.shared(b.params(cfg)), b.top).encode()).hexdigest()
    return out


def stale(names, catalogue: dict, hashes: dict | None = None) -> list[str]:
    """Blocks whose committed Verilog differs from (or is missing in) the catalogue."""
    hashes = hashes if hashes is not None else current_hashes(names)
    blocks = catalogue.get("blocks", {})
    return [n for n in names if blocks.get(n, {}).get("verilog_sha256") != hashes[n]]


def doc_pages() -> list[Path]:
    """The pages with generated Numbers: docs/blocks/*.md and docs/synthesis.md."""
    docs = repo_readme().parent / "docs"
    return sorted((docs / "blocks").glob("*.md")) + [docs / "synthesis.md"]


def stale_pages(cat: dict, pages: list[Path] | None = None) -> list[Path]:
    """Pages whose generated Numbers tables differ from the catalogue."""
    from ..sim.flow.catalogue import doc_numbers, expected
    blocks = cat.get("blocks", {})
    return [p for p in (pages if pages is not None else doc_pages()) if p.is_file() and any(
        text != expected(n, blocks) for n, text in doc_numbers(p.read_text()).items())]


def check(args) -> int:
    from ..sim.flow.catalogue import readme_table, table
    from ..sim.flow.records import load_catalogue
    names = parse_blocks(args.blocks)
    cat = load_catalogue()
    bad = stale(names, cat)
    for n in names:
        print(f"{n:12s} {'CHANGED since its record' if n in bad else 'recorded'}")
    readme = Path(args.readme) if args.readme else repo_readme()
    ok_readme = True
    if readme.is_file():
        ok_readme = readme_table(readme.read_text()) == table(cat)
        print(f"{readme}: block table {'matches' if ok_readme else 'DIFFERS FROM'} "
              "sim/data/synth/blocks.json")
    pages = stale_pages(cat)
    for p in pages:
        print(f"{p}: Numbers DIFFER FROM sim/data/synth/blocks.json")
    if bad or not ok_readme or pages:
        print("run `elmoe3d record` (with --no-pnr to skip place and route) to refresh")
        return 1
    return 0


def run(args) -> int:
    if args.check:
        return check(args)
    from ..blocks import get_block
    from ..config import preset
    from ..report import Progress
    from ..sim.flow import records
    from ..sim.flow import synth as flow
    from ..sim.flow.catalogue import entry, write_docs, write_readme
    from .synth import parse_seeds, parse_timeout, run_synth
    names = parse_blocks(args.blocks)
    seeds = parse_seeds(args.seeds)
    timeout = parse_timeout(args.tool_timeout)
    work = writable_dir(args.workdir, "--workdir")
    writable_dir(records.RECORD_DIR, "the record folder")
    readme = Path(args.readme) if args.readme else repo_readme()
    cfg = preset(PRESET)
    bl = [get_block(n) for n in names]
    if timeout is not None:
        flow.TOOL_TIMEOUT_S = timeout
    records.settings.update(into=records.RECORD_DIR, command="elmoe3d record"
                            + (" --no-pnr" if args.no_pnr else ""))
    progress = Progress()                         # the flow adds its steps
    try:
        pnr = "recorded" if args.no_pnr else True
        targets = tuple(t.strip() for t in args.target.split(",") if t.strip())
        bad = [t for t in targets if t not in ("generic", "ecp5", "ice40")]
        if bad or not targets:
            raise ValueError(f"--target {args.target!r}: choose from generic, ecp5, ice40")
        res = run_synth(cfg, bl, work, targets=targets, pnr=pnr,
                        seeds=seeds, progress=progress)
        used = {r["verilog_sha256"] for r in res.values()}
        if not args.no_demo_points:
            used |= _demo_points(cfg, names, work, seeds, pnr, progress)
    finally:
        records.settings.update(into=None, command=None)
    cat = records.load_catalogue() or {"format": "elmoe3d-block-catalogue", "version": 1,
                                       "preset": PRESET, "config": cfg.to_dict(), "blocks": {}}
    cat["config"] = cfg.to_dict()
    for b in bl:
        cat["blocks"][b.name] = entry(b, b.shared(b.params(cfg)), res[b.name])
    from ..blocks import block_names
    cat["blocks"] = {n: cat["blocks"][n] for n in block_names() if n in cat["blocks"]}
    records.CATALOGUE.write_text(json.dumps(cat, indent=1) + "\n")
    print(f"wrote {records.CATALOGUE}")
    if args.blocks is None and not args.no_demo_points:
        for f in records.record_files():
            d = json.loads(f.read_text())
            if d.get("verilog_sha256") not in used:
                f.unlink()
                print(f"removed {f} (no block or demo point has that Verilog now)")
    if readme.is_file():
        changed = write_readme(readme, cat)
        print(f"{'rewrote' if changed else 'unchanged:'} {readme}'s block table")
    for p in write_docs(doc_pages(), cat):
        print(f"rewrote {p}'s Numbers")
    return 0


def _demo_points(cfg, names, work: Path, seeds, pnr: bool, progress) -> set:
    """Synthesise (and so record) the peers and area sweeps `make demo` shows;
    the hashes of their Verilog."""
    from ..sim.flow.peers import peer_table
    from ..sim.flow.scaling import run_sweeps
    from .build import FMAX_MAX_CELLS
    used = set()
    if {"pe", "pe_plain", "mac_int8", "bitfusion", "bitserial"} & set(names):
        peers = peer_table(cfg, work, seeds=seeds, pnr=pnr, progress=progress)
        used |= {r["verilog_sha256"] for r in peers["rows"] if r.get("verilog_sha256")}
    sweeps = run_sweeps(cfg, names, work, targets=("generic", "ecp5"), pnr=False,
                        progress=progress, max_cells=FMAX_MAX_CELLS)
    for pts in sweeps.values():
        used |= {p["verilog_sha256"] for p in pts if p.get("verilog_sha256")}
    return used

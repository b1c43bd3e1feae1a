"""Recorded synthesis results: the flow's stage results, shipped in ``sim/data/synth/``.

Every stage of the synthesis flow (:mod:`elmoe3d.sim.flow.synth`: the generic
Yosys run, the ECP5/iCE40 area runs, one nextpnr run per seed) is keyed by
the SHA-256 of the Verilog logic it read and the constraints that matter to
it. Its local cache lives in the work folder; this module is the second
place a stage looks: results recorded for the committed Verilog, so that a
fresh clone's ``make demo`` reads them instead of redoing an hour of Yosys
and nextpnr. A block whose Verilog changed has no record for its new hash
and is synthesised again (and the report says so); ``--resynth`` ignores
records and caches alike.

Files
-----
``sim/data/synth/<top>-<sha12>.json``
    One per synthesised Verilog (a block, a peer or a sweep point): its
    stages ``{stage: {"key", "result", "recorded"}}``, where ``recorded``
    says when, at which commit and by which command the stage ran.
``sim/data/synth/blocks.json``
    The catalogue: every registered block at the ``default`` configuration,
    as ``elmoe3d synth`` reports it (generic, ECP5, iCE40), with the hash of
    its Verilog logic, its ports' payload types and where each figure came
    from. README's block table is generated from it
    (:mod:`elmoe3d.sim.flow.catalogue`).

``elmoe3d record`` refreshes both for the blocks whose Verilog changed.

Keys
----
A stage's key holds the whole constraints file of its target; records (and
the local caches) compare :func:`norm_key`, which keeps what the stage
depends on: the device, tool arguments and capacity, and for place and route
the block's own clock, placer and router -- not other blocks' entries nor
the ``*_why`` explanations.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

__all__ = ["RECORD_DIR", "CATALOGUE", "norm_key", "lookup", "block_stage", "stages_of", "record",
           "provenance", "settings", "record_files", "load_catalogue", "git_commit"]

RECORD_DIR = Path(__file__).resolve().parent.parent / "data" / "synth"
CATALOGUE = RECORD_DIR / "blocks.json"

#: Flow-wide switches, set by the commands (``--resynth``, ``elmoe3d record``):
#: ``use`` reads records, ``resynth`` ignores records and local caches,
#: ``into`` is the folder fresh stage results are recorded into (``None``: not recorded),
#: ``command`` is the command line recorded with them.
settings = {"use": True, "resynth": False, "into": None, "command": None}

_PER_BLOCK = ("blocks", "placer", "router", "seeds", "default_mhz")


def norm_key(key: dict, block: str | None = None) -> dict:
    """The part of a stage key its result depends on (see the module docstring)."""
    k = dict(key)
    for name in ("target", "generic"):
        c = k.get(name)
        if not isinstance(c, dict):
            continue
        t = {x: v for x, v in c.items() if not x.endswith("_why") and x not in _PER_BLOCK
             and x != "comment"}
        if "mhz" in k:                               # place and route: this block's placer/router
            pl, ro = c.get("placer", {}), c.get("router", {})
            # (a normalised key already holds the block's own values)
            t["placer"] = pl if isinstance(pl, str) else \
                pl.get("blocks", {}).get(block, pl.get("default", "heap"))
            t["router"] = list(ro) if isinstance(ro, list) else \
                list(ro.get("blocks", {}).get(block, ro.get("default", [])))
        k[name] = t
    return k


def _canon(stage: str, key: dict, block: str | None) -> str:
    return stage + " " + json.dumps(norm_key(key, block), sort_keys=True)


_INDEX: dict | None = None
_INDEX_DIR: Path | None = None


def record_files(folder: Path | None = None) -> list[Path]:
    folder = folder or RECORD_DIR
    return sorted(p for p in folder.glob("*.json") if p.name != CATALOGUE.name) \
        if folder.is_dir() else []


def _index(folder: Path | None = None) -> dict:
    """``{canonical stage key: (result, recorded, file)}`` over every record file."""
    global _INDEX, _INDEX_DIR
    folder = folder or RECORD_DIR
    if _INDEX is None or _INDEX_DIR != folder:
        idx = {}
        for f in record_files(folder):
            d = json.loads(f.read_text())
            for stage, s in d.get("stages", {}).items():
                idx[_canon(stage, s["key"], d.get("block"))] = (s["result"], s.get("recorded"), f)
        _INDEX, _INDEX_DIR = idx, folder
    return _INDEX


def lookup(stage: str, key: dict, block: str | None) -> tuple[dict, dict] | None:
    """``(result, recorded)`` of a recorded stage with this key, or ``None``."""
    if not settings["use"] or settings["resynth"]:
        return None
    hit = _index().get(_canon(stage, key, block))
    return (hit[0], hit[1] or {}) if hit else None


_BY_SHA: dict | None = None


def stages_of(vsha: str) -> dict:
    """The recorded stages of the Verilog whose logic hash is ``vsha`` (``{}``)."""
    global _BY_SHA
    if _BY_SHA is None:
        _BY_SHA = {}
        for f in record_files():
            d = json.loads(f.read_text())
            _BY_SHA[d.get("verilog_sha256")] = d
    return _BY_SHA.get(vsha, {}).get("stages", {})


def block_stage(vsha: str, stage: str, key: dict, block: str | None) -> tuple[dict, dict] | None:
    """``(result, recorded)`` of a stage recorded in the file of the block
    Verilog whose logic hash is ``vsha``, if its key, apart from the hash of
    the Verilog that stage read (a wrapper around the block), matches
    ``key``: the place-and-route stages without converting the wrapped
    design."""
    if not settings["use"] or settings["resynth"]:
        return None
    s = stages_of(vsha).get(stage)
    if s is None:
        return None
    want = norm_key({"verilog_sha256": None, **key}, block)
    have = dict(s["key"], verilog_sha256=None)
    return (s["result"], s.get("recorded") or {}) if have == want else None


def git_commit(root: Path | None = None) -> str | None:
    """The checkout's commit (``abc1234``, ``+`` when the tree has changes), if git knows it."""
    root = root or RECORD_DIR.parent.parent
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                           text=True, timeout=20)
        if c.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "hw", "elmoe3d", "golden",
                                "constraints", "sim/flow/synth.py"], cwd=root, capture_output=True,
                               text=True, timeout=20).stdout.strip()
        return c.stdout.strip() + ("+" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(command: str | None = None) -> dict:
    """What a freshly recorded stage says about itself."""
    return {"date": datetime.date.today().isoformat(), "commit": git_commit(),
            "command": command or settings["command"] or "elmoe3d synth"}


def record(stage: str, key: dict, result: dict, *, block: str | None, top: str,
           verilog_sha256: str, params: dict | None = None,
           recorded: dict | None = None) -> None:
    """Store a fresh stage result in ``settings["into"]`` (no-op when unset),
    in the file of the Verilog it belongs to (``<top>-<sha12>.json``);
    ``recorded`` replaces the provenance of a result made now."""
    folder = settings["into"]
    if folder is None:
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / f"{top}-{verilog_sha256[:12]}.json"
    d = json.loads(f.read_text()) if f.exists() else {
        "format": "elmoe3d-synth-record", "version": 1, "block": block, "top": top,
        "verilog_sha256": verilog_sha256, "params": params, "stages": {}}
    d["stages"][stage] = {"key": norm_key(key, block), "result": result,
                          "recorded": recorded or provenance()}
    d["stages"] = dict(sorted(d["stages"].items()))
    f.write_text(json.dumps(d, indent=1, sort_keys=False) + "\n")
    global _INDEX, _BY_SHA
    _INDEX = _BY_SHA = None                         # re-read on the next lookup


def load_catalogue(path: Path | None = None) -> dict:
    """``sim/data/synth/blocks.json`` (empty when there is none)."""
    p = path or CATALOGUE
    return json.loads(p.read_text()) if p.is_file() else {}

"""Peers per area: MACs per cycle (and per second) per LUT4 and per generic
cell, at INT8 weights and at 4-bit (draft) weights.

Every peer is synthesised by the same flow (:mod:`elmoe3d.sim.flow.synth`) at the
same lanes and ``max_len``; Fmax is the ECP5 median over the constraints
file's seeds. MACs per cycle are the *cycles per chunk* of each design, which
its cocotb throughput test measures (the cycle counts are asserted there:
``tests/test_pe.py::test_pe_throughput``,
``tests/test_bitserial.py::test_bitserial_throughput``); this module writes
them down per design and names the test.

Draft precision means a 4-bit weight per element: the bit-slice PEs keep
one plane of ``s = 4`` (the augmented PE rounds, the plain one truncates),
the bit-serial peer runs one 4-bit digit (truncated weight), Bit-Fusion
fuses its bricks for W4 (2L MACs/cycle), and the INT8 MAC has no faster
mode (a 4-bit weight still takes its INT8 cycle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Peer", "peers", "peer_table", "peer_text", "peer_markdown"]


@dataclass(frozen=True)
class Peer:
    label: str
    block: str                 # registered block whose factory builds it
    overrides: dict            # parameter overrides on top of the block's params(cfg)
    int8_cycles_per_chunk: int
    w4_cycles_per_chunk: int
    evidence: str              # the test that measures these cycle counts


#: the bit-slice PEs (this design's family); the others are the peers it is compared with
BIT_SLICE = ("pe", "pe_lanes", "pe_plain")


def peers(cfg) -> list[Peer]:
    n = cfg.planes
    return [
        Peer("augmented PE (s=4)", "pe", {"slice_bits": 4}, 2, 1,
             "tests/test_pe.py::test_pe_throughput (FULL/DRAFT = 0.5)"),
        Peer("augmented PE, P token lanes (s=4)", "pe_lanes", {"slice_bits": 4}, 2, 1,
             "tests/test_pe.py::test_pe_throughput (one beat per cycle for P tokens)"),
        Peer("plain bit-slice PE (s=4)", "pe_plain", {"slice_bits": 4}, 2, 1,
             "tests/test_pe.py::test_pe_throughput"),
        Peer("INT8 MAC", "mac_int8", {}, 1, 1, "tests/test_pe.py::test_pe_throughput (mac)"),
        Peer("Bit-Fusion-style", "bitfusion", {}, 1, 1, "README: W8 L, W4 2L MACs/cycle"),
        Peer("bit-serial, 4 bits/cycle", "bitserial", {"digit_bits": 4}, 2, 1,
             "tests/test_bitserial.py::test_bitserial_throughput[b4-L16]"),
        Peer("bit-serial, 2 bits/cycle", "bitserial", {"digit_bits": 2}, 4, 2,
             "tests/test_bitserial.py::test_bitserial_throughput[b2-L8]"),
    ] if n == 2 else []


def _macs_per_cycle(peer: Peer, lanes: int, w4: bool, tokens: int = 1) -> float:
    """MACs per cycle: ``lanes`` weights per beat, each applied to ``tokens``
    token lanes (the MoE array's PE; 1 elsewhere)."""
    if peer.block == "bitfusion":
        return 2.0 * lanes if w4 else float(lanes)
    return tokens * lanes / (peer.w4_cycles_per_chunk if w4 else peer.int8_cycles_per_chunk)


def peer_table(cfg, workroot: Path, *, seeds=None, pnr: bool | str = True,
               progress=None) -> dict:
    """Synthesise every peer (generic + ECP5) and compute the ratios (``pnr``
    and ``seeds`` as for :func:`elmoe3d.sim.flow.synth.fpga_target`)."""
    from ...blocks import get_block
    from .synth import synth_block
    if cfg.slice_bits != 4:
        cfg = cfg.replace(slice_bits=4)
    rows = []
    if progress is not None and hasattr(progress, "expect"):
        progress.expect(len(peers(cfg)))            # one step per peer
    for peer in peers(cfg):
        b = get_block(peer.block)
        params = {**b.params(cfg), **peer.overrides}
        tag = "-".join(f"{k}{v}" for k, v in sorted(peer.overrides.items()))
        wd = workroot / (peer.block if not tag or params == b.params(cfg) else f"{peer.block}-{tag}")
        if progress:
            progress(f"peer {peer.label}")
        r = synth_block(b.shared(params), b.top, wd, name=peer.block,
                        targets=("generic", "ecp5") if pnr else ("generic",), seeds=seeds,
                        progress=progress, pnr=pnr if pnr else True)
        if not pnr:
            from .synth import fpga_target
            r["ecp5"] = fpga_target(b.shared(params), peer.block, b.top, wd, "ecp5", pnr=False,
                                    prov=r["provenance"])
        e = r["ecp5"]
        row = {"label": peer.label, "block": peer.block, "params": params,
               "cells": r["cells"], "lut4": e["lut4"], "ff": e["ff"],
               "fmax_mhz": e.get("fmax_mhz"), "fmax_seeds": e.get("fmax_seeds"),
               "target_mhz": e["target_mhz"], "evidence": peer.evidence,
               "verilog_sha256": r["verilog_sha256"]}
        for prec, w4 in (("int8", False), ("w4", True)):
            mpc = _macs_per_cycle(peer, cfg.lanes, w4, params.get("tokens", 1))
            row[f"{prec}_macs_per_cycle"] = mpc
            row[f"{prec}_macs_per_cycle_per_klut"] = 1000 * mpc / e["lut4"]
            row[f"{prec}_macs_per_cycle_per_kcell"] = 1000 * mpc / r["cells"]
            if e.get("fmax_mhz"):
                row[f"{prec}_gmacs_per_s_per_klut"] = mpc * e["fmax_mhz"] / e["lut4"]
        rows.append(row)
    out = {"lanes": cfg.lanes, "max_len": cfg.max_len, "rows": rows}
    aug = next((r for r in rows if r["block"] == "pe"), None)
    plain = next((r for r in rows if r["block"] == "pe_plain"), None)
    if aug and plain:
        out["augmented_vs_plain_lut4"] = aug["lut4"] / plain["lut4"]
    if aug:
        key = "w4_gmacs_per_s_per_klut" if aug.get("w4_gmacs_per_s_per_klut") else \
            "w4_macs_per_cycle_per_klut"
        others = [r for r in rows if r["block"] not in BIT_SLICE and r.get(key)]
        out["draft_winner_metric"] = key
        out["augmented_wins_draft_per_area"] = all(aug[key] > r[key] for r in others)
        out["draft_ratio_vs_best_other"] = aug[key] / max(r[key] for r in others) if others else None
    return out


_HEAD = ["peer", "cells", "LUT4", "FF", "Fmax MHz", "MAC/cyc W8", "MAC/cyc W4",
         "W8 MAC/cyc/kLUT", "W4 MAC/cyc/kLUT", "W4 MAC/cyc/kcell", "W8 GMAC/s/kLUT",
         "W4 GMAC/s/kLUT"]


def _rows(t):
    def f(x, nd=2):
        return "-" if x is None else round(x, nd)
    return [[r["label"], r["cells"], r["lut4"], r["ff"], r["fmax_mhz"] or "-",
             r["int8_macs_per_cycle"], r["w4_macs_per_cycle"],
             f(r["int8_macs_per_cycle_per_klut"]), f(r["w4_macs_per_cycle_per_klut"]),
             f(r["w4_macs_per_cycle_per_kcell"]), f(r.get("int8_gmacs_per_s_per_klut"), 3),
             f(r.get("w4_gmacs_per_s_per_klut"), 3)] for r in t["rows"]]


def _summary(t) -> list[str]:
    out = []
    if "augmented_vs_plain_lut4" in t:
        out.append(f"augmented / plain bit-slice PE: LUT4 x{t['augmented_vs_plain_lut4']:.4f} "
                   f"(goal <= 1.05)")
    if t.get("draft_ratio_vs_best_other") is not None:
        verdict = "wins" if t["augmented_wins_draft_per_area"] else "does NOT win"
        out.append(f"draft precision ({t['draft_winner_metric']}): the augmented PE {verdict} "
                   f"against the INT8 MAC, Bit-Fusion and bit-serial peers "
                   f"(x{t['draft_ratio_vs_best_other']:.3f} of the best of them)")
    return out


def peer_text(t) -> str:
    from ...report import text_table
    return "\n".join([f"peers (L={t['lanes']}, ECP5 LUT4, median Fmax):",
                      text_table(_HEAD, _rows(t))] + _summary(t))


def peer_markdown(t) -> str:
    from ...report import md_table
    return "\n".join([md_table(_HEAD, _rows(t)), ""] + [f"- {x}" for x in _summary(t)])

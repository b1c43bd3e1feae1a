"""Hardware configurations (``data/hardware.json``) and figures the RTL tests measured.

Derived quantities
------------------
* Figures from the RTL tests (:func:`rtl_figures`) scale compute, HB and
  external bandwidth.
* Peak INT8 MAC rate: ``pes * prod(mac_array)`` slice MACs per cycle; a
  FULL-precision INT8 weight takes ``8 / slice_bits`` slice MACs (one per
  plane), a DRAFT (MSB-only) weight takes one. The RTL's measured datapath
  efficiency (beats per input cycle, 1.0 = no bubbles) and the DRAFT/FULL
  cycle ratio scale these rates; they are read from
  ``build/measured/throughput-pe-default-verilator.json`` (written by
  ``tests/test_pe.py``) when it exists, otherwise the fallback constants
  below are used and the report says so.
* Units: decimal GB (``1 GB = 1e9`` bytes) everywhere, like the paper's
  "8 GB" HB and "64 GB" LPDDR.
* One LPDDR efficiency for every system: the stream engine's measured
  AXI efficiency (``ext_efficiency``) scales every LPDDR access of every
  system (xPU, PIM/NMP, the HB systems) alike, never one system only.
* Energy: memory ``pJ/bit`` from the config; a MAC costs
  ``(mac8 + add8) * tech_scale`` per INT8 MAC (Horowitz 45 nm scaled to the
  paper's 7 nm by an assumed factor), on-chip SRAM staging ``sram_pj_per_bit``
  per weight byte, plus static power times time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .models import DATA

__all__ = ["Hardware", "load_hardware", "get_hardware", "rtl_figures", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Used when the RTL tests have not written their measured figures yet.
FALLBACK_RTL = {"pe_efficiency": 1.0, "draft_cycle_ratio": 0.5, "moe_full_efficiency": 1.0,
                "moe_draft_efficiency": 1.0, "hb_efficiency": 1.0, "ext_efficiency": 1.0,
                "tag_check": None, "sources": {}, "source": "fallback constants"}


@dataclass(frozen=True)
class Hardware:
    name: str
    hb_gb: float
    pes: int
    freq_ghz: float
    mac_array: tuple
    slice_bits: int
    hb_bw_gbs: float
    hb_pj_per_bit: float
    hb_write_pj_per_bit: float
    lpddr_gb: float
    lpddr_bw_gbs: float
    lpddr_pj_per_bit: float
    stream_link_gbs: float
    agg_link_gbs: float
    mac8_pj_45nm: float
    add8_pj_45nm: float
    tech_scale: float
    sram_pj_per_bit: float
    static_w: float
    kv_bytes: int
    rtl: dict = field(default_factory=lambda: dict(FALLBACK_RTL), compare=False)
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for f in ("hb_gb", "hb_bw_gbs", "lpddr_bw_gbs", "freq_ghz", "stream_link_gbs"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"Hardware {self.name!r}: {f} must be a positive number, not {v!r}")

    @property
    def hb_bytes(self) -> float:
        """HB capacity in bytes (decimal GB)."""
        return self.hb_gb * 1e9

    @property
    def planes(self) -> int:
        return 8 // self.slice_bits

    @property
    def int8_macs_per_s(self) -> float:
        """FULL-precision INT8 MACs per second (all PEs, measured efficiency)."""
        slice_macs = self.pes * math.prod(self.mac_array) * self.freq_ghz * 1e9
        return slice_macs / self.planes * self.rtl["pe_efficiency"] * self.rtl["moe_full_efficiency"]

    @property
    def draft_macs_per_s(self) -> float:
        """DRAFT-precision (MSB plane only) MACs per second."""
        return (self.int8_macs_per_s / self.rtl["moe_full_efficiency"] / self.rtl["draft_cycle_ratio"]
                * self.rtl["moe_draft_efficiency"])

    @property
    def lpddr_eff(self) -> float:
        """The one LPDDR efficiency applied to every system's LPDDR traffic."""
        return self.rtl["ext_efficiency"]

    @property
    def ext_bw(self) -> float:
        """External weight bandwidth of the HB chip in bytes/s: LPDDR, capped by
        the stream link, times the LPDDR efficiency."""
        return min(self.lpddr_bw_gbs, self.stream_link_gbs) * 1e9 * self.lpddr_eff

    @property
    def lpddr_bw(self) -> float:
        """LPDDR bandwidth of an xPU reading its own LPDDR (no stream link), bytes/s,
        times the same LPDDR efficiency."""
        return self.lpddr_bw_gbs * 1e9 * self.lpddr_eff

    @property
    def hb_bw(self) -> float:
        return self.hb_bw_gbs * 1e9 * self.rtl["hb_efficiency"]

    @property
    def mac_pj(self) -> float:
        return (self.mac8_pj_45nm + self.add8_pj_45nm) * self.tech_scale

    def with_hb(self, hb_gb: float) -> "Hardware":
        import dataclasses
        if not isinstance(hb_gb, (int, float)) or isinstance(hb_gb, bool) or hb_gb <= 0:
            raise ValueError(f"HB capacity must be a positive number of GB, not {hb_gb!r}")
        return dataclasses.replace(self, name=f"{self.name}@{hb_gb:g}GB", hb_gb=float(hb_gb))


#: the ext-stream bandwidth point the model uses (tb/test_ext_stream.py
#: ``bandwidth``: every plane of an expert to the PEs and the HB fill, 100-cycle
#: LPDDR latency)
EXT_KEY = "full_with_fill_lat100"


def _read(d: Path, name: str):
    try:
        return json.loads((d / name).read_text())
    except (OSError, ValueError):
        return None


def rtl_figures(measured_dir: Path | None = None) -> dict:
    """Figures the RTL tests measured (``build/measured/``), each with a fallback.

    ==================== ============================================ =========================== ========
    key                  meaning                                      file (written by)           fallback
    ==================== ============================================ =========================== ========
    pe_efficiency        FULL ``beats / input_cycles`` of the PE      throughput-pe-default-      1.0
                         (1.0 = a slice vector per cycle, no bubbles) verilator.json (test_pe)
    draft_cycle_ratio    DRAFT_k1 / FULL cycles per dot product       same                        0.5
    moe_full_efficiency  analytic / measured cycles per pass, FULL,   moe_cycles.json             1.0
                         the largest T measured in FULL and DRAFT     (test_moe_layer, slow)
    moe_draft_efficiency same, DRAFT                                                              1.0
    hb_efficiency        read + fill words per cycle per bank while   hb_bandwidth.json           1.0
                         a fill stream runs (PEs always ready)        (test_hb_bank)
    ext_efficiency       AXI beats per cycle, every plane to the PEs  ext_bandwidth.json          1.0
                         and the HB fill, 100-cycle memory latency    (test_ext_stream)
    tag_check            tag-unit RTL STATS == golden on a Zipf trace tag_unit-zipf-S*-*.json    (none)
                                                                  (test_tag_unit; the largest)
    ==================== ============================================ =========================== ========

    The compute rates are scaled by ``pe_efficiency * moe_*_efficiency``, HB
    bandwidth by ``hb_efficiency`` and the chip's external stream by
    ``ext_efficiency``. ``sources`` names the file (and figure) or "fallback"
    per key -- "fallback: <file> has no <figure>" when the file exists but
    not the figure the model reads -- and
    ``source`` summarises them in one line.
    """
    d = Path(measured_dir) if measured_dir else REPO_ROOT / "build" / "measured"
    out = dict(pe_efficiency=1.0, draft_cycle_ratio=0.5, moe_full_efficiency=1.0,
               moe_draft_efficiency=1.0, hb_efficiency=1.0, ext_efficiency=1.0, tag_check=None)
    src = dict.fromkeys(("pe", "moe", "hb", "ext", "tag"), "fallback")

    def ok(v):
        return isinstance(v, (int, float)) and 0 < v <= 1.0

    f = _read(d, "throughput-pe-default-verilator.json")
    try:
        full, draft = f["figures"]["FULL"], f["figures"]["DRAFT_k1"]
        eff = full["beats"] / full["input_cycles"]
        ratio = draft["cycles_per_dot"] / full["cycles_per_dot"]
        if ok(eff) and ok(ratio):
            out.update(pe_efficiency=eff, draft_cycle_ratio=ratio)
            src["pe"] = "throughput-pe-default-verilator.json"
    except (TypeError, KeyError, ZeroDivisionError):
        pass
    f = _read(d, "moe_cycles.json")
    try:
        # the points are <ROLE>_T<tokens per pass>: the largest pass measured
        # in both FULL and DRAFT (verification batches tokens)
        fig = f["figures"]
        t = max(int(k.split("_T")[1]) for k in fig if k.startswith("FULL_T")
                and f"DRAFT_T{k.split('_T')[1]}" in fig)
        a, b = fig[f"FULL_T{t}"]["efficiency"], fig[f"DRAFT_T{t}"]["efficiency"]
        if ok(a) and ok(b):
            out.update(moe_full_efficiency=a, moe_draft_efficiency=b)
            src["moe"] = f"moe_cycles.json (FULL_T{t}, DRAFT_T{t})"
    except (TypeError, KeyError, ValueError, IndexError):
        if f is not None:
            src["moe"] = "fallback: moe_cycles.json has no FULL_T<n>/DRAFT_T<n> pair"
    f = _read(d, "hb_bandwidth.json")
    try:
        # the model charges HB reads and fills to the same bandwidth
        # (systems.py: (reads + fills) / hb_bw): the array's words per cycle
        # per bank, reads plus fill words, while a fill stream runs
        r = f["figures"]["reads_with_fills"]
        v = r["read_words_per_cycle_per_bank"] + r["fill_words_per_cycle_per_bank"]
        if ok(v):
            out["hb_efficiency"] = v
            src["hb"] = "hb_bandwidth.json (reads_with_fills: read + fill words)"
    except (TypeError, KeyError):
        if f is not None:
            src["hb"] = ("fallback: hb_bandwidth.json has no reads_with_fills."
                         "read/fill_words_per_cycle_per_bank")
    f = _read(d, "ext_bandwidth.json")
    try:
        v = f["figures"][EXT_KEY]["beats_per_cycle_steady"] / \
            f.get("bus_peak_beats_per_cycle", 1.0)
        if ok(v):
            out["ext_efficiency"] = v
            src["ext"] = f"ext_bandwidth.json ({EXT_KEY})"
    except (TypeError, KeyError, ZeroDivisionError):
        if f is not None:
            src["ext"] = f"fallback: ext_bandwidth.json has no {EXT_KEY}"
    # the tag-unit tests write tag_unit-zipf-S<slots>-5k.json (default run) and
    # -1M.json (slow); the one with the most commands wins
    best = None
    for path in sorted(d.glob("tag_unit-zipf-S*-*.json")) if d.is_dir() else []:
        f = _read(d, path.name)
        try:
            n = int(f["commands"])
            if best is None or n > best[0]:
                best = (n, path.name, f)
        except (TypeError, KeyError, ValueError):
            continue
    if best is not None:
        n, name, f = best
        try:
            out["tag_check"] = dict(commands=n, rtl_equals_golden=f["rtl_stats"] == f["golden_stats"],
                                    rtl_stats=f["rtl_stats"], file=name)
            src["tag"] = name
        except (TypeError, KeyError):
            pass
    out["sources"] = src
    used = [k for k, v in src.items() if not v.startswith("fallback")]
    missing = [k for k, v in src.items() if v.startswith("fallback")]
    out["source"] = (f"build/measured ({', '.join(used) or 'none'})" +
                     (f"; fallback constants for {', '.join(missing)}" if missing else ""))
    return out


@lru_cache(maxsize=4)
def load_hardware(path: str | None = None) -> dict:
    p = Path(path) if path else DATA / "hardware.json"
    data = json.loads(p.read_text())
    rtl = rtl_figures()
    out = {}
    for name, d in data["configs"].items():
        fields = {k: d[k] for k in Hardware.__dataclass_fields__ if k in d and k not in ("name", "rtl", "meta")}
        try:
            fields["mac_array"] = tuple(fields["mac_array"])
            out[name] = Hardware(name=name, rtl=rtl, meta={k: d[k] for k in ("sources", "assumed") if k in d},
                                 **fields)
        except TypeError as e:
            raise ValueError(f"Hardware config {name!r} in {p.name}: {e}") from None
    return out


def get_hardware(name: str = "hb8", hb_gb: float | None = None) -> Hardware:
    """The named config, optionally with another HB capacity (``--hb-gb``).

    ``hb_gb`` of 4 or 8 picks the matching paper config; other values copy
    ``hb8`` with the new capacity.
    """
    hw = load_hardware()
    if hb_gb is not None:
        if isinstance(hb_gb, bool) or not isinstance(hb_gb, (int, float)) or not hb_gb > 0:
            raise ValueError(f"HB capacity must be a positive number of GB, not {hb_gb!r}")
        for h in hw.values():
            if h.hb_gb == hb_gb:
                return h
        return hw["hb8"].with_hb(hb_gb)
    if name not in hw:
        raise ValueError(f"Unknown hardware config {name!r}; choose one of {', '.join(hw)}")
    return hw[name]

"""Hardware configurations (``data/hardware.json``): the paper's chips.

What :mod:`.claims` reads: the HB capacity (expert slots per model), the
LPDDR bandwidth (the clock of the ``paper`` preset's cycles: LPDDR GB/s over
its LPDDR bytes per cycle), the memories' read and write ``pJ/bit``, the
INT8 MAC energy (Horowitz 45 nm scaled to 7 nm by an assumed factor) and the
static power. Units: decimal GB (``1 GB = 1e9`` bytes) everywhere, like the
paper's "8 GB" HB and "64 GB" LPDDR. The cycles themselves are the tile
cycle model's (:mod:`.tile_model`), not derived from these rates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .models import DATA

__all__ = ["Hardware", "load_hardware", "get_hardware", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[2]


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


@lru_cache(maxsize=4)
def load_hardware(path: str | None = None) -> dict:
    p = Path(path) if path else DATA / "hardware.json"
    data = json.loads(p.read_text())
    out = {}
    for name, d in data["configs"].items():
        fields = {k: d[k] for k in Hardware.__dataclass_fields__ if k in d and k not in ("name", "meta")}
        try:
            fields["mac_array"] = tuple(fields["mac_array"])
            out[name] = Hardware(name=name, meta={k: d[k] for k in ("sources", "assumed") if k in d},
                                 **fields)
        except TypeError as e:
            raise ValueError(f"Hardware config {name!r} in {p.name}: {e}") from None
    return out


def get_hardware(name: str = "hb8", hb_gb: float | None = None) -> Hardware:
    """The named config, or the one with ``hb_gb`` GB of HB (4 or 8: the
    paper's chips)."""
    hw = load_hardware()
    if hb_gb is not None:
        for h in hw.values():
            if h.hb_gb == hb_gb:
                return h
        raise ValueError(f"No hardware config has {hb_gb!r} GB of HB; the paper's have "
                         f"{', '.join(f'{h.hb_gb:g}' for h in hw.values())}")
    if name not in hw:
        raise ValueError(f"Unknown hardware config {name!r}; choose one of {', '.join(hw)}")
    return hw[name]

"""One configuration object for every block, golden model, testbench and report.

Every architectural parameter of ELMoE-3D lives in :class:`Config`, a frozen
dataclass validated on construction. Amaranth components, the golden models,
the cocotb testbenches, the synthesis flow and the system model all take
their parameters from it, so a block never disagrees with its golden model
about a width, and two blocks never disagree about a shared size.

``Config`` also owns the **geometry** that joins the blocks (see
``docs/architecture.md``): the HB slot size derived from the expert shape,
the dense region that holds router weights, shared experts and
requantisation parameters, and the cross-block constraints (an expert fits a
slot, ``H``/``I``/``E`` divide into what the PE array consumes, widths agree).
An impossible geometry raises ``ValueError`` naming the numbers.

Named presets: ``tiny`` (fast tests), ``default`` (the size ``make demo``
reports), ``fpga`` (smallest useful build for an FPGA), ``lm`` (the shape of
the in-project MoE language model, ``sim/lm/data/moe_lm.npz``),
``paper-ratio`` (the default tile at the paper's bandwidth and compute
ratios, :meth:`Config.ratios`), ``paper`` (the paper's chip, for the system
model only).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# the parameter check and the derived widths and sizes (check_int, PARAM_BITS,
# WEIGHT_BITS and SLICE_WIDTHS re-exported: they are part of this module's interface)
from .checks import check_int
from .geometry import PARAM_BITS, SLICE_WIDTHS, WEIGHT_BITS, acc_width, bits, dense_layout, lpddr_layout

__all__ = ["Config", "PRESETS", "preset", "check_int", "require_config", "SLICE_WIDTHS", "WEIGHT_BITS",
           "ACT_BITS", "PARAM_BITS"]

#: Activation precision of the target models (INT8 x INT8).
ACT_BITS = 8


def _check_pow2(name, value):
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, not {value!r}")


def require_config(owner: str, cfg) -> "Config":
    """``cfg``, or ``TypeError`` naming ``owner`` and the value unless it is a
    :class:`Config` (every block built from a Config checks so first)."""
    if not isinstance(cfg, Config):
        raise TypeError(f"{owner} needs a Config, not {cfg!r}")
    return cfg


@dataclass(frozen=True)
class Config:
    """Architectural parameters of one ELMoE-3D tile.

    Parameters
    ----------
    slice_bits : int
        Slice width ``s`` in bits (1, 2 or 4). An INT8 weight is ``n = 8 // s``
        planes; plane 0 (MSB) is signed, the others unsigned.
    lanes : int
        ``L``, lanes per PE: slices (and INT8 activations) consumed per cycle.
    pes : int
        ``B``, PEs in the tile; also the number of HB banks (paired 1:1).
    max_len : int
        Longest dot product (reduction length, in elements) one PE
        accumulates; sets the accumulator width so it can never overflow.
        Must be at least ``max(hidden, ffn)``.
    hb_words : int
        Words per HB bank (one word = one slice vector; power of two).
    tag_slots : int
        ``S``, slots of the expert-cache tag unit = expert slots in HB.
    layer_bits, expert_bits : int
        Widths of the ``{layer, expert}`` expert tag.
    layers : int
        MoE layers the tile serves (their dense data all live in HB; the
        LPDDR image holds every layer's experts).
    hidden, ffn, experts, top_k, shared_experts : int
        MoE layer shape ``H``, ``I``, ``E``, ``k`` and shared experts.
    hb_planes : int or None
        Planes of an expert kept in HB, which are also the planes a DRAFT
        computes with (``1 .. n-1``); ``None`` (default) means the MSB half,
        ``max(1, n // 2)``: the 4-bit draft of an INT8 weight.
    batch_tokens : int
        ``T``: tokens per pass of the batched MoE datapath (each expert's
        weights are streamed once per pass). A layer step of at most ``T``
        tokens is one pass: with ``T >= 16 * (draft_len_max + 1)`` (the
        largest batch of the Elastic-SD controller times the longest
        verification) every verification streams each expert once.
    token_lanes : int
        ``P``: tokens each PE multiplies one weight slice vector with in the
        same cycle (token-parallel PE array: ``B x P`` bit-slice dot products
        per cycle). Token ``t`` of a pass runs in lane ``t mod P``; the
        compute per weight word the array can apply is ``P``.
    axi_data_bits, axi_addr_bits, axi_id_bits : int
        AXI4 widths of the external-memory port. The data width must carry
        at least one slice vector; it is halved until its slice vectors per
        beat divide the bank count (:attr:`axi_beat_bits`).
    axi_max_burst, axi_outstanding : int
        Longest INCR burst (beats) and bursts in flight.
    lpddr_bytes_per_cycle : int or None
        LPDDR read bandwidth in bytes per tile clock cycle, which the memory
        models of the testbenches and the native harness enforce and the
        system model reads (:attr:`lpddr_rate`); ``None`` (default) means
        one AXI beat per cycle (``axi_beat_bits / 8``), the most the port
        carries. Not an RTL parameter: the Verilog does not depend on it.
    lpddr_base : int
        Byte address of the LPDDR window (4 KiB aligned); the window is
        :attr:`lpddr_bytes` long and holds the expert image and the dense
        image (``golden/layout.py``). Commands outside it are refused.
    fill_depth : int
        HB fill FIFO depth in beats.
    hot_bits, decay_shift, pin_bits, stat_bits : int
        Tag-unit policy widths: saturating hotness counter, DECAY's
        ``hot -= hot >> decay_shift``, pin counter, statistics counters.
    sd_threshold : int
        Batch size at and above which the Elastic-SD controller runs
        speculative decoding (below it: AR with the HB expert cache).
    draft_len_min, draft_len_max, draft_len_init : int
        Draft length ``K`` limits and starting value.
    decay_period : int
        DECAY of every hotness counter after this many draft steps.
    kv_words_per_token : int
        HB words per bank the KV cache grows by per token of context.
    min_free_slots : int
        SD backs off to AR when fewer expert slots than this remain outside
        the KV region.
    """

    slice_bits: int = 4
    lanes: int = 16
    pes: int = 4
    max_len: int = 4096
    hb_words: int = 8192
    tag_slots: int = 16
    layer_bits: int = 6
    expert_bits: int = 7
    layers: int = 2
    hidden: int = 64
    ffn: int = 128
    experts: int = 16
    top_k: int = 4
    shared_experts: int = 0
    hb_planes: int | None = None
    batch_tokens: int = 80
    token_lanes: int = 4
    axi_data_bits: int = 64
    axi_addr_bits: int = 32
    axi_id_bits: int = 4
    axi_max_burst: int = 16
    axi_outstanding: int = 16
    lpddr_bytes_per_cycle: int | None = None
    lpddr_base: int = 0
    fill_depth: int = 8
    hot_bits: int = 8
    decay_shift: int = 2
    pin_bits: int = 3
    stat_bits: int = 32
    sd_threshold: int = 4
    draft_len_min: int = 1
    draft_len_max: int = 4
    draft_len_init: int = 2
    decay_period: int = 16
    kv_words_per_token: int = 1
    min_free_slots: int = 2

    def __post_init__(self):
        if isinstance(self.slice_bits, bool) or not isinstance(self.slice_bits, int):
            raise TypeError(f"Slice width must be an integer, not {self.slice_bits!r}")
        if self.slice_bits not in SLICE_WIDTHS:
            raise ValueError(f"Slice width must be 1, 2 or 4, not {self.slice_bits!r}")
        check_int("Lane count", self.lanes, 1, 1024)
        check_int("PE count", self.pes, 1, 1024)
        check_int("Maximum dot-product length", self.max_len, 1)
        check_int("HB words per bank", self.hb_words, 2)
        _check_pow2("HB words per bank", self.hb_words)
        check_int("Tag-unit slot count", self.tag_slots, 2, 4096)
        check_int("Layer id width", self.layer_bits, 1, 16)
        check_int("Expert id width", self.expert_bits, 1, 16)
        check_int("Layer count", self.layers, 1)
        check_int("Hidden size", self.hidden, 1)
        check_int("Expert FFN width", self.ffn, 1)
        check_int("Routed expert count", self.experts, 1)
        check_int("Top-k", self.top_k, 1)
        check_int("Shared expert count", self.shared_experts, 0, 8)
        n = self.planes
        if self.hb_planes is not None:
            check_int("HB planes per expert", self.hb_planes, 1, max(1, n - 1))
        check_int("Tokens per pass", self.batch_tokens, 1, 256)
        check_int("Token lanes", self.token_lanes, 1, 64)
        if self.token_lanes > self.batch_tokens:
            raise ValueError(f"Token lanes {self.token_lanes!r} exceed the tokens per pass "
                             f"{self.batch_tokens}")
        check_int("AXI data width", self.axi_data_bits, 8, 1024)
        _check_pow2("AXI data width", self.axi_data_bits)
        check_int("AXI address width", self.axi_addr_bits, 12, 64)
        check_int("AXI ID width", self.axi_id_bits, 1, 16)
        check_int("AXI maximum burst length", self.axi_max_burst, 1, 256)
        check_int("AXI outstanding bursts", self.axi_outstanding, 1, 64)
        if self.lpddr_bytes_per_cycle is not None:
            check_int("LPDDR bytes per cycle", self.lpddr_bytes_per_cycle, 1)
        check_int("LPDDR base address", self.lpddr_base, 0)
        if self.lpddr_base % 4096:
            raise ValueError(f"LPDDR base address must be 4 KiB aligned, not {self.lpddr_base:#x}")
        check_int("Fill FIFO depth", self.fill_depth, 2, 1024)
        check_int("Hotness width", self.hot_bits, 1, 32)
        check_int("Decay shift", self.decay_shift, 0, self.hot_bits)
        check_int("Pin counter width", self.pin_bits, 1, 16)
        check_int("Statistics counter width", self.stat_bits, 1, 64)
        check_int("SD batch threshold", self.sd_threshold, 1)
        check_int("Minimum draft length", self.draft_len_min, 1, 64)
        check_int("Maximum draft length", self.draft_len_max, self.draft_len_min, 64)
        check_int("Initial draft length", self.draft_len_init, self.draft_len_min,
                  self.draft_len_max)
        check_int("DECAY period", self.decay_period, 1)
        check_int("KV words per token", self.kv_words_per_token, 0)
        check_int("Minimum free expert slots", self.min_free_slots, 0, self.tag_slots)
        self._check_geometry()

    # -- cross-block constraints -------------------------------------------
    def _check_geometry(self):
        H, I, E, L, B = self.hidden, self.ffn, self.experts, self.lanes, self.pes
        if self.top_k > E:
            raise ValueError(f"Top-k must not exceed the expert count {E}, not {self.top_k!r}")
        if E > (1 << self.expert_bits):
            raise ValueError(
                f"Expert count {E!r} does not fit in expert id width {self.expert_bits}")
        if self.layers > (1 << self.layer_bits):
            raise ValueError(
                f"Layer count {self.layers!r} does not fit in layer id width {self.layer_bits}")
        for name, v, div, dname in (("Hidden size", H, L, "lane count"),
                                    ("Expert FFN width", I, L, "lane count"),
                                    ("Hidden size", H, B, "PE count"),
                                    ("Expert FFN width", I, B, "PE count"),
                                    ("Routed expert count", E, B, "PE count")):
            if v % div:
                raise ValueError(f"{name} {v!r} must be a multiple of the {dname} {div}")
        if self.max_len < max(H, I):
            raise ValueError(f"Maximum dot-product length {self.max_len!r} is shorter than the "
                             f"longest projection, max(hidden, ffn) = {max(H, I)}")
        if self.slice_vector_bits < 8 or self.slice_vector_bits & (self.slice_vector_bits - 1):
            raise ValueError(f"A slice vector (lanes x slice bits = {self.slice_vector_bits}) "
                             f"must be a power of two of at least 8 bits")
        if self.axi_data_bits < self.slice_vector_bits:
            raise ValueError(f"AXI data width {self.axi_data_bits!r} is narrower than one "
                             f"{self.slice_vector_bits}-bit slice vector (lanes {L} x slice "
                             f"bits {self.slice_bits}); it must be at least "
                             f"{self.slice_vector_bits}")
        # AXI beat: the adjusted width must be representable (raises itself)
        beat = self.axi_beat_bits // 8
        if self.lpddr_bytes_per_cycle is not None and self.lpddr_bytes_per_cycle > beat:
            raise ValueError(f"LPDDR bytes per cycle {self.lpddr_bytes_per_cycle!r} exceeds one "
                             f"{self.axi_beat_bits}-bit AXI beat ({beat} bytes), the most the "
                             f"port carries per cycle")
        need = self.dense_words + self.tag_slots * self.slot_words
        if need > self.hb_words:
            raise ValueError(
                f"An expert needs {self.slot_words} words per HB bank "
                f"({self.hb_planes_eff} of {self.planes} planes of 3 x {H} x {I} weights over "
                f"{B} banks x {L} lanes); {self.tag_slots} slots need "
                f"{self.tag_slots * self.slot_words} words and the dense region "
                f"{self.dense_words}, {need} in all, but an HB bank holds {self.hb_words} words")
        if self.lpddr_base + self.lpddr_bytes > (1 << self.axi_addr_bits):
            raise ValueError(
                f"The LPDDR window ({self.lpddr_bytes} bytes at {self.lpddr_base:#x}) does not fit "
                f"the {self.axi_addr_bits}-bit AXI address space")

    # -- derived quantities -------------------------------------------------
    @property
    def planes(self) -> int:
        """``n``: slice planes per INT8 weight."""
        return WEIGHT_BITS // self.slice_bits

    @property
    def hb_planes_eff(self) -> int:
        """``k``: planes of an expert kept in HB (= DRAFT planes)."""
        return max(1, self.planes // 2) if self.hb_planes is None else self.hb_planes

    @property
    def draft_planes(self) -> int:
        """Planes a DRAFT computes with (the ones HB holds)."""
        return self.hb_planes_eff

    @property
    def slice_vector_bits(self) -> int:
        """Bits of one slice vector (``L`` slices, lane 0 in the low bits)."""
        return self.lanes * self.slice_bits

    @property
    def tag_bits(self) -> int:
        return self.layer_bits + self.expert_bits

    @property
    def slot_bits(self) -> int:
        """Width of a slot index (and of the tag unit's STATS index, >= 2)."""
        return max(2, math.ceil(math.log2(self.tag_slots)))

    @property
    def plane_bits(self) -> int:
        """Width of a plane index ``0 .. n-1``."""
        return bits(self.planes)

    @property
    def expert_rows(self) -> int:
        """Words per HB bank (= per PE) of one plane of one expert:
        ``3 H I / (B L)`` (gate, up and down projections)."""
        return 3 * self.hidden * self.ffn // (self.pes * self.lanes)

    @property
    def slot_words(self) -> int:
        """Words per bank of one expert slot: ``k`` planes of :attr:`expert_rows`."""
        return self.hb_planes_eff * self.expert_rows

    @property
    def dense_words(self) -> int:
        """Words per bank of the dense region (every layer's router, shared
        experts and requantisation parameters); see ``golden/layout.py``."""
        return dense_layout(self).words

    @property
    def expert_base(self) -> int:
        """Word address of slot 0 in every bank (just above the dense region)."""
        return self.dense_words

    @property
    def kv_max_words(self) -> int:
        """Largest KV region: everything above the dense region."""
        return self.hb_words - self.dense_words

    @property
    def axi_beat_bits(self) -> int:
        """AXI data width actually used: ``axi_data_bits`` adjusted so one beat
        carries ``fill_words`` whole slice vectors with ``fill_words``
        dividing the bank count (halved until it does; a width narrower
        than one slice vector is refused on construction)."""
        sv = self.slice_vector_bits
        d = self.axi_data_bits
        if d % sv:
            raise ValueError(f"AXI data width {self.axi_data_bits!r} cannot carry whole "
                             f"{sv}-bit slice vectors")
        w = d // sv
        while w > 1 and self.pes % w:
            w //= 2
        return w * sv

    @property
    def lpddr_rate(self) -> int:
        """LPDDR read bandwidth in bytes per cycle: :attr:`lpddr_bytes_per_cycle`,
        or one beat of :attr:`axi_beat_bits` per cycle when that is ``None``
        (never more: the port carries one beat per cycle)."""
        beat = self.axi_beat_bits // 8
        return beat if self.lpddr_bytes_per_cycle is None else self.lpddr_bytes_per_cycle

    @property
    def fill_words(self) -> int:
        """Slice vectors per AXI beat (and per HB fill beat)."""
        return self.axi_beat_bits // self.slice_vector_bits

    @property
    def expert_bytes(self) -> int:
        """LPDDR bytes of one expert (all ``n`` planes)."""
        return self.planes * self.expert_rows * self.pes * self.slice_vector_bits // 8

    @property
    def lpddr_bytes(self) -> int:
        """Length of the LPDDR window: every layer's routed experts, then the
        dense image (``golden/layout.py``)."""
        return lpddr_layout(self).total_bytes

    @property
    def acc_bits(self) -> int:
        """PE accumulator width: ``geometry.acc_width(max_len, lanes)``
        (no dot product a PE accepts can overflow it)."""
        return acc_width(self.max_len, self.lanes)

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields as a dict (``Config(**d)`` rebuilds it). ``lpddr_bytes_per_cycle``
        is left out at its default ``None``: it is no RTL parameter, so the
        build keys and records of configurations without it stay as they were."""
        d = dataclasses.asdict(self)
        if d["lpddr_bytes_per_cycle"] is None:
            del d["lpddr_bytes_per_cycle"]
        return d

    def ratios(self) -> dict:
        """The three ratios that decide where a pass is bound
        (``ELMoE-3D.md``, "Ratios, not sizes, decide"): the PE array's slice
        multiplies per HB word (``P``: a word feeds ``P`` tokens) and per
        LPDDR word, and HB's bandwidth over LPDDR's (bytes per cycle). The
        paper's chip: about 160, 2,560 and 16."""
        sv_bytes = self.slice_vector_bits / 8
        lp_words = self.lpddr_rate / sv_bytes
        return {"compute_per_hb_word": self.token_lanes,
                "compute_per_lpddr_word": self.pes * self.token_lanes / lp_words,
                "hb_to_lpddr": self.pes * sv_bytes / self.lpddr_rate}

    def geometry(self) -> dict:
        """The derived sizes, for reports and documentation."""
        return {"planes": self.planes, "hb_planes": self.hb_planes_eff,
                "expert_rows": self.expert_rows, "slot_words": self.slot_words,
                "dense_words": self.dense_words, "expert_base": self.expert_base,
                "kv_max_words": self.kv_max_words,
                "free_words": self.hb_words - self.dense_words - self.tag_slots * self.slot_words,
                "axi_beat_bits": self.axi_beat_bits, "fill_words": self.fill_words,
                "lpddr_bytes_per_cycle": self.lpddr_rate,
                "expert_bytes": self.expert_bytes, "lpddr_bytes": self.lpddr_bytes,
                **self.ratios()}


PRESETS = {
    # fast simulation: every test that needs a full block
    "tiny": Config(lanes=4, pes=2, max_len=256, hb_words=4096, tag_slots=8, layers=2,
                   hidden=16, ffn=32, experts=8, top_k=2, batch_tokens=4, token_lanes=2,
                   sd_threshold=2,
                   draft_len_max=4, draft_len_init=2, decay_period=4),
    # what `make demo` reports
    "default": Config(),
    # the smallest useful build; fits an ECP5-85F
    "fpga": Config(lanes=8, pes=2, max_len=1024, hb_words=8192, tag_slots=8, layers=1,
                   hidden=32, ffn=64, experts=8, top_k=2, batch_tokens=4, token_lanes=2,
                   axi_data_bits=32),
    # the in-project MoE language model (sim/lm/data/moe_lm.npz): 4 layers,
    # d_model 128, 16 experts top-2, FFN 64
    "lm": Config(lanes=16, pes=4, max_len=1024, hb_words=16384, tag_slots=24, layers=4,
                 hidden=128, ffn=64, experts=16, top_k=2),
    # the default tile at the paper's ratios: HB:LPDDR 16:1 (LPDDR 2 bytes per cycle
    # against HB's 4 banks x 8), 16 token lanes (16 slice multiplies per HB word,
    # 256 per LPDDR word): a DRAFT pass is HB-bound, a VERIFY LPDDR-bound
    "paper-ratio": Config(token_lanes=16, lpddr_bytes_per_cycle=2),
    # the paper's chip (8 GB config): 32 PEs, 16x32x32 bit-slice arrays; for the system model
    "paper": Config(lanes=32, pes=32, max_len=16384, hb_words=1 << 24, tag_slots=3200,
                    layer_bits=6, expert_bits=8, layers=48, hidden=2048, ffn=768, experts=128,
                    top_k=8, batch_tokens=144, token_lanes=16, draft_len_max=8,
                    axi_data_bits=256, axi_addr_bits=40),
}


def preset(name: str) -> Config:
    """The named preset; ``ValueError`` naming the choices for an unknown name."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"Unknown configuration preset {name!r}; choose one of {', '.join(PRESETS)}") from None

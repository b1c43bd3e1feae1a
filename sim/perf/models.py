"""Model shapes (``data/models.json``) and the counts derived from them.

Every weight is INT8 (``weight_bytes`` = 1, the paper's bit-slice datapath);
an expert is a SwiGLU FFN (gate, up, down: ``3 * hidden * expert_ffn``
weights). *Dense* weights are everything that is not a routed expert:
attention (GQA or MLA), routers, shared experts, dense FFN layers,
embeddings and the LM head; :mod:`.claims` takes them out of the HB
capacity before it counts expert slots, and runs the tile with a model's
``hidden``, ``expert_ffn``, ``experts``, ``top_k`` and ``shared_experts``
and generates its routing with the model's ``locality``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

__all__ = ["ModelShape", "load_models", "get_model", "model_names", "DATA"]

DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class ModelShape:
    """One MoE model's published shape plus its locality parameters."""

    name: str
    layers: int
    hidden: int
    expert_ffn: int
    experts: int
    top_k: int
    shared_experts: int
    shared_ffn: int
    dense_layers: tuple
    dense_ffn: int
    vocab: int
    tie_embeddings: bool
    attention: dict
    locality: dict
    paper_eval: bool = False
    weight_bytes: int = 1
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for f in ("layers", "hidden", "expert_ffn", "experts", "top_k", "vocab"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Model {self.name!r}: {f} must be a positive integer, not {v!r}")
        if self.top_k > self.experts:
            raise ValueError(f"Model {self.name!r}: top_k {self.top_k} exceeds experts {self.experts}")
        if any(not 0 <= l < self.layers for l in self.dense_layers):
            raise ValueError(f"Model {self.name!r}: dense layer ids {self.dense_layers} outside 0..{self.layers - 1}")
        if self.attention.get("type") not in ("gqa", "mla"):
            raise ValueError(f"Model {self.name!r}: attention type must be 'gqa' or 'mla', "
                             f"not {self.attention.get('type')!r}")

    # -- layers -----------------------------------------------------------------
    @property
    def moe_layers(self) -> list[int]:
        return [l for l in range(self.layers) if l not in self.dense_layers]

    # -- weights (parameters) ----------------------------------------------------
    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up, down)."""
        return 3 * self.hidden * self.expert_ffn

    @property
    def expert_bytes(self) -> int:
        return self.expert_params * self.weight_bytes

    def attention_params(self) -> int:
        """Attention weights of one layer."""
        a, H = self.attention, self.hidden
        if a["type"] == "gqa":
            qh, kvh, hd = a["q_heads"], a["kv_heads"], a["head_dim"]
            return H * qh * hd + 2 * H * kvh * hd + qh * hd * H
        qh, r = a["q_heads"], a["kv_lora_rank"]
        nope, rope, v = a["qk_nope_head_dim"], a["qk_rope_head_dim"], a["v_head_dim"]
        ql = a.get("q_lora_rank") or 0
        q = H * qh * (nope + rope) if not ql else H * ql + ql * qh * (nope + rope)
        return q + H * (r + rope) + r * qh * (nope + v) + qh * v * H

    @property
    def dense_params(self) -> int:
        """Every non-expert weight: attention, routers, shared experts, dense
        FFN layers, embeddings and LM head."""
        moe = len(self.moe_layers)
        p = self.layers * self.attention_params()
        p += moe * self.hidden * self.experts                              # routers
        p += moe * self.shared_experts * 3 * self.hidden * self.shared_ffn  # shared experts
        p += len(self.dense_layers) * 3 * self.hidden * self.dense_ffn
        p += self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return p

    @property
    def dense_bytes(self) -> int:
        return self.dense_params * self.weight_bytes

    @property
    def total_params(self) -> int:
        return self.dense_params + len(self.moe_layers) * self.experts * self.expert_params


def _from_dict(name, d) -> ModelShape:
    try:
        return ModelShape(
            name=name, layers=d["layers"], hidden=d["hidden"], expert_ffn=d["expert_ffn"],
            experts=d["experts"], top_k=d["top_k"], shared_experts=d.get("shared_experts", 0),
            shared_ffn=d.get("shared_ffn", 0), dense_layers=tuple(d.get("dense_layers", ())),
            dense_ffn=d.get("dense_ffn", 0), vocab=d["vocab"],
            tie_embeddings=bool(d.get("tie_embeddings", False)), attention=dict(d["attention"]),
            locality=dict(d.get("locality", {})), paper_eval=bool(d.get("paper_eval", False)),
            weight_bytes=d.get("weight_bytes", 1),
            meta={k: d[k] for k in ("assumed", "note", "locality_source") if k in d})
    except KeyError as e:
        raise ValueError(f"Model {name!r} in models.json lacks field {e.args[0]!r}") from None


@lru_cache(maxsize=8)
def load_models(path: str | None = None) -> dict:
    """``{name: ModelShape}`` from ``data/models.json`` (or ``path``)."""
    p = Path(path) if path else DATA / "models.json"
    data = json.loads(p.read_text())
    return {n: _from_dict(n, d) for n, d in data["models"].items()}


def model_names() -> list[str]:
    return list(load_models())


def get_model(name: str) -> ModelShape:
    """The named model; ``ValueError`` naming the choices for an unknown one
    (case-insensitive match accepted)."""
    models = load_models()
    if name in models:
        return models[name]
    for n, m in models.items():
        if n.lower() == str(name).lower():
            return m
    raise ValueError(f"Unknown model {name!r}; choose one of {', '.join(models)}")

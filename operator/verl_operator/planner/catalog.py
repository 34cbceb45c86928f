"""The built-in model catalog (``verl_operator/data/model-shapes.csv``) and parameter counting."""

from __future__ import annotations

import csv
import functools
import io
import math
from dataclasses import dataclass
from importlib import resources

from verl_operator.api.spec import ModelShape

_CATALOG_FILE = "model-shapes.csv"


@dataclass(frozen=True)
class CatalogEntry:
    """One catalog row: the ids that share a shape, the shape and the parameter counts."""

    ids: tuple[str, ...]
    shape: ModelShape
    params_total: float
    params_active: float


def _opt_int(raw: str) -> int | None:
    raw = raw.strip()
    return int(raw) if raw else None


def _parse_rows(text: str) -> list[CatalogEntry]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    entries: list[CatalogEntry] = []
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        shape = ModelShape(
            model_type=row["model_type"] or None,
            layers=int(row["num_hidden_layers"]),
            hidden_size=int(row["hidden_size"]),
            attention_heads=int(row["num_attention_heads"]),
            kv_heads=int(row["num_key_value_heads"]),
            head_dim=_opt_int(row["head_dim"]),
            intermediate_size=int(row["intermediate_size"]),
            vocab_size=int(row["vocab_size"]),
            max_position_embeddings=int(row["max_position_embeddings"]),
            tie_word_embeddings=row["tie_word_embeddings"].strip().lower() == "true",
            num_experts=_opt_int(row["num_experts"]),
            num_experts_per_tok=_opt_int(row["num_experts_per_tok"]),
            moe_intermediate_size=_opt_int(row["moe_intermediate_size"]),
            shared_experts=_opt_int(row["n_shared_experts"]),
            first_k_dense_replace=_opt_int(row["first_k_dense_replace"]),
            q_lora_rank=_opt_int(row["q_lora_rank"]),
            kv_lora_rank=_opt_int(row["kv_lora_rank"]),
            qk_nope_head_dim=_opt_int(row["qk_nope_head_dim"]),
            qk_rope_head_dim=_opt_int(row["qk_rope_head_dim"]),
            v_head_dim=_opt_int(row["v_head_dim"]),
        )
        entries.append(
            CatalogEntry(
                ids=tuple(i.strip() for i in row["ids"].split(";") if i.strip()),
                shape=shape,
                params_total=float(row["params_total_B_computed"]) * 1e9,
                params_active=float(row["params_active_B_computed"]) * 1e9,
            )
        )
    return entries


@functools.cache
def catalog() -> tuple[CatalogEntry, ...]:
    """All catalog entries, in file order."""
    text = resources.files("verl_operator").joinpath("data", _CATALOG_FILE).read_text(encoding="utf-8")
    return tuple(_parse_rows(text))


def lookup(path: str) -> CatalogEntry | None:
    """The catalog entry for a model path, or None.

    A path matches an id exactly (case-insensitive), or when its last two components (``Qwen/Qwen3-8B`` in
    ``/models/Qwen/Qwen3-8B``) or its last component (``Qwen3-8B`` in ``/models/Qwen3-8B``) equal an id's.

    Args:
        path: ``spec.model.path``: an HF id or a path in a mounted volume.
    """
    clean = path.strip().rstrip("/").lower()
    parts = [p for p in clean.split("/") if p]
    if not parts:
        return None
    tail2 = "/".join(parts[-2:])
    tail1 = parts[-1]
    for entry in catalog():
        ids = [i.lower() for i in entry.ids]
        if clean in ids or tail2 in ids:
            return entry
    for entry in catalog():
        if any(i.lower().split("/")[-1] == tail1 for i in entry.ids):
            return entry
    return None


@dataclass(frozen=True)
class MlaDims:
    """Multi-latent attention's dimensions (DeepSeek-V2/V3 style), with DeepSeek-V3's where the shape is silent."""

    q_rank: int | None  # q_lora_rank; None: the query is projected from the hidden state directly
    kv_rank: int  # kv_lora_rank
    nope: int  # qk_nope_head_dim
    rope: int  # qk_rope_head_dim
    v: int  # v_head_dim

    @property
    def qk(self) -> int:
        """A query's (and a key's) head dimension."""
        return self.nope + self.rope


def mla_dims(shape: ModelShape) -> MlaDims | None:
    """The shape's MLA dimensions, or None when its attention is not multi-latent."""
    if shape.kv_lora_rank is None:
        return None
    return MlaDims(
        q_rank=shape.q_lora_rank,
        kv_rank=shape.kv_lora_rank,
        nope=shape.qk_nope_head_dim or 128,
        rope=shape.qk_rope_head_dim or 64,
        v=shape.v_head_dim or 128,
    )


def mla_activation_bytes(shape: ModelShape) -> tuple[int, int] | None:
    """``(bytes per token a multi-latent attention layer keeps for its backward, the up-projection's part)``;
    None when the shape's attention is not multi-latent.

    Algorithm:
        bf16 (2 bytes each) query, key and value as the attention kernel takes them (``qk``, ``qk`` and ``v``
        per head) and its output (``v`` per head), plus the latents: the query's and the key-value's
        down-projection outputs and their normed copies (``q_lora_rank``, ``kv_lora_rank``) and the key's rope
        part. The up-projection's part is the query, key and value and the normed latents: what megatron-core's
        ``mla_up_proj`` recompute discards after the attention and rebuilds in the backward (0.14.0
        ``transformer/multi_latent_attention.py`` lines 115-118, 313-316 and 781-784). Example: DeepSeek-V3
        (128 heads, qk 192, v 128, ranks 1536 and 512, rope 64): ``2 x 128 x (2 x 192 + 2 x 128) +
        2 x (2 x 1536 + 2 x 512 + 64) = 172160`` kept, ``2 x 128 x (2 x 192 + 128) + 2 x (1536 + 512) = 135168``
        of it the up-projection's.
    """
    mla = mla_dims(shape)
    if mla is None:
        return None
    heads = shape.attention_heads
    ranks = (mla.q_rank or 0) + mla.kv_rank
    up_proj = 2 * heads * (2 * mla.qk + mla.v) + 2 * ranks
    return up_proj + 2 * heads * mla.v + 2 * (ranks + mla.rope), up_proj


def count_params(shape: ModelShape) -> tuple[float, float]:
    """Total and active (per token) parameters of a decoder-only transformer.

    Counts embeddings (and an untied LM head), attention (GQA or MLA), dense or MoE MLPs (routed, shared
    experts and router) and norms. Biases are ignored (under 0.1%).

    Args:
        shape: The model's architecture numbers.

    Returns:
        ``(total, active)`` parameter counts.
    """
    h = shape.hidden_size
    hd = shape.effective_head_dim
    embed = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    mla = mla_dims(shape)
    if mla is not None:
        q = (
            h * mla.q_rank + mla.q_rank * shape.attention_heads * mla.qk
            if mla.q_rank
            else (h * shape.attention_heads * mla.qk)
        )
        kv = h * (mla.kv_rank + mla.rope) + mla.kv_rank * shape.attention_heads * (mla.nope + mla.v)
        attn = q + kv + shape.attention_heads * mla.v * h
    else:
        attn = h * shape.attention_heads * hd * 2 + h * shape.kv_heads * hd * 2
    dense_mlp = 3 * h * shape.intermediate_size
    if shape.num_experts:
        moe_i = shape.moe_intermediate_size or shape.intermediate_size
        routed = shape.num_experts * 3 * h * moe_i
        shared = (shape.shared_experts or 0) * 3 * h * moe_i
        top_k = shape.num_experts_per_tok or 1
        dense_layers = shape.first_k_dense_replace or 0
        moe_layers = shape.layers - dense_layers
        router = h * shape.num_experts
        total_mlp = dense_layers * dense_mlp + moe_layers * (routed + shared + router)
        active_mlp = dense_layers * dense_mlp + moe_layers * (top_k * 3 * h * moe_i + shared + router)
    else:
        total_mlp = active_mlp = shape.layers * dense_mlp
    norms = shape.layers * 2 * h + h
    total = embed + shape.layers * attn + total_mlp + norms
    active = embed + shape.layers * attn + active_mlp + norms
    return float(total), float(active)


def effective_intermediate(shape: ModelShape) -> int:
    """The MLP width a token passes through (``moe_intermediate * top_k`` for MoE, plus shared experts)."""
    if shape.num_experts:
        moe_i = shape.moe_intermediate_size or shape.intermediate_size
        return moe_i * ((shape.num_experts_per_tok or 1) + (shape.shared_experts or 0))
    return shape.intermediate_size


def kv_bytes_per_token(shape: ModelShape, tp: int) -> int:
    """vLLM KV-cache bytes per token on one GPU of a TP group (bf16).

    Dense/GQA: ``2 * L * ceil(kv_heads / TP) * head_dim * 2``; MLA: ``L * (kv_lora_rank + qk_rope_head_dim) * 2``,
    replicated on every TP rank.
    """
    mla = mla_dims(shape)
    if mla is not None:
        return shape.layers * (mla.kv_rank + mla.rope) * 2
    return 2 * shape.layers * math.ceil(shape.kv_heads / tp) * shape.effective_head_dim * 2

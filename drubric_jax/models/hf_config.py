"""Reading and writing the fields of a Hugging Face `config.json` that every decoder family
here shares (the transformers `LlamaConfig` names). A family module builds its own mapping
from these (`llama.config_from_hf`, `qwen3_moe.config_from_hf`, `*.hf_config`); loading
(`models.weights.config_from_hf`) and export (`models.export.hf_config_dict`) call the
family's.

Source: the field names and defaults of transformers' `LlamaConfig` (rms_norm_eps 1e-6,
tie_word_embeddings False, head_dim D / H, num_key_value_heads H, rope_theta 1e4) and its
`llama3` rope type; transformers 5 names the rope block `rope_parameters`.
"""
from __future__ import annotations

from typing import Optional

from drubric_jax.models.config import ModelConfig, RopeScaling


def hf_field(hf: dict, name: str, kind: type, default=None, where: str = "config.json"):
    """`hf[name]` as `kind` (int/float: a positive number; bool: true or false), `default`
    when absent or null.

    Raises:
        ValueError: the field is absent and required (no default), or of the wrong kind
            (names the field and `where`).
    """
    value = hf.get(name)
    if value is None and default is None:
        raise ValueError(f"{where} lacks the field {name!r}")
    if value is None:
        return default
    # bool is an int subclass in Python: excluded from the numbers by hand.
    ok = isinstance(value, bool) if kind is bool else (
        isinstance(value, (int, float) if kind is float else int)
        and not isinstance(value, bool) and value > 0)
    if not ok:
        what = "true or false" if kind is bool else f"a positive {kind.__name__}"
        raise ValueError(f"{where} field {name!r} must be {what}, got {value!r}")
    return kind(value)


def _rope_scaling(hf: dict) -> tuple[dict, Optional[RopeScaling]]:
    """(the rope block, RopeScaling or None) of `hf`.

    Raises:
        ValueError: the block is not an object, or its rope type is not default / llama3.
    """
    # Newer transformers configs name the block rope_parameters (rope_theta may sit in it).
    scaling = hf.get("rope_scaling") or (hf.get("rope_parameters") or {})
    if not isinstance(scaling, dict):
        raise ValueError(f"config.json field 'rope_scaling' must be an object, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ValueError(f"config.json rope_scaling type {rope_type!r} is not supported")
    if rope_type == "default":
        return scaling, None

    def rope(name, kind):
        return hf_field(scaling, name, kind, where="config.json rope_scaling")

    return scaling, RopeScaling(
        factor=rope("factor", float), low_freq_factor=rope("low_freq_factor", float),
        high_freq_factor=rope("high_freq_factor", float),
        original_max_position_embeddings=rope("original_max_position_embeddings", int))


def dense_from_hf(hf: dict, hidden_dim: Optional[int] = None) -> dict:
    """The ModelConfig fields of a dense decoder's `config.json` (no dtype, no family).

    Args:
        hf: the config.json dict.
        hidden_dim: F when the family reads it elsewhere (a mixture of experts:
            `moe_intermediate_size`); None reads `intermediate_size`.

    Raises:
        ValueError: a required field absent, a field of the wrong kind, or an unsupported
            rope scaling (named).
    """
    scaling, rope_scaling = _rope_scaling(hf)

    def field(name, kind, default=None):
        return hf_field(hf, name, kind, default)

    dim, heads = field("hidden_size", int), field("num_attention_heads", int)
    return dict(
        vocab_size=field("vocab_size", int), dim=dim,
        num_layers=field("num_hidden_layers", int), num_heads=heads,
        num_kv_heads=field("num_key_value_heads", int, heads),
        head_dim=field("head_dim", int, dim // heads),
        hidden_dim=hidden_dim or field("intermediate_size", int),
        rope_theta=field("rope_theta", float, hf_field(scaling, "rope_theta", float, 1e4)),
        rope_scaling=rope_scaling,
        norm_eps=field("rms_norm_eps", float, 1e-6),
        tie_embeddings=field("tie_word_embeddings", bool, False),
        max_seq_len=field("max_position_embeddings", int, 8192))


def dense_to_hf(cfg: ModelConfig, bos_id: int, eos_id: int) -> dict:
    """The `config.json` fields of a dense decoder (the inverse of `dense_from_hf`), with
    the token ids, `torch_dtype` and, when set, the llama3 `rope_scaling` block; no
    `model_type` or `architectures` (`models.export.hf_config_dict` adds those)."""
    out = {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "mlp_bias": False, "bos_token_id": bos_id, "eos_token_id": eos_id,
        "torch_dtype": cfg.param_dtype,
    }
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        out["rope_scaling"] = {
            "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings}
    return out

"""Validation of a run config before any compute: every error names the field."""
from __future__ import annotations

import ml_collections

VARIANTS = ("full", "disc_only", "anchor_only", "static")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "dr_grpo")
DATA_NAMES = ("demo", "shared", "custom")


class ConfigError(ValueError):
    """A config field has a bad value; the message starts with the field's dotted name."""


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config.{field}: {message}")


def _check_trainer(c: ml_collections.ConfigDict, prefix: str, batch: int) -> None:
    _require(c.learning_rate > 0, f"{prefix}.learning_rate", "must be > 0")
    _require(c.warmup_steps >= 0, f"{prefix}.warmup_steps", "must be >= 0")
    _require(c.weight_decay >= 0, f"{prefix}.weight_decay", "must be >= 0")
    _require(0 <= c.b1 < 1 and 0 <= c.b2 < 1, f"{prefix}.b1/b2", "must be in [0, 1)")
    _require(c.max_grad_norm > 0, f"{prefix}.max_grad_norm", "must be > 0")
    _require(0 < c.clip_eps < 1, f"{prefix}.clip_eps", "must be in (0, 1)")
    _require(c.beta >= 0, f"{prefix}.beta", "must be >= 0")
    _require(c.aggregation in AGGREGATIONS, f"{prefix}.aggregation",
             f"{c.aggregation!r} not in {AGGREGATIONS}")
    _require(c.logits_chunk >= 1, f"{prefix}.logits_chunk", "must be >= 1")
    _require(c.mu_dtype in ("float32", "bfloat16"), f"{prefix}.mu_dtype",
             f"{c.mu_dtype!r} must be float32 or bfloat16")
    mb = c.micro_batch_size
    _require(mb >= 0 and (mb == 0 or batch % mb == 0), f"{prefix}.micro_batch_size",
             f"{mb} must be 0 or divide the {batch} responses of a step")


def validate(config: ml_collections.ConfigDict) -> None:
    """Checks a run config (configs/base.py layout).

    Raises:
        ConfigError: the first bad field, named, with the reason.
    """
    c = config
    _require(c.variant in VARIANTS, "variant", f"{c.variant!r} not in {VARIANTS}")
    _require(c.model.dtype in ("float32", "bfloat16"), "model.dtype",
             f"{c.model.dtype!r} must be float32 or bfloat16")
    _require(c.data.name in DATA_NAMES, "data.name", f"{c.data.name!r} not in {DATA_NAMES}")
    if c.data.name == "custom":
        _require(len(c.data.anchor_paths) > 0, "data.anchor_paths", "needed when data.name=custom")
        _require(len(c.data.prompt_paths) > 0, "data.prompt_paths", "needed when data.name=custom")
    _require(c.data.heldout_anchor_rows >= 0, "data.heldout_anchor_rows", "must be >= 0")
    _require(c.data.min_responses >= 2, "data.min_responses", "an anchor list needs >= 2")
    _require(c.data.max_responses >= c.data.min_responses, "data.max_responses",
             "must be >= data.min_responses")
    _require(c.rounds.num_rounds >= 1, "rounds.num_rounds", "must be >= 1")
    _require(c.rounds.generator_steps >= 0, "rounds.generator_steps", "must be >= 0")
    _require(c.rounds.policy_steps >= 0, "rounds.policy_steps", "must be >= 0")
    p, g = c.policy, c.generator
    _require(p.prompts_per_step >= 1, "policy.prompts_per_step", "must be >= 1")
    _require(p.num_responses >= 2, "policy.num_responses", "K must be >= 2 for GRPO groups")
    _require(p.max_new_tokens >= 1, "policy.max_new_tokens", "must be >= 1")
    _require(p.max_prompt_tokens >= 8, "policy.max_prompt_tokens", "must be >= 8")
    _require(p.temperature >= 0, "policy.temperature", "must be >= 0")
    _require(0 < p.top_p <= 1, "policy.top_p", "must be in (0, 1]")
    _require(p.rubric_temperature >= 0, "policy.rubric_temperature", "must be >= 0")
    _check_trainer(p.train, "policy.train", p.prompts_per_step * p.num_responses)
    _require(g.anchors_per_step >= 1, "generator.anchors_per_step", "must be >= 1")
    _require(g.num_lists >= 2, "generator.num_lists", "G must be >= 2 for GRPO groups")
    _require(g.lam >= 0, "generator.lam", "lambda must be >= 0")
    _require(1 <= g.max_items <= 64, "generator.max_items", "must be in 1..64")
    _require(g.max_item_chars >= 8, "generator.max_item_chars", "must be >= 8")
    _require(g.max_new_tokens >= 16, "generator.max_new_tokens", "must be >= 16")
    _require(g.input_budget >= 64, "generator.input_budget", "must be >= 64")
    _require(g.temperature > 0, "generator.temperature",
             "must be > 0: G identical greedy lists give flat groups")
    _check_trainer(g.train, "generator.train", g.anchors_per_step * g.num_lists)
    _require(c.verifier.max_prefix_tokens >= 32, "verifier.max_prefix_tokens", "must be >= 32")
    _require(c.verifier.max_suffix_tokens >= 8, "verifier.max_suffix_tokens", "must be >= 8")
    for axis in ("data", "fsdp", "tensor"):
        v = c.mesh[axis]
        _require(v == -1 or v >= 1, f"mesh.{axis}", "must be -1 or >= 1")
    _require(c.mesh.num_devices >= 0, "mesh.num_devices", "must be >= 0 (0 = all devices)")
    _require(isinstance(c.memory.park_idle_optimizer, bool), "memory.park_idle_optimizer",
             "must be True or False")
    _require(c.checkpoint.every_steps >= 1, "checkpoint.every_steps", "must be >= 1")
    _require(c.checkpoint.max_to_keep >= 1, "checkpoint.max_to_keep", "must be >= 1")

"""What one GRPO trainee (policy or rubric generator) is configured with, and the AdamW
optimizer that follows from it (METHOD section 4: the paper's learning rates 1e-6 for the
policy and 5e-6 for the generator, beta = 0.01).

`rounds.settings.train_config(node, field, ...)` is the one conversion from a config node
(`configs/base.py: trainer_config`, whose defaults are this dataclass's) to this
dataclass, read once per run; every check lives in `TRAINER_RULES`, so a bad value is
reported with its config field whichever way the dataclass is built.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import optax

from drubric_jax import parallel
from drubric_jax.rl import grpo
from drubric_jax.sampling.methods import temperature_for_scoring
from drubric_jax.types import require

AGGREGATIONS = tuple(grpo.AGGREGATIONS)
DTYPES = ("float32", "bfloat16")

# field -> (predicate, what a good value is). micro_batch_size is checked against the
# step's rows separately (0 means "all rows" in a config, and is resolved by TrainConfig).
TRAINER_RULES: dict[str, tuple[Callable, str]] = {
    "learning_rate": (lambda v: v > 0, "must be > 0"),
    "warmup_steps": (lambda v: v >= 0, "must be >= 0"),
    "weight_decay": (lambda v: v >= 0, "must be >= 0"),
    "b1": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "b2": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "eps": (lambda v: v > 0, "must be > 0"),
    "max_grad_norm": (lambda v: v > 0, "must be > 0"),
    "clip_eps": (lambda v: 0 < v < 1, "must be in (0, 1)"),
    "beta": (lambda v: v >= 0, "must be >= 0"),
    # Read when checked, so an estimator registered in grpo.KL_ESTIMATORS is accepted.
    "kl_estimator": (lambda v: v in grpo.KL_ESTIMATORS,
                     "must be one of the keys of rl.grpo.KL_ESTIMATORS"),
    "aggregation": (lambda v: v in AGGREGATIONS, f"must be one of {AGGREGATIONS}"),
    "temperature": (lambda v: v >= 0, "must be >= 0"),
    "logits_chunk": (lambda v: v >= 1, "must be >= 1"),
    "mu_dtype": (lambda v: v in DTYPES, f"must be one of {DTYPES}"),
    # A built TrainConfig holds a bool; a config node may also say "auto" (below).
    "remat": (lambda v: isinstance(v, bool), "must be True or False"),
    "shared_prefix": (lambda v: isinstance(v, bool), "must be True or False"),
    "group_rows": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                   "must be an integer >= 0 (0 = a group's rows in one packed row)"),
}

# The rules of a config node (`config.<role>.train`) where they differ from a TrainConfig's:
# remat may also be "auto", which the run resolves to a bool before it builds the
# TrainConfig (`rounds.remat.decide`, called by `rounds.settings.train_config`, asks the
# memory planner, `memory.remat.resolve_remat`):
# recompute each layer only where the update's saved activations would not fit the device.
REMAT_AUTO = "auto"
CONFIG_RULES: dict[str, tuple[Callable, str]] = {
    "remat": (lambda v: isinstance(v, bool) or v == REMAT_AUTO,
              f"must be True, False or {REMAT_AUTO!r}"),
}


def check_trainer(values: Mapping, prefix: str, rows: Optional[int] = None) -> None:
    """Checks a trainee's values against TRAINER_RULES.

    Args:
        values: field -> value (a ConfigDict node or `dataclasses.asdict(TrainConfig)`).
        prefix: dotted name used in messages ("config.policy.train" or "TrainConfig").
        rows: the step's rows; given for config nodes, where micro_batch_size 0 = all rows
            and `CONFIG_RULES` apply (remat "auto").

    Raises:
        ConfigError: "<prefix>.<field>: <reason> (got <value>)".
    """
    # A config node (rows given) is checked by its own rules where they differ.
    rules = {**TRAINER_RULES, **CONFIG_RULES} if rows is not None else TRAINER_RULES
    for name, (ok, message) in rules.items():
        if name in values:
            require(ok(values[name]), f"{prefix}.{name}", f"{message} (got {values[name]!r})")
    mb = values.get("micro_batch_size")
    if mb is None:
        return
    # A built TrainConfig has its micro-batch resolved: 0 ("all rows") is no longer allowed.
    if rows is None:
        require(mb >= 1, f"{prefix}.micro_batch_size", f"must be >= 1 (got {mb})")
    else:
        require(mb >= 0 and (mb == 0 or rows % mb == 0), f"{prefix}.micro_batch_size",
                 f"{mb} must be 0 or divide the {rows} rows of a step")



@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of one GRPO trainee. Validated on construction
    (`types.ConfigError`, a ValueError naming the field)."""

    learning_rate: float = 1e-6     # peak AdamW step size (paper: 1e-6 policy, 5e-6 generator)
    warmup_steps: int = 0           # optimizer updates of linear warm-up; 0 = none
    weight_decay: float = 0.0       # decoupled AdamW decay (not applied to norm scales)
    b1: float = 0.9                 # Adam first-moment decay
    b2: float = 0.999               # Adam second-moment decay
    eps: float = 1e-8               # Adam denominator epsilon
    max_grad_norm: float = 1.0      # global-norm clip of the accumulated gradient
    clip_eps: float = 0.2           # PPO epsilon of Eq. 23
    beta: float = 0.01              # KL coefficient beta of Eq. 23
    kl_estimator: str = "k3"        # a key of grpo.KL_ESTIMATORS (k1 | k2 | k3) (METHOD 11: k3)
    aggregation: str = "seq_mean_token_mean"  # grpo.AGGREGATIONS; paper: per-response mean
    micro_batch_size: int = 8       # rows per forward/backward; R % micro_batch_size == 0
    temperature: float = 1.0        # sampler temperature; log-probs use it; 0 (greedy) -> 1
    logits_chunk: int = 128         # tokens per logits chunk (bounds the [R, chunk, V] buffer)
    mu_dtype: str = "float32"       # storage of Adam's first moment: float32 | bfloat16
    # Recompute each layer in the backward pass instead of keeping its activations. A config
    # node may say "auto" (its default, configs/base.py): the run sets True only where the
    # update's saved activations would not fit the device (`rounds.remat.decide`).
    remat: bool = True
    # Each group's shared prefix (a prompt, a generator input) forward and backward once,
    # its R rows beside it (`train_step.GroupBatch`); False: every row runs its prefix again.
    shared_prefix: bool = True
    # Rows of a group one packed row holds at most (0 = all R; `batches.rows_per_pass`):
    # below R, a group runs as several packed rows, each with its prefix (for memory).
    group_rows: int = 0

    def __post_init__(self):
        check_trainer(dataclasses.asdict(self), "TrainConfig")

    @property
    def scoring_temperature(self) -> float:
        """Temperature of the log-probs: the sampler's, or 1.0 for greedy (METHOD 11)."""
        return temperature_for_scoring(self.temperature)


def learning_rate_schedule(cfg: TrainConfig) -> optax.Schedule:
    """lr(count) = learning_rate * min(1, (count + 1) / warmup_steps), count = updates done.

    The first update already moves (lr / warmup_steps); constant after warm-up. `count` is
    the optimizer state's own counter, so a restored state resumes the schedule (case-21).
    """
    peak, warmup = float(cfg.learning_rate), int(cfg.warmup_steps)

    def schedule(count):
        if warmup == 0:
            return jnp.full((), peak, jnp.float32)
        frac = (jnp.asarray(count, jnp.float32) + 1.0) / warmup
        return peak * jnp.minimum(1.0, frac)

    return schedule


def _decay_mask(params):
    """True for matrices, False for norm scales (`*norm` keys)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not (parallel.leaf_name(path) or "").endswith("norm"), params)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) then AdamW with `learning_rate_schedule(cfg)`.

    `cfg.mu_dtype="bfloat16"` stores Adam's first moment in bfloat16 (optax `mu_dtype`; the
    update is still computed in float32): half the memory of that moment. The second
    moment stays in the params' dtype. The schedule reads the `ScaleByScheduleState.count`
    inside the optimizer state (not a separate counter), so restoring `opt_state` restores
    the warm-up position.
    """
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                    weight_decay=cfg.weight_decay, mask=_decay_mask,
                    mu_dtype=jnp.dtype(cfg.mu_dtype)))


def schedule_count(opt_state) -> Optional[jax.Array]:
    """The schedule's own update counter inside `opt_state` (None if there is none)."""
    for leaf in jax.tree.leaves(opt_state,
                                is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState)):
        if isinstance(leaf, optax.ScaleByScheduleState):
            return leaf.count
    return None

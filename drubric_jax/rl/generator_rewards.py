"""The generator's rewards, one registry (METHOD 3, 6, 11: Eq. 13, 15, 17, 24-25).

A generator reward scores each of the G rubric lists sampled for an input (x, C) from the
verifier's verdicts on them: a pure function `RewardInputs -> float32[B, G]`. The
generator's advantage is the weighted sum of the rewards' group-normalised advantages
(Eq. 24-25 generalised, `advantages.generator_advantages_by_id`):

    A_g = sum_n w_n z(R^n)_g,    z: Eq. 21 within the G lists of one input

`GENERATOR_REWARDS` holds them, in the order their terms are added and their metrics
(`r_<name>`, `r_<name>_std`) are logged:

    disc    R_disc, Eq. 13 on the response set C             weight config.generator.disc_weight
    anchor  R_anchor, Eq. 15 on the anchor list, the METHOD   weight config.generator.lam
            11 floor for an invalid list                      (lambda of Eq. 17)

`variant_weights` gives each reward's weight under the run's variant (METHOD 6): `full`
keeps the config's weights (the paper: 1 and lambda = 1; `rounds.settings` reads them); the objective ablations keep one
reward at weight 1 and set every other to 0 (`ABLATION_KEEPS`). A new reward is one
function, one row here and its weight field in configs/base.py (docs/CONVENTIONS.md).

Axis legend (docs/CONVENTIONS.md): B inputs (x, C), G rubric lists per input, K responses
of C, A anchor responses, M items.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from drubric_jax.rl import rewards


@dataclasses.dataclass(frozen=True)
class RewardInputs:
    """What a generator reward reads: the G lists of each of B inputs and their verdicts.

    Attributes:
        verdicts: float32[B, G, K, M], v_m(y) of each list's items on the K responses of C
            (0 at padded items and responses).
        anchor_verdicts: float32[B, G, A, M], the same on the input's anchor list (0 at
            padded slots).
        weights: int32[B, G, M] item weights; item_mask: bool[B, G, M] real items.
        list_valid: bool[B, G], the list parsed (METHOD 11).
        gold_ranks: int32[B, A] anchor gold ranks (smaller is better; any value at padding).
        anchor_mask: bool[B, A] real anchor responses (anchor lists are ragged).
    """

    verdicts: Any
    anchor_verdicts: Any
    weights: Any
    item_mask: Any
    list_valid: Any
    gold_ranks: Any
    anchor_mask: Any


@dataclasses.dataclass(frozen=True)
class GeneratorReward:
    """A registry row: the reward function and the `config.generator` field of its weight
    in the full objective.

    Attributes:
        fn: `RewardInputs -> float32[B, G]`, pure; finite for finite inputs.
        weight_field: name of the float field of `config.generator` holding w_n.
    """

    fn: Callable[[RewardInputs], Any]
    weight_field: str


def discriminability(inputs: RewardInputs):
    """R_disc (Eq. 13, soft verdicts: METHOD 12) of each list on C: float32[B, G]; 0 for an
    invalid list (no valid item)."""
    return rewards.discriminability_reward(inputs.verdicts, inputs.weights, inputs.item_mask)


def anchor_ranking(inputs: RewardInputs):
    """R_anchor (Eq. 15) of each list on its input's anchor list, scores by Eq. 12:
    float32[B, G]; the floor `rewards.anchor_reward_floor` for an invalid list (METHOD 11).
    Every list of input b is scored on the same anchor list (gold ranks and mask broadcast
    over G); padded anchor slots are masked out, whatever rank they hold."""
    scores, _ = rewards.rubric_scores(inputs.anchor_verdicts, inputs.weights,
                                      inputs.item_mask)                    # [B, G, A]
    shape = scores.shape
    gold = jnp.broadcast_to(np.asarray(inputs.gold_ranks)[:, None], shape)
    mask = jnp.broadcast_to(np.asarray(inputs.anchor_mask)[:, None], shape)
    return rewards.anchor_reward_or_floor(scores, gold, mask, inputs.list_valid)


GENERATOR_REWARDS: dict = {
    "disc": GeneratorReward(discriminability, "disc_weight"),
    "anchor": GeneratorReward(anchor_ranking, "lam"),
}
"""{name: GeneratorReward}; the generator trains on every row, weighted (module docstring)."""

ABLATION_KEEPS = {"disc_only": "disc", "anchor_only": "anchor"}
"""The METHOD 6 objective ablations: variant -> the one reward it keeps (weight 1)."""


TRAINED_VARIANTS = ("full",) + tuple(ABLATION_KEEPS)
"""The variants whose generator trains on these rewards (METHOD 6; "static" does not)."""


def variant_weights(weights, variant: str) -> dict:
    """{name: w_n} of every registered reward under `variant` (METHOD 6).

    Args:
        weights: {name: w_n} of the full objective, one per registry row (the run reads
            them from each row's `weight_field` of config.generator, once:
            `rounds.settings`).
        variant: "full" keeps `weights`; an `ABLATION_KEEPS` variant weights its reward 1
            and every other 0.

    Raises:
        ValueError: a variant that trains no generator ("static") or an unknown one; a
            registry reward without a weight.
    """
    if variant in ABLATION_KEEPS:
        return {name: float(name == ABLATION_KEEPS[variant]) for name in GENERATOR_REWARDS}
    if variant != "full":
        raise ValueError(f"variant {variant!r} trains no generator (full, "
                         f"{', '.join(ABLATION_KEEPS)} do)")
    missing = [n for n in GENERATOR_REWARDS if n not in weights]
    if missing:
        raise ValueError(f"no weight for the generator reward(s) {missing}")
    return {name: float(weights[name]) for name in GENERATOR_REWARDS}


def generator_rewards(inputs: RewardInputs) -> dict:
    """{name: float32[B, G] numpy} of every registered reward, in registry order."""
    return {name: np.asarray(row.fn(inputs)) for name, row in GENERATOR_REWARDS.items()}

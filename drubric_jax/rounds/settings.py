"""The run config read once, into the typed settings the layers below `rounds/` take.

`rl/` and `data/` never read a ConfigDict: each trainee's `TrainConfig`, the policy's rule
reward, the generator's reward weights and the data spec are read here, once per run (`read`, called where the run
is set up, after `config_check.validate`), and passed down as plain values.

    RunSettings         policy_train, generator_train (TrainConfig), policy_reward (its
                        name), rule (the rule reward, None for the rubric reward),
                        generator_weights ({reward name: w_n} under config.variant, None
                        when no generator trains on rewards: variant "static"), data (the
                        `data.DataSpec`)
    train_config(...)   one trainee's TrainConfig from its config node (`config.<role>.train`)
    data_spec(config)   what the data layer reads (`data.load_data`, `check_data_sources`)
    read(config)        RunSettings of a run config

Errors name the config field ("config.policy.train.learning_rate ...").
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

from drubric_jax.config_check import uses_anchors
from drubric_jax.data.loading import DataSpec
from drubric_jax.rl import generator_rewards, rule_rewards
from drubric_jax.rl.train_config import TrainConfig, check_trainer
from drubric_jax.rounds import remat

# The policy rewards that read each prompt row's true checks (`checks.TRUE_CHECK_REWARDS`;
# named here so that reading a config does not import the checkers).
TRUE_CHECK_REWARDS = ("checks_gold", "checks_oracle")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What the run's layers below rounds/ are given (module docstring)."""

    policy_train: TrainConfig
    generator_train: TrainConfig
    policy_reward: str
    rule: Optional[rule_rewards.Rule]
    generator_weights: Optional[Mapping[str, float]]
    data: DataSpec


def train_config(node, field: str, *, rows: int, temperature: float,
                 config=None) -> TrainConfig:
    """The TrainConfig of config node `node` (at dotted path `field`, e.g. "policy.train").

    Args:
        node: a config node with the fields of `configs/base.py: trainer_config`.
        field: its dotted path, used in error messages.
        rows: R, rows (responses or rubric lists) of one step; micro_batch_size 0 means all
            of them.
        temperature: the sampler's temperature for this trainee.
        config: the run config `node` belongs to: remat "auto" is decided from it
            (`rounds.remat.decide`).

    Raises:
        types.ConfigError: a bad field, named "config.<field>.<name>".
    """
    values = {f.name: node[f.name] for f in dataclasses.fields(TrainConfig) if f.name in node}
    check_trainer(values, f"config.{field}", rows=rows)
    values["micro_batch_size"] = values.get("micro_batch_size") or rows
    values["remat"] = remat.decide(config, field.split(".")[0], values.get("remat", True))
    return TrainConfig(**values, temperature=float(temperature))


def generator_reward_weights(config) -> Optional[dict]:
    """{reward name: w_n} of `config.variant` (`generator_rewards.variant_weights` of the
    weights each registry row's `weight_field` names in config.generator); None for a
    variant that trains no generator on rewards ("static")."""
    if config.variant not in generator_rewards.TRAINED_VARIANTS:
        return None
    weights = {name: float(config.generator[row.weight_field])
               for name, row in generator_rewards.GENERATOR_REWARDS.items()}
    return generator_rewards.variant_weights(weights, config.variant)


def data_spec(config) -> DataSpec:
    """The `data.DataSpec` of a run config (configs/base.py layout): config.data's fields,
    the seed, both batch sizes, whether the run reads anchor lists, the reward that reads
    true checks, the checks world's build commands, whether each file must be its stage's
    split."""
    d = config.data
    reward = str(config.policy.reward)
    return DataSpec(
        name=d.name, anchor_paths=tuple(d.anchor_paths), prompt_paths=tuple(d.prompt_paths),
        shared_dir=d.get("shared_dir", "") or "", tfds_data_dir=d.get("tfds_data_dir", "") or "",
        min_responses=int(d.min_responses), max_responses=int(d.max_responses),
        min_prompt_chars=int(d.min_prompt_chars),
        min_top_response_chars=int(d.min_top_response_chars),
        max_anchor_rows=int(d.max_anchor_rows), max_prompt_rows=int(d.max_prompt_rows),
        heldout_anchor_rows=int(d.heldout_anchor_rows),
        heldout_anchor_paths=tuple(d.get("heldout_anchor_paths", ()) or ()),
        seed=int(config.seed),
        anchors_per_step=int(config.generator.anchors_per_step),
        prompts_per_step=int(config.policy.prompts_per_step),
        reads_anchors=uses_anchors(config),
        true_checks_reward=reward if reward in TRUE_CHECK_REWARDS else "",
        checks_build=d.get("checks_build", "") or "",
        require_splits=bool(d.get("require_splits", False)))


def read(config) -> RunSettings:
    """RunSettings of a run config (configs/base.py layout).

    Raises:
        types.ConfigError / ValueError: a bad trainer field or reward name (named).
    """
    p, g = config.policy, config.generator
    rule = (None if p.reward == rule_rewards.RUBRIC else rule_rewards.make_rule(
        p.reward, rule_rewards.RuleOptions(max_words=int(p.reward_max_words))))
    # R of a step: B*K responses (policy), B*G rubric lists (generator). Log-probs are scored
    # at each trainee's own sampling temperature (METHOD 11).
    return RunSettings(
        policy_train=train_config(p.train, "policy.train",
                                  rows=p.prompts_per_step * p.num_responses,
                                  temperature=p.temperature, config=config),
        generator_train=train_config(g.train, "generator.train",
                                     rows=g.anchors_per_step * g.num_lists,
                                     temperature=g.temperature, config=config),
        policy_reward=str(p.reward), rule=rule,
        generator_weights=generator_reward_weights(config), data=data_spec(config))

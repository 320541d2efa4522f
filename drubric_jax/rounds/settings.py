"""The run config read once, into the typed settings every stage takes.

No stage reads the ConfigDict: `read(config)` (called where the run is set up, after
`config_check.validate`) builds a `RunSettings` of frozen per-role settings
(`rounds.settings_types`: model, lora, policy, generator, verifier, data, world, rounds,
roles, mesh, memory, compile, checkpoint, log), and the stages read those.

Every field the reader reads is required: a field's default lives in one place,
`configs/base.py: base_config`, and a config without it is refused, naming the field.

    read(config)        RunSettings of a run config
    flatten(settings)   {"dotted.field": JSON value}: what `settings.json` holds
    SETTINGS_FILE       "settings.json", written in every run's workdir at its start
                        (`rounds.run_state.setup`), so a report can diff arms
    train_config(...)   one trainee's TrainConfig from its config node (`config.<role>.train`)
    data_spec(config)   what the data layer reads (`data.load_data`, `check_data_sources`)

Errors name the config field ("config.policy.train.learning_rate ...").
"""
from __future__ import annotations

import dataclasses
import numbers
import typing
from typing import Any, Mapping, Optional

from drubric_jax.config_check import uses_anchors
from drubric_jax.data.loading import DataSpec
from drubric_jax.rl import generator_rewards, rule_rewards
from drubric_jax.rl.train_config import TrainConfig, check_trainer
from drubric_jax.rounds import model_sources, remat
from drubric_jax.rounds.settings_types import (CheckpointSettings, CompileSettings,
                                               GeneratorSettings, LogSettings, LoraSettings,
                                               MemorySettings, MeshSettings, ModelSettings,
                                               PolicySettings, RoleUse, RoundsSettings,
                                               RunSettings, VerifierSettings, WorldSettings)
from drubric_jax.types import ConfigError, Role

__all__ = ["RunSettings", "SETTINGS_FILE", "TRUE_CHECK_REWARDS", "data_spec", "flatten",
           "read", "train_config"]

# The policy rewards that read each prompt row's true checks (`checks.TRUE_CHECK_REWARDS`;
# named here so that reading a config does not import the checkers).
TRUE_CHECK_REWARDS = ("checks_gold", "checks_oracle")
SETTINGS_FILE = "settings.json"


def value(config, field: str) -> Any:
    """config.<field> (dotted), required.

    Raises:
        ConfigError: "config.<field>: missing ..." when the config has no such field.
    """
    node = config
    for part in field.split("."):
        try:
            node = node[part]
        except (KeyError, TypeError, AttributeError):
            raise ConfigError(
                f"config.{field}: missing (configs/base.py base_config sets every field "
                "a run reads; build the config from it)") from None
    return node


def _typed(raw, hint, field: str):
    """`raw` as the settings type `hint` (bool, int, float, str, tuple[str, ...])."""
    def need(ok, what):
        if not ok:
            raise ConfigError(f"config.{field}: must be {what}, got {raw!r}")

    if hint is bool:
        need(isinstance(raw, bool), "True or False")
        return raw
    if hint is int:
        need(isinstance(raw, numbers.Integral) and not isinstance(raw, bool), "an integer")
        return int(raw)
    if hint is float:
        need(isinstance(raw, numbers.Real) and not isinstance(raw, bool), "a number")
        return float(raw)
    if hint is str:
        need(isinstance(raw, str), "a string")
        return raw
    if typing.get_origin(hint) is tuple:
        need(isinstance(raw, (tuple, list)) and all(isinstance(x, str) for x in raw),
             "a tuple of strings")
        return tuple(raw)
    raise TypeError(f"settings field read from config.{field}: no reader for type {hint}")


def _node(cls, config, **computed):
    """An instance of settings dataclass `cls`: each field with a "config" metadata entry
    read from that field (required, converted to the field's type), the derived fields
    from `computed`."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if "config" in f.metadata:
            values[f.name] = _typed(value(config, f.metadata["config"]), hints[f.name],
                                    f.metadata["config"])
    return cls(**values, **computed)


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


def generator_reward_weights(config) -> dict:
    """{reward name: w} of every registry row of `rl.generator_rewards`, each read from its
    `config.generator.<weight_field>` (required)."""
    return {name: _typed(value(config, f"generator.{row.weight_field}"), float,
                         f"generator.{row.weight_field}")
            for name, row in generator_rewards.GENERATOR_REWARDS.items()}


def variant_weights(weights: Mapping[str, float], variant: str) -> Optional[dict]:
    """{reward name: w_n} of `variant` (`generator_rewards.variant_weights`); None for a
    variant that trains no generator on rewards ("static")."""
    if variant not in generator_rewards.TRAINED_VARIANTS:
        return None
    return generator_rewards.variant_weights(dict(weights), variant)


def data_spec(config) -> DataSpec:
    """The `data.DataSpec` of a run config (configs/base.py layout): config.data's fields,
    the seed, both batch sizes, whether the run reads anchor lists, the reward that reads
    true checks, the checks world's build commands, whether each file must be its stage's
    split."""
    def d(name):
        return value(config, f"data.{name}")

    reward = str(value(config, "policy.reward"))
    return DataSpec(
        name=d("name"), anchor_paths=tuple(d("anchor_paths")),
        prompt_paths=tuple(d("prompt_paths")), shared_dir=d("shared_dir"),
        tfds_data_dir=d("tfds_data_dir"),
        min_responses=int(d("min_responses")), max_responses=int(d("max_responses")),
        min_prompt_chars=int(d("min_prompt_chars")),
        min_top_response_chars=int(d("min_top_response_chars")),
        max_anchor_rows=int(d("max_anchor_rows")), max_prompt_rows=int(d("max_prompt_rows")),
        heldout_anchor_rows=int(d("heldout_anchor_rows")),
        heldout_anchor_paths=tuple(d("heldout_anchor_paths")),
        seed=int(value(config, "seed")),
        anchors_per_step=int(value(config, "generator.anchors_per_step")),
        prompts_per_step=int(value(config, "policy.prompts_per_step")),
        reads_anchors=uses_anchors(config),
        true_checks_reward=reward if reward in TRUE_CHECK_REWARDS else "",
        checks_build=d("checks_build"), require_splits=bool(d("require_splits")))


def read(config) -> RunSettings:
    """RunSettings of a run config (configs/base.py layout): the last read of the
    ConfigDict a run makes.

    Raises:
        types.ConfigError: a missing field or one of the wrong type (named); a bad trainer
            field. ValueError: an unknown rule reward (`rule_rewards.make_rule`).
    """
    model = _node(ModelSettings, config)
    rounds = _node(RoundsSettings, config)
    variant = _typed(value(config, "variant"), str, "variant")
    p_raw = {k: value(config, f"policy.{k}") for k in
             ("reward", "reward_max_words", "prompts_per_step", "num_responses", "temperature")}
    rule = (None if p_raw["reward"] == rule_rewards.RUBRIC else rule_rewards.make_rule(
        p_raw["reward"], rule_rewards.RuleOptions(max_words=int(p_raw["reward_max_words"]))))
    # R of a step: B*K responses (policy), B*G rubric lists (generator). Log-probs are scored
    # at each trainee's own sampling temperature (METHOD 11).
    policy = _node(PolicySettings, config, rule=rule, train=train_config(
        value(config, "policy.train"), "policy.train",
        rows=p_raw["prompts_per_step"] * p_raw["num_responses"],
        temperature=p_raw["temperature"], config=config))
    g_rows = value(config, "generator.anchors_per_step") * value(config, "generator.num_lists")
    weights = generator_reward_weights(config)
    generator = _node(GeneratorSettings, config, reward_weights=weights,
                      weights=variant_weights(weights, variant),
                      train=train_config(value(config, "generator.train"), "generator.train",
                                         rows=g_rows,
                                         temperature=value(config, "generator.temperature"),
                                         config=config))
    verifier = _node(VerifierSettings, config)
    return _node(
        RunSettings, config, model=model, lora=_node(LoraSettings, config), policy=policy,
        generator=generator, verifier=verifier, data=data_spec(config),
        world=_node(WorldSettings, config), rounds=rounds,
        roles=RoleUse(policy_trains=model_sources.trains(config, Role.POLICY),
                      generator_trains=model_sources.trains(config, Role.GENERATOR),
                      generator_loaded=model_sources.generator_used(config),
                      verifier_loaded=model_sources.verifier_model_used(config)),
        mesh=_node(MeshSettings, config), memory=_node(MemorySettings, config),
        compile=_node(CompileSettings, config), checkpoint=_node(CheckpointSettings, config),
        log=_node(LogSettings, config))


def _json(v):
    """A settings value as JSON: tuples as lists, mappings by key, numbers and strings as
    they are."""
    if isinstance(v, Mapping):
        return {str(k): _json(x) for k, x in sorted(v.items())}
    if isinstance(v, (tuple, list)):
        return [_json(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"settings value {v!r} ({type(v).__name__}) has no JSON form")


def flatten(settings) -> dict:
    """{"dotted.field": JSON value} of a settings dataclass, nested dataclasses joined by
    dots ("policy.rubric_temperature", "policy.train.learning_rate", "data.prompt_paths"),
    a mapping's entries likewise ("generator.weights.disc"; None when the mapping is None);
    fields marked flat=False (the rule reward, a function of policy.reward and
    policy.reward_max_words) are left out. Sorted by key."""
    out: dict = {}

    def walk(prefix: str, obj) -> None:
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                if f.metadata.get("flat", True):
                    walk(f"{prefix}{f.name}.", getattr(obj, f.name))
        elif isinstance(obj, Mapping) and obj:
            for k in sorted(obj):
                walk(f"{prefix}{k}.", obj[k])
        else:
            out[prefix[:-1]] = _json(obj)

    walk("", settings)
    return dict(sorted(out.items()))

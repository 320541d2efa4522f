"""Which models a run loads, and which roles train (the sources half of `rounds.roles`,
which re-exports these names).

    LoadedModel           one model source's config, params and tokenizer
    trains                whether the policy / generator takes an optimizer step in the run
    generator_used        whether anything reads the generator (else it is not loaded)
    verifier_model_used   whether a verifier model is loaded (not in the checks world)
    check_model_sources   every source exists, before any load (errors name the fields)
    load_models           each distinct source of a config loaded once, onto the mesh
    load_sources          the same from the run's settings (`rounds.roles.build_roles`)

Axis legend: none (host-side bookkeeping).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections

from drubric_jax import models
from drubric_jax.models import check_source, load_model
from drubric_jax.models.config import ModelConfig
from drubric_jax.rl import rule_rewards
from drubric_jax.types import Role


@dataclasses.dataclass
class LoadedModel:
    """One model source: its config, params (shared by the frozen roles that name it) and
    tokenizer."""

    source: str
    cfg: ModelConfig
    params: dict
    tokenizer: Any


def verifier_model_used(config: ml_collections.ConfigDict) -> bool:
    """Whether the run loads a verifier model: not when items are checks
    (`verifier.kind = "checks"`, METHOD 13: the checkers judge them on the host)."""
    return config.verifier.kind != "checks"


def trains(config: ml_collections.ConfigDict, role: Role) -> bool:
    """Whether `role` takes an optimizer step in some round of the run (then it is a
    `Trainee`): the policy when rounds.policy_steps > 0; the generator when
    rounds.generator_steps > 0, rounds.generator_rounds != 0 and the variant is not static
    (whose generator never trains, METHOD 6)."""
    r = config.rounds
    if Role(role) is Role.POLICY:
        return r.policy_steps > 0
    return r.generator_steps > 0 and r.generator_rounds != 0 and config.variant != "static"


def generator_used(config: ml_collections.ConfigDict) -> bool:
    """Whether the run reads the generator's weights at all: it trains, or it writes the
    policy's rubrics (`policy.reward = "rubric"`), or the held-out evaluation runs
    (`rounds.heldout_eval`). A rule-reward policy run that does neither never loads it."""
    if "rounds" not in config or "policy" not in config:  # a config of model sources only
        return True
    return (trains(config, Role.GENERATOR) or config.policy.reward == rule_rewards.RUBRIC
            or bool(config.rounds.heldout_eval))


def _source_fields(config: ml_collections.ConfigDict) -> dict[str, list[str]]:
    """{model source: the config fields that name it} (config.model.verifier left out when
    no verifier model is used, config.model.generator when no generator is:
    `generator_used`)."""
    roles = (("policy",) + (("generator",) if generator_used(config) else ())
             + (("verifier",) if verifier_model_used(config) else ()))
    return source_fields({role: config.model[role] for role in roles})


def source_fields(role_sources: Mapping[str, str]) -> dict[str, list[str]]:
    """{model source: the config fields that name it} of {role: source} (the roles a run
    loads): roles that name the same source share one entry, so one load."""
    fields: dict[str, list[str]] = {}
    for role, source in role_sources.items():
        fields.setdefault(source, []).append(f"config.model.{role}")
    return fields


def _named(e: Exception, names: list[str]) -> Exception:
    """`e` with the config fields at the start of its message, of the same type."""
    try:
        # The same exception type, so callers' except clauses still match.
        return type(e)(f"{', '.join(names)}: {e}")
    except Exception:  # a constructor that wants other arguments
        e.add_note(f"while loading {', '.join(names)}")
        return e


def check_model_sources(config: ml_collections.ConfigDict) -> None:
    """Every model source of `config` exists (or is a preset / hub id), checked before any
    data is read or weight loaded; errors name the config field (`models.check_source`)."""
    for source, names in _source_fields(config).items():
        try:
            check_source(source)
        except FileNotFoundError as e:
            raise _named(e, names) from e


def load_models(config: ml_collections.ConfigDict, mesh=None) -> dict[str, LoadedModel]:
    """{source: LoadedModel} for the distinct sources of policy, generator and verifier,
    each loaded once, tensor by tensor straight onto `mesh` (`models.leaf_sharder`) when
    given.

    Raises:
        whatever `models.load_model` raises, of the same type, its message prefixed with the
        config fields that hold the source ("config.model.policy: ..."); an exception type
        that cannot be rebuilt from one message is re-raised as is, with the fields as a note.
    """
    return load_sources(_source_fields(config), config.model.dtype, config.seed, mesh)


def load_sources(fields: Mapping[str, list[str]], dtype: str, seed: int,
                 mesh=None) -> dict[str, LoadedModel]:
    """{source: LoadedModel} of `fields` ({source: the config fields naming it},
    `source_fields`), each loaded once in `dtype` (random-weight presets drawn from
    `seed`), tensor by tensor straight onto `mesh` when given.

    Raises:
        as `load_models`.
    """
    loaded = {}
    # Each tensor is placed onto its shards as it is read (`models.weights`).
    sharder = None if mesh is None else models.leaf_sharder(mesh)
    for source, names in fields.items():
        try:
            cfg, params, tok = load_model(source, dtype, shardings=sharder, seed=seed)
        except Exception as e:
            named = _named(e, names)
            # `_named` could not rebuild the type: the original goes up, with the fields as a note.
            if named is e:
                raise
            raise named from e
        loaded[source] = LoadedModel(source, cfg, params, tok)
    return loaded

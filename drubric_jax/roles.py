"""Model roles: which weights each role of Algorithm 1 uses, and where they live.

Five roles use decoder weights (METHOD section 5):
    policy          trainable (`Trainee`): params + AdamW moments, a compiled GRPO step
    policy_ref      frozen reference of the policy's KL term (Eq. 23)
    generator       trainable (`Trainee`)
    generator_ref   frozen reference of the generator's KL term
    verifier        frozen judge, never updated
Every model source is loaded once (`load_models`); frozen roles that name the same source
share that one copy of the arrays. A trainee starts from a copy of its source's params
(its buffers are donated to the train step) and keeps the source as its reference.

`Roles.params(role)` is the one place that resolves a role to the arrays a sampler or the
verifier should use now (the weight-sync point: nothing else hands params around). A
trainee is built so it can later hold "a frozen base + an adapter" (the scale-out issue):
only `Trainee.params` and `Trainee.reference_params` read its weights.

Parking (`config.memory.park_idle_optimizer`, CPU runs): the AdamW moments of the trainee
that is idle in a phase wait on disk as read-only memmaps (`hostmem.park`) and come back
bit for bit onto their shardings at its next phase.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from drubric_jax import hostmem
from drubric_jax import train_step as ts
from drubric_jax.models import load_model
from drubric_jax.models.config import ModelConfig
from drubric_jax.train_config import TrainConfig
from drubric_jax.types import Role


@dataclasses.dataclass
class LoadedModel:
    """One model source: its config, params (shared by the frozen roles that name it) and
    tokenizer."""

    source: str
    cfg: ModelConfig
    params: dict
    tokenizer: Any


def load_models(config: ml_collections.ConfigDict) -> dict[str, LoadedModel]:
    """{source: LoadedModel} for the distinct sources of policy, generator and verifier.

    Raises:
        whatever `models.load_model` raises, of the same type, its message prefixed with the
        config fields that hold the source ("config.model.policy: ..."); an exception type
        that cannot be rebuilt from one message is re-raised as is, with the fields as a note.
    """
    fields: dict[str, list[str]] = {}  # source -> the config fields naming it
    for role in ("policy", "generator", "verifier"):
        fields.setdefault(config.model[role], []).append(f"config.model.{role}")
    models = {}
    for source, names in fields.items():
        try:
            cfg, params, tok = load_model(source, config.model.dtype, seed=config.seed)
        except Exception as e:
            try:
                named = type(e)(f"{', '.join(names)}: {e}")
            except Exception:  # a constructor that wants other arguments
                named = None
            if named is None:
                e.add_note(f"while loading {', '.join(names)}")
                raise
            raise named from e
        models[source] = LoadedModel(source, cfg, params, tok)
    return models


@dataclasses.dataclass
class Trainee:
    """A trainable role: its TrainState, how it is trained, and its frozen reference.

    Attributes:
        role: Role.POLICY or Role.GENERATOR.
        model: the source it started from; `model.params` is its reference pi_ref (Eq. 23).
        train_config: its GRPO hyperparameters.
        optimizer, step_fn: from `train_step.make_sharded_train_step` (step donates state).
        state: TrainState, sharded on the mesh. Its opt_state leaves are `np.memmap`s while
            parked.
        parked: shardings of the parked opt_state (None when resident).
    """

    role: Role
    model: LoadedModel
    train_config: TrainConfig
    optimizer: optax.GradientTransformation
    step_fn: Any
    state: ts.TrainState
    parked: Optional[Any] = None

    @property
    def params(self) -> dict:
        return self.state.params

    @property
    def reference_params(self) -> dict:
        return self.model.params

    def resident_state(self) -> ts.TrainState:
        """The state with parked moments read back (a transient copy when parked)."""
        if self.parked is None:
            return self.state
        return self.state.replace(opt_state=hostmem.unpark(self.state.opt_state, self.parked))


def make_trainee(role: Role, model: LoadedModel, train_config: TrainConfig, mesh) -> Trainee:
    """A fresh trainee: a sharded copy of `model.params` with new AdamW moments."""
    optimizer, step_fn = ts.make_sharded_train_step(model.cfg, train_config, mesh)
    params = jax.tree.map(jnp.copy, model.params)  # ours: the step donates its buffers
    state = ts.shard_train_state(ts.init_train_state(params, optimizer), mesh)
    return Trainee(role, model, train_config, optimizer, step_fn, state)


@dataclasses.dataclass
class Roles:
    """The five roles of a run (see the module docstring)."""

    policy: Trainee
    generator: Trainee
    verifier: LoadedModel

    def trainee(self, role: Role) -> Trainee:
        return self.policy if role is Role.POLICY else self.generator

    def params(self, role: str) -> dict:
        """Current arrays of a role: "policy", "generator", "verifier", "policy_ref",
        "generator_ref" (the one weight-sync point)."""
        if role in (Role.POLICY, Role.GENERATOR):
            return self.trainee(Role(role)).params
        if role == "verifier":
            return self.verifier.params
        return self.trainee(Role(role.removesuffix("_ref"))).reference_params

    def park_idle(self, active: Role, park_dir: str) -> None:
        """Phase start: `active`'s moments come back, the other trainee's go to
        `park_dir/<role>/`. Values round-trip bit for bit."""
        for trainee, park in ((self.trainee(active), False), (self.trainee(active.other), True)):
            directory = os.path.join(park_dir, trainee.role.value)
            state = trainee.state
            if park and trainee.parked is None:
                trainee.parked = jax.tree.map(lambda x: x.sharding, state.opt_state)
                trainee.state = state.replace(opt_state=hostmem.park(state.opt_state, directory))
            elif not park and trainee.parked is not None:
                trainee.state = state.replace(opt_state=hostmem.unpark(
                    state.opt_state, trainee.parked, directory))
                trainee.parked = None
        hostmem.release_free_memory()


def build_roles(config: ml_collections.ConfigDict, mesh) -> Roles:
    """Loads every model source once and builds the roles of `config` on `mesh`.

    Raises:
        config_check.ConfigError: a bad trainer field (named).
    """
    models = load_models(config)
    p, g = config.policy, config.generator
    policy_tc = TrainConfig.from_config(p.train, "policy.train",
                                        rows=p.prompts_per_step * p.num_responses,
                                        temperature=p.temperature)
    generator_tc = TrainConfig.from_config(g.train, "generator.train",
                                           rows=g.anchors_per_step * g.num_lists,
                                           temperature=g.temperature)
    return Roles(
        policy=make_trainee(Role.POLICY, models[config.model.policy], policy_tc, mesh),
        generator=make_trainee(Role.GENERATOR, models[config.model.generator], generator_tc,
                               mesh),
        verifier=models[config.model.verifier])


def role_memory(roles: Roles) -> dict:
    """Bytes held by each role, a buffer shared by several roles counted once (under the
    first role that names it). Trainees include their AdamW moments; moments parked on disk
    count under "parked_on_disk", not the role."""
    seen: set = set()
    out = {"parked_on_disk": 0}

    def size(name, tree):
        total = 0
        for leaf in jax.tree.leaves(tree):
            if isinstance(leaf, np.memmap):
                out["parked_on_disk"] += leaf.nbytes
            elif hasattr(leaf, "nbytes") and id(leaf) not in seen:
                seen.add(id(leaf))
                total += leaf.nbytes
        out[name] = total

    size("verifier", roles.verifier.params)
    size("policy_ref", roles.policy.reference_params)
    size("generator_ref", roles.generator.reference_params)
    for trainee in (roles.policy, roles.generator):
        size(trainee.role.value, (trainee.state.params, trainee.state.opt_state))
    return out

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

Only a role that trains in the run is a `Trainee` (`trains`): one that never does (the
generator of the static variant, of `rounds.generator_steps = 0` or of
`rounds.generator_rounds = 0`; the policy of `rounds.policy_steps = 0`) is a `FrozenRole`,
its source's arrays with no TrainState and no AdamW moments, and the checkpoints hold the
trainees only. A generator that nothing reads (a rule-reward policy, no generator
training, no held-out evaluation: `generator_used`) is not loaded at all (`Roles.generator
is None`).

`Roles.params(role)` is the one place that resolves a role to the arrays a sampler or the
verifier should use now (the weight-sync point: nothing else hands params around). With
`config.lora.rank > 0` a trainee is "a frozen base + an adapter" (`models.lora`): it trains
only the adapters, its reference is the base with no adapter, and the base is the one copy
every frozen role of that source shares (the verifier too, when it is the same model).

Precision: frozen roles store `config.model.dtype` (bfloat16 at 8B); a trainee keeps its
trained params in `config.model.master_dtype` (float32: at the paper's learning rates a
bfloat16 update would round most entries away) and computes in `config.model.dtype`.
Every array is created on the mesh: the base loads straight onto its shardings and the
AdamW moments are made by a jitted init with out_shardings, never on one device first.

Parking (`config.memory.park_idle_optimizer`, CPU runs): the AdamW moments of the trainee
that is idle in a phase wait on disk as read-only memmaps (`hostmem.park`) and come back
bit for bit onto their shardings at its next phase. Offloading
(`config.memory.offload_idle_optimizer`, accelerators): they wait in pinned host memory
instead (the same shardings with memory kind "pinned_host"), and come back the same way.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from drubric_jax import models, parallel
from drubric_jax.rounds import hostmem
from drubric_jax.rl import train_step as ts
from drubric_jax.models import lora
from drubric_jax.models.config import ModelConfig
from drubric_jax.models.rollout import rollout_copy
from drubric_jax.rl.train_config import TrainConfig
from drubric_jax.rounds.settings_types import LoraSettings, RunSettings
from drubric_jax.types import Role


# The sources half (which models load, which roles train) lives in `model_sources`;
# re-exported here, where the memory planner, the experiments and the tests import it.
from drubric_jax.rounds.model_sources import (LoadedModel, check_model_sources,  # noqa: E402,F401
                                              generator_used, load_models, load_sources,
                                              source_fields, trains, verifier_model_used)

ROLE_KEYS = {Role.POLICY: 1, Role.GENERATOR: 2}  # fold_in of the seed for adapter inits


@dataclasses.dataclass
class Trainee:
    """A trainable role: its TrainState, how it is trained, and its frozen reference.

    Attributes:
        role: Role.POLICY or Role.GENERATOR.
        model: the source it started from; `model.params` is its reference pi_ref (Eq. 23)
            and, with LoRA, the frozen base its adapters sit on.
        cfg: its ModelConfig: the source's, with the master dtype and the LoRA settings.
        train_config: its GRPO hyperparameters.
        optimizer, step_fn: from `train_step.make_sharded_train_step` (step donates state).
        state: TrainState (full params, or the adapters), sharded on the mesh. Its
            opt_state leaves are `np.memmap`s while parked.
        parked: shardings of the parked opt_state (None when resident).
    """

    role: Role
    model: LoadedModel
    cfg: ModelConfig
    train_config: TrainConfig
    optimizer: optax.GradientTransformation
    step_fn: Any
    state: ts.TrainState
    parked: Optional[Any] = None

    @property
    def params(self) -> dict:
        """The params a forward pass of this trainee takes (base + adapters for LoRA)."""
        return self.forward_params(self.state.params)

    def forward_params(self, trained: dict) -> dict:
        """The params a forward pass takes for `trained`, the trained leaves of any state
        of this trainee (e.g. restored from another run's checkpoint): the adapters
        attached to the frozen base for LoRA (a dict merge: the base arrays are shared with
        the frozen roles, not copied), else `trained` itself."""
        if self.cfg.lora_rank:
            return lora.attach(self.model.params, trained)
        return trained

    def export_params(self) -> dict:
        """Full params to export: the adapters merged into the base for LoRA."""
        if self.cfg.lora_rank:
            return lora.merge(self.model.params, self.state.params, self.cfg)
        return self.state.params

    @property
    def reference_params(self) -> dict:
        # pi_ref is the unchanged source (for LoRA: the base with no adapter attached).
        return self.model.params

    def resident_state(self) -> ts.TrainState:
        """The state with parked moments read back (a transient copy when parked)."""
        if self.parked is None:
            return self.state
        # No directory: the parked files stay for the rest of the phase.
        return self.state.replace(opt_state=hostmem.unpark(self.state.opt_state, self.parked))


@dataclasses.dataclass
class FrozenRole:
    """A policy or generator that never trains in this run (`trains` is False): its source's
    arrays, shared with the frozen roles of that source; no TrainState, no optimizer state,
    not in the checkpoints, not exported.

    Attributes:
        role: Role.POLICY or Role.GENERATOR.
        model: the source; its params are what the role samples with (and its reference).
    """

    role: Role
    model: LoadedModel

    @property
    def cfg(self) -> ModelConfig:
        return self.model.cfg

    @property
    def params(self) -> dict:
        return self.model.params

    @property
    def reference_params(self) -> dict:
        return self.model.params


def trainee_config(model: LoadedModel, lora_settings: LoraSettings,
                   master_dtype: str) -> ModelConfig:
    """The trainee's ModelConfig: the source's, trained in `master_dtype`
    (config.model.master_dtype), with the adapters of `lora_settings` (config.lora.*)."""
    return model.cfg.replace(param_dtype=master_dtype, lora_rank=lora_settings.rank,
                             lora_alpha=lora_settings.alpha,
                             lora_targets=tuple(lora_settings.targets))


def make_trainee(role: Role, model: LoadedModel, cfg: ModelConfig, train_config: TrainConfig,
                 mesh, seed: int = 0) -> Trainee:
    """A fresh trainee on `mesh`: a copy of the base in the master dtype (full fine-tuning)
    or new adapters (LoRA), and AdamW moments made sharded by a jitted init."""
    optimizer, step_fn = ts.make_sharded_train_step(cfg, train_config, mesh)
    if cfg.lora_rank:
        # Policy and generator adapters start from different draws of the same seed.
        key = jax.random.fold_in(jax.random.PRNGKey(seed), ROLE_KEYS[role])
        # Shapes first, then a jit with out_shardings: the adapters are born sharded (STYLE 6).
        shapes = jax.eval_shape(lambda: ts.trainable_init(cfg, key, model.params))
        params = jax.jit(lambda k: ts.trainable_init(cfg, k, model.params),
                         out_shardings=models.param_shardings(shapes, mesh))(key)
    else:  # ours, not the base's buffers: the step donates them (eager copy keeps shardings)
        params = jax.tree.map(lambda x: jnp.copy(x).astype(cfg.weight_dtype), model.params)
        # Exactly the shardings the compiled step's in_shardings name.
        params = jax.device_put(params, models.param_shardings(params, mesh))
    # The moments mirror the params' tree, so the same leaf-name rules shard them.
    opt_shapes = jax.eval_shape(optimizer.init, params)
    opt_state = jax.jit(optimizer.init, out_shardings=models.param_shardings(
        opt_shapes, mesh))(params)
    # The step counter on the mesh too (replicated): Orbax refuses a host-local array on
    # several processes.
    step = jax.device_put(jnp.zeros((), jnp.int32), parallel.replicated(mesh))
    state = ts.TrainState(step=step, params=params, opt_state=opt_state)
    return Trainee(role, model, cfg, train_config, optimizer, step_fn, state)


@dataclasses.dataclass
class Roles:
    """The five roles of a run (see the module docstring). A role that never trains is a
    `FrozenRole`; the generator is None when nothing reads it (`generator_used`)."""

    policy: Trainee | FrozenRole
    generator: Optional[Trainee | FrozenRole]
    verifier: Optional[LoadedModel]  # None: no verifier model (`verifier_model_used`)

    def role(self, role: Role) -> Trainee | FrozenRole:
        """The policy or the generator, trained or frozen.

        Raises:
            ValueError: the generator is not loaded in this run (`generator_used`).
        """
        out = self.policy if Role(role) is Role.POLICY else self.generator
        if out is None:
            raise ValueError(f"the {Role(role).value} is not loaded in this run: nothing "
                             "reads it (config.policy.reward is a rule, config.rounds."
                             "generator_steps = 0, config.rounds.heldout_eval = False)")
        return out

    def trainee(self, role: Role) -> Trainee:
        """The Trainee of `role`.

        Raises:
            ValueError: `role` does not train in this run (frozen or not loaded).
        """
        out = self.policy if Role(role) is Role.POLICY else self.generator
        if not isinstance(out, Trainee):
            raise ValueError(f"the {Role(role).value} does not train in this run")
        return out

    def trainees(self) -> list[Trainee]:
        """The roles that train in this run, policy first (what the checkpoints hold)."""
        return [t for t in (self.policy, self.generator) if isinstance(t, Trainee)]

    def params(self, role: str) -> dict:
        """Current arrays of a role: "policy", "generator", "verifier", "policy_ref",
        "generator_ref" (the one weight-sync point)."""
        # Role is a str enum: "policy" and Role.POLICY both match here.
        if role in (Role.POLICY, Role.GENERATOR):
            return self.role(Role(role)).params
        if role == "verifier":
            return None if self.verifier is None else self.verifier.params
        return self.role(Role(role.removesuffix("_ref"))).reference_params

    def rollout_cfg(self, role: str) -> ModelConfig:
        """The ModelConfig a sampler runs `rollout_params(role)` with: the trainee's (with its
        LoRA rank and scale, so the adapters act in the rollout exactly as in the train
        step), or the frozen source's."""
        return self.role(Role(role)).cfg

    def rollout_params(self, role: str, mesh) -> dict:
        """A trainee's weights for its sampler: its current params in the decode layout and
        the compute dtype (`models.rollout.rollout_copy`: one resharding program per call,
        the weight sync between trainer and sampler; the params themselves where the
        layouts already agree, as on one device)."""
        trainee = self.role(Role(role))
        return rollout_copy(trainee.params, trainee.cfg, mesh)

    def offload_idle(self, active: Role) -> None:
        """Phase start: `active`'s moments come back onto the devices, the other trainee's go
        to pinned host memory (same shardings, memory kind "pinned_host"; bit for bit).

        Raises:
            ValueError: the backend has no pinned host memory (names the config field).
        """
        kinds = {m.kind for m in jax.local_devices()[0].addressable_memories()}
        if "pinned_host" not in kinds:
            raise ValueError("config.memory.offload_idle_optimizer: the "
                             f"{jax.default_backend()} backend has no pinned_host memory "
                             f"(it has {sorted(kinds)})")
        for trainee, idle in self._active_and_idle(active):
            kind = "pinned_host" if idle else "device"
            moments = trainee.state.opt_state
            # Only the memory kind changes; the partitioning over the devices stays as it was.
            target = jax.tree.map(lambda x: x.sharding.with_memory_kind(kind), moments)
            trainee.state = trainee.state.replace(opt_state=jax.device_put(moments, target))

    def _active_and_idle(self, active: Role) -> list[tuple[Trainee, bool]]:
        """[(trainee, idle)] of the run's trainees: `active`'s is not idle, the other's is.
        A frozen or absent role has no moments and is left out."""
        return [(t, t.role is not Role(active)) for t in self.trainees()]

    def park_idle(self, active: Role, park_dir: str) -> None:
        """Phase start: `active`'s moments come back, the other trainee's go to
        `park_dir/<role>/`. Values round-trip bit for bit."""
        for trainee, park in self._active_and_idle(active):
            directory = os.path.join(park_dir, trainee.role.value)
            state = trainee.state
            # Idempotent: a trainee already parked (or already resident) is left as it is.
            if park and trainee.parked is None:
                # `unpark` puts every leaf back onto the sharding recorded here.
                trainee.parked = jax.tree.map(lambda x: x.sharding, state.opt_state)
                trainee.state = state.replace(opt_state=hostmem.park(state.opt_state, directory))
            elif not park and trainee.parked is not None:
                trainee.state = state.replace(opt_state=hostmem.unpark(
                    state.opt_state, trainee.parked, directory))
                trainee.parked = None
        # On CPU the freed moments were host mallocs: hand their pages back to the kernel now.
        hostmem.release_free_memory()


def build_roles(run_settings: RunSettings, mesh) -> Roles:
    """Loads every model source once and builds the roles of `run_settings` on `mesh`: a
    role that trains (`run_settings.roles`) becomes a Trainee with its TrainConfig
    (`policy.train`, `generator.train`), one that never does a FrozenRole; the generator
    and the verifier model are loaded only where the run reads them.

    Raises:
        whatever `model_sources.load_sources` raises (naming the config.model fields).
    """
    s, use = run_settings, run_settings.roles
    loaded_roles = (("policy",) + (("generator",) if use.generator_loaded else ())
                    + (("verifier",) if use.verifier_loaded else ()))
    loaded = load_sources(source_fields({r: getattr(s.model, r) for r in loaded_roles}),
                          s.model.dtype, s.seed, mesh)

    def build(role: Role, source: str, trains_here: bool, train_config: TrainConfig):
        # A role that never trains gets no master copy and no AdamW moments (`trains`).
        model = loaded[source]
        if not trains_here:
            return FrozenRole(role, model)
        return make_trainee(role, model, trainee_config(model, s.lora, s.model.master_dtype),
                            train_config, mesh, s.seed)

    return Roles(
        policy=build(Role.POLICY, s.model.policy, use.policy_trains, s.policy.train),
        generator=(build(Role.GENERATOR, s.model.generator, use.generator_trains,
                         s.generator.train) if use.generator_loaded else None),
        verifier=loaded[s.model.verifier] if use.verifier_loaded else None)


def role_memory(roles: Roles) -> dict:
    """Bytes held by each role, a buffer shared by several roles counted once (under the
    first role that names it). Trainees include their AdamW moments (a frozen or absent
    policy / generator counts 0 under its name); moments parked on disk
    count under "parked_on_disk" and moments offloaded to pinned host memory under
    "offloaded_to_host", not the role."""
    seen: set = set()
    out = {"parked_on_disk": 0, "offloaded_to_host": 0}

    def size(name, tree):
        total = 0
        for leaf in jax.tree.leaves(tree):
            if isinstance(leaf, np.memmap):
                out["parked_on_disk"] += leaf.nbytes
            elif getattr(getattr(leaf, "sharding", None), "memory_kind", None) == "pinned_host":
                out["offloaded_to_host"] += leaf.nbytes
            # By id: a base that several roles share is one array object, counted once.
            elif hasattr(leaf, "nbytes") and id(leaf) not in seen:
                seen.add(id(leaf))
                total += leaf.nbytes
        out[name] = total

    # The order decides which role a shared base is charged to: the first that names it.
    size("verifier", roles.verifier.params if roles.verifier is not None else {})
    size("policy_ref", roles.policy.reference_params)
    size("generator_ref", {} if roles.generator is None else roles.generator.reference_params)
    # A frozen or absent role holds nothing of its own (its arrays are its reference's).
    out[Role.POLICY.value] = out[Role.GENERATOR.value] = 0
    for trainee in roles.trainees():
        size(trainee.role.value, (trainee.state.params, trainee.state.opt_state))
    return out

"""Memory planner: what one device holds in each step of a round, and whether it fits.

`plan(config, devices, device_memory_gb)` counts, per device, the resident state of each
phase (`terms.resident_terms`: the frozen base once per source, each trainee's
trained params and AdamW moments, the idle trainee's moments on the host when offloaded)
and the transient bytes at the peak of each device step of a round (METHOD section 5:
policy sampling, rubric sampling, verification, GRPO update; in the generator phase and in
the policy phase), then gives a verdict against the device memory less a headroom, naming
the largest term and the config field that shrinks it. With `search` it picks, for each
step with rows, the largest divisor of its rows that fits: rows per sampler call (the
rollout micro-batch) and rows per gradient pass (`train.micro_batch_size`, a multiple of
data x fsdp), so the step's global batch is reached in chunks.

An update runs in groups that share a prefix where the trainee's `train.shared_prefix` says
so (whole groups a gradient pass, `update_step`), and `train.remat="auto"` is decided here
(`remat_choice`): no recomputation where the update with every layer's activations saved
fits the memory; the run decides it the same way on its own devices (`resolve_remat`).

The rollout micro-batch it prints goes into `policy.rollout_micro_batch` /
`generator.rollout_micro_batch` (rows per sampler call; 0 = all); for a role whose
`sampler` is "engine" it is the engine's slots E, and the step's terms are the engine's
(`inference_terms.engine_sampling_terms`). Figures in GB
(1e9 bytes) per device. `experiments/plan.py` prints a plan, with the compiled figures of
`memory.compiled` beside it; a run's memory.json holds the measured figures to compare.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import ml_collections

from drubric_jax import config_check
from drubric_jax.memory.inference_terms import (engine_sampling_terms, sampling_terms,
                                                verification_terms)
# Re-exported: the planner's names, as callers have used them.
from drubric_jax.memory.remat import (RematChoice, remat_choice, resolve_remat,  # noqa: F401
                                      with_remat)
from drubric_jax.memory.terms import (ATTENTIONS, GB, RoleModels, Step,  # noqa: F401
                                      abstract_mesh, resident_terms, tree_bytes)
from drubric_jax.memory.workload import (BACKENDS, DEFAULT_BLOCK,  # noqa: F401
                                         DEFAULT_HEADROOM, PHASES, Workload, choose,
                                         divisors, update_step)
from drubric_jax.sampling.engine_host import slot_count


@dataclasses.dataclass
class Plan:
    """A plan: resident terms per phase, host terms, steps, capacity (bytes per device);
    `remat` the `RematChoice` of each trainee and `config` the config planned (its remat
    resolved to bools)."""

    devices: int
    mesh: dict
    capacity: Optional[int]
    headroom: float
    attention: str
    backend: str
    resident: dict
    host: dict
    steps: list
    remat: dict = dataclasses.field(default_factory=dict)
    config: Optional[ml_collections.ConfigDict] = None

    @property
    def usable(self) -> Optional[int]:
        return None if self.capacity is None else int(self.capacity * (1 - self.headroom))

    def peak(self, step: Step) -> int:
        """Bytes per device at the step's peak: its phase's resident state + transients."""
        return sum(t.bytes for t in self.resident[step.phase]) + step.transient

    @property
    def worst(self) -> Step:
        # The step with the highest peak decides the verdict.
        return max(self.steps, key=self.peak)

    @property
    def fits(self) -> Optional[bool]:
        return None if self.usable is None else self.peak(self.worst) <= self.usable

    def largest(self, step: Step):
        return max(self.resident[step.phase] + step.terms, key=lambda t: t.bytes)

    def verdict(self) -> str:
        """"FITS: ..." / "DOES-NOT-FIT: ..." naming the peak step, its largest term and the
        field that shrinks it."""
        worst, big = self.worst, self.largest(self.worst)
        where = (f"peak {self.peak(worst) / GB:.1f} GB per device in '{worst.phase} phase: "
                 f"{worst.name}'")
        term = f"largest term: {big.name} = {big.bytes / GB:.1f} GB (shrink: {big.field})"
        if self.usable is None:
            return f"NO-VERDICT (device memory unknown): {where}; {term}"
        room = (f"{self.usable / GB:.1f} GB usable ({self.capacity / GB:.1f} GB less "
                f"{self.headroom:.0%} headroom)")
        word = "FITS" if self.fits else "DOES-NOT-FIT"
        return f"{word}: {where} {'<=' if self.fits else '>'} {room}; {term}"

    def micro_batches(self) -> list:
        """"<phase>: <step> <rows> of <rows>" for each step with rows (a grouped update's
        in whole groups, of its rows padded to the row shards)."""
        return [f"{s.phase} phase, {s.name}: {s.rows} of {s.of_rows} rows"
                + (f" ({s.rows // s.group} group{'s' * (s.rows > s.group)} of {s.group})"
                   if s.group else "")
                for s in self.steps if s.of_rows]

    def table(self) -> str:
        """The plan as text: resident terms per phase, each step's terms and peak, the
        rollout and update micro-batches, the verdict."""
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
        cap = "unknown" if self.capacity is None else f"{self.capacity / GB:.1f} GB"
        # The ordered union of both phases' resident terms (one table row each).
        names = list(dict.fromkeys(t.name for p in PHASES for t in self.resident[p]))
        host = [(f"on the host in the {p} phase: {t.name}", t.bytes)
                for p in PHASES for t in self.host[p]]
        w = max(len(n) for n in names + [h for h, _ in host]
                + [t.name for s in self.steps for t in s.terms]) + 2

        def row(name, *values):
            return f"  {name:<{w}}" + "".join(f"{v / GB:>12.3f}" for v in values)

        out = [f"{self.devices} {self.backend} device(s), mesh {mesh}, {cap} per device, "
               f"attention={self.attention}; GB (1e9 bytes) per device", "",
               f"  {'resident':<{w}}{'generator ph':>12}{'policy ph':>12}"]
        for name in names:
            out.append(row(name, *[next((t.bytes for t in self.resident[p] if t.name == name),
                                        0) for p in PHASES]))
        out.append(row("total", *[sum(t.bytes for t in self.resident[p]) for p in PHASES]))
        out += [row(name, nbytes) for name, nbytes in host]
        for s in self.steps:
            rows = f", {s.rows} of {s.of_rows} rows" if s.of_rows else ""
            if "update" in s.name:
                rows += (f" in groups of {s.group} sharing a prefix (grouped update)"
                         if s.group else " (per-row update)")
                if s.group and s.rows // s.group < self.mesh["data"] * self.mesh["fsdp"]:
                    rows += (" [fewer groups a pass than row shards: XLA lays the pass out; "
                             "planned as one group a device]")
            compiled = ("" if s.compiled is None else
                        f"; compiled (CPU) {s.compiled / GB:.3f} [{s.compiled_how}]")
            out += ["", f"{s.phase} phase: {s.name}{rows}: transient {s.transient / GB:.3f}, "
                        f"peak {self.peak(s) / GB:.3f}{compiled}"]
            out += [row(t.name, t.bytes) for t in s.terms]
        out += ["", "micro-batches: " + "; ".join(self.micro_batches())]
        out += [c.describe() for c in self.remat.values()]
        out.append(self.verdict())
        return "\n".join(out)

    def to_json(self) -> dict:
        """The plan's figures in GB per device (memory.json "planned")."""
        def terms(ts):
            return {t.name: round(t.bytes / GB, 4) for t in ts}

        return {
            "devices": self.devices, "backend": self.backend, "mesh": self.mesh,
            "attention": self.attention,
            "capacity_gb": None if self.capacity is None else self.capacity / GB,
            "usable_gb": None if self.usable is None else self.usable / GB,
            "resident_gb": {p: terms(self.resident[p]) for p in PHASES},
            "host_gb": {p: terms(self.host[p]) for p in PHASES},
            "steps": [{"phase": s.phase, "name": s.name, "rows": s.rows, "of_rows": s.of_rows,
                       "transient_gb": round(s.transient / GB, 4),
                       "peak_gb": round(self.peak(s) / GB, 4), "terms_gb": terms(s.terms),
                       "compiled_gb": None if s.compiled is None else s.compiled / GB,
                       "group": s.group}
                      for s in self.steps],
            "peak_gb": round(self.peak(self.worst) / GB, 4), "fits": self.fits,
            "remat": {r: c.remat for r, c in self.remat.items()},
            "verdict": self.verdict()}


def plan(config: ml_collections.ConfigDict, devices: int,
         device_memory_gb: Optional[float] = None, mesh_sizes: Optional[tuple] = None,
         attention: str = "auto", block: int = DEFAULT_BLOCK,
         headroom: float = DEFAULT_HEADROOM, search: bool = True,
         workload: Optional[Workload] = None, backend: Optional[str] = None) -> Plan:
    """Plans `config` on `devices` devices of `device_memory_gb` GB each.

    Args:
        config: a run config (configs/base.py layout).
        devices: N, devices of the mesh.
        device_memory_gb: memory per device (None: figures without a verdict).
        mesh_sizes: (data, fsdp, tensor); default `config.mesh` on N devices.
        attention: "auto" (what the code runs by default: blockwise for long rows), "dense"
            or "blockwise" (key tile `block`).
        headroom: fraction of the memory kept free for the runtime.
        search: pick rollout and update micro-batches; else use what the run does
            (`policy/generator.rollout_micro_batch` rows per sampler call, 0 = all;
            `train.micro_batch_size`).
        workload: shapes of the steps; default `Workload.from_config(config)`.
        backend: the platform planned for, "cpu" | "gpu" | "tpu" (default: this one's,
            `jax.default_backend()`): CPU and GPU decode on per-layer copies of the rollout
            weights and cache (`models.per_layer_decode`), TPU does not.

    Raises:
        config_check.ConfigError: a bad field, or rows that do not divide over the mesh.
        ValueError: an unknown attention, a mesh that does not have N devices, a model
            source of unknown shape (`terms.source_config`).
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    backend = backend or jax.default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    # Shapes and shardings only: planning needs no devices.
    mesh = abstract_mesh(config, devices, mesh_sizes)
    checked = ml_collections.ConfigDict(config.to_dict())  # the run's config on this mesh
    checked.mesh.update(dict(mesh.shape), num_devices=devices)
    config_check.validate(checked, devices)
    # train.remat "auto" decided on this plan's devices and memory, as the run decides it.
    memory = None if device_memory_gb is None else f"{device_memory_gb:.1f} GB per device"
    remat = {r: remat_choice(config, r, devices, device_memory_gb, mesh_sizes, attention,
                             block, headroom, backend, memory) for r in PHASES}
    config = with_remat(config, {r: c.remat for r, c in remat.items()})
    models_ = RoleModels.from_config(config)
    w = workload or Workload.from_config(config)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    split = {p: resident_terms(models_, config, mesh, p) for p in PHASES}
    capacity = None if device_memory_gb is None else int(device_memory_gb * GB)
    usable = None if capacity is None else int(capacity * (1 - headroom))
    steps = []

    def per_call(rows: int, field: int, sampler: str) -> Optional[int]:
        """Rows per sampler call (the engine's slots) the run uses (None: search)."""
        if search:
            return None
        return (slot_count(field, rows, shards) if sampler == "engine"
                else (min(field, rows) if field else rows))

    def sampler_step(phase, name, role, rows, prompt, new, constrained, segments, sampler,
                     field, budget):
        """The sampling step of `role` with its sampler: the static calls' rows, or the
        engine's slots E (a multiple of the row shards, `engine_host.engine_slots`)."""
        if sampler == "engine":
            candidates = sorted({slot_count(d, rows, shards) for d in divisors(rows)},
                                reverse=True)
            return choose(phase, name, rows, candidates,
                           lambda e: engine_sampling_terms(
                               models_, role, mesh, e, rows, prompt, new, attention, block,
                               constrained, backend, w.shared_rows(role, phase)),
                           budget, per_call(rows, field, sampler))
        return choose(phase, name, rows, divisors(rows),
                       lambda r: sampling_terms(models_, role, mesh, r, prompt, new,
                                                attention, block, constrained, backend,
                                                segments),
                       budget, per_call(rows, field, sampler))

    for phase in PHASES:
        # What the phase's resident state leaves for a step's transients. The lambdas below run
        # inside `_choose` at once, so the loop's later rebinding of phase / rows cannot reach them.
        budget = None if usable is None else usable - sum(t.bytes for t in split[phase][0])
        rubric_rows = w.rubric_rows if phase == "generator" else w.rubric_rows_policy_phase
        steps.append(sampler_step(phase, "policy sampling", "policy", w.policy_rows,
                                  w.policy_prompt, w.policy_new, False, w.policy_segments,
                                  w.policy_sampler, config.policy.rollout_micro_batch,
                                  budget))
        steps.append(sampler_step(phase, "rubric sampling", "generator", rubric_rows,
                                  w.rubric_prompt, w.rubric_new, True, w.rubric_segments,
                                  w.rubric_sampler, config.generator.rollout_micro_batch,
                                  budget))
        # No micro-batch to choose here: the Verifier's default chunking (`Workload`).
        steps.append(Step(phase, "verification", verification_terms(
            models_, mesh, w.verifier_rows, w.verifier_prefix, w.verifier_suffix,
            w.verifier_items, attention, block, backend)))
        steps.append(update_step(models_, w, phase, mesh, attention, block, backend, budget,
                                 None if search else models_.train[phase].micro_batch_size))
    return Plan(devices, dict(mesh.shape), capacity, headroom, attention, backend,
                {p: split[p][0] for p in PHASES}, {p: split[p][1] for p in PHASES}, steps,
                remat, config)


def planned_role_mib(config: ml_collections.ConfigDict, idle: str = "generator") -> dict:
    """MiB per role as `roles.role_memory` measures them (whole arrays; a source's base under
    the first role that names it; trainees with their AdamW moments, except the `idle`
    trainee's when parked on disk or offloaded to the host), from shapes only."""
    models_ = RoleModels.from_config(config)
    away = ("parked_on_disk" if config.memory.park_idle_optimizer else "offloaded_to_host"
            if config.memory.offload_idle_optimizer else None)
    out, seen = {"parked_on_disk": 0.0, "offloaded_to_host": 0.0}, set()
    for role in ("verifier", "policy_ref", "generator_ref"):
        src = models_.sources[role.removesuffix("_ref")]
        out[role] = 0 if src in seen else tree_bytes(models_.base_shapes(src)) / 2 ** 20
        seen.add(src)
    for role in ("policy", "generator"):
        trained = models_.trained_shapes(role)
        opt = jax.tree.leaves(jax.eval_shape(models_.optimizer(role).init, trained))
        out[role] = tree_bytes(trained) / 2 ** 20
        for leaf in opt:  # parking leaves the step counters (scalars) in place
            # Offloading moves every leaf, the scalar counters too; parking leaves those in place.
            moved = away and role == idle and (leaf.ndim or away == "offloaded_to_host")
            out[away if moved else role] += tree_bytes(leaf) / 2 ** 20
    return out

"""The planner's terms: bytes per device of each array a round holds (`planner.plan`).

    resident   the frozen base of each model source, once (the verifier and both references
               share it, and LoRA trainees sit on it: `roles`), each trainee's trained
               params and AdamW moments in their dtypes; the idle trainee's moments leave
               the device with `memory.offload_idle_optimizer` (pinned host) or
               `memory.park_idle_optimizer` (disk)
    per step   the transient bytes at the peak of a device step: a GRPO update
               (`memory.train_terms`: per row, or in groups sharing a prefix, P + R N
               tokens a group), a sampler call (`sampling_terms`), a verifier chunk
               (`verification_terms`)

Every array's bytes come from `jax.eval_shape` of the real constructors
(`models.init_params`, `train_step.trainable_init`, the optimizer's `init`) and its shard
shape under `models.param_shardings` on an `AbstractMesh` (no devices needed).
Activations are counted from the shapes the jitted functions create, as the number of
buffers of each shape alive at their peak (constants below); `planner_compiled` measures
the same steps from XLA's compiled memory analysis, and tests hold the two within 25%.
Rows are split over data x fsdp in every step (the sampler's and the verifier's, padded to a
multiple of the row shards, and the train step's); the sampler's and verifier's terms are in
`memory.inference_terms`.

Attention: "dense" is the materialized attention ([H, T, S] float32 scores per row);
"blockwise" (flash-style, `models.attention`) keeps [H, T, block] tiles instead, so its
term is linear in length; "auto" (the default, as `ModelConfig.attention="auto"`) is
blockwise for rows of more than 2^20 scores and dense below. Each is counted analytically
(`attention=`).

Axis legend (docs/CONVENTIONS.md): R rows, P prompt bucket, N new tokens, T = P + N,
S cache slots, D width, F MLP width, H heads, Hkv KV heads, Dh head dim, V vocab, L layers.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional

import jax
import ml_collections
from jax.sharding import AbstractMesh

from drubric_jax import config_check, models, parallel
from drubric_jax.rl import train_step as ts
from drubric_jax.models import lora, weights
from drubric_jax.models.attention import AUTO_BLOCKWISE_MIN_SCORES
from drubric_jax.models.config import PRESETS, SMOLLM2_135M, ModelConfig
from drubric_jax.models.default import DEFAULT_MODEL
from drubric_jax.rounds.roles import LoadedModel, trainee_config
from drubric_jax.rounds.settings import read as read_settings
from drubric_jax.rl.train_config import make_optimizer

GB = 1e9
ATTENTIONS = ("auto", "dense", "blockwise")
# Buffers alive at a step's peak, in units of the named per-row array (read off XLA's buffer
# assignment of the jitted functions at several widths and lengths; `planner_compiled` and
# tests/test_planner.py check the sums).
TRAIN_ATTENTION = 3      # float32 [H, T, S]: scores, probabilities, their cotangent
FORWARD_ATTENTION = 3    # float32 [H, T, S] (verifier suffix passes): scores, unnormalised
#                          probabilities, their cast for the value product (`materialized`)
PREFILL_ATTENTION = 3    # a prefill into a fresh cache (T = S): the same three
OPTIMIZER_COPIES = 2     # float32 trained-params-sized buffers in the AdamW update: the
#                          gradients and the updates (new params and moments are donated)
# float32 [chunk, V] live in the head's backward: logits, log-softmax, its cotangent (the
# compiled generator update of tests/test_planner.py: at most 3.05 chunks live at its peak).
TRAIN_LOGITS = 3
# Per token of a row, (D-wide, F-wide, H*Dh-wide) buffers of one layer: recomputed with its
# gradients (train) or run forward. The F-wide ones (the MLP) are in the compute dtype; the
# D- and H*Dh-wide ones are counted in float32 (RMSNorm and RoPE compute in float32).
TRAIN_WIDTHS = (10, 15, 6)
# Without remat (`train.remat=False`) the forward keeps, per layer and token, what its
# backward reads (the same units), and with materialized attention also SAVED_ATTENTION
# float32 [H, T, S] per layer (scores and probabilities); blockwise attention keeps only its
# output and log-sum-exp. Fitted to the compiled difference remat off - on of the tiny
# config's steps (tests/test_planner.py checks it within 25%).
SAVED_WIDTHS = (6, 5, 4)
SAVED_ATTENTION = 2
FORWARD_WIDTHS = (4, 5, 3)
SAMPLING_LOGITS = 8      # float32 [R, V]: the state's and the new logits, masked, tempered,
#                          Gumbel-perturbed, the log-softmax and its exp (fitted; when the
#                          step's second log-softmax went, the compiled peak of the tiny
#                          config's decode moved by 64 bytes: XLA had fused it)
BATCH_BYTES = 2 * (4 + 1 + 1 + 4)  # tokens, masks, old log-probs per token, and their
#                                    micro-batch reshuffle


@dataclasses.dataclass(frozen=True)
class Term:
    """One amount of memory: its name, bytes per device, and what shrinks it."""

    name: str
    bytes: int
    field: str


@dataclasses.dataclass
class Step:
    """One device step of a phase: the transient terms at its peak (beyond the resident
    state of its phase); `rows` is its rollout or update micro-batch when it has one."""

    phase: str
    name: str
    terms: list
    rows: int = 0
    of_rows: int = 0
    compiled: Optional[int] = None  # planner_compiled's figure, when measured
    compiled_how: str = ""
    # An update's rows a group when it runs grouped (`train_step.GroupBatch`; `rows` and
    # `of_rows` are then whole groups' rows, of_rows padded to the row shards); 0 per row.
    group: int = 0

    @property
    def transient(self) -> int:
        return sum(t.bytes for t in self.terms)


def source_config(source: str, dtype: str) -> ModelConfig:
    """The ModelConfig `models.load_model(source, dtype)` gives, without reading weights: a
    preset, the packaged default, a Hugging Face directory (config.json), a GGUF file, or a
    hub id whose name is a preset ("Qwen/Qwen3-8B" -> qwen3_8b).

    Raises:
        ValueError: a hub id of no known preset (give a local directory instead).
    """
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        with open(os.path.join(path, "config.json")) as f:
            return weights.config_from_hf(json.load(f), dtype)
    if os.path.isfile(path):
        return weights.config_from_gguf(weights.open_gguf(path), dtype)
    # A hub id's name as a preset key: "Qwen/Qwen3-8B" -> qwen3_8b (a trailing _instruct dropped).
    name = source.split("/")[-1].lower().replace("-", "_").replace(".", "_")
    cfg = {DEFAULT_MODEL: SMOLLM2_135M}.get(source) or PRESETS.get(name) or PRESETS.get(
        name.removesuffix("_instruct"))
    if cfg is None:
        raise ValueError(f"model source {source!r}: not a preset, file or directory; pass a "
                         f"local Hugging Face directory (known presets: {sorted(PRESETS)})")
    return cfg.replace(dtype=dtype, param_dtype=dtype)


def abstract_mesh(config: ml_collections.ConfigDict, devices: int,
                  sizes: Optional[tuple] = None) -> AbstractMesh:
    """The mesh `config.mesh` (or `sizes` = (data, fsdp, tensor)) makes on `devices`
    devices, without devices (shard shapes only)."""
    if sizes is None:
        sizes = tuple(config_check.mesh_axis_sizes(config, devices)[a]
                      for a in parallel.MESH_AXES)
    if math.prod(sizes) != devices:
        raise ValueError(f"mesh {sizes} has {math.prod(sizes)} devices, not {devices}")
    return AbstractMesh(tuple(sizes), parallel.MESH_AXES)


def tree_bytes(shapes, mesh: Optional[AbstractMesh] = None) -> int:
    """Bytes per device of a pytree of arrays or structs under `models.param_shardings`
    on `mesh` (None: the whole arrays)."""
    if mesh is None:
        return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(shapes))
    shard = jax.tree.leaves(models.param_shardings(shapes, mesh))
    # One device's shard of each leaf (a replicated dim counts whole).
    return sum(math.prod(s.shard_shape(tuple(x.shape))) * x.dtype.itemsize
               for x, s in zip(jax.tree.leaves(shapes), shard))


@dataclasses.dataclass(frozen=True)
class RoleModels:
    """Model configs of a run's roles (no arrays): `base[source]` in the storage dtype,
    `trainee[role]` and `train[role]` as `roles.build_roles` makes them."""

    sources: dict
    base: dict
    trainee: dict
    train: dict

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "RoleModels":
        s = read_settings(config)  # the run's settings, as `rounds.run_state.setup` reads them
        sources = {r: getattr(s.model, r) for r in ("policy", "generator", "verifier")}
        base = {src: source_config(src, s.model.dtype) for src in dict.fromkeys(sources.values())}
        # `roles.trainee_config` on a params-less LoadedModel: the config a run builds.
        trainee = {r: trainee_config(LoadedModel(sources[r], base[sources[r]], {}, None),
                                     s.lora, s.model.master_dtype)
                   for r in ("policy", "generator")}
        # train.remat "auto" is decided on this machine unless the config holds bools
        # (`planner.plan` and `remat_choice` plan with bools: `planner.with_remat`).
        train = {"policy": s.policy.train, "generator": s.generator.train}
        return cls(sources, base, trainee, train)

    def optimizer(self, role: str):
        return make_optimizer(self.train[role])

    def base_shapes(self, source: str):
        return jax.eval_shape(lambda: models.init_params(self.base[source],
                                                            jax.random.PRNGKey(0)))

    def trained_shapes(self, role: str):
        return jax.eval_shape(lambda: ts.trainable_init(self.trainee[role]))

    def sampling_shapes(self, role: str):
        """What the sampler runs on (`roles.Trainee.params`): base + adapters, or masters."""
        trained = self.trained_shapes(role)
        if self.trainee[role].lora_rank:
            return lora.attach(self.base_shapes(self.sources[role]), trained)
        return trained


def resident_terms(models_: RoleModels, config: ml_collections.ConfigDict, mesh,
                   phase: str) -> tuple[list, list]:
    """(device terms, host terms) held through the `phase` ("generator" | "policy")."""
    users: dict = {}
    for role, src in models_.sources.items():  # who reads each source's one copy
        users.setdefault(src, []).append(role if role == "verifier" else f"{role}_ref")
        if role != "verifier" and models_.trainee[role].lora_rank:
            users[src].append(f"{role} (LoRA)")
    device, host = [], []
    for src, names in users.items():
        device.append(Term(f"base {src} ({config.model.dtype}), once for: {', '.join(names)}",
                           tree_bytes(models_.base_shapes(src), mesh),
                           "config.model.dtype; more devices on mesh.fsdp"))
    idle_off = config.memory.park_idle_optimizer or config.memory.offload_idle_optimizer
    for role in ("policy", "generator"):
        cfg, tc = models_.trainee[role], models_.train[role]
        trained = models_.trained_shapes(role)
        what = (f"LoRA adapters r={cfg.lora_rank}" if cfg.lora_rank else "full params")
        device.append(Term(f"{role} {what} ({cfg.param_dtype})", tree_bytes(trained, mesh),
                           "config.lora.rank" if cfg.lora_rank else
                           "config.lora.rank > 0; config.model.master_dtype; mesh.fsdp"))
        opt = Term(f"{role} AdamW moments (mu {tc.mu_dtype}, nu {cfg.param_dtype})",
                   tree_bytes(jax.eval_shape(models_.optimizer(role).init, trained), mesh),
                   f"config.{role}.train.mu_dtype=bfloat16; "
                   "config.memory.offload_idle_optimizer; config.lora.rank")
        # Only the idle trainee's moments can leave the device; the active one's stay.
        (host if role != phase and idle_off else device).append(opt)
    return device, host


def _layer_bytes(layers, dtype_bytes: int) -> int:
    """One whole (unsharded) layer of stacked [L, ...] leaves at `dtype_bytes` per entry."""
    return sum(math.prod(x.shape[1:]) for x in jax.tree.leaves(layers)) * dtype_bytes


def attention_term(cfg: ModelConfig, rows: int, queries: int, keys: int, buffers: int,
               attention: str, block: int, tensor: int = 1) -> Term:
    if attention == "auto":  # as `models.attention.choose`: blockwise for long rows only
        attention = "blockwise" if queries * keys > AUTO_BLOCKWISE_MIN_SCORES else "dense"
    # Blockwise holds [rows, H, query block, key block] tiles (both blocks `block` long).
    k = keys if attention == "dense" else min(keys, block)
    queries = queries if attention == "dense" else min(queries, block)
    field = ("ModelConfig.attention=blockwise (planner: --attention=blockwise)"
             if attention == "dense" else "rows per pass; --attention_block")
    return Term(f"attention {attention} ({buffers} x float32 [{rows}, H, {queries}, {k}])",
                buffers * rows * -(-cfg.num_heads // tensor) * queries * k * 4, field)


def widths_bytes(cfg: ModelConfig, rows: int, tokens: int, widths: tuple, tensor: int = 1) -> int:
    (d, f, q), (dim, ffn, heads) = widths, models.family(cfg).activation_widths(cfg)
    per_token = ((d * dim + q * -(-heads // tensor)) * 4
                 + f * -(-ffn // tensor) * cfg.compute_dtype.itemsize)
    return rows * tokens * per_token


def _f32(shapes):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, "float32"), shapes)


def weights_in_use(cfg: ModelConfig, layers, head_bytes: int, mesh,
                   backend: Optional[str] = None) -> list:
    """Weights a pass materialises beyond the stored shards, in the compute dtype: with
    fsdp > 1 the layers being gathered and the output head (`head_bytes`, 0 when the pass
    does not gather it); with fsdp = 1 the cast of leaves stored in another dtype (float32
    masters). Layers: one at a time on CPU (XLA:CPU runs collectives in program order),
    two on accelerators (the next layer's gather overlaps the current layer's compute)."""
    gather = mesh.shape["fsdp"] > 1
    moved = {k: x for k, x in layers.items() if gather or x.dtype != cfg.compute_dtype}
    count = 1 if (backend or jax.default_backend()) == "cpu" else 2
    nbytes = count * _layer_bytes(moved, cfg.compute_dtype.itemsize) + (
        head_bytes if gather else 0)
    if not nbytes:
        return []
    head = " + head" if gather and head_bytes else ""
    return [Term(f"layer weights in use (gathered or cast: {count} layer{'s' * (count > 1)}"
                 f"{head})", nbytes, "mesh.fsdp; config.model.master_dtype")]


def total_bytes(terms: list) -> int:
    """Sum of the terms' bytes."""
    return sum(t.bytes for t in terms)

"""The planner's terms of a GRPO update (`train_step.train_step`): bytes per device at the
peak of its gradient pass or of its AdamW update (`planner.plan`, `memory.terms` for the
buffer constants and the resident state).

Two layouts (`train.shared_prefix`): per row, each row [prompt | completion] of P + N
tokens; in groups sharing a prefix (`train_step.GroupBatch`), each group packed as one row
of P + R N tokens (`models.forward_shared_hidden`), its groups padded to the row shards as
`rounds.phases.train_batch` pads them and planned all live (`group_layout`).

Axis legend (docs/CONVENTIONS.md): R rows (a group's rows where grouped), P prompt bucket,
N new tokens, T = P + N, D width, F MLP width, H heads, Dh head dim, V vocab, L layers.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from drubric_jax.memory.terms import (BATCH_BYTES, OPTIMIZER_COPIES, SAVED_ATTENTION,
                                      SAVED_WIDTHS, TRAIN_ATTENTION, TRAIN_LOGITS,
                                      TRAIN_WIDTHS, RoleModels, Term, _f32, attention_term,
                                      total_bytes, tree_bytes, weights_in_use, widths_bytes)
from drubric_jax.models.config import ModelConfig
from drubric_jax.rl import train_step as ts
from drubric_jax.types import require


def head_terms(cfg: ModelConfig, mesh, micro_batches: int, trains_head: bool) -> list:
    """The output head [V, D] in a train step under fsdp > 1, as XLA's buffer assignment of
    the compiled step shows it (2-layer Qwen3-8B on 8 CPU devices, rows pinned to their
    devices by `parallel.constrain_rows`): with micro-batches (n > 1) its gather is hoisted
    out of the micro-batch loop, two gathered copies (compute dtype) live through it; a step
    that trains the head also holds its whole float32 gradient and the buffer that gradient
    is all-reduced into before each device keeps its shard (on GPU, XLA may turn that
    all-reduce into a reduce-scatter: then the plan is one head above)."""
    if mesh.shape["fsdp"] == 1:
        return []
    v, d = -(-cfg.vocab_size // mesh.shape["tensor"]), cfg.dim
    out = []
    if micro_batches > 1:
        out.append(Term("output head gathered (2 copies, hoisted out of the micro-batch loop)",
                        2 * v * d * cfg.compute_dtype.itemsize, "mesh.tensor; micro-batches"))
    if trains_head:
        out.append(Term("output head gradient, whole (float32, + its all-reduce buffer)",
                        2 * v * d * 4, "config.lora.rank > 0 (a frozen head); mesh.tensor"))
    return out


@dataclasses.dataclass(frozen=True)
class GroupLayout:
    """How a step's groups go through the grouped update (`rounds.phases.train_batch`,
    `train_step.micro_batches`), planned with every group live (flat groups are cut at run
    time: a step holds at most this many).

    groups      the step's groups, padded to the largest `train_step.group_buckets` count
                (a multiple of the row shards): ceil(groups / shards) x shards
    per_pass    groups of one micro-batch: max(1, micro_batch_size // R), at most `groups`
    passes      micro-batches of a step: groups / per_pass
    per_device  groups of a micro-batch on one device: ceil(per_pass / shards) (a
                micro-batch of fewer groups than row shards is not split over them:
                `parallel.constrain_rows` leaves it to XLA, and a device holds a whole group)
    """

    groups: int
    per_pass: int
    passes: int
    per_device: int


def pass_group(tc, group: int, rows: int, shards: int) -> int:
    """R', the rows of a group the grouped update packs into a row
    (`train_step.rows_per_pass` of `tc.group_rows`, as `rounds.phases.train_batch` picks
    it), or 0 for the per-row update (`tc.shared_prefix` off, or no groups).

    Args:
        tc: the trainee's TrainConfig; group: R, rows a group; rows: the step's rows;
            shards: the row shards.
    """
    if not (tc.shared_prefix and group):
        return 0
    return ts.rows_per_pass(group, max(rows // group, 1), shards, tc.group_rows)


def padded_groups(rows: int, group: int, shards: int) -> int:
    """The groups of a step of `rows` rows in groups of `group`, every group live, padded as
    `rounds.phases.train_batch` pads them: the largest `train_step.group_buckets` count,
    ceil(groups / shards) x shards."""
    return ts.group_buckets(max(rows // group, 1), shards)[-1]


def group_layout(rows: int, group: int, micro_batch: int, shards: int,
                 field: str = "micro_batch_size") -> GroupLayout:
    """The `GroupLayout` of a step of `rows` rows in groups of R = `group` rows, with
    `micro_batch` rows (`train.micro_batch_size`) a gradient pass, over `shards` row shards.

    Raises:
        ConfigError: a micro-batch's groups that do not divide the padded groups (the run's
            `rounds.phases.train_batch` finds no group count then), named by `field`
            ("config.<role>.train.micro_batch_size").
    """
    groups = padded_groups(rows, group, shards)
    per = min(max(1, micro_batch // group), groups)
    require(groups % per == 0, field,
                          f"{micro_batch} rows = {per} groups of {group} a micro-batch do not "
                          f"divide the {groups} groups of a step (padded to the {shards} row "
                          "shards)")
    return GroupLayout(groups, per, groups // per, -(-per // shards))


def attention_parts_term(cfg: ModelConfig, parts: list, buffers: int, attention: str,
                         block: int, tensor: int = 1) -> Term:
    """`attention_term` of several attentions that a layer holds at once, summed: `parts`
    is [(rows, queries, keys)]; each part is dense or blockwise on its own ("auto": by its
    queries x keys, as `models.attention.choose`)."""
    terms = [attention_term(cfg, r, q, k, buffers, attention, block, tensor) for r, q, k in parts]
    if len(terms) == 1:
        return terms[0]
    kinds = " + ".join(dict.fromkeys(t.name.split()[1] for t in terms))
    shapes = " + ".join(t.name.split("float32 ", 1)[1].rstrip(")") for t in terms)
    return Term(f"attention {kinds} ({buffers} x float32 {shapes})",
                sum(t.bytes for t in terms), terms[0].field)


def update_pass(rows: int, micro_batch: int, prompt: int, new: int, shards: int,
                group: int = 0, field: str = "micro_batch_size") -> tuple:
    """One gradient pass of an update on one device: (units, tokens a unit, scored rows a
    unit, attention parts [(rows, queries, keys)], micro-batches n, a label).

    Per row (group 0): units are rows of T = P + N tokens, each its own causal attention.
    Grouped (R = group, `train_step.GroupBatch`): units are groups packed as one row of
    P + R N tokens (`models.forward_shared_hidden`); attention (`attend_shared_prefix`) the
    prefix's causal [P x P], the suffixes' [R N x P] over the prefix, and R causal [N x N]
    of each suffix over itself; the output head scores the R N completion tokens.
    """
    if not group:
        b, n = max(micro_batch // shards, 1), rows // micro_batch
        t = prompt + new
        return b, t, b, [(b, t, t)], n, f"{b} rows x T={t}"
    lay = group_layout(rows, group, micro_batch, shards, field)
    b, t = lay.per_device, prompt + group * new
    parts = [(b, prompt, prompt), (b, group * new, prompt), (b * group, new, new)]
    # The output head takes the pass's rows [groups x R, N, D] pinned over the row shards
    # (`logprobs._score`, `parallel.constrain_rows`), even when its groups are fewer than
    # the shards.
    scored = -(-lay.per_pass * group // shards)
    return (b, t, scored, parts, lay.passes,
            f"{b} group{'s' * (b > 1)} x (P + R N = {prompt} + {group} x {new})")


def train_terms(models_: RoleModels, role: str, mesh, rows: int, micro_batch: int,
                prompt: int, new: int, attention: str, block: int,
                backend: Optional[str] = None, group: int = 0) -> list:
    """Transient terms of one GRPO step (`train_step.train_step`) of `role` on R = `rows`
    rows of T = prompt + new tokens, `micro_batch` rows per gradient pass, on `backend`
    ("cpu" | "gpu" | "tpu"; None: this one).

    With the trainee's `shared_prefix` and `group` = R rows a group (K answers of a prompt,
    G lists of an input), the grouped update (`train_step.GroupBatch`): each group's
    prefix once beside its R suffixes, P + R N tokens a group where the per-row update runs
    R (P + N); its groups padded to the row shards and every group live (`group_layout`).
    """
    cfg, tc = models_.trainee[role], models_.train[role]
    shards, tensor = mesh.shape["data"] * mesh.shape["fsdp"], mesh.shape["tensor"]
    grouped = pass_group(tc, group, rows, shards)
    # Units (rows, or packed groups) of one micro-batch on one device, and their tokens.
    mb_field = f"config.{role}.train.micro_batch_size"
    b, t, scored, parts, n, label = update_pass(rows, micro_batch, prompt, new, shards,
                                                grouped, mb_field)
    trained = models_.trained_shapes(role)
    grads = tree_bytes(_f32(trained), mesh)
    # The output head scores only the completion (start = P): chunks of at most N tokens.
    chunk = min(tc.logits_chunk, new)
    # Every unit of the step (the grouped batch padded to its bucket) split over the shards.
    units = group_layout(rows, grouped, micro_batch, shards, mb_field).groups if grouped else rows
    batch = Term("batch arrays", -(-units // shards) * t * BATCH_BYTES,
                 f"config.{role}.max_new_tokens")
    weights_ = weights_in_use(cfg, (models_.sampling_shapes(role) if cfg.lora_rank
                                     else trained)["layers"], 0, mesh, backend)
    weights_ += head_terms(cfg, mesh, n, trains_head=not cfg.lora_rank)
    # Grouped, a device's pass holds at least one whole group: past that, only running the
    # rows one by one shrinks it.
    unit_field = (f"{mb_field} (whole groups); config.{role}.train.shared_prefix=False "
                  "(rows one by one)" if grouped else mb_field)
    layer = [Term("one recomputed layer (+ its gradients)",
                  widths_bytes(cfg, b, t, TRAIN_WIDTHS, tensor), unit_field),
             attention_parts_term(cfg, parts, TRAIN_ATTENTION, attention, block, tensor)]
    logits = [Term(f"logits chunks ({TRAIN_LOGITS} x float32 [{scored}, {chunk}, V])",
                   TRAIN_LOGITS * scored * chunk * -(-cfg.vocab_size // tensor) * 4,
                   f"config.{role}.train.logits_chunk")]
    # A gradient pass holds the gradients (the accumulator when n > 1: XLA adds each
    # micro-batch's into it as they are made), the residuals of every layer, then either a
    # layer's backward or the output head's (never both at once).
    passes = [Term(f"{role} gradients (float32{', accumulated' if n > 1 else ''})", grads,
                   "config.lora.rank"),
              _saved_activations(cfg, tc.remat, b, t, parts, label, attention, block, tensor,
                                 unit_field, f"config.{role}.train.remat"),
              batch, *weights_, *max(layer, logits, key=total_bytes)]
    if not cfg.lora_rank and cfg.tie_embeddings:
        # Tied: the lookup's gradient is a scatter into its own [V, D] buffer, added to the
        # head's gradient. Untied, that scatter is the embedding's gradient itself (already
        # in the gradients above); counting it again over-planned Qwen3's update by 14-20%.
        passes.append(Term("embedding gradient (float32 [V, D])",
                           tree_bytes(_f32({"embed": trained["embed"]}), mesh),
                           "config.lora.rank"))
    if mesh.shape["data"] > 1:  # replicated gradients are all-reduced into a new buffer
        passes.append(Term("all-reduced gradients (data > 1)", grads, "mesh.fsdp over data"))
    update = [Term(f"{role} AdamW update ({OPTIMIZER_COPIES} x float32 trained params)",
                   OPTIMIZER_COPIES * grads, "config.lora.rank; mesh.fsdp"), batch]
    return max(passes, update, key=total_bytes)


def _saved_activations(cfg: ModelConfig, remat: bool, b: int, t: int, parts: list,
                       label: str, attention: str, block: int, tensor: int, mb_field: str,
                       remat_field: str) -> Term:
    """What the forward of a gradient pass keeps for its backward, for `b` units (rows or
    packed groups) of `t` tokens: with remat the L layer inputs (each layer is recomputed),
    without it every layer's activations (and the dense parts of its attention)."""
    if remat:
        return Term(f"remat residuals (L x {label} x D)",
                    cfg.num_layers * b * t * cfg.dim * cfg.compute_dtype.itemsize, mb_field)
    per_layer = widths_bytes(cfg, b, t, SAVED_WIDTHS, tensor)
    per_layer += sum(a.bytes for a in (attention_term(cfg, *p, SAVED_ATTENTION, attention,
                                                      block, tensor) for p in parts)
                     if "dense" in a.name)
    return Term(f"saved activations, no remat (L x {label})",
                cfg.num_layers * per_layer, f"{remat_field}=True; {mb_field}")

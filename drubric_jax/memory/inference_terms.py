"""The planner's terms of the inference steps: a sampler call and a verifier chunk.

Both split their rows over the mesh's ("data", "fsdp") axes, padded to a multiple of those
row shards (`sampling.generate`, `evaluator.placement`), so every row-sized array (KV cache,
activations, logits) is counted for the rows of one device: ceil(R / (data x fsdp)). The
sampler's cache also splits its KV heads over "tensor" when they divide
(`sampling.decode._shard_cache`).

A sampler call runs on the rollout copy of the trainee (`models.rollout.rollout_copy`): the
weights replicated over "data" and "fsdp", split over "tensor", in the compute dtype. It is
made before the call and freed after it, so it is a transient of the step; leaves already in
that layout and dtype are not copied (one device in the compute dtype: nothing). On CPU and
GPU (`models.per_layer_decode`) the decode loop runs on per-layer block weights and holds a
per-layer copy of the cache; TPUs decode the stacked arrays. The rollout copy is made in
that per-layer form (all its block weights), so a decode holds one copy of the weights;
where no rollout copy is made, the sampler makes the per-layer one (`sampling.decode_params`). The verifier runs on the
frozen base in its training layout and gathers a layer at a time, as a train step does.

Axis legend (docs/CONVENTIONS.md): R rows, P prompt bucket, N new tokens, S cache slots,
D width, V vocab, L layers, Hkv KV heads; here also Mc items per verifier pass.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax

from drubric_jax import models, parallel
from drubric_jax.memory.terms import (FORWARD_ATTENTION, FORWARD_WIDTHS, PREFILL_ATTENTION,
                                       SAMPLING_LOGITS, RoleModels, Term, attention_term,
                                       total_bytes, weights_in_use, widths_bytes)
from drubric_jax.models.config import ModelConfig
from drubric_jax.models.rollout import target_dtype
from drubric_jax.sampling.buckets import cache_schedule


def row_shards(mesh) -> int:
    """data x fsdp: the devices a step's rows are split over."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def rows_per_device(rows: int, mesh) -> int:
    """ceil(R / (data x fsdp)): a device's rows once R is padded to the row shards."""
    return -(-rows // row_shards(mesh))


def kv_cache_bytes(cfg: ModelConfig, rows: int, slots: int, mesh=None) -> int:
    """Bytes per device of `models.init_cache(cfg, rows, slots)`, k and v [L, R, Hkv, S, Dh]
    in the compute dtype: whole (mesh None), or rows over data x fsdp and, when they divide,
    the KV heads over "tensor" (the sampler's layout)."""
    heads = cfg.num_kv_heads
    if mesh is not None:
        rows = rows_per_device(rows, mesh)
        tensor = mesh.shape["tensor"]
        heads = heads // tensor if heads % tensor == 0 else heads
    return 2 * cfg.num_layers * rows * heads * slots * cfg.head_dim * cfg.compute_dtype.itemsize


def rollout_copy_bytes(shapes, cfg: ModelConfig, mesh,
                       per_layer: bool = False) -> tuple[int, int]:
    """(bytes per device of the rollout copy, of its block layers alone in the decode layout
    and dtype) for params of `shapes` (structs in their stored dtype and training layout)
    on `mesh`: each leaf whose layout (`parallel.decode_rules`) or dtype
    (`models.rollout.target_dtype`) changes is copied; the others are the params themselves
    (0 bytes). `per_layer`: a copy made in the per-layer form outputs every block leaf
    (`models.rollout.copy_program`), so all the layers count once any leaf is copied."""
    train = jax.tree.leaves(models.param_shardings(shapes, mesh))
    decode = jax.tree.leaves(parallel.param_shardings(
        shapes, mesh, parallel.decode_rules(models.param_specs())))
    copied = layers = copied_layers = 0
    for (path, x), tr, de in zip(jax.tree_util.tree_flatten_with_path(shapes)[0], train, decode):
        dtype = target_dtype(path, x, cfg.compute_dtype)
        shard = de.shard_shape(tuple(x.shape))
        whole = math.prod(shard) * jax.numpy.dtype(dtype).itemsize
        block = any(getattr(e, "key", None) == "layers" for e in path)
        if dtype != x.dtype or shard != tr.shard_shape(tuple(x.shape)):
            copied += whole
            copied_layers += whole * block
        # A per-layer copy (the sampler's, or the rollout copy's) holds every block leaf.
        layers += whole * block
    if per_layer and copied:
        copied += layers - copied_layers
    return copied, layers


def routed_expert_bytes(cfg: ModelConfig, tokens: int) -> int:
    """Bytes of one mixture-of-experts layer's "capacity" dispatch of one group of `tokens`
    tokens (`models.qwen3_moe`): E x C expert rows (C = `capacity`, ~ factor x k rows a
    token), each with its [D] input row in the compute dtype and its three [F] products
    (gate, up, their SwiGLU) in float32, the einsums' accumulation type. Read off the
    compiled `moe_mlp` of one Qwen3-30B-A3B layer on one CPU device (1K-8K tokens, linear
    in them): 38 float32 D-widths a token, 50 bfloat16 ones; this count gives 34 and 52.
    The sharded verifier prefill (8 CPU devices, fsdp = 8, one dispatch group a device)
    grows by the same ~0.28 MB a token. 0 for a dense model."""
    if not cfg.num_experts:
        return 0
    from drubric_jax.models import qwen3_moe

    slots = cfg.num_experts * qwen3_moe.capacity(cfg, tokens)
    return slots * (cfg.dim * cfg.compute_dtype.itemsize + 3 * cfg.hidden_dim * 4)


def forward_terms(cfg: ModelConfig, rows: int, tokens: int, slots: int, attention: str,
                  block: int, field: str, buffers: int = FORWARD_ATTENTION,
                  tensor: int = 1) -> list:
    """A forward pass of `rows` rows (one device's) of `tokens` tokens over `slots` keys:
    its activations and its attention, and for a mixture of experts the routed rows of one
    layer's dispatch (a device's rows are one dispatch group, `qwen3_moe.dispatch_groups`)."""
    out = [Term(f"forward activations ({rows} rows x {tokens} tokens)",
                widths_bytes(cfg, rows, tokens, FORWARD_WIDTHS, tensor), field),
           attention_term(cfg, rows, tokens, slots, buffers, attention, block, tensor)]
    if cfg.num_experts:
        out.append(Term(f"routed expert rows of one layer ({rows * tokens} tokens x "
                        f"{cfg.moe_capacity_factor:g} x k slots)",
                        routed_expert_bytes(cfg, rows * tokens),
                        "ModelConfig.moe_capacity_factor; rows per pass"))
    return out


def logits_term(cfg: ModelConfig, rows: int, buffers: int, field: str,
                tensor: int = 1) -> Term:
    """`buffers` float32 [rows, V] next-token logits; with `tensor` > 1 (dividing V) their
    vocabulary split over "tensor", as the split output head leaves them (measured for the
    engine's decode step: 8 buffers of V / 2 at tensor = 2)."""
    split = tensor if tensor > 1 and cfg.vocab_size % tensor == 0 else 1
    shape = f"[{rows}, V / {split}]" if split > 1 else f"[{rows}, V]"
    return Term(f"next-token logits ({buffers} x float32 {shape})",
                buffers * rows * cfg.vocab_size * 4 // split, field)


def sampling_terms(models_: RoleModels, role: str, mesh, rows: int, prompt: int, new: int,
                   attention: str, block: int, constrained: bool,
                   backend: Optional[str] = None, segments: int = 0,
                   decode_only: bool = False) -> list:
    """Transient terms per device at the peak of `sampling.generate` on the rollout copy of
    `role`, R = `rows` prompts per call (split over data x fsdp), bucket P = `prompt`,
    N = `new`: the rollout copy, then the larger of the prefill and the decode loop.

    Args:
        backend: the platform planned for ("cpu", "gpu", "tpu"; None: this one): CPU and
            GPU decode on per-layer copies of the weights and the cache
            (`models.per_layer_decode`), counted here; TPU does not. `constrained` decoding
            makes the same copies, so it is counted alike. When `generate` splits the
            decode into cache segments (`sampling.cache_schedule`, "auto"), the prefill's
            cache has S_0 slots and the decode ends with chunks of P + N slots.
        segments: `config.<role>.cache_segments` (0 = auto).
        decode_only: the decode loop's terms only, not the larger of it and the prefill
            (the device check times a decode from a state made without a prefill).
    """
    cfg = models_.base[models_.sources[role]]
    local, tensor = rows_per_device(rows, mesh), mesh.shape["tensor"]
    per_layer = models.decode_per_layer(cfg, backend)
    # The cache's segments as `sampling.generate` picks them (0: "auto").
    schedule = cache_schedule(prompt, new, segments, per_layer)
    field = f"rows per sampler call (rollout micro-batch); config.{role}.max_new_tokens"

    def cache_term(name, slots):
        return Term(f"{name} ({local} of {rows} rows x {slots} slots)",
                    kv_cache_bytes(cfg, rows, slots, mesh), field)

    # The prefill's cache: S_0 slots (all P + N with one segment).
    cache = cache_term("KV cache", schedule[0])
    copy, layers = rollout_copy_bytes(models_.sampling_shapes(role), cfg, mesh, per_layer)
    form = ", per-layer blocks" if per_layer else ""
    weights = ([Term(f"rollout copy of the weights (decode layout, compute dtype{form})", copy,
                     "mesh.tensor (splits the copy)")] if copy else [])
    budget = ("config.generator.input_budget" if role == "generator"
              else "config.policy.max_prompt_tokens")  # the prefill runs over the prompt
    # A prefill into a fresh cache attends over the prompt's own tokens (`KVCache.empty`).
    prefill = [cache, *forward_terms(cfg, local, prompt, prompt, attention, block,
                                     f"rows per sampler call (rollout micro-batch); {budget}",
                                     PREFILL_ATTENTION, tensor)]
    decode = [logits_term(cfg, local, SAMPLING_LOGITS, field)]
    if len(schedule) == 1:
        decode.append(cache)
        if per_layer:
            decode.append(dataclasses.replace(cache, name="per-layer copy of the KV cache "
                                              "(decode loop; CPU and GPU)"))
    else:
        # `sampling.decode_segments`: per-layer chunks, P + N slots at the end; the
        # unconstrained loop also keeps the prefill's cache (its argument), which the
        # constrained host loop drops after unstacking it.
        if not constrained:
            decode.append(cache)
        decode.append(cache_term(f"per-layer KV cache chunks ({len(schedule)} segments)",
                                 schedule[-1]))
    if per_layer and not copy:  # no rollout copy: the sampler makes the per-layer one
        decode.append(Term("per-layer copy of the block weights (sampling.decode_params; "
                           "CPU and GPU)", layers, "mesh.tensor"))
    return weights + (decode if decode_only else max(prefill, decode, key=total_bytes))


# Per row and new token of the rollout, the engine's outputs: int32 token, float32
# log-prob, bool mask (`sampling.engine.EngineState`; replicated: a slot writes any row).
ENGINE_OUTPUT_BYTES = 4 + 4 + 1


def engine_pages(slots: int, shards: int, rows: int, prompt: int, new: int,
                 rows_per_prompt: int = 1):
    """The engine's `PagePlan` for E = `slots` on `shards` row shards, B = `rows` rows of
    `rows_per_prompt` rows a prompt, prompt bucket P and N = `new`, with the host's default
    prefix pages (`engine_host.default_prefix_pages`)."""
    from drubric_jax.sampling import engine, engine_host

    prompts = max(rows // max(rows_per_prompt, 1), 1)
    return engine.PagePlan(
        slots=slots, shards=shards, page_size=engine.PAGE_SIZE, max_new_tokens=new,
        max_prompt=prompt, prefix_pages=engine_host.default_prefix_pages(
            slots, shards, rows, prompts, prompt, engine.PAGE_SIZE))


def engine_terms(cfg: ModelConfig, mesh, slots: int, rows: int, prompt: int, new: int,
                 attention: str, block: int, constrained: bool, field: str,
                 budget: str, branch: Optional[str] = None, rows_per_prompt: int = 1,
                 backend: Optional[str] = None) -> list:
    """Transient terms per device of the rollout engine (`sampling.engine`), beyond the
    weights: its state, then the largest of one prompt's prefill, an insert (with the
    prompt's pages stored) and a decode step.

    The state is a paged KV cache (`models.paged`), made once in the decode form: a device
    holds its row shard's pool, 1 scratch page + E_l slots x `own` pages (a slot's suffix:
    N tokens and the prompt's partial last page) + the prefix pages lent to prompts
    (`engine_pages`: room for 2 ceil(E_l / K) + 1 prompts of P, K = `rows_per_prompt`),
    with the KV heads over "tensor"; the slots' logits float32 [E_l, V]; the rollout's
    [B, N] outputs (`ENGINE_OUTPUT_BYTES` a token) on every device. One prompt is
    prefilled at a time (its k and v [L, Hkv, Pp Ps, Dh], replicated over the row shards).
    A decode step on CPU (XLA) gathers each slot's table pages of one layer ([E_l, Hkv,
    Pt Ps, Dh] k and v, and float32 scores); JAX's Pallas kernels (GPU, TPU) read the
    pages in place.

    Args:
        slots: E.  rows: B, rows of the rollout.  prompt: P_max, the longest prompt's
            bucket.  new: N.  rows_per_prompt: K, rows that share a prompt.
        constrained: a constraint's packed bitmask int32 [E, ceil(V / 32)] is an argument
            of each step (`engine.sample_step`).
        field / budget: what shrinks the slot-sized / the prompt-sized terms.
        branch: "prefill" | "insert" | "decode": the state and that program's terms only
            (None: the largest).
        backend: "cpu" | "gpu" | "tpu" (None: JAX's default): whether a step gathers pages.

    Raises:
        ValueError: an unknown branch.
    """
    local, tensor = rows_per_device(slots, mesh), mesh.shape["tensor"]
    plan = engine_pages(slots, row_shards(mesh), rows, prompt, new, rows_per_prompt)
    heads = cfg.num_kv_heads
    heads = heads // tensor if heads % tensor == 0 else heads
    token_bytes = 2 * cfg.num_layers * heads * cfg.head_dim * cfg.compute_dtype.itemsize
    ps = plan.page_size
    state = [Term(f"engine paged KV cache (a shard's {plan.pages_per_shard} pages of {ps}: "
                  f"{local} of {slots} slots x {plan.own} own + {plan.prefix_pages} prefix "
                  f"pages for {plan.prefix_pages // plan.prompt_pages} prompts of {prompt}, "
                  f"K = {rows_per_prompt})", plan.pages_per_shard * ps * token_bytes, field),
             Term(f"engine slots' next-token logits (float32 [{local}, V])",
                  local * cfg.vocab_size * 4, field),
             Term(f"engine outputs ([{rows}, {new}] tokens, log-probs, mask; every device)",
                  rows * new * ENGINE_OUTPUT_BYTES,
                  "rows of the rollout (prompts x K); max_new_tokens")]
    # The store: k and v of one prompt, [L, Hkv, Pp Ps, Dh] (heads over "tensor"), logits.
    stored = plan.prompt_pages * ps
    store = Term(f"engine prompt store (k, v of 1 prompt x {stored} positions)",
                 stored * token_bytes + cfg.vocab_size * 4, budget)
    decode = [store, logits_term(cfg, local, SAMPLING_LOGITS, field, tensor)]
    if (backend or jax.default_backend()) == "cpu":
        # XLA's paged attention (`paged._attend_xla`): one layer's table pages gathered (k
        # and v; the scores fuse into the products: the compiled step's temporaries grow
        # by one layer's k and v a slot and position, 2-layer Qwen3-8B, 8 fake devices).
        span = plan.table_pages * ps
        decode.append(Term(f"paged attention gather (one layer: k, v of {local} slots x "
                           f"{span} positions)",
                           local * span * token_bytes // cfg.num_layers, field))
    if constrained:
        decode.append(Term(f"constraint bitmask (int32 [{local}, ceil(V / 32)])",
                           local * -(-cfg.vocab_size // 32) * 4, field))
    # `engine.prefill_prompt`: a fresh one-row cache of P slots, then the store. Counted
    # with the forward widths of the many-row passes: an upper bound.
    prefill = [dataclasses.replace(store, name="engine prefill's KV cache (1 prompt)"), store,
               *forward_terms(cfg, 1, prompt, prompt, attention, block, budget,
                              PREFILL_ATTENTION, tensor)]
    # `engine.store_prefix`: the store's pages cast and laid out for the pool's scatter.
    insert = [store, Term(f"engine prefix store (the prompt's {plan.prompt_pages} pages, "
                          "laid out for the pool)", stored * token_bytes, budget)]
    branches = {"prefill": prefill, "insert": insert, "decode": decode}
    if branch is not None and branch not in branches:
        raise ValueError(f"branch must be one of {sorted(branches)} or None, got {branch!r}")
    return state + (branches[branch] if branch else max(branches.values(), key=total_bytes))


def engine_sampling_terms(models_: RoleModels, role: str, mesh, slots: int, rows: int,
                          prompt: int, new: int, attention: str, block: int,
                          constrained: bool, backend: Optional[str] = None,
                          rows_per_prompt: int = 1) -> list:
    """`sampling_terms` for a role whose `sampler` is "engine": the rollout copy of the
    weights (its per-layer form on CPU and GPU, or the sampler's per-layer copy where no
    rollout copy is made) and `engine_terms`."""
    cfg = models_.base[models_.sources[role]]
    per_layer = models.decode_per_layer(cfg, backend)
    copy, layers = rollout_copy_bytes(models_.sampling_shapes(role), cfg, mesh, per_layer)
    form = ", per-layer blocks" if per_layer else ""
    weights = ([Term(f"rollout copy of the weights (decode layout, compute dtype{form})", copy,
                     "mesh.tensor (splits the copy)")] if copy else [])
    if per_layer and not copy:
        weights.append(Term("per-layer copy of the block weights (sampling.decode_params; "
                            "CPU and GPU)", layers, "mesh.tensor"))
    field = f"config.{role}.rollout_micro_batch (engine slots); config.{role}.max_new_tokens"
    budget = ("config.generator.input_budget" if role == "generator"
              else "config.policy.max_prompt_tokens")
    return weights + engine_terms(cfg, mesh, slots, rows, prompt, new, attention, block,
                                  constrained, field, budget, rows_per_prompt=rows_per_prompt,
                                  backend=backend)


def verification_terms(models_: RoleModels, mesh, rows: int, prefix: int, suffix: int,
                       items: int, attention: str, block: int,
                       backend: Optional[str] = None) -> list:
    """Transient terms per device of one verifier chunk (`evaluator.passes`): the prefill of
    R = `rows` prefixes (split over data x fsdp) into P + Ts slots, then a suffix pass of
    Mc = `items` items on the repeated rows, on the frozen base (layers gathered as it runs)."""
    cfg = models_.base[models_.sources["verifier"]]
    local, slots = rows_per_device(rows, mesh), prefix + suffix
    field = "config.verifier.max_prefix_tokens; evaluator.budgets.PassBudgets"
    cache = Term(f"verifier KV cache ({local} of {rows} rows x {slots} slots)",
                 kv_cache_bytes(cfg, local, slots), field)
    # Its rows pinned to their devices (`parallel.constrain_rows`), a pass gathers the
    # fsdp-split layers and the output head (the P(yes) logits).
    head = cfg.dim * cfg.vocab_size * cfg.compute_dtype.itemsize
    layers = models_.base_shapes(models_.sources["verifier"])["layers"]
    if cfg.num_experts:
        # A mixture of experts' layer is gathered in two parts: the gate and up experts for
        # the first products, then the down experts into the memory those products freed
        # (the buffer assignment of the compiled prefill, 2-layer Qwen3-30B-A3B, fsdp = 8).
        layers = {k: v for k, v in layers.items() if k != "we_down"}
    gathered = weights_in_use(cfg, layers, head, mesh, backend)
    # The prefill only fills the cache: it computes no logits, so it gathers no head.
    prefill = [cache, *forward_terms(cfg, local, prefix, prefix, attention, block, field,
                                     PREFILL_ATTENTION), *weights_in_use(cfg, layers, 0, mesh,
                                                                          backend)]
    score = [cache, Term(f"repeated cache ({local * items} rows)",
                         kv_cache_bytes(cfg, local * items, slots), field),
             *forward_terms(cfg, local * items, suffix, slots, attention, block, field),
             logits_term(cfg, local * items, 1, field), *gathered]
    return max(prefill, score, key=total_bytes)

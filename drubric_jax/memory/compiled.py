"""Compiled memory of the jitted functions of a round: the planner's measured column.

Each function here lowers and compiles one real jitted function of the package
(`train_step.make_sharded_train_step`, `sampling.prefill` / `decode_loop` /
`constrained` sample / forward steps, the rollout engine's prefill / insert / decode
programs, `evaluator.passes.prefill` / `score_suffixes`) on
`jax.ShapeDtypeStruct` inputs that carry their shardings (nothing is allocated), and reads XLA's
`memory_analysis()`: bytes per device of the arguments, outputs, donated outputs (alias)
and temporaries. A function's "extra" bytes are what it needs beyond its arguments
(temp + output - alias); the planner adds them to the resident state.

Run it where the devices are the ones planned for: `XLA_FLAGS=
--xla_force_host_platform_device_count=N` set before jax is imported gives N fake CPU
devices (`experiments/plan.py` does this). On CPU, XLA computes bfloat16 matmuls in
float32 and makes float32 copies of their bfloat16 operands (weights included), so a
bfloat16 model's CPU figure is an upper bound of what a GPU or TPU needs; float32 models
compile without those copies. Depth: `scaled` compiles the model at two depths (same
widths and lengths) and extrapolates linearly to the real number of layers (every
per-layer buffer is linear in L: stacked weights, remat residuals, caches).

Axis legend (docs/CONVENTIONS.md): R rows, P prompt bucket, N new tokens, S cache slots,
V vocab, L layers; here also Mc items per verifier pass, Ts suffix tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax.sampling import constrained as constrained_lib
from drubric_jax import models, sampling, parallel
from drubric_jax.rl import train_step as ts
from drubric_jax.evaluator import passes
from drubric_jax.models import lora
from drubric_jax.models.config import ModelConfig
from drubric_jax.rl.train_config import TrainConfig

from drubric_jax.memory.compiled_base import (Compiled, _NoCopy, _row_structs,  # noqa: F401
                                              _structs, analyse, device_bytes,
                                              rollout_copy)
from drubric_jax.memory.compiled_engine import engine_peaks

SCALE_DEPTHS = (2, 4)  # depths compiled by `scaled` (a scan of length 1 is special-cased)


def param_structs(cfg: ModelConfig, mesh, trainable: bool = False):
    """Sharded structs of the base params of `cfg` (its storage dtype), or with
    `trainable` of what a trainee of `cfg` trains (`train_step.trainable_init`)."""
    make = (lambda: ts.trainable_init(cfg)) if trainable else (
        lambda: models.init_params(cfg, jax.random.PRNGKey(0)))
    shapes = jax.eval_shape(make)
    return _structs(shapes, models.param_shardings(shapes, mesh))


def sampler_params(trainee_cfg: ModelConfig, base_cfg: ModelConfig, mesh):
    """Structs of the params a trainee samples with (`roles.Trainee.params`)."""
    trained = param_structs(trainee_cfg, mesh, trainable=True)
    if trainee_cfg.lora_rank:
        return lora.attach(param_structs(base_cfg, mesh), trained)
    return trained


def train_step(trainee_cfg: ModelConfig, base_cfg: ModelConfig, train_cfg: TrainConfig, mesh,
               rows: int, prompt: int, new: int, group: int = 0) -> Compiled:
    """The sharded GRPO step on R = `rows` rows of T = prompt + new tokens (`group` > 0 and
    `train_cfg.shared_prefix`: in groups of that many rows, `lower_train_step`)."""
    return analyse(lower_train_step(trainee_cfg, base_cfg, train_cfg, mesh, rows, prompt, new,
                                    group))


def lower_train_step(trainee_cfg: ModelConfig, base_cfg: ModelConfig, train_cfg: TrainConfig,
                     mesh, rows: int, prompt: int, new: int, group: int = 0):
    """The `jax.stages.Lowered` sharded GRPO step of `train_step` (its HLO for tests).

    The batch is the per-row `train_step.Batch` of R = `rows` rows [prompt | completion],
    or with `group` = R' > 0 and `train_cfg.shared_prefix` the `train_step.GroupBatch` of
    rows / R' groups, each one prefix of P = `prompt` tokens and R' completions of
    N = `new` (Gn a multiple of the row shards, as `rounds.phases.train_batch` pads it).
    """
    # The step a run uses (memoised), lowered on structs.
    optimizer, step = ts.make_sharded_train_step(trainee_cfg, train_cfg, mesh)
    shapes = jax.eval_shape(lambda: ts.init_train_state(ts.trainable_init(trainee_cfg),
                                                        optimizer))
    state = _structs(shapes, models.param_shardings(shapes, mesh))
    # Batch rows over (data, fsdp), as the sharded step takes them; structs only: the step is
    # lowered and compiled, never run.
    rows_sh = parallel.batch_sharding(mesh)
    t = prompt + new

    def arr(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=rows_sh)

    if group and train_cfg.shared_prefix:
        gn = rows // group
        batch = ts.GroupBatch(
            prefix_tokens=arr((gn, prompt), jnp.int32), prefix_mask=arr((gn, prompt), bool),
            tokens=arr((gn, group, new), jnp.int32), mask=arr((gn, group, new), bool),
            old_logprobs=arr((gn, group, new), jnp.float32),
            advantages=arr((gn, group), jnp.float32), truncated=arr((gn, group), bool),
            live=arr((gn,), bool))
    else:
        batch = ts.Batch(tokens=arr((rows, t), jnp.int32), token_mask=arr((rows, t), bool),
                         loss_mask=arr((rows, t), bool),
                         old_logprobs=arr((rows, t), jnp.float32),
                         advantages=arr((rows,), jnp.float32), truncated=arr((rows,), bool),
                         live=arr((rows,), bool), prompt_len=prompt)
    return step.lower(state, batch, param_structs(base_cfg, mesh))


def sampling_peaks(cfg: ModelConfig, params, rows: int, prompt: int, new: int,
                   constrained: bool, mesh, segments: int = 0) -> tuple:
    """Bytes per device beyond `params` at each peak of `sampling.generate(..., mesh=mesh)` on
    R = `rows` prompts (padded to the row shards, as `generate` does) of bucket
    P = `prompt`, N = `new`, on the rollout copy of `params` (`models.rollout`): (the
    prefill, the decode loop or its segments) or, `constrained`, (the prefill, the cache
    unstacking, one constrained step on the last segment's chunks) beside the per-layer
    weights; each with the copy held. `segments`: the cache segments, as `generate` takes
    them (`sampling.cache_schedule`; 0 = auto)."""
    rows = parallel.row_shards(mesh) * -(-rows // parallel.row_shards(mesh))
    params, copy = rollout_copy(params, cfg, mesh)
    held = 0 if copy is None else copy.output
    tokens, mask = _row_structs(mesh, rows, ((prompt,), jnp.int32), ((prompt,), bool))
    # A key struct: nothing is drawn.
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    # The cache's segments as `generate` picks them (0: "auto" on this backend).
    per_layer = models.is_per_layer(params) or models.decode_per_layer(cfg)
    slots = sampling.cache_schedule(prompt, new, segments, per_layer)
    pre = analyse(sampling.prefill.lower(params, cfg, tokens, mask, key, new, mesh=mesh,
                                         num_slots=slots[0]))
    state = pre.outputs  # with the sharding the compiler picked for the cache
    stop = jax.ShapeDtypeStruct((1,), jnp.int32)
    method = sampling.Temperature(1.0)
    # The per-layer copy of the block weights `sampling.decode_params` makes (CPU and GPU),
    # unless the rollout copy was made in that form already (`models.rollout`).
    if models.is_per_layer(params) or not models.decode_per_layer(cfg):
        layers, loop_params = _NoCopy(), params
    else:
        layers = analyse(sampling.layer_copy.lower(params["layers"], cfg))
        loop_params = {**params, "layers": layers.outputs}
    if not constrained:
        if len(slots) == 1:
            dec = analyse(sampling.decode_loop.lower(loop_params, cfg, state, method, stop, 0))
        else:
            dec = analyse(sampling.decode_segments.lower(
                loop_params, cfg, state.replace(cache=None), state.cache, method, stop, 0,
                slots))
        # The decode loop's peak comes on top of the state the prefill returned.
        return held + pre.extra, held + layers.output + pre.output + dec.extra
    unstack = analyse(constrained_lib._decode_cache.lower(
        state.cache, per_layer=models.is_per_layer(loop_params)))
    # The host loop holds the state without its cache, plus the cache of the moment.
    base = held + layers.output + pre.output - device_bytes(state.cache)
    peaks = [held + pre.extra, base + device_bytes(state.cache) + unstack.extra]
    cache = unstack.outputs
    for s in slots[1:]:  # a chunk per segment (`models.add_chunk`, outside a program)
        cache = _with_chunk(cache, s)
    words, = _row_structs(mesh, rows, ((constrained_lib.bitmask_words(cfg.vocab_size),),
                                       jnp.int32))
    force, = _row_structs(mesh, rows, ((), bool))
    state = state.replace(cache=cache)
    sample = analyse(constrained_lib._sample.lower(state, words, force, method, stop, 0))
    new_state, tok, emitted, _ = sample.outputs  # and the all-rows-done flag
    step = analyse(constrained_lib._forward.lower(loop_params, cfg, new_state, tok, emitted))
    return (*peaks, base + device_bytes(cache) + max(sample.extra, step.extra))


def _with_chunk(cache, num_slots: int):
    """Structs of `models.add_chunk(cache, num_slots)` on per-layer cache structs: the new
    chunk laid out as the first."""
    extra = num_slots - cache.num_slots

    def add(x):
        chunks = x if isinstance(x, tuple) else (x,)
        f = chunks[0]
        return (*chunks, jax.ShapeDtypeStruct((*f.shape[:2], extra, f.shape[-1]), f.dtype,
                                              sharding=f.sharding))

    valid = jax.ShapeDtypeStruct((cache.valid.shape[0], num_slots), bool,
                                 sharding=cache.valid.sharding)
    return cache.replace(k=tuple(add(x) for x in cache.k), v=tuple(add(x) for x in cache.v),
                         valid=valid)


def verification_peaks(cfg: ModelConfig, params, rows: int, prefix: int, suffix: int,
                       items: int, mesh) -> tuple:
    """Bytes per device beyond `params` at each peak of one verifier chunk, its rows split
    over the row shards (`evaluator.placement`): (the prefill of R = `rows` prefixes (bucket
    `prefix`) into P + Ts slots, one suffix pass of Mc = `items` items)."""
    rows = parallel.row_shards(mesh) * -(-rows // parallel.row_shards(mesh))
    with parallel.rows_on(mesh):  # as `evaluator.chunked` runs them
        return _verification_peaks(cfg, params, rows, prefix, suffix, items, mesh)


def _verification_peaks(cfg, params, rows, prefix, suffix, items, mesh) -> tuple:
    tokens, mask = _row_structs(mesh, rows, ((prefix,), jnp.int32), ((prefix,), bool))
    pre = analyse(passes.prefill.lower(params, cfg, tokens, mask, prefix + suffix))
    cache, plen = pre.outputs
    ids = jax.ShapeDtypeStruct((1,), jnp.int32)
    suffixes, lengths = _row_structs(mesh, rows, ((items, suffix), jnp.int32),
                                     ((items,), jnp.int32))
    score = analyse(passes.score_suffixes.lower(params, cfg, cache, plen, suffixes, lengths,
                                                ids, ids))
    # The suffix pass runs on top of the cached prefixes it reads.
    return pre.extra, pre.output + score.extra


def scaled(measure: Callable[[int], tuple], num_layers: int) -> tuple[int, str]:
    """The largest of the peaks `measure(L)` returns, at the real depth: compiled there when
    L <= max(SCALE_DEPTHS), else each peak compiled at the two SCALE_DEPTHS and extrapolated
    linearly to L before the largest is taken (peaks grow at different rates in L).

    Returns:
        (bytes, how: "compiled" or "compiled at L=2, 4, scaled to L=36").
    """
    lo, hi = SCALE_DEPTHS
    if num_layers <= hi:
        return max(measure(num_layers)), "compiled"
    at_lo, at_hi = measure(lo), measure(hi)
    value = max(a + (b - a) * (num_layers - lo) / (hi - lo) for a, b in zip(at_lo, at_hi))
    return int(np.ceil(value)), f"compiled at L={lo}, {hi}, scaled to L={num_layers}"


def measure_plan(plan, models_, workload, mesh, only: tuple = ()) -> None:
    """Fills `compiled` and `compiled_how` of each step of `plan` (`planner.plan`) with the
    compiled figure of its jitted functions on `mesh` (a real mesh of the plan's devices).

    Args:
        plan: a `planner.Plan`; models_: its `planner_terms.RoleModels`; workload: its
            `planner_terms.Workload`.
        only: when given, just the steps whose name contains one of these words (e.g.
            ("update",)); the others keep `compiled` None.
    """
    w, memo = workload, {}

    def depth(cfg: ModelConfig, n: int) -> ModelConfig:
        return cfg.replace(num_layers=n)

    def base(role: str, n: int) -> ModelConfig:
        return depth(models_.base[models_.sources[role]], n)

    def measure(step):
        phase, rows = step.phase, step.rows
        if step.name == "policy sampling" or step.name == "rubric sampling":
            role = "policy" if step.name == "policy sampling" else "generator"
            prompt, new = ((w.policy_prompt, w.policy_new) if role == "policy"
                           else (w.rubric_prompt, w.rubric_new))
            segments = w.policy_segments if role == "policy" else w.rubric_segments
            if (w.policy_sampler if role == "policy" else w.rubric_sampler) == "engine":
                of_rows = step.of_rows
                share = w.shared_rows(role, phase)
                return (step.name, rows, of_rows, share), lambda n: engine_peaks(
                    base(role, n), sampler_params(depth(models_.trainee[role], n),
                                                  base(role, n), mesh),
                    rows, of_rows, prompt, new, role == "generator", mesh, share)
            return (step.name, rows), lambda n: sampling_peaks(
                base(role, n), sampler_params(depth(models_.trainee[role], n), base(role, n),
                                              mesh), rows, prompt, new, role == "generator",
                mesh, segments)
        if step.name == "verification":
            return (step.name,), lambda n: verification_peaks(
                base("verifier", n), param_structs(base("verifier", n), mesh),
                w.verifier_rows, w.verifier_prefix, w.verifier_suffix, w.verifier_items, mesh)
        prompt, new = ((w.rubric_prompt, w.rubric_new) if phase == "generator"
                       else (w.policy_prompt, w.policy_new))
        # Compiled at the update micro-batch the plan chose for this step, on its rows (a
        # grouped update's padded to the row shards, `terms.group_layout`).
        tc = dataclasses.replace(models_.train[phase], micro_batch_size=rows)
        return (step.name, rows, step.group), lambda n: (train_step(
            depth(models_.trainee[phase], n), base(phase, n), tc, mesh, step.of_rows, prompt,
            new, step.group).extra,)

    # The compiled code runs the attention `ModelConfig.attention` picks: "auto" goes
    # blockwise for long rows and materialized (dense) for short ones, as the plan does.
    chosen = getattr(models_.base[models_.sources["policy"]], "attention", "auto")
    code = {"materialized": "dense", "blockwise": "blockwise", "cudnn": "blockwise",
            "auto": "auto"}.get(chosen, "dense")
    for step in plan.steps:
        if only and not any(word in step.name for word in only):
            continue
        key, fn = measure(step)
        # Equal shapes (the same call in both phases) are compiled once.
        if key not in memo:
            memo[key] = scaled(fn, models_.base[models_.sources["policy"]].num_layers)
        step.compiled, how = memo[key]
        step.compiled_how = how if code == plan.attention else f"{how}; {code} attention"


"""The phases of `experiments/device_check.py`: `PHASES[name](ctx)` runs in a process of
its own (`--phase=name`) and reports its rows through `ctx.row` (`device_measure.Context`).

Each phase drives the library's own jitted functions as a run calls them (the sampler's
`decode_loop` and `prefill`, `constrained.decode` with the rubric generator's constraint,
`evaluator.passes.prefill`, a LoRA trainee's sharded train step); what a figure means and
how it is counted is in device_check's docstring.
"""
from __future__ import annotations

import time

import numpy as np

from drubric_jax.memory.costs import causal_pairs, forward_flops, kv_bytes, weight_bytes
from experiments.bench_common import median_seconds, timed
from experiments.device_engine import engine, paged
from experiments.device_measure import (Context, decode_state, first_and_steady, flops_row,
                                        load_tokenizer, planned_gb, with_plan)

BLOCK = 512  # the planner's blockwise key tile (`ModelConfig.attention_block_kv`)


def copy_probe(ctx: Context) -> dict:
    """Measured memory (HBM) bandwidth: median of 10 calls of y = 2 x over `copy_bytes` of bfloat16
    (each call reads and writes them once)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((ctx.shapes.copy_bytes // 2,), jnp.bfloat16)
    double = jax.jit(lambda v: v * 2)
    seconds = median_seconds(double, x, reps=10)  # after one untimed call
    ctx.copy_tbps = 2 * x.nbytes / seconds / 1e12
    return {"steady_s": seconds, "gb_per_s": ctx.copy_tbps * 1e3, "util_kind": "HBM",
            "util": ctx.copy_tbps / ctx.peak_tbps if ctx.peak_tbps else None}


def decode(ctx: Context) -> None:
    """`sampling.decode_loop` (Temperature 1, no stop id ever sampled) from a cache with
    `decode_context` filled slots, `decode_steps` steps, at each of `decode_batches`."""
    import jax.numpy as jnp

    from drubric_jax import sampling
    from drubric_jax.memory.inference_terms import sampling_terms

    s, cfg = ctx.shapes, ctx.model(ctx.shapes.dense)
    ctx.copy_tbps = None
    ctx.row(f"memory copy probe ({2 * s.copy_bytes / 1e9:.2f} GB moved)", lambda: copy_probe(ctx))
    params = ctx.init_params(cfg)
    loop_params = sampling.decode_params(params, cfg)  # a per-layer copy on CPU only
    p, n, stop = s.decode_context, s.decode_steps, jnp.asarray([-1], jnp.int32)

    def one(b):
        c, t, out = first_and_steady(
            lambda: (decode_state(cfg, b, p, n),),
            lambda st: sampling.decode_loop(loop_params, cfg, st, sampling.Temperature(1.0),
                                            stop, 0),
            warm_args=lambda: (decode_state(cfg, b, p, n, done=True),))
        steps = int(out.step)
        del out
        per = t / steps
        # The attention reads all P + N slots every step (the unwritten ones masked); until
        # 2026-12-05 this counted p + (steps + 1) / 2, which at N = 64 was 3% fewer slots.
        kv = kv_bytes(cfg, b, p + n)
        need = weight_bytes(cfg) + kv
        row = {"compile_s": c, "steady_s": t, "steps": steps, "ms_per_step": per * 1e3,
               "tokens_per_s": b / per, "gb_per_step": need / 1e9, "util_kind": "HBM",
               "util": need / (ctx.peak_tbps * 1e12) / per if ctx.peak_tbps else None,
               "util_vs_copy": need / (ctx.copy_tbps * 1e12) / per if ctx.copy_tbps else None,
               "note": f"reads >= {need / 1e9:.2f} GB/step (weights "
                       f"{weight_bytes(cfg) / 1e9:.2f} + KV {kv / 1e9:.2f}); "
                       f"{need / per / 1e9:.0f} GB/s"}
        # The planner's decode terms: a 1-token prompt into the same P + N slots.
        return with_plan(row, planned_gb(cfg, lambda rm: sampling_terms(
            rm, "policy", ctx.mesh, b, 1, p + n - 1, "auto", BLOCK, False)))

    for b in s.decode_batches:
        ctx.row(f"decode B={b} (P={p}, N={n})", lambda b=b: one(b))


def decode_segments(ctx: Context) -> None:
    """The KV cache in segments against one cache: `sampling.decode_segments` with the
    schedule of 4 segments and `sampling.decode_loop` over all P + N slots, each from
    `decode_context` filled slots for `segments_steps` steps at `segments_batch` rows
    (Temperature 1, no stop id ever sampled)."""
    import jax.numpy as jnp

    from drubric_jax import sampling
    from drubric_jax.memory.inference_terms import sampling_terms

    s, cfg = ctx.shapes, ctx.model(ctx.shapes.dense)
    params = ctx.init_params(cfg)
    loop_params = sampling.decode_params(params, cfg)
    b, p, n, stop = s.segments_batch, s.decode_context, s.segments_steps, jnp.asarray([-1],
                                                                                  jnp.int32)
    method = sampling.Temperature(1.0)

    def one(segments):
        slots = sampling.cache_schedule(p, n, segments)

        def run(st):
            if len(slots) == 1:
                return sampling.decode_loop(loop_params, cfg, st, method, stop, 0)
            return sampling.decode_segments(loop_params, cfg, st.replace(cache=None), st.cache,
                                            method, stop, 0, slots)

        c, t, out = first_and_steady(
            lambda: (decode_state(cfg, b, p, n, slots=slots[0]),), run,
            warm_args=lambda: (decode_state(cfg, b, p, n, done=True, slots=slots[0]),))
        steps = int(out.step)
        del out
        per = t / steps
        read = sampling.mean_slots_read(slots, p, n)  # slots a step reads, on average
        need = weight_bytes(cfg) + kv_bytes(cfg, b, read)
        row = {"compile_s": c, "steady_s": t, "steps": steps, "ms_per_step": per * 1e3,
               "tokens_per_s": b / per, "gb_per_step": need / 1e9, "util_kind": "HBM",
               "util": need / (ctx.peak_tbps * 1e12) / per if ctx.peak_tbps else None,
               "note": f"cache slots {slots}; reads >= {need / 1e9:.2f} GB/step on average "
                       f"({read:.0f} slots)"}
        return with_plan(row, planned_gb(cfg, lambda rm: sampling_terms(
            rm, "policy", ctx.mesh, b, p, n, "auto", BLOCK, False, segments=segments,
            decode_only=True)))

    for m in (1, 4):
        ctx.row(f"decode B={b} (P={p}, N={n}), {m} cache segment{'s' if m > 1 else ''}",
                lambda m=m: one(m))


def prefill(ctx: Context) -> None:
    """`sampling.prefill` of one prompt of each of `prefill_lengths` tokens into a cache of
    P + `prefill_new` slots (what a sampler call's prefill runs)."""
    import jax
    import jax.numpy as jnp

    from drubric_jax import sampling
    from drubric_jax.memory.inference_terms import verification_terms

    s, cfg = ctx.shapes, ctx.model(ctx.shapes.dense)
    params = ctx.init_params(cfg)
    key, n = jax.random.PRNGKey(2), s.prefill_new

    def one(p):
        tokens, mask = jnp.asarray(ctx.ids(1, p, vocab=cfg.vocab_size)), jnp.ones((1, p), bool)
        c, t, out = first_and_steady(
            lambda: (tokens, mask), lambda x, m: sampling.prefill(params, cfg, x, m, key, n))
        del out
        row = flops_row(ctx, c, t, p, forward_flops(cfg, p, causal_pairs(p), 1))
        # The planner's prefill terms (a verifier prefill of the same rows and slots, no items).
        return with_plan(row, planned_gb(cfg, lambda rm: verification_terms(
            rm, ctx.mesh, 1, p, n, 0, "auto", BLOCK)))

    for p in s.prefill_lengths:
        ctx.row(f"prefill 1 x {p} (cache {p} + {n})", lambda p=p: one(p))


def moe_verifier(ctx: Context) -> None:
    """`evaluator.passes.prefill` of one prefix of each of `moe_lengths` tokens on the
    mixture-of-experts verifier cut to `moe_layers` layers, under each expert dispatch
    (`ModelConfig.moe_dispatch`)."""
    import jax.numpy as jnp

    from drubric_jax.evaluator import passes
    from drubric_jax.models.config import PRESETS
    from drubric_jax.memory.inference_terms import verification_terms

    s = ctx.shapes
    cfg = ctx.model(s.moe, num_layers=s.moe_layers)
    full = PRESETS[s.moe].num_layers
    params = ctx.init_params(cfg)

    def one(p, cfg):
        tokens, mask = jnp.asarray(ctx.ids(1, p, vocab=cfg.vocab_size)), jnp.ones((1, p), bool)
        c, t, out = first_and_steady(
            lambda: (tokens, mask), lambda x, m: passes.prefill(params, cfg, x, m, num_slots=p))
        del out
        row = flops_row(ctx, c, t, p, forward_flops(cfg, p, causal_pairs(p), 0))
        row["note"] += (f"; {cfg.num_layers} of {full} layers, {t / cfg.num_layers * 1e3:.1f} "
                       f"ms/layer: ~{t * full / cfg.num_layers:.2f} s for all {full}")
        return with_plan(row, planned_gb(cfg, lambda rm: verification_terms(
            rm, ctx.mesh, 1, p, 0, 0, "auto", BLOCK)))

    # The default capacity-bounded dispatch, then `ragged_dot` (a dense masked product on
    # GPU) for comparison.
    for dispatch in ("capacity", "ragged"):
        for p in s.moe_lengths:
            ctx.row(f"MoE verifier prefill 1 x {p} ({cfg.num_layers} layers, {dispatch})",
                    lambda p=p, c=cfg.replace(moe_dispatch=dispatch): one(p, c))


class HostTimer:
    """A constraint (the `constrained.decode` contract) that adds up the host seconds of
    the wrapped one's calls, by method."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, {}

    def _timed(self, name, *args):
        out, seconds = timed(getattr(self.inner, name), *args)
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        return out

    def reset(self, batch):
        self.seconds = {}
        return self._timed("reset", batch)

    def fill(self, bitmask, rows):
        return self._timed("fill", bitmask, rows)

    def finished(self):
        return self._timed("finished")

    def advance(self, tokens, live):
        return self._timed("advance", tokens, live)


def constrained(ctx: Context) -> None:
    """`constrained.decode` under the rubric generator's JSON-schema constraint
    (llguidance, `RubricGenerator.constraint` at configs/qwen3_8b.py's max_items and
    max_item_chars) for `constrained_steps` steps of `constrained_batch` rows, on the dense
    model with its vocabulary cut to the SmolLM2 tokenizer's (49152: no Qwen tokenizer
    without the hub)."""
    import jax.numpy as jnp

    from configs import qwen3_8b
    from drubric_jax.sampling import constrained as constrained_lib
    from drubric_jax import sampling
    from drubric_jax.memory.inference_terms import sampling_terms
    from drubric_jax.evaluator.rubric_generator import RubricGenerator

    s = ctx.shapes
    tok = load_tokenizer(ctx.tokenizer_dir)
    cfg = ctx.model(s.dense, vocab_size=len(tok))
    g = qwen3_8b.get_config().generator
    b, p, n = s.constrained_batch, s.decode_context, s.constrained_steps
    t0 = time.perf_counter()
    gen = RubricGenerator(cfg, tok, max_items=g.max_items, max_item_chars=g.max_item_chars,
                          max_new_tokens=n)
    setup_s = time.perf_counter() - t0
    timer = HostTimer(gen.constraint)
    params = ctx.init_params(cfg)
    stop, pad = jnp.asarray(gen.stop_ids), int(gen.stop_ids[0])

    def one():
        c, t, out = first_and_steady(
            lambda: (decode_state(cfg, b, p, n),),
            lambda st: constrained_lib.decode(params, cfg, st, timer, sampling.Temperature(1.0),
                                              stop, pad))
        # (No warm state with every row done here: the steps after the first one take the
        # state the jitted halves return, which the first call must have compiled for too.)
        steps, made = int(out.step), int(np.asarray(out.mask).sum())
        done = int(np.asarray(out.done).sum())
        del out
        host = {k: v / steps * 1e3 for k, v in timer.seconds.items() if k != "reset"}
        errors = sum(1 for e in gen.constraint.errors() if e)
        row = {"compile_s": c, "steady_s": t, "steps": steps, "ms_per_step": t / steps * 1e3,
               "tokens_per_s": made / t, "host_ms_per_step": sum(host.values()),
               "host_ms_by_call": host, "reset_ms": timer.seconds.get("reset", 0.0) * 1e3,
               "grammar_setup_s": setup_s, "rows_done": done, "grammar_errors": errors,
               "note": f"host {sum(host.values()):.2f} of {t / steps * 1e3:.2f} ms/step ("
                       + ", ".join(f"{k} {v:.2f}" for k, v in host.items())
                       + f"); {done}/{b} rows done; {errors} grammar errors"}
        return with_plan(row, planned_gb(cfg, lambda rm: sampling_terms(
            rm, "policy", ctx.mesh, b, 1, p + n - 1, "auto", BLOCK, True)))

    ctx.row(f"constrained B={b} (P={p}, N={n}, V={cfg.vocab_size})", one)


def train(ctx: Context) -> None:
    """One LoRA GRPO step (`roles.make_trainee`'s sharded train step, configs/qwen3_8b.py:
    lora at rank `lora_rank`) on one row of `train_prompt` + `train_new` tokens, after a
    row with the bytes of the frozen base, the adapters and their AdamW state."""
    import jax

    from configs import qwen3_8b
    from drubric_jax import models
    from drubric_jax.rl import train_step as ts
    from drubric_jax.memory.terms import RoleModels, tree_bytes
    from drubric_jax.memory.train_terms import train_terms
    from drubric_jax.rounds.roles import LoadedModel, make_trainee
    from drubric_jax.types import Role

    s = ctx.shapes
    c = qwen3_8b.get_config(f"lora={s.lora_rank}")
    c.model.verifier = c.model.policy  # not loaded here; keeps the 30B source out of the plan
    if ctx.tiny:
        c.model.policy = c.model.generator = c.model.verifier = s.dense
    c.policy.prompts_per_step, c.policy.num_responses = 1, 1
    c.policy.max_prompt_tokens, c.policy.max_new_tokens = s.train_prompt, s.train_new
    c.policy.train.micro_batch_size = 1
    rm = RoleModels.from_config(c)
    src = rm.sources["policy"]
    cfg, tcfg, tc = rm.base[src], rm.trainee["policy"], rm.train["policy"]
    base = jax.block_until_ready(jax.jit(
        lambda k: models.init_params(cfg, k),
        out_shardings=models.param_shardings(rm.base_shapes(src), ctx.mesh))(
            jax.random.PRNGKey(0)))
    trainee = make_trainee(Role.POLICY, LoadedModel(src, cfg, base, None), tcfg, tc, ctx.mesh)
    trained = rm.trained_shapes("policy")
    resident = {"base": tree_bytes(rm.base_shapes(src)), "adapters": tree_bytes(trained),
                "optimizer": tree_bytes(jax.eval_shape(rm.optimizer("policy").init, trained))}

    def nbytes(tree):
        return sum(x.nbytes for x in jax.tree.leaves(tree))

    def layout():
        have = {"base": nbytes(base), "adapters": nbytes(trainee.state.params),
                "optimizer": nbytes(trainee.state.opt_state)}
        a = trainee.state.params["layers"]
        dtypes = sorted({str(x.dtype) for x in jax.tree.leaves(trainee.state.opt_state)
                         if x.ndim})
        in_use = ctx.memory_stats().get("bytes_in_use")
        return {**{f"{k}_gb": v / 1e9 for k, v in have.items()},
                **{f"planned_{k}_gb": v / 1e9 for k, v in resident.items()},
                "planned_gb": sum(resident.values()) / 1e9,
                "in_use_gb": None if in_use is None else in_use / 1e9,
                "note": f"base {have['base'] / 1e9:.2f} GB {cfg.dtype}; adapters "
                        f"{have['adapters'] / 1e9:.3f} GB {tcfg.param_dtype} ({len(a)} leaves, "
                        f"wq A {list(a['wq_lora_a'].shape)} B {list(a['wq_lora_b'].shape)}); "
                        f"AdamW {have['optimizer'] / 1e9:.3f} GB {'/'.join(dtypes)}"}

    ctx.row(f"LoRA layout (r={tcfg.lora_rank}, {len(tcfg.lora_targets)} matrices)", layout)
    p, n = s.train_prompt, s.train_new
    t_len, rng = p + n, np.random.default_rng(0)
    batch = ts.Batch(
        tokens=ctx.ids(1, t_len, vocab=cfg.vocab_size), token_mask=np.ones((1, t_len), bool),
        loss_mask=np.arange(t_len)[None] >= p,
        old_logprobs=np.full((1, t_len), -np.log(cfg.vocab_size), np.float32),
        advantages=rng.standard_normal(1).astype(np.float32), truncated=np.zeros(1, bool),
        live=np.ones(1, bool), prompt_len=p)
    state = {"now": trainee.state}

    def step():
        state["now"], metrics = trainee.step_fn(state["now"], batch, base)
        return metrics

    def one():
        c_s, t, metrics = first_and_steady(lambda: (), step)
        ts.check_finite(metrics, 1)
        adapters = sum(x.size for x in jax.tree.leaves(state["now"].params))
        mm = forward_flops(cfg, t_len, 0, 0)                  # matmuls of one forward
        ad = 2.0 * adapters * t_len                           # adapter matmuls of one
        att = forward_flops(cfg, 0, causal_pairs(t_len), 0)   # attention of one
        head = forward_flops(cfg, 0, 0, n)                    # output head (scored tokens)
        # Reference forward (beta > 0) + trainee forward + backward (activation gradients:
        # 1x the matmuls, adapters and head, 2x attention; adapter weight gradients: 1x).
        flops = (mm + att + head if tc.beta > 0 else 0) + (mm + ad + att + head) \
            + (mm + 2 * ad + 2 * att + head)
        row = flops_row(ctx, c_s, t, t_len, flops)
        planned = sum(resident.values()) + sum(x.bytes for x in train_terms(
            rm, "policy", ctx.mesh, 1, 1, p, n, "auto", BLOCK))
        return {**row, "planned_gb": planned / 1e9}

    ctx.row(f"GRPO LoRA step 1 x {t_len} (P={p}, N={n})", one)


PHASES = {"decode": decode, "decode_segments": decode_segments, "prefill": prefill,
          "train": train, "constrained": constrained, "moe_verifier": moe_verifier,
          "engine": engine, "paged": paged}

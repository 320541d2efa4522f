r"""One round of device steps at Qwen3-8B shapes on one accelerator: time, MFU, memory.

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m experiments.device_check   # one H200
    python -m experiments.device_check --only=policy_update,generator_update  # some steps
    python -m experiments.device_check --tiny                                # CPU, ~1 min

Random weights (nothing is downloaded) in bfloat16 with Qwen3-8B shapes, LoRA rank 64
trainees over one shared frozen base (`configs/qwen3_8b.py:lora`), and random token ids
(no tokenizer): the script drives the sampler, the verifier passes and the train step
directly with token arrays, at a small batch:
    policy sampling    8 prompts x K = 8 of 1024 tokens, 1024 new (`sampling.generate`)
    rubric sampling    G = 8 lists of one 8192-token generator prompt, 1024 new (the
                       unconstrained decode loop: without a tokenizer there is no JSON
                       constraint)
    verification       64 prefixes of 2048 tokens, 20 items each (`verifier_passes`)
    generator update   one GRPO step on the 8 lists (T = 8192 + 1024)
    policy update      one GRPO step on the 64 responses (T = 1024 + 1024)
Rows per sampler call and per gradient pass are the memory planner's picks for this
device (`drubric_jax.memory.planner`, dense attention: what the code has). Each function is
compiled before it is timed (a warm-up call; the sampler's warm-up stops every row after
one token, the train steps are compiled ahead of time), so the times are steady state.

Prints one table: per step, seconds, tokens/s (sampling: new tokens; verification and
updates: tokens processed), model TFLOP/s and MFU against the device's dense bfloat16
peak (`PEAK_TFLOPS`; forward FLOPs = 2 x matmul params x tokens + attention 4 x L x H x Dh
x attended keys, causal; an update = trainee forward + backward (3 x forward in full
fine-tuning, 2 x with LoRA: no weight gradients of frozen matrices) + 1 reference
forward; rematerialisation is not counted), the peak device memory so far
(`memory_stats()`, monotone) and the planner's predicted peak for that step.
"""
import dataclasses
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")

from absl import app, flags  # noqa: E402

_TINY = flags.DEFINE_bool("tiny", False, "A tiny Qwen3-shaped model at CPU-size lengths.")
STEPS = ("policy_sampling", "rubric_sampling", "verification", "generator_update",
         "policy_update")
_ONLY = flags.DEFINE_list("only", list(STEPS), f"Steps to run, of {', '.join(STEPS)}.")
_MEMORY = flags.DEFINE_float("device_memory_gb", None, "Memory per device for the planner "
                             "(default: the device's memory_stats bytes_limit).")

# Dense bfloat16 peak TFLOP/s per device, by a substring of `device_kind` (vendor sheets).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "B200": 2250.0,
               "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v5p": 459.0, "TPU v5": 459.0,
               "TPU v4": 275.0, "TPU v6": 918.0}


def check_config(tiny: bool):
    """The qwen3_8b:lora config at the check's small batch (or its tiny CPU version)."""
    from configs import qwen3_8b

    c = qwen3_8b.get_config("lora")
    # The verifier at Qwen3-8B shapes too, sharing the frozen base (the FLOP count below is
    # a dense model's; the 61 GB Qwen3-30B-A3B verifier is planned, not timed, here).
    c.model.verifier = c.model.policy
    c.policy.prompts_per_step, c.policy.num_responses = 8, 8
    c.policy.max_prompt_tokens = c.policy.max_new_tokens = 1024
    c.generator.anchors_per_step, c.generator.num_lists = 1, 8
    c.generator.input_budget, c.generator.max_new_tokens = 8192, 1024
    c.verifier.max_prefix_tokens, c.verifier.max_suffix_tokens = 2048, 32
    c.policy.train.micro_batch_size = c.generator.train.micro_batch_size = 0
    if tiny:
        c.model.policy = c.model.generator = c.model.verifier = "tiny_qwen3"
        c.lora.rank, c.lora.alpha = 4, 8.0
        c.policy.prompts_per_step, c.policy.num_responses = 2, 4
        c.policy.max_prompt_tokens = c.policy.max_new_tokens = 32
        c.generator.num_lists, c.generator.max_items = 4, 4
        c.generator.input_budget, c.generator.max_new_tokens = 128, 16
        c.verifier.max_prefix_tokens = 64
    return c


def forward_flops(cfg, tokens: int, keys: int, head_rows: int, adapters: int = 0) -> float:
    """FLOPs of a forward pass: matmuls of every layer over `tokens` tokens (+ LoRA
    adapters), attention over `keys` attended (query, key) pairs, the output head on
    `head_rows` positions."""
    d, f, hd, kv = cfg.dim, cfg.hidden_dim, cfg.num_heads * cfg.head_dim, \
        cfg.num_kv_heads * cfg.head_dim
    layer = d * (2 * hd + 2 * kv) + 3 * d * f
    return (2.0 * (cfg.num_layers * layer + adapters) * tokens
            + 4.0 * cfg.num_layers * hd * keys + 2.0 * d * cfg.vocab_size * head_rows)


def causal_keys(rows: int, prompt: int, new: int) -> int:
    """Attended (query, key) pairs of `rows` causal rows of prompt + new tokens."""
    t = prompt + new
    return rows * t * (t + 1) // 2


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp
    import numpy as np

    from drubric_jax import models, sampling, parallel
    from drubric_jax.memory import planner
    from drubric_jax.rl import train_step as ts
    from drubric_jax.evaluator import passes
    from drubric_jax.memory.planner import Workload
    from drubric_jax.memory.terms import RoleModels
    from drubric_jax.rounds.roles import LoadedModel, make_trainee
    from drubric_jax.types import Role

    config = check_config(_TINY.value)
    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    mem_gb = _MEMORY.value or (stats["bytes_limit"] / 1e9 if "bytes_limit" in stats else None)
    plan = planner.plan(config, 1, mem_gb, (1, 1, 1), attention="dense", headroom=0.05)
    steps = {(s.phase, s.name): s for s in plan.steps}
    w, rm = Workload.from_config(config), RoleModels.from_config(config)
    peak_tflops = next((v for k, v in PEAK_TFLOPS.items() if k in dev.device_kind), None)
    print(f"device: {dev.device_kind} ({jax.default_backend()}), planner memory "
          f"{mem_gb and round(mem_gb, 1)} GB; {plan.verdict()}", flush=True)

    mesh = parallel.make_mesh(1, 1, 1, [dev])
    cfg = rm.base[rm.sources["policy"]]
    shapes = rm.base_shapes(rm.sources["policy"])
    base = jax.jit(lambda k: models.init_params(cfg, k), out_shardings=models.param_shardings(
        shapes, mesh))(jax.random.PRNGKey(0))
    loaded = LoadedModel(rm.sources["policy"], cfg, base, None)
    trainees = {}
    for role in ("policy", "generator"):
        tc = dataclasses.replace(rm.train[role],
                                 micro_batch_size=steps[role, f"{role} update"].rows)
        trainees[role] = make_trainee(Role(role), loaded, rm.trainee[role], tc, mesh)
    adapters = sum(x.size for x in jax.tree.leaves(trainees["policy"].state.params))
    rng = np.random.default_rng(0)
    rows_out = []

    def ids(*shape):
        return rng.integers(0, cfg.vocab_size - 1, size=shape, dtype=np.int32)

    def record(name, step, seconds, tokens, flops):
        s = dev.memory_stats() or {}
        peak = s.get("peak_bytes_in_use")
        rows_out.append((name, seconds, tokens / seconds, flops / seconds / 1e12,
                         None if peak_tflops is None else flops / seconds / 1e12 / peak_tflops,
                         None if peak is None else peak / 1e9, plan.peak(step) / 1e9))
        print(f"  done: {name} in {seconds:.1f} s", flush=True)

    def sample(name, role, rows, prompt, new, step):
        params = trainees[role].params
        every = np.arange(cfg.vocab_size, dtype=np.int32)   # warm-up: every id stops
        one = np.full((cfg.vocab_size,), cfg.vocab_size - 1, np.int32)  # same shape
        chunk = step.rows
        prompts = ids(rows, prompt)
        key = jax.random.PRNGKey(1)
        method = sampling.Temperature(1.0)
        sampling.generate(params, cfg, prompts[:chunk].tolist(), key=key, max_new_tokens=new,
                          method=method, stop_ids=every, pad_id=0, min_bucket=prompt)
        t0, made, keys = time.perf_counter(), 0, 0
        for i in range(0, rows, chunk):
            out = sampling.generate(params, cfg, prompts[i:i + chunk].tolist(), key=key,
                                    max_new_tokens=new, method=method, stop_ids=one,
                                    pad_id=0, min_bucket=prompt)
            made += int(out.lengths.sum())
            keys += sum(causal_keys(1, prompt, int(n)) for n in out.lengths)
        seconds = time.perf_counter() - t0
        record(f"{name} ({rows} rows, {chunk}/call)", step, seconds, made,
               forward_flops(cfg, rows * prompt + made, keys, made + rows, adapters))

    def update(role, rows, prompt, new, step):
        t = prompt + new
        mask = np.ones((rows, t), bool)
        batch = ts.Batch(tokens=ids(rows, t), token_mask=mask,
                         loss_mask=np.concatenate([np.zeros((rows, prompt), bool),
                                                   np.ones((rows, new), bool)], axis=1),
                         old_logprobs=np.full((rows, t), -np.log(cfg.vocab_size), np.float32),
                         advantages=rng.standard_normal(rows).astype(np.float32),
                         truncated=np.zeros(rows, bool), prompt_len=prompt)
        trainee = trainees[role]
        trainee.step_fn.lower(trainee.state, batch, base).compile()  # cached for the call
        t0 = time.perf_counter()
        trainee.state, metrics = trainee.step_fn(trainee.state, batch, base)
        ts.check_finite(metrics, 0)
        seconds = time.perf_counter() - t0
        fwd = forward_flops(cfg, rows * t, causal_keys(rows, prompt, new), rows * new,
                            adapters)
        record(f"{role} update ({rows} rows x {t}, {step.rows}/pass)", step, seconds,
               rows * t, fwd * ((2 if rm.trainee[role].lora_rank else 3) + 1))

    def verify(step):
        prefixes, items, per_pass = w.policy_rows, config.generator.max_items, w.verifier_items
        rows, p, ts_ = w.verifier_rows, w.verifier_prefix, w.verifier_suffix
        yes = jnp.asarray([1], jnp.int32)

        def one_chunk():
            cache, plen = passes.prefill(base, cfg, jnp.asarray(ids(rows, p)),
                                         jnp.ones((rows, p), bool), num_slots=p + ts_)
            for _ in range(-(-items // per_pass)):
                out = passes.score_suffixes(base, cfg, cache, plen,
                                            jnp.asarray(ids(rows, per_pass, ts_)),
                                            jnp.full((rows, per_pass), ts_, jnp.int32),
                                            yes, yes)
            return jax.block_until_ready(out)

        one_chunk()  # compiles both passes
        t0 = time.perf_counter()
        for _ in range(prefixes // rows):
            one_chunk()
        seconds = time.perf_counter() - t0
        suffixes = prefixes * -(-items // per_pass) * per_pass
        keys = causal_keys(prefixes, p, 0) + suffixes * (p * ts_ + ts_ * (ts_ + 1) // 2)
        record(f"verification ({prefixes} x {p} + {items} items)", step,
               seconds, prefixes * p + suffixes * ts_,
               forward_flops(cfg, prefixes * p + suffixes * ts_, keys, suffixes))

    run = {
        "policy_sampling": lambda: sample("policy sampling", "policy", w.policy_rows,
                                          w.policy_prompt, w.policy_new,
                                          steps["generator", "policy sampling"]),
        "rubric_sampling": lambda: sample("rubric sampling", "generator", w.rubric_rows,
                                          w.rubric_prompt, w.rubric_new,
                                          steps["generator", "rubric sampling"]),
        "verification": lambda: verify(steps["generator", "verification"]),
        "generator_update": lambda: update("generator", w.rubric_rows, w.rubric_prompt,
                                           w.rubric_new, steps["generator", "generator update"]),
        "policy_update": lambda: update("policy", w.policy_rows, w.policy_prompt, w.policy_new,
                                        steps["policy", "policy update"])}
    for name in STEPS:
        if name in _ONLY.value:
            run[name]()

    def cell(x, fmt, width):
        return f"{'n/a':>{width}}" if x is None else format(x, f">{width}{fmt}")

    print(f"\n{'step':<46}{'s':>8}{'tokens/s':>11}{'TFLOP/s':>9}{'MFU':>7}"
          f"{'peak GB':>9}{'planned GB':>11}")
    for name, sec, tps, tflops, mfu, peak, planned in rows_out:
        print(f"{name:<46}{sec:>8.2f}{tps:>11.0f}{tflops:>9.2f}{cell(mfu, '.1%', 7)}"
              f"{cell(peak, '.1f', 9)}{planned:>11.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    app.run(main)

"""Sampler throughput: prefill and decode tokens/s of `drubric_jax.sampling` on CPU, beside
the machine's roofline, and optionally transformers' `generate` or a peer's JSON lines.

    python -m experiments.bench_sampler                          # JAX, float32, batch 1, 8, 32
    python -m experiments.bench_sampler --dtype=bfloat16         # bf16 weights and compute
    python -m experiments.bench_sampler --impl=all               # + transformers (needs torch)
    python -m experiments.bench_sampler --peer_json=tunix.jsonl  # + ratios against tunix
    python -m experiments.bench_sampler --profile                # + time by kind of op

Prints one JSON object per line (impl = matmul, load, bandwidth, jax, transformers, or a
peer's). The workload, every field and the comparison recipes (transformers in a layered
venv, tunix with alternating processes): docs/BENCHMARKS.md, "Sampler". The roofline,
paired-statistics and peer-JSON code is shared with the other benchmarks
(experiments/bench_common.py).
"""
from __future__ import annotations

import importlib
import os
import time

from absl import flags
from experiments import cli  # noqa: E402

from experiments import bench_common as bench
from experiments.bench_common import emit

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct",
                             "'smollm2-135m-instruct', a .gguf path or a Hugging Face directory")
_BATCHES = flags.DEFINE_list("batches", ["1", "8", "32"], "batch sizes B")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "params and compute dtype (bf16 halves the bytes per decode step)")
_IMPL = flags.DEFINE_enum("impl", "jax", ["jax", "transformers", "all"], "what to measure")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "P, prompt tokens (a bucket size)")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "N, new tokens per row")
_CACHE_SEGMENTS = flags.DEFINE_integer(
    "cache_segments", 0, "decode segments of the KV cache, as `generate(cache_segments=)`: 0 = "
    "auto (1 at the default lengths), 1 = one cache of P + N slots, m = m growing segments "
    "(`sampling.cache_schedule`)")
_REPS = flags.DEFINE_integer("reps", 2, "warm repetitions per shape (median reported)")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 2048, "size of the peak-FLOP/s matmul")
_PEER_JSON = flags.DEFINE_string("peer_json", None, "JSON lines of a peer to compare with")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the random prompts")
_PROFILE = flags.DEFINE_bool(
    "profile", False, "also trace one prefill and one decode call per batch and print where "
    "the time goes by kind of operation (prefill_ops, decode_ops; experiments/op_profile.py)")
_CACHE_DIR = flags.DEFINE_string(
    "compile_cache_dir", "~/.cache/drubric_jax/xla",
    "JAX persistent compilation cache, as config.compile.cache_dir ('' = off): a second run "
    "of the same shapes loads them, and its compile_s is what a resumed run pays")


def jax_timer(cfg, params, batch: int, prompt_len: int, new_tokens: int, seed: int,
              cache_segments: int = 0):
    """Compiles `sampling.prefill` and `sampling.decode_loop` (or `sampling.decode_segments`
    when `cache_segments` gives several, `sampling.cache_schedule`) for one shape ahead of
    time.

    Returns:
        (compile_s, once, profile): `once()` runs one prefill and one
        `sampling.decode_params` + `sampling.decode_loop` (as `generate` runs them) on fresh
        prompts and returns their wall seconds (prefill_s, decode_s); `profile()` returns
        {"prefill_ops": ..., "decode_ops": ...} of one more traced call each
        (`experiments.op_profile.op_times`).

    Raises:
        RuntimeError: the decode loop stopped before N steps.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from drubric_jax import sampling

    rng = np.random.default_rng(seed)
    method = sampling.Greedy()
    never = jnp.asarray([-1], jnp.int32)  # no sampled id equals -1: all N tokens are produced

    def prompts():
        tokens = jnp.asarray(rng.integers(3, cfg.vocab_size, (batch, prompt_len), np.int32))
        return jax.block_until_ready((tokens, jnp.ones((batch, prompt_len), bool)))

    key = jax.random.PRNGKey(0)
    slots = sampling.cache_schedule(prompt_len, new_tokens, cache_segments)
    t0 = time.perf_counter()
    prefill = sampling.prefill.lower(params, cfg, *prompts(), key, new_tokens,
                                     num_slots=slots[0]).compile()
    state = jax.eval_shape(lambda *a: sampling.prefill(params, cfg, *a, key, new_tokens,
                                                       num_slots=slots[0]), *prompts())
    # As `generate`: the loop runs on `sampling.decode_params` (on CPU a per-layer copy of
    # the weights, made once per call by a program of its own: compiled here).
    layers = sampling.decode_params(params, cfg)
    if len(slots) == 1:
        decode = sampling.decode_loop.lower(layers, cfg, state, method, never, 0).compile()
    else:
        segments = sampling.decode_segments.lower(layers, cfg, state.replace(cache=None),
                                                  state.cache, method, never, 0,
                                                  slots).compile()

        def decode(layers, state, never):
            return segments(layers, state.replace(cache=None), state.cache, never)
        decode.as_text = segments.as_text  # for `profile`
    compile_s = time.perf_counter() - t0
    del layers  # each timed call makes its own copy, as `generate` does

    def once():
        tokens, mask = prompts()
        t0 = time.perf_counter()
        state = jax.block_until_ready(prefill(params, tokens, mask, key))
        t1 = time.perf_counter()
        state = jax.block_until_ready(decode(sampling.decode_params(params, cfg), state, never))
        t2 = time.perf_counter()
        if int(state.step) != new_tokens or not bool(state.mask.all()):
            raise RuntimeError(f"decode stopped early at step {int(state.step)}")
        return t1 - t0, t2 - t1

    def profile():
        from experiments import op_profile

        tokens, mask = prompts()
        ops = dict(prefill_ops=op_profile.op_times(
            prefill.as_text(), lambda: jax.block_until_ready(prefill(params, tokens, mask, key)),
            cfg.vocab_size))
        state = jax.block_until_ready(prefill(params, tokens, mask, key))
        # decode_loop donates the state: this one call consumes it. The loop alone (the
        # weight copy is its own program, made before the trace).
        layers = jax.block_until_ready(sampling.decode_params(params, cfg))
        ops["decode_ops"] = op_profile.op_times(
            decode.as_text(), lambda: jax.block_until_ready(decode(layers, state, never)),
            cfg.vocab_size, steps=new_tokens)
        return ops

    return compile_s, once, profile


def _transformers_model(source: str):
    """(model, why_not): transformers' float32 model of `source`, or None and a reason."""
    try:
        import torch
        # Needed by the comparison (docs/BENCHMARKS.md); imported only to check for it.
        importlib.import_module("accelerate")
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        return None, f"transformers comparison skipped: {e} (needs torch and accelerate)"
    from drubric_jax import models

    torch.set_num_threads(os.cpu_count())
    path = models.default_gguf_path() if source == models.DEFAULT_MODEL else source
    if path.endswith(".gguf"):
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval(), None


def transformers_timer(model, vocab_size: int, batch: int, prompt_len: int, new_tokens: int,
                       seed: int):
    """Timers of transformers' `generate`, like for like with ours.

    `generate(max_new_tokens=1)` is the prefill as generate runs it (logits of the last
    position only, as `sampling.prefill`; plus one sampling step): prefill seconds = its
    time. Decode seconds = time of generate(N) - time of generate(1): the N - 1 decode
    steps.

    Also `peer_script_*`, measured once here: the figures of
    ../shared/peers/anchor_hf_generate.py, which times one `model(x)` call (logits of all P
    positions, the output head's [B, P, V] product included) and subtracts it from one
    generate(N) call. That prefill is up to 1.4x generate's own at B = 32 here, so its
    decode figure (a small difference of two large times) came out between 150 and 400
    tok/s on the same machine; it is printed for reference and not used in the ratios.

    Returns:
        (once, script): `once()` returns (prefill_s, decode_s) of one generate(1) and one
        generate(N); `script` the `peer_script_*` figures.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(3, vocab_size, (batch, prompt_len), generator=gen)
    am = torch.ones_like(x)

    def timed(fn):
        with torch.no_grad():
            return bench.timed(fn)[1]

    def generate(n):
        return timed(lambda: model.generate(x, attention_mask=am, max_new_tokens=n,
                                            min_new_tokens=n, do_sample=False, pad_token_id=0))

    timed(lambda: model(x[:, :16]))  # warm
    full_pre = timed(lambda: model(x, attention_mask=am))
    script_total = generate(new_tokens)
    script = dict(peer_script_prefill_tok_s=round(batch * prompt_len / full_pre, 1),
                  peer_script_decode_tok_s=round(
                      batch * (new_tokens - 1) / max(script_total - full_pre, 1e-9), 1))

    def once():
        one = generate(1)
        return one, max(generate(new_tokens) - one, 1e-9)

    return once, script


def main(argv):
    del argv
    import jax

    from drubric_jax import models
    from drubric_jax.rounds import compilation

    compilation.enable_persistent_cache(_CACHE_DIR.value)
    batches = [int(b) for b in _BATCHES.value]
    p, n = _PROMPT_LEN.value, _NEW_TOKENS.value
    f32_peak = bench.matmul_gflops(_MATMUL_N.value, "float32")
    peak = dict(impl="matmul", n=_MATMUL_N.value, float32_gflop_s=round(f32_peak, 1),
                devices=str(jax.devices()), cpus=os.cpu_count())
    if _DTYPE.value != "float32":
        peak[f"{_DTYPE.value}_gflop_s"] = round(
            bench.matmul_gflops(_MATMUL_N.value, _DTYPE.value), 1)
    emit(**peak)

    t = time.perf_counter()
    cfg, params, _ = models.load_model(_MODEL.value, _DTYPE.value)
    jax.block_until_ready(params)
    n_params = cfg.num_params()
    emit(impl="load", model=_MODEL.value, dtype=_DTYPE.value, n_params=n_params,
         load_s=round(time.perf_counter() - t, 2))

    run_ours = _IMPL.value in ("jax", "all")
    model = None
    if _IMPL.value in ("transformers", "all"):
        model, why = _transformers_model(_MODEL.value)
        if model is None:
            emit(impl="transformers", skipped=why)
    if run_ours:
        weight_bytes = bench.decode_bytes_per_step(cfg, params, 0, 0)
        read = bench.read_gb_s(weight_bytes)
        emit(impl="bandwidth", read_gb_s=round(read, 1), read_mb=round(weight_bytes / 2**20),
             matmul_stream_gb_s={
                 b: round(bench.matmul_stream_gb_s(b, cfg.dim, cfg.hidden_dim, cfg.num_layers,
                                                   _DTYPE.value), 1) for b in batches},
             matmul_shape=f"[B, {cfg.dim}] @ {cfg.num_layers} x [{cfg.dim}, {cfg.hidden_dim}]")

    ours = {}
    for b in batches:
        timers = {}
        if run_ours:
            compile_s, timers["jax"], profile = jax_timer(cfg, params, b, p, n, _SEED.value,
                                                          _CACHE_SEGMENTS.value)
        if model is not None:
            timers["transformers"], script = transformers_timer(model, cfg.vocab_size, b, p, n,
                                                                _SEED.value)
        # Ours and transformers alternate call by call (`paired_rounds`).
        res = bench.paired_rounds(timers, _REPS.value)
        if run_ours:
            row = bench.median_rates(res["jax"]["rounds"], b, p, n)
            row.update(compile_s=round(compile_s, 2),
                       first_run_s=round(sum(res["jax"]["first"]), 2))
            if _PROFILE.value:
                row.update(profile())
            ours[b] = row
            # The cache slots a step reads, on average over the segments (P + N: one).
            from drubric_jax import sampling
            read_slots = sampling.mean_slots_read(
                sampling.cache_schedule(p, n, _CACHE_SEGMENTS.value), p, n)
            step_bytes = bench.decode_bytes_per_step(cfg, params, b, round(read_slots))
            emit(impl="jax", dtype=_DTYPE.value, batch=b, prompt_len=p, new_tokens=n,
                 cache_segments=_CACHE_SEGMENTS.value, mean_slots_read=read_slots, **row,
                 prefill_mfu=round(2 * n_params * row["prefill_tok_s"] / (f32_peak * 1e9), 3),
                 prefill_mfu_blocks=round(2 * (n_params - cfg.vocab_size * cfg.dim)
                                          * row["prefill_tok_s"] / (f32_peak * 1e9), 3),
                 decode_mfu=round(2 * n_params * row["decode_tok_s"] / (f32_peak * 1e9), 3),
                 decode_bytes_per_step=step_bytes,
                 decode_roofline_frac=round(step_bytes / (read * 1e9)
                                            / (row["decode_ms_per_step"] / 1e3), 3),
                 peak_rss_mb=round(bench.peak_rss_mb(), 1))
        if model is not None:
            row = bench.median_rates(res["transformers"]["rounds"], b, p, n - 1)
            ratios = (bench.paired_ratios(res["jax"]["rounds"], res["transformers"]["rounds"], n)
                      if run_ours else {})
            emit(impl="transformers", dtype="float32", batch=b, prompt_len=p,
                 new_tokens=n, **row, **script, peak_rss_mb=round(bench.peak_rss_mb(), 1),
                 **ratios)

    if _PEER_JSON.value:
        for row in bench.peer_rows(_PEER_JSON.value, ours):
            emit(impl=row.get("impl", "peer"), source=_PEER_JSON.value, batch=row["batch"],
                 prefill_tok_s=row["prefill_tok_s"], decode_tok_s=row["decode_tok_s"],
                 **bench.peer_ratios(ours[row["batch"]], row))


if __name__ == "__main__":
    cli.run(main)

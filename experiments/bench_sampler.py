"""Sampler throughput: prefill and decode tokens/s of `drubric_jax.sampling` on CPU.

    python -m experiments.bench_sampler                          # JAX, float32, batch 1, 8, 32
    python -m experiments.bench_sampler --dtype=bfloat16         # bf16 weights and compute
    python -m experiments.bench_sampler --impl=all               # + transformers (needs torch)
    python -m experiments.bench_sampler --peer_json=tunix.jsonl  # + ratios against tunix
    python -m experiments.bench_sampler --profile                # + time by kind of op

Workload (the one of ../shared/peers): random prompts of `--prompt_len` tokens (ids 3..V-1,
no padding, so the prompt bucket is exactly 128), greedy, `--new_tokens` new tokens. The
stop id is -1, which no sampled token can equal, so every row produces all N tokens.

Output: one JSON object per line.
- `{"impl": "matmul", ...}`: the machine's float32 (and compute-dtype) matmul peak,
  `--matmul_n`^3 `jnp.dot`, in GFLOP/s.
- `{"impl": "load", ...}`: the model (`n_params`) and its load time (`load_s`).
- `{"impl": "bandwidth", ...}`: the memory roofline of this machine: `read_gb_s`, a jitted
  `jnp.sum` over a float32 array of the model's size (the rate a decode step can at best
  stream its weights at), and per batch B `matmul_stream_gb_s`, the rate XLA's dot streams
  weights at for [B, D] @ L distinct [D, F] matrices (the MLP's shape; for B >= 2 the CPU
  GEMM path packs its operands, so it streams slower than a B = 1 matrix-vector product).
- `{"impl": "jax", ...}` per batch B:
  `prefill_s`, `decode_s`: the median seconds of one prefill and one decode (below), and
  `decode_ms_per_step` = decode_s / N;
  `prefill_tok_s` = B * P / time of one jitted `sampling.prefill` call (block_until_ready);
  `decode_tok_s` = B * N / time of `sampling.decode_params` (on CPU the per-layer weight
  copy) and one `sampling.decode_loop` call, as `generate` runs them (N sampling steps and
  N forward passes; the last forward's logits are unused — the peers' B * (N - 1) tokens
  over N - 1 forwards is the same per-step rate);
  `compile_s` = ahead-of-time compile time of prefill + decode_loop for the shape (what
  the first call of a new shape pays on top; with the persistent cache
  (`--compile_cache_dir`, on by default as in the run configs) a second run of the same
  shapes loads them instead; `first_run_s` is the first execution after
  it, the warm-up that is not counted); `peak_rss_mb` = the process's peak resident
  memory so far (it only grows);
  `prefill_mfu` = 2 * n_params * prefill_tok_s / float32 matmul peak (n_params counts the
  tied embedding, which the prefill uses only for the last position's logits, so this
  overstates; `prefill_mfu_blocks` uses the parameters outside the embedding);
  `decode_bytes_per_step` = the bytes a decode step must read: every parameter (the tied
  embedding as the output head) plus the KV cache's S = P + N slots of every layer (the
  attention reads all of them; the unwritten ones are masked), and
  `decode_roofline_frac` = (those bytes / `read_gb_s`) / the measured time per step: 1.0
  would be a step as fast as this machine's memory allows; `decode_mfu` = 2 * n_params *
  decode_tok_s / float32 matmul peak (what bounds large batches, where the step computes
  more than it reads). Warm figures are the median of `--reps` calls.
  With `--profile`, the row also has `prefill_ops` (ms per call) and `decode_ops` (ms per
  step, of the loop without the weight copy): one more traced call each, its time split
  into weight matmuls, the output head, attention, slicing a layer out of stacked arrays
  and the rest, with the slowest operations (`experiments/op_profile.py`).
- `{"impl": "transformers", ...}`: transformers' `generate` on the same GGUF weights (torch
  CPU, float32): prefill = generate of 1 new token, decode = generate of N minus that
  (`transformers_timer`; the peer script's own figures beside them as `peer_script_*`),
  with `ratio_prefill` and `ratio_decode` = ours / theirs: with `--impl=all` our calls and
  theirs alternate (`paired_rounds`, the order reversed every other round) and each ratio
  is the median over the `--reps` rounds of that round's ratio, so a drift of this shared
  machine's speed between the two does not bias it. `peak_rss_mb` then includes the torch
  model (`--impl=jax` gives ours alone). Needs `torch` and `accelerate` importable, e.g.
  from a separate venv layered over the project's one:
      python3.11 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install torch==2.13.0 accelerate
      PYTHONPATH=.venv/lib/python3.11/site-packages \
          /tmp/tvenv/bin/python -m experiments.bench_sampler --impl=all
  When they are not importable, one line `{"impl": "transformers", "skipped": "<why>"}` is
  printed. Torch's OpenMP threads collapse when other processes hold the cores; compare only
  on an otherwise idle machine.
- `--peer_json FILE`: JSON lines of another system (same keys: impl, batch, prefill_tok_s,
  decode_tok_s; lines with `mode` other than "greedy" are ignored), re-printed with
  `ratio_prefill` / `ratio_decode` = ours / theirs. For tunix, produce the file with the
  setup in the docstring of ../shared/peers/anchor_tunix.py:
      /tmp/tvenv/bin/python anchor_tunix.py convert
      /tmp/tunixvenv/bin/python anchor_tunix.py sampler | grep '"tunix-vanilla"' > tunix.jsonl
  (its rows are `"impl": "tunix-vanilla", "mode": "greedy", "batch": ..., "prefill_tok_s",
  "decode_tok_s"`). The measured figures of ../shared/peers/README.md can also be written
  into such a file by hand. tunix runs in its own venv, so its calls cannot alternate with
  ours in one process; alternate the processes instead and take the median of the rounds'
  ratios (one round is about 6 minutes here):
      for i in 1 2 3; do
        /tmp/tunixvenv/bin/python anchor_tunix.py sampler --batches 1 8 32 > tunix_$i.jsonl
        python -m experiments.bench_sampler --impl=jax --reps=5 --peer_json=tunix_$i.jsonl
      done
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import time

from absl import app, flags

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct",
                             "'smollm2-135m-instruct', a .gguf path or a Hugging Face directory")
_BATCHES = flags.DEFINE_list("batches", ["1", "8", "32"], "batch sizes B")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "params and compute dtype (bf16 halves the bytes per decode step)")
_IMPL = flags.DEFINE_enum("impl", "jax", ["jax", "transformers", "all"], "what to measure")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "P, prompt tokens (a bucket size)")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "N, new tokens per row")
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


def _emit(**row):
    print(json.dumps(row), flush=True)


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _median_s(fn, *args, reps: int) -> float:
    """Median wall seconds of `reps` calls of jitted `fn(*args)`, after one warm-up call
    (compiles); each call waits for its result."""
    fn(*args).block_until_ready()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_gflops(n: int, dtype: str, reps: int = 5) -> float:
    """GFLOP/s of a jitted n x n x n `jnp.dot` in `dtype` (median of `reps` warm calls)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32).astype(dtype)
    return 2 * n ** 3 / _median_s(jax.jit(jnp.dot), a, b, reps=reps) / 1e9


def read_gb_s(nbytes: int, reps: int = 5) -> float:
    """GB/s (1e9 bytes) of a jitted `jnp.sum` over float32[nbytes / 4] (median of `reps`)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((max(nbytes // 4, 1),), jnp.float32)
    return x.nbytes / _median_s(jax.jit(jnp.sum), x, reps=reps) / 1e9


def matmul_stream_gb_s(rows: int, d: int, f: int, layers: int, dtype: str,
                       reps: int = 5) -> float:
    """GB/s at which a jitted `[rows, d] @ w` streams `layers` distinct `w: [d, f]` matrices
    (one program, as a decode step's layers; too many bytes to stay in cache), median of
    `reps` calls: the weight-streaming rate XLA's dot kernel reaches at this batch size."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(2), layers + 1)
    ws = [jax.random.normal(k, (d, f), jnp.float32).astype(dtype) for k in keys[1:]]
    h = jax.random.normal(keys[0], (rows, d), jnp.float32).astype(dtype)
    # Each product is reduced so that all of them stay live (none is optimised away).
    chain = jax.jit(lambda h, ws: sum(jnp.sum(h @ w) for w in ws))
    return sum(w.nbytes for w in ws) / _median_s(chain, h, ws, reps=reps) / 1e9


def decode_bytes_per_step(cfg, params, batch: int, num_slots: int) -> int:
    """Bytes one decode step reads at least: all params (a mixture of experts reads only its
    routed experts: there this overcounts), and the KV cache
    k, v: [L, B, Hkv, S, Dh] in the compute dtype (`models.init_cache`)."""
    import jax
    import jax.numpy as jnp

    weights = sum(x.nbytes for x in jax.tree.leaves(params))
    cache = (2 * cfg.num_layers * batch * cfg.num_kv_heads * num_slots * cfg.head_dim
             * jnp.dtype(cfg.compute_dtype).itemsize)
    return int(weights + cache)


def jax_timer(cfg, params, batch: int, prompt_len: int, new_tokens: int, seed: int):
    """Compiles `sampling.prefill` and `sampling.decode_loop` for one shape ahead of time.

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
    t0 = time.perf_counter()
    prefill = sampling.prefill.lower(params, cfg, *prompts(), key, new_tokens).compile()
    state = jax.eval_shape(lambda *a: sampling.prefill(params, cfg, *a, key, new_tokens),
                           *prompts())
    # As `generate`: the loop runs on `sampling.decode_params` (on CPU a per-layer copy of
    # the weights, made once per call by a program of its own: compiled here).
    layers = sampling.decode_params(params, cfg)
    decode = sampling.decode_loop.lower(layers, cfg, state, method, never, 0).compile()
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


def paired_rounds(timers: dict, reps: int) -> dict:
    """Runs each of `timers` (name -> a callable returning a tuple of seconds) once to warm
    up, then `reps` rounds of one call each, the order reversed every other round.

    Interleaving puts every implementation under the same drift of this shared machine
    (its speed moves 10-25% over minutes), so the per-round ratios of two implementations
    are paired samples; run one after the other, a drift between them would bias the ratio.

    Returns:
        name -> {"first": the warm-up's tuple, "rounds": list of `reps` tuples}.
    """
    out = {name: {"first": fn(), "rounds": []} for name, fn in timers.items()}
    names = list(timers)
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name]["rounds"].append(timers[name]())
    return out


def _transformers_model(source: str):
    """(model, why_not): transformers' float32 model of `source`, or None and a reason."""
    try:
        import torch  # noqa: F401
        import accelerate  # noqa: F401
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
        t = time.perf_counter()
        with torch.no_grad():
            fn()
        return time.perf_counter() - t

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


def _row(rounds, batch: int, prompt_len: int, new_steps: int) -> dict:
    """Medians of (prefill_s, decode_s) rounds as the row's times and tokens/s."""
    pre = statistics.median(r[0] for r in rounds)
    dec = statistics.median(r[1] for r in rounds)
    return dict(prefill_s=round(pre, 4), decode_s=round(dec, 4),
                prefill_tok_s=round(batch * prompt_len / pre, 1),
                decode_tok_s=round(batch * new_steps / dec, 1),
                decode_ms_per_step=round(1000 * dec / new_steps, 2))


def _paired_ratios(ours, theirs, new_tokens: int) -> dict:
    """ratio_prefill, ratio_decode = ours / theirs in tokens/s: the median over rounds of
    each round's ratio (paired samples, `paired_rounds`). Our decode makes N forwards, theirs
    N - 1 (their generate(1) includes the first): compared per step."""
    pre = [t[0] / o[0] for o, t in zip(ours, theirs)]
    dec = [(t[1] / (new_tokens - 1)) / (o[1] / new_tokens) for o, t in zip(ours, theirs)]
    return dict(ratio_prefill=round(statistics.median(pre), 3),
                ratio_decode=round(statistics.median(dec), 3))


def _ratios(ours: dict, theirs: dict) -> dict:
    if ours is None:
        return {}
    return dict(ratio_prefill=round(ours["prefill_tok_s"] / theirs["prefill_tok_s"], 3),
                ratio_decode=round(ours["decode_tok_s"] / theirs["decode_tok_s"], 3))


def main(argv):
    del argv
    import jax

    from drubric_jax import models
    from drubric_jax.rounds import compilation

    compilation.enable_persistent_cache(_CACHE_DIR.value)
    batches = [int(b) for b in _BATCHES.value]
    p, n = _PROMPT_LEN.value, _NEW_TOKENS.value
    f32_peak = matmul_gflops(_MATMUL_N.value, "float32")
    peak = dict(impl="matmul", n=_MATMUL_N.value, float32_gflop_s=round(f32_peak, 1),
                devices=str(jax.devices()), cpus=os.cpu_count())
    if _DTYPE.value != "float32":
        peak[f"{_DTYPE.value}_gflop_s"] = round(matmul_gflops(_MATMUL_N.value, _DTYPE.value), 1)
    _emit(**peak)

    t = time.perf_counter()
    cfg, params, _ = models.load_model(_MODEL.value, _DTYPE.value)
    jax.block_until_ready(params)
    n_params = cfg.num_params()
    _emit(impl="load", model=_MODEL.value, dtype=_DTYPE.value, n_params=n_params,
          load_s=round(time.perf_counter() - t, 2))

    run_ours = _IMPL.value in ("jax", "all")
    model = None
    if _IMPL.value in ("transformers", "all"):
        model, why = _transformers_model(_MODEL.value)
        if model is None:
            _emit(impl="transformers", skipped=why)
    if run_ours:
        weight_bytes = decode_bytes_per_step(cfg, params, 0, 0)
        read = read_gb_s(weight_bytes)
        _emit(impl="bandwidth", read_gb_s=round(read, 1), read_mb=round(weight_bytes / 2**20),
              matmul_stream_gb_s={
                  b: round(matmul_stream_gb_s(b, cfg.dim, cfg.hidden_dim, cfg.num_layers,
                                              _DTYPE.value), 1) for b in batches},
              matmul_shape=f"[B, {cfg.dim}] @ {cfg.num_layers} x [{cfg.dim}, {cfg.hidden_dim}]")

    ours = {}
    for b in batches:
        timers = {}
        if run_ours:
            compile_s, timers["jax"], profile = jax_timer(cfg, params, b, p, n, _SEED.value)
        if model is not None:
            timers["transformers"], script = transformers_timer(model, cfg.vocab_size, b, p, n,
                                                                _SEED.value)
        # Ours and transformers alternate call by call (`paired_rounds`).
        res = paired_rounds(timers, _REPS.value)
        if run_ours:
            row = _row(res["jax"]["rounds"], b, p, n)
            row.update(compile_s=round(compile_s, 2),
                       first_run_s=round(sum(res["jax"]["first"]), 2))
            if _PROFILE.value:
                row.update(profile())
            ours[b] = row
            step_bytes = decode_bytes_per_step(cfg, params, b, p + n)
            _emit(impl="jax", dtype=_DTYPE.value, batch=b, prompt_len=p, new_tokens=n, **row,
                  prefill_mfu=round(2 * n_params * row["prefill_tok_s"] / (f32_peak * 1e9), 3),
                  prefill_mfu_blocks=round(2 * (n_params - cfg.vocab_size * cfg.dim)
                                           * row["prefill_tok_s"] / (f32_peak * 1e9), 3),
                  decode_mfu=round(2 * n_params * row["decode_tok_s"] / (f32_peak * 1e9), 3),
                  decode_bytes_per_step=step_bytes,
                  decode_roofline_frac=round(step_bytes / (read * 1e9)
                                             / (row["decode_ms_per_step"] / 1e3), 3),
                  peak_rss_mb=_peak_rss_mb())
        if model is not None:
            row = _row(res["transformers"]["rounds"], b, p, n - 1)
            ratios = (_paired_ratios(res["jax"]["rounds"], res["transformers"]["rounds"], n)
                      if run_ours else {})
            _emit(impl="transformers", dtype="float32", batch=b, prompt_len=p,
                  new_tokens=n, **row, **script, peak_rss_mb=_peak_rss_mb(), **ratios)

    if _PEER_JSON.value:
        with open(_PEER_JSON.value, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                row = json.loads(line)
                if not {"batch", "prefill_tok_s", "decode_tok_s"} <= row.keys():
                    continue
                if row.get("mode", "greedy") != "greedy" or row["batch"] not in ours:
                    continue
                _emit(impl=row.get("impl", "peer"), source=_PEER_JSON.value, batch=row["batch"],
                      prefill_tok_s=row["prefill_tok_s"], decode_tok_s=row["decode_tok_s"],
                      **_ratios(ours[row["batch"]], row))


if __name__ == "__main__":
    app.run(main)

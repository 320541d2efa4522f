"""The `engine` phase of `experiments/device_check.py`: the rollout engine
(`sampling.generate_engine`, E slots) against static calls (`sampling.generate_chunked`,
E rows a call) on the same rows at one length distribution, in useful tokens/s (issue 42).

Random bfloat16 weights cannot stop where a model's answers would. The rows stop on a set
S of |S| = V / mean_len token ids drawn with the seed (the prompts never hold one): at
temperature 1 a near-uniform draw hits S with probability about 1 / mean_len a step, so the
lengths are roughly geometric with that mean, cut at N, a long-tailed distribution like
sampled answers'. The phase prints the lengths' quantiles it got. Both samplers draw each
row by its row id (`row_ids`), so they emit the same rows and the same useful tokens; the
first call of each compiles (and runs), the second is timed.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

BLOCK = 512  # the planner's blockwise key tile, as device_phases'


@dataclasses.dataclass(frozen=True)
class EngineShapes:
    prompts: int      # distinct prompts
    k: int            # samples per prompt (rows = prompts x k)
    slots: int        # E: the engine's slots, the static sampler's rows per call
    prompt_len: int   # tokens of every prompt
    new: int          # N, most new tokens a row
    mean_len: int     # the lengths' mean before the cut at N (sets |S|)


# One accelerator (Qwen3-8B): 128 rows of <= 1,024 tokens, mean about 256 (a static call
# of 64 rows runs 1,024 steps when its longest row reaches N).
QUICK = EngineShapes(32, 4, 64, 256, 1024, 256)
TINY = EngineShapes(4, 2, 4, 16, 32, 8)


def stop_set(vocab: int, mean_len: int, seed: int = 0) -> np.ndarray:
    """|S| = max(1, round(vocab / mean_len)) distinct token ids drawn with `seed`."""
    size = max(1, int(round(vocab / mean_len)))
    return np.random.default_rng(seed).permutation(vocab)[:size].astype(np.int32)


def rows_of(s: EngineShapes, vocab: int, stops: np.ndarray, seed: int = 0) -> list:
    """prompts x k token-id rows (each prompt's k rows consecutive, as a rollout lays them
    out), the ids drawn with `seed` outside the stop set."""
    allowed = np.setdiff1d(np.arange(vocab, dtype=np.int32), stops)
    rng = np.random.default_rng(seed + 1)
    prompts = [rng.choice(allowed, s.prompt_len).tolist() for _ in range(s.prompts)]
    return [p for p in prompts for _ in range(s.k)]


def engine(ctx) -> None:
    """Rows "static E=..." and "engine E=..." (device_check's docstring, this module's)."""
    import jax

    from drubric_jax import sampling
    from drubric_jax.memory.inference_terms import engine_sampling_terms, sampling_terms
    from drubric_jax.sampling.lengths import engine_steps
    from experiments.device_measure import planned_gb, with_plan

    s = TINY if ctx.tiny else QUICK
    cfg = ctx.model(ctx.shapes.dense)
    params = ctx.init_params(cfg)
    stops = stop_set(cfg.vocab_size, s.mean_len)
    rows = rows_of(s, cfg.vocab_size, stops)
    pad = int(np.setdiff1d(np.arange(cfg.vocab_size), stops)[0])
    kw = dict(key=jax.random.PRNGKey(0), max_new_tokens=s.new,
              method=sampling.Temperature(1.0), stop_ids=stops.tolist(), pad_id=pad,
              row_ids=list(range(len(rows))))
    stats: dict = {}
    run = {"static": lambda: sampling.generate_chunked(params, cfg, rows, s.slots, **kw),
           "engine": lambda: sampling.generate_engine(params, cfg, rows, num_slots=s.slots,
                                                      stats=stats, **kw)}
    out, first = {}, {}
    for name in ("static", "engine"):  # the first calls: compile and run
        t0 = time.perf_counter()
        jax.block_until_ready(run[name]().tokens)
        first[name] = time.perf_counter() - t0
    seconds = {}

    def timed(name):
        stats.clear()
        t0 = time.perf_counter()
        out[name] = run[name]()
        jax.block_until_ready(out[name].tokens)
        seconds[name] = time.perf_counter() - t0
        lens = np.asarray(out[name].lengths)
        useful = int(np.asarray(out[name].mask).sum())
        q = {f"p{p}": int(np.percentile(lens, p)) for p in (10, 50, 90)} | {"max": int(lens.max())}
        steps = (stats["steps"] if name == "engine" else
                 sum(int(lens[i:i + s.slots].max()) for i in range(0, len(rows), s.slots)))
        row = {"compile_s": max(first[name] - seconds[name], 0.0), "steady_s": seconds[name],
               "steps": int(steps), "ms_per_step": seconds[name] / max(steps, 1) * 1e3,
               "tokens_per_s": useful / seconds[name], "useful_tokens": useful,
               "lengths": q,
               "note": f"{len(rows)} rows ({s.prompts} prompts x K {s.k}), N {s.new}, "
                       f"|S| {stops.size}: lengths p10/p50/p90/max {q['p10']}/{q['p50']}/"
                       f"{q['p90']}/{q['max']}; {steps} decode steps"}
        if name == "engine":
            same = float(np.mean([np.array_equal(a, b) for a, b in
                                  zip(out["engine"].tokens, out["static"].tokens)]))
            planned = engine_steps(lens.tolist(), s.slots)
            row.update(speedup=seconds["static"] / seconds[name], same_tokens=same,
                       prefills=int(stats["prefills"]), planned_steps=int(planned),
                       pool_pages=int(stats["pool_pages"]), waits=int(stats["waits"]),
                       read_pages={str(k): v for k, v in stats["read_pages"].items()})
            row["note"] += (f" (the planner's count {planned}); {stats['prefills']} prefills; "
                            f"{row['speedup']:.2f}x static's useful tokens/s; rows alike "
                            f"{same:.2f}; paged pool {stats['pool_pages']} pages of "
                            f"{stats['page_size']}, {stats['waits']} waits, decode calls "
                            f"by read bucket {row['read_pages']}")
        # The planner's terms: the static calls' (E rows of P + N slots), or the engine's
        # (E slots, the rollout's outputs; tests/test_scale_programs.py holds its decode
        # and insert within 10% of the compiled programs).
        if name == "engine":
            return with_plan(row, planned_gb(cfg, lambda rm: engine_sampling_terms(
                rm, "policy", ctx.mesh, s.slots, len(rows), s.prompt_len, s.new, "auto",
                BLOCK, False, rows_per_prompt=s.k)))
        return with_plan(row, planned_gb(cfg, lambda rm: sampling_terms(
            rm, "policy", ctx.mesh, s.slots, s.prompt_len, s.new, "auto", BLOCK, False)))

    for name in ("static", "engine"):
        ctx.row(f"{name} E={s.slots}", lambda name=name: timed(name))


# Live-length decode attention: E slots of a Qwen3-8B layer's KV heads, a table of Pt pages
# (P + N = 16,384 positions), read at two live lengths, and K = 8 rows sharing one prompt.
PAGED_QUICK = dict(slots=64, table_tokens=16384, lives=(1024, 8192), k=8, prompt=4096)
PAGED_TINY = dict(slots=4, table_tokens=128, lives=(16, 64), k=2, prompt=32)


def paged(ctx) -> None:
    """Rows "paged live=...": `models.paged.attend_pages` (JAX's Pallas paged-attention
    kernel on a GPU or TPU; XLA elsewhere) of E slots at a live length, against the dense
    decode attention (`decode_attention.attend_one`) over the whole table, its HBM
    roofline the live k and v bytes; and "paged shared prefix": K rows listing one
    prompt's pages (one stored copy) against K copies, the same output, the pool's bytes."""
    import jax
    import jax.numpy as jnp

    from drubric_jax.models import decode_attention
    from drubric_jax.models import paged as paged_lib
    from experiments.device_measure import first_and_steady

    s = PAGED_TINY if ctx.tiny else PAGED_QUICK
    cfg = ctx.model(ctx.shapes.dense)
    hkv, h, dh, ps = cfg.num_kv_heads, cfg.num_heads, cfg.head_dim, 16
    e, pt = s["slots"], s["table_tokens"] // ps
    dtype = cfg.compute_dtype
    key = jax.random.PRNGKey(0)
    pool = jax.random.normal(key, (hkv, 1 + e * pt, ps, dh), dtype)
    tables = (1 + jnp.arange(e * pt, dtype=jnp.int32)).reshape(e, pt)
    q = jax.random.normal(jax.random.PRNGKey(1), (e, h, dh), dtype)
    dense_k = jnp.transpose(pool[:, tables], (1, 0, 2, 3, 4)).reshape(e, hkv, -1, dh)
    paged_fn = jax.jit(lambda q, lengths, read: paged_lib.attend_pages(
        q, pool, pool, tables[:, :read], lengths), static_argnums=2)
    dense_fn = jax.jit(lambda q, lengths: decode_attention.attend_one(
        q[:, None], (dense_k,), (dense_k,),
        (jnp.arange(dense_k.shape[2])[None] < lengths[:, None])[:, None, None], -1e30))

    def row(live, impl):
        lengths = jnp.full((e,), live, jnp.int32)
        read = paged_lib.pages_for(live, ps)
        one = ((lambda: paged_fn(q, lengths, read)) if impl == "paged"
               else (lambda: dense_fn(q, lengths)))
        reps = 20  # one call is tens of microseconds on a GPU: time several back to back

        def fn():
            out = None
            for _ in range(reps):
                out = one()
            return out

        compile_s, steady, _ = first_and_steady(lambda: (), fn)
        steady /= reps
        tokens = live if impl == "paged" else s["table_tokens"]
        must = 2 * e * hkv * tokens * dh * dtype.itemsize  # k and v (one layer) read
        out = {"compile_s": compile_s, "steady_s": steady, "ms_per_step": steady * 1e3,
               "tokens_per_s": e / steady, "bytes": must, "note": f"{e} slots, live {live} of {s['table_tokens']} "
                                      f"positions; reads {must / 1e6:.1f} MB"}
        if ctx.peak_tbps:
            out["util"] = must / (ctx.peak_tbps * 1e12) / steady
        return out

    for live in s["lives"]:
        ctx.row(f"paged live={live}", lambda live=live: row(live, "paged"))
        ctx.row(f"dense live={live}", lambda live=live: row(live, "dense"))

    def shared():
        k, prompt = s["k"], s["prompt"]
        full = prompt // ps
        own = pt - full
        one = jax.random.normal(key, (hkv, 1 + full + k * own, ps, dh), dtype)
        t = jnp.concatenate([jnp.broadcast_to(1 + jnp.arange(full, dtype=jnp.int32),
                                              (k, full)),
                             (1 + full + jnp.arange(k * own, dtype=jnp.int32)).reshape(k, own)],
                            axis=1)
        lengths = jnp.full((k,), prompt + 64, jnp.int32)
        qk = q[:k]
        got = jax.jit(lambda: paged_lib.attend_pages(qk, one, one, t, lengths))()
        copies = jnp.concatenate([jnp.broadcast_to(one[:, 1:1 + full], (k, hkv, full, ps, dh))
                                  .transpose(1, 0, 2, 3, 4).reshape(hkv, k * full, ps, dh),
                                  one[:, 1 + full:]], axis=1)
        copies = jnp.concatenate([one[:, :1], copies], axis=1)
        t2 = jnp.concatenate([(1 + jnp.arange(k * full, dtype=jnp.int32)).reshape(k, full),
                              t[:, full:] + (k - 1) * full], axis=1)
        want = jax.jit(lambda: paged_lib.attend_pages(qk, copies, copies, t2, lengths))()
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
        return {"max_abs_diff": err, "status": "ok" if err == 0.0 else "error", "pool_bytes": int(one.nbytes),
                "copies_bytes": int(copies.nbytes),
                "note": f"K {k} rows of one {prompt}-token prompt: pool {one.nbytes / 1e6:.1f} MB "
                        f"(one copy) against {copies.nbytes / 1e6:.1f} MB (K copies); "
                        f"outputs differ by {err:.2e}"}

    ctx.row("paged shared prefix", shared)

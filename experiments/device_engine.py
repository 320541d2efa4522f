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
                       prefills=int(stats["prefills"]), planned_steps=int(planned))
            row["note"] += (f" (the planner's count {planned}); {stats['prefills']} prefills; "
                            f"{row['speedup']:.2f}x static's useful tokens/s; rows alike "
                            f"{same:.2f}")
        # The planner's terms: the static calls' (E rows of P + N slots), or the engine's
        # (E slots, the rollout's outputs; tests/test_scale_programs.py holds its decode
        # and insert within 10% of the compiled programs).
        if name == "engine":
            return with_plan(row, planned_gb(cfg, lambda rm: engine_sampling_terms(
                rm, "policy", ctx.mesh, s.slots, len(rows), s.prompt_len, s.new, "auto",
                BLOCK, False)))
        return with_plan(row, planned_gb(cfg, lambda rm: sampling_terms(
            rm, "policy", ctx.mesh, s.slots, s.prompt_len, s.new, "auto", BLOCK, False)))

    for name in ("static", "engine"):
        ctx.row(f"{name} E={s.slots}", lambda name=name: timed(name))

"""What the benchmarks share: JSON-line output, timers, the machine's roofline, paired
statistics and peer JSON (the manual of every benchmark: docs/BENCHMARKS.md).

- Output: `emit` prints one JSON object per line; `peak_rss_mb` is the process's peak
  resident memory so far.
- Timers: `timed` (one call), `median_seconds` (warm calls of a jitted function).
- Roofline of this machine: `matmul_gflops` (compute peak), `read_gb_s` (memory read
  rate), `matmul_stream_gb_s` (the rate XLA's dot streams weights at),
  `decode_bytes_per_step` (the bytes one decode step must read).
- Paired statistics: `paired_rounds` alternates implementations call by call, so a drift of
  this shared machine's speed does not bias their ratio; `median_rates` and
  `paired_ratios` read the rounds.
- Peer JSON: `peer_rows` reads another system's JSON lines, `peer_ratios` compares.

jax is imported inside the functions, as in the benchmarks, so that `--help` and absl's
flag parsing do not wait for it.
"""
from __future__ import annotations

import json
import resource
import statistics
import time


# --- output -------------------------------------------------------------------------


def emit(**row) -> None:
    """Prints `row` as one JSON line (flushed: a long benchmark shows rows as they come)."""
    print(json.dumps(row), flush=True)


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MiB (it only grows; Linux reports
    `ru_maxrss` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- timers -------------------------------------------------------------------------


def timed(fn, *args, **kwargs):
    """(fn(*args, **kwargs), its wall seconds). Does not wait for device work: a caller
    timing JAX arrays blocks inside `fn`."""
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def median_seconds(fn, *args, reps: int, warmup: bool = True) -> float:
    """Median wall seconds of `reps` calls of `fn(*args)`, each waiting for its result
    (`jax.block_until_ready`); with `warmup`, after one untimed call (which compiles)."""
    import jax

    if warmup:
        jax.block_until_ready(fn(*args))
    return statistics.median(timed(lambda: jax.block_until_ready(fn(*args)))[1]
                             for _ in range(reps))


# --- roofline -----------------------------------------------------------------------


def matmul_gflops(n: int, dtype: str, reps: int = 5) -> float:
    """GFLOP/s of a jitted n x n x n `jnp.dot` in `dtype` (median of `reps` warm calls):
    2 n^3 floating-point operations per call."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32).astype(dtype)
    return 2 * n ** 3 / median_seconds(jax.jit(jnp.dot), a, b, reps=reps) / 1e9


def read_gb_s(nbytes: int, reps: int = 5) -> float:
    """GB/s (1e9 bytes) of a jitted `jnp.sum` over float32[nbytes / 4] (median of `reps`):
    the rate at which a program can at best stream `nbytes` of weights."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((max(nbytes // 4, 1),), jnp.float32)
    return x.nbytes / median_seconds(jax.jit(jnp.sum), x, reps=reps) / 1e9


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
    return sum(w.nbytes for w in ws) / median_seconds(chain, h, ws, reps=reps) / 1e9


def decode_bytes_per_step(cfg, params, batch: int, num_slots: int) -> int:
    """Bytes one decode step reads at least: all params (a mixture of experts reads only its
    routed experts: there this overcounts), and the KV cache
    k, v: [L, B, Hkv, S, Dh] in the compute dtype (`models.init_cache`), S = `num_slots`."""
    import jax
    import jax.numpy as jnp

    weights = sum(x.nbytes for x in jax.tree.leaves(params))
    cache = (2 * cfg.num_layers * batch * cfg.num_kv_heads * num_slots * cfg.head_dim
             * jnp.dtype(cfg.compute_dtype).itemsize)
    return int(weights + cache)


# --- paired statistics --------------------------------------------------------------


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


def median_rates(rounds, batch: int, prompt_len: int, new_steps: int) -> dict:
    """Medians of (prefill_s, decode_s) rounds as a row's seconds and tokens/s: prefill
    batch * prompt_len tokens, decode batch * new_steps tokens over new_steps steps."""
    pre = statistics.median(r[0] for r in rounds)
    dec = statistics.median(r[1] for r in rounds)
    return dict(prefill_s=round(pre, 4), decode_s=round(dec, 4),
                prefill_tok_s=round(batch * prompt_len / pre, 1),
                decode_tok_s=round(batch * new_steps / dec, 1),
                decode_ms_per_step=round(1000 * dec / new_steps, 2))


def paired_ratios(ours, theirs, new_tokens: int) -> dict:
    """ratio_prefill, ratio_decode = ours / theirs in tokens/s: the median over rounds of
    each round's ratio (paired samples, `paired_rounds`). Our decode makes N forwards, theirs
    N - 1 (their generate(1) includes the first): compared per step."""
    pre = [t[0] / o[0] for o, t in zip(ours, theirs)]
    dec = [(t[1] / (new_tokens - 1)) / (o[1] / new_tokens) for o, t in zip(ours, theirs)]
    return dict(ratio_prefill=round(statistics.median(pre), 3),
                ratio_decode=round(statistics.median(dec), 3))


# --- peer JSON ----------------------------------------------------------------------


def peer_rows(path: str, batches):
    """Yields the rows of a peer's JSON-lines file that compare with ours: a JSON object
    with batch, prefill_tok_s and decode_tok_s, `mode` absent or "greedy", and a batch in
    `batches`. Other lines (logs, other modes) are skipped."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if not {"batch", "prefill_tok_s", "decode_tok_s"} <= row.keys():
                continue
            if row.get("mode", "greedy") != "greedy" or row["batch"] not in batches:
                continue
            yield row


def peer_ratios(ours: dict, theirs: dict) -> dict:
    """ratio_prefill, ratio_decode = our tokens/s / the peer's (one measurement each, not
    paired: the peer ran in another process); {} without our row."""
    if ours is None:
        return {}
    return dict(ratio_prefill=round(ours["prefill_tok_s"] / theirs["prefill_tok_s"], 3),
                ratio_decode=round(ours["decode_tok_s"] / theirs["decode_tok_s"], 3))

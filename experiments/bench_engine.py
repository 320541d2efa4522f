r"""Rollout engine against static batches: useful tokens/s on the default model (CPU).

    python -m experiments.bench_engine                       # 32 rows = 8 prompts x K 4, E 8
    python -m experiments.bench_engine --prompts=16 --k=8 --slots=16 --new_tokens=256
    python -m experiments.bench_engine --new_tokens=256          # "cut": IFEval answers at 256
    python -m experiments.bench_engine --lengths=uniform         # every row to N (no stop)
    python -m experiments.bench_engine --prompt_tokens=1024 --k=8 --prompts=2 --slots=8
                                         # a group case: K = 8 rows of one 1,024-token prompt

The same rows, row ids and key go through `sampling.generate_engine` (E decode slots) and
`sampling.generate_chunked` (E rows a call), one call of each alternated per round
(`bench_common.paired_rounds`, after a warm-up that compiles). Useful tokens are those up
to each row's stop (the rollout's mask): a static call also spends steps on rows that have
stopped, the engine refills their slots. Prompts: IFEval's, from ../shared/data/ifeval
when it is there, else a few built-in ones; chat-formatted, K samples each at the given
temperature (so lengths differ). `--lengths=uniform` gives every row the same length: the
stop id is one no draw can give (-1), so every row runs to N and the engine can only lose
(its per-slot bookkeeping against static calls of equal rows).

Prints one JSON line per implementation and a line of paired ratios. Fields:
useful_tok_s, seconds (medians), lengths (p10/p50/p90/max of the rows' tokens),
steps (the engine's decode steps; the static calls' steps are their longest rows'),
prefills, same_tokens (share of rows whose tokens the two gave alike: row ids fix the
draws, so 1.0 up to float ties), peak_rss_mb, cache_bytes_per_slot (the engine: its
paged pool's bytes / E, the prompts' pages held once a prompt; static: a row's P + N
positions) and, on the ratio line, cache_per_slot_static_vs_engine. `--prompt_tokens=T`
makes every prompt T tokens (the IFEval text repeated and cut), so K rows share a long
prompt.
"""
from __future__ import annotations

import os
import statistics
import time

from absl import flags

from experiments import bench_common as bench
from experiments import cli
from experiments.bench_common import emit

_PROMPTS = flags.DEFINE_integer("prompts", 8, "distinct prompts")
_K = flags.DEFINE_integer("k", 4, "samples per prompt (rows = prompts x k)")
_SLOTS = flags.DEFINE_integer("slots", 8, "E: engine slots, and the static rows per call")
_NEW = flags.DEFINE_integer("new_tokens", 128, "N, most new tokens a row")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "sampling temperature")
_REPS = flags.DEFINE_integer("reps", 2, "alternated rounds after the warm-up")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the key and of the prompts drawn")
_PROMPT_TOKENS = flags.DEFINE_integer("prompt_tokens", 0, "make every prompt this many "
                                      "tokens (0: the prompts as they are)")
_LENGTHS = flags.DEFINE_enum("lengths", "model", ["model", "uniform"],
                             "model: rows stop where the model's answers stop (or at N); "
                             "uniform: no stop id, every row runs to N")

BUILT_IN = ("Name three primary colours.", "Write a haiku about rain.",
            "What is 17 times 3? Explain briefly.", "Give two tips for learning to cook.",
            "Describe a cat in one sentence.", "List four European capitals.",
            "Why is the sky blue?", "Write a limerick about a robot.")


def prompt_texts(count: int, seed: int) -> list[str]:
    """`count` IFEval prompts drawn with `seed` (../shared/data/ifeval/input_data.jsonl),
    else the built-in ones, cycled."""
    import numpy as np

    from drubric_jax.evaluation import ifeval

    path = ifeval.default_data_path(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.exists(path):
        texts = [row["prompt"] for row in ifeval.read_rows(path)]
        order = np.random.default_rng(seed).permutation(len(texts))
        return [texts[i] for i in order[:count]]
    return [BUILT_IN[i % len(BUILT_IN)] for i in range(count)]


def run(prompts: int, k: int, slots: int, new_tokens: int, temperature: float, reps: int,
        seed: int, length_mode: str = "model", prompt_tokens: int = 0) -> None:
    """Measures and prints (module docstring). The default model, float32, one device."""
    import jax
    import numpy as np

    from drubric_jax import models, sampling
    from drubric_jax.text.tokenizer import chat_ids, stop_ids

    cfg, params, tok = models.load_default()
    texts = prompt_texts(prompts, seed)
    if prompt_tokens:  # each prompt's text repeated, its chat ids cut to prompt_tokens
        texts = [" ".join([t] * (prompt_tokens // max(len(t.split()), 1) + 1)) for t in texts]
    chats = [chat_ids(tok, [{"role": "user", "content": t}]) for t in texts]
    if prompt_tokens:
        chats = [c[:prompt_tokens] for c in chats]
    rows = [c for c in chats for _ in range(k)]
    ids = list(range(len(rows)))
    # uniform: a stop id no draw gives (-1), and the tokenizer's pad for the prompts.
    stops = stop_ids(tok).tolist() if length_mode == "model" else [-1]
    kw = dict(key=jax.random.PRNGKey(seed), max_new_tokens=new_tokens,
              method=sampling.method_from_flags(temperature), stop_ids=stops,
              pad_id=int(stop_ids(tok)[0]), row_ids=ids)
    out, stats = {}, {}

    def timed(name, fn):
        def call():
            t0 = time.perf_counter()
            out[name] = fn()
            return (time.perf_counter() - t0,)
        return call

    timers = {
        "engine": timed("engine", lambda: sampling.generate_engine(
            params, cfg, rows, num_slots=slots, stats=stats, **kw)),
        "static": timed("static", lambda: sampling.generate_chunked(
            params, cfg, rows, slots, **kw))}
    res = bench.paired_rounds(timers, reps)
    useful = {name: int(r.mask.sum()) for name, r in out.items()}
    lengths = out["engine"].lengths
    same = float(np.mean([np.array_equal(a, b) for a, b in
                          zip(out["engine"].tokens, out["static"].tokens)]))
    static_steps = sum(int(out["static"].lengths[i:i + slots].max())
                       for i in range(0, len(rows), slots))
    seconds = {}
    token_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * cfg.compute_dtype.itemsize
    p_bucket = sampling.bucket_length(max(map(len, rows)), 16)
    per_slot = {"engine": stats["pool_pages"] * stats["page_size"] * token_bytes / slots,
                "static": (p_bucket + new_tokens) * token_bytes}
    for name in ("engine", "static"):
        seconds[name] = statistics.median(r[0] for r in res[name]["rounds"])
        emit(impl=name, rows=len(rows), prompts=prompts, k=k, slots=slots,
             new_tokens=new_tokens, temperature=temperature, length_mode=length_mode,
             useful_tokens=useful[name],
             seconds=round(seconds[name], 3),
             useful_tok_s=round(useful[name] / seconds[name], 1),
             first_s=round(res[name]["first"][0], 2),
             steps=stats.get("steps") if name == "engine" else static_steps,
             prefills=stats.get("prefills") if name == "engine" else len(rows),
             lengths={f"p{q}": int(np.percentile(lengths, q)) for q in (10, 50, 90)}
             | {"max": int(lengths.max())}, peak_rss_mb=round(bench.peak_rss_mb(), 1),
             cache_bytes_per_slot=int(per_slot[name]), prompt_bucket=p_bucket,
             waits=stats.get("waits") if name == "engine" else None)
    ratios = [s[0] / e[0] for e, s in zip(res["engine"]["rounds"], res["static"]["rounds"])]
    emit(impl="engine_vs_static", speedup_per_round=[round(r, 3) for r in ratios],
         speedup_median=round(statistics.median(ratios), 3), same_tokens=round(same, 3),
         cache_per_slot_static_vs_engine=round(per_slot["static"] / per_slot["engine"], 2))


def main(argv):
    del argv
    run(_PROMPTS.value, _K.value, _SLOTS.value, _NEW.value, _TEMPERATURE.value, _REPS.value,
        _SEED.value, _LENGTHS.value, _PROMPT_TOKENS.value)


if __name__ == "__main__":
    cli.run(main)

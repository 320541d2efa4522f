"""Host cost per token of JSON-constrained decoding (mask fill + transfer), before vs after.

    python -m experiments.bench_constrained                         # B = 8, 64, 256; two V
    python -m experiments.bench_constrained --batches=8 --vocabs=49152 --threads=4

Workload: B rows, each replaying its own rubric JSON document (`RUBRIC_JSON_SCHEMA(5, 200)`:
1-5 items of 2-30 random words, weights 1-5, from `--seed`) tokenized by the SmolLM2
tokenizer, the tokens a model would sample, through one llguidance matcher per row. Rows end
at different steps (their documents' lengths + one stop token), as in a real batch. A
vocabulary larger than the tokenizer (151936, Qwen's) is emulated by the SmolLM2 tokenizer
padded to V ids (llguidance never allows the extra ids): masks and transfers have V's size,
while the fill costs what the 49152-token tokenizer costs (a real 151936-token tokenizer
fills slower).

Per decode step (one token for each of the B rows), the host wall time of
- before (the code this replaced): every row's mask filled one after the other
  (`fill_next_token_bitmask`), unpacked to bool[B, V] with `np.unpackbits`, sent with
  `jnp.asarray` (waited for), and each live row's token consumed one after the other;
- after: `JsonSchemaConstraint.advance` and `.fill` (llguidance's threads; rows still inside
  their JSON value only) into int32[B, ceil(V / 32)], sent with `jnp.asarray` (waited for).
`constrained.decode` runs the after-work while the device runs the step's forward, so it
costs decoding time only where it is longer than the forward.

Output, one JSON object per (V, B): `before_ms_per_token`, `after_ms_per_token` (mean over
the steps until every row ended; the fastest of `--host_reps` replays, which alternate
between the two paths, since other processes on the machine only add time) and their parts
(`*_fill_ms`, `before_unpack_ms`, `*_send_ms`, `*_advance_ms`), `speedup`, `before_mb_sent`
/ `after_mb_sent` per step, `before_fills` / `after_fills` (row masks computed), and the
device cost of applying the mask to float32[B, V] logits (median of `--reps` jitted calls on
random data):
`device_apply_bool_ms` (`where(mask, logits, -inf)`, the old step) and
`device_apply_bitmask_ms` (`where(unpack_bitmask(words), logits, -inf)`, the new one); their
difference `device_unpack_ms` is what unpacking on the device costs.
"""
from __future__ import annotations

import json

from absl import flags
from experiments import cli  # noqa: E402

from experiments.bench_common import emit, median_seconds, timed

_BATCHES = flags.DEFINE_list("batches", ["8", "64", "256"], "batch sizes B")
_VOCABS = flags.DEFINE_list("vocabs", ["49152", "151936"],
                            "V; above the tokenizer's 49152 the extra ids are padding")
_THREADS = flags.DEFINE_integer("threads", 0, "llguidance threads (0: its default)")
_HOST_REPS = flags.DEFINE_integer("host_reps", 3, "replays per path, alternating (fastest kept)")
_REPS = flags.DEFINE_integer("reps", 5, "repetitions of the device-cost calls (median)")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the documents and the random masks")

MAX_ITEMS, MAX_CHARS = 5, 200
WORDS = ("the response states a correct final answer and explains each step clearly without "
         "errors or irrelevant content it follows the requested format cites sources gives "
         "units checks edge cases").split()


def _documents(tok, batch: int, rng) -> list:
    """B token lists, each a compact JSON document of RUBRIC_JSON_SCHEMA(5, 200)."""
    docs = []
    for _ in range(batch):
        items = []
        for _ in range(rng.integers(1, MAX_ITEMS + 1)):
            text = " ".join(rng.choice(WORDS, rng.integers(2, 31)))[:MAX_CHARS]
            items.append({"rubric": text, "weight": int(rng.integers(1, 6))})
        doc = json.dumps({"rubrics": items}, separators=(",", ":"))
        docs.append(tok.encode(doc, add_special_tokens=False))
    return docs


def host_costs(constraint, docs, vocab: int, before: bool) -> dict:
    """Replays `docs` through `constraint`'s matchers; returns the per-step host times (ms).

    Step s fills the masks of the rows that have not ended (row r ends at step len(docs[r]),
    its stop token), sends them, then feeds each row its token s.
    """
    import jax
    import jax.numpy as jnp
    import llguidance.numpy as lln
    import numpy as np

    from drubric_jax.sampling import constrained

    b = len(docs)
    lengths = np.array([len(d) for d in docs])
    constraint.reset(b)
    words = np.full((b, constrained.bitmask_words(vocab)), -1, np.int32)
    parts = dict(fill=0.0, unpack=0.0, send=0.0, advance=0.0)
    steps = int(lengths.max()) + 1
    for s in range(steps):
        live = s <= lengths  # rows that have not emitted their stop token
        if before:
            _, dt = timed(lambda: [lln.fill_next_token_bitmask(m, words, i)
                                   for i, m in enumerate(constraint.matchers)])
            constraint.fills += 1
            parts["fill"] += dt
            allowed, dt = timed(lambda: np.unpackbits(words.view(np.uint8), axis=-1,
                                                      bitorder="little")[:, :vocab].astype(bool))
            parts["unpack"] += dt
            _, dt = timed(lambda: jax.block_until_ready(jnp.asarray(allowed)))
        else:
            _, dt = timed(constraint.fill, words, live)
            parts["fill"] += dt
            _, dt = timed(lambda: jax.block_until_ready(jnp.asarray(words)))
        parts["send"] += dt
        tokens = np.array([d[s] if s < len(d) else 0 for d in docs], np.int32)
        feed = s < lengths
        if before:
            _, dt = timed(lambda: [m.consume_token(int(tokens[i]))
                                   for i, m in enumerate(constraint.matchers)
                                   if feed[i] and not m.is_stopped()])
        else:
            _, dt = timed(constraint.advance, tokens, feed)
        parts["advance"] += dt
    if any(constraint.errors()) or not constraint.finished().all():
        raise RuntimeError(f"a document was rejected: {constraint.errors()}")
    out = {k: round(1000 * v / steps, 3) for k, v in parts.items()}
    out["ms_per_token"] = round(sum(out.values()), 3)
    out["fills"] = int(constraint.fills.sum())
    return out


def device_costs(batch: int, vocab: int, reps: int, seed: int) -> dict:
    """Median ms of applying a bool[B, V] mask vs an int32[B, W] bitmask to random logits."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from drubric_jax.sampling import constrained

    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.standard_normal((batch, vocab), np.float32))
    words = rng.integers(-2**31, 2**31, (batch, constrained.bitmask_words(vocab)))
    words = jnp.asarray(words.astype(np.int32))
    allowed = constrained.unpack_bitmask(words, vocab)
    by_bool = jax.jit(lambda x, m: jnp.where(m, x, -jnp.inf))
    by_bits = jax.jit(lambda x, w: jnp.where(constrained.unpack_bitmask(w, vocab), x, -jnp.inf))
    if not bool(jnp.array_equal(by_bool(logits, allowed), by_bits(logits, words))):
        raise RuntimeError("bitmask and bool mask disagree")

    def median_ms(fn, *args):
        # Both programs already ran once (the agreement check above): no warm-up call.
        return 1000 * median_seconds(fn, *args, reps=reps, warmup=False)

    bool_ms, bits_ms = median_ms(by_bool, logits, allowed), median_ms(by_bits, logits, words)
    return dict(device_apply_bool_ms=round(bool_ms, 3), device_apply_bitmask_ms=round(bits_ms, 3),
                device_unpack_ms=round(bits_ms - bool_ms, 3))


def main(argv):
    del argv
    import jax
    import numpy as np

    from drubric_jax import models
    from drubric_jax.sampling import constrained
    from drubric_jax.text import tokenizer as tok_lib
    from drubric_jax.text.rubric_format import RUBRIC_JSON_SCHEMA

    tok = tok_lib.tokenizer_from_gguf(models.default_gguf_path())
    schema = RUBRIC_JSON_SCHEMA(MAX_ITEMS, MAX_CHARS)
    emit(devices=str(jax.devices()), tokenizer_size=len(tok))
    for vocab in (int(v) for v in _VOCABS.value):
        c = constrained.JsonSchemaConstraint(tok, schema, vocab, tok.eos_token_id,
                                             num_threads=_THREADS.value or None)
        for b in (int(x) for x in _BATCHES.value):
            docs = _documents(tok, b, np.random.default_rng(_SEED.value))
            runs = [(host_costs(c, docs, vocab, before=True),
                     host_costs(c, docs, vocab, before=False)) for _ in range(_HOST_REPS.value)]
            before = min((r[0] for r in runs), key=lambda r: r["ms_per_token"])
            after = min((r[1] for r in runs), key=lambda r: r["ms_per_token"])
            row = dict(vocab=vocab, batch=b, steps=max(map(len, docs)) + 1,
                       before_ms_per_token=before.pop("ms_per_token"),
                       after_ms_per_token=after.pop("ms_per_token"))
            row["speedup"] = round(row["before_ms_per_token"] / row["after_ms_per_token"], 2)
            row.update({f"before_{k}" + ("" if k == "fills" else "_ms"): v
                        for k, v in before.items()})
            row.update({f"after_{k}" + ("" if k == "fills" else "_ms"): v
                        for k, v in after.items() if k != "unpack"})
            row.update(before_mb_sent=round(b * vocab / 2**20, 2),
                       after_mb_sent=round(4 * b * constrained.bitmask_words(vocab) / 2**20, 2))
            row.update(device_costs(b, vocab, _REPS.value, _SEED.value))
            emit(**row)


if __name__ == "__main__":
    cli.run(main)

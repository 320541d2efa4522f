"""Anchor lists of the checks world (METHOD 13): K sampled responses per prompt, ranked by
the gold score g(x, y), the fraction of the prompt's true checks met (strict; IFEval's
instruction-level accuracy for one prompt, Zhou et al. 2023, arXiv:2311.07911).

    python -m experiments.make_checks_anchors --prompts=../checks_world/train.jsonl \\
        --out=../checks_world/anchors.jsonl --k=4 --temperature=0.7 \\
        --max_new_tokens=256 --limit=64

--prompts is a file of experiments.make_checks_data (prompt rows with `meta["checks"]`).
World v2's files are splits (`drubric_jax.data.splits`), one anchor file per split that
needs them (gen_sft, gen_rl, dev, heldout), written next to it as <split>_anchors.jsonl:

    python -m experiments.make_checks_anchors --split=gen_rl \\
        --prompts=../checks_world_v2_splits/gen_rl.jsonl \\
        --out=../checks_world_v2_splits/gen_rl_anchors.jsonl --k=8 --temperature=1.0 \\
        --max_new_tokens=64

--split names the split the prompts must be (checked before the model loads: a row of
another split stops the command, naming the file, row and both splits); a file whose rows
carry a split needs it. Each anchor row keeps its prompt's meta, its split included.
Each prompt is one user turn in the model's chat template (`text.tokenizer.chat_ids`),
sampled K times by `sampling.generate` in fixed batches of --batch prompts (by position in
the file). Row i's k-th response draws with `row_ids` i * K + k under
`jax.random.PRNGKey(seed)`, so it is the same whatever else is decoded with it. A written
row (shared data schema, listwise):

    {"id": the prompt's id, "source": the prompt's source, "prompt": x,
     "responses": [K str, sample order], "scores": [K gold scores],
     "ranking": indices best first (stable: equal scores keep sample order),
     "ties": true when two scores are equal (the schema's mark: `scores` decides ranks),
     "meta": the prompt's meta + {"sampling": {model, k, temperature, max_new_tokens,
             seed, batch}, "truncated": [K bool]}}

Empty responses (an immediate end of turn) cannot be schema responses: they are dropped,
and a prompt left with fewer than 2 responses is not written (counted, "too_few").

Resumable: rows are appended one by one (flushed); on restart an incomplete last line
(a killed write) is truncated, prompts already written are skipped, and a batch holding
any unwritten prompt is decoded whole again, so a resumed run writes the same bytes as an
uninterrupted one. A resume with other sampling settings (or --batch) is refused; resume
with the same --limit, or extend it from a multiple of --batch, so no batch changes shape.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from absl import flags  # noqa: E402
from experiments import cli  # noqa: E402

from drubric_jax.evaluation.checks_anchors import gold_summary, write_anchors  # noqa: E402


def define_flags():
    """The command's flags (defined only when run as a command, so tests can import
    several experiment modules whose flag names overlap)."""
    flags.DEFINE_string("prompts", None, "make_checks_data JSONL", required=True)
    flags.DEFINE_string("out", None, "anchor JSONL (appended to / resumed)", required=True)
    flags.DEFINE_integer("k", 4, "responses per prompt")
    flags.DEFINE_string("model", "default", "'default' (smollm2-135m-instruct), a .gguf "
                        "path, a Hugging Face directory or a tiny preset")
    flags.DEFINE_integer("max_new_tokens", 256, "longest response, in tokens")
    flags.DEFINE_float("temperature", 0.7, "sampling temperature")
    flags.DEFINE_integer("seed", 0, "PRNG seed of the sampler (per-row keys)")
    flags.DEFINE_integer("limit", 0, "first N prompts only; 0 = all")
    flags.DEFINE_integer("batch", 8, "prompts decoded together (K rows each)")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "params dtype")
    flags.DEFINE_string("split", "", "world v2: the split of --prompts (gen_sft, gen_rl, "
                        "dev, heldout); required when its rows carry one")


def check_prompt_split(path: str, split: str, limit: int = 0) -> None:
    """Checks, before any model loads, that the first `limit` rows (0: all) of the prompt
    file `path` are of `split` (`data.splits.require_split`); with no split given, that
    no row carries one.

    Raises:
        ValueError: a split without anchor lists; a row of another split, or a split file
            without --split (names the file, row and split).
    """
    from drubric_jax.data import splits
    from drubric_jax.data.schema import load_jsonl

    rows = load_jsonl(path)
    rows = rows[:limit] if limit else rows
    if split:
        splits.anchor_file(split)  # raises for a split without anchor lists (policy)
        splits.require_split(rows, split, f"--prompts: {path}",
                             stage=f"--split={split} (its anchor lists)")
        return
    for r in rows:
        if splits.split_of(r.meta) is not None:
            raise ValueError(f"--prompts: {path}:{r.line}: row {r.id!r}: field "
                             f"'{splits.SPLIT_FIELD}' is {splits.split_of(r.meta)!r}: pass "
                             f"--split={splits.split_of(r.meta)} (a split world's file)")


def main(argv):
    del argv
    from drubric_jax import models

    f = flags.FLAGS
    if not os.path.isfile(f.prompts):  # before the model loads: say what builds it
        raise SystemExit(f"error: --prompts: no such file {f.prompts}\nBuild the checks "
                         "world's prompts first: python -m experiments.make_checks_data "
                         "--version=2 --out=DIR (its split files, e.g. gen_rl.jsonl)")
    try:
        check_prompt_split(f.prompts, f.split, f.limit)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    source = models.DEFAULT_MODEL if f.model == "default" else f.model
    cfg, params, tokenizer = models.load_model(source, f.dtype)
    stats = write_anchors(f.prompts, f.out, cfg, params, tokenizer, k=f.k,
                          max_new_tokens=f.max_new_tokens, temperature=f.temperature,
                          seed=f.seed, limit=f.limit, batch=f.batch, model_name=source)
    print(json.dumps({**stats, **gold_summary(f.out)}), flush=True)


if __name__ == "__main__":
    define_flags()
    cli.run(main)

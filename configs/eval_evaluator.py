r"""Evaluator benchmark config: rubric generator + frozen verifier on ranked response sets.

    python -m experiments.eval_evaluator --config=configs/eval_evaluator.py \
        --config.data=../shared/data/judgebench/gpt.jsonl --config.max_rows=20 \
        --workdir=runs/eval_judgebench
    python -m experiments.eval_evaluator --config=configs/eval_evaluator.py:tiny \
        --config.data=a.jsonl,b.jsonl --workdir=/tmp/eval_smoke

The argument after ':' is a comma-separated list of switches:
    tiny    random-weight tiny model (real SmolLM2 tokenizer) in both roles, short budgets
            (tests and smoke runs; numbers are meaningless).
    shared  every pairwise and listwise file of ../shared/data (SHARED_FILES) with the
            row cap, n and budgets of SHARED_CPU_RUN (docs/EXPERIMENTS.md, "Evaluator benchmark";
            74.3 min measured on 2 CPU cores, cold XLA cache, direct_set included).
Any field can then be overridden with --config.<field>=<value>. `validate(config)` checks
every field before any model is loaded.
"""
import os

import ml_collections

from configs.base import parse_switches
# The evaluators and the field checks live in the package (it imports no config module).
from drubric_jax.evaluation.benchmark_config import METHODS, validate  # noqa: F401

SHARED_FILES = (
    "judgebench/gpt.jsonl", "judgebench/claude.jsonl",
    "rm_bench/chat.jsonl", "rm_bench/code.jsonl", "rm_bench/safety_refuse.jsonl",
    "rm_bench/safety_response.jsonl",
    "llmbar/natural.jsonl", "llmbar/adversarial_neighbor.jsonl",
    "llmbar/adversarial_gptinst.jsonl", "llmbar/adversarial_gptout.jsonl",
    "llmbar/adversarial_manual.jsonl",
    "llmbar_processed/mt_bench_human.jsonl", "llmbar_processed/faireval.jsonl",
    "llmbar_processed/llmeval2.jsonl",
    "pandalm/test.jsonl", "hh_rlhf_harmless/test.jsonl", "alpaca_eval_listwise/test.jsonl",
)
"""Every pairwise and listwise file of ../shared/data (paths under data/)."""

SHARED_CPU_RUN = dict(
    max_rows=4,          # rows per file, = rows_per_batch (one generator batch per file)
    rows_per_batch=4,
    n_samples=2,         # AVG@2
    max_k=4,             # K cap (RM-Bench 6 -> 4, AlpacaEval listwise 7 -> 4)
    max_items=4,         # M_max (the verifier's cost grows with the items per row)
    max_item_chars=100,  # shorter criteria, fewer decode steps
    max_new_tokens=192,  # SmolLM2 lists of <= 6 items took <= 155 tokens
    generator_input_budget=1024,  # the generator template alone takes ~450 tokens
    verifier_max_prefix_tokens=448,
    judge_max_tokens=512,
    calibration="contextual",
    methods="dynamic,static,direct,direct_set,random",
)
"""The `shared` switch: caps sized so all SHARED_FILES fit in about an hour on 2 CPU cores
with SmolLM2-135M (measured 42.9 min without direct_set on 2026-12-01; 74.3 min with it on
2026-12-02, a slower day, cold cache, partly beside test runs; docs/EXPERIMENTS.md, "Evaluator
benchmark")."""


def get_config(arg: str = ""):
    opts = parse_switches(arg, {"tiny", "shared"})
    c = ml_collections.ConfigDict()
    c.data = ""               # comma-separated JSONL files of the shared schema (required)
    c.max_rows = 0            # rows evaluated per file (0 = all)
    c.row_subset = "random"   # which max_rows rows: "random" (seeded by seed and the file
    #                           name, kept in file order) | "first" (files are often sorted
    #                           by category, so the first rows may all be of one kind)
    c.methods = "dynamic,static,direct,random"  # comma-separated subset of METHODS
    c.n_samples = 3           # n of AVG@n: rubric lists per row and method (paper: 5)
    c.max_k = 0               # K cap; a row with more responses keeps a seeded random
    #                           subset of max_k (gold restricted to it); 0 = all responses
    c.generator_model = "smollm2-135m-instruct"  # default name, .gguf path, HF dir or "tiny"
    c.verifier_model = "smollm2-135m-instruct"   # same source as the generator = shared weights
    c.dtype = "float32"       # params and compute: float32 | bfloat16
    c.seed = 0                # all randomness (rows, orders, sampling, random scores,
    #                           bootstrap) derives from it
    c.calibration = "none"    # "none" | "contextual": also report the rubric evaluators on
    #                           contextually calibrated P(yes) (METHOD 12; one content-free
    #                           verifier row per benchmark row, in the same pass)
    c.n_bootstrap = 1000      # bootstrap replicates of every 95% CI (rows resampled)
    c.temperature = 0.7       # generator sampling temperature (0 = greedy; lists then differ
    #                           only through the response order)
    c.max_items = 6           # M_max, items per rubric list (JSON schema maxItems)
    c.max_item_chars = 120    # characters per criterion (JSON schema maxLength)
    c.max_new_tokens = 256    # generator output budget, tokens (a longer list is invalid)
    c.generator_input_budget = 1024   # generator prompt budget, tokens (paper: 24K); a power
    #                                   of two wastes no padding (prompts are bucketed)
    c.verifier_max_prefix_tokens = 960   # instructions + request + response, tokens
    #                                      (960 keeps the prefix in the 1024 bucket)
    c.verifier_max_suffix_tokens = 64    # criterion question + answer opener, tokens
    c.judge_max_tokens = 1024  # direct / pairwise / direct_set judge prompt budget, tokens
    c.rows_per_batch = 4      # rows whose rubric lists are sampled in one generator batch
    c.html_max_examples = 40  # examples per file written to trace.html
    c.progress = True         # tqdm bar per file (with ETA)
    c.jax_cache_dir = "~/.cache/drubric_jax/xla"  # persistent XLA compilation cache, reused
    #                           by later runs ("" = off)
    if opts.get("tiny"):
        c.generator_model = c.verifier_model = "tiny"
        c.n_samples = 2
        c.max_items = 3
        c.max_item_chars = 24
        c.max_new_tokens = 96
        c.generator_input_budget = 1024
        c.verifier_max_prefix_tokens = 256
        c.verifier_max_suffix_tokens = 64
        c.judge_max_tokens = 384
        c.rows_per_batch = 2
        c.n_bootstrap = 200
        c.jax_cache_dir = ""  # tests write nothing outside their tmp dirs
    if opts.get("shared"):
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        c.data = ",".join(os.path.normpath(os.path.join(repo, "..", "shared", "data", f))
                          for f in SHARED_FILES)
        c.update(SHARED_CPU_RUN)
    return c

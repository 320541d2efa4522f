r"""Policy evaluation config (METHOD 7; issue 13): win rate against reference answers with
a local pairwise judge, and HumanEval pass@1.

    python -m experiments.eval_policy --config=configs/eval_policy.py --workdir=runs/evalp_p0
    python -m experiments.eval_policy --config=configs/eval_policy.py \
        --config.policy_model=runs/default/export/policy --workdir=runs/evalp_p1
    python -m experiments.eval_policy --config=configs/eval_policy.py:tiny --workdir=/tmp/ep

The argument after ':' is a comma-separated list of switches:
    tiny    random-weight tiny models as policy and judge, a few prompts and problems,
            short budgets (tests and smoke runs; numbers are meaningless).
CPU size (the default): SmolLM2-135M as policy and as judge, 32 prompts each from
AlpacaEval (gpt4_1106_preview references) and Arena-Hard v0.1 (gpt-4-0314 references),
a seeded random subset per file, greedy answers of <= 256 tokens; the first 40 HumanEval
problems (of 164), greedy, <= 384 tokens, 5 s per test run. Any field can be overridden
with --config.<field>=<value>; `validate(config)` checks every field before any model
loads.
"""
import os

import ml_collections

from configs.base import parse_switches

TASKS = ("winrate", "humaneval")
SHARED_PROMPT_FILES = ("alpaca_eval/eval.jsonl", "arena_hard/v0.1.jsonl")


def get_config(arg: str = ""):
    opts = parse_switches(arg, {"tiny"})
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    c = ml_collections.ConfigDict()
    c.policy_model = "smollm2-135m-instruct"  # preset name, .gguf path or HF dir (an export)
    c.judge_model = "smollm2-135m-instruct"   # the pairwise judge (a frozen verifier)
    c.dtype = "float32"        # params and compute of both: float32 | bfloat16
    c.tasks = "winrate,humaneval"  # comma-separated subset of TASKS
    # Prompt files with a "reference" answer per row (the shared prompt-only sets).
    c.winrate_data = ",".join(os.path.normpath(os.path.join(repo, "..", "shared", "data", f))
                              for f in SHARED_PROMPT_FILES)
    c.winrate_rows = 32        # prompts per file: a seeded random subset (0 = all)
    c.humaneval_problems = 40  # the first N HumanEval problems (0 = all 164)
    c.max_prompt_tokens = 512  # policy chat prompt budget, tokens
    c.max_new_tokens = 256     # answer budget of the win-rate prompts, tokens
    c.humaneval_max_new_tokens = 384  # answer budget of HumanEval, tokens
    c.temperature = 0.0        # policy sampling temperature (0 = greedy)
    c.judge_max_tokens = 1024  # pairwise judge prompt budget, tokens (texts cut to it)
    c.timeout_s = 5.0          # seconds a HumanEval test run may take
    c.rows_per_call = 0        # sampler micro-batch (0 = all rows in one call)
    # Mesh of both models (sharding.make_mesh; -1 = the remaining devices): by default the
    # params are split over every device on fsdp and the rows over the same devices.
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
    c.seed = 0                 # row subsets, sampling key and bootstrap
    c.n_bootstrap = 1000       # replicates of every 95% CI
    c.jax_cache_dir = "~/.cache/drubric_jax/xla"  # persistent XLA compilation cache ("" = off)
    if opts.get("tiny"):
        c.policy_model = c.judge_model = "tiny"
        c.winrate_data = os.path.join(repo, "drubric_jax", "demo_data", "anchors.jsonl")
        c.winrate_rows = 3
        c.humaneval_problems = 2
        c.max_prompt_tokens = 256
        c.max_new_tokens = c.humaneval_max_new_tokens = 16
        c.judge_max_tokens = 384
        c.n_bootstrap = 200
        c.jax_cache_dir = ""
    return c


def validate(c: ml_collections.ConfigDict) -> None:
    """Checks every field; raises ValueError("config.<field>: ...") on the first bad one."""
    def need(ok, field, msg):
        if not ok:
            raise ValueError(f"config.{field}: {msg}")

    tasks = [t.strip() for t in c.tasks.split(",") if t.strip()]
    need(tasks and set(tasks) <= set(TASKS), "tasks", f"a non-empty subset of {TASKS}")
    if "winrate" in tasks:
        paths = [p.strip() for p in c.winrate_data.split(",") if p.strip()]
        need(paths, "winrate_data", "give one or more JSONL paths (comma-separated)")
        for p in paths:
            need(os.path.isfile(p), "winrate_data", f"file not found: {p}")
    need(c.winrate_rows >= 0, "winrate_rows", "must be >= 0 (0 = all)")
    need(0 <= c.humaneval_problems <= 164, "humaneval_problems", "must be in 0..164 (0 = all)")
    need(c.max_prompt_tokens >= 32, "max_prompt_tokens", "must be >= 32")
    for field in ("max_new_tokens", "humaneval_max_new_tokens"):
        need(c[field] >= 1, field, "must be >= 1")
    need(c.temperature >= 0, "temperature", "must be >= 0")
    need(c.judge_max_tokens >= 128, "judge_max_tokens", "must be >= 128")
    need(c.timeout_s > 0, "timeout_s", "must be > 0")
    need(c.rows_per_call >= 0, "rows_per_call", "must be >= 0")
    need(c.n_bootstrap >= 1, "n_bootstrap", "must be >= 1")
    need(c.dtype in ("float32", "bfloat16"), "dtype", "float32 | bfloat16")
    for field in ("policy_model", "judge_model"):
        need(bool(c[field]), field, "must name a model source")

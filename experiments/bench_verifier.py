r"""Verifier throughput: prefix sharing vs one full prompt per (response, item) pair.

    python -m experiments.bench_verifier                        # K=8, M=8, default model
    python -m experiments.bench_verifier --max_prefix_tokens=448 --k=8 --m=8

Workload: the first K/2 JudgeBench rows (../shared/data/judgebench/gpt.jsonl; two responses
each) give K (prompt, response) pairs with real lengths, cut to `--max_prefix_tokens` by the
verifier's budget (most JudgeBench prompts + responses are longer); M rubric items of
typical length. Each mode runs in its own child process (so `peak_rss_mb`, the process's
peak resident memory, belongs to that mode); inside it a compile call runs first (prefix
sharing: the full call; naive: the first response only, which has the same chunk shape),
then the full `Verifier.p_yes` call `--reps` times (median).

Output, one JSON object per line:
    {"mode": "prefix_shared" | "naive", "K", "M", "judgements_per_s", "seconds",
     "warmup_s", "peak_rss_mb", "prefix_tokens_mean", "prefix_tokens_max",
     "suffix_tokens_mean", "max_abs_dp_vs_naive" (prefix_shared only)}
then {"speedup": prefix_shared / naive judgements_per_s}. Without the data file, one line
{"skipped": "<why>"} is printed.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from absl import flags
from experiments import cli  # noqa: E402

from experiments.bench_common import emit, peak_rss_mb, timed

_MODE = flags.DEFINE_enum("mode", None, ["prefix_shared", "naive"],
                          "run one mode in this process (default: both, in child processes)")
_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "model source")
_DATA = flags.DEFINE_string("data", "", "JudgeBench JSONL (default ../shared/data/...)")
_K = flags.DEFINE_integer("k", 8, "K, (prompt, response) pairs")
_M = flags.DEFINE_integer("m", 8, "M, rubric items per response")
_PREFIX = flags.DEFINE_integer("max_prefix_tokens", 960,
                               "verifier prefix budget (960 + a <= 64-token suffix fits the "
                               "1024 bucket of the naive path; the eval config's value)")
_SUFFIX = flags.DEFINE_integer("max_suffix_tokens", 64, "verifier suffix budget")
_REPS = flags.DEFINE_integer("reps", 1, "timed repetitions after the compile call")
_OUT = flags.DEFINE_string("p_out", "", "where a child writes its P(yes) (.npy)")

ITEMS = [
    "The response gives a single, clearly stated final answer.",
    "The final answer is correct.",
    "The response shows the reasoning steps that lead to its answer.",
    "Each reasoning step follows logically from the previous one.",
    "The response answers the question that was actually asked.",
    "The response follows every format requirement stated in the request.",
    "The response contains no factual errors.",
    "The response is free of irrelevant or repeated content.",
]


def _default_data() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "shared", "data", "judgebench", "gpt.jsonl")


def _pairs(path: str, k: int):
    from drubric_jax import data

    rows = data.load_jsonl(path)
    pairs = [(r.prompt, y) for r in rows for y in r.responses]
    if len(pairs) < k:
        raise ValueError(f"{path} has only {len(pairs)} (prompt, response) pairs < K={k}")
    return pairs[:k]


def _items(m: int):
    return [ITEMS[i % len(ITEMS)] + ("" if i < len(ITEMS) else f" (check {i})")
            for i in range(m)]


def run_mode(mode: str) -> dict:
    """Times `Verifier.p_yes` in one mode; returns the JSON row."""
    import numpy as np

    from drubric_jax.models import load_model
    from drubric_jax.evaluator.verifier import Verifier

    pairs = _pairs(_DATA.value or _default_data(), _K.value)
    items = _items(_M.value)
    cfg, params, tok = load_model(_MODEL.value)
    ver = Verifier(cfg, tok, _PREFIX.value, _SUFFIX.value)
    prompts, responses = [p for p, _ in pairs], [y for _, y in pairs]
    shared = mode == "prefix_shared"
    # Compile call. Naive: the first response's M prompts already have the timed call's
    # chunk shape (rows x bucket; every JudgeBench prefix is cut to the same budget), so
    # the expensive naive pass is not run twice. Prefix sharing: the full (cheap) call.
    warm = slice(None) if shared else slice(0, 1)
    _, first = timed(ver.p_yes, params, prompts[warm], responses[warm], items,
                     shared_prefix=shared)
    times = []
    for _ in range(_REPS.value):
        p, dt = timed(ver.p_yes, params, prompts, responses, items, shared_prefix=shared)
        times.append(dt)
    sec = statistics.median(times)
    prepared = [ver.prepare(a, b, items) for a, b in pairs]
    pre = [len(x) for x, _ in prepared]
    suf = [len(s) for _, sufs in prepared for s in sufs]
    if _OUT.value:
        np.save(_OUT.value, p)
    return {"mode": mode, "K": _K.value, "M": _M.value,
            "judgements_per_s": round(_K.value * _M.value / sec, 3),
            "seconds": round(sec, 3), "warmup_s": round(first, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "prefix_tokens_mean": round(float(np.mean(pre)), 1),
            "prefix_tokens_max": int(max(pre)),
            "suffix_tokens_mean": round(float(np.mean(suf)), 1)}


def main(argv):
    del argv
    path = _DATA.value or _default_data()
    if not os.path.exists(path):
        print(json.dumps({"skipped": f"JudgeBench file not found: {path} "
                                     f"(pass --data=.../judgebench/gpt.jsonl)"}))
        return
    if _MODE.value:
        emit(**run_mode(_MODE.value))
        return
    import tempfile

    import numpy as np

    rows, p_files = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("prefix_shared", "naive"):
            p_files[mode] = os.path.join(tmp, f"{mode}.npy")
            args = [sys.executable, "-m", "experiments.bench_verifier", f"--mode={mode}",
                    f"--p_out={p_files[mode]}", f"--data={path}"] + [
                f"--{f}={getattr(sys.modules[__name__], v).value}" for f, v in (
                    ("model", "_MODEL"), ("k", "_K"), ("m", "_M"),
                    ("max_prefix_tokens", "_PREFIX"), ("max_suffix_tokens", "_SUFFIX"),
                    ("reps", "_REPS"))]
            out = subprocess.run(args, capture_output=True, text=True, check=True)
            rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        dp = float(np.abs(np.load(p_files["prefix_shared"]) - np.load(p_files["naive"])).max())
    rows["prefix_shared"]["max_abs_dp_vs_naive"] = dp
    for mode in ("prefix_shared", "naive"):
        emit(**rows[mode])
    emit(speedup=round(rows["prefix_shared"]["judgements_per_s"]
                       / rows["naive"]["judgements_per_s"], 2))


if __name__ == "__main__":
    cli.run(main)

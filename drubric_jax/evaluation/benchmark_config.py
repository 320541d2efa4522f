"""The evaluator benchmark's config rules: its evaluators (`METHODS`) and the check of
every field of a configs/eval_evaluator.py config (`validate`), kept in the package so that
`evaluation.benchmark` imports no config module (configs/ sits above the package).
"""
from __future__ import annotations

import os

import ml_collections

from drubric_jax.evaluator.verdicts import CALIBRATIONS

METHODS = ("dynamic", "static", "direct", "direct_set", "random")
"""Evaluators (METHOD sections 6, 7): dynamic rubrics from (x, C); static (RaR) rubrics
from x only; direct pointwise yes/no judge (pairs: also the pairwise question in both
orders); direct_set, the pointwise judge shown the whole set; random scores (floor)."""


def validate(c: ml_collections.ConfigDict) -> None:
    """Checks every field; raises ValueError("config.<field>: ...") on the first bad one."""
    def need(ok, field, msg):
        if not ok:
            raise ValueError(f"config.{field}: {msg}")

    paths = [p for p in c.data.split(",") if p.strip()]
    need(paths, "data", "give one or more JSONL paths (comma-separated)")
    for p in paths:
        need(os.path.isfile(p.strip()), "data", f"file not found: {p.strip()}")
    methods = [m.strip() for m in c.methods.split(",") if m.strip()]
    need(methods, "methods", f"choose from {METHODS}")
    for m in methods:
        need(m in METHODS, "methods", f"unknown method {m!r}; known: {METHODS}")
    need(len(set(methods)) == len(methods), "methods", "a method is listed twice")
    need(c.max_rows >= 0, "max_rows", "must be >= 0")
    need(c.n_samples >= 1, "n_samples", "must be >= 1")
    need(c.max_k == 0 or c.max_k >= 2, "max_k", "must be 0 (all) or >= 2")
    need(c.dtype in ("float32", "bfloat16"), "dtype", "float32 | bfloat16")
    need(c.temperature >= 0, "temperature", "must be >= 0")
    need(1 <= c.max_items <= 64, "max_items", "must be in 1..64")
    need(c.max_item_chars >= 8, "max_item_chars", "must be >= 8")
    need(c.max_new_tokens >= 16, "max_new_tokens", "must be >= 16")
    need(c.generator_input_budget >= 128, "generator_input_budget", "must be >= 128")
    need(c.verifier_max_prefix_tokens >= 64, "verifier_max_prefix_tokens", "must be >= 64")
    need(c.verifier_max_suffix_tokens >= 32, "verifier_max_suffix_tokens", "must be >= 32")
    need(c.judge_max_tokens >= 128, "judge_max_tokens", "must be >= 128")
    need(c.rows_per_batch >= 1, "rows_per_batch", "must be >= 1")
    need(c.row_subset in ("random", "first"), "row_subset", "random | first")
    need(c.calibration in CALIBRATIONS, "calibration", f"one of {CALIBRATIONS}")
    need(c.n_bootstrap >= 1, "n_bootstrap", "must be >= 1")
    need(c.html_max_examples >= 0, "html_max_examples", "must be >= 0")
    for field in ("generator_model", "verifier_model"):
        src = getattr(c, field)
        need(bool(src), field, "must name a model source")

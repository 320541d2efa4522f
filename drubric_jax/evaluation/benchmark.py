"""Evaluator benchmark: how well each evaluator orders human-ranked responses (METHOD 6, 7).

`evaluate(config, workdir)` is the one entry point (config: configs/eval_evaluator.py).

Evaluators (`benchmark_config.METHODS`):
- dynamic: G_phi(x, C) writes rubric lists from the whole candidate set; the frozen
  verifier answers every item for every response; Eq. 12 gives the scores.
- static: RaR-style lists from the prompt only, same verifier and Eq. 12.
- direct: the verifier's P(yes) to "is this a high-quality response?" per response. For
  pair rows the pairwise question "is A better than B?" is also asked in both orders and
  reported as direct_pairwise_ab / _ba / _avg with the first-position win rate (position
  bias).
- direct_set: the same pointwise judge with the whole response set shown as context.
- random: uniform random scores from the seed (the chance floor).

The rubric evaluators are reported once per verdict variant, all from ONE verifier pass
(METHOD 12): <evaluator>_hard (v = 1 iff P(yes) > 0.5, the paper) and <evaluator>_soft
(v = P(yes)); with config.calibration = "contextual" also _hard_ctx and _soft_ctx, the same
on the contextually calibrated P(yes).

Each rubric method is AVG@n: n independently sampled lists per row, each with a fresh
response order in the generator prompt. Deterministic judges (direct*) are computed once
and repeated n times.

Metrics (`aggregate`, METHOD 7 and 11): strict pairwise accuracy (a predicted tie is
wrong; gold-tied pairs skipped), accuracy with predicted ties excluded, tie rate, strict
top-1 and nDCG (listwise files), each with a seeded 95% bootstrap CI over rows; Delta_gap
(Eq. 2) and the RM-Bench splits without CI; seconds per row and rows per second per
method. "macro" averages every method over files (top-1 and nDCG over the listwise
files) with a stratified-bootstrap CI; "differences" are paired (soft - hard, calibrated
- raw), per file and macro.

Rows: max_rows per file (0 = all), the first ones or a seeded random subset
(config.row_subset); a row with more than max_k responses keeps a seeded subset.

Axis legend (docs/CONVENTIONS.md): K responses per row (2 pairs, 6 RM-Bench, 7 listwise;
at most max_k), M rubric items per list, R rows per file; n samples (AVG@n).

Workdir: report.json (command line, config, per file and method the metrics with CIs and
timings, parse-failure and invalid-item rates; macro averages; wall time), trace.jsonl
(one record per example, evaluator and sample), trace.html (readable static page).
"""
from __future__ import annotations

import dataclasses
import os
import time
import zlib

import numpy as np
from absl import logging

from drubric_jax.evaluation import benchmark_config
from drubric_jax import data, models
from drubric_jax.evaluation import aggregate, filerun, report as report_lib
from drubric_jax.evaluator.rubric_generator import RubricGenerator
from drubric_jax.evaluator.verifier import Verifier
from drubric_jax.rounds import compilation


class ModelLoader:
    """(cfg, params, tokenizer) per (source, dtype), each loaded once per loader
    (`models.load_model`; "tiny" is the random-weight TINY preset).

    A generator and a verifier from the same source thus share one parameter set; pass
    one loader to several `evaluate` calls to load each source once (tests do).
    """

    def __init__(self):
        self._loaded = {}  # (source, dtype) -> (cfg, params, tokenizer)

    def __call__(self, source: str, dtype: str):
        if (source, dtype) not in self._loaded:
            self._loaded[(source, dtype)] = models.load_model(source, dtype)
        return self._loaded[(source, dtype)]


class Row:
    """One evaluated example: a data Record cut to at most max_k responses.

    Attributes: rec (the Record), keep (kept response indices, ascending), gold (gold
    ranks of the kept responses, `data.gold_ranks`), responses, rm_bench (meta.label and
    meta.style give one entry per response), labels / styles (kept entries, or None).
    """

    def __init__(self, rec, max_k: int):
        self.rec = rec
        k = len(rec.responses)
        if k < 2:
            raise ValueError(f"{rec.path}:{rec.line}: field 'responses' needs >= 2 responses "
                             f"to evaluate an evaluator, got {k}")
        keep = list(range(k))
        if max_k and k > max_k:
            # Seeded by the row id: the same subset whatever the run's seed or row order.
            rng = np.random.default_rng(zlib.crc32(rec.id.encode()))
            keep = sorted(rng.choice(k, max_k, replace=False).tolist())
        self.keep = keep
        ranks = data.gold_ranks(rec)
        self.gold = [ranks[i] for i in keep]
        self.responses = [rec.responses[i] for i in keep]
        labels, styles = rec.meta.get("label"), rec.meta.get("style")
        self.rm_bench = (isinstance(labels, list) and isinstance(styles, list)
                         and len(labels) == len(styles) == k)
        self.labels = [labels[i] for i in keep] if self.rm_bench else None
        self.styles = [styles[i] for i in keep] if self.rm_bench else None

    @property
    def k(self) -> int:
        return len(self.responses)


def load_rows(path: str, max_rows: int, max_k: int, subset: str = "first",
              seed: int = 0) -> list:
    """Rows of one file (data.load_jsonl validates and names file:line:field on errors).

    Args:
        path: JSONL file of the shared schema.
        max_rows: most rows kept (0 = all).
        max_k: K cap per row (0 = all responses; see `Row`).
        subset: "first": the first max_rows rows; "random": max_rows rows drawn with the
            seed and the file's last two path parts (files are often sorted by category,
            so the first rows may all be of one kind), kept in file order.
        seed: the config seed.
    """
    records = data.load_jsonl(path)
    if max_rows and len(records) > max_rows:
        if subset == "random":
            name = "/".join(os.path.normpath(path).split(os.sep)[-2:])
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            keep = sorted(rng.choice(len(records), max_rows, replace=False).tolist())
            records = [records[i] for i in keep]
        else:
            records = records[:max_rows]
    return [Row(r, max_k) for r in records]


@dataclasses.dataclass
class Evaluators:
    """The rubric generator and the verifier with their params, and the verifier's
    counters (`Verifier.p_yes(stats=...)`) over the whole benchmark."""

    generator: RubricGenerator
    generator_params: dict
    verifier: Verifier
    verifier_params: dict
    verifier_stats: dict = dataclasses.field(default_factory=dict)


def _macro(report: dict, replicates: dict) -> None:
    """report["macro"] and report["macro_differences"] from the per-file sections."""
    files = report["files"]
    methods = list(dict.fromkeys(m for f in files.values() for m in f["methods"]))
    report["macro"] = {}
    for m in methods:
        report["macro"][m] = {}
        for key in aggregate.METRICS:
            # top-1 and nDCG of a pair equal its strict accuracy: listwise files only
            use = [f for f in files if m in files[f]["methods"]
                   and (files[f]["listwise"] or key not in aggregate.LISTWISE_METRICS)]
            report["macro"][m][key] = aggregate.macro(
                {f: replicates[f][m][key] for f in use},
                {f: files[f]["methods"][m][key]["mean"] for f in use})
    report["macro_differences"] = {}
    for name, (a, b) in filerun.differences(methods).items():
        use = [f for f in files if a in files[f]["methods"] and b in files[f]["methods"]]
        report["macro_differences"][name] = aggregate.macro(
            {f: replicates[f][a]["strict_acc"] - replicates[f][b]["strict_acc"] for f in use},
            {f: files[f]["differences"][name]["strict_acc"]["mean"] for f in use})


def evaluate(config, workdir: str, loader: ModelLoader | None = None,
             command: str = "") -> dict:
    """Runs every configured method on every data file; writes the workdir outputs.

    Args:
        config: configs/eval_evaluator.py fields (checked by `benchmark_config.validate`).
        workdir: output directory (created): report.json, trace.jsonl, trace.html.
        loader: model loader, `ModelLoader()` when None; pass one to reuse loaded models.
        command: the command line, stored in report.json.

    Returns:
        the report dict (also written to workdir/report.json).

    Raises:
        ValueError: a bad config field, or a data row with a bad field (file:line:field).
    """
    benchmark_config.validate(config)
    # Compiled sampler / verifier programs are reused by the next run (and the tests).
    compilation.enable_persistent_cache(config.jax_cache_dir, min_compile_seconds=1.0)
    loader = ModelLoader() if loader is None else loader
    os.makedirs(workdir, exist_ok=True)
    paths = [p.strip() for p in config.data.split(",") if p.strip()]
    # Every file is read before any model loads, so a bad row fails in seconds.
    all_rows = [load_rows(p, config.max_rows, config.max_k, config.row_subset, config.seed)
                for p in paths]
    t_start = time.time()
    gcfg, gparams, gtok = loader(config.generator_model, config.dtype)
    vcfg, vparams, vtok = loader(config.verifier_model, config.dtype)
    ev = Evaluators(
        RubricGenerator(gcfg, gtok, config.max_items, config.max_item_chars,
                        config.max_new_tokens, config.generator_input_budget), gparams,
        Verifier(vcfg, vtok, config.verifier_max_prefix_tokens,
                 config.verifier_max_suffix_tokens), vparams)
    report = {"command": command, "config": config.to_dict(),
              "model_load_s": round(time.time() - t_start, 2), "files": {}}
    sections, replicates = [], {}
    with open(os.path.join(workdir, "trace.jsonl"), "w", encoding="utf-8") as trace:
        for index, (path, rows) in enumerate(zip(paths, all_rows)):
            t0 = time.time()
            run = filerun.FileRun(config, ev, path, index)
            run.run(rows)
            report["files"][path], replicates[path] = run.report(
                rows, time.time() - t0, config.n_bootstrap, config.seed * 1000 + index)
            for rec in run.traces(rows):
                trace.write(report_lib.trace_line(rec))
            sections.append((path, list(zip(rows, run.per_row))[:config.html_max_examples]))
            logging.info("%s", report_lib.file_line(path, report["files"][path]))
    _macro(report, replicates)
    total_rows = sum(len(r) for r in all_rows)
    wall = time.time() - t_start
    report["wall_s"] = round(wall, 2)
    report["total_rows"] = total_rows
    report["s_per_row"] = round(wall / max(total_rows, 1), 3)
    report["verifier_stats"] = dict(ev.verifier_stats)
    report["kind"] = "evaluator"  # what experiments.report renders it as
    report_lib.write_report(os.path.join(workdir, "report.json"), report)
    report_lib.write_html(os.path.join(workdir, "trace.html"), sections)
    return report

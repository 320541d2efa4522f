"""Evaluator benchmark: how well each evaluator orders human-ranked responses (METHOD 6, 7).

`evaluate(config, workdir)` is the one entry point (config: configs/eval_evaluator.py).

Methods (configs/eval_evaluator.py METHODS):
- dynamic: G_phi(x, C) writes rubric lists from the whole candidate set; the frozen
  verifier answers every item for every response; Eq. 12 gives the scores.
- static: RaR-style lists from the prompt only, same verifier and Eq. 12.
- direct: the verifier's P(yes) to "is this a high-quality response?" per response. For
  pair rows the pairwise question "is A better than B?" is also asked in both orders and
  reported as direct_pairwise_ab / _ba / _avg with the first-position win rate (position
  bias).
- direct_set: the same pointwise judge with the whole response set shown as context.
- random: uniform random scores from the seed (sanity floor).

Diagnostic variants dynamic_soft / static_soft reuse the same lists and verifier calls
with P(yes) in place of the 0/1 verdict in Eq. 12 (they show whether the verifier's
probabilities order the responses even when its hard verdicts tie).

Each rubric method is AVG@n: n independently sampled lists per row, each with a fresh
response order in the generator prompt; every metric is computed per sample over all rows
and reported as mean, std (ddof=1 when n > 1) and the per-sample values. Deterministic
judges (direct*) are computed once and repeated n times.

Metrics (evaluation.metrics, METHOD 7 and 11): strict pairwise accuracy (a predicted tie is
wrong; gold-tied pairs skipped), accuracy with predicted ties excluded, tie rate, strict
top-1 (rows whose responses are all gold-tied are skipped), nDCG (linear gains from the
gold ranks), Delta_gap (Eq. 2, pooled over ordered pairs). RM-Bench rows (meta.label and
meta.style) add the 9 chosen-vs-rejected pairs split into hard / normal / easy.

Axis legend (docs/CONVENTIONS.md): K responses per row (2 pairs, 6 RM-Bench, 7 listwise;
at most max_k), M rubric items per list, R rows per file; n samples (AVG@n).

Workdir: report.json (config, per file and method the metrics, parse-failure and
invalid-item rates, wall time per 100 rows), trace.jsonl (one record per example, method
and sample), trace.html (readable static page).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib

import jax
import numpy as np
from absl import logging
from tqdm import tqdm

from configs import eval_evaluator as eval_config
from drubric_jax import data, models
from drubric_jax import tokenizer as tok_lib
from drubric_jax.evaluation import judges, metrics, report as report_lib
from drubric_jax.models import config as cfg_lib
from drubric_jax.rubric_generator import RubricGenerator, RubricInput
from drubric_jax.verifier import Verifier


class ModelLoader:
    """(cfg, params, tokenizer) per (source, dtype), each loaded once per loader.

    A generator and a verifier from the same source thus share one parameter set; pass
    one loader to several `evaluate` calls to load each source once (tests do).
    "tiny" is the TINY preset with random weights (PRNGKey(0)) and the SmolLM2 tokenizer.
    """

    def __init__(self):
        self._loaded = {}  # (source, dtype) -> (cfg, params, tokenizer)

    def __call__(self, source: str, dtype: str):
        if (source, dtype) not in self._loaded:
            if source == "tiny":
                cfg = cfg_lib.TINY.replace(dtype=dtype, param_dtype=dtype)
                params = models.init_params(cfg, jax.random.PRNGKey(0))
                tok = tok_lib.tokenizer_from_gguf(models.default_gguf_path())
                self._loaded[(source, dtype)] = (cfg, params, tok)
            else:
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


def load_rows(path: str, max_rows: int, max_k: int) -> list:
    """Rows of one file (data.load_jsonl validates and names file:line:field on errors)."""
    records = data.load_jsonl(path)
    if max_rows:
        records = records[:max_rows]
    return [Row(r, max_k) for r in records]


def sample_metrics(rows, scores) -> dict:
    """Metrics of one sample: scores[i] float[K_i] for rows[i] (METHOD 7, 11).

    Returns a dict of floats (and RM-Bench splits when every row is an RM-Bench row).
    """
    # Rows are padded to the largest K; the mask keeps padding out of every metric.
    n = len(rows)
    kmax = max(r.k for r in rows)
    s = np.zeros((n, kmax), np.float32)
    g = np.zeros((n, kmax), np.float32)
    m = np.zeros((n, kmax), bool)
    for i, (row, sc) in enumerate(zip(rows, scores)):
        s[i, :row.k] = sc
        g[i, :row.k] = row.gold
        m[i, :row.k] = True
    pw = {k: float(v) for k, v in metrics.pairwise_accuracy(s, g, m).items()}
    distinct = np.array([len(set(r.gold)) > 1 for r in rows])  # all-tied rows: no top-1
    top1 = np.asarray(metrics.strict_top1(s, g, m))
    nd, nd_valid = (np.asarray(x) for x in metrics.ndcg(s, g, m))
    gap, cnt = (np.asarray(x) for x in metrics.delta_gap(s, g, m))
    out = {
        "strict_acc": pw["strict"], "acc_ties_excluded": pw["ties_excluded"],
        "tie_rate": pw["tie_rate"], "n_pairs": pw["n_pairs"],
        "top1": float(top1[distinct].mean()) if distinct.any() else 0.0,
        "ndcg": float(nd[nd_valid].mean()) if nd_valid.any() else 0.0,
        # Pooled over ordered pairs, not a mean of per-row means.
        "delta_gap": float((gap * cnt).sum() / max(cnt.sum(), 1)),
    }
    if all(r.rm_bench for r in rows):
        rb = metrics.rm_bench_accuracy(scores, [r.labels for r in rows],
                                       [r.styles for r in rows])
        for name in ("hard", "normal", "easy", "all"):
            out[f"rmbench_{name}"] = float(rb[name])
    return out


def aggregate(per_sample: list) -> dict:
    """{metric: {"mean", "std", "per_sample"}} over the n samples (std ddof=1 when n > 1)."""
    out = {}
    for key in per_sample[0]:
        vals = np.array([d[key] for d in per_sample], np.float64)
        std = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        out[key] = {"mean": float(vals.mean()), "std": std,
                    "per_sample": [float(v) for v in vals]}
    return out


@dataclasses.dataclass
class Evaluators:
    """The rubric generator and the verifier with their params, and the verifier's
    counters (`Verifier.p_yes(stats=...)`) over the whole benchmark."""

    generator: RubricGenerator
    generator_params: dict
    verifier: Verifier
    verifier_params: dict
    verifier_stats: dict = dataclasses.field(default_factory=dict)


class FileRun:
    """Evaluates every method on one file; accumulates scores, traces, counters, timings."""

    def __init__(self, config, ev: Evaluators, path: str, file_index: int):
        self.c, self.ev, self.path = config, ev, path
        self.methods = [m.strip() for m in config.methods.split(",") if m.strip()]
        self.n = config.n_samples
        self.file_index = file_index
        self.scores = {}      # method -> [sample][row] float[K]
        self.traces = []      # trace.jsonl records
        self.html_rows = []   # (row, {method: [per-sample dicts]})
        self.counters = {m: {} for m in judges.RUBRIC_METHODS}
        self.timing = {}
        self.pairwise = []    # (row index in file, p_ab, p_ba) per pair row

    def _tick(self, name, t0):
        self.timing[name] = self.timing.get(name, 0.0) + time.time() - t0

    def run(self, rows) -> None:
        key = jax.random.fold_in(jax.random.PRNGKey(self.c.seed), self.file_index)
        bar = tqdm(total=len(rows), desc=os.path.basename(self.path), unit="row",
                   disable=not self.c.progress)
        for start in range(0, len(rows), self.c.rows_per_batch):
            batch = rows[start:start + self.c.rows_per_batch]
            # One key per (file, first row of the batch).
            self._run_batch(jax.random.fold_in(key, start), start, batch)
            bar.update(len(batch))
        bar.close()

    def _run_batch(self, key, offset, rows) -> None:
        # per_row[j]: {method: n sample dicts}, rubric methods first (trace.html order).
        per_row = [dict() for _ in rows]
        lists = self._generate(key, rows)
        if lists:
            t0 = time.time()
            for j, samples in enumerate(judges.rubric_samples(
                    self.ev.verifier, self.ev.verifier_params, rows, lists, self.n,
                    self.ev.verifier_stats)):
                per_row[j].update(samples)
            self._tick("verifier", t0)
        self._direct(offset, rows, per_row)
        if "random" in self.methods:
            for j, r in enumerate(rows):
                per_row[j]["random"] = judges.random_samples(self.c.seed, r, self.n)
        self._record(rows, per_row)

    def _generate(self, key, rows) -> dict:
        """{method: the generator's n lists per row} for the configured rubric methods."""
        lists = {}
        rubric_methods = [m for m in self.methods if m in judges.RUBRIC_METHODS]
        for mi, method in enumerate(rubric_methods):
            t0 = time.time()
            inputs = [RubricInput(r.rec.prompt, tuple(r.responses), tuple(r.rec.history))
                      for r in rows]
            lists[method] = self.ev.generator.generate_batch(
                self.ev.generator_params, jax.random.fold_in(key, 1 + mi), inputs,
                num_lists=self.n,
                temperature=self.c.temperature, static=(method == "static"))
            for name, v in lists[method].counters.items():
                self.counters[method][name] = self.counters[method].get(name, 0) + v
            self._tick(f"generator_{method}", t0)
        return lists

    def _direct(self, offset, rows, per_row) -> None:
        """direct / direct_set samples into per_row; pairwise answers into self.pairwise."""
        for name, with_set in (("direct", False), ("direct_set", True)):
            if name not in self.methods:
                continue
            t0 = time.time()
            ps = judges.direct_scores(self.ev.verifier, self.ev.verifier_params, rows,
                                      self.c.judge_max_tokens, with_set)
            for j in range(len(rows)):
                one = {"scores": np.asarray(ps[j], np.float64), "p_yes": ps[j].round(4).tolist()}
                # Deterministic: one sample repeated n times (std 0); the n entries share
                # one dict, so the pairwise answers below reach every sample's trace.
                per_row[j][name] = [one] * self.n
            if name == "direct":
                pw = judges.pairwise_scores(self.ev.verifier, self.ev.verifier_params, rows,
                                            self.c.judge_max_tokens)
                for j, x in enumerate(pw):
                    if x is not None:
                        p_ab, p_ba = x
                        per_row[j]["direct"][0]["pairwise"] = {"p_ab": round(p_ab, 4),
                                                               "p_ba": round(p_ba, 4)}
                        self.pairwise.append((offset + j, p_ab, p_ba))
            self._tick(name, t0)

    def _record(self, rows, per_row) -> None:
        """Scores per method and sample, trace records and trace.html rows of a batch."""
        for j, r in enumerate(rows):
            for m in self.methods:
                for s, d in enumerate(per_row[j][m]):
                    self.scores.setdefault(m, [[] for _ in range(self.n)])[s].append(
                        d["scores"])
                    if "soft_scores" in d:  # the _soft diagnostic is reported as a method
                        self.scores.setdefault(f"{m}_soft", [[] for _ in range(self.n)])[
                            s].append(d["soft_scores"])
                    rec = {"file": self.path, "id": r.rec.id, "line": r.rec.line,
                           "method": m, "sample": s, "gold_ranks": r.gold,
                           "kept_responses": r.keep,
                           **{k: (v.tolist() if hasattr(v, "tolist") else v)
                              for k, v in d.items()}}
                    self.traces.append(rec)
            if len(self.html_rows) < self.c.html_max_examples:
                self.html_rows.append((r, per_row[j]))

    def report(self, rows, wall: float) -> dict:
        """Per-method metrics of this file, rates and timings (report.json section)."""
        out = {"n_rows": len(rows), "wall_s": round(wall, 2),
               "s_per_100_rows": round(100 * wall / max(len(rows), 1), 2),
               "phase_s_per_100_rows": {k: round(100 * v / max(len(rows), 1), 2)
                                        for k, v in self.timing.items()},
               "methods": {}}
        for m in self.scores:
            entry = aggregate([sample_metrics(rows, self.scores[m][s]) for s in range(self.n)])
            if m.endswith("_soft"):
                entry["note"] = ("diagnostic: Eq. 12 with P(yes) in place of the 0/1 verdict "
                                 "(not the method's score)")
            if m in judges.RUBRIC_METHODS:
                c = self.counters[m]
                lists = max(c.get("lists", 0), 1)
                items = c.get("items_kept", 0) + c.get("items_dropped", 0)
                entry["parse_failure_rate"] = 1.0 - c.get("valid_lists", 0) / lists
                entry["invalid_item_rate"] = c.get("items_dropped", 0) / max(items, 1)
                entry["mean_items_per_list"] = c.get("items_kept", 0) / lists
                entry["counters"] = c
            out["methods"][m] = entry
        if self.pairwise:
            pair_rows = [rows[j] for j, _, _ in self.pairwise]
            p_ab = np.array([a for _, a, _ in self.pairwise])
            p_ba = np.array([b for _, _, b in self.pairwise])
            for name, sc in judges.pairwise_variants(p_ab, p_ba).items():
                out["methods"][name] = aggregate([sample_metrics(pair_rows, sc)])
            out["methods"]["direct_pairwise_avg"]["first_position_win_rate"] = (
                judges.first_position_win_rate(p_ab, p_ba))
        return out


def evaluate(config, workdir: str, loader: ModelLoader | None = None) -> dict:
    """Runs every configured method on every data file; writes the workdir outputs.

    Args:
        config: configs/eval_evaluator.py fields (checked by its `validate`).
        workdir: output directory (created): report.json, trace.jsonl, trace.html.
        loader: model loader, `ModelLoader()` when None; pass one to reuse loaded models.

    Returns:
        the report dict (also written to workdir/report.json).

    Raises:
        ValueError: a bad config field, or a data row with a bad field (file:line:field).
    """
    eval_config.validate(config)
    if config.jax_cache_dir:
        jax.config.update("jax_compilation_cache_dir", config.jax_cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    loader = ModelLoader() if loader is None else loader
    os.makedirs(workdir, exist_ok=True)
    paths = [p.strip() for p in config.data.split(",") if p.strip()]
    # Every file is read before any model loads, so a bad row fails in seconds.
    all_rows = [load_rows(p, config.max_rows, config.max_k) for p in paths]
    t_start = time.time()
    gcfg, gparams, gtok = loader(config.generator_model, config.dtype)
    vcfg, vparams, vtok = loader(config.verifier_model, config.dtype)
    ev = Evaluators(
        RubricGenerator(gcfg, gtok, config.max_items, config.max_item_chars,
                        config.max_new_tokens, config.generator_input_budget), gparams,
        Verifier(vcfg, vtok, config.verifier_max_prefix_tokens,
                 config.verifier_max_suffix_tokens), vparams)
    load_s = time.time() - t_start
    report = {"config": config.to_dict(), "model_load_s": round(load_s, 2), "files": {}}
    sections = []
    with open(os.path.join(workdir, "trace.jsonl"), "w", encoding="utf-8") as trace:
        for index, (path, rows) in enumerate(zip(paths, all_rows)):
            t0 = time.time()
            run = FileRun(config, ev, path, index)
            run.run(rows)
            report["files"][path] = run.report(rows, time.time() - t0)
            for rec in run.traces:
                trace.write(report_lib.trace_line(rec))
            sections.append((path, run.html_rows))
            logging.info("%s: %s", path, json.dumps(report_lib.jsonable(
                {m: v.get("strict_acc", {}).get("mean")
                 for m, v in report["files"][path]["methods"].items()})))
    total_rows = sum(len(r) for r in all_rows)
    wall = time.time() - t_start
    report["wall_s"] = round(wall, 2)
    report["total_rows"] = total_rows
    report["s_per_100_rows"] = round(100 * wall / max(total_rows, 1), 2)
    report["verifier_stats"] = dict(ev.verifier_stats)
    report_lib.write_report(os.path.join(workdir, "report.json"), report)
    report_lib.write_html(os.path.join(workdir, "trace.html"), sections)
    return report

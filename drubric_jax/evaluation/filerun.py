"""One data file of the evaluator benchmark: every method's scores, traces and timings.

`FileRun.run(rows)` scores every row with every configured evaluator; `FileRun.report`
turns the scores into the file's report.json section (metrics with bootstrap CIs,
`aggregate`) and the bootstrap replicates the macro average needs.

Batching. Rubric lists are sampled for `rows_per_batch` rows at a time, rows taken in
order of length (similar prompt buckets in one batch, fewer padded tokens), dynamic and
static lists in one sampler call; every item of every list of a batch is answered in ONE
verifier pass (all verdict variants, METHOD 12, come from it). The direct judges take the whole file in one call (`Verifier.p_yes_ids`
groups prompts of similar length across it).

Reported methods: <evaluator>_<variant> for the rubric evaluators (dynamic_hard,
dynamic_soft, ..., `judges.verdict_variants`), direct, direct_set, direct_pairwise_ab /
_ba / _avg (pair rows), random.

Axis legend (docs/CONVENTIONS.md): K responses per row, M items per list, R rows of the
file; n samples (AVG@n), Bt bootstrap replicates.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np
from tqdm import tqdm

from drubric_jax.evaluation import aggregate, intervals, judges
from drubric_jax.evaluator.rubric_generator import RubricInput
from drubric_jax.text import rubric_format

DIFFERENCES = (("soft", "hard"), ("hard_ctx", "hard"), ("soft_ctx", "soft"))
"""Paired differences reported per rubric evaluator (variant a minus variant b)."""
DIFF_METRICS = ("strict_acc", "acc_ties_excluded", "top1", "ndcg")


def _length(row) -> int:
    return len(row.rec.prompt) + sum(len(y) for y in row.responses)


class FileRun:
    """Evaluates every method on one file; accumulates scores, traces, counters, timings."""

    def __init__(self, config, ev, path: str, file_index: int):
        self.c, self.ev, self.path = config, ev, path
        self.methods = [m.strip() for m in config.methods.split(",") if m.strip()]
        self.rubric = [m for m in self.methods if m in judges.RUBRIC_METHODS]
        self.n = config.n_samples
        self.calibrate = config.calibration == "contextual"
        self.file_index = file_index
        self.per_row = []     # per row: {evaluator: [n sample dicts]}
        self.counters = {m: {} for m in self.rubric}  # lists, valid_lists, items_*
        self.generator_counters = {}  # `RubricBatch.counters` summed (all evaluators)
        self.timing = {}      # phase -> seconds
        self.judgements = {m: 0 for m in self.rubric}  # verifier items asked per evaluator
        self.pairwise = []    # (row index in file, p_ab, p_ba) per pair row

    def _tick(self, name, t0):
        self.timing[name] = self.timing.get(name, 0.0) + time.time() - t0

    def run(self, rows) -> None:
        """Scores every row with every configured method."""
        self.per_row = [dict() for _ in rows]
        key = jax.random.fold_in(jax.random.PRNGKey(self.c.seed), self.file_index)
        order = sorted(range(len(rows)), key=lambda i: _length(rows[i]))
        bar = tqdm(total=len(rows), desc=os.path.basename(self.path), unit="row",
                   disable=not self.c.progress or not self.rubric)
        for start in range(0, len(rows), self.c.rows_per_batch):
            idx = order[start:start + self.c.rows_per_batch]
            # One key per (file, batch position in length order).
            self._rubric_batch(jax.random.fold_in(key, start), [rows[i] for i in idx], idx)
            bar.update(len(idx))
        bar.close()
        self._direct(rows)
        if "random" in self.methods:
            t0 = time.time()
            for i, r in enumerate(rows):
                self.per_row[i]["random"] = judges.random_samples(self.c.seed, r, self.n)
            self._tick("random", t0)

    def _rubric_batch(self, key, rows, idx) -> None:
        if not self.rubric:
            return
        b = len(rows)
        inputs = [RubricInput(r.rec.prompt, tuple(r.responses), tuple(r.rec.history))
                  for r in rows]
        t0 = time.time()
        # Dynamic and static lists in ONE sampler call (per-input static flags): on CPU a
        # decode step of 2x the rows costs far less than two steps. Measured (SmolLM2-135M,
        # 4 rows, n = 2, busy 2 cores): two calls 165-170 s per batch, one call 60-150 s.
        both = self.ev.generator.generate_batch(
            self.ev.generator_params, key, inputs * len(self.rubric), num_lists=self.n,
            temperature=self.c.temperature, static=[m == "static" for m in self.rubric
                                                    for _ in rows])
        self._tick("generator", t0)
        for name, v in both.counters.items():
            self.generator_counters[name] = self.generator_counters.get(name, 0) + v
        lists = {m: _take(both, i * b, (i + 1) * b) for i, m in enumerate(self.rubric)}
        for m, lst in lists.items():
            c = self.counters[m]
            dropped = sum(rubric_format.parse_rubric_output(
                raw, "length" if reason == "length" else "stop", self.c.max_items).num_dropped
                for raws, reasons in zip(lst.raw_texts, lst.finish_reasons)
                for raw, reason in zip(raws, reasons))
            for name, v in (("lists", lst.list_valid.size),
                            ("valid_lists", int(lst.list_valid.sum())),
                            ("items_kept", int(lst.item_mask.sum())), ("items_dropped", dropped)):
                c[name] = c.get(name, 0) + v
            self.judgements[m] += sum(r.k * int(lst.item_mask[j].sum())
                                      for j, r in enumerate(rows))
        t0 = time.time()
        samples = judges.rubric_samples(self.ev.verifier, self.ev.verifier_params, rows, lists,
                                        self.n, self.calibrate, self.ev.verifier_stats)
        for i, s in zip(idx, samples):
            self.per_row[i].update(s)
        self._tick("verifier", t0)

    def _direct(self, rows) -> None:
        """direct / direct_set samples into per_row; pairwise answers into self.pairwise."""
        for name, with_set in (("direct", False), ("direct_set", True)):
            if name not in self.methods:
                continue
            t0 = time.time()
            ps = judges.direct_scores(self.ev.verifier, self.ev.verifier_params, rows,
                                      self.c.judge_max_tokens, with_set)
            for i in range(len(rows)):
                one = {"scores": np.asarray(ps[i], np.float64), "p_yes": ps[i].round(4).tolist()}
                # Deterministic: one sample repeated n times (std 0); the n entries share
                # one dict, so the pairwise answers below reach every sample's trace.
                self.per_row[i][name] = [one] * self.n
            self._tick(name, t0)
            if name == "direct":
                t0 = time.time()
                pw = judges.pairwise_scores(self.ev.verifier, self.ev.verifier_params, rows,
                                            self.c.judge_max_tokens)
                for i, x in enumerate(pw):
                    if x is not None:
                        p_ab, p_ba = x
                        self.per_row[i]["direct"][0]["pairwise"] = {"p_ab": round(p_ab, 4),
                                                                    "p_ba": round(p_ba, 4)}
                        self.pairwise.append((i, p_ab, p_ba))
                self._tick("direct_pairwise", t0)

    def scores(self) -> dict:
        """{reported method: [sample][row] float[K]} in file row order."""
        out = {}
        for m in self.methods:
            names = ([f"{m}_{v}" for v in judges.verdict_variants(self.calibrate)]
                     if m in judges.RUBRIC_METHODS else [m])
            for name in names:
                out[name] = [[] for _ in range(self.n)]
            for row in self.per_row:
                for s, d in enumerate(row[m]):
                    for name in names:
                        out[name][s].append(d["variant_scores"][name[len(m) + 1:]]
                                            if m in judges.RUBRIC_METHODS else d["scores"])
        return out

    def traces(self, rows):
        """trace.jsonl records: one per row, evaluator and sample."""
        for r, row in zip(rows, self.per_row):
            for m in self.methods:
                for s, d in enumerate(row[m]):
                    yield {"file": self.path, "id": r.rec.id, "line": r.rec.line,
                           "method": m, "sample": s, "gold_ranks": r.gold,
                           "kept_responses": r.keep, **d}

    def _phase_seconds(self, method: str) -> float:
        """Seconds spent on a reported method. The sampler call of a batch is shared by the
        rubric evaluators (split evenly: each has n lists per row); the verifier pass too
        (one prefill per response), split by items asked. Every verdict variant of an
        evaluator comes from the same passes and the same seconds."""
        for m in self.rubric:
            if method.startswith(m + "_"):
                share = self.judgements[m] / max(sum(self.judgements.values()), 1)
                return (self.timing.get("generator", 0.0) / len(self.rubric)
                        + share * self.timing.get("verifier", 0.0))
        if method.startswith("direct_pairwise"):
            return self.timing.get("direct_pairwise", 0.0)
        return self.timing.get(method, 0.0)

    def report(self, rows, wall: float, n_boot: int, seed: int) -> tuple:
        """(report.json section of this file, {method: {metric: float[Bt]}} replicates).

        Rows are resampled with `intervals.resample_weights(R, n_boot, seed)`, the same
        replicates for every method of the file.
        """
        weights = intervals.resample_weights(len(rows), n_boot, seed)
        out = {"n_rows": len(rows), "listwise": any(r.k > 2 for r in rows),
               "wall_s": round(wall, 2), "s_per_row": round(wall / max(len(rows), 1), 3),
               "phase_s": {k: round(v, 2) for k, v in self.timing.items()},
               "methods": {}, "timing": {}, "differences": {}}
        reps = {}
        scored = self.scores()
        if self.pairwise:
            at = [i for i, _, _ in self.pairwise]
            variants = judges.pairwise_variants(np.array([a for _, a, _ in self.pairwise]),
                                                np.array([b for _, _, b in self.pairwise]))
            for name, sc in variants.items():
                scored[name] = (at, [sc] * self.n)  # deterministic, repeated n times
        for m, sc in scored.items():
            at, sc = sc if isinstance(sc, tuple) else (list(range(len(rows))), sc)
            sub = [rows[i] for i in at]
            entry, reps[m] = aggregate.summarise(
                [aggregate.row_counts(sub, sc[s]) for s in range(self.n)], weights[:, at])
            entry.update(aggregate.over_samples(
                [aggregate.sample_extras(sub, sc[s]) for s in range(self.n)]))
            out["methods"][m] = entry
            sec = self._phase_seconds(m)
            out["timing"][m] = {"s_per_row": round(sec / max(len(rows), 1), 3),
                                "rows_per_s": round(len(rows) / sec, 3) if sec > 0 else None}
        if self.pairwise:
            out["methods"]["direct_pairwise_avg"]["first_position_win_rate"] = (
                judges.first_position_win_rate([a for _, a, _ in self.pairwise],
                                               [b for _, _, b in self.pairwise]))
        for m in self.rubric:
            self._rubric_rates(m, out["methods"])
        for name, (a, b) in differences(reps).items():
            out["differences"][name] = {
                k: {"mean": out["methods"][a][k]["mean"] - out["methods"][b][k]["mean"],
                    "ci95": intervals.percentile_interval(reps[a][k] - reps[b][k])}
                for k in DIFF_METRICS}
        return out, reps

    def _rubric_rates(self, m: str, methods: dict) -> None:
        """Parse-failure and invalid-item rates of evaluator m, on each of its variants."""
        c = self.counters[m]
        lists = max(c.get("lists", 0), 1)
        items = c.get("items_kept", 0) + c.get("items_dropped", 0)
        rates = {"parse_failure_rate": 1.0 - c.get("valid_lists", 0) / lists,
                 "invalid_item_rate": c.get("items_dropped", 0) / max(items, 1),
                 "mean_items_per_list": c.get("items_kept", 0) / lists, "counters": c,
                 "generator_counters": self.generator_counters}
        for v in judges.verdict_variants(self.calibrate):
            methods[f"{m}_{v}"].update(rates)


def _take(batch, lo: int, hi: int):
    """Inputs lo..hi-1 of a `RubricBatch` (rollout and counters are left out)."""
    return dataclasses.replace(
        batch, texts=batch.texts[lo:hi], weights=batch.weights[lo:hi],
        item_mask=batch.item_mask[lo:hi], list_valid=batch.list_valid[lo:hi],
        finish_reasons=batch.finish_reasons[lo:hi], raw_texts=batch.raw_texts[lo:hi],
        orders=batch.orders[lo:hi], response_cut=batch.response_cut[lo:hi],
        prompt_cut=batch.prompt_cut[lo:hi], rollout=None, counters={})


def differences(methods) -> dict:
    """{"a - b": (a, b)} of the `DIFFERENCES` pairs present among the method names."""
    out = {}
    for m in judges.RUBRIC_METHODS:
        for a, b in DIFFERENCES:
            if f"{m}_{a}" in methods and f"{m}_{b}" in methods:
                out[f"{m}_{a} - {m}_{b}"] = (f"{m}_{a}", f"{m}_{b}")
    return out

"""Evaluator benchmark (METHOD 6, 7, 12): how well each evaluator orders human-ranked
responses, and whether the verifier follows criteria at all.

- `metrics`: strict pairwise accuracy (and its per-list counts), strict top-1, nDCG,
  Delta_gap, RM-Bench pairs and accuracy (METHOD 7, 11), the AUC; pure functions.
- `intervals`: seeded bootstrap replicates (row weights) and percentile intervals.
- `aggregate`: per-row counts, AVG@n metrics with bootstrap CIs, macro averages.
- `judges`: the evaluators scored by the frozen verifier: rubric lists through Eq. 12
  under hard / soft (and calibrated) verdicts from one verifier pass, the direct /
  direct_set / pairwise yes-no judges, random scores.
- `filerun`: one data file: batching, scores, traces, timings, its report section.
- `benchmark`: rows of a data file, model loading (`ModelLoader`) and `evaluate(config,
  workdir)`, the one entry point (experiments/eval_evaluator.py calls it).
- `report`: report.json, trace.jsonl lines, trace.html, log lines.
- `results`: results.md and its plot from report.json files
  (experiments/report_evaluator.py).
- `ifeval`: IFEval's prompt- and instruction-level accuracy, strict and loose, with
  bootstrap CIs over prompts and per instruction type (experiments/eval_ifeval.py).
- `verifier_check`: items whose truth is known by construction on real responses; the
  AUC of P(yes) (experiments/check_verifier.py).
"""

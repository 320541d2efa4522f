"""Evaluator benchmark (METHOD 6, 7): how well each evaluator orders human-ranked responses.

- `metrics`: strict pairwise accuracy, strict top-1, nDCG, Delta_gap, RM-Bench pairs and
  accuracy (METHOD 7, 11), pure functions of scores and gold ranks.
- `judges`: the evaluators scored by the frozen verifier: rubric lists through Eq. 12
  (dynamic, static), the direct / direct_set / pairwise yes-no judges, random scores.
- `benchmark`: rows of a data file, the per-file runner (`FileRun`), per-sample metrics
  and their AVG@n aggregate, model loading (`ModelLoader`) and `evaluate(config,
  workdir)`, the one entry point (experiments/eval_evaluator.py calls it).
- `report`: the outputs: report.json, trace.jsonl lines and trace.html.
"""

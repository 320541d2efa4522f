r"""results.md and a plot from evaluator-benchmark runs (experiments/eval_evaluator.py).

    python -m experiments.report_evaluator runs/eval_shared
    python -m experiments.report_evaluator runs/a runs/b --out=docs/results_evaluator.md

Reads RUN_DIR/report.json of each run; writes the markdown (default RUN_DIR/results.md of
the first run) and the plot beside it (same name, .png). Tables and the "at chance" rule
are described in drubric_jax/evaluation/results.py.
"""
import json
import os

from absl import app, flags
from experiments import cli  # noqa: E402

_OUT = flags.DEFINE_string("out", "", "markdown path (default: <first RUN_DIR>/results.md); "
                           "the plot goes beside it with the suffix .png")


def main(argv):
    from drubric_jax.evaluation import results

    runs = argv[1:]
    if not runs:
        raise app.UsageError("give one or more RUN_DIRs")
    reports = {}
    for run in runs:
        with open(os.path.join(run, "report.json"), encoding="utf-8") as f:
            reports[run] = json.load(f)
    out = _OUT.value or os.path.join(runs[0], "results.md")
    with open(out, "w", encoding="utf-8") as f:
        f.write(results.results_markdown(reports))
    results.plot(reports, os.path.splitext(out)[0] + ".png")
    print(f"wrote {out} and {os.path.splitext(out)[0]}.png")


if __name__ == "__main__":
    cli.run(main)

r"""Evaluator benchmark: how well each evaluator orders human-ranked responses (METHOD 6, 7).

    python -m experiments.eval_evaluator --config=configs/eval_evaluator.py \
        --config.data=../shared/data/judgebench/gpt.jsonl --config.max_rows=20 \
        --workdir=runs/eval_judgebench
    python -m experiments.eval_evaluator --config=configs/eval_evaluator.py:shared \
        --workdir=runs/eval_shared          # every shared file, the CPU table of docs/EXPERIMENTS.md
    python -m experiments.report_evaluator runs/eval_shared   # results.md and the plot

Methods, metrics and the workdir outputs (report.json, trace.jsonl, trace.html) are
described in drubric_jax/evaluation/benchmark.py; fields in configs/eval_evaluator.py.
"""
import shlex
import sys

from absl import flags, logging
from experiments import cli  # noqa: E402
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/eval_evaluator.py",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    import jax

    from drubric_jax.evaluation import benchmark, report

    logging.info("JAX devices: %s", jax.devices())
    command = shlex.join(["python", "-m", "experiments.eval_evaluator"] + sys.argv[1:])
    result = benchmark.evaluate(_CONFIG.value, _WORKDIR.value, command=command)
    print(report.timing_table(result))


if __name__ == "__main__":
    cli.run(main)

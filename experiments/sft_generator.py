r"""The generator's supervised warm start G_sft (checks world III): train, evaluate held-out
constraint recovery at step 0 and after each epoch, export.

    python -m experiments.sft_generator --config=configs/sft_generator.py --workdir=runs/g_sft

configs/sft_generator.py holds the settings; `drubric_jax.rounds.sft_stage` the stage.
Writes in the workdir: checkpoints/, metrics.jsonl, recovery.jsonl, export/generator/,
summary.json, results.md (the held-out F1 table; `evaluation.checks_sft.markdown`).
Running the command again resumes from the last checkpoint and skips finished evaluations.

    python -m experiments.sft_generator --config=configs/sft_generator.py --workdir=runs/g_sft \
        --dev_temperatures=0,1

scores the stage's exported generator on the dev split at each list temperature (one list a
dev row), the figures a rubric arm's list temperature is chosen by (never the reported
split), and writes dev_temperatures.json; it trains nothing.
"""
import os
import shlex
import sys

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from absl import flags  # noqa: E402
from experiments import cli  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/sft_generator.py[:switches]",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "The stage's directory.")
_DEV_TEMPERATURES = flags.DEFINE_list(
    "dev_temperatures", [], "Score the exported generator on the dev split at these list "
    "temperatures (comma-separated), instead of training")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    from drubric_jax.evaluation import checks_sft
    from drubric_jax.rounds import run_logging
    from drubric_jax.rounds.sft_stage import run_sft

    c, workdir = _CONFIG.value, _WORKDIR.value
    if _DEV_TEMPERATURES.value:
        return _dev_temperatures(c, workdir, [float(t) for t in _DEV_TEMPERATURES.value])
    try:
        summary = run_sft(c, workdir)
    except FileNotFoundError as e:  # a missing world file: the message names the commands
        raise SystemExit(f"error: {e}") from None
    s = c.sft
    setup = (f"{summary['examples']} pairs ({s.pairs_per_prompt} per training prompt, "
             f"anchors {os.path.basename(s.train_anchors)}), {summary['epochs']} epochs of "
             f"{summary['steps'] // max(1, summary['epochs'])} updates of {summary['batch']} "
             f"pair(s); generator {c.model.generator} with rank-{c.lora.rank} LoRA, "
             f"learning rate {s.learning_rate}, warm-up {s.warmup_steps}; inputs padded to "
             f"{summary['input_bucket']} tokens, targets to {summary['target_bucket']}; "
             f"dev lists at temperature {s.eval_temperature} (0 = greedy) on "
             f"{os.path.basename(s.eval_anchors)}; seed {c.seed}.")
    command = shlex.join(["python", "-m", "experiments.sft_generator"] + sys.argv[1:])
    evals = checks_sft.summaries(summary["evals"], int(s.n_bootstrap), int(c.seed))
    wall = run_logging.wall_times(workdir)
    run_logging.write_json(os.path.join(workdir, "summary.json"), {
        "kind": "checks_sft", "command": command, "setup": setup, "wall_s": wall,
        "n_bootstrap": int(s.n_bootstrap), "seed": int(c.seed),
        **{k: summary[k] for k in ("examples", "steps", "epochs", "batch", "input_bucket",
                                   "target_bucket")}, "evals": evals})
    text = checks_sft.markdown(evals, command, setup, wall)
    with open(os.path.join(workdir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, flush=True)


def _dev_temperatures(c, workdir: str, temperatures: list) -> None:
    """`sft_stage.dev_recovery` of workdir/export/generator at each temperature: a line per
    temperature (mean constraint F1 with its prompts-bootstrap 95% CI, valid lists) and
    dev_temperatures.json."""
    import json

    import numpy as np

    from drubric_jax.evaluation.intervals import percentile_interval, resample_weights
    from drubric_jax.rounds.sft_stage import dev_recovery

    export = os.path.join(workdir, "export", "generator")
    if not os.path.isdir(export):
        raise SystemExit(f"error: {export}: no exported generator (train the stage first)")
    out = {}
    for t in temperatures:
        r = dev_recovery(c, export, t)
        f1 = np.asarray(r["constraint_f1"], np.float64)
        # Percentile bootstrap over the dev rows (the stage's own interval).
        reps = resample_weights(len(f1), int(c.sft.n_bootstrap), int(c.seed)) @ f1 / len(f1)
        lo, hi = percentile_interval(reps)
        out[str(t)] = {"constraint_f1": float(np.mean(r["constraint_f1"])), "ci": [lo, hi],
                       "valid": float(np.mean(r["valid"])), "rows": len(r["ids"]),
                       "per_row_f1": r["constraint_f1"].tolist(), "ids": r["ids"]}
        print(f"dev lists at temperature {t}: constraint F1 {out[str(t)]['constraint_f1']:.3f} "
              f"[{lo:.3f}, {hi:.3f}], valid {out[str(t)]['valid']:.3f}, "
              f"{len(r['ids'])} dev rows", flush=True)
    with open(os.path.join(workdir, "dev_temperatures.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    cli.run(main)

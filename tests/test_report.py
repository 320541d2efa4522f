"""`python -m experiments.report` over run directories of different kinds in one command
(the results are recomputed from each directory's files)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from drubric_jax.evaluation import coevolution as co
from drubric_jax.evaluation import policy_eval
from helpers import REPO, run_module, write_checks_policy_workdir


def _coevolution_dir(d, seed=0):
    rng = np.random.default_rng(seed)
    names = {"r_disc": [f"{g} | {p}" for g in ("G1", "G2") for p in ("P1", "P2", "~P2")],
             "win_rate": ["P0", "P1", "P2", "~P2"], "preference": ["P0", "P1", "P2", "~P2"]}
    values = {k: {n: rng.uniform(0, 1, 5).tolist() for n in v} for k, v in names.items()}
    values["ids"] = [f"r{i}" for i in range(5)]
    d.mkdir()
    (d / "eval.json").write_text(json.dumps(values))
    s = co.summarize(str(d), 100, 0)
    # `kind` decides, not the keys: "parts" alone would read as a grpo_learns summary.
    (d / "summary.json").write_text(json.dumps({
        "kind": "coevolution", "parts": "not grpo_learns",
        "command": "python -m experiments.coevolution ...", "wall_s": {"round0": 60.0},
        "seed": seed, "n_bootstrap": 100, "eval_note": "5 rows", **s}))


def _eval_policy_dir(d):
    s = policy_eval.win_rate_summary([0.6, 0.4, 0.7], [0.7, 0.6, 0.2], [10, 20, 30],
                                     [15, 15, 15], 100, 0)
    d.mkdir()
    (d / "report.json").write_text(json.dumps({
        "command": "python -m experiments.eval_policy ...", "wall_s": 30.0,
        "config": {"policy_model": "p", "judge_model": "j", "temperature": 0.0, "seed": 0,
                   "humaneval_max_new_tokens": 16, "timeout_s": 5.0},
        "winrate": {"all": {**s, "mean_answer_chars": 20.0, "mean_reference_chars": 15.0}},
        "humaneval": {**policy_eval.pass_at_1_summary([1, 0], 100, 0),
                      "isolation": "netns"}}))


def _ifeval_dir_without_command(d):
    """An eval_ifeval report.json written before reports kept their command and kind."""
    cell = {"value": 0.5, "ci95": [0.25, 0.75]}
    d.mkdir()
    (d / "report.json").write_text(json.dumps({
        "n_prompts": 2, "n_instructions": 3, "not_scored": {"count": 0, "by_check": {}},
        "metrics": {f"{level}_{mode}": cell for level in ("prompt", "instruction")
                    for mode in ("strict", "loose")},
        "setup": {"model": "m", "max_new_tokens": 8}}))


def _ablation_dir(d, seed):
    """An ablation run of one seed: each generator's per-list values on 4 held-out lists."""
    rng = np.random.default_rng(seed)
    d.mkdir()
    names = ("zero_shot", "full", "disc_only")
    for name in names:
        (d / name).mkdir()
        pairs = rng.integers(1, 5, 4).astype(float)
        (d / name / "heldout.json").write_text(json.dumps({
            "delta_gap": rng.normal(0, 0.1, 4).tolist(), "r_anchor": rng.normal(-2, 1, 4).tolist(),
            "pairs": pairs.tolist(), "correct": (pairs // 2).tolist(),
            "ties": (pairs - pairs // 2).tolist(), "valid": [2.0] * 4,
            "ids": [f"s{seed}-{i}" for i in range(4)], "num_lists": 2}))
    (d / "summary.json").write_text(json.dumps({
        "kind": "ablation", "command": f"python -m experiments.ablation --config.seed={seed}",
        "seed": seed, "baseline": "zero_shot", "n_bootstrap": 100,
        "generators": {n: {} for n in names}, "comparisons": {"full - disc_only": {}}}))


def _checks_policy_dir(d):
    """A policy-reward experiment (2 arms x 2 seeds) with its summary.json."""
    base = {"policy.reward": "checks_gold", "model.generator": ""}
    write_checks_policy_workdir(d, {(s, "gold"): base for s in (0, 1)} | {
        (s, "rubric_sft"): {**base, "policy.reward": "rubric"} for s in (0, 1)})
    (d / "summary.json").write_text(json.dumps({
        "kind": "checks_policy", "command": "python -m experiments.checks_policy ...",
        "arms_run": ["gold", "rubric_sft"], "seeds": [0, 1], "n_bootstrap": 100, "seed": 0,
        "window": 1, "setup": "6 held-out prompts"}))


def test_report_renders_several_kinds_in_one_command(tmp_path):
    _coevolution_dir(tmp_path / "coevo")
    _coevolution_dir(tmp_path / "coevo1", seed=1)
    _eval_policy_dir(tmp_path / "evalp")
    out = tmp_path / "results"
    _ifeval_dir_without_command(tmp_path / "ife")
    _ablation_dir(tmp_path / "ab0", 0)
    _ablation_dir(tmp_path / "ab1", 1)
    _checks_policy_dir(tmp_path / "cp")
    run_module("experiments.report", str(tmp_path / "coevo"), str(tmp_path / "evalp"),
               str(tmp_path / "ife"), str(tmp_path / "ab0"), str(tmp_path / "ab1"),
               str(tmp_path / "coevo1"), str(tmp_path / "cp"), f"--out={out}", timeout=120)
    # Two ablation runs (seeds): each its own table, then both side by side and pooled.
    seeds = (out / "ablation-seeds.md").read_text()
    assert "pooled: 8 held-out anchor lists" in seeds
    assert "two-stage bootstrap: seeds, then lists" in seeds
    assert any(line.startswith("| full - disc_only | Delta_gap |") for line in seeds.splitlines())
    # Two coevolution runs: the headlines pooled by the two-stage bootstrap.
    coevo_seeds = (out / "coevolution-seeds.md").read_text()
    assert "Pooled over 2 runs (two-stage bootstrap: seeds, then prompts; METHOD 15)" in \
        coevo_seeds
    # The policy-reward experiment: pooled figures named, bookkeeping, settings.
    q1 = (out / "checks_policy-cp.md").read_text()
    assert "pooled greedy [95% CI, two-stage bootstrap: seeds, then prompts]" in q1
    assert "| gold | mean of 2 | 2 | 0.500 | - | 4.0 | 1.0 | 3.0 | - |" in q1
    assert ('| rubric_sft | 1 | `policy.reward` = "rubric" ("checks_gold"); none outside the '
            "reward and the generator |") in q1
    assert "ablation-seeds.md" in (out / "README.md").read_text()
    coevo = (out / "coevolution-coevo.md").read_text()
    assert "| G2 on P2 - G1 on P2 |" in coevo and "| P2 - ~P2 |" in coevo
    assert (out / "coevolution-coevo.png").stat().st_size > 0
    evalp = (out / "eval_policy-evalp.md").read_text()
    assert "| all | 3 |" in evalp and "HumanEval pass@1: 0.500" in evalp
    index = (out / "README.md").read_text()
    assert "coevolution-coevo.md" in index and "eval_policy-evalp.md" in index
    # A run without a recorded command says so, in the index and in its file.
    assert f"| `{tmp_path / 'ife'}` | (not recorded) |" in index
    assert "- command: (not recorded)" in (out / "ifeval-ife.md").read_text()
    assert "``" not in index


def test_help_exits_0_and_a_wrong_directory_is_one_line(tmp_path):
    """The entry points' shared `experiments.cli.run`: `--help` prints the usage text and
    exits 0 (absl alone exits 1); report's wrong RUN_DIR is an error line, not usage."""
    out = run_module("experiments.report", "--help", timeout=120)
    assert "RUN_DIR" in out and "--out" in out
    proc = subprocess.run([sys.executable, "-m", "experiments.report", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and "no summary.json" in proc.stderr
    assert "Regenerates" not in proc.stdout + proc.stderr  # no usage text
    proc = subprocess.run([sys.executable, "-m", "experiments.report", str(tmp_path / "no")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "no such directory" in proc.stderr.splitlines()[0]


@pytest.mark.parametrize("override,says", [
    ("--config.rounds.num_rounds=-1", "error: config.rounds.num_rounds: must be >= 1"),
    ("--config.rounds.num_round=1", 'Did you mean "num_rounds"'),
])
def test_a_bad_config_override_is_one_error_line(tmp_path, override, says):
    """`experiments.cli.run`: a bad value (`ConfigError`) or a misspelt field ends with
    one `error:` line naming the field and status 2, not a traceback; nothing is
    written to the workdir."""
    proc = subprocess.run([sys.executable, "-m", "experiments.run",
                           "--config=configs/smollm2_cpu.py:tiny", override,
                           f"--workdir={tmp_path / 'w'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and says in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "w" / "metrics.jsonl").exists()

"""Smoke runs of the entry points under experiments/ in fresh processes, as a user starts them
(one CPU device: the 8 fake devices of conftest.py are replaced by 1).

`experiments.run` runs one round of one generator and one policy step on the tiny configs
(`smollm2_cpu.py:tiny`, `qwen3_8b.py:local`); `experiments.sweep --print` prints one command
line per `get_sweep()` entry.
"""
import json
import math
import os
import shlex

import pytest

from configs import qwen3_8b, smollm2_cpu
from helpers import run_module

ONE_ROUND = ["--config.rounds.num_rounds=1", "--config.rounds.generator_steps=1",
             "--config.rounds.policy_steps=1", "--config.log.progress=False"]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["configs/smollm2_cpu.py:tiny", "configs/qwen3_8b.py:local"])
def test_run_one_round(config, tmp_path, smollm2_gguf):
    # smollm2_gguf: the tiny smollm2 config uses the real SmolLM2 tokenizer.
    run_module("experiments.run", f"--config={config}", f"--workdir={tmp_path}", *ONE_ROUND,
               timeout=600)
    with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    train = [r for r in rows if r["kind"] == "train"]
    assert sorted((r["phase"], r["round"], r["step"]) for r in train) == [
        ("generator", 0, 1), ("policy", 0, 1)], train
    for r in train:
        # Finite numbers: not NaN, not inf (math.isfinite raises on a null, i.e. a missing
        # value, which fails the test too).
        assert all(math.isfinite(r[k]) for k in ("loss", "kl", "grad_norm")), r


@pytest.mark.slow
def test_paper_config_runs_a_round_on_a_1x4x2_mesh(tmp_path):
    """configs/qwen3_8b.py at its tiny size (`local`: the Qwen3 family, a mixture-of-experts
    verifier) on 8 fake devices with the 8 x H100 mesh its comment offers, (data, fsdp,
    tensor) = (1, 4, 2), end to end as a user starts it: one generator and one policy
    step with finite numbers, the run finished, and the mesh recorded in config.json."""
    run_module("experiments.run", "--config=configs/qwen3_8b.py:local", f"--workdir={tmp_path}",
               *ONE_ROUND, "--config.mesh.data=1", "--config.mesh.fsdp=4",
               "--config.mesh.tensor=2", timeout=900, devices=8)
    config = json.loads((tmp_path / "config.json").read_text())
    assert {k: config["mesh"][k] for k in ("data", "fsdp", "tensor")} == {
        "data": 1, "fsdp": 4, "tensor": 2}
    with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
        train = [r for r in map(json.loads, f) if r["kind"] == "train"]
    assert sorted((r["phase"], r["step"]) for r in train) == [("generator", 1), ("policy", 1)]
    for r in train:
        assert all(math.isfinite(r[k]) for k in ("loss", "kl", "grad_norm")), r
    assert (tmp_path / "finished.json").exists()


@pytest.mark.parametrize("module,arg", [(smollm2_cpu, "tiny"), (qwen3_8b, "")])
def test_sweep_print_one_command_per_entry(module, arg, tmp_path):
    config = f"configs/{module.__name__.split('.')[-1]}.py:{arg}"
    out = run_module("experiments.sweep", f"--config={config}", f"--workdir={tmp_path}",
                     "--print", timeout=120)
    lines = out.splitlines()
    sweep = module.get_sweep()
    assert len(lines) == len(sweep), out
    workdirs = set()
    for line, overrides in zip(lines, sweep):
        argv = shlex.split(line)
        assert argv[:3] == ["python", "-m", "experiments.run"], line
        assert f"--config={config}" in argv, line
        for key, value in overrides.items():
            assert f"--{key}={value}" in argv, line
        workdirs |= {a for a in argv if a.startswith(f"--workdir={tmp_path}{os.sep}")}
    assert len(workdirs) == len(sweep), out  # one workdir per run


@pytest.mark.slow
def test_grpo_learns_tiny_writes_curves_and_resumes(tmp_path, smollm2_gguf):
    """Both parts (rule, rubric) of `experiments.grpo_learns` at tiny size: per-step curves,
    the last-minus-first difference with its CI, the files; a second command changes no
    number (each part finished)."""
    args = ("experiments.grpo_learns", "--config=configs/grpo_learns.py:tiny",
            f"--workdir={tmp_path}", "--config.experiment.policy_steps=2",
            "--config.experiment.first_steps=1", "--config.experiment.last_steps=1",
            "--config.log.progress=False")
    out = run_module(*args, timeout=600)
    assert "| rule | 2 |" in out and "| rubric | 2 |" in out, out
    summary = json.loads((tmp_path / "summary.json").read_text())
    for part in ("rule", "rubric"):
        s = summary["parts"][part]
        assert len(s["rewards"]) == 2 and s["ci"][0] <= s["difference"] <= s["ci"][1]
    assert (tmp_path / "reward_curves.png").exists() and (tmp_path / "results.md").exists()
    run_module(*args, timeout=300)
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["parts"] == summary["parts"] and again["wall_s"] == summary["wall_s"]
    # experiments.report reads the curves again from each part's metrics.jsonl.
    out = tmp_path / "results"
    run_module("experiments.report", str(tmp_path), f"--out={out}", timeout=300)
    assert (out / f"grpo_learns-{tmp_path.name}.md").read_text() == (
        tmp_path / "results.md").read_text()

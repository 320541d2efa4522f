"""experiments/device_check.py: the --tiny check on CPU (every phase in its own process, ok,
with positive finite figures in the JSON), the parent's budget and timeout statuses, and
the FLOP counts against the model's parameter count."""
import json
import math
import os
import subprocess
import sys

import pytest

from drubric_jax.memory import costs
from drubric_jax.models.config import QWEN3_30B_A3B, QWEN3_8B
from experiments import device_measure as dm
from experiments.device_phases import PHASES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One process per phase on CPU, with no fake devices.
ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
# moe_verifier: two lengths under each of the two expert dispatches.
# decode_segments: one cache and 4 segments.
# engine: static calls, then the engine, on the same rows.
# paged: paged and dense attention at two live lengths, then the shared prefix.
ROWS = {"decode": 4, "decode_segments": 2, "prefill": 2, "train": 2, "constrained": 1,
        "moe_verifier": 4, "engine": 2, "paged": 5}
TIMED = ("compile_s", "steady_s", "ms_per_step", "tokens_per_s")


def _check(*args, timeout=1200):
    return subprocess.run([sys.executable, "-m", "experiments.device_check", *args], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=timeout)


def _numbers(x):
    if isinstance(x, dict):
        return [n for v in x.values() for n in _numbers(v)]
    if isinstance(x, list):
        return [n for v in x for n in _numbers(v)]
    return [x] if isinstance(x, (int, float)) and not isinstance(x, bool) else []


@pytest.mark.slow
def test_tiny_check_runs_every_phase_ok_with_positive_finite_figures(tmp_path):
    out = tmp_path / "check.json"
    proc = _check("--tiny", f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "tiny" and result["device"]["backend"] == "cpu"
    assert list(result["phases"]) == list(PHASES)
    for name, phase in result["phases"].items():
        assert phase["status"] == "ok", (name, phase.get("error"), phase.get("log_tail"))
        assert phase["done"] and phase["wall_s"] > 0 and len(phase["rows"]) == ROWS[name]
        for row in phase["rows"]:
            assert row["status"] == "ok", (name, row)
            assert all(math.isfinite(n) and n >= 0 for n in _numbers(row)), row
            timed = [k for k in TIMED if k in row]
            assert all(row[k] > 0 for k in timed), row
            if name == "train" and "layout" in row["name"]:
                assert row["base_gb"] > 0 and row["adapters_gb"] > 0
                assert row["adapters_gb"] == pytest.approx(row["planned_adapters_gb"])
            elif name == "paged":  # attention alone: no planner step of its own
                assert ("steady_s" in row) != (row["name"] == "paged shared prefix"), row
            elif "probe" not in row["name"]:
                assert {"compile_s", "steady_s", "tokens_per_s"} <= set(timed), row
                assert row["planned_gb"] > 0, row
    static, eng = result["phases"]["engine"]["rows"]
    # The same rows by row id: the same tokens, the same useful tokens; the engine's steps
    # are the planner's count from the lengths (`sampling.lengths.engine_steps`).
    assert eng["same_tokens"] == 1.0 and eng["useful_tokens"] == static["useful_tokens"]
    assert eng["steps"] == eng["planned_steps"] <= static["steps"]
    assert eng["prefills"] == 4  # one per distinct prompt (TINY: 4 prompts x K = 2)
    assert eng["waits"] == 0 and eng["pool_pages"] > 0
    paged_rows = {r["name"]: r for r in result["phases"]["paged"]["rows"]}
    # A live length reads its own bytes; K rows of one stored prompt give the K copies'
    # output exactly from a pool that holds one copy.
    assert paged_rows["paged live=16"]["bytes"] < paged_rows["dense live=16"]["bytes"]
    shared = paged_rows["paged shared prefix"]
    assert shared["max_abs_diff"] == 0.0 and shared["pool_bytes"] < shared["copies_bytes"]
    constrained = result["phases"]["constrained"]["rows"][0]
    # Both clocks are reported (their ratio is a measurement, not a property to assert).
    assert constrained["host_ms_per_step"] > 0 and constrained["ms_per_step"] > 0
    assert constrained["grammar_errors"] == 0
    # The table: one line per phase, one per row.
    segments = result["phases"]["decode_segments"]["rows"]
    assert [r["name"].split(", ")[-1] for r in segments] == ["1 cache segment",
                                                            "4 cache segments"]
    assert segments[1]["gb_per_step"] < segments[0]["gb_per_step"]  # fewer slots read
    assert segments[1]["planned_gb"] < segments[0]["planned_gb"]
    assert f"{len(PHASES)} of {len(PHASES)} phases ok" in proc.stdout
    for name in PHASES:
        assert f"\n{name} [ok, " in proc.stdout


def test_a_check_out_of_budget_skips_every_phase(tmp_path):
    out = tmp_path / "check.json"
    proc = _check("--tiny", "--budget_s=1", f"--out={out}", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    phases = json.loads(out.read_text())["phases"]
    assert [p["status"] for p in phases.values()] == ["skipped: budget"] * len(PHASES)
    assert f"0 of {len(PHASES)} phases ok" in proc.stdout


def test_a_phase_past_its_timeout_is_killed_and_reported():
    from experiments.device_runner import run_phase, table

    res = run_phase("decode", 0.2, ("--tiny",))
    assert res["status"] == "timeout" and res["rows"] == [] and res["returncode"] != 0
    assert "decode [timeout" in table([res])


def test_status_of_tells_out_of_memory_from_other_errors():
    oom = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 GB.\n")
    assert dm.status_of(oom) == ("oom", "RuntimeError: RESOURCE_EXHAUSTED: Out of memory "
                                        "while trying to allocate 8 GB.")
    assert dm.status_of(ValueError("bad\nlast line")) == ("error", "last line")


@pytest.mark.parametrize("cfg", [QWEN3_8B, QWEN3_30B_A3B])
def test_matmul_weights_are_the_parameters_less_embedding_head_and_norms(cfg):
    # Every expert counted (k = E): the matmul weights are all the layers' matrices.
    full = cfg.replace(num_experts_per_tok=cfg.num_experts) if cfg.num_experts else cfg
    norms = cfg.num_layers * (2 * cfg.dim + 2 * cfg.head_dim) + cfg.dim
    assert costs.matmul_params(full) + 2 * cfg.vocab_size * cfg.dim + norms == cfg.num_params()
    # Qwen3-30B-A3B: about 3.3B active parameters per token (8 of 128 experts).
    moe = QWEN3_30B_A3B
    assert 3.2e9 < costs.matmul_params(moe) + 2 * moe.vocab_size * moe.dim < 3.4e9
    # A decode step reads every weight but the embedding.
    assert costs.weight_bytes(cfg) == 2 * (cfg.num_params() - cfg.vocab_size * cfg.dim)


@pytest.mark.real_model
def test_exported_tokenizer_loads_back_as_the_gguf_one(tmp_path, smollm2_tokenizer):
    """--export_tokenizer / --tokenizer: the folder the accelerator gets (no GGUF there)
    gives the same ids, vocabulary and end of sequence as the tokenizer rebuilt from it."""
    dm.export_tokenizer(str(tmp_path))
    tok = dm.load_tokenizer(str(tmp_path))
    text = '{"rubrics": [{"rubric": "Names Paris <|im_end|> as the capital", "weight": 5}]}'
    assert tok.encode(text) == smollm2_tokenizer.encode(text)
    assert len(tok) == len(smollm2_tokenizer) == 49152
    assert tok.eos_token_id == smollm2_tokenizer.eos_token_id

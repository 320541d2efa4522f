"""Policy evaluation (issue 13): win-rate statistics by hand, the HumanEval answer
extraction and its sandbox, and `experiments/eval_policy.py` end to end on tiny models."""
import json

import numpy as np
import pytest

from drubric_jax.evaluation import code_exec, policy_eval
from helpers import assert_percentile_ci, run_module

# Bootstrap replicates: the percentile bounds land within ~6% (in probability) of the exact
# bootstrap quantiles (`helpers.assert_percentile_ci`); each replicate also fits the
# length-controlled logistic model, so not more.
N_BOOT = 2000


def test_win_rate_counts_ties_when_the_orders_disagree():
    p_first = np.array([0.9, 0.8, 0.2, 0.7, 0.3])
    p_second = np.array([0.6, 0.1, 0.4, 0.9, 0.8])
    lens = np.array([100, 200, 300, 400, 500])
    s = policy_eval.win_rate_summary(p_first, p_second, lens, lens, n_boot=N_BOOT, seed=1)
    # wins: rows 0, 3; loss: row 2; ties: rows 1, 4 (the two orders disagree).
    assert (s["wins"], s["losses"], s["ties"], s["n"]) == (2, 1, 2, 5)
    assert s["win_rate"]["value"] == pytest.approx((2 + 2 / 2) / 5)
    assert s["win_rate_first"]["value"] == pytest.approx(3 / 5)
    assert s["win_rate_second"]["value"] == pytest.approx(3 / 5)
    assert s["tie_rate"]["value"] == pytest.approx(2 / 5)
    assert s["preference"]["value"] == pytest.approx(np.mean((p_first + p_second) / 2))
    # The CI against the exact bootstrap distribution of the mean of the per-row units
    # (win 1, tie 1/2, loss 0) over every resample of the 5 rows.
    units = np.array([1, 0.5, 0, 1, 0.5])
    assert_percentile_ci(s["win_rate"]["ci"], lambda w: w @ units / 5, 5, N_BOOT)
    # Equal lengths: the length term is constant 0, so the length-controlled rate is the
    # logistic intercept fitted to the soft preferences: their mean.
    assert s["lc_win_rate"]["value"] == pytest.approx(s["preference"]["value"], abs=1e-6)


def test_length_control_removes_a_preference_that_only_follows_length():
    """Soft preference = sigmoid(3 tanh(dl / std)): longer answers win, equal lengths are a
    coin flip. The raw preference is far from 0.5 (more longer answers than shorter), the
    length-controlled rate is 0.5."""
    rng = np.random.default_rng(0)
    dl = np.abs(rng.normal(0, 300, 200)) * np.where(rng.uniform(size=200) < 0.8, 1, -1)
    soft = 1 / (1 + np.exp(-3 * np.tanh(dl / dl.std())))
    s = policy_eval.win_rate_summary(soft, soft, dl + 500, np.full(200, 500.0), 100, 0)
    assert s["preference"]["value"] > 0.6
    assert s["lc_win_rate"]["value"] == pytest.approx(0.5, abs=1e-3)


def test_win_rate_refuses_empty_or_ragged_input():
    with pytest.raises(ValueError, match="equal-length"):
        policy_eval.win_rate_summary([0.6], [0.4, 0.3], [1], [1])
    with pytest.raises(ValueError):
        policy_eval.win_rate_summary([], [], [], [])


def test_reference_of_a_row_without_one_names_file_line_and_field(write_jsonl):
    path = write_jsonl([{"id": "a", "source": "t:t", "prompt": "hi", "reference": "hello"},
                        {"id": "b", "source": "t:t", "prompt": "why"}])
    with pytest.raises(ValueError, match=r":2: field 'reference'"):
        policy_eval.load_prompt_rows(str(path), 0, 0)


PROBLEM = {"task_id": "T/0", "entry_point": "add",
           "prompt": 'def add(a, b):\n    """Sum of a and b."""\n',
           "test": "def check(f):\n    assert f(2, 3) == 5\n    assert f(-1, 1) == 0\n"}


# The outcomes below do not depend on the machine's speed: every answer but the endless one
# ends at once (its timeout is never reached, however loaded the CPU), and the endless one
# never ends (it times out whatever its timeout; 1 s only bounds the test's wait).
ENDS_AT_ONCE_TIMEOUT_S = 60.0
ENDLESS_TIMEOUT_S = 1.0


@pytest.mark.parametrize("answer,result", [
    ("Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.", "passed"),
    ("```py\ndef add(a, b):\n    return a - b\n```", "failed: "),
    ("    return a + b\n", "passed"),             # a body continuing the prompt's signature
    ("```python\ndef add(a, b):\n    return a + b", "passed"),  # an unclosed fence
])
def test_humaneval_answers_run_in_the_sandbox(answer, result):
    r = code_exec.check(PROBLEM, code_exec.completion_from_answer(answer, PROBLEM),
                        timeout=ENDS_AT_ONCE_TIMEOUT_S)
    assert r["passed"] is (result == "passed") and r["result"].startswith(result), r


def test_humaneval_answer_that_never_ends_times_out():
    answer = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    r = code_exec.check(PROBLEM, code_exec.completion_from_answer(answer, PROBLEM),
                        timeout=ENDLESS_TIMEOUT_S)
    assert not r["passed"] and r["result"] == "timed out", r


def test_sandbox_has_no_network_and_no_destructive_os_calls(tmp_path):
    marker = tmp_path / "written"
    body = ("    import socket\n    try:\n        socket.create_connection(('127.0.0.1', 9))\n"
            "    except OSError as e:\n        assert 'disabled' in str(e)\n"
            f"    import os\n    os.remove({str(marker)!r})\n    return a + b\n")
    marker.write_text("keep me")
    r = code_exec.check(PROBLEM, body, timeout=ENDS_AT_ONCE_TIMEOUT_S)
    assert not r["passed"] and marker.read_text() == "keep me", r  # os.remove is disabled
    assert r["isolation"] in ("netns", "sockets")


def test_humaneval_problems_ship_with_the_package():
    problems = code_exec.read_problems()
    assert len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0"
    assert "def " in code_exec.humaneval_request(problems[0])


@pytest.mark.slow
def test_eval_policy_tiny_end_to_end(tmp_path, smollm2_gguf):
    out = run_module("experiments.eval_policy", "--config=configs/eval_policy.py:tiny",
                     f"--workdir={tmp_path}", timeout=600)
    assert "HumanEval pass@1" in out and "| all | 3 |" in out, out
    report = json.loads((tmp_path / "report.json").read_text())
    s = report["winrate"]["all"]
    assert s["wins"] + s["losses"] + s["ties"] == 3
    assert report["humaneval"]["n"] == 2
    rows = [json.loads(x) for x in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert [r["task"] for r in rows] == ["winrate"] * 3 + ["humaneval"] * 2
    assert all(0 <= r["p_policy_first"] <= 1 for r in rows if r["task"] == "winrate")
    out = tmp_path / "results"
    run_module("experiments.report", str(tmp_path), f"--out={out}", timeout=300)
    assert (out / f"eval_policy-{tmp_path.name}.md").read_text() == (
        tmp_path / "results.md").read_text()

"""IFEval scoring (drubric_jax.evaluation.ifeval, experiments/eval_ifeval.py) equals
if-verifiable's own evaluation on hand-written responses to real IFEval rows."""
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from if_verifiable import IFEvalSample, evaluate_output_for_sample

from drubric_jax import checks
from drubric_jax.evaluation import ifeval

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Responses to the first 12 rows of input_data.jsonl (their instructions in comments).
RESPONSES = [
    "Raymond III was a count. *His early life* *His rule* *His legacy*",  # no_comma, 3 hl, 300w
    "Day 1: Tokyo\nDay 2: Kyoto",  # no_comma
    "[name] lives at [address]",  # 12 placeholders
    None,  # repeat_prompt + title: filled from the row's prompt below
    "Sure!\nwhat are the two boys playing with and why are they so loud today?",  # lowercase
    "* a\n* b\n* c",  # 3 bullets
    "PARAGRAPH 1\nTHIS SENTENCE IS WEAK.\nPARAGRAPH 2\nIT LACKS DETAIL AND CLARITY.",  # caps
    '"MATTHIAS ALGIERS: a RESUME"',  # capital_word_frequency < 10 and >= 1, quotation
    "dear friend, please go and vote this week because it matters a lot.",  # lowercase
    "We are correlated and experiencing growth",  # keywords, 500 words, no_comma
    "Hammocks are great.",  # 400 words
    '```json\n{"ad": "dry diapers for happy babies"}\n```',  # json
]


@pytest.fixture(scope="module")
def rows(shared_file):
    path = shared_file("data", "ifeval", "input_data.jsonl")
    out = ifeval.read_rows(str(path), limit=len(RESPONSES))
    RESPONSES[3] = out[3]["prompt"] + "\n<<Leaving>>\nDear boss, I quit."
    return out


def _library(rows, responses):
    """Per-row (strict, loose) lists from if-verifiable's evaluate_output_for_sample (the
    punkt model on nltk's path: `checks.punkt.ensure_punkt`), not-scorable instructions
    removed first (none in these rows)."""
    checks.punkt.ensure_punkt()
    out = []
    for row, y in zip(rows, responses):
        keep = [i for i, c in enumerate(row["instruction_id_list"]) if checks.CHECKS[c].scorable]
        sample = IFEvalSample(row["key"], row["prompt"],
                              [row["instruction_id_list"][i] for i in keep],
                              [row["kwargs"][i] for i in keep])
        results, _ = evaluate_output_for_sample("ifeval", sample, y)
        out.append([(r.strict_pass, r.loose_pass) for r in results])
    return out


def test_report_equals_the_library(rows):
    judged = ifeval.judge(rows, RESPONSES)
    lib = _library(rows, RESPONSES)
    assert [[(v[2], v[3]) for v in p if v[1]] for p in judged] == lib
    rep = ifeval.report(judged, n_boot=200, seed=0)
    scored = [p for p in lib if p]
    want = {
        "prompt_strict": np.mean([all(s for s, _ in p) for p in scored]),
        "prompt_loose": np.mean([all(l for _, l in p) for p in scored]),
        "instruction_strict": sum(s for p in lib for s, _ in p) / sum(map(len, lib)),
        "instruction_loose": sum(l for p in lib for _, l in p) / sum(map(len, lib)),
    }
    for name, value in want.items():
        got = rep["metrics"][name]
        assert got["value"] == pytest.approx(value, abs=1e-12), name
        assert got["ci95"][0] <= got["value"] <= got["ci95"][1]
    # Counted by hand: rows 1, 3, 5, 6, 7, 8, 11 follow all their instructions, and 15 of
    # the 20 are followed (the misses: row 0's and 9's 300 / 500 words, row 2's 12
    # placeholders, row 4's lowercase, row 10's 400 words; row 7 has 3 all-capital words).
    assert rep["metrics"]["prompt_strict"]["value"] == pytest.approx(7 / 12)
    assert rep["metrics"]["instruction_strict"]["value"] == pytest.approx(15 / 20)
    assert rep["metrics"]["instruction_loose"]["value"] == pytest.approx(16 / 20)
    # Row 4 ("Sure!\n..." lowercase) passes only loose.
    assert judged[4] == [("change_case:english_lowercase", True, False, True, "")]
    assert rep["not_scored"] == {"count": 0, "of": 20, "by_check": {}, "invalid_args": [],
                                 "prompts_affected": 0, "prompts_without_scorable": 0}
    assert rep["per_type"]["change_case:capital_word_frequency"]["n"] == 2
    assert rep["per_type"]["punctuation:no_comma"]["n"] == 3
    assert "not scored: 0 of 20" in ifeval.format_table(rep)


def test_a_prompt_with_only_unscored_instructions_leaves_the_prompt_denominator():
    judged = [[("change_case:capital_word_frequency", False, None, None, "not scorable here")],
              [("punctuation:no_comma", True, True, True, "")],
              [("punctuation:no_comma", True, False, True, "")]]
    rep = ifeval.report(judged, n_boot=50, seed=1)
    assert rep["metrics"]["prompt_strict"]["value"] == 0.5
    assert rep["metrics"]["prompt_loose"]["value"] == 1.0
    assert rep["not_scored"]["prompts_without_scorable"] == 1
    again = ifeval.report(judged, n_boot=50, seed=1)
    assert again == rep  # seeded bootstrap


def test_not_scored_count_on_the_whole_file(shared_file):
    all_rows = ifeval.read_rows(str(shared_file("data", "ifeval", "input_data.jsonl")))
    assert len(all_rows) == ifeval.IFEVAL_N_PROMPTS
    rep = ifeval.report(ifeval.judge(all_rows, ["x"] * len(all_rows)), n_boot=10)
    assert rep["n_instructions"] == ifeval.IFEVAL_N_INSTRUCTIONS
    ns = rep["not_scored"]
    # Rows 1122 / 1129, whose letter "#" / "!" IFEval's checker replaces by a random one.
    assert ns["count"] == 2 and ns["of"] == 834
    assert ns["by_check"] == {"keywords:letter_frequency": 2}
    assert len(ns["invalid_args"]) == 2 and all("'letter'" in e for e in ns["invalid_args"])
    assert rep["per_type"]["keywords:letter_frequency"]["n"] == 31
    assert rep["per_type"]["length_constraints:number_sentences"]["n"] == 52
    assert rep["per_type"]["change_case:capital_word_frequency"]["n"] == 25


def test_a_check_not_scorable_here_is_counted_not_dropped(rows, monkeypatch):
    spec = checks.CHECKS["punctuation:no_comma"]
    monkeypatch.setitem(checks.CHECKS, spec.check,
                        dataclasses.replace(spec, scorable=False, reason="test"))
    rep = ifeval.report(ifeval.judge(rows, RESPONSES), n_boot=20)
    assert rep["not_scored"]["count"] == 3 and rep["not_scored"]["by_check"] == {
        spec.check: 3}
    assert rep["not_scored"]["prompts_without_scorable"] == 1  # row 1: no_comma alone
    assert spec.check not in rep["per_type"]
    # the 3 no_comma instructions (rows 0, 1, 9) were all met: 12 of the other 17 are
    assert rep["metrics"]["instruction_strict"]["value"] == pytest.approx(12 / 17)


def test_missing_data_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="input_data.jsonl"):
        ifeval.read_rows(str(tmp_path / "input_data.jsonl"))


def test_cli_scores_a_responses_file(rows, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": r["prompt"], "response": y}) + "\n"
                           for r, y in zip(rows, RESPONSES)))
    out = tmp_path / "out"
    data = os.path.join(REPO, "..", "shared", "data", "ifeval", "input_data.jsonl")
    proc = subprocess.run([sys.executable, "-m", "experiments.eval_ifeval", f"--responses={src}",
                           f"--out={out}", f"--data={data}", "--n_boot=200"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "prompt-level" in proc.stdout and "not scored: 0 of 20" in proc.stdout
    rep = json.loads((out / "report.json").read_text())
    want = ifeval.report(ifeval.judge(rows, RESPONSES), n_boot=200, seed=0)
    assert rep["metrics"] == want["metrics"] and rep["setup"]["model"] is None
    written = [json.loads(x) for x in (out / "responses.jsonl").read_text().splitlines()]
    assert written == [{"prompt": r["prompt"], "response": y} for r, y in zip(rows, RESPONSES)]


def test_a_killed_generation_resumes_where_its_file_ends(rows, tmp_path):
    """`ifeval.resume_responses` (what eval_ifeval generates through): responses are appended
    batch by batch; a rerun on the same file keeps its complete lines (a partial last line
    is cut), generates only the rows after them, and returns all of them in row order (the
    model is a stub that answers with the prompt's index among those it was asked)."""
    asked = []

    def stub(prompts, on_batch):
        asked.extend(prompts)
        got = [f"answer {i}" for i in range(len(prompts))]
        for lo in range(0, len(got), 2):
            on_batch(got[lo:lo + 2])
        return got, 1

    path = tmp_path / "responses.jsonl"
    done = [{"prompt": r["prompt"], "response": y} for r, y in zip(rows[:2], RESPONSES[:2])]
    path.write_text("".join(json.dumps(d) + "\n" for d in done) + '{"prompt": "cut in the mid')
    responses, cut = ifeval.resume_responses(str(path), rows[:5], stub)
    assert asked == [r["prompt"] for r in rows[2:5]]  # only the rows after the file's end
    assert responses == RESPONSES[:2] + ["answer 0", "answer 1", "answer 2"]
    assert cut is None  # the earlier lines' cuts are not known
    written = [json.loads(x) for x in path.read_text().splitlines()]
    assert written[:2] == done
    assert written == [{"prompt": r["prompt"], "response": y} for r, y in zip(rows[:5], responses)]
    # A finished file generates nothing; a fresh file reports this call's cuts.
    assert ifeval.resume_responses(str(path), rows[:5], stub)[0] == responses
    assert ifeval.resume_responses(str(tmp_path / "new.jsonl"), rows[:3], stub) == (
        ["answer 0", "answer 1", "answer 2"], 1)


def test_a_resumed_generation_counts_the_cuts_of_the_rows_it_kept(rows, tmp_path):
    """Rows written with their "truncated" flag: a resumed run's cut count is the kept
    rows' flags plus the new rows' cuts (a file without the flags gives None)."""
    def stub(prompts, on_batch):
        got = [f"answer {i}" for i in range(len(prompts))]
        cut = [i % 2 == 0 for i in range(len(prompts))]  # 0, 2, ... hit the limit
        for lo in range(0, len(got), 2):
            on_batch(got[lo:lo + 2], cut[lo:lo + 2])
        return got, sum(cut)

    path = tmp_path / "responses.jsonl"
    assert ifeval.resume_responses(str(path), rows[:3], stub)[1] == 2  # rows 0 and 2
    # Killed after 3 rows: a rerun over 5 keeps them (2 cut) and cuts 1 of the 2 new ones.
    assert [json.loads(x)["truncated"] for x in path.read_text().splitlines()] == [
        True, False, True]
    assert ifeval.resume_responses(str(path), rows[:5], stub)[1] == 2 + 1


def test_paired_difference_by_hand():
    """Two models on the same 3 prompts (judged as `ifeval.judge` writes them: (check,
    scored, strict, loose, reason)); the third prompt has no scored instruction and leaves
    the prompt-level denominator. Before: prompt strict 0 of 2, instruction strict 1 of 3;
    after: 2 of 2 and 3 of 3. The CI is the percentile interval of each replicate's
    difference of ratios (the same prompt resamples for both)."""
    from drubric_jax.evaluation.intervals import ratio
    from helpers import assert_percentile_ci

    c = "punctuation:no_comma"
    skip = (c, False, False, False, "not scorable here")
    before = [[(c, True, True, True, ""), (c, True, False, True, "")],
              [(c, True, False, False, "")], [skip]]
    after = [[(c, True, True, True, ""), (c, True, True, True, "")],
             [(c, True, True, True, "")], [skip]]
    p = ifeval.paired(before, after, 400, 0)
    assert p["n_prompts"] == 3
    assert (p["prompt_strict"]["before"], p["prompt_strict"]["after"]) == (0.0, 1.0)
    assert p["instruction_strict"]["before"] == pytest.approx(1 / 3)
    assert p["instruction_strict"]["difference"] == pytest.approx(2 / 3)
    assert p["instruction_loose"]["difference"] == pytest.approx(1 / 3)
    # The CI, on prompts that all have a scored instruction (a resample of the third alone
    # has no denominator: its replicate is dropped, which the exact reference cannot say).
    one = [(c, True, False, False, "")], [(c, True, True, True, "")]
    q = ifeval.paired(before[:2] + [one[0]], after[:2] + [one[1]], 400, 0)
    num_b, num_a, den = np.array([1.0, 0, 0]), np.array([2.0, 1, 1]), np.array([2.0, 1, 1])
    assert_percentile_ci(q["instruction_strict"]["ci95"],
                         lambda w: ratio(w @ num_a, w @ den) - ratio(w @ num_b, w @ den),
                         3, 400)
    with pytest.raises(ValueError, match="same prompts"):
        ifeval.paired(before, after[:2])
    with pytest.raises(ValueError, match="different instructions"):
        ifeval.paired(before, [after[0], after[1], [(c, True, True, True, "")]])
    text = ifeval.format_paired(p, "p0.jsonl", "p1")
    assert "instruction_strict    0.333     1.000     +0.667" in text

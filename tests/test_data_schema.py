"""Tests for drubric_jax.data.schema: loading and validation of the real shared files, errors
that name file:line:field, and gold ranks with ties (METHOD 11)."""

import json
import pytest

from drubric_jax import data as dd
from drubric_jax.data import Record, gold_ranks, load_jsonl, prompts_from_jsonl

# Row counts from ../shared/data/README.md ("shared rows").
SHARED_COUNTS = {
    "judgebench/gpt.jsonl": 210, "judgebench/claude.jsonl": 163,
    "rm_bench/chat.jsonl": 77, "rm_bench/code.jsonl": 137,
    "rm_bench/safety_refuse.jsonl": 171, "rm_bench/safety_response.jsonl": 94,
    "llmbar/natural.jsonl": 60, "llmbar/adversarial_neighbor.jsonl": 80,
    "llmbar/adversarial_gptinst.jsonl": 55, "llmbar/adversarial_gptout.jsonl": 28,
    "llmbar/adversarial_manual.jsonl": 28, "llmbar_processed/mt_bench_human.jsonl": 113,
    "llmbar_processed/faireval.jsonl": 40, "llmbar_processed/llmeval2.jsonl": 119,
    "pandalm/test.jsonl": 561, "hh_rlhf_harmless/test.jsonl": 1383,
    "alpaca_eval_listwise/test.jsonl": 483, "alpaca_eval/eval.jsonl": 805,
    "arena_hard/v0.1.jsonl": 500, "arena_hard/v2.0.jsonl": 750,
    "mt_bench/question.jsonl": 80, "vicuna_bench/question.jsonl": 80,
}
PROMPT_ONLY = {"alpaca_eval/eval.jsonl", "arena_hard/v0.1.jsonl", "arena_hard/v2.0.jsonl",
               "mt_bench/question.jsonl", "vicuna_bench/question.jsonl"}


# ---------------------------------------------------------------------------
# Real shared files
# ---------------------------------------------------------------------------

# Files of ../shared/data in another layout (its README: "IFEval prompts (a different
# layout)"), with their row count and fields; the issue that reads them loads them itself.
OTHER_LAYOUTS = {"ifeval/input_data.jsonl": (541, {"key", "prompt", "instruction_id_list",
                                                  "kwargs"})}


def test_every_shared_file_loads(shared_dir):
    root = shared_dir / "data"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jsonl"))
    assert set(SHARED_COUNTS) <= set(files)
    for rel, (count, fields) in OTHER_LAYOUTS.items():
        rows = [json.loads(line) for line in (root / rel).read_text("utf-8").splitlines()]
        assert len(rows) == count and all(set(r) == fields for r in rows), rel
    files = [f for f in files if f not in OTHER_LAYOUTS]
    all_ids = set()
    for rel in files:
        recs = load_jsonl(root / rel)
        if rel in SHARED_COUNTS:
            assert len(recs) == SHARED_COUNTS[rel], rel
        for r in recs:
            assert r.path == str(root / rel) and r.line >= 1
            assert r.id not in all_ids
            all_ids.add(r.id)
            if rel in PROMPT_ONLY:
                assert r.kind == "prompt" and r.responses == [] and r.ranking == []
            else:
                assert r.kind in ("pairwise", "listwise")
                ranks = gold_ranks(r)
                assert len(ranks) == len(r.responses)
                assert ranks[r.ranking[0]] == 1


def test_judgebench_pairwise(shared_dir):
    recs = load_jsonl(shared_dir / "data" / "judgebench" / "gpt.jsonl")
    assert all(r.kind == "pairwise" and not r.ties and r.scores is None for r in recs)
    for r in recs:
        g = gold_ranks(r)
        assert g[r.ranking[0]] == 1 and g[r.ranking[1]] == 2
    assert {"category", "label"} <= set(recs[0].meta)


def test_rm_bench_six_responses_with_ties(shared_dir):
    for name in ("chat", "code", "safety_refuse", "safety_response"):
        for r in load_jsonl(shared_dir / "data" / "rm_bench" / f"{name}.jsonl"):
            assert len(r.responses) == 6 and r.ties
            g = gold_ranks(r)
            assert sorted(g) == [1, 1, 1, 4, 4, 4]
            for i, label in enumerate(r.meta["label"]):
                assert g[i] == (1 if label == "chosen" else 4)
            a = dd.anchor_from_record(r)
            assert a.gold_ranks == [1, 1, 1, 4, 4, 4]
            assert a.responses == [r.responses[i] for i in r.ranking]


def test_alpaca_eval_listwise_seven_way(shared_dir):
    recs = load_jsonl(shared_dir / "data" / "alpaca_eval_listwise" / "test.jsonl")
    n_tied = 0
    for r in recs:
        assert len(r.responses) == 7 and r.scores is not None
        g = gold_ranks(r)
        if r.ties:
            n_tied += 1
            assert len(set(g)) < 7
            # 1 + number strictly better
            for i in range(7):
                assert g[i] == 1 + sum(s > r.scores[i] for s in r.scores)
        else:
            assert sorted(g) == list(range(1, 8))
        # best-first anchor ranks never decrease
        a = dd.anchor_from_record(r)
        assert a.gold_ranks == sorted(a.gold_ranks)
    assert n_tied > 0


def test_pandalm_tied_pairs(shared_dir):
    recs = load_jsonl(shared_dir / "data" / "pandalm" / "test.jsonl")
    tied = [r for r in recs if r.ties]
    assert tied and all(gold_ranks(r) == [1, 1] for r in tied)


def test_hh_rlhf_with_history(shared_dir):
    recs = load_jsonl(shared_dir / "data" / "hh_rlhf_harmless" / "test.jsonl")
    with_hist = [r for r in recs if r.history]
    assert 0.5 < len(with_hist) / len(recs) < 0.9
    for r in with_hist:
        assert r.history[0]["role"] == "user"
        assert all(set(t) == {"role", "content"} and t["role"] in ("user", "assistant")
                   for t in r.history)
    prompts = prompts_from_jsonl(shared_dir / "data" / "hh_rlhf_harmless" / "test.jsonl")
    assert any(p.history for p in prompts)


# ---------------------------------------------------------------------------
# Validation errors name file:line:field
# ---------------------------------------------------------------------------

GOOD_ROW = {"id": "t/1", "source": "t:x", "prompt": "Hello?", "responses": ["a", "b", "c"],
            "ranking": [2, 0, 1]}


@pytest.mark.parametrize("patch,field,fragment", [
    ({"ranking": [0, 0, 1]}, "ranking", "must be a permutation of range(len(responses))"),
    ({"ranking": [0, 1]}, "ranking", "must be a permutation"),
    ({"ranking": [0, 1, True]}, "ranking", "must be a permutation"),
    ({"prompt": 5}, "prompt", "must be a string"),
    ({"prompt": ""}, "prompt", "must be non-empty"),
    ({"responses": ["a", "", "c"]}, "responses", "entry 1 must be a non-empty string"),
    ({"scores": [1.0, 2.0]}, "scores", "one per response"),
    ({"scores": [0.1, 0.5, 0.9]}, "scores", "non-increasing along 'ranking'"),
    ({"ties": "yes"}, "ties", "must be a boolean"),
    ({"ties": True}, "ties", "'scores' is missing"),
    ({"history": [{"role": "bot", "content": "x"}]}, "history", "'role' must be"),
    ({"history": {"role": "user"}}, "history", "must be a list"),
    ({"meta": []}, "meta", "must be an object"),
    ({"reference": 3}, "reference", "must be a string"),
])
def test_bad_row_error_names_file_line_field(write_jsonl, patch, field, fragment):
    bad = dict(GOOD_ROW, id="t/2", **patch)
    p = write_jsonl([GOOD_ROW, "", bad])  # the bad row is on line 3
    with pytest.raises(ValueError) as e:
        load_jsonl(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:3: field '{field}'"), msg
    assert fragment in msg


def test_missing_field_and_bad_json_and_duplicate_id(write_jsonl):
    row = dict(GOOD_ROW)
    del row["ranking"]
    p = write_jsonl([row])
    with pytest.raises(ValueError, match=r"x\.jsonl:1: field 'ranking' is required"):
        load_jsonl(p)
    p = write_jsonl([GOOD_ROW, '{"id": "t/2", "source": '])
    with pytest.raises(ValueError, match=r"x\.jsonl:2: invalid JSON"):
        load_jsonl(p)
    p = write_jsonl([GOOD_ROW, GOOD_ROW])
    with pytest.raises(ValueError, match=r"x\.jsonl:2: field 'id' 't/1' repeats line 1"):
        load_jsonl(p)
    p = write_jsonl(['["not", "an", "object"]'])
    with pytest.raises(ValueError, match=r"x\.jsonl:1: row must be a JSON object"):
        load_jsonl(p)
    q = write_jsonl([GOOD_ROW], name="y.jsonl")
    with pytest.raises(ValueError, match=r"y\.jsonl:1: field 'id' 't/1' repeats .*x\.jsonl:1"):
        dd.load_jsonl_files([write_jsonl([GOOD_ROW]), q])


def test_record_keeps_optional_fields(write_jsonl):
    row = dict(GOOD_ROW, scores=[0.5, 0.2, 0.9], ties=False, history=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        meta={"k": 1}, custom="kept")
    (rec,) = load_jsonl(write_jsonl([row]))
    assert isinstance(rec, Record)
    assert rec.scores == [0.5, 0.2, 0.9] and rec.ties is False
    assert rec.history[1] == {"role": "assistant", "content": "hello"}
    assert rec.meta == {"k": 1} and rec.extra == {"custom": "kept"}
    assert rec.kind == "listwise" and rec.line == 1
    assert gold_ranks(rec) == [2, 3, 1]


# ---------------------------------------------------------------------------
# gold ranks (METHOD 11)
# ---------------------------------------------------------------------------

def test_gold_ranks_ties_share_rank():
    r = Record(id="a", source="s", prompt="p", responses=list("abcde"), ranking=[3, 1, 4, 0, 2],
               scores=[0.2, 0.9, 0.1, 0.9, 0.5], ties=True)
    assert gold_ranks(r) == [4, 1, 5, 1, 3]
    strict = Record(id="b", source="s", prompt="p", responses=list("abc"), ranking=[1, 2, 0])
    assert gold_ranks(strict) == [3, 1, 2]
    with pytest.raises(ValueError):
        gold_ranks(Record(id="c", source="s", prompt="p"))

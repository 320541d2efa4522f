"""Tests for drubric_jax.data.sources: prompt sets, anchor lists, the Nectar row conversion
and the demo set."""

from drubric_jax import data as dd
from drubric_jax.data import (
    AnchorFilterConfig,
    anchor_lists_from_jsonl,
    load_jsonl,
    prompts_from_jsonl,
)


def test_prompts_from_jsonl_prompt_only_and_pairwise(shared_dir):
    data = shared_dir / "data"
    mt = prompts_from_jsonl(data / "mt_bench" / "question.jsonl")
    assert len(mt) == 80 and all(p.history == [] for p in mt)
    assert sum(p.reference is not None for p in mt) == 30
    human = data / "llmbar_processed" / "mt_bench_human.jsonl"
    deduped = prompts_from_jsonl(human)
    assert len(deduped) < len(load_jsonl(human))  # several pairs per question
    assert len(prompts_from_jsonl(human, dedupe=False)) == len(load_jsonl(human))


def test_anchor_lists_from_shared_jsonl(shared_dir):
    data = shared_dir / "data"
    stats = {}
    anchors = anchor_lists_from_jsonl([data / "alpaca_eval_listwise" / "test.jsonl",
                                       data / "judgebench" / "gpt.jsonl",
                                       data / "mt_bench" / "question.jsonl"],
                                      min_responses=7, stats=stats)
    assert len(anchors) == 483 and stats == {"kept": 483, "few_responses": 210}
    assert all(len(a.responses) == 7 for a in anchors)


def test_nectar_row_conversion():
    row = {"prompt": "\n\nHuman: Hi there\n\nAssistant: Hello, how can I help?\n\n"
                     "Human: What is the tallest mountain on Earth?\n\nAssistant: ",
           "answers": [{"answer": "K2.", "model": "m1", "rank": 3},
                       {"answer": "Mount Everest, 8,849 m.", "model": "m2", "rank": 1},
                       {"answer": "Everest.", "model": "m3", "rank": 2},
                       {"answer": "Also Everest.", "model": "m4", "rank": 2}],
           "turns": 2, "num_responses": 4, "source": ["anthropic-hh"], "good_natured": True}
    a = dd.nectar_row_to_anchor(row, "nectar/0")
    assert a.prompt == "What is the tallest mountain on Earth?"
    assert a.history == [{"role": "user", "content": "Hi there"},
                         {"role": "assistant", "content": "Hello, how can I help?"}]
    assert a.responses == ["Mount Everest, 8,849 m.", "Everest.", "Also Everest.", "K2."]
    assert a.gold_ranks == [1, 2, 2, 4]
    assert a.source == "anthropic-hh"
    assert dd.nectar_row_to_anchor({"prompt": "no markers", "answers": []}, "x") is None


# ---------------------------------------------------------------------------
# Demo set
# ---------------------------------------------------------------------------

def test_demo_anchor_set():
    recs = load_jsonl(dd.demo_anchor_path())
    assert 20 <= len(recs) <= 30
    for r in recs:
        assert r.meta.get("demo") is True and r.source == "demo:anchors"
        assert 4 <= len(r.responses) <= 5
        assert len(r.prompt) > 50 and len(r.responses[r.ranking[0]]) > 50
    assert any(r.ranking != list(range(len(r.responses))) for r in recs)  # order shuffled
    stats = {}
    anchors = anchor_lists_from_jsonl(dd.demo_anchor_path(), min_responses=4,
                                      filters=AnchorFilterConfig(min_useful=3), stats=stats)
    assert len(anchors) == len(recs), stats
    assert all(a.gold_ranks == list(range(1, len(a.responses) + 1)) for a in anchors)


def test_demo_prompt_set():
    prompts = prompts_from_jsonl(dd.demo_prompt_path())
    assert 28 <= len(prompts) <= 40
    assert all(p.source == "demo:prompts" and p.prompt for p in prompts)
    assert all(r.kind == "prompt" for r in load_jsonl(dd.demo_prompt_path()))


def test_prompt_rows_keep_their_meta_and_meta_less_rows_hash_as_before(tmp_path):
    """`meta` reaches the PromptItem (the checks world's true checks live there); a row
    without meta hashes to the bytes it had before PromptItem carried meta, so earlier
    runs' data fingerprints still match on resume."""
    import json

    from drubric_jax.data.fingerprint import _row_bytes
    from drubric_jax.data.schema import PromptItem

    path = tmp_path / "p.jsonl"
    meta = {"checks": [{"check": "punctuation:no_comma", "args": {}}]}
    path.write_text(json.dumps({"id": "a", "source": "s", "prompt": "Hi", "meta": meta}) + "\n")
    (row,) = dd.prompts_from_jsonl(str(path))
    assert row.meta == meta
    bare = PromptItem(id="a", source="s", prompt="Hi")
    assert _row_bytes(bare) == (b'{"history":[],"id":"a","prompt":"Hi","reference":null,'
                                b'"source":"s"}')
    assert b'"meta"' in _row_bytes(row)

"""Tests for drubric_jax.data: schema loading and validation on the real shared files,
gold ranks with ties (METHOD 11), anchor lists, Appendix B heuristics (METHOD 9),
prompt sets, the demo set, and deterministic sharded / resumable batching."""

import json

import numpy as np
import pytest

from drubric_jax import data as dd
from drubric_jax.data import (
    AnchorFilterConfig,
    EpochIterator,
    Record,
    anchor_lists_from_jsonl,
    gold_ranks,
    host_shard,
    load_jsonl,
    prompts_from_jsonl,
    shuffled_order,
)

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

def test_every_shared_file_loads(shared_dir):
    root = shared_dir / "data"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jsonl"))
    assert set(SHARED_COUNTS) <= set(files)
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


# ---------------------------------------------------------------------------
# Validation errors name file:line:field
# ---------------------------------------------------------------------------

GOOD_ROW = {"id": "t/1", "source": "t:x", "prompt": "Hello?", "responses": ["a", "b", "c"],
            "ranking": [2, 0, 1]}


def _write(tmp_path, rows, name="x.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n",
                 encoding="utf-8")
    return p


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
def test_bad_row_error_names_file_line_field(tmp_path, patch, field, fragment):
    bad = dict(GOOD_ROW, id="t/2", **patch)
    p = _write(tmp_path, [GOOD_ROW, "", bad])  # the bad row is on line 3
    with pytest.raises(ValueError) as e:
        load_jsonl(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:3: field '{field}'"), msg
    assert fragment in msg


def test_missing_field_and_bad_json_and_duplicate_id(tmp_path):
    row = dict(GOOD_ROW)
    del row["ranking"]
    p = _write(tmp_path, [row])
    with pytest.raises(ValueError, match=r"x\.jsonl:1: field 'ranking' is required"):
        load_jsonl(p)
    p = _write(tmp_path, [GOOD_ROW, '{"id": "t/2", "source": '])
    with pytest.raises(ValueError, match=r"x\.jsonl:2: invalid JSON"):
        load_jsonl(p)
    p = _write(tmp_path, [GOOD_ROW, GOOD_ROW])
    with pytest.raises(ValueError, match=r"x\.jsonl:2: field 'id' 't/1' repeats line 1"):
        load_jsonl(p)
    p = _write(tmp_path, ['["not", "an", "object"]'])
    with pytest.raises(ValueError, match=r"x\.jsonl:1: row must be a JSON object"):
        load_jsonl(p)
    q = _write(tmp_path, [GOOD_ROW], name="y.jsonl")
    with pytest.raises(ValueError, match=r"y\.jsonl:1: field 'id' 't/1' repeats .*x\.jsonl:1"):
        dd.load_jsonl_files([_write(tmp_path, [GOOD_ROW]), q])


def test_record_keeps_optional_fields(tmp_path):
    row = dict(GOOD_ROW, scores=[0.5, 0.2, 0.9], ties=False, history=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        meta={"k": 1}, custom="kept")
    (rec,) = load_jsonl(_write(tmp_path, [row]))
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


# ---------------------------------------------------------------------------
# Appendix B heuristics (METHOD 9)
# ---------------------------------------------------------------------------

def test_degenerate_heuristics():
    assert dd.is_plain_refusal("I'm sorry, but I can't help with that.")
    assert dd.is_plain_refusal("That\u2019s not something I can support or provide information on.")
    assert dd.is_plain_refusal("As an AI, I do not do that.")
    assert not dd.is_plain_refusal("Thanks for the invite, but I can't make it on Friday. Sorry!")
    assert not dd.is_plain_refusal("Paris is the capital of France.")
    assert dd.is_greeting_only("Hello! How can I help you today?")
    assert dd.is_greeting_only("Hi there!")
    assert not dd.is_greeting_only("Hi! The capital of France is Paris.")
    assert dd.is_clarification_only("Could you clarify what you mean by 'fast'?")
    assert not dd.is_clarification_only("Use a hash map. Why? Lookups are O(1).")
    assert dd.is_broken_text("   ")
    assert dd.is_broken_text("\ufffd\ufffd\ufffd abc")
    assert dd.is_broken_text("#### ---- **** ==== ;;;; ~~~~")
    assert not dd.is_broken_text("x = [a + b for a, b in zip(xs, ys)]")
    loop = ("1. What is coding? \n2. How to code? \n3. How to write code? \n4. How to debug code? \n"
            "5. How to debug code? \n6. How to debug code? \n7. How to debug code? \n"
            "8. How to debug code? \n9. How to debug code?")
    assert dd.is_repetitive(loop)
    assert dd.is_repetitive("the cat sat on the mat " * 30)
    assert not dd.is_repetitive("1. Get enough sleep\n2. Exercise regularly\n3. Eat a balanced diet\n"
                                "4. Drink water")
    assert dd.is_boilerplate("As an AI language model, I don't have personal opinions. "
                             "I hope this helps!")
    assert not dd.is_boilerplate("Water boils at 100 C at sea level. It boils lower at altitude.")
    assert dd.is_degenerate("Hello! How can I help you today?")
    assert not dd.is_useful("I cannot do that.")


def test_anchor_drop_reasons():
    long_prompt = "Please explain in detail how the water cycle works for a school project."
    good = ["The water cycle moves water between the oceans, the air and the land through "
            "evaporation, condensation and precipitation."] * 5
    good = [g + f" Variant {i}." for i, g in enumerate(good)]
    cfg = AnchorFilterConfig()
    assert dd.anchor_drop_reason(long_prompt, good, cfg) is None
    assert dd.anchor_drop_reason("Too short?", good, cfg) == "short_prompt"
    assert dd.anchor_drop_reason(long_prompt, ["tiny"] + good, cfg) == "short_top_response"
    loop = "the cat sat on the mat " * 30
    assert dd.anchor_drop_reason(long_prompt, good + [loop], cfg) == "repetitive"
    refusals = ["I'm sorry, I can't help."] * 4
    assert dd.anchor_drop_reason(long_prompt, good[:3] + refusals, cfg) == "degenerate"
    assert dd.anchor_drop_reason(long_prompt, good[:3] + refusals[:3], cfg) == "few_useful"
    boiler = ["It's important to note that I hope this helps. Feel free to ask!"] * 4
    assert dd.anchor_drop_reason(long_prompt, good + boiler, cfg) == "boilerplate"
    off = AnchorFilterConfig(None, None, None, None, None, None)
    assert dd.anchor_drop_reason("x", ["y"], off) is None
    assert dd.policy_prompt_drop_reason(long_prompt, good) == "few_responses"
    assert dd.policy_prompt_drop_reason(long_prompt, good + good[:2]) is None
    assert dd.policy_prompt_drop_reason(long_prompt, refusals[:1] + good + good) in (
        "short_top_response", "bad_top_response")


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


# ---------------------------------------------------------------------------
# Shuffling, sharding, resumable iteration
# ---------------------------------------------------------------------------

def test_shuffled_order_deterministic_and_per_epoch():
    a = shuffled_order(50, seed=3, epoch=0)
    np.testing.assert_array_equal(a, shuffled_order(50, seed=3, epoch=0))
    assert sorted(a.tolist()) == list(range(50))
    assert not np.array_equal(a, shuffled_order(50, seed=3, epoch=1))
    assert not np.array_equal(shuffled_order(50, 1, 0), shuffled_order(50, 0, 1))
    with pytest.raises(ValueError):
        shuffled_order(5, -1)


@pytest.mark.parametrize("n,hosts", [(23, 4), (24, 4), (7, 1), (10, 3)])
def test_host_sharding_partitions_rows(n, hosts):
    for epoch in range(3):
        shards = [host_shard(n, 11, epoch, h, hosts) for h in range(hosts)]
        assert all(len(s) == n // hosts for s in shards)
        flat = np.concatenate(shards)
        assert len(set(flat.tolist())) == len(flat)  # disjoint
        order = shuffled_order(n, 11, epoch)
        assert set(flat.tolist()) == set(order[: n - n % hosts].tolist())
        for h in range(hosts):
            np.testing.assert_array_equal(shards[h], order[: n - n % hosts][h::hosts])
    with pytest.raises(ValueError):
        host_shard(10, 0, 0, host_id=2, num_hosts=2)


def test_epoch_iterator_covers_shard_and_reshuffles():
    items = list(range(20))
    it = EpochIterator(items, batch_size=3, seed=5, host_id=1, num_hosts=2, num_epochs=2)
    assert it.steps_per_epoch == 3
    batches = list(it)
    assert len(batches) == 6 and all(len(b) == 3 for b in batches)
    e0 = sum(batches[:3], [])
    e1 = sum(batches[3:], [])
    assert e0 == host_shard(20, 5, 0, 1, 2)[:9].tolist()
    assert e1 == host_shard(20, 5, 1, 1, 2)[:9].tolist()
    other = sum(list(EpochIterator(items, 3, 5, host_id=0, num_hosts=2, num_epochs=1)), [])
    assert not set(other) & set(e0)


def test_epoch_iterator_state_restore_reproduces_batches():
    items = [f"row{i}" for i in range(17)]
    it = EpochIterator(items, batch_size=4, seed=9)
    for _ in range(5):  # crosses the epoch boundary (4 steps per epoch)
        next(it)
    state = it.state()
    assert state["epoch"] == 1 and state["position"] == 1 and state["seed"] == 9
    state = json.loads(json.dumps(state))  # checkpoint round trip
    expected = [next(it) for _ in range(7)]
    fresh = EpochIterator(items, batch_size=4, seed=9)
    fresh.restore(state)
    assert [next(fresh) for _ in range(7)] == expected
    # state taken at the end of an epoch also resumes exactly
    it2 = EpochIterator(items, batch_size=4, seed=9)
    for _ in range(4):
        next(it2)
    s2 = it2.state()
    nxt = next(it2)
    it3 = EpochIterator(items, batch_size=4, seed=9)
    it3.restore(s2)
    assert next(it3) == nxt


def test_epoch_iterator_errors():
    with pytest.raises(ValueError):
        EpochIterator(list(range(3)), batch_size=4, seed=0)
    with pytest.raises(ValueError):
        EpochIterator(list(range(8)), batch_size=2, seed=0, host_id=2, num_hosts=2)
    it = EpochIterator(list(range(8)), batch_size=2, seed=0)
    with pytest.raises(ValueError):
        it.restore(dict(it.state(), batch_size=4))
    with pytest.raises(ValueError):
        it.restore(dict(it.state(), position=99))

"""`experiments.make_checks_anchors`: anchor rows ranked by the gold score with ties
marked, read by the project's loader, and a resumed run equal to an uninterrupted one
(tiny random-weight model, the real SmolLM2 tokenizer)."""
import json

import pytest

from drubric_jax import checks, data
from drubric_jax.evaluation import checks_anchors as mca

_LOWER_NO_COMMA = [{"check": "punctuation:no_comma", "args": {}},
                   {"check": "change_case:english_lowercase", "args": {}},
                   {"check": "keywords:existence", "args": {"keywords": ["cat", "dog"]}}]
# Checks that random text meets sometimes (letter counts, word counts) and never (capitals).
_PROMPTS = [
    {"id": "cw/0", "source": "checks_world:train", "prompt": "Say something about the sea.",
     "meta": {"checks": [{"check": "keywords:letter_frequency",
                          "args": {"letter": "e", "let_frequency": 3, "let_relation": "at least"}},
                         {"check": "punctuation:no_comma", "args": {}}], "base_id": "b/0"}},
    {"id": "cw/1", "source": "checks_world:train", "prompt": "Name a color.",
     "meta": {"checks": [{"check": "change_case:english_capital", "args": {}}]}},
    {"id": "cw/2", "source": "checks_world:train", "prompt": "Count to three.",
     "meta": {"checks": [{"check": "length_constraints:number_words",
                          "args": {"num_words": 6, "relation": "less than"}},
                         {"check": "keywords:letter_frequency",
                          "args": {"letter": "a", "let_frequency": 2,
                                   "let_relation": "less than"}}]}},
]
_KW = dict(k=3, max_new_tokens=10, temperature=1.0, seed=7, batch=2, model_name="tiny")


def _write_prompts(path, rows=_PROMPTS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_anchor_row_by_hand_ranks_by_gold_and_marks_ties(tmp_path):
    src = _write_prompts(tmp_path / "p.jsonl", [dict(_PROMPTS[0], meta={
        "checks": _LOWER_NO_COMMA, "base_id": "b/0"})])
    rec = data.load_jsonl(src)[0]
    # english_lowercase also asks langdetect for English: the lowercase answers are long enough.
    responses = ["A cat, a dog", "a cat and a dog", "", "Hello, World",
                 "my cat and my dog are friends, they play in the garden every day"]
    row = mca.anchor_row(rec, responses, [False, True, False, False, False], {"k": 5})
    assert row["responses"] == responses[:2] + responses[3:]  # the empty one dropped
    assert row["scores"] == pytest.approx([1 / 3, 1.0, 0.0, 2 / 3])
    assert row["ranking"] == [1, 3, 0, 2] and row["ties"] is False
    assert row["meta"]["truncated"] == [False, True, False, False]
    assert row["meta"]["base_id"] == "b/0" and row["meta"]["sampling"] == {"k": 5}
    tied = mca.anchor_row(rec, ["a cat and a dog", "Hi, cat and dog", "a cat and dog"],
                          [0, 0, 0], {})
    assert tied["scores"] == pytest.approx([1.0, 1 / 3, 1.0])
    assert tied["ranking"] == [0, 2, 1] and tied["ties"] is True
    anchor = data.anchor_from_record(data.record_from_dict(tied))
    assert anchor.gold_ranks == [1, 1, 3]  # tied responses share rank 1
    assert mca.anchor_row(rec, ["only one", ""], [0, 0], {}) is None


def test_sampled_rows_parse_rank_by_gold_and_resume_byte_for_byte(
        tiny_model, smollm2_tokenizer, tmp_path):
    cfg, params = tiny_model
    src = _write_prompts(tmp_path / "p.jsonl")
    full = tmp_path / "full.jsonl"
    stats = mca.write_anchors(src, str(full), cfg, params, smollm2_tokenizer, **_KW)
    assert stats["written"] + stats["too_few"] == 3 and stats["skipped_done"] == 0
    assert stats["seconds_per_prompt"] == round(stats["seconds"] / 3, 2)
    rows = data.load_jsonl(full)
    assert [r.id for r in rows] == [p["id"] for p in _PROMPTS][:len(rows)] and len(rows) >= 2
    for r, p in zip(rows, _PROMPTS):
        assert r.prompt == p["prompt"] and r.meta["checks"] == p["meta"]["checks"]
        assert r.meta["sampling"] == {**{k: v for k, v in _KW.items() if k != "model_name"},
                                      "model": "tiny"}
        want = [checks.gold_score(p["meta"]["checks"], y) for y in r.responses]
        assert r.scores == pytest.approx(want)
        assert r.ranking == sorted(range(len(want)), key=lambda i: -want[i])
        assert r.ties == (len(set(want)) < len(want))
    assert any(r.ties for r in rows)  # english_capital: random text fails every sample
    lists = data.anchor_lists_from_jsonl([full], min_responses=2)
    assert [a.id for a in lists] == [r.id for r in rows]
    # A run killed while writing: the first row, then half of the second.
    lines = full.read_bytes().split(b"\n")
    for cut in (1, 2):
        part = tmp_path / f"part{cut}.jsonl"
        part.write_bytes(b"\n".join(lines[:cut]) + b"\n" + lines[cut][:25])
        again = mca.write_anchors(src, str(part), cfg, params, smollm2_tokenizer, **_KW)
        assert again["skipped_done"] == cut
        assert part.read_bytes() == full.read_bytes()
    # Nothing left to do: nothing decoded, nothing written, no time per prompt.
    idle = mca.write_anchors(src, str(full), cfg, params, smollm2_tokenizer, **_KW)
    assert idle["written"] == 0 and idle["seconds_per_prompt"] is None
    with pytest.raises(ValueError, match="meta.sampling"):
        mca.write_anchors(src, str(full), cfg, params, smollm2_tokenizer,
                          **dict(_KW, temperature=0.5))
    summary = mca.gold_summary(str(full))
    assert summary["rows"] == len(rows)
    assert summary["mean_gold"] == pytest.approx(
        sum(s for r in rows for s in r.scores) / sum(len(r.scores) for r in rows))


def test_prompt_rows_without_checks_are_refused_by_file_line_and_field(
        tiny_model, smollm2_tokenizer, tmp_path):
    cfg, params = tiny_model
    src = _write_prompts(tmp_path / "p.jsonl", [_PROMPTS[1], {"id": "x/9", "source": "s",
                                                              "prompt": "Hi"}])
    with pytest.raises(ValueError, match=r"p\.jsonl:2: row 'x/9': field 'meta.checks' is "
                                         r"missing"):
        mca.write_anchors(src, str(tmp_path / "o.jsonl"), cfg, params, smollm2_tokenizer,
                          **_KW)
    bad = tmp_path / "o2.jsonl"
    bad.write_text("not json\n{}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"o2\.jsonl:1: not a JSON row"):
        mca.read_done(str(bad))

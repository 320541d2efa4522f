"""The checks world's parts (METHOD 13): the verifier of checks, the generator's schema,
prompt and parser, and the step metrics (gold score, constraint recovery, item rates), each
on hand-written inputs with hand-computed values."""
import json

import jax
import numpy as np
import pytest
from with_params import WithParams

from drubric_jax import checks, config_check
from drubric_jax.checks.recovery import constraint_prf, match_key
from drubric_jax.checks.schema import check_lines, items_json_schema
from drubric_jax.evaluator.check_rubrics import (CHECK_COUNTER_KEYS, display, item_of_text,
                                                 item_text, parse_checks_output)
from drubric_jax.evaluator.checks_verifier import ChecksVerifier
from drubric_jax.evaluator.rubric_formats import LLM_FORMAT, get_format
from drubric_jax.evaluator.rubric_generator import RubricGenerator, RubricInput
from drubric_jax.evaluator.verdicts import verdicts_from_p_yes
from drubric_jax.rounds.step_metrics import (constraint_metrics, gold_metrics,
                                             item_rate_metrics)

NO_COMMA = item_text("punctuation:no_comma", {})
LOWER = item_text("change_case:english_lowercase", {})
FEW_WORDS = item_text("length_constraints:number_words", {"num_words": 5,
                                                          "relation": "less than"})
PARIS = item_text("keywords:existence", {"keywords": ["paris"]})
END = item_text("startend:end_checker", {"end_phrase": "Any other questions?"})
ITEMS = [NO_COMMA, LOWER, FEW_WORDS, PARIS, END]
RESPONSES = [
    "paris is nice",                                       # 3 words, lowercase, no comma
    "Paris, France. Any other questions?",                 # 5 words: not less than 5
    "the city of light is lovely in spring and in autumn",  # 11 words, no paris
]
# Rows: responses; columns: ITEMS, each worked out by hand from the IFEval rules.
WANT = np.array([[1, 1, 1, 1, 0],
                 [0, 0, 0, 1, 1],
                 [1, 1, 0, 0, 0]], np.float32)


@pytest.mark.parametrize("workers", [1, 2])
def test_checks_verifier_verdict_matrix_by_hand(workers):
    stats = {}
    v = ChecksVerifier(workers=workers).p_yes(None, "Tell me about Paris.", RESPONSES, ITEMS,
                                              stats=stats)
    np.testing.assert_array_equal(v, WANT)
    assert v.dtype == np.float32
    assert stats == {"prefixes": 3, "judgements": 15}
    # Exact 0/1: both verdict modes of METHOD 12 give the same values.
    np.testing.assert_array_equal(verdicts_from_p_yes(v, "hard"), WANT)
    np.testing.assert_array_equal(verdicts_from_p_yes(v, "soft"), WANT)


def test_checks_verifier_ragged_lists_padding_and_loose():
    lists = [[PARIS, ""], [END, NO_COMMA], [NO_COMMA]]
    v = ChecksVerifier(workers=1).p_yes(None, ["x"] * 3, RESPONSES, lists)
    np.testing.assert_array_equal(v, [[1, 0], [1, 0], [1, 0]])
    # Loose (IFEval) also tries the response without its first line: lowercase passes.
    low = [LOWER]
    strict = ChecksVerifier(workers=1).p_yes(None, "x", ["The answer\nparis is nice"], low)
    loose = ChecksVerifier(loose=True, workers=1).p_yes(None, "x", ["The answer\nparis is nice"],
                                                         low)
    assert strict[0, 0] == 0 and loose[0, 0] == 1
    with pytest.raises(ValueError, match="calibration"):
        ChecksVerifier().p_yes(None, "x", ["y"], [NO_COMMA], calibration="contextual")
    with pytest.raises(checks.InvalidCheck):
        ChecksVerifier(workers=1).p_yes(None, "x", ["y"], ["be nice"])


def test_item_text_round_trip_and_display():
    args = {"num_words": 5, "relation": "less than"}
    text = item_text("length_constraints:number_words", args)
    assert item_of_text(text) == ("length_constraints:number_words", args)
    assert display(text) == "Answer with less than 5 words."
    assert display("") == "" and display("free text") == "free text"
    assert LLM_FORMAT.display("free text") == "free text"


def test_parse_checks_output_counts_every_drop():
    items = [
        {"check": "punctuation:no_comma", "args": {}, "weight": 5},                 # kept
        {"check": "length_constraints:number_words",
         "args": {"num_words": "ten", "relation": "at least"}, "weight": 3},       # invalid
        {"check": "be:nice", "args": {}, "weight": 2},                             # invalid
        {"check": "keywords:existence", "args": {"keywords": ["Paris"]}, "weight": 4},
        {"check": "keywords:existence", "args": {"keywords": [" paris"]}, "weight": 1},  # dup
        {"check": "startend:quotation", "args": {}, "weight": 0},                  # weight
        {"check": "length_constraints:nth_paragraph_first_word",
         "args": {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "so"},
         "weight": 2},                                                             # invalid
        "not an object",
        {"check": "detectable_format:title", "args": {}, "weight": 2},             # over
    ]
    p = parse_checks_output(json.dumps({"rubrics": items}), "stop", max_items=2)
    assert p.valid and p.weights == [5, 4]
    assert [item_of_text(t) for t in p.texts] == [("punctuation:no_comma", {}),
                                                  ("keywords:existence", {"keywords": ["Paris"]})]
    want = dict.fromkeys(CHECK_COUNTER_KEYS, 0)
    want.update(invalid_check=3, duplicate=1, invalid_weight=1, non_object_item=1,
                over_limit=1)
    assert p.counters == want and p.num_dropped == 7
    cut = parse_checks_output('{"rubrics": [{"check": "punctuation:no_comma"', "length")
    assert not cut.valid and cut.truncated and cut.counters["truncated"] == 1
    none = parse_checks_output(json.dumps({"rubrics": [items[2]]}))
    assert not none.valid and none.counters["no_valid_items"] == 1
    assert parse_checks_output("no json here").counters["unparseable"] == 1


def test_constraint_prf_by_hand():
    truth = [{"check": "punctuation:no_comma", "args": {}},
             {"check": "keywords:existence", "args": {"keywords": ["Paris", "rome"]}},
             {"check": "length_constraints:number_words",
              "args": {"num_words": 100, "relation": "at least"}}]
    pred = [("punctuation:no_comma", {}),
            ("keywords:existence", {"keywords": ["ROME", "paris"]}),  # same set, any case
            ("length_constraints:number_words", {"num_words": 50, "relation": "at least"}),
            ("detectable_format:title", {})]
    # 2 of 4 predicted are true, 2 of 3 true are found: P = 1/2, R = 2/3, F1 = 4/7.
    p, r, f = constraint_prf(pred, truth)
    assert (p, r) == (0.5, pytest.approx(2 / 3)) and f == pytest.approx(4 / 7)
    # Ids alone: 3 of 4, 3 of 3: F1 = 2 * 3/4 / (3/4 + 1) = 6/7.
    assert constraint_prf(pred, truth, ids_only=True)[2] == pytest.approx(6 / 7)
    assert constraint_prf([], truth) == (0.0, 0.0, 0.0)
    assert constraint_prf([("detectable_format:title", {})], truth) == (0.0, 0.0, 0.0)
    assert match_key("keywords:frequency", {"keyword": "Cat", "frequency": 2,
                                            "relation": "at least"}) == \
        match_key("keywords:frequency", {"relation": "at least", "frequency": 2,
                                         "keyword": " cat"})
    with pytest.raises(ValueError):
        constraint_prf(pred, [])


def test_step_metrics_of_the_checks_world_by_hand():
    truth = [[{"check": "punctuation:no_comma", "args": {}},
              {"check": "keywords:existence", "args": {"keywords": ["here"]}}], None]
    sets = [["no commas here", "Yes, a comma", "here, fine"], ["anything"] * 3]
    proxy = np.array([[1.0, 0.5, 0.0], [0.3, 0.3, 0.3]])
    # g: 1 (both met), 0 (neither), 1/2 (the keyword only); the prompt without checks skipped.
    got = gold_metrics(truth, sets, proxy)
    assert got == {"gold_score": pytest.approx(0.5), "gold_all_met_fraction": pytest.approx(1 / 3),
                   "proxy_score": pytest.approx(0.5),
                   # per prompt with checks: g (1 + 0 + 1/2) / 3, proxy (1 + 0.5 + 0) / 3
                   "group_gold": [pytest.approx(0.5)], "group_proxy": [pytest.approx(0.5)]}
    assert gold_metrics([None, []], sets) == {}
    here = item_text("keywords:existence", {"keywords": ["Here"]})
    texts = [[NO_COMMA, PARIS, ""], [here, "", ""], ["", "", ""]]
    mask = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
    lists_truth = [truth[0], truth[0], truth[0]]
    # List 0: P 1/2, R 1/2, F1 1/2; list 1: P 1, R 1/2, F1 2/3; list 2 (invalid): 0, 0, 0.
    got = constraint_metrics(texts, mask, lists_truth)
    assert got["constraint_precision"] == pytest.approx(0.5)
    assert got["constraint_recall"] == pytest.approx(1 / 3)
    assert got["constraint_f1"] == pytest.approx((0.5 + 2 / 3) / 3)
    # Ids alone: list 0 finds both ids (F1 1), list 1 one of two (2/3), list 2 none.
    assert got["constraint_f1_check_id"] == pytest.approx((1 + 2 / 3) / 3)
    assert constraint_metrics(texts, mask, [None] * 3) == {}
    counters = {"items_kept": 6, "items_dropped": 4, "invalid_check": 2, "duplicate": 1,
                "lists": 4, "valid_lists": 3}
    assert item_rate_metrics(counters) == {"invalid_item_rate": 0.2, "duplicate_item_rate": 0.1,
                                           "invalid_list_rate": 0.25}


def test_check_lines_name_every_scorable_check_with_placeholders():
    lines = check_lines().splitlines()
    assert [line.split(" ")[1] for line in lines] == list(checks.SCORABLE_CHECKS)
    text = "\n".join(lines)
    assert "qq" not in text and "7100" not in text and "QQ" not in text
    assert ("- length_constraints:number_words {num_words: int 0-500, relation: "
            '"less than"|"at least"}: Answer with <relation> <num_words> words.') in lines
    schema = items_json_schema(5)
    assert len(schema["properties"]["rubrics"]["items"]["anyOf"]) == len(checks.SCORABLE_CHECKS)
    assert schema["properties"]["rubrics"]["maxItems"] == 5


def test_config_kind_is_validated_and_checks_refuse_calibration():
    from configs.smollm2_cpu import get_config

    c = get_config("tiny,world=checks,checks_dir=/nowhere")
    config_check.validate(c)
    # World v2 (the default): the policy reads its own split, the generator's RL its own.
    assert c.verifier.kind == "checks" and c.data.prompt_paths == ("/nowhere/policy.jsonl",)
    assert c.data.anchor_paths == ("/nowhere/gen_rl_anchors.jsonl",)
    assert c.data.checks_dir == "/nowhere"
    v1 = get_config("tiny,world=checks,world_version=1,checks_dir=/nowhere")
    assert v1.data.prompt_paths == ("/nowhere/train.jsonl",)
    assert v1.data.anchor_paths == ("/nowhere/anchors.jsonl",)
    c.verifier.calibration = "contextual"
    with pytest.raises(config_check.ConfigError, match="config.verifier.calibration"):
        config_check.validate(c)
    c.verifier.calibration, c.verifier.kind = "none", "rules"
    with pytest.raises(config_check.ConfigError, match="config.verifier.kind"):
        config_check.validate(c)
    assert get_config("").verifier.kind == "llm"
    with pytest.raises(ValueError, match="world"):
        get_config("world=moon")


def test_tiny_generator_under_the_constraint_writes_only_valid_checks(tiny_model,
                                                                      smollm2_tokenizer):
    cfg, params = tiny_model
    gen = WithParams(RubricGenerator(cfg, smollm2_tokenizer, max_items=3, max_item_chars=40,
                                     max_new_tokens=160, input_budget=2048,
                                     fmt=get_format("checks")), params, "generate_batch")
    inputs = [RubricInput("Write a haiku about rain. Do not use any commas.",
                          ("rain falls soft", "Rain, rain, go away")),
              RubricInput("Describe Paris in at least 100 words.", ("Paris is big.", "No."))]
    rb = gen.generate_batch(jax.random.PRNGKey(0), inputs, num_lists=3, temperature=1.0)
    finished = [(b, g) for b in range(2) for g in range(3)
                if rb.finish_reasons[b][g] == "stop"]
    assert finished, rb.finish_reasons
    raw_items = 0
    for b, g in finished:
        # A finished list is the schema's JSON: only scorable ids, typed args; the one rule
        # JSON schema cannot state (nth_paragraph <= num_paragraphs) is the parser's.
        for item in json.loads(rb.raw_texts[b][g])["rubrics"]:
            raw_items += 1
            assert item["check"] in checks.SCORABLE_CHECKS and 1 <= item["weight"] <= 5
            try:
                checks.validate(item["check"], item["args"])
            except checks.InvalidCheck as e:
                assert e.field == "nth_paragraph", e
    kept = [(t, w) for b in range(2) for g in range(3)
            for t, w, on in zip(rb.texts[b][g], rb.weights[b, g], rb.item_mask[b, g]) if on]
    assert kept, rb.raw_texts
    for t, _ in kept:
        checks.validate(*item_of_text(t))  # every kept item validates
    c = rb.counters
    assert set(CHECK_COUNTER_KEYS) <= set(c) and c["constraint_dead_end"] == 0
    assert c["items_kept"] == len(kept)
    assert c["items_kept"] + c["invalid_check"] + c["duplicate"] + c["over_limit"] == raw_items

"""Tests for drubric_jax.text.rubric_format: rubric parsing (cases 11, 13), item rules,
the JSON schema and padding."""

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drubric_jax.text import json_scan, prompts
from drubric_jax.text.rubric_format import (
    COUNTER_KEYS,
    CRITERION_PLACEHOLDER,
    RUBRIC_JSON_SCHEMA,
    WEIGHT_PLACEHOLDER,
    _is_format_echo,
    pad_rubrics,
    parse_rubric_output,
)

# ---------------------------------------------------------------------------
# case-11: fences, trailing commas, prose, truncation
# ---------------------------------------------------------------------------

CASE_11_OUTPUTS = {
    "fenced_trailing_comma_prose": (
        "stop",
        "```json\n[{\"rubric\": \"Cites at least one source\", \"weight\": 3},\n"
        " {\"rubric\": \"Stays under 100 words\", \"weight\": 5},]\n```\n"
        "These two criteria separate the answers [see note 1]."),
    "prose_before": (
        "stop", "Here are the criteria (v2):\n[{\"rubric\": \"Gives a concrete date\", \"weight\": 2}]"),
    "backticks_in_string": ("stop", "[{\"rubric\": \"Uses `print` only once\", \"weight\": 4}]"),
    "truncated": (
        "length",
        "[{\"rubric\": \"Mentions the deadline\", \"weight\": 4}, {\"rubric\": \"Uses a polite tone\", \"wei"),
}
CASE_11_EXPECTED = {
    "fenced_trailing_comma_prose": [("Cites at least one source", 3), ("Stays under 100 words", 5)],
    "prose_before": [("Gives a concrete date", 2)],
    "backticks_in_string": [("Uses `print` only once", 4)],
}


def test_case_11_inputs_match_shared_file(load_case):
    case = load_case("case-11")
    if case is None:
        pytest.skip("../shared not found")
    for out in case["input"]["outputs"]:
        assert CASE_11_OUTPUTS[out["name"]] == (out["finish_reason"], out["text"])
    for name, items in CASE_11_EXPECTED.items():
        assert [tuple(x) for x in case["expected"][name]] == items


@pytest.mark.parametrize("name", sorted(CASE_11_EXPECTED))
def test_case_11_recovers_rubric_list(name):
    finish, text = CASE_11_OUTPUTS[name]
    p = parse_rubric_output(text, finish, max_items=8)
    assert p.valid and not p.truncated
    assert p.items == CASE_11_EXPECTED[name]
    assert p.num_dropped == 0
    assert p.counters["unparseable"] == 0


def test_case_11_truncated_is_invalid_and_flagged():
    finish, text = CASE_11_OUTPUTS["truncated"]
    p = parse_rubric_output(text, finish, max_items=8)  # no exception
    assert not p.valid and p.truncated
    assert p.texts == [] and p.weights == []  # documented: no salvage
    assert p.counters["truncated"] == 1 and p.counters["unparseable"] == 0


def test_case_11_unclosed_value_without_length_is_truncated():
    _, text = CASE_11_OUTPUTS["truncated"]
    p = parse_rubric_output(text, "stop", max_items=8)
    assert not p.valid and p.truncated and p.counters["truncated"] == 1


def test_case_11_length_finish_is_truncated_even_if_closed():
    p = parse_rubric_output('[{"rubric": "A", "weight": 3}]', "length", 8)
    assert not p.valid and p.truncated


def test_case_11_object_form_fence_and_trailing_prose_brackets():
    text = ('Sure!\n```json\n{"rubrics": [{"rubric": "States the answer [in bold]", "weight": 5,},'
            ' {"rubric": "Explains why } matters", "weight": 2}], "note": "x",}\n```\n'
            'See [1] and {2}.')
    p = parse_rubric_output(text, "stop", 8)
    assert p.items == [("States the answer [in bold]", 5), ("Explains why } matters", 2)]


def test_case_11_bracketed_prose_before_the_list_is_skipped():
    for prefix in ("Per note [1]: ", "Draft [v2, final]:\n", 'See {"a": 1} then ', "[[see"):
        p = parse_rubric_output(prefix + '[{"rubric": "Gives a date", "weight": 2}]', "stop", 8)
        assert p.items == [("Gives a date", 2)], prefix


def test_case_11_long_bracketed_prose_before_the_list():
    text = "Notes [x] (v2) {y} [1, 2] " * 500 + '["not", "rubric"] [{"rubric": "Ok", "weight": 1}]'
    assert parse_rubric_output(text, "stop", 8).items == [("Ok", 1)]


def test_case_11_commas_inside_strings_are_kept():
    p = parse_rubric_output('[{"rubric": "Lists a, b, ]", "weight": 1},]', "stop", 8)
    assert p.items == [("Lists a, b, ]", 1)]


def test_case_11_escaped_quotes_and_raw_newlines():
    p = parse_rubric_output('[{"rubric": "Quotes \\"exactly\\" [x]\nonce", "weight": 3}]', "stop", 8)
    assert p.items == [('Quotes "exactly" [x]\nonce', 3)]


@pytest.mark.parametrize("text", ["", "no json at all", "[1, 2, 3]", '{"criteria": []}',
                                  "[{'rubric': 'single quotes', 'weight': 3}]", "]]}}[",
                                  "[" * 3000 + "]" * 3000, "{" * 100])
def test_case_11_garbage_never_raises(text):
    p = parse_rubric_output(text, "stop", 8)
    assert not p.valid
    assert p.counters["unparseable"] + p.counters["truncated"] + p.counters["no_valid_items"] == 1
    assert set(p.counters) == set(COUNTER_KEYS)


def _scan_work(monkeypatch, text, max_items):
    """Parses `text` and returns (the parse, the work the JSON search did): candidate starts
    tried, special characters the bracket matcher visited, characters given to json.loads.
    Counting the work (not timing it) is what bounds the parser on any machine."""
    work = {"candidates": 0, "steps": 0, "json_chars": 0}
    match, loads = json_scan._match_value, json_scan.json.loads

    def counted_match(t, start, max_steps):
        end, used = match(t, start, max_steps)
        work["candidates"] += 1
        work["steps"] += used
        return end, used

    def counted_loads(segment, **kw):
        work["json_chars"] += len(segment)
        return loads(segment, **kw)

    monkeypatch.setattr(json_scan, "_match_value", counted_match)
    monkeypatch.setattr(json_scan, "json", SimpleNamespace(loads=counted_loads))
    return parse_rubric_output(text, "stop", max_items), work


def _assert_within_bounds(work):
    assert work["candidates"] <= json_scan.MAX_CANDIDATES, work
    assert work["steps"] <= json_scan.MAX_SCAN_STEPS, work
    assert work["json_chars"] <= json_scan.MAX_JSON_CHARS, work


_SPECIAL_CHARS = re.compile(r'[\[\]{}"\\]')

SLOW_BEFORE = {  # took 0.5 to 2 s each before the parser's work was bounded
    "open_lists": "[{" * 20000,
    "open_objects": '{"' * 20000,
    "open_strings": '["' * 20000,
    "unclosed_items": '[{"a":1,' * 5000,
    "nested_lists": ("[{" + "[1]" * 52) * 256,
    "deep_openers": ("[" * 300 + '{"') * 100,
    "closed_nesting": "[{" * 20000 + "}]" * 20000,
}


@pytest.mark.parametrize("name", sorted(SLOW_BEFORE))
def test_parser_work_is_bounded(name, monkeypatch):
    text = SLOW_BEFORE[name]
    p, work = _scan_work(monkeypatch, text, 8)
    assert not p.valid
    assert p.counters["unparseable"] + p.counters["truncated"] == 1
    _assert_within_bounds(work)
    # The unbounded search visited every special character once per candidate start.
    assert work["steps"] < len(_SPECIAL_CHARS.findall(text)) * min(
        len(text), json_scan.MAX_CANDIDATES), work


def test_parser_work_limit_is_counted_and_spares_real_outputs(monkeypatch):
    p = parse_rubric_output("[{" * 20000, "stop", 8)
    assert p.counters["work_limit"] == 1 and p.truncated
    huge = parse_rubric_output('[{"rubric": "A", "weight": 1}]' + " " * (1 << 21), "stop", 8)
    assert not huge.valid and huge.counters["work_limit"] == 1
    assert huge.counters["unparseable"] == 1
    # a long chatty output (reasoning with JSON-like snippets, then the list) still parses
    line = 'I think the item should say "why" [see 1], (v2) {draft} and {"a": [1]} matter.\n'
    prose = (line + 'The "weight" of [that] is {unclear}, see note [2] and "quote".\n' * 9) * 50
    items = [{"rubric": f"Criterion number {i} about {'x' * 200}", "weight": 1 + i % 5}
             for i in range(20)]
    text = '<think>\n["unclosed' + prose + "</think>\n" + json.dumps({"rubrics": items})
    p, work = _scan_work(monkeypatch, text, 20)
    assert p.valid and len(p.texts) == 20 and p.counters["work_limit"] == 0
    _assert_within_bounds(work)
    # The list is found with its own characters read once by json.loads, plus the prose's
    # small JSON-like snippets (each tried and rejected).
    assert work["json_chars"] < 2 * len(json.dumps({"rubrics": items})), work


def test_case_11_non_string_input_never_raises():
    for bad in (None, 3, b"[]"):
        p = parse_rubric_output(bad, "stop", 8)
        assert not p.valid and p.counters["unparseable"] == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list('[]{}",:` \n\\ab0123456') + ['"rubric"', '"weight"']),
                max_size=60).map("".join),
       st.sampled_from(["stop", "length", None]))
def test_case_11_parser_total_on_random_text(text, finish):
    p = parse_rubric_output(text, finish, 4)
    assert isinstance(p.valid, bool)
    assert len(p.texts) == len(p.weights) <= 4
    assert all(isinstance(w, int) and 1 <= w <= 5 for w in p.weights)
    assert p.valid == (len(p.texts) > 0)


JSONISH = st.lists(st.sampled_from(
    ['{"rubrics": [', '{"rubric": ', '"weight": ', '"A b"', '"<criterion>"', '"\\ud800"',
     '"..."', "3", "5.0", "true", "null", ", ", "]", "}", "[", "{", '"', "\\", "```json\n",
     "\n", "prose ", "[1]"]), max_size=80).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(st.characters(exclude_categories=())), JSONISH),  # surrogates too
       st.sampled_from(["stop", "length", None]), st.integers(-1, 20))
def test_parser_never_raises_on_arbitrary_text(text, finish, max_items):
    p = parse_rubric_output(text, finish, max_items)
    assert set(p.counters) == set(COUNTER_KEYS)
    assert p.valid == (len(p.texts) > 0) and len(p.texts) == len(p.weights)
    assert len(p.texts) <= max(max_items, 0)
    for t, w in p.items:
        assert t == t.strip() and t and not _is_format_echo(t)
        t.encode("utf-8")  # what the verifier and the trace writer need
        assert type(w) is int and 1 <= w <= 5


# item texts the item rules keep: not blank, not an echo of the format line such as "..."
ITEM_TEXT = st.text(max_size=25).filter(lambda t: t.strip() and not _is_format_echo(t))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(ITEM_TEXT, st.integers(1, 5)), min_size=1, max_size=6),
       st.sampled_from(["", "Here you go (v2) [note 1]:\n", "Criteria {draft}:\n", "```json\n"]),
       st.sampled_from(["", "\n```", "\nThat is all [1].", " {done}"]),
       st.booleans(), st.booleans())
def test_case_11_roundtrip_with_prose_and_fences(items, before, after, as_object, trailing_comma):
    body = ", ".join(json.dumps({"rubric": t, "weight": w}) for t, w in items)
    body = "[" + body + ("," if trailing_comma else "") + "]"
    text = before + ('{"rubrics": ' + body + "}" if as_object else body) + after
    expected, seen = [], set()
    for t, w in items:
        key = " ".join(t.split()).casefold()
        if key not in seen:
            seen.add(key)
            expected.append((t.strip(), w))
    p = parse_rubric_output(text, "stop", 10)
    assert p.valid and p.items == expected
    assert p.counters["duplicate"] == len(items) - len(expected)


# ---------------------------------------------------------------------------
# case-13: empty rubric / all items invalid (parsing side)
# ---------------------------------------------------------------------------

def test_case_13_empty_and_zero_weight_lists_are_invalid(load_case):
    texts = ["[]", '[{"rubric": "A", "weight": 0}, {"rubric": "B", "weight": 0}]']
    case = load_case("case-13")
    if case is not None:
        assert case["input"]["rubric_texts"] == texts
    empty = parse_rubric_output(texts[0], "stop", 8)
    assert not empty.valid and not empty.truncated
    assert empty.counters["no_valid_items"] == 1 and empty.counters["unparseable"] == 0
    zeros = parse_rubric_output(texts[1], "stop", 8)
    assert not zeros.valid
    assert zeros.counters["invalid_weight"] == 2 and zeros.counters["no_valid_items"] == 1
    assert zeros.texts == [] and zeros.weights == []
    # padded: nothing masked in, weight sum 0, list flagged invalid
    _, w, mask, ok = pad_rubrics([empty, zeros], m_max=4)
    assert w.sum() == 0 and not mask.any() and not ok.any()


def test_case_13_object_form_with_empty_list():
    p = parse_rubric_output('{"rubrics": []}', "stop", 8)
    assert not p.valid and p.counters["no_valid_items"] == 1


# ---------------------------------------------------------------------------
# Item validity rules (METHOD 11)
# ---------------------------------------------------------------------------

def test_item_rules_drop_and_count():
    items = [
        {"rubric": "bool weight", "weight": True},
        {"rubric": "float weight", "weight": 3.0},
        {"rubric": "string weight", "weight": "3"},
        {"rubric": "too high", "weight": 6},
        {"rubric": "too low", "weight": 0},
        {"rubric": "missing weight"},
        {"rubric": "   ", "weight": 3},
        {"rubric": 7, "weight": 3},
        {"weight": 3},
        "just a string",
        [1, 2],
        {"rubric": "Keeps  The Date", "weight": 4, "why": "extra keys are ignored"},
        {"rubric": "keeps the\tdate ", "weight": 5},
        {"rubric": "  Second item  ", "weight": 1},
        {"rubric": "Third item", "weight": 2},
        {"rubric": "Fourth item", "weight": 3},
    ]
    p = parse_rubric_output(json.dumps(items), "stop", max_items=3)
    assert p.valid
    assert p.items == [("Keeps  The Date", 4), ("Second item", 1), ("Third item", 2)]
    c = p.counters
    assert c["invalid_weight"] == 6
    assert c["empty_text"] == 3
    assert c["non_object_item"] == 2
    assert c["duplicate"] == 1
    assert c["over_limit"] == 1
    assert p.num_dropped == 13


def test_item_with_a_repeated_key_is_dropped_and_counted():
    # json.loads would silently keep the last value (weight 5); other parsers keep the first
    text = ('[{"rubric": "H", "weight": 2, "weight": 5}, {"rubric": "A", "rubric": "B", '
            '"weight": 3}, {"rubric": "C", "weight": 4, "why": "x", "why": "y"}, '
            '{"rubric": "Kept", "weight": 1, "note": {"a": 1, "a": 2}}]')
    p = parse_rubric_output(text, "stop", 8)
    assert p.valid and p.items == [("Kept", 1)]
    assert p.counters["duplicate_key"] == 3 and p.num_dropped == 3
    only = parse_rubric_output('{"rubrics": [{"rubric": "H", "weight": 2, "weight": 5}]}',
                               "stop", 8)
    assert not only.valid and only.counters["duplicate_key"] == 1
    assert only.counters["no_valid_items"] == 1
    # a wrapper with two "rubrics" lists is ambiguous too: invalid, neither list is read
    two = parse_rubric_output('{"rubrics": [{"rubric": "A", "weight": 2}], '
                              '"rubrics": [{"rubric": "B", "weight": 3}]}', "stop", 8)
    assert not two.valid and two.texts == []
    assert two.counters["duplicate_key"] == 1 and two.counters["no_valid_items"] == 1
    assert two.counters["unparseable"] == 0


def test_item_with_a_lone_surrogate_is_dropped_and_counted():
    # json.loads turns the escape "\ud800" into a lone surrogate, which no tokenizer or
    # UTF-8 file writer accepts (it crashed the verifier and the trace writer)
    text = r'[{"rubric": "\ud800", "weight": 3}, {"rubric": "Says hi \udc00 twice", "weight": 2}]'
    p = parse_rubric_output(text, "stop", 8)
    assert not p.valid and p.counters["invalid_unicode"] == 2
    assert p.counters["no_valid_items"] == 1
    mixed = parse_rubric_output(r'[{"rubric": "Uses \ud83d\ude00 once", "weight": 4}, '
                                r'{"rubric": "Bad \ud800", "weight": 1}]', "stop", 8)
    assert mixed.items == [("Uses \U0001F600 once", 4)]  # a proper pair is one character
    assert mixed.counters["invalid_unicode"] == 1 and mixed.num_dropped == 1
    for t in mixed.texts:
        t.encode("utf-8")


def test_items_echoing_the_output_format_are_dropped_and_counted():
    # the SmolLM2 generator copied the prompt's format line: items "<criterion>",
    # "<criterion_1", "<criterion_2", "<criterion_3" (round-0 trace of the default run)
    for system in (prompts.GENERATOR_SYSTEM_DYNAMIC, prompts.GENERATOR_SYSTEM_STATIC):
        assert (f'{{"rubric": "{CRITERION_PLACEHOLDER}", "weight": {WEIGHT_PLACEHOLDER}}}'
                in system)
    echoes = ["<criterion>", "<criterion_1", "<criterion_2", "<criterion_3", " Criterion 4 ",
              "<integer 1-5>", "rubric", "Weight: 5", "...", "<criterion>, ...", "\u2026",
              "<CRITERION>"]
    kept = ["Criterion: states the date", "Names the criterion it uses",
            "Gives the weight in kg", "Uses an integer between 1 and 5", "Ends with ..."]
    items = [{"rubric": t, "weight": 3} for t in echoes + kept]
    p = parse_rubric_output(json.dumps(items), "stop", 16)
    assert p.texts == kept
    assert p.counters["placeholder_item"] == len(echoes) and p.num_dropped == len(echoes)
    only = parse_rubric_output('{"rubrics": [{"rubric": "<criterion>", "weight": 1}]}', "stop", 8)
    assert not only.valid and only.counters["placeholder_item"] == 1
    assert only.counters["no_valid_items"] == 1


def test_weights_stay_python_ints():
    p = parse_rubric_output('[{"rubric": "a", "weight": 5}]', "stop", 8)
    assert type(p.weights[0]) is int


# ---------------------------------------------------------------------------
# JSON schema
# ---------------------------------------------------------------------------

def test_schema_structure():
    s = RUBRIC_JSON_SCHEMA(max_items=6, max_item_chars=120)
    assert s["type"] == "object" and s["required"] == ["rubrics"]
    assert s["additionalProperties"] is False
    arr = s["properties"]["rubrics"]
    assert arr["type"] == "array" and arr["minItems"] == 1 and arr["maxItems"] == 6
    item = arr["items"]
    assert item["required"] == ["rubric", "weight"] and item["additionalProperties"] is False
    assert item["properties"]["rubric"] == {"type": "string", "minLength": 1, "maxLength": 120}
    assert item["properties"]["weight"] == {"type": "integer", "minimum": 1, "maximum": 5}
    allowed = {"type", "properties", "required", "items", "minItems", "maxItems", "minLength",
               "maxLength", "minimum", "maximum", "additionalProperties"}

    def keys(node):
        if isinstance(node, dict):
            for k, v in node.items():
                yield k
                if k == "properties":
                    for sub in v.values():
                        yield from keys(sub)
                elif isinstance(v, dict):
                    yield from keys(v)

    assert set(keys(s)) <= allowed
    json.dumps(s)  # serialisable
    with pytest.raises(ValueError):
        RUBRIC_JSON_SCHEMA(0, 10)


GOOD = '{"rubrics": [{"rubric": "Gives a date", "weight": 3}]}'
BAD = ['{"rubrics": [{"rubric": "Gives a date", "weight": 6}]}',
       '{"rubrics": [{"rubric": "Gives a date", "weight": 0}]}',
       '{"rubrics": [{"rubric": "Gives a date", "weight": 3.5}]}',
       '{"rubrics": [{"rubric": "Gives a date", "weight": true}]}',
       '{"rubrics": [{"rubric": "Gives a date", "weight": "3"}]}',
       '{"rubrics": []}',
       '{"rubrics": [{"rubric": "", "weight": 3}]}',
       '{"rubrics": [{"rubric": "a", "weight": 3, "x": 1}]}',
       '{"rubrics": [{"rubric": "a", "weight": 1}, {"rubric": "b", "weight": 1},'
       ' {"rubric": "c", "weight": 1}]}']


def test_schema_with_jsonschema():
    import jsonschema  # the test extra's (setup.py)

    s = RUBRIC_JSON_SCHEMA(2, 40)
    jsonschema.Draft7Validator.check_schema(s)
    v = jsonschema.Draft7Validator(s)
    assert v.is_valid(json.loads(GOOD))
    for b in BAD:
        assert not v.is_valid(json.loads(b)), b


def test_schema_with_llguidance():
    import llguidance as llg  # a run-time requirement (setup.py)

    tok = llg.LLTokenizer("byte")
    grammar = llg.LLMatcher.grammar_from_json_schema(RUBRIC_JSON_SCHEMA(2, 40))
    assert llg.LLMatcher.validate_grammar(grammar) == ""

    def accepts(text):
        m = llg.LLMatcher(tok, grammar)
        ids = tok.tokenize_str(text)
        return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()

    assert accepts(GOOD)
    for b in BAD:
        assert not accepts(b), b
    # whatever the grammar accepts, the parser keeps
    assert parse_rubric_output(GOOD, "stop", 2).items == [("Gives a date", 3)]


# ---------------------------------------------------------------------------
# pad_rubrics
# ---------------------------------------------------------------------------

def test_pad_rubrics_shapes_and_values():
    a = parse_rubric_output('[{"rubric": "x", "weight": 2}, {"rubric": "y", "weight": 5}]', "stop", 4)
    b = parse_rubric_output('[{"rubric": "z", "weight": 1}]', "stop", 4)
    c = parse_rubric_output("nothing", "stop", 4)
    texts, w, mask, ok = pad_rubrics([a, b, c], m_max=3)
    assert texts == [["x", "y", ""], ["z", "", ""], ["", "", ""]]
    assert w.dtype == np.int32 and w.shape == (3, 3)
    np.testing.assert_array_equal(w, [[2, 5, 0], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert mask.dtype == bool and ok.dtype == bool
    np.testing.assert_array_equal(ok, [True, True, False])
    with pytest.raises(ValueError):
        pad_rubrics([a], m_max=1)
    with pytest.raises(ValueError):
        pad_rubrics([a], m_max=0)
    texts, w, mask, ok = pad_rubrics([], m_max=2)
    assert w.shape == (0, 2) and ok.shape == (0,)

"""drubric_jax.checks: IFEval's checkers as items (METHOD 13), on hand-written responses."""
import dataclasses
import inspect
import random

import numpy as np
import pytest
from if_verifiable.ifeval import instructions_registry

from drubric_jax import checks
from drubric_jax.checks import InvalidCheck, NotScorable

LONG = " ".join(["word"] * 120)
PASSAGE = ("The weather was bright and calm all day. Children played near the river while "
           "their parents talked about the harvest and the coming winter in the valley.")

# check -> (args, a response it accepts, a response it rejects); strict verdicts.
CASES = {
    "keywords:existence": ({"keywords": ["apple", "river"]},
                           "An Apple fell in the river.", "An apple fell."),
    "keywords:frequency": ({"keyword": "cat", "frequency": 2, "relation": "at least"},
                           "cat and CAT", "one cat"),
    "keywords:forbidden_words": ({"forbidden_words": ["dog"]}, "dogs and cats", "a dog here"),
    "keywords:letter_frequency": ({"letter": "z", "let_frequency": 3, "let_relation": "less than"},
                                  "zz top", "zzz"),
    "language:response_language": ({"language": "en"}, PASSAGE,
                                   "Le temps était clair et calme toute la journée, et les "
                                   "enfants jouaient près de la rivière."),
    "length_constraints:number_paragraphs": ({"num_paragraphs": 2}, "one\n***\ntwo", "one"),
    "length_constraints:number_words": ({"num_words": 100, "relation": "at least"}, LONG, "short"),
    "length_constraints:nth_paragraph_first_word": (
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
        "First part.\n\nThen, the second.", "First part.\n\nAnd the second."),
    "detectable_content:number_placeholders": ({"num_placeholders": 2}, "[name] at [address]",
                                               "[name] only"),
    "detectable_content:postscript": ({"postscript_marker": "P.S."}, "Hi.\nP.S. bye", "Hi. bye"),
    "detectable_format:number_bullet_lists": ({"num_bullets": 2}, "* a\n* b", "* a\n* b\n* c"),
    "detectable_format:constrained_response": ({}, "My answer is yes.", "Yes."),
    "detectable_format:number_highlighted_sections": ({"num_highlights": 2}, "*one* and *two*",
                                                      "*one* only"),
    "detectable_format:multiple_sections": ({"section_spliter": "Section", "num_sections": 2},
                                            "Section 1\na\nSection 2\nb", "Section 1\na"),
    "detectable_format:json_format": ({}, '```json\n{"a": 1}\n```', "a: 1"),
    "detectable_format:title": ({}, "<<My Title>>\ntext", "My Title\ntext"),
    "combination:two_responses": ({}, "first answer ****** second answer", "one answer"),
    "combination:repeat_prompt": ({"prompt_to_repeat": "Say hi."}, "Say hi. Hi!", "Hi! Say hi."),
    "startend:end_checker": ({"end_phrase": "Any other questions?"},
                             "Done. Any other questions?", "Any other questions? Done."),
    "change_case:english_capital": ({}, PASSAGE.upper(), PASSAGE),
    "change_case:english_lowercase": ({}, PASSAGE.lower(), PASSAGE),
    "punctuation:no_comma": ({}, "no commas here", "a, b"),
    "startend:quotation": ({}, '"wrapped"', "not wrapped"),
    # The two punkt checks (nltk's tokenizer, the model from checks.punkt).
    "length_constraints:number_sentences": ({"num_sentences": 3, "relation": "at least"},
                                            "Dr. Smith came. He sat. It rained.",
                                            "Dr. Smith came. He sat."),
    "change_case:capital_word_frequency": ({"capital_frequency": 2, "capital_relation": "at least"},
                                           "THIS IS loud", "This is QUIET"),
}


def test_table_is_the_registry():
    assert set(checks.CHECKS) == set(instructions_registry.INSTRUCTION_DICT)
    assert len(checks.CHECKS) == 25 and len(checks.SCORABLE_CHECKS) == 25
    assert checks.table.PUNKT_CHECKS == {"length_constraints:number_sentences",
                                         "change_case:capital_word_frequency"}
    for cid, spec in checks.CHECKS.items():
        cls = instructions_registry.INSTRUCTION_DICT[cid]
        assert spec.arg_names == tuple(cls(cid).get_instruction_args_keys()), cid
        accepted = list(inspect.signature(cls.build_description).parameters)[1:]
        assert set(accepted) == set(spec.arg_names), cid
    assert set(CASES) == set(checks.SCORABLE_CHECKS)  # every scorable check has a case


@pytest.mark.parametrize("check", sorted(CASES))
def test_strict_verdict_pass_and_fail(check):
    args, good, bad = CASES[check]
    assert checks.verdict(check, args, good) is True
    assert checks.verdict(check, args, bad) is False


def test_strict_and_loose_differ_where_built_to():
    # A markdown first line and a bold word: strict sees a comma-free body behind a header
    # with a comma, loose drops the first line.
    r = "Sure, here it is:\nno commas in this body"
    assert checks.verdict("punctuation:no_comma", {}, r) is False
    assert checks.verdict("punctuation:no_comma", {}, r, loose=True) is True
    r = 'Here is the answer:\n"quoted"'
    assert not checks.verdict("startend:quotation", {}, r)
    assert checks.verdict("startend:quotation", {}, r, loose=True)
    # An all-whitespace response fails both.
    assert not checks.verdict("punctuation:no_comma", {}, "  \n ", loose=True)


def test_render_is_the_library_sentence():
    assert checks.render("punctuation:no_comma", {}) == (
        "In your entire response, refrain from the use of any commas.")
    assert checks.render("length_constraints:number_words",
                         {"num_words": 300, "relation": "at least"}) == (
        "Answer with at least 300 words.")
    cls = instructions_registry.INSTRUCTION_DICT["keywords:existence"]
    want = cls("keywords:existence").build_description(keywords=["b", "a"])
    assert checks.render("keywords:existence", {"keywords": ["b", "a"]}) == want
    assert checks.render("length_constraints:number_sentences", {
        "num_sentences": 2, "relation": "at least"}) == (
        "Your response should contain at least 2 sentences.")


@pytest.mark.parametrize("check, args, field", [
    ("no:such", {}, "check"),
    ("punctuation:no_comma", [], "args"),
    ("punctuation:no_comma", {"x": 1}, "x"),
    ("length_constraints:number_words", {"num_words": 10}, "relation"),
    ("length_constraints:number_words", {"num_words": "10", "relation": "at least"}, "num_words"),
    ("length_constraints:number_words", {"num_words": True, "relation": "at least"}, "num_words"),
    ("length_constraints:number_words", {"num_words": -1, "relation": "at least"}, "num_words"),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at most"}, "relation"),
    ("keywords:existence", {"keywords": []}, "keywords"),
    ("keywords:existence", {"keywords": ["a("]}, "keywords"),
    ("keywords:letter_frequency", {"letter": "ab", "let_frequency": 1, "let_relation": "at least"},
     "letter"),
    ("language:response_language", {"language": "xx"}, "language"),
    ("length_constraints:nth_paragraph_first_word",
     {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"}, "nth_paragraph"),
])
def test_invalid_args_name_the_field(check, args, field):
    state = random.getstate()
    with pytest.raises(InvalidCheck) as e:
        checks.verdict(check, args, "text")
    assert e.value.field == field and repr(field) in str(e.value)
    assert random.getstate() == state  # the library never drew from global random


def test_punkt_model_is_the_packaged_parameters_in_nltk_format():
    from nltk.tokenize.punkt import load_punkt_params
    from punkt.data import english

    import nltk
    d = checks.punkt.ensure_punkt()
    params = load_punkt_params(nltk.data.FileSystemPathPointer(d))
    assert params.abbrev_types == set(english.ABBREV_TYPES)
    assert params.sent_starters == set(english.SENT_STARTERS)
    assert params.collocations == {tuple(c) for c in english.COLLOCATIONS}
    assert dict(params.ortho_context) == dict(english.ORTHO_CONTEXT)
    # Abbreviations of the model do not end a sentence.
    assert checks.verify.follows(checks.verify.scorable_checker(
        "length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"}),
        "Mr. Smith met Dr. Jones at 5 p.m. on Jan. 3.")


def test_not_scorable_checks_raise_and_are_never_drawn(monkeypatch):
    cid = "length_constraints:number_sentences"
    args = {"num_sentences": 2, "relation": "at least"}

    def missing():
        raise RuntimeError("no punkt")
    monkeypatch.setattr(checks.punkt, "ensure_punkt", missing)
    with pytest.raises(NotScorable, match="no punkt") as e:
        checks.verdict(cid, args, "A. B.")
    assert e.value.field == "check"
    monkeypatch.undo()
    spec = checks.CHECKS["punctuation:no_comma"]
    monkeypatch.setitem(checks.CHECKS, spec.check,
                        dataclasses.replace(spec, scorable=False, reason="test reason"))
    with pytest.raises(NotScorable, match="test reason"):
        checks.verdict(spec.check, {}, "a")
    with pytest.raises(NotScorable):
        checks.draw_args(spec.check, np.random.default_rng(0))
    assert checks.render(spec.check, {})  # still renders (traces show it)


def test_batched_verdicts_equal_the_loop():
    items = [(c, CASES[c][0]) for c in sorted(CASES)]
    responses = [r for c in sorted(CASES) for r in CASES[c][1:]] + ["Sure, a\nb", ""]
    for loose in (False, True):
        want = np.array([[checks.verdict(c, a, y, loose) for c, a in items] for y in responses],
                        np.float32)
        got = checks.verdicts(items, responses, loose=loose)
        assert got.dtype == np.float32 and got.shape == (len(responses), len(items))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(checks.verdicts(items, responses, loose, workers=1), want)
        np.testing.assert_array_equal(checks.verdicts(items, responses, loose, workers=2), want)
    assert checks.verdicts(items, [], False).shape == (0, len(items))
    with pytest.raises(InvalidCheck):
        checks.verdicts([("punctuation:no_comma", {"x": 1})], ["a"])
    checks.batch.shutdown()


def test_draw_args_is_seeded_and_valid_for_every_scorable_check():
    def draw(seed):
        rng = np.random.default_rng(seed)
        return [checks.draw_args(c, rng, prompt="Write a poem.") for c in checks.SCORABLE_CHECKS
                for _ in range(5)]
    state = random.getstate()
    a, b = draw(7), draw(7)
    assert a == b and a != draw(8)
    for i, c in enumerate(np.repeat(checks.SCORABLE_CHECKS, 5)):
        assert checks.validate(c, a[i]) == a[i]
        assert isinstance(checks.render(c, a[i]), str)
        assert checks.verdict(c, a[i], "Some response, with text.") in (True, False)
    assert random.getstate() == state
    with pytest.raises(InvalidCheck, match="prompt_to_repeat"):
        checks.draw_args("combination:repeat_prompt", np.random.default_rng(0))


def test_gold_score_is_the_fraction_of_true_checks_met():
    t = [{"check": "punctuation:no_comma", "args": {}},
         {"check": "keywords:existence", "args": {"keywords": ["river"]}},
         ("startend:quotation", {})]
    assert checks.gold_score(t, "by the river") == pytest.approx(2 / 3)
    assert checks.gold_score(t, '"by the river"') == 1.0
    assert checks.gold_score(t, "a, b") == 0.0
    assert checks.gold_score(t, 'Here:\n"by the river"') == pytest.approx(2 / 3)
    assert checks.gold_score(t, 'Here:\n"by the river"', loose=True) == 1.0
    assert np.isnan(checks.gold_score([], "anything"))
    with pytest.raises(InvalidCheck, match="keywords"):
        checks.gold_score([{"check": "keywords:existence", "args": {}}], "x")
    with pytest.raises(InvalidCheck):
        checks.gold_score([{"check": "punctuation:no_comma"}], "x")


def test_undetected_language_error_never_reaches_a_handler_where_the_checkers_run():
    """Importing the checkers (`checks.verify`) puts `UndetectedLanguage` on the root logger
    itself, so IFEval's undetected-language ERROR is dropped in any process, handler or
    not (a verdict worker has none of ours); the check's verdict is IFEval's (followed),
    and another ERROR through the root logger still passes."""
    import logging

    from drubric_jax.checks import verify

    root = logging.getLogger()
    assert sum(isinstance(f, verify.UndetectedLanguage) for f in root.filters) == 1
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    root.addHandler(handler)
    try:
        assert checks.verdict("language:response_language", {"language": "de"}, "123 456")
        logging.error("another error")
    finally:
        root.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["another error"]

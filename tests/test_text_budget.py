"""Tests for drubric_jax.text.budget: water-filling caps, `fit_to_budget`, `fit_prompt`."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drubric_jax.text.budget import TRUNCATION_MARKER, fit_prompt, fit_responses, fit_to_budget


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


def test_fit_responses_water_filling_numbers():
    assert fit_responses([100, 300, 50, 1000], 600) == [100, 225, 50, 225]
    assert fit_responses([10, 500, 500], 301) == [10, 146, 145]  # remainder to the first long one
    assert fit_responses([400, 400, 400, 400], 1000) == [250, 250, 250, 250]
    assert fit_responses([5, 6, 7], 100) == [5, 6, 7]  # fits: untouched
    assert fit_responses([5, 6, 7], 18) == [5, 6, 7]
    assert fit_responses([9, 9], 0) == [0, 0]
    assert fit_responses([], 10) == []
    for bad in (([1, -1], 5), ([1, 2], -1), ([1.5], 3)):
        with pytest.raises(ValueError):
            fit_responses(*bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 500), max_size=9), st.integers(0, 2000))
def test_fit_responses_properties(lengths, budget):
    caps = fit_responses(lengths, budget)
    assert len(caps) == len(lengths)
    assert all(0 <= c <= n for c, n in zip(caps, lengths))
    assert sum(caps) == min(budget, sum(lengths))
    # max-min fair: a truncated response is within one token of every other cap
    cut = [c for c, n in zip(caps, lengths) if c < n]
    if cut:
        assert max(caps) - min(cut) <= 1




def test_truncation_marker_text():
    assert TRUNCATION_MARKER == " [...truncated]"


def test_fit_to_budget_errors_when_template_too_long(tok):
    def build(texts):
        return tok.encode("fixed " * 50 + texts[0], add_special_tokens=False)

    with pytest.raises(ValueError, match="template alone"):
        fit_to_budget(tok, build, ["x " * 100], 40)
    ids, fitted, cut = fit_to_budget(tok, build, ["x " * 100], 90)
    assert len(ids) <= 90 and cut == [True]
    assert fitted[0].endswith(TRUNCATION_MARKER)


def _flat_render(tok):
    """render(prompt, history, responses) -> ids of a labelled plain transcript."""
    def render(prompt, history, responses):
        parts = [f"{h['role']}: {h['content']}" for h in history] + [f"request: {prompt}"]
        parts += [f"response {i}: {r}" for i, r in enumerate(responses)]
        return tok.encode("\n".join(parts), add_special_tokens=False)
    return render


HIST = [{"role": "user", "content": "earlier " * 80, "name": "kept"},
        {"role": "assistant", "content": "reply " * 5}]


@pytest.mark.parametrize("prompt_last", [False, True])
def test_fit_prompt_equals_fit_to_budget_on_the_flat_texts(tok, prompt_last):
    render = _flat_render(tok)
    prompt, responses = "question " * 60, ["short", "long answer " * 90, "mid " * 40]
    contents = [h["content"] for h in HIST]
    head = contents + [prompt] if prompt_last else [prompt] + contents

    def build(texts):
        p = texts[len(HIST)] if prompt_last else texts[0]
        c = texts[:len(HIST)] if prompt_last else texts[1:1 + len(HIST)]
        hist = [dict(h, content=x) for h, x in zip(HIST, c)]
        return render(p, hist, texts[1 + len(HIST):])

    for budget in (120, 157, 301, 10_000):
        ids, fitted, cut = fit_to_budget(tok, build, head + responses, budget)
        fit = fit_prompt(tok, render, prompt, HIST, responses, max_tokens=budget,
                         prompt_last=prompt_last)
        assert fit.ids == ids and len(fit.ids) <= budget
        n = len(HIST)
        want_p, want_c = (fitted[n], fitted[:n]) if prompt_last else (fitted[0], fitted[1:1 + n])
        want_pc, want_hc = (cut[n], cut[:n]) if prompt_last else (cut[0], cut[1:1 + n])
        assert fit.prompt == want_p and fit.prompt_cut == want_pc
        assert [h["content"] for h in fit.history] == want_c and fit.history_cut == want_hc
        assert fit.responses == fitted[1 + n:] and fit.response_cut == cut[1 + n:]
        assert fit.history[0]["name"] == "kept" and HIST[0]["content"] == "earlier " * 80
        assert fit.any_cut == any(cut) == (budget < 10_000)


def test_fit_prompt_without_history_or_responses(tok):
    render = _flat_render(tok)
    fit = fit_prompt(tok, render, "word " * 200, max_tokens=50)
    assert fit.prompt_cut and fit.prompt.endswith(TRUNCATION_MARKER) and len(fit.ids) <= 50
    assert fit.history == [] and fit.responses == [] and fit.history_cut == []
    with pytest.raises(ValueError, match="template alone"):
        fit_prompt(tok, render, "word " * 200, None, ["a"] * 40, max_tokens=60)


@pytest.mark.parametrize("prompt_last", [False, True])
def test_keep_prompt_never_cuts_the_request(tok, prompt_last):
    """keep_prompt (the checks world's generator, world v2): a request longer than the
    water-filling share stays whole; the history and responses share what it leaves, and
    the whole input still fits."""
    render = _flat_render(tok)
    prompt, responses = "question " * 60, ["long answer " * 90, "mid " * 40]
    cut = fit_prompt(tok, render, prompt, HIST, responses, max_tokens=157,
                     prompt_last=prompt_last)
    assert cut.prompt_cut  # without keep_prompt the request is cut like a response
    fit = fit_prompt(tok, render, prompt, HIST, responses, max_tokens=157,
                     prompt_last=prompt_last, keep_prompt=True)
    assert not fit.prompt_cut and fit.prompt == prompt and len(fit.ids) <= 157
    assert all(fit.response_cut) and fit.history_cut[0]
    assert fit.responses[0].endswith(TRUNCATION_MARKER)
    # Nothing left for the other texts once the request is whole: an error, not a cut.
    with pytest.raises(ValueError, match="never cut"):
        fit_prompt(tok, render, "question " * 200, HIST, responses, max_tokens=157,
                   prompt_last=prompt_last, keep_prompt=True)

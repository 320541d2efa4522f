"""Tests for drubric_jax.data.filters: the Appendix B heuristics (METHOD 9)."""

from drubric_jax import data as dd
from drubric_jax.data import AnchorFilterConfig


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


def test_filter_configs_give_the_drop_reason_functions():
    prompt = "Please explain in detail how the water cycle works for a school project."
    good = [f"The water cycle moves water between the oceans, the air and the land. Variant {i}."
            for i in range(7)]
    for responses in (good, good[:3], ["I can't help."] + good, ["tiny"] + good):
        assert (AnchorFilterConfig().drop_reason(prompt, responses)
                == dd.anchor_drop_reason(prompt, responses))
        assert (dd.PolicyFilterConfig().drop_reason(prompt, responses)
                == dd.policy_prompt_drop_reason(prompt, responses))
    assert dd.PolicyFilterConfig(2, 5, 0).drop_reason("Short one?", ["ok", "no"]) is None
    assert dd.PolicyFilterConfig(2, 0, 10).drop_reason("Short one?", ["ok", "no"]) == (
        "short_top_response")

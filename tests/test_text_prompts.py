"""Tests for drubric_jax.text.prompts: generator, verifier and judge prompt builders."""

import pytest

from drubric_jax.text import prompts as pr


HISTORY = [{"role": "user", "content": "Earlier question"},
           {"role": "assistant", "content": "Earlier answer"}]


def test_generator_messages_dynamic_order_and_labels():
    msgs = pr.generator_messages("What is 2+2?", ["four", "five", "4"], history=HISTORY,
                                 order=[2, 0, 1], max_items=7)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == pr.GENERATOR_SYSTEM_DYNAMIC + "\nWrite at most 7 criteria."
    u = msgs[1]["content"]
    assert "What is 2+2?" in u and "Earlier question" in u and "Earlier answer" in u
    i1, i2, i3 = (u.index(f"[Response {k}]") for k in (1, 2, 3))
    assert i1 < i2 < i3
    assert u[i1:i2].split("\n")[1] == "4"       # order[0] = 2
    assert u[i2:i3].split("\n")[1] == "four"    # order[1] = 0
    assert u[i3:].split("\n")[1] == "five"      # order[2] = 1
    assert '"rubrics"' in msgs[0]["content"]
    with pytest.raises(ValueError):
        pr.generator_messages("q", ["a", "b"], order=[0, 0])
    with pytest.raises(ValueError):
        pr.generator_messages("q", ["a", "b"], order=[0, 1, 2])


def test_generator_messages_static_variant():
    for responses in (None, []):
        msgs = pr.generator_messages("Write a haiku about rain.", responses)
        assert msgs[0]["content"] == pr.GENERATOR_SYSTEM_STATIC
        assert "[Response 1]" not in msgs[1]["content"]
        assert "Write a haiku about rain." in msgs[1]["content"]
    assert pr.GENERATOR_SYSTEM_STATIC != pr.GENERATOR_SYSTEM_DYNAMIC


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chatml(messages):
    import jinja2

    return jinja2.Template(CHATML).render(messages=messages, add_generation_prompt=True)


@pytest.mark.parametrize("render", [pr.plain_render, _chatml])
def test_verifier_prefix_suffix_layout(render):
    prefix_msgs = pr.verifier_prefix_messages("Name a prime.", "7 is prime.", history=HISTORY)
    assert prefix_msgs[0] == {"role": "system", "content": pr.VERIFIER_SYSTEM}
    content = prefix_msgs[1]["content"]
    assert content.endswith("[Response]\n7 is prime.\n[End of Response]")
    assert content.index("Earlier question") < content.index("Name a prime.")
    items = ["Names a prime number", "Explains why it is prime"]
    suffix_text = pr.verifier_item_suffix(items[0])
    assert suffix_text.startswith("\n\n") and suffix_text.endswith("Answer Yes or No.")
    prefix, suffixes = pr.render_verifier_prompts(render, prefix_msgs, items)
    for item, suf in zip(items, suffixes):
        full = render([prefix_msgs[0], {"role": "user", "content": content + pr.verifier_item_suffix(item)}])
        assert prefix + suf == full
        assert suf.startswith("\n\nCriterion: " + item)
        # the rendered prompt ends where the answer token goes
        assert full.endswith("Assistant:" if render is pr.plain_render else "<|im_start|>assistant\n")
    assert prefix.endswith("[End of Response]")


def test_verifier_split_rejects_unstable_renderer():
    calls = []

    def unstable(msgs):
        calls.append(1)
        return str(len(calls)) + msgs[-1]["content"]

    with pytest.raises(ValueError):
        pr.render_verifier_prompts(unstable, pr.verifier_prefix_messages("q", "r"), ["a"])


def test_direct_and_pairwise_judge_messages():
    d = pr.direct_judge_messages("Q?", "resp", history=HISTORY)
    assert d[0]["content"] == pr.DIRECT_JUDGE_SYSTEM
    assert "[Response to judge]\nresp\n" in d[1]["content"]
    assert d[1]["content"].endswith("Answer Yes or No.")
    assert "[Response 1]" not in d[1]["content"]
    d2 = pr.direct_judge_messages("Q?", "resp", response_set=["resp", "other"])
    assert "[Response 1]\nresp\n" in d2[1]["content"] and "[Response 2]\nother\n" in d2[1]["content"]
    p = pr.pairwise_judge_messages("Q?", "alpha", "beta")
    u = p[1]["content"]
    assert u.index("[Response A]\nalpha") < u.index("[Response B]\nbeta")
    assert "Is Response A better than Response B" in u and u.endswith("Answer Yes or No.")

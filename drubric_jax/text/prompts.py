"""Prompt texts and chat-message builders of the generator, verifier and judges (METHOD 1, 6, 8).

Pure Python; nothing here touches a model or a tokenizer. The wording is this project's own
and follows the principles listed in METHOD section 8; tests pin it, so edit it only on
purpose (every change alters the prompts the models see).

- Generator G_phi(x, C): `generator_messages` (dynamic, with the K responses of C shown as
  "Response 1".."Response K" in a given order; static / RaR-style without them).
- Verifier: `verifier_prefix_messages` (shared prefix per (x, y)) + `verifier_item_suffix`
  (one per criterion r_m); `render_verifier_prompts` splits any rendered chat into that
  prefix and the M suffixes; `plain_render` is the template-free renderer.
- Judge baselines (METHOD 6): `direct_judge_messages` (pointwise) and
  `pairwise_judge_messages`.

Every builder returns [{"role": "system", ...}, {"role": "user", ...}]; the answer (the
rubric JSON, or the Yes / No token) opens the assistant turn.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from drubric_jax.text.rubric_format import CRITERION_PLACEHOLDER, WEIGHT_PLACEHOLDER

# METHOD 8's principles in our own words, one bullet each; tests pin the wording.
_GUIDELINES = """Guidelines for the criteria:
- Judge how well a response serves what the user actually asked for.
- Do not build in facts, figures or answers that the user did not supply. Every criterion must be checkable by reading the request and a response.
- If the user set any requirement on format, length, style, language or structure, turn each such requirement into its own strict criterion.
- One property per criterion: split anything of the form "X and Y" into two criteria. Each criterion must have a clear yes or no answer.
- Be concrete enough that two careful graders working independently would give the same answer.
- Put substance first (correctness, completeness, sound reasoning, real usefulness). Add criteria about presentation or formatting only if the user asked for them.
- Word each criterion so that "yes" means better. Avoid negations and double negatives.
- Keep criteria distinct from each other and understandable on their own.
- Weight each criterion with an integer: 5 = essential (failing it makes a response unacceptable), 3 or 4 = important, 1 or 2 = nice to have."""

# The format line; the parser drops items that only echo its placeholders.
_OUTPUT_SPEC = ('Reply with a JSON object and nothing else, in this form:\n'
                f'{{"rubrics": [{{"rubric": "{CRITERION_PLACEHOLDER}", '
                f'"weight": {WEIGHT_PLACEHOLDER}}}, ...]}}')

GENERATOR_SYSTEM_DYNAMIC = (
    "You write grading checklists for answers to user requests. You will see a "
    "user's request and a pool of candidate responses to it. Write yes/no "
    "criteria that a grader can apply to any single response and that separate "
    "the stronger responses from the weaker ones.\n\n"
    "Use the candidate pool only to notice which qualities matter for this request "
    "and where the candidates differ; do not grade the candidates yourself. Never "
    "refer to a particular candidate: no response numbers and no quotes taken from "
    "a candidate.\n\n" + _GUIDELINES + "\n\n" + _OUTPUT_SPEC)
"""System text of the dynamic generator G_phi(x, C) (METHOD 1, 8)."""

GENERATOR_SYSTEM_STATIC = (
    "You write grading checklists for answers to user requests. You will see only "
    "a user's request, with no responses. Write yes/no criteria that a grader can "
    "apply to any single response to this request to judge how good it is.\n\n"
    + _GUIDELINES + "\n\n" + _OUTPUT_SPEC)
"""System text of the static (prompt-only, RaR-style) generator baseline (METHOD 6)."""

# "Partly meets -> No" keeps the verdicts strictly binary (METHOD 8).
VERIFIER_SYSTEM = (
    "You check one criterion against one response. Read the user's request and the "
    "response, then decide whether the response meets the criterion. Judge the "
    "response exactly as written, strictly and literally; if it only partly meets "
    "the criterion, the answer is No. Reply with one word: Yes or No.")
"""System text of the frozen verifier (METHOD 1, 11)."""

DIRECT_JUDGE_SYSTEM = (
    "You assess responses to user requests. Decide whether the response is of high "
    "quality: correct, genuinely helpful, complete, and following every instruction "
    "in the request. Reply with one word: Yes or No.")
"""System text of the pointwise yes/no judge baseline (METHOD 6)."""

PAIRWISE_JUDGE_SYSTEM = (
    "You compare two responses to the same user request. Decide whether Response A "
    "serves the user better than Response B: correctness and following the request "
    "come first, then helpfulness and completeness. Ignore the order in which the "
    "responses are shown and their length as such. Reply with one word: Yes or No.")
"""System text of the pairwise yes/no judge baseline (METHOD 6)."""

# Speaker labels of history transcripts and of `plain_render`.
_ROLE_LABEL = {"user": "User", "assistant": "Assistant", "system": "System"}


def _history_block(history: Optional[Sequence[dict]]) -> str:
    """Earlier turns as a labelled transcript block ("" when there are none)."""
    if not history:
        return ""
    lines = []
    for turn in history:
        role = _ROLE_LABEL.get(turn.get("role"), str(turn.get("role")))
        lines.append(f"{role}: {turn.get('content', '')}")
    return "[Earlier conversation]\n" + "\n\n".join(lines) + "\n[End of earlier conversation]\n\n"


def _request_block(prompt: str, history: Optional[Sequence[dict]]) -> str:
    """History (if any) + the user's request, delimited."""
    return _history_block(history) + f"[User request]\n{prompt}\n[End of user request]"


def _labelled(label: str, text: str) -> str:
    return f"[{label}]\n{text}\n[End of {label}]"


def _check_order(order: Optional[Sequence[int]], k: int) -> list:
    # The generator must see each response exactly once.
    if order is None:
        return list(range(k))
    order = [int(i) for i in order]
    if sorted(order) != list(range(k)):
        raise ValueError(f"order must be a permutation of range({k}), got {order}")
    return order


def generator_messages(prompt: str, responses: Optional[Sequence[str]],
                       history: Optional[Sequence[dict]] = None,
                       order: Optional[Sequence[int]] = None,
                       max_items: Optional[int] = None) -> list:
    """Chat messages for the rubric generator (METHOD 1, 8; static baseline METHOD 6).

    Layout: [system: instructions + output format] [user: earlier conversation
    (if any), the user request, the candidate responses labelled "Response 1" ..
    "Response K", a closing request]. Position p (0-based) shows
    `responses[order[p]]` as "Response p+1", so a shuffled `order` hides the
    sampling order from the generator.

    With `responses` None or empty, the STATIC (prompt-only, RaR-style) variant is
    built: its own system text, no response pool.

    Args:
      prompt: str, the last user turn x.
      responses: K strings (the set C) or None / [] for the static variant.
      history: earlier turns [{"role": "user"|"assistant", "content": str}] or None.
      order: a permutation of range(K), or None for the given order.
      max_items: if given, the instructions ask for at most this many criteria.

    Returns:
      list[dict]: [{"role": "system", ...}, {"role": "user", ...}].

    Raises:
      ValueError: `order` is not a permutation of range(K).
    """
    static = not responses
    system = GENERATOR_SYSTEM_STATIC if static else GENERATOR_SYSTEM_DYNAMIC
    if max_items is not None:
        # The schema's maxItems in words too, so the model can plan within it.
        system += f"\nWrite at most {int(max_items)} criteria."
    return [{"role": "system", "content": system},
            {"role": "user", "content": generator_request(prompt, responses, history, order,
                                                          "the grading criteria")}]


def generator_request(prompt: str, responses: Optional[Sequence[str]],
                      history: Optional[list], order: Optional[Sequence[int]],
                      what: str) -> str:
    """The generator's user turn: the earlier conversation and the request, then (dynamic)
    the candidate responses labelled in presentation order, then "Write `what` ... as JSON"
    (the free-text and the checks generator share it).

    Raises:
      ValueError: `order` is not a permutation of range(K).
    """
    parts = [_request_block(prompt, history)]
    if not responses:
        parts.append(f"Write {what} for responses to this request as JSON.")
    else:
        idx = _check_order(order, len(responses))
        parts.append(f"Candidate responses ({len(idx)}):")
        # Labels follow the presentation order: "Response p+1" is responses[order[p]].
        for p, i in enumerate(idx):
            parts.append(_labelled(f"Response {p + 1}", responses[i]))
        parts.append(f"Write {what} as JSON.")
    return "\n\n".join(parts)


def verifier_prefix_messages(prompt: str, response: str,
                             history: Optional[Sequence[dict]] = None) -> list:
    """Shared-prefix messages of the verifier prompt for one (x, y) pair (METHOD 1, 11).

    Exact layout. The full verifier conversation for item m is

        [{"role": "system", "content": VERIFIER_SYSTEM},
         {"role": "user",   "content": PREFIX_CONTENT + verifier_item_suffix(r_m)}]

    rendered with the chat template and `add_generation_prompt=True`, where
    PREFIX_CONTENT (the user content returned here) is

        [Earlier conversation] ... [End of earlier conversation]   (only with history)
        [User request]\\n<x>\\n[End of user request]\\n\\n[Response]\\n<y>\\n[End of Response]

    and `verifier_item_suffix(r_m)` is

        \\n\\nCriterion: <r_m>\\n\\nDoes the response meet this criterion? Answer Yes or No.

    The answer is the FIRST token the model generates after the rendered text,
    i.e. the first token of the assistant turn ("Yes" / "No"; with
    `plain_render`, " Yes" / " No" after "Assistant:"). P(yes) sums every yes
    variant against every no variant (METHOD 11).

    Prefix caching: everything up to the end of PREFIX_CONTENT is identical for
    all items of one (x, y); the per-item part starts with "\\n\\n" right after
    the "]" that closes the response block. Byte-level BPE pre-tokenizers always
    split between "]" and "\\n", so tokenizing prefix and suffix separately gives
    the same tokens as tokenizing the whole. `render_verifier_prompts` does the
    split for any renderer (it renders and cuts; it never assumes a template).

    Args:
      prompt: str, user request x (last user turn).
      response: str, the response y being checked.
      history: earlier turns or None.

    Returns:
      list[dict]: [system, user(PREFIX_CONTENT)].
    """
    # Ends with "]"; the item suffix starts with "\n\n", a pre-tokenizer boundary (above).
    content = _request_block(prompt, history) + "\n\n" + _labelled("Response", response)
    return [{"role": "system", "content": VERIFIER_SYSTEM},
            {"role": "user", "content": content}]


def verifier_item_suffix(item_text: str) -> str:
    """Per-item text appended to the verifier's user content (see
    `verifier_prefix_messages` for the full layout).

    Args:
      item_text: str, the criterion r_m.

    Returns:
      str: "\\n\\nCriterion: <r_m>\\n\\nDoes the response meet this criterion?
      Answer Yes or No." (the user turn ends here; the answer opens the
      assistant turn).
    """
    return (f"\n\nCriterion: {item_text.strip()}\n\n"
            "Does the response meet this criterion? Answer Yes or No.")


_SPLIT_SENTINEL = "\ue000"  # private-use character, absent from real text


def render_verifier_prompts(render: Callable[[list], str], prefix_messages: list,
                            item_texts: Sequence[str]):
    """Splits rendered verifier prompts into one shared prefix + per-item suffixes.

    `render(messages) -> str` is the chat renderer, e.g.
    `lambda m: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)`
    or `plain_render`. Each full prompt is `render(prefix_messages with
    verifier_item_suffix(item) appended to the last user content)`; the shared
    prefix is the rendered text up to where the suffix begins (found by
    rendering once with a sentinel character), so the prefix can be prefilled
    once and each suffix scored after it. The model's answer token follows
    each `prefix + suffix` directly.

    Args:
      render: callable list[dict] -> str (must open the assistant turn).
      prefix_messages: from `verifier_prefix_messages`.
      item_texts: M criteria.

    Returns:
      (prefix: str, suffixes: list[str]) with `prefix + suffixes[m]` equal to the
      full rendering for item m.

    Raises:
      ValueError: the renderer changes text before the suffix depending on the
        item (the template is not prefix-stable) or drops the sentinel.
    """
    def with_suffix(s):
        msgs = [dict(m) for m in prefix_messages]
        msgs[-1]["content"] = msgs[-1]["content"] + s
        return msgs

    # Rendered once with a sentinel suffix: all before it is the shared prefix, whatever the
    # template adds around the user content.
    probe = render(with_suffix(_SPLIT_SENTINEL))
    cut = probe.find(_SPLIT_SENTINEL)
    if cut < 0:
        raise ValueError("renderer dropped the split sentinel; cannot find the shared prefix")
    prefix = probe[:cut]
    suffixes = []
    for item in item_texts:
        full = render(with_suffix(verifier_item_suffix(item)))
        # A template that rewrites earlier text per item cannot share a prefix.
        if not full.startswith(prefix):
            raise ValueError("rendered verifier prompt does not start with the shared prefix")
        suffixes.append(full[len(prefix):])
    return prefix, suffixes


def plain_render(messages: Sequence[dict]) -> str:
    """Template-free renderer for base models and tests.

    "System: ...\\n\\nUser: ...\\n\\nAssistant:" -- the answer follows "Assistant:"
    (so the yes/no token carries a leading space, " Yes" / " No").

    Args:
      messages: [{"role", "content"}, ...].

    Returns:
      str.
    """
    parts = [f"{_ROLE_LABEL.get(m['role'], m['role'])}: {m['content']}" for m in messages]
    return "\n\n".join(parts) + "\n\nAssistant:"


def direct_judge_messages(prompt: str, response: str,
                          history: Optional[Sequence[dict]] = None,
                          response_set: Optional[Sequence[str]] = None) -> list:
    """Pointwise yes/no judge messages ("is this a high-quality response?"; METHOD 6).

    Layout: [system: DIRECT_JUDGE_SYSTEM] [user: earlier conversation (if any),
    request, optionally all candidate responses labelled "Response 1..K" as
    context (the "w/ responses" variant), then "[Response to judge]" and the
    question ending in "Answer Yes or No."]. The answer is the first assistant
    token, as for the verifier.

    Args:
      prompt: str, user request.
      response: str, the response judged.
      history: earlier turns or None.
      response_set: the whole response set (may include `response`) or None.

    Returns:
      list[dict]: [system, user].
    """
    parts = [_request_block(prompt, history)]
    # The "w/ responses" baseline (METHOD 6): the whole set as context.
    if response_set:
        parts.append(f"For context, all candidate responses to this request "
                     f"({len(response_set)}):")
        parts.extend(_labelled(f"Response {i + 1}", r) for i, r in enumerate(response_set))
    parts.append(_labelled("Response to judge", response))
    parts.append("Is the response to judge a high-quality response to the user's request? "
                 "Answer Yes or No.")
    return [{"role": "system", "content": DIRECT_JUDGE_SYSTEM},
            {"role": "user", "content": "\n\n".join(parts)}]


def pairwise_judge_messages(prompt: str, a: str, b: str,
                            history: Optional[Sequence[dict]] = None) -> list:
    """Pairwise yes/no judge messages ("is Response A better than Response B?"; METHOD 6).

    Layout: [system: PAIRWISE_JUDGE_SYSTEM] [user: earlier conversation (if any),
    request, "[Response A]", "[Response B]", question ending in "Answer Yes or
    No."]. The answer is the first assistant token. Callers should also ask
    with A and B swapped to cancel position bias.

    Args:
      prompt: str, user request.
      a, b: str, the two responses.
      history: earlier turns or None.

    Returns:
      list[dict]: [system, user].
    """
    parts = [_request_block(prompt, history), _labelled("Response A", a),
             _labelled("Response B", b),
             "Is Response A better than Response B as a reply to the user's request? "
             "Answer Yes or No."]
    return [{"role": "system", "content": PAIRWISE_JUDGE_SYSTEM},
            {"role": "user", "content": "\n\n".join(parts)}]

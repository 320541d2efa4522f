"""No constraint is ever cut from what a role sees (world v2 of METHOD 13; issue 40).

A checks-world prompt ends in its constraint sentences. The policy's chat prompt is cut to
`policy.max_prompt_tokens` keeping its first tokens, and the generator's input is cut by
water-filling over the prompt and its K responses (`text.budget.fit_prompt`); either cut can
drop a constraint, so the policy is graded on a constraint it never saw (world v1 lost one
in 58 of 256 training prompts). Here a prompt row is checked against both budgets:

- policy: the chat-rendered prompt (`rounds.phases.policy_prompt_ids`'s rendering, no
  history) has at most `policy_budget` tokens;
- generator: with K responses of `response_tokens` tokens each (the longest the policy can
  write), `text.budget.fit_responses` leaves the prompt whole, i.e. its cap equals its
  length, after the template's fixed tokens and one truncation marker per text.

Host-side Python; the tokenizer is a Hugging Face tokenizer (`text.tokenizer`).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.text.budget import TRUNCATION_MARKER, fit_responses


def policy_prompt_tokens(tokenizer, prompt: str, history: Sequence[dict] = ()) -> int:
    """Tokens of the policy's chat prompt (history + request, assistant turn opened)."""
    return len(tok_lib.chat_ids(tokenizer, list(history) + [{"role": "user",
                                                               "content": prompt}]))


def generator_keeps_prompt(tokenizer, prompt: str, *, k: int, response_tokens: int,
                           budget: int, render: Callable[[str, list], list],
                           keep_prompt: bool = False,
                           min_response_tokens: int = 16) -> tuple:
    """Whether the generator's input keeps `prompt` whole next to K responses of
    `response_tokens` tokens within `budget` tokens.

    Without keep_prompt the request is cut like a response (`fit_prompt`'s water-filling),
    so it survives only when its length is within the common cap. With keep_prompt
    (`generator.keep_prompt`) it is never cut, and the row fits when the responses keep
    at least `min_response_tokens` tokens each beside it (what a generator needs to tell
    them apart).

    Args:
        render: (prompt, responses) -> token ids of the generator's whole input.

    Returns:
        (kept: bool, needed: int), needed = the input's tokens with the prompt whole and the
        responses at full length (before any cut).
    """
    p = len(tokenizer.encode(prompt, add_special_tokens=False))
    overhead = len(render("", [""] * k))
    needed = overhead + p + k * response_tokens
    if needed <= budget:
        return True, needed
    marker = len(tokenizer.encode(TRUNCATION_MARKER, add_special_tokens=False))
    if keep_prompt:
        room = budget - overhead - p - marker * k
        return room >= k * min(min_response_tokens, response_tokens), needed
    room = budget - overhead - marker * (k + 1)
    if room <= 0:
        return False, needed
    return fit_responses([p] + [response_tokens] * k, room)[0] == p, needed


def check_rows_fit(rows, tokenizer, *, policy_budget: int,
                   generator: Optional[dict] = None, where: str = "") -> dict:
    """Raises on the first row whose constraints a role would not see.

    Args:
        rows: prompt rows with `prompt`, `id`, optional `history` and `line`, as
            attributes (`data.Record` / `PromptItem`) or keys (a JSON row).
        tokenizer: the policy's (and generator's) tokenizer.
        policy_budget: `config.policy.max_prompt_tokens`.
        generator: None (no generator reads these prompts), or {"k", "response_tokens",
            "budget", "render"} as `generator_keeps_prompt` takes them.
        where: the file (or config field) named in the error.

    Returns:
        {"rows", "policy_max_tokens", "generator_max_tokens"} (the largest inputs seen).

    Raises:
        ValueError: "<where>:<line>: row '<id>': field 'prompt' ..." naming the role, its
            budget and the prompt's tokens.
    """
    pmax = gmax = 0
    for i, r in enumerate(rows):
        # A row object (`data.Record`, `PromptItem`) or a JSON row dict.
        get = r.get if isinstance(r, dict) else (lambda k, d=None, r=r: getattr(r, k, d))
        at = f"{where}:{get('line') or i + 1}: row {get('id')!r}: field 'prompt'"
        prompt, hist = get("prompt"), list(get("history") or ())
        n = policy_prompt_tokens(tokenizer, prompt, hist)
        pmax = max(pmax, n)
        if n > policy_budget:
            raise ValueError(f"{at}: the policy's chat prompt has {n} tokens, over "
                             f"config.policy.max_prompt_tokens={policy_budget}; the cut would "
                             "drop its constraints (shorten the prompt or raise the budget)")
        if generator is not None:
            kept, need = generator_keeps_prompt(tokenizer, prompt, **generator)
            gmax = max(gmax, need)
            if not kept:
                raise ValueError(
                    f"{at}: the generator's input ({need} tokens with {generator['k']} "
                    f"responses of {generator['response_tokens']} tokens) is over "
                    f"config.generator.input_budget={generator['budget']} and the cut "
                    "would drop the prompt's constraints")
    return {"rows": len(rows), "policy_max_tokens": pmax, "generator_max_tokens": gmax}


def generator_render(tokenizer, check_lines: str, max_items: int) -> Callable:
    """(prompt, responses) -> the checks generator's input ids (chat template), as
    `evaluator.check_rubrics.messages` renders it with the given list of checks."""
    from drubric_jax.text.check_prompts import checks_generator_messages

    def render(prompt, responses):
        return tok_lib.chat_ids(tokenizer, checks_generator_messages(
            prompt, responses, None, None, max_items, check_lines=check_lines))
    return render


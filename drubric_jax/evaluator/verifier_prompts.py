"""The verifier's text side: its queries normalised, its prompts rendered, fitted to their
token budgets and tokenised into one shared prefix per response and one suffix per rubric
item (METHOD 11).

`verifier.Verifier` holds a `VerifierText`; nothing here touches a device, so under several
processes each process runs it for its own rows only.

Axis legend (drubric_jax/types.py): R (prompt, response) pairs, M rubric items.
"""
from __future__ import annotations

from typing import Optional, Sequence

from drubric_jax.evaluator.counters import add_count
from drubric_jax.text.budget import fit_prompt, fit_to_budget
from drubric_jax.text.prompts import (plain_render, render_verifier_prompts,
                                      verifier_prefix_messages)

_SUFFIX_CACHE_SIZE = 20000  # tokenised item suffixes kept (cleared when exceeded)


class VerifierText:
    """Prompt rendering, budget fitting and tokenisation of verifier queries.

    Args:
        tokenizer: the verifier's tokenizer; the chat template renders the prompt (a
            tokenizer without one uses `text.prompts.plain_render`).
        max_prefix_tokens: budget of [instructions + request (+ history) + response].
        max_suffix_tokens: budget of one item suffix.

    Raises:
        ValueError: a budget < 16 tokens.
    """

    def __init__(self, tokenizer, max_prefix_tokens: int = 2048, max_suffix_tokens: int = 128):
        if max_prefix_tokens < 16 or max_suffix_tokens < 16:
            raise ValueError(f"max_prefix_tokens ({max_prefix_tokens}) and max_suffix_tokens "
                             f"({max_suffix_tokens}) must be >= 16")
        self.tokenizer = tokenizer
        self.max_prefix_tokens = int(max_prefix_tokens)
        self.max_suffix_tokens = int(max_suffix_tokens)
        self._suffix_cache: dict = {}

    def render(self, messages: Sequence[dict]) -> str:
        """Chat-template text of `messages` with the assistant turn opened."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                      add_generation_prompt=True)
        return plain_render(messages)

    def _encode(self, text: str) -> list:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _fit_pair(self, prompt: str, response: str, history, stats: dict) -> tuple:
        """(prompt, response, history) cut so the rendered prefix fits max_prefix_tokens."""
        # Measured on the whole rendered prefix, so the template's own tokens count too.
        def render(p, hist, responses):
            msgs = verifier_prefix_messages(p, responses[0], hist)
            prefix, _ = render_verifier_prompts(self.render, msgs, [])
            return self._encode(prefix)

        fit = fit_prompt(self.tokenizer, render, prompt, history, [response],
                         max_tokens=self.max_prefix_tokens)
        add_count(stats, "prefix_cut", int(fit.any_cut))
        return fit.prompt, fit.responses[0], fit.history

    def _fit_item(self, item: str, stats: dict) -> str:
        """Item text cut so its suffix fits max_suffix_tokens (suffix measured on a stub)."""
        # A suffix's tokens do not depend on the prefix, so a stub prefix measures it.
        msgs = verifier_prefix_messages("x", "y")

        def build(texts):
            _, suffixes = render_verifier_prompts(self.render, msgs, texts)
            return self._encode(suffixes[0])

        _, fitted, cut = fit_to_budget(self.tokenizer, build, [item], self.max_suffix_tokens)
        add_count(stats, "item_cut", int(cut[0]))
        return fitted[0]

    def prepare(self, prompt: str, response: str, items: Sequence[str],
                history: Optional[Sequence[dict]] = None,
                stats: Optional[dict] = None) -> tuple[list, list]:
        """Token ids of one response's shared prefix and of each item suffix.

        `prefix_ids + suffix_ids[m]` tokenises to the same ids as the full verifier prompt
        for item m (`render_verifier_prompts` splits at a pre-tokenizer
        boundary). Empty item strings give empty suffixes (padding).

        Returns:
            (prefix_ids list[int], suffix_ids list[list[int]]).
        """
        prompt, response, history = self._fit_pair(prompt, response, history, stats)
        msgs = verifier_prefix_messages(prompt, response, history)
        # Blank items are padding and are not rendered.
        real = [self._fit_item(it, stats) for it in items if it.strip()]
        prefix, suffixes = render_verifier_prompts(self.render, msgs, real)
        # Suffixes come back for the real items only, in order; blanks get [] below.
        it = iter(suffixes)
        out = []
        for item in items:
            if not item.strip():
                out.append([])
                continue
            s = next(it)
            if len(self._suffix_cache) > _SUFFIX_CACHE_SIZE:
                self._suffix_cache.clear()
            if s not in self._suffix_cache:
                # An item recurs for every response it judges: its suffix is tokenised once.
                self._suffix_cache[s] = self._encode(s)
            out.append(self._suffix_cache[s])
        return self._encode(prefix), out


def normalise_queries(prompts, responses: Sequence[str], items, histories):
    """The verifier's queries as R rows: (prompts, histories, item lists), one of each per
    response.

    Args:
        prompts: one user request for all responses, or R of them.
        responses: R response strings.
        items: M criteria shared by all responses, or R lists of them.
        histories: None, one history list for all, or R history lists.

    Returns:
        (prompts list[str], histories list[list[dict]], items list[list[str]]), R each.

    Raises:
        ValueError: mismatched lengths, or an item that is not a string.
    """
    r = len(responses)
    if isinstance(prompts, str):
        prompts = [prompts] * r
    if len(prompts) != r:
        raise ValueError(f"{len(prompts)} prompts for {r} responses")
    # One history (a list of turn dicts) shared by every response.
    if histories is None or (len(histories) and isinstance(histories[0], dict)):
        histories = [histories or []] * r
    if len(histories) != r:
        raise ValueError(f"{len(histories)} histories for {r} responses")
    # One item list shared by every response.
    if len(items) == 0 or isinstance(items[0], str):
        items = [list(items)] * r
    elif len(items) != r:
        raise ValueError(f"{len(items)} item lists for {r} responses")
    for lst in items:
        if any(not isinstance(s, str) for s in lst):
            raise ValueError("items must be strings")
    return list(prompts), list(histories), [list(x) for x in items]

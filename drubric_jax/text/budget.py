"""Token budgets of model inputs: cut the variable texts of a prompt to fit (METHOD 4).

Pure Python; the tokenizer and the renderer are passed in. No paper equation: the paper
states only the input budgets (e.g. 24K generator input tokens); how texts are cut to meet
them is this project's rule:

- `fit_responses`: equal-share (water-filling) caps for n texts in a token budget.
- `fit_to_budget`: renders a prompt from its n variable texts and, when it is too long,
  cuts the texts to their caps, each cut text ending in the visible `TRUNCATION_MARKER`.
- `fit_prompt`: `fit_to_budget` for the usual layout of a request x, earlier turns and K
  responses; callers give a `render(prompt, history, responses) -> ids` function and get
  back the fitted texts and cut flags per group (`FittedPrompt`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

TRUNCATION_MARKER = " [...truncated]"
"""Visible marker appended to a text that was cut to fit the input budget."""


def fit_responses(token_lengths: Sequence[int], budget: int) -> list:
    """Per-response token caps that fit K responses into `budget` tokens (water-filling).

    If the lengths already fit (sum <= budget) every cap equals its length.
    Otherwise the caps are min(len_i, c) for the largest integer level c with
    sum_i min(len_i, c) <= budget: a response shorter than the equal share keeps
    all its tokens and its unused share goes to the longer ones. The remainder
    r = budget - sum_i min(len_i, c) (< number of responses longer than c) is
    handed out as one extra token to each of the first r responses (by index)
    longer than c. Caps never exceed lengths and sum to min(budget, sum len).

    How the caller cuts: for response i with caps[i] < len_i, keep its first
    caps[i] tokens and append the tokens of `TRUNCATION_MARKER`
    (`fit_to_budget` does this). The marker is NOT counted in `budget`:
    pass `budget = available - K * len(marker_tokens)` to stay within the
    input length.

    Args:
      token_lengths: K ints >= 0, token counts of the responses.
      budget: int >= 0, total tokens available for the response bodies.

    Returns:
      list[int]: K caps.

    Raises:
      ValueError: a negative length or budget, or a non-integer value.
    """
    lengths = [int(x) for x in token_lengths]
    if any(x != y for x, y in zip(lengths, token_lengths)):
        raise ValueError(f"token_lengths must be integers, got {list(token_lengths)}")
    budget = int(budget)
    if budget < 0 or any(x < 0 for x in lengths):
        raise ValueError(f"lengths and budget must be >= 0, got {lengths}, {budget}")
    if sum(lengths) <= budget:
        return lengths
    remaining = budget
    level = 0
    ordered = sorted(lengths)
    n = len(ordered)
    # Water-filling over the sorted lengths: a text under the equal share of what is left keeps
    # all of it; the first text over its share sets the common cap c for the rest.
    for k, length in enumerate(ordered):
        share = remaining // (n - k)
        if length <= share:
            remaining -= length
        else:
            level = share
            break
    caps = [min(x, level) for x in lengths]
    # The remainder (fewer than the capped texts): one more token to each of the first ones.
    extra = budget - sum(caps)
    for i, x in enumerate(lengths):
        if extra == 0:
            break
        if x > level:
            caps[i] += 1
            extra -= 1
    return caps


def fit_to_budget(tokenizer, build_ids: Callable[[list], list], texts: Sequence[str],
                  max_tokens: int, max_tries: int = 6,
                  keep: Sequence[int] = ()) -> tuple[list, list, list]:
    """Cuts the variable texts of a prompt so the whole prompt has <= `max_tokens` tokens.

    (Input budgets of METHOD 4, e.g. the paper's 24K generator input; no paper equation.)

    `build_ids(texts) -> token ids` renders the full prompt (chat template included) from
    the n variable texts (e.g. [user request, history turns..., responses...]). The fixed
    overhead is measured with every text empty; the rest, minus one `TRUNCATION_MARKER`
    per text, is split by `fit_responses` (water-filling: texts shorter than the equal
    share keep everything, the longer ones share what is left equally) and each over-long
    text keeps its first tokens plus the visible marker. Re-tokenising a cut text can merge
    tokens differently at the cut; the loop shrinks the budget by any excess and retries.

    Args:
      tokenizer: HF tokenizer.
      build_ids: callable list[str] -> list[int].
      texts: the n variable texts.
      max_tokens: int, total prompt budget in tokens.
      max_tries: refits before giving up.
      keep: indices of texts never cut: their whole length is taken from the budget first
        and only the other texts share the rest (e.g. a request whose constraints must
        survive, checks world v2).

    Returns:
      (ids list[int], fitted texts list[str], cut flags list[bool]), fitted and cut in
      the order of `texts`.

    Raises:
      ValueError: the fixed part alone (plus the markers) exceeds `max_tokens`, or the
        budget could not be met.
    """
    texts = list(texts)
    ids = build_ids(texts)
    # The common case: nothing to cut, no further tokenizer work.
    if len(ids) <= max_tokens:
        return ids, texts, [False] * len(texts)
    # The template's fixed cost: the prompt rendered with every variable text empty.
    overhead = len(build_ids([""] * len(texts)))
    marker = len(tokenizer.encode(TRUNCATION_MARKER, add_special_tokens=False))
    keep = set(int(i) for i in keep)
    # Encoded once; each retry only re-caps them.
    tok_ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    kept = sum(len(t) for i, t in enumerate(tok_ids) if i in keep)
    # Room for one marker per cuttable text is reserved up front (any of them may be cut).
    budget = max_tokens - overhead - kept - marker * (len(texts) - len(keep))
    if budget <= 0:
        raise ValueError(f"the prompt template alone needs {overhead} tokens (+ markers"
                         f"{f' and {kept} of texts never cut' if kept else ''}); budget is "
                         f"{max_tokens}")
    free = [i for i in range(len(texts)) if i not in keep]
    for _ in range(max_tries):
        caps = [len(t) for t in tok_ids]
        for i, cap in zip(free, fit_responses([len(tok_ids[i]) for i in free], budget)):
            caps[i] = cap
        fitted, cut = [], []
        for text, t_ids, cap in zip(texts, tok_ids, caps):
            if cap < len(t_ids):
                # Cut at a token boundary and decoded: re-tokenised, it is about cap tokens.
                fitted.append(tokenizer.decode(t_ids[:cap]) + TRUNCATION_MARKER)
                cut.append(True)
            else:
                fitted.append(text)
                cut.append(False)
        ids = build_ids(fitted)
        excess = len(ids) - max_tokens
        if excess <= 0:
            return ids, fitted, cut
        # Re-tokenising merged tokens differently at a cut: shrink by the excess and refit.
        budget -= excess
        if budget <= 0:
            break
    raise ValueError(f"could not fit the prompt into {max_tokens} tokens")


@dataclass(frozen=True)
class FittedPrompt:
    """A prompt whose variable texts were cut by `fit_prompt` (K responses, H turns).

    Attributes:
      ids: list[int], token ids of the rendered prompt, at most the budget.
      prompt: str, the request x (ends in `TRUNCATION_MARKER` when cut).
      history: list[dict], the earlier turns with their "content" fitted (other keys kept).
      responses: list[str], the K responses, fitted.
      prompt_cut: bool; history_cut: list[bool] (H); response_cut: list[bool] (K).
    """

    ids: list
    prompt: str
    history: list
    responses: list
    prompt_cut: bool
    history_cut: list
    response_cut: list

    @property
    def any_cut(self) -> bool:
        """bool: some text was cut."""
        return self.prompt_cut or any(self.history_cut) or any(self.response_cut)


def _with_contents(history: Sequence[dict], contents: Sequence[str]) -> list:
    """Copies of the turns with "content" replaced, in order."""
    return [dict(turn, content=c) for turn, c in zip(history, contents)]


def fit_prompt(tokenizer, render: Callable[[str, list, list], list], prompt: str,
               history: Optional[Sequence[dict]] = None,
               responses: Optional[Sequence[str]] = None, *, max_tokens: int,
               prompt_last: bool = False, keep_prompt: bool = False) -> FittedPrompt:
    """Cuts a request, its earlier turns and K responses so the prompt fits `max_tokens`.

    The variable texts are the request, the "content" of each earlier turn and each
    response; `fit_to_budget` cuts them (all texts share one water-filling budget, so a
    long turn is cut like a long response).

    Args:
      tokenizer: HF tokenizer.
      render: callable `(prompt: str, history: list[dict], responses: list[str]) ->
        list[int]`, the token ids of the whole prompt (chat template included) built from
        the given texts; the history turns it receives carry the fitted "content".
      prompt: str, the request x (last user turn).
      history: earlier turns [{"role", "content", ...}] or None.
      responses: K texts or None ([] is passed to `render`).
      max_tokens: int, budget of the whole prompt in tokens.
      prompt_last: order of the texts given to `fit_responses`, which hands its
        one-token remainders to the first long texts: False -> [prompt, history...,
        responses...]; True -> [history..., prompt, responses...] (conversation order,
        used for the policy's chat prompt).
      keep_prompt: the request is never cut (`fit_to_budget`'s `keep`): the history and
        responses share what it leaves (the checks world's generator: its constraints).

    Returns:
      FittedPrompt.

    Raises:
      ValueError: from `fit_to_budget` (template alone too long, or the budget not met).
    """
    history = list(history or [])
    responses = list(responses or [])
    # The flat text list holds the request and the history turns first, the responses after.
    n_head = 1 + len(history)

    def split(flat):
        """(prompt, history contents, responses) items of a flat list."""
        head, tail = flat[:n_head], list(flat[n_head:])
        if prompt_last:
            return head[-1], list(head[:-1]), tail
        return head[0], list(head[1:]), tail

    def build(texts):
        p, contents, r = split(texts)
        return render(p, _with_contents(history, contents), r)

    contents = [turn["content"] for turn in history]
    head = contents + [prompt] if prompt_last else [prompt] + contents
    # keep_prompt: the request is never cut; history and responses share what is left.
    at = len(contents) if prompt_last else 0
    ids, fitted, cut = fit_to_budget(tokenizer, build, head + responses, max_tokens,
                                     keep=(at,) if keep_prompt else ())
    p, contents, r = split(fitted)
    # The cut flags come back in the same flat order as the texts.
    p_cut, h_cut, r_cut = split(cut)
    return FittedPrompt(ids, p, _with_contents(history, contents), r, p_cut, h_cut, r_cut)

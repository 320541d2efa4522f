"""The frozen verifier: P(yes) for every (response, rubric item) pair (METHOD 1, 3, 11).

The verifier reads [instructions + user request (+ earlier turns) + response + criterion]
and answers Yes or No. We never sample that answer: one forward pass gives the logits of
the first assistant token, and

    P(yes) = sum_{t in YES} p(t) / (sum_{t in YES} p(t) + sum_{t in NO} p(t)),
    v_m(y) = 1  iff  P(yes) > 0.5                                   (METHOD 11)

where YES / NO are all single-token spellings of the words found in the tokenizer
(" yes", "Yes", " Yes", "YES", ... ; case-14). v feeds Eq. 12 (`rewards.rubric_scores`),
Eq. 13 and Eq. 15.

Two execution paths give the same numbers (|dP| <= 1e-4, tested):
- prefix sharing (default): the prefix [instructions + request + response] is prefilled
  ONCE per response into a left-padded KV cache; the cache rows are then repeated
  (`jnp.repeat` on the batch axis) once per rubric item and all item suffixes
  ("Criterion: ... Answer Yes or No." + the assistant-turn opener), right-padded to a
  bucket, run in one batched pass that continues after the shared prefix. Logits are read
  at each row's last real suffix token.
- naive: every (response, item) pair is its own full prompt (reference and benchmark).

Shapes are bucketed (powers of two for prefix and full-prompt lengths, multiples of 16 for
the short item suffixes; row chunks derived from the buckets and a memory budget) so a new
text length reuses a compiled program.

Axis legend: R (prompt, response) pairs, M rubric items, P prefix tokens (bucket),
Ts suffix tokens (bucket), S = P + Ts cache slots, T full-prompt tokens, V vocab,
L layers, Hkv KV heads, Dh head dim.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax import models
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling import bucket_length
from drubric_jax.text.budget import fit_prompt, fit_to_budget
from drubric_jax.text.prompts import (plain_render, render_verifier_prompts,
                                      verifier_prefix_messages)

YES_WORD = "yes"
NO_WORD = "no"
_VARIANT_PREFIXES = ("", " ")  # leading-space and bare forms (chat templates use both)
_SUFFIX_CACHE_SIZE = 20000  # tokenised item suffixes kept (cleared when exceeded)


# ----------------------------------------------------------------------------- yes/no tokens


def yes_no_token_ids(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Single-token spellings of "yes" and "no" in a tokenizer (METHOD 11, case-14).

    Candidates are the lower / Capitalised / UPPER forms with and without a leading space
    ("yes", "Yes", "YES", " yes", " Yes", " YES"; same for "no"). A candidate counts when
    it encodes to exactly one token whose decoded text, stripped and lower-cased, is the
    word. Nothing is hard-coded: a different tokenizer gives its own ids.

    Args:
        tokenizer: a Hugging Face tokenizer (`encode`, `decode`).

    Returns:
        (yes_ids int32[n_yes], no_ids int32[n_no]), sorted, without duplicates.

    Raises:
        ValueError: no single-token spelling of "yes" or of "no" exists, or the sets overlap.
    """
    found = {}
    for word in (YES_WORD, NO_WORD):
        ids = set()
        for form in (word, word.capitalize(), word.upper()):
            for prefix in _VARIANT_PREFIXES:
                enc = tokenizer.encode(prefix + form, add_special_tokens=False)
                if len(enc) == 1 and tokenizer.decode(enc).strip().lower() == word:
                    ids.add(int(enc[0]))
        if not ids:
            raise ValueError(f"the tokenizer has no single-token spelling of {word!r}")
        found[word] = np.array(sorted(ids), np.int32)
    if set(found[YES_WORD].tolist()) & set(found[NO_WORD].tolist()):
        raise ValueError("yes and no token sets overlap")
    return found[YES_WORD], found[NO_WORD]


def p_yes_from_logits(logits: jax.Array, yes_ids: jax.Array, no_ids: jax.Array) -> jax.Array:
    """P(yes) from next-token logits, summing every yes and no variant (METHOD 11; the
    verdict it gives is v_m(y) of Eq. 12-13).

        P(yes) = sum_yes exp(l) / (sum_yes exp(l) + sum_no exp(l))
               = sigmoid(logsumexp(l[YES]) - logsumexp(l[NO]))

    The softmax normaliser over the vocabulary cancels, so mass on other tokens does not
    matter (case-14: Yes .30 + " Yes" .25 vs No .40 + " no" .05 gives 0.55).

    Args:
        logits: float32[..., V].
        yes_ids: int32[n_yes]; no_ids: int32[n_no] (from `yes_no_token_ids`).

    Returns:
        float32[...] in [0, 1].
    """
    logits = jnp.asarray(logits, jnp.float32)
    lse_yes = jax.nn.logsumexp(jnp.take(logits, yes_ids, axis=-1), axis=-1)
    lse_no = jax.nn.logsumexp(jnp.take(logits, no_ids, axis=-1), axis=-1)
    return jax.nn.sigmoid(lse_yes - lse_no)


def verdicts_from_p_yes(p_yes) -> np.ndarray:
    """v in {0, 1}: 1 iff P(yes) > 0.5 (METHOD 11; exactly 0.5 is No).

    Args:
        p_yes: float[...].

    Returns:
        float32[...] of 0.0 / 1.0 (the dtype `rewards.rubric_scores` takes, Eq. 12).
    """
    return (np.asarray(p_yes, np.float32) > 0.5).astype(np.float32)


def restore_order(values, order: Sequence[int], axis: int = -1) -> np.ndarray:
    """Maps values given in presentation order back to the original response order.

    Slot j showed original response `order[j]`, so `out[..., order[j]] = values[..., j]`
    along `axis` (case-15: shuffled presentation must be undone before Eq. 12 scores are
    assigned to responses).

    Args:
        values: array [..., K, ...] in presentation order along `axis`.
        order: a permutation of range(K).
        axis: the response axis.

    Returns:
        np.ndarray of the same shape, in original order.

    Raises:
        ValueError: `order` is not a permutation of range(K).
    """
    values = np.asarray(values)
    order = np.asarray(order, np.int64)
    k = values.shape[axis]
    if sorted(order.tolist()) != list(range(k)):
        raise ValueError(f"order must be a permutation of range({k}), got {order.tolist()}")
    out = np.empty_like(values)
    idx = [slice(None)] * values.ndim
    idx[axis] = order
    out[tuple(idx)] = values
    return out


# ----------------------------------------------------------------------------- jitted cores


@functools.partial(jax.jit, static_argnames=("cfg", "num_slots"))
def _prefill(params, cfg: ModelConfig, tokens, token_mask, num_slots: int):
    """Prefills left-padded prefixes int32[R, P] into a cache of S = num_slots slots.

    Returns (cache with index P, prefix lengths int32[R]).
    """
    cache = models.init_cache(cfg, tokens.shape[0], num_slots)
    positions = models.positions_from_mask(token_mask)
    _, cache = models.forward_hidden(params, cfg, tokens, positions, token_mask, cache)
    return cache, jnp.sum(token_mask, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _score_suffixes(params, cfg: ModelConfig, cache: models.KVCache, prefix_len,
                    suffix_tokens, suffix_len, yes_ids, no_ids):
    """P(yes) of Mc suffixes per cached prefix, in one batched pass.

    Args:
        cache: KVCache of R prefixes (index = P); rows are repeated Mc times here.
        prefix_len: int32[R] real prefix tokens (RoPE position of the first suffix token).
        suffix_tokens: int32[R, Mc, Ts] right-padded.  suffix_len: int32[R, Mc] (>= 1 for
            real items; 0 rows give an unused value).
        yes_ids, no_ids: int32 variant ids.

    Returns:
        float32[R, Mc].
    """
    r, mc, ts = suffix_tokens.shape
    rows = models.repeat_rows(cache, mc)
    tokens = suffix_tokens.reshape(r * mc, ts)
    lens = suffix_len.reshape(r * mc)
    steps = jnp.arange(ts, dtype=jnp.int32)
    mask = steps[None, :] < lens[:, None]
    positions = jnp.repeat(prefix_len, mc)[:, None] + steps[None, :]
    hidden, _ = models.forward_hidden(params, cfg, tokens, positions, mask, rows)
    last = jnp.take_along_axis(hidden, jnp.maximum(lens - 1, 0)[:, None, None], axis=1)[:, 0]
    logits = models.logits_from_hidden(params, cfg, last)
    return p_yes_from_logits(logits, yes_ids, no_ids).reshape(r, mc)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _score_full(params, cfg: ModelConfig, tokens, token_mask, yes_ids, no_ids):
    """P(yes) after left-padded full prompts int32[N, T] (no cache, causal). float32[N]."""
    positions = models.positions_from_mask(token_mask)
    hidden, _ = models.forward_hidden(params, cfg, tokens, positions, token_mask)
    logits = models.logits_from_hidden(params, cfg, hidden[:, -1])
    return p_yes_from_logits(logits, yes_ids, no_ids)


SUFFIX_STEP = 16  # suffix lengths are bucketed to multiples of this


def suffix_bucket(n: int) -> int:
    """Suffix-length bucket: the smallest multiple of 16 >= max(n, 1).

    Item suffixes are short (~30-45 tokens); a power-of-two bucket would pad a 35-token
    suffix to 64 and nearly double the suffix pass. Multiples of 16 still bound the number
    of compiled shapes by max_suffix_tokens / 16.
    """
    return SUFFIX_STEP * max(1, -(-int(n) // SUFFIX_STEP))


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


# ----------------------------------------------------------------------------- verifier

Items = Union[Sequence[str], Sequence[Sequence[str]]]


class Verifier:
    """Frozen yes/no verifier with prefix sharing (METHOD 1, 11; scores feed Eq. 12-15).

    Args:
        params, cfg: the verifier model (never updated).
        tokenizer: its tokenizer; the chat template renders the prompt (a tokenizer without
            one uses `text.prompts.plain_render`).
        max_prefix_tokens: budget of [instructions + request (+ history) + response]; longer
            texts are cut by `text.budget.fit_prompt` with the visible `TRUNCATION_MARKER`.
        max_suffix_tokens: budget of one item suffix (criterion + question + assistant
            opener); longer criteria are cut the same way.
        cache_slots_budget: most KV-cache row-slots (rows x S) of one suffix pass; bounds
            memory (SmolLM2-135M: ~46 KB per row-slot in float32).
        prefill_tokens_budget: most rows x tokens of one prefill or naive pass.
        max_rows: most (response) rows per prefill chunk.
        item_chunk: most items scored per prefix per pass (a power of two).
        min_bucket: smallest token bucket.

    Raises:
        ValueError: a budget < 16 tokens, or the tokenizer has no yes/no tokens.
    """

    def __init__(self, params, cfg: ModelConfig, tokenizer, max_prefix_tokens: int = 2048,
                 max_suffix_tokens: int = 128, *, cache_slots_budget: int = 1 << 15,
                 prefill_tokens_budget: int = 8192, max_rows: int = 8, item_chunk: int = 16,
                 min_bucket: int = 16):
        if max_prefix_tokens < 16 or max_suffix_tokens < 16:
            raise ValueError(f"max_prefix_tokens ({max_prefix_tokens}) and max_suffix_tokens "
                             f"({max_suffix_tokens}) must be >= 16")
        self.params, self.cfg, self.tokenizer = params, cfg, tokenizer
        self.max_prefix_tokens = int(max_prefix_tokens)
        self.max_suffix_tokens = int(max_suffix_tokens)
        self.cache_slots_budget = int(cache_slots_budget)
        self.prefill_tokens_budget = int(prefill_tokens_budget)
        self.max_rows = _pow2_floor(max_rows)
        self.item_chunk = _pow2_floor(item_chunk)
        self.min_bucket = int(min_bucket)
        yes, no = yes_no_token_ids(tokenizer)
        self.yes_ids, self.no_ids = jnp.asarray(yes), jnp.asarray(no)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._suffix_cache: dict = {}
        self.stats = {"prefix_cut": 0, "item_cut": 0, "prefixes": 0, "judgements": 0}

    # ------------------------------------------------------------------ text -> tokens

    def render(self, messages: Sequence[dict]) -> str:
        """Chat-template text of `messages` with the assistant turn opened."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                      add_generation_prompt=True)
        return plain_render(messages)

    def _encode(self, text: str) -> list:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _fit_pair(self, prompt: str, response: str, history) -> tuple:
        """(prompt, response, history) cut so the rendered prefix fits max_prefix_tokens."""
        def render(p, hist, responses):
            msgs = verifier_prefix_messages(p, responses[0], hist)
            prefix, _ = render_verifier_prompts(self.render, msgs, [])
            return self._encode(prefix)

        fit = fit_prompt(self.tokenizer, render, prompt, history, [response],
                         max_tokens=self.max_prefix_tokens)
        self.stats["prefix_cut"] += int(fit.any_cut)
        return fit.prompt, fit.responses[0], fit.history

    def _fit_item(self, item: str) -> str:
        """Item text cut so its suffix fits max_suffix_tokens (suffix measured on a stub)."""
        msgs = verifier_prefix_messages("x", "y")

        def build(texts):
            _, suffixes = render_verifier_prompts(self.render, msgs, texts)
            return self._encode(suffixes[0])

        _, fitted, cut = fit_to_budget(self.tokenizer, build, [item], self.max_suffix_tokens)
        self.stats["item_cut"] += int(cut[0])
        return fitted[0]

    def prepare(self, prompt: str, response: str, items: Sequence[str],
                history: Optional[Sequence[dict]] = None) -> tuple[list, list]:
        """Token ids of one response's shared prefix and of each item suffix.

        `prefix_ids + suffix_ids[m]` tokenises to the same ids as the full verifier prompt
        for item m (`render_verifier_prompts` splits at a pre-tokenizer
        boundary). Empty item strings give empty suffixes (padding).

        Returns:
            (prefix_ids list[int], suffix_ids list[list[int]]).
        """
        prompt, response, history = self._fit_pair(prompt, response, history)
        msgs = verifier_prefix_messages(prompt, response, history)
        real = [self._fit_item(it) for it in items if it.strip()]
        prefix, suffixes = render_verifier_prompts(self.render, msgs, real)
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
                self._suffix_cache[s] = self._encode(s)
            out.append(self._suffix_cache[s])
        return self._encode(prefix), out

    # ------------------------------------------------------------------ scoring

    def _normalise(self, prompts, responses, items, histories):
        r = len(responses)
        if isinstance(prompts, str):
            prompts = [prompts] * r
        if len(prompts) != r:
            raise ValueError(f"{len(prompts)} prompts for {r} responses")
        if histories is None or (len(histories) and isinstance(histories[0], dict)):
            histories = [histories or []] * r
        if len(histories) != r:
            raise ValueError(f"{len(histories)} histories for {r} responses")
        if len(items) == 0 or isinstance(items[0], str):
            items = [list(items)] * r
        elif len(items) != r:
            raise ValueError(f"{len(items)} item lists for {r} responses")
        for lst in items:
            if any(not isinstance(s, str) for s in lst):
                raise ValueError("items must be strings")
        return list(prompts), list(histories), [list(x) for x in items]

    def p_yes(self, prompts: Union[str, Sequence[str]], responses: Sequence[str],
              items: Items, history=None, *, shared_prefix: bool = True) -> np.ndarray:
        """P(yes) for every response and item (METHOD 11; v = P > 0.5 feeds Eq. 12).

        Args:
            prompts: one user request for all responses, or R of them.
            responses: R response strings.
            items: M criteria shared by all responses, or R lists (ragged allowed; "" is
                padding and is not scored).
            history: None, one history list for all, or R history lists
                ([{"role", "content"}, ...]).
            shared_prefix: True = prefix-sharing path, False = naive path (one full prompt
                per pair); both agree to ~1e-5.

        Returns:
            float32[R, M_max], M_max the longest item list; 0.0 at padding.

        Raises:
            ValueError: mismatched lengths, or a budget the template cannot meet.
        """
        prompts, histories, items = self._normalise(prompts, responses, items, history)
        r = len(responses)
        m_max = max((len(x) for x in items), default=0)
        out = np.zeros((r, m_max), np.float32)
        if r == 0 or m_max == 0:
            return out
        prepared = [self.prepare(p, y, it, h)
                    for p, y, it, h in zip(prompts, responses, items, histories)]
        self.stats["prefixes"] += r
        self.stats["judgements"] += sum(1 for lst in items for s in lst if s.strip())
        if shared_prefix:
            self._run_shared(prepared, out)
        else:
            full = [(i, m, pre + suf) for i, (pre, sufs) in enumerate(prepared)
                    for m, suf in enumerate(sufs) if suf]
            values = self.p_yes_ids([ids for _, _, ids in full])
            for (i, m, _), v in zip(full, values):
                out[i, m] = v
        return out

    def _run_shared(self, prepared: list, out: np.ndarray) -> None:
        m_max = out.shape[1]
        longest = max((len(s) for _, sufs in prepared for s in sufs), default=0)
        if longest == 0:
            return
        ts = suffix_bucket(longest)
        order = sorted(range(len(prepared)), key=lambda i: -len(prepared[i][0]))
        start = 0
        while start < len(order):
            p = bucket_length(len(prepared[order[start]][0]), self.min_bucket)
            slots = p + ts
            mc = min(self.item_chunk, bucket_length(m_max, 1),
                     _pow2_floor(max(self.cache_slots_budget // slots, 1)))
            rc = min(self.max_rows, _pow2_floor(max(self.prefill_tokens_budget // p, 1)),
                     _pow2_floor(max(self.cache_slots_budget // (slots * mc), 1)),
                     bucket_length(len(order) - start, 1))
            chunk = order[start:start + rc]
            start += rc
            tokens = np.full((rc, p), self.pad_id, np.int32)
            tmask = np.zeros((rc, p), bool)
            for j, i in enumerate(chunk):
                pre = prepared[i][0]
                tokens[j, p - len(pre):] = pre
                tmask[j, p - len(pre):] = True
            tmask[len(chunk):, -1] = True  # filler rows: one pad token
            cache, plen = _prefill(self.params, self.cfg, jnp.asarray(tokens),
                                   jnp.asarray(tmask), num_slots=slots)
            for m0 in range(0, m_max, mc):
                suf = np.full((rc, mc, ts), self.pad_id, np.int32)
                slen = np.zeros((rc, mc), np.int32)
                for j, i in enumerate(chunk):
                    for dm, s in enumerate(prepared[i][1][m0:m0 + mc]):
                        suf[j, dm, :len(s)] = s
                        slen[j, dm] = len(s)
                if not slen.any():
                    continue
                vals = np.asarray(_score_suffixes(
                    self.params, self.cfg, cache, plen, jnp.asarray(suf), jnp.asarray(slen),
                    self.yes_ids, self.no_ids))
                for j, i in enumerate(chunk):
                    n = min(mc, len(prepared[i][1]) - m0)
                    for dm in range(max(n, 0)):
                        if slen[j, dm]:
                            out[i, m0 + dm] = vals[j, dm]

    def p_yes_ids(self, prompts_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """P(yes) after each full token-id prompt (naive path; one pass per chunk).

        Args:
            prompts_ids: N non-empty lists of token ids, each ending where the answer token
                is predicted (assistant turn opened).

        Returns:
            float32[N].
        """
        n = len(prompts_ids)
        out = np.zeros((n,), np.float32)
        order = sorted(range(n), key=lambda i: -len(prompts_ids[i]))
        start = 0
        while start < n:
            t = bucket_length(len(prompts_ids[order[start]]), self.min_bucket)
            rows = min(64, _pow2_floor(max(self.prefill_tokens_budget // t, 1)),
                       bucket_length(n - start, 1))
            chunk = order[start:start + rows]
            start += rows
            tokens = np.full((rows, t), self.pad_id, np.int32)
            mask = np.zeros((rows, t), bool)
            for j, i in enumerate(chunk):
                ids = prompts_ids[i]
                if not ids:
                    raise ValueError(f"prompt {i} is empty")
                tokens[j, t - len(ids):] = ids
                mask[j, t - len(ids):] = True
            mask[len(chunk):, -1] = True
            vals = np.asarray(_score_full(self.params, self.cfg, jnp.asarray(tokens),
                                          jnp.asarray(mask), self.yes_ids, self.no_ids))
            out[chunk] = vals[:len(chunk)]
        return out

    def p_yes_messages(self, messages_list: Sequence[Sequence[dict]],
                       max_tokens: Optional[int] = None) -> np.ndarray:
        """P(yes) of the first assistant token after each chat (direct / pairwise judges).

        Args:
            messages_list: N message lists; each is rendered with the assistant turn opened.
            max_tokens: optional length check (callers fit texts with `fit_to_budget`).

        Returns:
            float32[N].

        Raises:
            ValueError: a rendered prompt is longer than `max_tokens`.
        """
        ids = [self._encode(self.render(m)) for m in messages_list]
        if max_tokens is not None:
            for i, x in enumerate(ids):
                if len(x) > max_tokens:
                    raise ValueError(f"prompt {i} has {len(x)} tokens > {max_tokens}")
        self.stats["judgements"] += len(ids)
        return self.p_yes_ids(ids)

"""The frozen verifier: P(yes) for every (response, rubric item) pair (METHOD 1, 3, 11).

The verifier reads [instructions + user request (+ earlier turns) + response + criterion]
and answers Yes or No. We never sample that answer: one forward pass gives the logits of
the first assistant token, and `verdicts.p_yes_from_logits` gives P(yes) from them
(METHOD 11; `verdicts` also turns P(yes) into the v of Eq. 12, 13 and 15).

Two execution paths give the same numbers (|dP| <= 1e-4, tested):
- prefix sharing (default): the prefix [instructions + request + response] is prefilled
  ONCE per response into a left-padded KV cache; the cache rows are then repeated
  (`jnp.repeat` on the batch axis) once per rubric item and all item suffixes
  ("Criterion: ... Answer Yes or No." + the assistant-turn opener), right-padded to a
  bucket, run in one batched pass that continues after the shared prefix. Logits are read
  at each row's last real suffix token.
- naive: every (response, item) pair is its own full prompt (reference and benchmark).

The jitted passes live in `verifier_passes`; shapes are bucketed (powers of two for prefix
and full-prompt lengths, multiples of 16 for the short item suffixes; row chunks derived
from the buckets and a memory budget) so a new text length reuses a compiled program.
Contextual calibration (METHOD 12) appends one content-free row per prompt to the same call.

Counters (cut prefixes and items, prefixes, judgements) go into a dict the caller passes
as `stats=` (nothing is kept on the object between calls).

Axis legend (docs/CONVENTIONS.md): R (prompt, response) pairs, M rubric items, P prefix
tokens (bucket), S cache slots, V vocab; here also Ts suffix tokens (bucket), T
full-prompt tokens.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax import sharding
from drubric_jax import verifier_passes as passes
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling import bucket_length
from drubric_jax.text.budget import fit_prompt, fit_to_budget
from drubric_jax.verdicts import (CALIBRATIONS, NULL_RESPONSE, contextual_calibration,
                                  yes_no_token_ids)
from drubric_jax.text.prompts import (plain_render, render_verifier_prompts,
                                      verifier_prefix_messages)

_SUFFIX_CACHE_SIZE = 20000  # tokenised item suffixes kept (cleared when exceeded)


# ----------------------------------------------------------------------------- verifier

Items = Union[Sequence[str], Sequence[Sequence[str]]]


def _count(stats: Optional[dict], name: str, n: int) -> None:
    if stats is not None:
        stats[name] = stats.get(name, 0) + n



class Verifier:
    """Frozen yes/no verifier with prefix sharing (METHOD 1, 11; scores feed Eq. 12-15).

    Args:
        cfg: the verifier model's config (params are passed to each call).
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
        mesh: optional device mesh: the rows of every pass are split over its
            ("data", "fsdp") axes (each chunk padded to a multiple of data x fsdp); the
            params should be on the same mesh (`sharding.param_shardings`).

    Raises:
        ValueError: a budget < 16 tokens, or the tokenizer has no yes/no tokens.
    """

    def __init__(self, cfg: ModelConfig, tokenizer, max_prefix_tokens: int = 2048,
                 max_suffix_tokens: int = 128, *, cache_slots_budget: int = 1 << 15,
                 prefill_tokens_budget: int = 8192, max_rows: int = 8, item_chunk: int = 16,
                 min_bucket: int = 16, mesh=None):
        if max_prefix_tokens < 16 or max_suffix_tokens < 16:
            raise ValueError(f"max_prefix_tokens ({max_prefix_tokens}) and max_suffix_tokens "
                             f"({max_suffix_tokens}) must be >= 16")
        self.cfg, self.tokenizer = cfg, tokenizer
        self.max_prefix_tokens = int(max_prefix_tokens)
        self.max_suffix_tokens = int(max_suffix_tokens)
        self.cache_slots_budget = int(cache_slots_budget)
        self.prefill_tokens_budget = int(prefill_tokens_budget)
        # Powers of two: chunk shapes come from a small set, so compiled programs are reused.
        self.max_rows = passes.pow2_floor(max_rows)
        self.item_chunk = passes.pow2_floor(item_chunk)
        self.min_bucket = int(min_bucket)
        # Found from the tokenizer, never hard-coded (METHOD 11).
        yes, no = yes_no_token_ids(tokenizer)
        self.yes_ids, self.no_ids = jnp.asarray(yes), jnp.asarray(no)
        # Any id will do: padded positions are masked out.
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._suffix_cache: dict = {}
        self.mesh = mesh
        # Every pass's rows are padded to a multiple of data x fsdp, the mesh's row shards.
        self._row_shards = 1 if mesh is None else int(np.prod(
            [mesh.shape[a] for a in sharding.BATCH_AXES]))

    @staticmethod
    def budgets(cfg: ModelConfig, device_bytes: int, fraction: float) -> dict:
        """cache_slots_budget and prefill_tokens_budget that use `fraction` of a device's
        memory: a KV row-slot holds L x 2 x Hkv x Dh values of the compute dtype, and a
        prefill token, while one layer runs, about 4 D (residual, normed input, queries,
        attention output) + 2 Hkv Dh (keys, values) + 2 F (gate, up) activation values."""
        itemsize = np.dtype(cfg.compute_dtype).itemsize
        slot = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * itemsize
        token = (4 * cfg.dim + 2 * cfg.num_kv_heads * cfg.head_dim
                 + 2 * cfg.hidden_dim) * itemsize
        budget = fraction * device_bytes
        return {"cache_slots_budget": max(1024, int(budget // slot)),
                "prefill_tokens_budget": max(1024, int(budget // (slot + token)))}

    def _rows(self, x: np.ndarray) -> jax.Array:
        """A pass input on the device(s): rows over ("data", "fsdp") with a mesh."""
        if self.mesh is None:
            return jnp.asarray(x)
        return sharding.put(x, sharding.batch_sharding(self.mesh))

    # ------------------------------------------------------------------ text -> tokens

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
        _count(stats, "prefix_cut", int(fit.any_cut))
        return fit.prompt, fit.responses[0], fit.history

    def _fit_item(self, item: str, stats: dict) -> str:
        """Item text cut so its suffix fits max_suffix_tokens (suffix measured on a stub)."""
        # A suffix's tokens do not depend on the prefix, so a stub prefix measures it.
        msgs = verifier_prefix_messages("x", "y")

        def build(texts):
            _, suffixes = render_verifier_prompts(self.render, msgs, texts)
            return self._encode(suffixes[0])

        _, fitted, cut = fit_to_budget(self.tokenizer, build, [item], self.max_suffix_tokens)
        _count(stats, "item_cut", int(cut[0]))
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

    # ------------------------------------------------------------------ scoring

    def _normalise(self, prompts, responses, items, histories):
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

    def p_yes(self, params, prompts: Union[str, Sequence[str]], responses: Sequence[str],
              items: Items, history=None, *, shared_prefix: bool = True,
              calibration: str = "none", stats: Optional[dict] = None) -> np.ndarray:
        """P(yes) for every response and item (METHOD 11; `verdicts` turns it into v).

        Args:
            params: the verifier's params.
            prompts: one user request for all responses, or R of them.
            responses: R response strings.
            items: M criteria shared by all responses, or R lists (ragged allowed; "" is
                padding and is not scored).
            history: None, one history list for all, or R history lists
                ([{"role", "content"}, ...]).
            shared_prefix: True = prefix-sharing path, False = naive path (one full prompt
                per pair); both agree to ~1e-5.
            calibration: "none", or "contextual": every P(yes) is calibrated against the
                same item on the content-free response `verdicts.NULL_RESPONSE` for the
                same prompt (METHOD 12). That costs one extra prefix per distinct
                (prompt, history) and one suffix row per distinct item of it.
            stats: optional dict that counts prefix_cut, item_cut, prefixes, judgements.

        Returns:
            float32[R, M_max], M_max the longest item list; 0.0 at padding.

        Raises:
            ValueError: mismatched lengths, or a budget the template cannot meet.
        """
        prompts, histories, items = self._normalise(prompts, responses, items, history)
        # `_calibrated` calls back in with calibration "none", on the real and the null rows.
        if calibration == "contextual":
            return self._calibrated(params, prompts, list(responses), items, histories,
                                    shared_prefix, stats)
        if calibration != "none":
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        r = len(responses)
        m_max = max((len(x) for x in items), default=0)
        out = np.zeros((r, m_max), np.float32)
        if r == 0 or m_max == 0:
            return out
        prepared = [self.prepare(p, y, it, h, stats)
                    for p, y, it, h in zip(prompts, responses, items, histories)]
        _count(stats, "prefixes", r)
        _count(stats, "judgements", sum(1 for lst in items for s in lst if s.strip()))
        if shared_prefix:
            self._run_shared(params, prepared, out)
        else:
            # Naive path: one full prompt per real (response, item) pair.
            full = [(i, m, pre + suf) for i, (pre, sufs) in enumerate(prepared)
                    for m, suf in enumerate(sufs) if suf]
            values = self.p_yes_ids(params, [ids for _, _, ids in full])
            for (i, m, _), v in zip(full, values):
                out[i, m] = v
        return out

    def _calibrated(self, params, prompts, responses, items, histories, shared_prefix,
                    stats) -> np.ndarray:
        """`p_yes` with contextual calibration: the null rows are appended to the same call
        (one per distinct (prompt, history), holding that prompt's distinct items)."""
        null_rows: dict = {}  # (prompt, history) -> {item: column}
        for p, h, lst in zip(prompts, histories, items):
            # JSON text makes the history (a list of dicts) part of a hashable key.
            cols = null_rows.setdefault((p, json.dumps(h, sort_keys=True)), {})
            for it in lst:
                if it.strip():
                    cols.setdefault(it, len(cols))
        keys = list(null_rows)
        # Each key's null row is appended after the R real rows.
        key_row = {k: len(prompts) + n for n, k in enumerate(keys)}
        null_hist = [json.loads(h) for _, h in keys]
        # One call: the null rows share the chunks and compiled shapes of the real ones.
        p_all = self.p_yes(params, prompts + [p for p, _ in keys],
                           responses + [NULL_RESPONSE] * len(keys),
                           items + [list(null_rows[k]) for k in keys], histories + null_hist,
                           shared_prefix=shared_prefix, stats=stats)
        r = len(responses)
        out = np.zeros((r, max((len(x) for x in items), default=0)), np.float32)
        for i, (p, h, lst) in enumerate(zip(prompts, histories, items)):
            key = (p, json.dumps(h, sort_keys=True))
            row, cols = key_row[key], null_rows[key]
            for j, it in enumerate(lst):
                if it.strip():
                    out[i, j] = contextual_calibration(p_all[i, j], p_all[row, cols[it]])
        return out

    def _run_shared(self, params, prepared: list, out: np.ndarray) -> None:
        m_max = out.shape[1]
        longest = max((len(s) for _, sufs in prepared for s in sufs), default=0)
        if longest == 0:
            return
        # One suffix bucket for the whole call, set by the longest suffix.
        ts = passes.suffix_bucket(longest)
        # Longest prefixes first: a chunk's bucket is its first row's, and similar lengths share it.
        order = sorted(range(len(prepared)), key=lambda i: -len(prepared[i][0]))
        start = 0
        while start < len(order):
            p = bucket_length(len(prepared[order[start]][0]), self.min_bucket)
            slots = p + ts
            # Items per pass (a row's cache is repeated mc times) within the slot budget; rows
            # per chunk within the prefill-token budget and the repeated cache's (rc * mc x slots).
            mc = min(self.item_chunk, bucket_length(m_max, 1),
                     passes.pow2_floor(max(self.cache_slots_budget // slots, 1)))
            rc = min(self.max_rows, passes.pow2_floor(max(self.prefill_tokens_budget // p, 1)),
                     passes.pow2_floor(max(self.cache_slots_budget // (slots * mc), 1)),
                     bucket_length(len(order) - start, 1))
            rc = self._row_shards * -(-rc // self._row_shards)  # filler rows split evenly
            chunk = order[start:start + rc]
            start += rc
            tokens = np.full((rc, p), self.pad_id, np.int32)
            tmask = np.zeros((rc, p), bool)
            for j, i in enumerate(chunk):
                pre = prepared[i][0]
                tokens[j, p - len(pre):] = pre
                tmask[j, p - len(pre):] = True
            tmask[len(chunk):, -1] = True  # filler rows: one pad token
            cache, plen = passes.prefill(params, self.cfg, self._rows(tokens),
                                         self._rows(tmask), num_slots=slots)
            # The chunk's prefilled cache serves every item block (the prefix is computed once).
            for m0 in range(0, m_max, mc):
                suf = np.full((rc, mc, ts), self.pad_id, np.int32)
                slen = np.zeros((rc, mc), np.int32)
                for j, i in enumerate(chunk):
                    for dm, s in enumerate(prepared[i][1][m0:m0 + mc]):
                        suf[j, dm, :len(s)] = s
                        slen[j, dm] = len(s)
                if not slen.any():
                    continue
                vals = sharding.fetch(passes.score_suffixes(
                    params, self.cfg, cache, plen, self._rows(suf), self._rows(slen),
                    self.yes_ids, self.no_ids))
                for j, i in enumerate(chunk):
                    n = min(mc, len(prepared[i][1]) - m0)
                    for dm in range(max(n, 0)):
                        if slen[j, dm]:
                            out[i, m0 + dm] = vals[j, dm]

    def p_yes_ids(self, params, prompts_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """P(yes) after each full token-id prompt (naive path and the direct judges; one
        pass per chunk).

        Args:
            params: the verifier's params.
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
            rows = min(64, passes.pow2_floor(max(self.prefill_tokens_budget // t, 1)),
                       bucket_length(n - start, 1))
            rows = self._row_shards * -(-rows // self._row_shards)
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
            vals = sharding.fetch(passes.score_full(params, self.cfg, self._rows(tokens),
                                                self._rows(mask), self.yes_ids, self.no_ids))
            # Filler rows (mesh padding) are dropped.
            out[chunk] = vals[:len(chunk)]
        return out

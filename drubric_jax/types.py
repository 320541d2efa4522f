"""The data types that flow through one round, and the project's one axis legend.

Axis legend (docs/CONVENTIONS.md; every module uses these letters):
    B  prompts (or anchor examples, or generator inputs) in a step
    K  responses per prompt (the policy's samples, the set C)
    G  rubric lists per (x, C): one generator GRPO group
    M  rubric items per list (padded to `max_items`)
    A  responses of an anchor list (best first; METHOD's n)
    R  rows of a flat batch: one sequence (a response or a rubric list) each
    T  tokens of a training row (prompt bucket P + completion N)
    P  prompt tokens (left-padded bucket)       N  new (completion) tokens
    S  KV-cache slots (positions) of a row      E  decode slots of the rollout engine
    V  vocabulary        D  model width         L  layers
    H  query heads       Hkv  key/value heads               Dh head dim

Data flow of a phase (METHOD section 5): the sampler returns a `Rollout` (R rows with their
left-padded prompts and sampled completions); rewards turn into one advantage per row; the
trainer builds its batch from the same Rollout arrays, with no re-padding
(`train_step.batch_from_rollout`). The rubric generator returns a `RubricBatch`, whose
`rollout` is what the generator is trained on.
"""
from __future__ import annotations

import dataclasses
import enum

import numpy as np


class Role(str, enum.Enum):
    """The two trainable roles; a phase is named after the role it trains (Algorithm 1)."""

    POLICY = "policy"
    GENERATOR = "generator"

    @property
    def other(self) -> "Role":
        # The trainee that is idle while this one trains.
        return Role.GENERATOR if self is Role.POLICY else Role.POLICY


@dataclasses.dataclass(frozen=True)
class Rollout:
    """R sampled rows: prompts and completions as the sampler saw and wrote them (host numpy).

    Attributes:
        prompt_tokens: int32[R, P] left-padded prompts (the sampler's bucket).
        prompt_mask: bool[R, P] real prompt tokens.
        tokens: int32[R, N] generated ids; after the stop token, the pad id.
        logprobs: float32[R, N] sampler log-probs (pi_old of Eq. 23) at the scoring
            temperature; 0 where masked.
        mask: bool[R, N] up to and including the first stop token (METHOD 11).
        lengths: int32[R] number of True in mask.
        truncated: bool[R] the row hit N tokens without a stop id.
        invalid: bool[R] a step had no allowed token (constrained decoding); the row ends
            before that step.
        group_ids: int32[R] GRPO group of each row (the prompt it answers; METHOD 11:
            groups are formed by id, never by reshaping).
    """

    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    invalid: np.ndarray
    group_ids: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.tokens.shape[0])

    def replace(self, **changes) -> "Rollout":
        return dataclasses.replace(self, **changes)

    def take(self, rows) -> "Rollout":
        """The rows `rows` (an index array or slice) of every field."""
        return Rollout(**{f.name: getattr(self, f.name)[rows]
                          for f in dataclasses.fields(self)})

    @staticmethod
    def concat(parts: list) -> "Rollout":
        """Rows of several rollouts with the same P and N, one after another."""
        # No copy in the usual case of one sampler call.
        if len(parts) == 1:
            return parts[0]
        return Rollout(**{f.name: np.concatenate([getattr(r, f.name) for r in parts])
                          for f in dataclasses.fields(Rollout)})


@dataclasses.dataclass(frozen=True)
class RubricBatch:
    """G sampled rubric lists for each of B generator inputs (host numpy).

    Attributes:
        texts: [B][G][M] criteria strings, "" at padding and for invalid lists.
        weights: int32[B, G, M] w_m in 1..5, 0 at padding.
        item_mask: bool[B, G, M] real items.
        list_valid: bool[B, G] the list parsed with >= 1 valid item (METHOD 11).
        finish_reasons: [B][G] "stop" or "length" ("invalid" when the grammar reached a
            dead end).
        raw_texts: [B][G] decoded completions (parser input).
        orders: int32[B, G, K] order[p] = response index shown as "Response p+1"
            (-1 padding; identity for static).
        response_cut: bool[B, G, K] the response was cut by the input budget.
        prompt_cut: bool[B, G] the request or a history turn was cut.
        rollout: the R = B * G generator samples, row b * G + g = list (b, g), grouped by
            input b: what the generator is trained on (Eq. 23-25). `truncated` is True for
            lists cut by the token budget before their JSON value was complete.
        temperature: sampling temperature (log-probs are reported at it; 1.0 for greedy).
        counters: summed `ParsedRubric.counters` plus lists, valid_lists, items_kept,
            items_dropped, constraint_dead_end.
    """

    texts: list
    weights: np.ndarray
    item_mask: np.ndarray
    list_valid: np.ndarray
    finish_reasons: list
    raw_texts: list
    orders: np.ndarray
    response_cut: np.ndarray
    prompt_cut: np.ndarray
    rollout: Rollout
    temperature: float
    counters: dict

    def first(self) -> "RubricBatch":
        """The first input's lists with the B axis dropped (`RubricGenerator.generate`);
        `rollout` keeps its G rows."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            # Per-input fields drop their B axis; rollout, temperature and counters are kept whole.
            if isinstance(v, np.ndarray) or f.name in ("texts", "finish_reasons", "raw_texts"):
                v = v[0]
            out[f.name] = v
        return RubricBatch(**out)


class ConfigError(ValueError):
    """A config field has a bad value; the message starts with the field's dotted name."""


def require(ok: bool, field: str, message: str) -> None:
    """Raises ConfigError("<field>: <message>") unless `ok`."""
    if not ok:
        raise ConfigError(f"{field}: {message}")

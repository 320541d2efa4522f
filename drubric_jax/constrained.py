"""JSON-schema constrained decoding with llguidance.

The grammar state lives on the host (one `llguidance.LLMatcher` per row); after every
sampled token the host advances the matchers and computes the next allowed-token masks,
which the jitted decode step applies to the logits (`sampling.constrained_step`).
"""
from __future__ import annotations

import json

import numpy as np


class JsonSchemaConstraint:
    """Per-row JSON-schema constraint.

    Args:
        tokenizer: the model's `PreTrainedTokenizerFast`.
        schema: JSON schema dict.
        vocab_size: V of the model's logits (may exceed the tokenizer's size; extra ids are
            never allowed).
        stop_id: the id that ends a row once its JSON value is complete.

    Raises:
        ValueError: llguidance rejects the schema.
    """

    def __init__(self, tokenizer, schema: dict, vocab_size: int, stop_id: int):
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self._llg = llguidance
        self._fill = llguidance.numpy.fill_next_token_bitmask
        self.vocab_size = vocab_size
        self.lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                  eos_token=stop_id)
        self.grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False})
        err = llguidance.LLMatcher.validate_grammar(self.grammar, self.lltok)
        if err:
            raise ValueError(f"llguidance rejected the JSON schema: {err}")
        self.matchers = []
        self._bitmask = None
        self._allocate = llguidance.numpy.allocate_token_bitmask

    def reset(self, batch: int) -> None:
        """Fresh matchers for `batch` rows."""
        self.matchers = [self._llg.LLMatcher(self.lltok, self.grammar) for _ in range(batch)]
        self._bitmask = self._allocate(batch, self.vocab_size)

    def allowed(self) -> np.ndarray:
        """bool[B, V] tokens the grammar allows next for every row."""
        for i, m in enumerate(self.matchers):
            self._fill(m, self._bitmask, i)
        bits = np.unpackbits(self._bitmask.view(np.uint8), axis=-1, bitorder="little")
        return bits[:, :self.vocab_size].astype(bool)

    def finished(self) -> np.ndarray:
        """bool[B] rows whose grammar has stopped (value complete, nothing else allowed)."""
        return np.array([m.is_stopped() for m in self.matchers], bool)

    def advance(self, tokens: np.ndarray, live: np.ndarray) -> None:
        """Feeds each live row's sampled token to its matcher."""
        for i, m in enumerate(self.matchers):
            if live[i] and not m.is_stopped():
                m.consume_token(int(tokens[i]))

    def errors(self) -> list:
        """Matcher error strings per row ('' when fine)."""
        return [m.get_error() if m.is_error() else "" for m in self.matchers]

"""The verifier's memory budgets and the pass sizes they allow (METHOD 11).

One place decides how the verifier splits its work into jitted passes: the token buckets
(prefixes and full prompts: `sampling.bucket_length`; item suffixes: multiples of 16),
the items scored per cached prefix and the rows per pass under a KV-cache row-slot budget
and a prefill-token budget. `Verifier` chunks its passes with a `PassBudgets`, and the
memory planner (`memory.planner.Workload`) plans the verifier's step with the same object,
so the two cannot drift apart. `memory_budgets` sizes the two budgets for a fraction of a
device's memory.

Axis legend (drubric_jax/types.py): R rows, M rubric items, P prefix tokens (bucket),
S cache slots, T full-prompt tokens; here also Mc items per pass, Ts suffix tokens (bucket).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling.buckets import bucket_length

SUFFIX_STEP = 16     # suffix lengths are bucketed to multiples of this
FULL_PASS_ROWS = 64  # most rows of one full-prompt pass (naive path, direct judges)


def suffix_bucket(n: int) -> int:
    """Suffix-length bucket: the smallest multiple of 16 >= max(n, 1).

    Item suffixes are short (~30-45 tokens); a power-of-two bucket would pad a 35-token
    suffix to 64 and nearly double the suffix pass. Multiples of 16 still bound the number
    of compiled shapes by max_suffix_tokens / 16.
    """
    return SUFFIX_STEP * max(1, -(-int(n) // SUFFIX_STEP))


def pow2_floor(n: int) -> int:
    """The largest power of two <= max(n, 1): chunk sizes from a small set, so compiled
    programs are reused."""
    return 1 << (max(int(n), 1).bit_length() - 1)


@dataclasses.dataclass(frozen=True)
class PassBudgets:
    """How many rows and items one verifier pass takes (the `Verifier`'s defaults).

    Attributes:
        cache_slots_budget: most KV-cache row-slots (rows x S) of one suffix pass; bounds
            memory (SmolLM2-135M: ~46 KB per row-slot in float32).
        prefill_tokens_budget: most rows x tokens of one prefill or full-prompt pass.
        max_rows: most (response) rows per prefill chunk (rounded down to a power of two).
        item_chunk: most items scored per prefix per pass (rounded down to a power of two).
        min_bucket: smallest prefix / full-prompt token bucket.
    """

    cache_slots_budget: int = 1 << 15
    prefill_tokens_budget: int = 8192
    max_rows: int = 8
    item_chunk: int = 16
    min_bucket: int = 16

    def prefix_bucket(self, n: int) -> int:
        """The token bucket P of a prefix (or full prompt) of n tokens."""
        return bucket_length(n, self.min_bucket)

    def items_per_pass(self, prefix: int, suffix: int, num_items: int) -> int:
        """Mc: items per suffix pass at prefix bucket P = `prefix` and suffix bucket
        Ts = `suffix`, for rows of at most `num_items` (M) item columns. A row's cache is
        repeated Mc times, so Mc row-copies of P + Ts slots stay within the slot budget."""
        return min(pow2_floor(self.item_chunk), bucket_length(num_items, 1),
                   pow2_floor(max(self.cache_slots_budget // (prefix + suffix), 1)))

    def rows_per_pass(self, prefix: int, suffix: int, num_items: int) -> int:
        """Rows (prefixes) per prefill and suffix pass at buckets P = `prefix`, Ts = `suffix`:
        within the prefill-token budget and the repeated cache's rows x Mc x (P + Ts) slots."""
        items = self.items_per_pass(prefix, suffix, num_items)
        return min(pow2_floor(self.max_rows),
                   pow2_floor(max(self.prefill_tokens_budget // prefix, 1)),
                   pow2_floor(max(self.cache_slots_budget // ((prefix + suffix) * items), 1)))

    def rows_per_full_pass(self, bucket: int) -> int:
        """Rows per full-prompt pass at token bucket T: within the prefill-token budget,
        at most FULL_PASS_ROWS."""
        return min(FULL_PASS_ROWS, pow2_floor(max(self.prefill_tokens_budget // bucket, 1)))


DEFAULT_BUDGETS = PassBudgets()


def memory_budgets(cfg: ModelConfig, device_bytes: int, fraction: float) -> dict:
    """cache_slots_budget and prefill_tokens_budget that use `fraction` of a device's memory.

    A KV row-slot holds L x 2 x Hkv x Dh values of the compute dtype, and a prefill token,
    while one layer runs, about 4 D (residual, normed input, queries, attention output)
    + 2 Hkv Dh (keys, values) + 2 F (gate, up) activation values.

    Args:
        cfg: the verifier model's config.
        device_bytes: one device's memory in bytes.
        fraction: the share of it the verifier's passes may take.

    Returns:
        {"cache_slots_budget": int, "prefill_tokens_budget": int}, each >= 1024 (the
        `PassBudgets` fields of the same names).
    """
    itemsize = np.dtype(cfg.compute_dtype).itemsize
    slot = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * itemsize
    token = (4 * cfg.dim + 2 * cfg.num_kv_heads * cfg.head_dim
             + 2 * cfg.hidden_dim) * itemsize
    budget = fraction * device_bytes
    return {"cache_slots_budget": max(1024, int(budget // slot)),
            "prefill_tokens_budget": max(1024, int(budget // (slot + token)))}

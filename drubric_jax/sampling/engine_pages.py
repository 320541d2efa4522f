"""The rollout engine's page bookkeeping (`sampling.engine`): where each slot's own pages
sit in a row shard's pool (`PagePlan`), the host's ledger of the prefix pages lent to
prompts (`PrefixPages`), and how many prefix pages a shard gets by default.

Axis legend (docs/CONVENTIONS.md): E decode slots, R row shards, E_l = E / R, K rows a
prompt, P prompt bucket, N max new tokens, Ps tokens a page, Pt pages a table.
"""
from __future__ import annotations

import dataclasses
import math

from drubric_jax.models import paged

PAGE_SIZE = 16  # tokens a page: the GPU kernel's dot needs >= 16 keys a block


@dataclasses.dataclass(frozen=True)
class PagePlan:
    """Where each slot's pages are in the pool (page ids local to a row shard).

    Shard d (of R) holds slots [d * E_l, (d + 1) * E_l) and pool pages
    [d * Np_l, (d + 1) * Np_l). Locally: page 0 is scratch, then E_l slots' own pages
    (`own` each: the prompt's partial last page and N new tokens), then `prefix_pages`
    pages lent to prompts.

    Attributes:
        slots: E.  shards: R.  page_size: Ps.  max_new_tokens: N.  max_prompt: P_max.
        prefix_pages: prefix pages per shard.
    """

    slots: int
    shards: int
    page_size: int
    max_new_tokens: int
    max_prompt: int
    prefix_pages: int

    @property
    def slots_per_shard(self) -> int:
        return self.slots // self.shards

    @property
    def own(self) -> int:
        """A slot's own pages: up to Ps - 1 prompt tokens (its copied partial page) + N."""
        return paged.pages_for(self.page_size - 1 + self.max_new_tokens, self.page_size)

    @property
    def prompt_pages(self) -> int:
        """Pages of the longest prompt (a table's prefix part)."""
        return paged.pages_for(self.max_prompt, self.page_size)

    @property
    def table_pages(self) -> int:
        """Pt: a prompt's full pages, then the slot's own."""
        return self.max_prompt // self.page_size + self.own

    @property
    def pages_per_shard(self) -> int:
        return 1 + self.slots_per_shard * self.own + self.prefix_pages

    def shard_of(self, slot: int) -> int:
        return slot // self.slots_per_shard

    def own_pages(self, slot: int) -> list:
        first = 1 + (slot % self.slots_per_shard) * self.own
        return list(range(first, first + self.own))

    def prefix_range(self) -> range:
        return range(1 + self.slots_per_shard * self.own, self.pages_per_shard)


class PrefixPages:
    """The host's ledger of each row shard's prefix pages (`engine.PagePlan`): which prompt
    holds which pages on which shard, and how many of its rows are live there.

    A prompt is stored on a shard when a row of it is placed there and it is not already
    stored; its pages go back when its last row there ends and no row of it waits.
    """

    def __init__(self, plan: PagePlan):
        self.plan = plan
        self.free = [list(plan.prefix_range()) for _ in range(plan.shards)]
        self.held = [dict() for _ in range(plan.shards)]   # prompt index -> [pages, live]
        self.peak = 0

    def stored(self, shard: int, prompt: int) -> bool:
        return prompt in self.held[shard]

    def can_store(self, shard: int, pages: int) -> bool:
        return len(self.free[shard]) >= pages

    def store(self, shard: int, prompt: int, pages: int) -> list:
        got = [self.free[shard].pop(0) for _ in range(pages)]
        self.held[shard][prompt] = [got, 0]
        used = self.plan.prefix_pages - len(self.free[shard])
        self.peak = max(self.peak, used)
        return got

    def pages(self, shard: int, prompt: int) -> list:
        return self.held[shard][prompt][0]

    def add_row(self, shard: int, prompt: int) -> None:
        self.held[shard][prompt][1] += 1

    def end_row(self, shard: int, prompt: int, waiting: bool) -> None:
        """A row of `prompt` ended on `shard`; `waiting`: rows of it are still pending."""
        entry = self.held[shard][prompt]
        entry[1] -= 1
        if entry[1] == 0 and not waiting:
            self.release(shard, prompt)

    def release_idle(self, shard: int, prompt: int) -> None:
        """Gives back `prompt`'s pages on `shard` if it has no live row there."""
        if prompt in self.held[shard] and self.held[shard][prompt][1] == 0:
            self.release(shard, prompt)

    def release(self, shard: int, prompt: int) -> None:
        self.free[shard].extend(self.held[shard].pop(prompt)[0])


def default_prefix_pages(slots: int, shards: int, rows: int, prompts: int, max_prompt: int,
                         page_size: int) -> int:
    """Prefix pages per row shard when none are given: room for 2 ceil(E_l / K) + 1
    prompts of P_max (E_l slots a shard, K = rows / prompts rows a prompt), at most E_l
    and at most the rollout's prompts.

    Why that many: rows are placed in order, so a shard's live rows belong to about
    E_l / K consecutive prompts; twice that leaves room for the prompts whose last rows
    are still writing (long tails) while the next ones start. With K = 1 (every row its
    own prompt) it is E_l, every slot its own prompt. A slot that finds no room waits
    (`stats["waits"]`).
    """
    e_l = slots // shards
    k = max(rows / max(prompts, 1), 1.0)
    held = min(e_l, prompts, 2 * math.ceil(e_l / k) + 1)
    return max(held, 1) * paged.pages_for(max_prompt, page_size)

"""The verifier's counters: what a `stats=` dict of `Verifier.p_yes` counts.

Nothing is kept on the verifier between calls; the caller passes a dict and reads it.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

# prefix_cut, item_cut: texts cut to their token budgets (`verifier_prompts`); prefixes,
# judgements: responses and real (response, item) pairs scored (`verifier`).
STATS = ("prefix_cut", "item_cut", "prefixes", "judgements")
# A mixture-of-experts verifier's router load (`chunked.ChunkedPasses`), counted on the
# first pass of each call: int64 arrays [L, E] (pairs per expert), [L] (dropped, routed),
# as `models.qwen3_moe.router_load_counts` gives them; a dense verifier adds none. Every
# process holds the same values (a pass is one program of all processes): not summed over
# the processes.
LOAD_COUNTS = {"moe_pairs": "pairs", "moe_dropped": "dropped", "moe_routed": "routed"}


def add_count(stats: Optional[dict], name: str, n: int) -> None:
    """Adds n to counter `name` of a `stats=` dict (None: nothing is counted)."""
    if stats is not None:
        stats[name] = stats.get(name, 0) + n


def add_router_load(stats: Optional[dict], counts: dict) -> None:
    """Adds router load counts ({"pairs", "dropped", "routed"} arrays, host numpy) to the
    `LOAD_COUNTS` entries of a `stats=` dict (None: nothing is counted)."""
    for name, key in LOAD_COUNTS.items():
        add_count(stats, name, np.asarray(counts[key], np.int64))

"""The verifier's counters: what a `stats=` dict of `Verifier.p_yes` counts.

Nothing is kept on the verifier between calls; the caller passes a dict and reads it.
"""
from __future__ import annotations

from typing import Optional

# prefix_cut, item_cut: texts cut to their token budgets (`verifier_prompts`); prefixes,
# judgements: responses and real (response, item) pairs scored (`verifier`).
STATS = ("prefix_cut", "item_cut", "prefixes", "judgements")


def add_count(stats: Optional[dict], name: str, n: int) -> None:
    """Adds n to counter `name` of a `stats=` dict (None: nothing is counted)."""
    if stats is not None:
        stats[name] = stats.get(name, 0) + n

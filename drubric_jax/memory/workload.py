"""The shapes of a round's device steps (`Workload`) and the planner's choice of a step's
rows (`choose`), for the GRPO update too (`update_step`: per row, or whole groups sharing
a prefix a pass); `planner.plan` and `memory.remat` use them.

Axis legend (docs/CONVENTIONS.md): R rows, P prompt bucket, N new tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import ml_collections

from drubric_jax.evaluator.budgets import DEFAULT_BUDGETS, suffix_bucket
from drubric_jax.evaluator.rubric_generator import MIN_PROMPT_BUCKET
from drubric_jax.memory.terms import RoleModels, Step
from drubric_jax.memory.train_terms import (group_layout, padded_groups, pass_group,
                                            train_terms)
from drubric_jax.sampling import bucket_length

PHASES = ("generator", "policy")
DEFAULT_HEADROOM = 0.10  # of the device memory, for the runtime, compiled code, fragmentation
DEFAULT_BLOCK = 512      # key tile of blockwise attention (planned)
BACKENDS = ("cpu", "gpu", "tpu")


@dataclasses.dataclass(frozen=True)
class Workload:
    """Shapes of a round's device steps (`from_config`; the device check sets its own)."""

    policy_rows: int    # B * K responses per step (the policy update's R)
    policy_prompt: int  # P, the sampler's prompt bucket
    policy_new: int     # N
    rubric_rows: int    # B * G rubric lists per generator step (the generator update's R)
    rubric_rows_policy_phase: int  # B lists (one per prompt) per policy step
    rubric_prompt: int  # generator prompt bucket
    rubric_new: int
    verifier_prefix: int  # prefix bucket
    verifier_suffix: int  # suffix bucket
    verifier_rows: int    # prefixes per verifier pass
    verifier_items: int   # items per suffix pass
    policy_segments: int  # config.policy.cache_segments (0 = auto)
    rubric_segments: int  # config.generator.cache_segments
    policy_sampler: str   # config.policy.sampler: "static" | "engine"
    rubric_sampler: str   # config.generator.sampler
    # Rows of a group that shares a prefix (the grouped update's R, `train_step.GroupBatch`):
    # a prompt's K answers, an input's G lists; 0 = rows planned one by one.
    policy_group: int = 0
    rubric_group: int = 0

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "Workload":
        p, g, v = config.policy, config.generator, config.verifier
        # The verifier's own chunking (`evaluator.budgets`) at its default budgets.
        chunking = DEFAULT_BUDGETS
        prefix = chunking.prefix_bucket(v.max_prefix_tokens)
        suffix = suffix_bucket(v.max_suffix_tokens)
        num_items = g.num_lists * g.max_items
        items = chunking.items_per_pass(prefix, suffix, num_items)
        rows = chunking.rows_per_pass(prefix, suffix, num_items)
        # The generator's smallest prompt bucket, from its constructor's default (rubric_generator
        # has no module-level constant for it yet), so the plan follows the generator.
        gen_bucket = MIN_PROMPT_BUCKET
        return cls(p.prompts_per_step * p.num_responses,
                   bucket_length(p.max_prompt_tokens, p.min_prompt_bucket), p.max_new_tokens,
                   g.anchors_per_step * g.num_lists, p.prompts_per_step,
                   bucket_length(g.input_budget, gen_bucket), g.max_new_tokens,
                   prefix, suffix, rows, items, p.cache_segments, g.cache_segments,
                   p.sampler, g.sampler, p.num_responses, g.num_lists)

    def shared_rows(self, role: str, phase: str) -> int:
        """Rows of `role`'s sampling in `phase` that share one prompt (the engine stores it
        once a shard): a prompt's K answers; an input's G lists in the generator step, one
        list an input in the policy step."""
        if role == "policy":
            return max(self.policy_group, 1)
        return max(self.rubric_group, 1) if phase == "generator" else 1

    def update(self, role: str) -> tuple:
        """(rows R, prompt bucket P, new tokens N, rows a group) of `role`'s update."""
        if role == "generator":
            return self.rubric_rows, self.rubric_prompt, self.rubric_new, self.rubric_group
        return self.policy_rows, self.policy_prompt, self.policy_new, self.policy_group


def divisors(n: int) -> list:
    # Largest first: the search takes the first candidate that fits.
    return [d for d in range(n, 0, -1) if n % d == 0]


def choose(phase: str, name: str, rows: int, candidates: list, terms: Callable,
            budget: Optional[int], given: Optional[int]) -> Step:
    """The step at `given` rows, or (given None) at the largest candidate that fits
    `budget` (the smallest candidate when none does)."""
    if given is not None:
        return Step(phase, name, terms(given), given, rows)
    for r in candidates:
        t = terms(r)
        if budget is None or sum(x.bytes for x in t) <= budget:
            return Step(phase, name, t, r, rows)
    # Nothing fits: the smallest candidate, so the verdict names the real shortfall.
    return Step(phase, name, terms(candidates[-1]), candidates[-1], rows)


def update_step(models_: RoleModels, w: Workload, role: str, mesh, attention: str,
                block: int, backend: str, budget: Optional[int] = None,
                micro_batch: Optional[int] = None) -> Step:
    """The GRPO update step of `role` at `micro_batch` rows a gradient pass (None: the
    largest candidate whose transients fit `budget`).

    Per row: candidates are the divisors of the step's rows that split over data x fsdp.
    Grouped (the trainee's `shared_prefix`): whole groups a pass, a multiple of the row
    shards (each device its own groups), of the step's groups padded to the row shards as
    `rounds.phases.train_batch` pads them (`terms.group_layout`); every group planned live.
    """
    rows, prompt, new, group = w.update(role)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    grouped = pass_group(models_.train[role], group, rows, shards)
    if grouped:
        padded = padded_groups(rows, grouped, shards)
        of_rows = padded * grouped
        candidates = ([d * grouped for d in divisors(padded) if d % shards == 0]
                      or [of_rows])
    else:
        of_rows = rows
        # Update micro-batches are split over data x fsdp: multiples of the row shards only.
        candidates = [m for m in divisors(rows) if m % shards == 0] or [rows]
    step = choose(role, f"{role} update", of_rows, candidates,
                   lambda m: train_terms(models_, role, mesh, rows, m, prompt, new,
                                         attention, block, backend, grouped),
                   budget, micro_batch)
    if grouped:  # rows a pass as the run takes them: whole groups (`train_step.micro_batches`)
        step.rows = group_layout(rows, grouped, step.rows, shards).per_pass * grouped
        step.group = grouped
    return step

"""What every phase function shares: the run's context, a step timer and a step's output.

    Context          the run's settings, the roles, the rubric generator and verifier built
                     for them, the mesh and the policy's stop / pad ids (`Context.build`)
    Timer            wall seconds per named part of a step ("sampling", "verification", ...)
    PhaseStep        what a rollout function returns: rows, advantages, metrics, timer, trace
    verifier_budgets the verifier's chunk budgets from the accelerator's memory
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Optional

import jax
import numpy as np

from drubric_jax.evaluator.rubric_generator import RubricGenerator
from drubric_jax.evaluator.budgets import memory_budgets
from drubric_jax.evaluator.rubric_formats import get_format
from drubric_jax.evaluator.verifier import Verifier
from drubric_jax.rounds.roles import Roles
from drubric_jax.rounds.settings_types import RunSettings
from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.types import Rollout


class Timer:
    """Accumulates wall seconds per named part of a step (`with timer("sampling"): ...`)."""

    def __init__(self):
        self.seconds: dict = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def add(self, other: "Timer") -> None:
        """Adds `other`'s seconds to this timer's (e.g. a discarded rollout's, whose work
        still belongs to the step that replaced it)."""
        for name, seconds in other.seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def metrics(self) -> dict:
        return {f"seconds_{k}": v for k, v in self.seconds.items()}


@dataclasses.dataclass
class Context:
    """What every phase function needs: the run's settings, the roles and their samplers,
    the mesh, the ids that end a policy response (the policy tokenizer's EOS / end of turn)
    and the policy's pad id (the first of those; the masks, not the id, tell padding apart).

    `settings` is the run config read once (`rounds.settings.read`): no phase reads the
    ConfigDict, which the context does not hold. A test that changes a setting replaces
    it (`dataclasses.replace(ctx, settings=settings.read(other_config))`).
    The verifier is a `Verifier` (the model's P(yes)) or, with `verifier.kind = "checks"`,
    a `ChecksVerifier` (the checkers' 0/1, METHOD 13; the generator then writes checks).
    `generator` is None when the run loads no generator (`roles.generator_used`).
    `true_checks`: {prompt text: its true checks, `meta["checks"]`} of the run's prompts
    (METHOD 13's T(x); empty outside the checks world), for the step metrics."""

    settings: RunSettings
    roles: Roles
    generator: Optional[RubricGenerator]
    verifier: Any
    mesh: Any
    policy_stop_ids: np.ndarray
    policy_pad_id: int
    true_checks: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, settings: RunSettings, roles: Roles, mesh, prompts=()) -> "Context":
        """The context of a run; `settings`: `rounds.settings.read(config)`; `prompts`: its
        `PromptItem`s (read for `true_checks`)."""
        gen_s, ver_s = settings.generator, settings.verifier
        gen = None if roles.generator is None else roles.generator.model
        stop = tok_lib.stop_ids(roles.policy.model.tokenizer)
        true_checks = {x.prompt: x.meta["checks"] for x in prompts
                       if isinstance(getattr(x, "meta", None), dict) and x.meta.get("checks")}
        if ver_s.kind == "checks":
            from drubric_jax.evaluator.checks_verifier import ChecksVerifier  # imports the checkers
            verifier = ChecksVerifier(ver_s.loose, ver_s.check_workers)
        else:
            verifier = Verifier(roles.verifier.cfg, roles.verifier.tokenizer,
                                max_prefix_tokens=ver_s.max_prefix_tokens,
                                max_suffix_tokens=ver_s.max_suffix_tokens, mesh=mesh,
                                **verifier_budgets(roles.verifier.cfg, ver_s.memory_fraction))
        # The generator samples with its role's config: a LoRA trainee's carries the
        # adapters' scale (the source's has none).
        generator = None if gen is None else RubricGenerator(
            roles.generator.cfg, gen.tokenizer, max_items=gen_s.max_items,
            max_item_chars=gen_s.max_item_chars, max_new_tokens=gen_s.max_new_tokens,
            input_budget=gen_s.input_budget, mesh=mesh,
            rows_per_call=gen_s.rollout_micro_batch, cache_segments=gen_s.cache_segments,
            per_row_keys=settings.per_row_keys, fmt=get_format(ver_s.kind, gen_s.check_pool),
            keep_prompt=gen_s.keep_prompt, sampler=gen_s.sampler,
            orders_per_list=gen_s.orders_per_list)
        return cls(settings, roles, generator, verifier, mesh, stop, int(stop[0]), true_checks)


def verifier_budgets(cfg, fraction: float) -> dict:
    """The verifier's chunk budgets: `evaluator.budgets.memory_budgets` for `fraction` of the first device's
    memory on an accelerator (bytes_limit in its memory_stats), the CPU defaults otherwise
    or with fraction 0."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if fraction <= 0 or "bytes_limit" not in stats:
        return {}
    return memory_budgets(cfg, int(stats["bytes_limit"]), fraction)


@dataclasses.dataclass
class PhaseStep:
    """The output of a rollout function (trace: per-prompt records for trace/round_N.html)."""

    rollout: Rollout
    advantages: np.ndarray  # float32[R], this process's rows (Eq. 21 / Eq. 25)
    live: np.ndarray        # bool[R], the rows whose group is not flat (`train_step.live_rows`)
    metrics: dict
    timer: Timer
    trace: list = dataclasses.field(default_factory=list)

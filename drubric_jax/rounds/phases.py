"""One step of each phase of Algorithm 1 (METHOD section 5), as functions.

A rollout function samples, scores and returns `(Rollout, advantages, metrics)`: the rows
to train on, one advantage per row, and the step's reward and rubric statistics. Every
formula is a call into `rewards` (Eq. 12, 13, 15, 21, 24-25); nothing here re-derives one.
`update` then takes one GRPO step (Eq. 23) of a trainee on those rows.

    generator_rollout   evaluator update, policy fixed: G rubric lists per (x, C), R_disc on
                        C and R_anchor on the anchor list, A = A_disc + lambda A_anchor
    policy_rollout      policy update, generator fixed: K responses, one rubric list,
                        scores E (Eq. 12), group advantages by prompt id (Eq. 21)
    rule_policy_rollout the plain GRPO baseline: the same sampling with a rule reward
    heldout_metrics     Delta_gap (Eq. 2) and R_anchor on held-out anchor lists

Axis legend (docs/CONVENTIONS.md): B prompts or anchor examples, K responses per prompt,
G rubric lists per (x, C), M items, A anchor responses, R rows.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from drubric_jax.rl import advantages as adv_lib
from drubric_jax import sampling, parallel
from drubric_jax.rounds import hostmem
from drubric_jax.rl import rewards
from drubric_jax.rl import train_step as ts
from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.rounds.roles import Roles
from drubric_jax.evaluator.rubric_generator import RubricGenerator, RubricInput
from drubric_jax.text.budget import fit_prompt
from drubric_jax.types import Role, Rollout
from drubric_jax.evaluator.verdicts import verdicts_from_p_yes
from drubric_jax.evaluator.verifier import Verifier

# Eq. 24-25 weights (of z(R_disc), of z(R_anchor)) of each generator-training variant
# (METHOD 6); "full" uses config.generator.lam for the second.
VARIANT_WEIGHTS = {"full": (1.0, None), "disc_only": (1.0, 0.0), "anchor_only": (0.0, 1.0)}


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

    def metrics(self) -> dict:
        return {f"seconds_{k}": v for k, v in self.seconds.items()}


@dataclasses.dataclass
class Context:
    """What every phase function needs: the config, the roles and their samplers, the mesh,
    the ids that end a policy response (the policy tokenizer's EOS / end of turn) and the
    policy's pad id (the first of those; the masks, not the id, tell padding apart)."""

    config: ml_collections.ConfigDict
    roles: Roles
    generator: RubricGenerator
    verifier: Verifier
    mesh: Any
    policy_stop_ids: np.ndarray
    policy_pad_id: int

    @classmethod
    def build(cls, config, roles: Roles, mesh) -> "Context":
        g, v = config.generator, config.verifier
        gen = roles.generator.model
        stop = tok_lib.stop_ids(roles.policy.model.tokenizer)
        return cls(config, roles,
                   RubricGenerator(gen.cfg, gen.tokenizer, max_items=g.max_items,
                                   max_item_chars=g.max_item_chars,
                                   max_new_tokens=g.max_new_tokens,
                                   input_budget=g.input_budget, mesh=mesh,
                                   rows_per_call=g.rollout_micro_batch,
                                   per_row_keys=config.per_row_keys),
                   Verifier(roles.verifier.cfg, roles.verifier.tokenizer,
                            max_prefix_tokens=v.max_prefix_tokens,
                            max_suffix_tokens=v.max_suffix_tokens, mesh=mesh,
                            **verifier_budgets(roles.verifier.cfg, v.memory_fraction)),
                   mesh, stop, int(stop[0]))


def verifier_budgets(cfg, fraction: float) -> dict:
    """The verifier's chunk budgets: `Verifier.budgets` for `fraction` of the first device's
    memory on an accelerator (bytes_limit in its memory_stats), the CPU defaults otherwise
    or with fraction 0."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if fraction <= 0 or "bytes_limit" not in stats:
        return {}
    return Verifier.budgets(cfg, int(stats["bytes_limit"]), fraction)


@dataclasses.dataclass
class PhaseStep:
    """The output of a rollout function (trace: per-prompt records for trace/round_N.html)."""

    rollout: Rollout
    advantages: np.ndarray
    metrics: dict
    timer: Timer
    trace: list = dataclasses.field(default_factory=list)


# ----------------------------------------------------------------------------- pieces


def policy_prompt_ids(tokenizer, prompt: str, history: Sequence[dict], budget: int) -> list:
    """Policy chat prompt ids (history + request, assistant turn opened) within `budget`
    tokens (METHOD 4: the paper's 8K policy input)."""
    def render(p, hist, _):
        return tok_lib.chat_ids(tokenizer, hist + [{"role": "user", "content": p}])

    # prompt_last: the request is the last text, as in the chat (cut order of the budget).
    return fit_prompt(tokenizer, render, prompt, history, max_tokens=budget,
                      prompt_last=True).ids


def sample_responses(ctx: Context, key, prompts: Sequence[str], histories, k: int,
                     timer: Timer, params=None) -> tuple[Rollout, list]:
    """K policy responses per prompt, from the current policy or from `params` (another
    state of it, e.g. in an evaluation).

    Under several processes each process samples only its block of the B prompts
    (`parallel.process_block`; B is padded with copies of the last prompt to a multiple of
    the process count, the filler dropped) and the texts are gathered.

    Returns:
        (Rollout of this process's rows, grouped by prompt: row j*K + i answers its j-th
        prompt, group id = the prompt's index b in the batch; all B*K rows on one process,
        B*K response texts of every process in prompt order).
    """
    model, p = ctx.roles.policy.model, ctx.config.policy
    stop = ctx.policy_stop_ids
    n = len(prompts)
    block, rows = parallel.process_share(prompts, histories)
    ids = [policy_prompt_ids(model.tokenizer, x, h, p.max_prompt_tokens) for x, h in zip(*rows)]
    with timer("sampling"):
        out = sampling.generate_chunked(
            ctx.roles.params(Role.POLICY) if params is None else params, model.cfg,
            [i for i in ids for _ in range(k)],
            p.rollout_micro_batch, key=key, max_new_tokens=p.max_new_tokens,
            method=sampling.method_from_flags(p.temperature, top_p=p.top_p), stop_ids=stop,
            pad_id=ctx.policy_pad_id, min_bucket=p.min_prompt_bucket, mesh=ctx.mesh,
            # Row b*K + i of the step's batch draws by that id (config.per_row_keys).
            row_ids=(list(range(block.start * k, (block.start + len(ids)) * k))
                     if ctx.config.per_row_keys else None))
    # Rows b*K .. b*K+K-1 answer prompt b, so b is their GRPO group id (METHOD 11: by id).
    out = out.replace(group_ids=np.repeat(np.arange(block.start, block.stop, dtype=np.int32), k))
    texts = decode(model.tokenizer, out, set(stop.tolist()))
    return out, parallel.gather_texts(texts)[:n * k]


def decode(tokenizer, rollout: Rollout, stop_ids) -> list:
    """Completion texts of a rollout, stop tokens dropped."""
    out = []
    for row, mask in zip(rollout.tokens, rollout.mask):
        ids = [int(t) for t in row[mask] if int(t) not in stop_ids]
        out.append(tokenizer.decode(ids, skip_special_tokens=True))
    return out


def verify(ctx: Context, prompts, histories, responses, item_lists, timer: Timer,
           own: bool = False) -> np.ndarray:
    """Verdicts float32[R, M_max] for R (prompt, response, item list) triples, in the
    config's mode (`config.verifier.verdict`: hard 0/1 or soft P(yes); METHOD 11, 12) after
    its calibration (`config.verifier.calibration`). own=True: the triples are this
    process's own rows (`Verifier.p_yes(process_rows=True)`; every process calls)."""
    v = ctx.config.verifier
    with timer("verification"):
        p_yes = ctx.verifier.p_yes(ctx.roles.params("verifier"), prompts, responses,
                                   item_lists, history=histories, calibration=v.calibration,
                                   process_rows=own)
    return verdicts_from_p_yes(p_yes, v.verdict)


def own_items(n: int) -> np.ndarray:
    """Indices of this process's items among a step's n (prompts, anchor lists): the real
    ones of its `parallel.process_share` block, the block it sampled and generated rubric
    lists for. One process: all n. int64[n_p]."""
    count = jax.process_count()
    block = parallel.process_block(-(-n // count) * count)
    return np.arange(block.start, min(block.stop, n))


def gather_items(x) -> np.ndarray:
    """Every process's per-item values [n_p, ...] (its `own_items`), joined in item order:
    [n, ...] on every process (`parallel.gather_ragged`; the trailing shape must agree)."""
    return np.concatenate(parallel.gather_ragged(np.asarray(x)))


def verify_lists_on_sets(ctx: Context, rb, prompts, histories, sets, timer: Timer,
                         inputs=None) -> tuple[np.ndarray, np.ndarray]:
    """Verdicts of every response of each input's set on each of its G rubric lists, from
    ONE verifier call: a response is judged on the concatenation of its input's G lists
    (one shared prefix per response, `Verifier.p_yes`).

    Args:
        ctx: the phase context (its verifier and config.verifier settings, `verify`).
        rb: the inputs' `RubricBatch` (weights int32[B, G, M], texts B x G x M strings).
        prompts, histories: B prompts and history lists.
        sets: B lists of responses, ragged (N_b responses for input b).
        timer: gets the verifier's seconds under "verification".
        inputs: None (all B inputs), or int[B_p] this process's own inputs (`own_items`;
            every process calls, each judging its own inputs only).

    Returns:
        (verdicts float32[B', G, N_max, M], response_mask bool[B', N_max]) for the B' = B
        or B_p inputs, N_max over all B; verdicts are 0 at padded responses and items.
    """
    _, gl, m = rb.weights.shape
    sizes = np.array([len(s) for s in sets])
    n_max = int(sizes.max())
    idx = np.arange(len(sets)) if inputs is None else np.asarray(inputs, int)
    b = len(idx)
    # Query rows are the real cells of a [B', N_max] grid.
    real = np.arange(n_max)[None, :] < sizes[idx][:, None]                  # [B', N]
    flat_items = [[t for lst in rb.texts[i] for t in lst] for i in idx]
    qb, qj = np.nonzero(real)  # input (position in idx) and response j of each query row
    v = verify(ctx, [prompts[idx[i]] for i in qb], [histories[idx[i]] for i in qb],
               [sets[idx[i]][j] for i, j in zip(qb, qj)], [flat_items[i] for i in qb], timer,
               own=inputs is not None)
    v = fit_items(v, gl * m)
    grid = np.zeros((b, n_max, gl * m), np.float32)
    grid[qb, qj, :v.shape[1]] = v
    return grid.reshape(b, n_max, gl, m).transpose(0, 2, 1, 3), real


def rubric_stats(weights, item_mask, list_valid, verdicts) -> dict:
    """Rubric statistics of one step: parse-valid rate, items per valid list, weight
    histogram (weights 1..5), mean yes-rate (mean verdict: the mean P(yes) for soft
    verdicts), fraction of zero-variance items (every response got the same verdict, to
    1e-6: such an item separates nothing, Eq. 13).

    Args:
        weights: int32[R, M]; item_mask: bool[R, M]; list_valid: bool[R] (R rubric lists);
        verdicts: float32[R, K, M] verdicts on the responses each list judged.
    """
    item_mask = np.asarray(item_mask, bool) & np.asarray(list_valid, bool)[:, None]
    n_items = item_mask.sum()
    v = np.asarray(verdicts, np.float32)
    vbar = v.mean(axis=1)                                                 # [R, M]
    flat = (v.max(axis=1) - v.min(axis=1)) <= 1e-6
    hist = [int(((np.asarray(weights) == w) & item_mask).sum()) for w in range(1, 6)]
    return {
        "parse_valid_rate": float(np.mean(list_valid)),
        "items_per_list": float(n_items / max(1, np.sum(list_valid))),
        "weight_hist": hist,
        "yes_rate": float(vbar[item_mask].mean()) if n_items else 0.0,
        "zero_variance_item_fraction": float(flat[item_mask].mean()) if n_items else 0.0,
    }


def update(ctx: Context, role: Role, step: PhaseStep, global_step: int) -> dict:
    """One GRPO step (Eq. 23) of `role` on a rollout; returns host metrics. The frozen
    reference's log-probs (pi_ref) are computed inside the step (`train_step`).

    Raises:
        FloatingPointError: a non-finite metric, naming `global_step`.
    """
    rollout, advantages, timer = step.rollout, step.advantages, step.timer
    trainee = ctx.roles.trainee(role)
    # A global batch, rows over (data, fsdp), from every process's own rows (jit refuses
    # numpy under several processes).
    batch = parallel.put_process_rows(ts.batch_from_rollout(rollout, advantages), ctx.mesh,
                                      rollout.num_rows * jax.process_count())
    hostmem.release_free_memory()  # sampling/verification garbage, before the gradients
    with timer("update"):
        trainee.state, metrics = trainee.step_fn(trainee.state, batch,
                                                 trainee.reference_params)
        metrics = ts.check_finite(metrics, global_step)
    return metrics


# ----------------------------------------------------------------------------- phases


def _responses_and_rubrics(ctx: Context, key, items, num_lists: int, temperature: float,
                           static: bool, timer: Timer):
    """K policy responses per item (prompt or anchor example), then num_lists rubric lists
    per (x, C) from the current generator: (Rollout, K texts per item, RubricBatch). The
    key splits into the sampling key and the rubric key (the same split in every phase)."""
    k = ctx.config.policy.num_responses
    k_resp, k_rub = jax.random.split(key)
    prompts = [x.prompt for x in items]
    hists = [list(x.history) for x in items]
    rollout, responses = sample_responses(ctx, k_resp, prompts, hists, k, timer)
    sets = [responses[i * k:(i + 1) * k] for i in range(len(items))]  # C of item i
    with timer("rubric_generation"):
        rb = ctx.generator.generate_batch(
            ctx.roles.params(Role.GENERATOR), k_rub,
            [RubricInput(x, tuple(cs), tuple(h)) for x, cs, h in zip(prompts, sets, hists)],
            num_lists=num_lists, temperature=temperature, static=static)
    return rollout, sets, rb


def generator_rollout(ctx: Context, key, anchors) -> PhaseStep:
    """Algorithm 1, evaluator update: G rubric lists per (x, C), R_disc on C, R_anchor on
    the anchor list, advantage A_disc + lambda A_anchor (Eq. 13, 15, 24-25)."""
    c, g = ctx.config, ctx.config.generator
    timer = Timer()
    k = c.policy.num_responses
    _, sets, rb = _responses_and_rubrics(ctx, key, anchors, g.num_lists, g.temperature,
                                         False, timer)
    b, gl, m = rb.weights.shape
    n_anchor = np.array([len(a.responses) for a in anchors])  # A of each input (ragged)
    a_max = int(n_anchor.max())
    # Each process judges and rewards its own inputs (Bp of them); each input's C first,
    # then its anchor list: one verifier call judges both.
    mine = own_items(b)
    grid, _ = verify_lists_on_sets(ctx, rb, [a.prompt for a in anchors],
                                   [list(a.history) for a in anchors],
                                   [list(cs) + list(a.responses) for cs, a in zip(sets, anchors)],
                                   timer, inputs=mine)                      # [Bp, G, K+A, M]
    v_c, v_a = grid[:, :, :k], grid[:, :, k:]  # verdicts on C, on the anchor list
    anchor_mask = (np.arange(a_max)[None, :] < n_anchor[:, None])[mine]     # [Bp, A]
    # Padded anchor slots are masked out of Eq. 15 (anchor_mask), whatever rank they hold.
    gold = np.zeros((b, a_max), np.int32)
    for i, a in enumerate(anchors):
        gold[i, :n_anchor[i]] = a.gold_ranks
    gold = gold[mine]
    w, im, lv = rb.weights[mine], rb.item_mask[mine], rb.list_valid[mine]
    r_disc = np.asarray(rewards.discriminability_reward(v_c, w, im))        # [Bp, G]
    s_anchor, _ = rewards.rubric_scores(v_a, w, im)  # Eq. 12 on the anchor list, [Bp, G, A]
    # Every list of input b is scored on the same anchor list (gold, mask broadcast over G);
    # invalid lists get the Eq. 15 floor (METHOD 11).
    bp = len(mine)
    r_anchor = np.asarray(rewards.anchor_reward_or_floor(
        s_anchor, jnp.broadcast_to(gold[:, None], (bp, gl, a_max)),
        jnp.broadcast_to(anchor_mask[:, None], (bp, gl, a_max)), lv))
    # Eq. 24-25 normalise within each input's G lists; the metrics need every input.
    r_disc, r_anchor, v_c = (gather_items(x) for x in (r_disc, r_anchor, v_c))
    w, im, lv = rb.weights, rb.item_mask, rb.list_valid
    disc_weight, lam = VARIANT_WEIGHTS[c.variant]  # full objective or a METHOD 6 ablation
    # Row b * G + g: list g of input b (METHOD 11: by id), over the whole batch.
    ids = np.repeat(np.arange(b, dtype=np.int32), gl)
    adv, _, _ = adv_lib.generator_advantages_by_id(
        r_disc.reshape(-1), r_anchor.reshape(-1), g.lam if lam is None else lam, ids, b,
        disc_weight=disc_weight)
    adv = np.asarray(adv)  # [B * G], every input's lists
    metrics = dict(
        r_disc=float(r_disc.mean()), r_anchor=float(r_anchor.mean()),
        r_disc_std=_mean_spread(r_disc.reshape(-1), ids, b),
        r_anchor_std=_mean_spread(r_anchor.reshape(-1), ids, b),
        # A group trains nothing when its combined advantage (Eq. 25) is zero everywhere.
        flat_group_fraction=float(np.mean(np.all(adv.reshape(b, gl) == 0, axis=1))),
        **rubric_stats(w.reshape(b * gl, m), im.reshape(b * gl, m), lv.reshape(-1),
                       v_c.reshape(b * gl, k, m)))
    return PhaseStep(rb.rollout, process_part(adv, rb.rollout, gl), metrics, timer)


def policy_rollout(ctx: Context, key, items) -> PhaseStep:
    """Algorithm 1, policy update: K responses per prompt, one rubric list from the fixed
    generator (prompt-only for the `static` variant), scores E (Eq. 12), group advantages
    (Eq. 21) by prompt id."""
    c, p = ctx.config, ctx.config.policy
    timer = Timer()
    k = p.num_responses
    rollout, sets, rb = _responses_and_rubrics(ctx, key, items, 1, p.rubric_temperature,
                                               c.variant == "static", timer)
    prompts = [x.prompt for x in items]
    hists = [list(x.history) for x in items]
    responses = [y for cs in sets for y in cs]  # B*K, grouped by prompt
    b, m = len(items), rb.weights.shape[-1]
    # Each process judges and scores the responses of its own prompts (Bp of them).
    mine = own_items(b)
    v = verify(ctx, [prompts[i] for i in mine for _ in range(k)],
               [hists[i] for i in mine for _ in range(k)],
               [responses[i * k + j] for i in mine for j in range(k)],
               [rb.texts[i][0] for i in mine for _ in range(k)], timer, own=True)
    v = fit_items(v, m).reshape(len(mine), k, m)  # [Bp, K, M]
    # Eq. 12; an invalid list scores every response 0, so its group is flat (METHOD 11).
    scores, valid = rewards.rubric_scores(v, rb.weights[mine, 0], rb.item_mask[mine, 0])
    # The metrics (and the trace) read every prompt's scores and verdicts: [B, K], [B, K, M].
    scores, valid, v = (gather_items(x) for x in (np.asarray(scores), np.asarray(valid), v))
    # Group ids of the whole batch (rollout holds this process's rows only).
    adv, metrics = _policy_advantages(scores.reshape(-1), np.repeat(np.arange(b), k), b)
    metrics.update(
        rubric_invalid_fraction=float(1 - np.mean(valid)),
        **rubric_stats(rb.weights[:, 0], rb.item_mask[:, 0], rb.list_valid[:, 0], v))
    trace = [
        {"prompt": prompts[i], "responses": sets[i],
         "items": [t for t, on in zip(rb.texts[i][0], rb.item_mask[i, 0]) if on],
         "weights": [int(w) for w, on in zip(rb.weights[i, 0], rb.item_mask[i, 0]) if on],
         "verdicts": [[round(float(x), 3) for x, on in zip(v[i, j], rb.item_mask[i, 0])
                       if on] for j in range(k)],
         "scores": [float(s) for s in scores[i]], "valid": bool(rb.list_valid[i, 0])}
        for i in range(min(b, c.log.trace_prompts))]
    return PhaseStep(rollout, process_part(adv, rollout, k), metrics, timer, trace)


def rule_policy_rollout(ctx: Context, key, items,
                        reward_fn: Callable[[Any, str], float]) -> PhaseStep:
    """Plain GRPO baseline: the same sampling as `policy_rollout`, with a cheap rule reward
    `reward_fn(prompt_item, response) -> float` instead of rubrics (Eq. 21 advantages)."""
    timer = Timer()
    k = ctx.config.policy.num_responses
    rollout, responses = sample_responses(
        ctx, key, [x.prompt for x in items], [list(x.history) for x in items], k, timer)
    with timer("reward"):
        # Each process scores its own rows (row j*K + i answers prompt group_ids[j*K]), and
        # the scores are gathered: the advantages need whole groups, the metrics all rows.
        mine = np.array([reward_fn(items[g], responses[g * k + i % k])
                         for i, g in enumerate(rollout.group_ids)], np.float32)
        scores = parallel.gather_rows(mine) if ctx.mesh is not None else mine
    adv, metrics = _policy_advantages(scores, np.repeat(np.arange(len(items)), k), len(items))
    trace = [{"prompt": items[i].prompt, "responses": responses[i * k:(i + 1) * k],
              "scores": [float(s) for s in scores[i * k:(i + 1) * k]]}
             for i in range(min(len(items), ctx.config.log.trace_prompts))]
    return PhaseStep(rollout, process_part(adv, rollout, k), metrics, timer, trace)


def _policy_advantages(scores, group_ids, num_groups: int) -> tuple[np.ndarray, dict]:
    """Eq. 21 advantages of R policy rewards grouped by prompt id, and their metrics: the
    mean finite reward, flat-group fraction, mean group std (Eq. 21's divisor), unscorable
    (non-finite) fraction and each group's mean reward (`group_mean_rewards`, float[B]:
    the unit a learning curve's confidence interval resamples)."""
    adv, flat = adv_lib.group_advantages_by_id(scores, group_ids, num_groups)
    r = np.asarray(scores, np.float64)
    ok = np.isfinite(r)
    sums = np.bincount(group_ids[ok], r[ok], minlength=num_groups)
    counts = np.bincount(group_ids[ok], minlength=num_groups)
    return np.asarray(adv), dict(
        policy_reward=float(r[ok].mean()) if ok.any() else 0.0,
        flat_group_fraction=float(np.mean(flat)),
        reward_std=_mean_spread(scores, group_ids, num_groups),
        unscorable_fraction=float(np.mean(~ok)),
        group_mean_rewards=np.where(counts > 0, sums / np.maximum(counts, 1), np.nan))


def _mean_spread(r, group_ids, num_groups) -> float:
    """Mean over non-flat groups of the std Eq. 21 divided their rewards by (0 if none)."""
    std = np.asarray(adv_lib.group_std_by_id(r, group_ids, num_groups))
    return float(std[std > 0].mean()) if np.any(std > 0) else 0.0


def process_part(values, rollout: Rollout, per_group: int) -> np.ndarray:
    """The entries of a per-row array of the whole batch (row b * per_group + j: the j-th
    row of group b) for the rows of `rollout` (this process's rows, grouped, group id =
    b): the advantages this process trains on. One process: all of them."""
    j = np.arange(rollout.num_rows) % per_group
    return np.asarray(values)[rollout.group_ids * per_group + j]


def fit_items(v: np.ndarray, m: int) -> np.ndarray:
    """Verdicts [R, M_v] cut or zero-padded to M items."""
    return v[:, :m] if v.shape[1] >= m else np.pad(v, ((0, 0), (0, m - v.shape[1])))


def heldout_metrics(ctx: Context, key, anchors) -> dict:
    """Delta_gap (Eq. 2) and R_anchor (Eq. 15) of the current generator + verifier on the
    held-out anchor lists: one rubric list from (x, C_anchor) per list, decoded at
    config.policy.heldout_temperature (0 = greedy) with a fixed key per round."""
    if not anchors:
        return {}
    timer = Timer()
    rb = ctx.generator.generate_batch(
        ctx.roles.params(Role.GENERATOR), key,
        # The anchor list itself is the response set C shown to the generator (nothing sampled).
        [RubricInput(a.prompt, tuple(a.responses), tuple(a.history)) for a in anchors],
        num_lists=1, temperature=ctx.config.policy.heldout_temperature,
        static=ctx.config.variant == "static")
    m = rb.weights.shape[-1]
    gaps, r_anch = [], []
    # Each process judges its own anchor lists, in one call (a collective: the same number
    # of calls on every process); the means are over all of them.
    mine = [(i, anchors[i], len(anchors[i].responses)) for i in own_items(len(anchors))]
    rows = [(i, a, y) for i, a, _ in mine for y in a.responses]
    v_all = fit_items(verify(ctx, [a.prompt for _, a, _ in rows],
                             [list(a.history) for _, a, _ in rows], [y for _, _, y in rows],
                             [rb.texts[i][0] for i, _, _ in rows], timer, own=True), m)
    starts = np.cumsum([0] + [n for _, _, n in mine])
    for (i, a, n), s0 in zip(mine, starts):
        v = v_all[s0:s0 + n]
        s, _ = rewards.rubric_scores(v, rb.weights[i, 0], rb.item_mask[i, 0])
        gold = jnp.asarray(a.gold_ranks)
        gap, _ = rewards.delta_gap(s, gold)
        gaps.append(float(gap))
        r_anch.append(float(rewards.anchor_reward_or_floor(
            s, gold, jnp.ones(n, bool), rb.list_valid[i, 0])))
    gaps, r_anch = gather_items(np.asarray(gaps, np.float64)), gather_items(
        np.asarray(r_anch, np.float64))
    return {"delta_gap": float(np.mean(gaps)), "heldout_r_anchor": float(np.mean(r_anch)),
            "heldout_parse_valid_rate": float(np.mean(rb.list_valid)),
            "seconds_eval": sum(timer.seconds.values())}

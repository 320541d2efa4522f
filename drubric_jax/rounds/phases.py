"""One step of each phase of Algorithm 1 (METHOD section 5), as functions.

A rollout function samples, scores and returns a `PhaseStep`: the rows to train on, one
advantage per row, and the step's reward and rubric statistics. Every formula is a call into
`rl` (Eq. 12, 13, 15, 21, 24-25); nothing here re-derives one. `update` then takes one GRPO
step (Eq. 23) of a trainee on those rows.

    generator_rollout   evaluator update, policy fixed: G rubric lists per (x, C), every
                        reward of `rl.generator_rewards` (R_disc on C, R_anchor on the
                        anchor list), A = sum_n w_n A_n (Eq. 24-25; A_disc + lambda A_anchor)
    policy_rollout      policy update, generator fixed: K responses, one rubric list,
                        scores E (Eq. 12), group advantages by prompt id (Eq. 21)
    rule_policy_rollout the plain GRPO baseline: the same sampling with a rule reward

The context and step types are in `rounds.context`, the verifier calls in `rounds.judging`,
the multi-process bookkeeping in `rounds.process_items`, the metrics in
`rounds.step_metrics` and the held-out evaluation in `rounds.heldout`.

Axis legend (docs/CONVENTIONS.md): B prompts or anchor examples, K responses per prompt,
G rubric lists per (x, C), M items, A anchor responses, R rows.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from drubric_jax import parallel, sampling
from drubric_jax.evaluator.rubric_generator import RubricInput
from drubric_jax.rl import advantages as adv_lib
from drubric_jax.rl import generator_rewards, rewards, train_step
from drubric_jax.rounds import hostmem
from drubric_jax.rounds.context import Context, PhaseStep, Timer
from drubric_jax.rounds.judging import fit_items, verify, verify_lists_on_sets
from drubric_jax.rounds.process_items import gather_items, own_items, process_part
from drubric_jax.rounds.step_metrics import (constraint_metrics, generator_reward_metrics,
                                             gold_metrics, item_rate_metrics,
                                             policy_reward_metrics, rubric_stats,
                                             verifier_moe_metrics)
from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.text.budget import fit_prompt
from drubric_jax.types import Role, Rollout


# ----------------------------------------------------------------------------- sampling and update


def policy_prompt_ids(tokenizer, prompt: str, history: Sequence[dict], budget: int) -> list:
    """Policy chat prompt ids (history + request, assistant turn opened) within `budget`
    tokens (METHOD 4: the paper's 8K policy input)."""
    def render(request, hist, _):
        return tok_lib.chat_ids(tokenizer, hist + [{"role": "user", "content": request}])

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
    model, pol = ctx.roles.policy.model, ctx.settings.policy
    stop = ctx.policy_stop_ids
    n = len(prompts)
    block, rows = parallel.process_share(prompts, histories)
    ids = [policy_prompt_ids(model.tokenizer, x, h, pol.max_prompt_tokens)
           for x, h in zip(*rows)]
    rows_ids = [i for i in ids for _ in range(k)]  # a prompt's K rows are consecutive
    kw = dict(key=key, max_new_tokens=pol.max_new_tokens,
              method=sampling.method_from_flags(pol.temperature, top_p=pol.top_p),
              stop_ids=stop, pad_id=ctx.policy_pad_id, min_bucket=pol.min_prompt_bucket,
              mesh=ctx.mesh,
              # Row b*K + i of the step's batch draws by that id (config.per_row_keys).
              row_ids=(list(range(block.start * k, (block.start + len(ids)) * k))
                       if ctx.settings.per_row_keys else None))
    # The trainee's config: with LoRA its adapters act only under its lora scale (the
    # source's config has none, and would sample from the base alone).
    weights = ctx.roles.rollout_params(Role.POLICY, ctx.mesh) if params is None else params
    cfg = ctx.roles.rollout_cfg(Role.POLICY)
    with timer("sampling"):
        if pol.sampler == "engine":
            out = sampling.generate_engine(weights, cfg, rows_ids, num_slots=sampling.engine_slots(
                pol.rollout_micro_batch, len(rows_ids), ctx.mesh), **kw)
        else:
            out = sampling.generate_chunked(weights, cfg, rows_ids, pol.rollout_micro_batch,
                                            cache_segments=pol.cache_segments, **kw)
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


def all_groups_flat(step: PhaseStep) -> bool:
    """Whether every GRPO group of the step is flat, so every advantage is exactly 0 (Eq. 21,
    Eq. 25) and the update would change nothing. Read from the step's global
    `flat_group_fraction` (computed from every process's gathered rewards), so all
    processes of a run take the same decision."""
    return step.metrics.get("flat_group_fraction", 0.0) == 1.0


def update(ctx: Context, role: Role, step: PhaseStep, global_step: int) -> dict:
    """One GRPO step (Eq. 23) of `role` on a rollout; returns host metrics. The frozen
    reference's log-probs (pi_ref) are computed inside the step (`train_step`).

    The batch is the rollout's live groups (`train_batch`): with the trainee's
    `shared_prefix` (the default) each group's prompt runs once beside its rows and the
    flat groups are cut out; without it a row per response, flat rows masked.

    A step whose groups are all flat (`all_groups_flat`) is not sent to the train step at
    all: it would leave the state exactly as it is (`train_step.train_step`) after a full
    forward and backward. Its metrics are then those the train step gives a batch with no
    active row: update_skipped = 1, active_rows = num_tokens = 0, and loss, pg_loss, kl,
    grad_norm, update_norm, clip_fraction all 0 (so every train row has the same keys).
    Either way `rollout_truncated_fraction` is the share of all the step's sampled rows cut
    at the budget (the train step's `truncated_fraction` counts the update's rows only).

    Raises:
        FloatingPointError: a non-finite metric, naming `global_step`.
    """
    # Of every sampled row of the step (all processes), before the flat groups are cut.
    truncated = np.asarray(step.rollout.truncated, np.float32)
    sampled = {"rollout_truncated_fraction": float(np.mean(
        parallel.gather_rows(truncated) if ctx.mesh is not None else truncated))}
    if all_groups_flat(step):
        return {"update_skipped": 1.0, "active_rows": 0.0, "num_tokens": 0.0,
                **dict.fromkeys(("loss", "pg_loss", "kl", "grad_norm", "update_norm",
                                 "clip_fraction"), 0.0), **sampled}
    trainee = ctx.roles.trainee(role)
    batch, rows = train_batch(step, trainee.train_config, ctx.mesh)
    # A global batch, rows (groups) over (data, fsdp), from every process's own (jit refuses
    # numpy under several processes).
    batch = parallel.put_process_rows(batch, ctx.mesh, rows)
    hostmem.release_free_memory()  # sampling/verification garbage, before the gradients
    with step.timer("update"):
        trainee.state, metrics = trainee.step_fn(trainee.state, batch,
                                                 trainee.reference_params)
        metrics = train_step.check_finite(metrics, global_step)
    return {**metrics, **sampled}


def train_batch(step: PhaseStep, train_cfg, mesh) -> tuple:
    """(this process's part of the step's batch, the global batch's leading size).

    With `train_cfg.shared_prefix`: a `train_step.GroupBatch` of this process's live groups,
    each split into packed rows of R' rows (`train_step.rows_per_pass`: whole groups when
    the step's groups fill the row shards and `group_rows` allows), padded to the smallest
    `train_step.group_buckets` count that holds every process's (one compiled update per
    count); counts are multiples of this process's row shards, and of a micro-batch's
    groups when they exceed one micro-batch. Else the per-row `train_step.Batch` of all its
    rows.

    Raises:
        ValueError: a micro-batch's groups divide no bucket count (names the field).
    """
    rollout, live = step.rollout, step.live
    if not train_cfg.shared_prefix:
        return (train_step.batch_from_rollout(rollout, step.advantages, live),
                rollout.num_rows * jax.process_count())
    ids = np.asarray(rollout.group_ids)
    groups = len(np.unique(ids))
    r = rollout.num_rows // max(groups, 1)
    shards = 1 if mesh is None else max(parallel.row_shards(mesh) // jax.process_count(), 1)
    rp = train_step.rows_per_pass(r, groups, shards, train_cfg.group_rows)
    per_micro = max(1, train_cfg.micro_batch_size // rp)
    # Every process pads to the same count: the most live packed rows any process holds.
    most = max(parallel.agree_max(len(np.unique(ids[live])) * (r // rp)), 1)
    counts = [c for c in train_step.group_buckets(groups * (r // rp), shards)
              if c >= most and (c <= per_micro or c % per_micro == 0)]
    if not counts:
        raise ValueError(f"train.micro_batch_size={train_cfg.micro_batch_size}: {per_micro} "
                         f"groups of {rp} rows a micro-batch divide no batch of "
                         f"{groups * (r // rp)} groups padded to the {shards} row shards")
    batch = train_step.group_batch(rollout, step.advantages, live, counts[0], rp)
    return batch, counts[0] * jax.process_count()


# ----------------------------------------------------------------------------- phases


def _responses_and_rubrics(ctx: Context, key, items, num_lists: int, temperature: float,
                           static: bool, timer: Timer):
    """K policy responses per item (prompt or anchor example), then num_lists rubric lists
    per (x, C) from the current generator: (Rollout, K texts per item, RubricBatch). The
    key splits into the sampling key and the rubric key (the same split in every phase)."""
    k = ctx.settings.policy.num_responses
    k_resp, k_rub = jax.random.split(key)
    prompts = [x.prompt for x in items]
    hists = [list(x.history) for x in items]
    rollout, responses = sample_responses(ctx, k_resp, prompts, hists, k, timer)
    sets = [responses[i * k:(i + 1) * k] for i in range(len(items))]  # C of item i
    with timer("rubric_generation"):
        rb = ctx.generator.generate_batch(
            ctx.roles.rollout_params(Role.GENERATOR, ctx.mesh), k_rub,
            [RubricInput(x, tuple(cs), tuple(h)) for x, cs, h in zip(prompts, sets, hists)],
            num_lists=num_lists, temperature=temperature, static=static)
    return rollout, sets, rb


def generator_rollout(ctx: Context, key, anchors) -> PhaseStep:
    """Algorithm 1, evaluator update: G rubric lists per (x, C), every generator reward of
    `rl.generator_rewards` (R_disc on C, R_anchor on the anchor list, Eq. 13, 15), and the
    advantage sum_n w_n A_n of their group-normalised advantages (Eq. 24-25; the paper's
    A_disc + lambda A_anchor), with the weights of `config.variant`."""
    st, gen = ctx.settings, ctx.settings.generator
    timer = Timer()
    k = st.policy.num_responses
    _, sets, rb = _responses_and_rubrics(ctx, key, anchors, gen.num_lists, gen.temperature,
                                         False, timer)
    b, g, m = rb.weights.shape
    anchor_sizes = np.array([len(a.responses) for a in anchors])  # A of each input (ragged)
    a_max = int(anchor_sizes.max())
    # Each process judges and rewards its own inputs (Bp of them); each input's C first,
    # then its anchor list: one verifier call judges both.
    mine = own_items(b)
    vstats: dict = {}  # the verifier's counters (router load of a mixture of experts)
    grid, _ = verify_lists_on_sets(ctx, rb, [a.prompt for a in anchors],
                                   [list(a.history) for a in anchors],
                                   [list(cs) + list(a.responses) for cs, a in zip(sets, anchors)],
                                   timer, inputs=mine, stats=vstats)        # [Bp, G, K+A, M]
    # Padded anchor slots are masked out of Eq. 15 (anchor_mask), whatever rank they hold.
    gold = np.zeros((b, a_max), np.int32)
    for i, a in enumerate(anchors):
        gold[i, :anchor_sizes[i]] = a.gold_ranks
    inputs = generator_rewards.RewardInputs(
        verdicts=grid[:, :, :k], anchor_verdicts=grid[:, :, k:],  # on C, on the anchor list
        weights=rb.weights[mine], item_mask=rb.item_mask[mine],
        list_valid=rb.list_valid[mine], gold_ranks=gold[mine],
        anchor_mask=(np.arange(a_max)[None, :] < anchor_sizes[:, None])[mine])
    # Eq. 24-25 normalise within each input's G lists; the metrics need every input.
    values = {name: gather_items(r)                                          # [B, G] each
              for name, r in generator_rewards.generator_rewards(inputs).items()}
    verdicts_c = gather_items(inputs.verdicts)                               # [B, G, K, M]
    # Row b * G + g: list g of input b (METHOD 11: by id), over the whole batch.
    ids = np.repeat(np.arange(b, dtype=np.int32), g)
    weights = gen.weights
    adv, flats = adv_lib.generator_advantages_by_id(
        {name: r.reshape(-1) for name, r in values.items()}, weights, ids, b)
    adv = np.asarray(adv)  # [B * G], every input's lists
    # An input's lists train nothing when every reward that weighs in is flat there.
    flat = np.asarray(adv_lib.combined_flat(flats, weights))                # [B]
    metrics = dict(
        **generator_reward_metrics(values, ids, b),
        flat_group_fraction=float(np.mean(flat)),
        **rubric_stats(rb.weights.reshape(b * g, m), rb.item_mask.reshape(b * g, m),
                       rb.list_valid.reshape(-1), verdicts_c.reshape(b * g, k, m)),
        **verifier_moe_metrics(vstats))
    if _checks_world(ctx):  # METHOD 13: gold of the samples, the lists' constraint recovery
        truth = _true_checks(ctx, anchors)
        metrics.update(**gold_metrics(truth, sets, loose=st.verifier.loose),
                       **constraint_metrics([t for lists in rb.texts for t in lists],
                                            rb.item_mask.reshape(b * g, m),
                                            [t for t in truth for _ in range(g)]),
                       **item_rate_metrics(rb.counters))
    return PhaseStep(rb.rollout, process_part(adv, rb.rollout, g),
                     train_step.live_rows(rb.rollout.group_ids, flat), metrics, timer)


def policy_rollout(ctx: Context, key, items) -> PhaseStep:
    """Algorithm 1, policy update: K responses per prompt, one rubric list from the fixed
    generator (prompt-only for the `static` variant), scores E (Eq. 12), group advantages
    (Eq. 21) by prompt id. The lists are decoded at the list temperature
    (config.policy.rubric_temperature)."""
    st = ctx.settings
    timer = Timer()
    k = st.policy.num_responses
    rollout, sets, rb = _responses_and_rubrics(ctx, key, items, 1, st.policy.rubric_temperature,
                                               st.variant == "static", timer)
    prompts = [x.prompt for x in items]
    hists = [list(x.history) for x in items]
    responses = [y for cs in sets for y in cs]  # B*K, grouped by prompt
    b, m = len(items), rb.weights.shape[-1]
    # Each process judges and scores the responses of its own prompts (Bp of them).
    mine = own_items(b)
    vstats: dict = {}  # the verifier's counters (router load of a mixture of experts)
    v = verify(ctx, [prompts[i] for i in mine for _ in range(k)],
               [hists[i] for i in mine for _ in range(k)],
               [responses[i * k + j] for i in mine for j in range(k)],
               [rb.texts[i][0] for i in mine for _ in range(k)], timer, own=True, stats=vstats)
    v = fit_items(v, m).reshape(len(mine), k, m)  # [Bp, K, M]
    # Eq. 12; an invalid list scores every response 0, so its group is flat (METHOD 11).
    scores, valid = rewards.rubric_scores(v, rb.weights[mine, 0], rb.item_mask[mine, 0])
    # The metrics (and the trace) read every prompt's scores and verdicts: [B, K], [B, K, M].
    scores, valid, v = (gather_items(x) for x in (np.asarray(scores), np.asarray(valid), v))
    # Group ids of the whole batch (rollout holds this process's rows only).
    adv, flat, metrics = _policy_advantages(scores.reshape(-1), np.repeat(np.arange(b), k), b)
    metrics.update(
        rubric_invalid_fraction=float(1 - np.mean(valid)),
        **rubric_stats(rb.weights[:, 0], rb.item_mask[:, 0], rb.list_valid[:, 0], v),
        **verifier_moe_metrics(vstats))
    if _checks_world(ctx):  # METHOD 13: gold beside the proxy score trained on
        truth = _true_checks(ctx, items)
        metrics.update(**gold_metrics(truth, sets, scores, st.verifier.loose),
                       **constraint_metrics([lists[0] for lists in rb.texts], rb.item_mask[:, 0],
                                            truth),
                       **item_rate_metrics(rb.counters))
    # An item as the reader knows it: a check shows the checker's sentence.
    shown = ctx.generator.fmt.display if _checks_world(ctx) else (lambda t: t)
    trace = [
        {"prompt": prompts[i], "responses": sets[i],
         "items": [shown(t) for t, on in zip(rb.texts[i][0], rb.item_mask[i, 0]) if on],
         "weights": [int(w) for w, on in zip(rb.weights[i, 0], rb.item_mask[i, 0]) if on],
         "verdicts": [[round(float(x), 3) for x, on in zip(v[i, j], rb.item_mask[i, 0])
                       if on] for j in range(k)],
         "scores": [float(s) for s in scores[i]], "valid": bool(rb.list_valid[i, 0])}
        for i in range(min(b, st.log.trace_prompts))]
    return PhaseStep(rollout, process_part(adv, rollout, k),
                     train_step.live_rows(rollout.group_ids, flat), metrics, timer, trace)


def rule_policy_rollout(ctx: Context, key, items,
                        reward_fn: Callable[[Any, str], float]) -> PhaseStep:
    """Plain GRPO baseline: the same sampling as `policy_rollout`, with a cheap rule reward
    `reward_fn(prompt_item, response) -> float` instead of rubrics (Eq. 21 advantages)."""
    timer = Timer()
    k = ctx.settings.policy.num_responses
    rollout, responses = sample_responses(
        ctx, key, [x.prompt for x in items], [list(x.history) for x in items], k, timer)
    with timer("reward"):
        # Each process scores its own rows (row j*K + i answers prompt group_ids[j*K]), and
        # the scores are gathered: the advantages need whole groups, the metrics all rows.
        own_scores = np.array([reward_fn(items[b], responses[b * k + i % k])
                               for i, b in enumerate(rollout.group_ids)], np.float32)
        scores = parallel.gather_rows(own_scores) if ctx.mesh is not None else own_scores
    adv, flat, metrics = _policy_advantages(scores, np.repeat(np.arange(len(items)), k),
                                            len(items))
    trace = [{"prompt": items[i].prompt, "responses": responses[i * k:(i + 1) * k],
              "scores": [float(s) for s in scores[i * k:(i + 1) * k]]}
             for i in range(min(len(items), ctx.settings.log.trace_prompts))]
    return PhaseStep(rollout, process_part(adv, rollout, k),
                     train_step.live_rows(rollout.group_ids, flat), metrics, timer, trace)


def _checks_world(ctx: Context) -> bool:
    """Whether items are checks (`config.verifier.kind = "checks"`, METHOD 13)."""
    return ctx.settings.verifier.kind == "checks"


def _true_checks(ctx: Context, items) -> list:
    """T(x) of each item (a prompt or an anchor list): its `meta["checks"]`, else the run's
    prompt of the same text (`Context.true_checks`; anchor lists carry no meta), else None."""
    return [(getattr(x, "meta", None) or {}).get("checks") or ctx.true_checks.get(x.prompt)
            for x in items]


def _policy_advantages(scores, group_ids, num_groups: int) -> tuple:
    """Eq. 21 advantages float32[R] of R policy rewards grouped by prompt id, each group's
    flat flag bool[num_groups], and their metrics (`step_metrics.policy_reward_metrics`)."""
    adv, flat = adv_lib.group_advantages_by_id(scores, group_ids, num_groups)
    flat = np.asarray(flat)
    return np.asarray(adv), flat, policy_reward_metrics(scores, group_ids, num_groups, flat)

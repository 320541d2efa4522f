"""Time of a round's device work from FLOPs and bytes against a target's peaks.

Each step of Algorithm 1 is counted from the config (`memory.costs`): the sampler's prefill
(FLOPs) and decode (per step, the larger of the bytes it reads, weights + the KV cache of
its segment, over the HBM bandwidth and its FLOPs over the peak), the verifier's prefix and
suffix passes (FLOPs) and the GRPO update (FLOPs; `update_tokens`: in groups that share a
prefix, P + R N tokens a group, where the trainee's `shared_prefix` says so, else per row,
R (P + N); the other layout is printed beside it for comparison, outside the step's total).
`roofline_s` is the time at the target's vendor peaks,
a lower bound; `expected_s` divides it by the efficiency measured on one H200
(`MEASURED_EFFICIENCY`, results/device_check_h200_2026-12-04), carried to other targets as
an assumption. Not counted: host work (tokenising, llguidance masks: 8% of a constrained
step there), the held-out evaluation, checkpoints, the rollout weight copy, collectives.
Rows run to N new tokens unless the config gives their length distribution
(`response_lengths`, quantiles; `experiments.plan --lengths_from` reads a run's): then
the decode steps are counted from it, for the static sampler and for the engine.

Sampling runs as the config says: `rollout_micro_batch` rows per sampler call (0 = all),
the call's rows split over the devices of the data and fsdp axes, every call reading the
whole model once per decode step (`parallel.decode_rules`: the rollout copy is split only
over the tensor axis).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import ml_collections
import numpy as np

from drubric_jax.memory.costs import (Target, causal_pairs, forward_flops, kv_bytes,
                                      weight_bytes)
from drubric_jax.memory.train_terms import padded_groups
from drubric_jax.rl.batches import rows_per_pass
from drubric_jax.sampling.buckets import cache_schedule, mean_slots_read
from drubric_jax.sampling.lengths import (engine_steps, parse_lengths, row_lengths,
                                          static_steps)

# Fractions of the vendor peaks reached on one H200 (jax 0.11.2, 2026-12-04, the device
# check at this code: results/device_check_h200_2026-12-04/final_quick.log): decode
# 53.3-56.5% of the HBM bandwidth, prefill 52.6-55.4% MFU, a LoRA GRPO step of 8K tokens
# 35.9% MFU.
MEASURED_EFFICIENCY = {"decode": 0.55, "prefill": 0.54, "update": 0.36}

# Public figures to set the estimates beside (their sources' numbers, not ours).
ANCHORS = (
    "NeMo RL GRPO, Llama-3.1-8B on 16 x H100: 97.7 s a step, 1,562 tokens/s/GPU",
    "Qwen3-8B serving on one H100: about 13.3k output tokens/s at 128 in / 1,024 out",
)


@dataclasses.dataclass(frozen=True)
class PhaseTime:
    """One step's device work: FLOPs and HBM bytes over all devices, and its seconds."""

    phase: str        # "generator step" | "policy step"
    name: str         # e.g. "policy sampling: decode"
    kind: str         # "prefill" | "decode" | "update": which measured efficiency applies
    flops: float
    hbm_bytes: float
    roofline_s: float
    counted: bool = True  # in the step's total (False: a layout shown for comparison)

    @property
    def expected_s(self) -> float:
        return self.roofline_s / MEASURED_EFFICIENCY[self.kind]


def _sampling(phase, name, cfg, rows, prompt, new, per_call, devices, tensor, target,
              segments=0, sampler="static", lengths="", k=1, slots=None):
    """Prefill and decode of `rows` rows (prompt bucket P, N new) in calls of `per_call`,
    or with `sampler` = "engine" in `per_call` slots, each prompt (K rows) prefilled once.

    Decode steps: every call to N (`lengths` ""), or counted from the response-length
    quantiles `lengths` (`parse_lengths`): a static call runs to its longest row, the
    engine to its last row's end (`static_steps`, `engine_steps`). A static decode step
    reads the slots of its cache segment (`sampling.cache_schedule` as `generate` picks
    it: "auto", per-layer caches on GPU, stacked on TPU), on average
    `sampling.mean_slots_read` of them: P + N with one segment, P + 0.67 N with four. The
    engine runs `slots` slots (the planner's pick for the device memory; None: the
    config's `per_call`) and a step reads each slot's live tokens only (`models.paged`):
    its prompt and what it has written, on average P + E[n^2] / (2 E[n]) over a row's
    steps for lengths n (P + N / 2 when every row runs to N), with every slot busy.
    """
    if sampler == "engine" and slots:
        per_call = slots
    per_call = rows if per_call <= 0 else min(per_call, rows)
    calls = math.ceil(rows / per_call)
    ways = max(devices // tensor, 1)                      # data x fsdp: rows split this way
    prefills = rows // k if sampler == "engine" else rows
    pre = forward_flops(cfg, prefills * prompt, prefills * causal_pairs(prompt), prefills)
    out = [PhaseTime(phase, f"{name}: prefill ({prefills} prompts)", "prefill", pre, 0.0,
                     pre / (devices * target.tflops * 1e12))]
    # Every call reads the weights once a step on each device (split over tensor only) and
    # its rows' cache up to the end of the step's segment.
    per_layer = not target.name.startswith("TPU")  # `models.per_layer_decode`
    points = parse_lengths(lengths, new)
    if sampler == "engine":
        lens = row_lengths(points, rows).astype(float) if points else np.full(rows, new, float)
        read = prompt + float((lens ** 2).mean() / (2 * lens.mean()))
    else:
        read = mean_slots_read(cache_schedule(prompt, new, segments, per_layer), prompt, new)
    step_bytes = (weight_bytes(cfg) + kv_bytes(cfg, per_call / ways, read)) / tensor
    step_flops = forward_flops(cfg, per_call / ways, per_call / ways * read,
                               per_call / ways) / tensor
    step_s = max(step_bytes / (target.tbps * 1e12), step_flops / (target.tflops * 1e12))
    if points:
        lens = row_lengths(points, rows)
        steps = (engine_steps(lens, per_call) if sampler == "engine"
                 else static_steps(lens, per_call))
        label = f"{name}: decode ({sampler}, {steps:,} steps, length p50 {np.median(lens):.0f})"
    else:
        steps = calls * new
        label = f"{name}: decode ({sampler}, {calls} x {new} steps: every row to N)"
    if sampler == "engine":
        label = label[:-1] + f"; {per_call} slots, {read:,.0f} live tokens a slot)"
    out.append(PhaseTime(phase, label, "decode", step_flops * devices * steps,
                         step_bytes * devices * steps, step_s * steps))
    return out


def update_tokens(rows: int, prompt: int, new: int, group: int = 0,
                  shards: int = 1) -> tuple:
    """(tokens, attended (query, key) pairs, scored positions) of one forward of a GRPO
    update on `rows` rows of a P = `prompt` prefix and N = `new` completion tokens.

    Per row (group 0): R (P + N) tokens, R causal(P + N) pairs. Grouped (`group` = R rows a
    group sharing the prefix, `train_step.GroupBatch`; groups padded to the `shards` row
    shards as `rounds.phases.train_batch` pads them, every group live): Gn (P + R N)
    tokens; pairs Gn (causal(P) + R (N P + causal(N))): the prefix once, each suffix over
    the prefix and causally over itself (`models.attention.attend_shared_prefix`). Either
    way the output head scores the R N completion positions (the prompt is never scored).
    """
    if not group:
        return rows * (prompt + new), rows * causal_pairs(prompt + new), rows * new
    groups = padded_groups(rows, group, shards)
    return (groups * (prompt + group * new),
            groups * (causal_pairs(prompt) + group * (new * prompt + causal_pairs(new))),
            groups * group * new)


def _update(phase, name, cfg, rows, prompt, new, group, lora, remat, reference, devices,
            tensor, target, counted=True):
    """A GRPO update of `rows` rows (`update_tokens`: per row, or in groups of `group`):
    backward 2x the forward (1x with LoRA: no weight gradients of frozen matrices), a
    recomputed forward with remat, and the reference's forward when beta > 0."""
    tokens, pairs, scored = update_tokens(rows, prompt, new, group, max(devices // tensor, 1))
    fwd = forward_flops(cfg, tokens, pairs, scored)
    mult = 1 + (1 if lora else 2) + (1 if remat else 0) + (1 if reference else 0)
    flops = fwd * mult
    return PhaseTime(phase, name, "update", flops, 0.0,
                     flops / (devices * target.tflops * 1e12), counted)


def _updates(phase, role, cfg, rows, prompt, new, group, train, lora, devices, tensor,
             target) -> list:
    """The update the trainee runs (`train.shared_prefix`: grouped, else per row), and the
    other layout beside it for comparison (not counted in the step's total)."""
    out = []
    shards = max(devices // tensor, 1)
    # R', the rows a packed row holds (`train_step.rows_per_pass`, as the run picks it).
    rp = rows_per_pass(group, max(rows // group, 1), shards, train.group_rows) if group else 0
    for grouped in (train.shared_prefix, not train.shared_prefix):
        runs = grouped == train.shared_prefix
        g = padded_groups(rows, rp, shards) if rp else 0
        shape = (f"grouped: {g} x ({prompt} + {rp} x {new}) tokens" if grouped else
                 f"per row: {rows} x ({prompt} + {new}) tokens")
        name = f"{role} update, {shape}" + ("" if runs else " *")
        out.append(_update(phase, name, cfg, rows, prompt, new, rp if grouped else 0,
                           lora, train.remat, train.beta > 0, devices, tensor, target, runs))
    return out


def _verification(phase, cfg, prefixes, prefix, suffix, items, devices, target):
    """The verifier: each prefix (prompt + response) once, then every item's suffix over it."""
    suffixes = prefixes * items
    flops = forward_flops(cfg, prefixes * prefix + suffixes * suffix,
                          prefixes * causal_pairs(prefix)
                          + suffixes * (prefix * suffix + causal_pairs(suffix)), suffixes)
    return PhaseTime(phase, f"verification ({prefixes} prefixes x {items} items)", "prefill",
                     flops, 0.0, flops / (devices * target.tflops * 1e12))


def estimate(config: ml_collections.ConfigDict, models_, target: Target, devices: int,
             tensor: int = 1, slots: Optional[dict] = None) -> list:
    """[PhaseTime] of one generator step and one policy step of `config` on `devices`
    devices of `target` (`tensor` of them per tensor group).

    Args:
        config: a run config (configs/base.py layout).
        models_: `memory.terms.RoleModels.from_config(config)` (the three roles' configs).
        target: `memory.costs.TARGETS[...]`.
        slots: optional {(phase, "policy" | "generator"): E}, the engine's slots the memory
            planner picked (`experiments.plan`); phase "generator step" | "policy step".
    """
    slots = slots or {}
    p, g, v = config.policy, config.generator, config.verifier
    pol = models_.base[models_.sources["policy"]]
    gen = models_.base[models_.sources["generator"]]
    ver = models_.base[models_.sources["verifier"]]
    lora = bool(config.lora.rank)
    k, lists, items = p.num_responses, g.num_lists, g.max_items
    anchor = min(config.data.max_responses, 7)  # responses of an anchor list, at most
    out = []
    for phase, prompts, gen_lists, verified in (
            ("generator step", g.anchors_per_step, g.anchors_per_step * lists,
             g.anchors_per_step * (k + anchor)),
            ("policy step", p.prompts_per_step, p.prompts_per_step, p.prompts_per_step * k)):
        rows = prompts * k
        out += _sampling(phase, "policy sampling", pol, rows, p.max_prompt_tokens,
                         p.max_new_tokens, p.rollout_micro_batch, devices, tensor, target,
                         p.cache_segments, p.sampler,
                         p.response_lengths, k, slots.get((phase, "policy")))
        # A generator input's G lists share it (one prefill) in the generator step.
        out += _sampling(phase, "rubric sampling", gen, gen_lists, g.input_budget,
                         g.max_new_tokens, g.rollout_micro_batch, devices, tensor, target,
                         g.cache_segments, g.sampler,
                         g.response_lengths, lists if phase == "generator step" else 1,
                         slots.get((phase, "generator")))
        # Items per prefix: every list of the prefix's prompt (G in the generator step).
        per_prefix = items * (lists if phase == "generator step" else 1)
        out.append(_verification(phase, ver, verified, v.max_prefix_tokens,
                                 v.max_suffix_tokens, per_prefix, devices, target))
        # The update as `models_.train` says (remat resolved, `planner.with_remat`).
        if phase == "generator step":
            out += _updates(phase, "generator", gen, gen_lists, g.input_budget,
                            g.max_new_tokens, lists, models_.train["generator"], lora, devices,
                            tensor, target)
        else:
            out += _updates(phase, "policy", pol, rows, p.max_prompt_tokens, p.max_new_tokens,
                            k, models_.train["policy"], lora, devices, tensor, target)
    return out


def table(config, times: list, target: Target, devices: int) -> str:
    """The estimate as text: each step's phases, the step totals, a round, and the anchors."""
    lines = [f"time estimate on {devices} x {target.name} ({target.tflops:.0f} TFLOP/s, "
             f"{target.tbps} TB/s each): roofline (vendor peaks) and expected (/ the "
             f"efficiency measured on one H200: {MEASURED_EFFICIENCY})",
             f"{'step / phase':<80}{'roofline s':>12}{'expected s':>12}"]
    totals = {}
    for t in times:
        lines.append(f"  {t.phase + ': ' + t.name:<78}{t.roofline_s:>12.1f}{t.expected_s:>12.1f}")
        if not t.counted:
            continue
        r, e = totals.get(t.phase, (0.0, 0.0))
        totals[t.phase] = (r + t.roofline_s, e + t.expected_s)
    if any(not t.counted for t in times):
        lines.append("  * the other layout of the update, for comparison: not what the config "
                     "runs (train.shared_prefix), not in the total")
    for phase, (r, e) in totals.items():
        lines.append(f"{phase + ' (total)':<80}{r:>12.1f}{e:>12.1f}")
    steps = {"generator step": config.rounds.generator_steps,
             "policy step": config.rounds.policy_steps}
    rr = sum(totals[s][0] * n for s, n in steps.items())
    re_ = sum(totals[s][1] * n for s, n in steps.items())
    label = (f"a round ({steps['generator step']} generator + {steps['policy step']} policy "
             "steps), hours")
    lines.append(f"{label:<80}{rr / 3600:>12.2f}{re_ / 3600:>12.2f}")
    p = config.policy
    # Responses at their lengths' mean when the config gives them (else all N).
    points = parse_lengths(p.response_lengths, p.max_new_tokens)
    rows = p.prompts_per_step * p.num_responses
    response = (float(row_lengths(points, rows).mean()) if points else p.max_new_tokens)
    tokens = rows * (p.max_prompt_tokens + response)
    lines.append(f"policy step tokens/s/device (prompt + response, at expected): "
                 f"{tokens / totals['policy step'][1] / devices:,.0f}")
    lines += [f"anchor: {a}" for a in ANCHORS]
    return "\n".join(lines)

"""The co-evolution round loop (Algorithm 1, METHOD section 5): `run(config, workdir)`.

Each round first adapts the rubric generator to the current policy's samples (generator
phase, policy fixed), then trains the policy with the adapted generator and the frozen
verifier (policy phase, generator fixed). A step of either phase is a rollout function of
`phases` followed by `phases.update`.

Determinism: the key of (round r, phase f, step s) is fold_in(fold_in(fold_in(seed, r),
f), s); data order comes from the seed through `data.EpochIterator`, whose position is
checkpointed with the trainees' states. A resumed run therefore repeats exactly what the
uninterrupted run does.

Checkpoints (`workdir/checkpoints/<global step>/`, every config.checkpoint.every_steps
steps): state = {role: TrainState} of the roles that train in the run only
(`roles.trains`: e.g. no generator when rounds.generator_steps = 0; a LoRA trainee's
TrainState holds its adapters and their AdamW moments, never the frozen base); meta =
{"loop": LoopState, "anchor_iter", "prompt_iter", "seed", "data_fingerprint", "trace",
"trainees"}. A checkpoint id counts the steps of both phases (a step whose groups were all
flat counts, though it made no update: `phases.update`). The end
of a round (held-out evaluation and trace done) is recorded in `round_end.json` beside
them, so a resumed run neither repeats that evaluation nor loses the trace. A run that
finished writes `finished.json`; running it again says so and changes nothing. Resuming
with data whose fingerprint differs from the checkpoint's is refused unless
config.checkpoint.allow_data_change.

Several processes (`jax.distributed`, one per host): every process runs this loop on the
same global batches (the iterators are seeded, so every process draws the same rows) and
samples, decodes and trains on its own block of each (`parallel.process_block`, its own
devices' rows); the device work is one program over the global mesh, and the texts other
roles read are gathered (`phases.sample_responses`, `RubricGenerator.generate_batch`), so
the numbers are those of one process with the same mesh. All processes save and restore
the checkpoints (Orbax writes each array's shards from the process that holds them); only
process 0 writes metrics, traces, plots, memory.json, the exports and the JSON markers. The
workdir is a local path or a URL (`etils.epath`, e.g. gs://bucket/run).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Optional

import jax
import ml_collections
from absl import logging
from etils import epath

from drubric_jax.rounds import (compilation, context, gold_curve, heldout, hostmem, phases,
                                run_logging)
from drubric_jax.models import export_hf_dir
from drubric_jax.rounds.roles import role_memory
# The run's state, setup and checkpoints live in `run_state`; re-exported here, where the
# loop's users (experiments, tests) look for them.
from drubric_jax.rounds.run_state import (PHASES, LoopState, Run, _read_json,  # noqa: F401
                                          _write_json, is_primary, phase_key, restore, save,
                                          setup)
from drubric_jax.types import Role

FINISHED = "finished.json"


# ----------------------------------------------------------------------------- the loop


def _log(run: Run, kind: str, metrics: dict) -> None:
    # round / phase / step identify a row, so a row repeated after a resume can be told apart.
    row = {"kind": kind, "round": run.loop.round, "phase": run.loop.phase,
           "step": run.loop.step, "global_step": run.loop.global_step, **metrics}
    run.writer.write(run.loop.global_step, row)


def _maybe_eval(run: Run) -> None:
    """Held-out Delta_gap / R_anchor once per (round, phase boundary), unless
    config.rounds.heldout_eval is off."""
    # A list, not a tuple: `heldout_done` round-trips through the checkpoint's JSON meta.
    tag = [run.loop.round, run.loop.phase]
    if tag in run.loop.heldout_done or not run.settings.rounds.heldout_eval:
        return
    # Step 10**6: a key no training step uses, and the same one on a resumed run.
    metrics = heldout.heldout_metrics(
        run.ctx, phase_key(run.settings.seed, run.loop.round, run.loop.phase, 10 ** 6),
        run.data.heldout_anchors)
    hostmem.release_free_memory()
    if metrics:
        _log(run, "heldout", metrics)
    run.loop.heldout_done.append(tag)


def _rollout(run: Run, role: Role, key) -> phases.PhaseStep:
    """One rollout of `role`'s phase on the next batch of its iterator."""
    if role is Role.GENERATOR:
        return phases.generator_rollout(run.ctx, key, next(run.anchor_iter))
    if run.ctx.settings.rule is None:  # config.policy.reward = rubric
        return phases.policy_rollout(run.ctx, key, next(run.prompt_iter))
    # Plain GRPO on a rule reward (config.policy.reward, read once: `rounds.settings`).
    return phases.rule_policy_rollout(run.ctx, key, next(run.prompt_iter),
                                      run.ctx.settings.rule)


def _policy_rollout_with_redraws(run: Run, key) -> tuple[phases.PhaseStep, int]:
    """A policy rollout; while all its groups are flat (`phases.all_groups_flat`: nothing
    to learn from), fresh prompts are drawn, at most config.policy.max_redraws times.
    Redraw i uses the next prompt batch and the key fold_in(key, i): a function of the
    step's key and the iterator's position, both of which a resume restores, so a resumed
    run redraws exactly as the uninterrupted one. Every process reads the same global
    flat-group fraction, so all of them redraw together.

    Returns:
        (the last rollout, with the discarded rollouts' seconds added to its timer; the
        number of redraws).
    """
    step = _rollout(run, Role.POLICY, key)
    redraws = 0
    while phases.all_groups_flat(step) and redraws < run.settings.policy.max_redraws:
        redraws += 1
        again = _rollout(run, Role.POLICY, jax.random.fold_in(key, redraws))
        again.timer.add(step.timer)  # the discarded samples' work belongs to this step
        step = again
    return step, redraws


def _phase(run: Run, role: Role, steps: int) -> None:
    """Runs the remaining steps of one phase, checkpointing every config.checkpoint
    .every_steps optimizer steps.

    Each step's metrics row includes the seconds of its checkpoint save
    (`seconds_checkpoint`: the save comes before the row is written, so a crash between the
    two loses that row, and a resumed run does not repeat the step) and, in the phase's
    first step, of moving the idle trainee's AdamW moments away and the active one's back
    (`seconds_park`, parking or offloading). A policy step whose groups are all flat draws
    fresh prompts (`_policy_rollout_with_redraws`; metrics `redraws` and `prompts_drawn`);
    a step still all flat makes no update (`phases.update`; metric `update_skipped`)."""
    from tqdm import tqdm

    # The idle trainee's AdamW moments leave the device for this phase (disk or pinned host).
    phase_timer = context.Timer()
    with phase_timer("park"):
        if run.settings.memory.park_idle_optimizer:
            run.ctx.roles.park_idle(role, run.park_dir)
        elif run.settings.memory.offload_idle_optimizer:
            run.ctx.roles.offload_idle(role)
    bar = tqdm(total=steps, initial=run.loop.step, disable=not run.settings.log.progress,
               desc=f"round {run.loop.round} {role.value}", unit="step")
    while run.loop.step < steps:
        if role is Role.POLICY:
            _maybe_gold_point(run)
        compiled_before = compilation.CompileClock.seconds()
        # A function of (round, phase, step) only: a resumed run draws the same keys.
        key = phase_key(run.settings.seed, run.loop.round, role.value, run.loop.step)
        if role is Role.POLICY:
            step, redraws = _policy_rollout_with_redraws(run, key)
            # The last policy step's samples become this round's trace/round_N.html.
            run.last_trace = step.trace
        else:
            step, redraws = _rollout(run, role, key), None
        # global_step + 1 names this update in a NaN error (global_step counts finished ones).
        metrics = phases.update(run.ctx, role, step, run.loop.global_step + 1)
        metrics.update(step.metrics, **step.timer.metrics(), **phase_timer.metrics())
        if redraws is not None:
            metrics["redraws"] = redraws
            # Prompts this step took from the policy iterator, discarded redraws included.
            metrics["prompts_drawn"] = run.settings.policy.prompts_per_step * (1 + redraws)
        phase_timer = context.Timer()  # the park seconds belong to the phase's first step
        run.loop.step += 1
        run.loop.global_step += 1
        if run.loop.global_step % run.settings.checkpoint.every_steps == 0:
            with step.timer("checkpoint"):
                save(run)
            metrics["seconds_checkpoint"] = step.timer.seconds["checkpoint"]
        # Of the step's seconds, how many went to tracing and compiling (0 once warm).
        metrics["seconds_compile"] = compilation.CompileClock.seconds() - compiled_before
        hostmem.release_free_memory()
        metrics["peak_rss_gb"] = hostmem.peak_rss_bytes() / 1e9
        _log(run, "train", metrics)
        bar.update(1)
    bar.close()
    if role is Role.POLICY:
        _maybe_gold_point(run, last=True)


def _maybe_gold_point(run: Run, last: bool = False) -> None:
    """A point of the held-out gold curve (`rounds.gold_curve`) before every
    `rounds.heldout_gold_every`-th policy step of a round and after its last one. A later
    round's step 0 gets none: the policy is the one the last round's final point scored
    (a generator phase leaves it as it was)."""
    every = run.settings.rounds.heldout_gold_every
    if not every or not run.gold_items or (run.loop.step % every and not last):
        return
    if run.loop.step == 0 and run.loop.round > 0 and not last:
        return
    # Step 10**6 + s: keys no training step uses, the same on a resumed run.
    key = phase_key(run.settings.seed, run.loop.round, Role.POLICY.value,
                    10 ** 6 + run.loop.step)
    timer = context.Timer()
    p = run.settings.policy
    with timer("heldout_gold"):
        point = gold_curve.heldout_gold_point(
            run.ctx, key, run.gold_items, max_prompt_tokens=p.max_prompt_tokens,
            max_new_tokens=p.max_new_tokens, temperature=p.temperature,
            rows_per_call=p.rollout_micro_batch)
    _log(run, "heldout_gold", {**point, **timer.metrics()})


def run_rounds(run: Run, stop_after_rounds: Optional[int] = None) -> None:
    """Runs (or resumes) the rounds; `stop_after_rounds` ends early (tests, preemption
    drills) after that many completed rounds, with a checkpoint."""
    s = run.settings
    restore(run)
    while run.loop.round < s.rounds.num_rounds:
        # The static (RaR) baseline never trains its generator (METHOD 6); after
        # rounds.generator_rounds rounds it is frozen (the stale-evaluator arm).
        frozen = 0 <= s.rounds.generator_rounds <= run.loop.round
        gen_steps = 0 if s.variant == "static" or frozen else s.rounds.generator_steps
        if stop_after_rounds is not None and run.loop.round >= stop_after_rounds:
            break
        # A run resumed in the policy phase goes straight to it.
        if run.loop.phase == Role.GENERATOR.value:
            # Before the generator phase: the generator as this round found it.
            _maybe_eval(run)
            _phase(run, Role.GENERATOR, gen_steps)
            run.loop.phase, run.loop.step = Role.POLICY.value, 0
        _phase(run, Role.POLICY, s.rounds.policy_steps)
        # After the round: the generator it trained (held-out metrics never use the policy).
        _maybe_eval(run)
        if run.last_trace and is_primary():
            run_logging.write_round_trace(
                epath.Path(run.workdir) / "trace" / f"round_{run.loop.round}.html",
                f"round {run.loop.round}: policy samples, rubrics and verdicts",
                run.last_trace)
        run.loop.round, run.loop.phase, run.loop.step = (run.loop.round + 1,
                                                          Role.GENERATOR.value, 0)
        # Not a checkpoint: `restore` applies it only when its global_step is the newest one's.
        _write_json(epath.Path(run.workdir) / "round_end.json",
                    {"global_step": run.loop.global_step, "loop": dataclasses.asdict(run.loop)})
    run.ckpt.wait()
    if run.loop.round >= s.rounds.num_rounds:
        finish(run)


def finish(run: Run) -> None:
    """curves.png, memory.json (MiB per role and the peaks, measured; `experiments.plan`
    prints the planner's figures for the same config) and the Hugging Face exports (process
    0 writes; every process takes part in gathering the exported leaves)."""
    if is_primary():
        run_logging.plot_curves(run.writer.path, os.path.join(run.workdir, "curves.png"))
    # MiB, the unit of `memory.planner.planned_role_mib`.
    measured = {k: v / 2 ** 20 for k, v in role_memory(run.ctx.roles).items()}
    _write_json(os.path.join(run.workdir, "memory.json"),
                {**measured, **hostmem.measured_peaks()})
    if run.settings.export:
        # The trainees only: a frozen role is its unchanged source.
        for trainee in run.ctx.roles.trainees():
            tok = trainee.model.tokenizer
            params = trainee.export_params()  # LoRA: merged into the base, in float32
            # Adapters merged: the exported config has no LoRA and the params' own dtype.
            dtype = jax.tree.leaves(params)[0].dtype.name
            export_hf_dir(params, trainee.cfg.replace(lora_rank=0, param_dtype=dtype),
                          os.path.join(run.workdir, "export", trainee.role.value), tok,
                          bos_id=tok.bos_token_id or 0, eos_id=tok.eos_token_id or 0)
    rounds = run.settings.rounds.num_rounds
    _write_json(os.path.join(run.workdir, FINISHED), {
        "rounds": rounds, "global_step": run.loop.global_step,
        "data_sha256": run.data.fingerprint["sha256"]})
    if is_primary():  # the last line of a run, after its progress bars
        print(f"{run.workdir}: finished {rounds} round{'' if rounds == 1 else 's'} "
              f"({run.loop.global_step} optimizer steps); metrics.jsonl, curves.png, "
              f"memory.json{', export/' if run.settings.export else ''} are there.", flush=True)


def finished(workdir: str, config: ml_collections.ConfigDict) -> Optional[dict]:
    """The contents of workdir/finished.json when that run already did config's rounds."""
    done = _read_json(epath.Path(workdir) / FINISHED)
    if done is None:
        return None
    # More rounds asked for than were run: not finished, the run continues from its checkpoint.
    return done if done["rounds"] >= config.rounds.num_rounds else None


def close(run: Run) -> None:
    """Waits for the last checkpoint; removes `parked/` (the checkpoints hold those
    moments too, and a new process never reads parked files: it restores)."""
    run.ckpt.close()
    run.writer.close()
    shutil.rmtree(run.park_dir, ignore_errors=True)


def run(config: ml_collections.ConfigDict, workdir: str,
        stop_after_rounds: Optional[int] = None) -> None:
    """Runs Algorithm 1 for `config` in `workdir`, resuming from its last checkpoint.

    Outputs: config.json and settings.json (the config as given, and the settings the
    stages read, flattened: `rounds.settings.flatten`; written at the start),
    metrics.jsonl, tensorboard/, trace/round_N.html, curves.png, memory.json,
    checkpoints/, export/{policy,generator}/ of the roles that trained (docs/ARCHITECTURE.md, "Outputs of a run").

    Raises:
        config_check.ConfigError: a bad config field (before any compute).
        FloatingPointError: a NaN/inf training metric (names the step).
    """
    # Rerunning the command of a finished run changes nothing.
    done = finished(workdir, config)
    if done is not None:
        message = (f"{workdir}: this run finished ({done['rounds']} rounds, "
                   f"{done['global_step']} optimizer steps); nothing to do. Raise "
                   "config.rounds.num_rounds to continue it, or use a new workdir.")
        print(message, flush=True)  # once, on stdout (a log line beside it repeated it)
        return
    state = setup(config, workdir)
    logging.info("data: %s rows, sha256 %s", state.data.fingerprint["rows"],
                 state.data.fingerprint["sha256"][:16])
    # Closed on an error too: checkpoint writes finish, metrics close, parked/ is removed.
    try:
        run_rounds(state, stop_after_rounds)
    finally:
        close(state)

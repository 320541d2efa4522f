"""A run's state, its setup, and its checkpoints (the loop itself is `rounds.loop`, which
re-exports these names).

    LoopState       where the loop is (round, phase, step, global step): in every
                    checkpoint's meta
    Run             everything one run holds: settings, context, data iterators,
                    checkpointer, metrics writer
    setup           validates the config, reads it once (`rounds.settings`; settings.json),
                    checks the data (world v2: no constraint cut from a role's input)
                    before any weights load, loads the models, opens outputs
    save / restore  the trainees' states (only the roles that train) and the loop meta
    phase_key       the key of (round, phase, step): a resumed run draws the same keys

Axis legend: none (host-side bookkeeping).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import jax
import ml_collections
from absl import logging
from etils import epath

from drubric_jax import config_check, data, parallel
from drubric_jax.rounds import checkpoint as ckpt_lib
from drubric_jax.rounds import compilation, context, gold_curve, hostmem, run_logging, settings
from drubric_jax.rounds.roles import build_roles, check_model_sources
from drubric_jax.types import Role

# Order within a round (evaluator first); a phase's index here is its fold_in value.
PHASES = (Role.GENERATOR.value, Role.POLICY.value)


@dataclasses.dataclass
class LoopState:
    """Where the loop is: saved in every checkpoint's meta."""

    round: int = 0
    phase: str = "generator"
    step: int = 0            # steps done in the current phase
    global_step: int = 0     # optimizer steps done, both roles
    heldout_done: list = dataclasses.field(default_factory=list)  # (round, phase) evaluated


def phase_key(seed: int, round_: int, phase: str, step: int) -> jax.Array:
    """Key of one step: fold_in(fold_in(fold_in(PRNGKey(seed), round), phase), step)."""
    key = jax.random.fold_in(jax.random.PRNGKey(seed), round_)
    return jax.random.fold_in(jax.random.fold_in(key, PHASES.index(phase)), step)


@dataclasses.dataclass
class Run:
    """Everything one run holds; the functions of this module act on it. `settings` is the
    run config read once (`rounds.settings.read`); the run keeps no ConfigDict."""

    settings: settings.RunSettings
    workdir: str
    ctx: context.Context
    data: data.LoadedData
    anchor_iter: Optional[data.EpochIterator]
    prompt_iter: data.EpochIterator
    ckpt: ckpt_lib.Checkpointer
    writer: run_logging.MetricsWriter
    loop: LoopState = dataclasses.field(default_factory=LoopState)
    last_trace: list = dataclasses.field(default_factory=list)
    # The held-out prompts of the gold curve (`rounds.gold_curve`; [] when it is off).
    gold_items: list = dataclasses.field(default_factory=list)

    @property
    def park_dir(self) -> str:
        return os.path.join(self.workdir, "parked")


def setup(config: ml_collections.ConfigDict, workdir: str) -> Run:
    """Validates the config, reads it once into the run's settings, reads the data, loads
    the models, opens the outputs.

    `settings.read(config)` is the last read of the ConfigDict: everything after it (the
    data, the roles, the context, the checkpointer, the loop) reads the settings. The
    workdir gets config.json (the config as given) and settings.json (the settings,
    flattened: `settings.flatten`, so a report can diff arms). Data errors come before any
    weights are loaded.

    Raises:
        config_check.ConfigError: a bad config field (named).
        ValueError / FileNotFoundError: bad data (file, line and field named).
    """
    config_check.validate(config, jax.device_count(), jax.process_count())
    check_model_sources(config)  # every model path exists: seconds, not after a load
    # The config this invocation runs with, overrides included (a resumed run rewrites it).
    config_json = json.loads(config.to_json_best_effort())
    s = settings.read(config)  # the config read once: nothing below reads `config`
    hostmem.configure_malloc()  # CPU: large freed buffers go back to the kernel
    compilation.enable_persistent_cache(s.compile.cache_dir)
    # Each step's seconds_compile metric reads this clock.
    compilation.CompileClock.install()
    data.check_data_sources(s.data)  # every file parses, before any weights load
    # Only now: a run refused for its models or data leaves no empty workdir behind.
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    # After the checks, so a run refused for its data writes neither file.
    _write_json(epath.Path(workdir) / "config.json", config_json)
    _write_json(epath.Path(workdir) / settings.SETTINGS_FILE, settings.flatten(s))
    # Every process reads whole global batches (the iterators' defaults, host 0 of 1): the
    # rows of a batch are a global value, as `parallel.put` expects.
    loaded = data.load_data(s.data)
    # World v2 (data.refuse_cut_constraints): no row whose constraints a role's input
    # budget would cut; checked with the tokenizer alone, before any weights load.
    check_config_rows(s, loaded.prompts, [a for a in loaded.train_anchors],
                      where=", ".join(s.data.prompt_paths) or "config.data")
    # The gold curve's held-out prompts (and, under data.require_splits, their split), now.
    gold_items = gold_curve.load_items(s.rounds, s.data.require_splits)
    # mesh.num_devices = 0 keeps every device (the slice [:None]).
    mesh = parallel.make_mesh(s.mesh.data, s.mesh.fsdp, s.mesh.tensor,
                              jax.devices()[:s.mesh.num_devices or None])
    roles = build_roles(s, mesh)
    return Run(
        settings=s, workdir=workdir, data=loaded,
        ctx=context.Context.build(s, roles, mesh, loaded.prompts),
        # None when the run reads no anchor list (`config_check.uses_anchors`: no generator
        # trains and no held-out Delta_gap, e.g. the gold arm).
        anchor_iter=None if not loaded.train_anchors else data.EpochIterator(
            loaded.train_anchors, s.generator.anchors_per_step, s.seed, name="anchors"),
        # seed + 1: the prompt order is shuffled independently of the anchor order.
        prompt_iter=data.EpochIterator(loaded.prompts, s.policy.prompts_per_step, s.seed + 1,
                                       name="prompts"),
        # Synchronous saves: an async save keeps a host copy of both trainees' params and
        # AdamW moments alive during the next step (3.2 GB for SmolLM2 in float32).
        ckpt=ckpt_lib.Checkpointer(epath.Path(workdir) / "checkpoints",
                                   max_to_keep=s.checkpoint.max_to_keep, async_save=False),
        writer=run_logging.MetricsWriter(workdir, tensorboard=s.log.tensorboard,
                                         enabled=is_primary()),
        gold_items=gold_items)


def is_primary() -> bool:
    """Whether this process writes the run's files (process 0 of a multi-process run)."""
    return jax.process_index() == 0


# ----------------------------------------------------------------------------- checkpoints


def _write_json(path, obj) -> None:
    """Process 0 writes `obj` to `path` atomically (a kill leaves the old file or the new
    one); the other processes write nothing."""
    if not is_primary():
        return
    run_logging.write_json(path, obj, indent=2)


def _read_json(path) -> Optional[dict]:
    """The JSON object at `path` (a path or URL), or None when there is no such file."""
    path = epath.Path(path)
    return json.loads(path.read_text()) if path.exists() else None


def save(run: Run) -> None:
    """Checkpoint `run.loop.global_step`: the trainees' states (the roles that train in this
    run; a frozen or absent role is not saved) and the loop meta."""
    trainees = run.ctx.roles.trainees()
    # Parked moments are read back for the save only (a transient copy; they stay parked).
    state = {t.role.value: t.resident_state() for t in trainees}
    meta = {"loop": dataclasses.asdict(run.loop),
            "anchor_iter": None if run.anchor_iter is None else run.anchor_iter.state(),
            "prompt_iter": run.prompt_iter.state(), "seed": run.settings.seed,
            "data_fingerprint": run.data.fingerprint, "trace": run.last_trace,
            "trainees": [t.role.value for t in trainees]}
    run.ckpt.save(run.loop.global_step, state, meta, force=True)


def restore(run: Run) -> bool:
    """Resumes from the newest checkpoint in workdir/checkpoints, if there is one.

    Only the trainees of this run are restored: a checkpoint that also holds another role
    (one written before checkpoints held the trainees only, where both roles were saved)
    restores the keys this run trains and leaves the rest unread.

    Raises:
        ValueError: the checkpoint was written with other data (its fingerprint differs)
            and config.checkpoint.allow_data_change is False; or a role that trains in this
            run is not in the checkpoint (it was frozen when the checkpoint was written).
    """
    step = run.ckpt.latest()
    if step is None:
        return False
    trainees = run.ctx.roles.trainees()
    saved = run.ckpt.read_meta(step)
    # Checkpoints written before "trainees" was recorded hold both roles.
    have = saved.get("trainees", [r.value for r in (Role.POLICY, Role.GENERATOR)])
    missing = [t.role.value for t in trainees if t.role.value not in have]
    if missing:
        raise ValueError(
            f"{run.workdir}: checkpoint {step} holds {have} but this run trains {missing} "
            "too (config.rounds.generator_steps / generator_rounds / policy_steps or "
            "config.variant changed since it was written); use a new workdir")
    # The live states are the restore target: their shapes, dtypes and shardings are kept.
    target = {t.role.value: t.state for t in trainees}
    state, meta = run.ckpt.restore(step, target, partial=len(have) > len(target))
    _check_same_data(run, meta.get("data_fingerprint"), step)
    for t in trainees:
        t.state = state[t.role.value]
    run.loop = LoopState(**meta["loop"])
    run.last_trace = meta.get("trace", [])
    if run.anchor_iter is not None and meta.get("anchor_iter") is not None:
        run.anchor_iter.restore(meta["anchor_iter"])
    run.prompt_iter.restore(meta["prompt_iter"])
    saved = _read_json(epath.Path(run.workdir) / "round_end.json")
    if saved is not None:  # the round that ended after this checkpoint
        if saved["global_step"] == step:
            run.loop = LoopState(**saved["loop"])
    return True


def trained_params_at(run: Run, checkpoint_dir: str) -> dict:
    """The trainees' trained params at the newest checkpoint of `checkpoint_dir` (another
    run's, e.g. a branch of this one), restored into this run's shapes and shardings; the
    AdamW moments are not read (PLACEHOLDER leaves). `Trainee.forward_params` turns each
    into what a forward pass takes.

    Returns:
        {role name: params pytree} for each trainee of this run.

    Raises:
        FileNotFoundError: `checkpoint_dir` holds no checkpoint.
    """
    import orbax.checkpoint as ocp

    target = {t.role.value: t.state.replace(opt_state=jax.tree.map(
        lambda _: ocp.PLACEHOLDER, t.state.opt_state)) for t in run.ctx.roles.trainees()}
    with ckpt_lib.Checkpointer(checkpoint_dir) as ck:
        if ck.latest() is None:
            raise FileNotFoundError(f"{checkpoint_dir}: no checkpoint")
        state, _ = ck.restore(None, target)
    return {name: s.params for name, s in state.items()}


def _check_same_data(run: Run, saved: Optional[dict], step: int) -> None:
    if saved is None:  # checkpoints written before fingerprints existed
        logging.warning("checkpoint %d has no data fingerprint; not checked", step)
        return
    if saved.get("sha256") == run.data.fingerprint["sha256"]:
        return
    was = {f["path"]: f["rows"] for f in saved.get("files", [])}
    now = {f["path"]: f["rows"] for f in run.data.fingerprint["files"]}
    message = (f"{run.workdir}: checkpoint {step} was trained on other data (files and "
               f"rows then: {was}; now: {now}; content hashes differ). Resume anyway with "
               "--config.checkpoint.allow_data_change=True, or use a new workdir.")
    if not run.settings.checkpoint.allow_data_change:
        raise ValueError(message)
    logging.warning("%s (allowed by config.checkpoint.allow_data_change)", message)


def check_config_rows(run_settings: settings.RunSettings, prompts, anchors=(),
                      where: str = "") -> Optional[dict]:
    """`check_rows_fit` of a run's prompt rows (and anchor lists' prompts) with its budgets:
    `policy.max_prompt_tokens`; the generator's `input_budget` with K = policy.num_responses
    responses of policy.max_new_tokens tokens, its list naming `generator.check_pool`
    (checked only when a generator reads them: a rubric reward or generator steps).
    Runs only when `config.data.refuse_cut_constraints` is on (world v2); None otherwise.

    Raises:
        ValueError: as `check_rows_fit`, naming `where` (the data files' config field).
    """
    s = run_settings
    if not s.world.refuse_cut_constraints:
        return None
    from drubric_jax.checks.fit import check_rows_fit, generator_render
    from drubric_jax.checks.schema import check_lines
    from drubric_jax.checks.table import SCORABLE_CHECKS
    from drubric_jax.models import load_tokenizer

    tok = load_tokenizer(s.model.policy)
    gen = None
    p, g = s.policy, s.generator
    if p.reward == "rubric" or s.rounds.generator_steps > 0:
        pool = g.check_pool or SCORABLE_CHECKS
        gen = {"k": p.num_responses, "response_tokens": p.max_new_tokens,
               "budget": g.input_budget,
               "render": generator_render(tok, check_lines(pool), g.max_items),
               "keep_prompt": g.keep_prompt}
    out = check_rows_fit(list(prompts) + list(anchors), tok,
                         policy_budget=p.max_prompt_tokens, generator=gen,
                         where=where or "config.data.prompt_paths")
    return out

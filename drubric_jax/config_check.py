"""The one validation of a run config, before any compute: every error names the field.

`validate(config)` checks a whole run config (configs/base.py layout), including that a
step's rows divide over the mesh and the process-count limits of host-memory options.
The rules of a trainee's node (`policy.train`, `generator.train`) are
`rl.train_config.TRAINER_RULES`, which `TrainConfig` applies too, so no rule is written
twice.
"""
from __future__ import annotations

from typing import Optional

import ml_collections

from drubric_jax import models, parallel
from drubric_jax.sampling.lengths import parse_lengths
from drubric_jax.sampling.engine_host import SAMPLERS
from drubric_jax.evaluator.verdicts import CALIBRATIONS, VERDICT_MODES
from drubric_jax.evaluator.rubric_formats import KINDS as VERIFIER_KINDS
from drubric_jax.rl.generator_rewards import GENERATOR_REWARDS
from drubric_jax.rl import rule_rewards
from drubric_jax.rl.train_config import DTYPES, check_trainer
from drubric_jax.types import ConfigError, require as _require  # noqa: F401

# full: the Eq. 17 objective; disc_only / anchor_only: its ablations; static: the RaR
# baseline (METHOD 6).
VARIANTS = ("full", "disc_only", "anchor_only", "static")
# demo: the packaged set; shared: ../shared/data; custom: config.data.*_paths.
DATA_NAMES = ("demo", "shared", "custom")


def mesh_axis_sizes(config: ml_collections.ConfigDict, device_count: int) -> dict:
    """{"data", "fsdp", "tensor": size} of the mesh `config.mesh` builds on `device_count`
    devices (`parallel.axis_sizes`: its -1 axis takes the remaining devices).

    Raises:
        ConfigError: more devices asked for than available, or axes that do not fit them.
    """
    m = config.mesh
    # num_devices 0 = every device.
    n = m.num_devices or device_count
    _require(n <= device_count, "config.mesh.num_devices",
             f"{n} devices asked for, {device_count} available")
    try:
        sizes = parallel.axis_sizes(n, m.data, m.fsdp, m.tensor)
    except ValueError as e:
        raise ConfigError(f"config.mesh: {e} (set config.mesh.* or config.mesh.num_devices)")
    return dict(zip(parallel.MESH_AXES, sizes))


def mesh_row_shards(config: ml_collections.ConfigDict, device_count: int) -> int:
    """data x fsdp of the mesh `config.mesh` builds on `device_count` devices."""
    sizes = mesh_axis_sizes(config, device_count)
    return sizes["data"] * sizes["fsdp"]


def uses_anchors(config) -> bool:
    """Whether a run reads anchor lists: its generator trains (generator steps, a variant
    other than static, generator_rounds != 0) or it evaluates Delta_gap on held-out lists."""
    r = config.rounds
    trains = (r.generator_steps > 0 and config.variant != "static"
              and r.generator_rounds != 0)
    return bool(trains or r.heldout_eval)


def validate(config: ml_collections.ConfigDict, device_count: Optional[int] = None,
             process_count: int = 1) -> None:
    """Checks a run config (configs/base.py layout) before any compute.

    Args:
        config: the run config.
        device_count: devices the run sees (None: skip the mesh checks).
        process_count: JAX processes of the run.

    Raises:
        ConfigError: the first bad field, named "config.<field>", with the reason.
    """
    c = config

    def need(ok, field, message):
        _require(ok, f"config.{field}", message)

    # Method, model and data.
    need(c.variant in VARIANTS, "variant", f"{c.variant!r} not in {VARIANTS}")
    need(c.model.dtype in DTYPES, "model.dtype", f"{c.model.dtype!r} not in {DTYPES}")
    need(c.model.master_dtype in DTYPES, "model.master_dtype",
         f"{c.model.master_dtype!r} not in {DTYPES}")
    need(c.lora.rank >= 0, "lora.rank", "must be >= 0 (0 = full fine-tuning)")
    need(c.lora.alpha > 0, "lora.alpha", "must be > 0")
    # The registry's tables are read at each call: a family or rule added to them counts.
    targets = models.lora_targets()  # the model families' LORA_TARGETS
    need(len(c.lora.targets) > 0 and set(c.lora.targets) <= set(targets), "lora.targets",
         f"{tuple(c.lora.targets)} must be a non-empty subset of {targets}")
    need(c.data.name in DATA_NAMES, "data.name", f"{c.data.name!r} not in {DATA_NAMES}")
    if c.data.name == "custom":
        # Anchor lists feed the generator's phase and the held-out Delta_gap only.
        need(len(c.data.anchor_paths) > 0 or not uses_anchors(c), "data.anchor_paths",
             "needed when data.name=custom and the generator trains or "
             "rounds.heldout_eval is on")
        need(len(c.data.prompt_paths) > 0, "data.prompt_paths", "needed when data.name=custom")
    need(c.data.heldout_anchor_rows >= 0, "data.heldout_anchor_rows", "must be >= 0")
    need(c.data.min_responses >= 2, "data.min_responses", "an anchor list needs >= 2")
    need(c.data.max_responses >= c.data.min_responses, "data.max_responses",
         "must be >= data.min_responses")
    # Rounds and the two phases (Algorithm 1).
    need(c.rounds.num_rounds >= 1, "rounds.num_rounds", "must be >= 1")
    need(c.rounds.generator_steps >= 0, "rounds.generator_steps", "must be >= 0")
    need(c.rounds.policy_steps >= 0, "rounds.policy_steps", "must be >= 0")
    need(isinstance(c.rounds.heldout_eval, bool), "rounds.heldout_eval", "must be True or False")
    need(c.rounds.generator_rounds >= -1, "rounds.generator_rounds",
         "must be -1 (every round) or >= 0")
    need(c.rounds.heldout_gold_every >= 0, "rounds.heldout_gold_every",
         "must be >= 0 (0 = no held-out gold curve)")
    need(c.rounds.heldout_gold_rows >= 0, "rounds.heldout_gold_rows",
         "must be >= 0 (0 = every row)")
    need(not c.rounds.heldout_gold_every or bool(c.rounds.heldout_gold_path),
         "rounds.heldout_gold_path", "needed when rounds.heldout_gold_every > 0")
    from drubric_jax.data.splits import SPLITS
    need(c.rounds.heldout_gold_split in ("",) + SPLITS, "rounds.heldout_gold_split",
         f"must be one of {SPLITS} or '' (any split), got {c.rounds.heldout_gold_split!r}")
    p, g = c.policy, c.generator
    pool = tuple(g.check_pool)
    # An unknown verifier kind is reported by its own check below, not as the pool's.
    if pool and c.verifier.kind in VERIFIER_KINDS:
        from drubric_jax.checks.table import SCORABLE_CHECKS
        need(c.verifier.kind == "checks", "generator.check_pool",
             "applies to verifier.kind='checks' only")
        need(set(pool) <= set(SCORABLE_CHECKS), "generator.check_pool",
             f"{sorted(set(pool) - set(SCORABLE_CHECKS))} are not scorable check ids")
    need(p.prompts_per_step >= 1, "policy.prompts_per_step", "must be >= 1")
    need(p.num_responses >= 2, "policy.num_responses", "K must be >= 2 for GRPO groups")
    need(p.max_new_tokens >= 1, "policy.max_new_tokens", "must be >= 1")
    need(p.max_prompt_tokens >= 8, "policy.max_prompt_tokens", "must be >= 8")
    need(p.temperature >= 0, "policy.temperature", "must be >= 0")
    need(0 < p.top_p <= 1, "policy.top_p", "must be in (0, 1]")
    need(p.rubric_temperature >= 0, "policy.rubric_temperature", "must be >= 0")
    need(p.heldout_temperature >= 0, "policy.heldout_temperature", "must be >= 0")
    for node, field in ((p, "policy"), (g, "generator")):
        need(node.sampler in SAMPLERS, f"{field}.sampler",
             f"{node.sampler!r} not in {SAMPLERS} (sampling.SAMPLERS)")
        # Without row ids a row's draws follow its place in its sampler call, so the engine
        # (whose slots hold rows of many calls' worth) and the static sampler would give a
        # step different samples: the engine needs every row drawing by its id.
        need(node.sampler != "engine" or c.per_row_keys, f"{field}.sampler",
             "'engine' needs config.per_row_keys=True (each row draws by its id, so the "
             "engine gives the rows the static sampler gives)")
        try:
            parse_lengths(node.response_lengths, node.max_new_tokens)
        except ValueError as e:
            need(False, f"{field}.response_lengths", str(e))
    rewards = rule_rewards.reward_names()
    need(p.reward in rewards, "policy.reward", f"{p.reward!r} not in {rewards}")
    need(p.reward_max_words >= 1, "policy.reward_max_words", "must be >= 1")
    need(isinstance(p.max_redraws, int) and not isinstance(p.max_redraws, bool)
         and p.max_redraws >= 0, "policy.max_redraws",
         "must be an integer >= 0 (fresh prompt draws of a step whose groups are all flat)")
    for node, field in ((p, "policy"), (g, "generator")):
        need(node.rollout_micro_batch >= 0, f"{field}.rollout_micro_batch",
             "must be >= 0 (0 = every row in one sampler call)")
        need(node.cache_segments >= 0, f"{field}.cache_segments",
             "must be >= 0 (0 = auto, 1 = one cache of P + N slots)")
    check_trainer(p.train, "config.policy.train", rows=p.prompts_per_step * p.num_responses)
    need(g.anchors_per_step >= 1, "generator.anchors_per_step", "must be >= 1")
    need(not (g.orders_per_list and g.train.shared_prefix),
         "generator.train.shared_prefix", "must be False with generator.orders_per_list: "
         "lists that show the responses in their own orders share no prompt to run once")
    need(g.num_lists >= 2, "generator.num_lists", "G must be >= 2 for GRPO groups")
    # Each generator reward's weight (Eq. 24-25; rl.generator_rewards), lambda included.
    for name, row in GENERATOR_REWARDS.items():
        need(row.weight_field in g and g[row.weight_field] >= 0, f"generator.{row.weight_field}",
             f"weight of the {name!r} generator reward must be >= 0")
    need(1 <= g.max_items <= 64, "generator.max_items", "must be in 1..64")
    need(g.max_item_chars >= 8, "generator.max_item_chars", "must be >= 8")
    need(g.max_new_tokens >= 16, "generator.max_new_tokens", "must be >= 16")
    need(g.input_budget >= 64, "generator.input_budget", "must be >= 64")
    need(g.temperature > 0, "generator.temperature",
         "must be > 0: G identical greedy lists give flat groups")
    check_trainer(g.train, "config.generator.train", rows=g.anchors_per_step * g.num_lists)
    # Verifier (METHOD 11, 12).
    need(c.verifier.max_prefix_tokens >= 32, "verifier.max_prefix_tokens", "must be >= 32")
    need(c.verifier.max_suffix_tokens >= 8, "verifier.max_suffix_tokens", "must be >= 8")
    need(c.verifier.verdict in VERDICT_MODES, "verifier.verdict",
         f"{c.verifier.verdict!r} not in {VERDICT_MODES}")
    need(0 <= c.verifier.memory_fraction < 1, "verifier.memory_fraction", "must be in [0, 1)")
    need(c.verifier.calibration in CALIBRATIONS, "verifier.calibration",
         f"{c.verifier.calibration!r} not in {CALIBRATIONS}")
    need(c.verifier.kind in VERIFIER_KINDS, "verifier.kind",
         f"{c.verifier.kind!r} not in {VERIFIER_KINDS} (llm: the verifier model's P(yes); "
         "checks: IFEval checks as items, METHOD 13)")
    need(isinstance(c.verifier.loose, bool), "verifier.loose", "must be True or False")
    need(c.verifier.check_workers >= 0, "verifier.check_workers", "must be >= 0 (0 = CPUs)")
    if c.verifier.kind == "checks":
        # A checker's P(yes) is exactly 0 or 1: there is nothing to re-centre (METHOD 12).
        need(c.verifier.calibration == "none", "verifier.calibration",
             "must be 'none' when verifier.kind='checks' (verdicts are exact 0/1)")
    # Mesh, host memory, compile cache and checkpoints.
    for axis in ("data", "fsdp", "tensor"):
        v = c.mesh[axis]
        need(v == -1 or v >= 1, f"mesh.{axis}", "must be -1 or >= 1")
    need(c.mesh.num_devices >= 0, "mesh.num_devices", "must be >= 0 (0 = all devices)")
    need(isinstance(c.memory.park_idle_optimizer, bool), "memory.park_idle_optimizer",
         "must be True or False")
    need(isinstance(c.memory.offload_idle_optimizer, bool), "memory.offload_idle_optimizer",
         "must be True or False")
    need(not (c.memory.offload_idle_optimizer and c.memory.park_idle_optimizer),
         "memory.offload_idle_optimizer", "choose one of it (pinned host memory) and "
         "memory.park_idle_optimizer (disk)")
    need(not (c.memory.park_idle_optimizer and process_count > 1),
         "memory.park_idle_optimizer", "single-process runs only (it writes whole arrays "
         f"to local disk); this run has {process_count} processes: set it False and use "
         "memory.offload_idle_optimizer (pinned host memory) instead")
    need(isinstance(c.compile.cache_dir, str), "compile.cache_dir", "must be a path or \"\"")
    need(c.checkpoint.every_steps >= 1, "checkpoint.every_steps", "must be >= 1")
    need(c.checkpoint.max_to_keep >= 1, "checkpoint.max_to_keep", "must be >= 1")
    need(isinstance(c.checkpoint.allow_data_change, bool), "checkpoint.allow_data_change",
         "must be True or False")
    # The train step splits a step's rows over data x fsdp: they must divide evenly.
    if device_count is not None:
        shards = mesh_row_shards(c, device_count)
        for field, rows in (("policy.prompts_per_step * policy.num_responses",
                             p.prompts_per_step * p.num_responses),
                            ("generator.anchors_per_step * generator.num_lists",
                             g.anchors_per_step * g.num_lists)):
            need(rows % shards == 0, field, f"{rows} rows must divide over the mesh's "
                 f"data x fsdp = {shards} devices (set config.mesh.*)")
        # Each process samples and trains on its own block of a step's prompts / anchor
        # lists (`sharding.process_block`) on its own devices' rows.
        need(shards % process_count == 0, "mesh.data * mesh.fsdp",
             f"data x fsdp = {shards} must be a multiple of the {process_count} processes "
             "(each process's devices hold whole rows)")
    for field, items in (("policy.prompts_per_step", p.prompts_per_step),
                         ("generator.anchors_per_step", g.anchors_per_step)):
        need(items % process_count == 0, field, f"{items} must be a multiple of the "
             f"{process_count} processes (each samples its own block of a step's items)")


"""The typed, frozen settings of a run, one dataclass per role or concern (`rounds.settings`
reads them from the run config once; every stage reads these, never the ConfigDict).

Each field says where it came from in its metadata: "config" names the one config field
it is read from (the reader reads exactly that field, converted to the field's type), or
"from" names the fields a derived value is computed from (e.g. `policy.train`, the rule
reward, the generator's variant weights). Every "config" field is required: its default
lives in ONE place, `configs/base.py: base_config`, and the reader never supplies another.

    ModelSettings      model.*: the sources of the three roles, the dtypes
    LoraSettings       lora.*: the adapters of the trainees
    PolicySettings     policy.*: sampling, the reward, the redraws, its TrainConfig
    GeneratorSettings  generator.*: lists, budgets, sampling, reward weights, its TrainConfig
    VerifierSettings   verifier.*: what judges an item, and how
    WorldSettings      data.checks_dir / checks_world_version / refuse_cut_constraints
    RoundsSettings     rounds.*: the loop's schedule, the held-out evaluations
    RoleUse            which roles train and which models load (derived)
    MeshSettings, MemorySettings, CompileSettings, CheckpointSettings, LogSettings
    RunSettings        all of them, with seed, per_row_keys, variant, export and the data
                       layer's `data.DataSpec`

`config_field(cls, name)` gives a field's config field (or what it is derived from).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

from drubric_jax.data.loading import DataSpec
from drubric_jax.rl.rule_rewards import Rule
from drubric_jax.rl.train_config import TrainConfig


def read_from(field: str):
    """A dataclass field read from config field `field` (dotted, below `config.`); required."""
    return dataclasses.field(metadata={"config": field})


def derived(fields: str, flat: bool = True):
    """A field computed from the config fields `fields` (a description); flat=False leaves
    it out of `rounds.settings.flatten` (a function: the fields it comes from are there)."""
    return dataclasses.field(metadata={"from": fields, "flat": flat})


def config_field(cls, name: str) -> str:
    """The config field a settings field comes from ("config.policy.num_responses"), or
    "from <fields>" for a derived one.

    Raises:
        KeyError: `name` is not a field of `cls`.
    """
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}[name]
    return f"config.{meta['config']}" if "config" in meta else f"from {meta['from']}"


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The model sources (preset name, .gguf path or Hugging Face directory) and dtypes."""

    policy: str = read_from("model.policy")              # P_0
    generator: str = read_from("model.generator")        # G_0
    verifier: str = read_from("model.verifier")          # the frozen verifier
    dtype: str = read_from("model.dtype")                # compute / frozen storage
    master_dtype: str = read_from("model.master_dtype")  # trained params


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters of both trainees (rank 0: full fine-tuning)."""

    rank: int = read_from("lora.rank")
    alpha: float = read_from("lora.alpha")
    targets: tuple[str, ...] = read_from("lora.targets")


@dataclasses.dataclass(frozen=True)
class PolicySettings:
    """The policy's sampling, reward and training (units as configs/base.py says)."""

    prompts_per_step: int = read_from("policy.prompts_per_step")    # B
    num_responses: int = read_from("policy.num_responses")          # K
    max_prompt_tokens: int = read_from("policy.max_prompt_tokens")
    max_new_tokens: int = read_from("policy.max_new_tokens")
    min_prompt_bucket: int = read_from("policy.min_prompt_bucket")
    temperature: float = read_from("policy.temperature")
    top_p: float = read_from("policy.top_p")
    # The list temperature: the generator's decoding when its lists score the policy.
    rubric_temperature: float = read_from("policy.rubric_temperature")
    # The generator's decoding of the held-out evaluation lists (`rounds.heldout`).
    heldout_temperature: float = read_from("policy.heldout_temperature")
    rollout_micro_batch: int = read_from("policy.rollout_micro_batch")
    sampler: str = read_from("policy.sampler")                      # static | engine
    response_lengths: str = read_from("policy.response_lengths")
    cache_segments: int = read_from("policy.cache_segments")
    reward: str = read_from("policy.reward")                        # rubric | a rule's name
    reward_max_words: int = read_from("policy.reward_max_words")
    max_redraws: int = read_from("policy.max_redraws")
    train: TrainConfig = derived("policy.train.*, policy.temperature; micro_batch_size 0 = "
                                 "policy.prompts_per_step * policy.num_responses")
    # The rule reward, None for the rubric reward (`rl.rule_rewards.make_rule`).
    rule: Optional[Rule] = derived("policy.reward, policy.reward_max_words", flat=False)


@dataclasses.dataclass(frozen=True)
class GeneratorSettings:
    """The rubric generator's lists, budgets, sampling, rewards and training."""

    anchors_per_step: int = read_from("generator.anchors_per_step")
    num_lists: int = read_from("generator.num_lists")                # G
    max_items: int = read_from("generator.max_items")                # M_max
    max_item_chars: int = read_from("generator.max_item_chars")
    max_new_tokens: int = read_from("generator.max_new_tokens")
    input_budget: int = read_from("generator.input_budget")
    temperature: float = read_from("generator.temperature")          # its training lists
    rollout_micro_batch: int = read_from("generator.rollout_micro_batch")
    cache_segments: int = read_from("generator.cache_segments")
    sampler: str = read_from("generator.sampler")                    # static | engine
    response_lengths: str = read_from("generator.response_lengths")
    check_pool: tuple[str, ...] = read_from("generator.check_pool")  # () = every check
    keep_prompt: bool = read_from("generator.keep_prompt")
    # Each of an input's G lists shows the responses in its own order (then no shared
    # prompt: per-row updates); False: one order per input.
    orders_per_list: bool = read_from("generator.orders_per_list")
    # {reward name: the weight in config.generator[row.weight_field]} of every registered
    # generator reward (`rl.generator_rewards.GENERATOR_REWARDS`; disc_weight, lam).
    reward_weights: Mapping[str, float] = derived(
        "generator.<weight_field> of each rl.generator_rewards.GENERATOR_REWARDS row")
    # {reward name: w_n} under config.variant (`generator_rewards.variant_weights`); None
    # when no generator trains on rewards (variant "static").
    weights: Optional[Mapping[str, float]] = derived("generator.reward_weights, variant")
    train: TrainConfig = derived("generator.train.*, generator.temperature; micro_batch_size "
                                 "0 = generator.anchors_per_step * generator.num_lists")


@dataclasses.dataclass(frozen=True)
class VerifierSettings:
    """What judges an item (the verifier model's P(yes), or the checkers) and how."""

    kind: str = read_from("verifier.kind")                  # llm | checks
    loose: bool = read_from("verifier.loose")               # checks: IFEval's loose verdict
    check_workers: int = read_from("verifier.check_workers")
    max_prefix_tokens: int = read_from("verifier.max_prefix_tokens")
    max_suffix_tokens: int = read_from("verifier.max_suffix_tokens")
    verdict: str = read_from("verifier.verdict")            # hard | soft
    calibration: str = read_from("verifier.calibration")    # none | contextual
    memory_fraction: float = read_from("verifier.memory_fraction")


@dataclasses.dataclass(frozen=True)
class WorldSettings:
    """The checks world's fields of config.data that the data layer does not read."""

    checks_dir: str = read_from("data.checks_dir")
    version: int = read_from("data.checks_world_version")   # 0 = not the checks world
    refuse_cut_constraints: bool = read_from("data.refuse_cut_constraints")


@dataclasses.dataclass(frozen=True)
class RoundsSettings:
    """The loop's schedule (Algorithm 1) and its held-out evaluations."""

    num_rounds: int = read_from("rounds.num_rounds")
    generator_steps: int = read_from("rounds.generator_steps")
    policy_steps: int = read_from("rounds.policy_steps")
    heldout_eval: bool = read_from("rounds.heldout_eval")
    generator_rounds: int = read_from("rounds.generator_rounds")   # -1 = every round
    heldout_gold_every: int = read_from("rounds.heldout_gold_every")  # 0 = no gold curve
    heldout_gold_rows: int = read_from("rounds.heldout_gold_rows")
    heldout_gold_path: str = read_from("rounds.heldout_gold_path")
    # The split its rows must be under data.require_splits ("dev" | "heldout"; "" = any).
    heldout_gold_split: str = read_from("rounds.heldout_gold_split")


@dataclasses.dataclass(frozen=True)
class RoleUse:
    """Which roles train and which models the run loads (`rounds.model_sources`)."""

    policy_trains: bool = derived("rounds.policy_steps")
    generator_trains: bool = derived("rounds.generator_steps, rounds.generator_rounds, "
                                     "variant")
    generator_loaded: bool = derived("generator_trains, policy.reward, rounds.heldout_eval")
    verifier_loaded: bool = derived("verifier.kind")


@dataclasses.dataclass(frozen=True)
class MeshSettings:
    """The device mesh (-1: the remaining devices; num_devices 0: every device)."""

    data: int = read_from("mesh.data")
    fsdp: int = read_from("mesh.fsdp")
    tensor: int = read_from("mesh.tensor")
    num_devices: int = read_from("mesh.num_devices")


@dataclasses.dataclass(frozen=True)
class MemorySettings:
    """Where the idle trainee's AdamW moments wait during the other role's phase."""

    park_idle_optimizer: bool = read_from("memory.park_idle_optimizer")
    offload_idle_optimizer: bool = read_from("memory.offload_idle_optimizer")


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    """JAX's persistent compilation cache ("" = off)."""

    cache_dir: str = read_from("compile.cache_dir")


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """How often the loop saves, how many it keeps, whether a resume may change data."""

    every_steps: int = read_from("checkpoint.every_steps")
    max_to_keep: int = read_from("checkpoint.max_to_keep")
    allow_data_change: bool = read_from("checkpoint.allow_data_change")


@dataclasses.dataclass(frozen=True)
class LogSettings:
    """The run's console and trace outputs."""

    trace_prompts: int = read_from("log.trace_prompts")
    tensorboard: bool = read_from("log.tensorboard")
    progress: bool = read_from("log.progress")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything a run's stages read of its config, read once (`rounds.settings.read`).

    The properties policy_train, generator_train, policy_reward, rule and
    generator_weights name the values the layers below rounds/ take (they are fields of
    `policy` and `generator`)."""

    seed: int = read_from("seed")
    per_row_keys: bool = read_from("per_row_keys")  # each sampled row draws by its id
    variant: str = read_from("variant")             # full | disc_only | anchor_only | static
    export: bool = read_from("export")              # write DIR/export/<role>/ at the end
    model: ModelSettings = derived("model.*")
    lora: LoraSettings = derived("lora.*")
    policy: PolicySettings = derived("policy.*")
    generator: GeneratorSettings = derived("generator.*")
    verifier: VerifierSettings = derived("verifier.*")
    data: DataSpec = derived("data.*, seed, the batch sizes, the reward, the roles "
                             "(`rounds.settings.data_spec`)")
    world: WorldSettings = derived("data.checks_dir, data.checks_world_version, "
                                   "data.refuse_cut_constraints")
    rounds: RoundsSettings = derived("rounds.*")
    roles: RoleUse = derived("rounds.*, variant, policy.reward, verifier.kind")
    mesh: MeshSettings = derived("mesh.*")
    memory: MemorySettings = derived("memory.*")
    compile: CompileSettings = derived("compile.*")
    checkpoint: CheckpointSettings = derived("checkpoint.*")
    log: LogSettings = derived("log.*")

    @property
    def policy_train(self) -> TrainConfig:
        return self.policy.train

    @property
    def generator_train(self) -> TrainConfig:
        return self.generator.train

    @property
    def policy_reward(self) -> str:
        return self.policy.reward

    @property
    def rule(self) -> Optional[Rule]:
        return self.policy.rule

    @property
    def generator_weights(self) -> Optional[Mapping[str, float]]:
        return self.generator.weights

"""Every config file under configs/, with each of its ':' switches and each sweep entry, passes
its validation (before any compute, so no data file or model is read).

Run configs (configs/base.py layout) go through `config_check.validate` on the device count
they are written for; configs/eval_evaluator.py has its own `validate`.
"""
import pytest

from configs import (ablation, coevolution, eval_evaluator, eval_policy, grpo_learns, qwen3_8b,
                     smollm2_cpu)
from drubric_jax import config_check

SMOLLM2_SWITCHES = ["", "data=shared", "variant=full", "variant=disc_only",
                    "variant=anchor_only", "variant=static", "tiny", "world=checks",
                    "tiny,world=checks", "world=llm"]
QWEN3_SWITCHES = ["", "local", "lora"]


def _with_overrides(config, overrides):
    """`config` with get_sweep()-style overrides {"config.a.b": value} applied."""
    for key, value in overrides.items():
        *parents, leaf = key.split(".")[1:]
        node = config
        for name in parents:
            node = node[name]
        node[leaf] = value
    return config


# smollm2_cpu is the 2-core CPU default: one JAX device there. qwen3_8b is written for
# pods (its mesh puts 8 devices on fsdp); its `local` switch must run anywhere.
@pytest.mark.parametrize("module,switches,device_count", [
    (smollm2_cpu, SMOLLM2_SWITCHES, 1),
    (qwen3_8b, QWEN3_SWITCHES, 8),
    (qwen3_8b, ["local"], 1),
], ids=["smollm2_cpu-1dev", "qwen3_8b-8dev", "qwen3_8b_local-1dev"])
def test_run_configs_validate(module, switches, device_count):
    for arg in switches:
        config = module.get_config(arg)
        config_check.validate(config, device_count=device_count, process_count=1)
        for overrides in module.get_sweep():
            config_check.validate(_with_overrides(module.get_config(arg), overrides),
                                  device_count=device_count, process_count=1)


def test_smollm2_cpu_validates_on_8_devices():
    for arg in SMOLLM2_SWITCHES:
        config_check.validate(smollm2_cpu.get_config(arg), device_count=8, process_count=1)


@pytest.mark.parametrize("arg,device_count", [
    ("", 1), ("tiny", 1), ("scale=qwen3_8b", 8), ("scale=qwen3_8b,tiny", 1),
    ("world=checks", 1), ("scale=qwen3_8b,world=checks", 8)])
def test_grpo_learns_config_validates_for_both_parts(arg, device_count):
    config = grpo_learns.get_config(arg)
    assert config.rounds.generator_steps == 0  # policy-only: the generator stays G_0
    for reward in (config.experiment.rule, "rubric"):
        config.policy.reward = reward
        config_check.validate(config, device_count=device_count, process_count=1)
    with pytest.raises(ValueError, match="scale"):
        grpo_learns.get_config("scale=gpt2")


@pytest.mark.parametrize("arg,device_count", [
    ("", 1), ("tiny", 1), ("scale=qwen3_8b", 8), ("scale=qwen3_8b,tiny", 1),
    ("world=checks", 1), ("scale=qwen3_8b,world=checks", 8)])
def test_ablation_config_validates_for_every_variant(arg, device_count):
    config = ablation.get_config(arg)
    # Generator phase only, scored by the experiment on lists it never trains on.
    assert config.rounds.policy_steps == 0 and config.rounds.generator_steps >= 1
    assert config.data.heldout_anchor_rows >= 1 and not config.rounds.heldout_eval
    # One save at the end of a variant's steps at least (the experiment restores it).
    assert config.rounds.generator_steps % config.checkpoint.every_steps == 0
    for variant in config.experiment.variants.split(","):
        config.variant = variant
        config_check.validate(config, device_count=device_count, process_count=1)
    with pytest.raises(ValueError, match="scale"):
        ablation.get_config("scale=gpt2")


@pytest.mark.parametrize("arg,device_count", [
    ("", 1), ("tiny", 1), ("scale=qwen3_8b", 8), ("scale=qwen3_8b,tiny", 1)])
def test_coevolution_config_validates_for_both_arms(arg, device_count):
    config = coevolution.get_config(arg)
    assert config.rounds.num_rounds == 2 and config.rounds.generator_rounds == -1
    config_check.validate(config, device_count=device_count, process_count=1)
    config.rounds.generator_rounds = 1  # the stale arm
    config_check.validate(config, device_count=device_count, process_count=1)
    config.rounds.generator_rounds = -2
    with pytest.raises(config_check.ConfigError, match="rounds.generator_rounds"):
        config_check.validate(config, device_count=device_count, process_count=1)
    checks = coevolution.get_config(arg + ",world=checks")
    assert checks.verifier.kind == "checks"
    assert checks.experiment.eval_file.endswith("heldout.jsonl")
    config_check.validate(checks, device_count=device_count, process_count=1)


def test_eval_policy_config_validates_and_names_bad_fields():
    eval_policy.validate(eval_policy.get_config("tiny"))
    c = eval_policy.get_config("tiny")
    c.tasks = "winrate,bogus"
    with pytest.raises(ValueError, match="config.tasks"):
        eval_policy.validate(c)
    c = eval_policy.get_config("tiny")
    c.winrate_data = "/no/such/file.jsonl"
    with pytest.raises(ValueError, match="config.winrate_data: file not found"):
        eval_policy.validate(c)


@pytest.mark.parametrize("role", ["policy", "generator"])
def test_a_sampler_without_row_ids_is_refused(role):
    """The engine without `per_row_keys` (rows drawing by their place in a call) would
    give other samples than the static sampler: the config check refuses it, naming the
    field; with row ids it passes."""
    c = smollm2_cpu.get_config("")
    c[role].sampler = "engine"
    c.per_row_keys = False
    with pytest.raises(config_check.ConfigError, match=rf"config\.{role}\.sampler.*per_row_keys"):
        config_check.validate(c, device_count=1, process_count=1)
    c.per_row_keys = True
    config_check.validate(c, device_count=1, process_count=1)


def test_mesh_larger_than_device_count_is_a_config_error():
    with pytest.raises(config_check.ConfigError, match=r"config\.mesh"):
        config_check.validate(qwen3_8b.get_config(""), device_count=1, process_count=1)


def test_batch_items_and_row_shards_must_split_over_the_processes():
    """Each process samples its own block of a step's items on its own devices' rows
    (sharding.process_block): the counts must split evenly, and the error names the field."""
    config = qwen3_8b.get_config("")  # 8 devices on fsdp
    config.memory.park_idle_optimizer = False
    config.policy.prompts_per_step, config.generator.anchors_per_step = 8, 4
    config_check.validate(config, device_count=8, process_count=2)
    config.generator.anchors_per_step = 3
    with pytest.raises(config_check.ConfigError, match=r"generator\.anchors_per_step.*3 must "
                       r"be a multiple of the 2 processes"):
        config_check.validate(config, device_count=8, process_count=2)
    config.generator.anchors_per_step = 4
    with pytest.raises(config_check.ConfigError, match=r"mesh\.data \* mesh\.fsdp"):
        config_check.validate(config, device_count=8, process_count=16)
    config.memory.offload_idle_optimizer = False
    config.memory.park_idle_optimizer = True  # local disk: refused, pointing to the offload
    with pytest.raises(config_check.ConfigError, match=r"park_idle_optimizer.*single-process"
                       r".*memory\.offload_idle_optimizer"):
        config_check.validate(config, device_count=8, process_count=2)


@pytest.mark.parametrize("arg", ["", "tiny"])
def test_eval_evaluator_config_validates(arg, write_jsonl):
    config = eval_evaluator.get_config(arg)
    with pytest.raises(ValueError, match=r"config\.data"):
        eval_evaluator.validate(config)  # the data files are required
    path = write_jsonl([{"id": "a", "source": "t:t", "prompt": "p", "responses": ["x", "y"],
                         "ranking": [0, 1]}])
    config.data = f"{path},{path}"
    eval_evaluator.validate(config)


@pytest.mark.parametrize("module,arg", [(smollm2_cpu, ""), (qwen3_8b, ""), (qwen3_8b, "lora"),
                                        (grpo_learns, "")])
def test_every_trainer_field_is_in_the_config_and_overridable(module, arg):
    """Each TrainConfig field (but the sampler's temperature) is a field of both trainees'
    `train` node, so `--config.policy.train.<name>=...` reaches it (a missing node field is
    an AttributeError when the flag is parsed); a set value goes through from_config."""
    import dataclasses

    from drubric_jax.rl.train_config import TrainConfig

    config = module.get_config(arg)
    names = {f.name for f in dataclasses.fields(TrainConfig)} - {"temperature"}
    for role in ("policy", "generator"):
        assert names <= set(config[role].train.keys()), (role, names - set(config[role].train))
    config.policy.train.kl_estimator = "k1"
    config.policy.train.eps = 1e-6
    rows = config.policy.prompts_per_step * config.policy.num_responses  # a step's rows
    from drubric_jax.rounds.settings import train_config

    tc = train_config(config.policy.train, "policy.train", rows=rows, temperature=1.0,
                      config=config)
    assert (tc.kl_estimator, tc.eps) == ("k1", 1e-6)
    config.policy.train.kl_estimator = "k9"
    with pytest.raises(config_check.ConfigError, match="config.policy.train.kl_estimator"):
        config_check.validate(config, device_count=8, process_count=1)
    config.policy.train.kl_estimator = "k3"
    config.policy.sampler = "vllm"
    with pytest.raises(config_check.ConfigError, match="config.policy.sampler"):
        config_check.validate(config, device_count=8, process_count=1)
    config.policy.sampler = "engine"
    config.per_row_keys = True  # the engine draws by row id
    config.generator.response_lengths = "0.5:10,0.1:20"
    with pytest.raises(config_check.ConfigError, match="config.generator.response_lengths"):
        config_check.validate(config, device_count=8, process_count=1)


def test_remat_is_true_false_or_auto_and_a_bad_value_is_named():
    """`config.<role>.train.remat` takes True, False or "auto" (the default: the run decides
    from the update's memory, `memory.planner.resolve_remat`), set in Python or on the
    command line (a field of any type: `--config.policy.train.remat=False` parses to the
    bool); anything else is refused naming the field. A TrainConfig holds the bool."""
    from absl import flags
    from ml_collections import config_flags

    from drubric_jax.rl.train_config import TrainConfig
    from drubric_jax.rounds.settings import train_config

    config = smollm2_cpu.get_config("world=checks")
    assert config.policy.train.remat == config.generator.train.remat == "auto"
    for value in (True, False, "auto"):
        config.generator.train.remat = value
        config_check.validate(config, device_count=1, process_count=1)
    for bad in ("yes", "False", 1, None):
        config.generator.train.remat = bad
        with pytest.raises(config_check.ConfigError,
                           match=r"config\.generator\.train\.remat: must be True, False or "
                                 r"'auto' \(got "):
            config_check.validate(config, device_count=1, process_count=1)
    with pytest.raises(config_check.ConfigError, match=r"TrainConfig\.remat"):
        TrainConfig(remat="auto")
    # What a command-line override gives the field (config_flags parses by its type).
    for text, value in (("False", False), ("True", True), ("auto", "auto")):
        argv = ["run", f"--config={smollm2_cpu.__file__}:world=checks",
                f"--config.policy.train.remat={text}"]
        values = flags.FlagValues()
        config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                        sys_argv=argv)
        values(argv)
        got = values.config.policy.train.remat
        assert got == value and type(got) is type(value), (text, got)
    config.policy.train.remat = False
    rows = config.policy.prompts_per_step * config.policy.num_responses
    assert train_config(config.policy.train, "policy.train", rows=rows, temperature=1.0,
                        config=config).remat is False

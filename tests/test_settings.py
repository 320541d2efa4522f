"""The run's settings resolved once (`rounds.settings`, issue 53; METHOD 15): the Q1 arms
differ only in their reward, every stage of a run reads the settings and never the
ConfigDict, and each run writes them, flattened, to settings.json."""
import dataclasses
import json
import os

import ml_collections
import pytest

from drubric_jax.rounds import loop, settings
from drubric_jax.rounds.settings_types import PolicySettings, RunSettings, config_field
from drubric_jax.types import ConfigError
from helpers import one_round_config, tiny_config, write_checks_world

# What a Q1 arm may change against the gold arm (METHOD 15: "the reward, or the generator
# behind a rubric reward"), and nothing else:
#   policy.reward            the reward itself (config.policy.reward)
#   model.generator          the generator behind a rubric reward (config.model.generator)
# and what a reward necessarily brings with it, derived from config.policy.reward:
#   data.true_checks_reward  the reward that reads each prompt's true checks (gold, oracle)
#   roles.generator_loaded   a rubric reward loads a generator; gold and oracle load none
REWARD_FIELDS = {"policy.reward", "model.generator", "data.true_checks_reward",
                 "roles.generator_loaded"}


@pytest.mark.parametrize("switches", ["tiny", ""])
def test_arms_differ_only_in_their_reward(tmp_path, switches):
    """Every Q1 arm's resolved settings (configs/checks_policy.py `arm_config`, read by
    `settings.read`, flattened) equal the gold arm's outside REWARD_FIELDS; the list
    temperature is the experiment's in every arm."""
    from configs import checks_policy
    from drubric_jax.evaluation.checks_policy import ARMS

    c = checks_policy.get_config(switches)
    for field in ("sft_generator", "trained_generator"):  # dummy generator directories
        (tmp_path / field).mkdir()
        c.experiment[field] = str(tmp_path / field)
    flat = {arm: settings.flatten(settings.read(checks_policy.arm_config(c, arm, seed=0)))
            for arm in ARMS}
    gold = flat["gold"]
    for arm, f in flat.items():
        assert f.keys() == gold.keys(), arm
        differ = {k for k in f if f[k] != gold[k]}
        assert differ <= REWARD_FIELDS, (arm, {k: (gold[k], f[k]) for k in
                                               differ - REWARD_FIELDS})
        # Each arm does differ in its reward (the comparison is not vacuous).
        assert (arm == "gold") == ("policy.reward" not in differ), arm
        assert f["policy.rubric_temperature"] == c.experiment.list_temperature, arm
    assert flat["rubric_sft"]["model.generator"] == str(tmp_path / "sft_generator")
    assert flat["rubric_trained"]["model.generator"] == str(tmp_path / "trained_generator")
    assert flat["rubric_g0"]["model.generator"] == gold["model.generator"]


class ConfigReadAfterSettings(AssertionError):
    """A stage read the ConfigDict after `settings.read` had read it."""


class _Poisoned(dict):
    """A ConfigDict's field table that refuses every read (and records it)."""

    reads: list = []

    def _refuse(self, *args, **kw):
        _Poisoned.reads.append(args[:1])
        raise ConfigReadAfterSettings(f"the ConfigDict was read after settings.read: {args[:1]}")

    __getitem__ = get = __contains__ = __iter__ = keys = items = values = __len__ = _refuse


def poison(config: ml_collections.ConfigDict) -> None:
    """Makes every node of `config` refuse any read, in place (children first)."""
    for child in list(config._fields.values()):
        if isinstance(child, ml_collections.ConfigDict):
            poison(child)
    object.__setattr__(config, "_fields", _Poisoned(config._fields))


@pytest.mark.usefixtures("smollm2_gguf")
@pytest.mark.parametrize("world", ["checks", pytest.param("llm", marks=pytest.mark.slow)])
def test_every_stage_reads_the_resolved_settings(tmp_path, monkeypatch, world):
    """A one-round tiny run (configs/smollm2_cpu.py:tiny, `helpers.one_round_config`) whose
    ConfigDict refuses every read once `settings.read` has read it: the run still takes a
    generator step and a policy step, evaluates the held-out anchor lists, checkpoints and
    finishes, so no stage after the read touches the ConfigDict; settings.json holds the
    settings, flattened. The checks world (world v2 on `helpers.write_checks_world`'s rows)
    also has the checkers' verifier, the cut-constraint check of the rows and the held-out
    gold curve; the LLM world (slow: it loads a verifier model) the verifier model."""
    data = tmp_path / "checks_world"
    if world == "checks":
        data.mkdir()
        write_checks_world(str(data))

    def tiny_run_config():
        c = one_round_config() if world == "llm" else tiny_config(
            extra=f"world=checks,checks_dir={data}")
        c.rounds.num_rounds = 1
        if world == "checks":  # the gold curve (on the world's dev split), each step
            c.rounds.heldout_gold_every, c.rounds.heldout_gold_rows = 1, 1
        return c

    config = tiny_run_config()
    want = settings.flatten(settings.read(tiny_run_config()))
    real_read, poisoned = settings.read, []

    def read_then_poison(c):
        out = real_read(c)
        poison(c)
        poisoned.append(c)
        return out

    monkeypatch.setattr(settings, "read", read_then_poison)
    monkeypatch.setattr(_Poisoned, "reads", [])
    workdir = str(tmp_path / "run")
    loop.run(config, workdir)
    assert poisoned == [config]  # read once, then unreadable
    with pytest.raises(ConfigReadAfterSettings):
        config.policy.num_responses
    assert _Poisoned.reads == [("policy",)]  # no read but the one just above
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    kinds = {(r["kind"], r["phase"]) for r in rows}
    assert {("train", "generator"), ("train", "policy"), ("heldout", "generator"),
            ("heldout", "policy")} <= kinds, kinds
    assert (("heldout_gold", "policy") in kinds) == (world == "checks")
    assert os.listdir(os.path.join(workdir, "checkpoints"))
    assert os.path.exists(os.path.join(workdir, loop.FINISHED))
    with open(os.path.join(workdir, settings.SETTINGS_FILE)) as f:
        assert json.load(f) == want


def test_settings_are_typed_frozen_and_name_their_config_field():
    """`read` gives frozen settings whose fields name their config field; a missing field
    or one of the wrong type is refused, naming it; flatten gives JSON values by dotted
    field, whole (every leaf of the settings, the rule reward left out)."""
    c = one_round_config()
    s = settings.read(c)
    assert isinstance(s, RunSettings) and s.policy.num_responses == c.policy.num_responses
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.policy.rubric_temperature = 0.5
    assert config_field(PolicySettings, "rubric_temperature") == "config.policy.rubric_temperature"
    assert config_field(PolicySettings, "rule").startswith("from policy.reward")
    flat = settings.flatten(s)
    assert flat["policy.sampler"] == "static" and flat["per_row_keys"] is False
    assert flat["policy.train.learning_rate"] == c.policy.train.learning_rate
    assert "policy.rule" not in flat and json.loads(json.dumps(flat)) == flat
    del c.policy.sampler
    with pytest.raises(ConfigError, match=r"^config\.policy\.sampler: missing"):
        settings.read(c)
    # A config built without type safety (ConfigDict's own keeps a field's type).
    c = ml_collections.ConfigDict(one_round_config().to_dict(), type_safe=False)
    c.per_row_keys = 1
    with pytest.raises(ConfigError, match=r"^config\.per_row_keys: must be True or False"):
        settings.read(c)

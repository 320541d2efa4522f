"""The memory planner (`drubric_jax.memory.planner`): its sizes against hand counts, its verdict
text, and its figures against XLA's compiled memory analysis of the same jitted functions
on 8 fake CPU devices (`drubric_jax.memory.compiled`).

Hand counts use the `tiny` preset: V = 49152, D = 64, L = 2, H = 4, Hkv = 2, Dh = 16,
F = 128, tied embeddings, float32.
"""
import pytest

from configs import qwen3_8b, smollm2_cpu
from drubric_jax import config_check, sampling
from drubric_jax.memory import planner
from drubric_jax.memory.inference_terms import kv_cache_bytes
from drubric_jax.models.config import TINY

# embed [V, D]; per layer: attn_norm [D], wq [D, H*Dh], wk, wv [D, Hkv*Dh], wo [H*Dh, D],
# mlp_norm [D], w_gate, w_up [D, F], w_down [F, D]; final_norm [D].
TINY_LAYER = 64 + 64 * 64 + 2 * 64 * 32 + 64 * 64 + 64 + 3 * 64 * 128
TINY_PARAMS = 49152 * 64 + 2 * TINY_LAYER + 64
NORMS = 2 * 2 * 64 + 64  # [L, D] x 2 and [D]: replicated on every device


def _tiny():
    c = smollm2_cpu.get_config("tiny")  # full fine-tuning, float32, mu in bfloat16, parking
    c.generator.anchors_per_step = 2    # 8 rubric lists: the rows divide over 8 devices
    c.mesh.num_devices = 0              # all 8 fake devices (the CPU config uses one)
    return c


def _terms(terms):
    return {t.name: t.bytes for t in terms}


def test_resident_bytes_match_hand_counts():
    p = planner.plan(_tiny(), 8, mesh_sizes=(1, 8, 1), search=False)
    assert TINY_PARAMS == 3_219_776
    per_device = (TINY_PARAMS - NORMS) // 8 + NORMS  # fsdp = 8 splits D (64) of every matrix
    device = _terms(p.resident["generator"])
    host = _terms(p.host["generator"])
    assert device["base tiny (float32), once for: policy_ref, generator_ref, verifier"] == \
        per_device * 4
    assert device["policy full params (float32)"] == per_device * 4
    # AdamW: mu bfloat16 + nu float32 per entry, and two int32 step counters (replicated).
    moments = per_device * (2 + 4) + 2 * 4
    assert device["generator AdamW moments (mu bfloat16, nu float32)"] == moments
    assert host == {"policy AdamW moments (mu bfloat16, nu float32)": moments}  # parked


def test_lora_adapters_and_kv_caches_match_hand_counts():
    c = _tiny()
    c.lora.rank = 4
    p = planner.plan(c, 8, mesh_sizes=(1, 8, 1), search=False)
    # A [L, in, r] is split like W's input dim, B [L, r, out] like its output dim: fsdp
    # splits D, so A of wq, wk, wv, w_gate, w_up and B of wo, w_down are split by 8.
    per_layer = ((64 * 4 // 8 + 4 * 64) + 2 * (64 * 4 // 8 + 4 * 32)    # wq; wk, wv
                 + (64 * 4 + 4 * 64 // 8)                                 # wo
                 + 2 * (64 * 4 // 8 + 4 * 128) + (128 * 4 + 4 * 64 // 8))  # w_gate, w_up; w_down
    assert _terms(p.resident["policy"])["policy LoRA adapters r=4 (float32)"] == \
        2 * per_layer * 4
    steps = {(s.phase, s.name): s for s in p.steps}
    sample = _terms(steps["policy", "policy sampling"].terms)
    # 8 rows over fsdp = 8 (1 a device) x (P = bucket(128) + N = 16) slots: k and v
    # [L, R, Hkv, S, Dh] float32.
    assert sample["KV cache (1 of 8 rows x 144 slots)"] == 2 * 2 * 1 * 2 * 144 * 16 * 4 == \
        kv_cache_bytes(TINY, 8, 144, planner.abstract_mesh(c, 8, (1, 8, 1)))
    # The rollout copy, made in the per-layer form the CPU and GPU decode runs on: every
    # fsdp-split leaf whole on each device (float32 is the compute dtype), the final norm
    # not copied; every block leaf is an output of the per-layer copy, so the layer norms
    # and all the adapters (whole: A [in, 4] and B [4, out] of the 7 targets) count too,
    # and no second per-layer copy of the blocks is made.
    adapters = (64 * 4 + 4 * 64) + 2 * (64 * 4 + 4 * 32) + (64 * 4 + 4 * 64) \
        + 2 * (64 * 4 + 4 * 128) + (128 * 4 + 4 * 64)
    assert sample["rollout copy of the weights (decode layout, compute dtype, per-layer "
                  "blocks)"] == (TINY_PARAMS - 64 + 2 * adapters) * 4
    assert not any(name.startswith("per-layer copy of the block weights") for name in sample)
    # Verifier at its default budgets: prefix bucket 512 + suffix bucket 32 slots; 32768
    # row-slots // 544 -> 16 items per pass (the item chunk), then 2 prefixes per pass.
    verify = _terms(steps["policy", "verification"].terms)
    # The 2 rows of a pass are padded to the 8 row shards: 1 a device.
    assert verify["verifier KV cache (1 of 2 rows x 544 slots)"] == 2 * 2 * 1 * 2 * 544 * 16 * 4
    assert verify["repeated cache (16 rows)"] == 16 * 2 * 2 * 1 * 2 * 544 * 16 * 4


def test_verdict_names_the_largest_term_and_the_field_that_shrinks_it():
    c = _tiny()
    p = planner.plan(c, 8, device_memory_gb=0.05, mesh_sizes=(1, 8, 1))
    big = p.largest(p.worst)
    text = p.verdict()
    assert text.startswith("DOES-NOT-FIT") and big.name in text and big.field in text
    roomy = planner.plan(c, 8, device_memory_gb=10.0, mesh_sizes=(1, 8, 1))
    assert roomy.fits and roomy.verdict().startswith("FITS")
    assert roomy.largest(roomy.worst).name in roomy.verdict()


def test_qwen3_8b_lora_fits_one_h200_and_full_fits_eight_80gb():
    """The memory plan's verdicts (docs/SCALE.md): at the paper's lengths, with blockwise attention, LoRA fits
    one 141 GB device and full fine-tuning (idle moments offloaded) 8 x 80 GB; with this
    package's dense attention neither does, and the verdict says which field to change.
    Their updates run per row (`train.shared_prefix=False` in configs/qwen3_8b.py): in
    groups, a device's pass holds a whole group of P + R N = 90,112 generator tokens, which
    does not fit 80 GB (the verdict names shared_prefix) and fits 141 GB."""
    lora = planner.plan(qwen3_8b.get_config("lora"), 1, 141, attention="blockwise")
    assert lora.fits, lora.verdict()
    picked = {(s.phase, s.name): s.rows for s in lora.steps if s.of_rows}
    assert picked["policy", "policy update"] == \
        qwen3_8b.get_config("lora").policy.train.micro_batch_size
    assert picked["generator", "generator update"] == \
        qwen3_8b.get_config("lora").generator.train.micro_batch_size
    full = planner.plan(qwen3_8b.get_config(""), 8, 80, attention="blockwise")
    assert full.fits, full.verdict()
    assert not any(s.group for s in full.steps)
    grouped = qwen3_8b.get_config("")
    grouped.policy.train.shared_prefix = grouped.generator.train.shared_prefix = True
    tight = planner.plan(grouped, 8, 80, attention="blockwise")
    assert tight.verdict().startswith("DOES-NOT-FIT"), tight.verdict()
    assert "config.generator.train.shared_prefix=False" in tight.verdict()
    assert tight.worst.group == 8 and tight.worst.rows == 64  # one group of 8 a device
    assert planner.plan(grouped, 8, 141, attention="blockwise").fits
    dense = planner.plan(qwen3_8b.get_config("lora"), 1, 141, attention="dense")
    assert dense.verdict().startswith("DOES-NOT-FIT")
    assert "attention dense" in dense.verdict()
    assert "ModelConfig.attention=blockwise" in dense.verdict()


@pytest.mark.parametrize("groups,r,micro_batch,shards", [
    (2, 4, 8, 8),    # fewer groups than row shards: split into 8 packed rows of 1 row
    (2, 8, 16, 4),   # split into 4 packed rows of 4, one a device
    (8, 4, 32, 8),   # a group a device, one pass
    (32, 8, 8, 8),   # the paper's generator shape with 8 rows a pass: one group a pass
    (3, 4, 4, 1),    # one device: one group a pass
    (6, 2, 4, 2)])   # padded to 6 (a multiple of 2), 2 groups a pass
def test_group_layout_is_the_batch_the_run_builds(groups, r, micro_batch, shards):
    """`terms.group_layout` (what the planner counts) against the run's own batch
    (`rounds.phases.train_batch` with every group live, `train_step.micro_batches`): the
    same padded group count and the same micro-batches."""
    import jax
    import numpy as np

    from drubric_jax import parallel
    from drubric_jax.memory.train_terms import group_layout
    from drubric_jax.rl import train_step as ts
    from drubric_jax.rl.train_config import TrainConfig
    from drubric_jax.rounds import phases
    from drubric_jax.rounds.context import PhaseStep, Timer
    from test_shared_prefix import synthetic_rollout

    rollout = synthetic_rollout((groups, r, 6, 4), vocab=64)
    rows = groups * r
    step = PhaseStep(rollout, np.zeros(rows, np.float32), np.ones(rows, bool), {}, Timer())
    mesh = None if shards == 1 else parallel.make_mesh(1, shards, 1, jax.devices()[:shards])
    tc = TrainConfig(micro_batch_size=micro_batch)
    batch, total = phases.train_batch(step, tc, mesh)
    # A step of fewer groups than row shards splits its groups (`rows_per_pass`).
    rp = ts.rows_per_pass(r, groups, shards)
    assert batch.tokens.shape[1] == rp
    lay = group_layout(rows, rp, micro_batch // rp * rp, shards)
    assert total == lay.groups == batch.tokens.shape[0]
    assert ts.micro_batches(batch, tc) == lay.passes
    assert lay.per_pass * lay.passes == lay.groups
    assert lay.per_device == -(-lay.per_pass // shards)


def test_grouped_update_terms_by_hand():
    """The grouped update's terms (`terms.train_terms`, `train.shared_prefix`) on the tiny
    config, 8 prompts x K = 4 over fsdp = 8, 32 rows a pass: one group a device, packed as
    one row of P + K N = 128 + 4 x 16 = 192 tokens where the per-row update runs 4 rows of
    P + N = 144 (576 tokens); its three attentions (the prompt's causal [P x P], the
    answers' [K N x P] over it, each answer's [N x N]); the head on the K N answer tokens."""
    from drubric_jax.memory import terms

    c = _tiny()
    c.policy.prompts_per_step = 8
    c.policy.train.micro_batch_size = 32
    c.policy.train.remat = True
    # One-token logits chunks (3 float32 [4, 1, V] = 2.4 MB), so the recomputed layer and
    # its attention (3.5 MB) are the pass's larger part and appear in the terms.
    c.policy.train.logits_chunk = 1
    p = planner.plan(c, 8, mesh_sizes=(1, 8, 1), search=False)
    step = next(s for s in p.steps if s.name == "policy update")
    assert (step.rows, step.of_rows, step.group) == (32, 32, 4)
    got = _terms(step.terms)
    cfg = TINY  # L = 2, D = 64, H = 4, Dh = 16, F = 128, float32
    pp, n, k = 128, 16, 4
    packed = pp + k * n
    assert got[f"remat residuals (L x 1 group x (P + R N = {pp} + {k} x {n}) x D)"] == \
        cfg.num_layers * packed * cfg.dim * 4
    # TRAIN_WIDTHS per token: 10 D-wide and 6 H*Dh-wide float32, 15 F-wide (float32 here).
    d, f, q = terms.TRAIN_WIDTHS
    layer = packed * ((d * 64 + q * 64) * 4 + f * 128 * 4)
    attention = terms.TRAIN_ATTENTION * 4 * 4 * (pp * pp + k * n * pp + k * n * n)
    assert got["one recomputed layer (+ its gradients)"] == layer
    assert got[f"attention dense ({terms.TRAIN_ATTENTION} x float32 [1, H, {pp}, {pp}] + "
               f"[1, H, {k * n}, {pp}] + [{k}, H, {n}, {n}])"] == attention
    # 32 rows a pass over 8 devices: 4 scored rows a device, chunks [4, 1, V] (smaller).
    assert terms.TRAIN_LOGITS * 4 * 1 * cfg.vocab_size * 4 < layer + attention
    assert not any(name.startswith("logits chunks") for name in got)
    assert got["batch arrays"] == 1 * packed * terms.BATCH_BYTES
    # Per row, the same rows hold K (P + N) tokens a device's pass: 3x the prompt.
    c.policy.train.shared_prefix = False
    rows = next(s for s in planner.plan(c, 8, mesh_sizes=(1, 8, 1), search=False).steps
                if s.name == "policy update")
    assert _terms(rows.terms)[f"remat residuals (L x 4 rows x T={pp + n} x D)"] == \
        cfg.num_layers * k * (pp + n) * cfg.dim * 4
    assert rows.group == 0 and k * (pp + n) == 3 * packed


def test_remat_auto_is_decided_by_the_update_memory():
    """`train.remat="auto"`: False exactly when the update planned with every layer's
    activations saved fits the memory less the headroom (its phase's resident state + the
    step's transients); True and False stand as set; unknown memory recomputes."""
    c = smollm2_cpu.get_config("world=checks")
    assert c.policy.train.remat == c.generator.train.remat == "auto"
    for role in ("policy", "generator"):
        choice = planner.remat_choice(c, role, 1, 100.0, backend="cpu")
        assert choice.remat is False and choice.peak <= choice.usable
        # The decision flips where the peak meets the usable memory.
        at = choice.peak / ((1 - planner.DEFAULT_HEADROOM) * planner.GB)
        assert planner.remat_choice(c, role, 1, at * 1.001, backend="cpu").remat is False
        assert planner.remat_choice(c, role, 1, at * 0.999, backend="cpu").remat is True
        assert planner.remat_choice(c, role, 1, None).remat is True
        assert "auto -> False" in choice.describe() and "fits" in choice.describe()
        # The peak is the plan's own update step, planned without remat.
        flat = planner.with_remat(c, {"policy": False, "generator": False})
        p = planner.plan(flat, 1, 100.0, search=False, backend="cpu")
        step = next(s for s in p.steps if s.name == f"{role} update")
        assert choice.peak == p.peak(step)
    c.policy.train.remat = False
    c.generator.train.remat = True
    assert planner.remat_choice(c, "policy", 1, 0.001).remat is False
    assert planner.remat_choice(c, "generator", 1, 1e6).remat is True
    assert planner.resolve_remat(c, "policy") is False
    with pytest.raises(config_check.ConfigError, match="config.policy.train.remat"):
        planner.resolve_remat(None, "policy", "auto")


def test_the_run_builds_its_train_configs_with_the_planners_decision():
    """`rounds.settings.train_config` turns "auto" into the bool through `rounds.remat`:
    the planner's `resolve_remat` once `memory.remat.install()` handed it over (every
    experiment entry point does, `experiments.cli.run`), True where nothing did."""
    from drubric_jax.memory import remat as memory_remat
    from drubric_jax.rounds import remat as run_remat
    from drubric_jax.rounds import settings

    c = smollm2_cpu.get_config("world=checks")
    rows = c.policy.prompts_per_step * c.policy.num_responses

    def built():
        return settings.train_config(c.policy.train, "policy.train", rows=rows,
                                     temperature=1.0, config=c).remat

    before = run_remat.use_planner(None)
    try:
        assert built() is True
        calls = []
        run_remat.use_planner(lambda config, role: calls.append(role) or False)
        assert built() is False and calls == ["policy"]
        memory_remat.install()
        assert run_remat._planner is memory_remat.resolve_remat
        assert built() is memory_remat.resolve_remat(c, "policy")
        c.policy.train.remat = True  # a bool is never planned
        assert built() is True
    finally:
        run_remat.use_planner(before)


@pytest.mark.parametrize("module,arg", [
    ("smollm2_cpu", "world=checks"), ("grpo_learns", "world=checks"),
    ("ablation", "world=checks"), ("coevolution", "world=checks"), ("checks_policy", ""),
    ("sensitivity", "")])
def test_cpu_configs_train_without_remat_in_the_checks_world(module, arg):
    """The CPU configs at the checks world's shapes (SmolLM2-135M, LoRA rank 16, one
    device): "auto" gives no remat for both trainees on a host with the 7 GB the README
    asks `make run` to have free; the plan's peaks are 3.8 GB (policy: 2 prompts x 8
    answers of 64 after 128 prompt tokens, one pass) and 5.4 GB (generator: one input of
    1,536 tokens and its 4 lists of 96, a pass)."""
    import importlib

    c = importlib.import_module(f"configs.{module}").get_config(arg)
    for role in ("policy", "generator"):
        choice = planner.remat_choice(c, role, c.mesh.num_devices or 1, 7.0, backend="cpu")
        assert choice.setting == "auto" and choice.remat is False, choice.describe()


def test_plan_prints_the_update_layout_and_the_remat_decision():
    """The plan's text says, per update, whether it runs grouped or per row, and what each
    trainee's remat came out as; memory.json's "planned" carries both."""
    c = _tiny()
    p = planner.plan(c, 8, device_memory_gb=10.0, mesh_sizes=(1, 8, 1), search=False)
    text = p.table()
    # 2 prompts x K = 4 over 8 row shards: each group splits into 4 packed rows of one
    # answer (`train_step.rows_per_pass`: no device holds only filler).
    assert "policy update, 8 of 8 rows in groups of 1 sharing a prefix (grouped update)" in text
    c.policy.prompts_per_step = 8  # 8 groups fill the 8 shards: whole groups of 4
    text = planner.plan(c, 8, device_memory_gb=10.0, mesh_sizes=(1, 8, 1),
                        search=False).table()
    assert "policy update, 32 of 32 rows in groups of 4 sharing a prefix (grouped update)" \
        in text
    assert "config.policy.train.remat=auto -> False" in text
    assert p.to_json()["remat"] == {"generator": False, "policy": False}
    assert p.config.policy.train.remat is False  # the config as planned
    c.policy.train.shared_prefix = False
    c.policy.train.remat = True
    text = planner.plan(c, 8, mesh_sizes=(1, 8, 1), search=False).table()
    assert "policy update, 32 of 32 rows (per-row update)" in text
    assert "config.policy.train.remat=True -> True (set in the config)" in text


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["static", "engine"])
def test_planned_steps_are_within_25_percent_of_the_compiled_memory_analysis(sampler):
    """Each step's transient bytes (beyond the resident state) against `memory_analysis()`
    of its jitted functions compiled on 8 fake CPU devices (float32: no CPU-only operand
    copies). 25%: the planner counts the large buffers of each step, not every small one,
    and where XLA reuses or fuses buffers differs from one shape to another. With
    `sampler = "engine"` for both roles the sampling steps are the rollout engine's
    (`inference_terms.engine_sampling_terms` against `compiled_engine.engine_peaks`); the other
    steps are the same programs, so only the sampling steps are compiled again."""
    import jax

    from drubric_jax import parallel
    from drubric_jax.memory import compiled as planner_compiled
    from drubric_jax.memory.planner import Workload
    from drubric_jax.memory.terms import RoleModels

    c = _tiny()
    c.policy.sampler = c.generator.sampler = sampler
    c.per_row_keys = True  # the engine draws by row id (`config_check`)
    p = planner.plan(c, 8, search=False)
    mesh = parallel.make_mesh(*p.mesh.values(), jax.devices()[:8])
    only = ("sampling",) if sampler == "engine" else ()
    planner_compiled.measure_plan(p, RoleModels.from_config(p.config),
                                  Workload.from_config(p.config), mesh,
                                  only)
    for s in p.steps:
        if only and "sampling" not in s.name:
            continue
        assert s.compiled_how == "compiled"
        if sampler == "engine":
            assert any(t.name.startswith("engine paged KV cache") for t in s.terms)
        # A blockwise-attention step (long prompts: "auto" picks blockwise) adds the
        # attention tiles to the layer's other activations, which XLA does not keep live at
        # the same time: there the plan is a bound from above, measured 1.25x here.
        blockwise = any("attention blockwise" in t.name for t in s.terms)
        hi = 1.35 if blockwise else 1.25
        assert 0.75 <= s.transient / s.compiled <= hi, (s.phase, s.name, s.transient,
                                                        s.compiled)


@pytest.mark.slow
def test_planned_steps_hold_on_programs_not_used_to_fit_them():
    """The 25% band of the test above on programs its constants were not fitted to:
    configs/qwen3_8b.py's `local` code path (Qwen3 tiny models: untied output head,
    qk-norm, a mixture-of-experts verifier), full fine-tuning, on 8 fake CPU devices.
    Measured 0.95-1.20 here once the untied head stopped counting the embedding's gradient
    twice (it read 1.34 before). Its LoRA programs (`local,lora`) read 0.75 and 0.80 for
    the two updates, at the band's edge: the planner under-counts them by about one logits
    chunk, an open gap, so they are not asserted here (docs/SCALE.md, "Memory plan")."""
    import jax

    from drubric_jax import parallel
    from drubric_jax.memory import compiled as planner_compiled
    from drubric_jax.memory.planner import Workload
    from drubric_jax.memory.terms import RoleModels

    c = qwen3_8b.get_config("local")
    c.mesh.num_devices = 0  # all 8 fake devices
    p = planner.plan(c, 8, search=False)
    mesh = parallel.make_mesh(*p.mesh.values(), jax.devices()[:8])
    planner_compiled.measure_plan(p, RoleModels.from_config(p.config),
                                  Workload.from_config(p.config), mesh)
    measured = [s for s in p.steps if s.compiled_how == "compiled"]
    assert {s.name for s in measured} >= {"policy update", "generator update"}
    for s in measured:
        blockwise = any("attention blockwise" in t.name for t in s.terms)
        hi = 1.35 if blockwise else 1.25
        assert 0.75 <= s.transient / s.compiled <= hi, (s.phase, s.name, s.transient,
                                                        s.compiled)


@pytest.mark.slow
@pytest.mark.parametrize("shared_prefix", [False, True], ids=["per_row", "grouped"])
def test_saved_activations_without_remat_match_the_compiled_difference(shared_prefix):
    """train.remat=False: what the update steps hold on top of the remat ones (each layer's
    activations instead of its input) against the same difference of `memory_analysis()`
    of the compiled steps, within 25%; each whole step stays within the 25% band of the
    test above. Per row (measured 0.97-0.98 here, 0.90-0.96 at SmolLM2 widths) and in
    groups sharing a prefix (`train.shared_prefix`: 8 groups of 4 a pass, one a device:
    the layout the planner counts; a pass of fewer groups than devices is placed by XLA)."""
    import jax

    from drubric_jax import parallel
    from drubric_jax.memory import compiled as planner_compiled
    from drubric_jax.memory.planner import Workload
    from drubric_jax.memory.terms import RoleModels

    steps = {}
    for remat in (True, False):
        c = _tiny()
        # Longer policy rows (dense attention, 640 tokens) so the activations are not
        # lost beside the logits chunks.
        c.policy.max_new_tokens, c.policy.train.micro_batch_size = 512, 8
        if shared_prefix:
            # 8 prompts and 8 anchors of 4 rows each, 8 groups a pass: one a device.
            c.policy.prompts_per_step = c.generator.anchors_per_step = 8
            c.policy.train.micro_batch_size = c.generator.train.micro_batch_size = 32
        c.policy.train.shared_prefix = c.generator.train.shared_prefix = shared_prefix
        c.policy.train.remat = c.generator.train.remat = remat
        p = planner.plan(c, 8, search=False)
        mesh = parallel.make_mesh(*p.mesh.values(), jax.devices()[:8])
        planner_compiled.measure_plan(p, RoleModels.from_config(p.config),
                                      Workload.from_config(p.config),
                                      mesh, only=("update",))
        steps[remat] = {s.name: s for s in p.steps if "update" in s.name}
    assert set(steps[False]) == {"policy update", "generator update"}
    assert all(bool(s.group) == shared_prefix for s in steps[False].values())
    for name, s in steps[False].items():
        names = [t.name for t in s.terms]
        assert any(n.startswith("saved activations, no remat") for n in names), names
        planned = s.transient - steps[True][name].transient
        compiled = s.compiled - steps[True][name].compiled
        assert compiled > 0 and 0.75 <= planned / compiled <= 1.25, (name, planned, compiled)
        assert 0.75 <= s.transient / s.compiled <= 1.25, (name, s.transient, s.compiled)


def test_planning_what_the_config_does_uses_its_rollout_micro_batches():
    """search=False (`--nosearch`, memory.json "planned") plans the rows per sampler call the
    config sets, not every row at once."""
    c = _tiny()
    c.policy.rollout_micro_batch, c.generator.rollout_micro_batch = 4, 2
    p = planner.plan(c, 8, mesh_sizes=(1, 8, 1), search=False)
    rows = {(s.phase, s.name): s.rows for s in p.steps}
    assert rows[("generator", "policy sampling")] == 4
    assert rows[("generator", "rubric sampling")] == 2


def test_workload_chunks_the_verifier_as_the_verifier_does():
    """`Workload.from_config` plans the verifier at the Verifier's own default chunking
    (`evaluator.budgets.DEFAULT_BUDGETS`, the object a default `Verifier` holds)."""
    from drubric_jax.evaluator.budgets import DEFAULT_BUDGETS

    c = qwen3_8b.get_config()
    w = planner.Workload.from_config(c)
    num_items = c.generator.num_lists * c.generator.max_items
    assert w.verifier_prefix == DEFAULT_BUDGETS.prefix_bucket(c.verifier.max_prefix_tokens)
    assert w.verifier_items == DEFAULT_BUDGETS.items_per_pass(w.verifier_prefix,
                                                              w.verifier_suffix, num_items)
    assert w.verifier_rows == DEFAULT_BUDGETS.rows_per_pass(w.verifier_prefix,
                                                            w.verifier_suffix, num_items)


def test_time_estimate_of_a_step_by_hand():
    """memory.timing on the tiny config: a decode step at batch 1 is bound by reading the
    weights (bytes / bandwidth), a prefill and an update by FLOPs / peak, each phase's
    expected time is its roofline over the measured efficiency, and a round adds the
    steps up."""
    from drubric_jax.memory import costs, timing
    from drubric_jax.memory.terms import RoleModels

    c = smollm2_cpu.get_config("tiny")
    c.policy.rollout_micro_batch = 1
    c.policy.train.remat = True  # a bool: "auto" would be decided on this machine
    target = costs.Target("test", tflops=1.0, tbps=1.0, memory_gb=1.0)
    models_ = RoleModels.from_config(c)
    times = {(t.phase, t.name.split(" (")[0].split(",")[0] + ("" if t.counted else " *")): t
             for t in timing.estimate(c, models_, target, 1)}
    cfg = models_.base[models_.sources["policy"]]
    p = c.policy
    rows = p.prompts_per_step * p.num_responses
    decode = times["policy step", "policy sampling: decode"]
    # One cache segment at these lengths: every step reads the P + N slots.
    assert sampling.cache_schedule(p.max_prompt_tokens, p.max_new_tokens, 0) == (
        p.max_prompt_tokens + p.max_new_tokens,)
    step_bytes = costs.weight_bytes(cfg) + costs.kv_bytes(cfg, 1, p.max_prompt_tokens
                                                          + p.max_new_tokens)
    assert decode.roofline_s == pytest.approx(rows * p.max_new_tokens * step_bytes / 1e12)
    # With 4 segments a step reads P + N (1/2 + 1/8 + 1/32 + 1/64) slots on average.
    c.policy.cache_segments = 4
    seg = next(t for t in timing.estimate(c, models_, target, 1)
               if t.phase == "policy step" and t.name.startswith("policy sampling: decode"))
    slots = sampling.mean_slots_read(sampling.cache_schedule(
        p.max_prompt_tokens, p.max_new_tokens, 4), p.max_prompt_tokens, p.max_new_tokens)
    assert slots < p.max_prompt_tokens + p.max_new_tokens
    step_bytes = costs.weight_bytes(cfg) + costs.kv_bytes(cfg, 1, slots)
    assert seg.roofline_s == pytest.approx(rows * p.max_new_tokens * step_bytes / 1e12)
    c.policy.cache_segments = 0
    prefill = times["policy step", "policy sampling: prefill"]
    t = p.max_prompt_tokens
    assert prefill.roofline_s == pytest.approx(
        costs.forward_flops(cfg, rows * t, rows * t * (t + 1) // 2, rows) / 1e12)
    # The update in groups (`train.shared_prefix`, the default): B = 2 prompts, each once
    # beside its K = 4 answers: B (P + K N) tokens; the prefix's causal pairs once, each
    # answer's N P over the prompt and causal(N) over itself; the head on the K N answers.
    assert models_.train["policy"].shared_prefix
    update = times["policy step", "policy update"]
    b, k, pp, n = p.prompts_per_step, p.num_responses, p.max_prompt_tokens, p.max_new_tokens
    fwd = costs.forward_flops(cfg, b * (pp + k * n),
                              b * (pp * (pp + 1) // 2 + k * (n * pp + n * (n + 1) // 2)),
                              b * k * n)
    # Full fine-tuning: forward + 2x backward + the remat forward + the reference forward.
    assert update.roofline_s == pytest.approx(fwd * (1 + 2 + 1 + 1) / 1e12)
    assert update.expected_s == pytest.approx(update.roofline_s
                                              / timing.MEASURED_EFFICIENCY["update"])
    # The per-row update beside it (for comparison, not in the step's total): every row
    # its prompt again, R (P + N) tokens, R causal(P + N) pairs, the same R N scored.
    per_row = times["policy step", "policy update *"]
    t = pp + n
    fwd_rows = costs.forward_flops(cfg, rows * t, rows * t * (t + 1) // 2, rows * n)
    assert per_row.roofline_s == pytest.approx(fwd_rows * 5 / 1e12)
    assert per_row.roofline_s > update.roofline_s
    text = timing.table(c, list(times.values()), target, 1)
    assert "a round" in text and "NeMo RL" in text
    policy_total = sum(x.roofline_s for x in times.values()
                       if x.phase == "policy step" and x.counted)
    assert f"{'policy step (total)':<80}{policy_total:>12.1f}" in text


def test_decode_steps_from_response_lengths_by_hand():
    """`sampling.lengths`: a quantile spec, the rows' lengths from it, and the decode steps
    of each sampler on hand-sized rows; a run's metrics give a spec."""
    import numpy as np

    from drubric_jax.sampling import lengths as ln

    assert ln.parse_lengths("", 64) == ()
    assert ln.parse_lengths("0.5:10,0.1:4,0.9:100", 64) == (
        (0.0, 1.0), (0.1, 4.0), (0.5, 10.0), (0.9, 64.0), (1.0, 64.0))
    for bad in ("0.5", "1.5:10", "0.1:20,0.5:10", "0.5:0"):
        with pytest.raises(ValueError, match="response lengths"):
            ln.parse_lengths(bad, 64)
    rows = ln.row_lengths(((0.0, 1.0), (1.0, 9.0)), 4)  # quantiles 1/8, 3/8, 5/8, 7/8
    assert sorted(rows.tolist()) == [2, 4, 6, 8]
    # Static calls of 2 rows run to their longest; the engine's 2 slots to the last end.
    assert ln.static_steps(np.array([5, 1, 1, 1]), 2) == 6
    assert ln.engine_steps(np.array([5, 1, 1, 1]), 2) == 5
    assert ln.engine_steps(np.array([1, 1, 1, 5]), 2) == 6
    assert ln.engine_steps(np.array([3, 3]), 8) == 3
    metrics = [{"response_length_p10": 10, "response_length_p50": 20,
                "response_length_p90": 40, "truncated_fraction": 0.05},
               {"response_length_p10": 12, "response_length_p50": 22,
                "response_length_p90": 44, "truncated_fraction": 0.05}, {"loss": 1.0}]
    assert ln.spec_from_metrics(metrics, 64) == "0.1:11,0.5:21,0.9:42,0.95:64"
    with pytest.raises(ValueError, match="x.jsonl"):
        ln.spec_from_metrics([{"loss": 1.0}], 64, "x.jsonl")


def test_lengths_come_from_both_roles_updates():
    """`plan --lengths_from` reads each role's lengths from its own phase's rows: the
    policy's answers from the policy phase, the generator's lists from the generator
    phase; a run without a generator update leaves the generator at N."""
    from drubric_jax.sampling import lengths as ln

    def row(phase, p50):
        return {"phase": phase, "response_length_p10": p50 / 2, "response_length_p50": p50,
                "response_length_p90": 2 * p50, "truncated_fraction": 0.0}

    rows = [row("policy", 20), row("policy", 22), row("generator", 50), {"phase": "eval"}]
    specs = ln.role_specs(rows, {"policy": 64, "generator": 160})
    assert specs == {"policy": "0.1:10.5,0.5:21,0.9:42", "generator": "0.1:25,0.5:50,0.9:100"}
    assert ln.role_specs(rows[:2], {"policy": 64, "generator": 160}).keys() == {"policy"}


def test_time_estimate_counts_decode_steps_from_lengths():
    """memory.timing with `policy.response_lengths`: the static sampler's decode is its
    calls' longest rows, the engine's its slots' last ends, each a step at the slots'
    cost (the static sampler reads P + N positions a row, the engine a row's live tokens);
    the engine prefills each prompt once."""
    from drubric_jax.memory import costs, timing
    from drubric_jax.memory.terms import RoleModels
    from drubric_jax.sampling import lengths as ln

    c = smollm2_cpu.get_config("tiny")
    p = c.policy
    p.rollout_micro_batch = 2
    p.response_lengths = "0.5:8,0.9:30"
    target = costs.Target("test", tflops=1.0, tbps=1.0, memory_gb=1.0)
    models_ = RoleModels.from_config(c)
    cfg = models_.base[models_.sources["policy"]]
    rows = p.prompts_per_step * p.num_responses
    lens = ln.row_lengths(ln.parse_lengths(p.response_lengths, p.max_new_tokens), rows)

    def decode_and_prefill(sampler):
        p.sampler = sampler
        times = [t for t in timing.estimate(c, models_, target, 1) if t.phase == "policy step"
                 and t.name.startswith("policy sampling")]
        return times[1], times[0]

    step_bytes = costs.weight_bytes(cfg) + costs.kv_bytes(cfg, 2, p.max_prompt_tokens
                                                          + p.max_new_tokens)
    static, static_pre = decode_and_prefill("static")
    engine, engine_pre = decode_and_prefill("engine")
    assert static.roofline_s == pytest.approx(ln.static_steps(lens, 2) * step_bytes / 1e12)
    # The engine reads each slot's live tokens (a paged cache): on average the prompt and
    # E[n^2] / (2 E[n]) of a row's own over its steps.
    live = p.max_prompt_tokens + float((lens.astype(float) ** 2).mean() / (2 * lens.mean()))
    engine_bytes = costs.weight_bytes(cfg) + costs.kv_bytes(cfg, 2, live)
    assert engine.roofline_s == pytest.approx(ln.engine_steps(lens, 2) * engine_bytes / 1e12)
    assert engine.roofline_s < static.roofline_s
    assert engine_pre.roofline_s == pytest.approx(static_pre.roofline_s / p.num_responses)


def test_length_metrics_are_the_percentiles_numpy_gives():
    """The train step's response-length metrics (`sampling.lengths.length_metrics`): mean
    and linear-interpolation percentiles, as numpy computes them."""
    import numpy as np

    from drubric_jax.sampling.lengths import length_metrics

    x = np.array([3, 64, 10, 10, 1, 40, 64, 7])
    got = {k: float(v) for k, v in length_metrics(x).items()}
    want = dict(zip(("response_length_p10", "response_length_p50", "response_length_p90"),
                    np.percentile(x, [10, 50, 90])), response_length_mean=x.mean())
    assert got == pytest.approx(want, rel=1e-6)

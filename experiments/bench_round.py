r"""Cost of one DynamicRubric policy step against plain rule-reward GRPO (a benchmark).

    python -m experiments.bench_round                       # both parts, each in its own process
    python -m experiments.bench_round --part=cost           # DynamicRubric vs rule step
    python -m experiments.bench_round --part=tunix_shape    # plain GRPO at the tunix peer's shape
    python -m experiments.bench_round --noremat --tunix_step_s=52.1  # no remat; tunix measured beside

Prints JSON lines.
- part "cost": one warm DynamicRubric policy step (sampling, rubric generation,
  verification, reference log-probs, update) and one warm plain GRPO step whose reward is a
  rule (exact match with the prompt's reference answer, 0 when there is none), on the same
  prompts, model (SmolLM2-135M, float32) and K. `ratio` = DynamicRubric seconds / rule
  seconds (paper: 3.0x; our goal: <= 2.0x).
- part "tunix_shape": plain GRPO at the shape google-tunix's GRPOLearner was measured at
  (../shared/peers/anchor_tunix.py): 4 prompts x G=4, prompts padded to 128 tokens, 64 new
  tokens (no early stop), temperature 0.9, beta 0.04 with a reference model, AdamW 1e-6,
  length reward. Reports the warm step seconds and the process's peak RSS next to tunix's
  53-56 s and 14.4 GB (goal: <= 0.7x the time, <= 0.5x the memory). The process also
  holds the run's other roles (verifier, generator params), so its peak RSS over-counts a
  plain GRPO job.
Each part runs in a fresh process so its peak RSS is its own. Steps are timed after one
warm-up step (which compiles).
"""
import os
import subprocess
import sys
import tempfile

from absl import flags
from experiments import cli  # noqa: E402

from experiments.bench_common import emit, peak_rss_mb, timed

_PART = flags.DEFINE_enum("part", "all", ["all", "cost", "tunix_shape"], "What to time.")
_STEPS = flags.DEFINE_integer("steps", 2, "Timed (warm) steps per measurement.")
_REMAT = flags.DEFINE_bool(
    "remat", True, "config.<role>.train.remat of the timed updates (False keeps each "
    "layer's activations: no recomputation, more memory; google-tunix's GRPO does not remat)")
_TUNIX = flags.DEFINE_float(
    "tunix_step_s", None, "google-tunix's warm GRPO step measured beside this run "
    "(../shared/peers/anchor_tunix.py grpo); default: the peers README's figure")
_TUNIX_STEP_S = 54.5   # google-tunix 0.1.7 GRPOLearner warm step here (peers/README.md)
_TUNIX_PEAK_GB = 14.4

_QUESTIONS = ["What is the capital of France?", "Name three primary colors.",
              "What is 12 times 7?", "Write a haiku about the sea.", "Who wrote Hamlet?",
              "What is photosynthesis?", "Give a synonym for happy.",
              "How many legs does a spider have?"]


def _timed_steps(step, n):
    step(0)  # warm-up (compiles)
    out = []
    for i in range(1, n + 1):
        metrics, seconds = timed(step, i)
        out.append((seconds, metrics))
    return out


def _phase_seconds(runs):
    keys = sorted({k for _, m in runs for k in m if k.startswith("seconds_")})
    return {k[len("seconds_"):]: round(sum(m.get(k, 0.0) for _, m in runs) / len(runs), 3)
            for k in keys}


def cost_part(steps: int) -> None:
    from configs.smollm2_cpu import get_config
    from drubric_jax.rounds import loop
    from drubric_jax.rounds import phases
    from drubric_jax.types import Role

    c = get_config("")
    c.policy.train.remat = _REMAT.value
    c.policy.prompts_per_step, c.policy.num_responses = 2, 4
    c.log.progress = c.log.tensorboard = False
    with tempfile.TemporaryDirectory() as workdir:
        run = loop.setup(c, workdir)
        # As in the run's policy phase (parks the generator's moments).
        run.ctx.roles.park_idle(Role.POLICY, run.park_dir)
        try:
            def rule(item, response):
                ref = (item.reference or "").strip().lower()
                return float(bool(ref) and response.strip().lower() == ref)

            def step(rollout_fn):
                s = rollout_fn()
                m = phases.update(run.ctx, Role.POLICY, s, 0)
                return {**m, **s.metrics, **s.timer.metrics()}

            dyn = _timed_steps(lambda i: step(lambda: phases.policy_rollout(
                run.ctx, loop.phase_key(0, 0, "policy", i), next(run.prompt_iter))), steps)
            plain = _timed_steps(lambda i: step(lambda: phases.rule_policy_rollout(
                run.ctx, loop.phase_key(0, 0, "policy", 100 + i), next(run.prompt_iter),
                rule)), steps)
        finally:
            loop.close(run)
    d = sum(s for s, _ in dyn) / len(dyn)
    p = sum(s for s, _ in plain) / len(plain)
    shape = dict(prompts=c.policy.prompts_per_step, K=c.policy.num_responses,
                 new_tokens=c.policy.max_new_tokens, model="smollm2-135m", dtype="float32")
    emit(part="cost", impl="dynamic_rubric", step_s=round(d, 3),
         phases=_phase_seconds(dyn), **shape)
    emit(part="cost", impl="rule_grpo", step_s=round(p, 3), phases=_phase_seconds(plain),
         **shape)
    emit(part="cost", ratio=round(d / p, 3), paper_ratio=3.0, goal="<= 2.0",
         remat=_REMAT.value, peak_rss_mb=round(peak_rss_mb(), 1))


def tunix_shape_part(steps: int) -> None:
    import jax
    import numpy as np

    from configs.smollm2_cpu import get_config
    from drubric_jax import data
    from drubric_jax.rounds import loop
    from drubric_jax.rounds import phases
    from drubric_jax.types import Role

    c = get_config("")
    c.policy.train.remat = _REMAT.value
    c.policy.prompts_per_step, c.policy.num_responses = 4, 4
    c.policy.max_new_tokens, c.policy.min_prompt_bucket = 64, 128
    c.policy.temperature = 0.9
    c.policy.train.beta, c.policy.train.learning_rate = 0.04, 1e-6
    c.log.progress = c.log.tensorboard = False
    with tempfile.TemporaryDirectory() as workdir:
        run = loop.setup(c, workdir)
        run.ctx.roles.park_idle(Role.POLICY, run.park_dir)
        try:
            prompts = data.EpochIterator(
                [data.PromptItem(id=str(i), source="bench", prompt=q)
                 for i, q in enumerate(_QUESTIONS)], 4, 0)
            run.ctx.policy_stop_ids = np.array([-1], np.int32)  # never matches: 64 tokens

            def step(i):
                s = phases.rule_policy_rollout(run.ctx, jax.random.PRNGKey(i), next(prompts),
                                               lambda item, y: float(len(y)))
                return {**phases.update(run.ctx, Role.POLICY, s, i), **s.timer.metrics()}

            runs = _timed_steps(step, steps)
        finally:
            loop.close(run)
    step_s = sum(s for s, _ in runs) / len(runs)
    peak = peak_rss_mb()
    tunix_s = _TUNIX.value or _TUNIX_STEP_S
    emit(part="tunix_shape", impl="drubric_jax", prompts=4, G=4, prompt_len_padded=128,
         new_tokens=64, beta=0.04, warm_step_s=round(step_s, 3), phases=_phase_seconds(runs),
         remat=_REMAT.value, peak_rss_mb=round(peak, 1), tunix_step_s=tunix_s,
         tunix_peak_gb=_TUNIX_PEAK_GB, step_ratio=round(step_s / tunix_s, 3),
         memory_ratio=round(peak / 1024 / _TUNIX_PEAK_GB, 3))


def main(argv):
    del argv
    if _PART.value == "all":
        for part in ("cost", "tunix_shape"):
            subprocess.run([sys.executable, "-m", "experiments.bench_round", f"--part={part}",
                            f"--steps={_STEPS.value}", f"--remat={_REMAT.value}"]
                           + ([f"--tunix_step_s={_TUNIX.value}"] if _TUNIX.value else []),
                           check=True, env=dict(os.environ))
    elif _PART.value == "cost":
        cost_part(_STEPS.value)
    else:
        tunix_shape_part(_STEPS.value)


if __name__ == "__main__":
    cli.run(main)

"""The co-evolution round loop (Algorithm 1, METHOD section 5).

Each round first adapts the rubric generator to the current policy's samples (generator
phase, policy fixed), then trains the policy with the adapted generator and the frozen
verifier (policy phase, generator fixed). Both phases take GRPO steps with the same
`train_step` machinery.

Roles (METHOD 5; STYLE 13). Five roles use the decoder weights:
    policy          trainable: TrainState (params + AdamW moments)
    policy_ref      frozen reference of the policy's KL term (Eq. 23)
    generator       trainable: TrainState
    generator_ref   frozen reference of the generator's KL term
    verifier        frozen judge (never updated)
Every model source is loaded once; frozen roles that name the same source share that one
copy of the arrays (no duplicates). The trainable roles start as copies (their buffers are
donated to the train step). `bind_roles` is the one named step that hands the current
trainable params to the samplers: the generator phase samples responses with the policy's
params and trains the generator's; the policy phase does the reverse. With
`config.memory.park_idle_optimizer`, `activate(phase)` also parks the AdamW moments of the
role that is idle in that phase on disk (`hostmem.park`) and brings the active role's back.

Axis legend: B prompts (or anchor examples) per step, K responses per prompt, G rubric
lists per (x, C), n anchor responses, M rubric items, P prompt tokens, N new tokens.

Determinism: the key of (round r, phase f, step s) is fold_in(fold_in(fold_in(seed, r),
f), s); data order comes from the seed through `data.EpochIterator`, whose position is
checkpointed. A resumed run therefore repeats exactly what the uninterrupted run does.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from drubric_jax import checkpoint as ckpt_lib
from drubric_jax import config_check, data, hostmem, rewards, run_logging
from drubric_jax import sampling
from drubric_jax import sharding
from drubric_jax import tokenizer as tok_lib
from drubric_jax import train_step as ts
from drubric_jax import models
from drubric_jax.models import export_hf_dir, load_model
from drubric_jax.models.config import ModelConfig
from drubric_jax.train_config import TrainConfig
from drubric_jax.types import Rollout
from drubric_jax.rubrics import RubricGenerator, RubricInput
from drubric_jax.text.budget import fit_prompt
from drubric_jax.verification import Verifier

PHASES = ("generator", "policy")


# ----------------------------------------------------------------------------- setup


@dataclasses.dataclass
class Model:
    """One loaded model source: its config, params (shared by frozen roles), tokenizer."""

    source: str
    cfg: ModelConfig
    params: dict
    tokenizer: object


@dataclasses.dataclass
class Roles:
    """The five roles. `policy` and `generator` are TrainStates; the rest are frozen."""

    policy: ts.TrainState
    generator: ts.TrainState
    policy_model: Model      # policy_ref = policy_model.params
    generator_model: Model   # generator_ref = generator_model.params
    verifier_model: Model


@dataclasses.dataclass
class LoopState:
    """Where the loop is: restored from a checkpoint's meta."""

    round: int = 0
    phase: str = "generator"
    step: int = 0            # steps done in the current phase
    global_step: int = 0     # optimizer steps done, both roles
    heldout_done: list = dataclasses.field(default_factory=list)  # (round, phase) evaluated


def load_models(config: ml_collections.ConfigDict) -> dict:
    """{source: Model} for the distinct sources of policy, generator and verifier."""
    models = {}
    for source in (config.model.policy, config.model.generator, config.model.verifier):
        if source not in models:
            cfg, params, tok = load_model(source, config.model.dtype, seed=config.seed)
            models[source] = Model(source, cfg, params, tok)
    return models


def role_memory(roles: Roles) -> dict:
    """Bytes held by each role, counting a buffer shared by several roles once (under the
    first role that names it). Trainable roles include their AdamW moments; moments parked
    on disk (`CoEvolution.activate`) are counted under "parked_on_disk", not the role."""
    seen: set = set()
    out = {"parked_on_disk": 0}

    def size(name, tree):
        total = 0
        for leaf in jax.tree.leaves(tree):
            if isinstance(leaf, np.memmap):
                out["parked_on_disk"] += leaf.nbytes
            elif hasattr(leaf, "nbytes") and id(leaf) not in seen:
                seen.add(id(leaf))
                total += leaf.nbytes
        out[name] = total

    size("verifier", roles.verifier_model.params)
    size("policy_ref", roles.policy_model.params)
    size("generator_ref", roles.generator_model.params)
    size("policy", (roles.policy.params, roles.policy.opt_state))
    size("generator", (roles.generator.params, roles.generator.opt_state))
    return out


def _train_config(c: ml_collections.ConfigDict, batch: int, temperature: float):
    return ts.TrainConfig(
        learning_rate=c.learning_rate, warmup_steps=c.warmup_steps,
        weight_decay=c.weight_decay, b1=c.b1, b2=c.b2, max_grad_norm=c.max_grad_norm,
        clip_eps=c.clip_eps, beta=c.beta, aggregation=c.aggregation,
        micro_batch_size=c.micro_batch_size or batch, temperature=temperature,
        logits_chunk=c.logits_chunk, mu_dtype=c.mu_dtype)


# ----------------------------------------------------------------------------- helpers


def phase_key(seed: int, round_: int, phase: str, step: int) -> jax.Array:
    """Key of one step: fold_in(fold_in(fold_in(PRNGKey(seed), round), phase), step)."""
    key = jax.random.fold_in(jax.random.PRNGKey(seed), round_)
    return jax.random.fold_in(jax.random.fold_in(key, PHASES.index(phase)), step)


class Timer:
    """Accumulates wall seconds per named part of a step."""

    def __init__(self):
        self.seconds: dict = {}

    def __call__(self, name: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer.seconds[name] = timer.seconds.get(name, 0.0) + time.perf_counter() - self.t0

        return _Span()


def _chat_prompt_ids(tokenizer, prompt: str, history: Sequence[dict], budget: int) -> list:
    """Policy chat prompt ids (history + request, assistant turn opened) within `budget`."""
    def render(p, hist, _):
        return tok_lib.chat_ids(tokenizer, hist + [{"role": "user", "content": p}])

    return fit_prompt(tokenizer, render, prompt, history, max_tokens=budget,
                      prompt_last=True).ids


def _decode(tokenizer, sample: Rollout, stop_ids) -> list:
    out = []
    for row, mask in zip(sample.tokens, sample.mask):
        ids = [int(t) for t in row[mask] if int(t) not in stop_ids]
        out.append(tokenizer.decode(ids, skip_special_tokens=True))
    return out


def rubric_stats(weights, item_mask, list_valid, verdicts) -> dict:
    """Rubric statistics of one step: parse-valid rate, items per valid list, weight
    histogram (weights 1..5), mean yes-rate, fraction of zero-variance items.

    Args:
        weights: int32[L, M]; item_mask: bool[L, M]; list_valid: bool[L];
        verdicts: float32[L, K, M] 0/1 verdicts on the responses each list judged.
    """
    item_mask = np.asarray(item_mask, bool) & np.asarray(list_valid, bool)[:, None]
    n_items = item_mask.sum()
    vbar = np.asarray(verdicts, np.float32).mean(axis=1)  # [L, M]
    hist = [int(((np.asarray(weights) == w) & item_mask).sum()) for w in range(1, 6)]
    return {
        "parse_valid_rate": float(np.mean(list_valid)),
        "items_per_list": float(n_items / max(1, np.sum(list_valid))),
        "weight_hist": hist,
        "yes_rate": float(vbar[item_mask].mean()) if n_items else 0.0,
        "zero_variance_item_fraction": float(
            ((vbar == 0) | (vbar == 1))[item_mask].mean()) if n_items else 0.0,
    }


# ----------------------------------------------------------------------------- the loop


class CoEvolution:
    """Holds the roles, data iterators, jitted steps and outputs of one run.

    Use `run(config, workdir)`; the class exists so each phase step is a small method.
    """

    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        config_check.validate(config, jax.device_count(), jax.process_count())
        hostmem.configure_malloc()  # CPU: large freed buffers go back to the kernel
        self.config, self.workdir = config, workdir
        os.makedirs(workdir, exist_ok=True)
        c = config
        models = load_models(c)
        pol_m, gen_m, ver_m = (models[c.model.policy], models[c.model.generator],
                               models[c.model.verifier])
        self.mesh = sharding.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor,
                                       jax.devices()[:c.mesh.num_devices or None])
        p, g = c.policy, c.generator
        self.policy_tc = TrainConfig.from_config(
            p.train, "policy.train", rows=p.prompts_per_step * p.num_responses,
            temperature=p.temperature)
        self.generator_tc = TrainConfig.from_config(
            g.train, "generator.train", rows=g.anchors_per_step * g.num_lists,
            temperature=g.temperature)
        self.policy_opt, self.policy_step_fn = ts.make_sharded_train_step(
            pol_m.cfg, self.policy_tc, self.mesh)
        self.generator_opt, self.generator_step_fn = ts.make_sharded_train_step(
            gen_m.cfg, self.generator_tc, self.mesh)
        # Trainable roles get their own copies: their buffers are donated to the step.
        copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731
        self.roles = Roles(
            policy=ts.shard_train_state(ts.init_train_state(copy(pol_m.params),
                                                            self.policy_opt), self.mesh),
            generator=ts.shard_train_state(ts.init_train_state(copy(gen_m.params),
                                                               self.generator_opt), self.mesh),
            policy_model=pol_m, generator_model=gen_m, verifier_model=ver_m)
        self.pol_stop = tok_lib.stop_ids(pol_m.tokenizer)
        self.pol_pad = int(self.pol_stop[0])
        self.generator = RubricGenerator(
            gen_m.params, gen_m.cfg, gen_m.tokenizer, max_items=g.max_items,
            max_item_chars=g.max_item_chars, max_new_tokens=g.max_new_tokens,
            input_budget=g.input_budget)
        self.verifier = Verifier(ver_m.params, ver_m.cfg, ver_m.tokenizer,
                                 max_prefix_tokens=c.verifier.max_prefix_tokens,
                                 max_suffix_tokens=c.verifier.max_suffix_tokens)
        host, hosts = jax.process_index(), jax.process_count()
        loaded = data.load_data(c, num_hosts=hosts)
        self.anchors, self.heldout, self.prompts = (loaded.train_anchors, loaded.heldout_anchors,
                                                    loaded.prompts)
        self.data_fingerprint = loaded.fingerprint
        self.anchor_iter = data.EpochIterator(self.anchors, g.anchors_per_step, c.seed,
                                              host_id=host, num_hosts=hosts, name="anchors")
        self.prompt_iter = data.EpochIterator(self.prompts, p.prompts_per_step, c.seed + 1,
                                              host_id=host, num_hosts=hosts, name="prompts")
        self.loop = LoopState()
        # Synchronous saves: an async save keeps a host copy of both roles' params and
        # AdamW moments alive during the next step (3.2 GB for SmolLM2 in float32).
        self.ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                          max_to_keep=c.checkpoint.max_to_keep,
                                          async_save=False)
        self.writer = run_logging.MetricsWriter(workdir, tensorboard=c.log.tensorboard)
        self.last_trace: list = []
        self._parked: dict = {}  # role -> shardings of its parked opt_state
        self._park_dir = os.path.join(workdir, "parked")

    # -- roles

    def bind_roles(self) -> None:
        """Hands the current trainable params to the samplers (the one role-swap step)."""
        self.generator.params = self.roles.generator.params

    def activate(self, role: str) -> None:
        """Phase start with `config.memory.park_idle_optimizer`: the AdamW moments of the
        role that is not trained in this phase go to `workdir/parked/<role>/` (read-only
        memmaps, not resident), and `role`'s come back. Values round-trip bit for bit."""
        if not self.config.memory.park_idle_optimizer:
            return
        idle = "policy" if role == "generator" else "generator"
        for name, parked in ((role, False), (idle, True)):
            state = getattr(self.roles, name)
            directory = os.path.join(self._park_dir, name)
            if parked and name not in self._parked:
                self._parked[name] = jax.tree.map(lambda x: x.sharding, state.opt_state)
                opt_state = hostmem.park(state.opt_state, directory)
            elif not parked and name in self._parked:
                opt_state = hostmem.unpark(state.opt_state, self._parked.pop(name), directory)
            else:
                continue
            setattr(self.roles, name, state.replace(opt_state=opt_state))
        hostmem.release_free_memory()

    # -- checkpoint

    def _meta(self) -> dict:
        return {"loop": dataclasses.asdict(self.loop),
                "anchor_iter": self.anchor_iter.state(),
                "prompt_iter": self.prompt_iter.state(),
                "seed": int(self.config.seed)}

    def save(self) -> None:
        """Checkpoint id = optimizer steps done. Phase and round changes are not saved on
        their own: a run resumed at the end of a phase sees step == steps and moves on."""
        state = {}
        for name in ("policy", "generator"):
            role = getattr(self.roles, name)
            if name in self._parked:  # a transient jax copy: Orbax buffers numpy leaves whole
                role = role.replace(opt_state=hostmem.unpark(role.opt_state,
                                                             self._parked[name]))
            state[name] = role
        self.ckpt.save(self.loop.global_step, state, self._meta(), force=True)

    def restore_if_any(self) -> bool:
        """Resumes from the newest checkpoint in workdir/checkpoints, if there is one."""
        step = self.ckpt.latest()
        if step is None:
            return False
        target = {"policy": self.roles.policy, "generator": self.roles.generator}
        state, meta = self.ckpt.restore(step, target)
        self.roles.policy, self.roles.generator = state["policy"], state["generator"]
        self.loop = LoopState(**meta["loop"])
        self.anchor_iter.restore(meta["anchor_iter"])
        self.prompt_iter.restore(meta["prompt_iter"])
        return True

    # -- shared pieces

    def sample_responses(self, key, prompts: Sequence[str], histories, k: int, timer: Timer):
        """K policy responses per prompt: (Rollout of B*K rows, texts)."""
        pm, p = self.roles.policy_model, self.config.policy
        ids = [_chat_prompt_ids(pm.tokenizer, x, h, p.max_prompt_tokens)
               for x, h in zip(prompts, histories)]
        rows = [i for i in ids for _ in range(k)]
        method = sampling.method_from_flags(p.temperature, top_p=p.top_p)
        with timer("sampling"):
            out = sampling.generate(self.roles.policy.params, pm.cfg, rows, key=key,
                                    max_new_tokens=p.max_new_tokens, method=method,
                                    stop_ids=self.pol_stop, pad_id=self.pol_pad,
                                    min_bucket=p.min_prompt_bucket)
        out = out.replace(group_ids=np.repeat(np.arange(len(prompts), dtype=np.int32), k))
        return out, _decode(pm.tokenizer, out, set(self.pol_stop.tolist()))

    def verify(self, prompts, histories, responses, item_lists, timer: Timer) -> np.ndarray:
        """0/1 verdicts float32[R, M_max] for R (prompt, response, item list) triples."""
        with timer("verification"):
            p_yes = self.verifier.p_yes(prompts, responses, item_lists, history=histories)
        return (p_yes > 0.5).astype(np.float32)

    def train(self, role: str, rollout, advantages: np.ndarray, timer: Timer) -> dict:
        """One GRPO update of `role` ("policy" | "generator") on the given rollouts."""
        state = getattr(self.roles, role)
        model = self.roles.policy_model if role == "policy" else self.roles.generator_model
        tc = self.policy_tc if role == "policy" else self.generator_tc
        batch = ts.batch_from_rollout(rollout, advantages)
        hostmem.release_free_memory()  # sampling/verification garbage, before the gradients
        if tc.beta > 0:
            with timer("logprobs"):
                ref_fn = ts.make_sharded_logprobs_fn(model.cfg, self.mesh,
                                                     tc.scoring_temperature,
                                                     start=batch.prompt_len)
                ref = ref_fn(model.params, batch.tokens, batch.token_mask)
                ref.block_until_ready()  # so the time lands here, not in "update"
            batch = batch.replace(ref_logprobs=ref)
        step_fn = self.policy_step_fn if role == "policy" else self.generator_step_fn
        with timer("update"):
            new_state, metrics = step_fn(state, batch)
            metrics = ts.check_finite(metrics, self.loop.global_step + 1)
        setattr(self.roles, role, new_state)
        return metrics

    # -- generator phase

    def generator_step(self, key) -> dict:
        """Algorithm 1, evaluator update: G rubric lists per (x, C), R_disc on C, R_anchor on
        the anchor list, advantage A_disc + lambda A_anchor (Eq. 13, 15, 24-25)."""
        c, g = self.config, self.config.generator
        timer = Timer()
        anchors = next(self.anchor_iter)
        k_resp, k_rub = jax.random.split(key)
        prompts = [a.prompt for a in anchors]
        hists = [list(a.history) for a in anchors]
        _, responses = self.sample_responses(k_resp, prompts, hists,
                                             c.policy.num_responses, timer)
        k = c.policy.num_responses
        sets = [responses[i * k:(i + 1) * k] for i in range(len(anchors))]
        self.bind_roles()
        with timer("rubric_generation"):
            rs = self.generator.generate_batch(
                k_rub, [RubricInput(x, tuple(cs), tuple(h))
                        for x, cs, h in zip(prompts, sets, hists)],
                num_lists=g.num_lists, temperature=g.temperature)
        b, gl, m = rs.weights.shape
        n = max(len(a.responses) for a in anchors)
        # One verifier call: every response of C and of the anchor list is judged on the
        # concatenation of the G lists (one shared prefix per response).
        flat_items = [[t for lst in rs.texts[i] for t in lst] for i in range(b)]
        q_prompts, q_hists, q_resps, q_items = [], [], [], []
        for i, a in enumerate(anchors):
            for y in list(sets[i]) + list(a.responses):
                q_prompts.append(a.prompt), q_hists.append(hists[i])
                q_resps.append(y), q_items.append(flat_items[i])
        v = self.verify(q_prompts, q_hists, q_resps, q_items, timer)
        v_c = np.zeros((b, gl, k, m), np.float32)
        v_a = np.zeros((b, gl, n, m), np.float32)
        anchor_mask = np.zeros((b, n), bool)
        gold = np.zeros((b, n), np.int32)
        row = 0
        for i, a in enumerate(anchors):
            na = len(a.responses)
            vi = v[row:row + k + na].reshape(k + na, gl, m)
            row += k + na
            v_c[i] = vi[:k].transpose(1, 0, 2)
            v_a[i, :, :na] = vi[k:].transpose(1, 0, 2)
            anchor_mask[i, :na] = True
            gold[i, :na] = a.gold_ranks
        w, im, lv = rs.weights, rs.item_mask, rs.list_valid
        r_disc = np.asarray(rewards.discriminability_reward(v_c, w, im))
        s_anchor, _ = rewards.rubric_scores(v_a, w, im)
        r_anchor = np.asarray(rewards.anchor_reward_or_floor(
            s_anchor, jnp.broadcast_to(gold[:, None], (b, gl, n)),
            jnp.broadcast_to(anchor_mask[:, None], (b, gl, n)), lv))
        lam_disc, lam_anchor = {"full": (1.0, g.lam), "disc_only": (1.0, 0.0),
                                "anchor_only": (0.0, 1.0)}[c.variant]
        a_disc, flat_d = rewards.group_advantages(jnp.asarray(r_disc))
        a_anchor, flat_a = rewards.group_advantages(jnp.asarray(r_anchor))
        adv = np.asarray(lam_disc * a_disc + lam_anchor * a_anchor).reshape(-1)
        rollout = Rollout(
            prompt_tokens=rs.prompt_tokens.reshape(b * gl, -1),
            prompt_mask=rs.prompt_mask.reshape(b * gl, -1),
            tokens=rs.completion_tokens.reshape(b * gl, -1),
            logprobs=rs.logprobs.reshape(b * gl, -1),
            mask=rs.completion_mask.reshape(b * gl, -1),
            lengths=rs.completion_mask.reshape(b * gl, -1).sum(-1),
            truncated=np.array([f == "length" for fs in rs.finish_reasons for f in fs]),
            invalid=np.zeros(b * gl, bool),
            group_ids=np.repeat(np.arange(b, dtype=np.int32), gl))
        metrics = self.train("generator", rollout, adv, timer)
        metrics.update(
            r_disc=float(r_disc.mean()), r_anchor=float(r_anchor.mean()),
            flat_group_fraction=float(np.mean(np.asarray(flat_d) & np.asarray(flat_a))),
            **rubric_stats(w.reshape(b * gl, m), im.reshape(b * gl, m), lv.reshape(-1),
                           v_c.reshape(b * gl, k, m)),
            **{f"seconds_{k_}": v_ for k_, v_ in timer.seconds.items()})
        return metrics

    # -- policy phase

    def policy_step(self, key) -> dict:
        """Algorithm 1, policy update: K responses per prompt, one rubric list from the
        fixed generator (prompt-only for the `static` variant), scores E (Eq. 12), group
        advantages (Eq. 21) by prompt id."""
        c, p = self.config, self.config.policy
        timer = Timer()
        items = next(self.prompt_iter)
        k_resp, k_rub = jax.random.split(key)
        prompts = [x.prompt for x in items]
        hists = [list(x.history) for x in items]
        k = p.num_responses
        sample, responses = self.sample_responses(k_resp, prompts, hists, k, timer)
        sets = [responses[i * k:(i + 1) * k] for i in range(len(items))]
        self.bind_roles()
        with timer("rubric_generation"):
            rs = self.generator.generate_batch(
                k_rub, [RubricInput(x, tuple(cs), tuple(h))
                        for x, cs, h in zip(prompts, sets, hists)],
                num_lists=1, temperature=p.rubric_temperature, static=c.variant == "static")
        b = len(items)
        v = self.verify([x for x in prompts for _ in range(k)],
                        [h for h in hists for _ in range(k)], responses,
                        [rs.texts[i][0] for i in range(b) for _ in range(k)], timer)
        m = rs.weights.shape[-1]
        v = v[:, :m].reshape(b, k, m) if v.shape[1] >= m else np.pad(
            v, ((0, 0), (0, m - v.shape[1]))).reshape(b, k, m)
        scores, valid = rewards.rubric_scores(v, rs.weights[:, 0], rs.item_mask[:, 0])
        scores = np.asarray(scores)
        group_ids = np.repeat(np.arange(b), k)
        adv, flat = rewards.group_advantages_by_id(jnp.asarray(scores.reshape(-1)),
                                                   jnp.asarray(group_ids), b)
        metrics = self.train("policy", sample, np.asarray(adv), timer)
        metrics.update(
            policy_reward=float(scores.mean()), flat_group_fraction=float(np.mean(flat)),
            rubric_invalid_fraction=float(1 - np.mean(valid)),
            **rubric_stats(rs.weights[:, 0], rs.item_mask[:, 0], rs.list_valid[:, 0], v),
            **{f"seconds_{k_}": v_ for k_, v_ in timer.seconds.items()})
        self.last_trace = [
            {"prompt": prompts[i], "responses": sets[i],
             "items": [t for t, on in zip(rs.texts[i][0], rs.item_mask[i, 0]) if on],
             "weights": [int(w) for w, on in zip(rs.weights[i, 0], rs.item_mask[i, 0]) if on],
             "verdicts": [[int(x) for x, on in zip(v[i, j], rs.item_mask[i, 0]) if on]
                          for j in range(k)],
             "scores": [float(s) for s in scores[i]], "valid": bool(rs.list_valid[i, 0])}
            for i in range(min(b, c.log.trace_prompts))]
        return metrics

    def rule_policy_step(self, key, reward_fn) -> dict:
        """Plain GRPO baseline step: the same sampling and update as `policy_step`, with a
        cheap rule reward `reward_fn(prompt_item, response) -> float` instead of rubrics."""
        timer = Timer()
        items = next(self.prompt_iter)
        k = self.config.policy.num_responses
        sample, responses = self.sample_responses(
            key, [x.prompt for x in items], [list(x.history) for x in items], k, timer)
        with timer("reward"):
            scores = np.array([reward_fn(items[i // k], y) for i, y in enumerate(responses)],
                              np.float32)
        adv, flat = rewards.group_advantages(jnp.asarray(scores.reshape(len(items), k)))
        metrics = self.train("policy", sample, np.asarray(adv).reshape(-1), timer)
        metrics.update(policy_reward=float(scores.mean()), flat_group_fraction=float(
            np.mean(flat)), **{f"seconds_{k_}": v_ for k_, v_ in timer.seconds.items()})
        return metrics

    # -- held-out evaluation

    def heldout_eval(self, key) -> dict:
        """Delta_gap (Eq. 2) and R_anchor (Eq. 15) of the current generator + verifier on
        the held-out anchor lists: one greedy rubric list from (x, C_anchor) per list."""
        if not self.heldout:
            return {}
        self.bind_roles()
        timer = Timer()
        anchors = self.heldout
        rs = self.generator.generate_batch(
            key, [RubricInput(a.prompt, tuple(a.responses), tuple(a.history)) for a in anchors],
            num_lists=1, temperature=0.0, static=self.config.variant == "static")
        gaps, r_anch = [], []
        for i, a in enumerate(anchors):
            items = rs.texts[i][0]
            v = self.verify([a.prompt] * len(a.responses), [list(a.history)] * len(a.responses),
                            list(a.responses), [items] * len(a.responses), timer)
            m = rs.weights.shape[-1]
            v = np.pad(v, ((0, 0), (0, max(0, m - v.shape[1]))))[:, :m]
            s, _ = rewards.rubric_scores(v, rs.weights[i, 0], rs.item_mask[i, 0])
            gold = jnp.asarray(a.gold_ranks)
            gap, _ = rewards.delta_gap(s, gold)
            gaps.append(float(gap))
            r_anch.append(float(rewards.anchor_reward_or_floor(
                s, gold, jnp.ones(len(a.responses), bool), rs.list_valid[i, 0])))
        return {"delta_gap": float(np.mean(gaps)), "heldout_r_anchor": float(np.mean(r_anch)),
                "heldout_parse_valid_rate": float(np.mean(rs.list_valid)),
                "seconds_eval": sum(timer.seconds.values())}

    # -- driver

    def _log(self, kind: str, metrics: dict) -> None:
        row = {"kind": kind, "round": self.loop.round, "phase": self.loop.phase,
               "step": self.loop.step, "global_step": self.loop.global_step, **metrics}
        self.writer.write(self.loop.global_step, row)

    def _maybe_eval(self) -> None:
        tag = [self.loop.round, self.loop.phase]
        if tag in self.loop.heldout_done:
            return
        metrics = self.heldout_eval(phase_key(self.config.seed, self.loop.round,
                                              self.loop.phase, 10 ** 6))
        hostmem.release_free_memory()
        if metrics:
            self._log("heldout", metrics)
        self.loop.heldout_done.append(tag)

    def _phase(self, phase: str, steps: int) -> None:
        from tqdm import tqdm

        step_fn = self.generator_step if phase == "generator" else self.policy_step
        self.activate(phase)
        bar = tqdm(total=steps, initial=self.loop.step, disable=not self.config.log.progress,
                   desc=f"round {self.loop.round} {phase}", unit="step")
        while self.loop.step < steps:
            key = phase_key(self.config.seed, self.loop.round, phase, self.loop.step)
            metrics = step_fn(key)
            hostmem.release_free_memory()
            metrics["peak_rss_gb"] = hostmem.peak_rss_bytes() / 1e9
            self.loop.step += 1
            self.loop.global_step += 1
            self._log("train", metrics)
            if self.loop.global_step % self.config.checkpoint.every_steps == 0:
                self.save()
            bar.update(1)
        bar.close()

    def run(self, stop_after_rounds: Optional[int] = None) -> None:
        """Runs (or resumes) the rounds; `stop_after_rounds` ends early (tests, preemption
        drills) after that many completed rounds, with a checkpoint."""
        c = self.config
        self.restore_if_any()
        gen_steps = 0 if c.variant == "static" else c.rounds.generator_steps
        while self.loop.round < c.rounds.num_rounds:
            if stop_after_rounds is not None and self.loop.round >= stop_after_rounds:
                break
            if self.loop.phase == "generator":
                self._maybe_eval()
                self._phase("generator", gen_steps)
                self.loop.phase, self.loop.step = "policy", 0
            self._phase("policy", c.rounds.policy_steps)
            self._maybe_eval()
            if self.last_trace:
                run_logging.write_round_trace(
                    os.path.join(self.workdir, "trace", f"round_{self.loop.round}.html"),
                    f"round {self.loop.round}: policy samples, rubrics and verdicts",
                    self.last_trace)
            self.loop.round, self.loop.phase, self.loop.step = self.loop.round + 1, "generator", 0
        self.ckpt.wait()
        if self.loop.round >= c.rounds.num_rounds:
            self.finish()

    def finish(self) -> None:
        """curves.png, role memory, and the Hugging Face exports."""
        run_logging.plot_curves(self.writer.path, os.path.join(self.workdir, "curves.png"))
        with open(os.path.join(self.workdir, "memory.json"), "w") as f:
            json.dump({k: v / 2 ** 20 for k, v in role_memory(self.roles).items()}, f, indent=2)
        if self.config.export:
            for role in ("policy", "generator"):
                model = getattr(self.roles, f"{role}_model")
                export_hf_dir(getattr(self.roles, role).params, model.cfg,
                              os.path.join(self.workdir, "export", role), model.tokenizer,
                              bos_id=model.tokenizer.bos_token_id or 0,
                              eos_id=model.tokenizer.eos_token_id or 0)

    def close(self) -> None:
        """Waits for the last checkpoint; removes `parked/` (the checkpoints hold those
        moments too, and a new process never reads parked files: it restores)."""
        self.ckpt.close()
        self.writer.close()
        shutil.rmtree(self._park_dir, ignore_errors=True)


def run(config: ml_collections.ConfigDict, workdir: str,
        stop_after_rounds: Optional[int] = None) -> None:
    """Runs Algorithm 1 for `config` in `workdir`, resuming from its last checkpoint.

    Outputs: metrics.jsonl, tensorboard/, trace/round_N.html, curves.png, memory.json,
    checkpoints/, export/{policy,generator}/ (see README).

    Raises:
        config_check.ConfigError: a bad config field (before any compute).
        FloatingPointError: a NaN/inf training metric (names the step).
    """
    loop = CoEvolution(config, workdir)
    try:
        loop.run(stop_after_rounds)
    finally:
        loop.close()

"""Helpers shared by several test modules and the multi-process drivers.

A test module never imports another test module: what two of them use lives here, imported
under the one name `helpers` (tests/ is on sys.path: pytest puts it there for the test
modules, the drivers add it themselves). Heavy imports (jax, the configs, gguf) happen
inside the functions, so importing this module sets nothing up before a driver has set
its XLA_FLAGS.
"""
import json
import os
import socket
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- configs


def tiny_config(variant: str = "full", extra: str = ""):
    """`configs/smollm2_cpu.py:tiny` cut to a 2-round run of one generator and one policy
    step (1 prompt x 2 responses, 2 rubric lists of <= 2 items, 8 / 48 new tokens), batch
    rows split over two of the fake CPU devices (tests/conftest.py). `extra`: more switches
    of the config ("world=checks,checks_dir=DIR"). Uses the real SmolLM2 tokenizer: a test
    of it needs the `smollm2_gguf` fixture."""
    import jax

    from configs.smollm2_cpu import get_config

    c = get_config(f"tiny,variant={variant}" + (f",{extra}" if extra else ""))
    c.rounds.num_rounds = 2
    c.rounds.generator_steps = 1
    c.rounds.policy_steps = 1
    c.policy.prompts_per_step = 1
    c.policy.num_responses = 2
    c.policy.max_new_tokens = 8
    c.generator.num_lists = 2
    c.generator.max_items = 2
    c.generator.max_item_chars = 16
    c.generator.max_new_tokens = 48
    c.data.heldout_anchor_rows = 1
    c.data.max_responses = 3
    c.log.progress = False
    c.log.tensorboard = False
    # Two of the fake CPU devices (tests/conftest.py): batch rows split over "data".
    c.mesh.num_devices = min(2, jax.device_count())
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = c.mesh.num_devices, 1, 1
    return c


# ----------------------------------------------------------------------------- checks world

# Hand-written rows of the checks world (METHOD 13): prompts with their true checks, and
# responses that meet some of them.
NO_COMMA = {"check": "punctuation:no_comma", "args": {}}
LOWER = {"check": "change_case:english_lowercase", "args": {}}
WORDS = {"check": "length_constraints:number_words",
         "args": {"num_words": 100, "relation": "less than"}}
TITLE = {"check": "detectable_format:title", "args": {}}
PROMPTS = [
    ("Describe a rainy day. Do not use any commas. Answer with less than 100 words.",
     [NO_COMMA, WORDS]),
    ("Write a short note to a friend. Your entire response should be in English, and in all "
     "lowercase letters.", [LOWER]),
    ("Explain what a river is. Your answer must contain a title, wrapped in double angular "
     "brackets, such as <<poem of joy>>.", [TITLE, NO_COMMA]),
]
# Four useful responses per anchor list: the anchor filter (data.filters, Appendix B) drops
# lists with fewer.
ANSWERS = ["<<rivers>> a river is water that flows to the sea", "Rain, rain and more rain.",
           "it was grey and wet all day", "Dear Sam, see you on Friday at the lake.",
           "A river carries fresh water downhill through its valley."]


def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


# World v2's splits in `write_checks_world`: each split's prompts are PROMPTS with its own
# lead sentence (the policy split's: none), so no two splits share a prompt text.
SPLIT_LEADS = {"policy": "", "gen_sft": "For a class. ", "gen_rl": "For a blog. ",
               "dev": "For a diary. ", "heldout": "For a letter. "}


def _anchor_row(row: dict) -> dict:
    """The anchor row of a prompt row: ANSWERS ranked by their gold score (best first),
    the prompt's id, text and meta (its split included), as make_checks_anchors writes."""
    from drubric_jax.checks import gold_score

    g = [gold_score(row["meta"]["checks"], y) for y in ANSWERS]
    ranking = sorted(range(len(ANSWERS)), key=lambda j: -g[j])  # best first
    return {**row, "responses": ANSWERS, "ranking": ranking}


def checks_split_rows(split: str) -> list:
    """World v2's rows of one split for `write_checks_world`: PROMPTS with the split's lead
    sentence, ids "cw/<i>" (the policy split) or "cw/<split>/<i>", `meta["split"]` set."""
    return [{"id": f"cw/{i}" if split == "policy" else f"cw/{split}/{i}",
             "source": f"checks_world:{split}", "prompt": SPLIT_LEADS[split] + p,
             "meta": {"checks": t, "split": split}} for i, (p, t) in enumerate(PROMPTS)]


def write_checks_world(directory) -> None:
    """Both layouts the checks world's data scripts write, in one directory:
    world v1's train.jsonl (PROMPTS, ids cw/<i>) and anchors.jsonl (ids cw/a<i>), and
    world v2's five splits (`data.splits`: gen_sft.jsonl, gen_rl.jsonl, policy.jsonl,
    dev.jsonl, heldout.jsonl, 3 rows each, `checks_split_rows`) with the anchor lists of
    gen_sft, gen_rl, dev and heldout (<split>_anchors.jsonl); heldout.jsonl serves both
    (world v1 ignores meta.split). Prompt rows carry meta.checks; anchor lists are ANSWERS
    ranked best first by the gold score."""
    from drubric_jax.data import splits

    rows = [{"id": f"cw/{i}", "source": "checks_world", "prompt": p, "meta": {"checks": t}}
            for i, (p, t) in enumerate(PROMPTS)]
    _write_jsonl(os.path.join(directory, "train.jsonl"), rows)
    _write_jsonl(os.path.join(directory, "anchors.jsonl"),
                 [_anchor_row(dict(r, id=f"cw/a{i}")) for i, r in enumerate(rows)])
    for split in splits.SPLITS:
        part = checks_split_rows(split)
        _write_jsonl(os.path.join(directory, splits.prompt_file(split)), part)
        if split in splits.ANCHORED:
            _write_jsonl(os.path.join(directory, splits.anchor_file(split)),
                         [_anchor_row(r) for r in part])


def one_round_config():
    """`tiny_config()` with one round."""
    c = tiny_config()
    c.rounds.num_rounds = 1
    return c


# ----------------------------------------------------------------------------- stub verifier


def p_yes_of(response: str, item: str) -> float:
    """The stub verifier's P(yes): a fixed pseudo-random number per (response, item), 0 for
    an empty item."""
    if not item.strip():
        return 0.0
    return (zlib.crc32(f"{response}\x00{item}".encode()) % 997) / 996.0


class StubVerifier:
    """A verifier whose P(yes) is `p_yes_of` (`Verifier.p_yes`'s signature): verdicts known
    to the test, far from flat groups, whatever a tiny model would write."""

    def p_yes(self, params, prompts, responses, items, history=None, **kw):
        m = max((len(x) for x in items), default=0)
        out = np.zeros((len(responses), m), np.float32)
        for i, (y, lst) in enumerate(zip(responses, items)):
            for j, t in enumerate(lst):
                out[i, j] = p_yes_of(y, t)
        return out


# ----------------------------------------------------------------------------- processes


def run_module(*args, timeout: float, devices: int = 1) -> str:
    """`python -m *args` from the repository root, as a user starts an entry point, on
    `devices` fake CPU devices (default 1: the suite's 8 replaced by 1); returns its stdout.

    Raises:
        AssertionError: a non-zero exit (with the end of its stderr).
        subprocess.TimeoutExpired: it ran past `timeout` seconds (a hang).
    """
    from conftest import xla_flags_with_device_count

    env = dict(os.environ,
               XLA_FLAGS=xla_flags_with_device_count(os.environ["XLA_FLAGS"], devices))
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_json(driver: str, num_processes: int, *args, timeout: float) -> list:
    """`launch_processes`, each process required to exit 0, then the last JSON line ("{...")
    each printed, in process order."""
    out = []
    for rc, text in launch_processes(driver, num_processes, *args, timeout=timeout):
        assert rc == 0, text[-3000:]
        out.append(json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1]))
    return out


def launch_processes(driver: str, num_processes: int, *args, timeout: float) -> list:
    """Starts `num_processes` processes of `driver` (its args, then --num_processes,
    --process_id, --port and --devices: 8 fake CPU devices shared out); returns
    [(returncode, output)] once all ended.

    Raises:
        subprocess.TimeoutExpired: a process ran past `timeout` seconds (all are killed).
    """
    env = dict(os.environ)
    # The driver sets its own device count; the suite's 8-device flag would override it.
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "device_count" not in f)
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, driver, *args, f"--num_processes={num_processes}",
         f"--process_id={i}", f"--port={port}", f"--devices={8 // num_processes}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for i in range(num_processes)]
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            out.append((p.returncode, text))
    finally:
        for p in procs:
            p.kill()
    return out


# ----------------------------------------------------------------------------- GGUF


def llama_cpp_permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` (HF half-split -> interleaved
    rows of a Q or K projection, float[out, in])."""
    out, inp = w.shape
    return w.reshape(n_head, 2, out // n_head // 2, inp).swapaxes(1, 2).reshape(out, inp)


def write_tiny_gguf(path, cfg, params):
    """Writes params as a llama-architecture GGUF the way llama.cpp's converter does:
    F32 tensors in [out, in] layout, attn_q/attn_k rows permuted for interleaved RoPE."""
    import gguf

    from drubric_jax.models import llama

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(cfg.num_layers)
    w.add_embedding_length(cfg.dim)
    w.add_feed_forward_length(cfg.hidden_dim)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_context_length(cfg.max_seq_len)
    w.add_vocab_size(cfg.vocab_size)
    for key, (_, name) in llama.TOP_WEIGHT_NAMES.items():
        if key in params:
            x = np.asarray(params[key], np.float32)
            w.add_tensor(name, np.ascontiguousarray(x.T if key == "lm_head" else x))
    for key, stacked in params["layers"].items():
        for i in range(cfg.num_layers):
            x = np.asarray(stacked[i], np.float32)
            if x.ndim == 2:
                x = np.ascontiguousarray(x.T)
            if key == "wq":
                x = llama_cpp_permute(x, cfg.num_heads)
            elif key == "wk":
                x = llama_cpp_permute(x, cfg.num_kv_heads)
            w.add_tensor(f"blk.{i}.{llama.LAYER_WEIGHT_NAMES[key][1]}", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ----------------------------------------------------------------------------- bootstrap


def bootstrap_resamples(n_units: int):
    """Every bootstrap resample of U = n_units units, as counts, with its probability.

    A resample draws U units with replacement; as counts w (w_u >= 0, sum U) it has the
    multinomial probability U! / (prod_u w_u!) / U^U. The C = binom(2U - 1, U) count
    vectors are enumerated by stars and bars (U - 1 bars among 2U - 1 slots).

    Returns:
        counts float64[C, U] and probabilities float64[C] (summing to 1).
    """
    import itertools
    import math

    u = n_units
    bars = np.array(list(itertools.combinations(range(2 * u - 1), u - 1)), np.int64)
    ends = np.full((len(bars), 1), 2 * u - 1)
    counts = np.diff(np.concatenate([-np.ones_like(ends), bars, ends], axis=1), axis=1) - 1
    log_fact = np.array([math.lgamma(k + 1) for k in range(u + 1)])
    log_p = log_fact[u] - log_fact[counts].sum(1) - u * math.log(u)
    return counts.astype(np.float64), np.exp(log_p)


def exact_quantile(values, probs, q: float) -> float:
    """inf {x : P(X <= x) >= q} of the discrete distribution P(X = values[c]) = probs[c];
    the smallest value for q <= 0, the largest for q >= 1."""
    order = np.argsort(values, kind="stable")
    v, cdf = np.asarray(values)[order], np.cumsum(np.asarray(probs)[order])
    i = np.searchsorted(cdf, q, side="left")  # first c with cdf[c] >= q
    return float(v[min(int(i), len(v) - 1)]) if q > 0 else float(v[0])


def assert_percentile_ci(ci, statistic, n_units: int, n_boot: int, level: float = 0.95,
                         alpha: float = 1e-6) -> None:
    """Checks a percentile bootstrap interval against the exact bootstrap distribution.

    `ci` = [lo, hi] is meant to be the (1 -+ level) / 2 quantiles (`np.quantile`, linear
    interpolation) of `n_boot` replicates of a statistic, each computed on U units drawn
    with replacement. Here the statistic is evaluated on every resample instead
    (`bootstrap_resamples`; `statistic(counts float64[C, U]) -> float64[C]`, e.g.
    `counts @ x / U` for the mean of x), which gives its exact bootstrap CDF F; the bounds
    must lie in `assert_ci_in_exact_band`'s band.

    Raises:
        AssertionError: a bound outside its band.
    """
    counts, probs = bootstrap_resamples(n_units)
    assert_ci_in_exact_band(ci, statistic(counts), probs, n_boot, level, alpha)


def assert_ci_in_exact_band(ci, values, probs, n_boot: int, level: float = 0.95,
                            alpha: float = 1e-6) -> None:
    """Checks a percentile interval of `n_boot` replicates against the exact distribution
    of one replicate: P(X = values[c]) = probs[c] (non-finite values are replicates the
    interval leaves out: the distribution is renormalised over the finite ones, and
    `n_boot` should count the finite replicates).

    Tolerance: the empirical CDF F_n of n i.i.d. replicates satisfies
    P(sup |F_n - F| > eps) <= 2 exp(-2 n eps^2) (Dvoretzky-Kiefer-Wolfowitz, Massart's
    constant), so eps = sqrt(log(2 / alpha) / (2 n)) fails a correct implementation with
    probability <= alpha. `np.quantile(r, q)` interpolates between the order statistics
    k = floor(h), ceil(h), h = (n - 1) q, whose F_n values lie within 1 / n of q; so, with
    |F_n - F| <= eps, each bound lies between the exact quantiles at q - eps - 1 / n and
    q + eps + 1 / n. A wrong statistic, unpaired resampling or resampling with the wrong
    probabilities moves the bounds outside that band (for n_boot ~ 1e4 it is ~ +-2% in
    probability), plus float rounding of the replicates (1e-12 relative).

    Raises:
        AssertionError: a bound outside its band.
    """
    import math

    values, probs = np.asarray(values, np.float64), np.asarray(probs, np.float64)
    ok = np.isfinite(values)
    values, probs = values[ok], probs[ok] / probs[ok].sum()
    eps = math.sqrt(math.log(2.0 / alpha) / (2.0 * n_boot)) + 1.0 / n_boot
    rounding = 1e-12 * (1.0 + float(np.abs(values).max()))
    for bound, q in zip(ci, ((1.0 - level) / 2.0, (1.0 + level) / 2.0)):
        low = exact_quantile(values, probs, q - eps) - rounding
        high = exact_quantile(values, probs, q + eps) + rounding
        assert low <= bound <= high, (
            f"the {q:.3f} bound {bound!r} is outside [{low!r}, {high!r}], the exact "
            f"bootstrap quantiles at {q:.3f} -+ {eps:.4f} ({n_boot} replicates)")


def two_stage_resamples(sizes, unit_ids=None):
    """Every replicate of the two-stage bootstrap (METHOD 15) as a weight vector, with its
    probability: the exact distribution that `intervals.two_stage_weights` samples.

    Stage one: the S seeds drawn with replacement (counts m, multinomial: every count
    vector of `bootstrap_resamples(S)`). Stage two, without ids: each drawn copy of seed s
    draws n_s of its units (every count vector of `bootstrap_resamples(n_s)`), the copies
    independently; a replicate weighs unit i of seed s by its draws / (S n_s). With
    `unit_ids` (N ids, seed-major): the U distinct ids drawn once (every count vector c of
    `bootstrap_resamples(U)`), unit i of seed s weighing m_s / S * c[id] / (the seed's
    drawn ids); nan rows where a drawn seed got none of its ids.

    Enumerated by brute force (no shortcut shared with the implementation): keep S and
    n_s tiny (without ids: the product over the S slots of sum_s C(2 n_s - 1, n_s)).

    Returns:
        weights float64[C, N], probabilities float64[C] (summing to 1).
    """
    import itertools

    n = [int(x) for x in sizes]
    s_count, total = len(n), sum(n)
    offsets = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(int)
    if unit_ids is None:
        # One slot: seed s with probability 1 / S, then one of its resamples.
        slot_w, slot_p = [], []
        for s in range(s_count):
            counts, probs = bootstrap_resamples(n[s])
            for c, p in zip(counts, probs):
                w = np.zeros(total)
                w[offsets[s]:offsets[s] + n[s]] = c / (s_count * n[s])
                slot_w.append(w)
                slot_p.append(p / s_count)
        rows, ps = [], []
        for combo in itertools.product(range(len(slot_w)), repeat=s_count):
            rows.append(np.sum([slot_w[k] for k in combo], axis=0))
            ps.append(np.prod([slot_p[k] for k in combo]))
        return np.asarray(rows), np.asarray(ps)
    ids = list(unit_ids)
    distinct = list(dict.fromkeys(ids))
    m_counts, m_probs = bootstrap_resamples(s_count)
    c_counts, c_probs = bootstrap_resamples(len(distinct))
    rows, ps = [], []
    for m, pm in zip(m_counts, m_probs):
        for c, pc in zip(c_counts, c_probs):
            raw = np.array([c[distinct.index(u)] for u in ids])
            w = np.zeros(total)
            for s in range(s_count):
                part = raw[offsets[s]:offsets[s] + n[s]]
                if m[s] > 0 and part.sum() == 0:
                    w[:] = np.nan
                    break
                if m[s] > 0:
                    w[offsets[s]:offsets[s] + n[s]] = m[s] / s_count * part / part.sum()
            rows.append(w)
            ps.append(pm * pc)
    return np.asarray(rows), np.asarray(ps)


# ----------------------------------------------------------------------------- run files


def write_checks_policy_workdir(root, settings: dict) -> None:
    """A policy-reward experiment's files (`evaluation.checks_policy`), written by hand in
    the directory `root` (a pathlib.Path, created): P_0's scores on 6 held-out prompts, and
    for seeds 0, 1 and arms gold, rubric_sft the held-out scores, two policy steps of
    metrics.jsonl (the second all flat: skipped, without truncated_fraction) and, where
    `settings` ({(seed, arm): flat dict}) names the run, its settings.json."""
    from drubric_jax.evaluation import checks_policy as cp

    ids = [f"h{i}" for i in range(6)]
    rng = np.random.default_rng(4)
    root.mkdir()
    (root / cp.P0_FILE).write_text(json.dumps({
        "model": "p0", "ids": ids, "gold": rng.integers(0, 2, 6).astype(float).tolist(),
        "truncated": 2}))
    for seed in (0, 1):
        for arm in ("gold", "rubric_sft"):
            d = root / f"seed{seed}" / arm
            d.mkdir(parents=True)
            (d / cp.HELDOUT_FILE).write_text(json.dumps({
                "ids": ids, "gold": rng.integers(0, 2, 6).astype(float).tolist(),
                "truncated": 1}))
            # Step 1 is all flat: skipped, no truncated_fraction (as rounds/phases logs it).
            rows = [{"kind": "train", "phase": "policy", "round": 0, "step": 0,
                     "global_step": 1, "policy_reward": 0.5, "gold_score": 0.4,
                     "truncated_fraction": 0.25 + 0.5 * seed, "active_rows": 8.0,
                     "update_skipped": 0.0, "redraws": 1},
                    {"kind": "train", "phase": "policy", "round": 0, "step": 1,
                     "global_step": 2, "policy_reward": 0.6, "gold_score": 0.5,
                     "active_rows": 0.0, "update_skipped": 1.0, "redraws": 2}]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            if (seed, arm) in settings:
                (d / cp.SETTINGS_FILE).write_text(json.dumps(settings[(seed, arm)]))


# ----------------------------------------------------------------------------- constraints


class RowRule:
    """A per-row constraint that bites, for both samplers: at a row's even steps only the
    lower half of the vocabulary is allowed; a row is complete (forced to stop) after
    `limit` tokens. It depends on the row's own tokens only, so a row in a slot of the
    engine and the same row in a `generate` batch see the same masks."""

    def __init__(self, vocab: int, limit: int):
        self.vocab, self.limit = vocab, limit

    def reset(self, batch):
        self.steps = np.zeros(batch, int)

    def reset_rows(self, rows):
        self.steps[list(rows)] = 0

    def fill(self, bitmask, rows):
        from drubric_jax.sampling.constrained import pack_bitmask  # jax: after XLA_FLAGS

        allowed = np.ones((len(self.steps), self.vocab), bool)
        allowed[self.steps % 2 == 0, self.vocab // 2:] = False
        bitmask[rows] = pack_bitmask(allowed)[rows]

    def finished(self):
        return self.steps >= self.limit

    def advance(self, tokens, live):
        self.steps[live] += 1

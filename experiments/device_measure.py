"""Measuring helpers of `experiments/device_check.py`: shapes, FLOP and byte counts, the
vendor peaks, and `Context`, a phase's state in its own process.

A phase (`experiments/device_phases.py`) builds random bfloat16 weights at the shapes of
`Shapes` (QUICK: Qwen3 shapes for one accelerator; TINY: tiny presets for CPU), times the
current code's device steps and reports one row per measurement through `Context.row`,
which catches a row's exception (status "oom" for RESOURCE_EXHAUSTED, else "error") and
prints the phase's result so far as one JSON line after each row (`RESULT_TAG`), so a
phase killed by its timeout still reports the rows it finished. device_check's docstring
says what each figure means and how FLOPs and bytes are counted.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import numpy as np

from drubric_jax.memory.costs import target
from experiments.bench_common import timed

RESULT_TAG = "@@device_check "
@dataclasses.dataclass(frozen=True)
class Shapes:
    """Models and lengths of a mode (tokens unless named otherwise)."""

    dense: str                # preset of the dense model (policy / generator)
    moe: str                  # preset of the mixture-of-experts verifier
    moe_layers: int           # its layers, cut to fit the time
    decode_batches: tuple     # rows of each decode row
    decode_context: int       # P: cache slots already filled when decoding starts
    decode_steps: int         # N: decode steps timed
    segments_batch: int       # rows of the cache-segments rows (`decode_segments` phase)
    segments_steps: int       # their N (after decode_context filled slots)
    prefill_lengths: tuple    # prompt lengths, batch 1
    prefill_new: int          # N of the prefill's cache (S = P + N)
    constrained_batch: int
    constrained_steps: int
    moe_lengths: tuple        # verifier prefix lengths, batch 1
    train_prompt: int         # P and N of the one GRPO row (T = P + N)
    train_new: int
    lora_rank: int
    copy_bytes: int           # array of the bandwidth probe


QUICK = Shapes("qwen3_8b", "qwen3_30b_a3b", 4, (1, 64, 256), 1024, 64, 64, 2048,
               (8192, 24576), 8192, 64, 64, (1024, 4096), 4096, 4096, 64, 2 ** 30)
TINY = Shapes("tiny_qwen3", "tiny_qwen3_moe", 2, (1, 4, 8), 32, 8, 4, 64, (64, 192), 16, 4,
              12, (64, 256), 32, 32, 4, 2 ** 22)


def status_of(e: BaseException) -> tuple[str, str]:
    """("oom" | "error", the exception's last non-empty line, at most 300 characters)."""
    text = f"{type(e).__name__}: {e}"
    lines = [s for s in text.strip().splitlines() if s.strip()]
    oom = any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory"))
    return ("oom" if oom else "error"), (lines[-1] if lines else type(e).__name__)[:300]


class Context:
    """One phase's shared state: shapes, device figures and the rows reported so far."""

    def __init__(self, phase: str, tiny: bool, tokenizer: str | None,
                 attention: str | None = None, decode_form: str | None = None):
        import jax

        self.jax, self.phase, self.tiny, self.tokenizer_dir = jax, phase, tiny, tokenizer
        self.attention = attention  # None: each preset's own (`ModelConfig.attention`)
        self.decode_form = decode_form  # None: the backend's (`ModelConfig.decode_form`)
        self.shapes = TINY if tiny else QUICK
        self.dev = jax.devices()[0]
        if not tiny and jax.default_backend() == "cpu":  # e.g. an accelerator plugin that failed
            raise RuntimeError("no accelerator: jax runs on cpu (the quick shapes need one; "
                               "--tiny is the CPU mode)")
        self.t0 = time.perf_counter()
        stats = self.memory_stats()
        kind = self.dev.device_kind
        peaks = target(kind)  # vendor peaks by a substring of device_kind (None: unknown)
        self.peak_tflops, self.peak_tbps = (peaks.tflops, peaks.tbps) if peaks else (None, None)
        self.result = {"phase": phase, "status": "running", "rows": [], "device": {
            "kind": kind, "backend": jax.default_backend(), "jax": jax.__version__,
            "bytes_limit_gb": stats["bytes_limit"] / 1e9 if "bytes_limit" in stats else None,
            "peak_tflops": self.peak_tflops, "peak_tbps": self.peak_tbps}}
        from drubric_jax import parallel

        self.mesh = parallel.make_mesh(1, 1, 1, [self.dev])

    def memory_stats(self) -> dict:
        try:
            return dict(self.dev.memory_stats() or {})
        except Exception:  # a backend without memory statistics
            return {}

    def peak_gb(self):
        """Peak device bytes in use so far in this process (GB), None where not reported."""
        peak = self.memory_stats().get("peak_bytes_in_use")
        return None if peak is None else peak / 1e9

    def emit(self) -> None:
        self.result["wall_s"] = time.perf_counter() - self.t0
        print(RESULT_TAG + json.dumps(self.result), flush=True)

    def row(self, name: str, fn) -> dict:
        """Runs `fn() -> dict` as the row `name`: status, its figures, the peak so far."""
        print(f"[{self.phase}] {name} ...", file=sys.stderr, flush=True)
        try:
            out = {"name": name, "status": "ok", **fn()}
        except Exception as e:  # reported per row; the phase goes on
            status, error = status_of(e)
            out = {"name": name, "status": status, "error": error}
        out["peak_gb"] = self.peak_gb()
        self.result["rows"].append(out)
        self.emit()
        return out

    def finish(self, error: BaseException | None = None) -> None:
        """The phase's status: the setup's error, else the first row that is not ok."""
        bad = [r["status"] for r in self.result["rows"] if r["status"] != "ok"]
        status = "oom" if "oom" in bad else bad[0] if bad else "ok"
        if error is not None:
            status, self.result["error"] = status_of(error)
        self.result.update(status=status, done=True)
        self.emit()

    def model(self, name: str, **changes):
        """A preset in bfloat16 (compute and storage), with `changes` (and the check's
        `--attention` and `--decode_form`, when given)."""
        from drubric_jax.models.config import PRESETS

        if self.attention:
            changes = {"attention": self.attention, **changes}
        if self.decode_form:
            changes = {"decode_form": self.decode_form, **changes}
        return PRESETS[name].replace(dtype="bfloat16", param_dtype="bfloat16", **changes)

    def init_params(self, cfg):
        """Random params of `cfg`, made on the device by one jitted call."""
        from drubric_jax import models

        params = self.jax.jit(lambda k: models.init_params(cfg, k))(self.jax.random.PRNGKey(0))
        return self.jax.block_until_ready(params)

    def ids(self, *shape, vocab: int):
        return np.random.default_rng(0).integers(0, vocab, size=shape, dtype=np.int32)


def first_and_steady(make_args, fn, warm_args=None):
    """Times a first and a second (steady) call of `fn`, results made ready, each on fresh
    arguments: `make_args()`, or for the first `warm_args()` (same shapes, no work: a
    sampler state whose rows are all done, so the call is its compilation).

    Returns:
        (compile s = the first call's time, less the steady call's when both did the same
        work; steady s; the steady call's result).
    """
    import jax

    times = []
    for args_fn in (warm_args or make_args, make_args):
        args = args_fn()
        jax.block_until_ready(args)
        out, seconds = timed(lambda: jax.block_until_ready(fn(*args)))
        times.append(seconds)
        if len(times) == 1:
            del out
    compile_s = times[0] if warm_args else max(times[0] - times[1], 0.0)
    return compile_s, times[1], out


def planned_gb(base_cfg, terms_fn):
    """(bytes of the base params + sum of the planner's terms `terms_fn(RoleModels)`) in
    GB, or (None, why) when the planner cannot size it."""
    try:
        from drubric_jax.memory.terms import RoleModels, tree_bytes

        rm = RoleModels(sources={"policy": "check", "verifier": "check"},
                        base={"check": base_cfg}, trainee={"policy": base_cfg}, train={})
        return (tree_bytes(rm.base_shapes("check")) + sum(t.bytes for t in terms_fn(rm))) / 1e9, \
            None
    except Exception as e:  # the prediction is optional; the measurement is not
        return None, status_of(e)[1]


def with_plan(row: dict, plan) -> dict:
    row["planned_gb"], why = plan
    if why:
        row["plan_error"] = why
    return row



def flops_row(ctx: Context, compile_s: float, seconds: float, tokens: int, flops: float) -> dict:
    """Figures of a timed pass over `tokens` tokens worth `flops` model FLOPs."""
    tflops = flops / seconds / 1e12
    return {"compile_s": compile_s, "steady_s": seconds, "tokens_per_s": tokens / seconds,
            "tflops": tflops, "util_kind": "MFU",
            "util": tflops / ctx.peak_tflops if ctx.peak_tflops else None,
            "note": f"{tflops:.4g} TFLOP/s ({flops / 1e12:.4g} TFLOP counted)"}


def decode_state(cfg, rows: int, filled: int, new: int, done: bool = False,
                 slots: int | None = None):
    """A `sampling.SamplerState` as a prefill of `filled` tokens leaves it, made without
    one: the first `filled` cache slots valid (zeros: values do not change a step's work),
    N = `new` steps to go, zero logits; `done`: every row already stopped (a decode loop
    on it ends at once: its compilation alone); `slots`: the cache's S (default
    filled + new; the first segment's for `sampling.decode_segments`)."""
    import jax
    import jax.numpy as jnp

    from drubric_jax import models, sampling

    slots = filled + new if slots is None else slots
    cache = models.init_cache(cfg, rows, slots).replace(
        valid=jnp.broadcast_to(jnp.arange(slots) < filled, (rows, slots)),
        index=jnp.asarray(filled, jnp.int32), empty=False)
    return sampling.SamplerState(
        cache=cache, logits=jnp.zeros((rows, cfg.vocab_size), jnp.float32),
        positions=jnp.full((rows,), filled, jnp.int32),
        tokens=jnp.zeros((rows, new), jnp.int32), logprobs=jnp.zeros((rows, new), jnp.float32),
        mask=jnp.zeros((rows, new), bool), done=jnp.full((rows,), done),
        invalid=jnp.zeros((rows,), bool), step=jnp.zeros((), jnp.int32),
        key=jax.random.PRNGKey(1))


def export_tokenizer(directory: str) -> str:
    """Writes the default model's (SmolLM2) tokenizer, rebuilt from its GGUF, to
    `directory` (tokenizer.json, tokenizer_config.json: about 3.5 MB); returns a summary."""
    from drubric_jax.text import tokenizer as tok_lib
    from drubric_jax.models import default_gguf_path

    tok = tok_lib.tokenizer_from_gguf(default_gguf_path())
    tok.save_pretrained(directory)
    return f"{len(tok)} tokens, eos {tok.eos_token!r} -> {directory}"


def load_tokenizer(directory: str | None):
    """The SmolLM2 tokenizer from `directory` (as `export_tokenizer` writes it: only
    tokenizer.json and the special tokens of tokenizer_config.json are read, so other
    transformers versions load it), or rebuilt from the GGUF when `directory` is None."""
    from drubric_jax.text import tokenizer as tok_lib

    if not directory:
        from drubric_jax.models import default_gguf_path

        return tok_lib.tokenizer_from_gguf(default_gguf_path())
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
        conf = json.load(f)
    special = {k: conf[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
               if isinstance(conf.get(k), str)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(os.path.join(directory, "tokenizer.json")),
        clean_up_tokenization_spaces=False, **special)

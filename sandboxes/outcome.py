"""How a local sandbox run ended, as an ExecutionResult status."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

from agentgym.sandboxes.contract import ExecutionResult, Status


@dataclass(frozen=True)
class TreeReport:
    """What the run's cgroup saw, read after its tree is gone."""

    peak_memory_bytes: int | None = None
    oom_killed: bool = False


def classify(
    returncode: int | None,
    out: bytes,
    err: bytes,
    cut: Literal["timeout", "output_limit", "memory"] | None,
    duration: float,
    wrapped: bool,
    ended: TreeReport,
) -> ExecutionResult:
    """Maps how the process ended to a status (see ExecutionResult)."""
    stdout = out.decode("utf-8", errors="replace")
    stderr = err.decode("utf-8", errors="replace")
    peak = ended.peak_memory_bytes
    if cut is not None:
        return ExecutionResult(cut, stdout, stderr, None, duration, peak_memory_bytes=peak)
    code = returncode if returncode is not None else -signal.SIGKILL
    if wrapped and code > 128:  # bwrap reports a child killed by signal N as 128 + N
        code = -(code - 128)
    tail = stderr[-2000:]
    status: Status
    if code == 0 and not ended.oom_killed:
        status = "ok"
    elif code == -signal.SIGXCPU:
        status = "timeout"
    elif ended.oom_killed or "MemoryError" in tail or "Cannot allocate memory" in tail:
        status = "memory"
    elif code < 0:
        status = "killed"
    else:
        status = "error"
    return ExecutionResult(status, stdout, stderr, code, duration, peak_memory_bytes=peak)

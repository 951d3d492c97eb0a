"""The sandbox contract, and the threat model every sandbox is held to.

A sandbox runs untrusted, model-written Python and returns an
`ExecutionResult`. It never raises for anything the code does: an infinite
loop, a fork bomb or a memory bomb comes back as a status, and the host
(the trainer, the inference server, the machine) is left as it was.

Threat model
------------
The adversary is the code itself: a policy under RL pressure that finds
whatever raises its reward or breaks the run, by accident or on purpose.
It is not a kernel attacker, and the sandbox does not claim to stop one.

Isolated, and why:

- Network. Each run gets its own network namespace holding only its own
  loopback (up under bwrap, down under unshare), and no route. No outbound
  TCP, no DNS, and no host loopback:
  the trainer's and the inference server's ports on 127.0.0.1 live in
  another namespace, out of reach. (Reward hacking by calling a grader or
  a model over HTTP is the reason.)
- Filesystem. The system (/usr, /etc, the libraries, the Python prefix)
  is mounted read-only; the root is a read-only tmpfs with nothing else on
  it, so home directories (~/.bashrc, ~/.cache, tokens), the repository
  and the host's /tmp are not there at all. /dev holds only a few devices
  and is read-only too.
- Scratch space: the work dir (`WORKDIR`), /tmp and /dev/shm are the only
  writable places, each a private tmpfs thrown away after the run, so
  nothing written survives. Each is capped at `tmpfs_mb` in every budget
  mode: a write past it fails with ENOSPC (and one file stops at
  RLIMIT_FSIZE). With a cgroup their pages also count against
  `memory_mb`, so a run that fills them past its budget is killed as
  "memory"; without one (the rlimit fallback) they are host RAM outside
  `memory_mb`, at most 3 x `tmpfs_mb` per run.
- Environment. The host's environment variables (API keys, tokens) are
  cleared; the code sees a fixed PATH, HOME and LANG. Python runs with
  -I, so PYTHON* variables and the user site are ignored as well.
- User and capabilities. The code runs as an unprivileged uid with no
  capabilities and no_new_privs set, so setuid binaries give nothing. When
  the trainer is root, the code still gets a uid that owns no host file.
- Processes. A new pid namespace: the code sees only its own processes,
  so `os.kill(-1, 9)`, `os.killpg` or killing its parent cannot reach the
  trainer. rlimits bound CPU seconds, file size and open files of each
  process. The process count is per run: each run gets its own user
  namespace or its own uid, and (with a cgroup) its own pids limit.
- Memory and process budget, for the whole tree. An address-space rlimit
  binds each process alone, and a run may fork, so per-process limits
  multiply (32 processes x 1 GB is 32 GB: the host's OOM killer then
  picks the largest process, the trainer). Where the machine allows it
  (root, or a delegated cgroup), each run gets its own cgroup (v2, or the
  v1 `memory` and `pids` controllers): memory, page cache and tmpfs
  writes of the whole tree count against `memory_mb` with no swap, and
  processes against a pids limit; an OOM kill in it comes back as
  "memory"; the group is removed after the run. The run's interpreter
  joins its group first thing, before any of the run's code, so the
  group counts all the run allocates (a bare `print` peaks under 1 MB);
  the pages of the interpreter's start-up (some 10 MB) and bwrap itself
  stay charged to the trainer, outside `memory_mb`. Elsewhere the fallback
  splits the budget: per-process address space x the process cap stays
  within `memory_mb` (at least 128 MB each, so fewer processes when
  `memory_mb` is small), and the sandbox warns once. `describe()` and each
  result's `budget` say which mode ran. The v2 path is exercised here only
  against a fake cgroupfs: the CI machines mount v1 controllers.
- Zombies and orphans. The run's process is pid 1 of its namespace
  (bwrap --as-pid-1, or unshare's forked child) and the direct child of
  bwrap/unshare, which reaps it; the sandbox kills that pid 1 first, so
  no helper is ever orphaned to the host's PID 1 (which, when it is the
  trainer, reaps nothing). The namespace's own orphans die with it.
- Time. A wall-clock deadline kills the whole tree by killing the pid
  namespace's init, which takes grandchildren and setsid'd daemons with
  it; CPU-bound C code that never checks signals dies the same way.
- Output. stdout and stderr are read concurrently (no pipe deadlock) and
  each is capped; past the cap the process is killed and the text ends in
  a marker. Invalid UTF-8 is decoded with replacement characters.

Not isolated, and why:

- Kernel exploits and container escapes through system calls. There is
  no seccomp filter or VM boundary; a gVisor or Firecracker sandbox is the
  answer when the code is truly hostile, and is out of scope here.
- CPU side channels (Spectre-class, cache timing) and noisy-neighbour
  effects: the code shares the CPU and memory bandwidth with the trainer.
- Information about the machine that any process can read: the kernel
  version, CPU model and count, total memory, the read-only system files
  (world-readable ones only), and /proc of its own pid namespace.
- Memory without a cgroup (the rlimit fallback): page cache and kernel
  memory are not accounted, and writes to the work dir, /tmp and /dev/shm
  take host RAM up to their caps (3 x `tmpfs_mb`), outside `memory_mb`.
- Denial of service below the limits, e.g. a run that uses its full CPU
  quota on every core it can fork onto.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "killed"]
BudgetMode = Literal["cgroup", "rlimit", "per_process"]
"""How a run's memory and processes were bounded: one cgroup for the tree, rlimits split
so that their product fits `memory_mb`, or (unsafe, for comparison) per process only."""
SandboxKind = Literal["local", "docker"]
SANDBOX_KINDS: tuple[str, ...] = ("local", "docker")


@dataclass(frozen=True)
class ExecutionResult:
    """What one run of untrusted code produced.

    Attributes:
        status: "ok" (exit 0), "error" (nonzero exit or an exception),
            "timeout" (wall clock or CPU limit), "memory" (address-space
            limit, or an OOM kill in the run's cgroup), "output_limit"
            (stdout or stderr over the cap) or "killed" (any other signal).
        stdout: standard output, decoded as UTF-8 with errors="replace".
        stderr: standard error, decoded the same way.
        exit_code: the exit status; minus the signal number when killed by
            one; None when the sandbox killed the run (timeout, output cap).
        duration_s: wall-clock seconds from handing over the code to exit.
        budget: how memory and processes were bounded (see `BudgetMode`);
            None where the sandbox does not say.
        peak_memory_bytes: the most memory the run's tree held, where a
            cgroup measured it; else None.
    """

    status: Status
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float
    budget: BudgetMode | None = None
    peak_memory_bytes: int | None = None

    @property
    def ok(self) -> bool:
        """Whether the code ran to completion with exit status 0."""
        return self.status == "ok"


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot isolate code on this machine (a tool or engine is missing)."""


@runtime_checkable
class Sandbox(Protocol):
    """Runs untrusted Python source and reports what happened, never raising for it."""

    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        files: Mapping[str, str] | None = None,
    ) -> ExecutionResult:
        """Runs `code` as the main module of a fresh Python process.

        Args:
            code: Python source, run as `main.py` in the work dir.
            stdin: text fed to the process's standard input.
            timeout_s: wall-clock limit; the whole process tree dies at it.
            memory_mb: memory limit of the whole run (its process tree).
            files: extra files to create in the work dir, relative path -> text.

        Returns:
            The ExecutionResult; its status says how the run ended.
        """
        ...

    def close(self) -> None:
        """Releases the sandbox's resources (warm processes, containers)."""
        ...

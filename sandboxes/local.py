"""The default sandbox: a fresh, namespaced, rlimited Python process per run.

See `agentgym.sandboxes.contract` for the threat model. Three isolation modes:

- "bwrap": bubblewrap builds a private root (read-only /usr, /etc and the
  Python prefix; a new /proc; a minimal read-only /dev; capped tmpfs work
  dir, /tmp and /dev/shm) in new pid, net, ipc, uts and mount namespaces.
  As an ordinary user it also makes a user namespace and runs the code as
  uid 65534; as root it keeps only CAP_SETUID/CAP_SETGID so the bootstrap
  can drop to a random high uid that owns nothing (in a user namespace
  mapped to root the kernel would not enforce RLIMIT_NPROC).
- "unshare": for root where bubblewrap is missing. util-linux `unshare`
  makes the same namespaces; the bootstrap builds the same root with
  mount(2) and chroot, then drops to a random high uid.
- "none": no isolation at all, only rlimits and a temp work dir; warns on
  every run. For debugging on machines where neither tool works.

"auto" takes bwrap, else unshare, else raises SandboxUnavailableError.
In every mode the code runs as `/sandbox/main.py` under `python -I`, as
pid 1 of its pid namespace and the direct child of bwrap or unshare; the
wall clock kills it first (the tree goes with it, and its parent reaps
it and exits), so nothing is orphaned to the host's PID 1.

Memory and processes are bounded per run, tree-wide: by a cgroup where the
machine allows one, else by rlimits split to fit (`agentgym.sandboxes.budget`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import marshal
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from agentgym.sandboxes import cgroups
from agentgym.sandboxes._io import communicate
from agentgym.sandboxes.budget import (
    Budget,
    BudgetPlan,
    plan_budget,
    process_limits,
)
from agentgym.sandboxes.contract import BudgetMode, ExecutionResult, SandboxUnavailableError
from agentgym.sandboxes.outcome import TreeReport, classify

Isolation = Literal["auto", "bwrap", "unshare", "none"]
WORKDIR = "/sandbox"
INSTALL_HINT = "install bubblewrap (`apt-get install -y bubblewrap`) or run as root with util-linux"
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "LANG": "C.UTF-8"}
_BOOTSTRAP = (Path(__file__).with_name("_bootstrap.py")).read_text()
_UID_BASE, _UID_SPAN = 1_800_000_000, 1 << 24  # far above any real or subordinate uid
_probe_cache: dict[tuple[str, ...], str | None] = {}


def _probe(cmd: list[str]) -> str | None:
    """Runs `cmd` once per process; returns None when it works, else why not."""
    key = tuple(cmd)
    if key not in _probe_cache:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            ok = proc.returncode == 0
            _probe_cache[key] = None if ok else (proc.stderr.strip() or f"exit {proc.returncode}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            _probe_cache[key] = str(exc)
    return _probe_cache[key]


def unavailable_reason(isolation: Literal["bwrap", "unshare"]) -> str | None:
    """Says why `isolation` cannot work on this machine, or None when it can."""
    tool = shutil.which("bwrap" if isolation == "bwrap" else "unshare")
    if tool is None:
        return f"`{'bwrap' if isolation == 'bwrap' else 'unshare'}` is not installed"
    if isolation == "bwrap":
        userns = [] if os.geteuid() == 0 else ["--unshare-user"]
        ns = [*userns, "--unshare-net", "--unshare-pid", "--as-pid-1"]  # no init to orphan
        failure = _probe([tool, *ns, "--dev-bind", "/", "/", "true"])
    elif os.geteuid() != 0:
        return "`unshare` isolation needs root (it makes namespaces without a user namespace)"
    else:
        failure = _probe([tool, "--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "true"])
    return None if failure is None else f"`{tool}` cannot make namespaces here: {failure}"


def _python_dirs(python: str) -> list[str]:
    """The directories the interpreter needs (prefixes, venv), outside /usr."""
    query = "import sys,json;print(json.dumps([sys.prefix,sys.base_prefix,sys.exec_prefix]))"
    out = subprocess.run([python, "-I", "-c", query], capture_output=True, text=True, check=True)
    dirs = {os.path.realpath(p) for p in json.loads(out.stdout)}
    dirs.add(os.path.realpath(os.path.dirname(os.path.dirname(os.path.realpath(python)))))
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(python))))
    kept = sorted(
        d for d in dirs if not d.startswith(("/usr/", "/etc/")) and d not in ("/usr", "/")
    )
    return [d for d in kept if not any(d.startswith(o + "/") for o in kept)]


@dataclasses.dataclass
class _Spawned:
    """One started sandbox process, waiting for its payload on the control pipe."""

    proc: subprocess.Popen[bytes]
    control_fd: int
    tmpdir: str | None
    group: cgroups.RunGroup | None


class LocalSandbox:
    """Runs each piece of code in a fresh isolated process tree on this machine.

    Args:
        isolation: "auto" (bwrap, else unshare), "bwrap", "unshare", or
            "none" (no isolation; warns on every run).
        max_output_bytes: cap on each of stdout and stderr; past it the run
            is killed with status "output_limit".
        pool_size: warm interpreters kept waiting for code (0: none). Each
            serves one run and is replaced in the background.
        python: the interpreter inside the sandbox (default: this one).
        site_packages: let the code import the interpreter's installed
            packages. Off by default: the code sees the standard library
            only (`python -S`), which is less to attack, keeps graders'
            packages (e.g. a dataset with the answers) out of reach, and
            skips site processing, the larger part of interpreter start-up.
        max_file_mb: RLIMIT_FSIZE, the largest file the code may write.
        tmpfs_mb: size of each of the work dir and /tmp.
        max_processes: processes and threads per run (a cgroup's pids limit
            and RLIMIT_NPROC; fewer in the rlimit fallback, see `budget`).
        max_open_files: RLIMIT_NOFILE.
        budget: how a run's memory and processes are bounded: "auto" (a
            cgroup per run where possible, else "rlimit" with a warning),
            "cgroup" (required), "rlimit" (per-process limits split to fit
            `memory_mb`), or "per_process" (unsafe; for comparisons).

    Raises:
        SandboxUnavailableError: when the requested isolation or budget cannot work here.
    """

    def __init__(
        self,
        isolation: Isolation = "auto",
        max_output_bytes: int = 1_000_000,
        pool_size: int = 0,
        python: str | None = None,
        site_packages: bool = False,
        max_file_mb: int = 10,
        tmpfs_mb: int = 64,
        max_processes: int = 32,
        max_open_files: int = 64,
        budget: Budget = "auto",
    ) -> None:
        self.isolation = self._resolve(isolation)
        self.plan: BudgetPlan = plan_budget(budget)
        self.max_output_bytes = max_output_bytes
        self.python = python or sys.executable
        self.site_packages = site_packages
        self.limits = {"max_file_mb": max_file_mb, "nproc": max_processes, "nofile": max_open_files}
        self.tmpfs_bytes = tmpfs_mb << 20
        self._python_dirs = _python_dirs(self.python)
        self._pool: deque[_Spawned] = deque()
        self._pool_size = pool_size
        self._lock = threading.Lock()
        self._closed = False
        self._refill = threading.Event()
        self._graves: list[cgroups.RunGroup] = []  # emptied run groups the filler removes
        if pool_size:
            # Warm interpreters and their cgroups go at exit too, if nobody closed us.
            ref = weakref.ref(self)

            def close_at_exit() -> None:
                if (sandbox := ref()) is not None:
                    sandbox.close()

            self._close_at_exit = close_at_exit
            atexit.register(self._close_at_exit)
            # One filler thread for the sandbox's lifetime: bwrap's --die-with-parent (and
            # unshare's --kill-child) fire when the *thread* that spawned them exits, so a
            # short-lived spawning thread would kill the warm interpreters it made.
            threading.Thread(target=self._keep_pool_full, daemon=True).start()

    @property
    def budget(self) -> BudgetMode:
        """The mode runs are bounded in: "cgroup", "rlimit" or "per_process"."""
        return self.plan.mode

    def describe(self) -> str:
        """One line saying how this sandbox isolates code and bounds each run."""
        return f"{self.isolation}; {self.plan.describe(self.limits['nproc'])}"

    @staticmethod
    def _resolve(isolation: Isolation) -> Literal["bwrap", "unshare", "none"]:
        if isolation == "none":
            return "none"
        if isolation in ("bwrap", "unshare"):
            reason = unavailable_reason(isolation)
            if reason:
                raise SandboxUnavailableError(f"isolation={isolation!r}: {reason}; {INSTALL_HINT}")
            return isolation
        if isolation != "auto":
            raise ValueError(f"unknown isolation {isolation!r}: auto, bwrap, unshare or none")
        reasons = {mode: unavailable_reason(mode) for mode in ("bwrap", "unshare")}
        for mode in ("bwrap", "unshare"):
            if reasons[mode] is None:
                return mode
        detail = "; ".join(f"{m}: {r}" for m, r in reasons.items())
        raise SandboxUnavailableError(
            f"no way to isolate code on this machine ({detail}). To fix it, {INSTALL_HINT}; "
            'or pass isolation="none" to run model code unisolated (not recommended).'
        )

    # -- processes ---------------------------------------------------------

    def _command(
        self, uid: int | None, workdir: str, control_fd: int, join_fds: list[int]
    ) -> list[str]:
        cfg: dict[str, object] = {"uid": uid, "workdir": workdir, "tmpfs_bytes": self.tmpfs_bytes}
        cfg |= {"control_fd": control_fd, "join_fds": join_fds}
        if self.isolation == "unshare":
            cfg |= {
                "build_root": True,
                "system_dirs": SYSTEM_DIRS,
                "python_dirs": self._python_dirs,
            }
        flags = ["-I"] if self.site_packages else ["-I", "-S"]
        boot = [self.python, *flags, "-c", _BOOTSTRAP, marshal.dumps(cfg, 4).hex()]
        if self.isolation == "none":
            return boot
        if self.isolation == "unshare":
            ns = ["--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child"]
            return [shutil.which("unshare") or "unshare", *ns, "--", *boot]
        # --as-pid-1: bwrap's own init would exit after bwrap does, orphaned to the host's
        # PID 1, a zombie on every run; as pid 1 the code is bwrap's child, reaped by it.
        return [*self._bwrap_args(), "--as-pid-1", "--", *boot]

    def _bwrap_args(self) -> list[str]:
        args = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session"]
        args += ["--unshare-pid", "--unshare-net"]
        args += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
        if os.geteuid() == 0:
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            args += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        # --dev before /dev/shm's capped tmpfs, which it would hide if mounted later. Its own
        # tmpfs has no size and is the code's where bwrap makes a user namespace: it is
        # remounted read-only below.
        args += ["--dev", "/dev"]
        size = str(self.tmpfs_bytes)
        for path in (WORKDIR, "/tmp", "/dev/shm"):
            args += ["--perms", "1777", "--size", size, "--tmpfs", path]
        # The Python dirs come after the tmpfs mounts: a venv under /tmp (a CI checkout)
        # would otherwise be hidden by the private /tmp.
        parents = {str(p) for d in self._python_dirs for p in Path(d).parents if str(p) != "/"}
        for path in sorted(parents, key=len):  # bwrap would make them 0700, closed to the code
            args += ["--perms", "0755", "--dir", path]
        for path in self._python_dirs:
            args += ["--ro-bind", path, path]
        args += ["--proc", "/proc", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/"]
        args += ["--clearenv"] + [a for k, v in SAFE_ENV.items() for a in ("--setenv", k, v)]
        return args

    def _spawn(self) -> _Spawned:
        """Starts one isolated interpreter (in its own cgroup), waiting on its control pipe."""
        group = None
        if self.plan.hierarchy is not None:
            group = self.plan.hierarchy.create(self.limits["nproc"])
        # The bootstrap joins the group itself, first thing, through these fds: before
        # any code of the run, with nothing exec'd in between (a joining `sh` cost 3 ms).
        join_fds = [os.open(f, os.O_WRONLY) for f in group.procs_files] if group else []
        tmpdir = tempfile.mkdtemp(prefix="agentgym-sandbox-") if self.isolation == "none" else None
        isolated_root = os.geteuid() == 0 and self.isolation != "none"
        uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if isolated_root else None
        ctl_read, ctl_write = os.pipe()
        env = dict(SAFE_ENV, HOME=tmpdir) if tmpdir else SAFE_ENV
        command = self._command(uid, tmpdir or WORKDIR, ctl_read, join_fds)
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(ctl_read, *join_fds),
                start_new_session=True,
                env=env,
                cwd=tmpdir or "/",
            )
        except OSError:
            if group is not None:
                group.remove()
            raise
        finally:
            for fd in (ctl_read, *join_fds):
                os.close(fd)
        return _Spawned(proc, ctl_write, tmpdir, group)

    def _keep_pool_full(self) -> None:
        while not self._closed:
            self._bury()
            self._fill_pool()
            self._refill.wait()
            self._refill.clear()
        self._bury()

    def _bury(self) -> None:
        """Removes the cgroups of ended runs (list.pop is atomic: no lock needed)."""
        while self._graves:
            _remove(self._graves.pop())

    def _fill_pool(self) -> None:
        while not self._closed:
            with self._lock:
                if len(self._pool) >= self._pool_size:
                    return
            spawned = self._spawn()
            with self._lock:
                if self._closed:
                    _end(spawned, self.isolation)
                    return
                self._pool.append(spawned)

    def _take(self) -> _Spawned:
        with self._lock:
            taken = self._pool.popleft() if self._pool else None
        if self._pool_size:
            self._refill.set()
        return taken or self._spawn()

    # -- the contract --------------------------------------------------------

    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        files: Mapping[str, str] | None = None,
    ) -> ExecutionResult:
        """Runs `code` as `main.py` in a fresh isolated process tree; see `Sandbox.run`."""
        if self.isolation == "none":
            warnings.warn("LocalSandbox(isolation='none') runs model code UNISOLATED", stacklevel=2)
        spawned = self._take()
        per_process = process_limits(self.plan.mode, memory_mb, self.limits["nproc"])
        limits = {
            "RLIMIT_AS": per_process.address_space_bytes,
            "RLIMIT_CPU": math.ceil(timeout_s) + 1,
            "RLIMIT_FSIZE": self.limits["max_file_mb"] << 20,
            "RLIMIT_NOFILE": self.limits["nofile"],
            "RLIMIT_NPROC": per_process.processes,
            "RLIMIT_CORE": 0,
        }
        payload = marshal.dumps({"code": code, "files": dict(files or {}), "limits": limits}, 4)
        start = time.monotonic()
        cut: Literal["timeout", "output_limit", "memory"] | None
        out, err, cut = b"", b"", None
        try:
            if spawned.group is not None:
                spawned.group.set_memory_limit(memory_mb << 20)
        except OSError as exc:  # EBUSY: the idle interpreter alone holds more than memory_mb
            err = f"memory_mb={memory_mb} is below what the interpreter needs: {exc}".encode()
            cut = "memory"
        try:
            if cut is None:
                out, err, cut = communicate(
                    spawned.proc,
                    spawned.control_fd,
                    payload,
                    stdin.encode(),
                    start + timeout_s,
                    self.max_output_bytes,
                )
                spawned.control_fd = -1  # communicate closed it
        finally:
            graves = self._graves if self._pool_size and not self._closed else None
            ended = _end(spawned, self.isolation, graves)
        duration = time.monotonic() - start
        res = classify(
            spawned.proc.returncode, out, err, cut, duration, self.isolation != "none", ended
        )
        return dataclasses.replace(res, budget=self.plan.mode)

    def close(self) -> None:
        """Kills the warm interpreters; the sandbox can still run code cold."""
        if self._pool_size:
            atexit.unregister(self._close_at_exit)
        with self._lock:
            self._closed = True
            pool, self._pool = list(self._pool), deque()
        for spawned in pool:
            _end(spawned, self.isolation)
        self._bury()
        # Only now let the filler thread exit: bwrap's --die-with-parent would kill the
        # warm bwraps it spawned, orphaning their pid 1 before we could kill it first.
        self._refill.set()

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_pool", None):
            self.close()


def _end(
    spawned: _Spawned, isolation: str, graves: list[cgroups.RunGroup] | None = None
) -> TreeReport:
    """Kills a sandbox's process tree, reaps it, and frees what it held (pipes, dirs, cgroup).

    With `graves`, the emptied cgroup is left there for the pool's filler thread to
    remove, off the caller's path.
    """
    proc = spawned.proc
    if spawned.control_fd >= 0:
        os.close(spawned.control_fd)
        spawned.control_fd = -1
    if proc.poll() is None:
        # Kill pid 1 of the run's namespace first: the kernel kills the rest of the tree,
        # and bwrap (or unshare), its parent, reaps it and exits. Killing bwrap first
        # would orphan that pid 1 to the host's PID 1, a zombie where nothing reaps.
        roots = _child_pids(proc.pid) if isolation != "none" else []
        for pid in roots:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            # generous: on a loaded machine bwrap may take seconds to reap and exit, and
            # killing it first would orphan the run's pid 1
            proc.wait(timeout=10 if roots else 0.001)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    if spawned.tmpdir:
        shutil.rmtree(spawned.tmpdir, ignore_errors=True)
    group = spawned.group
    if group is None:
        return TreeReport()
    group.kill()  # nothing should be left; a process outside the namespace would be
    ended = TreeReport(group.peak_bytes(), group.oom_kills() > 0)
    if graves is not None:
        graves.append(group)
    else:
        _remove(group)
    return ended


def _remove(group: cgroups.RunGroup) -> None:
    if not group.remove():
        warnings.warn(f"could not remove the run's cgroup {group.memory_dir}", stacklevel=3)


def _child_pids(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # gone, or a kernel without CONFIG_PROC_CHILDREN
        return []

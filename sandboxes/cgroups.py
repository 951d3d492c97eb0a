"""Per-run cgroups: one memory and process budget for a sandbox run's whole process tree.

rlimits bind each process on its own, so a run that forks N children may
use N times its memory limit. A cgroup counts the tree: the run's memory
(resident pages, page cache and tmpfs it writes, kernel memory) against
one limit with no swap, and its processes against one pids limit.

`detect()` finds where this process may create groups: cgroup v2
(`memory.max`, `memory.swap.max`, `pids.max`, one directory per run) or
v1 (a directory per run in each of the `memory` and `pids` hierarchies).
It returns a `Hierarchy`, or a sentence saying why there is none (not
root, no controllers, a read-only cgroupfs); the local sandbox then falls
back to rlimits. A `RunGroup` is created per run, filled by writing a pid
to its `procs_files` before the untrusted code starts, read after the run
(peak memory, OOM kills) and removed.

v2 needs the memory and pids controllers enabled in our cgroup's
`cgroup.subtree_control`. A non-root cgroup that holds processes cannot
enable them ("no internal processes"), so when this process is alone in
its cgroup it moves itself into a `agentgym-trainer` leaf first, as
systemd's delegation guide describes; otherwise `detect()` says why not.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Version = Literal[1, 2]
GROUP_PREFIX = "agentgym-"
TRAINER_LEAF = "agentgym-trainer"
_counter = itertools.count()
_detected: dict[str, Hierarchy | str] = {}


@dataclass(frozen=True)
class Mount:
    """One cgroup mount from /proc/self/mountinfo."""

    mountpoint: str
    root: str
    fstype: str
    options: frozenset[str]


@dataclass(frozen=True)
class RunGroup:
    """The cgroup (v2) or pair of cgroups (v1: memory, pids) of one run."""

    version: Version
    memory_dir: Path
    pids_dir: Path

    @property
    def dirs(self) -> tuple[Path, ...]:
        if self.memory_dir == self.pids_dir:
            return (self.memory_dir,)
        return (self.memory_dir, self.pids_dir)

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """Where a process writes "0" to join the group (v1: one file per controller)."""
        return tuple(d / "cgroup.procs" for d in self.dirs)

    def set_memory_limit(self, limit_bytes: int) -> None:
        """Caps the group's memory at `limit_bytes`, swap included (no swap)."""
        if self.version == 2:
            _write(self.memory_dir / "memory.max", limit_bytes)
            _write(self.memory_dir / "memory.swap.max", 0, missing_ok=True)
            _write(self.memory_dir / "memory.oom.group", 1, missing_ok=True)  # kill the tree
            return
        # memsw (memory + swap) must stay >= the memory limit, so set memory first.
        _write(self.memory_dir / "memory.limit_in_bytes", limit_bytes)
        _write(self.memory_dir / "memory.memsw.limit_in_bytes", limit_bytes, missing_ok=True)

    def add(self, pid: int) -> None:
        """Moves process `pid` into the group (its later children follow it)."""
        for path in self.procs_files:
            _write(path, pid)

    def pids(self) -> set[int]:
        """The processes in the group now."""
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(FileNotFoundError):
                found.update(int(line) for line in path.read_text().split())
        return found

    def peak_bytes(self) -> int | None:
        """The most memory the group has held, or None where the kernel does not say."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.memory_dir / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def oom_kills(self) -> int:
        """How many of the group's processes the OOM killer has killed."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            lines = (self.memory_dir / name).read_text().splitlines()
        except OSError:
            return 0
        fields = dict(line.split(None, 1) for line in lines if " " in line)
        return int(fields.get("oom_kill", "0"))

    def kill(self) -> None:
        """SIGKILLs every process in the group, including any forked meanwhile."""
        kill_file = self.memory_dir / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, 1)
                return
        for _ in range(100):  # a process may fork between our read and our kill
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def remove(self, timeout_s: float = 2.0) -> bool:
        """Kills what is left and removes the group; False if it was still busy at the timeout."""
        deadline = time.monotonic() + timeout_s
        for directory in self.dirs:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:  # EBUSY: dying processes still charged to it
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        return False
                    self.kill()
                    time.sleep(0.001)
        return True


@dataclass(frozen=True)
class Hierarchy:
    """Where this process creates run groups: v2's one parent, or v1's memory and pids parents."""

    version: Version
    memory_parent: Path
    pids_parent: Path

    def create(self, max_pids: int) -> RunGroup:
        """Makes an empty run group with a pids limit (the memory limit comes per run)."""
        name = f"{GROUP_PREFIX}{os.getpid()}-{next(_counter)}"
        group = RunGroup(self.version, self.memory_parent / name, self.pids_parent / name)
        made: list[Path] = []
        try:
            for directory in group.dirs:
                directory.mkdir()
                made.append(directory)
            _write(group.pids_dir / "pids.max", max_pids)
        except OSError:
            for directory in reversed(made):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise
        return group

    def sweep(self) -> list[str]:
        """Removes the empty run groups that trainers now gone left behind (killed, or
        exiting with a warm pool open); returns their names. Live trainers' are kept."""
        removed = []
        for parent in dict.fromkeys((self.memory_parent, self.pids_parent)):
            for directory in parent.glob(f"{GROUP_PREFIX}*-*"):
                owner = directory.name[len(GROUP_PREFIX) :].split("-")[0]
                if not owner.isdigit() or Path(f"/proc/{owner}").exists():
                    continue
                with contextlib.suppress(OSError):  # not empty, or raced: leave it
                    directory.rmdir()
                    removed.append(directory.name)
        return removed


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Maps each v1 controller (and "" for v2) to this process's cgroup path."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts listed in a mountinfo text."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 10:
            continue
        tail = line.split(" - ", 1)[1].split()
        if tail[0] in ("cgroup", "cgroup2"):
            options = frozenset(tail[2].split(",")) if len(tail) > 2 else frozenset()
            mounts.append(Mount(_unescape(fields[4]), _unescape(fields[3]), tail[0], options))
    return mounts


def find_hierarchy(proc_cgroup: str, mountinfo: str, fs_root: Path = Path("/")) -> Hierarchy | str:
    """Finds where run groups can go, from /proc/self/cgroup and mountinfo texts.

    Args:
        proc_cgroup: the text of /proc/self/cgroup.
        mountinfo: the text of /proc/self/mountinfo.
        fs_root: where the mountpoints are found (a fake cgroupfs folder in tests).

    Returns:
        A Hierarchy (v2 preferred), or why neither version can hold run groups.
    """
    own, mounts = parse_proc_cgroup(proc_cgroup), parse_mountinfo(mountinfo)
    reasons = []
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if v2 is None or "" not in own:
        reasons.append("no cgroup v2 mount")
    else:
        found = _v2_parent(_own_dir(fs_root, v2, own[""]))
        if isinstance(found, Path):
            return Hierarchy(2, found, found)
        reasons.append(found)
    dirs = {}
    for controller in ("memory", "pids"):
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if mount is None or controller not in own:
            reasons.append(f"cgroup v1: no {controller} hierarchy mounted")
            break
        dirs[controller] = _own_dir(fs_root, mount, own[controller])
    else:
        return Hierarchy(1, dirs["memory"], dirs["pids"])
    return "; ".join(reasons)


def detect(max_pids: int = 8) -> Hierarchy | str:
    """This process's Hierarchy, probed by making a group with limits; or why there is none.

    The answer is cached for the life of the process.
    """
    if "" not in _detected:
        try:
            found = find_hierarchy(
                Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
            )
        except OSError as exc:
            found = f"cannot read /proc/self: {exc}"
        if isinstance(found, Hierarchy):
            try:
                probe = found.create(max_pids)
                try:
                    probe.set_memory_limit(64 << 20)
                finally:
                    probe.remove()
            except OSError as exc:
                found = f"cgroup v{found.version} at {found.memory_parent}: {exc}"
            else:
                found.sweep()
        _detected[""] = found
    return _detected[""]


def _own_dir(fs_root: Path, mount: Mount, path: str) -> Path:
    # Inside a cgroup namespace (or a bind-mounted subtree) the mount's root is a
    # prefix of our path; strip it so the path is relative to the mountpoint.
    if mount.root != "/" and (path == mount.root or path.startswith(mount.root + "/")):
        path = path[len(mount.root) :]
    return fs_root / mount.mountpoint.lstrip("/") / path.lstrip("/")


def _v2_parent(own: Path) -> Path | str:
    """Our v2 cgroup, with memory and pids enabled for its children; or why not."""
    try:
        available = set((own / "cgroup.controllers").read_text().split())
        enabled = set((own / "cgroup.subtree_control").read_text().split())
    except OSError as exc:
        return f"cgroup v2: {exc}"
    if not {"memory", "pids"} <= available:
        return f"cgroup v2: memory and pids are not available in {own} (has: {sorted(available)})"
    if {"memory", "pids"} <= enabled:
        return own
    try:
        members = (own / "cgroup.procs").read_text().split()
        if members == [str(os.getpid())]:  # alone: step into a leaf, then enable (see above)
            (own / TRAINER_LEAF).mkdir(exist_ok=True)
            _write(own / TRAINER_LEAF / "cgroup.procs", os.getpid())
        _write(own / "cgroup.subtree_control", "+memory +pids")
    except OSError as exc:
        return (
            f"cgroup v2: cannot enable memory and pids below {own} ({exc}); run the trainer "
            "alone in a delegated cgroup (e.g. `systemd-run -p Delegate=yes`)"
        )
    return own


def _write(path: Path, value: object, missing_ok: bool = False) -> None:
    """Writes one value to a cgroup interface file (which the kernel made; never creates one)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")

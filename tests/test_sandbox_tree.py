"""The local sandbox bounds a run's whole process tree and leaves no zombie or orphan.

Memory tests run one workload, 16 children that each touch up to 400 MB under
`memory_mb=512`, in each budget mode: with a cgroup the group's own peak
stays within `memory_mb`; in the rlimit fallback the run's summed PSS
(sampled every 20 ms) stays within `memory_mb` + 64 MB; with per-process
limits only, the same workload goes past 2 x `memory_mb`, which shows the
sampler can see a failure. The sampler sums by pid namespace and keeps the
largest: a run's tree is its own namespace, and whatever else starts below
pytest meanwhile (a Ray worker an earlier test left, the pool's next worker)
is not the run's. Every test kills what a run left, even when it
fails, and each run is bounded by its own `timeout_s`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgym.sandboxes import cgroups
from agentgym.sandboxes.budget import FALLBACK_FLOOR_MB, process_limits
from agentgym.sandboxes.local import LocalSandbox, unavailable_reason

MODES = [m for m in ("bwrap", "unshare") if unavailable_reason(m) is None]
pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the local sandbox is Linux-only"),
    pytest.mark.skipif(not MODES, reason="neither bwrap nor unshare can isolate here"),
]
HIERARCHY = cgroups.detect() if sys.platform == "linux" else "not Linux"
needs_cgroup = pytest.mark.skipif(
    not isinstance(HIERARCHY, cgroups.Hierarchy), reason=f"no cgroup for runs: {HIERARCHY}"
)
MEMORY_MB = 512
MARKER = "1000.375"  # an argument of the `sleep` a run's children exec, to find leftovers
TOUCH_400MB_X16 = """
import os, time
kids = []
for _ in range(16):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        held = []
        try:
            while len(held) < 40:
                held.append(bytearray(10 << 20))  # zero-filled, so every page is touched
        except MemoryError:
            pass  # keep what it got: the budget must hold with it
        time.sleep(3)  # hold it while the others touch theirs
        os._exit(0 if len(held) == 40 else 3)
    kids.append(pid)
codes = [os.waitstatus_to_exitcode(os.wait()[1]) for _ in kids]
print(len(kids), codes.count(0))
"""


def _parents() -> dict[int, int]:
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            found[int(entry)] = int(
                Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]
            )
    return found


def descendants(root: int) -> set[int]:
    """Every live process below `root`."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            found.add(kid)
            todo.append(kid)
    return found


def marked_processes() -> list[int]:
    """Live processes whose command line carries MARKER (a run's sleeping children)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{entry}/status").read_text()
            if MARKER in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace") and (
                "State:\tZ" not in status
            ):
                found.append(int(entry))
    return found


def pss_mb(pids: set[int]) -> float:
    total_kb = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
                    break
    return total_kb / 1024


def pid_namespace(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/{pid}/ns/pid")
    return None


class PssSampler:
    """Every 20 ms, sums the PSS of the processes below this one per pid namespace,
    and keeps the peak of the largest sum: the run's tree (its namespace's pid 1
    and all it forks), and not what else starts below pytest meanwhile.

    Past `kill_above_mb` it kills that namespace's processes: the failure is seen,
    and the host spared.
    """

    def __init__(self, kill_above_mb: float | None = None) -> None:
        self.kill_above_mb = kill_above_mb
        # what other tests left running below this process is not the run's
        self.before = descendants(os.getpid())
        self.peak_mb = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        me = os.getpid()
        ours = pid_namespace(me)
        while not self._stop.is_set():
            trees: dict[str, set[int]] = {}
            for pid in descendants(me) - self.before:
                namespace = pid_namespace(pid)
                if namespace is not None and namespace != ours:
                    trees.setdefault(namespace, set()).add(pid)
            sums = {namespace: pss_mb(pids) for namespace, pids in trees.items()}
            largest = max(sums, key=sums.__getitem__, default=None)
            if largest is not None:
                self.peak_mb = max(self.peak_mb, sums[largest])
            self.samples += 1
            if self.kill_above_mb is not None and self.peak_mb > self.kill_above_mb:
                for pid in trees.get(largest, ()):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            self._stop.wait(0.02)

    def __enter__(self) -> PssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(autouse=True)
def reaper() -> Iterator[None]:
    """Kills whatever a run left below this process or marked, even when the test fails
    (processes that were there before the test, another test's, are left alone)."""
    before = descendants(os.getpid())
    yield
    for pid in (descendants(os.getpid()) - before) | set(marked_processes()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def run_touch(sandbox: LocalSandbox, kill_above_mb: float | None = None):
    with PssSampler(kill_above_mb) as sampler:
        res = sandbox.run(TOUCH_400MB_X16, memory_mb=MEMORY_MB, timeout_s=12)
    assert res.duration_s < 12, res  # the workload ended, not the deadline
    return res, sampler


# -- memory ------------------------------------------------------------------


@needs_cgroup
@pytest.mark.parametrize("pool_size", [0, 2], ids=["cold", "warm"])
def test_cgroup_holds_the_tree_at_memory_mb(pool_size):
    with LocalSandbox(budget="cgroup", pool_size=pool_size) as sandbox:
        res, sampler = run_touch(sandbox)
    assert res.budget == "cgroup"
    assert res.status == "memory", res  # the OOM killer took children: reported, not hidden
    assert res.peak_memory_bytes is not None
    assert 300 << 20 < res.peak_memory_bytes <= MEMORY_MB << 20  # pushed to the cap, not past
    assert sampler.samples > 10 and sampler.peak_mb <= MEMORY_MB + 64


@pytest.mark.parametrize("pool_size", [0, 2], ids=["cold", "warm"])
def test_rlimit_fallback_holds_the_summed_pss(pool_size):
    with LocalSandbox(budget="rlimit", pool_size=pool_size) as sandbox:
        res, sampler = run_touch(sandbox)
    assert res.budget == "rlimit"
    forked, held = map(int, res.stdout.split())
    limits = process_limits("rlimit", MEMORY_MB, sandbox.limits["nproc"])
    assert (forked, held) == (limits.processes - 1, 0), res  # fork capped; 400 MB refused
    assert sampler.samples > 10 and sampler.peak_mb > 200  # the children held what they got
    assert sampler.peak_mb <= MEMORY_MB + 64


def test_per_process_limits_let_the_same_tree_exceed_twice_the_budget():
    with pytest.warns(UserWarning, match="not the run"):
        sandbox = LocalSandbox(budget="per_process")
    with sandbox:
        res, sampler = run_touch(sandbox, kill_above_mb=2.5 * MEMORY_MB)
    assert res.budget == "per_process"
    assert sampler.peak_mb > 2 * MEMORY_MB, (sampler.peak_mb, res)


def test_fallback_splits_memory_into_processes_of_at_least_the_floor():
    assert process_limits("rlimit", 512, 32) == process_limits("rlimit", 512, 4)
    limits = process_limits("rlimit", 512, 32)
    assert (limits.processes, limits.address_space_bytes) == (4, 128 << 20)
    assert process_limits("rlimit", 64, 32).processes == 1  # below the floor: one process
    assert process_limits("rlimit", 64, 32).address_space_bytes == 64 << 20
    for memory_mb in (64, 100, 512, 1000, 4096, 65536):
        got = process_limits("rlimit", memory_mb, 32)
        assert got.processes * got.address_space_bytes <= memory_mb << 20
        assert got.processes == 1 or got.address_space_bytes >= FALLBACK_FLOOR_MB << 20
    assert process_limits("cgroup", 512, 32).address_space_bytes == 512 << 20


def test_auto_falls_back_with_one_warning_and_says_so(monkeypatch):
    monkeypatch.setattr(cgroups, "detect", lambda *a, **k: "no cgroup here (test)")
    with pytest.warns(UserWarning, match=r"no cgroup for runs \(no cgroup here \(test\)\)"):
        sandbox = LocalSandbox()
    assert sandbox.budget == "rlimit" and "rlimit fallback" in sandbox.describe()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: runs do not warn again
        res = sandbox.run("print('fine')")
    assert (res.status, res.budget) == ("ok", "rlimit")


@needs_cgroup
def test_a_run_sits_in_its_own_group_with_its_limits():
    code = "import time; print('in', flush=True); time.sleep(1.5)"
    before = {p.name for p in HIERARCHY.pids_parent.iterdir()}
    with LocalSandbox(budget="cgroup", max_processes=7) as sandbox:
        thread = threading.Thread(target=sandbox.run, args=(code,), kwargs={"memory_mb": 300})
        thread.start()
        seen = {}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not seen.get("procs"):
            for d in HIERARCHY.memory_parent.glob(f"{cgroups.GROUP_PREFIX}{os.getpid()}-*"):
                with contextlib.suppress(OSError):
                    seen = {
                        "memory": int((d / "memory.limit_in_bytes").read_text()),
                        "pids": (HIERARCHY.pids_parent / d.name / "pids.max").read_text().strip(),
                        "procs": (d / "cgroup.procs").read_text().split(),
                    }
            time.sleep(0.02)
        thread.join()
    assert seen.get("memory") == 300 << 20 and seen.get("pids") == "7", seen
    assert len(seen["procs"]) == 1, seen  # the code's interpreter; bwrap stays outside
    assert {p.name for p in HIERARCHY.pids_parent.iterdir()} == before  # removed after


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_sweep_removes_only_empty_groups_of_trainers_gone(tmp_path):
    memory, pids = tmp_path / "memory", tmp_path / "pids"
    dead, alive = _dead_pid(), os.getpid()
    for parent in (memory, pids):
        for name in (f"agentgym-{dead}-0", f"agentgym-{alive}-0", "agentgym-trainer", "other"):
            (parent / name).mkdir(parents=True)
    (memory / f"agentgym-{dead}-1").mkdir()
    (memory / f"agentgym-{dead}-1" / "cgroup.procs").write_text("")  # not empty: kept
    removed = cgroups.Hierarchy(1, memory, pids).sweep()
    assert sorted(removed) == [f"agentgym-{dead}-0"] * 2
    assert sorted(p.name for p in memory.iterdir()) == sorted(
        [f"agentgym-{dead}-1", f"agentgym-{alive}-0", "agentgym-trainer", "other"]
    )
    assert sorted(p.name for p in pids.iterdir()) == [
        f"agentgym-{alive}-0",
        "agentgym-trainer",
        "other",
    ]


@needs_cgroup
def test_a_trainer_that_exits_with_its_pool_open_leaves_no_group():
    script = (
        "from agentgym.sandboxes.local import LocalSandbox\n"
        "import os\n"
        "sandbox = LocalSandbox(budget='cgroup', pool_size=2)\n"
        "print(os.getpid(), sandbox.run('print(1)').status, flush=True)\n"
    )  # and exits without close()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    pid, status = out.stdout.split()
    assert status == "ok", out
    left = [
        d.name
        for parent in (HIERARCHY.memory_parent, HIERARCHY.pids_parent)
        for d in parent.glob(f"{cgroups.GROUP_PREFIX}{pid}-*")
    ]
    assert left == []


# -- processes -------------------------------------------------------------------

FAN_OUT = f"""
import os
n = 0
try:
    for _ in range(1000):
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "{MARKER}"])
        n += 1
except OSError as e:
    print(n, e.errno)
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("budget", ["cgroup", "rlimit"])
def test_fork_fan_out_stops_at_the_cap_and_leaves_nothing(mode, budget):
    if budget == "cgroup" and not isinstance(HIERARCHY, cgroups.Hierarchy):
        pytest.skip(f"no cgroup for runs: {HIERARCHY}")
    before = descendants(os.getpid())
    with LocalSandbox(isolation=mode, budget=budget, max_processes=12) as sandbox:
        res = sandbox.run(FAN_OUT, memory_mb=MEMORY_MB, timeout_s=8)
    forked, err = map(int, res.stdout.split())
    cap = process_limits(budget, MEMORY_MB, 12).processes
    assert (res.status, err) == ("ok", errno.EAGAIN), res
    assert forked == cap - 1  # the run's own process is one of the cap
    assert res.duration_s < 4  # the sleeping children died with the run's pid 1
    assert marked_processes() == [] and descendants(os.getpid()) - before == set()


PID1_SCRIPT = """
import json, os, subprocess, sys, time
from agentgym.sandboxes.local import LocalSandbox

def zombies():
    found = 0
    for e in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{e}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found += fields[0] == "Z" and fields[1] == "1"
    return found

def others():
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != 1]

codes = [
    "print(1)",
    "while True: pass",
    "import subprocess; subprocess.Popen(['sleep', 'MARKER']); print('left')",
    "import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass",
    "import os; os.kill(os.getppid(), 9)",
]
out = {"pid": os.getpid()}
for pool in (0, 2):
    with LocalSandbox(isolation=sys.argv[1], pool_size=pool) as sb:
        for i in range(10):
            sb.run(codes[i % len(codes)], timeout_s=0.3)
time.sleep(0.5)
out["zombies"], out["others"] = zombies(), others()
# The control: bwrap's own init, orphaned to us on exit, shows the count can go up.
if sys.argv[1] == "bwrap":
    subprocess.run(["bwrap", "--unshare-pid", "--dev-bind", "/", "/", "true"])
    time.sleep(0.3)
    out["control_zombies"] = zombies()
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a pid namespace of our own needs root here")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is missing")
@pytest.mark.parametrize("mode", MODES)
def test_twenty_runs_leave_no_zombie_when_the_trainer_is_pid_1(mode):
    script = PID1_SCRIPT.replace("MARKER", MARKER)
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script, mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["pid"] == 1
    assert out["zombies"] == 0 and out["others"] == [], out
    if mode == "bwrap":
        assert out["control_zombies"] >= 1, out  # the count sees a zombie where there is one


# -- the v2 path, against a fake cgroupfs folder (the CI machines mount v1) -------

KERNFS_FILES = {
    "cgroup.procs": "",
    "cgroup.controllers": "cpu memory pids",
    "cgroup.subtree_control": "",
    "memory.max": "max",
    "memory.swap.max": "max",
    "memory.oom.group": "0",
    "memory.peak": "0",
    "memory.events": "oom 0\noom_kill 0\n",
    "pids.max": "max",
}
MOUNTINFO_V2 = "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n"


@pytest.fixture
def fake_v2(tmp_path, monkeypatch) -> Path:
    """A cgroup2 folder whose mkdir makes the interface files, as the kernel does."""
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if str(self).startswith(str(tmp_path)):
            for name, text in KERNFS_FILES.items():
                (self / name).write_text(text)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    (tmp_path / "sys/fs/cgroup/user.slice").mkdir(parents=True)
    own = tmp_path / "sys/fs/cgroup/user.slice/trainer"
    own.mkdir()
    (own / "cgroup.subtree_control").write_text("memory pids")
    return own


def test_v2_detection_and_file_writes_on_a_fake_cgroupfs(fake_v2, tmp_path):
    found = cgroups.find_hierarchy("0::/user.slice/trainer\n", MOUNTINFO_V2, fs_root=tmp_path)
    assert found == cgroups.Hierarchy(2, fake_v2, fake_v2)
    group = found.create(max_pids=33)
    assert group.dirs == (group.memory_dir,) and group.memory_dir.parent == fake_v2
    assert (group.pids_dir / "pids.max").read_text() == "33"
    group.set_memory_limit(512 << 20)
    written = {n: (group.memory_dir / n).read_text() for n in ("memory.max", "memory.swap.max")}
    assert written == {"memory.max": str(512 << 20), "memory.swap.max": "0"}
    assert (group.memory_dir / "memory.oom.group").read_text() == "1"
    group.add(4242)
    assert (group.memory_dir / "cgroup.procs").read_text() == "4242"
    (group.memory_dir / "memory.peak").write_text("123456\n")
    (group.memory_dir / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
    assert (group.peak_bytes(), group.oom_kills()) == (123456, 2)


def test_v2_alone_in_its_cgroup_steps_into_a_leaf_and_enables_controllers(fake_v2, tmp_path):
    (fake_v2 / "cgroup.subtree_control").write_text("")
    (fake_v2 / "cgroup.procs").write_text(f"{os.getpid()}\n")
    found = cgroups.find_hierarchy("0::/user.slice/trainer\n", MOUNTINFO_V2, fs_root=tmp_path)
    assert found == cgroups.Hierarchy(2, fake_v2, fake_v2)
    assert (fake_v2 / cgroups.TRAINER_LEAF / "cgroup.procs").read_text() == str(os.getpid())
    assert (fake_v2 / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_v2_without_memory_falls_back_to_v1_as_on_this_machine(tmp_path):
    unified = tmp_path / "sys/fs/cgroup/unified"
    unified.mkdir(parents=True)
    (unified / "cgroup.controllers").write_text("hugetlb\n")
    (unified / "cgroup.subtree_control").write_text("")
    mountinfo = textwrap.dedent("""\
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
        39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
        41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
        """)
    own = "8:pids:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n"
    found = cgroups.find_hierarchy(own, mountinfo, fs_root=tmp_path)
    root = tmp_path / "sys/fs/cgroup"
    assert found == cgroups.Hierarchy(1, root / "memory/process_api/abc", root / "pids")


def test_cgroup_namespace_root_is_stripped_and_missing_controllers_are_named(tmp_path):
    mountinfo = "35 31 0:32 /docker/c1 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    mountinfo += "39 31 0:36 /docker/c1 /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    own = "4:memory:/docker/c1/sub\n8:pids:/docker/c1\n"
    found = cgroups.find_hierarchy(own, mountinfo, fs_root=tmp_path)
    root = tmp_path / "sys/fs/cgroup"
    assert found == cgroups.Hierarchy(1, root / "memory/sub", root / "pids")
    reason = cgroups.find_hierarchy("4:memory:/\n", mountinfo.splitlines()[0], fs_root=tmp_path)
    assert isinstance(reason, str) and "no pids hierarchy" in reason

"""The docker sandbox: one test per attack, each against a real container.

Skipped as a whole, with the reason, where no Docker engine answers or the
sandbox image is missing (`bash sandboxes/docker_setup.sh` provides both).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgym.sandboxes.contract import Sandbox, SandboxUnavailableError
from agentgym.sandboxes.factory import make_sandbox

try:
    from agentgym.sandboxes.docker import LABEL, PIDS_LIMIT, DockerSandbox

    DockerSandbox().close()
except SandboxUnavailableError as exc:
    pytest.skip(f"docker sandbox unavailable: {exc}", allow_module_level=True)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[DockerSandbox]:
    sb = DockerSandbox()
    yield sb
    sb.close()


def leftovers(sb: DockerSandbox) -> list[str]:
    """Names of sandbox containers, of any instance, that still exist."""
    return [c.name for c in sb.client.containers.list(all=True, filters={"label": LABEL})]


def test_make_sandbox_builds_a_docker_sandbox() -> None:
    sb = make_sandbox("docker")
    try:
        assert isinstance(sb, DockerSandbox)
        assert isinstance(sb, Sandbox)
    finally:
        sb.close()


def test_prints_stdout(sandbox: DockerSandbox) -> None:
    res = sandbox.run("print('hello')")
    assert (res.status, res.stdout, res.stderr, res.exit_code) == ("ok", "hello\n", "", 0)


def test_reads_stdin(sandbox: DockerSandbox) -> None:
    res = sandbox.run("import sys; print(sys.stdin.read()[::-1])", stdin="abc")
    assert (res.status, res.stdout) == ("ok", "cba\n")


def test_files_are_importable_from_the_work_dir(sandbox: DockerSandbox) -> None:
    files = {"helper.py": "X = 41", "data/n.txt": "1"}
    code = "import helper; print(helper.X + int(open('data/n.txt').read()))"
    res = sandbox.run(code, files=files)
    assert (res.status, res.stdout) == ("ok", "42\n")


def test_file_paths_outside_the_work_dir_are_refused(sandbox: DockerSandbox) -> None:
    with pytest.raises(ValueError, match="outside the work dir"):
        sandbox.run("pass", files={"../escape.py": ""})


def test_nonzero_exit_is_an_error(sandbox: DockerSandbox) -> None:
    res = sandbox.run("raise SystemExit(3)")
    assert (res.status, res.exit_code) == ("error", 3)


def test_exception_is_an_error_with_its_traceback(sandbox: DockerSandbox) -> None:
    res = sandbox.run("1 / 0")
    assert (res.status, res.exit_code) == ("error", 1)
    assert "ZeroDivisionError" in res.stderr


def test_signal_death_is_killed(sandbox: DockerSandbox) -> None:
    res = sandbox.run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert (res.status, res.exit_code) == ("killed", -11)


def test_infinite_loop_times_out_and_its_container_is_removed(sandbox: DockerSandbox) -> None:
    res = sandbox.run("while True: pass", timeout_s=1.0)
    assert (res.status, res.exit_code) == ("timeout", None)
    assert 1.0 <= res.duration_s < 3.0
    assert leftovers(sandbox) == []


def test_memory_bomb_is_a_memory_status(sandbox: DockerSandbox) -> None:
    res = sandbox.run("x = b'x' * (512 << 20)", memory_mb=64)
    assert res.status == "memory"


def test_fork_bomb_stops_at_the_pids_limit(sandbox: DockerSandbox) -> None:
    # Children that sleep on hold their pids; the parent reports how many it got.
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(1000):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print(n, e.errno)\n"
    )
    res = sandbox.run(code, timeout_s=10.0)
    assert res.status == "ok", res.stderr
    forked, err = map(int, res.stdout.split())
    assert forked < PIDS_LIMIT and err == errno.EAGAIN
    # The sleeping children died with the container instead of holding the run open.
    assert res.duration_s < 5.0


def test_endless_fork_bomb_ends_at_the_deadline(sandbox: DockerSandbox) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    res = sandbox.run(code, timeout_s=2.0)
    assert res.status == "timeout"
    assert res.duration_s < 5.0


def test_huge_stdout_is_cut_at_the_output_limit(sandbox: DockerSandbox) -> None:
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))\n"
    res = sandbox.run(code, timeout_s=10.0)
    assert (res.status, res.exit_code) == ("output_limit", None)
    assert res.stdout.startswith("x" * sandbox.max_output_bytes)
    assert len(res.stdout) < sandbox.max_output_bytes + 100
    assert res.duration_s < 5.0


def test_no_outbound_network(sandbox: DockerSandbox) -> None:
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    res = sandbox.run(code)
    assert res.stdout.startswith("refused"), res.stdout


def test_host_loopback_is_out_of_reach(sandbox: DockerSandbox) -> None:
    # A server on the host's 127.0.0.1 stands for the trainer or an inference server.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as e:\n"
            "    print('refused', e.errno)\n"
        )
        res = sandbox.run(code)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing is waiting to be accepted
            server.accept()
    assert res.stdout.startswith("refused"), res.stdout


def test_root_is_read_only_and_work_and_tmp_are_writable(sandbox: DockerSandbox) -> None:
    code = (
        "import errno\n"
        "for path in ('/etc/owned', '/usr/lib/python3.11/os.py', '/work/out', '/tmp/out'):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print(path, 'written')\n"
        "    except OSError as e:\n"
        "        print(path, errno.errorcode[e.errno])\n"
    )
    res = sandbox.run(code)
    lines = dict(line.split() for line in res.stdout.splitlines())
    assert lines["/etc/owned"] in ("EROFS", "EACCES")
    assert lines["/usr/lib/python3.11/os.py"] in ("EROFS", "EACCES")
    assert lines["/work/out"] == lines["/tmp/out"] == "written"


def test_runs_unprivileged_without_capabilities(sandbox: DockerSandbox) -> None:
    code = (
        "import os\n"
        "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
        "print(os.getuid(), os.getgid(), int(caps[0], 16))\n"
    )
    res = sandbox.run(code)
    assert res.stdout.split() == ["65534", "65534", "0"]


def test_host_environment_is_not_visible(
    sandbox: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTGYM_CANARY", "canary-4b1d")
    res = sandbox.run("import os; print(sorted(os.environ))")
    assert res.status == "ok"
    assert "AGENTGYM_CANARY" not in res.stdout
    assert "canary-4b1d" not in res.stdout


def test_host_files_are_not_visible(sandbox: DockerSandbox) -> None:
    res = sandbox.run(f"import os; print(os.path.exists({__file__!r}))")
    assert res.stdout == "False\n"


def test_no_container_is_left_behind(sandbox: DockerSandbox) -> None:
    sandbox.run("print(1)")
    sandbox.run("while True: pass", timeout_s=0.5)
    assert leftovers(sandbox) == []


# -- the whole tree: memory, processes, zombies (as in test_sandbox_tree.py) ------

MARKER = "agentgym-tree-7f3a"
REEXEC = (
    "import os, sys\n"
    f"if {MARKER!r} not in sys.argv:  # a marker in argv, for the host to find the tree\n"
    f"    os.execv(sys.executable, [sys.executable, '-E', '-s', 'main.py', {MARKER!r}])\n"
)
TOUCH_400MB_X16 = REEXEC + (
    "import time\n"
    "kids = []\n"
    "for _ in range(16):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        held = []\n"
    "        try:\n"
    "            while len(held) < 40:\n"
    "                held.append(bytearray(10 << 20))\n"
    "        except MemoryError:\n"
    "            pass\n"
    "        time.sleep(3)\n"
    "        os._exit(0 if len(held) == 40 else 3)\n"
    "    kids.append(pid)\n"
    "codes = [os.waitstatus_to_exitcode(os.wait()[1]) for _ in kids]\n"
    "print(len(kids), codes.count(0))\n"
)


def marked() -> set[int]:
    """Live processes, in any container, whose command line carries MARKER."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            if (
                MARKER.encode() in cmdline
                and "State:\tZ" not in Path(f"/proc/{entry}/status").read_text()
            ):
                found.add(int(entry))
    return found


def pss_mb(pids: set[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            total += int(rollup.split("Pss:", 1)[1].split()[0])
    return total / 1024


def test_memory_limit_holds_the_whole_tree(sandbox: DockerSandbox) -> None:
    peak, samples, stop = [0.0], [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], pss_mb(marked()))
            samples[0] += 1
            stop.wait(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        res = sandbox.run(TOUCH_400MB_X16, memory_mb=512, timeout_s=15.0)
    finally:
        stop.set()
        thread.join()
    assert res.status == "memory", res  # the OOM kill is reported
    assert res.budget == "cgroup"
    assert samples[0] > 10 and 200 < peak[0] <= 512 + 64, (peak[0], samples[0])
    assert marked() == set()


def test_fork_fan_out_leaves_no_process_of_the_run(sandbox: DockerSandbox) -> None:
    code = REEXEC + (
        "import time\nn = 0\ntry:\n    for _ in range(1000):\n"
        "        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    print(n, e.errno)\n"
    )
    res = sandbox.run(code, timeout_s=10.0)
    forked, err = map(int, res.stdout.split())
    assert (res.status, err) == ("ok", errno.EAGAIN) and forked < PIDS_LIMIT
    assert res.duration_s < 5.0
    assert marked() == set()


PID1_SCRIPT = """
import json, os
from agentgym.sandboxes.docker import DockerSandbox
codes = ["print(1)", "while True: pass", "import os\\nwhile True:\\n    try:\\n"
         "        os.fork()\\n    except OSError:\\n        pass"]
sb = DockerSandbox()
for i in range(20):
    sb.run(codes[i % 3], timeout_s=0.5)
sb.close()
zombies = [e for e in os.listdir("/proc") if e.isdigit()
           and open(f"/proc/{e}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"]
print(json.dumps({"pid": os.getpid(), "zombies": len(zombies)}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a pid namespace of our own needs root here")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is missing")
def test_twenty_runs_leave_no_zombie_when_the_trainer_is_pid_1() -> None:
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PID1_SCRIPT]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out == {"pid": 1, "zombies": 0}

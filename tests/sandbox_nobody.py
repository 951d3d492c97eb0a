"""A local sandbox driven by an unprivileged user, for tests that run as root.

The sandbox takes two paths: as root it drops the code to a random high uid
itself; as an ordinary user, bubblewrap makes a user namespace and the code runs
as uid 65534 there. CI runs as root, so `AsNobody` covers the second path from a
root test process: each run starts a small driver under `setpriv` as nobody,
with a Python nobody can execute and a copy of `agentgym.sandboxes` (standard
library only) in a directory nobody can read (the checkout and its virtualenv
may sit under a home directory closed to other users).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agentgym import sandboxes
from agentgym.sandboxes import ExecutionResult, SandboxUnavailableError

NOBODY = 65534
UNAVAILABLE = 3  # the driver's exit status when the sandbox cannot isolate as nobody
DRIVER = f"""
import dataclasses, json, sys
from agentgym.sandboxes import SandboxUnavailableError, make_sandbox
request = json.load(sys.stdin)
try:
    sandbox = make_sandbox("local", **request.pop("options"))
except SandboxUnavailableError as err:
    print(err, file=sys.stderr)
    sys.exit({UNAVAILABLE})
try:
    print(json.dumps(dataclasses.asdict(sandbox.run(request.pop("code"), **request))))
finally:
    sandbox.close()
"""


def drop_to_nobody() -> list[str]:
    """The command prefix that runs a program as nobody, with no groups."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxUnavailableError("util-linux `setpriv` is missing: cannot run as nobody")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def python_for_nobody(drop: list[str]) -> str:
    """An interpreter of this Python's minor version that nobody can run."""
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]
    candidates.append(shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "")
    # It must start itself too, as the sandbox will: setpriv execs it while still able to
    # search root's directories, so a Python under /root can start once and no more.
    check = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-I', '-c', 'import json'], check=True)\n"
        f"sys.exit(sys.version_info[:2] != {tuple(sys.version_info[:2])})"
    )
    for python in filter(None, candidates):
        ran = subprocess.run([*drop, python, "-c", check], capture_output=True, cwd="/")
        if ran.returncode == 0:
            return python
    raise SandboxUnavailableError(f"no Python {sys.version_info[:2]} nobody can run")


class AsNobody:
    """Runs code in `make_sandbox("local", **options)` built by the user nobody.

    Args:
        **options: passed to `LocalSandbox` in the driver (JSON values only).

    Raises:
        SandboxUnavailableError: when there is no way to run a Python as nobody.
    """

    def __init__(self, **options: object) -> None:
        self.options = options
        self._drop = drop_to_nobody()
        self._python = python_for_nobody(self._drop)
        self._dir = tempfile.mkdtemp(prefix="agentgym-nobody-")
        package = Path(self._dir, "agentgym")
        package.mkdir()
        (package / "__init__.py").write_text("")
        source = Path(sandboxes.__file__).parent  # copied per instance: a planted bug shows
        shutil.copytree(source, package / "sandboxes", ignore=shutil.ignore_patterns("*.pyc"))
        Path(self._dir, "driver.py").write_text(DRIVER)
        for root, _, files in os.walk(self._dir):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)

    def run(self, code: str, *, timeout_s: float = 5.0, memory_mb: int = 512) -> ExecutionResult:
        """Runs `code` in a sandbox that nobody built; see `Sandbox.run`."""
        request = {"options": self.options, "code": code}
        request |= {"timeout_s": timeout_s, "memory_mb": memory_mb}
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": self._dir, "HOME": self._dir}
        env |= {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        ran = subprocess.run(
            [*self._drop, self._python, f"{self._dir}/driver.py"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env=env,
            cwd=self._dir,
            timeout=timeout_s + 30,
        )
        if ran.returncode == UNAVAILABLE:
            raise SandboxUnavailableError(f"as nobody: {ran.stderr.strip()}")
        if ran.returncode != 0:
            raise RuntimeError(f"the driver failed as nobody ({ran.returncode}):\n{ran.stderr}")
        return ExecutionResult(**json.loads(ran.stdout))

    def close(self) -> None:
        """Removes the copy of the package."""
        shutil.rmtree(self._dir, ignore_errors=True)

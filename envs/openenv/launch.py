"""OpenEnv servers that `agentgym/OpenEnv-v0` starts itself: from a local folder or image.

A folder is an OpenEnv environment as `openenv init` lays it out: `openenv.yaml` names the
ASGI app (`app: server.app:app`), which runs here under uvicorn, in this interpreter, with
the folder first on the import path (the folder's own dependencies must be installed in
this environment; nothing is installed for it). An image is a Docker image already present
on this machine (`docker build -t NAME folder/`; nothing is pulled), run with its port
published on loopback only.

The env copies of one process share the servers of one source: each claims a session slot
(`sessions_per_server`, OpenEnv's own default being one session per server, as its
template's `max_concurrent_envs=1` and its Docker client's container per client), and a new
server starts when every slot is claimed. A server stops when its last claim is released,
and every server still running stops when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml

from agentgym.envs.openenv.frames import OpenEnvError

TAIL = 2000
"""How much of a server's output an error about it quotes, in characters."""


@dataclass(frozen=True)
class Source:
    """What to start: a folder (`openenv.yaml`'s app under uvicorn) or a local image."""

    folder: Path | None = None
    image: str | None = None
    port: int = 8000  # the image's port inside its container
    start_timeout_s: float = 60.0

    @property
    def name(self) -> str:
        return str(self.folder) if self.folder is not None else f"image {self.image}"


def folder_app(folder: Path) -> str:
    """The `module:attribute` of the folder's ASGI app, from its `openenv.yaml`."""
    manifest = folder / "openenv.yaml"
    if not folder.is_dir():
        raise ValueError(
            f"run.env_kwargs.folder={str(folder)!r} is not a folder: give an OpenEnv "
            "environment's folder (the one holding openenv.yaml)"
        )
    if not manifest.is_file():
        raise ValueError(
            f"{manifest} is missing: an OpenEnv folder holds openenv.yaml naming its app "
            "(app: server.app:app), as `openenv init` writes it"
        )
    try:
        spec = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"{manifest} is not YAML: {err}") from None
    app = spec.get("app") if isinstance(spec, dict) else None
    module, colon, attribute = app.partition(":") if isinstance(app, str) else ("", "", "")
    if not (module and colon and attribute):
        raise ValueError(
            f"{manifest}: app is {app!r}; valid: 'module:attribute' of an ASGI app, "
            "e.g. 'server.app:app'"
        )
    return f"{module}:{attribute}"


@dataclass
class _Server:
    url: str
    stop: contextlib.ExitStack
    claims: int = 0


@dataclass
class _Pool:
    servers: list[_Server] = field(default_factory=list)


class Launcher:
    """The servers this process started, per source; env copies claim and release slots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[Source, _Pool] = {}
        atexit.register(self.stop_all)

    def claim(self, source: Source, sessions_per_server: int) -> str:
        """The URL of a server of `source` with a free session slot, started if none has."""
        with self._lock:
            pool = self._pools.setdefault(source, _Pool())
            server = next((s for s in pool.servers if s.claims < sessions_per_server), None)
            if server is None:
                server = _start(source)
                pool.servers.append(server)
            server.claims += 1
            return server.url

    def release(self, source: Source, url: str) -> None:
        """Gives a slot back; a server with no claims left stops."""
        with self._lock:
            pool = self._pools.get(source)
            server = next((s for s in pool.servers if s.url == url), None) if pool else None
            if pool is None or server is None:
                return
            server.claims -= 1
            if server.claims <= 0:
                pool.servers.remove(server)
                server.stop.close()

    def running(self, source: Source) -> int:
        """How many servers of `source` run now."""
        with self._lock:
            pool = self._pools.get(source)
            return len(pool.servers) if pool else 0

    def stop_all(self) -> None:
        with self._lock:
            for pool in self._pools.values():
                for server in pool.servers:
                    server.stop.close()
            self._pools.clear()


LAUNCHER = Launcher()
"""This process's launched servers (one per process: env copies share it)."""


def _start(source: Source) -> _Server:
    stop = contextlib.ExitStack()
    try:
        if source.folder is not None:
            url, output = _start_folder(source.folder, stop)
        else:
            assert source.image is not None
            url, output = _start_image(source.image, source.port, stop)
        _wait_ready(url, source, output)
    except BaseException:
        stop.close()
        raise
    return _Server(url, stop)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_folder(folder: Path, stop: contextlib.ExitStack) -> tuple[str, _Output]:
    app = folder_app(folder)
    port = _free_port()
    log = stop.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 (the stack closes it)
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        command,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: stopping it stops what it started
    )
    stop.callback(_stop_process, process)
    return f"http://127.0.0.1:{port}", _Output(process, log)


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _docker(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise OpenEnvError(
            "run.env_kwargs.image needs Docker, and there is no `docker` on PATH"
        ) from None


def require_image(image: str) -> None:
    """Refuses, by name, an image that is not on this machine (nothing is pulled)."""
    found = _docker("image", "inspect", "--format", "{{.Id}}", image)
    if found.returncode != 0:
        raise OpenEnvError(
            f"run.env_kwargs.image={image!r} is not on this machine ({found.stderr.strip()}); "
            f"build it first (docker build -t {image} <the environment's folder>): "
            "agentgym pulls nothing"
        )


def _start_image(image: str, port: int, stop: contextlib.ExitStack) -> tuple[str, _Output]:
    require_image(image)
    started = _docker("run", "-d", "--rm", "--pull", "never", "-p", f"127.0.0.1::{port}", image)
    if started.returncode != 0:
        raise OpenEnvError(f"docker could not run image {image!r}: {started.stderr.strip()}")
    container = started.stdout.strip()
    stop.callback(_docker, "rm", "-f", container)
    published = _docker("port", container, str(port)).stdout.split()
    if not published:
        raise OpenEnvError(
            f"image {image!r} publishes no port {port} (run.env_kwargs.image_port): "
            f"{_docker('logs', container).stdout[-TAIL:]}"
        )
    host_port = published[0].rpartition(":")[2]
    return f"http://127.0.0.1:{host_port}", _Output(None, None, container)


@dataclass
class _Output:
    """Where a starting server's output can be read, for an error that quotes it."""

    process: subprocess.Popen[bytes] | None
    log: IO[bytes] | None
    container: str | None = None

    def exited(self) -> bool:
        if self.process is not None:
            return self.process.poll() is not None
        state = _docker("inspect", "--format", "{{.State.Running}}", str(self.container))
        return state.stdout.strip() != "true"

    def tail(self) -> str:
        if self.container is not None:
            logs = _docker("logs", self.container)
            return (logs.stdout + logs.stderr)[-TAIL:]
        assert self.log is not None
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-TAIL:]


def _wait_ready(url: str, source: Source, output: _Output) -> None:
    """Waits for the server's `/health`; a server that exits or never answers is an error
    that names the source and quotes its output."""
    deadline = time.monotonic() + source.start_timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if output.exited():
            raise OpenEnvError(
                f"the OpenEnv server of {source.name} exited while starting:\n{output.tail()}"
            )
        time.sleep(0.1)
    raise OpenEnvError(
        f"the OpenEnv server of {source.name} did not answer {url}/health in "
        f"{source.start_timeout_s:g} s (run.env_kwargs.start_timeout_s):\n{output.tail()}"
    )

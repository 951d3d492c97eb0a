"""A sandbox that runs each piece of code in a fresh, locked-down Docker container.

The threat model is the one in `agentgym.sandboxes.contract`; this module says
where a container does better or worse than the local sandbox.

Stronger than "local":

- Filesystem. The container's root is its own image (Debian bookworm
  minbase + python3, built by `sandboxes/docker_setup.sh`), mounted
  read-only: no host file is visible, not even the read-only system
  files. /work and /tmp are private tmpfs mounts, thrown away with the
  container.
- Memory. The cgroup memory limit counts resident memory, page cache and
  tmpfs writes of the whole container, not one process's address space;
  swap is off (memswap = mem). An OOM kill comes back as "memory".
- Processes and CPU. A cgroup pids limit (fork bombs stop at
  `PIDS_LIMIT`), a CPU quota (`cpus`), and the engine's default seccomp
  profile, which blocks keyring, mount, bpf, ptrace-of-others and similar
  system calls.
- Privileges. User 65534 (nobody), every capability dropped,
  no-new-privileges, no core dumps (so the host's core_pattern helper is
  never run), and an OOM score that makes a host under memory pressure
  kill the sandbox before the trainer.
- Output. The logging driver is "none": output is streamed off the attach
  socket and capped, never written to the host's disk.

Weaker or different:

- The caller needs the Docker socket, which is root-equivalent on the
  host. That right belongs to the trainer process, never to the code: the
  socket is not mounted into the container.
- Startup costs a container create/start/remove, about 0.3-0.5 s per run
  against tens of milliseconds for "local".
- The kernel is still shared: a kernel exploit escapes the container. Pass
  `runtime="runsc"` (gVisor) where the engine has it for a user-space
  kernel.
- Exit statuses pass through the container's exit code, so an exit code
  of 128 + N reads as "killed by signal N", as in a shell: a program that
  calls `sys.exit(137)` is reported as killed by SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import selectors
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

from agentgym.sandboxes._io import TRUNCATED
from agentgym.sandboxes.contract import ExecutionResult, SandboxUnavailableError, Status

IMAGE = "agentgym-sandbox:py311"
"""The image tag `sandboxes/docker_setup.sh` builds; keep the two in step."""
LABEL = "org.agentgym.sandbox"
"""Label on every container this module creates, to find leftovers."""
SETUP_HINT = (
    "run `python -m agentgym.sandboxes.docker_setup` (as root) to start an engine and build "
    "the image"
)
PIDS_LIMIT = 64
TMPFS_SIZE = "64m"
MAX_OUTPUT_BYTES = 1_000_000
"""Cap on each of stdout and stderr; past it the container is killed."""
MIN_MEMORY_MB = 6  # Docker refuses smaller memory limits.

_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8"}

# PID 1 inside the container. It reads one payload from stdin (a length
# line, a JSON header with the code and files, then the code's stdin),
# writes the files to /work, and runs main.py as a child: as PID 1 the code
# would ignore signals it has no handler for, and a parent is needed to
# reap orphans. Its exit code is the child's, or 128 + signal.
_BOOTSTRAP = """\
import json, os, sys
data = sys.stdin.buffer.read()
nl = data.index(b"\\n")
end = nl + 1 + int(data[:nl])
job = json.loads(data[nl + 1 : end])
for rel, text in {**job["files"], "main.py": job["code"]}.items():
    os.makedirs(os.path.dirname(os.path.join("/work", rel)), exist_ok=True)
    with open(os.path.join("/work", rel), "w", encoding="utf-8") as f:
        f.write(text)
fd = os.open("/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)
view = memoryview(data)[end:]
while view:
    view = view[os.write(fd, view):]
os.lseek(fd, 0, os.SEEK_SET)
del data, view, job
child = os.fork()
if child == 0:
    try:
        os.dup2(fd, 0)
        os.execv(sys.executable, [sys.executable, "-E", "-s", "main.py"])
    finally:
        os._exit(127)
os.close(fd)
while True:
    pid, status = os.wait()
    if pid == child:
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
"""


class DockerSandbox:
    """Runs untrusted Python in a fresh container per run; see the module docstring.

    Args:
        image: the image to run; it must have python3 and user 65534.
        client: a `docker.DockerClient`; by default one from the environment
            (DOCKER_HOST or the local socket), closed by `close()`.
        cpus: CPU quota of each container, in cores.
        runtime: an OCI runtime the engine knows, e.g. "runsc" for gVisor.
        max_output_bytes: cap on each of stdout and stderr.

    Raises:
        SandboxUnavailableError: when the docker package is missing, the
            engine does not answer, or the image is not there.
    """

    def __init__(
        self,
        image: str = IMAGE,
        client: Any = None,
        *,
        cpus: float = 1.0,
        runtime: str | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> None:
        try:
            import docker
        except ImportError as exc:
            raise SandboxUnavailableError(
                "the docker sandbox needs the Docker SDK: pip install 'agentgym[docker]'"
            ) from exc
        import requests

        self._errors = docker.errors
        # What a failing engine raises: the SDK's errors, or requests' for the socket.
        self._engine_errors = (docker.errors.DockerException, requests.RequestException)
        self._owns_client = client is None
        try:
            self.client = client if client is not None else docker.from_env()
            self.client.ping()
        except self._engine_errors as exc:
            raise SandboxUnavailableError(
                f"the Docker engine does not answer ({exc}); {SETUP_HINT}"
            ) from exc
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailableError(f"image {image} is missing; {SETUP_HINT}") from exc
        self.image = image
        self.cpus = cpus
        self.runtime = runtime
        self.max_output_bytes = max_output_bytes
        # Each instance labels its containers with its own id, so close()
        # removes only its own leftovers, never another sandbox's live runs.
        self._instance = uuid.uuid4().hex

    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        files: Mapping[str, str] | None = None,
    ) -> ExecutionResult:
        """Runs `code` as /work/main.py in a new container and removes the container.

        Args:
            code: Python source, run as `main.py` in /work.
            stdin: text fed to the process's standard input.
            timeout_s: wall-clock limit from container start; the container dies at it.
            memory_mb: memory limit of the whole container (no swap).
            files: extra files to create in /work, relative path -> text.

        Returns:
            The ExecutionResult; its status says how the run ended.

        Raises:
            ValueError: for a file path outside /work or a memory limit below Docker's.
            SandboxUnavailableError: when the engine fails (not the code).
        """
        if memory_mb < MIN_MEMORY_MB:
            raise ValueError(f"memory_mb must be at least {MIN_MEMORY_MB}, got {memory_mb}")
        payload = _payload(code, stdin, dict(files or {}))
        try:
            container = self._create(memory_mb)
        except self._errors.ImageNotFound as exc:
            raise SandboxUnavailableError(f"image {self.image} is missing; {SETUP_HINT}") from exc
        except self._engine_errors as exc:
            raise SandboxUnavailableError(f"could not create a container: {exc}") from exc
        try:
            return self._drive(container, payload, timeout_s)
        except self._engine_errors as exc:
            raise SandboxUnavailableError(f"the Docker engine failed during a run: {exc}") from exc
        finally:
            with contextlib.suppress(self._errors.NotFound):
                container.remove(force=True)

    def describe(self) -> str:
        """One line saying how this sandbox isolates code and bounds each run."""
        return (
            f"docker ({self.runtime or 'default runtime'}, image {self.image}); cgroup: "
            f"memory_mb and {PIDS_LIMIT} processes for each container's whole tree"
        )

    def close(self) -> None:
        """Removes this sandbox's leftover containers and closes an owned client."""
        mine: dict[str, str | list[str] | bool] = {"label": f"{LABEL}={self._instance}"}
        with contextlib.suppress(Exception):  # best effort: the engine may be gone
            for container in self.client.containers.list(all=True, filters=mine):
                with contextlib.suppress(self._errors.NotFound):
                    container.remove(force=True)
        if self._owns_client:
            self.client.close()

    def _create(self, memory_mb: int) -> Any:
        import docker

        tmpfs_opts = f"rw,exec,nosuid,nodev,size={TMPFS_SIZE},mode=1777"
        return self.client.containers.create(
            self.image,
            command=["python3", "-I", "-S", "-c", _BOOTSTRAP],
            stdin_open=True,  # with detach unset, the SDK sets StdinOnce too
            environment=_ENV,
            working_dir="/work",
            user="65534:65534",
            hostname="sandbox",
            labels={LABEL: self._instance},
            network_mode="none",
            ipc_mode="private",
            read_only=True,
            tmpfs={"/work": tmpfs_opts, "/tmp": tmpfs_opts},
            mem_limit=f"{memory_mb}m",
            memswap_limit=f"{memory_mb}m",
            pids_limit=PIDS_LIMIT,
            nano_cpus=int(self.cpus * 1e9),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[docker.types.Ulimit(name="core", soft=0, hard=0)],
            oom_score_adj=1000,
            log_config=docker.types.LogConfig(type="none"),
            runtime=self.runtime,
        )

    def _drive(self, container: Any, payload: bytes, timeout_s: float) -> ExecutionResult:
        """Starts the container, streams the payload in and the output out, and classifies."""
        # Attach before start, so no output is lost.
        attached = container.attach_socket(
            params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
        sock: socket.socket = getattr(attached, "_sock", attached)
        try:
            container.start()
            started = time.monotonic()
            streams = _Streams(self.max_output_bytes)
            stopped = _exchange(sock, payload, started + timeout_s, streams)
        finally:
            sock.close()
            attached.close()
        if stopped is not None:
            with contextlib.suppress(self._errors.APIError):  # it may have exited meanwhile
                container.kill()
            return streams.result(stopped, None, time.monotonic() - started)
        exit_code = container.wait(timeout=30)["StatusCode"]
        duration = time.monotonic() - started
        container.reload()
        oom_killed = bool(container.attrs["State"].get("OOMKilled"))
        status, code = _classify(exit_code, oom_killed, streams.text(2)[-2000:])
        return streams.result(status, code, duration)


class _Streams:
    """Demultiplexes Docker's attach stream into stdout and stderr, each capped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.pending = bytearray()
        self.out = {1: bytearray(), 2: bytearray()}
        self.cut: set[int] = set()

    def feed(self, data: bytes) -> bool:
        """Adds raw bytes from the socket; returns False once a stream is over the cap."""
        self.pending += data
        # Each frame: stream id (1 byte), 3 zero bytes, big-endian length, payload.
        while len(self.pending) >= 8:
            end = 8 + int.from_bytes(self.pending[4:8], "big")
            if len(self.pending) < end:
                break
            stream_id = self.pending[0]
            if stream_id in self.out:
                stream = self.out[stream_id]
                stream += self.pending[8:end]
                if len(stream) > self.cap:
                    del stream[self.cap :]
                    self.cut.add(stream_id)
            del self.pending[:end]
        return not self.cut

    def text(self, stream_id: int) -> str:
        data = bytes(self.out[stream_id]) + (TRUNCATED if stream_id in self.cut else b"")
        return data.decode("utf-8", errors="replace")

    def result(self, status: Status, exit_code: int | None, duration: float) -> ExecutionResult:
        return ExecutionResult(
            status, self.text(1), self.text(2), exit_code, duration, budget="cgroup"
        )


def _payload(code: str, stdin: str, files: dict[str, str]) -> bytes:
    """Packs what the bootstrap reads: a length line, a JSON header, then stdin."""
    for rel in files:
        norm = posixpath.normpath(rel)
        if rel.startswith("/") or norm == ".." or norm.startswith("../"):
            raise ValueError(f"file path outside the work dir: {rel!r}")
    # As in the local sandbox, `code` wins over a file named main.py.
    header = json.dumps({"code": code, "files": files}).encode()
    return b"%d\n" % len(header) + header + stdin.encode()


def _exchange(
    sock: socket.socket, payload: bytes, deadline: float, streams: _Streams
) -> Status | None:
    """Writes the payload and reads output until EOF; returns why it stopped early, if it did."""
    sock.setblocking(False)
    view = memoryview(payload)
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            for _, events in selector.select(remaining):
                if events & selectors.EVENT_WRITE and view:
                    try:
                        view = view[sock.send(view[: 1 << 16]) :]
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:  # the container died before reading it all
                        view = view[len(view) :]
                    if not view:
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_WR)  # EOF on the code's stdin
                        selector.modify(sock, selectors.EVENT_READ)
                if events & selectors.EVENT_READ:
                    try:
                        data = sock.recv(1 << 16)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        return None
                    if not data:
                        return None
                    if not streams.feed(data):
                        return "output_limit"


def _classify(exit_code: int, oom_killed: bool, stderr_tail: str) -> tuple[Status, int]:
    """Maps the container's exit code (128 + N for signal N) to a status and exit code.

    The order follows the local sandbox: a MemoryError the code raised (or
    the kernel's ENOMEM) counts as "memory" as much as an OOM kill does.
    """
    code = -(exit_code - 128) if 128 < exit_code <= 128 + 64 else exit_code
    if code == 0 and not oom_killed:
        return "ok", 0
    if oom_killed or "MemoryError" in stderr_tail or "Cannot allocate memory" in stderr_tail:
        return "memory", code
    if code < 0:
        return "killed", code
    return "error", code

"""Harbor tasks in Docker: each task's image built here once, each episode's own container.

Images. A task's `environment/` folder is built with its Dockerfile (the engine's builder;
nothing but what the Dockerfile names is fetched) and tagged
`agentgym-harbor/<task>:<hash of environment/>`, so a run builds each task once and a
later run, or a changed folder, finds or builds its own. A `FROM` image that is neither
on this machine nor pullable fails the build; the error names the task, its Dockerfile
and the missing image, and the env refuses to start (before any model loads: preflight
makes the env). `[environment] docker_image` tasks use that image as it is.

Containers. Each episode's container runs `sleep infinity` under Docker's init with the
limits of agentgym's Docker sandbox where a task can live with them: no network
(`network_mode none`; harbor's `network_mode` is not honoured), a memory limit without
swap, a pids limit, a CPU quota, every capability dropped except the file-ownership and
setuid ones an image's root needs (`CAP_ADD`), `no-new-privileges`, an OOM score that
makes the kernel kill it before the trainer, no logs on the host. Unlike the sandbox, its
root file system is writable (the agent edits the task's files) and its user is the
image's (or task.toml's `[agent] user`). Every container carries the label `LABEL`;
`close()` removes its own.

Commands run through the engine's exec under coreutils' `timeout` (so the image needs
`timeout` and, for the shell tool, `bash`); their output is read up to `max_bytes` per
stream and the rest discarded as it arrives.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import re
import tarfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.envs.harbor.schema import HarborTaskError
from agentgym.envs.harbor.tasks import HarborTask

LABEL = "org.agentgym.harbor"
"""Label on every container this module starts, to find leftovers."""
IMAGE_REPOSITORY = "agentgym-harbor"
PIDS_LIMIT = 512
CAP_ADD = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL")
KILL_GRACE_S = 5
"""After its time limit a command gets SIGTERM, and SIGKILL this much later."""
SETUP_HINT = "run `python -m agentgym.sandboxes.docker_setup` (as root) to start an engine"
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(?P<image>\S+)(?:\s+AS\s+(?P<stage>\S+))?", re.I)
_ARG = re.compile(r"^\s*ARG\s+(?P<name>\w+)(?:=(?P<value>\S*))?", re.I)
_build_lock = threading.Lock()


@dataclass(frozen=True)
class Output:
    """How one command in a container ended."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    cut: bool
    """Whether stdout or stderr went past the byte limit and was cut."""


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile's `FROM` lines name, without its own stages and `scratch`;
    `ARG`s declared before the first `FROM` are filled in from their defaults."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    for line in dockerfile.splitlines():
        arg = _ARG.match(line)
        if arg and not images and arg["value"] is not None:
            args[arg["name"]] = arg["value"]
        found = _FROM.match(line)
        if not found:
            continue
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), found["image"])
        if image.lower() not in stages and image != "scratch" and image not in images:
            images.append(image)
        if found["stage"]:
            stages.add(found["stage"].lower())
    return images


def environment_hash(folder: Path) -> str:
    """SHA-256 over the relative paths and bytes of every file under `folder`."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def image_tag(task: HarborTask) -> str:
    """The tag a task's built image carries: `agentgym-harbor/<task>:<hash>`."""
    name = re.sub(r"[^a-z0-9._-]+", "-", task.task_id.lower()).strip("._-") or "task"
    return f"{IMAGE_REPOSITORY}/{name}:{environment_hash(task.folder / 'environment')[:16]}"


class Engine:
    """The Docker engine harbor tasks run on: builds their images, starts their containers.

    Raises:
        HarborTaskError: when the docker package is missing or no engine answers.
    """

    def __init__(self, client: Any = None) -> None:
        try:
            import docker
        except ImportError as exc:
            raise HarborTaskError(
                "Harbor tasks run in Docker: pip install 'agentgym[docker]'"
            ) from exc
        self.errors = docker.errors
        self._owns_client = client is None
        try:
            self.client = client if client is not None else docker.from_env()
            self.client.ping()
        except Exception as exc:  # the SDK's errors, or requests' for the socket
            raise HarborTaskError(
                f"Harbor tasks need a Docker engine ({exc}); {SETUP_HINT}"
            ) from None
        self.instance = uuid.uuid4().hex  # close() removes only this engine's containers

    def image(self, task: HarborTask) -> str:
        """The task's image, built if this machine does not hold it yet.

        Raises:
            HarborTaskError: naming the task, its Dockerfile and the base images this
                machine lacks, or the build's last lines, when it cannot be built.
        """
        prebuilt = task.section("environment").get("docker_image")
        if prebuilt and not task.dockerfile.is_file():
            if not self._has(prebuilt) and not self._pulled(prebuilt):
                raise HarborTaskError(
                    f"Harbor task {task.task_id!r}: its docker_image {prebuilt!r} is not on "
                    "this machine and cannot be pulled"
                )
            return str(prebuilt)
        tag = image_tag(task)
        with _build_lock:
            if not self._has(tag):
                self._build(task, tag)
        return tag

    def _has(self, image: str) -> bool:
        try:
            self.client.images.get(image)
        except self.errors.ImageNotFound:
            return False
        return True

    def _pulled(self, image: str) -> bool:
        try:
            self.client.images.pull(image)
        except self.errors.DockerException:
            return False
        return True

    def _build(self, task: HarborTask, tag: str) -> None:
        missing = [i for i in base_images(task.dockerfile.read_text()) if not self._has(i)]
        try:
            self.client.images.build(
                path=str(task.folder / "environment"),
                tag=tag,
                rm=True,
                forcerm=True,
                labels={LABEL: task.task_id},
                timeout=int(task.build_timeout_s),
            )
        except (self.errors.BuildError, self.errors.APIError) as err:
            where = f"Harbor task {task.task_id!r} ({task.dockerfile})"
            if missing:
                raise HarborTaskError(
                    f"{where}: cannot build its image: FROM {', '.join(missing)}: not on this "
                    f"machine and not pullable here ({err}); valid: a base image present "
                    "locally (`docker images`), e.g. agentgym-sandbox:py311"
                ) from None
            why = _last_lines(err)
            raise HarborTaskError(f"{where}: its image does not build: {why}") from None

    def start(self, task: HarborTask, image: str, *, memory_mb: int, cpus: float) -> Container:
        """A new container of `image` for one episode of `task`."""
        import docker

        workdir = task.section("environment").get("workdir")
        container = self.client.containers.run(
            image,
            entrypoint=["sleep", "infinity"],
            detach=True,
            init=True,
            working_dir=workdir,
            hostname="harbor",
            labels={LABEL: self.instance, f"{LABEL}.task": task.task_id},
            network_mode="none",
            mem_limit=f"{memory_mb}m",
            memswap_limit=f"{memory_mb}m",
            pids_limit=PIDS_LIMIT,
            nano_cpus=int(cpus * 1e9),
            cap_drop=["ALL"],
            cap_add=list(CAP_ADD),
            security_opt=["no-new-privileges"],
            oom_score_adj=1000,
            log_config=docker.types.LogConfig(type="none"),
        )
        return Container(self.client, container)

    def close(self) -> None:
        """Removes this engine's leftover containers and closes an owned client."""
        mine: dict[str, Any] = {"label": f"{LABEL}={self.instance}"}
        with contextlib.suppress(Exception):  # best effort: the engine may be gone
            for container in self.client.containers.list(all=True, filters=mine):
                with contextlib.suppress(self.errors.NotFound):
                    container.remove(force=True)
        if self._owns_client:
            self.client.close()


class Container:
    """One episode's running container."""

    def __init__(self, client: Any, container: Any) -> None:
        self.client = client
        self.container = container

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        max_bytes: int,
        user: str | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> Output:
        """Runs `argv` under `timeout`; reads at most `max_bytes` of each stream."""
        api = self.client.api
        command = ["timeout", "-k", str(KILL_GRACE_S), f"{timeout_s:g}", *argv]
        exec_id = api.exec_create(
            self.container.id,
            command,
            stdout=True,
            stderr=True,
            user=user or "",
            environment=dict(environment or {}),
        )["Id"]
        started = time.monotonic()
        streams = (bytearray(), bytearray())
        cut = False
        for chunks in api.exec_start(exec_id, stream=True, demux=True):
            for kept, chunk in zip(streams, chunks, strict=True):
                if chunk:
                    room = max(0, max_bytes - len(kept))
                    kept += chunk[:room]
                    cut = cut or len(chunk) > room
        code = api.exec_inspect(exec_id)["ExitCode"]
        timed_out = code in (124, 137) and time.monotonic() - started >= timeout_s
        out, err = (bytes(s).decode("utf-8", errors="replace") for s in streams)
        return Output(int(code if code is not None else -1), out, err, timed_out, cut)

    def write(self, path: str, data: bytes, *, user: str | None) -> Output:
        """Writes `data` to `path` (its folders made) as `user`; arguments carry it, so
        `data` must stay well under the kernel's 128 KiB per argument."""
        script = 'mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" | base64 -d > "$1"'
        argv = ["sh", "-c", script, "sh", path, base64.b64encode(data).decode()]
        return self.run(argv, timeout_s=30, max_bytes=4096, user=user)

    def read(self, path: str, max_bytes: int, *, user: str | None) -> bytes | None:
        """The bytes of `path` (up to `max_bytes`), or None if it cannot be read."""
        api = self.client.api
        exec_id = api.exec_create(self.container.id, ["cat", "--", path], user=user or "")["Id"]
        data = bytearray()
        for out, _ in api.exec_start(exec_id, stream=True, demux=True):
            if out and len(data) <= max_bytes:
                data += out[: max_bytes + 1 - len(data)]
        return bytes(data) if api.exec_inspect(exec_id)["ExitCode"] == 0 else None

    def upload(self, folder: Path, target: str) -> None:
        """Copies `folder`'s contents into `target` (made, owned by root, world-readable)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in sorted(folder.rglob("*")):
                info = tar.gettarinfo(str(path), path.relative_to(folder).as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode |= 0o755 if path.is_dir() else 0o444
                if path.is_file():
                    with path.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        self.run(["mkdir", "-p", target], timeout_s=30, max_bytes=4096, user="root")
        self.container.put_archive(target, buffer.getvalue())

    def remove(self) -> None:
        with contextlib.suppress(Exception):  # already gone, or the engine is
            self.container.remove(force=True)


def _last_lines(err: Exception, lines: int = 12) -> str:
    log = getattr(err, "build_log", None) or []
    text = "".join(
        str(e.get("stream", "") or e.get("error", "")) for e in log if isinstance(e, dict)
    )
    tail = "\n".join(text.strip().splitlines()[-lines:])
    return f"{err}" + (f"\n{tail}" if tail else "")

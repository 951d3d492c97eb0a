"""A folder of Harbor tasks, read without harbor: each task's instruction, config and files.

A task is a folder holding `instruction.md`, `task.toml` (checked by `schema`),
`environment/Dockerfile` (or `[environment] docker_image`), `tests/test.sh` and, optionally,
`solution/solve.sh`. The folder given to the env is one task, or a folder whose
subfolders with a `task.toml` are tasks; a task's id is its folder's name.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.envs.harbor.schema import HarborTaskError, check_task_toml

_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
_SIZES = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
UNSUPPORTED = {
    "steps": "multi-step tasks",
    "environment.os": "Windows containers",
    "environment.gpus": "GPUs in the task's container",
    "environment.tpu": "TPUs",
    "environment.mcp_servers": "MCP servers for the agent",
    "environment.healthcheck": "health checks",
    "verifier.environment": "a separate verifier container",
    "verifier.environment_mode": "a separate verifier container",
    "verifier.collect": "collect hooks (compose services)",
}
"""task.toml fields whose tasks agentgym cannot play (when set to other than the default),
with what they ask for."""


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task as agentgym plays it."""

    task_id: str
    folder: Path
    instruction: str
    config: Mapping[str, Any]

    @property
    def dockerfile(self) -> Path:
        return self.folder / "environment" / "Dockerfile"

    @property
    def test_script(self) -> Path:
        return self.folder / "tests" / "test.sh"

    @property
    def solve_script(self) -> Path:
        return self.folder / "solution" / "solve.sh"

    def section(self, name: str) -> Mapping[str, Any]:
        """A table of task.toml (`environment`, `agent`, `verifier`); empty if absent."""
        table = self.config.get(name, {})
        return table if isinstance(table, Mapping) else {}

    @property
    def verifier_timeout_s(self) -> float:
        return float(self.section("verifier").get("timeout_sec", 600.0))

    @property
    def agent_timeout_s(self) -> float | None:
        value = self.section("agent").get("timeout_sec")
        return None if value is None else float(value)

    @property
    def build_timeout_s(self) -> float:
        return float(self.section("environment").get("build_timeout_sec", 600.0))

    @property
    def memory_mb(self) -> int | None:
        env = self.section("environment")
        if "memory_mb" in env:
            return int(env["memory_mb"])
        return _size_mb(env["memory"]) if "memory" in env else None

    @property
    def cpus(self) -> float | None:
        value = self.section("environment").get("cpus")
        return None if value is None else float(value)


def read_tasks(folder: str | Path) -> list[HarborTask]:
    """The tasks of `folder` (a task, or a folder of tasks), sorted by id.

    Raises:
        HarborTaskError: naming the folder when it holds no task, or every file and
            field of every task that cannot be played (all of them, not the first).
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise HarborTaskError(f"Harbor task folder {str(folder)!r} is not a directory")
    if (root / "task.toml").is_file():
        folders = [root]
    else:
        folders = sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
    if not folders:
        raise HarborTaskError(
            f"{root} holds no Harbor task: valid: a task folder (with task.toml, "
            "instruction.md, environment/Dockerfile, tests/test.sh) or a folder of them"
        )
    tasks, problems = [], []
    for path in folders:
        try:
            tasks.append(read_task(path))
        except HarborTaskError as err:
            problems.append(str(err))
    if problems:
        raise HarborTaskError("\n".join(problems))
    return tasks


def read_task(folder: Path) -> HarborTask:
    """One task folder, checked: its task.toml against harbor's schema, its files present,
    nothing asked that agentgym cannot play (`UNSUPPORTED`)."""
    toml_path = folder / "task.toml"
    try:
        config = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise HarborTaskError(f"{toml_path}: not valid TOML: {err}") from None
    check_task_toml(config, str(toml_path))
    task = HarborTask(folder.name, folder, _instruction(folder), config)
    missing = [p for p in (task.test_script,) if not p.is_file()]
    if not task.section("environment").get("docker_image") and not task.dockerfile.is_file():
        missing.append(task.dockerfile)
    if missing:
        names = ", ".join(str(p) for p in missing)
        raise HarborTaskError(f"Harbor task {task.task_id!r}: missing {names}")
    asked = [f"{key} ({what})" for key, what in UNSUPPORTED.items() if _asks(config, key)]
    if asked:
        raise HarborTaskError(
            f"Harbor task {task.task_id!r} ({toml_path}) asks for what agentgym does not "
            f"support: {', '.join(asked)}; see docs/ecosystem.md"
        )
    return task


def _instruction(folder: Path) -> str:
    """instruction.md without its leading canary lines (data-provenance markers that harbor
    also keeps from the agent)."""
    path = folder / "instruction.md"
    if not path.is_file():
        raise HarborTaskError(f"Harbor task {folder.name!r}: missing {path}")
    lines = path.read_text(encoding="utf-8").split("\n")
    start = 0
    while start < len(lines) and _CANARY.match(lines[start].strip()):
        start += 1
    while start < len(lines) and not lines[start].strip():
        start += 1
    text = "\n".join(lines[start:]).strip()
    if not text:
        raise HarborTaskError(f"Harbor task {folder.name!r}: {path} is empty")
    return text


def _asks(config: Mapping[str, Any], key: str) -> bool:
    section, _, name = key.partition(".")
    value = config.get(section) if not name else config.get(section, {}).get(name)
    defaults: dict[str, Any] = {"environment.os": "linux", "environment.gpus": 0}
    return value not in (None, [], {}, defaults.get(key))


def _size_mb(text: str) -> int:
    size = text.strip().upper()
    if size[-1:] not in _SIZES:
        raise HarborTaskError(f"memory={text!r}; valid: a size such as '2G' or '512M'")
    return int(float(size[:-1]) * _SIZES[size[-1]])


def split_tasks(
    ids: Sequence[str], test_fraction: float, test_tasks: Sequence[str] | None
) -> dict[str, list[str]]:
    """The train and test splits of the task ids: `test_tasks` where given, else the
    `ceil(n * test_fraction)` ids whose SHA-256 is lowest (stable: a task keeps its split
    while its name does), at least one in each split. One task alone is in both."""
    if test_tasks is not None:
        unknown = sorted(set(test_tasks) - set(ids))
        if unknown:
            raise HarborTaskError(f"test_tasks names {unknown}, not tasks here; valid: {ids}")
        test = [t for t in ids if t in set(test_tasks)]
    else:
        if not 0.0 < test_fraction < 1.0:
            raise HarborTaskError(f"test_fraction={test_fraction!r}; valid: between 0 and 1")
        ranked = sorted(ids, key=lambda t: hashlib.sha256(t.encode()).hexdigest())
        count = min(max(1, math.ceil(len(ids) * test_fraction)), len(ids) - 1)
        test = sorted(ranked[: max(count, 1)])
    train = [t for t in ids if t not in set(test)]
    if len(ids) == 1:
        return {"train": list(ids), "test": list(ids)}
    if not train or not test:
        raise HarborTaskError(
            f"test_tasks={test_tasks!r} leaves a split empty; valid: some but not all of {ids}"
        )
    return {"train": train, "test": test}

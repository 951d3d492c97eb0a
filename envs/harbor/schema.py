"""Harbor's `task.toml`, read and checked by agentgym itself (harbor needs Python 3.12).

The tables below restate the fields of harbor 0.25.0's task config models
(`harbor/models/task/config.py`: `TaskConfig` and the models it holds), each with the kind
of value it takes; `tests/test_harbor_schema.py` checks them against a field list drawn
from that wheel (`tests/fixtures/harbor_task_schema.json`). Where harbor's pydantic models
ignore a key they do not know, this reader refuses it, naming the file, the field and the
valid ones: a misspelt `timeout_secs` would otherwise run the task with the default limit.
The free-form tables (`[metadata]`, the `env` tables) take any keys, as in harbor.

The legacy spellings harbor still reads are accepted: a top-level `version` (now
`schema_version`), `[environment] memory` / `storage` ("2G", "512M": now `memory_mb` /
`storage_mb`) and `allow_internet` (now `network_mode`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class HarborTaskError(ValueError):
    """A Harbor task that cannot be played here; the message names the task and the fix."""


@dataclass(frozen=True)
class Table:
    """A TOML table: its fields (a kind name, a tuple of allowed strings, a nested `Table`
    or a `ListOf`), those it requires, and whether it takes keys of its own (`free`)."""

    fields: Mapping[str, Kind]
    required: frozenset[str] = frozenset()
    free: bool = False


@dataclass(frozen=True)
class ListOf:
    """An array whose items are `item`; `strings` also allows plain strings among them."""

    item: Table
    strings: bool = False


Kind = str | tuple[str, ...] | Table | ListOf

NETWORK_MODES = ("no-network", "public", "allowlist")
NETWORK: dict[str, Kind] = {"network_mode": NETWORK_MODES, "allowed_hosts": "list[str]"}
HEALTHCHECK = Table(
    {
        "command": "str",
        "interval_sec": "number",
        "timeout_sec": "number",
        "start_period_sec": "number",
        "start_interval_sec": "number",
        "retries": "int",
    },
    required=frozenset({"command"}),
)
MCP_SERVER = Table(
    {
        "name": "str",
        "transport": ("stdio", "sse", "streamable-http", "http"),
        "url": "str",
        "command": "str",
        "args": "list[str]",
        "headers": "table[str]",
    },
    required=frozenset({"name"}),
)
ENVIRONMENT = Table(
    {
        **NETWORK,
        "build_timeout_sec": "number",
        "docker_image": "str",
        "os": ("linux", "windows"),
        "cpus": "number",
        "memory_mb": "int",
        "storage_mb": "int",
        "gpus": "int",
        "gpu_types": "list[str]",
        "tpu": Table({"type": "str", "topology": "str"}, frozenset({"type", "topology"})),
        "mcp_servers": ListOf(MCP_SERVER),
        "env": "table[str]",
        "skills_dir": "str",
        "healthcheck": HEALTHCHECK,
        "workdir": "str",
        "allow_internet": "bool",
        "memory": "str",  # legacy: memory_mb
        "storage": "str",  # legacy: storage_mb
    }
)
AGENT = Table({**NETWORK, "timeout_sec": "number", "user": "str|int"})
VERIFIER = Table(
    {
        **NETWORK,
        "timeout_sec": "number",
        "env": "table[str]",
        "user": "str|int",
        "environment_mode": ("shared", "separate"),
        "environment": ENVIRONMENT,
        "collect": ListOf(
            Table(
                {"command": "str", "service": "str", "timeout_sec": "number", "user": "str|int"},
                required=frozenset({"command"}),
            )
        ),
    }
)
ARTIFACT = Table(
    {"source": "str", "destination": "str", "exclude": "list[str]", "service": "str"},
    required=frozenset({"source"}),
)
STEP = Table(
    {
        "name": "str",
        "agent": AGENT,
        "verifier": VERIFIER,
        "min_reward": "number|table[number]",
        "healthcheck": HEALTHCHECK,
        "artifacts": ListOf(ARTIFACT, strings=True),
    },
    required=frozenset({"name"}),
)
PACKAGE = Table(
    {
        "name": "str",
        "version": "str",
        "description": "str",
        "authors": ListOf(Table({"name": "str", "email": "str"}, frozenset({"name"}))),
        "keywords": "list[str]",
    },
    required=frozenset({"name"}),
)
TASK_TOML = Table(
    {
        "schema_version": "str",
        "version": "str",  # legacy: schema_version
        "task": PACKAGE,
        "metadata": Table({}, free=True),
        "verifier": VERIFIER,
        "agent": AGENT,
        "environment": ENVIRONMENT,
        "solution": Table({"env": "table[str]"}),
        "source": "str",
        "multi_step_reward_strategy": ("mean", "final"),
        "steps": ListOf(STEP),
        "artifacts": ListOf(ARTIFACT, strings=True),
    }
)
"""The whole of `task.toml`, as harbor 0.25.0 defines it."""

SCALARS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "str": ("a string", lambda v: isinstance(v, str)),
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "number": ("a finite number", lambda v: _is_number(v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "str|int": ("a user name or a uid", lambda v: isinstance(v, str) or SCALARS["int"][1](v)),
    "list[str]": ("an array of strings", lambda v: _all(v, list, str)),
    "table[str]": ("a table of strings", lambda v: _all(v, dict, str)),
    "number|table[number]": (
        "a number or a table of numbers",
        lambda v: _is_number(v) or (isinstance(v, dict) and all(map(_is_number, v.values()))),
    ),
}
"""Each kind name: what it reads as in an error, and the check of a value."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _all(value: Any, container: type, item: type) -> bool:
    values = value.values() if isinstance(value, dict) else value
    return isinstance(value, container) and all(isinstance(v, item) for v in values)


@dataclass
class Problems:
    """The problems found in one file, each naming its field."""

    path: str
    found: list[str] = field(default_factory=list)

    def add(self, where: str, message: str) -> None:
        self.found.append(f"{self.path}: {where}: {message}")


def check_task_toml(data: Mapping[str, Any], path: str) -> None:
    """Raises HarborTaskError listing every field of `data` (a parsed task.toml at `path`)
    that harbor's schema does not define or that holds the wrong kind of value."""
    problems = Problems(path)
    _check_table(data, TASK_TOML, "", problems)
    if problems.found:
        raise HarborTaskError("invalid task.toml:\n  " + "\n  ".join(problems.found))


def _check_table(data: Any, table: Table, where: str, problems: Problems) -> None:
    if not isinstance(data, dict):
        problems.add(where or "(top)", f"is {type(data).__name__}; valid: a table")
        return
    if table.free:
        return
    for name in sorted(table.required - set(data)):
        problems.add(_join(where, name), "is required and missing")
    for name, value in data.items():
        key = _join(where, name)
        if name not in table.fields:
            valid = ", ".join(sorted(table.fields))
            problems.add(key, f"is not a harbor task.toml field; valid here: {valid}")
        else:
            _check_value(value, table.fields[name], key, problems)


def _check_value(value: Any, kind: Kind, where: str, problems: Problems) -> None:
    if isinstance(kind, Table):
        _check_table(value, kind, where, problems)
    elif isinstance(kind, ListOf):
        if not isinstance(value, list):
            problems.add(where, f"is {value!r}; valid: an array of tables")
            return
        for i, item in enumerate(value):
            if not (kind.strings and isinstance(item, str)):
                _check_table(item, kind.item, f"{where}[{i}]", problems)
    elif isinstance(kind, tuple):
        if value not in kind:
            problems.add(where, f"is {value!r}; valid: {', '.join(map(repr, kind))}")
    else:
        what, ok = SCALARS[kind]
        if not ok(value):
            problems.add(where, f"is {value!r}; valid: {what}")


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name

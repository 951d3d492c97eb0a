"""What the rollout reads from an environment's `info` dicts, typed and read in one place.

Gymnasium's `reset` and `step` return `info` as a plain dict, and an environment may put
anything in it; the keys below are the ones agentgym's players act on. `ResetInfo.read`
and `StepInfo.read` turn a dict into the typed record at the boundary, so that nothing
downstream indexes a dict by a string, and a value of the wrong type is an error naming
its key rather than a surprise three calls later.

reset: `task_id` (required), `tools` (OpenAI function schemas), `tool_format` ("native":
the chat template renders `tools`), `env` (a mixture's member), `category`.
step: `reward_parts` ({name: value}), `tool_calls` (call attempts this turn),
`tool_errors` ({kind: count}).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _read(info: Mapping[str, Any], key: str, kind: type, reading: str) -> Any:
    value = info.get(key)
    if value is not None and not isinstance(value, kind):
        raise TypeError(
            f"{reading} info[{key!r}] is a {type(value).__name__}; it should be a {kind.__name__}"
        )
    return value


@dataclass(frozen=True)
class ResetInfo:
    """The reset's task and how to render its tools."""

    task_id: str
    tools: list[dict[str, Any]] | None = None
    tool_format: str | None = None
    env: str | None = None
    category: str | None = None

    @classmethod
    def read(cls, info: Mapping[str, Any]) -> ResetInfo:
        if "task_id" not in info:
            raise KeyError("env.reset's info has no 'task_id': every agentgym env gives one")
        return cls(
            task_id=info["task_id"],
            tools=_read(info, "tools", list, "env.reset's"),
            tool_format=_read(info, "tool_format", str, "env.reset's"),
            env=_read(info, "env", str, "env.reset's"),
            category=_read(info, "category", str, "env.reset's"),
        )

    @property
    def native_tools(self) -> list[dict[str, Any]] | None:
        """The tools for the chat template to render: only where the env speaks the
        template's native format."""
        return self.tools if self.tool_format == "native" else None


@dataclass(frozen=True)
class StepInfo:
    """A step's reward parts and tool counters. `tool_calls` is None where the env does
    not count calls (a math env), so that no counter appears for it."""

    reward_parts: dict[str, float] = field(default_factory=dict)
    tool_calls: int | None = None
    tool_errors: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, info: Mapping[str, Any]) -> StepInfo:
        parts = _read(info, "reward_parts", Mapping, "env.step's") or {}
        calls = info.get("tool_calls")
        errors = _read(info, "tool_errors", Mapping, "env.step's") or {}
        return cls(
            reward_parts={k: float(v) for k, v in parts.items()},
            tool_calls=None if calls is None else int(calls),
            tool_errors={kind: int(n) for kind, n in errors.items()},
        )

"""The OpenEnv WebSocket protocol as `agentgym/OpenEnv-v0` speaks it: frames read and checked.

An OpenEnv server (openenv-core's `HTTPEnvServer`) keeps one environment per connection to
`/ws`. The client sends `{"type": "reset", "data": {...}}`, `{"type": "step", "data":
action}` or `{"type": "close"}`; the server answers each with `{"type": "observation",
"data": {"observation": {...}, "reward": float | null, "done": bool}}` or `{"type":
"error", "data": {"message": ..., "code": ...}}`. A server at its session limit accepts the
socket, then sends one error frame with code `CAPACITY_REACHED` and closes it.

`read_frame` is the one place a frame from the server is read: anything but a well-formed
observation is an `OpenEnvError` naming the server, never a KeyError three calls later.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentgym.types import Message

CAPACITY_REACHED = "CAPACITY_REACHED"


class OpenEnvError(RuntimeError):
    """An OpenEnv server answered with an error, a malformed frame, or not at all."""


class OpenEnvCapacityError(OpenEnvError):
    """The server refused a new session: it holds as many as it allows."""


@dataclass(frozen=True)
class Reply:
    """One observation frame: the observation's fields, the step's reward, and `done`."""

    observation: Mapping[str, Any]
    reward: float
    done: bool


def read_frame(raw: str | bytes, server: str) -> Reply:
    """The observation a server's frame carries.

    Args:
        raw: The frame's text (or bytes, UTF-8).
        server: The server's URL, named in every error.

    Raises:
        OpenEnvCapacityError: the frame is a `CAPACITY_REACHED` error.
        OpenEnvError: any other error frame, or a frame that is not an observation.
    """
    try:
        frame = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise OpenEnvError(
            f"OpenEnv server {server} sent a frame that is not JSON: {err}"
        ) from None
    if not isinstance(frame, dict) or not isinstance(frame.get("data"), dict):
        raise OpenEnvError(
            f"OpenEnv server {server} sent a frame without a data object: {_cut(raw)}"
        )
    data = frame["data"]
    if frame.get("type") == "error":
        raise _error(data, server)
    if frame.get("type") != "observation":
        raise OpenEnvError(
            f"OpenEnv server {server} sent a {frame.get('type')!r} frame; expected an observation"
        )
    observation, reward, done = (
        data.get("observation", {}),
        data.get("reward"),
        data.get("done", False),
    )
    if not isinstance(observation, dict):
        raise OpenEnvError(f"OpenEnv server {server} sent an observation that is not an object")
    if not isinstance(done, bool):
        raise OpenEnvError(f"OpenEnv server {server} sent done={done!r}; expected true or false")
    if reward is None:
        reward = 0.0
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise OpenEnvError(
            f"OpenEnv server {server} sent reward={reward!r}; expected a finite number"
        )
    return Reply(observation, float(reward), done)


def _error(data: Mapping[str, Any], server: str) -> OpenEnvError:
    code, message = data.get("code"), data.get("message")
    if code == CAPACITY_REACHED:
        active, most = data.get("active_sessions"), data.get("max_sessions")
        return OpenEnvCapacityError(
            f"OpenEnv server {server} is at its session limit ({active} of {most} sessions "
            "open) and refused this episode: start the server with a higher limit "
            "(max_concurrent_envs), or play fewer episodes at once (run.env_workers, "
            "training.batch_size x training.group_size)"
        )
    return OpenEnvError(f"OpenEnv server {server} answered with an error ({code}): {message}")


def render_observation(observation: Mapping[str, Any], field: str | None) -> list[Message]:
    """An observation as the chat messages the agent reads.

    `field` names the observation field holding the text; without one, a `messages` field
    holding chat messages (as `agentgym serve-env` sends) is taken as they are, an
    observation of one field is that field's text, and any other is its JSON. Text that is
    not a string is written as JSON. Empty text gives no message.
    """
    if field is not None:
        if field not in observation:
            fields = ", ".join(sorted(observation)) or "none"
            raise OpenEnvError(
                f"the observation has no field {field!r} (run.env_kwargs.observation_field); "
                f"its fields: {fields}"
            )
        value: Any = observation[field]
    elif _is_chat(observation.get("messages")):
        return [Message.from_dict(m) for m in observation["messages"]]
    elif len(observation) == 1:
        (value,) = observation.values()
    else:
        value = dict(observation)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return [Message("user", text)] if text else []


def _is_chat(value: Any) -> bool:
    if not isinstance(value, list):
        return False
    try:
        [Message.from_dict(m) for m in value]
    except (ValueError, TypeError, KeyError, AttributeError):
        return False
    return True


def _cut(raw: str | bytes, limit: int = 200) -> str:
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "..."

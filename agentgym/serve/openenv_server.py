"""`agentgym serve-env`: an agentgym environment behind an OpenEnv-compatible server.

Built on openenv-core's own server (`create_fastapi_app`, its `HTTPEnvServer` routes:
`/ws` for episodes, `/reset`, `/step`, `/state`, `/health`, `/schema`): `GymEnvironment`
is an openenv-core `Environment` wrapping one `gymnasium.make` of the env, and the server
makes one per WebSocket session. The action is `{"message": text}` (the assistant's
turn); the observation is `{"messages": [...], "task_id", "tools", "reward_parts"}`, the
new chat messages as the env returns them, with the step's reward and `done`
(terminated or truncated) beside it, as OpenEnv sends them. A reset takes `seed`, and
`task_id` and `split` as the env's reset options.

Loopback by default; a host other than loopback is refused without `--api-key`, and with
one every request (HTTP and WebSocket) must send `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import hmac
import signal
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import gymnasium as gym
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from agentgym.config import ConfigError
from agentgym.env.core import make_env
from agentgym.serve.app import Server, is_loopback

RESET_OPTIONS = ("task_id", "split")


class MessageAction(Action):
    """The agent's turn: the assistant's text."""

    message: str = Field(description="the assistant's text")


class ChatObservation(Observation):
    """The messages an environment adds, and what its info says of them."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="new messages")
    task_id: str = Field(default="", description="the episode's task (info['task_id'])")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="tool schemas")
    reward_parts: dict[str, float] = Field(default_factory=dict, description="the reward's parts")


class GymEnvironment(Environment[MessageAction, ChatObservation, State]):
    """One agentgym environment (`make_env(name, **kwargs)`) as an OpenEnv `Environment`."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session makes its own env

    def __init__(self, name: str, env_kwargs: dict[str, Any] | None = None):
        super().__init__()
        self.env: gym.Env = make_env(name, **(env_kwargs or {}))
        self._state = State(episode_id=None, step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> ChatObservation:
        options = {k: kwargs[k] for k in RESET_OPTIONS if kwargs.get(k) is not None}
        messages, info = self.env.reset(seed=seed, options=options or None)
        self._state = State(episode_id=episode_id or str(info["task_id"]), step_count=0)
        return ChatObservation(
            messages=messages,
            task_id=str(info["task_id"]),
            tools=info.get("tools") or [],
            done=False,
            reward=0.0,
        )

    def step(
        self, action: MessageAction, timeout_s: float | None = None, **kwargs: Any
    ) -> ChatObservation:
        messages, reward, terminated, truncated, info = self.env.step(action.message)
        self._state.step_count += 1
        return ChatObservation(
            messages=messages,
            task_id=str(info.get("task_id", "")),
            reward_parts={k: float(v) for k, v in (info.get("reward_parts") or {}).items()},
            done=bool(terminated or truncated),
            reward=float(reward),
        )

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self.env.close()


ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class RequireKey:
    """ASGI middleware: HTTP requests and WebSocket handshakes without `Authorization:
    Bearer <key>` are refused (401, or the socket closed before it opens)."""

    def __init__(self, app: ASGIApp, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            sent = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(sent, self.expected):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"missing or wrong API key"})
                return
        await self.app(scope, receive, send)


def create_env_app(
    name: str, env_kwargs: dict[str, Any], *, max_sessions: int, api_key: str | None = None
) -> Any:
    """The OpenEnv app serving environment `name`, at most `max_sessions` episodes at once."""
    make_env(name, **env_kwargs).close()  # an unknown env or bad kwargs fail here, not per session
    app = create_fastapi_app(
        lambda: GymEnvironment(name, env_kwargs),
        MessageAction,
        ChatObservation,
        max_concurrent_envs=max_sessions,
    )
    return RequireKey(app, api_key) if api_key else app


def check_env_host(host: str, api_key: str | None) -> None:
    """Refuses an empty host, and a host other than loopback without an API key."""
    if not host:
        raise ConfigError("--host is empty; give 127.0.0.1 (the default) or an address")
    if not is_loopback(host) and api_key is None:
        raise ConfigError(
            f"--host {host} is not loopback: give --api-key too, or anyone who can reach "
            "the port can play (and run tools in) the environment"
        )


def run_serve_env(
    name: str,
    env_kwargs: dict[str, Any],
    host: str,
    port: int,
    *,
    max_sessions: int,
    api_key: str | None = None,
) -> None:
    """Serves environment `name` until SIGINT or SIGTERM; then closes the port and returns."""
    check_env_host(host, api_key)
    app = create_env_app(name, env_kwargs, max_sessions=max_sessions, api_key=api_key)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        with Server(app, host, port) as server:
            print(f"agentgym serve-env: {name} at http://{host}:{server.port} (OpenEnv, /ws)")
            stop.wait()
    except OSError as err:
        raise ConfigError(str(err)) from None
    print("agentgym serve-env: stopped; the port is closed")

"""A `Player` written outside agentgym (`run.player: players:ServedEnvPlayer`), as a user
would write one for environments that live behind a server.

Each episode's environment is served from a thread of its own: the player never calls
the environment object, only sends it messages ("reset", "step") and waits for the
replies, as it would over HTTP to another process. It plays the turns itself with the
policy's `generate` and builds the trajectories from the ids it sampled: nothing under
`agentgym/` knows it exists.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.policy.turn_end import find_turn_end
from agentgym.rollout.episodes import closing_text, continuation_ids, prompt_ids, sampled_text
from agentgym.rollout.player import Submission, Versions
from agentgym.types import Completion, Message, Trajectory, Turn


class ServedEnv:
    """An environment answering messages on a thread of its own."""

    def __init__(self, env: Any) -> None:
        self._inbox: queue.Queue = queue.Queue()
        self.threads_seen: set[int] = set()
        self._thread = threading.Thread(target=self._serve, args=(env,), daemon=True)
        self._thread.start()

    def _serve(self, env: Any) -> None:
        while True:
            method, args, kwargs, reply = self._inbox.get()
            if method == "stop":
                reply.put(None)
                return
            self.threads_seen.add(threading.get_ident())
            try:
                reply.put(("ok", getattr(env, method)(*args, **kwargs)))
            except Exception as err:  # sent back, as a server answers an error
                reply.put(("error", err))

    def request(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The environment's answer to `method(*args, **kwargs)`, or its exception."""
        reply: queue.Queue = queue.Queue()
        self._inbox.put((method, args, kwargs, reply))
        status, value = reply.get(timeout=60)
        if status == "error":
            raise value
        return value

    def stop(self) -> None:
        reply: queue.Queue = queue.Queue()
        self._inbox.put(("stop", (), {}, reply))
        reply.get(timeout=60)
        self._thread.join(timeout=60)


@dataclass
class _Live:
    server: ServedEnv
    task_id: str
    group: int
    messages: list[dict[str, Any]]
    tokens: list[int]
    prompt_length: int
    opening: tuple[Message, ...]
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    reward: float = 0.0
    finish_reason: str = "stop"
    truncated: bool = False
    done: bool = False


class ServedEnvPlayer:
    """Plays each episode against its environment served from another thread."""

    served_threads: set[int] = set()  # every serving thread's id, for the tests to check

    def __init__(self, config: Any, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end = find_turn_end(tokenizer)

    def play(
        self,
        policy: Any,
        envs: Sequence[Any],
        submission: Submission,
        versions: Versions | None = None,
    ) -> list[Trajectory]:
        g = submission.group_size
        servers = [ServedEnv(envs[i]) for i in range(submission.episodes)]
        try:
            live = [
                self._start(servers[i * g + k], spec, i)
                for i, spec in enumerate(submission.specs)
                for k in range(g)
            ]
            # asked once, as an agent program's player does: no new weights mid-submission
            version = versions() if versions is not None else None
            while playing := [ep for ep in live if not ep.done]:
                gens = policy.generate([ep.tokens for ep in playing], submission.params)
                for ep, gen in zip(playing, gens, strict=True):
                    self._turn(ep, gen, submission.max_tokens)
            return [self._trajectory(ep, version) for ep in live]
        finally:
            for server in servers:
                ServedEnvPlayer.served_threads |= server.threads_seen
                server.stop()

    def _start(self, server: ServedEnv, spec: Any, group: int) -> _Live:
        obs, info = server.request("reset", **spec.reset_kwargs())
        ids = prompt_ids(self.tokenizer, list(obs))
        opening = tuple(Message.from_dict(m) for m in obs)
        return _Live(server, info["task_id"], group, list(obs), list(ids), len(ids), opening)

    def _turn(self, ep: _Live, gen: Any, max_tokens: int | None) -> None:
        start = len(ep.tokens)
        ep.tokens += gen.ids
        ep.mask += [1] * len(gen.ids)
        ep.logprobs += gen.logprobs
        ep.spans.append((start, len(ep.tokens)))
        ep.finish_reason = gen.finish_reason
        closing = closing_text(self.tokenizer, gen.ids, self.end)
        text = sampled_text(self.tokenizer, gen.ids, False, closing)
        obs, reward, terminated, truncated, info = ep.server.request(
            "step", Completion(text, gen.finish_reason)
        )
        parts = {k: float(v) for k, v in info.get("reward_parts", {}).items()}
        ep.turns.append(Turn(text, tuple(Message.from_dict(m) for m in obs), float(reward), parts))
        ep.reward += float(reward)
        for key, value in parts.items():
            ep.parts[key] = ep.parts.get(key, 0.0) + value
        ep.messages.append({"role": "assistant", "content": text})
        ep.truncated, ep.done = bool(truncated), bool(terminated or truncated)
        if not ep.done:
            more = continuation_ids(self.tokenizer, ep.messages, list(obs), closing is not None)
            ep.messages += list(obs)
            ep.tokens += more
            ep.mask += [0] * len(more)
            ep.logprobs += [0.0] * len(more)
            if max_tokens is not None and len(ep.tokens) >= max_tokens:
                ep.done = ep.truncated = True

    def _trajectory(self, ep: _Live, version: int | None) -> Trajectory:
        mask = [0] * ep.prompt_length + ep.mask
        return Trajectory(
            task_id=ep.task_id,
            group=ep.group,
            tokens=tuple(ep.tokens),
            loss_mask=tuple(mask),
            logprobs=tuple([0.0] * ep.prompt_length + ep.logprobs),
            prompt_length=ep.prompt_length,
            reward=ep.reward,
            reward_parts=dict(ep.parts),
            turns=tuple(ep.turns),
            finish_reason=ep.finish_reason,
            truncated=ep.truncated,
            prompt_messages=ep.opening,
            turn_spans=tuple(ep.spans),
            # the sampler stamps them when no version was asked for
            token_versions=() if version is None else tuple(version if m else -1 for m in mask),
        )

    def close(self) -> None:
        return None


def gives_text(config: Any, tokenizer: Any) -> str:
    """A factory that gives something other than a player (refused by name)."""
    return "not a player"

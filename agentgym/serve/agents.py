"""Agent programs as the rollout: `run.agent: module:function`, played through the endpoint.

An agent is `async def agent(client: openai.AsyncOpenAI, task: AgentTask)`, written
against the plain `openai` client. `AgentPlayer` serves the policy in this process on a
free loopback port and plays G copies of the agent per task, concurrently, each with a
client whose base URL is its own episode's path: every request it sends is recorded as
the exact ids the policy saw and sampled (`agentgym.serve.recorder`). The episode's
reward is what the agent returns, when a number, or else the environment's
`judge(messages, task)` of the conversation it returns (its last request's messages and
the reply, when it returns None).

Faults are episodes, not dead runs: an agent that raises (SystemExit too), runs or blocks
past `run.agent_timeout_s`, returns something else, or sends no request gives an
unscorable episode (advantage 0) whose `error` says which.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import gymnasium as gym
from transformers import PreTrainedTokenizerBase

from agentgym.config import Config
from agentgym.env.core import AgentEnv, Task
from agentgym.env.info import ResetInfo
from agentgym.extras import require_serve
from agentgym.policy.base import Policy, SamplingParams, as_policy
from agentgym.rollout.episodes import Job, episode_jobs, turn_stream, use_chat_template
from agentgym.rollout.player import Submission, Versions, named_object
from agentgym.rollout.samples import resampled
from agentgym.serve.agent_thread import run_here, run_on_thread
from agentgym.serve.engine import Engine
from agentgym.serve.recorder import Sample
from agentgym.serve.service import ChatService, Episode
from agentgym.tools import CallAttempt
from agentgym.types import AgentReward, Completion, Message, ToolCall, Trajectory, Turn

AgentFn = Callable[[Any, "AgentTask"], Awaitable[Any]]


@dataclass(frozen=True)
class _Started:
    """An episode set up for its agent: its path's key, the agent's task, its group, and
    the env's opening and reset info."""

    key: str
    task: AgentTask
    group: int
    opening: list[dict[str, Any]]
    info: ResetInfo


@dataclass(frozen=True)
class AgentTask:
    """What an agent is given for one episode.

    Attributes:
        id: The task's id.
        messages: The environment's opening messages (system, user), in OpenAI's shape.
        tools: The environment's tools as OpenAI function tools (`tools=` of a request).
        task: The environment's task (prompt, answer, metadata).
    """

    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    task: Task
    _env: gym.Env[Any, Any] | None = field(default=None, repr=False)  # wrapped: TimeLimit
    _revoked: threading.Event = field(default_factory=threading.Event, repr=False)

    def _check_open(self, what: str) -> None:
        """RuntimeError once the episode has ended (its agent ran past its deadline)."""
        if self._revoked.is_set():
            raise RuntimeError(f"task {self.id!r}: {what} after the episode ended")

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Runs the environment's tool `name` in this episode's world, as the environment
        runs a call; returns the result text (or the error the environment would give)."""
        self._check_open("call_tool")
        toolbox = getattr(self._env.unwrapped, "toolbox", None) if self._env else None
        if toolbox is None:
            raise RuntimeError(f"task {self.id!r}: the environment has no tools")
        attempt = CallAttempt(ToolCall(name, dict(arguments)), None)
        (result,) = await asyncio.to_thread(toolbox.run, [attempt])
        return str(result.content)

    async def env_step(
        self, message: Mapping[str, Any], finish_reason: str = "stop"
    ) -> tuple[list[dict[str, Any]], bool]:
        """The environment's answer to an assistant message (OpenAI's shape) and the
        reply's `finish_reason` ("length": a call cut off, as the env reads it), as the
        rollout gives it: its reply messages, each tool result with the `tool_call_id` of
        the call it answers, and whether the episode is over. An agent that answers each
        turn this way plays the built-in rollout's conversation."""
        assert self._env is not None  # the player gives every task its env
        self._check_open("env_step")
        text = Completion(cast(AgentEnv, self._env.unwrapped).turn_text(message), finish_reason)
        replies, _, terminated, truncated, _ = await asyncio.to_thread(self._env.step, text)
        ids = [c.get("id") for c in message.get("tool_calls") or []]
        results = [r for r in replies if r["role"] == "tool"]
        for i, result in enumerate(results):  # the calls they answer, in order, as OpenAI's
            result["tool_call_id"] = ids[i] if i < len(ids) else f"call_unread_{i}"
        return list(replies), bool(terminated or truncated)

    @property
    def prompt(self) -> str:
        """The task's prompt (`task.task.prompt`): the user's opening message's text."""
        return self.task.prompt

    @property
    def env(self) -> AgentEnv:
        """The episode's environment (unwrapped): an agent program an env declares
        (`AgentEnv.agent_program`) plays the episode with it."""
        assert self._env is not None  # the player gives every task its env
        return cast(AgentEnv, self._env.unwrapped)


def load_agent(path: str) -> AgentFn:
    """The agent `module:function` or `path/to/file.py:function` names; ValueError naming
    `run.agent` and what is wrong."""
    where, name, agent = named_object("run.agent", path, "my_agents:solve")
    if agent is None or not inspect.iscoroutinefunction(agent):
        raise ValueError(
            f"run.agent {path!r}: {where} has no async function {name!r}; an agent is "
            "`async def agent(client: openai.AsyncOpenAI, task: AgentTask)`"
        )
    return cast(AgentFn, agent)


@dataclass(frozen=True)
class AgentOptions:
    """`run.agent` and how its episodes run (`agent_options` reads them from a config)."""

    agent: str
    concurrency: int = 16
    timeout_s: float = 3600.0
    tool_format: str = "auto"
    tool_parser: str | None = None
    own_thread: bool = True
    """Each episode's agent on a thread of its own; False for an env's declared program."""

    def player(self, tokenizer: PreTrainedTokenizerBase, name: str = "agentgym") -> AgentPlayer:
        """A player of the agent; it serves the policy it plays with on a free loopback port."""
        return AgentPlayer(
            load_agent(self.agent),
            tokenizer,
            concurrency=self.concurrency,
            timeout_s=self.timeout_s,
            tool_format=self.tool_format,
            tool_parser=self.tool_parser,
            model_name=name,
            own_thread=self.own_thread,
        )


def agent_options(config: Config, agent: str | None = None) -> AgentOptions | None:
    """The config's agent program (`agent` where given, else `run.agent`) and its
    settings; None without one."""
    run = config.run
    agent = agent or run.agent
    if agent is None:
        return None
    kwargs = run.env_kwargs
    return AgentOptions(
        agent,
        run.agent_concurrency,
        run.agent_timeout_s,
        kwargs.get("tool_format", "auto"),
        kwargs.get("tool_parser"),
    )


class AgentPlayer:
    """A `Player` (`agentgym.rollout.player`) whose episodes an agent program plays: it
    serves the policy it is given on loopback, and the agent calls it.

    The server starts at the first `play` and serves that policy until `close`; a `play`
    with another policy serves that one instead (a new server).

    Args:
        concurrency: Most episodes whose agents run at once (`run.agent_concurrency`).
        timeout_s: Seconds an agent's episode may take (`run.agent_timeout_s`).
    """

    def __init__(
        self,
        agent: AgentFn,
        tokenizer: PreTrainedTokenizerBase,
        *,
        concurrency: int = 16,
        timeout_s: float = 3600.0,
        tool_format: str = "auto",
        tool_parser: str | None = None,
        model_name: str = "agentgym",
        own_thread: bool = True,
    ):
        require_serve("run.agent (the endpoint an agent calls)")
        self.own_thread = own_thread
        self.agent, self.tokenizer = agent, tokenizer
        self.concurrency, self.timeout_s = concurrency, timeout_s
        self.tool_format, self.tool_parser, self.model_name = tool_format, tool_parser, model_name
        self._served: Policy | None = None

    def serve(self, policy: Policy) -> None:
        """Serves `policy` (as given to `play`) on a free loopback port, unless it is served."""
        if self._served is policy:
            return
        self.close()
        from agentgym.serve.app import Server, create_app  # fastapi, uvicorn: `serve` extra

        self.engine = Engine(as_policy(policy))
        self.service = ChatService(
            self.engine,
            self.tokenizer,
            self.model_name,
            tool_format=self.tool_format,
            tool_parser=self.tool_parser,
        )
        self.server = Server(create_app(self.service)).start()
        self._served = policy

    def play(
        self,
        policy: Policy,
        envs: Sequence[gym.Env],
        submission: Submission,
        versions: Versions | None = None,
    ) -> list[Trajectory]:
        """The submission's episodes, each played by the agent through the endpoint,
        grouped by task. `versions` is asked once: an agent's episode takes new weights
        between episodes, not between turns; each request records the version it was
        sampled with. Without `versions` (a Ray worker, a torchrun rank) the player does
        not know the version, and leaves `token_versions` empty for the caller to stamp."""
        self.serve(policy)
        if versions is not None:
            with self.engine.lock:
                self.engine.version = versions()
        jobs = episode_jobs(envs, submission.specs, submission.group_size)
        # within one play the weights do not change: a turn continues from its episode's
        # kept keys and values, as in the rollout
        with as_policy(policy).reusing_cache():
            played = asyncio.run(self._play_all(jobs, submission.params, submission.max_tokens))
        return played if versions is not None else [_unversioned(t) for t in played]

    async def _play_all(
        self, jobs: list[Job], params: SamplingParams, max_tokens: int | None
    ) -> list[Trajectory]:
        limit = asyncio.Semaphore(self.concurrency)
        # every episode is set up first, so that the agents' first requests arrive together
        # and decode as one batch
        started = [self._start(job, params, max_tokens) for job in jobs]

        async def one(start: _Started | Trajectory) -> Trajectory:
            if isinstance(start, Trajectory):  # its reset failed
                return start
            async with limit:
                return await self._run(start)

        return list(await asyncio.gather(*(one(s) for s in started)))

    def _start(
        self, job: Job, params: SamplingParams, max_tokens: int | None
    ) -> _Started | Trajectory:
        """The episode's env reset, its path on the server opened, its task; or, when the
        reset raised, the episode as an unscorable trajectory."""
        env, spec, group, member = job
        agent_env = cast(AgentEnv, env.unwrapped)
        use_chat_template(env, self.tokenizer)
        try:
            obs, raw = env.reset(**spec.reset_kwargs())
            info = ResetInfo.read(raw)
        except Exception as err:  # a bug in the environment fails this episode, not the run
            task_id = spec.task_id or f"seed={spec.seed}"
            failed = _trajectory(Episode(self.service.recorder()), task_id, group, [], None, 0, {})
            return replace(failed, error=f"env.reset raised {type(err).__name__}: {err}")
        task = agent_env.task
        assert task is not None  # reset loaded it
        seed = params.seed
        streams = None if seed is None else (lambda k: turn_stream(seed, task.task_id, member, k))
        key = self.service.open_episode(streams, params, max_tokens)
        tools = list(info.tools or [])  # OpenAI function tools
        opening = agent_env.agent_opening(list(obs))
        agent_task = AgentTask(task.task_id, opening, tools, task, env)
        return _Started(key, agent_task, group, obs, info)

    async def _run(self, start: _Started) -> Trajectory:
        """Runs the agent on a started episode, on a thread of its own
        (`agentgym.serve.agent_thread`); its trajectory, judged."""
        import openai  # the `serve` extra, checked when the player started

        task = start.task
        url, key = self.server.episode_url(start.key), self.service.episodes[start.key].token

        async def play() -> Any:
            # the episode's key is its client's API key: no other episode's client has it
            client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
            try:
                return await self.agent(client, task)
            finally:
                await client.close()

        name = f"agentgym-agent-{task.id}"
        try:
            ran = run_on_thread(play, self.timeout_s, name) if self.own_thread else None
            (result, error), _ = await (ran or run_here(play, self.timeout_s))
        finally:  # what the agent was given is revoked: its path, its environment
            task._revoked.set()
            episode = self.service.close_episode(start.key)
        if episode.truncated and error is not None:
            # refused past the token budget, the agent gave up: judged on what it said, as
            # the rollout judges an episode cut at the budget
            error, result = None, None
        reward, parts = 0.0, dict[str, float]()
        if error is None:
            assert task._env is not None  # _start gave it
            reward, parts, error = _reward(task._env, task.task, episode, result)
        return _trajectory(
            episode, task.id, start.group, start.opening, start.info, reward, parts, error
        )

    def close(self) -> None:
        """Closes the server (its port) and the engine; the policy is the caller's."""
        if self._served is not None:
            self.server.close()
            self.engine.close()
            self._served = None


def _reward(
    env: gym.Env[Any, Any], task: Task, episode: Episode, result: Any
) -> tuple[float, dict[str, float], str | None]:
    """The agent's number, or the env's judge of its conversation (no further than the
    registered `max_episode_steps`, where the rollout's TimeLimit ends it); or why there
    is none."""
    if isinstance(result, AgentReward):
        values = [result.reward, *result.parts.values()]
        if not all(math.isfinite(v) for v in values):
            return 0.0, {}, f"the agent returned the reward {result.reward} ({result.parts})"
        return float(result.reward), {k: float(v) for k, v in result.parts.items()}, None
    if isinstance(result, bool) or not isinstance(result, int | float | list | None):
        kind = type(result).__name__
        why = f"the agent returned a {kind}; return a number, an AgentReward, the messages, "
        return 0.0, {}, why + "or None"
    if isinstance(result, int | float):
        if not math.isfinite(result):
            return 0.0, {}, f"the agent returned the reward {result}"
        return float(result), {"agent": float(result)}, None
    if not episode.recorder.samples:
        return 0.0, {}, "the agent sent no request"
    messages = result if result is not None else episode.conversation
    try:
        limit = env.spec.max_episode_steps if env.spec is not None else None
        reward, parts = cast(AgentEnv, env.unwrapped).judge(messages, task, max_turns=limit)
    except Exception as err:  # messages the env cannot replay fail the episode
        return 0.0, {}, f"judge() raised {type(err).__name__}: {err}"
    return float(reward), dict(parts), None


def _trajectory(
    episode: Episode,
    task_id: str,
    group: int,
    opening: list[dict[str, Any]],
    info: ResetInfo | None,
    reward: float,
    parts: dict[str, float],
    error: str | None = None,
) -> Trajectory:
    """The episode as a trajectory: its newest sample, with the earlier ones (the agent
    rewrote its history) in `split_samples`; no tokens when the agent sent no request."""
    samples = episode.recorder.samples
    checked, differ = _check_sampled(samples, task_id, group)
    rows = [_sample_row(s, task_id, group) for s in samples]
    main = rows[-1] if rows else _sample_row(Sample([], 0, [], [], (), None), task_id, group)
    said = samples[-1].template if samples else []
    turns = tuple(Turn(m["content"], (), 0.0, {}) for m in said if m["role"] == "assistant")
    return replace(
        main,
        reward=reward,
        reward_parts=parts,
        turns=turns,
        finish_reason=episode.finish_reason,
        truncated=episode.truncated or error is not None,
        prompt_messages=tuple(Message.from_dict(m) for m in opening),
        counts={
            "tool_calls": float(episode.tool_calls),
            "split_samples": float(episode.recorder.split_samples),
            "tokens_checked": float(checked),
            "tokens_resampled": float(differ),
        },
        error=error,
        env=info.env if info else None,
        category=info.category if info else None,
        split_samples=tuple(rows[:-1]),
    )


def _check_sampled(samples: list[Sample], task_id: str, group: int) -> tuple[int, int]:
    """(ids compared, ids that differ) between what each recorded sample trains on and what
    the engine sampled (`agentgym.rollout.samples.resampled`, the rollout's rule); an
    AssertionError naming the episode, the sample and the turn where any differ."""
    checked = differ = 0
    for index, sample in enumerate(samples):
        per_turn = resampled(sample.tokens, sample.spans, sample.sampled)
        checked, differ = checked + sum(map(len, sample.sampled)), differ + sum(per_turn)
        for turn, n in enumerate(per_turn):
            if n:
                raise AssertionError(
                    f"episode {task_id!r} (group {group}), sample {index}, turn {turn}: "
                    f"{n} of the ids it trains on are not the ids the policy sampled"
                )
    return checked, differ


def _unversioned(trajectory: Trajectory) -> Trajectory:
    """`trajectory` and its split samples without the versions the engine recorded."""
    split = tuple(replace(s, token_versions=()) for s in trajectory.split_samples)
    return replace(trajectory, token_versions=(), split_samples=split)


def _sample_row(sample: Sample, task_id: str, group: int) -> Trajectory:
    """One recorded sample as a trajectory row (its reward is the episode's)."""
    return Trajectory(
        task_id=task_id,
        group=group,
        tokens=tuple(sample.tokens),
        loss_mask=tuple(sample.loss_mask),
        logprobs=tuple(sample.logprobs),
        prompt_length=sample.prompt_length,
        reward=0.0,
        reward_parts={},
        turns=(),
        finish_reason="stop",
        truncated=False,
        turn_spans=tuple(sample.spans),
        token_versions=tuple(sample.versions),
        opened_by=sample.opened_by,
    )

"""Runs G episodes per task, batching every live episode into one `generate` call per turn.

The rollout owns the loss mask: ids the policy sampled get mask 1 and keep
their sampler logprobs; everything else (the prompt, environment replies,
template glue between turns) gets mask 0. Sampled ids are kept exactly as
sampled, and only environment text is tokenized, as a chat-template suffix;
special-token text in it (a tool result holding `<|im_end|>`) stays plain text,
never control tokens (`external_text`). The end of a turn is the chat template's
(`agentgym.policy.turn_end`): sampled, it stays in the trajectory with mask 1 and is
taken out of the glue; a turn that ended otherwise (eos, a stop string, the token
budget) gets it from the glue, with mask 0.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, SupportsFloat

import gymnasium as gym
from transformers import PreTrainedTokenizerBase

from agentgym.env.info import ResetInfo, StepInfo
from agentgym.policy.base import Generation, Policy, SamplingParams, as_policy
from agentgym.policy.turn_end import TurnEnd, find_turn_end
from agentgym.rollout.conversation import HistoryRewritten
from agentgym.rollout.conversation import closing_text as closing_text  # part of this module's API
from agentgym.rollout.conversation import continuation_ids as continuation_ids  # (as above)
from agentgym.rollout.conversation import prompt_ids as prompt_ids  # (as above)
from agentgym.rollout.conversation import sampled_text as sampled_text  # (as above)
from agentgym.rollout.conversation import use_chat_template as use_chat_template  # (as above)
from agentgym.rollout.external_text import render as render  # part of this module's API
from agentgym.rollout.guard import EnvTimeoutError, call_on, call_within, each_call
from agentgym.rollout.samples import Sample, check_sampled, close_sample, versions, with_samples
from agentgym.types import Completion, Message, Trajectory, Turn
from agentgym.types import TaskSpec as TaskSpec  # part of this module's API


@dataclass
class _Episode:
    """Mutable state of one live episode while the rollout runs."""

    env: gym.Env
    task_id: str
    group: int
    member: int
    messages: list[dict[str, str]]
    tokens: list[int]
    prompt_length: int
    opening: tuple[Message, ...]
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    spans: list[tuple[int, int]] = field(default_factory=list)
    span_versions: list[int] = field(default_factory=list)  # each span's, where turns name one
    reward: float = 0.0
    finish_reason: str = "stop"
    truncated: bool = False
    done: bool = False
    error: str | None = None
    tools: list[dict[str, Any]] | None = None  # given to the template: the env is native
    env_name: str | None = None  # the member of an env mix that plays it
    category: str | None = None  # the task's category, as the env's reset info gives it
    hung: bool = False  # its env's reset or step timed out: the env is replaced after
    samples: list[Sample] = field(default_factory=list)  # earlier ones: history rewritten
    sampled: list[tuple[int, ...]] = field(default_factory=list)  # each turn's ids, as sampled
    opened_by: str | None = None  # why the sample now open began there (a rewritten history)


TurnBatching = Literal["barrier", "continuous", "ordered"]
"""How turns share the decode batch (`collect`'s `turn_batching`, `run.turn_batching`)."""
_Reset = tuple[list[dict[str, Any]], dict[str, Any]]
"""What `env.reset` returns: the opening messages and the info."""
_Stepped = tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]
"""What `env.step` returns: the reply's messages, reward, terminated, truncated, info."""


def stream(seed: int, ep: _Episode) -> int:
    """The random stream of this episode's next turn: a hash of (seed, task id, member,
    turn). Two policies playing the same held-out task with the same seed draw the same
    uniforms, turn by turn, whatever else is in their batches: their samples are coupled,
    so the per-task difference between them carries far less sampling noise."""
    return turn_stream(seed, ep.task_id, ep.member, len(ep.turns))


def turn_stream(seed: int, task_id: str, member: int, turn: int) -> int:
    """The random stream of `turn` of the `member`-th episode of a group on `task_id`
    (`stream`; an agent's episode through the endpoint draws the same)."""
    name = f"{seed}/{task_id}/{member}/{turn}".encode()
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little")


def _reset(env: gym.Env, spec: TaskSpec, timeout_s: float | None) -> _Reset | Exception:
    """`env.reset` for `spec` (on a worker thread), or the exception it raised or timed out with."""
    try:
        return call_within(lambda: env.reset(**spec.reset_kwargs()), timeout_s, "env.reset")
    except Exception as err:  # a bug in the environment fails this episode, not the run
        return err


def _start(
    env: gym.Env,
    spec: TaskSpec,
    group: int,
    member: int,
    tokenizer: PreTrainedTokenizerBase,
    reset: _Reset | Exception,
) -> _Episode:
    """The episode `env`'s reset began (`reset`: what `_reset` returned)."""
    if isinstance(reset, Exception):
        return _failed_start(env, spec, group, member, reset)
    obs, raw = reset
    info = ResetInfo.read(raw)
    tools = info.native_tools
    prompt = prompt_ids(tokenizer, obs, tools)
    return _Episode(
        env=env,
        task_id=info.task_id,
        group=group,
        member=member,
        messages=list(obs),
        tokens=list(prompt),
        prompt_length=len(prompt),
        opening=tuple(Message.from_dict(m) for m in obs),
        loss_mask=[0] * len(prompt),
        logprobs=[0.0] * len(prompt),
        tools=tools,
        env_name=info.env,
        category=info.category,
    )


def _failed_start(
    env: gym.Env, spec: TaskSpec, group: int, member: int, err: Exception
) -> _Episode:
    """An episode whose reset raised or hung: no tokens, unscorable, done before it began.
    Its task id is the spec's (`collect` gives it its group's, where a member started)."""
    task_id = spec.task_id if spec.task_id is not None else f"seed={spec.seed}"
    ep = _Episode(env, task_id, group, member, [], [], 0, ())
    _fail(ep, err)
    return ep


def _fail(ep: _Episode, err: Exception) -> None:
    """Ends `ep` as unscorable: its env's reset or step raised `err`, or hung."""
    ep.error = f"{type(err).__name__}: {err}"
    ep.hung = isinstance(err, EnvTimeoutError)
    ep.done = ep.truncated = True


def _sampled(
    ep: _Episode, gen: Generation, tokenizer: PreTrainedTokenizerBase, end: TurnEnd
) -> tuple[str, str | None]:
    """Appends one sampled turn (`end`: the template's turn end); its text for the
    environment, and the turn end the glue adds (None where the turn sampled it)."""
    ids = gen.ids
    ep.sampled.append(tuple(ids))
    ep.spans.append((len(ep.tokens), len(ep.tokens) + len(ids)))
    ep.tokens.extend(ids)
    ep.loss_mask.extend([1] * len(ids))
    ep.logprobs.extend(gen.logprobs)
    ep.finish_reason = gen.finish_reason
    # a turn cut at a stop string or at the budget has not sampled the turn end: the glue
    # adds it; so it does after eos, where the template ends turns with another token
    closing = closing_text(tokenizer, ids, end)
    return sampled_text(tokenizer, ids, ep.tools is not None, closing), closing


def _step(ep: _Episode, text: str, timeout_s: float | None) -> _Stepped | Exception:
    """`env.step` with the sampled turn (on a worker thread), or the exception it raised or
    timed out with."""
    finish_reason = ep.finish_reason
    try:
        return call_within(
            lambda: ep.env.step(Completion(text, finish_reason)), timeout_s, "env.step"
        )
    except Exception as err:  # a bug in the environment ends this episode, not the run
        return err


def _advance(
    ep: _Episode,
    text: str,
    closing: str | None,
    stepped: _Stepped | Exception,
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Appends the environment's reply to the turn `text` (`stepped`: what `_step`
    returned), or ends the episode as failed."""
    if isinstance(stepped, Exception):
        ep.turns.append(Turn(text, (), 0.0, {}))
        _fail(ep, stepped)
        return
    obs, reward, terminated, truncated, raw = stepped
    info = StepInfo.read(raw)
    parts = info.reward_parts
    ep.turns.append(Turn(text, tuple(Message.from_dict(m) for m in obs), float(reward), parts))
    ep.reward += float(reward)
    for key, value in parts.items():
        ep.parts[key] += value
    _count(ep.counts, info)
    ep.messages.append({"role": "assistant", "content": text})
    ep.truncated = bool(truncated)
    ep.done = bool(terminated or truncated)
    if not ep.done:
        try:
            more = continuation_ids(
                tokenizer, ep.messages, obs, closing is not None, ep.tools, closing
            )
        except HistoryRewritten as note:
            ep.messages.extend(obs)
            close_sample(ep, prompt_ids(tokenizer, ep.messages, ep.tools), str(note))
            return
        ep.messages.extend(obs)
        ep.tokens.extend(more)
        ep.loss_mask.extend([0] * len(more))
        ep.logprobs.extend([0.0] * len(more))


def _count(counts: dict[str, float], info: StepInfo) -> None:
    """Adds a step's tool counters (`tool_calls`, `tool_errors` by kind) to the episode's."""
    if info.tool_calls is not None:
        counts["tool_calls"] += info.tool_calls
    for kind, n in info.tool_errors.items():
        counts[f"tool_errors/{kind}"] += n


def collect(
    envs: Sequence[gym.Env],
    specs: Sequence[TaskSpec],
    group_size: int,
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    max_tokens: int | None = None,
    env_timeout_s: float | None = None,
    env_workers: int | None = None,
    turn_version: Callable[[], int] | None = None,
    turn_batching: TurnBatching = "barrier",
) -> list[Trajectory]:
    """Plays `group_size` episodes of each task spec; returns trajectories grouped by task.

    The live episodes' `reset` calls, and each turn's `step` calls, run at once on
    `env_workers` threads (None: one per episode; 1: one after another), so tools that wait
    on I/O wait together; their results are applied in the episodes' order, so a seed
    gives the same trajectories however many threads (environments that share state
    between episodes, such as a user's tool with a global counter, may need 1).

    An exception raised by an environment's `reset` or `step`, or one of them running
    past `env_timeout_s`, ends that episode only: it is truncated, unscorable, and
    `Trajectory.error` names the exception (an episode whose reset failed has no
    tokens). An environment whose call timed out is replaced in `envs` (a list) by a
    fresh one made from its spec, since the abandoned call may still be running in it.

    Args:
        envs: At least len(specs) * group_size environments, reset here.
        specs: One TaskSpec per group; the group's G episodes reset identically.
        max_tokens: Episodes longer than this (in tokens) are truncated; one whose opening
            already holds as many is truncated before it samples a token.
        env_timeout_s: Seconds one `reset` or `step` may take; None: no limit.
        env_workers: Threads that call the environments at once; None: one per episode.
        turn_version: Called before each turn's `generate` (as the turn joins the batch,
            with continuous batching): the policy version the turn samples with, recorded
            as `Trajectory.token_versions`; None: the caller stamps the versions. It may
            load newer weights first (partial rollouts) with barrier batching only: a
            running batch's keys and values would be stale (`run.turn_batching`).
        turn_batching: "barrier": one `generate` per turn over every live episode, each
            turn waiting for every episode's previous one. "continuous": one decode batch
            that an episode's turn leaves when it ends and its next turn joins when its
            environment replied (continuous batching over turns; the policy needs a
            `turn_stream`, as `HFPolicy` has): no episode waits for another's tool, and the
            rows decoded beside a turn depend on the tools' timing. "ordered": the same
            batch, each reply waited for and the next turn joining at the next decode step,
            so a seed gives the same trajectories.
    """
    jobs = episode_jobs(envs, specs, group_size)
    for env, *_ in jobs:
        use_chat_template(env, tokenizer)
    named, policy = type(policy).__name__, as_policy(policy)
    if turn_batching != "barrier" and not policy.streams_turns:
        raise ValueError(
            f"turn_batching {turn_batching!r} needs a policy with a turn_stream (the "
            f"transformers and vLLM backends); {named} has none: use 'barrier'"
        )
    workers = env_workers or len(jobs)
    with ThreadPoolExecutor(workers, "agentgym-env") if workers > 1 else nullcontext() as pool:
        resets = each_call(pool, lambda job: _reset(job[0], job[1], env_timeout_s), jobs)
        episodes = [_start(*job, tokenizer, reset) for job, reset in zip(jobs, resets, strict=True)]
        _name_failed_starts(episodes)
        for ep in episodes:  # an opening that already fills the budget samples nothing
            _cut(ep, max_tokens)
        limits = (max_tokens, env_timeout_s)
        if turn_batching == "barrier":
            _play(episodes, policy, tokenizer, params, limits, pool, turn_version)
        else:
            ordered = turn_batching == "ordered"
            _stream(episodes, policy, tokenizer, params, limits, pool, ordered, turn_version)
    _replace_hung(envs, episodes)
    return [_finish(ep) for ep in episodes]


Job = tuple[gym.Env, TaskSpec, int, int]
"""One episode to play: its environment, its task, its group and its member in the group."""


def episode_jobs(envs: Sequence[gym.Env], specs: Sequence[TaskSpec], group_size: int) -> list[Job]:
    """The episodes of `group_size` members of each spec's group, each with its environment
    (group g's member k plays in `envs[g * group_size + k]`); ValueError when there are
    fewer environments than episodes."""
    needed = len(specs) * group_size
    if len(envs) < needed:
        raise ValueError(f"playing needs {needed} environments, got {len(envs)}")
    return [
        (envs[g * group_size + k], spec, g, k)
        for g, spec in enumerate(specs)
        for k in range(group_size)
    ]


def _play(
    episodes: list[_Episode],
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    limits: tuple[int | None, float | None],
    pool: ThreadPoolExecutor | None,
    turn_version: Callable[[], int] | None,
) -> None:
    """Plays the started episodes turn by turn: one `generate` over every live episode,
    then their `env.step` calls at once on `pool`, applied in order. `limits`: the
    episode's most tokens, and the seconds an env call may take."""
    (max_tokens, env_timeout_s), end = limits, find_turn_end(tokenizer)
    # a policy that can continues each episode's next turn from its cache
    with policy.reusing_cache():
        while live := [ep for ep in episodes if not ep.done]:
            streams = None if params.seed is None else [stream(params.seed, ep) for ep in live]
            if turn_version is not None:  # it may load newer weights: before the turn samples
                version = turn_version()
                for ep in live:
                    ep.span_versions.append(version)
            gens = policy.generate([ep.tokens for ep in live], params, streams)
            turns = [_sampled(ep, gen, tokenizer, end) for ep, gen in zip(live, gens, strict=True)]
            played = list(zip(live, (text for text, _ in turns), strict=True))
            steps = each_call(pool, lambda pair: _step(*pair, env_timeout_s), played)
            for ep, (text, closing), stepped in zip(live, turns, steps, strict=True):
                _advance(ep, text, closing, stepped, tokenizer)
                _cut(ep, max_tokens)


def _cut(ep: _Episode, max_tokens: int | None) -> None:
    """Truncates an episode that goes on past `max_tokens` tokens."""
    if not ep.done and max_tokens is not None and len(ep.tokens) >= max_tokens:
        ep.done = ep.truncated = True


def _stream(
    episodes: list[_Episode],
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    limits: tuple[int | None, float | None],
    pool: ThreadPoolExecutor | None,
    ordered: bool,
    turn_version: Callable[[], int] | None,
) -> None:
    """Plays the started episodes in one decode batch (`policy.turn_stream`): a turn that
    ended leaves it, its `env.step` runs on `pool`, and the episode's next turn joins as soon
    as the reply is applied (`ordered`: the step's replies waited for, joining at the next
    decode step). Replies back together are applied in the episodes' order."""
    (max_tokens, env_timeout_s), end = limits, find_turn_end(tokenizer)
    with policy.reusing_cache(), policy.turn_stream(params) as turns:

        def join(i: int) -> None:
            ep = episodes[i]
            if turn_version is not None:
                ep.span_versions.append(turn_version())
            turns.add(i, ep.tokens, None if params.seed is None else stream(params.seed, ep))

        for i in (i for i, ep in enumerate(episodes) if not ep.done):
            join(i)
        stepping: dict[Future[_Stepped | Exception], tuple[int, str, str | None]] = {}
        while len(turns) or stepping:
            for i, gen in turns.step():
                text, closing = _sampled(episodes[i], gen, tokenizer, end)
                replying = call_on(pool, _step, episodes[i], text, env_timeout_s)
                stepping[replying] = (i, text, closing)
            if ordered or not len(turns):  # nothing decodes meanwhile: wait
                wait(stepping, return_when="ALL_COMPLETED" if ordered else FIRST_COMPLETED)
            for future in sorted((f for f in stepping if f.done()), key=lambda f: stepping[f][0]):
                i, text, closing = stepping.pop(future)
                _advance(episodes[i], text, closing, future.result(), tokenizer)
                _cut(episodes[i], max_tokens)
                if not episodes[i].done:
                    join(i)


def _name_failed_starts(episodes: list[_Episode]) -> None:
    """Gives an episode whose reset failed the task id its group's other members reset to."""
    started = {ep.group: ep.task_id for ep in episodes if ep.prompt_length}
    for ep in episodes:
        if not ep.prompt_length and ep.group in started:
            ep.task_id = started[ep.group]


def _replace_hung(envs: Sequence[gym.Env], episodes: list[_Episode]) -> None:
    """Swaps each environment whose call timed out for a fresh one made from its spec."""
    hung = {id(ep.env) for ep in episodes if ep.hung}
    if not hung or not isinstance(envs, list):
        return
    for i, env in enumerate(envs):
        if id(env) in hung and env.spec is not None:
            envs[i] = gym.make(env.spec)


def _finish(ep: _Episode) -> Trajectory:
    check_sampled(ep)
    return with_samples(ep, _trajectory(ep))


def _trajectory(ep: _Episode) -> Trajectory:
    return Trajectory(
        task_id=ep.task_id,
        group=ep.group,
        tokens=tuple(ep.tokens),
        loss_mask=tuple(ep.loss_mask),
        logprobs=tuple(ep.logprobs),
        prompt_length=ep.prompt_length,
        reward=ep.reward,
        reward_parts=dict(ep.parts),
        turns=tuple(ep.turns),
        finish_reason=ep.finish_reason,
        truncated=ep.truncated,
        prompt_messages=ep.opening,
        turn_spans=tuple(ep.spans),
        counts=dict(ep.counts),
        error=ep.error,
        reward_error=None if math.isfinite(ep.reward) else f"environment reward is {ep.reward}",
        env=ep.env_name,
        category=ep.category,
        token_versions=versions(ep) if ep.span_versions else (),
        opened_by=ep.opened_by,
    )

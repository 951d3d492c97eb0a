"""`check_agent_env`: the checks agentgym adds to `gymnasium.utils.env_checker.check_env`.

Gymnasium's checker covers the Env API; this one covers the contracts of
`AgentEnv` that GRPO relies on: the G members of a group start from the same
state (seeded determinism, `options={"task_id": ...}`), observations are
well-formed chat messages, the train and test splits are disjoint, a tool environment's
expected calls name its tools (`cheap_checks`, which `agentgym train` runs), steps report
float reward parts, and a finished episode refuses further steps.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym

from agentgym.env.core import SPLITS, AgentEnv, Split
from agentgym.env.spaces import ChatMessages
from agentgym.env.tool_env import ToolEnv
from agentgym.types import Message


class AgentEnvCheckError(AssertionError):
    """An environment breaks one of agentgym's environment contracts."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AgentEnvCheckError(message)


def _check_messages(obs: object, where: str, *, nonempty: bool) -> None:
    """Observations are lists of chat-message dicts that `Message.from_dict` accepts."""
    _require(isinstance(obs, list), f"{where}: observation is {type(obs).__name__}, not a list")
    assert isinstance(obs, list)  # for the type checker: _require raised otherwise
    _require(not nonempty or len(obs) > 0, f"{where}: no opening messages")
    for i, message in enumerate(obs):
        _require(isinstance(message, dict), f"{where}: message {i} is not a dict")
        try:
            Message.from_dict(message)
        except ValueError as err:
            raise AgentEnvCheckError(f"{where}: message {i}: {err}") from err
    _require(ChatMessages().contains(obs), f"{where}: observation not in ChatMessages: {obs!r}")


def _check_seeded_determinism(make_env: Callable[[], gym.Env], seeds: tuple[int, ...]) -> None:
    """The same seed gives the same task and messages in two fresh environments."""
    for seed in seeds:
        for split in ("train", "test"):
            a = make_env().reset(seed=seed, options={"split": split})
            b = make_env().reset(seed=seed, options={"split": split})
            _require(
                a[0] == b[0] and a[1]["task_id"] == b[1]["task_id"],
                f"reset(seed={seed}, split={split!r}) differs between two fresh environments",
            )
            _check_messages(a[0], f"reset(seed={seed}, split={split!r})", nonempty=True)
            _require(a[1].get("split") == split, f"info['split'] is not {split!r}")


def _check_task_id_option(env: gym.Env, seed: int) -> None:
    """`options={"task_id": id}` reproduces the episode that `seed` started."""
    obs, info = env.reset(seed=seed)
    again, info2 = env.reset(options={"task_id": info["task_id"]})
    _require(
        obs == again and info2["task_id"] == info["task_id"],
        f"reset(options={{'task_id': {info['task_id']!r}}}) does not reproduce the task",
    )


def _sampled_ids(env: AgentEnv, split: Split, sample: int) -> list[str]:
    n = env.num_tasks(split)
    _require(n > 0, f"num_tasks({split!r}) is {n}")
    return [env.task_id(split, i) for i in range(0, n, max(1, n // sample))][:sample]


def _check_disjoint_splits(env: AgentEnv, sample: int) -> None:
    """Train and test task ids, and their prompts, do not overlap (on a sample)."""
    ids = {split: _sampled_ids(env, split, sample) for split in SPLITS}
    shared = set(ids["train"]) & set(ids["test"])
    _require(not shared, f"task ids in both splits: {sorted(shared)[:5]}")
    prompts = {split: {env.load_task(t).prompt for t in ids[split]} for split in ids}
    both = prompts["train"] & prompts["test"]
    _require(not both, f"{len(both)} sampled train prompts are test prompts: {sorted(both)[:2]}")


def _check_expected_calls(env: gym.Env, sample: int) -> None:
    """A tool environment's expected calls name tools that their task offers (on a sample)."""
    agent = env.unwrapped
    if not isinstance(agent, ToolEnv):
        return
    for split in SPLITS:
        for task_id in _sampled_ids(agent, split, sample):
            env.reset(options={"task_id": task_id})
            assert agent.task is not None  # reset loaded it
            expected = {c.name for c in agent.expected_calls(agent.task)}
            if not expected:
                continue
            offered = {s.get("function", s).get("name") for s in agent.tools()}
            missing = sorted(expected - offered)
            _require(
                not missing,
                f"task {task_id!r} expects calls of {missing}, which it does not offer; its "
                f"tools: {sorted(offered)}",
            )


def cheap_checks(env: gym.Env, sample: int = 16) -> None:
    """The checks that load tasks but play no episode, which `agentgym train` runs before a
    model loads: both splits hold tasks, their ids and prompts are disjoint, and a tool
    environment's expected calls name tools the task offers (on `sample` tasks a split)."""
    agent = env.unwrapped
    _require(isinstance(agent, AgentEnv), f"{type(agent).__name__} is not an agentgym.AgentEnv")
    assert isinstance(agent, AgentEnv)  # for the type checker: _require raised otherwise
    _check_disjoint_splits(agent, sample)
    _check_expected_calls(env, sample)


def _check_episode(env: gym.Env, seed: int, max_steps: int) -> None:
    """Steps report float rewards and reward parts; a terminated episode raises on step."""
    _, info = env.reset(seed=seed)
    for t in range(max_steps):
        obs, reward, terminated, truncated, step_info = env.step(env.action_space.sample())
        where = f"step {t} of task {info['task_id']!r}"
        _check_messages(obs, where, nonempty=False)
        _require(isinstance(reward, float), f"{where}: reward is {type(reward).__name__}")
        _require(
            isinstance(terminated, bool) and isinstance(truncated, bool),
            f"{where}: terminated and truncated must be bools",
        )
        parts = step_info.get("reward_parts")
        _require(isinstance(parts, dict), f"{where}: info['reward_parts'] missing")
        assert isinstance(parts, dict)  # for the type checker: _require raised otherwise
        for key, value in parts.items():
            _require(
                isinstance(key, str) and isinstance(value, float),
                f"{where}: reward part {key!r} is {type(value).__name__}, not float",
            )
        if terminated:
            try:
                env.step(env.action_space.sample())
            except RuntimeError:
                return
            raise AgentEnvCheckError(f"{where}: step() after termination did not raise")
        if truncated:
            return  # a time limit ended the episode; the env itself never finished


def check_agent_env(
    env: gym.Env,
    make_env: Callable[[], gym.Env] | None = None,
    *,
    seeds: tuple[int, ...] = (0, 1, 123),
    sample: int = 32,
    max_steps: int = 32,
) -> None:
    """Checks `env` against agentgym's environment contracts; raises AgentEnvCheckError.

    Args:
        env: An `AgentEnv`, wrapped or not.
        make_env: Builds a fresh copy of `env`, for the determinism check.
            Defaults to `gymnasium.make(env.spec)`; without a spec, to reusing
            `env` itself.
        seeds: The seeds whose resets are compared.
        sample: How many task ids per split the disjointness check loads.
        max_steps: How many sampled actions an episode may take; the
            step-after-termination check runs only if one terminates by then.
    """
    agent_env = env.unwrapped
    _require(
        isinstance(agent_env, AgentEnv),
        f"{type(agent_env).__name__} is not an agentgym.AgentEnv",
    )
    assert isinstance(agent_env, AgentEnv)  # for the type checker: _require raised otherwise
    if make_env is None:
        spec = env.spec
        make_env = (lambda: gym.make(spec)) if spec is not None else (lambda: env)
    _check_seeded_determinism(make_env, seeds)
    for seed in seeds:
        _check_task_id_option(env, seed)
        _check_episode(env, seed, max_steps)
    cheap_checks(env, sample)
    if agent_env.render_mode == "ansi":
        _require(isinstance(env.render(), str), "render() in 'ansi' mode did not return a str")

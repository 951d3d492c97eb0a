"""`EnvMix` (`agentgym/Mix-v0`): several agent environments as one, each task from one member.

A run with `run.envs: [{env: math, weight: 1}, {env: tool_call, weight: 2}]` trains on
this env. A reset with a seed picks the member by weight from that seed (so the G
episodes of a group, which share their seed, share their member, and the draw follows
the run's seeded stream: resuming replays it exactly), then resets the member with the
same seed. Task ids are "<member name>:<member's task id>", e.g. "math:chain_sum/test/4";
`info["env"]` names the member, which the rollout keeps on each trajectory for the
per-environment metrics. A member's own `TimeLimit` bounds its episodes.

The test split interleaves the members' test tasks, so the first k held-out ids cover
every member (an evenly split selection), whatever their weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np

from agentgym.env.core import SPLITS, AgentEnv, Split, Task, make_env

DEFAULT_MIX: tuple[Mapping[str, Any], ...] = ({"env": "math"}, {"env": "tool_call"})
"""What `gym.make("agentgym/Mix-v0")` plays without `envs`: math and tool calls, equally."""
RESERVED_NAMES = frozenset({"errors", "first_error"})  # taken by env/errors, env/first_error
ENTRY_KEYS = ("env", "weight", "env_kwargs", "name")


@dataclass
class Member:
    """One environment of a mix: its name (in task ids and metrics), weight and instance."""

    name: str
    weight: float
    env: gym.Env

    @property
    def agent(self) -> AgentEnv:
        agent: AgentEnv = self.env.unwrapped  # type: ignore[assignment]  # make_env checked it
        return agent


def member_name(entry: Mapping[str, Any]) -> str:
    """An entry's name: its "name", else its env's last path part ("tool_call", "X-v0")."""
    name = entry.get("name") or str(entry["env"]).replace(":", "/").rsplit("/", 1)[-1]
    return str(name)


def check_entries(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The entries, checked: each {env, weight > 0, env_kwargs, name}, names unique;
    ValueError naming the entry and field otherwise."""
    if isinstance(entries, Mapping | str) or not entries:
        raise ValueError("envs must be a non-empty list of {env, weight, env_kwargs, name}")
    out, names = [], set()
    for i, entry in enumerate(entries):
        where = f"envs[{i}]"
        if not isinstance(entry, Mapping) or "env" not in entry:
            raise ValueError(f"{where} must be a mapping with an 'env' key, got {entry!r}")
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise ValueError(
                f"{where} has unknown key(s) {unknown}; valid: {', '.join(ENTRY_KEYS)}"
            )
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise ValueError(f"{where}.weight={weight!r}; valid: a number > 0")
        if not np.isfinite(weight):
            raise ValueError(f"{where}.weight={weight!r}; valid: a finite number > 0")
        name = member_name(entry)
        if name in names or name in RESERVED_NAMES or not name.replace("-", "_").isidentifier():
            raise ValueError(
                f"{where}: name {name!r} is taken or not usable in metric keys; give each "
                "env a distinct 'name' of letters, digits, '_' and '-'"
            )
        names.add(name)
        kwargs = entry.get("env_kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"{where}.env_kwargs must be a mapping, got {kwargs!r}")
        entry = {"env": str(entry["env"]), "weight": float(weight), "env_kwargs": dict(kwargs)}
        out.append({**entry, "name": name})
    return out


def pick(seed: int | None, weights: Sequence[float]) -> int:
    """The member a reset seed picks, with probability proportional to its weight: a uniform
    drawn from a hash of the seed, so the same seed picks the same member anywhere."""
    digest = hashlib.blake2b(f"agentgym-mix/{seed}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "little") / 2**64
    bounds = np.cumsum(weights) / sum(weights)
    return min(int(np.searchsorted(bounds, u, side="right")), len(weights) - 1)


class EnvMix(AgentEnv):
    """Several agent environments as one (see the module): reset and step are the chosen
    member's; the task hooks (`num_tasks`, `task_id`, `load_task`, `demonstration`) speak
    the mix's task ids.

    Args:
        envs: The members: each {"env": name or id, "weight": 1.0, "env_kwargs": {...},
            "name": for task ids and metrics (default: the env's last path part)}; None
            for `DEFAULT_MIX`.
        render_mode: None or "ansi" (each member renders its own episodes).
    """

    def __init__(
        self, envs: Sequence[Mapping[str, Any]] | None = None, render_mode: str | None = None
    ):
        super().__init__(render_mode=render_mode)
        entries = check_entries(DEFAULT_MIX if envs is None else envs)
        for entry in entries if render_mode is not None else ():
            entry["env_kwargs"] = {**entry["env_kwargs"], "render_mode": render_mode}
        self.members: list[Member] = []
        try:
            for e in entries:
                self.members.append(
                    Member(e["name"], e["weight"], make_env(e["env"], **e["env_kwargs"]))
                )
        except Exception:
            self.close()
            raise
        self.by_name = {m.name: m for m in self.members}
        self.current: Member | None = None
        self.difficulty_levels = min(m.agent.difficulty_levels for m in self.members)

    # -- the AgentEnv hooks that preflight, held-out ids and SFT read --------------------

    def num_tasks(self, split: Split) -> int:
        return sum(m.agent.num_tasks(split) for m in self.members)

    def task_id(self, split: Split, index: int) -> str:
        """The members' tasks taking turns: index 0 is the first member's first task."""
        counts = [m.agent.num_tasks(split) for m in self.members]
        if not 0 <= index < sum(counts):
            raise IndexError(f"task index {index} out of range 0..{sum(counts) - 1}")
        depth = 0
        while True:
            here = [i for i, c in enumerate(counts) if c > depth]
            if index < len(here):
                member = self.members[here[index]]
                return f"{member.name}:{member.agent.task_id(split, depth)}"
            index -= len(here)
            depth += 1

    def split_id(self, task_id: str) -> tuple[Member, str]:
        """The member a task id names, and the member's own id; KeyError naming it if none."""
        name, sep, inner = task_id.partition(":")
        if not sep or name not in self.by_name:
            raise KeyError(
                f"task id {task_id!r} names no member of this mix; ids read "
                f"'<member>:<task id>' with member one of {', '.join(self.by_name)}"
            )
        return self.by_name[name], inner

    def load_task(self, task_id: str) -> Task:
        member, inner = self.split_id(task_id)
        return replace(member.agent.load_task(inner), task_id=task_id)

    def demonstration(self, task: Task) -> list[str]:
        member, inner = self.split_id(task.task_id)
        return member.agent.demonstration(replace(task, task_id=inner))

    def select_difficulty(self, level: int | None) -> None:
        """Sets every member's level (a reset passes its option on to the member it picks)."""
        for member in self.members:
            member.agent.select_difficulty(level)

    def use_chat_template(self, tokenizer: Any) -> None:
        """Passes the tokenizer on to the members that speak the model's own tool format."""
        for member in self.members:
            bind = getattr(member.agent, "use_chat_template", None)
            if bind is not None:
                bind(tokenizer)

    # -- Gymnasium API -------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        gym.Env.reset(self, seed=seed)  # seeds np_random; the member picks the task
        options = dict(options or {})
        if "task_id" in options:
            member, options["task_id"] = self.split_id(options["task_id"])
        else:
            if options.get("split", "train") not in SPLITS:
                raise ValueError(f"reset option 'split' is {options['split']!r}; valid: {SPLITS}")
            draw = seed if seed is not None else int(self.np_random.integers(2**31 - 1))
            member = self.members[pick(draw, [m.weight for m in self.members])]
            seed = draw
        self.current = member
        obs, info = member.env.reset(seed=seed, options=options)
        inner = member.agent.task
        self.task = (
            None if inner is None else replace(inner, task_id=f"{member.name}:{inner.task_id}")
        )
        return obs, self._mark(info)

    def step(self, action: str) -> tuple[list[dict[str, str]], float, bool, bool, dict[str, Any]]:
        if self.current is None:
            raise RuntimeError("step() called before reset()")
        obs, reward, terminated, truncated, info = self.current.env.step(action)
        return obs, float(reward), terminated, truncated, self._mark(info)

    def agent_opening(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The opening as the current member gives it to an agent program."""
        return messages if self.current is None else self.current.agent.agent_opening(messages)

    def turn_text(self, message: Mapping[str, Any]) -> str:
        """An assistant message as the current member reads an action."""
        if self.current is None:
            return super().turn_text(message)
        return self.current.agent.turn_text(message)

    def render(self) -> str | None:
        text = None if self.current is None else self.current.env.render()
        return text if isinstance(text, str) else None

    def _mark(self, info: dict[str, Any]) -> dict[str, Any]:
        assert self.current is not None  # reset chose it
        info = dict(info)
        info["env"] = self.current.name
        if "task_id" in info:
            info["task_id"] = f"{self.current.name}:{info['task_id']}"
        return info

    def close(self) -> None:
        for member in self.members:
            member.env.close()
        super().close()

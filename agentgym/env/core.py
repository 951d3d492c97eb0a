"""`AgentEnv`: a Gymnasium environment whose observations are chat messages.

An episode is a conversation. `reset` returns the opening messages (system and
user); each `step` takes the assistant's text and returns the new messages the
environment adds (tool results, feedback), the reward, and Gymnasium's
`terminated` / `truncated` flags. Episode length limits come from
`gymnasium.register(..., max_episode_steps=N)`, as for any Gymnasium env.

Subclasses supply the tasks and the judging through four hooks:
`num_tasks`, `task_id`, `load_task` and `respond` (plus, optionally,
`initial_messages`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import gymnasium as gym

from agentgym.env.spaces import ChatMessages, Utterance
from agentgym.types import Message

Split = Literal["train", "test"]
SPLITS: tuple[Split, ...] = get_args(Split)
RESET_OPTIONS = ("split", "task_id", "difficulty")


@dataclass(frozen=True)
class Task:
    """One problem an episode is about: the user's prompt and what counts as solving it."""

    task_id: str
    prompt: str
    answer: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Feedback:
    """What the environment says back to one assistant action."""

    messages: tuple[Message, ...]
    reward: float
    reward_parts: Mapping[str, float]
    terminated: bool
    info: Mapping[str, Any] = field(default_factory=dict)


class AgentEnv(gym.Env[list[dict[str, str]], str]):
    """Base class of agentgym environments: chat-message observations, text actions.

    Args:
        system_prompt: The system message that opens every episode; None for none.
        render_mode: None or "ansi" (the conversation so far, as text).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}
    default_system_prompt: str | None = None
    difficulty_levels: int = 1
    """Levels of the reset option `difficulty` (1 to this); 1: the env has none to choose."""
    agent_program: ClassVar[str | None] = None
    """The agent program (`module:function`, `run.agent`'s form) that must play this env's
    episodes, where they are played by something other than `step()` (a harness of its
    own); None: any player. `make_player` chooses it (`env_agent_program`)."""

    def __init__(self, system_prompt: str | None = None, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r}; valid: None, "
                + ", ".join(repr(m) for m in self.metadata["render_modes"])
            )
        self.render_mode = render_mode
        self.system_prompt = (
            system_prompt if system_prompt is not None else self.default_system_prompt
        )
        self.observation_space = ChatMessages()
        self.action_space = Utterance()
        self.task: Task | None = None
        self.messages: list[Message] = []
        self._done = True

    # -- hooks for subclasses ------------------------------------------------

    def num_tasks(self, split: Split) -> int:
        """How many tasks the split holds."""
        raise NotImplementedError(f"{type(self).__name__} must implement num_tasks(split)")

    def task_id(self, split: Split, index: int) -> str:
        """The id of the split's `index`-th task (0 <= index < num_tasks(split))."""
        raise NotImplementedError(f"{type(self).__name__} must implement task_id(split, index)")

    def load_task(self, task_id: str) -> Task:
        """The task with this id; raises KeyError naming the id when there is none."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_task(task_id)")

    def respond(self, action: str) -> Feedback:
        """Judges one assistant action against `self.task`."""
        raise NotImplementedError(f"{type(self).__name__} must implement respond(action)")

    def initial_messages(self, task: Task) -> list[Message]:
        """The messages that open an episode on `task`."""
        opening = [Message("system", self.system_prompt)] if self.system_prompt else []
        return [*opening, Message("user", task.prompt)]

    def demonstration(self, task: Task) -> list[str]:
        """A correct episode on `task`, as the assistant's turns: SFT warm-up data."""
        raise NotImplementedError(
            f"{type(self).__name__} has no demonstrations; implement demonstration(task) for sft"
        )

    def tools(self) -> list[dict[str, Any]]:
        """JSON schemas of the tools the agent may call; none by default."""
        return []

    def select_difficulty(self, level: int | None) -> None:
        """Serves the next episode's tasks at `level` (the reset option `difficulty`), or at
        the env's own level when None; the task hooks then speak that level's tasks.
        Envs with `difficulty_levels` > 1 override this; the rest have only None."""
        if level is not None:
            raise ValueError(
                f"reset option difficulty={level!r}: {type(self).__name__} has no difficulty "
                "levels; leave the option out (run.curriculum needs an env that has them)"
            )

    # -- Gymnasium API -------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Starts an episode on a task chosen by `seed`, or named by `options["task_id"]`.

        Options:
            split: "train" (default) or "test"; the two hold disjoint tasks.
            task_id: a task id, as returned in `info["task_id"]`; overrides the seed.
            difficulty: the level this episode's task is drawn at or named in (envs with
                `difficulty_levels` > 1; a curriculum sets it); default: the env's own.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - set(RESET_OPTIONS)
        if unknown:
            valid = ", ".join(RESET_OPTIONS)
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; valid: {valid}")
        self.select_difficulty(options.get("difficulty"))
        split = options.get("split", "train")
        if split not in SPLITS:
            raise ValueError(f"reset option 'split' is {split!r}; valid: {', '.join(SPLITS)}")
        if "task_id" in options:
            task_id = options["task_id"]
        else:
            task_id = self.task_id(split, int(self.np_random.integers(self.num_tasks(split))))
        self.task = self.load_task(task_id)
        self.messages = self.initial_messages(self.task)
        self._done = False
        split = self.task.metadata.get("split", split)
        info = {"task_id": self.task.task_id, "split": split, "tools": self.tools()}
        return [m.to_dict() for m in self.messages], info

    def step(self, action: str) -> tuple[list[dict[str, str]], float, bool, bool, dict[str, Any]]:
        """Takes the assistant's text; returns the new messages, reward and flags."""
        if self._done or self.task is None:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        if not isinstance(action, str):
            raise TypeError(
                f"action must be the assistant's text (str), got {type(action).__name__}"
            )
        feedback = self.respond(action)
        self.messages.append(Message("assistant", action))
        self.messages.extend(feedback.messages)
        self._done = feedback.terminated
        info = {"task_id": self.task.task_id, "reward_parts": dict(feedback.reward_parts)}
        info.update(feedback.info)
        obs = [m.to_dict() for m in feedback.messages]
        return obs, float(feedback.reward), feedback.terminated, False, info

    # -- judging a conversation played elsewhere ---------------------------------

    def judge(
        self, messages: Sequence[Mapping[str, Any]], task: Task, *, max_turns: int | None = None
    ) -> tuple[float, dict[str, float]]:
        """The reward of a conversation on `task` played outside this env (an agent program
        through `agentgym serve`), in OpenAI's shape, and its parts.

        The default replays it: a fresh episode on the task, each assistant message (its
        content, and its `tool_calls` as the env's format writes them: `turn_text`) stepped
        in order until the episode ends, the rewards summed. Tool and user messages are not
        read: the env answers each turn itself (a `ToolEnv` runs the calls again, in the
        task's world). An env whose reward reads the conversation otherwise overrides it.
        `max_turns` ends the replay there, as the registered `max_episode_steps` (Gymnasium's
        TimeLimit wrapper, which a replay on the bare env does not pass through) ends an
        episode.
        """
        self.reset(options={"task_id": task.task_id})
        total, parts = 0.0, dict[str, float]()
        turns = [m for m in messages if m.get("role") == "assistant"]
        for message in turns[:max_turns]:
            _, reward, terminated, truncated, info = self.step(self.turn_text(message))
            total += reward
            for key, value in info.get("reward_parts", {}).items():
                parts[key] = parts.get(key, 0.0) + float(value)
            if terminated or truncated:
                break
        return total, parts

    def agent_opening(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The opening `reset` gave, as an agent program sends it to the endpoint with the
        env's tools: the same here; a `ToolEnv` in a text format leaves out its tools'
        description, which the endpoint writes from the request's `tools=`."""
        return messages

    def turn_text(self, message: Mapping[str, Any]) -> str:
        """An assistant message in OpenAI's shape as this env reads an action: its text
        content (text parts joined). A `ToolEnv` writes its `tool_calls` after it."""
        content = message.get("content") or ""
        if isinstance(content, list):
            return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        return str(content)

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m.role}] {m.content}" for m in self.messages)


def interleave(families: Sequence[str], index: int, total: int) -> tuple[str, int]:
    """(family, index within it) of a split's `index`-th task when families take turns.

    Turn-taking makes a seeded draw pick every family equally often.
    Raises IndexError unless 0 <= index < total.
    """
    if not 0 <= index < total:
        raise IndexError(f"task index {index} out of range 0..{total - 1}")
    return families[index % len(families)], index // len(families)


def check_difficulty(difficulty: Any, levels: int) -> int:
    """`difficulty` if it is a level from 1 to `levels`; ValueError naming the range otherwise."""
    if (
        isinstance(difficulty, bool)
        or not isinstance(difficulty, int)
        or not 1 <= difficulty <= levels
    ):
        raise ValueError(f"difficulty={difficulty!r}; valid: an int from 1 to {levels}")
    return difficulty


SHORT_NAMES = {
    "math": "agentgym/Math-v0",
    "code": "agentgym/Code-v0",
    "tool_call": "agentgym/ToolCall-v0",
    "tasks": "agentgym/Tasks-v0",
    "function_calls": "agentgym/FunctionCalls-v0",
    "openenv": "agentgym/OpenEnv-v0",
}
"""The CLI's short names of the built-in environments (`import agentgym` registers them)."""


class UnknownEnvError(ValueError):
    """An environment name that is neither a short name nor a registered id."""


def resolve_env_id(name: str) -> str:
    """Maps a short name (`math`), a registered id, or `module:Env-v0` to a Gymnasium id."""
    if name in SHORT_NAMES:
        return SHORT_NAMES[name]
    if ":" in name or name in gym.registry:
        return name
    ours = sorted(k for k in gym.registry if k.startswith("agentgym/"))
    raise UnknownEnvError(
        f"unknown environment {name!r}. Short names: {', '.join(sorted(SHORT_NAMES))}; "
        f"agentgym ids: {', '.join(ours)}; or any registered Gymnasium id, or "
        "'module:Env-v0' to import a module that registers it."
    )


PREFIXES = {
    "verifiers": ("agentgym/Verifiers-v0", "module"),
    "harbor": ("agentgym/Harbor-v0", "folder"),
}
"""Names that carry their argument: `verifiers:<module>` and `harbor:<folder>` make the env
on the left with the part after the colon as the keyword argument on the right."""


def split_env_name(name: str) -> tuple[str, dict[str, str]]:
    """A Gymnasium id and the keyword arguments the name carries (`harbor:tasks/` ->
    `agentgym/Harbor-v0`, `{"folder": "tasks/"}`); other names resolve as `resolve_env_id`."""
    prefix, colon, rest = name.partition(":")
    if colon and prefix in PREFIXES:
        env_id, field = PREFIXES[prefix]
        if not rest:
            raise UnknownEnvError(
                f"environment {name!r} names no {field}: write '{prefix}:<{field}>'"
            )
        return env_id, {field: rest}
    return resolve_env_id(name), {}


def make_env(name: str, **kwargs: Any) -> gym.Env:
    """`gymnasium.make` on a resolved name; the env must speak chat messages and text."""
    env_id, carried = split_env_name(name)
    for key, value in carried.items():
        if kwargs.get(key, value) != value:
            raise UnknownEnvError(
                f"environment {name!r} names {key}={value!r} and run.env_kwargs.{key} is "
                f"{kwargs[key]!r}: give it once"
            )
    kwargs = {**kwargs, **carried}
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.Error as err:
        raise UnknownEnvError(f"cannot make environment {name!r}: {err}") from err
    except ModuleNotFoundError as err:
        module = env_id.partition(":")[0] if ":" in env_id else None
        missing = err.name or getattr(err.__cause__, "name", None)  # gymnasium re-raises it
        if module is None or missing is None or not module.startswith(missing):
            raise  # an import inside the env's own module: its traceback says where
        raise UnknownEnvError(
            f"environment {name!r}: cannot import module {module!r} (no module named "
            f"{missing!r}); a module in the current folder needs it on the path: "
            "PYTHONPATH=. agentgym ..."
        ) from None
    if not isinstance(env.observation_space, ChatMessages) or not isinstance(
        env.action_space, Utterance
    ):
        env.close()
        raise UnknownEnvError(
            f"environment {name!r} is not an agent environment: its observation space is "
            f"{env.observation_space} and action space {env.action_space}; agentgym trains on "
            "envs with ChatMessages observations and Utterance actions (subclass AgentEnv)"
        )
    return env


def env_agent_program(name: str) -> str | None:
    """The agent program the environment `name` declares it must be played by
    (`AgentEnv.agent_program`), read from its registration without making it; None where
    it declares none, or where `name` does not resolve (making it then says why)."""
    try:
        env_id, _ = split_env_name(name)
        entry = gym.spec(env_id).entry_point
        creator = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    except Exception:  # an unknown name fails where the env is made, with its own error
        return None
    program = getattr(creator, "agent_program", None)
    return program if isinstance(program, str) else None


def env_doc_line(entry_point: Any) -> str:
    """The first line of a registered env class's docstring (`agentgym envs`); where its
    module needs an extra that is missing, that, so the env is listed all the same."""
    import importlib

    from agentgym.extras import MissingExtraError

    module, _, cls_name = str(entry_point).partition(":")
    try:
        cls = getattr(importlib.import_module(module), cls_name, None)
    except MissingExtraError as err:
        return f"(not installed here: {err})"
    doc = (cls.__doc__ or "").strip() if cls is not None else ""
    paragraph = " ".join(doc.split("\n\n")[0].split())  # the summary, however it wraps
    sentence = re.split(r"(?<=\.)\s", paragraph, maxsplit=1)[0]
    return re.sub(r"\s*\(see the module[^)]*\)|[;,] see the module docstring", "", sentence)

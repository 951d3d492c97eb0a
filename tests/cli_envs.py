"""Environments the CLI tests load through `module:Env-v0`, the way users add their own.

`DigitsEnv`'s reward varies even under a random model (the share of sampled
characters that are digits), so a GRPO step has non-zero advantages to learn
from. `LookupEnv` is a custom tool environment: one `@tool` function.
"""

from __future__ import annotations

import os

import gymnasium as gym

from agentgym.env.core import AgentEnv, Feedback, Task
from agentgym.env.tool_env import ExpectedCall, ToolEnv
from agentgym.tools import tool
from agentgym.types import Message


class DigitsEnv(AgentEnv):
    """Rewards the share of digits in the reply: a dense reward for smoke runs."""

    def num_tasks(self, split):
        return 10

    def task_id(self, split, index):
        return f"digits/{split}/{index}"

    def load_task(self, task_id):
        return Task(task_id=task_id, prompt=f"Write digits only ({task_id}).")

    def respond(self, action):
        share = sum(c.isdigit() for c in action) / max(len(action), 1)
        return Feedback((), reward=share, reward_parts={"digits": share}, terminated=True)


if "cli_envs/Digits-v0" not in gym.registry:
    gym.register(id="cli_envs/Digits-v0", entry_point=DigitsEnv, max_episode_steps=1)


class ChattyDigitsEnv(DigitsEnv):
    """`DigitsEnv` over three turns: each reply is paid its share of digits, and the user
    asks again, whatever the model wrote (multi-turn under a random model)."""

    TURNS = 3
    CALL = '<tool_call>\n{"name": "say", "arguments": {"digits": "42"}}\n</tool_call>'

    def demonstration(self, task):
        """Each turn a call in Hermes's layout (what a template that re-renders calls
        rewrites once the turn is past): an SFT warm-up teaches it to a random model."""
        return [self.CALL] * self.TURNS

    def load_task(self, task_id):
        self.turn = 0
        return super().load_task(task_id)

    def respond(self, action):
        self.turn += 1
        share = sum(c.isdigit() for c in action) / max(len(action), 1)
        again = (Message("user", f"More digits, please ({self.turn})."),)
        last = self.turn == self.TURNS
        return Feedback(() if last else again, reward=share, reward_parts={"digits": share},
                        terminated=last)  # fmt: skip


if "cli_envs/ChattyDigits-v0" not in gym.registry:
    gym.register(id="cli_envs/ChattyDigits-v0", entry_point=ChattyDigitsEnv)


class TaughtDigitsEnv(DigitsEnv):
    """`DigitsEnv` with an answer and demonstrations, for runs with an SFT warm-up and
    held-out evaluations: a reply of digits only is correct."""

    def load_task(self, task_id):
        return Task(task_id=task_id, prompt=f"Write digits only ({task_id}).", answer="42")

    def demonstration(self, task):
        return ["42"]

    def respond(self, action):
        feedback = super().respond(action)
        correct = float(action.strip().isdigit())
        parts = {**feedback.reward_parts, "correctness": correct}
        return Feedback((), reward=feedback.reward, reward_parts=parts, terminated=True)


if "cli_envs/TaughtDigits-v0" not in gym.registry:
    gym.register(id="cli_envs/TaughtDigits-v0", entry_point=TaughtDigitsEnv, max_episode_steps=1)


class LevelsEnv(TaughtDigitsEnv):
    """`TaughtDigitsEnv` with three difficulty levels (the reset option `difficulty`), for
    the curriculum tests: every reply is correct at level 1 and none above it; task ids
    name the level their episode was drawn at ("L2/train/7")."""

    difficulty_levels = 3
    level = 1

    def select_difficulty(self, level):
        self.level = 1 if level is None else level

    def task_id(self, split, index):
        return f"L{self.level}/{split}/{index}"

    def respond(self, action):
        feedback = DigitsEnv.respond(self, action)
        correct = float(self.task.task_id.startswith("L1/"))
        parts = {**feedback.reward_parts, "correctness": correct}
        return Feedback((), reward=feedback.reward, reward_parts=parts, terminated=True)


if "cli_envs/Levels-v0" not in gym.registry:
    gym.register(id="cli_envs/Levels-v0", entry_point=LevelsEnv, max_episode_steps=1)


class PlayedDigitsEnv(DigitsEnv):
    """`DigitsEnv` that notes which process played each episode: a line "pid task_id"
    per reply, in the file AGENTGYM_TEST_PLAYED names (for torchrun's ranks)."""

    def respond(self, action):
        with open(os.environ["AGENTGYM_TEST_PLAYED"], "a") as f:
            f.write(f"{os.getpid()} {self.task.task_id}\n")
        return super().respond(action)


if "cli_envs/PlayedDigits-v0" not in gym.registry:
    gym.register(id="cli_envs/PlayedDigits-v0", entry_point=PlayedDigitsEnv, max_episode_steps=1)


@tool
def lookup(key: str) -> str:
    """Looks a key up in the phone book.

    Args:
        key: The person's name.
    """
    return PHONE_BOOK.get(key, "not found")


PHONE_BOOK = {"ada": "5551", "alan": "5552", "grace": "5553"}
NAMES = {"train": ["ada", "alan"], "test": ["grace"]}


class LookupEnv(ToolEnv):
    """Asks for a phone number that only the `lookup` tool knows."""

    tool_name = "lookup"

    def make_tools(self):
        return [lookup]

    def num_tasks(self, split):
        return len(NAMES[split])

    def task_id(self, split, index):
        return f"{split}/{NAMES[split][index]}"

    def load_task(self, task_id):
        name = task_id.split("/")[1]
        expected = (ExpectedCall(self.tool_name, {"key": name}),)
        return Task(task_id, f"What is {name}'s number?", answer=PHONE_BOOK[name],
                    metadata={"expected_calls": expected})  # fmt: skip


class MiscalledEnv(LookupEnv):
    """Expects a call of a tool it does not offer: `train`'s preflight refuses it."""

    tool_name = "phone_book"


class OverlapDigitsEnv(DigitsEnv):
    """Its train and test prompts are the same: `train`'s preflight refuses it."""

    def load_task(self, task_id):
        return Task(task_id=task_id, prompt=f"Write digits only ({task_id.split('/')[-1]}).")


for env_id, entry, steps in (("cli_envs/Lookup-v0", LookupEnv, 3),
                             ("cli_envs/Miscalled-v0", MiscalledEnv, 3),
                             ("cli_envs/OverlapDigits-v0", OverlapDigitsEnv, 1)):  # fmt: skip
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry, max_episode_steps=steps)


class BenchDigitsEnv(TaughtDigitsEnv):
    """A benchmark's environment as `agentgym.eval.benchmarks` plays one (the harness's
    tests; the real ones are BFCL's, ToolTalk's and τ²'s): categories by name, and with
    `benchmark=True` a `test` split of every task of those categories in their order."""

    SIZES = {"short": 5, "long": 12}

    def __init__(self, categories=None, benchmark=False, **kwargs):
        super().__init__(**kwargs)
        self.categories = list(categories or self.SIZES)
        unknown = [c for c in self.categories if c not in self.SIZES]
        if unknown:
            raise ValueError(f"categories {unknown}; valid: {', '.join(self.SIZES)}")
        self.ids = [f"{c}_{i}" for c in self.categories for i in range(self.SIZES[c])]
        self.scoring = {"checker": "digits only", "benchmark": benchmark}

    def num_tasks(self, split):
        return len(self.ids)

    def task_id(self, split, index):
        return self.ids[index]

    def load_task(self, task_id):
        task = super().load_task(task_id)
        return Task(task_id, task.prompt, task.answer, {"category": task_id.rpartition("_")[0]})


if "cli_envs/BenchDigits-v0" not in gym.registry:
    gym.register(id="cli_envs/BenchDigits-v0", entry_point=BenchDigitsEnv, max_episode_steps=1)

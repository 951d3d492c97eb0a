"""`run.curriculum`: the train tasks' difficulty level, raised as the policy masters each.

The run starts at the first of `levels`. After each step, the step's train
correctness (`correctness_rate`, at the level it trained on) joins a window of
the last `window` steps at this level; when the window is full and its mean
reaches `threshold`, the next step trains one level up, with an empty window.
The last level is kept to the end.

The state is a function of the steps' logged metrics: each step logs the level it
trained on (`curriculum/level`) and its correctness, so a resumed run replays its
checkpoint's history (`Curriculum.replay`) and goes on at the same level, with the
same window, as if it had never stopped. Held-out evaluation, the SFT warm-up's
demonstrations and the closing table stay at the env's own `difficulty`, so that
checkpoints compare on the same tasks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym import records
from agentgym.config import ConfigError, CurriculumConfig
from agentgym.env.core import AgentEnv

TOLERANCE = 1e-9
"""A window's mean this close below the threshold reaches it: (0.9 + 0.9 + 0.6) / 3 is
0.79999... in floating point, and correctness rates are fractions of episodes."""


@dataclass
class Curriculum:
    """Where a curriculum stands: the level index and the correctness window at it."""

    levels: tuple[int, ...]
    threshold: float
    window: int
    stage: int = 0
    """Index of the current level in `levels`."""
    recent: list[float] = field(default_factory=list)
    """Train correctness of the last steps (at most `window`) at the current level."""

    @classmethod
    def from_config(cls, config: CurriculumConfig) -> Curriculum | None:
        """The curriculum at its start; None when `levels` is empty (no curriculum)."""
        if not config.levels:
            return None
        return cls(tuple(config.levels), config.threshold, config.window)

    @property
    def level(self) -> int:
        """The difficulty the next step trains at."""
        return self.levels[self.stage]

    def update(self, correctness: float) -> bool:
        """Adds one step's train correctness; True when it raises the level.

        A step without a correctness figure (NaN: no scorable episode) leaves the
        window as it was.
        """
        if self.stage == len(self.levels) - 1 or math.isnan(correctness):
            return False
        self.recent = [*self.recent, correctness][-self.window :]
        if len(self.recent) < self.window:
            return False
        if sum(self.recent) / self.window < self.threshold - TOLERANCE:
            return False
        self.stage += 1
        self.recent = []
        return True

    def replay(self, history: Iterable[Mapping[str, Any]]) -> Curriculum:
        """Feeds a run's logged steps through `update`, in order; returns self.

        Raises ConfigError when a step trained at another level than the replay
        reaches: the checkpoint was made with another curriculum.
        """
        for metrics in history:
            logged = metrics.get(records.CURRICULUM_LEVEL)
            if logged != self.level:
                raise ConfigError(
                    f"step {metrics.get('step')} trained at curriculum level {logged}, but "
                    f"run.curriculum {self.describe()} puts it at {self.level}: resume with "
                    "the curriculum the run was started with"
                )
            correctness = metrics.get(records.CORRECTNESS_RATE)  # JSON writes NaN as null
            self.update(math.nan if correctness is None else float(correctness))
        return self

    def describe(self) -> str:
        """The settings, as a note and the errors name them."""
        return f"(levels {list(self.levels)}, threshold {self.threshold}, window {self.window})"


def level_problem(levels: Sequence[int], agent: AgentEnv, env_name: str) -> str | None:
    """What is wrong with climbing `levels` in `agent`, or None: the levels must rise
    strictly within the env's 1..`difficulty_levels`, and the env must build each."""
    top = agent.difficulty_levels
    if not levels:
        return None
    if top <= 1:
        return (
            f"{list(levels)}, but env {env_name!r} has no difficulty levels (ToolCall-v0 and "
            "Math-v0 have 5; in run.envs, every member needs them)"
        )
    rising = all(b > a for a, b in zip(levels, levels[1:], strict=False))
    if not rising or levels[0] < 1 or levels[-1] > top:
        return (
            f"{list(levels)}; valid: levels rising strictly from 1 to {top} "
            f"(env {env_name!r}), e.g. {list(range(1, top + 1))}"
        )
    try:
        for level in levels:
            agent.select_difficulty(level)
    except ValueError as err:
        return f"{list(levels)}: env {env_name!r} cannot serve level {level}: {err}"
    finally:
        agent.select_difficulty(None)
    return None

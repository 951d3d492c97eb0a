"""`agentgym/FunctionCalls-v0` (short name `function_calls`): a procedural function-calling
world, seeded, nothing downloaded.

Each task is a row of `world.row` in the shape of published function-calling data: the
user's query, the functions offered (generated APIs: typed parameters with descriptions,
enums, numbers with units, lists, nested objects, optional parameters with defaults;
some schemas in the loose style of published data), and the calls that answer it. The
env judges the model's calls as `agentgym.envs.tasks.calls_env.FunctionCallsEnv` does
(judge-only: one turn; `agentgym.rewards.calls` for the rules and the reward).

`difficulty` 1-5, each its own kind of task (`world` has the details): 1 one function, one
call; 2 choose among 4; 3 two or three parallel calls; 4 some tasks where no function fits
(call nothing), the rest as 2; 5 list and nested-object arguments. A list of levels
(`difficulty=[1, 2]`) interleaves them: task `i` of a split is of level
`levels[i % len(levels)]`. **Train and test are disjoint by API family**, distractors
included, so test correctness measures calls to schemas the model never trained on.

Task ids read `"level<d>/<split>/<index>"`; `seed` picks the world (its APIs and split).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.env.core import SPLITS, Split, Task, check_difficulty
from agentgym.env.templates import ToolFormatName
from agentgym.envs.function_calls import world
from agentgym.envs.tasks.calls_env import FunctionCallsEnv
from agentgym.envs.tasks.table import schemas_of, specs_of
from agentgym.rewards.calls import CallReward, StringMatch

LEVELS = 5


def check_levels(difficulty: Any) -> tuple[int, ...]:
    """The levels `difficulty` names: one level, or a non-empty list of distinct ones."""
    if isinstance(difficulty, list | tuple):
        if not difficulty or len(set(difficulty)) != len(difficulty):
            raise ValueError(
                f"difficulty={difficulty!r}; valid: an int from 1 to {LEVELS}, or a list of "
                "distinct ones"
            )
        return tuple(check_difficulty(d, LEVELS) for d in difficulty)
    return (check_difficulty(difficulty, LEVELS),)


class FunctionCallsWorldEnv(FunctionCallsEnv):
    """Generated APIs and requests: one turn of calls (or none), judged against the expected
    calls; five levels of difficulty (see the module).

    Args:
        difficulty: A level from 1 to 5, or a list of levels to interleave.
        seed: The world: its APIs, their train/test split, the rows.
        string_match, call_reward, tool_format, tool_parser, max_calls_per_turn,
        reward_weights, system_prompt, render_mode: as for `FunctionCallsEnv`.
    """

    difficulty_levels = LEVELS

    def __init__(
        self,
        difficulty: int | Sequence[int] = 1,
        seed: int = 0,
        *,
        string_match: StringMatch = "exact",
        call_reward: CallReward = "seed",
        tool_format: ToolFormatName = "auto",
        tool_parser: str | None = None,
        max_calls_per_turn: int = 8,
        reward_weights: Mapping[str, float] | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise ValueError(f"seed={seed!r}; valid: an int from 0 to 2**31 - 1")
        self.base_levels = self.levels = check_levels(difficulty)
        self.seed = seed
        super().__init__(
            string_match=string_match,
            call_reward=call_reward,
            tool_format=tool_format,
            tool_parser=tool_parser,
            max_calls_per_turn=max_calls_per_turn,
            reward_weights=reward_weights,
            system_prompt=system_prompt,
            render_mode=render_mode,
        )

    def select_difficulty(self, level: int | None) -> None:
        self.levels = self.base_levels if level is None else check_levels(level)

    # -- tasks ------------------------------------------------------------------------

    def num_tasks(self, split: Split) -> int:
        return min(world.num_rows(split, level) for level in self.levels) * len(self.levels)

    def task_id(self, split: Split, index: int) -> str:
        total = self.num_tasks(split)
        if not 0 <= index < total:
            raise IndexError(f"task index {index} out of range 0..{total - 1} of {split!r}")
        level = self.levels[index % len(self.levels)]
        return f"level{level}/{split}/{index // len(self.levels)}"

    def load_task(self, task_id: str) -> Task:
        level, split, index = _parse_id(task_id)
        row = world.row(self.seed, split, level, index)
        return _task(task_id, row)


def _parse_id(task_id: str) -> tuple[int, Split, int]:
    """(level, split, index) of a task id; KeyError naming the shape otherwise."""
    parts = task_id.split("/") if isinstance(task_id, str) else []
    try:
        level_text, split, index_text = parts
        level, index = int(level_text.removeprefix("level")), int(index_text)
        if not level_text.startswith("level") or split not in SPLITS or index < 0:
            raise ValueError
        check_difficulty(level, LEVELS)
    except ValueError:
        raise KeyError(
            f"no task {task_id!r} in FunctionCalls-v0; ids read 'level<d>/<split>/<index>', "
            "e.g. 'level1/train/0'"
        ) from None
    return level, split, index


def _task(task_id: str, row: Mapping[str, Any]) -> Task:
    """The task of a generated row: its schemas made strict, its expected calls read."""
    schemas = schemas_of(row["tools"])
    specs = specs_of(row["expected_calls"], schemas)
    metadata = {
        "schemas": schemas,
        "call_specs": specs,
        "category": row["category"],
        "level": row["level"],
        "api": row["api"],
        "split": task_id.split("/")[1],
    }
    answer = json.dumps([s.demonstration() for s in specs])
    return Task(task_id, row["prompt"], answer=answer, metadata=metadata)

"""`ToolCallEnv`: questions that take a calculator, a SQL database or lookup tools to answer.

Three default task families (see `tasks.py`): `calculator` (long arithmetic),
`sql` (counts and sums over a seeded shop database) and `chain` (a sum from the
database, then tax on it with the calculator); and `purchase`, used only where
named: lookups in a seeded purchasing world through narrow tools, two of them
distractors, then the calculator (`purchase.py`). Each task has one correct
answer and a reference solution, `ToolCallEnv.reference_solution(task_id)`,
whose calls are the expected calls of the "tool" reward part. Arguments are
judged by meaning, not spelling: two expressions match when they have the same
value, two queries when they return the same rows, two lookups when they name
the same thing (case and surrounding whitespace aside).

The reward is `ToolEnv`'s (correctness 1.0, tool 0.5, format 0.1 by default);
register with `max_episode_steps` to bound the turns (6 for `agentgym/ToolCall-v0`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from agentgym.env.core import SPLITS, Split, Task, interleave
from agentgym.env.templates import ToolFormatName
from agentgym.env.tool_env import ExpectedCall, ToolEnv
from agentgym.envs.tool_call.calculator import calculate, same_value
from agentgym.envs.tool_call.problem import LEVELS, check_difficulty
from agentgym.envs.tool_call.purchase import LOOKUP_TOOLS, purchase_tools, same_lookup
from agentgym.envs.tool_call.store import SCHEMA_TEXT, ReadOnlyStore
from agentgym.envs.tool_call.tasks import ALL_FAMILIES, FAMILIES, family_size, problem
from agentgym.tools import Tool, tool
from agentgym.types import ToolCall

if TYPE_CHECKING:
    from agentgym.sandboxes import Sandbox
    from agentgym.sandboxes.contract import SandboxKind

_TASK_ID = re.compile(r"(?P<family>\w+)/(?P<split>\w+)/(?P<index>\d+)")
_TOOLS_OF = {
    "calculator": ("calculator",),
    "sql": ("sql",),
    "chain": ("sql", "calculator"),
    "purchase": ("calculator", *(t.name for t in LOOKUP_TOOLS)),
}


@tool
def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression exactly and returns its value.

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses, e.g. "(12 + 3) * 4.5".
    """
    return calculate(expression)


def _sql(query: str) -> str:
    """Runs one read-only SQLite query on the shop database; returns the rows as a table.

    Args:
        query: A single SELECT statement.
    """
    raise RuntimeError("the sql tool is bound to an environment's store by ToolCallEnv")


SQL_TOOL: Tool = tool(_sql, name="sql")
"""The `sql` tool's schema; each env binds it to its own store (no pydantic model per env)."""


def _same_expression(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    return same_value(expected["expression"], actual.get("expression"))


def _check_families(families: Sequence[str]) -> tuple[str, ...]:
    if isinstance(families, str):
        families = (families,)
    unknown = [f for f in families if f not in ALL_FAMILIES]
    if unknown or not families or len(set(families)) != len(families):
        raise ValueError(
            f"families={tuple(families)!r}; valid: a non-empty subset of {ALL_FAMILIES}, "
            "without repeats"
        )
    return tuple(families)


class ToolCallEnv(ToolEnv):
    """Tool-use questions on arithmetic, a shop database and a purchasing world; several turns.

    Task ids read `"<family>/<split>/<index>"`, e.g. `"calculator/train/17"`.
    The splits interleave the families, so a seed picks any of them with equal
    chance; a family smaller than the largest one repeats within the split.

    Args:
        families: Task families to draw from; default `FAMILIES`, valid: `ALL_FAMILIES`.
        seed: Seed of the problems, of the shop database and of the purchasing world.
        difficulty: 1 (the original tasks) to 5, per family as in `tasks.py`.
        tool_format, tool_parser, mcp_servers, max_turns, max_result_chars,
        max_calls_per_turn, reward_weights, system_prompt, render_mode: as for `ToolEnv`.
        python: Also offer a `python` tool, run in a sandbox (`envs/code/python_tool.py`).
        sandbox: The kind of that sandbox, for `make_sandbox` ("local" or "docker").
    """

    difficulty_levels = LEVELS

    def __init__(
        self,
        families: Sequence[str] = FAMILIES,
        seed: int = 0,
        tool_format: ToolFormatName = "auto",
        max_turns: int | None = None,
        max_result_chars: int = 2000,
        max_calls_per_turn: int = 4,
        reward_weights: Mapping[str, float] | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
        python: bool = False,
        sandbox: str = "local",
        tool_parser: str | None = None,
        mcp_servers: Sequence[Mapping[str, Any]] = (),
        difficulty: int = 1,
    ):
        self.families = _check_families(families)
        self.base_difficulty = self.difficulty = check_difficulty(difficulty)
        self.python = python
        self.sandbox_kind = sandbox
        self.sandbox: Sandbox | None = None  # made on first use when `python` is on
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise ValueError(f"seed={seed!r}; valid: an int from 0 to 2**31 - 1")
        self.seed = seed
        self.store = ReadOnlyStore(seed)
        super().__init__(
            tool_format=tool_format,
            tool_parser=tool_parser,
            mcp_servers=mcp_servers,
            max_turns=max_turns,
            max_result_chars=max_result_chars,
            max_calls_per_turn=max_calls_per_turn,
            reward_weights=reward_weights,
            system_prompt=system_prompt if system_prompt is not None else self._instructions(),
            render_mode=render_mode,
        )

    def _instructions(self) -> str:
        uses = {name for f in self.families for name in _TOOLS_OF[f]}
        text = "Answer the user's question with the help of the tools; never guess a number."
        if "calculator" in uses:
            text += " Do all arithmetic with the calculator tool."
        if "sql" in uses:
            text += (
                " Look data up with the sql tool. The shop database (SQLite) has these "
                f"tables:\n{SCHEMA_TEXT}"
            )
        if "purchase" in self.families:
            text += " Look up items, suppliers and cities with the lookup tools."
        if self.python:
            text += " You may also run Python programs with the python tool."
        return text + "\nGive exact numbers; round only when the question asks you to."

    # -- tools -----------------------------------------------------------------

    def make_tools(self) -> list[Tool]:
        uses = {name for f in self.families for name in _TOOLS_OF[f]}
        tools = [calculator] if "calculator" in uses else []
        if "sql" in uses:
            tools.append(dataclasses.replace(SQL_TOOL, fn=self.store.run))
        if "purchase" in self.families:
            tools.extend(purchase_tools(self.seed))
        if self.python:
            from agentgym.envs.code.python_tool import python_tool
            from agentgym.sandboxes import make_sandbox

            # make_sandbox refuses any other kind
            self.sandbox = make_sandbox(cast("SandboxKind", self.sandbox_kind))
            tools.append(python_tool(self.sandbox))
        return tools

    def _same_rows(self, expected: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
        return self.store.same_result(expected["query"], actual.get("query"))

    def expected_calls(self, task: Task) -> list[ExpectedCall]:
        matchers = {"calculator": _same_expression, "sql": self._same_rows}
        matchers.update((t.name, same_lookup) for t in LOOKUP_TOOLS)
        return [
            ExpectedCall(c.name, c.arguments, matchers[c.name])
            for c in task.metadata["reference_calls"]
        ]

    def reference_solution(self, task_id: str) -> tuple[list[ToolCall], str]:
        """The calls that solve the task, in order, and its final answer."""
        task = self.load_task(task_id)
        return list(task.metadata["reference_calls"]), task.answer

    def demonstration(self, task: Task) -> list[str]:
        """The reference calls, one turn each, then the final answer, in this env's format."""
        calls, answer = self.reference_solution(task.task_id)
        if self.format.name == "react":
            render = self.format.render_call
            turns = [f"Thought: I need the {c.name} tool.\n{render(c)}" for c in calls]
            return [*turns, f"Thought: I have the answer.\nFinal Answer: {answer}"]
        return [*(self.format.render_call(c) for c in calls), f"The answer is \\boxed{{{answer}}}."]

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        self.store.close()
        super().close()

    # -- tasks -----------------------------------------------------------------

    def select_difficulty(self, level: int | None) -> None:
        self.difficulty = self.base_difficulty if level is None else check_difficulty(level)

    def _size(self, family: str, split: Split) -> int:
        return family_size(family, self.seed, split, self.difficulty)

    def num_tasks(self, split: Split) -> int:
        return len(self.families) * max(self._size(f, split) for f in self.families)

    def task_id(self, split: Split, index: int) -> str:
        family, k = interleave(self.families, index, self.num_tasks(split))
        return f"{family}/{split}/{k % self._size(family, split)}"

    def load_task(self, task_id: str) -> Task:
        family, split, index = self._parse_task_id(task_id)
        found = problem(family, self.seed, split, index, self.difficulty)
        metadata = {
            "family": family,
            "split": split,
            "index": index,
            "reference_calls": found.calls,
        }
        return Task(task_id, found.prompt, answer=found.answer, metadata=metadata)

    def _parse_task_id(self, task_id: str) -> tuple[str, Split, int]:
        """(family, split, index) of a task id; KeyError naming the id if it is none."""
        match = _TASK_ID.fullmatch(task_id) if isinstance(task_id, str) else None
        if (
            match is None
            or match["family"] not in self.families
            or match["split"] not in SPLITS
            or int(match["index"]) >= self._size(match["family"], cast(Split, match["split"]))
        ):
            sizes = {f"{f}/{s}": self._size(f, s) for f in self.families for s in SPLITS}
            raise KeyError(
                f"no task {task_id!r}; ids read '<family>/<split>/<index>' with family in "
                f"{self.families}, split in {SPLITS}, index below the family's size {sizes}"
            )
        # the split was checked against SPLITS above
        return match["family"], cast(Split, match["split"]), int(match["index"])

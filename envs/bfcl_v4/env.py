"""`agentgym/BFCL-v0`: BFCL v4's single-turn categories from the bfcl-eval wheel, scored as
BFCL scores them.

The rows are those `python -m agentgym.envs.tasks.bfcl_rows` writes (the published
questions, function docs and possible answers, read in memory from the installed
wheel), judged as `agentgym/Tasks-v0` judges them with `string_match: bfcl`: one turn,
nothing runs, the turn's calls checked by `agentgym.rewards.bfcl`, BFCL's AST checker
ported rule for rule; reward part "correctness" is BFCL's verdict, 1 or 0. The model
sees the functions as the native chat template renders `tools=` where its template
can ("auto"), and a row's own system message where it has one.

Task ids are BFCL's (`simple_python_12`, `live_multiple_3-1-0`); `Task.metadata["category"]`
is BFCL's category name. The 7 rows that BFCL's own checker accepts no call for (the
possible answer contradicts the schema) are left out, each named with BFCL's reason in
`env.skipped` and `env.scoring` (BFCL counts them as failures for every model).

Splits: with `benchmark=True` the test split is every row of the chosen categories in
published order, and the train split is refused by name (a reset naming no split plays
the test split). Otherwise a row is a test row when the
hash of its last user message (`agentgym.envs.tasks.table.hash_splits`, `seed`) falls
below `test_fraction`, so rows that share a question share a split.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.env.core import SPLITS, Split, Task
from agentgym.env.templates import ToolFormatName
from agentgym.envs.tasks.bfcl_rows import (
    CATEGORIES,
    LEFT_OUT,
    bfcl_version,
    category_rows,
    check_categories,
)
from agentgym.envs.tasks.calls_env import FunctionCallsEnv
from agentgym.envs.tasks.table import hash_splits, prompt_of
from agentgym.rewards.bfcl import bfcl_demonstration, unscorable
from agentgym.rewards.calls import CallReward, call_specs
from agentgym.tools.function_tools import openai_function
from agentgym.tools.schema import strict_schema


@dataclass(frozen=True)
class Suite:
    """The tasks of some categories by BFCL id, in published order, and the rows left out."""

    tasks: Mapping[str, Task]
    skipped: Mapping[str, str]


def row_task(row: Mapping[str, Any]) -> Task | str:
    """The task of a BFCL row (see `bfcl_rows`), or why BFCL's checker cannot score it."""
    prompt, messages = prompt_of(row["prompt"])
    schemas = []
    for function in row["tools"]:  # checked, and copied by strict_schema
        schema = openai_function({k: v for k, v in function.items() if k != "parameters"})
        schema["parameters"] = strict_schema(function.get("parameters", {"type": "object"}))
        schemas.append(schema)
    specs = call_specs(row["calls"])
    parameters = {f["name"]: f["parameters"] for f in schemas}
    try:
        demonstration = [bfcl_demonstration(s, parameters.get(s.name)) for s in specs]
    except ValueError:
        return unscorable(specs, parameters) or "BFCL's checker accepts no call"
    metadata = {
        "category": row["category"],
        "messages": messages,
        "schemas": tuple(schemas),
        "call_specs": specs,
    }
    return Task(row["id"], prompt, answer=json.dumps(demonstration), metadata=metadata)


@functools.cache
def bfcl_suite(categories: tuple[str, ...]) -> Suite:
    """The tasks of `categories` (read once per process; the function schemas are checked
    when a task's tools are first built, at its first reset)."""
    tasks: dict[str, Task] = {}
    skipped: dict[str, str] = {}
    for category in categories:
        for row in category_rows(category):
            task = row_task(row)
            if isinstance(task, str):
                skipped[row["id"]] = task
            else:
                tasks[task.task_id] = task
    return Suite(tasks, skipped)


class BfclEnv(FunctionCallsEnv):
    """BFCL v4's single-turn rows, judged by BFCL's checker (see the module).

    Args:
        categories: BFCL's category names (`CATEGORIES`); None: all of them.
        benchmark: Every row a test row, in published order; the train split refused.
        test_fraction: Without `benchmark`, the hash split's share of test rows.
        seed: Without `benchmark`, the hash split's seed.
        call_reward, tool_format, tool_parser, reward_weights, system_prompt, render_mode:
            as for `FunctionCallsEnv` (whose default weights count "tool" and "format" too:
            `reward_weights={"correctness": 1.0}` for BFCL's figure alone).
    """

    def __init__(
        self,
        categories: Sequence[str] | None = None,
        benchmark: bool = False,
        *,
        test_fraction: float = 0.2,
        seed: int = 0,
        call_reward: CallReward = "seed",
        tool_format: ToolFormatName = "auto",
        tool_parser: str | None = None,
        reward_weights: Mapping[str, float] | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        if not isinstance(benchmark, bool):
            raise ValueError(f"benchmark={benchmark!r}; valid: True or False")
        if isinstance(test_fraction, bool) or not (
            isinstance(test_fraction, int | float) and 0 < test_fraction < 1
        ):
            raise ValueError(f"test_fraction={test_fraction!r}; valid: a number between 0 and 1")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise ValueError(f"seed={seed!r}; valid: an int from 0 to 2**31 - 1")
        self.categories = check_categories(categories)
        self.benchmark = benchmark
        suite = bfcl_suite(self.categories)
        self.skipped = dict(suite.skipped)
        ids = list(suite.tasks)
        if benchmark:
            splits = ["test"] * len(ids)
        else:
            splits = hash_splits([suite.tasks[i].prompt for i in ids], test_fraction, seed)
        self.split_ids = {
            s: tuple(i for i, t in zip(ids, splits, strict=True) if t == s) for s in SPLITS
        }
        self.tasks = {
            i: dataclasses.replace(t, metadata={**t.metadata, "split": s})
            for (i, t), s in zip(suite.tasks.items(), splits, strict=True)
        }
        super().__init__(
            string_match="bfcl",
            call_reward=call_reward,
            tool_format=tool_format,
            tool_parser=tool_parser,
            max_calls_per_turn=16,
            reward_weights=reward_weights,
            system_prompt=system_prompt,
            render_mode=render_mode,
        )
        self.split_rule = (
            "benchmark: every row a test row, in published order"
            if benchmark
            else f"hash of the last user message, test_fraction={test_fraction}, seed={seed}"
        )

    @property
    def scoring(self) -> dict[str, Any]:
        """The exact scoring configuration, JSON-able: the data's package and version, the
        checker, the categories and their rows, the rows left out, the split, the format."""
        rows = {c: 0 for c in self.categories}
        for task in self.tasks.values():
            rows[task.metadata["category"]] += 1
        return {
            "benchmark": "BFCL v4 (single-turn)",
            "package": "bfcl-eval",
            "version": bfcl_version(),
            "checker": "bfcl_eval/eval_checker/ast_eval/ast_checker.py (Language.PYTHON), "
            "ported rule for rule in agentgym.rewards.bfcl; irrelevance: right when no call",
            "string_match": "bfcl",
            "correctness": "BFCL's verdict, 1 or 0",
            "categories": list(self.categories),
            "rows": rows,
            "skipped": dict(self.skipped),
            "split": self.split_rule,
            "tool_format": self.templates.requested,
            "tool_format_used": self.format.name,
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """As `FunctionCallsEnv.reset`; with `benchmark`, a reset that names no split (nor a
        task) plays the test split, and one that names "train" is refused."""
        if self.benchmark and not (options and ("split" in options or "task_id" in options)):
            options = {**(options or {}), "split": "test"}
        return super().reset(seed=seed, options=options)

    # -- tasks ------------------------------------------------------------------------

    def num_tasks(self, split: Split) -> int:
        if split == "train" and self.benchmark:
            raise ValueError(
                "agentgym/BFCL-v0 with benchmark=True has no train split: every row is a "
                "test row; valid: split 'test', or benchmark=False for a train/test split"
            )
        return len(self.split_ids[split])

    def task_id(self, split: Split, index: int) -> str:
        ids = self.split_ids[split] if split in SPLITS else ()
        if not 0 <= index < self.num_tasks(split):
            raise IndexError(f"task index {index} out of range 0..{len(ids) - 1} of {split!r}")
        return ids[index]

    def load_task(self, task_id: str) -> Task:
        try:
            return self.tasks[task_id]
        except (KeyError, TypeError):
            why = self.skipped.get(task_id) if isinstance(task_id, str) else None
            raise KeyError(
                f"no task {task_id!r} in agentgym/BFCL-v0"
                + (f" (left out: BFCL cannot score it: {why})" if why else "")
                + f"; ids are BFCL's, e.g. {next(iter(self.tasks), 'simple_python_0')!r}, of "
                f"the categories {', '.join(self.categories)}"
            ) from None


__all__ = ["CATEGORIES", "LEFT_OUT", "BfclEnv", "bfcl_suite", "row_task"]

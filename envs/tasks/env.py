"""`agentgym/Tasks-v0`: tasks from your own data, a prompt and an answer per row.

`make_tasks_env(data=..., ...)` (the registered entry point) reads the data
(`data.py`), checks every row and splits them (`table.py`), and makes one of two
environments:

- Without tools, `TasksEnv`: one turn, as `Math-v0`. The reply's last
  `\\boxed{}` is the answer, for every judge; the reward is `Math-v0`'s,
  `correctness + 0.1 * format`: correctness 1.0 if the judge accepts the answer,
  0.0 if not, -1.0 without a boxed answer; format 0.3 for reasoning ended by one
  boxed answer, else -0.2.
- With `tools` or `mcp_servers`, `ToolTasksEnv`, a `ToolEnv`: multi-turn, its
  final answer read the tool format's way and judged by the judge, its reward
  `ToolEnv`'s parts "correctness", "tool" (against the row's expected calls)
  and "format". A row may offer only some of the tools (`tools_column`); the
  model sees, and may call, only those.

Tool-only options (`tool_format`, `max_turns`, ...) and tool columns without
tools are errors, not ignored.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import types
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.env.core import AgentEnv, Feedback, Split, Task
from agentgym.env.templates import ToolFormatName
from agentgym.env.tool_env import ToolEnv
from agentgym.envs.tasks.calls_env import FunctionCallsEnv
from agentgym.envs.tasks.data import DataError, Rows, read_rows
from agentgym.envs.tasks.judges import Judge, import_object, make_judge
from agentgym.envs.tasks.sample import SAMPLE_ROWS
from agentgym.envs.tasks.table import (
    Columns,
    TaskTable,
    build_table,
    cached_table,
    is_schema_cell,
    opening_messages,
)
from agentgym.rewards.verifiable import (
    Format,
    check_weights,
    combine,
    extract_boxed,
    format_reward,
)
from agentgym.tools import McpServer, RunnableTool, ToolBox, schema_tool, tool
from agentgym.types import Message

logger = logging.getLogger(__name__)

ONE_TURN_PARTS: tuple[str, ...] = ("correctness", "format")
BOXED: tuple[Format, ...] = ("boxed",)
"""What counts as well-formed without tools: reasoning ended by one boxed answer."""


class TableTasks:
    """The task hooks of an env whose tasks are a data file's rows (`self.table`)."""

    table: TaskTable
    task: Task | None

    def num_tasks(self, split: Split) -> int:
        return self.table.num_tasks(split)

    def task_id(self, split: Split, index: int) -> str:
        return self.table.task_id(split, index)

    def load_task(self, task_id: str) -> Task:
        return self.table.load_task(task_id)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """As the env's own reset; `info["category"]` is the row's category (or None)."""
        obs, info = super().reset(seed=seed, options=options)  # type: ignore[misc]
        assert self.task is not None
        info["category"] = self.task.metadata.get("category")
        return obs, info


class TasksEnv(TableTasks, AgentEnv):
    """One-turn tasks from a data file, the reply's last `\\boxed{}` judged (see the module).

    Task ids read `"<split>/<row>"`, e.g. `"train/17"` for the file's row 17.
    Make it with `make_tasks_env` (or `gymnasium.make("agentgym/Tasks-v0", ...)`).

    Args:
        table: The checked, split rows.
        judge: Judges the boxed answer against the row's answers.
        reward_weights: Weights of "correctness" and "format"; default 1.0 and 0.1.
        system_prompt: The system message; None for `default_system_prompt`. A row
            whose messages open with a system message uses its own.
        render_mode: None or "ansi".
    """

    default_system_prompt = (
        "Answer the user's question. Reason step by step, then give the final answer as "
        "\\boxed{ANSWER}."
    )

    def __init__(
        self,
        table: TaskTable,
        judge: Judge,
        *,
        reward_weights: Mapping[str, float] | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(system_prompt=system_prompt, render_mode=render_mode)
        self.table, self.answer_judge = table, judge
        self.reward_weights = check_weights(
            reward_weights,
            ONE_TURN_PARTS,
            types.MappingProxyType({"correctness": 1.0, "format": 0.1}),
        )

    def initial_messages(self, task: Task) -> list[Message]:
        return opening_messages(task, self.system_prompt)

    def respond(self, action: str) -> Feedback:
        """Judges the last boxed answer: `correctness + 0.1 * format`; ends the episode."""
        assert self.task is not None  # step() checked it
        answer = extract_boxed(action)
        answers = self.task.metadata["answers"]
        correct = answer is not None and self.answer_judge(answer, answers)
        parts = {
            "correctness": -1.0 if answer is None else float(correct),
            "format": format_reward(action, formats=BOXED),
        }
        info = {
            "correct": correct,
            "format_ok": parts["format"] > 0,
            "expected_answer": self.task.answer,
            "extracted_answer": answer,
        }
        reward = combine(parts, self.reward_weights)
        return Feedback(messages=(), reward=reward, reward_parts=parts, terminated=True, info=info)

    def demonstration(self, task: Task) -> list[str]:
        """The row's first answer, boxed, when the judge accepts it as a reply (not a regex)."""
        answer = task.metadata["answers"][0]
        text = f"The answer is \\boxed{{{answer}}}."
        if extract_boxed(text) != answer or not self.answer_judge(answer, task.metadata["answers"]):
            raise NotImplementedError(
                f"Tasks-v0 has no demonstration of {task.metadata['where']}: judge "
                f"{self.answer_judge.name!r}"
                f" does not accept its answer {answer!r}, boxed, as a reply"
            )
        return [text]


class ToolTasksEnv(TableTasks, ToolEnv):
    """Multi-turn tool-use tasks from a data file; a `ToolEnv` (see the module).

    Args:
        table: The checked, split rows.
        judge: Judges the final answer against the row's answers.
        tools: The tools every row may use (a row's tools column picks some).
        tool_format, tool_parser, mcp_servers, max_turns, max_result_chars,
        max_calls_per_turn, reward_weights, system_prompt, render_mode: as for `ToolEnv`.
    """

    def __init__(
        self,
        table: TaskTable,
        judge: Judge,
        tools: Sequence[RunnableTool] = (),
        *,
        tool_format: ToolFormatName = "auto",
        tool_parser: str | None = None,
        mcp_servers: Sequence[Mapping[str, Any] | McpServer] = (),
        max_turns: int | None = None,
        max_result_chars: int = 2000,
        max_calls_per_turn: int = 4,
        reward_weights: Mapping[str, float] | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        self.table, self.answer_judge, self.given_tools = table, judge, tuple(tools)
        self.box_options = {
            "max_result_chars": max_result_chars,
            "max_calls_per_turn": max_calls_per_turn,
        }
        self.boxes: dict[tuple[str, ...] | None, tuple[ToolBox, str]] = {}  # box, schemas
        super().__init__(
            tool_format=tool_format,
            tool_parser=tool_parser,
            mcp_servers=mcp_servers,
            max_turns=max_turns,
            max_result_chars=max_result_chars,
            max_calls_per_turn=max_calls_per_turn,
            reward_weights=reward_weights,
            system_prompt=system_prompt,
            render_mode=render_mode,
        )
        if not self.mcp_servers:
            self.offered(None)  # duplicate or unknown tool names fail now, not at the first reset

    def make_tools(self) -> list[RunnableTool]:
        return list(self.given_tools)

    def is_correct(self, task: Task, answer: str) -> bool:
        return self.answer_judge(answer, task.metadata["answers"])

    @functools.cached_property
    def all_tools(self) -> tuple[RunnableTool, ...]:
        """The given tools and the MCP servers' (which starts them); the rows' names checked."""
        served = [t for server in self.mcp_servers for t in server.tools()]
        found = (*self.make_tools(), *served)
        names = {t.name for t in found}
        unknown = {n: w for n, w in self.table.tool_uses.items() if n not in names}
        if unknown:
            named = ", ".join(f"{n!r} ({w})" for n, w in unknown.items())
            raise ValueError(
                f"{self.table.name}: rows name tools the env lacks: {named}; its tools: "
                f"{', '.join(sorted(names))}"
            )
        return found

    def offered(self, task: Task | None) -> tuple[ToolBox, str]:
        """The ToolBox of the tools `task` offers (all, without a tools column), and their
        schemas as JSON."""
        names = task.metadata.get("tools") if task is not None else None
        if names not in self.boxes:
            chosen = [t for t in self.all_tools if names is None or t.name in names]
            box = ToolBox(chosen, **self.box_options)
            self.boxes[names] = box, json.dumps(box.schemas())
        return self.boxes[names]

    @property
    def toolbox(self) -> ToolBox:
        """The tools of the current task: the model sees and may call only those."""
        return self.offered(self.task)[0]

    def tools(self) -> list[dict[str, Any]]:
        """JSON schemas of the current task's tools (a fresh copy), as `info["tools"]`."""
        schemas: list[dict[str, Any]] = json.loads(self.offered(self.task)[1])
        return schemas

    def initial_messages(self, task: Task) -> list[Message]:
        box = self.offered(task)[0]
        instructions = self.format.instructions(list(box.tools.values()))
        return opening_messages(task, self.system_prompt, instructions)


class TableCallsEnv(TableTasks, FunctionCallsEnv):
    """Function-calling rows from a data file: each row's own schemas and expected calls,
    judged by `agentgym.rewards.calls` (see `agentgym.envs.tasks.calls_env`)."""

    def __init__(self, table: TaskTable, **options: Any):
        self.table = table
        super().__init__(**options)


# -- making one -------------------------------------------------------------------------------


def resolve_tool(spec: Any, where: str) -> RunnableTool:
    """A tool from a spec: a tool object; "module:name" of a `@tool`, a `schema_tool` or a
    typed function (made a `@tool`); or an OpenAI function schema with "fn": "module:function"
    (or a callable). ValueError naming `where` otherwise."""
    if isinstance(spec, RunnableTool):
        return spec
    if isinstance(spec, str):
        found = import_object(spec, where)
        if isinstance(found, RunnableTool):
            return found
        if not callable(found):
            raise ValueError(f"{where} {spec!r} is a {type(found).__name__}; valid: a tool")
        try:
            return tool(found)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where} {spec!r} is not a typed function: {err}") from None
    if isinstance(spec, Mapping):
        schema = dict(spec)
        fn = schema.pop("fn", None)
        if isinstance(fn, str):
            fn = import_object(fn, f"{where}['fn']")
        if not callable(fn):
            raise ValueError(f"{where}: a schema needs 'fn': 'module:function', got {fn!r}")
        try:
            return schema_tool(schema, fn)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from None
    raise ValueError(
        f"{where} is a {type(spec).__name__}; valid: 'module:name' of a tool or typed "
        "function, or an OpenAI function schema with 'fn': 'module:function'"
    )


def _as_list(value: Any, name: str) -> list[Any]:
    """A list option, a single item (a string, a dict) counting as a list of one."""
    if isinstance(value, str | Mapping | RunnableTool | McpServer):
        return [value]
    if not isinstance(value, list | tuple):
        raise ValueError(f"{name}={value!r}; valid: a list")
    return list(value)


def _check_options(test_fraction: Any, seed: Any, needs_tools: Mapping[str, Any]) -> None:
    """ValueError for a split option out of range, or an option that needs tools given
    without them (`needs_tools`: those options, None where not given)."""
    if (
        isinstance(test_fraction, bool)
        or not isinstance(test_fraction, int | float)
        or not 0 < test_fraction < 1
    ):
        raise ValueError(f"test_fraction={test_fraction!r}; valid: a number between 0 and 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed={seed!r}; valid: an int from 0 to 2**31 - 1")
    given = [f"{k}={v!r}" for k, v in needs_tools.items() if v is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)} apply with tools; valid: also give tools or mcp_servers"
        )


@functools.cache
def _sample_rows() -> Rows:
    logger.warning("agentgym/Tasks-v0 without data: playing its 24-row built-in sample")
    return read_rows(list(SAMPLE_ROWS), name="the built-in sample")


def make_tasks_env(
    data: Any = None,
    *,
    prompt_column: str = "prompt",
    answer_column: str = "answer",
    split_column: str | None = None,
    tools_column: str | None = None,
    expected_calls_column: str | None = None,
    category_column: str | None = None,
    test_fraction: float = 0.1,
    seed: int = 0,
    judge: str = "math",
    tools: Sequence[Any] = (),
    mcp_servers: Sequence[Mapping[str, Any] | McpServer] = (),
    system_prompt: str | None = None,
    reward_weights: Mapping[str, float] | None = None,
    render_mode: str | None = None,
    tool_format: ToolFormatName | None = None,
    tool_parser: str | None = None,
    max_turns: int | None = None,
    max_result_chars: int | None = None,
    max_calls_per_turn: int | None = None,
    string_match: str | None = None,
    call_reward: str | None = None,
) -> TasksEnv | ToolTasksEnv | TableCallsEnv:
    """Tasks from your own data, a prompt and an answer a row; one turn, or several with tools.

    Makes a `TasksEnv`, or with `tools` or `mcp_servers` a `ToolTasksEnv`, or for rows
    with their own function schemas a `TableCallsEnv`.

    Args:
        data: A `.jsonl`, `.json`, `.csv` or `.parquet` file, a folder saved by
            `datasets`' `save_to_disk`, a `datasets.Dataset`/`DatasetDict`, or a list of
            dicts; None plays a 24-row built-in sample (and logs a warning).
        prompt_column: Its cells are a string, or a list of chat messages.
        answer_column: Its cells are a string or a number, or a list of them.
        split_column: Its cells are "train" or "test"; None splits by a hash of the
            prompt (a `DatasetDict`'s own splits count as a split column).
        tools_column: Its cells name the tools the row offers (all if empty), or are
            the row's own function schemas: then the env is a `TableCallsEnv`,
            judge-only unless `tools` runs the functions, and the answer column is
            optional.
        expected_calls_column: Its cells are the calls that solve the row,
            `[{"name": ..., "arguments": {...}}]` (with the row's own schemas also
            `[{"<function>": {"<argument>": [values]}}]`, and `[]` for: call nothing).
        category_column: Its cells label the rows; figures are reported per label.
        test_fraction: The hash split's share of test rows (at least one row each).
        seed: The hash split's seed.
        judge: "math", "exact", "contains", "regex" or "module:function"; see `judges`.
        tools: Each a tool, "module:name" of a `@tool`/`schema_tool`/typed function, or
            an OpenAI function schema with "fn": "module:function".
        mcp_servers: MCP server specs or `McpServer`s, as for `ToolEnv`.
        system_prompt: The system message (with tools: the task instructions).
        reward_weights: Weights of the reward parts.
        render_mode: None or "ansi".
        tool_format, tool_parser, max_turns, max_result_chars, max_calls_per_turn: as
            for `ToolEnv`; only with tools.
        string_match: "exact" (the default), "normalized" or "bfcl" (BFCL v4's checker,
            `agentgym.rewards.bfcl`; rows it cannot score are skipped and logged); only
            with the rows' own schemas (see `agentgym.rewards.calls`).
        call_reward: "seed" (the default) or "toolrl"; likewise.

    Raises:
        ValueError: An option, the data source, or rows not valid (`DataError` lists every
            row's problems, with its line or row and column).
    """
    options: dict[str, Any] = {"tool_format": tool_format, "tool_parser": tool_parser}
    options.update(max_turns=max_turns, max_result_chars=max_result_chars)
    options.update(max_calls_per_turn=max_calls_per_turn)
    given = [resolve_tool(t, f"tools[{i}]") for i, t in enumerate(_as_list(tools, "tools"))]
    servers = _as_list(mcp_servers, "mcp_servers")
    rows = _sample_rows() if data is None else read_rows(data)
    own = _own_schemas(rows, tools_column)
    answers: str | None = answer_column
    if own and answer_column == "answer" and "answer" not in rows.columns:
        answers = None  # function-calling data: the calls are the answer
    columns = Columns(
        prompt_column,
        answers,
        split_column,
        tools_column,
        expected_calls_column,
        category_column,
    )
    with_tools = bool(given or servers) or own
    needs_tools = {
        **options,
        "tools_column": tools_column,
        "expected_calls_column": expected_calls_column,
    }
    _check_options(test_fraction, seed, {} if with_tools else needs_tools)
    judge_options = {"string_match": string_match, "call_reward": call_reward}
    _check_calls_options(rows, own, servers, expected_calls_column, judge_options)
    tool_options = {k: v for k, v in options.items() if v is not None}
    judged = make_judge(judge)
    from_file = data is None or isinstance(data, str | os.PathLike)
    table = (cached_table if from_file else build_table)(
        rows,
        columns,
        test_fraction=float(test_fraction),
        seed=seed,
        check=judged.check_expected,
        known_tools=None if servers or own else frozenset(t.name for t in given),
        bfcl=string_match == "bfcl",
    )
    if table.skipped:
        logger.warning(
            "%s: %d row(s) skipped, which BFCL's checker cannot score: %s",
            table.name,
            len(table.skipped),
            "; ".join(f"{where}: {why}" for where, why in table.skipped.items()),
        )
    common: dict[str, Any] = {"reward_weights": reward_weights, "system_prompt": system_prompt}
    if own:
        chosen = {k: v for k, v in judge_options.items() if v is not None}
        return TableCallsEnv(
            table, tools=given, render_mode=render_mode, **common, **tool_options, **chosen
        )
    if with_tools:
        common.update(tool_options, mcp_servers=servers)
        return ToolTasksEnv(table, judged, given, render_mode=render_mode, **common)
    return TasksEnv(table, judged, render_mode=render_mode, **common)


def _own_schemas(rows: Rows, tools_column: str | None) -> bool:
    """Whether the rows offer their own function schemas (any row's tools cell holds them)."""
    if tools_column is None:
        return False
    return any(is_schema_cell(row.get(tools_column)) for row in rows.rows)


def _check_calls_options(
    rows: Rows,
    own: bool,
    servers: Sequence[Any],
    expected_calls_column: str | None,
    judge_options: Mapping[str, Any],
) -> None:
    """ValueError for options of function-calling rows that do not fit the data."""
    if not own:
        given = [f"{k}={v!r}" for k, v in judge_options.items() if v is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)} apply to rows with their own function schemas; valid: "
                "a tools_column whose cells are function schemas"
            )
        return
    if expected_calls_column is None:
        raise DataError(
            f"{rows.name}: the rows offer their own function schemas, so their expected "
            "calls are the answer; valid: also give expected_calls_column ([] in a row for: "
            "call nothing)"
        )
    if servers:
        raise ValueError(
            "mcp_servers with rows that offer their own function schemas; valid: one or the "
            "other (tools= callables run the rows' functions by name)"
        )

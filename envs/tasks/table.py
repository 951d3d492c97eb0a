"""`TaskTable`: a data source's rows, checked, made into tasks, and split into train and test.

Every row is checked when the table is built, before any model loads, and all
problems are reported together in one `DataError`, each with where its row is
("line 7", "row 3") and the column. A row holds:

- a prompt: a non-empty string, or a list of chat messages (`{"role", "content"}`,
  roles system, user and assistant, a system message only first, the last one
  the user's): TRL's "standard" and "conversational" prompts;
- an answer: a string or a number, or a non-empty list of them (any one counts);
  surrounding whitespace is stripped, and an empty answer is a problem;
- optionally a split, "train" or "test";
- optionally the names of the tools the row offers (a subset of the env's);
- optionally the calls that solve it, `[{"name", "arguments"}, ...]` (or OpenAI's
  `{"function": {"name", "arguments"}}`), for `ToolEnv`'s "tool" reward part.

List cells may be JSON text (as a CSV cell must be). In Parquet files and
`datasets` folders, store call arguments as JSON text: Arrow gives every row's
arguments the union of all rows' keys, the missing ones as null, which would
then count as arguments.

Splits come from the split column or a `DatasetDict`'s splits; otherwise from a
hash of the row's prompt text (a message prompt's last user message) and
`seed`: a row is a test row when `sha256(f"{seed}\\n{text}")`, read as a
fraction of 2**64 from its first 8 bytes, is below `test_fraction`. A row keeps
its split when rows are added, removed or reordered, and rows with the same
prompt share one, so the splits never share a prompt. So that a small file
still has both, a split that gets no row takes the prompt with the smallest
hash (test) or the largest (train). Given splits must not share a prompt either.

Task ids read `"<split>/<row>"`, the row's 0-based index in the file (in its
split, for a `DatasetDict`): `"train/17"` is row 17.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.env.core import SPLITS, Split, Task
from agentgym.env.tool_env import ExpectedCall
from agentgym.envs.tasks.data import DataError, Rows, data_error
from agentgym.types import Message

AnswerCheck = Callable[[str], "str | None"]
"""What is wrong with an expected answer for a judge (a regex that does not compile)."""


@dataclass(frozen=True)
class Columns:
    """Which columns hold what; None for a column the data does not have."""

    prompt: str = "prompt"
    answer: str = "answer"
    split: str | None = None
    tools: str | None = None
    expected_calls: str | None = None


@dataclass(frozen=True)
class Row:
    """One row's checked values."""

    prompt: str
    messages: tuple[Message, ...] | None
    answers: tuple[str, ...]
    split: str | None = None
    tools: tuple[str, ...] | None = None
    expected_calls: tuple[ExpectedCall, ...] = ()


@dataclass(frozen=True)
class TaskTable:
    """The tasks of a data source by id, and each split's ids in row order.

    `tool_uses` maps each tool name the rows mention to where it is first
    mentioned, to check the names against tools known only later (MCP servers').
    """

    name: str
    tasks: Mapping[str, Task]
    ids: Mapping[str, tuple[str, ...]]
    tool_uses: Mapping[str, str] = field(default_factory=dict)

    def num_tasks(self, split: Split) -> int:
        """How many rows the split holds."""
        return len(self.ids[split])

    def task_id(self, split: Split, index: int) -> str:
        """The id of the split's `index`-th row; IndexError out of range."""
        ids = self.ids[split]
        if not 0 <= index < len(ids):
            raise IndexError(f"task index {index} out of range 0..{len(ids) - 1} of {split!r}")
        return ids[index]

    def load_task(self, task_id: str) -> Task:
        """The task with this id; KeyError naming the id and the ids' shape."""
        try:
            return self.tasks[task_id]
        except (KeyError, TypeError):
            firsts = [ids[0] for ids in self.ids.values() if ids]
            raise KeyError(
                f"no task {task_id!r} in {self.name}; ids read '<split>/<row>', the row's "
                f"index in the file, e.g. {', '.join(map(repr, firsts))}"
            ) from None


# -- one cell at a time: each raises ValueError saying what is wrong and what is valid --------


def _messages(value: Sequence[Any]) -> tuple[Message, ...]:
    valid = "valid: a non-empty string, or chat messages [{'role', 'content'}] ending with 'user'"
    if not value:
        raise ValueError(f"an empty list; {valid}")
    messages = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or not isinstance(item.get("content"), str):
            raise ValueError(f"message {i} is not {{'role', 'content': str}}; {valid}")
        role = item.get("role")
        if role not in ("system", "user", "assistant") or (role == "system" and i > 0):
            roles = "system (first only), user, assistant"
            raise ValueError(f"message {i} has role {role!r}; valid roles: {roles}")
        messages.append(Message(role, item["content"]))
    if messages[-1].role != "user" or not messages[-1].content.strip():
        raise ValueError(f"the last message is not a non-empty user message; {valid}")
    return tuple(messages)


def prompt_of(value: Any) -> tuple[str, tuple[Message, ...] | None]:
    """(prompt text, messages or None) of a prompt cell; the text is the last user message."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("an empty string; valid: a non-empty string, or chat messages")
        return value, None
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        messages = _messages(value)
        return messages[-1].content, messages
    raise ValueError(f"a {type(value).__name__}; valid: a non-empty string, or chat messages")


def _one_answer(value: Any, check: AnswerCheck | None) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"a {type(value).__name__}; valid: a string or a number, or a list")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r}; valid: a finite number")
    text = str(value).strip()
    if not text:
        raise ValueError("empty; valid: a non-empty string or a number")
    problem = check(text) if check is not None else None
    if problem:
        raise ValueError(f"{text!r} is {problem}")
    return text


def answers_of(value: Any, check: AnswerCheck | None) -> tuple[str, ...]:
    """The acceptable answers of an answer cell: one, or a non-empty list."""
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError("an empty list; valid: at least one answer")
        return tuple(_one_answer(v, check) for v in value)
    return (_one_answer(value, check),)


def _listed(value: Any, what: str) -> list[Any]:
    """A list cell, decoded from JSON text if need be."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"text that is not JSON ({err.msg}); valid: {what}") from None
    if not isinstance(value, list | tuple):
        raise ValueError(f"a {type(value).__name__}; valid: {what}")
    return list(value)


def tools_of(value: Any, known: frozenset[str] | None) -> tuple[str, ...]:
    """The tool names of a tools cell, each one of `known` (when known)."""
    names = _listed(value, "a list of tool names")
    if not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{names!r}; valid: a list of tool names (strings)")
    unknown = [n for n in names if known is not None and n not in known]
    if unknown:
        raise ValueError(f"unknown tool(s) {unknown}; the env's tools: {sorted(known or ())}")
    return tuple(dict.fromkeys(names))


def _call(item: Any) -> ExpectedCall:
    valid = "valid: {'name': str, 'arguments': {...} or its JSON text}"
    if isinstance(item, Mapping) and isinstance(item.get("function"), Mapping):
        item = item["function"]  # OpenAI's {"type": "function", "function": {...}}
    if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
        raise ValueError(f"call {item!r}; {valid}")
    arguments = item.get("arguments")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    if not isinstance(arguments, Mapping):
        raise ValueError(f"call {item['name']!r} has arguments {item.get('arguments')!r}; {valid}")
    return ExpectedCall(item["name"], dict(arguments))


def expected_calls_of(value: Any, offered: frozenset[str] | None) -> tuple[ExpectedCall, ...]:
    """The expected calls of a cell, each of a tool in `offered` (when known)."""
    calls = tuple(_call(item) for item in _listed(value, "a list of calls"))
    missing = [c.name for c in calls if offered is not None and c.name not in offered]
    if missing:
        raise ValueError(
            f"call(s) of {missing}, which the row does not offer: {sorted(offered or ())}"
        )
    return calls


def split_of(value: Any) -> str:
    """A split cell: "train" or "test"."""
    if value not in SPLITS:
        raise ValueError(f"{value!r}; valid: {', '.join(SPLITS)}")
    return str(value)


# -- whole rows, and the table ----------------------------------------------------------------


def _given(value: Any) -> bool:
    """Whether an optional cell holds something: not null, nor empty text (an empty CSV cell)."""
    return value is not None and value != ""


def parse_row(
    row: Mapping[str, Any],
    columns: Columns,
    check: AnswerCheck | None,
    known_tools: frozenset[str] | None,
) -> tuple[Row | None, list[str]]:
    """A row's checked values, or None and its problems ("column 'answer': ...")."""
    problems: list[str] = []

    def cell(column: str, parse: Callable[..., Any], *args: Any) -> Any:
        if row.get(column) is None:
            problems.append(f"column {column!r}: missing")
            return None
        try:
            return parse(row[column], *args)
        except ValueError as err:
            problems.append(f"column {column!r}: {err}")
            return None

    prompt = cell(columns.prompt, prompt_of)
    answers = cell(columns.answer, answers_of, check)
    split = cell(columns.split, split_of) if columns.split else None
    tools = None
    if columns.tools and _given(row.get(columns.tools)):
        tools = cell(columns.tools, tools_of, known_tools)
    offered = frozenset(tools) if tools is not None else known_tools
    calls: tuple[ExpectedCall, ...] = ()
    if columns.expected_calls and _given(row.get(columns.expected_calls)):
        calls = cell(columns.expected_calls, expected_calls_of, offered) or ()
    if problems:
        return None, problems
    return Row(prompt[0], prompt[1], answers, split, tools, calls), []


def hash_fraction(text: str, seed: int) -> float:
    """Where `text` falls in [0, 1) for the hash split: sha256 of f"{seed}\\n{text}"."""
    digest = hashlib.sha256(f"{seed}\n{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def hash_splits(prompts: Sequence[str], test_fraction: float, seed: int) -> list[str]:
    """Each prompt's split by its hash; each split gets at least one prompt (see the module)."""
    where = {p: hash_fraction(p, seed) for p in dict.fromkeys(prompts)}
    if len(where) < 2:
        raise ValueError(
            f"{len(prompts)} row(s) with {len(where)} distinct prompt(s) cannot be split into "
            "train and test; valid: at least two distinct prompts, or a split column"
        )
    test = {p for p, h in where.items() if h < test_fraction}
    if not test:
        test = {min(where, key=lambda p: (where[p], p))}
    if len(test) == len(where):
        test.remove(max(where, key=lambda p: (where[p], p)))
    return ["test" if p in test else "train" for p in prompts]


def _check_given_splits(rows: Rows, parsed: Sequence[Row], splits: Sequence[str]) -> list[str]:
    """Problems of splits the data gives: an empty split, a prompt in both."""
    valid = "valid: rows in both splits, or no split column (then a hash split)"
    problems = [f"no {s!r} rows; {valid}" for s in SPLITS if s not in splits]
    first: dict[str, tuple[str, str]] = {}
    for where, row, split in zip(rows.where, parsed, splits, strict=True):
        seen = first.setdefault(row.prompt, (split, where))
        if seen[0] != split:
            shared = f"{where} ({split}) has the prompt of {seen[1]} ({seen[0]})"
            problems.append(f"{shared}; valid: splits that share no prompt")
    return problems


def _check_columns(rows: Rows, columns: Columns) -> None:
    named = {
        "prompt_column": columns.prompt,
        "answer_column": columns.answer,
        "split_column": columns.split,
        "tools_column": columns.tools,
        "expected_calls_column": columns.expected_calls,
    }
    unknown = [f"{k}={v!r}" for k, v in named.items() if v is not None and v not in rows.columns]
    if unknown:
        missing = f"no column {', '.join(unknown)}; its columns: {', '.join(rows.columns)}"
        raise data_error(rows.name, [missing, *(p for _, p in rows.unreadable)])
    if columns.split is not None and rows.splits is not None:
        raise DataError(
            f"{rows.name}: a DatasetDict's splits are its splits; valid: split_column=None"
        )


def build_table(
    rows: Rows,
    columns: Columns,
    *,
    test_fraction: float,
    seed: int,
    check: AnswerCheck | None = None,
    known_tools: frozenset[str] | None = None,
) -> TaskTable:
    """The tasks of `rows`, checked and split.

    Args:
        rows: The source's rows (`read_rows`).
        columns: Which columns hold what.
        test_fraction: The hash split's share of test rows.
        seed: The hash split's seed.
        check: What is wrong with an expected answer, for the judge (regex).
        known_tools: The env's tool names, when known now; the rows' tools and
            expected calls must name them.

    Raises:
        DataError: Every problem of every row, with where the row is and its column.
    """
    _check_columns(rows, columns)
    parsed, problems = [], list(rows.unreadable)
    for where, position, row in zip(rows.where, rows.positions, rows.rows, strict=True):
        checked, found = parse_row(row, columns, check, known_tools)
        problems += [(position, f"{where}, {p}") for p in found]
        if checked is not None:
            parsed.append(checked)
    if problems:
        problems.sort(key=lambda p: p[0])  # file order; a row's own problems keep theirs
        raise data_error(rows.name, [text for _, text in problems])
    given = rows.splits or ([r.split or "" for r in parsed] if columns.split else None)
    if given is not None:
        split_problems = _check_given_splits(rows, parsed, given)
        if split_problems:
            raise data_error(rows.name, split_problems)
        splits = list(given)
    else:
        try:
            splits = hash_splits([r.prompt for r in parsed], test_fraction, seed)
        except ValueError as err:
            raise DataError(f"{rows.name}: {err}") from None
    return _table(rows, parsed, splits)


cached_table = functools.lru_cache(maxsize=16)(build_table)
"""`build_table`, cached by the identity of `rows`: for the rows of files, which
`read_rows` reads once (the envs of a run then check and split them once)."""


def _table(rows: Rows, parsed: Sequence[Row], splits: Sequence[str]) -> TaskTable:
    tasks: dict[str, Task] = {}
    ids: dict[str, list[str]] = {s: [] for s in SPLITS}
    tool_uses: dict[str, str] = {}
    for where, number, row, split in zip(rows.where, rows.numbers, parsed, splits, strict=True):
        task_id = f"{split}/{number}"
        metadata = {
            "split": split,
            "row": number,
            "where": where,
            "answers": row.answers,
            "messages": row.messages,
            "tools": row.tools,
            "expected_calls": row.expected_calls,
        }
        tasks[task_id] = Task(task_id, row.prompt, answer=row.answers[0], metadata=metadata)
        ids[split].append(task_id)
        for name in [*(row.tools or ()), *(c.name for c in row.expected_calls)]:
            tool_uses.setdefault(name, where)
    frozen_ids = {s: tuple(v) for s, v in ids.items()}
    return TaskTable(rows.name, tasks, frozen_ids, tool_uses)

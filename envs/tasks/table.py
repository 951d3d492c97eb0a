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
- optionally the tools the row offers: the names of some of the env's tools, or the
  row's own function schemas (OpenAI's `{"type": "function", "function": {...}}` or bare
  `{"name", "description", "parameters"}`, loose type names made strict by
  `agentgym.tools.schema.strict_schema`), told apart by the cell's shape;
- optionally the calls that solve it, `[{"name", "arguments"}, ...]` (or OpenAI's
  `{"function": {"name", "arguments"}}`), for `ToolEnv`'s "tool" reward part; with the
  row's own schemas also BFCL's acceptable values, `[{"<function>": {"<argument>":
  [values]}}]` (see `agentgym.rewards.calls`), each checked against its schema;
- optionally a category, any label, for per-category figures.

With `bfcl=True` (`string_match: bfcl`) the expected calls are BFCL's possible answers,
read as BFCL's checker reads them (`agentgym.rewards.bfcl`), not checked against the
schemas; a row whose expected calls BFCL's checker accepts no call for is skipped, by
where it is (and its "id" cell) with BFCL's reason (`TaskTable.skipped`), and an empty
tools cell offers no function.

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
from agentgym.rewards.bfcl import bfcl_demonstration, unscorable
from agentgym.rewards.calls import CallSpec, call_specs, spec_problems
from agentgym.tools.function_tools import openai_function
from agentgym.tools.schema import JsonArguments, strict_schema
from agentgym.types import Message

AnswerCheck = Callable[[str], "str | None"]
"""What is wrong with an expected answer for a judge (a regex that does not compile)."""


@dataclass(frozen=True)
class Columns:
    """Which columns hold what; None for a column the data does not have."""

    prompt: str = "prompt"
    answer: str | None = "answer"
    split: str | None = None
    tools: str | None = None
    expected_calls: str | None = None
    category: str | None = None


@dataclass(frozen=True)
class Row:
    """One row's checked values."""

    prompt: str
    messages: tuple[Message, ...] | None
    answers: tuple[str, ...]
    split: str | None = None
    tools: tuple[str, ...] | None = None
    expected_calls: tuple[ExpectedCall, ...] = ()
    schemas: tuple[dict[str, Any], ...] | None = None
    call_specs: tuple[CallSpec, ...] | None = None
    category: str | None = None
    skip: str | None = None


@dataclass(frozen=True)
class TaskTable:
    """The tasks of a data source by id, and each split's ids in row order.

    `tool_uses` maps each tool name the rows mention to where it is first
    mentioned, to check the names against tools known only later (MCP servers').
    `own_schemas`: the rows offer their own function schemas (function-calling data).
    `skipped`: why each row left out is (BFCL cannot score it), by where it is.
    """

    name: str
    tasks: Mapping[str, Task]
    ids: Mapping[str, tuple[str, ...]]
    tool_uses: Mapping[str, str] = field(default_factory=dict)
    own_schemas: bool = False
    skipped: Mapping[str, str] = field(default_factory=dict)

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


def opening_messages(
    task: Task, system_prompt: str | None, instructions: str = ""
) -> list[Message]:
    """The messages that open an episode: the system prompt (a row's own system message
    instead, if it has one), then `instructions`, then the row's prompt or messages."""
    messages = task.metadata.get("messages") or (Message("user", task.prompt),)
    if messages[0].role == "system":
        system_prompt, messages = messages[0].content, messages[1:]
    system = "\n\n".join(p for p in (system_prompt, instructions) if p)
    return [*([Message("system", system)] if system else []), *messages]


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


def is_schema_cell(value: Any) -> bool:
    """Whether a tools cell holds function schemas (any object), rather than tool names."""
    try:
        listed = _listed(value, "")
    except ValueError:
        return False
    return any(isinstance(item, Mapping) for item in listed)


def schemas_of(value: Any) -> tuple[dict[str, Any], ...]:
    """A row's own function schemas, each as OpenAI's "function" object with strict types."""
    valid = (
        "valid: a list of function schemas, {'type': 'function', 'function': {'name', "
        "'description', 'parameters'}} or the bare {'name', 'description', 'parameters'}"
    )
    functions: list[dict[str, Any]] = []
    for i, item in enumerate(_listed(value, valid)):
        if not isinstance(item, Mapping):
            raise ValueError(f"tool {i} is a {type(item).__name__}; {valid}")
        try:
            function = openai_function(item)
            parameters = strict_schema(function.get("parameters", {"type": "object"}))
            function["parameters"] = parameters
            JsonArguments(parameters, function["name"])
        except ValueError as err:
            raise ValueError(f"tool {i}: {err}") from None
        functions.append(function)
    names = [f["name"] for f in functions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two tools are named {twice[0]!r}; valid: distinct names")
    return tuple(functions)


def specs_of(
    value: Any, schemas: Sequence[Mapping[str, Any]], bfcl: bool = False
) -> tuple[CallSpec, ...]:
    """The expected calls of a row with its own schemas, each checked against its function
    (with `bfcl`, as BFCL's checker reads them: not checked)."""
    specs = call_specs(_listed(value, "a list of calls ([] for: call nothing)"))
    if bfcl:
        return specs
    offered = {f["name"]: f["parameters"] for f in schemas}
    problems: list[str] = []
    for spec in specs:
        if spec.name not in offered:
            problems.append(
                f"expected call {spec.name!r} names a function the row does not offer "
                f"({', '.join(sorted(offered))})"
            )
        else:
            problems += spec_problems(spec, offered[spec.name])
    if problems:
        raise ValueError("; ".join(problems))
    return specs


def category_of(value: Any) -> str:
    """A category cell: a label (a non-empty string, or a number)."""
    if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
        raise ValueError(f"{value!r}; valid: a label (a non-empty string)")
    return str(value).strip()


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
    bfcl: bool = False,
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
    answers = cell(columns.answer, answers_of, check) if columns.answer else ()
    split = cell(columns.split, split_of) if columns.split else None
    category = None
    if columns.category and _given(row.get(columns.category)):
        category = cell(columns.category, category_of)
    tools = schemas = specs = None
    own = columns.tools is not None and is_schema_cell(row.get(columns.tools))
    own = own or (bfcl and columns.tools is not None and row.get(columns.tools) in ([], "[]"))
    if own and columns.tools is not None:
        schemas = cell(columns.tools, schemas_of)
    elif columns.tools and _given(row.get(columns.tools)):
        tools = cell(columns.tools, tools_of, known_tools)
    offered = frozenset(tools) if tools is not None else known_tools
    calls: tuple[ExpectedCall, ...] = ()
    if own:
        if columns.expected_calls and schemas is not None:
            specs = cell(columns.expected_calls, specs_of, schemas, bfcl)
    elif columns.expected_calls and _given(row.get(columns.expected_calls)):
        calls = cell(columns.expected_calls, expected_calls_of, offered) or ()
    if problems:
        return None, problems
    skip = None
    if bfcl and specs is not None and schemas is not None:
        skip = unscorable(specs, {f["name"]: f["parameters"] for f in schemas})
        if skip and isinstance(row.get("id"), str):
            skip = f"{row['id']}: {skip}"
    found = Row(prompt[0], prompt[1], answers, split, tools, calls, schemas, specs, category, skip)
    return found, []


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
        "category_column": columns.category,
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
    bfcl: bool = False,
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
        bfcl: Expected calls read as BFCL's checker reads them; rows it cannot score
            skipped (see the module).

    Raises:
        DataError: Every problem of every row, with where the row is and its column.
    """
    _check_columns(rows, columns)
    parsed, problems = [], list(rows.unreadable)
    for where, position, row in zip(rows.where, rows.positions, rows.rows, strict=True):
        checked, found = parse_row(row, columns, check, known_tools, bfcl)
        problems += [(position, f"{where}, {p}") for p in found]
        if checked is not None:
            parsed.append(checked)
    if not problems:
        problems += _check_tool_shapes(rows, parsed)
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
    return _table(rows, parsed, splits, bfcl)


def _check_tool_shapes(rows: Rows, parsed: Sequence[Row]) -> list[tuple[int, str]]:
    """Problems of rows whose tools are of the other shape than the first row's: either
    every row offers its own schemas, or none does."""
    own = [r.schemas is not None for r in parsed]
    if not any(own):
        return []
    valid = "valid: every row's own function schemas, or every row's tool names"
    found = []
    for where, position, row in zip(rows.where, rows.positions, parsed, strict=True):
        if row.schemas is None:
            found.append((position, f"{where}: no function schemas of its own; {valid}"))
        elif row.call_specs is None:
            found.append(
                (
                    position,
                    f"{where}: its own schemas but no expected calls; valid: "
                    "an expected_calls_column ([] for: call nothing)",
                )
            )
    return found


cached_table = functools.lru_cache(maxsize=16)(build_table)
"""`build_table`, cached by the identity of `rows`: for the rows of files, which
`read_rows` reads once (the envs of a run then check and split them once)."""


def _table(rows: Rows, parsed: Sequence[Row], splits: Sequence[str], bfcl: bool) -> TaskTable:
    tasks: dict[str, Task] = {}
    ids: dict[str, list[str]] = {s: [] for s in SPLITS}
    tool_uses: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for where, number, row, split in zip(rows.where, rows.numbers, parsed, splits, strict=True):
        if row.skip is not None:
            skipped[where] = row.skip
            continue
        task_id = f"{split}/{number}"
        metadata = {
            "split": split,
            "row": number,
            "where": where,
            "answers": row.answers,
            "messages": row.messages,
            "tools": row.tools,
            "expected_calls": row.expected_calls,
            "schemas": row.schemas,
            "call_specs": row.call_specs,
            "category": row.category,
        }
        answer = row.answers[0] if row.answers else json.dumps(_demonstrated(row, bfcl))
        tasks[task_id] = Task(task_id, row.prompt, answer=answer, metadata=metadata)
        ids[split].append(task_id)
        for name in [*(row.tools or ()), *(c.name for c in row.expected_calls)]:
            tool_uses.setdefault(name, where)
    frozen_ids = {s: tuple(v) for s, v in ids.items()}
    own = bool(parsed) and parsed[0].schemas is not None
    return TaskTable(rows.name, tasks, frozen_ids, tool_uses, own_schemas=own, skipped=skipped)


def _demonstrated(row: Row, bfcl: bool) -> list[dict[str, Any]]:
    """The calls a perfect answer to a function-calling row makes (its task's `answer`)."""
    if bfcl:
        offered = {f["name"]: f["parameters"] for f in row.schemas or ()}
        return [bfcl_demonstration(s, offered.get(s.name)) for s in row.call_specs or ()]
    return [spec.demonstration() for spec in row.call_specs or ()]

"""Tools from plain typed Python functions (`@tool`); a `ToolBox` runs the model's calls.

`@tool` turns a function into a `Tool`: its JSON schema comes from the
signature (every parameter annotated) and the Google docstring (the first
paragraph describes the tool, `Args:` describes each argument), read by
`agentgym.tools.schema`. The arguments are checked by a pydantic model built
from the signature, in strict mode with extra arguments forbidden: `"3"` is
*not* accepted for an `int`, nor `true` for an `int`, nor `2.0` for an `int`;
an `int` is accepted for a `float`.

The ToolBox runs any tool that satisfies `RunnableTool` (its name, schema,
time limit, an argument check and a way to run a checked call): besides
`Tool`, the JSON-schema tools of `agentgym.tools.function_tools` and the tools
of an MCP server (`agentgym.tools.mcp`).

`ToolBox.run` never raises for anything the model wrote or a tool did. Each
problem (see `ToolErrorKind`) becomes a `ToolResult` whose content starts with
"Error: " and says what was wrong, so the model can fix its next call, and the
environment can count the errors with `error_counts`.

Time limits: each call of a `Tool` (or a `SchemaTool`) runs in a daemon
worker thread that is abandoned when it runs past its limit (`run_with_limit`);
an MCP tool's server is killed instead. Python cannot kill a thread, so an
abandoned call keeps running (and holding whatever it holds) in the
background. A tool that can block for long should honour a deadline itself, or
run its work in a subprocess or sandbox (`agentgym.sandboxes`). Objects bound
to one thread (e.g. a `sqlite3` connection) must be created inside the tool, or
the box built with `default_timeout_s=None`, which runs calls inline with no
limit.

The text formats of calls (Hermes, ReAct) live in `agentgym.tools.formats` and
are re-exported here.
"""

from __future__ import annotations

import difflib
import json
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, overload, runtime_checkable

import pydantic

from agentgym.tools.formats import CallAttempt, ToolErrorKind, ToolResult
from agentgym.tools.schema import (
    TOOL_NAME,
    argument_path,
    arguments_model,
    parse_docstring,
    without_titles,
)
from agentgym.types import ToolCall

__all__ = [
    "CallOutcome",
    "RunnableTool",
    "Tool",
    "ToolBox",
    "error_counts",
    "run_with_limit",
    "tool",
]


@dataclass(frozen=True)
class CallOutcome:
    """How one run of a tool ended: its result as text, what it raised, or a timeout."""

    text: str = ""
    raised: BaseException | None = None
    timed_out: bool = False


@runtime_checkable
class RunnableTool(Protocol):
    """What the `ToolBox` needs of a tool; `Tool`, `SchemaTool` and `McpTool` are ones."""

    @property
    def name(self) -> str: ...

    @property
    def timeout_s(self) -> float | None:
        """The tool's own time limit in seconds; None for the ToolBox's default."""
        ...

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes function schema: name, description, JSON-schema parameters."""
        ...

    def check_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any] | str:
        """The keyword arguments to run with, or what is wrong with `arguments`, for the model."""
        ...

    def invoke(self, arguments: dict[str, Any], timeout_s: float | None) -> CallOutcome:
        """Runs one checked call, giving up after `timeout_s` (None: no limit); never raises."""
        ...


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with its description and argument model.

    Build one with `@tool`. `arguments` is a pydantic model whose fields are
    the function's parameters (aliased to the parameter name where pydantic
    reserves it); `timeout_s` None means the ToolBox's default.
    """

    name: str
    description: str
    fn: Callable[..., Any]
    arguments: type[pydantic.BaseModel]
    timeout_s: float | None = None

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes function schema: name, description, JSON-schema parameters."""
        parameters = without_titles(self.arguments.model_json_schema(by_alias=True))
        parameters.setdefault("properties", {})
        parameters.setdefault("required", [])
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }

    def check_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any] | str:
        """The arguments as the argument model checks them (strictly, no extras), or what is
        wrong with them."""
        try:
            encoded = json.dumps(dict(arguments), ensure_ascii=False)
        except (TypeError, ValueError):
            encoded = None  # built in Python, not parsed from text: validate the objects
        try:
            if encoded is None:
                checked = self.arguments.model_validate(dict(arguments))
            else:  # JSON mode: strict, yet arrays fill tuples and strings fill enums
                checked = self.arguments.model_validate_json(encoded)
        except pydantic.ValidationError as err:
            problems = "; ".join(_problem(e) for e in err.errors())
            return f"{problems}. Expected {_signature(self)}"
        fields = self.arguments.model_fields
        return {info.alias or f: getattr(checked, f) for f, info in fields.items()}

    def invoke(self, arguments: dict[str, Any], timeout_s: float | None) -> CallOutcome:
        """Runs the function in a worker thread abandoned after `timeout_s` (see the module)."""
        return run_with_limit(lambda: self.fn(**arguments), timeout_s, self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the function directly, unchecked (for tests and reference solutions)."""
        return self.fn(*args, **kwargs)


@overload
def tool(
    fn: Callable[..., Any], *, name: str | None = None, timeout_s: float | None = None
) -> Tool: ...
@overload
def tool(
    fn: None = None, *, name: str | None = None, timeout_s: float | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    timeout_s: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Makes a `Tool` of a typed function; use as `@tool` or `@tool(timeout_s=2.0)`.

    Args:
        fn: The function. Every parameter needs a type annotation; `*args`,
            `**kwargs` and positional-only parameters are refused (TypeError).
        name: The name the model calls it by; the function's name by default.
        timeout_s: Its time limit in seconds; None for the ToolBox's default.
    """

    def build(func: Callable[..., Any]) -> Tool:
        tool_name = name or func.__name__
        if not TOOL_NAME.match(tool_name):
            raise ValueError(
                f"tool name {tool_name!r} must be 1-64 letters, digits, '_', '-' or '.'"
            )
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"tool {tool_name}: timeout_s must be positive, got {timeout_s}")
        description, docs = parse_docstring(func.__doc__)
        made = Tool(
            name=tool_name,
            description=description,
            fn=func,
            arguments=arguments_model(func, tool_name, docs),
            timeout_s=timeout_s,
        )
        try:
            made.schema()
        except pydantic.PydanticUserError as err:  # e.g. a type with no JSON schema
            raise TypeError(f"tool {tool_name}: its arguments have no JSON schema: {err}") from err
        return made

    return build(fn) if fn is not None else build


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return repr(annotation).replace("typing.", "")


def _signature(tool_: Tool) -> str:
    """`name(a: int, b: str = "x")`: the arguments the model should give, as JSON."""
    params = []
    for field_name, info in tool_.arguments.model_fields.items():
        text = f"{info.alias or field_name}: {_type_name(info.annotation)}"
        params.append(text if info.is_required() else f"{text} = {_short(info.default, 20)}")
    return f"{tool_.name}({', '.join(params)})"


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _problem(error: Mapping[str, Any]) -> str:
    """One pydantic error as a sentence naming the argument."""
    loc = error["loc"]
    if not loc:
        return str(error["msg"])
    where = argument_path(loc)
    if error["type"] == "missing":
        return f"missing required argument {where!r}"
    if error["type"] == "extra_forbidden":
        return f"unexpected argument {where!r}"
    return f"argument {where!r}: {error['msg']} (got {_short(error.get('input'))})"


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def run_with_limit(fn: Callable[[], Any], limit_s: float | None, label: str) -> CallOutcome:
    """Runs `fn` (and turns its result to text) in a worker thread, giving up after `limit_s`.

    Args:
        fn: The call; what it returns becomes text (containers as JSON).
        limit_s: Seconds to wait; None runs `fn` inline in the caller's thread.
        label: Names the worker thread (`agentgym-tool-{label}`).
    """
    if limit_s is None:
        try:
            return CallOutcome(text=_to_text(fn()))
        except (Exception, SystemExit) as err:  # KeyboardInterrupt still stops the run
            return CallOutcome(raised=err)
    box: list[CallOutcome] = []

    def work() -> None:
        try:
            box.append(CallOutcome(text=_to_text(fn())))
        except BaseException as err:  # a worker thread; SystemExit would vanish silently
            box.append(CallOutcome(raised=err))

    worker = threading.Thread(target=work, name=f"agentgym-tool-{label}", daemon=True)
    worker.start()
    worker.join(limit_s)
    return box[0] if box else CallOutcome(timed_out=True)


class ToolBox:
    """The tools of an environment; runs one turn's calls and reports each outcome.

    Args:
        tools: The tools (`@tool` functions, `schema_tool`s, an MCP server's `tools()`);
            their names must be unique.
        max_result_chars: Longer results (and error messages) are cut to this
            many characters, with a marker saying how many were cut.
        max_argument_chars: Calls whose arguments, as JSON, are longer are refused.
        max_calls_per_turn: Calls beyond this many in one turn are not run.
        default_timeout_s: Time limit of a tool without its own `timeout_s`;
            None runs calls inline in the caller's thread, without a limit.
    """

    def __init__(
        self,
        tools: Sequence[RunnableTool],
        *,
        max_result_chars: int = 2000,
        max_argument_chars: int = 2000,
        max_calls_per_turn: int = 4,
        default_timeout_s: float | None = 5.0,
    ):
        by_name: dict[str, RunnableTool] = {}
        for t in tools:
            if not isinstance(t, RunnableTool):
                raise TypeError(
                    "ToolBox takes tools (a function decorated with @tool, a schema_tool, "
                    f"an MCP server's tools()), got {t!r}"
                )
            if t.name in by_name:
                raise ValueError(f"two tools are named {t.name!r}")
            by_name[t.name] = t
        for label, value in [
            ("max_result_chars", max_result_chars),
            ("max_argument_chars", max_argument_chars),
            ("max_calls_per_turn", max_calls_per_turn),
        ]:
            if value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        if default_timeout_s is not None and not default_timeout_s > 0:
            raise ValueError(f"default_timeout_s must be positive, got {default_timeout_s}")
        self.tools: Mapping[str, RunnableTool] = MappingProxyType(by_name)
        self.max_result_chars = max_result_chars
        self.max_argument_chars = max_argument_chars
        self.max_calls_per_turn = max_calls_per_turn
        self.default_timeout_s = default_timeout_s

    def schemas(self) -> list[dict[str, Any]]:
        """The tools' function schemas, in order (as `info["tools"]` and chat templates take)."""
        return [t.schema() for t in self.tools.values()]

    def run(self, attempts: Sequence[CallAttempt]) -> list[ToolResult]:
        """One result per attempt, in order; calls run one after another. Never raises."""
        results = []
        for index, attempt in enumerate(attempts):
            if index >= self.max_calls_per_turn:
                results.append(self._too_many(index, len(attempts)))
            elif attempt.error is not None:
                results.append(self._error("", attempt.error, attempt.message or attempt.error))
            else:
                results.append(self._run_call(attempt.call))
        return results

    def _truncate(self, text: str) -> str:
        if len(text) <= self.max_result_chars:
            return text
        cut = len(text) - self.max_result_chars
        return f"{text[: self.max_result_chars]}\n...[truncated {cut} chars]"

    def _error(self, name: str, kind: ToolErrorKind, message: str) -> ToolResult:
        return ToolResult(name=name, content=self._truncate(f"Error: {message}"), error=kind)

    def _too_many(self, index: int, total: int) -> ToolResult:
        return self._error(
            "",
            ToolErrorKind.TOO_MANY_CALLS,
            f"call {index + 1} of {total} was not run: at most {self.max_calls_per_turn} "
            "tool calls per turn",
        )

    def _check(self, call: ToolCall | None) -> ToolResult | tuple[RunnableTool, dict[str, Any]]:
        """The tool and checked arguments of `call`, or the error result explaining why not."""
        name = getattr(call, "name", None)
        if not isinstance(name, str) or not name:
            return self._error("", ToolErrorKind.MISSING_NAME, "the tool call has no tool name")
        if name not in self.tools:
            return self._error(name, ToolErrorKind.UNKNOWN_TOOL, self._unknown(name))
        assert call is not None  # a missing call has no name
        tool_, raw = self.tools[name], call.arguments
        if not isinstance(raw, Mapping):
            kind = ToolErrorKind.ARGUMENTS_NOT_OBJECT
            return self._error(name, kind, f"the arguments of {name!r} must be a JSON object")
        try:
            encoded = json.dumps(dict(raw), ensure_ascii=False)
        except (TypeError, ValueError):
            encoded = None  # built in Python, not parsed from text: the tool checks the objects
        if encoded is not None and len(encoded) > self.max_argument_chars:
            return self._error(
                name,
                ToolErrorKind.ARGUMENTS_TOO_LARGE,
                f"the arguments of {name!r} are {len(encoded)} characters of JSON; "
                f"the limit is {self.max_argument_chars}",
            )
        try:
            checked = tool_.check_arguments(raw)
        except Exception as err:  # a broken tool must not break the run
            checked = f"the arguments could not be checked: {type(err).__name__}: {err}"
        if isinstance(checked, str):
            message = f"invalid arguments for {name!r}: {checked}"
            return self._error(name, ToolErrorKind.INVALID_ARGUMENTS, message)
        return tool_, checked

    def _unknown(self, name: str) -> str:
        if not self.tools:
            return f"unknown tool {name!r}: no tools are available"
        hint = difflib.get_close_matches(name, list(self.tools), n=1)
        maybe = f" Did you mean {hint[0]!r}?" if hint else ""
        return f"unknown tool {name!r}; available tools: {', '.join(self.tools)}.{maybe}"

    def _run_call(self, call: ToolCall | None) -> ToolResult:
        checked = self._check(call)
        if isinstance(checked, ToolResult):
            return checked
        tool_, kwargs = checked
        limit = tool_.timeout_s if tool_.timeout_s is not None else self.default_timeout_s
        if limit is not None and math.isinf(limit):
            limit = None
        try:
            outcome = tool_.invoke(kwargs, limit)
        except Exception as broken:  # a broken tool must not break the run
            outcome = CallOutcome(raised=broken)
        if outcome.timed_out:
            within = f" within {limit:g} s" if limit is not None else ""
            message = f"tool {tool_.name!r} did not finish{within}"
            return self._error(tool_.name, ToolErrorKind.TIMEOUT, message)
        if outcome.raised is not None:
            err = outcome.raised
            what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            return self._error(
                tool_.name, ToolErrorKind.TOOL_RAISED, f"{tool_.name!r} raised {what}"
            )
        return ToolResult(name=tool_.name, content=self._truncate(outcome.text), error=None)


def error_counts(results: Sequence[ToolResult]) -> dict[str, int]:
    """How many results had each kind of error: {kind.value: count}, kinds that occurred only."""
    return dict(Counter(r.error.value for r in results if r.error is not None))

"""Tools given by an OpenAI-style function schema and a callable, sync or async.

`schema_tool(schema, fn)` makes a `SchemaTool` the `ToolBox` runs like a `@tool`
function, for callables without a typed signature (a `**kwargs` wrapper, a
client of some API) and for schemas written by hand or loaded from a file. The
schema is taken as given, in the OpenAI form
`{"type": "function", "function": {"name", "description", "parameters"}}` or
bare (`{"name", "description", "parameters"}`); `schema()` returns it in the
OpenAI form. A call's arguments are checked against `parameters` by
`agentgym.tools.schema.JsonArguments` (Draft 2020-12, integers strict), and the
callable receives them, unchanged, as keyword arguments.

An async callable runs to completion in a fresh event loop inside the
ToolBox's worker thread, under the same time limit as a sync one; a call
abandoned at its limit is cancelled `CANCEL_GRACE_S` later, so its loop and
thread end then rather than when the coroutine would have finished.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, overload

from agentgym.tools.schema import TOOL_NAME, JsonArguments
from agentgym.tools.toolbox import CallOutcome, run_with_limit

__all__ = ["CANCEL_GRACE_S", "SchemaTool", "call_to_completion", "openai_function", "schema_tool"]

CANCEL_GRACE_S = 1.0  # an async call is cancelled this long after the ToolBox gave up on it


@dataclass(frozen=True, eq=False)
class SchemaTool:
    """A tool given by a JSON schema and a callable; build one with `schema_tool`.

    `function` is the schema's "function" object as given (name, description,
    parameters); `arguments` checks a call's arguments against its parameters;
    `timeout_s` None means the ToolBox's default.
    """

    name: str
    description: str
    fn: Callable[..., Any]
    function: Mapping[str, Any]
    arguments: JsonArguments
    timeout_s: float | None = None

    def schema(self) -> dict[str, Any]:
        """The schema as given, in the OpenAI form (a fresh copy)."""
        return {"type": "function", "function": copy.deepcopy(dict(self.function))}

    def check_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any] | str:
        """The arguments, if the schema's parameters allow them, or what is wrong."""
        return self.arguments.check(arguments)

    def invoke(self, arguments: dict[str, Any], timeout_s: float | None) -> CallOutcome:
        """Runs the callable (an async one to completion) in a worker thread, as `Tool` does."""
        return run_with_limit(
            lambda: call_to_completion(self.fn, arguments, timeout_s), timeout_s, self.name
        )

    def __call__(self, **kwargs: Any) -> Any:
        """Calls the callable directly, unchecked, awaiting an async one (for tests)."""
        return call_to_completion(self.fn, kwargs)


@overload
def schema_tool(
    schema: Mapping[str, Any], fn: Callable[..., Any], *, timeout_s: float | None = None
) -> SchemaTool: ...
@overload
def schema_tool(
    schema: Mapping[str, Any], fn: None = None, *, timeout_s: float | None = None
) -> Callable[[Callable[..., Any]], SchemaTool]: ...
def schema_tool(
    schema: Mapping[str, Any],
    fn: Callable[..., Any] | None = None,
    *,
    timeout_s: float | None = None,
) -> SchemaTool | Callable[[Callable[..., Any]], SchemaTool]:
    """Makes a tool of a JSON schema and a callable; also a decorator, `@schema_tool(schema)`.

    Args:
        schema: An OpenAI-style function schema, `{"type": "function", "function":
            {...}}`, or its bare "function" object: a "name" (1-64 letters, digits,
            '_', '-' or '.'), an optional "description" and optional "parameters" (a
            JSON schema of type "object").
        fn: Called with the checked arguments as keyword arguments; it may be async.
        timeout_s: Its time limit in seconds; None for the ToolBox's default.

    Raises:
        ValueError: The schema is malformed or its parameters are not a valid JSON
            schema (the message names the tool), or `timeout_s` is not positive.
    """
    function = openai_function(schema)
    name = function["name"]
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"tool {name!r}: timeout_s must be positive, got {timeout_s}")
    arguments = JsonArguments(function.get("parameters", {"type": "object"}), name)

    def build(func: Callable[..., Any]) -> SchemaTool:
        if not callable(func):
            raise TypeError(f"tool {name!r}: fn must be callable, got {func!r}")
        return SchemaTool(
            name=name,
            description=function.get("description", ""),
            fn=func,
            function=function,
            arguments=arguments,
            timeout_s=timeout_s,
        )

    return build(fn) if fn is not None else build


def openai_function(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The "function" object (a copy) of a function schema given in either form; checked."""
    if not isinstance(schema, Mapping):
        raise ValueError(f"a tool schema must be a JSON object, got {type(schema).__name__}")
    if "function" in schema or "type" in schema:
        if schema.get("type") != "function":
            raise ValueError(f"schema['type'] must be 'function', got {schema.get('type')!r}")
        extra = sorted(set(schema) - {"type", "function"})
        if extra:
            raise ValueError(f"unexpected keys {extra} beside 'type' and 'function'; valid: both")
        function = schema.get("function")
        if not isinstance(function, Mapping):
            raise ValueError(
                "schema['function'] must be an object with 'name', 'description' and "
                f"'parameters', got {function!r}"
            )
    else:
        function = schema
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_', '-' or '.'")
    description = function.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"tool {name!r}: description must be a string, got {description!r}")
    return copy.deepcopy(dict(function))


def call_to_completion(
    fn: Callable[..., Any], arguments: Mapping[str, Any], timeout_s: float | None = None
) -> Any:
    """`fn(**arguments)`; an awaitable result is awaited in a fresh event loop, and
    cancelled `CANCEL_GRACE_S` after `timeout_s` (None: never)."""
    result = fn(**arguments)
    if not inspect.isawaitable(result):
        return result
    limit = None if timeout_s is None else timeout_s + CANCEL_GRACE_S

    async def wait(awaitable: Awaitable[Any]) -> Any:
        return await asyncio.wait_for(awaitable, limit)

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: the ToolBox's worker thread runs no loop
        return asyncio.run(wait(result))
    # A loop already runs in this thread (a ToolBox without time limits called from async
    # code), and asyncio.run cannot nest: run the coroutine in a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1, "agentgym-async-tool") as pool:
        return pool.submit(asyncio.run, wait(result)).result()

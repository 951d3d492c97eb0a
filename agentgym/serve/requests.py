"""OpenAI chat-completion requests read and checked, and the messages a chat template renders.

An agent speaks OpenAI's shapes: assistant messages carry `tool_calls` (each with an id and
JSON-text arguments), tool results are `tool` messages naming the call's `tool_call_id`.
The model speaks its tool format (`agentgym.tools`): the native template's, Hermes or
ReAct. `template_messages` turns the one into the other exactly as the in-process rollout
writes a conversation: an assistant turn's calls are written into its content in the
format's syntax, and a run of tool results becomes the format's observation messages.

Every check raises `BadRequest` naming the field (`messages[2].tool_calls[0].function`),
which the server answers with OpenAI's error shape and status 400.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.policy.base import SamplingParams
from agentgym.tools import ToolCallFormat, ToolResult
from agentgym.types import ToolCall

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ServeLimits:
    """What one request may ask of the server (`agentgym serve --max-tokens ...`): each past
    it is a 400 naming the field and the limit, before any work."""

    max_tokens: int = 4096
    """The most tokens a request may ask to generate (max_tokens, max_completion_tokens)."""
    max_n: int = 8
    """The most choices a request may ask for."""
    max_body_bytes: int = 8 << 20
    """The largest request body, in bytes (8 MiB)."""
    max_json_depth: int = 64
    """The deepest nesting of lists and objects in a request's JSON."""
    max_waiting: int = 64
    """The most requests waiting or computing at once (an episode's, bounded by its run, not
    counted); one more is a 429 with Retry-After, not a wait behind them."""


def too_large(size: int, limits: ServeLimits) -> BadRequest:
    """The 400 of a body of `size` bytes past `limits.max_body_bytes`."""
    return BadRequest(
        None,
        f"the request body is {size} bytes; this server takes at most "
        f"{limits.max_body_bytes} (--max-body-bytes)",
        code="request_too_large",
    )


def read_body(raw: bytes, limits: ServeLimits) -> Any:
    """A request body's JSON, within `limits` (its size, its nesting); BadRequest otherwise."""
    if len(raw) > limits.max_body_bytes:
        raise too_large(len(raw), limits)
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest(None, "the request body nests too deep to parse") from None
    except ValueError:
        raise BadRequest(None, "the request body is not JSON") from None
    todo: list[tuple[Any, int]] = [(body, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > limits.max_json_depth:
            raise BadRequest(
                None,
                f"the request body nests deeper than {limits.max_json_depth} levels "
                "(--max-json-depth)",
            )
        if isinstance(value, dict):
            todo += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            todo += [(v, depth + 1) for v in value]
    return body


class BadRequest(ValueError):
    """A request OpenAI's API would refuse with status 400; `param` names the field."""

    def __init__(self, param: str | None, message: str, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code

    def body(self) -> dict[str, Any]:
        """OpenAI's error body."""
        error = {"message": str(self), "type": "invalid_request_error", "param": self.param}
        return {"error": {**error, "code": self.code}}


@dataclass(frozen=True)
class Call:
    """One tool call of an assistant message: OpenAI's id, the name, the arguments."""

    id: str
    name: str
    arguments: Mapping[str, Any]

    def openai(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": json.dumps(dict(self.arguments))}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class ChatMessage:
    """One message of a request, read: text content, and the calls or the call answered."""

    role: str
    content: str
    tool_calls: tuple[Call, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def key(self) -> tuple[Any, ...]:
        """What makes two messages the same turn: not the calls' ids, which are labels."""
        calls = tuple(
            (c.name, json.dumps(dict(c.arguments), sort_keys=True)) for c in self.tool_calls
        )
        return (self.role, self.content, calls, self.name)


@dataclass(frozen=True)
class FunctionTool:
    """A function the request offers (`tools[i]`), kept as sent: the template and a text
    format's description show it as the request gave it."""

    name: str
    spec: Mapping[str, Any]

    def schema(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.spec))

    def openai(self) -> dict[str, Any]:
        return self.schema()


@dataclass(frozen=True)
class ChatRequest:
    """A chat-completion request, checked."""

    model: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: str = "auto"
    """"auto", "none", "required", or the name of the function that must be called."""
    params: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    logprobs: bool = False
    stream: bool = False
    seed: int | None = None


def _text(value: Any, param: str, *, optional: bool = False) -> str:
    """A message's content: a string, or a list of text parts (joined); None where allowed."""
    if value is None and optional:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise BadRequest(f"{param}[{i}]", f"{param}[{i}]: only text parts are supported")
            parts.append(_text(part.get("text"), f"{param}[{i}].text"))
        return "".join(parts)
    raise BadRequest(param, f"{param} must be a string or a list of text parts")


def _call(raw: Any, param: str) -> Call:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("function"), Mapping):
        raise BadRequest(
            f"{param}.function", f"{param} must be {{'type': 'function', 'function': {{...}}}}"
        )
    function = raw["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(
            f"{param}.function.name", f"{param}.function.name must be a non-empty string"
        )
    arguments = function.get("arguments", "{}")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        raise BadRequest(
            f"{param}.function.arguments", f"{param}.function.arguments is not JSON"
        ) from None
    if not isinstance(parsed, Mapping):
        raise BadRequest(
            f"{param}.function.arguments", f"{param}.function.arguments must be a JSON object"
        )
    call_id = raw.get("id")
    return Call(call_id if isinstance(call_id, str) else "", name, dict(parsed))


def read_message(raw: Any, index: int) -> ChatMessage:
    param = f"messages[{index}]"
    if not isinstance(raw, Mapping):
        raise BadRequest(param, f"{param} must be an object")
    role = raw.get("role")
    if role not in ROLES:
        raise BadRequest(f"{param}.role", f"{param}.role is {role!r}; valid: {', '.join(ROLES)}")
    calls = raw.get("tool_calls") or []
    if role != "assistant" and calls:
        raise BadRequest(f"{param}.tool_calls", f"{param}: only assistant messages make tool calls")
    if not isinstance(calls, list):
        raise BadRequest(f"{param}.tool_calls", f"{param}.tool_calls must be a list")
    content = _text(raw.get("content"), f"{param}.content", optional=role == "assistant")
    call_id = raw.get("tool_call_id")
    if role == "tool" and not isinstance(call_id, str):
        raise BadRequest(f"{param}.tool_call_id", f"{param}.tool_call_id must be a string")
    name = raw.get("name")
    return ChatMessage(
        "system" if role == "developer" else role,
        content,
        tuple(_call(c, f"{param}.tool_calls[{i}]") for i, c in enumerate(calls)),
        call_id if role == "tool" else None,
        name if isinstance(name, str) else None,
    )


def _tool(raw: Any, index: int) -> FunctionTool:
    param = f"tools[{index}]"
    function = raw.get("function") if isinstance(raw, Mapping) else None
    if (
        not isinstance(raw, Mapping)
        or raw.get("type") != "function"
        or not isinstance(function, Mapping)
    ):
        raise BadRequest(param, f"{param} must be {{'type': 'function', 'function': {{...}}}}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(
            f"{param}.function.name", f"{param}.function.name must be a non-empty string"
        )
    parameters = function.get("parameters", {})
    if not isinstance(parameters, Mapping):
        raise BadRequest(
            f"{param}.function.parameters", f"{param}.function.parameters must be an object"
        )
    try:
        return FunctionTool(name, json.loads(json.dumps(raw)))
    except (TypeError, ValueError):
        raise BadRequest(param, f"{param} is not plain JSON") from None


def _tool_choice(raw: Any, tools: Sequence[FunctionTool]) -> str:
    if raw is None:
        return "auto"
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise BadRequest("tool_choice", "tool_choice 'required' needs tools")
        return str(raw)
    function = raw.get("function") if isinstance(raw, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    names = [t.name for t in tools]
    if name not in names:
        raise BadRequest(
            "tool_choice",
            "tool_choice must be 'auto', 'none', 'required' or "
            f"{{'type': 'function', 'function': {{'name': ...}}}} naming one of the tools {names}",
        )
    return str(name)


def _number(body: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(key, f"{key} must be a number")
    if not low <= value <= high:
        raise BadRequest(key, f"{key} is {value}; valid: {low} to {high}")
    return float(value)


def _count(
    body: Mapping[str, Any], key: str, default: int | None, low: int, high: int
) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(key, f"{key} must be an integer from {low} to {high}, got {value!r}")
    return value


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(stops, list)
        or len(stops) > 4
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise BadRequest("stop", "stop must be a non-empty string or a list of up to 4 of them")
    return tuple(stops)


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(key, f"{key} must be true or false, got {value!r}")
    return value


def read_request(body: Any, max_new_tokens: int, limits: ServeLimits | None = None) -> ChatRequest:
    """The request `body` checked (within `limits`); `max_new_tokens` when it gives no token
    limit."""
    limits = limits or ServeLimits()
    if not isinstance(body, Mapping):
        raise BadRequest(None, "the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages", "messages must be a non-empty list")
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise BadRequest("tools", "tools must be a list")
    tools = tuple(_tool(t, i) for i, t in enumerate(raw_tools))
    limit = _count(body, "max_completion_tokens", None, 1, limits.max_tokens)
    limit = _count(body, "max_tokens", limit, 1, limits.max_tokens)
    if _count(body, "top_logprobs", 0, 0, 20):
        raise BadRequest(
            "top_logprobs",
            "top_logprobs is not supported; the logprob of each sampled token is (logprobs: true)",
        )
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("seed", "seed must be an integer")
    params = SamplingParams(
        max_new_tokens=limit or max_new_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        stop=_stop(body.get("stop")),
    )
    return ChatRequest(
        model=str(body.get("model", "")),
        messages=tuple(read_message(m, i) for i, m in enumerate(messages)),
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        params=params,
        n=_count(body, "n", 1, 1, limits.max_n) or 1,
        logprobs=_flag(body, "logprobs"),
        stream=_flag(body, "stream"),
        seed=seed,
    )


def offered_tools(request: ChatRequest) -> tuple[FunctionTool, ...]:
    """The tools the model is shown: none under tool_choice 'none'."""
    return () if request.tool_choice == "none" else request.tools


def template_messages(
    messages: Sequence[ChatMessage],
    fmt: ToolCallFormat,
    tools: Sequence[FunctionTool],
    native: bool,
    start: int = 0,
) -> list[dict[str, Any]]:
    """The messages from `start` on as the chat template renders them in `fmt`, as the
    rollout writes them: an assistant's calls written in its content, each run of tool
    results as the format's observation (a result named by the call it answers, found in
    any earlier message), and, in a text format, the tools described at the end of the
    system message (a system message is added first where there is none)."""
    names = {c.id: c.name for m in messages[:start] for c in m.tool_calls}
    out: list[dict[str, Any]] = []
    results: list[ToolResult] = []
    for message in messages[start:]:
        if message.role != "tool" and results:
            out.extend(m.to_dict() for m in fmt.observation(results))
            results = []
        if message.role == "tool":
            name = message.name or names.get(message.tool_call_id or "", "")
            results.append(ToolResult(name, message.content, None))
        elif message.role == "assistant":
            names.update({c.id: c.name for c in message.tool_calls})
            out.append({"role": "assistant", "content": assistant_text(message, fmt)})
        else:
            out.append({"role": message.role, "content": message.content})
    if results:
        out.extend(m.to_dict() for m in fmt.observation(results))
    if tools and not native and start == 0:
        described = fmt.instructions(list(tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def assistant_text(message: ChatMessage, fmt: ToolCallFormat) -> str:
    """An assistant message's content with its calls written in `fmt` after it."""
    calls = [fmt.render_call(ToolCall(c.name, c.arguments)) for c in message.tool_calls]
    return "\n".join(p for p in (message.content, *calls) if p)


_CUT = "agentgymcut"


def call_opening(fmt: ToolCallFormat, name: str | None) -> str:
    """The start of a call in `fmt`, written for the model to go on from: up to the
    arguments of a call to `name`, or up to the name when any function will do (OpenAI's
    tool_choice "required" or a named function: the reply is then a call)."""
    if name is None:
        text = fmt.render_call(ToolCall(_CUT, {}))
        return text[: text.index(_CUT)]
    text = fmt.render_call(ToolCall(name, {_CUT: 0}))
    return text[: text.index(_CUT) - 2]  # before '{"' of the arguments object

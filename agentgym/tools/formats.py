"""How tool calls look in a model's text: the Hermes and ReAct formats.

A format does four things: it writes the system-prompt instructions
(`instructions`), reads the calls and the final answer out of an assistant turn
(`parse`), turns tool results into the messages the model sees next
(`observation`), and writes a correct call (`render_call`), for reference
solutions and SFT data.

Parsing is tolerant where that cannot change a call's meaning (whitespace and
newlines around the JSON, a ```json fence, a list of calls inside one tag) and
strict everywhere else: JSON is parsed by `json.loads` with NaN and Infinity
refused (and numbers such as 1e999 that a float cannot hold), so a trailing comma
or a stray word is INVALID_JSON, never repaired.
One choice is lenient on purpose: `"arguments"` given as a JSON *string* that
holds an object is accepted, because OpenAI-style APIs encode arguments so.

A call that could not be parsed becomes a `CallAttempt` with `call=None` and an
error; a parsed one has `error=None`. Whether the tool exists and the arguments
fit it is `ToolBox.run`'s job (`agentgym.tools.toolbox`), which also turns these parse
errors into tool results, so the model hears about every malformed call.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentgym.text import extract_boxed, outside_thinking
from agentgym.types import Message, ToolCall


class Tool(Protocol):
    """What a format needs of a tool (`agentgym.tools.Tool` is one): its name and schema."""

    @property
    def name(self) -> str: ...

    def schema(self) -> dict[str, Any]: ...


class ToolErrorKind(enum.StrEnum):
    """What went wrong with one tool call; the value is the key in `error_counts`."""

    INVALID_JSON = "invalid_json"  # the call is malformed: bad JSON, unclosed tag, no Action Input
    TRUNCATED = "truncated"  # a call cut off by the token limit
    MISSING_NAME = "missing_name"  # no tool name, or a name that is not a non-empty string
    UNKNOWN_TOOL = "unknown_tool"
    ARGUMENTS_NOT_OBJECT = "arguments_not_object"
    INVALID_ARGUMENTS = "invalid_arguments"  # wrong types, missing or unexpected arguments
    ARGUMENTS_TOO_LARGE = "arguments_too_large"
    TOO_MANY_CALLS = "too_many_calls"  # beyond the per-turn limit; not run
    TOOL_RAISED = "tool_raised"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class CallAttempt:
    """One tool call as read from the model's text: either `call` or `error` is set."""

    call: ToolCall | None
    error: ToolErrorKind | None
    message: str = ""  # what was wrong, for the model; "" when the call parsed

    def __post_init__(self) -> None:
        if (self.call is None) == (self.error is None):
            raise ValueError("a CallAttempt has exactly one of `call` and `error`")


@dataclass(frozen=True)
class ParsedTurn:
    """Everything a format reads from one assistant turn."""

    calls: tuple[CallAttempt, ...]
    final_answer: str | None  # None when the turn gives none


@dataclass(frozen=True)
class ToolResult:
    """What the model is told about one call."""

    name: str  # the tool's name; "" when the call's name could not be read
    content: str  # the (truncated) result, or "Error: ..." explaining what went wrong
    error: ToolErrorKind | None


class ToolCallFormat(Protocol):
    """A way of writing tool calls in plain text."""

    name: str

    def instructions(self, tools: Sequence[Tool]) -> str:
        """System-prompt text: the tools' schemas, how to call them, how to answer."""
        ...

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn:
        """The calls and final answer in `text`; `truncated` if it hit the token limit."""
        ...

    def observation(self, results: Sequence[ToolResult]) -> list[Message]:
        """The messages that tell the model the results of its calls."""
        ...

    def render_call(self, call: ToolCall) -> str:
        """`call` written as a model should write it; `parse` reads it back."""
        ...


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: json.loads would read it as inf
        raise ValueError(f"{text} is out of range")
    return value


MAX_JSON_DEPTH = 64
"""Deeper JSON in a call is refused (INVALID_JSON): arguments nest a few levels, and every
later step (validation, matching, encoding) may recurse once per level."""

STRICT_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
"""A decoder refusing NaN, Infinity and numbers that overflow; `raw_decode` reads one value."""


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in `value` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def check_depth(value: Any) -> Any:
    """`value`, if it nests at most `MAX_JSON_DEPTH` levels; ValueError otherwise."""
    if _depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def strict_json(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, nor numbers that overflow to infinity, nor nesting
    deeper than `MAX_JSON_DEPTH` (however deep: never a RecursionError); raises ValueError
    (JSONDecodeError is one)."""
    try:
        value = STRICT_DECODER.decode(text)
    except RecursionError:
        raise ValueError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels") from None
    return check_depth(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


_FENCE = re.compile(r"\A```(?:json)?[ \t]*\n?(.*?)\n?[ \t]*```\Z", re.DOTALL)


def _unfence(text: str) -> str:
    """`text` stripped, without a surrounding ```json ... ``` fence if it has one."""
    text = text.strip()
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


def failed_attempt(kind: ToolErrorKind, message: str) -> CallAttempt:
    """A call that could not be read: its error kind and what to tell the model."""
    return CallAttempt(call=None, error=kind, message=message)


def call_attempt(name: str, raw: Any) -> CallAttempt:
    """The call to `name` with `raw` as its arguments, if they are a JSON object."""
    if isinstance(raw, str):  # OpenAI-style: the arguments object encoded as a string
        try:
            raw = strict_json(raw)
        except ValueError:
            return failed_attempt(
                ToolErrorKind.ARGUMENTS_NOT_OBJECT,
                f"the arguments of {name!r} are a string that is not a JSON object",
            )
    if not isinstance(raw, dict):
        return failed_attempt(
            ToolErrorKind.ARGUMENTS_NOT_OBJECT,
            f"the arguments of {name!r} must be a JSON object, got {_json_type(raw)}",
        )
    return CallAttempt(call=ToolCall(name=name, arguments=raw), error=None)


def _json_type(value: Any) -> str:
    # no caller passes an object, which would be a valid call; the entry is for completeness
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def _hermes_call(value: Any) -> CallAttempt:
    """One {"name": ..., "arguments": {...}} object, checked."""
    if not isinstance(value, dict):
        return failed_attempt(
            ToolErrorKind.INVALID_JSON,
            'a tool call must be a JSON object {"name": ..., "arguments": {...}}, '
            f"got {_json_type(value)}",
        )
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        got = "no name" if name is None else f"name {_dumps(name)}"
        return failed_attempt(
            ToolErrorKind.MISSING_NAME,
            f'a tool call needs "name": the tool\'s name as a non-empty string; got {got}',
        )
    if "arguments" not in value:
        extra = sorted(k for k in value if k != "name")
        if extra:  # the arguments written beside "name" instead of inside "arguments"
            return failed_attempt(
                ToolErrorKind.ARGUMENTS_NOT_OBJECT,
                f'put the arguments of {name!r} inside "arguments": {{...}}; '
                f"unexpected key(s) {', '.join(map(repr, extra))} in the call",
            )
        return CallAttempt(call=ToolCall(name=name, arguments={}), error=None)
    return call_attempt(name, value["arguments"])


def _hermes_block(body: str) -> list[CallAttempt]:
    """The calls in the text between one <tool_call> and its </tool_call>."""
    body = _unfence(body)
    try:
        value = strict_json(body)
    except ValueError as err:
        return [failed_attempt(ToolErrorKind.INVALID_JSON, f"invalid JSON in <tool_call>: {err}")]
    if isinstance(value, list) and value:  # several calls in one tag
        return [_hermes_call(item) for item in value]
    return [_hermes_call(value)]


class HermesFormat:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several per turn allowed.

    Results come back as one `tool` message per call. The final answer is the
    last `\\boxed{...}` outside the tool-call tags. An opening tag that is never
    closed is TRUNCATED when generation hit the token limit and INVALID_JSON
    ("unclosed <tool_call>") otherwise. A stray `</tool_call>` is ignored.
    """

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def instructions(self, tools: Sequence[Tool]) -> str:
        schemas = "\n".join(_dumps(t.schema()) for t in tools)
        return (
            "You may call the following tools. Their signatures, as JSON schemas, are "
            f"within <tools></tools> tags:\n<tools>\n{schemas}\n</tools>\n\n"
            "To call a tool, write a JSON object with its name and arguments within "
            "<tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <tool-name>, "arguments": <arguments-json-object>}\n'
            "</tool_call>\n"
            "You may make several calls in one turn. Each result comes back to you in a "
            "tool message. When you know the answer, write it as \\boxed{answer}."
        )

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn:
        text = outside_thinking(text)
        calls: list[CallAttempt] = []
        outside: list[str] = []
        pos = 0
        while (start := text.find(self.OPEN, pos)) != -1:
            outside.append(text[pos:start])
            body_start = start + len(self.OPEN)
            end = text.find(self.CLOSE, body_start)
            reopen = text.find(self.OPEN, body_start)
            if end == -1 or (reopen != -1 and reopen < end):
                calls.append(self._unclosed(truncated and reopen == -1))
                pos = len(text) if reopen == -1 else reopen
                continue
            calls.extend(_hermes_block(text[body_start:end]))
            pos = end + len(self.CLOSE)
        outside.append(text[pos:])
        return ParsedTurn(calls=tuple(calls), final_answer=extract_boxed("".join(outside)))

    def _unclosed(self, cut_off: bool) -> CallAttempt:
        if cut_off:
            return failed_attempt(
                ToolErrorKind.TRUNCATED,
                "the tool call was cut off by the length limit; write shorter calls",
            )
        return failed_attempt(
            ToolErrorKind.INVALID_JSON,
            "unclosed <tool_call>: end every call with </tool_call>",
        )

    def observation(self, results: Sequence[ToolResult]) -> list[Message]:
        return [Message("tool", r.content, name=r.name or None) for r in results]

    def render_call(self, call: ToolCall) -> str:
        body = _dumps({"name": call.name, "arguments": dict(call.arguments)})
        # a tag inside a JSON string would end the call early; "\u003c" is the same "<"
        body = body.replace(self.OPEN, "\\u003c" + self.OPEN[1:])
        body = body.replace(self.CLOSE, "\\u003c" + self.CLOSE[1:])
        return f"{self.OPEN}\n{body}\n{self.CLOSE}"


_REACT_KEYWORD = re.compile(
    r"^[ \t]*(Thought|Action|Action Input|Observation|Final Answer):[ \t]*", re.MULTILINE
)


def _react_blocks(text: str) -> list[tuple[str, str]]:
    """(keyword, text up to the next keyword line) for each keyword line, in order."""
    matches = list(_REACT_KEYWORD.finditer(text))
    if not matches:
        return []
    ends = [m.start() for m in matches[1:]] + [len(text)]
    return [(m.group(1), text[m.end() : end]) for m, end in zip(matches, ends, strict=True)]


def _react_call(name: str, raw_input: str | None, cut_off: bool) -> CallAttempt:
    """The call `Action: name` / `Action Input: raw_input`; `cut_off` if the turn ends in it."""
    if not name:
        return failed_attempt(ToolErrorKind.MISSING_NAME, "'Action:' must name the tool to call")
    if raw_input is None:
        if cut_off:
            return failed_attempt(
                ToolErrorKind.TRUNCATED, "the call was cut off by the length limit"
            )
        return failed_attempt(
            ToolErrorKind.INVALID_JSON,
            f"'Action: {name}' needs an 'Action Input:' line with the arguments as a JSON "
            "object ({} for none)",
        )
    try:
        value = strict_json(_unfence(raw_input))
    except ValueError as err:
        if cut_off:
            return failed_attempt(
                ToolErrorKind.TRUNCATED, "the call was cut off by the length limit"
            )
        return failed_attempt(ToolErrorKind.INVALID_JSON, f"invalid JSON in 'Action Input:': {err}")
    return call_attempt(name, value)


class ReactFormat:
    """ReAct: `Thought:` / `Action: tool` / `Action Input: {json}`, answered by `Observation:`.

    Every Action in the turn is parsed (the ToolBox caps how many run). An
    Action Input runs until the next keyword line (Thought, Action,
    Observation, Final Answer), so it may span lines. The final answer is the
    text after the last `Final Answer:`, up to the next keyword line, stripped;
    without one, the last `\\boxed{...}`. When generation hit the token limit,
    an incomplete last call is TRUNCATED rather than INVALID_JSON.
    """

    name = "react"

    def instructions(self, tools: Sequence[Tool]) -> str:
        schemas = "\n".join(_dumps(t.schema()) for t in tools)
        names = ", ".join(t.name for t in tools)
        return (
            f"You may use the following tools, given as JSON schemas:\n{schemas}\n\n"
            "Use this format:\n"
            "Thought: what to do next, and why\n"
            f"Action: the tool to call, one of [{names}]\n"
            "Action Input: the arguments, as one JSON object\n"
            "Then stop: the result comes back as 'Observation: ...'. Repeat Thought / "
            "Action / Action Input as often as needed. When you know the answer, write:\n"
            "Thought: I know the answer\n"
            "Final Answer: the answer"
        )

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn:
        text = outside_thinking(text)
        blocks = _react_blocks(text)
        calls: list[CallAttempt] = []
        final_answer = None
        for i, (keyword, body) in enumerate(blocks):
            if keyword == "Final Answer":
                final_answer = body.strip()
            if keyword != "Action":
                continue
            follows = blocks[i + 1] if i + 1 < len(blocks) else None
            raw_input = follows[1] if follows and follows[0] == "Action Input" else None
            is_last = i + (1 if raw_input is None else 2) >= len(blocks)
            # later lines before the input are prose
            name = body.strip().split("\n", 1)[0].strip()
            calls.append(_react_call(name, raw_input, truncated and is_last))
        if final_answer is None:
            final_answer = extract_boxed(text)
        return ParsedTurn(calls=tuple(calls), final_answer=final_answer)

    def observation(self, results: Sequence[ToolResult]) -> list[Message]:
        if not results:
            return []
        if len(results) == 1:
            return [Message("user", f"Observation: {results[0].content}")]
        parts = [f"Observation {i}: {r.content}" for i, r in enumerate(results, start=1)]
        return [Message("user", "\n\n".join(parts))]

    def render_call(self, call: ToolCall) -> str:
        return f"Action: {call.name}\nAction Input: {_dumps(dict(call.arguments))}"


HERMES: ToolCallFormat = HermesFormat()
REACT: ToolCallFormat = ReactFormat()
FORMATS: dict[str, ToolCallFormat] = {"hermes": HERMES, "react": REACT}


def get_format(name: str) -> ToolCallFormat:
    """The tool-call format called `name`; ValueError listing the valid names otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {name!r}; valid: {', '.join(sorted(FORMATS))}"
        ) from None

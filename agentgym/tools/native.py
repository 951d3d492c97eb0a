"""The model's own tool-call format (`tool_format="native"`): its chat template lists the tools,
a parser for the template's family reads the calls back.

A model trained on a tool format writes well-formed calls in that format far more often
than in one it is prompted with, so fewer GRPO groups have zero reward variance. The
template renders `tools=` (schemas) and `tool` messages itself; agentgym only has to read
the calls out of the assistant's text, with one of these parsers:

- `hermes`: Hermes / Qwen2.5 / Qwen3 `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  several per turn (the same reader as the Hermes text format).
- `llama3_json`: Llama 3.1 / 3.2 JSON, `{"name": ..., "parameters": {...}}` as the whole
  turn, optionally after `<|python_tag|>`; several calls as that family writes them:
  separated by `;` or newlines, back to back (`{...}{...}`), or as a JSON list of objects.
  `"arguments"` is read as `"parameters"`.
- `mistral`: Mistral v3 `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`, after any prose.
- `response_schema`: the tokenizer's own `response_template` (`tokenizer.parse_response`,
  transformers 5), used first whenever the tokenizer has one.

`detect_parser(template)` picks the family from the template's text. Every failure is a
`CallAttempt` with the same error kinds as the text formats, and a turn that is not a call
ends the episode, its final answer the last `\\boxed{...}` in it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agentgym.text import extract_boxed, outside_thinking
from agentgym.tools.formats import (
    MAX_JSON_DEPTH,
    STRICT_DECODER,
    HermesFormat,
    ParsedTurn,
    Tool,
    ToolErrorKind,
    ToolResult,
    call_attempt,
    check_depth,
    failed_attempt,
)
from agentgym.types import Message, ToolCall

_ANSWER = "When you know the answer, write it as \\boxed{answer}."


class ToolParser(Protocol):
    """Reads a model family's tool calls out of an assistant turn, and writes one."""

    name: str

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn: ...

    def render_call(self, call: ToolCall) -> str: ...


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _cut_or_invalid(truncated: bool, message: str) -> Any:
    if truncated:
        return failed_attempt(
            ToolErrorKind.TRUNCATED, "the tool call was cut off by the length limit"
        )
    return failed_attempt(ToolErrorKind.INVALID_JSON, message)


def _json_objects(text: str, separator: str, *, adjacent: bool = False) -> list[Any]:
    """The JSON values in `text`, separated by `separator` (or by nothing but whitespace,
    with `adjacent`); ValueError if anything else is there."""
    values, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        try:
            value, pos = STRICT_DECODER.raw_decode(text, pos)
        except RecursionError:
            raise ValueError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels") from None
        values.append(check_depth(value))
        rest = text[pos:].lstrip()
        if not rest:
            return values
        if adjacent and rest[0] in "{[":
            pos = len(text) - len(rest)
        elif rest.startswith(separator):
            pos = len(text) - len(rest) + len(separator)
        else:
            raise ValueError(f"unexpected text after a call: {rest[:40]!r}")


def _named_call(value: Any, arguments_keys: tuple[str, ...]) -> Any:
    """One {"name": ..., <arguments key>: {...}} object, checked."""
    if not isinstance(value, dict):
        return failed_attempt(
            ToolErrorKind.INVALID_JSON, "a tool call must be a JSON object with a name"
        )
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return failed_attempt(
            ToolErrorKind.MISSING_NAME, 'a tool call needs "name": the tool\'s name as a string'
        )
    present = [k for k in arguments_keys if k in value]
    if len(present) > 1:
        return failed_attempt(
            ToolErrorKind.ARGUMENTS_NOT_OBJECT,
            f"the call to {name!r} gives both {present[0]!r} and {present[1]!r}; give one",
        )
    return call_attempt(name, value[present[0]] if present else {})


class HermesParser:
    """`<tool_call>` JSON blocks (Hermes, Qwen2.5, Qwen3); see `HermesFormat`."""

    name = "hermes"

    def __init__(self) -> None:
        self._format = HermesFormat()

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn:
        return self._format.parse(text, truncated=truncated)

    def render_call(self, call: ToolCall) -> str:
        return self._format.render_call(call)


class Llama3JsonParser:
    """Llama 3.1 / 3.2 JSON tool calls: the whole turn is the call, or calls separated by `;`
    or newlines, back to back, or a JSON list of objects."""

    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"
    LIST = re.compile(r"\[\s*\{")  # a JSON list of objects: calls

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn:
        body = text.strip()
        tagged = body.startswith(self.PYTHON_TAG)
        body = body.removeprefix(self.PYTHON_TAG).strip()
        if body.startswith("```"):
            body = body.strip("`").removeprefix("json").strip()
        if not (tagged or body.startswith("{") or self.LIST.match(body)):
            return ParsedTurn(calls=(), final_answer=extract_boxed(text))
        try:
            values = _json_objects(body, ";", adjacent=True)
        except ValueError as err:
            return ParsedTurn(
                calls=(_cut_or_invalid(truncated, f"invalid JSON in the tool call: {err}"),),
                final_answer=None,
            )
        items = [item for v in values for item in (v if isinstance(v, list) else [v])]
        if not items:
            message = 'an empty list of tool calls; write one or more {"name", "parameters"}'
            return ParsedTurn(
                calls=(failed_attempt(ToolErrorKind.INVALID_JSON, message),), final_answer=None
            )
        calls = tuple(_named_call(v, ("parameters", "arguments")) for v in items)
        return ParsedTurn(calls=calls, final_answer=None)

    def render_call(self, call: ToolCall) -> str:
        return _dumps({"name": call.name, "parameters": dict(call.arguments)})


class MistralParser:
    """Mistral v3: prose, then `[TOOL_CALLS]` and a JSON array of {"name", "arguments"} objects."""

    name = "mistral"
    MARKER = "[TOOL_CALLS]"

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn:
        prose, marker, body = text.partition(self.MARKER)
        if not marker:
            return ParsedTurn(calls=(), final_answer=extract_boxed(text))
        try:
            values = _json_objects(body.strip(), self.MARKER)
        except ValueError as err:
            message = f"invalid JSON after {self.MARKER}: {err}"
            return ParsedTurn(calls=(_cut_or_invalid(truncated, message),), final_answer=None)
        if not values:
            return ParsedTurn(
                calls=(failed_attempt(ToolErrorKind.INVALID_JSON, "no call after [TOOL_CALLS]"),),
                final_answer=None,
            )
        items = [item for v in values for item in (v if isinstance(v, list) and v else [v])]
        calls = tuple(_named_call(item, ("arguments",)) for item in items)
        return ParsedTurn(calls=calls, final_answer=extract_boxed(prose))

    def render_call(self, call: ToolCall) -> str:
        return f"{self.MARKER} [{_dumps({'name': call.name, 'arguments': dict(call.arguments)})}]"


class ResponseSchemaParser:
    """The tokenizer's own response template, read by `tokenizer.parse_response` (transformers 5).

    Argument types are not cast to the tools' schemas (no `tools=`): a string where an
    integer belongs stays a string, and the ToolBox reports it.
    """

    name = "response_schema"

    def __init__(self, parse_response: Callable[[str], Any], fallback: ToolParser):
        self._parse_response = parse_response
        self._fallback = fallback  # writes calls; the schema only reads them

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn:
        try:
            message = check_depth(self._parse_response(text))
        except RecursionError:  # the schema's JSON reader on deep nesting
            return self._unreadable(
                truncated, f"the JSON nests deeper than {MAX_JSON_DEPTH} levels"
            )
        except Exception as err:  # the parser raises whatever its regexes and JSON raise
            return self._unreadable(truncated, f"the tool call could not be read: {err}")
        if not isinstance(message, dict):
            return self._unreadable(truncated, "the reply could not be read as a message")
        raw_calls = message.get("tool_calls") or ()
        if not isinstance(raw_calls, list):
            return self._unreadable(truncated, "the reply's tool calls are not a list")
        calls = tuple(
            _named_call(c.get("function", c) if isinstance(c, dict) else c, ("arguments",))
            for c in raw_calls
        )
        content = message.get("content")
        answer = extract_boxed(content) if isinstance(content, str) and not calls else None
        return ParsedTurn(calls=calls, final_answer=answer)

    @staticmethod
    def _unreadable(truncated: bool, message: str) -> ParsedTurn:
        return ParsedTurn(calls=(_cut_or_invalid(truncated, message),), final_answer=None)

    def render_call(self, call: ToolCall) -> str:
        return self._fallback.render_call(call)


PARSERS: dict[str, Callable[[], ToolParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}


def get_parser(name: str) -> ToolParser:
    """The native parser called `name`; ValueError listing the valid names otherwise."""
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(
            f"unknown tool parser {name!r}; valid: {', '.join(sorted(PARSERS))}"
        ) from None


def detect_parser(template: str | None) -> str | None:
    """The parser family of a chat template, from the call syntax it writes; None if unknown."""
    text = template or ""
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<tool_call>" in text:
        return "hermes"
    if "<|python_tag|>" in text or ("ipython" in text and "parameters" in text):
        return "llama3_json"
    return None


class NativeFormat:
    """`tool_format="native"`: the template lists the tools and renders their results.

    `instructions` says only how to give the answer (the template's own tool prompt
    describes the tools); results go back as `tool` messages, which the template renders
    its own way (`<tool_response>`, Llama's `ipython` turn, `[TOOL_RESULTS]`).
    """

    name = "native"

    def __init__(self, parser: ToolParser):
        self.parser = parser

    def instructions(self, tools: Sequence[Tool]) -> str:
        return _ANSWER

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn:
        return self.parser.parse(outside_thinking(text), truncated=truncated)

    def observation(self, results: Sequence[ToolResult]) -> list[Message]:
        return [Message("tool", r.content, name=r.name or None) for r in results]

    def render_call(self, call: ToolCall) -> str:
        return self.parser.render_call(call)

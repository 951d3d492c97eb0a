"""Tools' arguments: their JSON schema, and the checks a call's arguments must pass.

For typed functions, `parse_docstring` reads a Google docstring's first
paragraph (the tool's description) and its `Args:` section (each argument's);
`arguments_model` builds the strict pydantic model of the signature that checks
a call's arguments (every parameter annotated, extra arguments forbidden); and
`without_titles` strips pydantic's generated titles from the JSON schema that
model gives. `agentgym.tools.toolbox` makes its `Tool`s with these.

For tools given by a JSON schema (`agentgym.tools.function_tools`, MCP tools),
`JsonArguments` checks a call's arguments with `jsonschema`'s Draft 2020-12
validator, with one departure made for the same reason `@tool` is strict: an
"integer" is a JSON number without a fraction part *written as one*, so `2.0`
and `true` are refused where the standard accepts `2.0`. Defaults in the schema
are documentation only: they are not filled in.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pydantic

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""Tool names: OpenAI's letters, digits, '_' and '-', and '.' as published function-calling
data writes them (`math.factorial`)."""

LOOSE_TYPES: dict[str, str | None] = {
    "dict": "object",
    "float": "number",
    "double": "number",
    "int": "integer",
    "str": "string",
    "bool": "boolean",
    "tuple": "array",
    "list": "array",
    "any": None,
}
"""Type names published function-calling data uses (BFCL, glaive, xLAM) and the JSON
Schema type each means; None: unconstrained (the "type" is dropped)."""

_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:$")  # "Args:", "Returns:", "Raises:", ...
_ARG_SECTIONS = ("Args:", "Arguments:", "Parameters:")
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(first paragraph, {argument: description from the `Args:` section}) of a Google docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        summary.append(line.strip())
    args: dict[str, str] = {}
    start = next((i for i, line in enumerate(lines) if line in _ARG_SECTIONS), None)
    if start is None:
        return " ".join(summary), args
    entry_indent, current = None, None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break  # the next section
        entry_indent = entry_indent or indent
        match = _ARG_LINE.match(line.strip())
        if indent == entry_indent and match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    return " ".join(summary), args


def _field_name(param: str) -> str:
    """A pydantic field name for `param`; names pydantic reserves get a prefix (and an alias)."""
    if param.startswith(("_", "model_")) or hasattr(pydantic.BaseModel, param):
        return f"arg_{param.lstrip('_')}_"
    return param


def arguments_model(
    fn: Callable[..., Any], name: str, docs: Mapping[str, str]
) -> type[pydantic.BaseModel]:
    """The strict pydantic model of `fn`'s arguments; TypeError for an unusable signature."""
    qualname = getattr(fn, "__qualname__", name)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError) as err:
        raise TypeError(f"tool {qualname}: cannot resolve its type annotations: {err}") from err
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(
                f"tool {qualname}: parameter {param.name!r} is {param.kind.description}; "
                "tools take named arguments only (no *args, **kwargs or positional-only)"
            )
        if param.name not in hints:
            raise TypeError(
                f"tool {qualname}: parameter {param.name!r} needs a type annotation, "
                "from which its JSON schema and argument checks are built"
            )
        default = ... if param.default is param.empty else param.default
        field_name = _field_name(param.name)
        fields[field_name] = (
            hints[param.name],
            pydantic.Field(
                default,
                description=docs.get(param.name),
                alias=param.name if field_name != param.name else None,
            ),
        )
    config = pydantic.ConfigDict(extra="forbid", strict=True)
    model_name = "".join(part.title() for part in name.split("_")) + "Arguments"
    try:
        return pydantic.create_model(model_name, __config__=config, **fields)
    except pydantic.PydanticUserError as err:  # e.g. a parameter type pydantic cannot check
        raise TypeError(f"tool {qualname}: unusable argument types: {err}") from err


def without_titles(schema: Any) -> Any:
    """A JSON schema minus pydantic's generated "title"s (properties named title are kept)."""
    if isinstance(schema, list):
        return [without_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: without_titles(sub) for name, sub in value.items()}
        else:
            out[key] = without_titles(value)
    return out


def strict_schema(schema: Any) -> Any:
    """`schema` with the loose type names of `LOOSE_TYPES` as JSON Schema's, at every depth
    (properties, items, combinators); a copy, anything else kept as it is."""
    if isinstance(schema, list):
        return [strict_schema(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            value = _strict_type(value)
            if value is None:
                continue
        elif key in ("properties", "$defs", "patternProperties") and isinstance(value, Mapping):
            value = {name: strict_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "not"):
            value = strict_schema(value)
        out[key] = value
    return out


def _strict_type(kind: Any) -> Any:
    """A "type" value with loose names mapped; None when it leaves the value unconstrained."""
    if isinstance(kind, str):
        return LOOSE_TYPES.get(kind, kind)
    if isinstance(kind, list):
        mapped = [LOOSE_TYPES.get(k, k) if isinstance(k, str) else k for k in kind]
        return None if None in mapped else list(dict.fromkeys(mapped))
    return kind


def argument_path(loc: Sequence[str | int]) -> str:
    """Where in the arguments a problem is: `a`, `opts.depth`, `ids[2]`."""
    return str(loc[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])


def _is_integer(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


_VALIDATOR = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


class JsonArguments:
    """The arguments a JSON schema (a tool's `parameters`) allows; checks a call's against it.

    Args:
        parameters: A JSON schema of type "object" (Draft 2020-12).
        tool_name: The tool's name, for error messages.

    Raises:
        ValueError: `parameters` is not a valid JSON schema of an object; the message names
            the tool and where in the schema the problem is.
    """

    def __init__(self, parameters: Mapping[str, Any], tool_name: str):
        if not isinstance(parameters, Mapping):
            raise ValueError(
                f"tool {tool_name!r}: parameters must be a JSON schema (an object), "
                f"got {type(parameters).__name__}"
            )
        if parameters.get("type", "object") != "object":
            raise ValueError(
                f"tool {tool_name!r}: parameters must be a JSON schema of type 'object' "
                f"(the arguments are a JSON object), got type {parameters['type']!r}"
            )
        try:
            _VALIDATOR.check_schema(parameters)
        except jsonschema.SchemaError as err:
            at = "".join(f"[{p!r}]" for p in err.absolute_path)
            raise ValueError(
                f"tool {tool_name!r}: parameters{at} is not a valid JSON schema: {err.message}"
            ) from err
        self.parameters: dict[str, Any] = json.loads(json.dumps(parameters))
        self.tool_name = tool_name
        self.validator = _VALIDATOR(self.parameters)

    def check(self, arguments: Mapping[str, Any]) -> dict[str, Any] | str:
        """`arguments` as a dict if the schema allows them, else what is wrong, for the model."""
        problems: dict[str, None] = {}  # ordered and without repeats
        for error in self.validator.iter_errors(dict(arguments)):
            problems.update(dict.fromkeys(_problems(error)))
        if not problems:
            return dict(arguments)
        return f"{'; '.join(problems)}. Expected {self.signature()}"

    def signature(self) -> str:
        """`name(a: integer, b: string = "x", c?: array[number])`: the arguments, JSON-typed."""
        properties = self.parameters.get("properties", {})
        required = self.parameters.get("required", [])
        params = []
        for key, sub in properties.items():
            text = f"{key}: {json_type(sub)}"
            if key in required:
                params.append(text)
            elif isinstance(sub, dict) and "default" in sub:
                params.append(f"{text} = {_short(sub['default'])}")
            else:
                params.append(f"{key}?: {json_type(sub)}")
        return f"{self.tool_name}({', '.join(params)})"


def json_type(schema: Any) -> str:
    """A short name of the values `schema` allows: `integer`, `"a" | "b"`, `array[string]`."""
    if not isinstance(schema, dict):
        return "any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return " | ".join(_short(v) for v in schema["enum"])
    if "const" in schema:
        return _short(schema["const"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array[{json_type(schema['items'])}]"
    if isinstance(kind, str):
        return kind
    for combinator in ("anyOf", "oneOf"):
        if isinstance(schema.get(combinator), list):
            return " | ".join(json_type(sub) for sub in schema[combinator])
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1]
    return "any"


def _short(value: Any, limit: int = 20) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _matches(patterns: list[str], key: str) -> bool:
    return any(re.search(pattern, key) for pattern in patterns)


def _problems(error: jsonschema.ValidationError) -> list[str]:
    """One jsonschema error as sentences naming the argument (one per missing or extra key)."""
    path = list(error.absolute_path)
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        missing = [k for k in error.validator_value if k not in instance]
        return [f"missing required argument {argument_path([*path, k])!r}" for k in missing]
    refuses_extra = error.validator == "additionalProperties" and error.validator_value is False
    if refuses_extra and isinstance(instance, dict) and isinstance(error.schema, dict):
        known = error.schema.get("properties", {})
        patterns = list(error.schema.get("patternProperties", {}))
        extra = [k for k in instance if k not in known and not _matches(patterns, k)]
        return [f"unexpected argument {argument_path([*path, k])!r}" for k in extra]
    if not path:
        return [str(error.message)]
    return [f"argument {argument_path(path)!r}: {error.message}"]

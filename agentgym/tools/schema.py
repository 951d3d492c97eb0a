"""A tool's argument model and JSON schema, built from its function's signature and docstring.

`parse_docstring` reads a Google docstring's first paragraph (the tool's
description) and its `Args:` section (each argument's); `arguments_model`
builds the strict pydantic model of the signature that checks a call's
arguments (every parameter annotated, extra arguments forbidden); and
`without_titles` strips pydantic's generated titles from the JSON schema that
model gives. `agentgym.tools.toolbox` makes its `Tool`s with these.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

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

"""The config as a command line: every field in `--help`, `--set` read by type, TRL's names.

Every field of `agentgym.config.Config` becomes a flag `--section.field VALUE` in
its section's argument group, with the description, type and default its
pydantic `Field` declares, so nothing is documented twice. A flag is another
spelling of `--set section.field=VALUE`: both append to the same list, in
command-line order, and later ones win.

Values are read by the field's declared type, not as YAML: a `str` keeps the
text as given (`model.name=no` is "no"), a `bool` takes true/false/yes/no/on/
off/1/0, an optional field takes null, None or ~ for None; lists, dicts and
models take YAML flow syntax (`[calculator]`, `{a: 1}`), their items again read
by type, and only a value typed `Any` (in `run.env_kwargs`) is plain YAML. A key
may reach into a dict (`run.env_kwargs.families=[calculator]`); dicts merge into
the config file's, other values replace. TRL_ALIASES and TRL_REFUSED
(`agentgym.config_trl`) say which of TRL's GRPOConfig names mean ours and which
are refused, naming ours.

`python -m agentgym.config_cli --markdown > docs/configs.md` writes the reference.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard, get_args, get_origin

import yaml
from pydantic import BaseModel

from agentgym.config import Config, ConfigError, load_config
from agentgym.config.files import (
    config_path,
    read_yaml,
    type_members,
    unknown_key,
    unknown_keys,
)
from agentgym.config_trl import TRL_ALIASES, TRL_REFUSED

NULLS = frozenset({"null", "Null", "NULL", "None", "none", "~"})
BOOLS = {
    "true": True,
    "yes": True,
    "on": True,
    "1": True,
    "false": False,
    "no": False,
    "off": False,
    "0": False,
}


@dataclass(frozen=True)
class FieldDoc:
    """One config field as `--help` and docs/configs.md show it."""

    key: str  # grpo.beta; rewards.functions[].fn for a field of a list's items
    annotation: Any
    default: str  # as written on the command line; "required" when there is none
    description: str


def field_docs(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[FieldDoc]:
    """Every field below `model`, depth first; a list of models is followed by its items' fields."""
    for name, info in model.model_fields.items():
        if _is_model(info.annotation):
            yield from field_docs(info.annotation, f"{prefix}{name}.")
            continue
        default = (
            "required" if info.is_required() else flow(info.get_default(call_default_factory=True))
        )
        yield FieldDoc(f"{prefix}{name}", info.annotation, default, info.description or "")
        items = [m for m in type_members(info.annotation) if get_origin(m) is list]
        if items and _is_model(get_args(items[0])[0]):
            yield from field_docs(get_args(items[0])[0], f"{prefix}{name}[].")


def flow(value: Any) -> str:
    """`value` as it would be written after `--set key=`."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


def type_name(annotation: Any) -> str:
    """A declared type as a reader would write it: `float | None`, `{hf,vllm}`, `list[str]`."""
    members = type_members(annotation)
    if len(members) > 1:
        return " | ".join(type_name(m) for m in members)
    kind = members[0]
    if get_origin(kind) is Literal:
        return "{" + ",".join(str(a) for a in get_args(kind)) + "}"
    if get_origin(kind) in (list, dict):
        return f"{get_origin(kind).__name__}[{', '.join(type_name(a) for a in get_args(kind))}]"
    if _is_model(kind):
        return "{" + ", ".join(kind.model_fields) + "}"
    if kind is Any:
        return "Any"
    return "None" if kind is type(None) else kind.__name__


# ---- reading --set ------------------------------------------------------------------


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """`--set key=value` strings as nested overrides (`{"grpo": {"beta": 0.1}}`), later winning.

    Raises:
        ConfigError: naming every bad key or value, one a line, and what would be valid.
    """
    overrides: dict[str, Any] = {}
    problems = []
    for item in items:
        try:
            path, value = _parse_item(item)
        except ConfigError as err:
            problems.append(str(err))
            continue
        node = overrides
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = merge(node.get(path[-1]), value)
    if problems:
        raise ConfigError("\n".join(problems))
    return overrides


def _parse_item(item: str) -> tuple[list[str], Any]:
    """One `--set key=value` string's path and value; ConfigError naming what is wrong."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected section.field=value, e.g. grpo.beta=0.02")
    path, annotation = resolve(key.strip())
    value = parse_value(annotation, raw, ".".join(path))
    if unknown := unknown_keys(value, annotation, ".".join(path)):  # in a list's models
        raise ConfigError("\n".join(unknown))
    return path, value


def resolve(key: str) -> tuple[list[str], Any]:
    """The path and declared type of a dotted key; TRL's names resolve to ours."""
    parts = key.split(".")
    if parts[-1] in TRL_REFUSED and len(parts) <= 2 and declared(parts) is None:
        raise ConfigError(f"{key!r} is not accepted: {TRL_REFUSED[parts[-1]]}")
    alias = TRL_ALIASES.get(parts[-1], "")
    if (len(parts) == 1 and alias) or (len(parts) == 2 and alias.startswith(f"{parts[0]}.")):
        parts = alias.split(".")
    annotation: Any = Config
    for depth, part in enumerate(parts):
        dicts = [m for m in type_members(annotation) if get_origin(m) is dict]
        if _is_model(annotation):
            if part not in annotation.model_fields:
                raise ConfigError(_unknown(key, parts[:depth], annotation))
            annotation = annotation.model_fields[part].annotation
        elif dicts:
            annotation = get_args(dicts[0])[1] if get_args(dicts[0]) else Any
        elif annotation is not Any:
            where = ".".join(parts[:depth])
            raise ConfigError(f"{key!r}: {where} is {type_name(annotation)}; it has no keys")
    return parts, annotation


def parse_value(annotation: Any, raw: str, key: str) -> Any:
    """`raw` read as the declared type: the text itself for str, flow YAML for containers."""
    members = type_members(annotation)
    try:
        if Any in members:
            return yaml.safe_load(raw) if raw.strip() else ""
        if any(_is_container(m) for m in members) and raw.lstrip()[:1] in ("[", "{"):
            node = yaml.compose(raw, Loader=yaml.SafeLoader)
            assert node is not None  # a flow collection is never an empty document
            return _read_node(annotation, node, key)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or "unreadable"
        raise ConfigError(f"{key}: {raw!r} is not YAML flow syntax: {problem}") from None
    return _read_node(annotation, yaml.ScalarNode("tag:yaml.org,2002:str", raw), key)


def _read_node(annotation: Any, node: yaml.Node, key: str) -> Any:
    members = type_members(annotation)
    lists = [m for m in members if get_origin(m) is list]
    maps = [m for m in members if get_origin(m) is dict or _is_model(m)]
    if Any in members:
        return yaml.SafeLoader("").construct_document(node)
    if isinstance(node, yaml.ScalarNode):
        if type(None) in members and node.style is None and node.value.strip() in NULLS:
            return None
        for kind in sorted(members, key=_takes_any_text):  # text last: it takes all
            try:
                return _scalar(kind, node.value)
            except ValueError:
                continue
        text_lists = [m for m in lists if get_args(m) and _takes_any_text(get_args(m)[0])]
        if text_lists and node.value.strip():  # one item, as HF's parsers take `--x a`
            return [_scalar(get_args(text_lists[0])[0], node.value)]
    elif isinstance(node, yaml.SequenceNode) and lists:
        item = get_args(lists[0])[0] if get_args(lists[0]) else Any
        return [_read_node(item, n, f"{key}[{i}]") for i, n in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode) and maps:
        types_ = {k.value: _value_type(maps[0], k.value) for k, _ in node.value}
        return {k.value: _read_node(types_[k.value], v, f"{key}.{k.value}") for k, v in node.value}
    got = node.value if isinstance(node, yaml.ScalarNode) else yaml.serialize(node).strip()
    raise ConfigError(f"{key}: expected {type_name(annotation)}, got {got!r}")


def _scalar(kind: Any, text: str) -> Any:
    """`text` as one scalar type; ValueError when it is not one."""
    if _takes_any_text(kind):
        return text  # pydantic checks a Literal and names its values
    if kind is bool and text.strip().lower() in BOOLS:
        return BOOLS[text.strip().lower()]
    if kind in (int, float):
        return kind(text.strip())
    raise ValueError(text)


def _value_type(kind: Any, name: str) -> Any:
    if _is_model(kind):
        field = kind.model_fields.get(name)
        return field.annotation if field else Any  # `unknown_keys` names an unknown field
    return get_args(kind)[1] if get_args(kind) else Any


def declared(parts: list[str]) -> Any:
    """The annotation of a dotted path of model fields, or None where there is no such field."""
    annotation: Any = Config
    for part in parts:
        if not _is_model(annotation) or part not in annotation.model_fields:
            return None
        annotation = annotation.model_fields[part].annotation
    return annotation


def _unknown(key: str, where: list[str], model: type[BaseModel]) -> str:
    keys = [d.key for d in field_docs() if "[]" not in d.key]  # a near miss of any depth
    return unknown_key(key, ".".join(where), model, [*keys, *TRL_ALIASES])


def _is_model(annotation: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _takes_any_text(annotation: Any) -> bool:
    return annotation in (str, Path) or get_origin(annotation) is Literal


def _is_container(annotation: Any) -> bool:
    return get_origin(annotation) in (list, dict) or _is_model(annotation)


# ---- building the config ------------------------------------------------------------


def merge(base: Any, override: Any) -> Any:
    """`override` over `base`: dicts merge key by key, any other value replaces."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    return {**base, **{k: merge(base.get(k), v) for k, v in override.items()}}


def read_config_file(path: Path) -> dict[str, Any]:
    """A YAML config file as a mapping of sections; an empty section (`grpo:`) is `{}`.

    Raises:
        ConfigError: naming every key given twice, unknown section and unknown field.
    """
    where = f"config file {str(path)!r}"
    loaded = read_yaml(path) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where} must hold a mapping of sections")
    problems = unknown_keys(loaded)
    for section, fields in loaded.items():
        if section in Config.model_fields and not isinstance(fields, dict | None):
            problems.append(f"section {section!r} must hold a mapping, not {fields!r}")
    if problems:
        raise ConfigError("\n".join(f"{where}: {p}" for p in problems))
    return {section: fields or {} for section, fields in loaded.items()}


def load(path: Path | None, items: Sequence[str]) -> Config:
    """The Config from an optional YAML file, then `--set` strings in order.

    Raises:
        ConfigError: naming every problem of the file and of the `--set` strings at once.
    """
    problems = []
    path = config_path(path) if path is not None else None  # a bare name: a shipped config
    try:
        data = read_config_file(path) if path is not None else {}
    except ConfigError as err:
        data, problems = {}, [str(err)]
    try:
        data = merge(data, parse_overrides(items))
    except ConfigError as err:
        problems.append(str(err))
    if problems:
        raise ConfigError("\n".join(problems))
    flat = {
        f"{section}.{field}": v for section, fields in data.items() for field, v in fields.items()
    }
    try:
        return load_config(None, flat)
    except ConfigError as err:
        if path is None:
            raise
        raise ConfigError(f"{err}\n  (config file {str(path)!r}, then --set and flags)") from None


# ---- the reference and the version ---------------------------------------------------


def markdown() -> str:
    """docs/configs.md: every field of every section, then TRL's names."""
    command = "python -m agentgym.config_cli --markdown > docs/configs.md"
    lines = [
        f"*Generated by `{command}` from the `Field` descriptions in agentgym/config/sections.py; "
        "edit those, not this file.*",
        "",
        "# Config reference",
        "",
        "A run's config is the defaults below, then a YAML file (`--config`), then "
        "`--set section.field=VALUE` (or `--section.field VALUE`) in command-line order. "
        "Values are read by the field's type: text as given for `str`, true/false/yes/no/1/0 "
        "for `bool`, null/None/~ for None where a field may be None, YAML flow syntax "
        "(`[a, b]`, `{k: v}`) for lists and dicts. A key may reach into a dict: "
        "`--set run.env_kwargs.families=[calculator]`.",
    ]
    docs = list(field_docs())
    for section in Config.model_fields:
        lines += ["", f"## {section}", "", "| field | type | default | description |", "|-|-|-|-|"]
        lines += [
            f"| `{d.key}` | {_cell(type_name(d.annotation))} | `{_cell(d.default)}` | "
            f"{_cell(d.description)} |"
            for d in docs
            if d.key.split(".")[0] == section
        ]
    note = "Accepted where they mean ours (`--num_generations 4`, `--set num_generations=4`, "
    note += "`--set grpo.num_generations=4`), refused where they mean something else."
    lines += ["", "## TRL's names", "", note, "", "| TRL | here |", "|-|-|"]
    lines += [f"| `{name}` | `{key}` |" for name, key in TRL_ALIASES.items()]
    lines += [f"| `{name}` | refused: {_cell(why)} |" for name, why in TRL_REFUSED.items()]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def version() -> str:
    """The installed agentgym's version, for `agentgym --version`."""
    try:
        return importlib.metadata.version("agentgym")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (agentgym is not installed; pip install -e .)"


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m agentgym.config_cli --markdown`: prints the config reference."""
    parser = argparse.ArgumentParser(prog="python -m agentgym.config_cli")
    parser.add_argument("--markdown", action="store_true", help="print docs/configs.md")
    if not parser.parse_args(argv).markdown:
        parser.print_help(sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())

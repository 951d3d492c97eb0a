"""A run's config from a YAML file and `--set section.field=value` overrides.

A run's config is built from the defaults of `agentgym.config.sections`, then a YAML file
(`--config`), then CLI flags and overrides, in that order. Unknown keys, keys given twice
and bad values are errors that name the field; every one is reported at once.
"""

from __future__ import annotations

import difflib
import os
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeGuard, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from agentgym.config.sections import Config


class ConfigError(ValueError):
    """A config file, key or value that is not valid; the message names it."""


class DuplicateKeyError(yaml.YAMLError):
    """Keys given twice in one mapping of a YAML document, one a line, with both lines."""


MAX_YAML_BYTES = int(os.environ.get("AGENTGYM_MAX_CONFIG_BYTES", 1 << 20))
"""The largest config file read (1 MiB; a config is a few kB). AGENTGYM_MAX_CONFIG_BYTES."""
MAX_YAML_NODES = 100_000
"""The most values a YAML document may expand to, aliases counted each time they are used."""
MAX_YAML_DEPTH = 100
"""The deepest nesting of mappings and lists a YAML document may have."""


DEFAULT_RUN = "tool_call"
"""The shipped config that `agentgym train` with neither `--env` nor `--config` trains, as
`make train` does: ToolCall-v0 with the embedded model (`configs/tool_call.yaml`)."""


def shipped_config(name: str) -> Path:
    """The config `name` shipped in the package (the repository's `configs/NAME.yaml`)."""
    from importlib.resources import files

    return Path(str(files("agentgym.configs"))) / f"{name}.yaml"


def shipped_names() -> list[str]:
    """The names of the shipped configs, as `--config NAME` takes them."""
    return sorted(p.stem for p in shipped_config(DEFAULT_RUN).parent.glob("*.yaml"))


def config_path(path: Path) -> Path:
    """`--config PATH`: the file when it exists; a bare name that no file has, such as
    `function_calls` or `math.yaml`, is the shipped config of that name where there is one."""
    if path.exists() or len(path.parts) != 1 or path.suffix not in ("", ".yaml"):
        return path
    shipped = shipped_config(path.stem)
    return shipped if shipped.is_file() else path


class YAMLTooLarge(yaml.YAMLError):
    """A YAML document past `MAX_YAML_NODES` or `MAX_YAML_DEPTH`: refused before it is built."""


def _expanded_size(node: yaml.Node, sizes: dict[int, int], depth: int) -> int:
    """How many values `node` stands for once its aliases are expanded (each subtree counted
    once per use, computed once); YAMLTooLarge past `MAX_YAML_DEPTH` levels."""
    if id(node) in sizes:
        return sizes[id(node)]
    if depth > MAX_YAML_DEPTH:
        raise YAMLTooLarge(
            f"it nests deeper than {MAX_YAML_DEPTH} levels (line {node.start_mark.line + 1})"
        )
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, sizes, depth + 1) for item in node.value)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            size += _expanded_size(key, sizes, depth + 1) + _expanded_size(value, sizes, depth + 1)
    sizes[id(node)] = size = min(size, MAX_YAML_NODES + 1)
    return size


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping.

    PyYAML keeps the last of two equal keys without a word, so a second `grpo:` section
    would silently replace the first. Keys a merge (`<<: *base`) brings in may be
    overridden: that is what a merge is for.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        expanded = _expanded_size(node, {}, 0)
        if expanded > MAX_YAML_NODES:
            raise YAMLTooLarge(
                f"its aliases expand it to {expanded} values, more than {MAX_YAML_NODES} "
                "(a config has a few hundred; repeated aliases of aliases grow exponentially)"
            )
        if found := list(self._duplicates(node, (), set())):
            raise DuplicateKeyError("\n".join(found))
        return super().construct_document(node)

    def _duplicates(self, node: yaml.Node, path: tuple[str, ...], seen: set[int]) -> Iterator[str]:
        """A line per key given twice in a mapping at or below `node`, named by its path."""
        if id(node) in seen:  # an alias: its anchor's node was checked where it was written
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                yield from self._duplicates(item, (*path, f"[{i}]"), seen)
        if not isinstance(node, yaml.MappingNode):
            return
        first: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its own keys count
                yield from self._duplicates(value_node, path, seen)
                continue
            key = self.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            name = ".".join((*path, str(key))).replace(".[", "[")
            if key is not None and key in first:
                again, before = key_node.start_mark.line + 1, first[key].start_mark.line + 1
                yield f"key {name!r} is given again on line {again} (first on line {before})"
            elif key is not None:
                first[key] = key_node
            yield from self._duplicates(value_node, (*path, str(key)), seen)


def read_yaml(path: Path) -> Any:
    """A YAML file's document, read safely; None for an empty file.

    Raises:
        ConfigError: naming the file when it is missing, not YAML, or gives a key twice
            in one mapping (every such key, with both lines).
    """
    where = f"config file {str(path)!r}"
    if not Path(path).is_file():
        shipped = ", ".join(shipped_names())
        raise ConfigError(f"{where} does not exist (shipped, by name: {shipped})")
    size = Path(path).stat().st_size
    if size > MAX_YAML_BYTES:
        raise ConfigError(
            f"{where} is {size} bytes; a config file is at most {MAX_YAML_BYTES} "
            "(AGENTGYM_MAX_CONFIG_BYTES raises the limit)"
        )
    try:
        with Path(path).open(encoding="utf-8") as stream:
            return yaml.load(stream, Loader=UniqueKeyLoader)
    except DuplicateKeyError as err:
        raise ConfigError("\n".join(f"{where}: {line}" for line in str(err).splitlines())) from None
    except YAMLTooLarge as err:
        raise ConfigError(f"{where} is refused: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where} is not valid YAML: {_cut(str(err))}") from None
    except RecursionError:
        raise ConfigError(
            f"{where} is refused: it nests deeper than Python's parser goes"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text ({not_utf8(Path(path))})") from None


def not_utf8(path: Path) -> str:
    """Where a file stops being UTF-8: its line and column."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = raw.rfind(b"\n", 0, err.start) + 1
        line = raw[: err.start].count(b"\n") + 1
        return f"line {line}, column {err.start - line_start + 1}: byte {raw[err.start]:#04x}"
    return "a byte the locale's encoding cannot read"


def _cut(text: str, most: int = 2000) -> str:
    """`text`, or its head and tail with what lies between counted (a parser's message may
    quote a huge line)."""
    if len(text) <= most:
        return text
    return f"{text[: most // 2]} [... {len(text) - most} characters ...] {text[-most // 2 :]}"


def _problem(error: Any) -> str:
    """One line of a validation error: the field, the message and the value given. A rule
    across sections (no field: the whole config's) names its fields in its message, and the
    value it saw is the whole config, so the line is the message alone."""
    message = error["msg"].removeprefix("Value error, ")
    field = ".".join(str(p) for p in error["loc"])
    return f"{field}: {message} (got {error.get('input')!r})" if field else message


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Builds a Config from an optional YAML file and overrides, the file's values replaced
    field by field.

    `overrides` maps dotted keys to values, `{"grpo.beta": 0.1, "run.env": "tool_call"}`,
    or sections to their fields, `{"grpo": {"beta": 0.1}}`; values are Python values, not
    text (`agentgym.config_cli.load(path, ["grpo.beta=0.1"])` reads `--set` strings).

    Raises:
        ConfigError: naming every unknown key, duplicate key and invalid value at once, or
            overrides of another shape.
    """
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError(
            f"overrides: got a {type(overrides).__name__}; valid: a dict of dotted keys "
            "({'grpo.beta': 0.1}) or of sections ({'grpo': {'beta': 0.1}}); for --set "
            "strings, agentgym.config_cli.load(path, ['grpo.beta=0.1'])"
        )
    overrides = {
        f"{key}.{field}" if "." not in key and isinstance(value, dict) else key: inner
        for key, value in (overrides or {}).items()
        for field, inner in (
            value.items() if "." not in key and isinstance(value, dict) else [(None, value)]
        )
    }
    data: dict[str, Any] = {}
    if path is not None:
        loaded = read_yaml(path) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections")
        data = {k: {} if v is None else v for k, v in loaded.items()}  # `grpo:` is {}
    problems = unknown_keys(data)
    for key, value in (overrides or {}).items():
        section, _, field = key.partition(".")
        if not field or section not in Config.model_fields:
            problems.append(unknown_key(key, "", Config))
        elif found := unknown_keys({section: {field: value}}):
            problems += found
        elif isinstance(data.setdefault(section, {}), dict):
            data[section][field] = value
    try:
        config = Config.model_validate(data)
    except ValidationError as err:
        problems += [  # an unknown key is named above, with the keys valid there
            _problem(e) for e in err.errors() if e["type"] != "extra_forbidden"
        ]
    if problems:
        where = f" in {path}" if path else ""
        raise ConfigError(f"invalid config{where}:\n" + "\n".join(f"  {p}" for p in problems))
    return config


def unknown_keys(value: Any, annotation: Any = Config, where: str = "") -> list[str]:
    """A line per key of `value` that no field declares, at any depth below `annotation`
    (`where`, its dotted path), each naming the fields valid there; a list's items are
    named by index (`rewards.functions[0].fnn`)."""
    kinds = type_members(annotation)
    models = [k for k in kinds if _is_model(k)]
    lists = [get_args(k)[0] for k in kinds if get_origin(k) is list and get_args(k)]
    problems = []
    if models and isinstance(value, dict):
        fields = models[0].model_fields
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            if key in fields:
                problems += unknown_keys(item, fields[key].annotation, path)
            else:
                problems.append(unknown_key(path, where, models[0]))
    elif lists and isinstance(value, list):
        for i, item in enumerate(value):
            problems += unknown_keys(item, lists[0], f"{where}[{i}]")
    return problems


def unknown_key(key: str, where: str, model: type[BaseModel], known: Iterable[str] = ()) -> str:
    """The message for `key`, which `model` (at dotted path `where`) does not declare: the
    nearest valid key (among the model's and `known`) and the fields valid there."""
    fields = list(model.model_fields)
    nearby = [f"{where}.{f}" if where else f for f in fields]
    close = difflib.get_close_matches(key, [*nearby, *known], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if not where:
        shape = "keys look like section.field with section one of"
        return f"unknown config key {key!r}{hint}; {shape}: {', '.join(fields)}"
    return f"unknown config key {key!r}{hint}; valid fields of {where!r}: {', '.join(fields)}"


def _is_model(kind: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def type_members(annotation: Any) -> list[Any]:
    """The types a value may take: a union's members, each without its Annotated metadata."""
    if get_origin(annotation) is Annotated:
        return type_members(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in type_members(arg)]
    return [annotation]

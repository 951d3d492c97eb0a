"""How the commands read their flags: every config field as `--section.field VALUE`, help
per command, both spellings of a flag, and the closest flag for a misspelled one.

- **Config fields as flags** (`add_config_arguments`): each field of `agentgym.config.Config`
  is a flag in its section's argument group, with the description, type and default its
  pydantic `Field` declares; it appends `section.field=VALUE` to the list `--set` fills,
  in command-line order. TRL's GRPOConfig names are flags too (`agentgym.config_trl`).
- **Help per command**: `--help` lists the command's own options and names the sections it
  reads; `--help-all` lists every field of those sections as well.
- **Sections per command** (`SECTIONS`): a field flag of a section the command does not read
  (`agentgym eval --grpo.beta 0.5`, or TRL's `--beta`) is refused by name. A config file
  and `--set` may still hold any section: one file serves train and eval.
- **Both spellings** (`normalised`): `--output-dir` and `--output_dir`, `--eval.save-episodes`
  and `--eval.save_episodes` are one flag, as HF's argument parsers take them.
- **Misspellings** (`unknown_flags`): an unknown flag is refused with the closest flags.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_origin

from agentgym.config import Config
from agentgym.config.files import type_members
from agentgym.config_cli import declared, field_docs, type_name
from agentgym.config_trl import TRL_ALIASES, TRL_REFUSED

SECTIONS: dict[str, tuple[str, ...]] = {
    "train": tuple(Config.model_fields),
    "rft": tuple(Config.model_fields),
    "sft": ("model", "lora", "sft", "optim", "run"),
    "eval": ("model", "sampling", "eval", "run", "policy", "rewards"),
}
"""The config sections each command reads; flags of the others are refused."""


class _ConfigAction(argparse.Action):
    """`--section.field VALUE` or a TRL name: appends `key=VALUE` to the list `--set` fills,
    or, for a name refused here, fails saying why and what to use."""

    def __init__(self, option_strings, dest, key: str = "", refused: str = "", **kwargs) -> None:
        kwargs["default"] = argparse.SUPPRESS  # sets nothing unless given: `--set` owns dest
        super().__init__(option_strings, dest, **kwargs)
        self.key, self.refused = key, refused

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if self.refused:
            raise argparse.ArgumentError(self, f"not accepted: {self.refused}")
        items = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, [*items, f"{self.key}={values}"])


class _HelpAll(argparse.Action):
    """`--help-all`: the help with every config field of the command's sections."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        for action in parser._actions:
            action.help = getattr(action, "full_help", action.help)
        parser.print_help()
        parser.exit()


def add_config_arguments(
    parser: argparse.ArgumentParser, dest: str = "overrides", command: str | None = None
) -> None:
    """Adds every config field as `--section.field VALUE`, one argument group per section,
    then TRL's names; each appends `key=VALUE` to `dest`, the list `--set` fills.

    With `command`, the fields of the sections it does not read (`SECTIONS`) are refused,
    and `--help` names the sections where `--help-all` lists every field. Call it after
    the parser's own arguments: it fixes the usage line to those.
    """
    own = parser.format_usage().removeprefix("usage: ").rstrip().replace("%", "%%")
    indent = " " * len(f"usage: {parser.prog} ")
    parser.usage = f"{own}\n{indent}[--SECTION.FIELD VALUE ...]"
    reads = SECTIONS.get(command or "", tuple(Config.model_fields))
    if command is not None:
        parser.add_argument("--help-all", action=_HelpAll, help="also list every config field")
        parser.epilog = (
            f"Every field of the sections {', '.join(reads)} is also a flag, --SECTION.FIELD "
            "VALUE (or --set SECTION.FIELD=VALUE); --help-all lists them, docs/configs.md "
            "describes them. TRL's names (--num_generations, --learning_rate, ...) are "
            "accepted where they mean ours."
        )
    for section in Config.model_fields:
        title = f"{section} (--{section}.FIELD VALUE, or --set {section}.FIELD=VALUE)"
        group = parser.add_argument_group(title)
        refused = "" if section in reads else _not_read(section, command, reads)
        for key, text, metavar in _field_flags(section):
            action = group.add_argument(
                f"--{key}",
                key=key,
                metavar=metavar,
                help=text,
                refused=refused,
                action=_ConfigAction,
                dest=dest,
            )
            _brief(action, command)
    about = "GRPOConfig's names, where they mean ours" if command is None else None
    trl = parser.add_argument_group("TRL's names", about)  # brief --help: none listed
    for name, key in TRL_ALIASES.items():
        section = key.split(".")[0]
        refused = "" if section in reads else _not_read(section, command, reads)
        metavar = _metavar(declared(key.split(".")))
        action = trl.add_argument(
            f"--{name}",
            key=key,
            metavar=metavar,
            help=f"same as --{key}",
            refused=refused,
            action=_ConfigAction,
            dest=dest,
        )
        _brief(action, command)
    for name, why in TRL_REFUSED.items():
        action = trl.add_argument(
            f"--{name}",
            refused=why,
            nargs="?",
            metavar="VALUE",
            action=_ConfigAction,
            help=f"refused: {why}".replace("%", "%%"),
            dest=dest,
        )
        _brief(action, command)


def _field_flags(section: str) -> list[tuple[str, str, str]]:
    """(key, help, metavar) of each field of `section`, a list's item fields told in its help."""
    docs = list(field_docs())
    found = []
    for doc in (d for d in docs if d.key.split(".")[0] == section and "[]" not in d.key):
        metavar = _metavar(doc.annotation)
        kind = "" if metavar == type_name(doc.annotation) else f"{type_name(doc.annotation)}, "
        text = f"{doc.description} ({kind}default: {doc.default})"
        for item in (d for d in docs if d.key.startswith(f"{doc.key}[].")):
            text += f" Each item's {item.key.rpartition('.')[2]}: {item.description} "
            text += f"({type_name(item.annotation)}, {item.default})"
        found.append((doc.key, text.replace("%", "%%"), metavar))
    return found


def _not_read(section: str, command: str | None, reads: Sequence[str]) -> str:
    return f"agentgym {command} does not read the {section!r} section; it reads {', '.join(reads)}"


def _brief(action: argparse.Action, command: str | None) -> None:
    """Keeps the flag out of `--help` when the parser is a command's, and out of
    `--help-all` too when the command refuses it."""
    if command is not None:
        refused = getattr(action, "refused", "") and action.option_strings[0][2:] not in TRL_REFUSED
        action.full_help = argparse.SUPPRESS if refused else action.help  # type: ignore[attr-defined]
        action.help = argparse.SUPPRESS


def _metavar(annotation: Any) -> str:
    kinds = [m for m in type_members(annotation) if m is not type(None)]
    if len(kinds) == 1 and get_origin(kinds[0]) is Literal:
        return type_name(kinds[0])
    names = {list: "LIST", dict: "DICT"}
    return "|".join(
        names.get(get_origin(k), getattr(k, "__name__", "VALUE").upper()) for k in kinds
    )


def normalised(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """`argv` with each flag the parser does not know by its spelling given the spelling it
    knows, hyphens for underscores or the other way round (`--output-dir`, `--output_dir`)."""
    known = parser._option_string_actions
    out = []
    for token in argv:
        flag, eq, value = token.partition("=")
        if flag.startswith("--") and flag not in known:
            name = flag[2:]
            for other in (name.replace("_", "-"), name.replace("-", "_")):
                if f"--{other}" in known:
                    flag = f"--{other}"
                    break
        out.append(flag + eq + value)
    return out


def unknown_flags(extra: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """The error for arguments the parser did not take: each flag with its closest ones."""
    known = [s for s in parser._option_string_actions if s.startswith("--")]
    told = []
    for token in extra:
        flag = token.partition("=")[0]
        close = difflib.get_close_matches(flag, known, n=2, cutoff=0.8) if flag[:2] == "--" else []
        told.append(f"{token} (did you mean {' or '.join(close)}?)" if close else token)
    return f"unrecognized arguments: {' '.join(told)}"


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """The arguments, each flag in either spelling (`--output-dir`, `--output_dir`); an
    unknown flag is refused by its command's parser with the closest ones it has."""
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = next((a for a in argv if not a.startswith("-")), None)
    commands: dict[str, argparse.ArgumentParser] = sub.choices
    if command in commands:
        argv = normalised(argv, commands[command])
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands[args.command].error(unknown_flags(extra, commands[args.command]))
    return args


def names_env(overrides: Sequence[str], kwargs: bool = False) -> bool:
    """Whether `--set` strings name the environment (`run.env`, `run.envs`; with `kwargs`,
    also its options, `run.env_kwargs` and keys within it)."""
    keys = [o.split("=")[0].strip() for o in overrides]
    found = any(k in ("run.env", "run.envs") for k in keys)
    return found or (kwargs and any(k.split(".")[:2] == ["run", "env_kwargs"] for k in keys))


def default_run(args: argparse.Namespace) -> Path | None:
    """`--config`; for `train` with neither `--config` nor an env named, the default run's
    config (shipped with the package: `make train`'s), said in one line."""
    from agentgym.config.files import DEFAULT_RUN, shipped_config

    if args.command != "train" or args.config is not None or args.env or names_env(args.overrides):
        return args.config
    path = shipped_config(DEFAULT_RUN)
    print(f"agentgym train: the default run, {path} (`make train`'s; --env or --config: another)")
    return path

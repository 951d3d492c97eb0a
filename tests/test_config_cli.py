"""The command line built from the config: --help, --set read by type, TRL's names, the docs."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from agentgym.cli_flags import add_config_arguments
from agentgym.config import Config, ConfigError, load_config
from agentgym.config_cli import (
    NULLS,
    load,
    main,
    markdown,
    parse_overrides,
    version,
)
from agentgym.config_trl import TRL_ALIASES, TRL_REFUSED

ROOT = Path(__file__).parent.parent


def _parser() -> argparse.ArgumentParser:
    """A parser shaped like `agentgym train`'s: its own flags, `--set`, then the config's."""
    parser = argparse.ArgumentParser(prog="agentgym train")
    parser.add_argument("--env")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    add_config_arguments(parser)
    return parser


def _walk(model: type[BaseModel], prefix: str) -> list[tuple[str, str]]:
    """(key, description) of every field below `model`, found independently of config_cli."""
    found = []
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            found += _walk(info.annotation, f"{prefix}{name}.")  # a section within a section
            continue
        found.append((f"{prefix}{name}", info.description or ""))
        for arg in getattr(info.annotation, "__args__", ()):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                found += _walk(arg, f"{prefix}{name}[].")
    return found


FIELDS = [
    field
    for section, info in Config.model_fields.items()
    for field in _walk(info.annotation, f"{section}.")
]


# ---- --help -------------------------------------------------------------------------


def test_help_shows_grpo_beta_with_its_description_type_and_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: descriptions stay whole
    text = _parser().format_help()
    beta = Config.model_fields["grpo"].annotation.model_fields["beta"]
    assert f"--grpo.beta FLOAT {beta.description} (float, default: 0.04)" in " ".join(text.split())


def test_help_groups_every_field_under_its_section_with_its_description():
    groups = {g.title.split()[0]: g._group_actions for g in _parser()._action_groups}
    for key, description in FIELDS:
        option = f"--{key.split('[]')[0]}"  # a field of a list's items: told in the list's help
        (action,) = [a for a in groups[key.split(".")[0]] if option in a.option_strings]
        assert description.replace("%", "%%") in action.help


def test_the_usage_line_does_not_list_every_field():
    usage = _parser().format_usage()
    assert "--grpo.beta" not in usage and "[--SECTION.FIELD VALUE ...]" in usage


# ---- flags and --set share one list -------------------------------------------------


def test_a_field_flag_is_a_set_in_command_line_order():
    args = _parser().parse_args(
        ["--set", "grpo.beta=0.1", "--grpo.beta", "0.2", "--num_generations", "4"]
    )
    assert args.overrides == ["grpo.beta=0.1", "grpo.beta=0.2", "grpo.group_size=4"]
    assert parse_overrides(args.overrides) == {"grpo": {"beta": 0.2, "group_size": 4}}


def test_no_flags_leave_the_set_list_empty():
    assert _parser().parse_args([]).overrides == []


@pytest.mark.parametrize("argv", [["--max_completion_length", "256"], ["--use_vllm"]])
def test_a_refused_trl_flag_exits_naming_our_field(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(argv)
    assert exit_.value.code == 2
    name = argv[0].removeprefix("--")
    assert TRL_REFUSED[name] in capsys.readouterr().err


# ---- --set values, read by the field's type -----------------------------------------


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("grpo.num_generations=4", {"grpo": {"group_size": 4}}),
        ("num_generations=4", {"grpo": {"group_size": 4}}),
        ("loss_type=dapo", {"grpo": {"loss": "dapo"}}),
        ("learning_rate=1e-5", {"optim": {"lr": 1e-5}}),
        ("vllm_importance_sampling_clip_max=3", {"grpo": {"tis_cap": 3.0}}),
        ("model.name=no", {"model": {"name": "no"}}),
        ("model.name=null", {"model": {"name": None}}),
        ("run.env=null", {"run": {"env": "null"}}),
        ("run.stop_on_health=no", {"run": {"stop_on_health": False}}),
        ("run.log_completions=2", {"run": {"log_completions": 2}}),
        ("run.stop_on_health=1", {"run": {"stop_on_health": True}}),
        ("run.report_to=[wandb, mlflow]", {"run": {"report_to": ["wandb", "mlflow"]}}),
        ("optim.lr=1e-6", {"optim": {"lr": 1e-6}}),
        ("grpo.epsilon_high=None", {"grpo": {"epsilon_high": None}}),
        (
            "run.env_kwargs.families=[calculator]",
            {"run": {"env_kwargs": {"families": ["calculator"]}}},
        ),
        ("run.env_kwargs={a: 1}", {"run": {"env_kwargs": {"a": 1}}}),
        (
            "sampling.stop=[no, '</tool_call>', 1]",
            {"sampling": {"stop": ["no", "</tool_call>", "1"]}},
        ),
        ("lora.target_modules=all-linear", {"lora": {"target_modules": "all-linear"}}),
        (
            "lora.target_modules=[q_proj, v_proj]",
            {"lora": {"target_modules": ["q_proj", "v_proj"]}},
        ),
        (
            "rewards.functions=[{fn: 'm:f', weight: 2}]",
            {"rewards": {"functions": [{"fn": "m:f", "weight": 2.0}]}},
        ),
    ],
)
def test_a_value_is_read_by_its_field_type(item, expected):
    assert parse_overrides([item]) == expected


def test_deeper_dict_keys_merge_and_a_later_set_wins():
    items = ["run.env_kwargs.families=[calculator]", "run.env_kwargs.max_turns=3", "grpo.beta=1"]
    overrides = parse_overrides([*items, "grpo.beta=0.5"])
    assert overrides == {
        "run": {"env_kwargs": {"families": ["calculator"], "max_turns": 3}},
        "grpo": {"beta": 0.5},
    }


@pytest.mark.parametrize(
    ("item", "needles"),
    [
        ("grpo.bta=0.1", ["did you mean 'grpo.beta'", "valid fields of 'grpo': group_size"]),
        ("grp.beta=1", ["did you mean 'grpo.beta'", "section one of: model"]),
        ("beta", ["section.field=value"]),
        ("sampling.temperature=hot", ["sampling.temperature", "expected float", "'hot'"]),
        ("grpo.group_size=4.5", ["grpo.group_size", "expected int"]),
        ("run.stop_on_health=maybe", ["run.stop_on_health", "expected bool"]),
        ("sampling.stop=[a", ["sampling.stop", "not YAML flow syntax"]),
        ("sampling.stop=abc", ["sampling.stop", "expected list[str]"]),
        ("grpo.beta.x=1", ["grpo.beta is float", "no keys"]),
    ],
)
def test_a_bad_key_or_value_is_a_config_error_naming_it(item, needles):
    with pytest.raises(ConfigError) as err:
        parse_overrides([item])
    assert all(n in str(err.value) for n in needles), str(err.value)


@pytest.mark.parametrize("name", sorted(TRL_REFUSED))
@pytest.mark.parametrize("prefix", ["", "grpo.", "sampling."])
def test_a_refused_trl_name_names_the_field_to_use(name, prefix):
    with pytest.raises(ConfigError) as err:
        parse_overrides([f"{prefix}{name}=1"])
    message = str(err.value)
    assert "not accepted" in message
    assert any(key in message for key, _ in FIELDS), message


def test_refused_names_name_our_fields_that_exist():
    for why in TRL_REFUSED.values():
        named = [w.strip(".,;") for w in why.split() if "." in w.strip(".,;")]
        assert named and all(n.split("=")[0] in dict(FIELDS) for n in named), why


@pytest.mark.parametrize(("name", "key"), sorted(TRL_ALIASES.items()))
def test_every_trl_alias_names_a_field_and_reaches_it(name, key):
    assert key in dict(FIELDS)
    section, field = key.split(".")
    bare = parse_overrides([f"{name}=1"])
    assert field in bare[section]
    assert parse_overrides([f"{section}.{name}=1"]) == bare


@given(st.text())
def test_any_string_given_to_a_str_field_comes_back_unchanged(text):
    assert parse_overrides([f"run.env={text}"]) == {"run": {"env": text}}


@given(st.text().filter(lambda t: t.strip() not in NULLS))
def test_any_string_but_null_given_to_an_optional_str_field_comes_back_unchanged(text):
    assert parse_overrides([f"model.name={text}"]) == {"model": {"name": text}}


@given(st.integers())
def test_any_int_round_trips(number):
    assert parse_overrides([f"grpo.group_size={number}"]) == {"grpo": {"group_size": number}}


@given(st.floats(allow_nan=False))
def test_any_float_round_trips(number):
    assert parse_overrides([f"grpo.beta={number!r}"]) == {"grpo": {"beta": number}}


@given(st.lists(st.text(st.characters(max_codepoint=0xFFFF))))
def test_any_list_of_strings_round_trips_through_flow_syntax(items):
    # JSON is YAML flow syntax; each item stays a string, even "no" or "1". (Past U+FFFF
    # JSON writes surrogate pairs, which PyYAML reads as two characters.)
    assert parse_overrides([f"sampling.stop={json.dumps(items)}"]) == {"sampling": {"stop": items}}


# ---- with a config file -------------------------------------------------------------


def test_an_empty_yaml_section_with_set_on_it_works(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("grpo:\nrun:\n  env_kwargs:\n    tool_format: hermes\n")
    config = load(path, ["grpo.beta=0.1", "run.env_kwargs.families=[calculator]"])
    assert config.grpo.beta == 0.1
    assert config.grpo.group_size == Config().grpo.group_size
    assert config.run.env_kwargs == {"tool_format": "hermes", "families": ["calculator"]}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("grpo: 5\n", "section 'grpo' must hold a mapping"),
        ("grop:\n  beta: 1\n", "did you mean 'grpo'"),
        ("grpo:\n  bta: 1\n", "did you mean 'grpo.beta'"),
        ("grpo:\n  beta: [\n", "is not valid YAML"),
        ("- grpo\n", "must hold a mapping of sections"),
        ("grpo:\n  beta: -1\n", "grpo.beta"),
    ],
)
def test_a_bad_config_file_is_a_config_error(tmp_path, text, needle):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path, ["grpo.beta=0.1"] if "-1" not in text else [])
    assert needle in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        (
            "grpo:\n  beta: 0.1\nrun:\n  steps: 3\ngrpo:\n  group_size: 4\n",
            ["key 'grpo' is given again on line 5 (first on line 1)"],
        ),
        (
            "grpo:\n  beta: 0.1\n  epsilon: 0.2\n  beta: 0.2\n  beta: 0.3\n",
            [
                "key 'grpo.beta' is given again on line 4 (first on line 2)",
                "key 'grpo.beta' is given again on line 5 (first on line 2)",
            ],
        ),
        (
            "rewards:\n  functions:\n    - {fn: 'a:b', fn: 'c:d'}\n",
            ["key 'rewards.functions[0].fn' is given again on line 3 (first on line 3)"],
        ),
    ],
)
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path, text, problems):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    for read in (lambda: load(path, []), lambda: load_config(path)):
        with pytest.raises(ConfigError) as err:
            read()
        lines = str(err.value).splitlines()
        assert lines == [f"config file {str(path)!r}: {p}" for p in problems]


def test_a_merge_may_override_the_keys_it_brings_in(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run:\n  env_kwargs: {<<: {a: 1, b: 2}, a: 3}\n")
    assert load(path, []).run.env_kwargs == {"a": 3, "b": 2}


def test_every_unknown_key_of_the_file_and_of_set_is_reported_at_once(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "grpo:\n  bta: 1\n  epsilon: 0.2\ngrop:\n  beta: 1\nsampling:\n  temprature: 1\n"
        "rewards:\n  functions: [{fn: 'm:f', fnn: 1}]\nrun:\n  curriculum: {levls: [1]}\n"
    )
    with pytest.raises(ConfigError) as err:
        load(path, ["optim.lrr=1", "grpo.beta=0.1", "eval.nn=2", "rewards.functions=[{wieght: 1}]"])
    message = str(err.value)
    expected = {
        "grpo.bta": "valid fields of 'grpo': group_size",
        "grop": "section one of: model",
        "sampling.temprature": "valid fields of 'sampling': max_new_tokens",
        "rewards.functions[0].fnn": "valid fields of 'rewards.functions[0]': fn, weight",
        "run.curriculum.levls": "valid fields of 'run.curriculum': levels",
        "optim.lrr": "valid fields of 'optim': lr",
        "eval.nn": "valid fields of 'eval': every",
        "rewards.functions[0].wieght": "valid fields of 'rewards.functions[0]': fn, weight",
    }
    lines = message.splitlines()
    for key, valid in expected.items():
        (line,) = [x for x in lines if f"unknown config key {key!r}" in x]
        assert valid in line, line
    assert len(lines) == len(expected), message
    assert sum(str(path) in x for x in lines) == 5  # the file's keys name the file


def test_load_config_reports_every_unknown_key_and_bad_value_at_once():
    overrides = {"grpo.bta": 1, "grp.beta": 1, "grpo.beta": -1, "sampling.top_pp": 1}
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides)
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 4, lines
    assert "'grpo.bta' (did you mean 'grpo.beta'?); valid fields of 'grpo'" in lines[0]
    assert "'grp.beta'; keys look like section.field with section one of: model" in lines[1]
    assert "'sampling.top_pp' (did you mean 'sampling.top_p'?)" in lines[2]
    assert lines[3].startswith("  grpo.beta: Input should be greater than or equal to 0")


def test_a_rule_across_sections_is_its_message_alone_not_the_whole_config():
    with pytest.raises(ConfigError) as err:  # a field's error keeps the value it got
        load_config(overrides={"grpo.beta": -1})
    assert str(err.value).endswith(" (got -1)"), str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"pipeline.partial_rollouts": True})
    assert str(err.value).splitlines() == [
        "invalid config:",
        "  pipeline.partial_rollouts needs pipeline.max_off_policy_steps >= 1 (with 0 nothing "
        "is played while the learner steps)",
    ]


@pytest.mark.parametrize("name", ["math.yaml", "tool_call.yaml"])
def test_a_shipped_config_loads_as_load_config_reads_it(name):
    path = ROOT / "configs" / name
    assert load(path, []) == load_config(path)


def test_set_overrides_the_file_as_load_config_does():
    path = ROOT / "configs" / "math.yaml"
    ours = load(path, ["grpo.beta=0.02", "run.report_to=[]", "model.name=tiny-random"])
    theirs = load_config(
        path, {"grpo.beta": 0.02, "run.report_to": [], "model.name": "tiny-random"}
    )
    assert ours == theirs and ours.grpo.beta == 0.02


# ---- the reference and the version --------------------------------------------------


def test_the_markdown_lists_every_field_of_every_section():
    text = markdown()
    assert "generated" in text.splitlines()[0].lower()
    for section in Config.model_fields:
        assert f"\n## {section}\n" in text
    for key, description in FIELDS:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
        assert description.replace("|", "\\|") in row


def test_docs_configs_md_is_the_commands_output(capsys):
    assert main(["--markdown"]) == 0
    assert (ROOT / "docs" / "configs.md").read_text() == capsys.readouterr().out


def test_version_is_the_projects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert version() == project["version"]


def test_load_config_takes_dotted_keys_or_sections_and_refuses_other_shapes_by_name():
    both = load_config(overrides={"grpo": {"beta": 0.5, "group_size": 3}, "run.env": "code"})
    assert (both.grpo.beta, both.grpo.group_size, both.run.env) == (0.5, 3, "code")
    assert load_config(overrides={"grpo.beta": 0.3}).grpo.beta == 0.3
    kwargs = load_config(overrides={"run": {"env_kwargs": {"families": ["sql"]}}}).run.env_kwargs
    assert kwargs == {"families": ["sql"]}
    for shape in (["grpo.beta=0.1"], "grpo.beta=0.1"):
        with pytest.raises(ConfigError, match=r"overrides: got a (list|str); valid: a dict"):
            load_config(overrides=shape)
    with pytest.raises(ConfigError, match=r"unknown config key 'grpo.bta' \(did you mean"):
        load_config(overrides={"grpo": {"bta": 1}})

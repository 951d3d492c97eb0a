"""`agentgym/Harbor-v0` plays the Harbor tasks of `tests/harbor_tasks/` in real containers:
their images built here FROM the local sandbox image, their tests run after the episode,
a 2-step training run and an evaluation through the CLI on tiny-random.

Skipped as a whole, with the reason, where no Docker engine answers or the sandbox image
is missing, as tests/test_sandbox_docker.py is (`bash sandboxes/docker_setup.sh`)."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from agentgym.sandboxes.contract import SandboxUnavailableError

try:
    from agentgym.sandboxes.docker import DockerSandbox

    DockerSandbox().close()
except SandboxUnavailableError as exc:
    pytest.skip(f"docker sandbox unavailable: {exc}", allow_module_level=True)

import docker  # noqa: E402

import agentgym  # noqa: F401, E402  (registers agentgym/Harbor-v0)
from agentgym.cli import main  # noqa: E402
from agentgym.env.checker import check_agent_env  # noqa: E402
from agentgym.envs.harbor.container import LABEL  # noqa: E402
from agentgym.envs.harbor.env import MAX_OUTPUT_BYTES  # noqa: E402
from agentgym.envs.harbor.schema import HarborTaskError  # noqa: E402
from agentgym.types import ToolCall  # noqa: E402

TASKS = Path(__file__).parent / "harbor_tasks"


def make(folder: Path = TASKS, **kwargs) -> gym.Env:
    return gym.make("agentgym/Harbor-v0", folder=str(folder), **kwargs)


@pytest.fixture(scope="module")
def env():
    env = make()
    yield env
    env.close()


def call(env: gym.Env, name: str, **arguments) -> str:
    """An assistant turn making one call, in the env's format."""
    return env.unwrapped.format.render_call(ToolCall(name, arguments))


def solve_script(task_id: str) -> str:
    return (TASKS / task_id / "solution" / "solve.sh").read_text()


def episode(env: gym.Env, task_id: str, *turns: str) -> tuple[list, float, dict]:
    """Plays the turns; returns the last step's observation, the summed reward and its info."""
    env.reset(options={"task_id": task_id})
    total, obs, info = 0.0, [], {}
    for turn in turns:
        obs, reward, _, _, info = env.step(turn)
        total += reward
    return obs, total, info


def containers(env: gym.Env | None = None) -> list[str]:
    """The Harbor containers `env` started that still exist (any env's: None)."""
    label = LABEL if env is None else f"{LABEL}={env.unwrapped.engine.instance}"
    client = docker.from_env()
    try:
        return [c.name for c in client.containers.list(all=True, filters={"label": label})]
    finally:
        client.close()


# --- the solution run: reward 1 with it, 0 without ------------------------------------------


@pytest.mark.parametrize("task_id", ["hello-file", "fix-sum"])
def test_the_solution_through_the_shell_tool_then_the_tests_pay_1(env, task_id):
    obs, reward, info = episode(env, task_id, call(env, "shell", command=solve_script(task_id)))
    assert reward == 0.0 and obs[0]["content"].startswith("exit code 0")
    obs, reward, terminated, truncated, info = env.step("Done.")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["harbor"]["reason"] is None and info["harbor"]["test_exit_code"] == 0


def test_without_the_solution_the_tests_pay_0_and_the_parts_come_from_reward_json(env):
    _, reward, info = episode(env, "fix-sum", "I am done.")
    assert reward == 0.0
    assert info["reward_parts"] == {"reward": 0.0, "cases": pytest.approx(1 / 3)}
    _, reward, info = episode(env, "hello-file", "I am done.")
    assert (reward, info["reward_parts"]) == (0.0, {"reward": 0.0})


def test_each_episode_gets_a_fresh_container(env):
    write = call(env, "write_file", path="/app/hello.txt", content="hello\n")
    assert episode(env, "hello-file", write, "Done.")[1] == 1.0
    _, reward, _ = episode(env, "hello-file", "Done.")
    assert reward == 0.0  # the file the last episode wrote is gone with its container


# --- the tools --------------------------------------------------------------------------------


def test_write_and_edit_file_then_the_tests_pass(env):
    turns = [
        call(env, "write_file", path="notes/x.txt", content="hi"),
        call(env, "edit_file", path="/app/total.py", old="numbers[1:]", new="numbers"),
        call(env, "edit_file", path="/app/total.py", old="nowhere", new="x"),
        call(env, "shell", command="cat notes/x.txt; pwd"),
        "Fixed.",
    ]
    env.reset(options={"task_id": "fix-sum"})
    replies = [env.step(t) for t in turns]
    assert replies[0][0][0]["content"] == "wrote 2 bytes to notes/x.txt"
    assert replies[1][0][0]["content"].startswith("wrote")
    assert "occurs 0 times" in replies[2][0][0]["content"]
    assert replies[3][0][0]["content"] == "exit code 0\nstdout:\nhi/app"
    assert replies[4][1] == 1.0


def test_the_shell_reports_exit_codes_stderr_time_limits_and_cuts_output(tmp_path):
    env = make(command_timeout_s=1.0)
    try:
        env.reset(options={"task_id": "hello-file"})
        obs, *_ = env.step(call(env, "shell", command="echo oops >&2; exit 3"))
        assert obs[0]["content"] == "exit code 3\nstderr:\noops"
        started = time.monotonic()
        obs, *_ = env.step(call(env, "shell", command="sleep 30"))
        assert "killed: past the 1 s limit" in obs[0]["content"]
        assert time.monotonic() - started < 10
        obs, *_ = env.step(call(env, "shell", command="head -c 100000 /dev/zero | tr '\\0' a"))
        assert f"[output cut at {MAX_OUTPUT_BYTES} bytes per stream]" in obs[0]["content"]
        obs, *_ = env.step(call(env, "shell", command="getent hosts example.com || echo offline"))
        assert "offline" in obs[0]["content"]
    finally:
        env.close()


def test_containers_are_removed_at_reset_and_close():
    env = make()
    env.reset(options={"task_id": "hello-file"})
    env.step(call(env, "shell", command="true"))
    assert len(containers(env)) == 1
    env.reset(options={"task_id": "hello-file"})
    assert containers(env) == []
    env.step(call(env, "shell", command="true"))
    env.close()
    assert containers(env) == []


def test_running_out_of_turns_runs_the_tests(tmp_path):
    env = make(max_turns=2)
    try:
        env.reset(options={"task_id": "hello-file"})
        env.step(call(env, "shell", command="true"))
        _, reward, terminated, truncated, info = env.step(
            call(env, "shell", command=solve_script("hello-file"))
        )
        assert (reward, terminated, truncated) == (1.0, False, True)
    finally:
        env.close()


def test_a_garbled_reward_file_scores_0_with_the_reason(tmp_path):
    folder = tmp_path / "tasks"
    shutil.copytree(TASKS / "hello-file", folder / "garbled")
    (folder / "garbled" / "tests" / "test.sh").write_text(
        "#!/bin/bash\necho 'all good' > /logs/verifier/reward.txt\n"
    )
    env = make(folder)
    try:
        _, reward, info = episode(env, "garbled", "Done.")
        assert reward == 0.0 and "holds 'all good\\n', not a number" in info["harbor"]["reason"]
    finally:
        env.close()


# --- the splits and the checkers -----------------------------------------------------------------


def test_splits_are_disjoint_and_checkers_pass(env):
    agent = env.unwrapped
    assert (agent.splits["train"], agent.splits["test"]) == (["fix-sum"], ["hello-file"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version.*")
        check_env(agent)
        made: list[gym.Env] = []
        try:
            check_agent_env(env, lambda: made.append(make()) or made[-1], sample=4)
        finally:
            for each in made:
                each.close()


# --- refusals before the model loads ------------------------------------------------------------


def unbuildable(tmp_path: Path) -> Path:
    folder = tmp_path / "tasks"
    shutil.copytree(TASKS / "hello-file", folder / "needs-pull")
    (folder / "needs-pull" / "environment" / "Dockerfile").write_text(
        "FROM agentgym-test/not-here:1.0\nRUN true\n"
    )
    return folder


def test_a_task_whose_image_cannot_be_built_is_refused_by_name(tmp_path):
    folder = unbuildable(tmp_path)
    with pytest.raises(HarborTaskError) as err:
        make(folder)
    message = str(err.value)
    assert "Harbor task 'needs-pull'" in message
    assert str(folder / "needs-pull" / "environment" / "Dockerfile") in message
    assert "FROM agentgym-test/not-here:1.0: not on this machine" in message


def test_train_refuses_the_unbuildable_task_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import agentgym.policy.models as models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model_and_tokenizer", no_loading)
    folder = unbuildable(tmp_path)
    argv = ["train", "--env", f"harbor:{folder}", "--model", "tiny-random", "--steps", "2"]
    assert main([*argv, "--output", str(tmp_path / "run"), *SETS]) != 0
    err = capsys.readouterr().err
    assert "needs-pull" in err and "agentgym-test/not-here:1.0" in err


# --- training and evaluation through the CLI ---------------------------------------------

SETS = [
    f"--set={s}"
    for s in (
        "grpo.tasks_per_step=1", "grpo.group_size=2", "sampling.max_new_tokens=8",
        "run.report_to=[]",
    )
]  # fmt: skip


def test_train_two_steps_and_evaluate_on_a_harbor_task_folder(tmp_path):
    before = set(containers())
    run = tmp_path / "run"
    argv = ["train", "--env", f"harbor:{TASKS}", "--model", "tiny-random", "--steps", "2"]
    assert main([*argv, "--output", str(run), *SETS]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["failures/fraction"] == 0 for r in rows)
    report = tmp_path / "report"
    evaluate = ["eval", "--env", f"harbor:{TASKS}", "--model", str(run / "checkpoint-000002")]
    assert main([*evaluate, "--tasks", "1", "--output", str(report)]) == 0
    tasks = json.loads((report / "report.json").read_text())["tasks"]["model"]
    assert [t["task_id"] for t in tasks] == ["hello-file"]
    assert set(containers()) <= before  # each episode's container removed

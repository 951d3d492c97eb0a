"""OpenEnv both ways (docs/ecosystem.md): `agentgym/OpenEnv-v0` plays an OpenEnv server
written with openenv-core (`tests/openenv_servers.py`), and `agentgym serve-env` serves
agentgym's environments to openenv-core's own client. Real servers on loopback ports, no
mocks; the model is tiny-random, built in code."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip(
    "openenv", reason="openenv-core is not installed (pip install 'agentgym[openenv]')"
)
from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from openenv_servers import FOLDER, EchoDigit, serve  # noqa: E402

import agentgym  # noqa: F401, E402  (registers agentgym/OpenEnv-v0)
from agentgym.cli import main  # noqa: E402
from agentgym.env.checker import check_agent_env  # noqa: E402
from agentgym.envs.openenv.env import TEST_SEEDS_FROM  # noqa: E402
from agentgym.envs.openenv.frames import (  # noqa: E402
    OpenEnvCapacityError,
    OpenEnvError,
    read_frame,
    render_observation,
)
from agentgym.envs.openenv.launch import LAUNCHER, Source  # noqa: E402
from agentgym.serve.app import Server  # noqa: E402
from agentgym.serve.openenv_server import create_env_app  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERVER = "http://127.0.0.1:1"


@pytest.fixture(scope="module")
def echo():
    with serve() as server:
        yield f"http://127.0.0.1:{server.port}"


def make(url: str, **kwargs) -> gym.Env:
    return gym.make("agentgym/OpenEnv-v0", url=url, **kwargs)


# --- agentgym/OpenEnv-v0 plays an OpenEnv server ------------------------------------------


def test_an_episode_is_played_over_the_socket_with_the_servers_rewards(echo):
    env = make(echo)
    obs, info = env.reset(options={"task_id": "train/7"})
    assert obs == [{"role": "user", "content": "Say the digit 7."}]
    assert info["task_id"] == "train/7"
    obs, reward, terminated, _, info = env.step("it is 3")
    assert (obs, reward, terminated) == ([{"role": "user", "content": "No: say 7."}], 0.0, False)
    # the second step reaches the same server-side episode: the socket carries its state
    obs, reward, terminated, _, info = env.step("7")
    assert (reward, terminated, info["reward_parts"]) == (1.0, True, {"openenv": 1.0})
    env.close()


def test_solved_at_makes_an_episode_that_earns_it_correct(echo):
    env = make(echo, solved_at=1.0)
    env.reset(options={"task_id": "train/4"})
    _, _, terminated, _, info = env.step("five")
    assert not terminated and info["reward_parts"]["correctness"] == 0.0
    _, _, terminated, _, info = env.step("4")
    assert terminated and info["reward_parts"] == {"openenv": 1.0, "correctness": 1.0}
    env.reset(options={"task_id": "train/4"})
    env.step("no")
    _, _, terminated, _, info = env.step("no")
    assert terminated and info["reward_parts"]["correctness"] == 0.0
    env.close()


def test_a_test_task_resets_the_server_with_a_seed_no_train_task_uses(echo):
    env = make(echo)
    obs, info = env.reset(options={"task_id": "test/4"})
    digit = (TEST_SEEDS_FROM + 4) % 10
    assert info["split"] == "test" and obs[0]["content"] == f"Say the digit {digit}."
    env.close()


def test_another_action_field_and_observation_field(echo):
    env = make(echo, action_field="message", observation_field="prompt", system_prompt="Be brief.")
    obs, _ = env.reset(options={"task_id": "train/2"})
    assert [m["role"] for m in obs] == ["system", "user"]
    env.close()
    bad = make(echo, action_field="text")
    bad.reset(seed=0)
    with pytest.raises(OpenEnvError, match="VALIDATION_ERROR|EXECUTION_ERROR"):
        bad.step("2")
    bad.close()


def test_gymnasiums_checker_and_agentgyms_pass_against_a_server(echo):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version.*")
        check_env(make(echo).unwrapped)
        check_agent_env(make(echo), lambda: make(echo), sample=8)


def test_a_server_over_capacity_is_named_with_its_limit_and_not_retried():
    with serve(max_sessions=1) as server:
        url = f"http://127.0.0.1:{server.port}"
        first, second = make(url), make(url)
        first.reset(seed=0)
        started = time.monotonic()
        with pytest.raises(OpenEnvCapacityError, match=rf"{url} is at its session limit \(1 of 1"):
            second.reset(seed=0)
        assert time.monotonic() - started < 5
        first.close()
        second.close()


def test_a_server_that_stops_answering_fails_the_episode(echo):
    env = make(echo, timeout_s=0.5)
    env.reset(seed=0)
    EchoDigit.hold.set()
    try:
        with pytest.raises(OpenEnvError, match=rf"{echo} did not answer a step in 0.5 s"):
            env.step("0")
    finally:
        EchoDigit.hold.clear()
    env.close()


def test_a_server_that_is_gone_fails_the_reset():
    with serve() as server:
        url = f"http://127.0.0.1:{server.port}"
        env = make(url, connect_timeout_s=2.0)
        env.reset(seed=0)
    with pytest.raises(OpenEnvError, match=rf"OpenEnv server {url} failed"):
        env.step("0")
    with pytest.raises(OpenEnvError, match=rf"OpenEnv server {url} failed during a reset"):
        env.reset(seed=0)
    env.close()


def test_the_url_is_required():
    with pytest.raises(ValueError, match="run.env_kwargs.url"):
        gym.make("agentgym/OpenEnv-v0")


SMALL = [
    "grpo.tasks_per_step=2", "grpo.group_size=2", "sampling.max_new_tokens=8",
    "run.report_to=[]",
]  # fmt: skip


def train_two_steps_and_evaluate(tmp_path: Path, server: list[str]) -> None:
    """`agentgym train` 2 steps then `agentgym eval` of its checkpoint on 2 test tasks, on
    the server the `run.env_kwargs` settings in `server` give."""
    run = tmp_path / "run"
    argv = ["train", "--env", "openenv", "--model", "tiny-random", "--steps", "2"]
    assert main([*argv, "--output", str(run), *(f"--set={s}" for s in (*SMALL, *server))]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["failures/fraction"] == 0 for r in rows)
    report = tmp_path / "report"
    evaluate = ["eval", "--env", "openenv", "--model", str(run / "checkpoint-000002")]
    sets = [f"--set={s}" for s in server]
    assert main([*evaluate, "--tasks", "2", "--output", str(report), *sets]) == 0
    tasks = json.loads((report / "report.json").read_text())["tasks"]["model"]
    assert [t["task_id"] for t in tasks] == ["test/0", "test/1"]


def test_train_two_steps_and_evaluate_on_an_openenv_server(echo, tmp_path):
    train_two_steps_and_evaluate(tmp_path, [f"run.env_kwargs.url={echo}"])


def test_train_two_steps_and_evaluate_on_a_server_started_from_its_folder(tmp_path):
    folder = [f"run.env_kwargs.folder={FOLDER}", "run.env_kwargs.sessions_per_server=64"]
    train_two_steps_and_evaluate(tmp_path, folder)
    assert LAUNCHER.running(Source(FOLDER)) == 0  # every env closed: its servers stopped


def test_a_server_that_stops_answering_stops_the_run_by_the_failure_policy(echo, tmp_path, capsys):
    argv = ["train", "--env", "openenv", "--model", "tiny-random", "--steps", "2"]
    sets = [*SMALL, f"run.env_kwargs.url={echo}", "run.env_kwargs.timeout_s=0.5"]
    sets += ["run.max_failed_steps=1"]
    EchoDigit.hold.set()  # resets answer (preflight passes); steps never do
    try:
        code = main([*argv, "--output", str(tmp_path / "run"), *(f"--set={s}" for s in sets)])
    finally:
        EchoDigit.hold.clear()
    assert code == 1
    err = capsys.readouterr().err
    assert "OpenEnvError" in err and f"{echo} did not answer a step in 0.5 s" in err


# --- OpenEnv-v0 starts the server itself, from a folder or a local image ------------------


def test_env_copies_share_a_folders_server_up_to_its_sessions_then_start_another():
    shared = [make(None, folder=str(FOLDER), sessions_per_server=2) for _ in range(3)]
    source = Source(FOLDER)
    try:
        for i, env in enumerate(shared):
            obs, _ = env.reset(options={"task_id": f"train/{i + 3}"})
            assert obs[-1]["content"] == f"Say the digit {i + 3}."
            _, reward, terminated, _, _ = env.step(str(i + 3))
            assert reward == 1.0 and terminated
        urls = [env.unwrapped.url for env in shared]
        assert urls[0] == urls[1] != urls[2] and LAUNCHER.running(source) == 2
    finally:
        for env in shared:
            env.close()
    assert LAUNCHER.running(source) == 0


def test_a_folder_that_cannot_serve_is_named_with_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        make(None, folder=str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"openenv.yaml is missing"):
        make(None, folder=str(tmp_path))
    (tmp_path / "openenv.yaml").write_text("app: server.app\n")
    with pytest.raises(ValueError, match=r"app is 'server.app'; valid: 'module:attribute'"):
        make(None, folder=str(tmp_path))
    (tmp_path / "openenv.yaml").write_text("app: no_such_module:app\n")
    env = make(None, folder=str(tmp_path), start_timeout_s=30)
    with pytest.raises(OpenEnvError, match=r"(?s)exited while starting.*no_such_module"):
        env.reset(seed=0)
    env.close()
    assert LAUNCHER.running(Source(tmp_path.resolve(), start_timeout_s=30)) == 0


def test_one_server_is_given_not_two():
    with pytest.raises(
        ValueError, match=r"give one of run.env_kwargs.url.*given: \['url', 'folder'\]"
    ):
        make("http://127.0.0.1:1", folder=str(FOLDER))


def test_an_image_not_on_this_machine_is_refused_by_name_before_any_episode():
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True).returncode
    ):
        pytest.skip("no Docker engine answers here (make sandbox-engines starts one)")
    with pytest.raises(
        OpenEnvError, match=r"image='agentgym-no-such:image' is not on this machine.*pulls nothing"
    ):
        make(None, image="agentgym-no-such:image")


# --- agentgym serve-env, played by openenv-core's own client --------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_tool_call():
    port = free_port()
    cmd = [sys.executable, "-m", "agentgym", "serve-env", "tool_call", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_openenv_cores_client_plays_tool_call_through_serve_env(served_tool_call):
    local = gym.make("agentgym/ToolCall-v0").unwrapped
    task = local.load_task("calculator/train/0")
    turns = local.demonstration(task)
    with GenericEnvClient(base_url=served_tool_call).sync() as client:
        result = client.reset(seed=0, task_id=task.task_id)
        assert result.observation["task_id"] == task.task_id
        assert result.observation["messages"][-1]["content"] == task.prompt
        assert result.observation["tools"] and not result.done
        total = 0.0
        for turn in turns:
            result = client.step({"message": turn})
            total += result.reward or 0.0
            if result.done:
                break
        assert result.done and total > 1.0
        assert result.observation["reward_parts"]["correctness"] == 1.0


def test_serve_env_refuses_a_host_off_loopback_without_a_key(capsys):
    assert main(["serve-env", "tool_call", "--host", "0.0.0.0"]) == 2
    assert "--host 0.0.0.0 is not loopback: give --api-key" in capsys.readouterr().err


def test_serve_env_refuses_a_bad_port_and_an_unknown_env(capsys):
    assert main(["serve-env", "tool_call", "--port", "70000"]) == 2
    assert main(["serve-env", "no_such_env"]) == 2
    assert "unknown environment 'no_such_env'" in capsys.readouterr().err


def test_a_keyed_server_refuses_a_client_without_the_key():
    app = create_env_app("tool_call", {}, max_sessions=4, api_key="k3y")
    with Server(app, "127.0.0.1", 0) as server:
        url = f"http://127.0.0.1:{server.port}"
        with pytest.raises(ConnectionError):
            GenericEnvClient(base_url=url).sync().connect()
        env = make(url, api_key="k3y")
        _, info = env.reset(seed=1)
        assert info["task_id"] == "train/" + info["task_id"].split("/")[1]
        env.close()


# --- the frames the server sends, read ---------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@given(st.text(max_size=200) | st.binary(max_size=50) | JSON.map(json.dumps))
def test_any_frame_is_an_observation_or_an_openenv_error(raw):
    try:
        read_frame(raw, SERVER)
    except OpenEnvError as err:
        assert SERVER in str(err)


@given(
    st.dictionaries(st.text(max_size=6), JSON, max_size=4),
    st.none() | st.integers(-5, 5) | st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)
def test_an_observation_frame_is_read_as_sent(observation, reward, done):
    frame = {
        "type": "observation",
        "data": {"observation": observation, "reward": reward, "done": done},
    }
    reply = read_frame(json.dumps(frame), SERVER)
    assert reply.observation == observation and reply.done is done
    assert reply.reward == (0.0 if reward is None else float(reward))
    for message in render_observation(reply.observation, None):
        assert message.role == "user" or "messages" in observation


@given(st.integers(0, 99), st.integers(1, 99))
def test_a_capacity_frame_names_the_server_and_its_limit(active, most):
    data = {
        "code": "CAPACITY_REACHED",
        "message": "full",
        "active_sessions": active,
        "max_sessions": most,
    }
    with pytest.raises(OpenEnvCapacityError, match=f"{active} of {most} sessions"):
        read_frame(json.dumps({"type": "error", "data": data}), SERVER)

"""MCP servers as a `ToolEnv`'s tool source, through `env_kwargs` (stdio and streamable HTTP):
listed at reset, called in episodes, a server killed mid-episode answered with an error
observation and restarted, and no process left after the env, or a whole training run."""

from __future__ import annotations

import json
import os
import signal
import sys

import gymnasium as gym
import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'agentgym[mcp]')")

from test_mcp import SERVER, HttpServer, children  # noqa: E402

import agentgym  # noqa: E402, F401  (registers the built-in environments)

ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
WHOAMI = '<tool_call>{"name": "whoami", "arguments": {}}</tool_call>'
NAP = '<tool_call>{"name": "nap", "arguments": {"seconds": 30}}</tool_call>'


@pytest.fixture(params=["stdio", "http"])
def spec(request):
    if request.param == "stdio":
        yield {"command": [sys.executable, SERVER, "stdio"], "timeout_s": 2.0}
        return
    http = HttpServer().start()
    try:
        yield {"url": http.url, "timeout_s": 2.0}
    finally:
        http.kill()


def _env(spec):
    return gym.make(
        "agentgym/ToolCall-v0", families=["calculator"], tool_format="hermes", mcp_servers=[spec]
    )


def test_the_servers_tools_join_the_envs_and_answer_calls(spec):
    before = children()
    env = _env(spec)
    _, info = env.reset(seed=0)
    names = [t["function"]["name"] for t in info["tools"]]
    assert names[0] == "calculator" and {"add", "nap", "explode"} <= set(names)
    assert '"name": "add"' in env.unwrapped.system_message  # described to the model too
    obs, _, terminated, _, info = env.step(ADD)
    assert (obs, terminated, info["tool_errors"]) == (
        [{"role": "tool", "content": "5", "name": "add"}], False, {},
    )  # fmt: skip
    obs, _, _, _, info = env.step('<tool_call>{"name": "explode", "arguments": {"reason": "no"}}'
                                  "</tool_call>")  # fmt: skip
    assert info["tool_errors"] == {"tool_raised": 1} and "no" in obs[0]["content"]
    obs, _, _, _, info = env.step(NAP)  # past the server's 2 s limit
    assert info["tool_errors"] == {"timeout": 1}
    obs, _, _, _, info = env.step(ADD)  # a hung stdio server was killed; it starts again
    assert obs[0]["content"] == "5"
    env.close()
    assert children() <= before


def test_a_stdio_server_killed_mid_episode_is_an_error_observation_then_restarts():
    before = children()
    env = _env({"command": [sys.executable, SERVER, "stdio"]})
    env.reset(seed=0)
    obs, *_ = env.step(WHOAMI)
    os.kill(int(obs[0]["content"]), signal.SIGKILL)
    obs, _, terminated, _, info = env.step(ADD)
    assert not terminated and info["tool_errors"] == {"tool_raised": 1}
    assert obs[0]["content"].startswith("Error: ") and "starts it again" in obs[0]["content"]
    obs, _, _, _, info = env.step(ADD)
    assert obs[0]["content"] == "5" and info["tool_errors"] == {}
    env.close()
    assert children() <= before


def test_a_bad_server_spec_names_the_field():
    with pytest.raises(ValueError, match="comand"):
        _env({"comand": ["x"]})


def test_a_training_run_leaves_no_server_process(tmp_path):
    from agentgym.cli import main

    before = children()
    servers = json.dumps([{"command": [sys.executable, SERVER, "stdio"]}])
    out = tmp_path / "run"
    args = [
        "train", "--env", "tool_call", "--model", "tiny-random", "--steps", "2",
        "--set", f"run.env_kwargs.mcp_servers={servers}",
        "--set", "run.env_kwargs.families=[calculator]",
        "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2",
        "--set", "sampling.max_new_tokens=16", "--set", "eval.every=0",
        "--set", "eval.report_tasks=0", "--output", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["env/errors"] for r in rows] == [0.0, 0.0]
    assert children() <= before

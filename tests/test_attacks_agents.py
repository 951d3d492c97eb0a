"""Attacks on the agent-program rollout (`run.agent`, issue 53): agents that block, swallow
their cancellation, raise SystemExit or KeyboardInterrupt, leave a thread running, or call
another episode's endpoint. Each must fail its own episode only, in bounded time, and
record nothing anywhere else.

The agents are in `tests/agents.py`; they sample with the real tiny-random model."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_agents import _play

from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.serve.agent_thread import run_on_thread
from agentgym.serve.agents import AgentTask
from agentgym.types import TaskSpec

ROOT = Path(__file__).resolve().parent.parent
PAST = "the agent ran past run.agent_timeout_s (2 s)"


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny-random")


@pytest.mark.parametrize(
    ("agent", "error", "deadline"),
    [
        ("agents:blocks", PAST, 2.0),
        ("agents:ignores_cancellation", PAST, 2.0),
        # a deadline the model's own time cannot reach on a loaded machine
        ("agents:exits", "the agent raised SystemExit: 3", 60.0),
        ("agents:interrupts", "the agent raised KeyboardInterrupt", 60.0),
    ],
)
def test_an_agent_that_blocks_or_exits_fails_its_episode_in_bounded_time(
    tiny, agent, error, deadline
):
    started = time.monotonic()
    played, _ = _play(agent, HFPolicy(*tiny), tiny[1], [TaskSpec(seed=1)], 2, timeout_s=deadline)
    took = time.monotonic() - started
    assert [t.error for t in played] == [error, error]
    assert not any(t.scorable for t in played)
    assert took < 2.0 + 30, took  # the deadline, or the exit, and two requests' own time


def test_past_its_deadline_an_agent_can_no_longer_touch_its_environment():
    from agentgym import Task

    task = AgentTask("t1", [], [], Task(prompt="p", answer="a", task_id="t1"))
    task._revoked.set()
    with pytest.raises(RuntimeError, match="'t1': call_tool after the episode ended"):
        asyncio.run(task.call_tool("add", {"a": 1}))


def test_a_cooperative_agent_is_cancelled_at_its_deadline_and_its_thread_ends():
    """An agent that awaits ends at the deadline (its task is cancelled): no thread is left."""
    ended = threading.Event()

    async def waits() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.set()

    (result, error), late = asyncio.run(run_on_thread(waits, 0.5, "agentgym-agent-test"))
    assert (result, late) == (None, True) and error == (
        "the agent ran past run.agent_timeout_s (0.5 s)"
    )
    assert ended.wait(5), "the agent's task was not cancelled"


def test_an_agent_calling_another_episodes_endpoint_is_refused_and_recorded_nowhere(tiny):
    import agents

    agents.SEEN["urls"].clear()
    agents.SEEN["answers"].clear()
    played, _ = _play(
        "agents:calls_another_episode", HFPolicy(*tiny), tiny[1], [TaskSpec(seed=1)], 2
    )
    # the other's URL with its own key, with none, with a made-up one
    assert agents.SEEN["answers"] == [403, 403, 403]
    assert [t.error for t in played] == [None, None]
    # each episode holds its own one request: the refused ones reached no recorder
    assert [t.counts["split_samples"] for t in played] == [0.0, 0.0]
    assert [len(t.turns) for t in played] == [1, 1]


@pytest.mark.slow
def test_a_thread_an_agent_leaves_running_does_not_keep_the_run_alive(tmp_path):
    sets = ["grpo.tasks_per_step=1", "grpo.group_size=2", "sampling.max_new_tokens=8",
            "eval.every=0", "eval.report_tasks=0", "run.report_to=[]"]  # fmt: skip
    command = [
        sys.executable, "-m", "agentgym", "train", "--env", "tool_call",
        "--model", "tiny-random", "--agent", "agents:leaves_a_thread", "--steps", "1",
        "--output", str(tmp_path / "run"), *(f"--set={s}" for s in sets),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 threads left running (agents-leftover, agents-leftover); exiting without them" in (
        done.stderr
    )
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]

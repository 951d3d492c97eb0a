"""Reward functions the failure tests name as "reward_fns_fixture:<function>".

They run in `RewardFunctions`' worker process, which imports this module by
name, so they live here rather than in a test file.
"""

from __future__ import annotations

import os
import subprocess
import time


def half(**kwargs):
    return 0.5


def as_told(task_id, messages, completion, **kwargs):
    """Does what the episode's task id says, so that one worker serves every case."""
    if task_id == "raise":
        raise ValueError("boom")
    if task_id == "slow":
        time.sleep(60)
    if task_id == "exit":
        os._exit(3)
    told = {"nan": float("nan"), "inf": float("inf"), "none": None, "text": "1.0"}
    if task_id in told:
        return told[task_id]
    if task_id == "count":
        return len(messages)  # so a test sees the conversation it was given
    return 0.5


def raises_if_flagged(messages, **kwargs):
    if messages[0]["content"] == "flagged":
        raise ValueError("flagged episode")
    return 0.25


def starts_a_sleeper(**kwargs):
    """Starts `sleep 60`, writes its pid to $REWARD_FIXTURE_PIDFILE, then hangs."""
    child = subprocess.Popen(["sleep", "60"])
    with open(os.environ["REWARD_FIXTURE_PIDFILE"], "w") as f:
        f.write(str(child.pid))
    time.sleep(60)


def takes_no_kwargs(completion):
    return 1.0


def digit_share(completion, **kwargs):
    """The share of the completion's characters that are digits (varies within a group,
    so a run with it trains on different advantages; `bench/same_run.py matrix` uses it)."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def text_length(completion, **kwargs):
    """The completion's characters / 100: tokens decode to texts of different lengths, so
    it varies within a group even where no sample writes a digit (tests/test_player.py)."""
    return len(completion) / 100


def turn_count(messages, completion, task_id, env_reward, env_reward_parts, turns):
    """Names `turns`: gets the assistant's turns as a list (their count, checked against the
    joined `completion`)."""
    assert isinstance(turns, list) and "\n".join(turns) == completion
    return float(len(turns))


def exact_five(messages, completion, task_id, env_reward, env_reward_parts):
    """Names only the five arguments, no **kwargs: it must not be given `turns`."""
    return 1.0

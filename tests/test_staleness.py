"""Asynchronous GRPO's staleness rule by hand (`agentgym/rollout/ahead.py`): how far behind
an episode is, which groups are dropped, and the figures logged. Apart from test_async.py's
runs so that `make mutate` (module `ahead`) runs these alone against each mutant."""

from __future__ import annotations

import pytest

from agentgym import records
from agentgym.rollout.ahead import drop_stale, stale_groups, staleness
from agentgym.types import StepRecord, TaskSpec, TrainingError, Trajectory


def _trajectory(version: int, task: str = "t/1") -> Trajectory:
    return Trajectory(
        task_id=task, group=0, tokens=(1, 2, 3, 4), loss_mask=(0, 1, 0, 1),
        logprobs=(0.0, -0.5, 0.0, -0.5), prompt_length=1, reward=1.0, reward_parts={},
        turns=(), finish_reason="stop", truncated=False,
        token_versions=(-1, version, -1, version + 1),
    )  # fmt: skip


def test_staleness_is_counted_from_the_oldest_sampled_token():
    assert staleness(_trajectory(3), 5) == 2  # tokens of versions 3 and 4
    assert staleness(_trajectory(5), 5) == 0
    bare = Trajectory(task_id="t", group=0, tokens=(1,), loss_mask=(0,), logprobs=(0.0,),
                      prompt_length=1, reward=0.0, reward_parts={}, turns=(),
                      finish_reason="stop", truncated=False)  # fmt: skip
    assert staleness(bare, 5) == 0  # no sampled token


def test_groups_more_than_k_behind_are_dropped_and_counted_by_hand():
    # three groups of two at step 6 (version 5), k = 1: versions 4, 3 (one stale episode
    # spoils its group), 5
    trajectories = tuple(_trajectory(v, f"t/{i // 2}") for i, v in enumerate([4, 4, 4, 3, 5, 5]))
    specs = tuple(TaskSpec(seed=s) for s in (10, 11, 12))
    record = StepRecord(6, 5, specs, trajectories)
    assert stale_groups(trajectories, 2, 5, 1) == [1]
    assert type(stale_groups(trajectories, 2, 5, 1)[0]) is int  # an index, not 1.0
    kept = drop_stale(record, group_size=2, limit=1)
    assert [s.seed for s in kept.specs] == [10, 12]
    assert [t.task_id for t in kept.trajectories] == ["t/0", "t/0", "t/2", "t/2"]
    assert kept.pipeline == {
        records.STALENESS_MEAN: 0.5,  # (1 + 1 + 0 + 0) / 4
        records.STALENESS_MAX: 1.0,
        records.STALE_GROUPS: 1.0,
    }
    assert drop_stale(record, group_size=2, limit=2).pipeline[records.STALE_GROUPS] == 0.0
    with pytest.raises(TrainingError, match="every group was sampled more than 0 versions"):
        drop_stale(StepRecord(6, 5, specs[:1], trajectories[:2]), group_size=2, limit=0)


def test_tokens_of_version_0_count_and_unsampled_ones_do_not():
    """Version 0 (the start model) is a version like any; -1 marks a token not sampled (the
    prompt, a tool's reply)."""
    assert staleness(_trajectory(0), 2) == 2
    assert stale_groups((_trajectory(0), _trajectory(1)), 2, 2, 1) == [0]
    assert stale_groups((_trajectory(1), _trajectory(1)), 2, 2, 1) == []

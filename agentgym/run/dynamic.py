"""Dynamic sampling (`grpo.dynamic_sampling`, DAPO: Yu et al. 2025, Sec. 3.2): a group whose
rewards are all equal carries no gradient, so the step samples more tasks until it has
`grpo.tasks_per_step` groups that do, at most `grpo.max_resample_rounds` more rounds of
`tasks_per_step` tasks each.

The step trains on the informative groups in the order they were played, up to
`tasks_per_step`; when the rounds run out first, the flat groups of the first round fill
it up to `tasks_per_step` (they carry no gradient, and keep the step's size and figures
comparable). Each group gets a fresh group index in that order. The rounds and what they
found are logged (`records.RESAMPLE_ROUNDS`, `records.INFORMATIVE_GROUPS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from agentgym import records
from agentgym.learn import grpo
from agentgym.types import StepRecord, step_reward_targets


def informative(record: StepRecord, group_size: int) -> list[int]:
    """The indexes of `record`'s groups whose scored rewards are not all equal."""
    assert record.rewards is not None
    flat = grpo.flat_groups(record.rewards, group_size, scorable=record.scorable)
    return [i for i, f in enumerate(flat.tolist()) if not f]


def sample_until_informative(
    record: StepRecord, more: Callable[[], StepRecord], group_size: int, rounds: int
) -> StepRecord:
    """`record` (scored), or, while it has fewer informative groups than it has groups and
    rounds are left, those of it and of `more()` (a scored round of as many tasks), as
    the module docstring says; with the figures of the rounds in `pipeline`."""
    want, played = len(record.specs), [(record, informative(record, group_size))]
    found = len(played[0][1])
    while found < want and len(played) <= rounds:
        extra = more()
        played.append((extra, informative(extra, group_size)))
        found += len(played[-1][1])
    picks = [(r, i) for r, useful in played for i in useful][:want]
    flat = [i for i in range(want) if i not in played[0][1]]
    picks += [(record, i) for i in flat[: want - len(picks)]]
    merged = _groups(picks, group_size, record)
    figures = {
        records.RESAMPLE_ROUNDS: float(len(played) - 1),
        records.INFORMATIVE_GROUPS: float(min(found, want)),
    }
    return replace(merged, pipeline={**record.pipeline, **figures})


def _groups(
    picks: Sequence[tuple[StepRecord, int]], group_size: int, first: StepRecord
) -> StepRecord:
    """One scored record of the picked groups, in order, each with its new group index."""
    trajectories, rewards, scorable, specs = [], [], [], []
    for new, (r, i) in enumerate(picks):
        assert r.rewards is not None and r.scorable is not None
        rows = slice(i * group_size, (i + 1) * group_size)
        trajectories += [replace(t, group=new) for t in r.trajectories[rows]]
        rewards.append(r.rewards[rows])
        scorable.append(r.scorable[rows])
        specs.append(r.specs[i])
    return replace(
        first,
        specs=tuple(specs),
        trajectories=tuple(trajectories),
        rewards=torch.cat(rewards),
        scorable=torch.cat(scorable),
        step_rewards=step_reward_targets(trajectories),
    )

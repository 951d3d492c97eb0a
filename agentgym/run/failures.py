"""The run-time failure policy: a step where most episodes fail is not a training step.

One unscorable episode (its environment's `reset` or `step` raised or hung, a
reward function failed) gets advantage 0 and the run goes on. A step where
more than `run.max_failed_fraction` of the episodes are unscorable is a failed
step; `run.max_failed_steps` of them in a row stop the run, with a checkpoint,
and a `TrainingError` naming the most frequent error, how often it occurred
and one episode's task id: an environment that always raises would otherwise
train every step on advantage 0 and finish with `reward/mean` NaN. The whole
policy, configuration failures included, is in docs/runs.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym import records
from agentgym.config import RunConfig
from agentgym.types import Trajectory


def failed_fraction(trajectories: Sequence[Trajectory]) -> float:
    """Share of the episodes that are unscorable (0.0 for none)."""
    if not trajectories:
        return 0.0
    return sum(not t.scorable for t in trajectories) / len(trajectories)


def failed_steps_in_a_row(history: Sequence[Mapping[str, Any]], limit: float) -> int:
    """Steps at the end of `history` whose failed fraction is above `limit`, in a row.

    Read from the metric history, so a resumed run counts the steps before its
    checkpoint as the run that stopped did.
    """
    count = 0
    for row in reversed(history):
        if float(row.get(records.FAILED_FRACTION, 0.0)) <= limit:
            break
        count += 1
    return count


def most_frequent_error(trajectories: Sequence[Trajectory]) -> tuple[str, int, str]:
    """The unscorable episodes' most frequent error, its count and one task id that had it."""
    errors = [(t.error or t.reward_error or "", t.task_id) for t in trajectories if not t.scorable]
    message, count = Counter(e for e, _ in errors).most_common(1)[0]
    return message, count, next(task for e, task in errors if e == message)


def stop_reason(
    history: Sequence[Mapping[str, Any]], trajectories: Sequence[Trajectory], run: RunConfig
) -> str | None:
    """Why the run must stop after this step (its trajectories, the history ending with
    it), or None while fewer than `run.max_failed_steps` failed steps came in a row."""
    in_a_row = failed_steps_in_a_row(history, run.max_failed_fraction)
    if in_a_row < run.max_failed_steps:
        return None
    message, count, task_id = most_frequent_error(trajectories)
    failed = sum(not t.scorable for t in trajectories)
    return (
        f"{in_a_row} steps in a row had more than run.max_failed_fraction="
        f"{run.max_failed_fraction:g} of their episodes unscorable (run.max_failed_steps="
        f"{run.max_failed_steps}); the last: {failed} of {len(trajectories)}. Most frequent "
        f"error, {count} times in the last step: {message} (e.g. task {task_id!r})."
    )

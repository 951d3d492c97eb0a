"""A run's records: metrics.jsonl, TensorBoard scalars, sampled completions, trained.jsonl."""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from agentgym import records
from agentgym.eval.episode_files import token_advantages, write_episodes
from agentgym.extras import available, install_hint
from agentgym.run.failures import failed_fraction
from agentgym.run.trackers import finite, open_trackers
from agentgym.types import StepRecord, Trajectory

logger = logging.getLogger(__name__)


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The seed tutorial's rollout metrics (section 7) over one step's trajectories.

    `format_accuracy` is the share whose "format" reward part is positive;
    `correctness_rate` the share whose "correctness" part reached 1.0 (a
    fully correct answer). Both are NaN when the environment reports no such part.
    The reward figures are over scorable episodes only (NaN when there are none).
    """
    scored = [t.reward for t in trajectories if t.scorable]
    rewards = torch.tensor(scored or [math.nan], dtype=torch.float64)
    lengths = torch.tensor([t.completion_length for t in trajectories], dtype=torch.float64)

    def share(part: str, ok) -> float:
        values = [t.reward_parts[part] for t in trajectories if part in t.reward_parts]
        return sum(map(ok, values)) / len(values) if values else math.nan

    return {
        **tool_metrics(trajectories),
        **env_metrics(trajectories),
        **sample_metrics(trajectories),
        records.REWARD_MEAN: float(rewards.mean()),
        records.REWARD_STD: float(rewards.std(unbiased=False)),
        records.REWARD_MAX: float(rewards.max()),
        records.REWARD_MIN: float(rewards.min()),
        records.FORMAT_ACCURACY: share("format", lambda v: v > 0),
        records.CORRECTNESS_RATE: share("correctness", lambda v: v >= 1.0),
        records.COMPLETION_LENGTH: float(lengths.mean()),
        records.TRUNCATED_FRACTION: sum(t.truncated for t in trajectories) / len(trajectories),
    }


def env_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Per member of an env mix: `env/<name>/reward/mean` (scorable episodes; NaN for none)
    and `env/<name>/correctness_rate` (NaN when it reports no correctness); the same per task
    category, `category/<label>/...`. Empty outside a mix and without categories."""
    out: dict[str, float] = {}
    for name in sorted({t.env for t in trajectories if t.env is not None}):
        mine = [t for t in trajectories if t.env == name]
        out.update(_figures(mine, name, records.env_metric))
    for label in sorted({t.category for t in trajectories if t.category is not None}):
        mine = [t for t in trajectories if t.category == label]
        out.update(_figures(mine, label, records.category_metric))
    return out


def _figures(
    mine: Sequence[Trajectory], name: str, key: Callable[[str, str], str]
) -> dict[str, float]:
    """The mean reward (scorable episodes) and correctness rate of some episodes, under
    `key(name, metric)`."""
    scored = [t.reward for t in mine if t.scorable]
    parts = [t.reward_parts["correctness"] for t in mine if "correctness" in t.reward_parts]
    return {
        key(name, records.REWARD_MEAN): sum(scored) / len(scored) if scored else math.nan,
        key(name, records.CORRECTNESS_RATE): (
            sum(v >= 1.0 for v in parts) / len(parts) if parts else math.nan
        ),
    }


def failure_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float | str]:
    """Counts of the step's failed episodes, and the first one's message of each kind.

    "reward/failed": episodes whose reward is not a verified outcome (a reward
    function failed, or the environment's reward is not finite); "env/errors":
    episodes that `env.reset` or `env.step` ended by raising or hanging;
    "failures/fraction": the share of episodes that are either. The "first_error" keys are
    present only when their count is not 0.
    """
    reward = [t.reward_error for t in trajectories if t.reward_error is not None]
    env = [t.error for t in trajectories if t.error is not None]
    out: dict[str, float | str] = {
        records.REWARD_FAILED: float(len(reward)),
        records.ENV_ERRORS: float(len(env)),
        records.FAILED_FRACTION: failed_fraction(trajectories),
    }
    if reward:
        out[records.REWARD_FIRST_ERROR] = reward[0]
    if env:
        out[records.ENV_FIRST_ERROR] = env[0]
    return out


def sample_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The ids trained on checked against the ids sampled (`tokens/checked`,
    `tokens/resampled`: every row); and the samples beyond the first of episodes whose
    history was rewritten (`agent/split_samples`: where any episode counts them)."""
    out = {
        records.TOKENS_CHECKED: sum(t.counts.get("tokens_checked", 0.0) for t in trajectories),
        records.TOKENS_RESAMPLED: sum(t.counts.get("tokens_resampled", 0.0) for t in trajectories),
    }
    if any("split_samples" in t.counts for t in trajectories):
        out[records.SPLIT_SAMPLES] = sum(t.counts.get("split_samples", 0.0) for t in trajectories)
    return out


def tool_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Tool-call counts: calls per episode, and errors per call, overall and by kind.

    Empty when no environment reported tool calls.
    """
    totals: dict[str, float] = {}
    for t in trajectories:
        for key, value in t.counts.items():
            totals[key] = totals.get(key, 0.0) + value
    if "tool_calls" not in totals:
        return {}
    calls = totals.pop("tool_calls")
    errors = {k.removeprefix("tool_errors/"): v for k, v in totals.items() if k.startswith("tool_")}
    out = {records.TOOL_CALLS: calls / len(trajectories)}
    out[records.TOOL_ERROR_RATE] = sum(errors.values()) / calls if calls else 0.0
    for kind, n in sorted(errors.items()):
        out[f"{records.TOOL_ERRORS_PREFIX}{kind}"] = n / calls if calls else 0.0
    return out


class RunLog:
    """Appends a step's metrics and completions under the run directory, and reports them
    to the run's trackers.

    Args:
        directory: The run directory (created if missing).
        report_to: The trackers (`agentgym.run.trackers`); TensorBoard writes under
            `directory/tb`, and is left out with a warning where it is not installed.
        purge_step: A resumed run's first step: TensorBoard drops what an earlier
            process logged from there on (see `truncate_logs` for the JSON lines).
        config: The run's config, for the trackers that keep it.
    """

    def __init__(
        self,
        directory: Path,
        report_to: Sequence[str] = ("tensorboard",),
        purge_step: int | None = None,
        config: dict[str, Any] | None = None,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        names = list(report_to)
        if "tensorboard" in names and not available("tensorboard"):
            logger.warning(
                "TensorBoard logging is off: tensorboard is not installed (%s, or take it "
                "out of run.report_to); metrics.jsonl has every metric",
                install_hint("tensorboard"),
            )
            names.remove("tensorboard")
        self.trackers = open_trackers(names, self.directory, config or {}, purge_step)
        self._episodes: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._decoder: Any = None

    def metrics(
        self, step: int, values: Mapping[str, float | str], health: Sequence[str] = ()
    ) -> None:
        """Appends one line to metrics.jsonl (and reports it to the trackers); `health`
        lists warning kinds. Strings (such as a first error's message) go to metrics.jsonl
        as they are; the trackers get the finite numbers only."""
        record: dict[str, object] = {"step": step, **{k: _finite(v) for k, v in values.items()}}
        if health:
            record["health"] = list(health)
        with open(self.directory / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        numbers = finite(values)
        for tracker in self.trackers:
            tracker.scalars(step, numbers)

    def completions(self, step: int, trajectories: Sequence[Trajectory], limit: int) -> None:
        """Appends up to `limit` sampled episodes to completions.jsonl, and gives the
        trackers a table of them."""
        if self.trackers and limit:
            rows = [
                (step, t.task_id, t.group, _finite(t.reward), len(t.turns), _last_action(t))
                for t in trajectories[:limit]
            ]
            for tracker in self.trackers:
                tracker.episodes(step, rows)
        with open(self.directory / "completions.jsonl", "a") as f:
            for t in trajectories[:limit]:
                record = {
                    "step": step,
                    "task_id": t.task_id,
                    "group": t.group,
                    "prompt": [m.to_dict() for m in t.prompt_messages],
                    "turns": [
                        {
                            "action": turn.action,
                            "observation": [m.to_dict() for m in turn.observation],
                        }
                        for turn in t.turns
                    ],
                    "reward": _finite(t.reward),
                    "reward_parts": dict(t.reward_parts),
                    "finish_reason": t.finish_reason,
                }
                for key in ("error", "reward_error"):
                    if getattr(t, key) is not None:
                        record[key] = getattr(t, key)
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def trained(self, record: StepRecord, group_size: int) -> None:
        """Appends one line to trained.jsonl: the step, and per group trained, its task (the
        reset seed and the env's task id) and the oldest and newest policy version its
        sampled tokens came from; so a run's tasks can be counted from outside, across
        resumes (each task trained once)."""
        groups, starts = [], range(0, len(record.trajectories), group_size)
        for spec, start in zip(record.specs, starts, strict=True):
            group = record.trajectories[start : start + group_size]
            versions = [v for t in group for v in t.token_versions if v >= 0] or [record.version]
            task = {"seed": spec.seed, "task_id": group[0].task_id}
            groups.append({**task, "versions": [min(versions), max(versions)]})
        with open(self.directory / "trained.jsonl", "a") as f:
            f.write(json.dumps({"step": record.step, "groups": groups}) + "\n")

    def episodes(self, record: StepRecord, token_share: float, max_mb: float, tokenizer) -> None:
        """Writes the step's episodes to `episodes/step-NNNNNN.npz`
        (`agentgym.eval.episode_files`, each token's text from `tokenizer`) on the log's
        own thread, off the learner's path. The thread decodes with a copy of the
        tokenizer: a fast tokenizer is not to be used from two threads at once."""
        if self._episodes is None:
            self._episodes = ThreadPoolExecutor(1, thread_name_prefix="agentgym-episodes")
            self._decoder = copy.deepcopy(tokenizer)
        decoder = self._decoder
        advantages = record.advantages.detach().cpu() if record.advantages is not None else None
        path = self.directory / EPISODES / f"step-{record.step:06d}.npz"
        trajectories, extra = list(record.trajectories), {"step": record.step}
        max_bytes = int(max_mb * (1 << 20))

        def write() -> None:
            per_token = None
            if advantages is not None:
                rows = zip(advantages.tolist(), trajectories, strict=True)
                per_token = [token_advantages(r, len(t.tokens)) for r, t in rows]
            write_episodes(
                path,
                trajectories,
                per_token,
                token_share=token_share,
                max_bytes=max_bytes,
                extra=extra,
                decode=lambda i: decoder.decode([i]),
            )

        self._pending.append(self._episodes.submit(write))
        self._wait(keep=1)

    def _wait(self, keep: int = 0) -> None:
        """Waits for the episode writes but the newest `keep`; an error one met is raised."""
        while len(self._pending) > keep:
            self._pending.pop(0).result()

    def close(self) -> None:
        if self._episodes is not None:
            try:
                self._wait()
            finally:
                self._episodes.shutdown()
                self._episodes = None
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


EPISODES = "episodes"
"""The folder of a run's per-step episode files (`RunLog.episodes`)."""


def truncate_logs(directory: Path, step: int) -> None:
    """Drops the records of steps after `step` from metrics.jsonl, completions.jsonl and
    trained.jsonl, and their episode files: a run resumed from step `step` logs those
    steps again. Each file is replaced whole."""
    for path in (Path(directory) / EPISODES).glob("step-*.npz"):
        if int(path.stem.removeprefix("step-")) > step:
            path.unlink()
    for name in ("metrics.jsonl", "completions.jsonl", "trained.jsonl"):
        path = Path(directory) / name
        if not path.is_file():
            continue
        kept = [
            line
            for line in path.read_text().splitlines(keepends=True)
            if (at := _step_of(line)) is not None and at <= step
        ]
        staging = path.with_name(f".{name}.tmp")
        staging.write_text("".join(kept))
        staging.replace(path)


EARLIER_START = (
    "metrics.jsonl",
    "completions.jsonl",
    "trained.jsonl",
    EPISODES,
    "sft_metrics.jsonl",
    "sft_long_metrics.jsonl",
    "tb",
    "curves.png",
    "report",
    "checkpoint-*",
)
"""What a start of a run writes in its folder (`checkpoint-*`: its SFT, best and numbered
checkpoints); a later start would append to the logs and overwrite the rest."""


def set_aside(directory: Path) -> Path | None:
    """Moves what an earlier start of the run in `directory` wrote (`EARLIER_START`) into
    `directory/old-<n>/`, the first free n, so that a fresh start loses none of it.

    Returns:
        The folder they went to; None when there was nothing to move (nothing is created).
    """
    directory = Path(directory)
    found = sorted({p for pattern in EARLIER_START for p in directory.glob(pattern)})
    if not found:
        return None
    n = 1
    while (directory / f"old-{n}").exists():
        n += 1
    folder = directory / f"old-{n}"
    folder.mkdir()
    for path in found:
        # a link (checkpoint-best) moves as a link: relative ones still resolve in there
        path.rename(folder / path.name)
    return folder


def _last_action(t: Trajectory) -> str:
    return t.turns[-1].action[-500:] if t.turns else ""


def _step_of(line: str) -> int | None:
    """A JSON line's step; None for a line a killed process left torn."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _finite(value: float | str) -> float | str | None:
    """The value for JSON: a string as it is, a non-finite number as null."""
    return value if isinstance(value, str) or math.isfinite(value) else None


def step_note(metrics: dict) -> str:
    """A step's progress note: its reward, time, held-out correctness and level, if any, and
    the first error of a reward function and of the environment, where episodes failed."""
    reward = metrics[records.REWARD_MEAN]
    shown = f"{reward:+.3f}" if math.isfinite(reward) else "n/a (no episode scored)"
    note = f"reward {shown}  {metrics[records.STEP_SECONDS]:.1f}s/step"
    if records.EVAL_CORRECTNESS in metrics:
        note += f"  held-out {metrics[records.EVAL_CORRECTNESS]:.3f}"
    if records.CURRICULUM_LEVEL in metrics:
        note += f"  level {metrics[records.CURRICULUM_LEVEL]}"
    for count, first, what in (
        (records.REWARD_FAILED, records.REWARD_FIRST_ERROR, "reward failed"),
        (records.ENV_ERRORS, records.ENV_FIRST_ERROR, "env failed"),
    ):
        if first in metrics:
            note += f"  {what} on {metrics[count]:.0f}: {_one_line(metrics[first])}"
    return note


def _one_line(message: str, most: int = 160) -> str:
    """An error message on one console line: its lines joined, cut at `most` characters."""
    text = " ".join(message.split())
    return text if len(text) <= most else text[: most - 3] + "..."

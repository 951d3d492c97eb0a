"""The `record` stage of a training step, and the held-out evaluations it makes when due.

After the update and the sync, a step's figures are put together (`step_metrics`), its
skipped updates counted, the selection tasks evaluated when due (keeping
`checkpoint-best`), its health checked and the step logged (`record_step`). The model
GRPO starts from is scored on the same tasks first, as step 0 (`score_start`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from agentgym import records
from agentgym.eval.benchmarks import figures as benchmark_figures
from agentgym.eval.benchmarks import labelled
from agentgym.eval.console import Stages
from agentgym.eval.heldout import HeldOut, TaskResult
from agentgym.eval.report import summarize
from agentgym.eval.stats import best_step
from agentgym.policy.base import Policy
from agentgym.run import failures
from agentgym.run.checkpoint import latest_checkpoint, save_best
from agentgym.run.health import HealthWarning, check_health
from agentgym.run.interrupt import TrainingError
from agentgym.run.runlog import failure_metrics, rollout_metrics
from agentgym.types import StepRecord

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from agentgym.run.setup import Run

EVAL_METRICS = {
    records.EVAL_CORRECTNESS: "correctness_strict",
    records.EVAL_LENIENT: "correctness_lenient",
    records.EVAL_FORMAT: "format_accuracy",
    records.EVAL_REWARD: "reward_mean",
    records.EVAL_TOOL_ERRORS: "tool_error_rate",
}
"""The held-out figures logged during training: step metric -> greedy summary figure."""


def step_metrics(record: StepRecord, beta: float, length_penalty: float) -> dict[str, float | str]:
    """A step's metrics row: the rollout's, the failures', the update's, the KL
    coefficient `beta` it used, the share of flat groups, its timings and sync figures."""
    assert record.rewards is not None and record.flat_groups is not None  # after the update
    trajectories = record.trajectories
    seconds = float(record.timings[records.STEP_SECONDS])
    sampled = sum(t.completion_length for t in trajectories)
    metrics: dict[str, float | str] = {
        **rollout_metrics(trajectories),
        **failure_metrics(trajectories),
        **record.stats,
        records.BETA: beta,
        records.ZERO_VARIANCE: record.flat_groups.float().mean().item(),
        **record.timings,
        records.TOKENS_PER_SECOND: sampled / seconds,
        **record.pipeline,
    }
    if length_penalty:
        metrics[records.REWARD_PENALISED] = float(record.rewards.nanmean())
    return metrics


def evaluate(
    held_out: HeldOut, policy: Policy, stages: Stages, name: str, seed: int
) -> list[TaskResult]:
    """Plays `held_out` with `policy` under a progress bar named `name`; its results."""
    task = stages.stage(name, held_out.episodes)
    results = held_out.run(policy, seed=seed, advance=lambda n: stages.advance(task, n))
    figures = summarize(results)
    note = f"correct {figures.greedy.correctness_strict:.3f} (greedy)"
    if figures.sampled is not None:
        note += f", pass@1 {figures.sampled.at_k['pass@1']:.3f}"
    stages.note(task, note, done=True)
    return results


def selection_figures(run: Run, stages: Stages, step: int) -> dict[str, float]:
    """The run's policy's figures on the selection tasks now, as step metrics."""
    assert run.selection is not None  # made before GRPO when eval.every is set
    with run.evaluating() as policy:
        results = evaluate(run.selection, policy, stages, f"eval step {step}", run.config.run.seed)
        played = [
            labelled(part, evaluate(held, policy, stages, f"{part.choice.label} step {step}", 0))
            for part, held in run.benchmarks
        ]
    figures = summarize(results)
    row = {key: getattr(figures.greedy, v) for key, v in EVAL_METRICS.items()}
    if figures.sampled is not None:
        row[records.EVAL_PASS_AT_1] = figures.sampled.at_k["pass@1"]
    return row | benchmark_figures([r for rs in played for r in rs])


def score_start(run: Run, stages: Stages) -> None:
    """Scores the model GRPO starts from (the SFT checkpoint, or the base model) on the
    selection tasks, as step 0: it is `checkpoint-best` until a step scores higher."""
    config, t = run.config, run.training()
    if run.selection is None or t.progress.step != 0 or t.progress.start_selection is not None:
        return
    t.progress.start_selection = {"step": 0, **selection_figures(run, stages, 0)}
    t.progress.best_step = 0
    save_best(run.out, 0, t.model, t.tokenizer, config)


def record_step(
    run: Run, stages: Stages, record: StepRecord, metrics: dict[str, float | str]
) -> list[HealthWarning]:
    """Counts skipped updates, evaluates when due (keeping checkpoint-best), checks
    health, logs the step; returns the health warnings. Too many skipped updates in
    a row end the run with TrainingError, and so do too many failed steps in a row
    (`agentgym.run.failures`), after a checkpoint."""
    config, t, step = run.config, run.training(), record.step
    p, ev, max_skips = t.progress, config.eval, config.run.max_skipped_steps
    assert run.log is not None  # opened before the first step
    skipped = float(metrics.get(records.SKIPPED, 0.0)) > 0
    p.skipped_steps += skipped
    p.consecutive_skips = p.consecutive_skips + 1 if skipped else 0
    metrics[records.SKIPPED_STEPS] = float(p.skipped_steps)
    if run.selection is not None and (step % ev.every == 0 or step == config.run.steps):
        metrics.update(selection_figures(run, stages, step))
    p.history.append({"step": step, **metrics})
    warnings = check_health(p.history, beta=config.grpo.beta)
    for w in warnings:
        logger.warning("health: step %d: %s: %s", step, w.kind, w.message)
    run.log.metrics(step, metrics, health=[w.kind for w in warnings])
    run.log.completions(step, list(record.trajectories), config.run.log_completions)
    run.log.trained(record, config.grpo.group_size)
    if config.run.log_episodes:
        run.log.episodes(record, config.run.episode_tokens, config.run.episode_max_mb, t.tokenizer)
    select = ev.select_by or (records.EVAL_PASS_AT_1 if ev.n else records.EVAL_CORRECTNESS)
    if records.EVAL_CORRECTNESS in metrics and best_step(p.candidates(), select) == step:
        p.best_step = step
        save_best(run.out, step, t.model, t.tokenizer, config)
    if p.consecutive_skips >= max_skips:
        raise TrainingError(
            f"{p.consecutive_skips} steps in a row (to step {step}) had a non-finite loss "
            f"or gradient, so their updates were skipped (run.max_skipped_steps={max_skips}). "
            "Lower optim.lr or check the rewards; the last checkpoint is "
            f"{latest_checkpoint(Path(run.out)) or 'none'}."
        )
    trajectories = list(record.trajectories)
    if (reason := failures.stop_reason(p.history, trajectories, config.run)) is not None:
        raise TrainingError(f"{reason} Checkpoint: {run.save(step)}.")
    return warnings

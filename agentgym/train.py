"""The GRPO training loop: rollout -> advantages -> learner -> sync -> log -> checkpoint.

Each stage lives elsewhere (rollout.py, grpo.py, learner.py, runlog.py,
checkpoint.py); this file only strings them together, one step at a time.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym import grpo
from agentgym.checkpoint import save_checkpoint
from agentgym.config import Config
from agentgym.console import Stages, print_report
from agentgym.core import make_env
from agentgym.evaluate import best_step
from agentgym.health import check_health
from agentgym.heldout import (
    HeldOut,
    TaskResult,
    build_report,
    held_out_ids,
    summarize,
    write_report,
)
from agentgym.learner import Learner
from agentgym.plots import training_curves
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy, merged_adapters
from agentgym.policy.models import load_model_and_tokenizer, resolve_model_name
from agentgym.rollout import TaskSpec, collect
from agentgym.runlog import RunLog, rollout_metrics
from agentgym.sft import warm_up
from agentgym.types import Batch, Trajectory


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (initialisation; sampling has its own generator)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def task_specs(rng: np.random.Generator, count: int) -> list[TaskSpec]:
    """`count` train tasks, each named by a fresh reset seed."""
    return [TaskSpec(seed=int(s)) for s in rng.integers(0, 2**31 - 1, size=count)]


def sampling_params(config: Config, rng: np.random.Generator) -> SamplingParams:
    """This step's sampling parameters, with a fresh seed drawn from the run's generator."""
    s = config.sampling
    return SamplingParams(
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        seed=int(rng.integers(2**31 - 1)),
    )


def train_step(
    config: Config,
    rng: np.random.Generator,
    envs: list,
    policy: HFPolicy,
    learner: Learner,
    tokenizer,
    beta: float | None = None,
) -> tuple[list[Trajectory], dict[str, float]]:
    """One GRPO step: rollout, advantages, learner update, weight sync. Returns its metrics.

    `beta` is this step's KL coefficient (the beta schedule); None keeps the learner's.
    """
    g = config.grpo
    start = time.perf_counter()
    specs = task_specs(rng, g.tasks_per_step)
    with merged_adapters(policy.model):
        trajectories = collect(
            envs, specs, g.group_size, policy, tokenizer, sampling_params(config, rng),
            max_tokens=config.sampling.max_episode_tokens,
        )  # fmt: skip
    rollout_seconds = time.perf_counter() - start
    rewards = torch.tensor([t.reward for t in trajectories])
    if g.length_penalty:
        lengths = torch.tensor([float(t.completion_length) for t in trajectories])
        rewards = rewards - g.length_penalty * lengths
    advantages = grpo.group_advantages(rewards, g.group_size, scale=g.scale_rewards)
    stats = learner_steps(config, learner, trajectories, rewards, advantages, tokenizer, beta)
    if policy.model is not learner.model:
        policy.load_weights(learner.named_weights())
    seconds = time.perf_counter() - start
    trained_tokens = sum(sum(t.loss_mask) for t in trajectories)
    metrics = {
        **rollout_metrics(trajectories),
        **stats,
        "beta": learner.beta,
        "zero_variance_groups": grpo.zero_variance_fraction(rewards, g.group_size),
        "step_seconds": seconds,
        "rollout_seconds": rollout_seconds,
        "tokens_per_second": trained_tokens / seconds,
    }
    if g.length_penalty:
        metrics["reward/penalised_mean"] = float(rewards.mean())
    return trajectories, metrics


def learner_steps(config: Config, learner: Learner, trajectories: list[Trajectory],
                  rewards: torch.Tensor, advantages: torch.Tensor, tokenizer,
                  beta: float | None) -> dict[str, float]:  # fmt: skip
    """`grpo.num_iterations` learner steps on the step's batch; returns their mean metrics.

    Groups whose rewards are all equal are left out first with
    `grpo.drop_zero_variance_groups`, and episodes cut at the token budget are
    masked out of the loss with `grpo.mask_truncated_completions`. Later
    iterations compare against the same stored old logprobs (the sampler's).
    """
    g = config.grpo
    keep = torch.ones(len(trajectories), dtype=torch.bool)
    stats: dict[str, float] = {}
    if g.drop_zero_variance_groups:
        flat = torch.tensor([grpo.zero_variance_fraction(group, g.group_size) == 1.0
                             for group in rewards.split(g.group_size)])  # fmt: skip
        keep = ~flat.repeat_interleave(g.group_size)
        stats["dropped_groups"] = float(flat.sum())
    if not keep.any():
        return stats
    kept = [t for t, k in zip(trajectories, keep.tolist(), strict=True) if k]
    batch = Batch.from_trajectories(kept, advantages[keep], tokenizer.pad_token_id)
    if g.mask_truncated_completions:
        complete = torch.tensor([not t.truncated for t in kept], dtype=batch.loss_mask.dtype)
        batch = batch.masked_rows(complete)
    runs = [learner.step(batch, beta=beta) for _ in range(g.num_iterations)]
    stats.update({key: sum(r[key] for r in runs) / len(runs) for key in runs[0]})
    return stats


def _held_out(config: Config, tokenizer, count: int, start: int, n: int | None = None
              ) -> HeldOut:  # fmt: skip
    ev, run = config.eval, config.run
    ids = held_out_ids(run.env, run.env_kwargs, count, start=start, split=ev.split)
    return HeldOut(run.env, run.env_kwargs, ids, tokenizer, n=ev.n if n is None else n,
                   temperature=config.sampling.temperature,
                   max_new_tokens=ev.max_new_tokens or config.sampling.max_new_tokens,
                   max_episode_tokens=config.sampling.max_episode_tokens)  # fmt: skip


def _evaluate(held_out: HeldOut, policy: HFPolicy, stages: Stages, name: str, seed: int
              ) -> list[TaskResult]:  # fmt: skip
    task = stages.stage(name, held_out.episodes)
    results = held_out.run(policy, seed=seed, advance=lambda n: stages.advance(task, n))
    figures = summarize(results)
    note = f"correct {figures['greedy']['correctness_strict']:.3f} (greedy)"
    if "sampled" in figures:
        note += f", pass@1 {figures['sampled']['pass@1']:.3f}"
    stages.note(task, note, done=True)
    return results


def _trainable_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def train(config: Config) -> Path:
    """Runs the configured pipeline; returns the run directory.

    Stages, each optional but GRPO: held-out evaluation of the starting model,
    the SFT warm-up (`sft.warmup`) and its evaluation, `run.steps` GRPO steps
    with a held-out evaluation every `eval.every` steps (keeping
    `checkpoint-best`), then the best checkpoint's evaluation and the closing
    table (`eval.report_tasks`), and `curves.png`.
    """
    run, g, ev = config.run, config.grpo, config.eval
    out = Path(run.output)
    seed_everything(run.seed)
    model, tokenizer = load_model_and_tokenizer(config.model.name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device)
    log = RunLog(out, tensorboard=run.tensorboard)
    envs = [make_env(run.env, **run.env_kwargs) for _ in range(g.tasks_per_step * g.group_size)]
    # The selection tasks pick checkpoint-best; the report's are disjoint from them.
    selection = _held_out(config, tokenizer, ev.tasks, 0) if ev.every else None
    report_set = start_set = None
    if ev.report_tasks:
        report_set = _held_out(config, tokenizer, ev.report_tasks, ev.tasks)
        start_set = report_set
        if ev.start_n is not None and ev.start_n != ev.n:
            start_set = _held_out(config, tokenizer, ev.report_tasks, ev.tasks, n=ev.start_n)
    results: dict[str, list[TaskResult]] = {}
    history: list[dict[str, float]] = []
    try:
        with Stages() as stages:
            if start_set is not None:
                results["start"] = _evaluate(start_set, HFPolicy(model, tokenizer), stages,
                                             "eval start", run.seed)  # fmt: skip
            if config.sft.warmup:
                task = stages.stage("sft", config.sft.steps)
                model, records = warm_up(model, tokenizer, config,
                                         advance=lambda: stages.advance(task))  # fmt: skip
                with open(out / "sft_metrics.jsonl", "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in records)
                stages.note(task, f"loss {records[-1]['sft/loss']:.3f}", done=True)
                save_checkpoint(out, config.sft.steps, model, tokenizer, config,
                                name="checkpoint-sft")  # fmt: skip
                if report_set is not None:
                    results["sft"] = _evaluate(report_set, HFPolicy(model, tokenizer), stages,
                                               "eval sft", run.seed)  # fmt: skip
            learner = Learner(model, config)
            policy = HFPolicy(learner.model, tokenizer)
            best = _grpo(config, learner, policy, tokenizer, envs, selection, log, stages, history)
            if history:
                training_curves(history, out / "curves.png")
            if report_set is not None:
                name = "grpo"
                if best is not None:
                    policy.load_weights(best[1].items())
                    name = f"best@{best[0]}"
                results[name] = _evaluate(report_set, policy, stages, "eval best", run.seed)
                pairs = [(b, a) for a, b in zip(results, list(results)[1:], strict=False)]
                if len(results) == 3:
                    pairs.append((name, "start"))
                report = build_report(results, k=max(ev.n, 1), comparisons=pairs,
                                      meta=_meta(config))  # fmt: skip
                write_report(out / "report", report)
                print_report(report, stages.bar.console)
    finally:
        log.close()
        for env in envs:
            env.close()
        for held in (report_set, start_set, selection):
            if held is not None:
                held.close()
    return out


def _grpo(config, learner, policy, tokenizer, envs, selection, log, stages, history):
    """The GRPO steps; returns (best step, its trainable weights), or None without evaluations."""
    run, g, ev = config.run, config.grpo, config.eval
    rng = np.random.default_rng(run.seed)
    best = None
    select = "eval/pass@1" if ev.n else "eval/correctness"
    task = stages.stage("grpo", run.steps)
    for step in range(1, run.steps + 1):
        trajectories, metrics = train_step(config, rng, envs, policy, learner, tokenizer,
                                           beta=g.beta_at(step))  # fmt: skip
        if selection is not None and (step % ev.every == 0 or step == run.steps):
            figures = summarize(_evaluate(selection, policy, stages, f"eval step {step}", run.seed))
            metrics.update({f"eval/{k}": figures["greedy"][v] for k, v in EVAL_METRICS.items()})
            if "sampled" in figures:
                metrics["eval/pass@1"] = figures["sampled"]["pass@1"]
        history.append({"step": step, **metrics})
        warnings = check_health(history, beta=g.beta)
        for w in warnings:
            stages.print(f"[yellow]health[/yellow] step {step}: {w.kind}: {w.message}")
        log.metrics(step, metrics, health=[w.kind for w in warnings])
        log.completions(step, trajectories, run.log_completions)
        if "eval/correctness" in metrics and best_step(history, select) == step:
            best = (step, _trainable_state(learner.model))
            save_checkpoint(run.output, step, learner.model, tokenizer, config,
                            name="checkpoint-best")  # fmt: skip
        stop = bool(warnings) and run.stop_on_health
        if step % run.save_every == 0 or step == run.steps or stop:
            save_checkpoint(run.output, step, learner.model, tokenizer, config)
        note = f"reward {metrics['reward/mean']:+.3f}  {metrics['step_seconds']:.1f}s/step"
        if "eval/correctness" in metrics:
            note += f"  held-out {metrics['eval/correctness']:.3f}"
        stages.advance(task)
        stages.note(task, f"step {step}: {note}")
        if stop:
            stages.print("stopping early: run.stop_on_health is set")
            break
    best_note = f", best held-out step {best[0]}" if best is not None else ""
    stages.note(task, f"{len(history)} steps{best_note}", done=True)
    return best


EVAL_METRICS = {
    "correctness": "correctness_strict",
    "correctness_lenient": "correctness_lenient",
    "format_accuracy": "format_accuracy",
    "reward_mean": "reward_mean",
    "tool_error_rate": "tool_error_rate",
}
"""The held-out figures logged during training, as eval/<key>."""


def _meta(config: Config) -> dict[str, Any]:
    return {
        "env": config.run.env,
        "env_kwargs": config.run.env_kwargs,
        "model": resolve_model_name(config.model.name),
        "split": config.eval.split,
        "decoding": "greedy",
    }

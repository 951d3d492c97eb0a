"""The GRPO training loop: rollout -> advantages -> learner -> sync -> log -> checkpoint.

Each stage lives elsewhere (rollout.py, grpo.py, learner.py, runlog.py,
checkpoint.py); this file only strings them together, one step at a time.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from agentgym import grpo
from agentgym.checkpoint import save_checkpoint
from agentgym.config import Config
from agentgym.core import make_env
from agentgym.health import check_health
from agentgym.learner import Learner
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout import TaskSpec, collect
from agentgym.runlog import RunLog, rollout_metrics
from agentgym.types import Batch, Trajectory


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (initialisation; sampling has its own generator)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def task_specs(rng: np.random.Generator, count: int) -> list[TaskSpec]:
    """`count` train tasks, each named by a fresh reset seed."""
    return [TaskSpec(seed=int(s)) for s in rng.integers(0, 2**31 - 1, size=count)]


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]step {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("reward {task.fields[reward]:+.3f}  {task.fields[sps]:.1f}s/step"),
        TimeElapsedColumn(),
    )


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
) -> tuple[list[Trajectory], dict[str, float]]:
    """One GRPO step: rollout, advantages, learner update, weight sync. Returns its metrics."""
    g = config.grpo
    start = time.perf_counter()
    specs = task_specs(rng, g.tasks_per_step)
    trajectories = collect(
        envs, specs, g.group_size, policy, tokenizer, sampling_params(config, rng),
        max_tokens=config.sampling.max_episode_tokens,
    )  # fmt: skip
    rollout_seconds = time.perf_counter() - start
    rewards = torch.tensor([t.reward for t in trajectories])
    advantages = grpo.group_advantages(rewards, g.group_size)
    batch = Batch.from_trajectories(trajectories, advantages, tokenizer.pad_token_id)
    stats = learner.step(batch)
    if policy.model is not learner.model:
        policy.load_weights(learner.named_weights())
    seconds = time.perf_counter() - start
    metrics = {
        **rollout_metrics(trajectories),
        **stats,
        "zero_variance_groups": grpo.zero_variance_fraction(rewards, g.group_size),
        "step_seconds": seconds,
        "rollout_seconds": rollout_seconds,
        "tokens_per_second": float(batch.loss_mask.sum()) / seconds,
    }
    return trajectories, metrics


def train(config: Config) -> Path:
    """Runs `config.run.steps` GRPO steps; returns the run directory."""
    run, g = config.run, config.grpo
    seed_everything(run.seed)
    model, tokenizer = load_model_and_tokenizer(config.model.name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    learner = Learner(model.to(device), config)
    policy = HFPolicy(learner.model, tokenizer)
    envs = [make_env(run.env, **run.env_kwargs) for _ in range(g.tasks_per_step * g.group_size)]
    log = RunLog(run.output, tensorboard=run.tensorboard)
    rng = np.random.default_rng(run.seed)
    history: list[dict[str, float]] = []
    try:
        with _progress() as bar:
            task = bar.add_task("train", total=run.steps, reward=0.0, sps=0.0)
            for step in range(1, run.steps + 1):
                trajectories, metrics = train_step(config, rng, envs, policy, learner, tokenizer)
                history.append({"step": step, **metrics})
                warnings = check_health(history, beta=g.beta)
                for w in warnings:
                    bar.console.print(f"[yellow]health[/yellow] step {step}: {w.kind}: {w.message}")
                log.metrics(step, metrics, health=[w.kind for w in warnings])
                log.completions(step, trajectories, run.log_completions)
                stop = bool(warnings) and run.stop_on_health
                if step % run.save_every == 0 or step == run.steps or stop:
                    save_checkpoint(run.output, step, learner.model, tokenizer, config)
                reward, seconds = metrics["reward/mean"], metrics["step_seconds"]
                bar.update(task, advance=1, reward=reward, sps=seconds)
                if stop:
                    bar.console.print("stopping early: run.stop_on_health is set")
                    break
    finally:
        log.close()
        for env in envs:
            env.close()
    return Path(run.output)

"""The GRPO training loop: rollout -> advantages -> learner -> sync -> log -> checkpoint.

Each stage lives elsewhere (rollout.py, grpo.py, learner.py, runlog.py,
checkpoint.py); this file only strings them together, one step at a time.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.config import Config
from agentgym.env.core import make_env
from agentgym.eval.console import Stages, print_report
from agentgym.eval.heldout import HeldOut, TaskResult, held_out_ids, task_result
from agentgym.eval.plots import training_curves
from agentgym.eval.report import build_report, summarize, write_report
from agentgym.eval.stats import best_step
from agentgym.learn import grpo
from agentgym.learn.learner import Learner
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy, merged_adapters
from agentgym.policy.models import load_model_and_tokenizer, resolve_model_name
from agentgym.policy.vllm import VLLMPolicy, require_vllm, save_model_folder
from agentgym.rewards.functions import RewardFunctions
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.run.checkpoint import (
    BEST,
    latest_checkpoint,
    read_state,
    read_trainer,
    save_best,
    save_checkpoint,
)
from agentgym.run.health import check_health
from agentgym.run.interrupt import StopRequest, TrainingError
from agentgym.run.resume import Progress, RunState, learner_for, load_trainable, restore
from agentgym.run.runlog import RunLog, failure_metrics, rollout_metrics, truncate_logs
from agentgym.run.sft import warm_up
from agentgym.scale import dist, fsdp_sync
from agentgym.scale.ray_rollout import RayRollout, require_ray
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
        stop=tuple(s.stop),
    )


def train_step(
    config: Config,
    rng: np.random.Generator,
    envs: list,
    policy: HFPolicy,
    learner: Learner,
    tokenizer,
    beta: float | None = None,
    reward_fns: RewardFunctions | None = None,
    rollout: RayRollout | None = None,
) -> tuple[list[Trajectory], dict[str, float | str]]:
    """One GRPO step: rollout, advantages, learner update, weight sync. Returns its metrics.

    `beta` is this step's KL coefficient (the beta schedule); None keeps the learner's.
    `reward_fns` (the `rewards` section's functions) add to each episode's reward.
    Unscorable episodes (an environment error, a failed reward function) get
    advantage 0 and stay out of the reward figures and the group statistics.
    `rollout` (`distributed.backend: ray`) plays the episodes on its workers instead
    of `policy` and `envs`, and gets the new weights after the learner step. A policy
    that is not the learner's own model (vLLM, or rank 0's whole copy of an FSDP
    learner's) gets them too, timed
    (`rollout/weight_sync_seconds`), and frees its GPU memory while the learner steps
    when it can (`policy.enable_sleep_mode`).
    """
    g = config.grpo
    start = time.perf_counter()
    specs = task_specs(rng, g.tasks_per_step)
    if rollout is not None:
        trajectories = rollout.collect(specs, g.group_size, sampling_params(config, rng),
                                       max_tokens=config.sampling.max_episode_tokens)  # fmt: skip
    else:
        with merged_adapters(getattr(policy, "model", None)):
            trajectories = collect(
                envs, specs, g.group_size, policy, tokenizer, sampling_params(config, rng),
                max_tokens=config.sampling.max_episode_tokens,
            )  # fmt: skip
    if reward_fns is not None:
        trajectories = reward_fns.score(trajectories)
    rollout_seconds = time.perf_counter() - start
    scorable = torch.tensor([t.scorable for t in trajectories])
    # NaN as well as the mask, so that learner_steps' flat-group test leaves them out too
    rewards = torch.tensor([t.reward if t.scorable else math.nan for t in trajectories])
    if g.length_penalty:
        lengths = torch.tensor([float(t.completion_length) for t in trajectories])
        rewards = rewards - g.length_penalty * lengths
    advantages = grpo.group_advantages(rewards, g.group_size, scale=g.scale_rewards,
                                       scorable=scorable)  # fmt: skip
    with getattr(policy, "released", contextlib.nullcontext)():
        stats = learner_steps(config, learner, trajectories, rewards, advantages, tokenizer, beta)
    synced = {}
    if getattr(policy, "model", None) is not learner.model:
        sync_start = time.perf_counter()
        policy.load_weights(dist.share_weights(learner))
        synced["rollout/weight_sync_seconds"] = time.perf_counter() - sync_start
    if rollout is not None:
        synced["rollout/sync_seconds"] = rollout.load_weights(learner.named_weights())
        synced["rollout/worker_restarts"] = float(rollout.restarts)
        synced["rollout/sync_path"] = rollout.sync_path  # distributed.weight_sync's, or fallback
    seconds = time.perf_counter() - start
    trained_tokens = sum(sum(t.loss_mask) for t in trajectories)
    metrics: dict[str, float | str] = {
        **rollout_metrics(trajectories),
        **failure_metrics(trajectories),
        **stats,
        "beta": learner.beta,
        "zero_variance_groups": grpo.zero_variance_fraction(rewards, g.group_size),
        "step_seconds": seconds,
        "rollout_seconds": rollout_seconds,
        "tokens_per_second": trained_tokens / seconds,
        **synced,
    }
    if g.length_penalty:
        metrics["reward/penalised_mean"] = float(rewards.nanmean())
    return trajectories, metrics


def learner_steps(config: Config, learner: Learner, trajectories: list[Trajectory],
                  rewards: torch.Tensor, advantages: torch.Tensor, tokenizer,
                  beta: float | None) -> dict[str, float]:  # fmt: skip
    """`grpo.num_iterations` learner steps on the step's batch; returns their mean metrics.

    Groups whose rewards are all equal are left out first with
    `grpo.drop_zero_variance_groups`, and episodes cut at the token budget are
    masked out of the loss with `grpo.mask_truncated_completions`. Later
    iterations compare against the same stored old logprobs: the sampler's, or, with
    a vLLM sampler, the learner's own, recomputed first, with truncated importance
    weights for the sampler's (`Learner.correct_mismatch`).
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
    if config.policy.backend == "vllm":
        batch, mismatch = learner.correct_mismatch(batch)
        stats.update(mismatch)
    runs = [dist.share_step(learner, batch, beta) for _ in range(g.num_iterations)]
    stats.update({key: sum(r[key] for r in runs) / len(runs) for key in runs[0]})
    return stats


def _held_out(config: Config, tokenizer, count: int, start: int, n: int | None = None
              ) -> HeldOut:  # fmt: skip
    ev, run = config.eval, config.run
    ids = held_out_ids(run.env, run.env_kwargs, count, start=start, split=ev.split)
    return HeldOut.from_config(config, ids, tokenizer, n=ev.n if n is None else n)


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


def train(config: Config, resume: Path | None = None) -> Path:
    """Runs the configured pipeline; returns the run directory.

    Stages, each optional but GRPO: held-out evaluation of the starting model,
    the SFT warm-up (`sft.warmup`) and its evaluation, `run.steps` GRPO steps
    with a held-out evaluation every `eval.every` steps (keeping
    `checkpoint-best`), then the best checkpoint's evaluation and the closing
    table (`eval.report_tasks`), and `curves.png`.

    `resume` is a checkpoint folder written by an earlier run of this config:
    the run goes on from its step exactly as if it had never stopped. SIGTERM or
    SIGINT stops the run after the current step with a checkpoint (a second
    SIGINT stops at once).

    Under `torchrun --nproc-per-node N -m agentgym train ...` rank 0 runs all of
    this and writes every file; the other ranks hold copies of the learner (or,
    with `distributed.learner: fsdp`, shards of it) and step them on the batches
    rank 0 shares, each on its share (`agentgym.scale.dist`, `agentgym.scale.fsdp_sync`).
    """
    fsdp_sync.check(config)
    joined = dist.init()
    try:
        if not dist.is_main():
            return _follow(config, resume)
        out = _lead(config, resume)
        dist.release_followers()
        return out
    finally:
        if joined:
            dist.shutdown()


def _follow(config: Config, resume: Path | None) -> Path:
    """A rank other than 0: builds its learner when rank 0 builds its own (rank 0's
    weights are copied in), then steps it on the batches rank 0 shares. Writes nothing."""
    seed_everything(config.run.seed)
    state = read_state(resume) if resume is not None else None
    start_model = state["start_model"] if state else config.model.name

    def build() -> Learner:
        model, _ = load_model_and_tokenizer(start_model)
        learner = learner_for(config, model.to(dist.device()), start_model, resume)
        if resume is not None:
            learner.load_state_dict(read_trainer(resume)["learner"])
        return learner

    dist.follow(build)
    return Path(config.run.output)


def _lead(config: Config, resume: Path | None) -> Path:
    """`train` in one process, or on rank 0."""
    run, g, ev = config.run, config.grpo, config.eval
    out = Path(run.output)
    state = read_state(resume) if resume is not None else None
    reward_fns = RewardFunctions(config.rewards)  # a function that cannot load fails here
    on_ray = config.distributed.backend == "ray"
    if on_ray:
        require_ray()  # before the model loads
    if config.policy.backend == "vllm":
        require_vllm(config)
    seed_everything(run.seed)
    start_model = state["start_model"] if state else config.model.name
    model, tokenizer = load_model_and_tokenizer(start_model)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device)
    if state is not None:
        truncate_logs(out, state["step"])
    log = RunLog(out, tensorboard=run.tensorboard,
                 purge_step=state["step"] + 1 if state else None)  # fmt: skip
    envs = [make_env(run.env, **run.env_kwargs)
            for _ in range(0 if on_ray else g.tasks_per_step * g.group_size)]  # fmt: skip
    # The selection tasks pick checkpoint-best; the report's are disjoint from them.
    selection = _held_out(config, tokenizer, ev.tasks, 0) if ev.every else None
    report_set = start_set = None
    if ev.report_tasks:
        report_set = _held_out(config, tokenizer, ev.report_tasks, ev.tasks)
        start_set = report_set
        if ev.start_n is not None and ev.start_n != ev.n:
            start_set = _held_out(config, tokenizer, ev.report_tasks, ev.tasks, n=ev.start_n)
    results = {k: [task_result(r) for r in v] for k, v in (state or {}).get("evals", {}).items()}
    rollout = policy = None
    try:
        with Stages() as stages, StopRequest(stages.print) as stop:
            if state is None:
                model, start_model = _before_grpo(config, model, tokenizer, stages, results,
                                                  start_set, report_set, stop)  # fmt: skip
                if model is None:
                    stages.print(f"stopped on {stop.requested} before training began: nothing "
                                 "to resume; run the command again")  # fmt: skip
                    return out
            elif report_set is not None and config.sft.warmup and "sft" not in results:
                # stopped after SFT, before its evaluation: evaluate the SFT model now
                results["sft"] = _evaluate(report_set, HFPolicy(model, tokenizer), stages,
                                           "eval sft", run.seed)  # fmt: skip
            # the engine starts from the weights GRPO starts from, saved before LoRA wraps them
            engine_dir = (save_model_folder(model, tokenizer)
                          if config.policy.backend == "vllm" else None)  # fmt: skip
            # FSDP shards the learner's model in place: rank 0 samples with a whole copy
            whole = fsdp_sync.unsharded_copy(model, config) if fsdp_sync.sharded(config) else None
            learner = dist.build_learner(lambda: learner_for(config, model, start_model, resume))
            policy = HFPolicy(learner.model if whole is None else whole, tokenizer)
            if engine_dir is not None:
                policy = VLLMPolicy.for_learner(engine_dir, learner.model, tokenizer, config)
            rng = np.random.default_rng(run.seed)
            progress = Progress()
            if state is not None:
                progress = restore(state, resume, learner, rng)
            if state is not None or whole is not None:
                policy.load_weights(dist.share_weights(learner))
            run_state = RunState(config, learner, tokenizer, rng, progress, results, start_model,
                                 unsharded=whole)  # fmt: skip
            if stop.requested and state is None:  # SFT done, GRPO not begun: step 0
                _say_stopped(stages, stop, 0, run_state.save(0))
                return out
            if on_ray:  # workers load the model GRPO starts from, then get the learner's weights
                rollout = RayRollout(config, start_model, learner.named_weights())
            finished = _grpo(run_state, policy, envs, selection, log, stages, stop, reward_fns,
                             rollout)  # fmt: skip
            if not finished:
                return out
            if progress.history:
                training_curves(progress.history, out / "curves.png")
            if report_set is not None:
                _closing_report(run_state, policy, report_set, stages)
    finally:
        if rollout is not None:
            rollout.close()
        if hasattr(policy, "close"):
            policy.close()
        log.close()
        reward_fns.close()
        for env in envs:
            env.close()
        for held in (report_set, start_set, selection):
            if held is not None:
                held.close()
    return out


def _before_grpo(config, model, tokenizer, stages, results, start_set, report_set, stop):
    """The start model's evaluation and the SFT warm-up with its evaluation; returns the
    model GRPO starts from and its name (a folder, once SFT wrote one)."""
    run, out = config.run, Path(config.run.output)
    start_model = config.model.name
    if start_set is not None:
        results["start"] = _evaluate(start_set, HFPolicy(model, tokenizer), stages,
                                     "eval start", run.seed)  # fmt: skip
    if stop.requested:
        return None, start_model
    if config.sft.warmup:
        task = stages.stage("sft", config.sft.steps)
        model, records = warm_up(model, tokenizer, config, advance=lambda: stages.advance(task))
        with open(out / "sft_metrics.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        stages.note(task, f"loss {records[-1]['sft/loss']:.3f}", done=True)
        folder = save_checkpoint(out, config.sft.steps, model, tokenizer, config,
                                 name="checkpoint-sft")  # fmt: skip
        # GRPO's checkpoints name this folder as their base model: LoRA adapters saved
        # from here on are adapters of the SFT model, not of the model SFT started from.
        start_model = model.name_or_path = str(folder.resolve())
        if report_set is not None and not stop.requested:
            results["sft"] = _evaluate(report_set, HFPolicy(model, tokenizer), stages,
                                       "eval sft", run.seed)  # fmt: skip
    return model, start_model


def _say_stopped(stages: Stages, stop: StopRequest, step: int, folder: Path) -> None:
    stages.print(f"stopped on {stop.requested} after step {step}; checkpoint {folder}. "
                 f"Resume with: agentgym train --resume {folder}")  # fmt: skip


def _closing_report(rs: RunState, policy: HFPolicy, report_set: HeldOut, stages: Stages) -> None:
    """Evaluates the best checkpoint (or the last weights) and writes the closing table."""
    config, results, out = rs.config, rs.results, Path(rs.config.run.output)
    name = "grpo"
    if rs.progress.best_step is not None:
        load_trainable(rs.model, out / BEST)
        if getattr(policy, "model", None) is not rs.model:
            policy.load_weights(dist.share_weights(rs.learner))
        name = f"best@{rs.progress.best_step}"
    results[name] = _evaluate(report_set, policy, stages, "eval best", config.run.seed)
    pairs = [(b, a) for a, b in zip(results, list(results)[1:], strict=False)]
    if len(results) == 3:
        pairs.append((name, "start"))
    report = build_report(results, k=max(config.eval.n, 1), comparisons=pairs,
                          meta=_meta(config))  # fmt: skip
    write_report(out / "report", report)
    print_report(report, stages.bar.console)


def _grpo(rs: RunState, policy, envs, selection, log, stages, stop, reward_fns,
          rollout: RayRollout | None = None) -> bool:  # fmt: skip
    """The GRPO steps from `rs.progress.step + 1`; False when a stop request ended them early.

    Each step's non-finite update is skipped and counted; `run.max_skipped_steps`
    of them in a row stop the run with TrainingError.
    """
    config, learner, tokenizer, p = rs.config, rs.learner, rs.tokenizer, rs.progress
    run, g, ev = config.run, config.grpo, config.eval
    select = "eval/pass@1" if ev.n else "eval/correctness"
    task = stages.stage("grpo", run.steps)
    stages.advance(task, p.step)
    while p.step < run.steps:
        step = p.step = p.step + 1
        trajectories, metrics = train_step(config, rs.rng, envs, policy, learner, tokenizer,
                                           beta=g.beta_at(step), reward_fns=reward_fns,
                                           rollout=rollout)  # fmt: skip
        skipped = metrics.get("skipped", 0.0) > 0
        p.skipped_steps += skipped
        p.consecutive_skips = p.consecutive_skips + 1 if skipped else 0
        metrics["train/skipped_steps"] = float(p.skipped_steps)
        if selection is not None and (step % ev.every == 0 or step == run.steps):
            figures = summarize(_evaluate(selection, policy, stages, f"eval step {step}", run.seed))
            metrics.update({f"eval/{k}": figures["greedy"][v] for k, v in EVAL_METRICS.items()})
            if "sampled" in figures:
                metrics["eval/pass@1"] = figures["sampled"]["pass@1"]
        p.history.append({"step": step, **metrics})
        warnings = check_health(p.history, beta=g.beta)
        for w in warnings:
            stages.print(f"[yellow]health[/yellow] step {step}: {w.kind}: {w.message}")
        log.metrics(step, metrics, health=[w.kind for w in warnings])
        log.completions(step, trajectories, run.log_completions)
        if "eval/correctness" in metrics and best_step(p.history, select) == step:
            p.best_step = step
            save_best(run.output, step, rs.model, tokenizer, config)
        if p.consecutive_skips >= run.max_skipped_steps:
            last = latest_checkpoint(run.output)
            raise TrainingError(
                f"{p.consecutive_skips} steps in a row (to step {step}) had a non-finite loss "
                f"or gradient, so their updates were skipped (run.max_skipped_steps="
                f"{run.max_skipped_steps}). Lower optim.lr or check the rewards; the last "
                f"checkpoint is {last if last else 'none'}."
            )
        halt = bool(warnings) and run.stop_on_health
        folder = None
        # Read once: a signal that lands between the save and the stop below would
        # otherwise stop the run without its checkpoint; a later one stops the next step.
        stopping = stop.requested is not None
        if step % run.save_every == 0 or step == run.steps or halt or stopping:
            folder = rs.save(step)
        note = f"reward {metrics['reward/mean']:+.3f}  {metrics['step_seconds']:.1f}s/step"
        if "eval/correctness" in metrics:
            note += f"  held-out {metrics['eval/correctness']:.3f}"
        stages.advance(task)
        stages.note(task, f"step {step}: {note}")
        if stopping:
            _say_stopped(stages, stop, step, folder)
            return False
        if halt:
            stages.print("stopping early: run.stop_on_health is set")
            break
    best_note = f", best held-out step {p.best_step}" if p.best_step is not None else ""
    stages.note(task, f"{len(p.history)} steps{best_note}", done=True)
    return True


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

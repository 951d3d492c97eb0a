"""The GRPO training loop: rollout -> advantages -> learner -> sync -> log -> checkpoint.

Each stage lives elsewhere (the sampler in `agentgym.rollout`, the losses and the
learner in `agentgym.learn`, logs and checkpoints in `agentgym.run`); set-up and
teardown are `agentgym.run.setup`'s. This file strings them together, a step at a time.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from agentgym import records
from agentgym.config import Config
from agentgym.eval.console import Stages
from agentgym.eval.plots import training_curves
from agentgym.learn import grpo
from agentgym.learn.learner import Learner
from agentgym.policy.base import Policy, as_policy
from agentgym.policy.models import load_configured
from agentgym.rewards.functions import RewardFunctions
from agentgym.rollout.sampler import InProcessSampler, Sampler
from agentgym.run import preflight, setup
from agentgym.run.curriculum import Curriculum
from agentgym.run.interrupt import StopRequest
from agentgym.run.resume import Progress, RunState, restore
from agentgym.run.runlog import failure_metrics, rollout_metrics, step_note
from agentgym.run.setup import Run
from agentgym.run.sft import on_device
from agentgym.run.update import learner_steps
from agentgym.scale import dist
from agentgym.types import Trajectory


def train_step(
    config: Config,
    rng: np.random.Generator,
    envs: list,
    policy: Policy,
    learner: Learner,
    tokenizer,
    beta: float | None = None,
    reward_fns: RewardFunctions | None = None,
    sampler: Sampler | None = None,
    version: int = 0,
    difficulty: int | None = None,
) -> tuple[list[Trajectory], dict[str, float | str]]:
    """One GRPO step: rollout, advantages, learner update, weight sync. Returns its metrics.

    `sampler` plays the episodes (by default `policy` in `envs`, in this process) and
    gets the learner's weights of policy `version` + 1 afterwards. `policy`, the run's
    own (evaluations use it), gets them first when it samples with another model than
    the learner's (vLLM, or rank 0's whole copy of an FSDP learner's), timed as
    `rollout/weight_sync_seconds`; it frees what it can while the learner steps.
    `beta` is this step's KL coefficient (the beta schedule); None keeps the learner's.
    `reward_fns` add to each episode's reward. `difficulty` is the level the tasks are
    drawn at (a curriculum's; None: the env's own). Unscorable episodes (an environment
    error, a failed reward function) get advantage 0 and stay out of the reward
    figures and the group statistics.
    """
    g, policy = config.grpo, as_policy(policy)
    sampler = sampler or InProcessSampler(envs, policy, tokenizer)
    start = time.perf_counter()
    specs = setup.task_specs(rng, g.tasks_per_step, difficulty)  # tasks, then sampling seed
    sampler.submit(
        specs,
        g.group_size,
        setup.sampling_params(config, rng),
        max_tokens=config.sampling.max_episode_tokens,
    )
    trajectories = sampler.poll()
    if reward_fns is not None:
        trajectories = reward_fns.score(trajectories)
    rollout_seconds = time.perf_counter() - start
    scorable = torch.tensor([t.scorable for t in trajectories])
    # NaN as well as the mask, so that learner_steps' flat-group test leaves them out too
    rewards = torch.tensor([t.reward if t.scorable else math.nan for t in trajectories])
    if g.length_penalty:
        rewards = rewards - g.length_penalty * torch.tensor(
            [float(t.completion_length) for t in trajectories]
        )
    grpo.check_groups(
        [t.task_id for t in trajectories], [t.group for t in trajectories], g.group_size
    )
    advantages = grpo.group_advantages(
        rewards, g.group_size, scale=g.scale_rewards, scorable=scorable
    )
    with policy.released():
        stats = learner_steps(config, learner, trajectories, rewards, advantages, tokenizer, beta)
    synced: dict[str, float | str] = {}
    if policy.model is not learner.model:
        sync_start = time.perf_counter()
        policy.load_weights(dist.share_weights(learner))
        synced[records.WEIGHT_SYNC_SECONDS] = time.perf_counter() - sync_start
    synced |= sampler.load_weights(lambda: learner.named_weights(), version + 1)
    seconds = time.perf_counter() - start
    metrics: dict[str, float | str] = {
        **rollout_metrics(trajectories),
        **failure_metrics(trajectories),
        **stats,
        records.BETA: learner.beta,
        records.ZERO_VARIANCE: grpo.zero_variance_fraction(rewards, g.group_size),
        records.STEP_SECONDS: seconds,
        records.ROLLOUT_SECONDS: rollout_seconds,
        records.TOKENS_PER_SECOND: sum(sum(t.loss_mask) for t in trajectories) / seconds,
        **synced,
    }
    if g.length_penalty:
        metrics[records.REWARD_PENALISED] = float(rewards.nanmean())
    return trajectories, metrics


def train(config: Config, resume: Path | None = None) -> Path:
    """Runs the configured pipeline; returns the run directory.

    Stages, each optional but GRPO: held-out evaluation of the starting model, the SFT
    warm-up (`sft.warmup`) and its evaluation, `run.steps` GRPO steps with a held-out
    evaluation every `eval.every` steps (keeping `checkpoint-best`), then the best
    checkpoint's evaluation, the closing table (`eval.report_tasks`) and `curves.png`.
    `resume` is a checkpoint folder of an earlier run of this config: the run goes on
    from its step as if it had never stopped. SIGTERM or SIGINT stops the run after
    the current step with a checkpoint (a second SIGINT stops at once).

    Under `torchrun --nproc-per-node N -m agentgym train ...` rank 0 runs all of
    this and writes every file; the other ranks hold copies of the learner (or,
    with `distributed.learner: fsdp`, shards of it) and step them on the batches
    rank 0 shares, each on its share (`agentgym.scale.dist`, `agentgym.scale.fsdp_sync`).
    """
    preflight.check_fsdp(config)
    joined = dist.init()
    try:
        if not dist.is_main():
            return setup.follow(config, resume)
        out = _lead(config, resume)
        dist.release_followers()
        return out
    finally:
        if joined:
            dist.shutdown()


def _lead(config: Config, resume: Path | None) -> Path:
    """`train` in one process, or on rank 0."""
    run = Run.begin(config, resume)
    try:
        model, tokenizer = load_configured(run.start_model, config.model)
        model = on_device(model, config)
        run.open(tokenizer)
        with Stages() as stages, StopRequest(stages.print) as stop:
            if run.state is None:
                model = setup.before_grpo(run, model, tokenizer, stages, stop)
                if model is None:
                    stages.print(
                        f"stopped on {stop.requested} before training began: nothing "
                        "to resume; run the command again"
                    )
                    return run.out
            else:  # stopped after SFT, before its evaluation: evaluate the SFT model now
                setup.owed_sft_evaluation(run, model, tokenizer, stages)
            learner, whole = run.build_learner(model, tokenizer, resume)
            assert run.policy is not None  # build_learner made it
            rng = np.random.default_rng(config.run.seed)
            progress = Progress()
            if run.state is not None:
                assert resume is not None  # the state was read from it
                progress = restore(run.state, resume, learner, rng)
            if run.state is not None or whole is not None:
                run.policy.load_weights(dist.share_weights(learner))
            rs = RunState(
                config,
                learner,
                tokenizer,
                rng,
                progress,
                run.results,
                run.start_model,
                unsharded=whole,
            )
            if stop.requested and run.state is None:  # SFT done, GRPO not begun: step 0
                setup.say_stopped(stages, stop, 0, rs.save(0))
                return run.out
            if not _grpo(rs, run, run.start_sampler(tokenizer, learner), stages, stop):
                return run.out
            if progress.history:
                training_curves(progress.history, run.out / "curves.png")
            if run.report_set is not None:
                setup.closing_report(rs, run.policy, run.report_set, stages)
    finally:
        run.close()
    return run.out


def _grpo(rs: RunState, run: Run, sampler: Sampler, stages: Stages, stop: StopRequest) -> bool:
    """The GRPO steps from `rs.progress.step + 1`; False when a stop request ended them early.

    Each step's non-finite update is skipped and counted; `run.max_skipped_steps`
    of them in a row stop the run with TrainingError.
    """
    config, p = rs.config, rs.progress
    assert run.policy is not None  # build_learner made it
    task = stages.stage("grpo", config.run.steps)
    stages.advance(task, p.step)
    setup.score_start(rs, run, stages)  # step 0: the start is a checkpoint-best candidate
    levels = Curriculum.from_config(config.run.curriculum)
    if levels is not None:
        levels.replay(p.history)  # where a resumed run stood
    while p.step < config.run.steps:
        step = p.step = p.step + 1
        trajectories, metrics = train_step(
            config,
            rs.rng,
            [],
            run.policy,
            rs.learner,
            rs.tokenizer,
            config.grpo.beta_at(step),
            run.reward_fns,
            sampler,
            version=step - 1,
            difficulty=levels.level if levels else None,
        )
        if levels is not None:  # logged at the level trained on, then moved on from it
            metrics[records.CURRICULUM_LEVEL] = levels.level
            if levels.update(float(metrics[records.CORRECTNESS_RATE])):
                stages.print(
                    f"curriculum: step {step} reached the threshold; level {levels.level} next"
                )
        warnings = setup.record_step(rs, run, stages, step, trajectories, metrics)
        halt = bool(warnings) and config.run.stop_on_health
        # Read once: a signal that lands between the save and the stop below would
        # otherwise stop the run without its checkpoint; a later one stops the next step.
        stopping, folder = stop.requested is not None, None
        if step % config.run.save_every == 0 or step == config.run.steps or halt or stopping:
            folder = rs.save(step)
        stages.advance(task)
        stages.note(task, f"step {step}: {step_note(metrics)}")
        if stopping:
            assert folder is not None  # saved above
            setup.say_stopped(stages, stop, step, folder)
            return False
        if halt:
            stages.print("stopping early: run.stop_on_health is set")
            break
    best_note = f", best held-out step {p.best_step}" if p.best_step is not None else ""
    stages.note(task, f"{len(p.history)} steps{best_note}", done=True)
    return True

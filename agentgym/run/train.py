"""The GRPO training loop: collect -> score -> advantages -> update -> sync -> record.

Each stage lives in the package that owns it and passes one `StepRecord` on: the
sampler collects (`agentgym.rollout`), `agentgym.rewards.score` scores,
`agentgym.learn.advantages` and `agentgym.learn.update` compute the advantages and step
the learner, the sampler takes the new weights (`Sampler.load_weights`, the one sync
path), and `agentgym.run.record` records. Set-up and teardown are `agentgym.run.setup`'s,
the stages around GRPO `agentgym.run.phases`'. This file strings them together.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from pathlib import Path

from agentgym import faults, records
from agentgym.config import Config
from agentgym.eval.console import Stages
from agentgym.learn.advantages import advantages
from agentgym.learn.update import update
from agentgym.policy.base import Policy
from agentgym.policy.models import load_configured, on_device
from agentgym.rewards.functions import RewardFunctions
from agentgym.rewards.score import score
from agentgym.rollout.ahead import drop_stale
from agentgym.rollout.player import Submission
from agentgym.rollout.sampler import Sampler
from agentgym.run import phases, preflight, setup
from agentgym.run.curriculum import Curriculum
from agentgym.run.dynamic import sample_until_informative
from agentgym.run.interrupt import StopRequest
from agentgym.run.record import record_step, score_start, step_metrics
from agentgym.run.resume import Submitted, Trainer
from agentgym.run.runlog import step_note
from agentgym.run.setup import Run
from agentgym.scale import ranks
from agentgym.types import StepRecord

logger = logging.getLogger(__name__)


def train_step(
    config: Config,
    trainer: Trainer,
    sampler: Sampler,
    reward_fns: RewardFunctions | None = None,
    *,
    step: int = 1,
    policy: Policy | None = None,
    difficulty: int | None = None,
) -> StepRecord:
    """GRPO step `step`: the stages in order, on `grpo.tasks_per_step` fresh tasks.

    `sampler` plays them with the weights of policy version `step - 1` and gets those
    of version `step` after the update; with `pipeline.max_off_policy_steps` k > 0 it was
    handed them up to k steps before, and plays them with version max(start, step - 1 - k)
    (`agentgym.rollout.ahead`) while the learner steps on the steps before.
    `reward_fns` add to each episode's reward.
    `policy`, the run's own, frees what it can while the learner steps (a vLLM engine's
    cache). `difficulty` is the level the tasks are drawn at (a curriculum's; None: the
    env's own). The KL coefficient is the beta schedule's at `step`.
    """
    g, learner, start = config.grpo, trainer.learner, time.perf_counter()
    ahead, queue = trainer.staleness, trainer.submitted
    # this step's tasks, and, asynchronously, those of the k steps after it (not past the end)
    while not queue or (len(queue) <= ahead and step + len(queue) <= config.run.steps):
        queue.append(_submit(config, trainer, sampler, difficulty))
    if not ahead:  # a sampler that plays ahead reaches the point on its own thread
        faults.reached("rollout", step)
    record = StepRecord(step, step - 1, queue.popleft().specs, tuple(sampler.poll(wait=True)))
    if ahead:
        record = drop_stale(record, g.group_size, ahead)
    record = score(record, reward_fns, g.length_penalty)
    if g.dynamic_sampling:  # synchronous only (config.rules)

        def more() -> StepRecord:
            specs = _submit(config, trainer, sampler, difficulty).specs
            played = StepRecord(step, step - 1, specs, tuple(sampler.poll(wait=True)))
            return score(played, reward_fns, g.length_penalty)

        record = sample_until_informative(record, more, g.group_size, g.max_resample_rounds)
    rollout_seconds = time.perf_counter() - start
    record = advantages(record, g)
    faults.reached("update", step)
    with policy.released() if policy is not None else contextlib.nullcontext():
        pad_id = trainer.tokenizer.pad_token_id
        beta, off_policy = g.beta_at(step), trainer.off_policy
        record = update(record, learner, config, pad_id, beta, ranks.share_step, off_policy)
    synced = sampler.load_weights(lambda: ranks.share_weights(learner), step)
    timings = {
        records.STEP_SECONDS: time.perf_counter() - start,
        records.ROLLOUT_SECONDS: rollout_seconds,
    }
    return replace(record, timings={**timings, **synced})


def _submit(
    config: Config, trainer: Trainer, sampler: Sampler, difficulty: int | None
) -> Submitted:
    """Draws a step's tasks, then its sampling seed, and hands them to the sampler."""
    stream = trainer.rng.bit_generator.state
    specs = setup.task_specs(trainer.rng, config.grpo.tasks_per_step, difficulty)
    params = setup.sampling_params(config, trainer.rng)
    max_tokens = config.sampling.max_episode_tokens
    sampler.submit(Submission(tuple(specs), config.grpo.group_size, params, max_tokens))
    return Submitted(tuple(specs), stream)


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
    rank 0 shares, each on its share (`agentgym.scale.ranks`, `agentgym.scale.ranks`).
    """
    preflight.check_torchrun(config)
    joined = ranks.init()
    try:
        if not ranks.is_main():
            return setup.follow(config, resume)
        out = _lead(config, resume)
        ranks.release_followers()
        return out
    finally:
        if joined:
            ranks.shutdown()


def _lead(config: Config, resume: Path | None) -> Path:
    """`train` in one process, or on rank 0."""
    run = Run.begin(config, resume)
    try:
        model, tokenizer = load_configured(run.start_model, config.model)
        model = on_device(model, config)
        run.open(tokenizer)
        with Stages() as stages, StopRequest() as stop:
            if run.state is None:
                model = phases.before_grpo(run, model, tokenizer, stages, stop)
                if model is None:
                    logger.info(
                        "stopped on %s before training began: nothing to resume; run "
                        "the command again",
                        stop.requested,
                    )
                    return run.out
            else:  # stopped after SFT, before its evaluation: evaluate the SFT model now
                phases.owed_sft_evaluation(run, model, tokenizer, stages)
            run.start_training(model, tokenizer, resume)
            if stop.requested and run.state is None:  # SFT done, GRPO not begun: step 0
                phases.say_stopped(stop, 0, run.save(0))
                return run.out
            if not _grpo(run, stages, stop):
                return run.out
            if run.training().progress.history:
                from agentgym.eval.plots import training_curves  # matplotlib: only here

                training_curves(run.training().progress.history, run.out / "curves.png")
            if run.report_set is not None:
                phases.closing_report(run, run.report_set, stages)
    finally:
        run.close()
    return run.out


def _grpo(run: Run, stages: Stages, stop: StopRequest) -> bool:
    """The GRPO steps from `progress.step + 1`; False when a stop request ended them early.

    Each step's non-finite update is skipped and counted; `run.max_skipped_steps`
    of them in a row stop the run with TrainingError.
    """
    config, t = run.config, run.training()
    p, sampler = t.progress, run.sampler
    assert sampler is not None  # start_training made it
    task = stages.stage("grpo", config.run.steps)
    stages.advance(task, p.step)
    score_start(run, stages)  # step 0: the start is a checkpoint-best candidate
    levels = Curriculum.from_config(config.run.curriculum)
    if levels is not None:
        levels.replay(p.history)  # where a resumed run stood
    while p.step < config.run.steps:
        step = p.step = p.step + 1
        level = levels.level if levels else None
        record = train_step(
            config, t, sampler, run.reward_fns, step=step, policy=run.policy, difficulty=level
        )
        metrics = step_metrics(record, t.learner.beta, config.grpo.length_penalty)
        if levels is not None:  # logged at the level trained on, then moved on from it
            metrics[records.CURRICULUM_LEVEL] = levels.level
            if levels.update(float(metrics[records.CORRECTNESS_RATE])):
                logger.info(
                    "curriculum: step %d reached the threshold; level %d next", step, levels.level
                )
        warnings = record_step(run, stages, record, metrics)
        faults.reached("step_end", step)
        halt = bool(warnings) and config.run.stop_on_health
        # Read once: a signal that lands between the save and the stop below would
        # otherwise stop the run without its checkpoint; a later one stops the next step.
        stopping, folder = stop.requested is not None, None
        if step % config.run.save_every == 0 or step == config.run.steps or halt or stopping:
            folder = run.save(step)
        stages.advance(task)
        stages.note(task, f"step {step}: {step_note(metrics)}")
        if stopping:
            assert folder is not None  # saved above
            phases.say_stopped(stop, step, folder)
            return False
        if halt:
            logger.warning("stopping early: run.stop_on_health is set")
            break
    best_note = f", best held-out step {p.best_step}" if p.best_step is not None else ""
    stages.note(task, f"{len(p.history)} steps{best_note}", done=True)
    return True

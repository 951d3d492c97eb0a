"""A training run's set-up and teardown: everything the loop in `agentgym.run.train` uses.

`Run` owns the run's resources (reward functions, logs, the held-out sets, the
sampler's environments, the policy, the sampler) and closes them, in `close`,
whatever happened. The stages around GRPO live here too: the start model's
evaluation, the SFT warm-up and its evaluation (`before_grpo`), and the best
checkpoint's evaluation with the closing table (`closing_report`). Rank 0 leads;
another torchrun rank only `follow`s (`agentgym.scale.dist`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym import records
from agentgym.config import Config
from agentgym.env.core import make_env
from agentgym.eval.console import Stages, print_report
from agentgym.eval.heldout import HeldOut, TaskResult, held_out_ids, task_result
from agentgym.eval.report import build_report, summarize, write_report
from agentgym.eval.stats import best_step
from agentgym.learn.learner import Learner
from agentgym.policy.base import Policy, SamplingParams
from agentgym.policy.factory import engine_folder, make_policy
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_configured, resolve_model_name
from agentgym.records import CheckpointState
from agentgym.rewards.functions import RewardFunctions
from agentgym.rollout.episodes import TaskSpec
from agentgym.rollout.sampler import Sampler
from agentgym.run import failures, preflight
from agentgym.run.checkpoint import (
    BEST,
    latest_checkpoint,
    read_trainer,
    save_best,
    save_checkpoint,
)
from agentgym.run.doctor import check_env_template
from agentgym.run.health import check_health
from agentgym.run.interrupt import StopRequest, TrainingError
from agentgym.run.resume import RunState, learner_for, load_trainable, resume_state
from agentgym.run.runlog import RunLog, truncate_logs
from agentgym.run.sft import long_config, on_device, warm_up
from agentgym.scale import dist, fsdp_sync
from agentgym.scale.samplers import make_sampler, play_share, ranks_sample, sampler_envs
from agentgym.types import Trajectory

SFT_LONG = "sft-long"
"""The closing table's row of SFT trained on past the warm-up (`sft.long`)."""

EVAL_METRICS = {
    records.EVAL_CORRECTNESS: "correctness_strict",
    records.EVAL_LENIENT: "correctness_lenient",
    records.EVAL_FORMAT: "format_accuracy",
    records.EVAL_REWARD: "reward_mean",
    records.EVAL_TOOL_ERRORS: "tool_error_rate",
}
"""The held-out figures logged during training: step metric -> greedy summary figure."""


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (initialisation; sampling has its own generator)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def task_specs(
    rng: np.random.Generator, count: int, difficulty: int | None = None
) -> list[TaskSpec]:
    """`count` train tasks, each named by a fresh reset seed, at `difficulty` (None: the env's)."""
    seeds = rng.integers(0, 2**31 - 1, size=count)
    return [TaskSpec(seed=int(s), difficulty=difficulty) for s in seeds]


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


@dataclass
class Run:
    """One training run on rank 0 (or in one process): its config, where it stands, and
    what it holds. Made by `Run.begin`; `open` adds what needs the model; `close` frees all."""

    config: Config
    state: CheckpointState | None
    """The checkpoint's state when resuming, else None."""
    reward_fns: RewardFunctions
    out: Path
    start_model: str | None
    log: RunLog | None = None
    envs: list = field(default_factory=list)
    selection: HeldOut | None = None
    """The held-out tasks `checkpoint-best` is chosen on (`eval.tasks`)."""
    report_set: HeldOut | None = None
    """The closing table's tasks (`eval.report_tasks`), disjoint from the selection's."""
    start_set: HeldOut | None = None
    results: dict[str, list[TaskResult]] = field(default_factory=dict)
    policy: Policy | None = None
    sampler: Sampler | None = None

    @classmethod
    def begin(cls, config: Config, resume: Path | None) -> Run:
        """Reads the checkpoint, loads the reward functions (one that cannot load fails
        here), checks Ray and vLLM are there, before any model loads; then seeds."""
        state = resume_state(resume) if resume is not None else None
        reward_fns = RewardFunctions(config.rewards)
        if config.distributed.backend == "ray":
            preflight.require_ray()
        if config.policy.backend == "vllm":
            preflight.require_vllm(config)
        seed_everything(config.run.seed)
        start_model = state.start_model if state else config.model.name
        assert config.run.output is not None  # the CLI names the run's folder first
        return cls(config, state, reward_fns, Path(config.run.output), start_model)

    def open(self, tokenizer) -> None:
        """The logs (cut back to the checkpoint's step), the sampler's environments, the
        held-out sets, and the evaluations a resumed run already made."""
        run, ev = self.config.run, self.config.eval
        if self.state is not None:
            truncate_logs(self.out, self.state.step)
        purge = self.state.step + 1 if self.state else None
        self.log = RunLog(self.out, tensorboard=run.tensorboard, purge_step=purge)
        self.envs = sampler_envs(self.config)
        probe = self.envs[0] if self.envs else make_env(run.env, **run.env_kwargs)  # Ray: none
        try:
            check_env_template(probe, tokenizer, str(self.start_model or "the model"))
        finally:
            if not self.envs:
                probe.close()
        self.selection = self._held_out(tokenizer, ev.tasks, 0) if ev.every else None
        if ev.report_tasks:
            self.report_set = self.start_set = self._held_out(tokenizer, ev.report_tasks, ev.tasks)
            if ev.start_n is not None and ev.start_n != ev.n:
                self.start_set = self._held_out(tokenizer, ev.report_tasks, ev.tasks, ev.start_n)
        evals = self.state.evals if self.state else {}
        self.results = {k: [task_result(r) for r in v] for k, v in evals.items()}

    def _held_out(self, tokenizer, count: int, start: int, n: int | None = None) -> HeldOut:
        ev, run = self.config.eval, self.config.run
        ids = held_out_ids(run.env, run.env_kwargs, count, start=start, split=ev.split)
        return HeldOut.from_config(self.config, ids, tokenizer, n=ev.n if n is None else n)

    def build_learner(self, model, tokenizer, resume: Path | None) -> tuple[Learner, Any]:
        """The learner, the run's policy and sampler; returns the learner and rank 0's
        whole copy of a sharded learner's model (None when the learner's is whole)."""
        config = self.config
        # the engine starts from the weights GRPO starts from, saved before LoRA wraps them
        engine_dir = engine_folder(config, model, tokenizer)
        # FSDP shards the learner's model in place: rank 0 samples with a whole copy
        whole = fsdp_sync.unsharded_copy(model, config) if fsdp_sync.sharded(config) else None
        learner = dist.build_learner(lambda: learner_for(config, model, self.start_model, resume))
        sampling_model = learner.model if whole is None else whole
        self.policy = make_policy(
            config, sampling_model, tokenizer, engine_dir=engine_dir, learner_model=learner.model
        )
        return learner, whole

    def start_sampler(self, tokenizer, learner: Learner) -> Sampler:
        """The sampler; Ray workers load the model GRPO starts from, then the learner's
        weights now."""
        assert self.policy is not None  # `build_learner` made it
        self.sampler = make_sampler(
            self.config, self.envs, self.policy, tokenizer, self.start_model, learner.named_weights
        )
        return self.sampler

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        else:
            for env in self.envs:
                env.close()
        if self.policy is not None:
            self.policy.close()
        if self.log is not None:
            self.log.close()
        self.reward_fns.close()
        for held in (self.report_set, self.start_set, self.selection):
            if held is not None:
                held.close()


def owed_sft_evaluation(run: Run, model: Any, tokenizer: Any, stages: Stages) -> None:
    """A resumed run that stopped after SFT, before SFT's evaluation, evaluates it now."""
    config = run.config
    if run.report_set is not None and config.sft.warmup and "sft" not in run.results:
        policy = HFPolicy(model, tokenizer)
        run.results["sft"] = evaluate(run.report_set, policy, stages, "eval sft", config.run.seed)


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


def before_grpo(run: Run, model, tokenizer, stages: Stages, stop: StopRequest):
    """The start model's evaluation and the SFT warm-up with its evaluation; returns the
    model GRPO starts from (None when a stop request came first), and sets the run's
    `start_model` (a folder, once SFT wrote one)."""
    config, results, seed = run.config, run.results, run.config.run.seed
    if run.start_set is not None:
        results["start"] = evaluate(
            run.start_set, HFPolicy(model, tokenizer), stages, "eval start", seed
        )
    if stop.requested:
        return None
    if config.sft.warmup:
        task = stages.stage("sft", config.sft.steps)
        model, records = warm_up(model, tokenizer, config, advance=lambda: stages.advance(task))
        with open(run.out / "sft_metrics.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        stages.note(task, f"loss {records[-1]['sft/loss']:.3f}", done=True)
        folder = save_checkpoint(
            run.out, config.sft.steps, model, tokenizer, config, name="checkpoint-sft"
        )
        # GRPO's checkpoints name this folder as their base model: LoRA adapters saved
        # from here on are adapters of the SFT model, not of the model SFT started from.
        run.start_model = model.name_or_path = str(folder.resolve())
        if run.report_set is not None and not stop.requested:
            results["sft"] = evaluate(
                run.report_set, HFPolicy(model, tokenizer), stages, "eval sft", seed
            )
    return model


def say_stopped(stages: Stages, stop: StopRequest, step: int, folder: Path) -> None:
    stages.print(
        f"stopped on {stop.requested} after step {step}; checkpoint {folder}. "
        f"Resume with: agentgym train --resume {folder}"
    )


def closing_report(rs: RunState, policy: Policy, report_set: HeldOut, stages: Stages) -> None:
    """Evaluates the best checkpoint (or the last weights) and writes the closing table."""
    assert rs.config.run.output is not None  # the CLI names the run's folder first
    config, results, out = rs.config, rs.results, Path(rs.config.run.output)
    name = "grpo"
    if rs.progress.best_step is not None:
        load_trainable(rs.model, out / BEST)
        if policy.model is not rs.model:
            policy.load_weights(dist.share_weights(rs.learner))
        name = f"best@{rs.progress.best_step}"
    results[name] = evaluate(report_set, policy, stages, "eval best", config.run.seed)
    pairs = [(b, a) for a, b in zip(results, list(results)[1:], strict=False)]
    if len(results) == 3:
        pairs.append((name, "start"))
    if config.sft.long != "off":
        results[SFT_LONG] = sft_long(rs, report_set, stages)
        pairs += [(name, SFT_LONG), (SFT_LONG, "sft")]
    meta = {
        "env": config.run.env,
        "env_kwargs": config.run.env_kwargs,
        "model": resolve_model_name(config.model.name),
        "split": config.eval.split,
        "decoding": "greedy",
    }
    report = build_report(results, k=max(config.eval.n, 1), comparisons=pairs, meta=meta)
    write_report(out / "report", report)
    print_report(report, stages.bar.console)


def sft_long(rs: RunState, report_set: HeldOut, stages: Stages) -> list[TaskResult]:
    """The `sft-long` model's results: SFT from the start model for `sft.long` steps, or
    for as long as SFT and GRPO trained (`run/sft.long_config`), on fresh demonstrations;
    its step records go to sft_long_metrics.jsonl."""
    config = rs.config
    out = Path(str(config.run.output))
    sft_records = [json.loads(x) for x in (out / "sft_metrics.jsonl").read_text().splitlines()]
    grpo_seconds = sum(float(h[records.STEP_SECONDS]) for h in rs.progress.history)
    long = long_config(config, [r["step_seconds"] for r in sft_records], grpo_seconds)
    model, tokenizer = load_configured(config.model.name, config.model)
    model = on_device(model, config)
    task = stages.stage(SFT_LONG, long.sft.steps)
    torch.manual_seed(config.run.seed)  # its LoRA adapters start as a run's first ones do
    model, steps = warm_up(model, tokenizer, long, advance=lambda: stages.advance(task))
    with open(out / "sft_long_metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in steps)
    note = f"{long.sft.steps} steps, {sum(r['step_seconds'] for r in steps):.0f} s"
    stages.note(task, f"{note} (GRPO trained {grpo_seconds:.0f} s)", done=True)
    policy = HFPolicy(model, tokenizer)
    return evaluate(report_set, policy, stages, f"eval {SFT_LONG}", config.run.seed)


def follow(config: Config, resume: Path | None) -> Path:
    """A rank other than 0: builds its learner when rank 0 builds its own (rank 0's
    weights are copied in), then steps it on the batches rank 0 shares, and plays its
    share of each step's episodes when the ranks sample (`ranks_sample`). Writes nothing."""
    seed_everything(config.run.seed)
    state = resume_state(resume) if resume is not None else None
    start_model = state.start_model if state else config.model.name
    envs: list[Any] = []
    tokenizers: list[Any] = []
    policies: list[HFPolicy] = []

    def build() -> Learner:
        model, tokenizer = load_configured(start_model, config.model)
        tokenizers.append(tokenizer)
        model = on_device(model, config)  # this rank's GPU: `dist.init` made it the current one
        learner = learner_for(config, model, start_model, resume)
        if resume is not None:
            learner.load_state_dict(read_trainer(resume)["learner"])
        return learner

    def sample(learner: Learner, payload: Any) -> list[Trajectory]:
        envs[:] = envs or sampler_envs(config)
        policies[:] = policies or [HFPolicy(learner.model, tokenizers[-1])]
        return play_share(envs, policies[0], tokenizers[-1], payload)

    try:
        dist.follow(build, sample if ranks_sample(config) else None)
    finally:
        for env in envs:
            env.close()
    assert config.run.output is not None  # the CLI names the run's folder first
    return Path(config.run.output)


def score_start(rs: RunState, run: Run, stages: Stages) -> None:
    """Scores the model GRPO starts from (the SFT checkpoint, or the base model) on the
    selection tasks, as step 0: it is `checkpoint-best` until a step scores higher."""
    config, p = rs.config, rs.progress
    if run.selection is None or p.step != 0 or p.start_selection is not None:
        return
    assert config.run.output is not None  # the CLI names the run's folder first
    p.start_selection = {"step": 0, **selection_figures(run, stages, 0)}
    p.best_step = 0
    save_best(config.run.output, 0, rs.model, rs.tokenizer, config)


def selection_figures(run: Run, stages: Stages, step: int) -> dict[str, float]:
    """The run's policy's figures on the selection tasks now, as step metrics."""
    assert run.selection is not None and run.policy is not None  # made before GRPO
    results = evaluate(run.selection, run.policy, stages, f"eval step {step}", run.config.run.seed)
    figures = summarize(results)
    row = {key: getattr(figures.greedy, v) for key, v in EVAL_METRICS.items()}
    if figures.sampled is not None:
        row[records.EVAL_PASS_AT_1] = figures.sampled.at_k["pass@1"]
    return row


def record_step(
    rs: RunState, run: Run, stages: Stages, step: int, trajectories: list[Trajectory], metrics: dict
) -> list:
    """Counts skipped updates, evaluates when due (keeping checkpoint-best), checks
    health, logs the step; returns the health warnings. Too many skipped updates in
    a row end the run with TrainingError, and so do too many failed steps in a row
    (`agentgym.run.failures`), after a checkpoint."""
    config, p = rs.config, rs.progress
    ev, max_skips = config.eval, config.run.max_skipped_steps
    assert config.run.output is not None and run.log is not None  # set before the first step
    skipped = metrics.get(records.SKIPPED, 0.0) > 0
    p.skipped_steps += skipped
    p.consecutive_skips = p.consecutive_skips + 1 if skipped else 0
    metrics[records.SKIPPED_STEPS] = float(p.skipped_steps)
    if run.selection is not None and (step % ev.every == 0 or step == config.run.steps):
        metrics.update(selection_figures(run, stages, step))
    p.history.append({"step": step, **metrics})
    warnings = check_health(p.history, beta=config.grpo.beta)
    for w in warnings:
        stages.print(f"[yellow]health[/yellow] step {step}: {w.kind}: {w.message}")
    run.log.metrics(step, metrics, health=[w.kind for w in warnings])
    run.log.completions(step, trajectories, config.run.log_completions)
    select = records.EVAL_PASS_AT_1 if ev.n else records.EVAL_CORRECTNESS
    if records.EVAL_CORRECTNESS in metrics and best_step(p.candidates(), select) == step:
        p.best_step = step
        save_best(config.run.output, step, rs.model, rs.tokenizer, config)
    if p.consecutive_skips >= max_skips:
        raise TrainingError(
            f"{p.consecutive_skips} steps in a row (to step {step}) had a non-finite loss "
            f"or gradient, so their updates were skipped (run.max_skipped_steps={max_skips}). "
            "Lower optim.lr or check the rewards; the last checkpoint is "
            f"{latest_checkpoint(config.run.output) or 'none'}."
        )
    if (reason := failures.stop_reason(p.history, trajectories, config.run)) is not None:
        raise TrainingError(f"{reason} Checkpoint: {rs.save(step)}.")
    return warnings

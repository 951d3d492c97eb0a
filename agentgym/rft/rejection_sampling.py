"""Rejection-sampling fine-tuning (RFT): sample, keep what the verifier passes, fine-tune.

Each round plays `grpo.group_size` episodes of each of `rft.tasks_per_round` fresh train
tasks with the current policy, through the sampler GRPO plays with (`make_sampler`: the
same environments, `sampling.*` parameters and, for the same seed, task stream), keeps
the episodes the verifier passes, and takes `rft.steps_per_round` SFT steps of
`sft.batch_size` episodes on them (`agentgym.sft.warmup.sft_step`): the mean NLL of the
policy's own sampled ids, never of the prompt or the tool results (the rollout's loss
mask). The sampler then gets the new weights, and the next round begins. This is expert
iteration (Anthony et al., 2017) as RAFT (Dong et al., 2023) and ReST-EM (Singh et al.,
2023) apply it to language models, with these choices:

- Kept: an episode whose reward part `correctness` is at least 1.0 and whose reward is a
  verified outcome (`Trajectory.scorable`); with `rft.min_reward`, also whose reward (the
  one GRPO learns from: the environment's plus the reward functions', less
  `grpo.length_penalty` per token) reaches it. A pass is a pass: RAFT keeps the best of
  each prompt's samples by reward instead.
- No negative examples and no advantages: failed episodes are dropped, not pushed down,
  and every kept token weighs the same; GRPO weighs each by its group-relative advantage.
- Fine-tuning goes on from the current weights with one AdamW (`sft.lr`) across rounds,
  as RAFT's does; ReST-EM fine-tunes the base model afresh each iteration.
- `rft.pool: round` draws batches (with replacement) from this round's kept episodes,
  on-policy; `all` from every round's so far, a growing set that keeps older policies'.
- A round that keeps nothing takes no step; `rft.max_empty_rounds` of them in a row stop
  the run with its checkpoint and TrainingError, as does an environment that reports no
  `correctness` part at all.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from agentgym.config import Config, ConfigError
from agentgym.eval.console import Stages
from agentgym.learn.lora import wrap_lora
from agentgym.policy.backend import engine_folder, make_policy
from agentgym.policy.base import Policy
from agentgym.policy.models import load_configured, on_device
from agentgym.rewards.functions import RewardFunctions
from agentgym.rewards.score import score
from agentgym.rollout.player import Submission
from agentgym.rollout.sampler import Sampler, WeightSource
from agentgym.run import preflight
from agentgym.run.checkpoint import save_checkpoint
from agentgym.run.interrupt import StopRequest, TrainingError
from agentgym.run.setup import sampling_params, seed_everything, task_specs
from agentgym.scale import ranks
from agentgym.scale.samplers import make_sampler, sampler_envs
from agentgym.sft.warmup import sft_optimizer, sft_step
from agentgym.types import StepRecord, Trajectory

logger = logging.getLogger(__name__)

CORRECTNESS = "correctness"
"""The reward part the verifier's verdict is read from: 1.0 is a pass."""


def passes(trajectory: Trajectory, reward: float, min_reward: float | None = None) -> bool:
    """Whether RFT keeps an episode: verified (scorable), `correctness` >= 1.0, and, when
    `min_reward` is given, `reward` (its scored reward) >= it."""
    if not trajectory.scorable or trajectory.reward_parts.get(CORRECTNESS, 0.0) < 1.0:
        return False
    return min_reward is None or reward >= min_reward


def kept_episodes(record: StepRecord, min_reward: float | None = None) -> list[Trajectory]:
    """The episodes of a scored `record` that `passes` keeps, in their order."""
    record.require("rewards")
    assert record.rewards is not None  # require() checked it
    rewards = record.rewards.tolist()
    return [
        t for t, r in zip(record.trajectories, rewards, strict=True) if passes(t, r, min_reward)
    ]


def check_rft(config: Config) -> None:
    """Refuses `config` for `agentgym rft` before any model loads, naming each field.

    What RFT shares with GRPO is checked as `agentgym train` checks it (the model, the
    environment, which plays up to its first observation, LoRA, the output folder), with
    the stages RFT does not have switched off: the SFT warm-up and sft-long, held-out
    evaluations, the curriculum and the learning-rate schedule.
    """
    if ranks.world_size() > 1:
        raise ConfigError("agentgym rft runs in one process: launch it without torchrun")
    preflight.require_backends(config)
    shared = config.model_copy(
        update={
            "sft": config.sft.model_copy(update={"warmup": False, "long": "off"}),
            "eval": config.eval.model_copy(update={"every": 0, "report_tasks": 0}),
            "optim": config.optim.model_copy(update={"lr_scheduler": "constant"}),
            "run": config.run.model_copy(
                update={"curriculum": config.run.curriculum.model_copy(update={"levels": []})}
            ),
        }
    )
    preflight.check(shared, "train")


def sampler_config(config: Config) -> Config:
    """`config` as the sampler reads it: `grpo.tasks_per_step` is `rft.tasks_per_round`
    (how many environments it makes, here or on each Ray worker)."""
    grpo = config.grpo.model_copy(update={"tasks_per_step": config.rft.tasks_per_round})
    return config.model_copy(update={"grpo": grpo})


@dataclass
class RFTRun:
    """What RFT holds while it runs: the model it fine-tunes, its optimizer, the sampler
    and its policy, the reward functions, and the two random streams. Made by `start`;
    `close` frees what it holds."""

    config: Config
    model: Any
    tokenizer: Any
    policy: Policy
    sampler: Sampler
    reward_fns: RewardFunctions
    optimizer: torch.optim.Optimizer
    tasks: np.random.Generator
    """The task stream and the sampling seeds: GRPO's, for the same `run.seed`."""
    batches: np.random.Generator
    """Which kept episodes each SFT step trains on."""
    pool: list[Trajectory] = field(default_factory=list)
    updates: int = 0
    """Rounds that stepped the optimizer: the version of the weights the sampler has."""

    @classmethod
    def start(cls, config: Config, model, tokenizer, reward_fns: RewardFunctions) -> RFTRun:
        """The policy and sampler GRPO would make for `model`, with LoRA adapters on it
        when `lora.enabled` (the vLLM engine starts from the weights before them)."""
        engine_dir = engine_folder(config, model, tokenizer)
        model = wrap_lora(model, config) if config.lora.enabled else model
        policy = make_policy(config, model, tokenizer, engine_dir=engine_dir, learner_model=model)
        view = sampler_config(config)
        envs = sampler_envs(view)
        weights = cls.trainable(model)
        try:
            start = config.model.name
            sampler = make_sampler(view, envs, policy, tokenizer, start, weights, model)
        except BaseException:
            for env in envs:
                env.close()
            policy.close()
            raise
        seed = config.run.seed
        return cls(
            config,
            model,
            tokenizer,
            policy,
            sampler,
            reward_fns,
            sft_optimizer(model, config),
            np.random.default_rng(seed),
            np.random.default_rng([seed, 1]),
        )

    @staticmethod
    def trainable(model) -> WeightSource:
        """The weight source the sampler copies from: `model`'s trainable weights by name."""

        def weights() -> Iterator[tuple[str, torch.Tensor]]:
            return ((n, p.detach()) for n, p in model.named_parameters() if p.requires_grad)

        return weights

    def play(self, number: int) -> StepRecord:
        """Round `number`'s episodes, scored as a GRPO step's are."""
        c = self.config
        specs = task_specs(self.tasks, c.rft.tasks_per_round)
        params = sampling_params(c, self.tasks)
        size, budget = c.grpo.group_size, c.sampling.max_episode_tokens
        self.sampler.submit(Submission(tuple(specs), size, params, budget))
        played = tuple(self.sampler.poll(wait=True))
        record = StepRecord(number, self.updates, tuple(specs), played)
        return score(record, self.reward_fns, c.grpo.length_penalty)

    def fine_tune(self, kept: list[Trajectory]) -> list[dict[str, float]]:
        """Adds `kept` to the pool (`rft.pool`), then, unless `kept` is empty, takes
        `rft.steps_per_round` SFT steps on batches drawn from it and gives the sampler
        the new weights; returns the steps' records."""
        r, size = self.config.rft, self.config.sft.batch_size
        self.pool = kept if r.pool == "round" else [*self.pool, *kept]
        if not kept:
            return []
        was_training, steps = self.model.training, []
        with self.policy.released():
            self.model.train()
            for _ in range(r.steps_per_round):
                chosen = [self.pool[i] for i in self.batches.choice(len(self.pool), size=size)]
                pad_id = self.tokenizer.pad_token_id
                steps.append(sft_step(self.model, self.optimizer, chosen, pad_id, self.config))
            self.model.train(was_training)
        self.updates += 1
        self.sampler.load_weights(self.trainable(self.model), self.updates)
        return steps

    def close(self) -> None:
        self.sampler.close()
        self.policy.close()


def round_row(
    record: StepRecord, kept: list[Trajectory], steps: list[dict[str, float]], pool: int
) -> dict[str, Any]:
    """Round `record.step`'s row of metrics.jsonl, without its timings."""
    episodes = len(record.trajectories)
    mean = float(record.rewards.nanmean()) if record.rewards is not None else math.nan
    losses = [s["sft/loss"] for s in steps]
    return {
        "round": record.step,
        "tasks": len(record.specs),
        "episodes": episodes,
        "kept": len(kept),
        "kept_fraction": len(kept) / episodes if episodes else 0.0,
        "unscorable": sum(not t.scorable for t in record.trajectories),
        "reward_mean": mean if math.isfinite(mean) else None,
        "pool": pool,
        "sft/steps": len(steps),
        "sft/loss": sum(losses) / len(losses) if losses else None,
        "grad_norm": sum(s["grad_norm"] for s in steps) / len(steps) if steps else None,
    }


def rounds(run: RFTRun, log: IO[str], stages: Stages, stop: StopRequest) -> tuple[int, str]:
    """Plays and fine-tunes round after round, a row of `log` each, until `rft.rounds`,
    the wall budget or a stop signal; returns the rounds done and, when the run cannot
    go on (nothing to learn from), why, else "". The caller saves either way."""
    r = run.config.rft
    bar = stages.stage("rft", r.rounds)
    start, empty = time.perf_counter(), 0
    for number in range(1, r.rounds + 1):
        began = time.perf_counter()
        record = run.play(number)
        rollout = time.perf_counter() - began
        kept = kept_episodes(record, r.min_reward)
        row = round_row(record, kept, run.fine_tune(kept), len(run.pool))
        now = time.perf_counter()
        row |= {"rollout_seconds": rollout, "seconds": now - began, "elapsed": now - start}
        log.write(json.dumps(row) + "\n")
        log.flush()
        stages.advance(bar)
        stages.note(bar, note(row))
        empty = 0 if kept else empty + 1
        if number == 1 and (why := unverified(run.config.run.env, record.trajectories)):
            return number, why
        if r.max_empty_rounds and empty >= r.max_empty_rounds:
            why = f"{empty} rounds in a row kept no episode (rft.max_empty_rounds): none passed"
            return number, f"{why} the verifier ({CORRECTNESS!r} >= 1.0)"
        if stop.requested:
            logger.info("stopped on %s after round %d", stop.requested, number)
            return number, ""
        if r.max_seconds is not None and now - start >= r.max_seconds:
            logger.info("rft: %.0f s reached rft.max_seconds after round %d", now - start, number)
            return number, ""
    return r.rounds, ""


def unverified(env: str, played: tuple[Trajectory, ...]) -> str:
    """Why RFT can keep nothing `env` plays: its scorable episodes carry no `correctness`
    part; "" when some do, or none is scorable (then the environment failed, not its
    verifier)."""
    scored = [t for t in played if t.scorable]
    if scored and not any(CORRECTNESS in t.reward_parts for t in scored):
        return f"{env!r} reports no {CORRECTNESS!r} reward part, so RFT keeps none of its episodes"
    return ""


def note(row: dict[str, Any]) -> str:
    """The progress bar's note for a round's row."""
    loss = "no update" if row["sft/loss"] is None else f"sft loss {row['sft/loss']:.3f}"
    return f"round {row['round']}: kept {row['kept']}/{row['episodes']}, {loss}"


def rft(config: Config) -> Path:
    """Runs `rft.rounds` rounds of RFT (fewer under `rft.max_seconds` or a stop signal);
    returns the checkpoint written at the end, `checkpoint-{rounds done}`.

    The checkpoint holds the whole model (LoRA adapters merged), so `--model` takes it
    as any other model folder. `metrics.jsonl` gets a row per round as it ends.

    Raises:
        TrainingError: after the checkpoint, when the environment reports no
            `correctness` part or `rft.max_empty_rounds` rounds in a row kept nothing.
    """
    assert config.run.output is not None  # the CLI names the run's folder first
    out = Path(config.run.output)
    seed_everything(config.run.seed)
    reward_fns = RewardFunctions(config.rewards)  # one that cannot load fails before the model
    try:
        model, tokenizer = load_configured(config.model.name, config.model)
        run = RFTRun.start(config, on_device(model, config), tokenizer, reward_fns)
        try:
            out.mkdir(parents=True, exist_ok=True)
            with (
                open(out / "metrics.jsonl", "a") as log,
                Stages() as stages,
                StopRequest() as stop,
            ):
                done, why = rounds(run, log, stages, stop)
        finally:
            run.close()
    finally:
        reward_fns.close()
    model = run.model.merge_and_unload() if config.lora.enabled else run.model
    folder = save_checkpoint(out, done, model, tokenizer, config)
    if why:
        raise TrainingError(f"{why}; stopped after round {done}, checkpoint {folder}")
    return folder

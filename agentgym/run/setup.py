"""A training run's set-up and teardown: everything the loop in `agentgym.run.train` uses.

`Run` is the run: its config, where it stands (`Trainer`: the learner, the task stream,
the progress), and the resources it owns (reward functions, logs, the held-out sets, the
sampler's environments, the policy, the sampler), which it closes, in `close`, whatever
happened. Rank 0 leads; another torchrun rank only `follow`s (`agentgym.scale.ranks`).
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.config import Config
from agentgym.doctor.template_checks import check_env_template
from agentgym.env.core import make_env
from agentgym.eval.benchmarks import BenchmarkPart, parse_benchmark, plan
from agentgym.eval.benchmarks import held_out as benchmark_held_out
from agentgym.eval.heldout import HeldOut, TaskResult, held_out_ids, task_result
from agentgym.learn.learner import Learner
from agentgym.policy.backend import engine_folder, make_policy
from agentgym.policy.base import Policy, SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_configured, on_device
from agentgym.records import CheckpointState
from agentgym.rewards.functions import RewardFunctions
from agentgym.rollout.ahead import AheadSampler
from agentgym.rollout.player import Player, Submission
from agentgym.rollout.sampler import Sampler
from agentgym.run import preflight
from agentgym.run.checkpoint import read_trainer
from agentgym.run.resume import Progress, Trainer, learner_for, restore, resume_state
from agentgym.run.runlog import RunLog, truncate_logs
from agentgym.scale import ranks
from agentgym.scale.players import make_player
from agentgym.scale.samplers import make_sampler, play_share, ranks_sample, sampler_envs
from agentgym.types import TaskSpec, Trajectory


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
    benchmarks: list[tuple[BenchmarkPart, HeldOut]] = field(default_factory=list)
    """`eval.benchmarks`' tasks, played at each held-out evaluation beside the selection's."""
    results: dict[str, list[TaskResult]] = field(default_factory=dict)
    policy: Policy | None = None
    """The run's own policy, which evaluations play with."""
    sampler: Sampler | None = None
    trainer: Trainer | None = None
    """The learner and where GRPO stands; set by `start_training`."""
    policy_version: int = 0
    """The learner updates `policy` holds when it samples with its own copy of the
    weights and is not the sampler's (-1: none it can name); see `fresh_policy`."""

    @classmethod
    def begin(cls, config: Config, resume: Path | None) -> Run:
        """Reads the checkpoint, loads the reward functions (one that cannot load fails
        here), checks Ray and vLLM are there, before any model loads; then seeds."""
        state = resume_state(resume) if resume is not None else None
        preflight.check_registered(config)
        reward_fns = RewardFunctions(config.rewards)
        preflight.require_backends(config)
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
        dump = self.config.model_dump(mode="json")
        self.log = RunLog(self.out, run.report_to, purge_step=purge, config=dump)
        self.envs = sampler_envs(self.config)
        probe = self.envs[0] if self.envs else make_env(run.env, **run.env_kwargs)  # Ray: none
        try:
            check_env_template(probe, tokenizer, str(self.start_model or "the model"))
        finally:
            if not self.envs:
                probe.close()
        self.selection = self._held_out(tokenizer, ev.tasks, 0) if ev.every else None
        if ev.every and ev.benchmarks:
            self.benchmarks = self._benchmarks(tokenizer)
        if ev.report_tasks:
            self.report_set = self.start_set = self._held_out(tokenizer, ev.report_tasks, ev.tasks)
            if ev.start_n is not None and ev.start_n != ev.n:
                self.start_set = self._held_out(tokenizer, ev.report_tasks, ev.tasks, ev.start_n)
        evals = self.state.evals if self.state else {}
        self.results = {k: [task_result(r) for r in v] for k, v in evals.items()}

    def _held_out(self, tokenizer, count: int, start: int, n: int | None = None) -> HeldOut:
        ev, run = self.config.eval, self.config.run
        ids = held_out_ids(run.env, run.env_kwargs, count, start=start, split=ev.split)
        player = make_player(self.config, tokenizer)  # as the run's episodes are played
        return HeldOut.from_config(
            self.config, ids, tokenizer, n=ev.n if n is None else n, player=player
        )

    def _benchmarks(self, tokenizer) -> list[tuple[BenchmarkPart, HeldOut]]:
        parts = [p for spec in self.config.eval.benchmarks for p in plan(parse_benchmark(spec))]
        return [(p, benchmark_held_out(p, tokenizer, self.config)) for p in parts]

    def start_training(self, model, tokenizer, resume: Path | None) -> Trainer:
        """The learner, the run's policy, and where GRPO stands (a resumed run's progress,
        optimizer and random states put back); then the sampler, which gets the learner's
        weights now when they are not the ones it starts from."""
        config = self.config
        # the engine starts from the weights GRPO starts from, saved before LoRA wraps them
        engine_dir = engine_folder(config, model, tokenizer)
        # FSDP shards the learner's model in place: rank 0 samples with a whole copy
        whole = ranks.unsharded_copy(model, config) if ranks.sharded(config) else None
        learner = ranks.build_learner(lambda: learner_for(config, model, self.start_model, resume))
        sampling_model = learner.model if whole is None else whole
        self.policy = make_policy(
            config, sampling_model, tokenizer, engine_dir=engine_dir, learner_model=learner.model
        )
        rng = np.random.default_rng(config.run.seed)
        progress = Progress()
        if self.state is not None:
            assert resume is not None  # the state was read from it
            progress = restore(self.state, resume, learner, rng)
        # the one reading of the staleness bound: the sampler plays ahead, the learner
        # corrects for the sampler's logprobs (so it does for a separate engine's)
        ahead = config.pipeline.max_off_policy_steps
        off_policy = ahead > 0 or self.policy.model is None
        self.trainer = Trainer(
            learner, tokenizer, rng, progress, whole, staleness=ahead, off_policy=off_policy
        )
        self.sampler = make_sampler(
            config,
            self.envs,
            self.policy,
            tokenizer,
            self.start_model,
            learner.named_weights,
            learner_model=learner.model,
            plays_ahead=ahead > 0,
        )
        kept = read_trainer(resume).get("sampler_weights", {}) if resume and ahead else {}
        if kept:  # the oldest, that step s + 1 is played with
            low = min(kept)
            self.sampler.load_weights(lambda: kept[low], low)
        elif self.state is not None or whole is not None:
            self.sampler.load_weights(lambda: ranks.share_weights(learner), progress.step)
        if ahead:
            self.sampler = self._ahead(self.sampler, learner, ahead, progress.step, kept)
        return self.trainer

    def _ahead(
        self, inner: Sampler, learner: Learner, k: int, step: int, kept: dict
    ) -> AheadSampler:
        """The sampler that plays ahead of the learner from step `step + 1`. A resumed
        run's checkpoint `kept` the weights its steps handed ahead are played with
        (`AheadSampler.kept`): `inner` holds the oldest; the others are handed over again."""
        config = self.config
        newest = lambda: ranks.share_weights(learner)  # noqa: E731
        ahead = AheadSampler(
            inner,
            k,
            first_step=step + 1,
            partial_rollouts=config.pipeline.partial_rollouts,
            start=(lambda: kept[min(kept)]) if kept else newest,
        )
        for version in sorted(kept)[1:]:
            ahead.load_weights(functools.partial(kept.__getitem__, version), version)
        if kept:
            ahead.load_weights(newest, step)
        return ahead

    def training(self) -> Trainer:
        """The learner and where GRPO stands (`start_training` made them)."""
        assert self.trainer is not None, "start_training() comes first"
        return self.trainer

    def sampler_policy(self) -> Policy | None:
        """The policy the sampler plays with in this process (None: it plays elsewhere)."""
        return self.sampler.policy if self.sampler is not None else None

    def fresh_policy(self) -> Policy:
        """The run's policy, holding the learner's weights now: a policy with its own copy
        of them that the sampler does not refresh (vLLM on rank 0 beside Ray workers)
        gets them here, before an evaluation, rather than after every step."""
        assert self.policy is not None  # start_training made it
        t = self.training()
        own_copy = self.policy.model is not t.learner.model
        stale = own_copy and self.policy_version != t.progress.step
        if stale and self.policy is not self.sampler_policy():
            self.policy.load_weights(ranks.share_weights(t.learner))
            self.policy_version = t.progress.step
        return self.policy

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[Policy]:
        """The run's policy holding the learner's weights, for an evaluation in the block.
        Where the sampler plays ahead with that very policy (a vLLM engine in this process,
        asynchronous GRPO), its thread is held for the block (`AheadSampler.paused`), which
        then puts back the weights it plays with."""
        ahead = self.sampler if isinstance(self.sampler, AheadSampler) else None
        if ahead is None or ahead.policy is None or ahead.policy is not self.policy:
            yield self.fresh_policy()
            return
        with ahead.paused():
            ahead.policy.load_weights(ranks.share_weights(self.training().learner))
            yield ahead.policy

    def save(self, step: int) -> Path:
        """Writes `checkpoint-{step}` (`Trainer.save`) and prunes to `run.keep_last`."""
        kept = self.sampler.kept(step) if isinstance(self.sampler, AheadSampler) else {}
        t = self.training()
        return t.save(step, self.config, self.start_model, self.results, sampler_weights=kept)

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
        for _, held in self.benchmarks:
            held.close()


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
    players: list[Player] = []

    def build() -> Learner:
        model, tokenizer = load_configured(start_model, config.model)
        tokenizers.append(tokenizer)
        model = on_device(model, config)  # this rank's GPU: `ranks.init` made it the current one
        learner = learner_for(config, model, start_model, resume)
        if resume is not None:
            learner.load_state_dict(read_trainer(resume)["learner"])
        return learner

    def sample(learner: Learner, submission: Submission) -> list[Trajectory]:
        envs[:] = envs or sampler_envs(config)
        policies[:] = policies or [HFPolicy(learner.model, tokenizers[-1])]
        players[:] = players or [make_player(config, tokenizers[-1])]
        return play_share(envs, policies[0], players[0], submission)

    try:
        ranks.follow(build, sample if ranks_sample(config) else None)
    finally:
        for player in players:
            player.close()
        for env in envs:
            env.close()
    assert config.run.output is not None  # the CLI names the run's folder first
    return Path(config.run.output)

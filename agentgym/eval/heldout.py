"""Held-out evaluation: play test tasks greedily and by sampling, and score them.

`HeldOut` plays each task once greedily (temperature 0) and, optionally, n
times at the sampling temperature and top-p, through the same rollout as
training, so an evaluated episode is exactly a training episode without the update.
`agentgym.eval.report` turns the per-task results into the report's figures; the
statistics themselves (pass@k, maj@k, bootstrap) live in `agentgym.eval.stats`.

Correctness is judged two ways, side by side:

- strict: the environment's own verdict, which needs the exact format (a
  `\\boxed{}` or `Final Answer:` the env parses, after well-formed tool calls);
- lenient: math-verify equivalence of any final answer found in the last
  assistant message (boxed, `Final Answer:`, or else its last number), so a
  right answer in the wrong format still counts; a task without an answer, which its
  calls alone judge (an irrelevance row), has the strict verdict.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from agentgym.env.core import AgentEnv, Split, make_env
from agentgym.policy.base import Policy, SamplingParams, as_policy, context_tokens
from agentgym.policy.hf import merged_adapters
from agentgym.rewards.verifiable import answers_equal, extract_boxed
from agentgym.rollout.player import Player, Submission, TurnPlayer, turn_player
from agentgym.types import TaskSpec, Trajectory

_FINAL_ANSWER = re.compile(r"Final Answer:[ \t]*(.+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(text: str) -> str | None:
    """The answer an assistant message gives: its boxed answer, its `Final Answer:`, or its
    last number; None when it has none of these."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed.strip()
    stated = _FINAL_ANSWER.findall(text)
    if stated:
        return stated[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


@dataclass(frozen=True)
class EpisodeScore:
    """One evaluated episode, reduced to what the report needs."""

    reward: float
    parts: dict[str, float]
    strict: bool
    lenient: bool
    format_ok: bool
    answer: str | None
    turns: int
    tool_calls: float
    tool_errors: float
    completion_length: int
    truncated: bool
    unscorable: bool = False
    """The environment raised or hung: no verified outcome (not a wrong answer)."""

    @classmethod
    def of(cls, t: Trajectory, expected: str | None) -> EpisodeScore:
        """The episode's figures; `expected` is the task's answer, None for a task judged
        by its calls alone, whose lenient verdict is then the strict one."""
        last = t.turns[-1].action if t.turns else ""
        answer = final_answer(last)
        strict = t.reward_parts.get("correctness", 0.0) >= 1.0
        return cls(
            reward=t.reward,
            parts=dict(t.reward_parts),
            strict=strict,
            lenient=(
                strict
                if expected is None
                else answer is not None and answers_equal(answer, expected)
            ),
            format_ok=t.reward_parts.get("format", 0.0) > 0,
            answer=answer,
            turns=len(t.turns),
            tool_calls=t.counts.get("tool_calls", 0.0),
            tool_errors=sum(v for k, v in t.counts.items() if k.startswith("tool_errors/")),
            completion_length=t.completion_length,
            truncated=t.truncated,
            unscorable=not t.scorable,
        )


@dataclass
class TaskResult:
    """A task's greedy episode and its sampled ones."""

    task_id: str
    expected: str
    greedy: EpisodeScore
    samples: list[EpisodeScore] = field(default_factory=list)
    category: str | None = None
    """The task's category (a data file's `category_column`, FunctionCalls-v0's kind)."""


def task_result(data: dict[str, Any]) -> TaskResult:
    """A TaskResult from its `dataclasses.asdict` form (as a checkpoint stores it)."""
    return TaskResult(
        data["task_id"],
        data["expected"],
        EpisodeScore(**data["greedy"]),
        [EpisodeScore(**s) for s in data["samples"]],
        data.get("category"),
    )


def held_out_ids(
    env_id: str, env_kwargs: dict[str, Any], count: int, *, start: int = 0, split: Split = "test"
) -> list[str]:
    """Task ids `start .. start + count` of `split` (all there are, when fewer).

    Raises:
        ValueError: when the split has no task at `start`.
    """
    env = make_env(env_id, **env_kwargs)
    try:
        agent = cast(AgentEnv, env.unwrapped)  # make_env made an agent environment
        total = agent.num_tasks(split)
        if start >= total:
            raise ValueError(
                f"{env_id}: the {split!r} split has {total} tasks; none from index {start}"
            )
        return [agent.task_id(split, i) for i in range(start, min(total, start + count))]
    finally:
        env.close()


class HeldOut:
    """Plays a fixed list of held-out tasks with a policy and scores every episode.

    Args:
        env_id, env_kwargs: The environment, as for `make_env`.
        task_ids: The tasks, played in this order.
        tokenizer: The policy's tokenizer.
        max_new_tokens, max_episode_tokens: The rollout's limits (as in training).
        stop: Strings that end a turn (as in training).
        n: Sampled episodes per task besides the greedy one (0: greedy only).
        temperature, top_p: How those n episodes are sampled: as in training
            (`from_config`), so that pass@k measures the distribution the policy is
            trained to sample from. The greedy episode takes no top-p.
        batch: Most episodes played at once.
        player: Who plays the episodes (`agentgym.rollout.player`): the training run's
            player, so that an evaluated episode is played as a trained one; None: the
            turn loop, with `env_timeout_s` and `env_workers`. Closed after each `run`
            (an agent program's server with it) and by `close`.
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any],
        task_ids: Sequence[str],
        tokenizer,
        *,
        max_new_tokens: int,
        max_episode_tokens: int | None = None,
        n: int = 0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch: int = 32,
        stop: Sequence[str] = (),
        env_timeout_s: float | None = None,
        env_workers: int | None = None,
        player: Player | None = None,
    ):
        if not task_ids:
            raise ValueError("HeldOut needs at least one task id")
        self.task_ids = list(task_ids)
        self.tokenizer = tokenizer
        self.max_new_tokens, self.max_episode_tokens = max_new_tokens, max_episode_tokens
        self.n, self.temperature, self.top_p, self.stop = n, temperature, top_p, tuple(stop)
        self.player = player or TurnPlayer(tokenizer, env_timeout_s, env_workers)
        self.batch = max(batch, n)
        self.envs = [make_env(env_id, **env_kwargs) for _ in range(self.batch)]
        first = cast(AgentEnv, self.envs[0].unwrapped)  # make_env made an agent environment
        tasks = {t: first.load_task(t) for t in self.task_ids}
        self.answers = {
            t: None if task.answer is None else str(task.answer) for t, task in tasks.items()
        }
        """What lenient correctness compares with: None for a task its calls alone judge."""
        self.categories = {t: task.metadata.get("category") for t, task in tasks.items()}

    @classmethod
    def from_config(
        cls, config, task_ids: Sequence[str], tokenizer, *, n: int, player: Player | None = None
    ) -> HeldOut:
        """`task_ids` played with the run's sampling settings and `eval.max_new_tokens`, by
        `player` (None: the turn loop with the run's options)."""
        s, run = config.sampling, config.run
        return cls(
            run.env,
            run.env_kwargs,
            task_ids,
            tokenizer,
            n=n,
            temperature=s.temperature,
            top_p=s.top_p,
            max_new_tokens=config.eval.max_new_tokens or s.max_new_tokens,
            max_episode_tokens=s.max_episode_tokens,
            stop=s.stop,
            player=player or turn_player(config, tokenizer),
        )

    @property
    def episodes(self) -> int:
        """Episodes one `run` plays."""
        return len(self.task_ids) * (1 + self.n)

    def budget(self, policy: Policy) -> int | None:
        """An episode's most tokens: `max_episode_tokens`, but never past what `policy`'s
        model can attend over (a longer episode is truncated there: it counts as played
        and failed, as a benchmark counts a prompt its model cannot hold)."""
        limits = [n for n in (self.max_episode_tokens, context_tokens(policy)) if n is not None]
        return min(limits) if limits else None

    def _play(self, policy: Policy, group: int, params: SamplingParams, advance) -> list:
        per_chunk = max(1, self.batch // group)
        out: list[list[Trajectory]] = []
        for start in range(0, len(self.task_ids), per_chunk):
            ids = self.task_ids[start : start + per_chunk]
            specs = tuple(TaskSpec(task_id=t) for t in ids)
            chunk = Submission(specs, group, params, self.budget(policy))
            played = self.player.play(policy, self.envs, chunk)
            out += [played[i * group : (i + 1) * group] for i in range(len(ids))]
            advance(len(played))
        return out

    def run(
        self,
        policy: Policy,
        *,
        seed: int = 0,
        advance: Callable[[int], None] = lambda n: None,
        episodes: list[Trajectory] | None = None,
    ) -> list[TaskResult]:
        """Plays every task; `advance(k)` is called as each k episodes finish. `episodes`,
        when given, gets every episode played: each task's greedy one, then the sampled."""
        kept = episodes if episodes is not None else []
        with merged_adapters(as_policy(policy).model):
            try:
                return self._run(policy, seed, advance, kept)
            finally:
                self.player.close()  # an agent program's server: one per evaluation

    def _run(
        self, policy: Policy, seed: int, advance: Callable[[int], None], kept: list[Trajectory]
    ) -> list[TaskResult]:
        greedy = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0, stop=self.stop)
        played = self._play(policy, 1, greedy, advance)
        kept += [g[0] for g in played]
        results = [
            TaskResult(
                t,
                str(self.answers[t]),  # "None" where there is none, as the report shows it
                EpisodeScore.of(g[0], self.answers[t]),
                category=self.categories[t],
            )
            for t, g in zip(self.task_ids, played, strict=True)
        ]
        if self.n:
            sampled = SamplingParams(
                max_new_tokens=self.max_new_tokens,
                stop=self.stop,
                temperature=self.temperature,
                top_p=self.top_p,
                seed=seed,
            )
            for result, group in zip(
                results, self._play(policy, self.n, sampled, advance), strict=True
            ):
                answer = self.answers[result.task_id]
                result.samples = [EpisodeScore.of(t, answer) for t in group]
                kept += group
        return results

    def close(self) -> None:
        """Closes the player and the environments; a second call does nothing."""
        self.player.close()
        for env in self.envs:
            env.close()
        self.envs = []

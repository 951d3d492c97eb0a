"""Typed records passed between the stages of the data flow.

Every stage hands the next one of these frozen dataclasses: environments speak
in `Message`s, the rollout records `Turn`s into a `Trajectory`, and the learner
consumes a `Batch` of padded tensors built from trajectories.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Message:
    """One chat message, as chat templates and environments exchange them."""

    role: Role
    content: str
    name: str | None = None  # the tool's name, on tool messages

    def to_dict(self) -> dict[str, str]:
        """The message as the plain dict `tokenizer.apply_chat_template` takes."""
        out = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """Builds a message from a chat-template dict; raises ValueError naming the bad field."""
        role = data.get("role")
        if role not in ROLES:
            raise ValueError(f"message field 'role' is {role!r}; valid roles: {', '.join(ROLES)}")
        content = data.get("content")
        if not isinstance(content, str):
            raise ValueError(f"message field 'content' must be a str, got {type(content).__name__}")
        return cls(role=role, content=content, name=data.get("name"))


class Completion(str):
    """The assistant's text as an action, remembering why its generation ended.

    A plain `str` to Gymnasium and to any environment; an environment that
    cares (a tool call cut off by the token limit) reads `finish_reason`.
    """

    finish_reason: str

    def __new__(cls, text: str, finish_reason: str = "stop") -> Completion:
        obj = super().__new__(cls, text)
        obj.finish_reason = finish_reason
        return obj


@dataclass(frozen=True)
class ToolCall:
    """A tool call parsed from an assistant message."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """One assistant action and what the environment answered to it."""

    action: str
    observation: tuple[Message, ...]
    reward: float
    reward_parts: Mapping[str, float]


@dataclass(frozen=True)
class Trajectory:
    """One episode as token ids, with the mask of the tokens the policy sampled.

    `tokens[:prompt_length]` is the chat-templated prompt. After it come the
    policy's sampled ids (mask 1, with their sampler logprobs) interleaved with
    tokenized environment replies (mask 0, logprob 0.0). The ids the policy
    sampled are kept exactly; they are never decoded and re-encoded.
    """

    task_id: str
    group: int
    tokens: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_length: int
    reward: float
    reward_parts: Mapping[str, float]
    turns: tuple[Turn, ...]
    finish_reason: str
    truncated: bool
    prompt_messages: tuple[Message, ...] = ()
    turn_spans: tuple[tuple[int, int], ...] = ()
    counts: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    reward_error: str | None = None
    token_versions: tuple[int, ...] = ()
    env: str | None = None
    category: str | None = None
    split_samples: tuple[Trajectory, ...] = ()
    opened_by: str | None = None
    """`turn_spans[k]` is the [start, end) of turn k's sampled ids in `tokens`.
    `counts` sums the numeric counters environments report in `info` over the
    episode: "tool_calls" and "tool_errors/<kind>". `error` is the exception
    `env.step` raised, which ended the episode ("ValueError: ..."); `reward_error`
    why the reward is not a verified outcome (a reward function failed, or the
    environment's reward is not finite). `token_versions[i]` is the policy version
    that sampled `tokens[i]` (-1 where the policy did not sample it); empty until a
    `Sampler` stamps it. `env` names the member of an env mix (`agentgym.env.mixture`)
    that played the episode; None outside a mix. `category` is the task's category, as
    the env's `info["category"]` gives it at reset; None without one. `split_samples` are
    the episode's earlier samples when its history was rewritten (by an agent program,
    `agentgym.serve.recorder`; by the chat template, the rollout splitting where its
    rendering stopped extending the previous one): each is trained on with this one's
    advantage, weighted as `agentgym.learn.advantages.split_weights` says; empty
    otherwise. This trajectory is then the last sample: its `turn_spans` are those of the
    last turns, its `turns` every turn of the episode. `opened_by` says why a sample after
    an episode's first begins where it does (the turn, and where the template's rendering
    stopped extending the sample before; or the agent's request that extended none)."""

    def __post_init__(self) -> None:
        # the learner pairs these position by position (`Batch.from_trajectories`): a
        # length off by one would shift the mask or the logprobs onto the wrong tokens
        lengths = {
            "tokens": len(self.tokens),
            "loss_mask": len(self.loss_mask),
            "logprobs": len(self.logprobs),
        }
        if self.token_versions:
            lengths["token_versions"] = len(self.token_versions)
        if len(set(lengths.values())) != 1 or not 0 <= self.prompt_length <= len(self.tokens):
            raise ValueError(
                f"trajectory of task {self.task_id!r} (group {self.group}): per-token "
                f"fields must have one length, and prompt_length at most it; got {lengths}, "
                f"prompt_length {self.prompt_length}"
            )

    @property
    def completion_length(self) -> int:
        """Number of tokens the policy sampled in this episode."""
        return sum(self.loss_mask)

    @property
    def scorable(self) -> bool:
        """Whether `reward` is a verified outcome; an unscorable episode gets advantage 0."""
        return self.error is None and self.reward_error is None

    @property
    def step_rewards(self) -> tuple[tuple[float, tuple[int, int]], ...]:
        """Each step's environment reward with the span of sampled ids it follows
        (`turn_spans[k]`, [start, end) in `tokens`), in order: what a turn-level
        estimator reads. Where there are fewer spans than turns (a rewritten history: this
        is the last sample), the spans are those of the last turns."""
        turns = self.turns[max(0, len(self.turns) - len(self.turn_spans)) :]
        return tuple(
            (turn.reward, span) for turn, span in zip(turns, self.turn_spans, strict=False)
        )


@dataclass(frozen=True)
class TaskSpec:
    """Which task a group plays: a reset seed, or a task id, and the split; and the
    difficulty level it is drawn at (a curriculum's), None for the env's own."""

    seed: int | None = None
    task_id: str | None = None
    split: str = "train"
    difficulty: int | None = None

    def reset_kwargs(self) -> dict[str, Any]:
        options: dict[str, Any] = {"split": self.split}
        if self.task_id is not None:
            options["task_id"] = self.task_id
        if self.difficulty is not None:
            options["difficulty"] = self.difficulty
        return {"seed": self.seed, "options": options}


@dataclass(frozen=True)
class Batch:
    """Right-padded tensors for one learner step.

    Shapes: `input_ids`, `attention_mask` are [N, L]. `loss_mask` and
    `old_logprobs` are [N, L-1] and aligned with the *targets*: position t
    describes token `input_ids[:, t+1]`, which the logits at t predict.
    `advantages` is [N, L-1] too, one per target token (an advantage estimator's,
    `agentgym.learn.advantages`); given as [N], one per row, it is broadcast over the
    row's tokens. `is_weights` [N, L-1],
    when set, are the truncated importance weights between the learner's old
    logprobs and the sampler's (a vLLM sampler; `Learner.correct_mismatch`).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    is_weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # every later stage (micro-batches, the loss) slices these by row and position
        # alike: a mismatch would pair a token with another one's mask or logprob
        if self.input_ids.dim() != 2:
            raise ValueError(f"Batch: input_ids must be [N, L], got {tuple(self.input_ids.shape)}")
        n, length = self.input_ids.shape
        if self.advantages.dim() == 1 and self.advantages.shape[0] == n:
            per_token = self.advantages[:, None].expand(n, length - 1)
            object.__setattr__(self, "advantages", per_token)
        want: dict[str, tuple[int, ...]] = {
            "attention_mask": (n, length),
            "loss_mask": (n, length - 1),
            "old_logprobs": (n, length - 1),
            "advantages": (n, length - 1),
        }
        if self.is_weights is not None:
            want["is_weights"] = (n, length - 1)
        wrong = [
            f"{name} is {tuple(getattr(self, name).shape)}, not {shape}"
            for name, shape in want.items()
            if tuple(getattr(self, name).shape) != shape
        ]
        if wrong:
            raise ValueError(
                f"Batch: input_ids are [N, L] = {(n, length)}, so attention_mask must be "
                "[N, L], loss_mask, old_logprobs, advantages and is_weights [N, L-1]; "
                + "; ".join(wrong)
            )

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def from_trajectories(
        cls, trajectories: Sequence[Trajectory], advantages: torch.Tensor, pad_id: int
    ) -> Batch:
        """Pads trajectories to one length; advantages[i] belongs to trajectories[i]: [N]
        (one per row), or [N, T] per target token with T at least the longest row's
        length - 1 (`targets`' width over a larger set of rows; the rest is cut off)."""
        if len(trajectories) != len(advantages):
            raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages")
        length = max(len(t.tokens) for t in trajectories)
        if advantages.dim() == 2:
            advantages = advantages[:, : length - 1]
        n = len(trajectories)
        input_ids = torch.full((n, length), pad_id, dtype=torch.long)
        attention = torch.zeros((n, length), dtype=torch.long)
        loss_mask = torch.zeros((n, length - 1), dtype=torch.float32)
        old = torch.zeros((n, length - 1), dtype=torch.float32)
        for i, t in enumerate(trajectories):
            k = len(t.tokens)
            input_ids[i, :k] = torch.tensor(t.tokens, dtype=torch.long)
            attention[i, :k] = 1
            # token j is predicted at position j-1
            loss_mask[i, : k - 1] = torch.tensor(t.loss_mask[1:], dtype=torch.float32)
            old[i, : k - 1] = torch.tensor(t.logprobs[1:], dtype=torch.float32)
        return cls(input_ids, attention, loss_mask, old, advantages.to(torch.float32))

    def masked_rows(self, keep: torch.Tensor) -> Batch:
        """This batch with the loss mask of every row where `keep` [N] is 0 zeroed."""
        return replace(self, loss_mask=self.loss_mask * keep[:, None].to(self.loss_mask.dtype))

    def split(self, micro_batch_size: int, by_length: bool = False) -> list[Batch]:
        """Cuts the batch into micro-batches, trimming each to its longest row.

        With `by_length`, rows are taken in order of length, so that each
        micro-batch holds rows of similar length and little padding.
        """
        order = self._order(by_length)
        return [
            self._rows(order[start : start + micro_batch_size])
            for start in range(0, self.size, micro_batch_size)
        ]

    def split_tokens(self, budget: int, skip: int = 0, by_length: bool = False) -> list[Batch]:
        """Cuts the batch into micro-batches of at most `budget` tokens: the rows' lengths,
        less the `skip` leading tokens of each (a prefix run apart), summed.

        Rows are taken in order (of length, with `by_length`) and a micro-batch is
        closed when the next row would take it past the budget. A row longer than
        the budget on its own makes a micro-batch of its own.
        """
        lengths = (self.attention_mask.sum(dim=1) - skip).tolist()
        out: list[Batch] = []
        rows: list[int] = []
        total = 0
        for i in self._order(by_length).tolist():
            if rows and total + lengths[i] > budget:
                out.append(self._rows(torch.tensor(rows)))
                rows, total = [], 0
            rows.append(i)
            total += lengths[i]
        if rows:
            out.append(self._rows(torch.tensor(rows)))
        return out

    def _order(self, by_length: bool) -> torch.Tensor:
        lengths = self.attention_mask.sum(dim=1)
        return torch.argsort(lengths, stable=True) if by_length else torch.arange(self.size)

    def _rows(self, rows: torch.Tensor) -> Batch:
        """The batch's `rows`, trimmed to the longest of them."""
        length = int(self.attention_mask[rows].sum(dim=1).max())
        return Batch(
            input_ids=self.input_ids[rows, :length],
            attention_mask=self.attention_mask[rows, :length],
            loss_mask=self.loss_mask[rows, : length - 1],
            old_logprobs=self.old_logprobs[rows, : length - 1],
            advantages=self.advantages[rows, : length - 1],
            is_weights=None if self.is_weights is None else self.is_weights[rows, : length - 1],
        )


def target_width(trajectories: Sequence[Trajectory]) -> int:
    """T of the per-target tensors of `trajectories`: the longest one's length - 1 (0: none)."""
    return max([len(t.tokens) - 1 for t in trajectories] + [0])


def step_reward_targets(trajectories: Sequence[Trajectory]) -> torch.Tensor:
    """[N, T] float: `StepRecord.step_rewards`. A step whose turn sampled no id adds its
    reward to the last earlier sampled id's position (dropped when there is none)."""
    rewards = torch.zeros((len(trajectories), target_width(trajectories)), dtype=torch.float64)
    for i, t in enumerate(trajectories):
        if not t.scorable:
            rewards[i] = math.nan
            continue
        last = -1  # the target position of the last sampled id so far
        for reward, (start, end) in t.step_rewards:
            if end > start:
                last = end - 2  # token end - 1 is predicted at position end - 2
            if last >= 0:
                rewards[i, last] += reward
    return rewards.float()


def sampled_targets(trajectories: Sequence[Trajectory]) -> torch.Tensor:
    """[N, T] float: 1 where row i's target token t + 1 was sampled by the policy, aligned
    as `Batch` aligns its loss mask (position t predicts token t + 1), with T the longest
    trajectory's length - 1 (0 for a trajectory without tokens)."""
    mask = torch.zeros((len(trajectories), target_width(trajectories)), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        if len(t.tokens) > 1:
            mask[i, : len(t.tokens) - 1] = torch.tensor(t.loss_mask[1:], dtype=torch.float32)
    return mask


@dataclass(frozen=True)
class StepRecord:
    """One training step as it passes through the stages: `collect` (the sampler) fills
    the trajectories, `score` (`agentgym.rewards.score`) the rewards, `advantages`
    (`agentgym.learn.advantages`) the per-token advantages, `update`
    (`agentgym.learn.update`) the learner's figures, and the loop the sync's and its
    own timings. Each stage returns a copy with its fields filled (`dataclasses.replace`).
    """

    step: int
    """The step's number (1 for the first GRPO step)."""
    version: int
    """The policy version it trains as sampled with: the learner updates made before it
    (asynchronous GRPO may have sampled it with older ones: `Trajectory.token_versions`)."""
    specs: tuple[TaskSpec, ...]
    trajectories: tuple[Trajectory, ...] = ()
    """G per spec, each group contiguous, in the order submitted."""
    rewards: torch.Tensor | None = None
    """[N] the rewards the advantages are computed from: the environment's plus the user
    reward functions', less the length penalty; NaN where the episode is unscorable."""
    scorable: torch.Tensor | None = None
    """[N] bool: the episode's reward is a verified outcome (`Trajectory.scorable`)."""
    step_rewards: torch.Tensor | None = None
    """[N, T] each step's environment reward at the target position of the last id its turn
    sampled (where the reward follows: `Trajectory.step_rewards`), 0 elsewhere, aligned as
    `sampled_targets`; NaN rows where the episode is unscorable. Kept beside `rewards` for
    turn-level estimators; `rewards` does not depend on it."""
    advantages: torch.Tensor | None = None
    """[N, T] per target token, aligned as `sampled_targets` is; 0 off the sampled tokens."""
    split_advantages: torch.Tensor | None = None
    """[M, T'] per target token of each split sample (the trajectories' `split_samples`, in
    order), where the estimator gave each its own (the turn estimator); None: each takes its
    episode's mean advantage (`agentgym.learn.advantages.with_split_samples`)."""
    flat_groups: torch.Tensor | None = None
    """[N / G] bool: the group's scored rewards are all equal (no learning signal)."""
    stats: Mapping[str, float] = field(default_factory=dict)
    """The update's figures (loss, KL, clip fraction, ...), means over its iterations."""
    timings: Mapping[str, float | str] = field(default_factory=dict)
    """Seconds each stage took, and the weight sync's figures, by metric name."""
    pipeline: Mapping[str, float] = field(default_factory=dict)
    """Asynchronous GRPO's figures (staleness, dropped groups), by metric name; empty when
    the run is synchronous."""

    def require(self, *names: str) -> None:
        """ValueError unless the fields `names` were filled by the stages before."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(
                f"step {self.step}: {', '.join(missing)} not set yet; the stages run in "
                "order collect, score, advantages, update"
            )


class TrainingError(RuntimeError):
    """A run that cannot go on (e.g. too many non-finite steps, a rollout worker Ray gave
    up on); the message says why."""


@dataclass(frozen=True)
class AgentReward:
    """What an agent program (`run.agent`) may return when it scores its episode itself:
    the reward and its parts (recorded as the episode's `reward_parts`)."""

    reward: float
    parts: Mapping[str, float] = field(default_factory=dict)

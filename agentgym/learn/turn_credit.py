"""Credit per turn (`grpo.credit: turn`): each assistant turn's tokens get their own advantage.

GRPO gives every token of an episode one value, so a right first call in an episode that
failed at its last turn is pushed down with the rest. Here turn k of member i of a group
gets

    A[i, k] = (G[i, k] - b[i, k]) / scale

- G[i, k], the return from turn k on: the environment's step rewards of turns k, k+1, ...
  (`Trajectory.step_rewards`), plus what the episode's reward adds beyond them (the reward
  functions', less the length penalty: `StepRecord.rewards` minus the step rewards' sum)
  at its last turn. G[i, 0] is the episode's reward.
- b[i, k], the baseline: the mean return of the group's *other* members from the turns
  where they stood in the same state, the same token prefix (GiGPO's anchor states, Feng
  et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training", grouped here by
  the exact ids before the turn). Where no other member stood there, the mean return from
  turn k of the other members that reached a turn k; where none did, 0. At the first turn
  every member stands at the task's opening, so b[i, 0] is the leave-one-out group mean
  (RLOO) and the first turn's advantage is GRPO's, rescaled by G / (G - 1).
- scale: `grpo.scale_rewards` as GRPO's: the group's std of episode rewards (a flat group
  then gets 0, as GRPO gives it), the batch's, or 1 ("none").

**Why it is unbiased** (Williams 1992, the REINFORCE baseline argument). The policy
gradient of the expected episode reward is E[sum_k grad log pi(a_k | s_k) G_k]: dropping
the rewards before turn k changes nothing, since the action at k cannot change them. A
baseline b may be subtracted when E[grad log pi(a_k | s_k) b] = 0, which holds when b is
independent of a_k given s_k: then E[grad log pi b | s_k] = b E[grad log pi | s_k] = 0.
The group's members are independent samples of one task, so the returns of the *other*
members, whichever turns are averaged, are independent of member i's action; which of the
two averages is taken depends on s[i, k] (where member i stands) and on the others only.
Every b[i, k] above is such a baseline, whatever the members' turn counts. Dividing by the
group's std rescales each group's terms by a positive number (which itself depends on the
rewards: unbiased up to that scale, as GRPO is). By contrast, normalising by turn index
(subtracting the mean of turn k's returns over the members that reached turn k, oneself
included) shrinks member i's term by (1 - 1/n_k), where n_k depends on how many members
played that long: the bias differs per turn and does not cancel (verl RFC #7244);
`tests/test_turn_credit.py` measures both against the exact gradient of a small MDP.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from agentgym.types import Trajectory, sampled_targets


def turn_advantages(
    returns: Sequence[Sequence[float] | None],
    states: Sequence[Sequence[Hashable]],
    group_size: int,
    scales: Sequence[float],
) -> list[list[float]]:
    """Each member's per-turn advantages (see the module docstring).

    Args:
        returns: Per member, the return from each of its turns (G[i, k]); None for an
            unscorable member, whose advantages are 0 and which no baseline reads.
        states: Per member, each turn's state (equal states: the same prefix).
        group_size: G, the members of a group (contiguous).
        scales: Per group, what divides its advantages (0: the group gets 0).
    """
    out: list[list[float]] = []
    for g, start in enumerate(range(0, len(returns), group_size)):
        members = range(start, start + group_size)
        for i in members:
            own = returns[i]
            if own is None or scales[g] == 0:
                out.append([0.0] * len(states[i]))
                continue
            others = [j for j in members if j != i and returns[j] is not None]
            baselines = [_baseline(i, k, others, returns, states) for k in range(len(own))]
            out.append([(ret - b) / scales[g] for ret, b in zip(own, baselines, strict=True)])
    return out


def _baseline(
    i: int,
    k: int,
    others: list[int],
    returns: Sequence[Sequence[float] | None],
    states: Sequence[Sequence[Hashable]],
) -> float:
    """The other members' mean return from member i's state at turn k; else from turn k."""
    here = states[i][k]
    same = [
        ret
        for j in others
        for state, ret in zip(states[j], returns[j] or (), strict=True)
        if state == here
    ]
    if not same:
        same = [returns[j][k] for j in others if len(returns[j] or ()) > k]  # type: ignore[index]
    return sum(same) / len(same) if same else 0.0


def episode_turns(
    t: Trajectory, reward: float
) -> tuple[list[float], list[tuple[int, ...]], list[tuple[int, int, int]]]:
    """A trajectory's returns from each of its turns (`reward`: the episode's), each turn's
    state (the ids before it in its sample) and where it sampled: (sample, start, end),
    sample 0 the first of its samples (`split_samples`, then `t` itself)."""
    samples = (*t.split_samples, t)
    spans = [(k, start, end) for k, s in enumerate(samples) for start, end in s.turn_spans]
    turns = t.turns[max(0, len(t.turns) - len(spans)) :]
    rewards = [turn.reward for turn, _ in zip(turns, spans, strict=False)]
    spans = spans[: len(rewards)]  # a last turn cut before its step has no reward
    if rewards:
        rewards[-1] += reward - sum(rewards)  # reward functions, length penalty: at the end
    returns = [sum(rewards[k:]) for k in range(len(rewards))]
    return returns, [tuple(samples[k].tokens[:start]) for k, start, _ in spans], spans


def turn_targets(
    trajectories: Sequence[Trajectory],
    rewards: Tensor,
    scorable: Tensor,
    group_size: int,
    scales: Sequence[float],
) -> Tensor:
    """[N, T] per target token: each turn's advantage on the ids it sampled, aligned as
    `sampled_targets` (position t predicts token t + 1). Where episodes were split into
    samples (a rewritten history), [N + M, T]: the split samples' rows after the N, in
    order (`agentgym.learn.advantages.all_rows`), each turn's value on its own sample."""
    played = [episode_turns(t, float(r)) for t, r in zip(trajectories, rewards, strict=True)]
    ok = [bool(s) and not torch.isnan(r) for s, r in zip(scorable, rewards, strict=True)]
    returns = [p[0] if good else None for p, good in zip(played, ok, strict=True)]
    values = turn_advantages(returns, [p[1] for p in played], group_size, scales)
    rows = list(trajectories)
    where = []  # per trajectory, its samples' rows: the earlier ones, then its own
    for i, t in enumerate(trajectories):
        where.append([*range(len(rows), len(rows) + len(t.split_samples)), i])
        rows += t.split_samples
    mask = sampled_targets(rows)
    out = torch.zeros_like(mask)
    for i, (per_turn, (_, _, spans)) in enumerate(zip(values, played, strict=True)):
        for value, (k, start, end) in zip(per_turn, spans, strict=True):
            if end > start:
                out[where[i][k], start - 1 : end - 1] = value
    return out * mask

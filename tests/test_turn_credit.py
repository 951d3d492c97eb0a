"""Credit per turn (`grpo.credit: turn`): hand-computed advantages, their place on the tokens,
and unbiasedness against the exact policy gradient of a small multi-turn MDP whose episodes
have different numbers of turns; normalising by turn index fails that same test."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agentgym.cli import main
from agentgym.config import load_config
from agentgym.learn.advantages import advantages, unregistered
from agentgym.learn.turn_credit import turn_advantages
from agentgym.types import StepRecord, Trajectory, Turn


def test_each_turn_is_measured_against_the_other_members_at_its_state_else_at_its_turn():
    # one group of 3; returns from each turn, and each turn's state (its prefix)
    returns = [[1.0, 0.5], [0.0, 3.0], [2.0, 1.0, 1.0]]
    states = [["o", "a"], ["o", "b"], ["o", "a", "c"]]
    got = turn_advantages(returns, states, 3, [1.0])
    assert got == [
        [1.0 - (0.0 + 2.0) / 2, 0.5 - 1.0],  # turn 1 at "a": member 2 was there with 1.0
        [0.0 - (1.0 + 2.0) / 2, 3.0 - (0.5 + 1.0) / 2],  # nobody else at "b": turn 1's others
        [2.0 - (1.0 + 0.0) / 2, 1.0 - 0.5, 1.0 - 0.0],  # nobody else reached a third turn
    ]
    halved = turn_advantages(returns, states, 3, [2.0])
    assert halved == [[v / 2 for v in row] for row in got]
    assert turn_advantages(returns, states, 3, [0.0]) == [[0.0] * len(s) for s in states]


def test_an_unscorable_member_gets_zero_and_is_in_no_baseline():
    returns = [[1.0], None, [3.0]]
    got = turn_advantages(returns, [["o"], ["o"], ["o"]], 3, [1.0])
    assert got == [[1.0 - 3.0], [0.0], [3.0 - 1.0]]


def _episode(reward: float, step_rewards: list[float], group: int = 0) -> Trajectory:
    """A prompt of 2 ids, then per turn 2 sampled ids and 2 ids of the tool's reply."""
    tokens, mask, spans, turns = [1, 2], [0, 0], [], []
    for k, r in enumerate(step_rewards):
        start = len(tokens)
        tokens += [10 + k, 20 + k]
        mask += [1, 1]
        spans.append((start, start + 2))
        turns.append(Turn(f"turn {k}", (), r, {}))
        tokens += [7, 8]
        mask += [0, 0]
    return Trajectory(task_id="t", group=group, tokens=tuple(tokens), loss_mask=tuple(mask),
                      logprobs=tuple(-0.5 * m for m in mask), prompt_length=2, reward=reward,
                      reward_parts={}, turns=tuple(turns), finish_reason="stop",
                      truncated=False, turn_spans=tuple(spans))  # fmt: skip


def test_the_turn_estimator_puts_each_turn_s_value_on_the_ids_it_sampled():
    # rewards: the episodes' (step rewards plus 0.5 of a reward function on the first)
    a = _episode(1.5, [0.25, 0.75])  # returns from its turns: 1.5, 1.25
    b = _episode(0.0, [0.0])  # returns: 0.0
    rewards = torch.tensor([1.5, 0.0])
    record = StepRecord(1, 0, (), (a, b), rewards=rewards, scorable=torch.tensor([True, True]))
    g = load_config(overrides={"grpo.credit": "turn", "grpo.group_size": 2,
                               "grpo.scale_rewards": "none"}).grpo  # fmt: skip
    values = advantages(record, g).advantages
    # a: turn 0 (ids 2-3, targets 1-2) 1.5 - 0.0; turn 1 (ids 6-7, targets 5-6): b never
    # reached a turn 1, so 1.25 - 0. b: turn 0 0.0 - 1.5.
    assert values[0].tolist() == [0, 1.5, 1.5, 0, 0, 1.25, 1.25, 0, 0]
    assert values[1].tolist()[:4] == [0, -1.5, -1.5, 0] and not values[1, 4:].any()
    scaled = advantages(record, g.model_copy(update={"scale_rewards": "group"})).advantages
    assert torch.allclose(scaled, values / (0.75 + g.std_eps))  # the group's std is 0.75


def test_turn_credit_reaches_each_sample_of_an_episode_whose_history_was_rewritten():
    from dataclasses import replace

    from agentgym.learn.advantages import with_split_samples

    # member 0: its template rewrote the history after turn 0, so turn 0 sits in an earlier
    # sample (ids 1 2 | 10 20) and turn 1 in the last one, whose prompt is re-rendered (5 6)
    whole = _episode(1.0, [0.5, 0.0])  # returns from its turns: 1.0, 0.5
    earlier = replace(whole, tokens=(1, 2, 10, 20), loss_mask=(0, 0, 1, 1), turns=(),
                      logprobs=(0, 0, -0.5, -0.5), turn_spans=((2, 4),))  # fmt: skip
    last = replace(whole, tokens=(5, 6, 11, 21), loss_mask=(0, 0, 1, 1), turn_spans=((2, 4),),
                   logprobs=(0, 0, -0.5, -0.5), split_samples=(earlier,))  # fmt: skip
    other = _episode(0.0, [0.0, 0.0])  # returns 0.0, 0.0; its turn 1 after (1 2 10 20 7 8)
    rewards = torch.tensor([1.0, 0.0])
    record = StepRecord(
        1, 0, (), (last, other), rewards=rewards, scorable=torch.tensor([True, True])
    )
    g = load_config(overrides={"grpo.credit": "turn", "grpo.group_size": 2,
                               "grpo.scale_rewards": "none"}).grpo  # fmt: skip
    out = advantages(record, g)
    # member 0, turn 0 (in the earlier sample): state (1 2), which `other` shares: 1.0 - 0.0;
    # turn 1 (in the last sample): state (5 6) nobody shares, so `other`'s turn 1: 0.5 - 0.0.
    # other, turn 0: 0.0 - 1.0 (the shared state); turn 1: 0.0 - 0.5 (member 0's turn 1)
    assert out.advantages.tolist() == [
        [0, 0.5, 0.5, 0, 0, 0, 0, 0, 0],
        [0, -1.0, -1.0, 0, 0, -0.5, -0.5, 0, 0],
    ]
    assert out.split_advantages.tolist() == [[0, 1.0, 1.0]]
    # the learner's rows: each sample of member 0 weighted 1/2 (split_weights), own values
    rows, values = with_split_samples(record.trajectories, out.advantages, out.split_advantages)
    assert rows == [last, other, earlier]
    assert values.tolist() == [
        [0, 0.25, 0.25, 0, 0, 0, 0, 0, 0],
        [0, -1.0, -1.0, 0, 0, -0.5, -0.5, 0, 0],
        [0, 0.5, 0.5, 0, 0, 0, 0, 0, 0],
    ]
    # the group estimator gives no split rows: the earlier sample takes its episode's mean
    group = advantages(record, g.model_copy(update={"credit": "episode"}))
    assert group.split_advantages is None
    rows, values = with_split_samples(record.trajectories, group.advantages)
    assert values[2].tolist() == [0, 0.25, 0.25, 0, 0, 0, 0, 0, 0]  # (1.0 - 0.5) x 1/2


def test_credit_turn_with_another_estimator_named_is_refused_as_the_run_starts():
    g = load_config(overrides={"grpo.credit": "turn", "grpo.advantage": "group"}).grpo
    assert unregistered(g) == {}
    bad = g.model_copy(update={"advantage": "last_turn_double"})
    assert "credit 'turn' is the turn estimator" in unregistered(bad)["grpo.credit"]


# -- unbiasedness on a small MDP with exact gradients ----------------------------------------
# Turn 0 at "": a=0 goes to "0", a=1 to "1" (reward 0.2), a=2 ends (0.5). At "0": a=0 ends
# (1.0), a=1 goes to "01". At "1": a=0 ends (0.0), a=1 ends (0.8). At "01": a=1 ends (2.0),
# a=0 ends (0.0). Episodes have one, two or three turns.
STATES = {"": 3, "0": 2, "1": 2, "01": 2}
STEP = {("", 0): ("0", 0.0), ("", 1): ("1", 0.2), ("", 2): (None, 0.5),
        ("0", 0): (None, 1.0), ("0", 1): ("01", 0.0), ("1", 0): (None, 0.0),
        ("1", 1): (None, 0.8), ("01", 0): (None, 0.0), ("01", 1): (None, 2.0)}  # fmt: skip
LOGITS = {"": [0.3, -0.2, 0.1], "0": [0.2, -0.4], "1": [-0.1, 0.5], "01": [0.0, -0.3]}
PROBS = {s: np.exp(v) / np.exp(v).sum() for s, v in LOGITS.items()}
OFFSET = dict(zip(STATES, np.cumsum([0, *STATES.values()])[:-1].tolist(), strict=True))


def _exact_gradient() -> np.ndarray:
    logits = {
        s: torch.tensor(v, dtype=torch.float64, requires_grad=True) for s, v in LOGITS.items()
    }

    def value(state: str) -> torch.Tensor:
        probs = torch.softmax(logits[state], 0)
        total = torch.zeros((), dtype=torch.float64)
        for a in range(STATES[state]):
            nxt, r = STEP[(state, a)]
            total = total + probs[a] * (r + (value(nxt) if nxt else 0.0))
        return total

    value("").backward()
    return np.concatenate([logits[s].grad.numpy() for s in STATES])


def _play(rng: np.random.Generator) -> tuple[list[str], list[int], list[float]]:
    state, states, actions, rewards = "", [], [], []
    while state is not None:
        a = int(rng.choice(STATES[state], p=PROBS[state]))
        states.append(state)
        actions.append(a)
        state, r = STEP[(state, a)]
        rewards.append(r)
    return states, actions, rewards


def _score(states: list[str], actions: list[int]) -> list[np.ndarray]:
    """d log pi(a_k | s_k) / d logits, per turn, as one flat vector over every state."""
    out = []
    for s, a in zip(states, actions, strict=True):
        grad = np.zeros(sum(STATES.values()))
        grad[OFFSET[s] : OFFSET[s] + STATES[s]] = np.eye(STATES[s])[a] - PROBS[s]
        out.append(grad)
    return out


def _per_turn_index(returns: list[list[float]], group_size: int) -> list[list[float]]:
    """Normalising by turn index: turn k's return less the mean over the members that
    reached turn k, the member itself included (the estimator that fails)."""
    out = []
    for i, own in enumerate(returns):
        out.append([])
        for k, ret in enumerate(own):
            there = [r[k] for r in returns if len(r) > k]
            out[i].append(ret - sum(there) / len(there))
    return out


def _estimates(estimator, seeds: int, groups: int, group_size: int = 4) -> np.ndarray:
    """One gradient estimate per seed: the mean over `groups` groups."""
    per_seed = []
    for seed in range(seeds):
        rng, total = np.random.default_rng(seed), np.zeros(sum(STATES.values()))
        for _ in range(groups):
            played = [_play(rng) for _ in range(group_size)]
            returns = [[sum(r[k:]) for k in range(len(r))] for _, _, r in played]
            values = estimator(returns, [s for s, _, _ in played], group_size)
            for (states, actions, _), adv in zip(played, values, strict=True):
                for score, a in zip(_score(states, actions), adv, strict=True):
                    total += a * score / group_size
        per_seed.append(total / groups)
    return np.array(per_seed)


def _z_scores(estimates: np.ndarray) -> np.ndarray:
    mean = estimates.mean(0)
    stderr = estimates.std(0, ddof=1) / np.sqrt(len(estimates))
    return (mean - _exact_gradient()) / stderr


def test_the_turn_estimator_is_unbiased_and_per_turn_index_normalisation_is_not():
    ours = _z_scores(_estimates(lambda r, s, g: turn_advantages(r, s, g, [1.0]), 40, 250))
    theirs = _z_scores(_estimates(lambda r, s, g: _per_turn_index(r, g), 40, 250))
    print("z (turn estimator):", np.round(ours, 2).tolist())
    print("z (per-turn-index normalisation):", np.round(theirs, 2).tolist())
    assert np.abs(ours).max() < 3  # every component within 3 standard errors
    assert np.abs(theirs).max() > 3


@pytest.mark.slow
def test_credit_turn_trains_two_steps_on_tool_call(tmp_path):
    run = tmp_path / "run"
    code = main(["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "2",
                 "--set", "grpo.credit=turn", "--set", "grpo.group_size=2",
                 "--set", "grpo.tasks_per_step=2", "--set", "sampling.max_new_tokens=8",
                 "--set", "run.report_to=[]", "--output", str(run)])  # fmt: skip
    assert code == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]

"""The `advantages` stage and its registry (`agentgym.learn.advantages`): per-token
advantages [N, T] aligned with the batch's targets, estimators added by name from outside
the package, and a second estimator training on `tool_call` from this file alone."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentgym.cli import main
from agentgym.config import ConfigError, load_config
from agentgym.learn.advantages import (
    ADVANTAGES,
    advantages,
    get_advantage,
    register_advantage,
    unregistered,
)
from agentgym.learn.learner import Learner
from agentgym.run.preflight import check_registered
from agentgym.types import Batch, StepRecord, TrainingError, Trajectory, sampled_targets

CALLS: list[StepRecord] = []
OUTPUTS: list[torch.Tensor] = []


@register_advantage("last_turn_double")
def last_turn_double(record, grpo):
    """GRPO's advantage, twice over on every token of each trajectory's last turn: the
    kind of turn-level credit the registry is for, written outside the package."""
    CALLS.append(record)
    base = ADVANTAGES["group"](record, grpo)
    weight = torch.ones_like(base)
    for i, t in enumerate(record.trajectories):
        if t.turn_spans:
            start, end = t.turn_spans[-1]
            weight[i, start - 1 : end - 1] = 2.0  # token j is the target at position j - 1
    OUTPUTS.append(base * weight)
    return OUTPUTS[-1]


def _episode(group: int, reward: float, mask: tuple[int, ...], spans=()) -> Trajectory:
    n = len(mask)
    return Trajectory(task_id=f"t{group}", group=group, tokens=tuple(range(5, 5 + n)),
                      loss_mask=mask, logprobs=tuple(-0.5 * m for m in mask), prompt_length=2,
                      reward=reward, reward_parts={}, turns=(), finish_reason="stop",
                      truncated=False, turn_spans=spans)  # fmt: skip


# two turns: sampled tokens 2-3 (turn 0), a tool result 4-5, sampled 6-7 (turn 1)
TWO_TURNS = (0, 0, 1, 1, 0, 0, 1, 1)
ONE_TURN = (0, 0, 1, 1, 1)


def _record(rewards, trajectories, scorable=None) -> StepRecord:
    rewards = torch.tensor(rewards)
    scorable = torch.tensor(scorable) if scorable is not None else ~torch.isnan(rewards)
    return StepRecord(1, 0, (), tuple(trajectories), rewards=rewards, scorable=scorable)


def _grpo(**overrides):
    return load_config(overrides={f"grpo.{k}": v for k, v in overrides.items()}).grpo


def test_the_group_estimator_puts_each_trajectory_s_advantage_on_its_sampled_targets():
    # one group of two: rewards 1 and 0, mean 0.5, population std 0.5: advantages +1 and -1
    record = _record([1.0, 0.0], [_episode(0, 1.0, TWO_TURNS), _episode(0, 0.0, ONE_TURN)])
    out = advantages(record, _grpo(group_size=2))
    assert out.advantages is not None and out.advantages.shape == (2, 7)  # longest 8 - 1
    plus, minus = 1.0, -1.0  # 0.5 / (0.5 + eps) with the paper's eps 1e-8 is 1.0 in float32
    # target position t is token t + 1: the mask from the second token on, padded with 0
    assert out.advantages[0].tolist() == [0, plus, plus, 0, 0, plus, plus]
    assert out.advantages[1].tolist() == [0, minus, minus, minus, 0, 0, 0]
    assert out.flat_groups is not None and out.flat_groups.tolist() == [False]


def test_an_unscorable_episode_gets_no_advantage_and_its_group_is_judged_without_it():
    trajectories = [_episode(0, r, ONE_TURN) for r in (1.0, 0.0, 0.0)]
    record = _record([1.0, 0.0, math.nan], trajectories)
    out = advantages(record, _grpo(group_size=3, scale_rewards="none"))
    assert out.advantages is not None
    assert out.advantages[:, 1].tolist() == [0.5, -0.5, 0.0]  # mean of the two scored: 0.5
    flat = advantages(_record([1.0, math.nan, 1.0], trajectories), _grpo(group_size=3))
    assert flat.flat_groups is not None and flat.flat_groups.tolist() == [True]


def test_a_registered_estimator_gets_the_record_and_shapes_every_token_by_hand():
    CALLS.clear()
    spans = ((2, 4), (6, 8))
    record = _record([1.0, 0.0], [_episode(0, 1.0, TWO_TURNS, spans),
                                  _episode(0, 0.0, ONE_TURN, ((2, 5),))])  # fmt: skip
    out = advantages(record, _grpo(group_size=2, advantage="last_turn_double"))
    assert [record] == CALLS
    plus, minus = 1.0, -1.0  # as above
    assert out.advantages is not None
    # turn 1 (tokens 6-7, positions 5-6) doubled; turn 0 (tokens 2-3, positions 1-2) not
    assert out.advantages[0].tolist() == [0, plus, plus, 0, 0, 2 * plus, 2 * plus]
    assert out.advantages[1].tolist() == [0, 2 * minus, 2 * minus, 2 * minus, 0, 0, 0]


def test_the_batch_keeps_each_row_s_per_token_advantages_through_dropped_rows_and_micro_batches():
    long, short = _episode(0, 1.0, TWO_TURNS), _episode(1, 0.0, ONE_TURN)
    per_token = torch.arange(14, dtype=torch.float32).view(2, 7)
    batch = Batch.from_trajectories([long, short], per_token, pad_id=0)
    assert torch.equal(batch.advantages, per_token)
    # the short row alone: cut to its own length - 1 = 4 positions
    alone = Batch.from_trajectories([short], per_token[1:], pad_id=0)
    assert alone.advantages.tolist() == [[7.0, 8.0, 9.0, 10.0]]
    first, second = batch.split(1, by_length=True)
    assert first.advantages.tolist() == [[7.0, 8.0, 9.0, 10.0]]  # the shorter row first
    assert torch.equal(second.advantages, per_token[:1])
    # one advantage per row, as the losses' callers may still pass: on every position
    assert Batch.from_trajectories([short], torch.tensor([3.0]), 0).advantages.tolist() == [
        [3.0] * 4
    ]


def test_an_estimator_of_the_wrong_shape_is_refused_naming_it_and_the_shape_wanted():
    @register_advantage("per_row_only")
    def per_row_only(record, grpo):
        return torch.zeros(len(record.trajectories))

    try:
        record = _record([1.0, 0.0], [_episode(0, 1.0, ONE_TURN), _episode(0, 0.0, ONE_TURN)])
        with pytest.raises(ValueError, match=r"'per_row_only' .*\(2,\); it must be \[N, T\] = "
                                             r"\(2, 4\)"):  # fmt: skip
            advantages(record, _grpo(group_size=2, advantage="per_row_only"))
    finally:
        del ADVANTAGES["per_row_only"]


def test_samples_out_of_their_groups_stop_the_stage():
    record = _record([1.0, 0.0], [_episode(0, 1.0, ONE_TURN), _episode(1, 0.0, ONE_TURN)])
    with pytest.raises(TrainingError, match=r"^block 0 \(samples 0-1\) is not one group"):
        advantages(record, _grpo(group_size=2))


def test_an_unscored_record_is_refused():
    record = StepRecord(3, 2, (), (_episode(0, 1.0, ONE_TURN),))
    with pytest.raises(ValueError, match=r"^step 3: rewards, scorable not set yet"):
        advantages(record, _grpo(group_size=2))


def test_names_are_registered_once_and_unknown_ones_are_refused_as_the_run_starts():
    with pytest.raises(ValueError, match="'group' is already registered"):
        register_advantage("group")(last_turn_double)
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'gigpo'; registered: "):
        get_advantage("gigpo")
    grpo = _grpo(advantage="gigpo", loss="ppo2")
    assert unregistered(grpo) == {
        "grpo.loss": "unknown loss 'ppo2'; registered: bnpo, dapo, dr_grpo, grpo, token_mean",
        "grpo.advantage": "unknown advantage estimator 'gigpo'; registered: group, "
        "last_turn_double, turn",
    }
    with pytest.raises(ConfigError, match=r"grpo\.advantage: unknown advantage estimator"):
        check_registered(load_config(overrides={"grpo.advantage": "gigpo"}))


def test_the_cli_refuses_an_unregistered_estimator_before_any_model_loads(tmp_path, capsys):
    code = main(["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "1",
                 "--set", "grpo.advantage=gigpo", "--output", str(tmp_path / "run")])  # fmt: skip
    assert code == 2
    assert "grpo.advantage: unknown advantage estimator 'gigpo'" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_second_estimator_from_this_file_trains_two_steps_on_tool_call(tmp_path, monkeypatch):
    """Nothing under agentgym/ names `last_turn_double`: the registry is the whole hook."""
    CALLS.clear()
    OUTPUTS.clear()
    stepped: list[Batch] = []
    real_step = Learner.step

    def step(self, batch, beta=None):
        stepped.append(batch)
        return real_step(self, batch, beta=beta)

    monkeypatch.setattr(Learner, "step", step)
    run = tmp_path / "run"
    code = main(["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "2",
                 "--set", "grpo.advantage=last_turn_double", "--set", "grpo.group_size=2",
                 "--set", "grpo.tasks_per_step=2", "--set", "sampling.max_new_tokens=8",
                 "--set", "grpo.beta=0.0", "--set", "run.report_to=[]",
                 "--output", str(run)])  # fmt: skip
    assert code == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert len(CALLS) == len(stepped) == 2  # once a step
    for record, values, batch in zip(CALLS, OUTPUTS[-2:], stepped, strict=True):
        assert record.advantages is None and record.rewards is not None  # scored, not yet set
        # every row reached the learner (none is flat-dropped by default) with the
        # estimator's own per-token values, aligned with its targets
        assert torch.equal(batch.advantages, values)
        assert torch.equal(batch.loss_mask, sampled_targets(record.trajectories))

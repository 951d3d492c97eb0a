"""The `update` stage (`learn/update.update`): which rows reach the learner,
what it is handed, and how the iterations' metrics are reduced. The learner's own step is
replaced by a recorder here; tests/test_learner.py runs the real one."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from step_records import update_stats

from agentgym.config import load_config
from agentgym.learn.learner import Learner
from agentgym.types import Batch, Trajectory


def _trajectory(vocab: int, reward: float, seed: int, tokens: int = 12) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (tokens,), generator=g).tolist()
    mask = [0] * min(5, tokens) + [1] * max(0, tokens - 5)
    return Trajectory(task_id=f"t{seed // 2}", group=seed // 2, tokens=tuple(ids),
                      loss_mask=tuple(mask), logprobs=tuple(-0.5 * m for m in mask),
                      prompt_length=min(5, tokens), reward=reward, reward_parts={}, turns=(),
                      finish_reason="stop", truncated=False)  # fmt: skip


@pytest.fixture
def recorded(tiny):
    """(learner, tokenizer, calls, step): each learner step's (batch, beta) by `step`,
    answering metrics {"x": 1.0}, then {"x": 3.0}, ... (2k + 1 at the k-th call)."""
    model, tokenizer = tiny
    calls: list[tuple] = []

    def step(learner, batch, beta):
        calls.append((batch, beta))
        return {"x": 2.0 * len(calls) - 1.0}

    learner = Learner(copy.deepcopy(model), load_config(overrides={"grpo.beta": 0.0}))
    return learner, tokenizer, calls, step


def _config(**overrides):
    return load_config(overrides={"grpo.group_size": 2, "grpo.beta": 0.0, **overrides})


def test_the_iterations_metrics_are_averaged_and_each_gets_the_step_s_beta(recorded):
    learner, tokenizer, calls, step = recorded
    trajs = [_trajectory(len(tokenizer), r, i) for i, r in enumerate([1.0, 0.0])]
    config = _config(**{"grpo.num_iterations": 2})
    stats = update_stats(config, learner, trajs, torch.tensor([1.0, 0.0]),
                         torch.tensor([1.0, -1.0]), tokenizer, 0.25, step=step)  # fmt: skip
    assert stats == {"x": 2.0}  # (1 + 3) / 2
    assert [beta for _, beta in calls] == [0.25, 0.25]


def test_an_episode_whose_reset_failed_has_no_row_even_when_flat_groups_are_dropped(recorded):
    learner, tokenizer, calls, step = recorded
    vocab = len(tokenizer)
    # two groups of three, neither flat; the last episode's reset failed: no tokens
    trajs = [_trajectory(vocab, r, i) for i, r in enumerate([1.0, 0.0, 0.5, 0.5, 0.0])]
    failed = _trajectory(vocab, 0.0, 5, tokens=0)
    trajs.append(dataclasses.replace(failed, group=1, task_id="t1", error="OSError: down"))
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.0, float("nan")])
    advantages = torch.tensor([1.0, -1.0, 0.0, 1.0, -1.0, 0.0])
    for drop in (False, True):
        calls.clear()
        config = _config(**{"grpo.group_size": 3, "grpo.drop_zero_variance_groups": drop})
        update_stats(config, learner, trajs, rewards, advantages, tokenizer, None, step=step)
        ((batch, _),) = calls
        assert batch.size == 5, drop  # the row without tokens never reaches the learner
        assert torch.equal(batch.advantages[:, -1], advantages[:5])  # on each sampled token


@pytest.mark.parametrize("off_policy", [False, True])
def test_only_an_off_policy_sampler_s_batch_is_corrected_for_its_logprob_mismatch(
    recorded, monkeypatch, off_policy
):
    """`Trainer.off_policy` (a vLLM engine samples, or asynchronous GRPO: decided once, by
    `Run.start_training`) is what the update reads, not the config's backend."""
    learner, tokenizer, calls, step = recorded
    corrected = []
    monkeypatch.setattr(learner, "correct_mismatch",
                        lambda batch: corrected.append(batch) or (batch, {"tis": 1.0}))  # fmt: skip
    trajs = [_trajectory(len(tokenizer), r, i) for i, r in enumerate([1.0, 0.0])]
    config = _config(**{"policy.backend": "vllm"})  # read by no stage of the update
    stats = update_stats(config, learner, trajs, torch.tensor([1.0, 0.0]),
                         torch.tensor([1.0, -1.0]), tokenizer, None, step=step,
                         off_policy=off_policy)  # fmt: skip
    assert len(corrected) == off_policy
    assert all(isinstance(b, Batch) and b.size == 2 for b in corrected)  # the step's batch
    assert ("tis" in stats) == off_policy

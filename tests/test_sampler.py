"""The in-process sampler as the loop uses it: `poll(wait=...)` honoured, and the one
weight-sync path (`load_weights`) copying only into a policy with its own weights."""

from __future__ import annotations

import copy

import torch

from agentgym.config import load_config
from agentgym.env.core import make_env
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.rollout.episodes import TaskSpec
from agentgym.rollout.player import Submission, TurnPlayer, turn_player
from agentgym.rollout.sampler import InProcessSampler
from agentgym.scale.samplers import make_sampler

PARAMS = SamplingParams(max_new_tokens=4, temperature=1.0, seed=3)


def _moved(model) -> dict[str, torch.Tensor]:
    """`model`'s parameters, each plus 1: weights a learner step could have made."""
    return {n: p.detach() + 1.0 for n, p in model.named_parameters()}


def test_poll_without_wait_plays_nothing_and_with_wait_plays_what_was_submitted(tiny):
    model, tokenizer = tiny
    envs = [make_env("math") for _ in range(2)]
    sampler = InProcessSampler(envs, HFPolicy(model, tokenizer), TurnPlayer(tokenizer))
    try:
        sampler.submit(Submission((TaskSpec(seed=1),), 2, PARAMS))
        assert sampler.poll(wait=False) == []  # it plays only when waited on
        played = sampler.poll(wait=True)
        assert [(t.group, t.task_id == played[0].task_id) for t in played] == [(0, True)] * 2
        assert sampler.poll(wait=True) == []  # nothing left queued
    finally:
        sampler.close()


def test_a_policy_with_its_own_copy_gets_the_weights_and_one_on_the_learner_s_model_not(tiny):
    model, tokenizer = tiny
    learner_model, copy_model = copy.deepcopy(model), copy.deepcopy(model)
    weights = _moved(learner_model)
    calls = []

    def source():
        calls.append(1)
        return weights.items()

    own = InProcessSampler(
        [], HFPolicy(copy_model, tokenizer), TurnPlayer(tokenizer), copies_weights=True
    )
    figures = own.load_weights(source, 5)
    assert own.version == 5 and calls == [1] and set(figures) == {"rollout/weight_sync_seconds"}
    assert all(torch.equal(p, weights[n]) for n, p in copy_model.named_parameters())

    shared = InProcessSampler([], HFPolicy(learner_model, tokenizer), TurnPlayer(tokenizer))
    assert shared.load_weights(source, 6) == {} and shared.version == 6
    assert calls == [1]  # never asked for the weights: it samples with the learner's model


def test_make_sampler_copies_exactly_when_the_policy_is_not_on_the_learner_s_model(tiny):
    model, tokenizer = tiny
    config = load_config(overrides={"grpo.group_size": 2})
    other = copy.deepcopy(model)
    for policy_model, copies in ((model, False), (other, True)):
        policy = HFPolicy(policy_model, tokenizer)
        sampler = make_sampler(config, [], policy, tokenizer, None, lambda: [], model)
        assert isinstance(sampler, InProcessSampler) and sampler.copies_weights is copies
        assert sampler.player == turn_player(config, tokenizer)  # the config's turn loop

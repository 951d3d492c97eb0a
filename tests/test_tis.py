"""The sampler/learner mismatch correction (truncated importance sampling) and the
`policy` config section; none of it needs vLLM installed."""

from __future__ import annotations

import copy
import importlib.util
import math
from dataclasses import replace

import pytest
import torch

from agentgym.cli import build_parser, config_from_args
from agentgym.config import ConfigError, load_config
from agentgym.learn.grpo import clipped_policy_loss, truncated_is_weights
from agentgym.learn.learner import Learner
from agentgym.types import Batch


def test_truncated_weights_are_the_ratio_capped_on_sampled_tokens_only():
    sampler = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    # learner - sampler: ln 1.5, ln 3 (over the cap 2), -ln 2, and a masked-out 7.0
    old = sampler + torch.tensor([[math.log(1.5), math.log(3.0), -math.log(2.0), 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    weights, stats = truncated_is_weights(old, sampler, mask, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 2.0, 0.5, 0.0]]))
    assert stats["logprob_diff_max"].item() == pytest.approx(math.log(3.0))
    assert stats["is_ratio_mean"].item() == pytest.approx((1.5 + 3.0 + 0.5) / 3)
    assert stats["is_truncated_fraction"].item() == pytest.approx(1 / 3)


def test_the_weights_multiply_each_tokens_clipped_surrogate():
    # At the learner's old logprobs the ratio is 1, so each token's surrogate is -A;
    # weighted by (1.5, 2.0) and averaged over the sequence: -(1.5 + 2.0) / 2 * A.
    logp = torch.tensor([[-1.0, -2.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights = torch.tensor([[1.5, 2.0, 5.0]])
    out = clipped_policy_loss(logp, logp.detach(), torch.tensor([2.0]), mask,
                              is_weights=weights)  # fmt: skip
    assert out.loss.item() == pytest.approx(-(1.5 + 2.0) / 2 * 2.0)
    out.loss.backward()
    # d/dlogp of -w * A * exp(logp - old) at ratio 1 is -w * A / T_tokens
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.5, -2.0, 0.0]]))


def test_without_weights_the_loss_is_unchanged():
    logp = torch.tensor([[-1.0, -2.0]])
    old = torch.tensor([[-1.2, -1.9]])
    mask = torch.ones(1, 2)
    adv = torch.tensor([1.0])
    plain = clipped_policy_loss(logp, old, adv, mask)
    ones = clipped_policy_loss(logp, old, adv, mask, is_weights=torch.ones(1, 2))
    assert plain.loss.item() == ones.loss.item()


def _batch(model, tokenizer) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(tokenizer), (3, 10), generator=g)
    mask = torch.zeros(3, 9)
    mask[:, 4:] = 1.0
    return Batch(ids, torch.ones_like(ids), mask, torch.zeros(3, 9), torch.tensor([1.0, -1.0, 0.5]))


def test_the_learner_recomputes_its_old_logprobs_and_weighs_the_samplers(tiny):
    model, tokenizer = tiny
    config = load_config(overrides={"grpo.tis_cap": 2.0, "optim.micro_batch_size": 2})
    learner = Learner(copy.deepcopy(model), config)
    batch = _batch(model, tokenizer)
    own = learner.old_logprobs(batch)
    assert (own[batch.loss_mask == 0] == 0).all() and (own[batch.loss_mask == 1] < 0).all()
    # a sampler that agrees exactly: weights 1, no difference
    agreed, stats = learner.correct_mismatch(replace(batch, old_logprobs=own))
    torch.testing.assert_close(agreed.is_weights, batch.loss_mask)
    assert stats["rollout/logprob_diff_max"] == 0.0 and stats["rollout/is_ratio_mean"] == 1.0
    # a sampler that found every token 3 times less likely: ratio 3, capped at 2
    low = replace(batch, old_logprobs=own - math.log(3.0) * batch.loss_mask)
    corrected, stats = learner.correct_mismatch(low)
    torch.testing.assert_close(corrected.old_logprobs, own)
    torch.testing.assert_close(corrected.is_weights, 2.0 * batch.loss_mask)
    assert stats["rollout/is_ratio_mean"] == pytest.approx(3.0, rel=1e-5)
    assert stats["rollout/is_truncated_fraction"] == 1.0
    metrics = learner.step(corrected)
    assert all(math.isfinite(v) for v in metrics.values())


def test_split_micro_batches_carry_their_rows_weights(tiny):
    model, tokenizer = tiny
    batch = _batch(model, tokenizer)
    weights = torch.arange(27, dtype=torch.float32).view(3, 9)
    parts = replace(batch, is_weights=weights).split(2)
    torch.testing.assert_close(torch.cat([p.is_weights for p in parts]), weights)


def test_the_cli_selects_the_vllm_policy_and_its_options():
    args = build_parser().parse_args(
        ["train", "--env", "tool_call", "--policy", "vllm", "--set", "grpo.tis_cap=1.5",
         "--set", "policy.gpu_memory_utilization=0.5", "--output", "unused"]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.policy.backend == "vllm" and config.grpo.tis_cap == 1.5
    assert config.policy.gpu_memory_utilization == 0.5
    assert load_config().policy.backend == "hf"


def test_bad_policy_options_name_the_field():
    with pytest.raises(ConfigError, match="policy.backend"):
        load_config(overrides={"policy.backend": "sglang"})
    with pytest.raises(ConfigError, match="grpo.tis_cap"):
        load_config(overrides={"grpo.tis_cap": 0})


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_without_vllm_the_vllm_policy_fails_early_saying_how_to_install_it():
    from agentgym.run.preflight import require_vllm

    with pytest.raises(ConfigError, match="make setup-vllm"):
        require_vllm(load_config(overrides={"policy.backend": "vllm"}))

"""Exact edges of the GRPO math: error messages, clamps, clip bounds, eps, dtypes.

Written against the mutants `make mutate` found alive in `agentgym.learn.grpo`; every
expected number is worked out by hand in the comment beside it.
"""

from __future__ import annotations

import math

import pytest
import torch

from agentgym.learn.grpo import (
    MICRO_BATCH_WEIGHTS,
    POLICY_LOSSES,
    aggregate,
    clipped_policy_loss,
    get_policy_loss,
    group_advantages,
    kl_k3,
    register_policy_loss,
    truncated_is_weights,
    zero_variance_fraction,
)

E20 = math.exp(20.0)  # the clamp on every log-ratio: exp(+-20), never exp(+-100)


def close(actual: torch.Tensor, expected, rtol: float = 1e-6) -> None:
    expected = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual.detach().double(), expected, rtol=rtol, atol=0.0)


def loss_of(log_ratios: list[float], advantages: list[float], **options):
    """clipped_policy_loss on one token per row: old logprobs 0, logprobs `log_ratios`."""
    logp = torch.tensor(log_ratios).unsqueeze(1).requires_grad_(True)
    old = torch.zeros_like(logp)
    out = clipped_policy_loss(logp, old, torch.tensor(advantages), torch.ones_like(old), **options)
    return out, logp


# --- error messages: each names what is wrong and what was given ---------------------


def _bad_calls():
    ok2, ok3 = torch.zeros(2, 2), torch.zeros(2, 3)
    return [
        (lambda: group_advantages(ok2, 2), r"rewards must be 1-D \[N\], got shape \(2, 2\)$"),
        (
            lambda: group_advantages(torch.zeros(3), 2),
            r"^3 rewards cannot be split into groups of 2: N must be a positive multiple "
            r"of group_size$",
        ),
        (
            lambda: group_advantages(torch.zeros(4), 2, scale="std"),
            r"^scale must be one of \('group', 'batch', 'none'\), got 'std'$",
        ),
        (
            lambda: aggregate(ok2, ok2, "sum"),
            r"^unknown aggregation 'sum'; choose one of \('seq_mean_token_mean', "
            r"'token_mean', 'seq_mean_token_sum_norm'\)$",
        ),
        (
            lambda: clipped_policy_loss(ok3, ok2, torch.zeros(2), ok3),
            r"^logprobs, old_logprobs and loss_mask must all be \[B, T\]; "
            r"got \(2, 3\), \(2, 2\), \(2, 3\)$",
        ),
        (
            lambda: clipped_policy_loss(ok3, ok3, torch.zeros(3), ok3),
            r"^advantages must be \[B, T\] = \(2, 3\) or \[B=2\], got \(3,\)$",
        ),
        (
            lambda: clipped_policy_loss(ok3, ok3, torch.zeros(2), ok3, beta=0.1),
            r"^beta > 0 needs ref_logprobs: pass the reference policy's log-probs$",
        ),
        (
            lambda: clipped_policy_loss(
                ok3, ok3, torch.zeros(2), ok3, importance_sampling_level="seq"
            ),
            r"^importance_sampling_level must be 'token' or 'sequence', got 'seq'$",
        ),
        (
            lambda: get_policy_loss("ppo"),
            r"^unknown policy loss 'ppo'; registered: bnpo, dapo, dr_grpo, grpo, ",
        ),
        (
            lambda: truncated_is_weights(ok3, ok2, ok3, 2.0),
            r"^old_logprobs, sampler_logprobs and loss_mask must have one shape; "
            r"got \(2, 3\), \(2, 2\), \(2, 3\)$",
        ),
        (lambda: truncated_is_weights(ok3, ok3, ok3, 0.0), r"^cap must be > 0, got 0.0$"),
    ]


BAD_CALL_NAMES = [
    "rewards not 1-D",
    "N not a multiple of G",
    "unknown scale",
    "unknown aggregation",
    "shapes differ",
    "advantages not [B, T] or [B]",
    "beta without ref",
    "unknown IS level",
    "unknown loss",
    "IS shapes differ",
    "cap 0",
]


@pytest.mark.parametrize(("call", "message"), _bad_calls(), ids=BAD_CALL_NAMES)
def test_a_bad_argument_is_a_value_error_that_says_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- advantages ----------------------------------------------------------------------


def test_a_group_of_one_is_allowed_and_carries_no_signal():
    # one sample per prompt: no sample has a peer to be compared with
    close(group_advantages(torch.tensor([1.0, 2.0, 3.0]), 1), [0.0, 0.0, 0.0])
    assert zero_variance_fraction(torch.tensor([1.0, 2.0, 3.0]), 1) == 1.0


def test_each_group_is_scaled_by_its_own_std():
    # [0, 1]: mean 0.5, std 0.5 -> -1, 1.  [0, 4]: mean 2, std 2 -> -1, 1.
    close(group_advantages(torch.tensor([0.0, 1.0, 0.0, 4.0]), 2), [-1.0, 1.0, -1.0, 1.0])


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_eps_is_added_to_the_std(scale):
    # [0, 2]: centred -1, 1; the group's std and the batch's are both 1: -1 / (1 + 1)
    close(group_advantages(torch.tensor([0.0, 2.0]), 2, eps=1.0, scale=scale), [-0.5, 0.5])


def test_float64_rewards_keep_their_precision():
    # [0, 2] in float64: +-1 / (1 + 1e-8), which float32 would round to +-1
    adv = group_advantages(torch.tensor([0.0, 2.0], dtype=torch.float64), 2)
    assert adv.dtype == torch.float64
    assert adv.tolist() == [-1 / (1 + 1e-8), 1 / (1 + 1e-8)]


def test_integer_rewards_are_scaled_by_the_batch_std():
    # [0, 2] centred -1, 1; [1, 1] flat. Batch [0, 2, 1, 1]: mean 1, std sqrt(0.5)
    adv = group_advantages(torch.tensor([0, 2, 1, 1]), 2, scale="batch")
    close(adv, [-math.sqrt(2), math.sqrt(2), 0.0, 0.0])


def test_a_0_1_scorable_mask_works_as_a_bool_one():
    rewards = torch.tensor([1.0, 5.0, 3.0, 0.0])
    as_bool = group_advantages(rewards, 2, scorable=torch.tensor([True, False, True, True]))
    as_int = group_advantages(rewards, 2, scorable=torch.tensor([1, 0, 1, 1]))
    # group 0 has one scored sample: 0, 0; group 1 [3, 0]: mean 1.5, std 1.5 -> 1, -1
    close(as_bool, [0.0, 0.0, 1.0, -1.0])
    assert torch.equal(as_int, as_bool)


def test_a_group_with_no_scored_reward_counts_as_zero_variance():
    # group 0 is all NaN, group 1 has a signal: half the groups give none
    assert zero_variance_fraction(torch.tensor([math.nan, math.nan, 1.0, 2.0]), 2) == 0.5


# --- the policy loss -----------------------------------------------------------------


def test_the_default_clip_range_is_0_2():
    # ratio 1.5, A = 1: -min(1.5, 1.2) = -1.2.  ratio 0.5, A = -1: -min(-0.5, -0.8) = 0.8
    close(loss_of([math.log(1.5)], [1.0])[0].loss, -1.2)
    close(loss_of([math.log(0.5)], [-1.0])[0].loss, 0.8)


def test_clip_fraction_counts_the_tokens_whose_gradient_the_clip_zeroes():
    # (ratio, A): (1.5, 1) and (0.5, -1) are clipped; with A = 0 nothing is; (0.5, 0.5)
    # is below the range with A > 0, where min() takes the unclipped ratio: 2 of 5
    ratios = [1.5, 0.5, 1.5, 0.5, 0.5]
    out, _ = loss_of([math.log(r) for r in ratios], [1.0, -1.0, 0.0, 0.0, 0.5])
    close(out.clip_fraction, 0.4)


def test_a_ratio_exactly_at_the_clip_bound_is_not_clipped():
    # epsilon 0: the range is [1, 1] and ratio 1 sits on both ends. The gradient still
    # flows (half through each side of the min): d/dlogp (-A * ratio) / 2 rows = -A / 2
    out, logp = loss_of([0.0, 0.0], [1.0, -1.0], epsilon=0.0)
    assert out.clip_fraction.item() == 0.0
    out.loss.backward()
    close(logp.grad, [[-0.5], [0.5]])


def test_log_ratios_are_clamped_to_plus_minus_20():
    # +100, A = -1: -min(-e^20, -1.2) = e^20, not inf
    close(loss_of([100.0], [-1.0])[0].loss, E20, rtol=1e-5)
    # -100, A = 1: -min(e^-20, 0.8) = -e^-20, not -e^-100
    close(loss_of([-100.0], [1.0])[0].loss, -1 / E20, rtol=1e-5)
    # +100, A = 1: clipped at 1.2, and the gradient is 0, not 0 * inf = NaN
    out, logp = loss_of([100.0], [1.0])
    out.loss.backward()
    close(out.loss, -1.2)
    assert logp.grad.item() == 0.0


def test_kl_k3_clamps_the_log_ratio_to_plus_minus_20():
    # d = ref - logp clamped: d = 20 -> e^20 - 21; d = -20 -> e^-20 + 19
    close(kl_k3(torch.zeros(2), torch.tensor([100.0, -100.0])), [E20 - 21, 1 / E20 + 19], 1e-5)


def test_without_beta_the_loss_ignores_even_an_infinite_kl():
    # k1 against a reference that gives the token probability 0: KL inf, reported as is
    out, _ = loss_of(
        [math.log(1.5)], [1.0], ref_logprobs=torch.tensor([[-math.inf]]), kl_estimator="k1"
    )
    close(out.loss, -1.2)
    assert out.kl.item() == math.inf


def test_the_loss_takes_the_dtype_of_the_logprobs_not_of_the_advantages():
    logp = torch.zeros(1, 1, requires_grad=True)
    out = clipped_policy_loss(
        logp, torch.zeros(1, 1), torch.ones(1, dtype=torch.float64), torch.ones(1, 1)
    )
    assert out.loss.dtype == torch.float32


def test_the_kl_is_on_the_device_of_the_logprobs():
    meta = {"device": "meta"}
    out = clipped_policy_loss(
        torch.zeros(1, 2, **meta),
        torch.zeros(1, 2, **meta),
        torch.zeros(1, **meta),
        torch.ones(1, 2, **meta),
    )
    assert out.kl.device.type == "meta"


# --- truncated importance weights ------------------------------------------------------


def test_is_weights_clamp_the_log_ratio_and_truncate_strictly_above_the_cap():
    # per token old - sampler: 100 -> ratio e^20 (not inf), weight the cap 2;
    # -100 -> ratio and weight e^-20; 0 -> ratio 1, weight 1
    old = torch.tensor([[100.0, -100.0, 0.0]])
    weights, stats = truncated_is_weights(old, torch.zeros(1, 3), torch.ones(1, 3), 2.0)
    close(weights, [[2.0, 1 / E20, 1.0]], rtol=1e-5)
    close(stats["is_ratio_mean"], (E20 + 1 / E20 + 1) / 3, rtol=1e-5)
    close(stats["is_truncated_fraction"], 1 / 3)
    # a ratio equal to the cap is not truncated; any cap > 0 is allowed
    weights, stats = truncated_is_weights(
        torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 1.0
    )
    assert weights.tolist() == [[1.0, 1.0]] and stats["is_truncated_fraction"].item() == 0.0
    weights, _ = truncated_is_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 0.5)
    assert weights.tolist() == [[0.5, 0.5]]


@pytest.mark.parametrize("shape", [(2, 3), (2, 0)])
def test_is_weights_without_tokens_give_zero_statistics(shape):
    weights, stats = truncated_is_weights(
        torch.ones(shape), torch.zeros(shape), torch.zeros(shape), 2.0
    )
    assert weights.shape == shape and not weights.any()
    assert {k: v.item() for k, v in stats.items()} == {
        "logprob_diff_max": 0.0,
        "is_ratio_mean": 0.0,
        "is_truncated_fraction": 0.0,
    }


# --- registry --------------------------------------------------------------------------


def test_a_registered_loss_is_weighted_by_sequences_unless_told_tokens():
    def loss(*args, **kwargs):
        raise AssertionError("never called")

    try:
        register_policy_loss("test_by_sequences")(loss)
        register_policy_loss("test_by_tokens", weight="tokens")(loss)
        assert MICRO_BATCH_WEIGHTS["test_by_sequences"] == "sequences"
        assert MICRO_BATCH_WEIGHTS["test_by_tokens"] == "tokens"
    finally:
        for name in ("test_by_sequences", "test_by_tokens"):
            POLICY_LOSSES.pop(name, None)
            MICRO_BATCH_WEIGHTS.pop(name, None)

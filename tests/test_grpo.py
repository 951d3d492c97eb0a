"""Hand-computed checks of the GRPO advantages, KL estimator and policy losses."""

import math

import pytest
import torch

from agentgym.learn.grpo import (
    POLICY_LOSSES,
    clipped_policy_loss,
    entropy_from_logprobs,
    get_policy_loss,
    group_advantages,
    kl_k3,
    masked_mean,
    register_policy_loss,
    zero_variance_fraction,
)

LN2 = math.log(2.0)


def close(actual: torch.Tensor, expected: list | float, atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        actual.detach().to(torch.float64),
        torch.tensor(expected, dtype=torch.float64),
        atol=atol,
        rtol=0,
    )


# --- advantages ---------------------------------------------------------------


def test_group_advantages_population_std():
    # Group 1: mean 0.5; population var = 4 * 0.5^2 / 4 = 0.25, std 0.5 -> (1 - 0.5)/0.5 = 1.
    # Group 2: all equal -> 0.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    close(group_advantages(rewards, 4), [1, -1, -1, 1, 0, 0, 0, 0])


def test_group_advantages_uses_population_not_unbiased_std():
    # [1, 0]: population std 0.5 -> +-1 (the unbiased std 0.7071 would give +-0.7071).
    close(group_advantages(torch.tensor([1.0, 0.0]), 2), [1, -1])


def test_nan_reward_gets_zero_and_is_left_out_of_group_stats():
    # Scored [1, 0, 1]: mean 2/3; var = ((1/3)^2 + (2/3)^2 + (1/3)^2) / 3 = 2/9, std = sqrt(2)/3.
    # 1 -> (1/3) / (sqrt(2)/3) = 1/sqrt(2); 0 -> (-2/3) / (sqrt(2)/3) = -sqrt(2).
    rewards = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    s = 1 / math.sqrt(2)
    close(group_advantages(rewards, 4), [s, 0.0, -math.sqrt(2), s])


def test_groups_with_fewer_than_two_scored_rewards_get_zero():
    nan = float("nan")
    rewards = torch.tensor([nan, nan, nan, 5.0, nan, nan])
    assert torch.equal(group_advantages(rewards, 3), torch.zeros(6))


def test_equal_rewards_give_exact_zero_despite_rounding():
    # 0.1 is inexact in float32, so the mean can differ from 0.1 by an ulp;
    # that noise must not be divided by eps.
    for n in (3, 7, 10):
        assert torch.equal(group_advantages(torch.full((n,), 0.1), n), torch.zeros(n))


def test_integer_rewards_are_accepted():
    close(group_advantages(torch.tensor([1, 0]), 2), [1, -1])


def test_dr_grpo_advantages_skip_std():
    # [1, 0, 0, 1] - mean 0.5.
    close(
        group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, scale="none"),
        [0.5, -0.5, -0.5, 0.5],
    )


def test_n_not_multiple_of_group_size_is_an_error():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="multiple of group_size"):
        zero_variance_fraction(torch.zeros(6), 4)


def test_zero_variance_fraction():
    # Groups: [1,0,0,1] varies; [0,0,0,0] flat; [1,1,nan,1] flat once NaN is ignored -> 2/3.
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0, 1, 1, float("nan"), 1])
    assert zero_variance_fraction(rewards, 4) == pytest.approx(2 / 3)


def test_unscorable_samples_get_zero_and_stay_out_of_the_group_stats():
    # The 5.0 is unscorable. Scored [1, 0, 1]: mean 2/3; var = ((1/3)^2 + (2/3)^2 +
    # (1/3)^2) / 3 = 2/9, std = sqrt(2)/3. 1 -> (1/3) / (sqrt(2)/3) = 1/sqrt(2);
    # 0 -> (-2/3) / (sqrt(2)/3) = -sqrt(2). (With the 5.0 in, the mean would be 7/4.)
    rewards = torch.tensor([1.0, 0.0, 5.0, 1.0])
    scorable = torch.tensor([True, True, False, True])
    s = 1 / math.sqrt(2)
    close(group_advantages(rewards, 4, scorable=scorable), [s, -math.sqrt(2), 0.0, s])


def test_unscorable_samples_stay_out_of_the_batch_std():
    # Group 1 [1, 3]: mean 2, centred [-1, 1]. Group 2 [2, 9 unscorable]: one scored
    # sample, so 0 throughout. Batch std over the scored {1, 3, 2}: mean 2,
    # var (1 + 1 + 0) / 3 = 2/3, std sqrt(2/3) = 0.81650 -> +-1 / 0.81650 = +-1.22474.
    rewards = torch.tensor([1.0, 3.0, 2.0, 9.0])
    scorable = torch.tensor([True, True, True, False])
    a = 1 / math.sqrt(2 / 3)
    close(group_advantages(rewards, 2, scale="batch", scorable=scorable), [-a, a, 0.0, 0.0])


def test_unscorable_samples_without_scaling():
    # Scored [2, 4, 6]: mean 4 -> [-2, 0, 2]; the unscorable 100 gets 0.
    rewards = torch.tensor([2.0, 4.0, 100.0, 6.0])
    scorable = torch.tensor([True, True, False, True])
    close(group_advantages(rewards, 4, scale="none", scorable=scorable), [-2, 0, 0, 2])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_an_all_scorable_mask_changes_nothing(scale):
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(0))
    rewards[5] = float("nan")
    plain = group_advantages(rewards, 4, scale=scale)
    masked = group_advantages(rewards, 4, scale=scale, scorable=torch.ones(12, dtype=torch.bool))
    assert torch.equal(plain, masked)


def test_zero_variance_fraction_ignores_unscorable_samples():
    # [1, 0 unscorable, 1, 1] is flat once the 0 is left out; [0, 1, 1, 1] varies -> 1/2.
    rewards = torch.tensor([1.0, 0, 1, 1, 0, 1, 1, 1])
    scorable = torch.tensor([True, False, True, True, True, True, True, True])
    assert zero_variance_fraction(rewards, 4, scorable=scorable) == 0.5
    assert zero_variance_fraction(rewards, 4) == 0.0


def test_a_scorable_mask_of_the_wrong_shape_is_an_error():
    with pytest.raises(ValueError, match=r"scorable must be \[N=4\] like rewards, got \(2,\)"):
        group_advantages(torch.zeros(4), 2, scorable=torch.ones(2, dtype=torch.bool))


# --- KL ----------------------------------------------------------------------


def test_kl_k3_known_values():
    # logp = ln 0.5, ref = ln 0.25: d = ln 0.5, k3 = 0.5 - ln 0.5 - 1 = ln 2 - 0.5 = 0.19315.
    # logp = ln 0.25, ref = ln 0.5: d = ln 2,   k3 = 2 - ln 2 - 1 = 1 - ln 2 = 0.30685.
    # equal log-probs: k3 = 1 - 0 - 1 = 0.
    logp = torch.log(torch.tensor([0.5, 0.25, 0.3]))
    ref = torch.log(torch.tensor([0.25, 0.5, 0.3]))
    close(kl_k3(logp, ref), [LN2 - 0.5, 1 - LN2, 0.0])


# --- policy losses -------------------------------------------------------------

# A 2x3 example with epsilon = 0.2, old log-prob -1 everywhere, logp = -1 + ln(ratio).
#   row 0: A = +1, mask [1, 1, 0], ratios [1.0, 1.5, -]
#     t0: -min(1*1, 1*1) = -1                      (unclipped)
#     t1: -min(1.5*1, 1.2*1) = -1.2                (clipped: ratio > 1.2 with A > 0)
#   row 1: A = -2, mask [1, 1, 1], ratios [0.5, 1.0, 2.0]
#     t0: -min(0.5*-2, 0.8*-2) = -(-1.6) = 1.6     (clipped: ratio < 0.8 with A < 0)
#     t1: -min(-2, -2) = 2                         (unclipped)
#     t2: -min(2*-2, 1.2*-2) = -(-4) = 4           (unclipped: PPO has no upper clip for A < 0)
# grpo:       row means -2.2/2 = -1.1 and 7.6/3; mean = (-3.3 + 7.6)/6 = 4.3/6
# token_mean: (-1 - 1.2 + 1.6 + 2 + 4) / 5 = 5.4/5 = 1.08
# dr_grpo:    row sums -2.2 and 7.6, each / T=3, mean over rows = 5.4/6 = 0.9
# clip fraction: 2 clipped of 5 masked tokens = 0.4
RATIOS = [[1.0, 1.5, 1.0], [0.5, 1.0, 2.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
ADV = [1.0, -2.0]


def example(ratios=RATIOS, mask=MASK, adv=ADV):
    old = torch.full((len(ratios), len(ratios[0])), -1.0)
    logp = (old + torch.log(torch.tensor(ratios))).requires_grad_(True)
    return logp, old, torch.tensor(adv), torch.tensor(mask)


@pytest.mark.parametrize(
    ("name", "expected"), [("grpo", 4.3 / 6), ("token_mean", 1.08), ("dr_grpo", 0.9)]
)
def test_loss_value_on_hand_example(name, expected):
    out = get_policy_loss(name)(*example(), epsilon=0.2)
    close(out.loss, expected)
    close(out.policy_loss, expected)
    close(out.clip_fraction, 0.4)
    close(out.kl, 0.0)


def test_grpo_gradient_on_hand_example():
    # d/dlogp of -ratio*A is -A*ratio, times the token's weight 1/(2 rows * row's tokens):
    #   row 0 t0: -1 * 1 / (2*2) = -0.25;  t1 clipped -> 0;  t2 masked -> 0
    #   row 1 t0 clipped -> 0;  t1: 2 * 1 / (2*3) = 1/3;  t2: 2 * 2 / 6 = 2/3
    logp, old, adv, mask = example()
    get_policy_loss("grpo")(logp, old, adv, mask, epsilon=0.2).loss.backward()
    close(logp.grad, [[-0.25, 0.0, 0.0], [0.0, 1 / 3, 2 / 3]])


def test_token_mean_gradient_on_hand_example():
    # Every masked token weighs 1/5: -1*1/5 = -0.2; 2*1/5 = 0.4; 2*2/5 = 0.8; clipped -> 0.
    logp, old, adv, mask = example()
    get_policy_loss("token_mean")(logp, old, adv, mask, epsilon=0.2).loss.backward()
    close(logp.grad, [[-0.2, 0.0, 0.0], [0.0, 0.4, 0.8]])


def test_ratio_above_clip_with_positive_advantage_has_zero_gradient():
    # ratio 1.5 > 1.2, A = +1: loss -min(1.5, 1.2) = -1.2, gradient 0, counted as clipped.
    logp, old, adv, mask = example([[1.5]], [[1.0]], [1.0])
    out = clipped_policy_loss(logp, old, adv, mask, epsilon=0.2)
    out.loss.backward()
    close(out.loss, -1.2)
    close(logp.grad, [[0.0]])
    close(out.clip_fraction, 1.0)


def test_ratio_below_clip_with_positive_advantage_is_not_clipped():
    # ratio 0.5 < 0.8, A = +1: -min(0.5, 0.8) = -0.5; gradient -A*ratio = -0.5; not clipped.
    logp, old, adv, mask = example([[0.5]], [[1.0]], [1.0])
    out = clipped_policy_loss(logp, old, adv, mask, epsilon=0.2)
    out.loss.backward()
    close(out.loss, -0.5)
    close(logp.grad, [[-0.5]])
    close(out.clip_fraction, 0.0)


def test_epsilon_high_widens_only_the_upper_clip():
    # ratio 1.25, A = +1: clipped at 1.2 by default (-1.2), inside 1.28 with epsilon_high.
    close(clipped_policy_loss(*example([[1.25]], [[1.0]], [1.0]), epsilon=0.2).loss, -1.2)
    out = clipped_policy_loss(*example([[1.25]], [[1.0]], [1.0]), epsilon=0.2, epsilon_high=0.28)
    close(out.loss, -1.25)


@pytest.mark.parametrize("name", ["grpo", "token_mean", "dr_grpo"])
@pytest.mark.parametrize("garbage", [-1e4, 1e4, float("nan"), float("inf")])
def test_masked_positions_affect_neither_loss_nor_gradient(name, garbage):
    loss_fn = get_policy_loss(name)
    logp, old, adv, mask = example()
    ref = logp.detach() - 0.1
    base = loss_fn(logp, old, adv, mask, ref_logprobs=ref, epsilon=0.2, beta=0.1)
    base.loss.backward()

    logp2, old2, _, _ = example()
    with torch.no_grad():  # row 0 token 2 is the only masked position
        logp2[0, 2] = garbage
    old2[0, 2], ref2 = -garbage, ref.clone()
    ref2[0, 2] = garbage
    out = loss_fn(logp2, old2, adv, mask, ref_logprobs=ref2, epsilon=0.2, beta=0.1)
    out.loss.backward()

    assert torch.equal(out.loss, base.loss)
    assert torch.equal(logp2.grad, logp.grad)
    assert logp2.grad[0, 2] == 0.0


def test_kl_term_on_hand_example():
    # ratio 1 and A = 0, so the surrogate is 0. ref = logp + ln 0.5 on t0, = logp on t1:
    # k3 = [ln2 - 0.5, 0]; grpo row mean kl = (ln2 - 0.5)/2; loss = 0.1 * that.
    logp, old, adv, mask = example([[1.0, 1.0]], [[1.0, 1.0]], [0.0])
    ref = logp.detach() + torch.tensor([[-LN2, 0.0]])
    out = clipped_policy_loss(logp, old, adv, mask, ref_logprobs=ref, beta=0.1)
    close(out.kl, (LN2 - 0.5) / 2)
    close(out.loss, 0.1 * (LN2 - 0.5) / 2)
    close(out.policy_loss, 0.0)


def test_beta_zero_ignores_ref_in_loss_but_reports_kl():
    logp, old, adv, mask = example()
    ref = logp.detach() - 1.0
    without = clipped_policy_loss(logp, old, adv, mask)
    with_ref = clipped_policy_loss(logp, old, adv, mask, ref_logprobs=ref, beta=0.0)
    assert torch.equal(with_ref.loss, without.loss)
    # d = -1 on every token: k3 = e^-1 + 1 - 1 = e^-1, so any mean of it is e^-1.
    close(with_ref.kl, math.exp(-1))


def test_beta_without_ref_is_an_error():
    with pytest.raises(ValueError, match="ref_logprobs"):
        clipped_policy_loss(*example(), beta=0.04)


def test_sequence_without_loss_tokens_contributes_zero():
    # row 0: A = 1, ratio 1, two tokens -> mean -1; row 1 has no tokens -> 0. grpo: (-1 + 0)/2.
    logp, old, adv, mask = example([[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [0.0, 0.0]], [1.0, 3.0])
    out = clipped_policy_loss(logp, old, adv, mask)
    out.loss.backward()
    close(out.loss, -0.5)
    close(logp.grad, [[-0.25, -0.25], [0.0, 0.0]])


def test_batch_without_loss_tokens_gives_zero_not_nan():
    for name in POLICY_LOSSES:
        logp, old, adv, mask = example([[1.0, 1.0]], [[0.0, 0.0]], [1.0])
        out = get_policy_loss(name)(logp, old, adv, mask, ref_logprobs=old, beta=0.1)
        out.loss.backward()
        assert out.loss.item() == 0.0 and out.clip_fraction.item() == 0.0
        assert torch.equal(logp.grad, torch.zeros_like(logp))


def test_shape_mismatch_is_an_error():
    logp, old, adv, mask = example()
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        clipped_policy_loss(logp, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="advantages"):
        clipped_policy_loss(logp, old, adv[:1], mask)


# --- registry ----------------------------------------------------------------


def test_unknown_policy_loss_lists_registered_names():
    with pytest.raises(ValueError, match="grpo") as info:
        get_policy_loss("ppo_typo")
    assert "dr_grpo" in str(info.value) and "token_mean" in str(info.value)


def test_register_policy_loss_adds_and_refuses_duplicates():
    try:

        @register_policy_loss("test_dummy")
        def dummy(*args, **kwargs):
            raise AssertionError("never called")

        assert get_policy_loss("test_dummy") is dummy
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("test_dummy")(dummy)
    finally:
        POLICY_LOSSES.pop("test_dummy", None)


# --- helpers -----------------------------------------------------------------


def test_masked_mean():
    # (1 + 3) / 2 = 2, NaN under the mask is ignored; nothing selected -> 0.
    x = torch.tensor([1.0, float("nan"), 3.0])
    close(masked_mean(x, torch.tensor([1, 0, 1])), 2.0)
    close(masked_mean(x, torch.zeros(3)), 0.0)
    # per row: [1, 3] -> 2; [] -> 0
    x2 = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    close(masked_mean(x2, torch.tensor([[1, 1], [0, 0]]), dim=-1), [2.0, 0.0])


def test_entropy_from_logprobs():
    # uniform over 4: ln 4.  probs [1/4, 3/4] (logits [0, ln 3]):
    # -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.25*1.386294 + 0.75*0.287682 = 0.562335.
    # one-hot through -inf logits: 0.
    inf = float("inf")
    logits = torch.tensor(
        [[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -inf, -inf], [3.0, -inf, -inf, -inf]]],
        requires_grad=True,
    )
    h = entropy_from_logprobs(torch.log_softmax(logits, dim=-1))
    close(h, [[math.log(4.0), 0.562335, 0.0]])
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


# --- the loss options of issue 7, by hand ---------------------------------------------


def test_batch_and_no_reward_scaling():
    # G = 4: group means 0.25 and 0.75, centred [.75 -.25 -.25 -.25 | .25 .25 .25 -.75];
    # the batch's rewards have mean 0.5 and population std 0.5.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    close(group_advantages(rewards, 4, scale="batch"), [1.5, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -1.5])
    close(
        group_advantages(rewards, 4, scale="none"),
        [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75],
    )
    with pytest.raises(ValueError, match="scale"):
        group_advantages(rewards, 4, scale="rank")


def test_trls_unbiased_std_and_eps_by_hand():
    # G = 4, rewards [1 0 0 0]: centred [.75 -.25 -.25 -.25], squares sum to 0.75: the
    # population std is sqrt(0.75 / 4) = 0.4330127, the unbiased one sqrt(0.75 / 3) = 0.5.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    close(group_advantages(rewards, 4)[:4], [0.75 / 0.4330127, *[-0.25 / 0.4330127] * 3])
    close(group_advantages(rewards, 4, unbiased=True), [1.5, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -1.5])
    trl = group_advantages(rewards, 4, 1e-4, unbiased=True)  # TRL: / (std + 1e-4)
    close(trl[:2], [0.75 / 0.5001, -0.25 / 0.5001])
    # the batch of 8 has mean 0.5 and squares summing to 2: unbiased std sqrt(2 / 7)
    batch = group_advantages(rewards, 4, scale="batch", unbiased=True)
    close(batch[:2], [0.75 / (2 / 7) ** 0.5, -0.25 / (2 / 7) ** 0.5])


def test_dr_grpo_divides_by_a_constant_not_the_width():
    # The hand example's row sums are -2.2 and 7.6: mean 2.7, / 10 = 0.27 whatever the width.
    out = get_policy_loss("dr_grpo")(*example(), epsilon=0.2, max_tokens=10)
    close(out.loss, 0.27)


@pytest.mark.parametrize(("name", "expected"), [("bnpo", 1.08), ("dapo", 1.08)])
def test_bnpo_and_dapo_are_token_means_of_a_micro_batch(name, expected):
    from agentgym.learn.grpo import MICRO_BATCH_WEIGHTS

    close(get_policy_loss(name)(*example(), epsilon=0.2).loss, expected)
    # they differ in how the learner weighs micro-batches: dapo by tokens (a token mean
    # over the whole batch), bnpo by sequences (each micro-batch's own token mean)
    assert MICRO_BATCH_WEIGHTS[name] == {"bnpo": "sequences", "dapo": "tokens"}[name]
    assert get_policy_loss("token_mean") is get_policy_loss("dapo")


def test_sequence_level_importance_ratio_on_hand_example():
    # log-ratios 0.1 and 0.3: the sequence's mean 0.2, ratio e^0.2 = 1.2214 on both tokens;
    # A = +1, epsilon 0.2: clipped at 1.2 on both, loss -1.2, no gradient.
    logp, old, adv, mask = example([[math.exp(0.1), math.exp(0.3)]], [[1.0, 1.0]], [1.0])
    out = clipped_policy_loss(logp, old, adv, mask, epsilon=0.2,
                              importance_sampling_level="sequence")  # fmt: skip
    close(out.loss, -1.2)
    close(out.clip_fraction, 1.0)
    out.loss.backward()
    close(logp.grad, [[0.0, 0.0]])
    # per token instead: -min(e^0.1, e^0.1) and -1.2 (clipped): mean -(1.10517 + 1.2) / 2
    token = clipped_policy_loss(*example([[math.exp(0.1), math.exp(0.3)]], [[1.0, 1.0]], [1.0]),
                                epsilon=0.2)  # fmt: skip
    close(token.loss, -(math.exp(0.1) + 1.2) / 2)


def test_sequence_level_gradient_spreads_over_the_sequence():
    # log-ratios +0.05 and -0.05: mean 0, ratio 1, A = 2, unclipped; loss -2 and
    # d/dlogp_t = -A * ratio * (1/T) = -1 on each token (seq-mean of equal terms).
    logp, old, adv, mask = example([[math.exp(0.05), math.exp(-0.05)]], [[1.0, 1.0]], [2.0])
    out = clipped_policy_loss(logp, old, adv, mask, epsilon=0.2,
                              importance_sampling_level="sequence")  # fmt: skip
    close(out.loss, -2.0)
    out.loss.backward()
    close(logp.grad, [[-1.0, -1.0]])


def test_k1_kl_estimator_on_hand_example():
    from agentgym.learn.grpo import kl_k1

    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    close(kl_k1(logp, ref), [0.5, -1.0])
    # as the KL term of a loss: ratio 1, A = 0, beta 0.1 -> loss = 0.1 * mean k1 = -0.025
    logp2, old, adv, mask = example([[1.0, 1.0]], [[1.0, 1.0]], [0.0])
    ref2 = logp2.detach() + torch.tensor([[-0.5, 1.0]])
    out = clipped_policy_loss(logp2, old, adv, mask, ref_logprobs=ref2, beta=0.1,
                              kl_estimator="k1")  # fmt: skip
    close(out.loss, 0.1 * (0.5 - 1.0) / 2)
    with pytest.raises(ValueError, match="kl_estimator"):
        clipped_policy_loss(logp2, old, adv, mask, ref_logprobs=ref2, kl_estimator="k2")

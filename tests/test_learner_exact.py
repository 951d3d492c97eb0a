"""What the learner passes on and how it cuts the work: options, prefix, micro-batches, chunks.

Written against the mutants `make mutate` found alive in `agentgym.learn.learner`. The
gradient itself is checked by test_learner_gradient.py; these tests pin what
leaves the values alone but must hold all the same: every config option
reaches the loss, the shared prefix runs once, micro-batches hold rows of one
length and weigh their metrics by their share, long selections go in chunks.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

import agentgym.learn.logprobs as learner_module
from agentgym.config import load_config
from agentgym.learn.grpo import clipped_policy_loss
from agentgym.learn.learner import Learner
from agentgym.learn.logprobs import backward_micro_batches, shared_prefix_length, token_logprobs
from agentgym.types import Batch

LENGTH, SHARED = 30, 20  # rows share their first 20 ids; the loss starts at column 16


def _config(**overrides):
    return load_config(overrides={"optim.max_grad_norm": 1e9, **overrides})


def _batch(vocab: int, n: int = 4, first: int = 16, seed: int = 0) -> Batch:
    """`n` unpadded rows sharing SHARED leading ids, trained from column `first` on."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, LENGTH), generator=g)
    ids[:, :SHARED] = ids[0, :SHARED].clone()
    mask = torch.zeros(n, LENGTH - 1)
    mask[:, first:] = 1.0
    old = -torch.rand(n, LENGTH - 1, generator=g) * mask
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5][:n])
    return Batch(ids, torch.ones(n, LENGTH, dtype=torch.long), mask, old, advantages)


def _record_decoder_calls(model) -> list[tuple[int, int]]:
    """The [rows, columns] of every input the model's decoder runs, in order."""
    calls = []

    def record(module, args, kwargs):
        calls.append(tuple(kwargs["input_ids"].shape))

    model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    return calls


def _learner(model, **overrides):
    reference = copy.deepcopy(model)
    learner = Learner(copy.deepcopy(model), _config(**overrides), reference=reference)
    return learner, _record_decoder_calls(learner.model), _record_decoder_calls(reference)


# --- the shared prefix ------------------------------------------------------------------


def test_shared_prefix_length_stops_at_the_first_trained_column_or_difference():
    batch = _batch(100)  # ids shared to column 20, trained from 16
    assert shared_prefix_length(batch) == 16
    ids = batch.input_ids.clone()
    ids[2, 9] = (ids[2, 9] + 1) % 100
    assert shared_prefix_length(replace(batch, input_ids=ids)) == 9
    assert shared_prefix_length(replace(batch, loss_mask=torch.zeros(4, LENGTH - 1))) == 0


def test_the_shared_prefix_runs_once_per_step_for_the_policy_and_the_reference(tiny):
    # a prefix of exactly MIN_SHARED_PREFIX = 16 columns is shared: one [1, 16] pass each,
    # then each micro-batch of 2 runs its suffix only
    learner, policy_calls, reference_calls = _learner(tiny[0], **{"optim.micro_batch_size": 2})
    assert learner.beta > 0
    learner.accumulate(_batch(len(tiny[1])))
    assert policy_calls == [(1, 16), (2, 14), (2, 14)]
    assert reference_calls == [(1, 16), (2, 14), (2, 14)]


def test_two_rows_share_their_prefix_too(tiny):
    # in micro-batches of one row, which would run whole if the step did not share it
    learner, policy_calls, reference_calls = _learner(tiny[0], **{"optim.micro_batch_size": 1})
    batch = _batch(len(tiny[1]), n=2)
    learner.accumulate(batch)
    assert policy_calls == [(1, 16), (1, 14), (1, 14)]
    assert reference_calls == [(1, 16), (1, 14), (1, 14)]
    policy_calls.clear()
    token_logprobs(learner.model, batch, 1.0)
    assert policy_calls == [(1, 16), (2, 14)]


def test_micro_batches_that_share_more_than_the_batch_run_their_own_prefix(tiny):
    # rows 0, 1 and rows 2, 3 share two different system prompts: nothing is shared by the
    # whole batch, but each micro-batch of 2 runs its own prefix once
    learner, policy_calls, reference_calls = _learner(tiny[0], **{"optim.micro_batch_size": 2})
    batch = _batch(len(tiny[1]))
    ids = batch.input_ids.clone()
    ids[2:, :SHARED] = (ids[2:, :SHARED] + 1) % len(tiny[1])
    learner.accumulate(replace(batch, input_ids=ids))
    assert policy_calls == [(1, 16), (2, 14), (1, 16), (2, 14)]
    assert reference_calls == [(1, 16), (2, 14), (1, 16), (2, 14)]


def test_backward_micro_batches_shares_the_prefix_unless_told_not_to(tiny):
    model = copy.deepcopy(tiny[0])
    calls = _record_decoder_calls(model)

    def loss_fn(micro, prefix):
        return token_logprobs(model, micro, 1.0, prefix)[0].sum(), None

    batch = _batch(len(tiny[1]))
    backward_micro_batches(model, batch, 2, loss_fn)
    assert calls == [(1, 16), (2, 14), (2, 14)]
    calls.clear()
    backward_micro_batches(model, batch, 2, loss_fn, share_prefix=False)
    # no prefix handed down: each micro-batch finds its own (token_logprobs shares by default)
    assert calls == [(1, 16), (2, 14), (1, 16), (2, 14)]


def test_a_batch_of_one_row_is_run_whole(tiny):
    learner, policy_calls, reference_calls = _learner(tiny[0], **{"optim.micro_batch_size": 2})
    learner.accumulate(_batch(len(tiny[1]), n=1))
    assert policy_calls == [(1, LENGTH)] and reference_calls == [(1, LENGTH)]


def test_token_logprobs_shares_the_prefix_unless_told_not_to(tiny):
    model = copy.deepcopy(tiny[0])
    calls = _record_decoder_calls(model)
    batch = _batch(len(tiny[1]))
    shared, _ = token_logprobs(model, batch, 1.0)
    assert calls == [(1, 16), (4, 14)]
    calls.clear()
    whole, _ = token_logprobs(model, batch, 1.0, share_prefix=False)
    assert calls == [(4, LENGTH)]
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-4)


# --- micro-batches ------------------------------------------------------------------------


def _ragged(vocab: int) -> Batch:
    """Rows of 12, 6, 10 and 8 tokens, right-padded to 12; advantages name the rows."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (4, 12), generator=g)
    attention = torch.zeros(4, 12, dtype=torch.long)
    for row, length in enumerate([12, 6, 10, 8]):
        attention[row, :length] = 1
    mask = attention[:, 1:].float()
    mask[:, :2] = 0.0
    return Batch(ids, attention, mask, torch.zeros(4, 11), torch.tensor([0.0, 1.0, 2.0, 3.0]))


def test_micro_batches_hold_rows_of_similar_length_and_select_keeps_some(tiny):
    model, tokenizer = tiny
    seen = []

    def loss_fn(micro, prefix):
        seen.append((micro.advantages[:, 0].tolist(), tuple(micro.input_ids.shape)))
        return token_logprobs(model, micro, 1.0, prefix)[0].sum(), None

    batch = _ragged(len(tokenizer))
    backward_micro_batches(model, batch, 2, loss_fn)
    # shortest first: rows 1 and 3 (6 and 8 tokens), then 2 and 0 (10 and 12)
    assert seen == [([1.0, 3.0], (2, 8)), ([2.0, 0.0], (2, 12))]
    seen.clear()
    backward_micro_batches(model, batch, 2, loss_fn, select=lambda micro: micro[1:])
    assert seen == [([2.0, 0.0], (2, 12))]
    model.zero_grad(set_to_none=True)


def test_metrics_are_weighted_by_each_micro_batch_s_share(tiny):
    # ratio 1 (old logprobs are the learner's own): each row's loss is -A; two micro-batches
    # of one row, each half the batch: -(2 + 0) / 2 = -1
    model, tokenizer = tiny
    learner = Learner(copy.deepcopy(model), _config(**{"optim.micro_batch_size": 1}))
    batch = _batch(len(tokenizer), n=2, seed=4)
    batch = replace(batch, old_logprobs=learner.old_logprobs(batch), advantages=torch.ones(2))
    batch = replace(batch, advantages=torch.tensor([2.0, 0.0]))
    assert learner.accumulate(batch)["loss/policy"] == pytest.approx(-1.0, abs=1e-5)


def test_a_batch_of_one_trained_token_weighs_it_fully_under_a_token_mean(tiny):
    model, tokenizer = tiny
    learner = Learner(copy.deepcopy(model), _config(**{"grpo.loss": "dapo"}))
    batch = _batch(len(tokenizer), n=1, seed=5)
    mask = torch.zeros_like(batch.loss_mask)
    mask[0, 20] = 1.0
    batch = replace(batch, loss_mask=mask, advantages=torch.tensor([1.0]))
    batch = replace(batch, old_logprobs=learner.old_logprobs(batch))
    assert learner.accumulate(batch)["loss/policy"] == pytest.approx(-1.0, abs=1e-5)


# --- the loss's options -------------------------------------------------------------------


def test_every_grpo_option_of_the_config_reaches_the_loss(tiny):
    model, tokenizer = tiny
    options = {"epsilon": 0.1, "epsilon_high": 0.3, "beta": 0.1, "kl_estimator": "k1"}
    config = _config(
        **{f"grpo.{k}": v for k, v in options.items()},
        **{"optim.micro_batch_size": 4, "sampling.temperature": 1.0},
    )
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.05)
    learner = Learner(copy.deepcopy(model), config, reference=reference)
    batch = _batch(len(tokenizer), first=4, seed=6)
    with torch.no_grad():
        logp = token_logprobs(learner.model, batch, 1.0)[0]
        ref = token_logprobs(reference, batch, 1.0)[0]
    # log-ratios +-0.15: ratios 1.16 and 0.86, clipped by 0.1 and 0.3 where 0.2 would not be
    sign = torch.ones_like(logp)
    sign[:, 1::2] = -1.0
    old = (logp - 0.15 * sign) * batch.loss_mask
    weights = 0.5 + torch.rand(logp.shape, generator=torch.Generator().manual_seed(7))
    batch = replace(batch, old_logprobs=old, is_weights=weights * batch.loss_mask)
    expected = clipped_policy_loss(
        logp,
        old,
        batch.advantages,
        batch.loss_mask,
        ref_logprobs=ref,
        is_weights=batch.is_weights,
        max_tokens=config.sampling.max_episode_tokens,
        **options,
    )
    totals = learner.accumulate(batch)
    assert totals["loss/policy"] == pytest.approx(expected.policy_loss.item(), abs=1e-5)
    assert totals["kl"] == pytest.approx(expected.kl.item(), abs=1e-5)
    assert totals["clip_fraction"] == pytest.approx(expected.clip_fraction.item(), abs=1e-6)
    assert 0.0 < expected.clip_fraction.item() < 1.0


# --- chunks -------------------------------------------------------------------------------


@pytest.mark.parametrize(("tokens", "chunks"), [(3, 0), (4, 2), (7, 3)])
def test_selections_past_the_logit_budget_go_through_the_head_in_chunks(
    tiny, monkeypatch, tokens, chunks
):
    model, tokenizer = tiny
    vocab = model.get_output_embeddings().weight.shape[0]
    batch = _batch(len(tokenizer), n=1)
    mask = torch.zeros_like(batch.loss_mask)
    mask[0, 10 : 10 + tokens] = 1.0
    batch = replace(batch, loss_mask=mask)
    whole, _ = token_logprobs(model, batch, 1.0)
    monkeypatch.setattr(learner_module, "LOGIT_BUDGET", 3 * vocab)  # 3 positions at a time
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return torch.utils.checkpoint.checkpoint(*args, **kwargs)

    monkeypatch.setattr(learner_module, "checkpoint", counting)
    chunked, _ = token_logprobs(model, batch, 1.0)
    assert len(calls) == chunks
    torch.testing.assert_close(chunked, whole)


def test_every_optim_option_reaches_adamw(tiny):
    options = {"optim.lr": 3e-4, "optim.weight_decay": 0.05, "optim.adam_epsilon": 1e-6}
    learner = Learner(copy.deepcopy(tiny[0]), _config(**options))
    (group,) = learner.optimizer.param_groups
    assert isinstance(learner.optimizer, torch.optim.AdamW)
    assert (group["lr"], group["weight_decay"], group["eps"]) == (3e-4, 0.05, 1e-6)

"""The padding-free learner (`optim.micro_batch_tokens`): rows packed into one sequence give
the logprobs and the gradient the padded learner gives, and token-budget micro-batches keep
to their budget."""

from __future__ import annotations

import copy

import pytest
import test_learner_gradient as plain
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_learner_gradient import float64_norms  # noqa: F401 (an autouse fixture)

from agentgym.learn.logprobs import run_prefix, token_logprobs
from agentgym.types import Batch

# Rows of lengths 44, 31, 38, 27 sharing an 18-token prefix: 26, 13, 20, 9 tokens each past it,
# shortest first 9 (row 3), 13 (row 1), 20 (row 2), 26 (row 0). The rows each budget's
# micro-batches hold, with the prefix run once (not counted) and without one (counted).
WITH_PREFIX = {26: [[3, 1], [2], [0]], 45: [[3, 1, 2], [0]], 68: [[3, 1, 2, 0]]}
WHOLE_ROWS = {60: [[3, 1], [2], [0]], 96: [[3, 1, 2], [0]]}


@pytest.fixture
def budgets(monkeypatch):
    """test_learner_gradient's check, its learner cutting micro-batches by a token budget
    (its `micro` argument) and its plain bnpo grouping rows as that budget does."""
    make = plain._config

    def with_budget(loss: str, budget: int, lora: bool):
        config = make(loss, 4, lora)
        config.optim.micro_batch_tokens = budget
        return config

    monkeypatch.setattr(plain, "_config", with_budget)
    monkeypatch.setattr(plain, "SPLITS", {**WITH_PREFIX, **WHOLE_ROWS})


@pytest.mark.parametrize("budget", sorted(WITH_PREFIX))
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("loss", plain.LOSSES)
def test_the_packed_gradient_equals_the_plain_loss_gradient(tiny, budgets, loss, lora, budget):
    plain._check(tiny, loss, budget, lora)


@pytest.mark.parametrize("budget", sorted(WHOLE_ROWS))
@pytest.mark.parametrize("loss", ["bnpo", "dapo"])
def test_without_a_shared_prefix_the_packed_gradient_is_the_same(tiny, budgets, loss, budget):
    plain._check(tiny, loss, budget, lora=False, shared=0)


def _rows_batch(tiny, shared: int) -> Batch:
    rows = plain._rows(tiny[0].config.vocab_size, shared)
    old = [torch.zeros(len(ids) - 1, dtype=torch.float64) for ids, _ in rows]
    return plain._batch(rows, old)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("with_prefix", [False, True], ids=["whole", "prefix"])
def test_packed_logprobs_equal_the_padded_ones(tiny, attention, with_prefix):
    model = copy.deepcopy(tiny[0]).double()
    model.set_attn_implementation(attention)
    batch = _rows_batch(tiny, plain.SHARED)
    prefix = run_prefix(model, batch.input_ids[:1, : plain.SHARED]) if with_prefix else None
    with torch.no_grad():
        padded, padded_entropy = token_logprobs(model, batch, 0.7, prefix)
        packed, packed_entropy = token_logprobs(model, batch, 0.7, prefix, True, True)
    assert batch.loss_mask.sum() > 0 and bool((packed != 0).any())
    # eager attention takes its softmax in float32 whatever the model's dtype: over a longer
    # row of keys (the packed ones, most masked) its sums round differently
    atol = 1e-12 if attention == "sdpa" else 1e-7
    torch.testing.assert_close(packed, padded, rtol=0, atol=atol)
    torch.testing.assert_close(packed_entropy, padded_entropy, rtol=0, atol=atol)
    for i in range(batch.size):  # and each row's are its own, as run alone
        alone = token_logprobs(model, batch._rows(torch.tensor([i])), 0.7, None, False)[0]
        width = alone.shape[1]
        torch.testing.assert_close(packed[i, :width], alone[0], rtol=0, atol=atol)


def _batch_of(lengths: list[int]) -> Batch:
    n, width = len(lengths), max(lengths)
    attention = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = attention * (torch.arange(n)[:, None] + 1)  # row i's ids are i + 1: trackable
    zeros = torch.zeros(n, width - 1)
    return Batch(ids, attention, zeros, zeros, torch.zeros(n))


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(2, 40), min_size=1, max_size=12),
    budget=st.integers(2, 120),
    skip=st.integers(0, 1),
    by_length=st.booleans(),
)
def test_token_budget_micro_batches_keep_to_the_budget(lengths, budget, skip, by_length):
    batch = _batch_of(lengths)
    micro_batches = batch.split_tokens(budget, skip, by_length)
    seen = []
    for micro in micro_batches:
        rows = [int(r[0]) - 1 for r in micro.input_ids]
        sizes = [lengths[r] - skip for r in rows]
        assert sum(sizes) <= budget or len(rows) == 1  # a row longer than the budget, alone
        assert micro.input_ids.shape[1] == max(lengths[r] for r in rows)  # trimmed
        seen += rows
    assert sorted(seen) == list(range(len(lengths)))  # every row once
    if by_length:
        assert [lengths[r] for r in seen] == sorted(lengths)
    else:
        assert seen == list(range(len(lengths)))
    # closed only when the next row would not fit
    for micro, after in zip(micro_batches, micro_batches[1:], strict=False):
        first_next = int(after.input_ids[0, 0]) - 1
        total = sum(lengths[int(r[0]) - 1] - skip for r in micro.input_ids)
        assert total + lengths[first_next] - skip > budget


def test_token_budget_hand_example():
    batch = _batch_of([5, 3, 8, 2])
    got = [[int(r[0]) - 1 for r in m.input_ids] for m in batch.split_tokens(10, by_length=True)]
    assert got == [[3, 1, 0], [2]]  # 2 + 3 + 5 = 10 fits; 8 does not join
    got = [[int(r[0]) - 1 for r in m.input_ids] for m in batch.split_tokens(7, skip=1)]
    assert got == [[0, 1], [2], [3]]  # in order: 4 + 2 = 6; 7 alone; 1


def test_a_packed_sft_step_takes_the_padded_one(tiny, monkeypatch):
    from agentgym.config import load_config
    from agentgym.sft import warmup
    from agentgym.sft.warmup import warm_up

    packed_calls = []

    def spy(*args):
        packed_calls.append(args[5])
        return token_logprobs(*args)

    monkeypatch.setattr(warmup, "token_logprobs", spy)

    model, tokenizer = tiny
    overrides = {"run.env": "tool_call", "sft.steps": 1, "sft.batch_size": 4,
                 "sft.demonstrations": 4, "optim.micro_batch_size": 2,
                 "run.env_kwargs": {"tool_format": "hermes"}}  # fmt: skip
    results = []
    for budget in (None, 300):
        config = load_config(overrides={**overrides, "optim.micro_batch_tokens": budget})
        trained, records = warm_up(copy.deepcopy(model).double(), tokenizer, config)
        results.append((records[0]["sft/loss"], dict(trained.named_parameters())))
    (padded_loss, padded), (packed_loss, packed) = results
    assert set(packed_calls) == {False, True}  # the second run packed its rows
    # float64, but RoPE's angles are taken in float32 (about 1e-8 of the loss here)
    assert packed_loss == pytest.approx(padded_loss, rel=1e-7)
    moved = [
        n for n in padded if not torch.equal(padded[n], dict(model.named_parameters())[n].double())
    ]
    assert moved  # the step moved the weights, so equal weights mean equal gradients
    for name, weight in padded.items():
        torch.testing.assert_close(packed[name], weight, rtol=0, atol=1e-9)

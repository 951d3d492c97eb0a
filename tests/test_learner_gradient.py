"""The gradient the Learner applies, against each loss written out plainly in float64.

The expected side runs every row alone and unpadded through the model, takes a
full-vocabulary log_softmax and types each loss's formula out: it imports no
agentgym helper, so a sign flip, a wrong micro-batch weight, a shifted mask or a
lost KL term in the learner (its micro-batches, length buckets, shared prefix,
chunks) shows as a difference. The learner's side is the gradient `Learner.step`
hands to the optimizer, captured by a step pre-hook.
"""

from __future__ import annotations

import copy

import pytest
import torch

from agentgym.config import load_config
from agentgym.learn.learner import Learner
from agentgym.types import Batch

TEMPERATURE = 0.7
EPS_LOW, EPS_HIGH = 0.2, 0.28
BETA = 0.05
MAX_TOKENS = 64  # Dr. GRPO's constant normaliser (sampling.max_episode_tokens)
ADVANTAGES = (1.0, -0.5, 0.25, -1.5)
LENGTHS = (44, 31, 38, 27)
SHARED = 18  # a system prompt every row starts with (>= the learner's MIN_SHARED_PREFIX)
# Batch.split(size, by_length=True) takes rows shortest first: lengths 27, 31, 38, 44.
SPLITS = {1: [[3], [1], [2], [0]], 2: [[3, 1], [2, 0]], 4: [[3, 1, 2, 0]]}


def _rms_norm_in_input_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture(autouse=True)
def float64_norms(monkeypatch):
    """Qwen2's RMSNorm computes in float32 whatever its input; in float64 here, or its rounding
    (1e-8 on the prefix's embeddings, summed in another order by the learner) hides the check."""
    from transformers.models.qwen2 import modeling_qwen2

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", _rms_norm_in_input_dtype)


def _rows(vocab: int, shared: int) -> list[tuple[list[int], list[int]]]:
    """Each row's ids and the positions t (0-based, < len - 1) whose target id t + 1 is trained:
    a first turn, then a tool result (not trained), then a second turn."""
    g = torch.Generator().manual_seed(11)
    head = torch.randint(3, vocab, (shared,), generator=g).tolist()
    rows = []
    for length in LENGTHS:
        ids = head + torch.randint(3, vocab, (length - shared,), generator=g).tolist()
        first = range(SHARED, SHARED + 3)
        second = range(SHARED + 6, length - 1)
        rows.append((ids, [*first, *second]))
    return rows


def _plain_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t + 1] | ids[:t + 1]) / T for every t: one unpadded forward, full vocabulary."""
    x = torch.tensor([ids])
    logits = model(input_ids=x).logits[0, :-1] / TEMPERATURE
    full = torch.log_softmax(logits, dim=-1)
    return full[torch.arange(len(ids) - 1), x[0, 1:]]


# Each row's sampler logprobs sit this far above the model's own: rows 0 and 3 mostly outside
# the clip range on the side where it bites (ratio > 1 + EPS_HIGH for A > 0, < 1 - EPS_LOW for
# A < 0), rows 1 and 2 inside it; sequence-level ratios too.
OLD_OFFSETS = (-0.3, 0.0, 0.1, 0.3)


def _old_logprobs(model, rows) -> list[torch.Tensor]:
    """The sampler's logprobs: the model's own, moved by each row's offset and by up to
    +-0.4 nats of noise per token."""
    g = torch.Generator().manual_seed(5)
    out = []
    with torch.no_grad():
        for (ids, _), offset in zip(rows, OLD_OFFSETS, strict=True):
            logp = _plain_logprobs(model, ids)
            noise = (torch.rand(logp.shape, generator=g, dtype=logp.dtype) - 0.5) * 0.8
            out.append(logp + offset + noise)
    return out


def _batch(rows, old: list[torch.Tensor]) -> Batch:
    width = max(len(ids) for ids, _ in rows)
    n = len(rows)
    ids = torch.zeros(n, width, dtype=torch.long)
    attention = torch.zeros(n, width, dtype=torch.long)
    loss_mask = torch.zeros(n, width - 1)
    old_logprobs = torch.zeros(n, width - 1, dtype=torch.float64)
    for i, (row, trained) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        loss_mask[i, trained] = 1.0
        old_logprobs[i, : len(row) - 1] = old[i]
    return Batch(ids, attention, loss_mask, old_logprobs, torch.tensor(ADVANTAGES))


def _token_terms(model, reference, rows, old, row: int, sequence_level: bool):
    """Row `row`'s per-token loss on its trained tokens: the clipped surrogate plus beta times
    the k3 KL to the reference, written out."""
    ids, trained = rows[row]
    logp = _plain_logprobs(model, ids)[trained]
    with torch.no_grad():
        if isinstance(reference, str):  # "adapters off": LoRA's reference is its base model
            with model.disable_adapter():
                ref = _plain_logprobs(model, ids)[trained]
        else:
            ref = _plain_logprobs(reference, ids)[trained]
    log_ratio = logp - old[row][trained]
    if sequence_level:  # GSPO: one ratio for the sequence, the exp of its mean log-ratio
        log_ratio = log_ratio.mean().expand(len(trained))
    ratio = torch.exp(log_ratio)
    a = ADVANTAGES[row]
    surrogate = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * a)
    d = ref - logp
    kl = torch.exp(d) - d - 1
    return surrogate + BETA * kl


def _plain_loss(loss: str, model, reference, rows, old, micro: int) -> torch.Tensor:
    sequence_level = loss == "gspo"
    terms = [_token_terms(model, reference, rows, old, i, sequence_level) for i in range(len(rows))]
    n = len(rows)
    if loss in ("grpo", "gspo"):  # mean over each sequence's tokens, then over sequences
        return sum(t.mean() for t in terms) / n
    if loss == "dr_grpo":  # each sequence's sum over a constant, then the mean over sequences
        return sum(t.sum() for t in terms) / MAX_TOKENS / n
    if loss == "dapo":  # every trained token of the batch counts once
        return torch.cat(terms).sum() / sum(len(t) for t in terms)
    if loss == "bnpo":  # a token mean within each micro-batch, weighted by its sequences
        return sum(
            torch.cat([terms[i] for i in group]).mean() * len(group) / n for group in SPLITS[micro]
        )
    raise AssertionError(loss)


def _config(loss: str, micro: int, lora: bool):
    overrides = {
        "grpo.loss": "grpo" if loss == "gspo" else loss,
        "grpo.importance_sampling_level": "sequence" if loss == "gspo" else "token",
        "grpo.beta": BETA,
        "grpo.epsilon": EPS_LOW,
        "grpo.epsilon_high": EPS_HIGH,
        "grpo.kl_estimator": "k3",
        "sampling.temperature": TEMPERATURE,
        "sampling.max_episode_tokens": MAX_TOKENS,
        "optim.micro_batch_size": micro,
        "optim.max_grad_norm": 1e9,
        "lora.enabled": lora,
        "lora.r": 4,
        "lora.dropout": 0.0,
    }
    return load_config(overrides=overrides)


def _perturbed(model, seed: int, std: float):
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return out


def _learner(tiny, loss: str, micro: int, lora: bool) -> tuple[Learner, object]:
    """A float64 learner, and its KL reference as the plain side sees it."""
    model = tiny[0]
    base = copy.deepcopy(model).double()
    config = _config(loss, micro, lora)
    if lora:
        torch.manual_seed(0)
        learner = Learner(base, config)
        learner.model.double()
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():  # B = 0 at initialisation would leave A without a gradient
            for name, p in learner.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
        return learner, "adapters off"
    reference = _perturbed(base, seed=4, std=0.02)  # a reference apart from the policy
    learner = Learner(base, config, reference=copy.deepcopy(reference))
    return learner, reference


def _applied_gradient(learner: Learner, batch: Batch) -> tuple[dict, dict]:
    """The gradients `step` hands to the optimizer, and the step's metrics."""
    seen: dict[str, torch.Tensor] = {}

    def capture(optimizer, args, kwargs):
        for name, p in learner.model.named_parameters():
            if p.grad is not None:
                seen[name] = p.grad.detach().clone()

    handle = learner.optimizer.register_step_pre_hook(capture)
    try:
        stats = learner.step(batch)
    finally:
        handle.remove()
    return seen, stats


def _plain_gradient(model, reference, rows, old, loss: str, micro: int) -> tuple[dict, float]:
    model.zero_grad(set_to_none=True)
    value = _plain_loss(loss, model, reference, rows, old, micro)
    value.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.requires_grad and p.grad is not None}  # fmt: skip
    model.zero_grad(set_to_none=True)
    return grads, float(value.detach())


def _check(tiny, loss: str, micro: int, lora: bool, shared: int = SHARED) -> None:
    learner, reference = _learner(tiny, loss, micro, lora)
    plain_model = copy.deepcopy(learner.model)  # the same weights, before the step moves them
    rows = _rows(tiny[0].config.vocab_size, shared)
    old = _old_logprobs(plain_model, rows)
    batch = _batch(rows, old)

    got, stats = _applied_gradient(learner, batch)
    want, _ = _plain_gradient(plain_model, reference, rows, old, loss, micro)

    trainable = {n for n, p in learner.model.named_parameters() if p.requires_grad}
    assert got, "the learner produced no gradient"
    assert set(got) == set(want) == trainable
    assert all(g.dtype == torch.float64 for g in got.values())
    nonzero = [n for n, g in got.items() if g.abs().max() > 0]
    assert len(nonzero) >= 0.75 * len(got), f"only {len(nonzero)} of {len(got)} grads non-zero"
    # some tokens clipped and some not, so both sides of the min are exercised
    assert 0.0 < stats["clip_fraction"] < 1.0, stats
    assert stats["kl"] > 0.0, stats
    for name in want:
        diff = float((got[name] - want[name]).abs().max())
        assert diff <= 1e-9, f"{name}: the learner's gradient is off by {diff:.3g}"


LOSSES = ["grpo", "bnpo", "dapo", "dr_grpo", "gspo"]


@pytest.mark.parametrize("micro", [1, 2, 4])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("loss", LOSSES)
def test_the_applied_gradient_equals_the_plain_loss_gradient(tiny, loss, lora, micro):
    _check(tiny, loss, micro, lora)


@pytest.mark.parametrize("loss", ["grpo", "dapo"])
def test_without_a_shared_prefix_the_gradient_is_the_same(tiny, loss):
    # rows differing from their first id: every row runs whole, no prefix cache
    _check(tiny, loss, micro=2, lora=False, shared=0)

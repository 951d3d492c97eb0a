"""The learner: a step moves the weights, accumulation is exact, LoRA's reference is free."""

from __future__ import annotations

import copy

import pytest
import torch

from agentgym.config import load_config
from agentgym.learn.learner import Learner
from agentgym.learn.logprobs import token_logprobs
from agentgym.types import Batch


def _batch(vocab: int, n: int = 4, length: int = 12, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, length), generator=g)
    attention = torch.ones(n, length, dtype=torch.long)
    attention[0, -3:] = 0  # one right-padded row
    mask = torch.zeros(n, length - 1)
    mask[:, 4:] = 1.0  # a 5-token prompt, then sampled tokens
    mask[0, -3:] = 0.0
    old = -torch.rand(n, length - 1, generator=g) * mask - 2.0 * mask
    return Batch(ids, attention, mask, old, torch.tensor([1.0, -1.0, 0.5, -0.5]))


def _config(**overrides):
    base = {"optim.max_grad_norm": 1e9, "optim.lr": 1e-3}
    return load_config(overrides={**base, **overrides})


def _grads(model, config, batch):
    """The gradient `step` hands to the optimizer (it zeroes the gradients after stepping)."""
    learner = Learner(copy.deepcopy(model), config)
    seen = {}

    def capture(optimizer, args, kwargs):
        seen.update({n: p.grad.clone() for n, p in learner.model.named_parameters()
                     if p.grad is not None})  # fmt: skip

    learner.optimizer.register_step_pre_hook(capture)
    learner.step(batch)
    assert seen and any(g.abs().max() > 0 for g in seen.values()), "no gradient to compare"
    return seen


def test_a_step_changes_the_weights_and_reports_finite_metrics(tiny):
    model, tokenizer = tiny
    learner = Learner(copy.deepcopy(model), _config())
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    stats = learner.step(_batch(len(tokenizer)))
    changed = [n for n, p in learner.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) > len(before) // 2
    assert set(stats) >= {"loss/policy", "kl", "clip_fraction", "entropy", "grad_norm"}
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    assert learner.reference is not None  # beta 0.04: a frozen copy
    assert all(torch.equal(p, before[n]) for n, p in learner.reference.named_parameters())


@pytest.mark.parametrize("loss", ["grpo", "token_mean"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny, loss):
    model, tokenizer = tiny
    batch = _batch(len(tokenizer))
    whole = _grads(model, _config(**{"grpo.loss": loss, "optim.micro_batch_size": 4}), batch)
    split = _grads(model, _config(**{"grpo.loss": loss, "optim.micro_batch_size": 1}), batch)
    assert whole.keys() == split.keys()
    for name in whole:
        assert torch.allclose(whole[name], split[name], atol=1e-6, rtol=1e-4), name


def test_lora_trains_adapters_only_and_uses_the_base_model_as_reference(tiny):
    model, tokenizer = tiny
    base = copy.deepcopy(model)
    batch = _batch(len(tokenizer))
    learner = Learner(copy.deepcopy(model), _config(**{"lora.enabled": True, "lora.r": 4}))
    assert learner.reference is None
    stats = learner.step(batch)
    trained = {n for n, p in learner.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    ref = learner._reference_logprobs(batch)
    with torch.no_grad():
        expected, _ = token_logprobs(base, batch, 1.0)
    assert torch.allclose(ref, expected, atol=1e-5)
    with torch.no_grad():
        current, _ = token_logprobs(learner.model, batch, 1.0)
    assert not torch.allclose(current, expected, atol=1e-6)  # the adapters moved the policy
    assert stats["kl"] == 0.0  # B = 0 at the first step: the policy was its reference
    assert learner.accumulate(batch)["kl"] > 0.0  # moved adapters: a KL to the base model


def test_beta_zero_loads_no_reference_and_reports_zero_kl(tiny):
    model, tokenizer = tiny
    learner = Learner(copy.deepcopy(model), _config(**{"grpo.beta": 0.0}))
    assert learner.reference is None
    assert learner.step(_batch(len(tokenizer)))["kl"] == 0.0


def test_token_logprobs_and_entropy_match_a_full_forward_pass(tiny):
    model, tokenizer = tiny
    batch = _batch(len(tokenizer))
    with torch.no_grad():
        logp, entropy = token_logprobs(model, batch, 0.8)
        logits = model(input_ids=batch.input_ids).logits[:, :-1].float() / 0.8
    full = torch.log_softmax(logits, -1)
    expected = full.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    selected = batch.loss_mask.bool()
    assert torch.allclose(logp[selected], expected[selected], atol=1e-5)
    expected_entropy = -(full.exp() * full).sum(-1)
    assert torch.allclose(entropy[selected], expected_entropy[selected], atol=1e-4)


def _prefixed_batch(vocab: int, shared: int = 20, n: int = 4, length: int = 40) -> Batch:
    """Rows sharing their first `shared` ids (a system prompt), right-padded, masked after it."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (n, length), generator=g)
    ids[:, :shared] = ids[0, :shared]
    attention = torch.ones(n, length, dtype=torch.long)
    attention[1, -7:] = 0
    mask = torch.zeros(n, length - 1)
    mask[:, shared + 3 : shared + 9] = 1.0  # a first turn
    mask[:, shared + 14 :] = 1.0  # a second turn, after a tool result
    mask[1, -7:] = 0.0
    return Batch(ids, attention, mask, torch.zeros(n, length - 1), torch.ones(n))


def test_a_shared_prefix_is_run_once_with_the_same_logprobs_and_gradients(tiny):
    from agentgym.learn.logprobs import shared_prefix_length

    model, tokenizer = tiny
    batch = _prefixed_batch(len(tokenizer))
    assert shared_prefix_length(batch) == 20
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    full = torch.log_softmax(logits[:, :-1].float(), -1)
    expected = full.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1) * batch.loss_mask
    (expected.sum()).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    logp, _ = token_logprobs(model, batch, 1.0)
    assert torch.allclose(logp, expected, atol=1e-5)
    assert logp[batch.loss_mask == 0].abs().max() == 0  # unselected positions cost nothing
    logp.sum().backward()
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    assert got.keys() == want.keys()
    for name, grad in want.items():
        assert torch.allclose(got[name], grad, atol=1e-5), name


def test_rows_that_differ_early_share_no_prefix(tiny):
    from agentgym.learn.logprobs import shared_prefix_length

    batch = _batch(len(tiny[1]))
    assert shared_prefix_length(batch) == 0


def test_the_shared_prefix_path_matches_a_full_forward_through_lora_adapters(tiny):
    from agentgym.learn.lora import wrap_lora as _wrap_lora

    model, tokenizer = tiny
    wrapped = _wrap_lora(copy.deepcopy(model), _config(**{"lora.enabled": True, "lora.r": 4}))
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.3)
    batch = _prefixed_batch(len(tokenizer))
    with torch.no_grad():
        logits = wrapped(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        full = torch.log_softmax(logits[:, :-1].float(), -1)
        expected = full.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1) * batch.loss_mask
        logp, _ = token_logprobs(wrapped, batch, 1.0)
        with wrapped.disable_adapter():
            ref, _ = token_logprobs(wrapped, batch, 1.0)
        plain, _ = token_logprobs(model, batch, 1.0)
    assert torch.allclose(logp, expected, atol=1e-5)
    assert torch.allclose(ref, plain, atol=1e-5)  # adapters off: the base model
    assert not torch.allclose(logp, plain, atol=1e-3)


def test_final_logit_softcapping_is_applied_after_the_head(tiny):
    model, tokenizer = tiny
    capped = copy.deepcopy(model)
    capped.config.final_logit_softcapping = 2.0
    batch = _prefixed_batch(len(tokenizer))
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        full = torch.log_softmax(torch.tanh(logits[:, :-1].float() / 2.0) * 2.0, -1)
        expected = full.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1) * batch.loss_mask
        logp, _ = token_logprobs(capped, batch, 1.0)
    assert torch.allclose(logp, expected, atol=1e-5)


@pytest.mark.parametrize("lora", [False, True])
def test_a_prefix_run_once_per_step_gives_the_gradient_of_unshared_micro_batches(
    tiny, lora, monkeypatch
):
    import agentgym.learn.logprobs as learner_module

    model, tokenizer = tiny
    batch = _prefixed_batch(len(tokenizer))
    batch = Batch(batch.input_ids, batch.attention_mask, batch.loss_mask,
                  -torch.rand(batch.loss_mask.shape) * batch.loss_mask,
                  torch.tensor([1.0, -1.0, 0.5, -0.5]))  # fmt: skip
    config = _config(**{"optim.micro_batch_size": 2, "lora.enabled": lora, "lora.r": 4})
    reference = copy.deepcopy(model)  # a full fine-tune's reference, apart from the policy
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(9)) * 0.02)

    def grads():
        torch.manual_seed(0)  # the same LoRA initialisation both times
        learner = Learner(copy.deepcopy(model), config, reference=reference)
        if lora:
            with torch.no_grad():
                for name, p in learner.model.named_parameters():
                    if "lora_B" in name:
                        p.normal_(std=0.3, generator=torch.Generator().manual_seed(len(name)))
        learner.optimizer.zero_grad(set_to_none=True)
        totals = learner.accumulate(batch)
        named = learner.model.named_parameters()
        return totals, {n: p.grad.clone() for n, p in named if p.grad is not None}

    shared_totals, shared = grads()
    monkeypatch.setattr(learner_module, "MIN_SHARED_PREFIX", 10**9)  # every row run whole
    plain_totals, plain = grads()
    assert shared.keys() == plain.keys() and len(shared) > 0
    for name in plain:
        assert torch.allclose(shared[name], plain[name], atol=1e-5, rtol=1e-4), name
    for key in plain_totals:
        assert shared_totals[key] == pytest.approx(plain_totals[key], abs=1e-5), key
    # the KL is not zero, so the reference prefix was used too
    assert plain_totals["kl"] > 0


def test_split_by_length_puts_rows_of_similar_length_together():
    ids = torch.arange(24).reshape(4, 6)
    attention = torch.tensor([[1] * 6, [1] * 2 + [0] * 4, [1] * 5 + [0], [1] * 3 + [0] * 3])
    batch = Batch(ids, attention, torch.ones(4, 5), torch.zeros(4, 5), torch.arange(4.0))
    micros = batch.split(2, by_length=True)
    # each row's advantages, per target position, follow it: row r's are all r here
    assert [m.advantages[:, 0].tolist() for m in micros] == [[1.0, 3.0], [2.0, 0.0]]
    assert [m.input_ids.shape[1] for m in micros] == [3, 6]  # each trimmed to its longest row
    assert [tuple(m.advantages.shape) for m in micros] == [(2, 2), (2, 5)]  # and its targets
    assert [m.advantages[:, 0].tolist() for m in batch.split(2)] == [[0.0, 1.0], [2.0, 3.0]]


def _trajectory(vocab: int, reward: float, truncated: bool, seed: int):
    from agentgym.types import Trajectory

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (12,), generator=g).tolist()
    mask = [0] * 5 + [1] * 7
    logps = [0.0] * 5 + (-torch.rand(7, generator=g) - 1.0).tolist()
    return Trajectory(task_id=f"t{seed // 2}", group=seed // 2, tokens=tuple(ids),
                      loss_mask=tuple(mask), logprobs=tuple(logps), prompt_length=5,
                      reward=reward, reward_parts={}, turns=(), finish_reason="stop",
                      truncated=truncated)  # fmt: skip


def test_the_update_drops_flat_groups_mask_truncated_episodes_and_iterate(tiny, monkeypatch):
    from step_records import update_stats

    model, tokenizer = tiny
    # two groups of two: group 0 rewards 1 and 0 (signal), group 1 rewards 1 and 1 (flat);
    # the second episode of group 0 was cut at the token budget
    rewards = [1.0, 0.0, 1.0, 1.0]
    trajs = [_trajectory(len(tokenizer), r, i == 1, i) for i, r in enumerate(rewards)]
    config = _config(**{"grpo.group_size": 2, "grpo.drop_zero_variance_groups": True,
                        "grpo.mask_truncated_completions": True,
                        "grpo.num_iterations": 3})  # fmt: skip
    learner = Learner(copy.deepcopy(model), config)
    seen = []
    real_step = learner.step
    monkeypatch.setattr(learner, "step", lambda batch, beta=None: seen.append(batch) or
                        real_step(batch, beta))  # fmt: skip
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    advantages = torch.tensor([1.0, -1.0, 0.0, 0.0])
    stats = update_stats(config, learner, trajs, torch.tensor(rewards), advantages, tokenizer,
                         None)  # fmt: skip
    assert stats["dropped_groups"] == 1.0
    assert len(seen) == 3 and all(b is seen[0] for b in seen)  # mu = 3 steps on one batch
    batch = seen[0]
    assert batch.size == 2  # the flat group left the batch
    assert batch.loss_mask[0].sum() == 7 and batch.loss_mask[1].sum() == 0  # truncated: masked
    assert torch.equal(batch.advantages[:, -1], torch.tensor([1.0, -1.0]))  # per sampled token
    changed = any(not torch.equal(p, before[n]) for n, p in learner.model.named_parameters())
    assert changed and set(stats) >= {"kl", "clip_fraction", "grad_norm"}


def test_an_update_with_every_group_flat_skips_the_learner(tiny):
    from step_records import update_stats

    model, tokenizer = tiny
    trajs = [_trajectory(len(tokenizer), 1.0, False, i) for i in range(4)]
    config = _config(**{"grpo.group_size": 2, "grpo.drop_zero_variance_groups": True})
    learner = Learner(copy.deepcopy(model), config)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    stats = update_stats(config, learner, trajs, torch.ones(4), torch.zeros(4), tokenizer, None)
    assert stats == {"dropped_groups": 2.0}
    assert all(torch.equal(p, before[n]) for n, p in learner.model.named_parameters())


def test_an_unknown_loss_name_is_refused_as_the_run_starts_with_the_registered_names():
    from agentgym.run.preflight import check_registered

    # the config takes any name: a user's loss registers when their module is imported
    config = _config(**{"grpo.loss": "ppo2"})
    with pytest.raises(Exception, match="grpo.loss: unknown loss 'ppo2'; registered: bnpo, dapo"):
        check_registered(config)


def test_chunked_vocabulary_projection_gives_the_same_logprobs_and_gradients(tiny, monkeypatch):
    import agentgym.learn.logprobs as learner_module

    model, tokenizer = tiny
    batch = _prefixed_batch(len(tokenizer))

    def run():
        model.zero_grad(set_to_none=True)
        logp, entropy = token_logprobs(model, batch, 0.7)
        (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logp.detach(), entropy, grads

    whole = run()
    # three positions per chunk: the 4 rows' ~60 selected positions take about 20 chunks
    monkeypatch.setattr(
        learner_module, "LOGIT_BUDGET", 3 * model.get_output_embeddings().weight.shape[0]
    )
    chunked = run()
    model.zero_grad(set_to_none=True)
    assert torch.allclose(whole[0], chunked[0], atol=1e-6)
    assert torch.allclose(whole[1], chunked[1], atol=1e-6) and whole[1].abs().sum() > 0
    assert whole[2].keys() == chunked[2].keys()
    for name, grad in whole[2].items():
        assert torch.allclose(chunked[2][name], grad, atol=1e-5, rtol=1e-5), (
            name,
            float((chunked[2][name] - grad).abs().max()),
            float(grad.abs().max()),
        )


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo"])  # bnpo depends on the buckets
def test_length_bucketed_micro_batches_equal_one_padded_batch(tiny, loss):
    # rows of very different lengths (a multi-turn batch): bucketing them two by two
    # must give the gradient of the whole batch padded to its longest row
    model, tokenizer = tiny
    lengths = [40, 9, 31, 14, 22, 12]
    g = torch.Generator().manual_seed(3)
    width = max(lengths)
    ids = torch.randint(3, len(tokenizer), (len(lengths), width), generator=g)
    attention = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    mask = attention[:, 1:].float()
    mask[:, :4] = 0.0  # a 5-token prompt
    old = -torch.rand(mask.shape, generator=g) * mask
    batch = Batch(ids, attention, mask, old, torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0]))
    options = {"grpo.loss": loss, "optim.micro_batch_size": len(lengths)}
    whole = _grads(model, _config(**options), batch)
    bucketed = _grads(model, _config(**{**options, "optim.micro_batch_size": 2}), batch)
    assert whole.keys() == bucketed.keys()
    for name in whole:
        assert torch.allclose(whole[name], bucketed[name], atol=1e-5, rtol=1e-4), name


def test_bf16_autocast_runs_the_model_in_bf16_and_the_loss_in_float32(tiny):
    """The GPU default (bf16 autocast) runs on the CPU too: the head's logits come out in
    bf16, the logprobs and the loss are taken in float32, and the gradient points where
    float32's does."""
    model, tokenizer = tiny
    batch = _batch(len(tokenizer))
    assert Learner(copy.deepcopy(model), _config()).autocast is None  # "auto" on a CPU
    fp32 = _grads(model, _config(**{"model.precision": "fp32"}), batch)
    learner = Learner(copy.deepcopy(model), _config(**{"model.precision": "bf16"}))
    assert learner.autocast == torch.bfloat16
    seen = []
    learner.model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(out.dtype)
    )
    learner.optimizer.zero_grad(set_to_none=True)
    stats = learner.accumulate(batch)
    assert seen and set(seen) == {torch.bfloat16}
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    assert learner.old_logprobs(batch).dtype == torch.float32
    bf16 = {n: p.grad for n, p in learner.model.named_parameters() if p.grad is not None}
    assert bf16.keys() == fp32.keys()
    assert all(g.dtype == torch.float32 for g in bf16.values())  # the weights stay float32
    a = torch.cat([bf16[n].flatten() for n in fp32])
    b = torch.cat([fp32[n].flatten() for n in fp32])
    cosine = float(a @ b / (a.norm() * b.norm()))
    assert 0.98 < cosine < 1.0, cosine  # close, and not float32's own gradient

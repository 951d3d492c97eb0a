"""The transformers policy: sampled ids, their logprobs, stop handling, seeding."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from agentgym.compat import cache_kwarg
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy, ReservedCache
from agentgym.policy.sampling import _draw, stream_uniforms


def _prompt(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


def _teacher_forced(model, prompt, ids, temperature):
    full = torch.tensor([prompt + list(ids)])
    with torch.no_grad():
        logits = model(full).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, full[0, len(prompt) :, None]).squeeze(-1)


def test_logprobs_match_a_teacher_forced_forward_pass(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    prompts = [_prompt(tokenizer, "What is 2 + 3?"), _prompt(tokenizer, "Add 12 and 30, please.")]
    for temperature in (1.0, 0.7):
        gens = policy.generate(
            prompts, SamplingParams(max_new_tokens=12, temperature=temperature, seed=1)
        )
        for prompt, gen in zip(prompts, gens, strict=True):
            assert len(gen.ids) == len(gen.logprobs) > 0
            expected = _teacher_forced(model, prompt, gen.ids, temperature)
            assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)


def test_same_seed_same_samples_and_different_seed_differs(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    prompts = [_prompt(tokenizer, "Compute 7 times 8.")] * 4
    a = policy.generate(prompts, SamplingParams(max_new_tokens=16, seed=3))
    b = policy.generate(prompts, SamplingParams(max_new_tokens=16, seed=3))
    c = policy.generate(prompts, SamplingParams(max_new_tokens=16, seed=4))
    assert [g.ids for g in a] == [g.ids for g in b]
    assert [g.ids for g in a] != [g.ids for g in c]
    # the four members of a group are sampled independently
    assert len({g.ids for g in a}) > 1


def test_stream_uniforms_are_uniform_repeatable_and_independent_across_streams():
    streams = np.arange(100_000, dtype=np.uint64)
    u = stream_uniforms(streams, 0).numpy()
    assert ((u >= 0) & (u < 1)).all()
    # 100,000 draws: the standard error of the mean is 0.0009, of a tenth's share 0.001
    assert abs(u.mean() - 0.5) < 0.004 and abs(u.var() - 1 / 12) < 0.003
    assert np.allclose(np.histogram(u, bins=10, range=(0, 1))[0] / len(u), 0.1, atol=0.005)
    assert np.array_equal(u, stream_uniforms(streams, 0).numpy())
    nxt = stream_uniforms(streams, 1).numpy()
    assert abs(np.corrcoef(u, nxt)[0, 1]) < 0.02  # index i and i+1 of a stream
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02  # neighbouring streams


def test_a_row_with_a_stream_samples_the_same_whatever_its_batch(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    prompts = [_prompt(tokenizer, "Compute 7 times 8."), _prompt(tokenizer, "Name a prime")]
    both = policy.generate(prompts, SamplingParams(max_new_tokens=12, seed=0), streams=[11, 12])
    alone = policy.generate(prompts[1:], SamplingParams(max_new_tokens=12, seed=5), streams=[12])
    assert both[1].ids == alone[0].ids  # logprobs agree up to batching's float noise
    assert np.allclose(both[1].logprobs, alone[0].logprobs, atol=1e-4)
    other = policy.generate(prompts[1:], SamplingParams(max_new_tokens=12, seed=0), streams=[13])
    assert other[0].ids != alone[0].ids
    with pytest.raises(ValueError, match="2 prompts"):
        policy.generate(prompts, SamplingParams(max_new_tokens=4), streams=[1])


def test_equal_streams_couple_two_nearby_policies_and_seeds_alone_do_not(tiny):
    model, tokenizer = tiny
    nudged, gen = copy.deepcopy(model), torch.Generator().manual_seed(0)
    with torch.no_grad():  # a nearly uniform random model: a small nudge moves its bins
        for p in nudged.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 3e-5)
    prompts = [_prompt(tokenizer, "Compute 7 times 8.")] * 16
    params = SamplingParams(max_new_tokens=8, seed=0)
    streams = list(range(16))
    a = HFPolicy(model, tokenizer).generate(prompts, params, streams)
    b = HFPolicy(nudged, tokenizer).generate(prompts, params, streams)
    c = HFPolicy(nudged, tokenizer).generate(prompts, SamplingParams(max_new_tokens=8, seed=1))
    coupled = sum(x.ids == y.ids for x, y in zip(a, b, strict=True))
    independent = sum(x.ids == y.ids for x, y in zip(a, c, strict=True))
    assert coupled >= 12 and independent <= 1, (coupled, independent)


def test_left_padding_gives_the_same_logprobs_as_an_unpadded_prompt(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    short, long = _prompt(tokenizer, "Hi"), _prompt(tokenizer, "A much longer question about sums")
    gens = policy.generate([short, long], SamplingParams(max_new_tokens=8, seed=0))
    expected = _teacher_forced(model, short, gens[0].ids, 1.0)
    assert torch.allclose(torch.tensor(gens[0].logprobs), expected, atol=1e-4)


def test_finish_reason_is_length_at_the_budget_and_stop_after_a_stop_token(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    prompt = _prompt(tokenizer, "Say something")
    gens = policy.generate([prompt] * 8, SamplingParams(max_new_tokens=5, seed=0))
    for gen in gens:
        if gen.finish_reason == "length":
            assert len(gen.ids) == 5 and not set(gen.ids) & policy.stop_ids
        else:
            assert gen.ids[-1] in policy.stop_ids and not set(gen.ids[:-1]) & policy.stop_ids
    # force a stop: make <|im_end|> overwhelmingly likely through the output bias
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    head = model.get_output_embeddings()
    saved = head.weight.data[stop_id].clone()
    try:
        head.weight.data[stop_id] = 50 * model.get_input_embeddings().weight.data.abs().max()
        forced = policy.generate(
            [prompt], SamplingParams(max_new_tokens=5, temperature=0.01, seed=0)
        )
    finally:
        head.weight.data[stop_id] = saved
    assert forced[0].finish_reason == "stop" and forced[0].ids[-1] == stop_id


def test_load_weights_copies_by_name_and_rejects_unknown_names(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    name, param = next(iter(model.named_parameters()))
    saved = param.detach().clone()
    try:
        policy.load_weights([(name, torch.zeros_like(param))])
        assert torch.count_nonzero(param) == 0
    finally:
        policy.load_weights([(name, saved)])
    try:
        policy.load_weights([("no.such.weight", saved)])
    except KeyError as err:
        assert "no.such.weight" in str(err)
    else:
        raise AssertionError("unknown weight name accepted")


def _long_prompts(tokenizer) -> list[list[int]]:
    system = "You are a careful assistant. " * 12

    def render(question):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)

    a, b = render("What is 2 + 3?"), render("Add twelve and thirty, then double it.")
    return [a, a, b, b]


def test_a_shared_prefix_is_prefilled_once_and_logprobs_still_match(tiny):
    model, tokenizer = tiny
    prompts = _long_prompts(tokenizer)
    policy = HFPolicy(model, tokenizer, min_shared_prefix=16)
    gens = policy.generate(prompts, SamplingParams(max_new_tokens=10, seed=2))
    for prompt, gen in zip(prompts, gens, strict=True):
        expected = _teacher_forced(model, prompt, gen.ids, 1.0)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)


def test_prefix_sharing_and_row_compaction_do_not_change_greedy_samples(tiny):
    model, tokenizer = tiny
    prompts = _long_prompts(tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=1e-4, seed=0)
    shared = HFPolicy(model, tokenizer, min_shared_prefix=16).generate(prompts, params)
    plain = HFPolicy(model, tokenizer, min_shared_prefix=10**9).generate(prompts, params)
    assert [g.ids for g in shared] == [g.ids for g in plain]
    solo = [HFPolicy(model, tokenizer).generate([p], params)[0] for p in prompts]
    assert [g.ids for g in shared] == [g.ids for g in solo]


def test_rows_that_stop_early_leave_the_batch_and_the_rest_stay_exact(tiny):
    model, tokenizer = tiny
    prompts = _long_prompts(tokenizer) * 2
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    head = model.get_output_embeddings()
    saved = head.weight.data[stop_id].clone()
    try:  # make the stop token likely, not certain: rows end at different steps
        head.weight.data[stop_id] = saved * 40
        gens = HFPolicy(model, tokenizer).generate(
            prompts, SamplingParams(max_new_tokens=12, seed=5)
        )
        lengths = {len(g.ids) for g in gens}
        assert len(lengths) > 1, lengths  # some rows left the batch before others
        for prompt, gen in zip(prompts, gens, strict=True):
            expected = _teacher_forced(model, prompt, gen.ids, 1.0)
            assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)
            assert (gen.finish_reason == "stop") == (gen.ids[-1] == stop_id)
    finally:
        head.weight.data[stop_id] = saved


def test_draw_follows_the_distribution_and_never_picks_a_zero_probability_id():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 0.0, 1.0]]).repeat(50_000, 1)
    ids = _draw(probs, torch.rand(len(probs), generator=torch.Generator().manual_seed(0)))
    first, second = ids[0::2], ids[1::2]
    freq = torch.bincount(first, minlength=4).float() / len(first)
    # 50,000 draws: the standard error of each share is under 0.0025
    assert torch.allclose(freq, torch.tensor([0.1, 0.0, 0.6, 0.3]), atol=0.01)
    assert freq[1] == 0 and bool((second == 3).all())


def test_a_cache_that_outgrows_its_capacity_keeps_every_position(tiny):
    model, tokenizer = tiny
    prompts = _long_prompts(tokenizer)
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        full = model(ids).logits[0]
        cache = ReservedCache(capacity=3)  # forces several doublings
        steps = [model(ids[:, :5], use_cache=True, **{cache_kwarg(model): cache}).logits[0]]
        for t in range(5, ids.shape[1]):
            out = model(ids[:, t : t + 1], use_cache=True, **{cache_kwarg(model): cache})
            steps.append(out.logits[0])
    assert cache.get_seq_length() == ids.shape[1]
    assert torch.allclose(torch.cat(steps), full, atol=1e-4)


def test_sampling_with_merged_adapters_matches_the_adapters_and_unmerges_after(tiny):
    import copy

    from agentgym.config import load_config
    from agentgym.learn.learner import Learner
    from agentgym.learn.logprobs import token_logprobs
    from agentgym.policy.hf import merged_adapters
    from agentgym.types import Batch

    model, tokenizer = tiny
    config = load_config(overrides={"lora.enabled": True, "lora.r": 4})
    peft = Learner(copy.deepcopy(model), config).model
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.3)
    before = {n: p.detach().clone() for n, p in peft.named_parameters()}
    prompt = _prompt(tokenizer, "What is 2 + 3?")
    with merged_adapters(peft):
        assert all(m.merged for m in peft.modules() if hasattr(m, "merged"))
        gen = HFPolicy(peft, tokenizer).generate(
            [prompt], SamplingParams(max_new_tokens=8, seed=1)
        )[0]
    # on exit: unmerged, every weight bitwise as before (peft's unmerge alone leaves
    # W + delta - delta, a rounding off W at about 1% of the elements)
    assert not any(m.merged for m in peft.modules() if hasattr(m, "merged"))
    for name, p in peft.named_parameters():
        assert torch.equal(p, before[name]), name
    ids = torch.tensor([prompt + list(gen.ids)])
    mask = torch.zeros(1, ids.shape[1] - 1)
    mask[0, len(prompt) - 1 :] = 1
    batch = Batch(ids, torch.ones_like(ids), mask, mask.clone(), torch.zeros(1))
    with torch.no_grad():
        logp, _ = token_logprobs(peft, batch, 1.0)
    assert torch.allclose(torch.tensor(gen.logprobs), logp[0, len(prompt) - 1 :], atol=1e-4)
    with torch.no_grad(), peft.disable_adapter():
        base, _ = token_logprobs(peft, batch, 1.0)
    assert not torch.allclose(logp, base, atol=1e-3)  # the adapters did change the samples' odds


def test_a_next_turn_continues_from_the_kept_cache_with_exact_logprobs(tiny, monkeypatch):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    prompts = _long_prompts(tokenizer)
    reply = tokenizer.encode("<tool_response>\n42\n</tool_response>", add_special_tokens=False)
    calls = []
    real = policy._prefill_reused
    monkeypatch.setattr(policy, "_prefill_reused", lambda *a: calls.append(a[1]) or real(*a))
    with policy.reusing_cache():
        first = policy.generate(prompts, SamplingParams(max_new_tokens=6, seed=1))
        # the next turn: each history, then a tool reply; one new prompt continues nothing
        turn2 = [p + list(g.ids) + reply for p, g in zip(prompts, first, strict=True)]
        turn2.append(_prompt(tokenizer, "A fresh question about 7 and 5"))
        second = policy.generate(turn2, SamplingParams(max_new_tokens=6, seed=2))
        assert policy._kept is not None and len(policy._kept) == len(turn2)  # kept for turn 3
    assert policy._kept is None  # nothing outlives the block
    assert len(calls) == 1 and sum(k is not None for k in calls[0]) == len(prompts)
    for prompt, gen in zip(turn2, second, strict=True):
        expected = _teacher_forced(model, prompt, gen.ids, 1.0)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)
    # without the block, the same call prefills everything and samples the same ids
    plain = HFPolicy(model, tokenizer).generate(turn2, SamplingParams(max_new_tokens=6, seed=2))
    assert [g.ids for g in plain] == [g.ids for g in second]


def test_a_stop_string_ends_the_completion_at_the_token_that_completes_it(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    prompt = _prompt(tokenizer, "Say something")
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    (whole,) = policy.generate([prompt], greedy)
    # a 3-character string that first appears when the k-th id is added, for some k > 2
    text = lambda k: tokenizer.decode(whole.ids[:k])  # noqa: E731
    k = next(k for k in range(3, len(whole.ids)) if text(k)[-3:] not in text(k - 1))
    stop = text(k)[-3:]
    (cut,) = policy.generate([prompt], replace(greedy, stop=(stop,)))
    assert cut.ids == whole.ids[:k] and cut.finish_reason == "stop"
    assert cut.logprobs == pytest.approx(whole.logprobs[:k], abs=1e-5)
    assert tokenizer.decode(cut.ids).endswith(stop)  # kept in the completion
    # a string that never comes changes nothing
    (same,) = policy.generate([prompt], replace(greedy, stop=("\u2603\u2603",)))
    assert same.ids == whole.ids and same.finish_reason == whole.finish_reason

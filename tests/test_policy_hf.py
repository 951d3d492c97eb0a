"""The transformers policy: sampled ids, their logprobs, stop handling, seeding."""

from __future__ import annotations

import torch

from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy


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

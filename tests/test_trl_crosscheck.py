"""Our losses against TRL's GRPOTrainer on the same ids, advantages and logprobs.

Both sides get one batch: equal-length prompts (no padding, so position ids
agree), right-padded completions, advantages, old logprobs that differ from
the current ones (so ratios leave 1 and some clip) and reference logprobs.
TRL computes its loss with `GRPOTrainer._compute_loss` on one copy of the
model; we compute ours with `token_logprobs` and the registered loss on
another. Loss and every parameter's gradient must agree within 1e-5.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip(
    "trl", reason="TRL is not installed (a dev dependency; make test-lowest leaves it out)"
)

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer

from agentgym.learn.grpo import get_policy_loss
from agentgym.learn.logprobs import token_logprobs
from agentgym.types import Batch

PROMPT, COMPLETION, ROWS = 6, 5, 4


def _inputs(vocab: int):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (ROWS, PROMPT), generator=g)
    completion = torch.randint(3, vocab, (ROWS, COMPLETION), generator=g)
    completion_mask = torch.ones(ROWS, COMPLETION, dtype=torch.long)
    completion_mask[1, 3:] = 0  # a short completion, right-padded
    completion_mask[3, 1:] = 0
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2])
    return prompt, completion, completion_mask, advantages


def _current_logprobs(model, prompt, completion, completion_mask):
    with torch.no_grad():
        return token_logprobs(model, _batch(prompt, completion, completion_mask), 1.0)[0][
            :, PROMPT - 1 :
        ]


def _batch(prompt, completion, completion_mask, old=None, advantages=None) -> Batch:
    ids = torch.cat([prompt, completion], dim=1)
    attention = torch.cat([torch.ones_like(prompt), completion_mask], dim=1)
    loss_mask = torch.zeros(ROWS, PROMPT + COMPLETION - 1)
    loss_mask[:, PROMPT - 1 :] = completion_mask.float()  # token j is predicted at j - 1
    old_full = torch.zeros_like(loss_mask)
    if old is not None:
        old_full[:, PROMPT - 1 :] = old
    adv = advantages if advantages is not None else torch.zeros(ROWS)
    return Batch(ids, attention, loss_mask, old_full, adv)


def _trl_trainer(model, tokenizer, tmp_path, **options) -> GRPOTrainer:
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=ROWS,
        num_generations=2,
        max_completion_length=COMPLETION,
        beta=0.0,  # no reference model is loaded; the loss takes ref logprobs from inputs
        report_to=[],
        use_cpu=True,
        bf16=False,
        temperature=1.0,
        use_bias_correction_kl=False,  # TRL's default weighs the KL by the ratio; GRPO does not
        **options,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["hi"] * ROWS}),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


CASES = [
    # (TRL loss_type, our loss, TRL options, beta)
    ("grpo", "grpo", {}, 0.04),
    ("bnpo", "bnpo", {}, 0.04),
    ("dr_grpo", "dr_grpo", {}, 0.04),
    ("dapo", "dapo", {"epsilon_high": 0.28}, 0.04),
    ("grpo", "grpo", {"importance_sampling_level": "sequence"}, 0.04),
    ("dapo", "dapo", {"importance_sampling_level": "sequence"}, 0.0),
]


@pytest.mark.parametrize(("trl_loss", "ours", "options", "beta"), CASES)
def test_loss_and_gradients_equal_trls(tiny, tmp_path, trl_loss, ours, options, beta):
    model, tokenizer = tiny
    prompt, completion, completion_mask, advantages = _inputs(len(tokenizer))
    current = _current_logprobs(model, prompt, completion, completion_mask)
    g = torch.Generator().manual_seed(1)
    old = current + (torch.rand(current.shape, generator=g) - 0.5) * 0.6
    ref = current + (torch.rand(current.shape, generator=g) - 0.5) * 0.4

    theirs_model = copy.deepcopy(model).train()
    trainer = _trl_trainer(theirs_model, tokenizer, tmp_path, loss_type=trl_loss, **options)
    trainer.beta = beta
    inputs = {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": completion_mask.sum(),
    }
    theirs = trainer._compute_loss(trainer.model, inputs)
    theirs.backward()

    ours_model = copy.deepcopy(model).train()
    batch = _batch(prompt, completion, completion_mask, old, advantages)
    logp, _ = token_logprobs(ours_model, batch, 1.0)
    ref_full = torch.zeros_like(batch.loss_mask)
    ref_full[:, PROMPT - 1 :] = ref
    out = get_policy_loss(ours)(
        logp, batch.old_logprobs, batch.advantages, batch.loss_mask, ref_logprobs=ref_full,
        epsilon=0.2, beta=beta, epsilon_high=options.get("epsilon_high"),
        importance_sampling_level=options.get("importance_sampling_level", "token"),
        max_tokens=COMPLETION,
    )  # fmt: skip
    out.loss.backward()

    assert float(out.loss.detach()) == pytest.approx(float(theirs.detach()), abs=1e-5)
    if "importance_sampling_level" not in options:
        assert float(out.clip_fraction) > 0  # some tokens clip: the clip is exercised too
    theirs_grads = dict(trainer.model.named_parameters())
    compared = 0
    for name, p in ours_model.named_parameters():
        if p.grad is None:
            continue
        other = theirs_grads[name].grad
        assert other is not None, name
        assert torch.allclose(p.grad, other, atol=1e-5), name
        compared += 1
    assert compared > 10

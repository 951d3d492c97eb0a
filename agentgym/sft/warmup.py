"""Supervised warm-up on each environment's own demonstrations (the tutorial's FAQ 1).

GRPO learns nothing from a group whose rewards are all equal, and a base model
that never writes the expected format earns the same reward every time. A short
SFT on correct episodes teaches the format first. Demonstrations are played
through the real environment by the real rollout, so their tokens and loss
mask are built exactly as in training: the loss covers the assistant's tokens
only, never the prompt or tool results.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch
from transformers import PreTrainedModel

from agentgym.config import Config
from agentgym.env.core import AgentEnv, make_env
from agentgym.learn.logprobs import Prefix, backward_micro_batches, token_logprobs
from agentgym.learn.lora import wrap_lora
from agentgym.policy.base import Generation, PolicyBase, SamplingParams
from agentgym.policy.turn_end import find_turn_end
from agentgym.rollout.episodes import TaskSpec, collect, use_chat_template
from agentgym.types import Batch, Trajectory


class ScriptPolicy(PolicyBase):
    """Plays fixed assistant turns, one per `generate` call, for a single episode; each
    turn ends with the chat template's turn end (`agentgym.policy.turn_end`), as a
    sampled one does."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tokenizer, self.turns, self.next = tokenizer, turns, 0
        self.end = list(find_turn_end(tokenizer).ids)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, streams=None
    ) -> list[Generation]:
        if len(prompts) != 1 or self.next >= len(self.turns):
            raise RuntimeError("a demonstration ran past its scripted turns")
        ids = self.tokenizer.encode(self.turns[self.next], add_special_tokens=False)
        ids += self.end
        self.next += 1
        return [Generation(tuple(ids), (0.0,) * len(ids), "stop")]

    def load_weights(self, named_tensors) -> None:
        raise NotImplementedError("a ScriptPolicy has no weights")


def demonstrations(config: Config, tokenizer, count: int, seed: int) -> list[Trajectory]:
    """`count` demonstration episodes of train tasks, tokenized as the rollout tokenizes."""
    env = make_env(config.run.env, **config.run.env_kwargs)
    try:
        out = []
        use_chat_template(env, tokenizer)  # the demonstrations are in the format it resolves
        for s in np.random.default_rng(seed).integers(0, 2**31 - 1, size=count):
            env.reset(seed=int(s))
            agent = cast(AgentEnv, env.unwrapped)  # make_env made an agent environment
            task = agent.task
            assert task is not None  # reset() loaded it
            policy = ScriptPolicy(tokenizer, agent.demonstration(task))
            spec = TaskSpec(task_id=task.task_id)
            out += collect([env], [spec], 1, policy, tokenizer, SamplingParams(max_new_tokens=1))
        return out
    finally:
        env.close()


def sft_loss(
    model,
    batch: Batch,
    prefix: Prefix | None = None,
    share_prefix: bool = True,
    packed: bool = False,
) -> torch.Tensor:
    """Mean negative log-likelihood of the batch's mask-1 (assistant) tokens (`packed`: the
    rows run as one sequence, without padding)."""
    logp, _ = token_logprobs(model, batch, 1.0, prefix, share_prefix, packed)
    return -(logp * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1)


def sft_optimizer(model: PreTrainedModel, config: Config) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable weights at `sft.lr`: SFT's, and RFT's across its rounds."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=config.sft.lr, eps=config.optim.adam_epsilon)


def sft_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    chosen: Sequence[Trajectory],
    pad_id: int,
    config: Config,
) -> dict[str, float]:
    """One optimizer step on the mean NLL of `chosen`'s mask-1 (sampled) tokens; returns
    its "sft/loss" and "grad_norm" (before clipping to `optim.max_grad_norm`).

    Micro-batches as the learner's (`optim.micro_batch_size`; `optim.micro_batch_tokens`
    packs them), each weighted by its share of the batch's tokens, so the gradient is the
    whole batch's. Under `model.gradient_checkpointing` no prefix is shared: a
    checkpointed layer drops the prefix's KV cache.
    """
    share = not config.model.gradient_checkpointing
    budget = config.optim.micro_batch_tokens
    batch = Batch.from_trajectories(chosen, torch.zeros(len(chosen)), pad_id)
    optimizer.zero_grad(set_to_none=True)
    tokens = batch.loss_mask.sum().clamp(min=1)

    def loss_fn(micro: Batch, prefix: Prefix | None):
        part = sft_loss(model, micro, prefix, share, budget is not None)
        part = part * (micro.loss_mask.sum() / tokens)
        return part, part.item()

    size = config.optim.micro_batch_size
    parts = backward_micro_batches(
        model, batch, size, loss_fn, share_prefix=share, micro_batch_tokens=budget
    )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, config.optim.max_grad_norm)
    optimizer.step()
    return {"sft/loss": sum(parts), "grad_norm": float(grad_norm)}


def warm_up(
    model, tokenizer, config: Config, advance=lambda: None, after_step=None
) -> tuple[PreTrainedModel, list[dict[str, float]]]:
    """Runs `config.sft.steps` SFT steps on demonstrations; returns (model, step records).

    With LoRA on, the adapters are trained and then merged into the weights, so
    the returned model is a plain model: GRPO's own adapters and its KL
    reference (the adapters switched off) then start from the SFT model.
    `advance()` is called after each step, and `after_step(model, record)` when given
    (a benchmark evaluates the model mid-way; the record's seconds are the step's).
    Each step is `sft_step`.
    """
    s = config.sft
    model = wrap_lora(model, config) if config.lora.enabled else model
    demos = demonstrations(config, tokenizer, s.demonstrations, config.run.seed)
    optimizer = sft_optimizer(model, config)
    rng = np.random.default_rng(config.run.seed)
    was_training = model.training
    model.train()
    records = []
    for step in range(1, s.steps + 1):
        start = time.perf_counter()
        chosen = [demos[i] for i in rng.choice(len(demos), size=s.batch_size)]
        done = sft_step(model, optimizer, chosen, tokenizer.pad_token_id, config)
        records.append({"step": step, **done, "step_seconds": time.perf_counter() - start})
        advance()
        if after_step is not None:
            after_step(model, records[-1])
            model.train()
    model.train(was_training)
    if config.lora.enabled:
        model = model.merge_and_unload()
    return model, records


def long_config(config: Config, sft_seconds: Sequence[float], grpo_seconds: float) -> Config:
    """The config of the closing table's `sft-long` SFT: `sft.long` steps, or under 'wall'
    SFT's steps and as many more as fit in GRPO's training seconds at SFT's mean step
    time; with a fresh demonstration for each row it trains on (at least `demonstrations`)."""
    s = config.sft
    if s.long == "wall":
        per_step = sum(sft_seconds) / max(len(sft_seconds), 1)
        steps = s.steps + math.ceil(grpo_seconds / per_step) if per_step > 0 else s.steps
    else:
        steps = int(s.long)
    demos = max(s.demonstrations, steps * s.batch_size)
    sft = s.model_copy(update={"steps": steps, "demonstrations": demos})
    return config.model_copy(update={"sft": sft})

"""`distributed.learner: fsdp` in `agentgym train`: the whole weights rank 0 samples with and saves.

FSDP shards the learner's weights in place (`dist.fully_shard_model`), so under
torchrun no rank holds the model whole, and rank 0 can neither generate with it
nor save it. Rank 0 therefore keeps a whole copy (`unsharded_copy`), taken before
the learner shards the model, and after every learner step (all
`grpo.num_iterations` of them) gets the trainable weights into it, gathered from
every rank (`dist.share_weights`). Only trainable weights move: with LoRA, the
adapters alone, since the frozen base never changes. The copy is then the
sampler, and what checkpoints save (`RunState.model`), in the format one process
writes; the optimizer state is gathered whole only when a checkpoint is written
(`dist.share_state`).

The copy needs one device that holds the whole model: FSDP here saves the
learner's memory (gradients, optimizer state, the KL reference), not the sampler's.
"""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from agentgym.config import Config
from agentgym.learn.lora import wrap_lora
from agentgym.scale import dist


def sharded(config: Config) -> bool:
    """Whether the learner shards its weights: `distributed.learner` 'fsdp' in a process
    group of more than one (in one process it is the plain learner)."""
    return dist.active() and config.distributed.learner == "fsdp"


def unsharded_copy(model: PreTrainedModel, config: Config) -> PreTrainedModel:
    """A whole copy of `model`, taken before the learner shards it, shaped as the learner
    holds it (LoRA adapters of the same names) and in the same mode (train).

    Its adapters are not the learner's: `dist.share_weights` brings those. The global
    RNG is left as it was, so that the run draws what a DDP run draws.
    """
    whole = copy.deepcopy(model)
    if config.lora.enabled:
        devices = [whole.device] if whole.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            whole = wrap_lora(whole, config)
    return whole.train()

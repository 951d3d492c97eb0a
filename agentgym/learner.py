"""One optimizer step of GRPO over a Batch: micro-batches, accumulation, clipping.

The learner recomputes the policy's logprobs of the batch's tokens (logits
divided by the sampling temperature, as the sampler drew them), takes the
loss from `agentgym.grpo`'s registry, and steps AdamW. The KL reference is a
frozen copy of the initial weights, or, with LoRA, the same model with its
adapters switched off (no second copy); with beta = 0 there is none.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from transformers import PreTrainedModel

from agentgym import grpo
from agentgym.config import Config
from agentgym.types import Batch


def token_logprobs(model, batch: Batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs [N, L-1] of each target token, and the entropy [N, L-1] of its distribution.

    Logits are computed only from the first column any row's loss mask selects
    (`logits_to_keep`), so prompt positions cost no vocabulary projection; the
    columns before it read 0. The entropy is detached: it is a metric.
    """
    width = batch.loss_mask.shape[1]
    active = batch.loss_mask.any(dim=0).nonzero()
    first = int(active[0]) if len(active) else 0
    keep = torch.arange(first, width, device=batch.input_ids.device)
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep)
    logsm = torch.log_softmax(out.logits.float() / temperature, dim=-1)
    targets = batch.input_ids[:, first + 1 :]
    kept = logsm.gather(-1, targets[..., None]).squeeze(-1)
    logp = torch.cat([kept.new_zeros(batch.size, first), kept], dim=1)
    with torch.no_grad():
        entropy = torch.zeros_like(logp)
        entropy[:, first:] = grpo.entropy_from_logprobs(logsm)
    return logp, entropy


def _wrap_lora(model: PreTrainedModel, config: Config) -> PreTrainedModel:
    from peft import LoraConfig, get_peft_model

    lora = config.lora
    peft_config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)


class Learner:
    """Holds the trained model, its optimizer and the KL reference.

    Args:
        model: The policy model; wrapped with LoRA adapters when config.lora.enabled.
        config: The run's config (grpo, optim, lora, sampling and model sections).
    """

    def __init__(self, model: PreTrainedModel, config: Config):
        self.config = config
        self.model = _wrap_lora(model, config) if config.lora.enabled else model
        self.model.train()
        self.reference = None
        if config.grpo.beta > 0 and not config.lora.enabled:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.loss_fn = grpo.get_policy_loss(config.grpo.loss)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.optim.lr, weight_decay=config.optim.weight_decay
        )
        self.autocast = self._autocast_dtype()

    def _autocast_dtype(self) -> torch.dtype | None:
        precision = self.config.model.precision
        device = next(self.model.parameters()).device
        has_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        if precision == "bf16" or (precision == "auto" and has_bf16):
            return torch.bfloat16
        return None

    def _forward_context(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        device_type = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device_type, dtype=self.autocast)

    @torch.no_grad()
    def _reference_logprobs(self, batch: Batch) -> torch.Tensor | None:
        if self.config.grpo.beta == 0:
            return None
        temperature = self.config.sampling.temperature
        with self._forward_context():
            if self.reference is not None:
                return token_logprobs(self.reference, batch, temperature)[0]
            with self.model.disable_adapter():
                return token_logprobs(self.model, batch, temperature)[0]

    def _weight(self, micro: Batch, whole: Batch) -> float:
        """This micro-batch's share of the whole batch's loss."""
        if self.config.grpo.loss == "token_mean":
            return float(micro.loss_mask.sum() / whole.loss_mask.sum().clamp(min=1))
        return micro.size / whole.size

    def step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step over the whole batch; returns the step's learner metrics."""
        device = next(self.model.parameters()).device
        totals = {"loss/policy": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0}
        self.optimizer.zero_grad(set_to_none=True)
        for micro in batch.split(self.config.optim.micro_batch_size):
            micro = _to(micro, device)
            weight = self._weight(micro, batch)
            for key, value in self._backward(micro, weight).items():
                totals[key] += value * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], self.config.optim.max_grad_norm
        )
        self.optimizer.step()
        return {**totals, "grad_norm": float(grad_norm)}

    def _backward(self, micro: Batch, weight: float) -> dict[str, float]:
        ref = self._reference_logprobs(micro)
        with self._forward_context():
            logp, entropy = token_logprobs(self.model, micro, self.config.sampling.temperature)
        out = self.loss_fn(
            logp,
            micro.old_logprobs,
            micro.advantages,
            micro.loss_mask,
            ref_logprobs=ref,
            epsilon=self.config.grpo.epsilon,
            beta=self.config.grpo.beta,
        )
        (out.loss * weight).backward()
        return {
            "loss/policy": float(out.policy_loss),
            "kl": float(out.kl),
            "clip_fraction": float(out.clip_fraction),
            "entropy": float(grpo.masked_mean(entropy, micro.loss_mask)),
        }

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The trained weights by name, for `Policy.load_weights`."""
        return ((n, p.detach()) for n, p in self.model.named_parameters() if p.requires_grad)


def _to(batch: Batch, device: torch.device) -> Batch:
    if batch.input_ids.device == device:
        return batch
    return Batch(
        *(
            t.to(device)
            for t in (
                batch.input_ids,
                batch.attention_mask,
                batch.loss_mask,
                batch.old_logprobs,
                batch.advantages,
            )
        )
    )

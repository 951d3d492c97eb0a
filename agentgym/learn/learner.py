"""One optimizer step of GRPO over a Batch: micro-batches, accumulation, clipping.

The learner recomputes the policy's logprobs of the batch's tokens
(`agentgym.learn.logprobs`: logits divided by the sampling temperature, as the
sampler drew them), takes the loss from `agentgym.learn.grpo`'s registry, and
steps AdamW under the learning-rate schedule. A step whose loss or gradient
norm is not finite changes nothing: its update is skipped and reported
(`skipped`). The KL reference is a frozen copy of the initial weights, or, with
LoRA, the same model with its adapters switched off (no second copy); with
beta = 0 there is none.

Under torchrun (more than one process) every rank holds the learner and steps
it on the same whole batch. The batch is cut into micro-batches exactly as in
one process, and each rank runs every world_size-th of them, each weighted by
its share of the whole batch; the gradients (summed over the ranks) and the
metrics are then those of one process, up to the order of float additions, for
every loss. `distributed.learner` "ddp" keeps a full replica on each rank and
sums the gradients with all-reduce, as DistributedDataParallel does, but
without its wrapper: DDP's hooks only fire inside its own forward, which the
learner's passes (decoder and head called apart, the shared prefix run once
and backpropagated last) never go through. "fsdp" shards the weights, the
gradients and the optimizer state with FSDP2 (`fully_shard`) over each decoder
layer and the rest; it runs no shared prefix (the gradient reaching a layer
through the prefix's cached keys and values bypasses FSDP's hooks), and ranks
with fewer micro-batches run empty ones, since every pass gathers weights from
all ranks.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import torch
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from agentgym import records
from agentgym.config import Config
from agentgym.learn import dist, grpo, logprobs
from agentgym.learn.logprobs import (
    Prefix,
    backward_micro_batches,
    run_prefix,
    shared_prefix_length,
    token_logprobs,
)
from agentgym.learn.lora import wrap_lora
from agentgym.types import Batch

T = TypeVar("T")

LOSS_METRICS = (records.LOSS, records.KL, records.CLIP_FRACTION, records.ENTROPY)
"""The metrics of a step's loss, each a sum over micro-batches weighted by their share."""


def _has_adapters(model: PreTrainedModel) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def lr_factor(config: Config, done: int) -> float:
    """The learning rate's multiplier after `done` optimizer steps: linear warm-up from 0
    over `optim.warmup_steps`, then constant, or a linear or half-cosine decay to 0 at
    the run's last optimizer step (the schedules of transformers' Trainer)."""
    warmup, total = config.optim.warmup_steps, config.run.steps * config.grpo.num_iterations
    if done < warmup:
        return done / warmup
    if config.optim.lr_scheduler == "constant":
        return 1.0
    progress = min(1.0, (done - warmup) / max(1, total - warmup))
    if config.optim.lr_scheduler == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class Learner:
    """Holds the trained model, its optimizer and schedule, and the KL reference.

    Args:
        model: The policy model; wrapped with LoRA adapters when config.lora.enabled
            (unless it is a peft model already: a resumed run loads its adapters first).
        config: The run's config (grpo, optim, lora, sampling, model and run sections).
        reference: The KL reference of a full fine-tune, when it is not `model` as
            given (a resumed run passes the model it started from); LoRA runs ignore it.

    Under torchrun, every rank builds its learner at the same point: the
    weights are then copied from rank 0's (as DistributedDataParallel does), and
    sharded when `sharded` (`distributed.learner` "fsdp").
    """

    def __init__(
        self, model: PreTrainedModel, config: Config, reference: PreTrainedModel | None = None
    ):
        self.config = config
        wrap = config.lora.enabled and not _has_adapters(model)
        self.model = wrap_lora(model, config) if wrap else model
        self.model.train()
        dist.broadcast_module(self.model)
        self.sharded = dist.active() and config.distributed.learner == "fsdp"
        self.reference = None
        self.beta = config.grpo.beta
        needs_reference = max(config.grpo.beta, config.grpo.beta_start or 0.0) > 0
        if needs_reference and not config.lora.enabled:
            frozen = reference if reference is not None else copy.deepcopy(model)
            if reference is not None:
                dist.broadcast_module(frozen)
            self.reference = frozen.eval().requires_grad_(False)
        self.data_parallel = dist.active() and not self.sharded
        # DistributedDataParallel's module runs `fn(model, *args)` as a Runner does
        self._ddp = dist.data_parallel(self.model) if self.data_parallel else None
        self._run: Runner = self._ddp or _runner(self.model, self.sharded)
        self._run_reference = self._run
        if self.reference is not None:
            self._run_reference = _runner(self.reference, self.sharded)
        # a prefix run apart goes back through the model outside FSDP's and DDP's hooks,
        # and checkpointed layers drop the cache it is handed in: then rows run whole
        self.share_prefix = not (self.sharded or self.data_parallel or _checkpointing(self.model))
        self.loss_fn = grpo.get_policy_loss(config.grpo.loss)
        params = [p for p in self.model.parameters() if p.requires_grad]
        optim = config.optim
        self.optimizer = torch.optim.AdamW(
            params, lr=optim.lr, weight_decay=optim.weight_decay, eps=optim.adam_epsilon
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda done: lr_factor(config, done)
        )
        self.autocast = self._autocast_dtype()
        self.packed = config.optim.micro_batch_tokens is not None
        """Rows run packed, without padding (`optim.micro_batch_tokens`)."""

    def _autocast_dtype(self) -> torch.dtype | None:
        precision = self.config.model.precision
        device = next(self.model.parameters()).device
        has_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        if precision == "bf16" or (precision == "auto" and has_bf16):
            return torch.bfloat16
        return None

    def _forward_context(self) -> contextlib.AbstractContextManager[object]:
        if self.autocast is None:
            return contextlib.nullcontext()
        device_type = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device_type, dtype=self.autocast)

    @torch.no_grad()
    def _reference_prefix(self, ids: torch.Tensor) -> Prefix | None:
        if self.beta == 0:
            return None
        with self._forward_context(), self._as_reference() as run:
            return run(run_prefix, ids)

    @torch.no_grad()
    def _reference_logprobs(
        self, batch: Batch, prefix: Prefix | None = None
    ) -> torch.Tensor | None:
        if self.beta == 0:
            return None
        temperature = self.config.sampling.temperature
        with self._forward_context(), self._as_reference() as run:
            args = (batch, temperature, prefix, self.share_prefix, self.packed)
            return run(token_logprobs, *args)[0]

    @contextlib.contextmanager
    def _as_reference(self) -> Iterator[Runner]:
        """Yields what runs a function of the reference model (see `_runner`)."""
        if self.reference is not None:
            yield self._run_reference
        else:
            # no reference copy: the model is a peft model, typed as the PreTrainedModel it
            # wraps, whose attributes torch types as Tensor | Module
            with self.model.disable_adapter():  # type: ignore[operator]
                yield self._run

    def _weight(self, micro: Batch, whole: Batch) -> float:
        """This micro-batch's share of the whole batch's loss."""
        if grpo.LOSSES[self.config.grpo.loss].weight == "tokens":
            # token counts are exact in float32; their ratio is taken in float64
            return float(micro.loss_mask.sum()) / max(1.0, float(whole.loss_mask.sum()))
        return micro.size / whole.size

    def step(self, batch: Batch, beta: float | None = None) -> dict[str, float]:
        """One optimizer step over the whole batch; returns the step's learner metrics.

        `beta` sets the KL coefficient from this step on (the beta schedule).
        """
        if beta is not None:
            self.beta = beta
        self.optimizer.zero_grad(set_to_none=True)
        totals = self.accumulate(batch)
        norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], self.config.optim.max_grad_norm
        )
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        finite = math.isfinite(grad_norm) and all(math.isfinite(v) for v in totals.values())
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()  # the schedule follows steps taken, skipped or not
        return {
            **totals,
            records.GRAD_NORM: grad_norm,
            records.LR: lr,
            records.SKIPPED: float(not finite),
        }

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's and the schedule's state, and the KL coefficient, for a checkpoint.

        When `sharded`, the optimizer state is gathered whole, as one process has it
        (`dist.full_optimizer_state`): every rank must call this, in step.
        """
        optimizer = (
            dist.full_optimizer_state(self.model, self.optimizer)
            if self.sharded
            else self.optimizer.state_dict()
        )
        return {"optimizer": optimizer, "scheduler": self.scheduler.state_dict(), "beta": self.beta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict` returned (a resumed run); when `sharded`, each rank
        keeps its shard of the whole optimizer state."""
        if self.sharded:
            dist.load_full_optimizer_state(self.model, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.beta = state["beta"]

    def accumulate(self, batch: Batch) -> dict[str, float]:
        """Adds the gradient of the whole batch's loss, micro-batch by micro-batch.

        The shared prefix runs once per step (`backward_micro_batches`), for
        the reference too. Under torchrun, this rank runs its share of the
        micro-batches; the gradients and the metrics are then summed over the
        ranks, gradients already there included (`step` zeroes them first).
        """
        batch = _to(batch, next(self.model.parameters()).device)
        select = self._select if dist.active() else None
        shared = shared_prefix_length(batch) if batch.size > 1 and self.share_prefix else 0
        ref_prefix = None
        # read from the module, as `backward_micro_batches` reads it: a test that sets
        # logprobs.MIN_SHARED_PREFIX changes both
        if shared >= logprobs.MIN_SHARED_PREFIX:
            ref_prefix = self._reference_prefix(batch.input_ids[:1, :shared])

        def loss_fn(micro: Batch, prefix: Prefix | None) -> tuple[torch.Tensor, dict[str, float]]:
            weight = self._weight(micro, batch)
            loss, stats = self._loss(micro, ref_prefix, prefix)
            return loss * weight, {k: v * weight for k, v in stats.items()}

        parts = backward_micro_batches(
            self.model,
            batch,
            self.config.optim.micro_batch_size,
            loss_fn,
            self._forward_context,
            select,
            share_prefix=self.share_prefix,
            micro_batch_tokens=self.config.optim.micro_batch_tokens,
            no_sync=self._ddp.no_sync if self._ddp is not None else None,
        )
        totals = {key: sum(p[key] for p in parts) for key in LOSS_METRICS}
        if select is None:
            # what follows runs under torchrun only, whose tests run in subprocesses
            # (tests/test_distributed_learner.py): mutation testing cannot reach it
            return totals
        # DDP (`dist.data_parallel`) and FSDP summed the gradients over the ranks in the backward
        return dist.all_reduce_sum(totals, LOSS_METRICS)

    def _select(self, micro_batches: list[Batch]) -> list[Batch]:
        """This rank's micro-batches; with FSDP, as many on every rank, and with DDP at
        least one, whose backward sums the gradients (empty ones added)."""
        mine = dist.shard(micro_batches)
        rounds = -(-len(micro_batches) // dist.world_size()) if self.sharded else 1
        return mine + [_empty(micro_batches[0])] * (rounds - len(mine))

    def _loss(
        self, micro: Batch, ref_prefix: Prefix | None, prefix: Prefix | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        ref = self._reference_logprobs(micro, ref_prefix)
        with self._forward_context():
            temperature = self.config.sampling.temperature
            logp, entropy = self._run(
                token_logprobs, micro, temperature, prefix, self.share_prefix, self.packed
            )
        out = self.loss_fn(
            logp,
            micro.old_logprobs,
            micro.advantages,
            micro.loss_mask,
            ref_logprobs=ref,
            epsilon=self.config.grpo.epsilon,
            beta=self.beta,
            epsilon_high=self.config.grpo.epsilon_high,
            importance_sampling_level=self.config.grpo.importance_sampling_level,
            kl_estimator=self.config.grpo.kl_estimator,
            max_tokens=self.config.sampling.max_episode_tokens,
            # only where there are some: a registered loss need not take is_weights otherwise
            **({} if micro.is_weights is None else {"is_weights": micro.is_weights}),
        )
        stats = (
            out.policy_loss,
            out.kl,
            out.clip_fraction,
            grpo.masked_mean(entropy, micro.loss_mask),
        )
        return out.loss, {key: float(v) for key, v in zip(LOSS_METRICS, stats, strict=True)}

    @torch.no_grad()
    def old_logprobs(self, batch: Batch) -> torch.Tensor:
        """The current weights' logprobs [N, L-1] of the batch's tokens, without gradient.

        Computed as the loss computes its logprobs (same temperature, precision and
        mode), micro-batch by micro-batch, so that before the update the ratio is 1
        up to float rounding.
        """
        batch = _to(batch, next(self.model.parameters()).device)
        optim, temperature = self.config.optim, self.config.sampling.temperature
        out, start = torch.zeros_like(batch.old_logprobs), 0
        micro_batches = (  # in order: row i of the batch is row i of `out`
            batch.split(optim.micro_batch_size)
            if optim.micro_batch_tokens is None
            else batch.split_tokens(optim.micro_batch_tokens)
        )
        for micro in micro_batches:
            with self._forward_context():
                logp = self._run(
                    token_logprobs, micro, temperature, None, self.share_prefix, self.packed
                )[0]
            out[start : start + micro.size, : logp.shape[1]] = logp.float()
            start += micro.size
        return out

    def correct_mismatch(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """The batch against the learner's own old logprobs, with truncated importance
        weights for the sampler's (`grpo.truncated_is_weights`, cap `grpo.tis_cap`).

        For a sampler that is not the learner's model (vLLM): its logprobs differ from
        the learner's by kernels and precision, so the clipped ratio is taken against
        the learner's and the difference is corrected by the weights. Returns the new
        batch and "rollout/logprob_diff_max", "rollout/is_ratio_mean" and
        "rollout/is_truncated_fraction".
        """
        old = self.old_logprobs(batch)
        sampler = batch.old_logprobs.to(old.device)
        mask = batch.loss_mask.to(old.device)
        weights, stats = grpo.truncated_is_weights(old, sampler, mask, self.config.grpo.tis_cap)
        batch = replace(
            batch,
            old_logprobs=old.to(batch.old_logprobs.device),
            is_weights=weights.to(batch.old_logprobs.device),
        )
        return batch, {f"rollout/{k}": float(v) for k, v in stats.items()}

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The trained weights by name, for `Policy.load_weights`.

        When `sharded`, each weight is gathered from every rank's shard: every
        rank must go through all of them, in step.
        """
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                yield name, (p.full_tensor() if isinstance(p, DTensor) else p).detach()


class Runner(Protocol):
    """Runs `fn(model, *args)` of one model as `run(fn, *args)` (see `_runner`)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> T: ...


def _runner(model: torch.nn.Module, sharded: bool) -> Runner:
    """What runs `fn(model, *args)` as `run(fn, *args)`: the call itself, or, when
    `sharded`, the same through FSDP (`dist.fully_shard_model`)."""
    if sharded:
        return dist.fully_shard_model(model)
    return lambda fn, *args: fn(model, *args)


def _checkpointing(model: torch.nn.Module) -> bool:
    """Whether layers of `model` recompute their activations in the backward (transformers'
    `gradient_checkpointing` flag, as its `is_activation_checkpointing` reads it)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _empty(micro: Batch) -> Batch:
    """A one-row micro-batch whose loss and metrics are exactly 0 (nothing under its mask)."""
    ids = micro.input_ids[:1, :2]
    zeros = torch.zeros(1, ids.shape[1] - 1, device=ids.device)
    return Batch(ids, torch.ones_like(ids), zeros, zeros, torch.zeros(1, device=ids.device))


def _to(batch: Batch, device: torch.device) -> Batch:
    if batch.input_ids.device == device:
        return batch
    tensors = (batch.input_ids, batch.attention_mask, batch.loss_mask, batch.old_logprobs)
    # mypy cannot count a starred tuple: these are Batch's first five fields
    return Batch(  # type: ignore[misc]
        *(t.to(device) for t in (*tensors, batch.advantages)),
        is_weights=None if batch.is_weights is None else batch.is_weights.to(device),
    )

"""Differences between the transformers versions agentgym runs on, and a torch workaround.

Imports nothing of agentgym; the policy and the learner both call the model's forward.
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

# torch's CPU math functions (cos, exp, ...) call MKL, which picks its kernels by CPU type
# on its first call, in steps that are not thread-safe: where that first call comes from
# two OpenMP threads at once (the rotary cos of a first forward, split over the threads),
# one can read the half-written CPU type and compute its half with MKL's low-accuracy
# kernels (cos off by 1.5e-4), so that the first forward of a process differs from the
# next. One call here, on this thread, makes the choice before anything runs in parallel.
torch.zeros(1).cos()


def cache_kwarg(model: PreTrainedModel) -> str:
    """The forward() keyword for the KV cache: `cache` since transformers 5.x, else the old name."""
    # torch types an attribute a module does not declare as Tensor | Module (get_base_model
    # of a peft model, typed as the PreTrainedModel it wraps)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    params = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in params else "past_key_values"

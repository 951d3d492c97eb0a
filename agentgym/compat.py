"""Differences between the transformers versions agentgym runs on.

Imports nothing of agentgym; the policy and the learner both call the model's forward.
"""

from __future__ import annotations

import inspect

from transformers import PreTrainedModel


def cache_kwarg(model: PreTrainedModel) -> str:
    """The forward() keyword for the KV cache: `cache` since transformers 5.x, else the old name."""
    # torch types an attribute a module does not declare as Tensor | Module (get_base_model
    # of a peft model, typed as the PreTrainedModel it wraps)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    params = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in params else "past_key_values"

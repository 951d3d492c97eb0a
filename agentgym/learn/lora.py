"""LoRA: the adapters the learner trains when `lora.enabled` (peft), on any causal LM."""

from __future__ import annotations

from typing import cast

from transformers import PreTrainedModel

from agentgym.config import Config


def wrap_lora(model: PreTrainedModel, config: Config) -> PreTrainedModel:
    """`model` with LoRA adapters on `config.lora.target_modules` (peft), the rest frozen."""
    from peft import LoraConfig, get_peft_model

    lora = config.lora
    peft_config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    # a peft model hands every attribute it lacks to the model it wraps: callers use it as one
    return cast(PreTrainedModel, get_peft_model(model, peft_config))

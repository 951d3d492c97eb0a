"""`make_policy`: the run's policy, as `policy.backend` says; the one place a policy is
built from the config (the run, Ray workers, RFT, `agentgym serve`). Besides it, only
checks read the option: preflight (is vLLM here) and `scale.samplers.ranks_sample`."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentgym.config import Config
from agentgym.policy.base import Policy
from agentgym.policy.hf import HFPolicy
from agentgym.policy.vllm import VLLMPolicy, save_model_folder


def engine_folder(config: Config, model: PreTrainedModel, tokenizer) -> Path | None:
    """With `policy.backend: vllm`, a folder of `model`'s weights for the engine to start
    from (saved before LoRA wraps them); None for transformers."""
    if config.policy.backend != "vllm":
        return None
    return save_model_folder(model, tokenizer)


def make_policy(
    config: Config,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    engine_dir: Path | None = None,
    learner_model: PreTrainedModel | None = None,
) -> Policy:
    """Transformers sampling with `model`, or, with `policy.backend: vllm`, an engine
    started from `engine_dir` that serves `learner_model`'s LoRA adapters when they train."""
    if config.policy.backend == "vllm":
        assert engine_dir is not None, "policy.backend 'vllm' needs engine_folder()'s folder"
        return VLLMPolicy.for_learner(engine_dir, learner_model or model, tokenizer, config)
    return HFPolicy(model, tokenizer)

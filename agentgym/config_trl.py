"""TRL's GRPOConfig names, as `agentgym.config_cli` reads them.

`TRL_ALIASES` maps each name that means what one of our fields means to that
field; `TRL_REFUSED` says, for each name that means something else here, why,
and which of our fields to use instead. `agentgym.config_cli` accepts the first
as `--set` keys and flags, refuses the second with that message, and lists both
in docs/configs.md.
"""

from __future__ import annotations

# TRL GRPOConfig names that mean what our field means.
TRL_ALIASES: dict[str, str] = {
    "num_generations": "grpo.group_size",
    "loss_type": "grpo.loss",
    "beta": "grpo.beta",
    "epsilon": "grpo.epsilon",
    "epsilon_high": "grpo.epsilon_high",
    "num_iterations": "grpo.num_iterations",
    "scale_rewards": "grpo.scale_rewards",
    "importance_sampling_level": "grpo.importance_sampling_level",
    "mask_truncated_completions": "grpo.mask_truncated_completions",
    "vllm_importance_sampling_clip_max": "grpo.tis_cap",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "learning_rate": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "max_grad_norm": "optim.max_grad_norm",
    "lr_scheduler_type": "optim.lr_scheduler",
    "warmup_steps": "optim.warmup_steps",
    "vllm_gpu_memory_utilization": "policy.gpu_memory_utilization",
    "vllm_enable_sleep_mode": "policy.enable_sleep_mode",
    "vllm_max_model_length": "policy.max_model_len",
    "seed": "run.seed",
    "output_dir": "run.output",
    "report_to": "run.report_to",
    "gradient_checkpointing": "model.gradient_checkpointing",
}

# TRL GRPOConfig names that mean something else here: why, and what to use.
TRL_REFUSED: dict[str, str] = {
    "max_completion_length": "TRL's bounds one completion; here sampling.max_new_tokens bounds "
    "a turn and sampling.max_episode_tokens a whole episode",
    "per_device_train_batch_size": "TRL's counts completions; here a step samples "
    "grpo.tasks_per_step x grpo.group_size episodes and optim.micro_batch_size of them go "
    "through each forward/backward",
    "gradient_accumulation_steps": "here a step accumulates over its whole batch of "
    "grpo.tasks_per_step x grpo.group_size episodes, optim.micro_batch_size at a time",
    "max_steps": "TRL's counts optimizer steps; run.steps counts sampled batches, each "
    "trained grpo.num_iterations times",
    "use_vllm": "use policy.backend=vllm",
    "log_completions": "TRL's is a switch; run.log_completions is how many are written per step",
    "padding_free": "TRL's is a switch; here optim.micro_batch_tokens turns packing on and "
    "sizes the micro-batches by tokens",
    "bf16": "TRL's is a switch; use model.precision (auto, fp32, bf16)",
}

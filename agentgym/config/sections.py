"""Every option of a run, its type, its default and its description: the one source of truth."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from agentgym.config.rules import broken_rules
from agentgym.config.training import (
    GRPOConfig,
    LoraConfig,
    OptimConfig,
    PipelineConfig,
    RFTConfig,
    Section,
    SFTConfig,
)


class ModelConfig(Section):
    name: str | None = Field(
        None,
        description="Causal LM: a local path, a hub id, 'tiny-random', or None for the embedded "
        "SmolLM2-135M-Instruct.",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Weight dtype the model loads in (train, sft, eval) and the learner's "
        "autocast; 'auto' is bf16 on a GPU that has it, float32 elsewhere. Checkpoints keep it.",
    )
    device: str = Field(
        "auto",
        description="Where the model runs (train, sft, eval): 'auto' is the GPU when there is "
        "one, else the CPU; or a torch device: 'cpu', 'cuda', 'cuda:1', ...",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass (train, "
        "sft): less memory for about a third more compute.",
    )
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = Field(
        "auto",
        description="Attention kernels, passed to from_pretrained; 'auto' keeps transformers' "
        "choice (sdpa where it can); flash_attention_2 needs a GPU and the flash-attn package.",
    )
    chat_template: str | None = Field(
        None,
        description="Replaces the tokenizer's chat template: a shipped one with tools ('qwen2.5', "
        "'llama3.1', 'mistral-v3'), a Jinja file, or template text; None keeps the model's.",
    )

    @field_validator("device")
    @classmethod
    def _torch_device(cls, device: str) -> str:
        import torch  # parses the name only: 'cuda:1' is a device name without a GPU too

        if device != "auto":
            try:
                torch.device(device)
            except RuntimeError as err:
                raise ValueError(
                    f"unknown device {device!r}: 'auto', 'cpu', 'cuda', 'cuda:1', ..."
                ) from err
        return device


class SamplingConfig(Section):
    max_new_tokens: int = Field(256, gt=0, description="Most tokens the policy samples per turn.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (the tutorial's 1.0).")
    top_p: float = Field(
        1.0, gt=0, le=1, description="Nucleus sampling mass, in training and sampled held-out play."
    )
    max_episode_tokens: int = Field(
        4096, gt=0, description="Token budget of a whole episode; past it the episode is truncated."
    )
    stop: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        default_factory=list,
        description="Strings that end a turn, kept in it (e.g. '</tool_call>': one call per "
        "turn, then the tool's reply); the stop tokens end turns besides.",
    )


class PolicyConfig(Section):
    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="What samples the rollouts: 'hf', transformers on the learner's own model, "
        "or 'vllm', a colocated vLLM engine given the learner's weights after each step "
        "(the learner then recomputes the old logprobs; see grpo.tis_cap).",
    )
    gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        le=1,
        description="vLLM: share of the GPU's memory the engine may take (weights and KV "
        "cache); the learner needs the rest.",
    )
    enable_sleep_mode: bool = Field(
        False,
        description="vLLM: free the engine's GPU memory (weights to host memory, KV cache "
        "dropped) while the learner steps. CUDA, ROCm and XPU; refused on CPU.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="vLLM: the engine's weight dtype; 'auto' is float32 on CPU (as the "
        "learner there) and bfloat16 on a GPU.",
    )
    max_model_len: int | None = Field(
        None,
        gt=0,
        description="vLLM: longest prompt plus completion; None: sampling.max_episode_tokens "
        "plus one turn's tokens.",
    )
    cpu_kv_cache_gb: float = Field(
        1.0, gt=0, description="vLLM on CPU: GiB of KV cache (on a GPU, gpu_memory_utilization)."
    )
    engine_process: Literal["auto", "in_process", "separate"] = Field(
        "auto",
        description="vLLM: where the engine runs: 'in_process', in the sampling process, "
        "which hands it the weights' tensors as they are (TRL's colocate mode); 'separate', "
        "in vLLM's own worker process, which gets them through shared memory (CPU tensors) "
        "or CUDA IPC handles; 'auto': in_process on a GPU, separate on CPU (there an "
        "in-process engine cuts its process's torch threads to 1).",
    )


class EvalConfig(Section):
    every: int = Field(
        0, ge=0, description="Held-out evaluation every N steps, keeping checkpoint-best; 0: none."
    )
    tasks: int = Field(48, ge=1, description="Held-out tasks of those evaluations (selection).")
    report_tasks: int = Field(
        0, ge=0, description="Held-out tasks of the closing table, after the selection's; 0: none."
    )
    n: int = Field(
        0,
        ge=0,
        description="Sampled episodes per task besides the greedy one; with n > 0 the "
        "evaluations report pass@1 and checkpoint-best follows it (eval/pass@1).",
    )
    start_n: int | None = Field(
        None,
        ge=0,
        description="Sampled episodes per task in the start model's evaluation; None: n. "
        "0 plays it greedily only, which saves time when the start model cannot answer yet.",
    )
    split: Literal["train", "test"] = Field("test", description="Split the tasks come from.")
    max_new_tokens: int | None = Field(
        None, gt=0, description="Tokens per turn when evaluating; None: sampling.max_new_tokens."
    )
    benchmarks: list[str] = Field(
        default_factory=list,
        description="Public benchmarks played greedily at each held-out evaluation (and by "
        "`agentgym eval --benchmark`): NAME[:CATEGORY,...][@N], NAME one of bfcl, tooltalk, "
        "tau2; @N: N seeded tasks of each category. Logged as bench/<name>[/<category>]/"
        "correctness; scored by each benchmark's own checker, never by the run's rewards.",
    )
    select_by: str | None = Field(
        None,
        description="The held-out metric checkpoint-best follows, e.g. bench/bfcl/correctness; "
        "None: eval/pass@1 with n > 0, else eval/correctness.",
    )
    save_episodes: Literal["none", "failures", "all"] = Field(
        "all",
        description="`agentgym eval` writes the episodes it played (messages, reward parts, "
        "token ids, mask, logprobs) to episodes-<model|baseline>.npz beside report.json, for "
        "`agentgym view`: all, the failures (not fully correct, or unscorable), or none; "
        "tokens kept up to run.episode_max_mb a file.",
    )


MIX_ENV = "agentgym/Mix-v0"  # several envs as one: `run.envs`


class CurriculumConfig(Section):
    levels: list[int] = Field(
        default_factory=list,
        description="Difficulty levels to climb, in order (e.g. [1, 2, 3]); [] is no curriculum.",
    )
    threshold: float = Field(0.8, gt=0, le=1, description="Train correctness that moves on.")
    window: int = Field(8, ge=1, description="Steps at a level whose mean must reach threshold.")


Tracker = Literal["tensorboard", "trackio", "wandb", "mlflow"]
"""The trackers `run.report_to` may name (`agentgym.run.trackers`)."""


class RunConfig(Section):
    env: str = Field("math", description="Env: a short name, a registered id, or module:Env-v0.")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="Passed to gym.make.")
    envs: list[dict[str, Any]] = Field(
        default_factory=list,
        description=f"Several envs: [{{env, weight, env_kwargs, name}}, ...]; sets env={MIX_ENV}.",
    )

    @model_validator(mode="before")
    @classmethod
    def _tensorboard_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("tensorboard") is not None:
            warnings.warn(
                "run.tensorboard is deprecated: set run.report_to (a list of trackers, "
                "'tensorboard' among them)",
                DeprecationWarning,
                stacklevel=2,
            )
            others = [t for t in data.get("report_to", ["tensorboard"]) if t != "tensorboard"]
            on = ["tensorboard"] if data["tensorboard"] else []
            data = {**data, "report_to": on + others, "tensorboard": None}
        return data

    @field_validator("report_to", mode="before")
    @classmethod
    def _trl_report_to(cls, value: Any) -> Any:
        """TRL's forms too: one tracker as a string, "a,b", and "none" (or ["none"]) for none."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = [name.strip() for v in value for name in v.split(",") if name.strip()]
        return [] if value in (["none"], ["None"]) else value

    @model_validator(mode="before")
    @classmethod
    def _mix(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("envs"):  # a checkpoint's config holds all three
            if data.get("env", "math") not in ("math", MIX_ENV):
                raise ValueError("set run.envs or run.env (with run.env_kwargs), not both")
            data = {**data, "env": MIX_ENV, "env_kwargs": {"envs": data["envs"]}}
        return data

    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig, description="Train tasks' difficulty over the run."
    )
    steps: int = Field(100, ge=1, description="Training steps.")
    seed: int = Field(0, description="Seeds task choice, sampling and initialisation.")
    output: Path | None = Field(
        None, description="Run directory for logs and checkpoints; None: runs/<env>-<time>."
    )
    save_every: int = Field(50, ge=1, description="Checkpoint every N steps (and at the end).")
    keep_last: int = Field(
        3, ge=1, description="Numbered checkpoints kept (newest); best and sft are kept besides."
    )
    max_skipped_steps: int = Field(
        3, ge=1, description="Steps in a row whose update is skipped (not finite) before an error."
    )
    max_failed_fraction: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="Share of a step's episodes that may be unscorable (an env's step or reset "
        "raised or hung, a reward function failed); more counts the step as failed.",
    )
    max_failed_steps: int = Field(
        3,
        ge=1,
        description="Failed steps in a row (run.max_failed_fraction) that stop the run with a "
        "checkpoint and TrainingError naming the most frequent error.",
    )
    env_step_timeout_s: float | None = Field(
        300.0, gt=0, description="Seconds an env.reset or step may take (None: no limit)."
    )
    env_workers: int | None = Field(
        None,
        ge=1,
        description="Threads that call the episodes' env.reset and env.step at once, so tools "
        "waiting on I/O wait together; results are applied in order, so a seed gives the same "
        "run. None: one per live episode; 1: one after another (for envs sharing state).",
    )
    turn_batching: Literal["barrier", "continuous", "ordered"] = Field(
        "barrier",
        description="'barrier': one generate per turn over every live episode, each turn "
        "waiting for all episodes' tools. 'continuous': one decode batch that a turn leaves "
        "when it ends and the episode's next turn joins as soon as its tool replied "
        "(continuous batching over turns; transformers or vLLM); the rows beside a turn then "
        "depend on the tools' timing. 'ordered': the same, each reply waited for and "
        "joining at the next decode step, so a seed gives the same trajectories.",
    )
    agent: str | None = Field(
        None, description="An agent program (module:function, file.py:function; docs/agents.md)."
    )
    player: str | None = Field(
        None,
        description="Who plays the episodes, when not the turn loop or run.agent: a player "
        "factory (module:name, file.py:name), called with (config, tokenizer) "
        "(agentgym.rollout.player; docs/players.md).",
    )
    agent_concurrency: int = Field(16, ge=1, description="Agents' episodes run at once.")
    agent_timeout_s: float = Field(
        3600.0, gt=0, description="Seconds an agent's episode may take, model's time included."
    )
    log_completions: int = Field(4, ge=0, description="Completions written per step.")
    log_episodes: bool = Field(
        True,
        description="Write each step's episodes (messages, reward parts, advantage; tokens, "
        "mask, logprobs and versions as run.episode_tokens says) to "
        "episodes/step-NNNNNN.npz, on a thread of its own, for `agentgym view`.",
    )
    episode_tokens: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="The share of each step's episodes (the first ones) whose token ids, "
        "mask, logprobs and versions are written; the others keep messages and figures.",
    )
    episode_max_mb: float = Field(
        32.0,
        gt=0,
        description="The most a step's token arrays may take (about 17 bytes a token, "
        "before compression); episodes past it keep messages and figures only.",
    )
    report_to: list[Tracker] = Field(
        default_factory=lambda: list[Tracker](["tensorboard"]),
        description="Trackers that get each step's scalars (metrics.jsonl's names) and a "
        "table of a few episodes, each writing locally unless set up to send "
        "(agentgym.run.trackers); [] for none. tensorboard is skipped with a warning where "
        "it is not installed; the others are refused before the model loads.",
    )
    tensorboard: bool | None = Field(
        None,
        description="Deprecated, run.report_to's: true adds 'tensorboard' to it, false "
        "takes it out.",
    )
    stop_on_health: bool = Field(False, description="Stop, with a checkpoint, on a health warning.")


class RewardFunctionConfig(Section):
    fn: str = Field(
        description="The function, as 'package.module:function' (importable where the run "
        "starts); see agentgym.rewards.functions for the arguments it is called with."
    )
    weight: float = Field(
        1.0,
        allow_inf_nan=False,
        description="Multiplies the function's value before it is added to the episode's reward.",
    )

    @field_validator("fn")
    @classmethod
    def _module_colon_function(cls, fn: str) -> str:
        module, sep, name = fn.partition(":")
        if not (sep and name.isidentifier() and all(p.isidentifier() for p in module.split("."))):
            raise ValueError(
                f"{fn!r} is not 'package.module:function'; e.g. 'my_rewards:length_bonus'"
            )
        return fn


class RewardsConfig(Section):
    functions: list[RewardFunctionConfig] = Field(
        default_factory=list,
        description="Reward functions called on every finished episode, in a worker process; "
        "their weighted values add to the environment's reward.",
    )
    timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds one function may take on one episode; past them the worker is "
        "killed and the episode is unscorable (advantage 0).",
    )


class DistributedConfig(Section):
    backend: Literal["none", "ray"] = Field(
        "none",
        description="Where rollouts run: 'none' in this process, 'ray' on rollout_workers Ray "
        "actors, each with its own policy (policy.backend) and environments.",
    )
    rollout_workers: int = Field(1, ge=1, description="Ray rollout actors (backend: ray).")
    ray_address: str | None = Field(
        None,
        description="Ray cluster to join ('auto', 'ray://host:10001'); None starts a local one.",
    )
    max_worker_restarts: int = Field(
        3, ge=0, description="Restarts of a rollout actor that died, before the run fails."
    )
    worker_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Seconds to wait for one call to a Ray rollout actor (a batch, a weight "
        "sync, a restart); past them the run stops with TrainingError naming the worker.",
    )
    weight_sync: Literal["object_store", "collective"] = Field(
        "object_store",
        description="How new weights reach the Ray workers after each step: 'object_store' (a "
        "CPU copy through Ray's object store) or 'collective' (a broadcast in a process group "
        "of the learner and workers, NCCL on GPUs, else gloo; the driver on a cluster node).",
    )
    learner: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="Under torchrun (WORLD_SIZE > 1): 'ddp', a full replica per rank with the "
        "gradients summed by all-reduce, or 'fsdp', weights, gradients and optimizer state "
        "sharded (rank 0 keeps a whole copy to sample with and save; policy.backend 'hf', "
        "distributed.backend 'none'). Gloo on CPU, NCCL on GPUs.",
    )

    @model_validator(mode="after")
    def _collective_on_ray(self) -> DistributedConfig:
        if self.weight_sync == "collective" and self.backend != "ray":
            raise ValueError("weight_sync 'collective' needs distributed.backend 'ray'")
        if self.weight_sync == "collective" and (self.ray_address or "").startswith("ray://"):
            raise ValueError(
                "weight_sync 'collective' through ray:// (a client): use 'object_store'"
            )
        return self


class Config(Section):
    """A whole training run."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    rft: RFTConfig = Field(default_factory=RFTConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="after")
    def _options_go_together(self) -> Config:
        broken = broken_rules(self)  # the table of `agentgym.config.rules`
        if broken:
            raise ValueError(broken[0])
        return self

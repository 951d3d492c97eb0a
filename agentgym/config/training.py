"""The sections of the training algorithms: GRPO, the optimizer, LoRA, SFT and RFT; and
`Section`, the base of every section (an unknown key is an error, assignments are checked)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GRPOConfig(Section):
    group_size: int = Field(8, ge=2, description="G: trajectories sampled per task.")
    tasks_per_step: int = Field(4, ge=1, description="B: tasks per step; a step trains on B x G.")
    epsilon: float = Field(0.2, gt=0, description="Clip range of the importance ratio.")
    beta: float = Field(0.04, ge=0, description="KL coefficient (k3); 0 loads no reference model.")
    loss: str = Field(
        "grpo",
        description="Loss aggregation, by name in agentgym.learn.grpo's registry: grpo, bnpo, "
        "dr_grpo, dapo (token_mean is dapo's older name), or one registered by you "
        "(checked as the run starts).",
    )
    advantage: str = Field(
        "group",
        description="Advantage estimator, by name in agentgym.learn.advantages' registry: "
        "group (GRPO's group-relative one), or one registered by you "
        "(register_advantage; checked as the run starts).",
    )
    credit: Literal["episode", "turn"] = Field(
        "episode",
        description="Who gets an advantage: the episode, one value on all its tokens "
        "(grpo.advantage's estimator), or each turn, from the return after it less a "
        "baseline from the group's other members (the turn estimator; "
        "agentgym.learn.turn_credit).",
    )
    epsilon_high: float | None = Field(
        None, gt=0, description="Upper clip range (DAPO's clip-higher); None: epsilon."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="What divides r - group mean: the group's std, the batch's, or none."
    )
    std: Literal["population", "unbiased"] = Field(
        "population",
        description="The std scale_rewards divides by: over the samples as they are "
        "(population, divide by n) or TRL's unbiased one (divide by n - 1).",
    )
    std_eps: float = Field(
        1e-8, ge=0, description="Added to that std before dividing (TRL adds 1e-4)."
    )
    kl_estimator: Literal["k1", "k3"] = Field("k3", description="The per-token KL estimate.")
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="Importance ratio per token (GRPO) or per sequence (GSPO)."
    )
    num_iterations: int = Field(
        1, ge=1, description="mu: optimizer steps on each batch, against its stored old logprobs."
    )
    mask_truncated_completions: bool = Field(
        False, description="Leave episodes cut at the token budget out of the loss (DAPO)."
    )
    drop_zero_variance_groups: bool = Field(
        False, description="Leave groups whose rewards are all equal out of the batch."
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: sample more rounds of tasks_per_step tasks until "
        "the step has tasks_per_step groups whose rewards differ (agentgym.run.dynamic).",
    )
    max_resample_rounds: int = Field(
        3, ge=0, description="With dynamic_sampling: the most extra rounds a step samples."
    )
    beta_start: float | None = Field(
        None,
        ge=0,
        description="Beta schedule (FAQ 3): start here and move linearly to `beta` "
        "over `beta_warmup_steps` steps; None keeps `beta` throughout.",
    )
    beta_warmup_steps: int = Field(0, ge=0, description="Steps of the beta schedule.")
    length_penalty: float = Field(
        0.0, ge=0, description="Reward minus this per sampled token (FAQ 7: 0.001); 0 is off."
    )
    tis_cap: float = Field(
        2.0,
        gt=0,
        description="With policy.backend 'vllm' or pipeline.max_off_policy_steps > 0: the cap "
        "of the truncated importance weight min(exp(learner old logprob - sampler logprob), "
        "cap) on each token's policy loss.",
    )

    def beta_at(self, step: int) -> float:
        """The KL coefficient at `step` (1-based) under the beta schedule."""
        if self.beta_start is None or self.beta_warmup_steps == 0:
            return self.beta
        done = min(1.0, (step - 1) / self.beta_warmup_steps)
        return self.beta_start + done * (self.beta - self.beta_start)


class OptimConfig(Section):
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_epsilon: float = Field(1e-8, gt=0, description="AdamW's eps, GRPO's and SFT's.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    micro_batch_size: int = Field(4, ge=1, description="Trajectories per forward/backward pass.")
    micro_batch_tokens: int | None = Field(
        None,
        ge=2,
        description="Padding-free learner: micro-batches hold rows up to this many tokens in "
        "all (the shared system prompt, run once, not counted), run as one sequence with no "
        "padding (a longer row runs alone). None: micro_batch_size rows, right-padded.",
    )
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="Learning-rate schedule after warm-up: constant, or decay to 0 "
        "at run.steps, linearly or along a half cosine.",
    )
    warmup_steps: int = Field(0, ge=0, description="Steps of linear learning-rate warm-up from 0.")


class LoraConfig(Section):
    enabled: bool = Field(False, description="Train LoRA adapters (peft) instead of all weights.")
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA alpha.")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: str | list[str] = Field("all-linear", description="Modules to adapt.")


class SFTConfig(Section):
    steps: int = Field(50, ge=1, description="Steps of the supervised warm-up (`agentgym sft`).")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate of the warm-up.")
    batch_size: int = Field(8, ge=1, description="Demonstrations per step.")
    demonstrations: int = Field(64, ge=1, description="Demonstration episodes drawn from train.")
    warmup: bool = Field(
        False, description="`agentgym train` runs this SFT first, in the same process (FAQ 1)."
    )
    long: Literal["off", "wall"] | Annotated[int, Field(ge=1)] = Field(
        "off",
        description="The closing table's sft-long row (train): SFT from the start model for N "
        "steps, or 'wall': for as long as SFT and GRPO trained, on fresh demonstrations.",
    )


class RFTConfig(Section):
    rounds: int = Field(10, ge=1, description="Rounds of sample, keep, fine-tune (`agentgym rft`).")
    tasks_per_round: int = Field(
        16, ge=1, description="Train tasks a round samples, grpo.group_size episodes each."
    )
    steps_per_round: int = Field(
        4, ge=1, description="SFT steps (sft.batch_size, sft.lr) a round takes on what it kept."
    )
    min_reward: float | None = Field(
        None,
        allow_inf_nan=False,
        description="Keep only passing episodes whose reward reaches it; None: a pass is enough.",
    )
    pool: Literal["round", "all"] = Field(
        "round", description="SFT draws from this round's kept episodes, or from every round's."
    )
    max_seconds: float | None = Field(
        None, gt=0, description="Wall budget: stop after the round it runs out in; None: none."
    )
    max_empty_rounds: int = Field(
        5, ge=0, description="Rounds in a row that keep nothing before the run stops; 0: never."
    )


class PipelineConfig(Section):
    max_off_policy_steps: int = Field(
        0,
        ge=0,
        description="k: learner updates the sampler may run ahead by (asynchronous GRPO). Step "
        "t's tasks are played on a sampler thread with the weights of version max(start, "
        "t - 1 - k) while the learner steps, so a seed gives the same run whatever the timing; "
        "a group whose oldest sampled token is more than k versions behind when trained is "
        "dropped and counted. 0: synchronous, each step sampled with the newest weights.",
    )
    partial_rollouts: bool = Field(
        False,
        description="With k > 0: the weights the learner makes while a step is being played "
        "go into the sampler before its next turn, so an episode may be sampled with several "
        "versions (each token records its own; the kept keys and values are dropped and "
        "recomputed). Fresher samples, but which turn takes them depends on timing. "
        "In-process transformers sampling only.",
    )

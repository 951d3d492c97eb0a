"""Three whole GRPO steps against TRL's `GRPOTrainer`, from rewards to weights.

TRL trains as it does for its users (`trainer.train()`: its sampler of prompts, its
advantages, loss, gradient clipping, AdamW and schedule), with one stand-in: its
`rollout_func` hook (TRL's own extension point for custom generation) returns fixed
completions of the prompts it is given instead of sampling them, and a reward function
pays fixed rewards for them. Our side replays the same prompts, completions and rewards
through the stages of our step (`advantages`, `update`, the `Learner`), with TRL's
conventions set by option: `grpo.std: unbiased` and `grpo.std_eps: 1e-4`. After each of
the three optimizer steps the advantages, the loss and every trained weight must agree;
`loss_type` grpo and dapo, beta > 0, LoRA and a full fine-tune, all in float32 on the CPU.

Tolerances, stated: advantages 1e-6 (the same formula), loss 1e-6 (the same sums in
another order), weights 1e-6 after three AdamW steps of lr 1e-3 (found: 0, 5e-8, 1.2e-7).
Both AdamWs take eps = 1e-3, not 1e-8: AdamW's first step moves each weight by
lr x g / (|g| + eps), so with eps = 1e-8 a weight whose gradient is float noise (1e-12 on
one side, -1e-12 on the other) moves +lr on one side and -lr on the other, 2e-3 apart,
whatever the two implementations agree on; with eps = 1e-3 it moves by a noise-sized amount.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip(
    "trl", reason="TRL is not installed (a dev dependency; make test-lowest leaves it out)"
)

from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from agentgym import records
from agentgym.config import load_config
from agentgym.learn.advantages import advantages
from agentgym.learn.learner import Learner
from agentgym.learn.lora import wrap_lora
from agentgym.learn.update import update
from agentgym.types import Batch, StepRecord, TaskSpec, Trajectory

PROMPTS, PROMPT_LEN, G, TASKS, STEPS, LR = 4, 6, 4, 2, 3, 1e-3
ADVANTAGE_TOL, LOSS_TOL, WEIGHT_TOL = 1e-6, 1e-6, 1e-6
ADAM_EPS = 1e-3


def _fixed(vocab: int, prompt: str, member: int, step: int) -> tuple[list[int], list[int], float]:
    """The prompt's ids, the `member`-th completion of it at `step`, and its reward."""
    p = int(prompt[1:])
    g = torch.Generator().manual_seed(1000 * step + 10 * p + member)
    ids = torch.randint(3, vocab, (PROMPT_LEN + 7,), generator=g).tolist()
    length = 3 + (member + p + step) % 5  # completions of 3 to 7 tokens
    reward = [1.0, 0.0, 0.5, 0.25][(member + p + step) % 4] + 0.1 * step
    return ids[:PROMPT_LEN], ids[PROMPT_LEN : PROMPT_LEN + length], reward


class _Recorder(TrainerCallback):
    def __init__(self):
        self.weights: list[dict[str, torch.Tensor]] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        self.weights.append(trained)


def _trl_steps(model, tokenizer, tmp_path, loss_type: str, beta: float) -> dict:
    """TRL's three steps; what it played, its advantages, losses and weights after each."""
    vocab, played, advantages_seen, losses = len(tokenizer), [], [], []

    def rollout(prompts, trainer):
        step = len(played)
        rows = [_fixed(vocab, p, i % G, step) for i, p in enumerate(prompts)]
        played.append([(p, i % G) for i, p in enumerate(prompts)])
        return {
            "prompt_ids": [r[0] for r in rows],
            "completion_ids": [r[1] for r in rows],
            "logprobs": None,
        }

    def reward(prompts, completions, **kwargs):  # for what `rollout` played last
        return [_fixed(vocab, p, i % G, len(played) - 1)[2] for i, p in enumerate(prompts)]

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=G * TASKS, num_generations=G,
        max_completion_length=8, max_steps=STEPS, learning_rate=LR, lr_scheduler_type="constant",
        warmup_steps=0, beta=beta, epsilon=0.2, loss_type=loss_type, scale_rewards="group",
        use_bias_correction_kl=False, temperature=1.0, report_to=[], use_cpu=True, bf16=False,
        seed=0, logging_steps=1, save_strategy="no", max_grad_norm=1.0, weight_decay=0.0,
        adam_epsilon=ADAM_EPS, optim="adamw_torch", gradient_accumulation_steps=1,
    )  # fmt: skip
    dataset = Dataset.from_dict({"prompt": [f"p{i}" for i in range(PROMPTS)]})
    recorder = _Recorder()
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset,
        processing_class=tokenizer, rollout_func=rollout, callbacks=[recorder],
    )  # fmt: skip
    score = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: _kept(
        score(inputs), advantages_seen, "advantages"
    )
    compute = trainer.compute_loss
    trainer.compute_loss = lambda *a, **k: _kept(compute(*a, **k), losses)
    trainer.train()
    return {"played": played, "advantages": advantages_seen, "losses": losses,
            "weights": recorder.weights}  # fmt: skip


def _kept(value, into: list, key: str | None = None):
    into.append((value[key] if key else value).detach().clone())
    return value


def _our_steps(model, config, vocab: int, played: list) -> dict:
    """Our stages on TRL's prompts, completions and rewards, step by step."""
    learner = Learner(model, config)
    out: dict[str, list] = {"advantages": [], "losses": [], "weights": []}
    for step, rows in enumerate(played):
        fixed = [_fixed(vocab, p, member, step) for p, member in rows]
        bare = [
            _trajectory(p, c, r, [0.0] * (len(p) + len(c)), i // G)
            for i, (p, c, r) in enumerate(fixed)
        ]
        old = learner.old_logprobs(Batch.from_trajectories(bare, torch.zeros(len(bare)), 0))
        played_now = tuple(
            _trajectory(p, c, r, [0.0, *old[i, : len(p) + len(c) - 1].tolist()], i // G)
            for i, (p, c, r) in enumerate(fixed)
        )
        record = StepRecord(
            step=step + 1, version=step, specs=tuple(TaskSpec(seed=s) for s in range(TASKS)),
            trajectories=played_now, rewards=torch.tensor([r for _, _, r in fixed]),
            scorable=torch.ones(len(fixed), dtype=torch.bool),
        )  # fmt: skip
        record = advantages(record, config.grpo)
        out["advantages"].append(record.advantages[:, PROMPT_LEN - 1].clone())
        record = update(record, learner, config, pad_id=0)
        # the loss minimised: the surrogate (`loss/policy`) plus beta x kl, as TRL's `loss`
        out["losses"].append(
            record.stats[records.LOSS] + config.grpo.beta * record.stats[records.KL]
        )
        out["weights"].append(
            {n: p.detach().clone() for n, p in learner.model.named_parameters() if p.requires_grad}
        )
    return out


def _trajectory(prompt, completion, reward, logprobs, group) -> Trajectory:
    return Trajectory(
        task_id=f"task-{group}", group=group, tokens=tuple(prompt + completion),
        loss_mask=tuple([0] * len(prompt) + [1] * len(completion)), logprobs=tuple(logprobs),
        prompt_length=len(prompt), reward=reward, reward_parts={}, turns=(),
        finish_reason="stop", truncated=False,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
@pytest.mark.parametrize("lora", [True, False])
def test_three_steps_agree_with_trls_grpo_trainer(tiny, tmp_path, loss_type, lora):
    model, tokenizer = tiny
    config = load_config(overrides={
        "grpo.group_size": G, "grpo.tasks_per_step": TASKS, "grpo.beta": 0.04,
        "grpo.loss": loss_type, "grpo.std": "unbiased", "grpo.std_eps": 1e-4,
        "optim.lr": LR, "optim.adam_epsilon": ADAM_EPS, "optim.micro_batch_size": G * TASKS,
        "lora.enabled": lora, "lora.r": 4, "run.steps": STEPS,
    })  # fmt: skip
    # fresh adapters (B = 0), as both sides make them: TRL given a peft model whose adapter
    # is not fresh takes a frozen copy of it as the KL reference, we the base model
    start = copy.deepcopy(model)
    start = wrap_lora(start, config) if lora else start
    theirs = _trl_steps(copy.deepcopy(start), tokenizer, tmp_path, loss_type, 0.04)
    assert len(theirs["played"]) == STEPS and len(theirs["weights"]) == STEPS
    ours = _our_steps(copy.deepcopy(start), config, len(tokenizer), theirs["played"])
    figures = []
    for step in range(STEPS):
        adv = (ours["advantages"][step] - theirs["advantages"][step]).abs().max().item()
        loss = abs(ours["losses"][step] - float(theirs["losses"][step]))
        names = theirs["weights"][step].keys()
        assert names == ours["weights"][step].keys() and len(names) > 0
        moved = max(
            (ours["weights"][step][n] - start.state_dict()[n]).abs().max().item() for n in names
        )
        weights = max(
            (ours["weights"][step][n] - theirs["weights"][step][n]).abs().max().item()
            for n in names
        )
        figures.append((adv, loss, weights, moved))
        print(f"{loss_type} lora={lora} step {step + 1}: |adv| {adv:.1e} |loss| {loss:.1e} "
              f"|weights| {weights:.1e} (moved {moved:.1e})")  # fmt: skip
    for adv, loss, weights, moved in figures:
        assert adv <= ADVANTAGE_TOL and loss <= LOSS_TOL and weights <= WEIGHT_TOL
        assert moved > 100 * WEIGHT_TOL  # the steps moved the weights far past the tolerance

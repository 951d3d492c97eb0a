"""The whole pipeline of `agentgym train` on tiny-random: start eval, SFT, GRPO with held-out
evaluations and checkpoint-best, the best checkpoint's eval, the closing table, the curves."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from agentgym.cli import main
from agentgym.config import load_config
from agentgym.env.core import make_env
from agentgym.learn.lora import wrap_lora as _wrap_lora
from agentgym.policy.base import Generation
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout.player import TurnPlayer
from agentgym.rollout.sampler import InProcessSampler
from agentgym.run.checkpoint import save_checkpoint
from agentgym.run.record import step_metrics
from agentgym.run.resume import Progress, Trainer
from agentgym.run.train import train_step
from agentgym.types import TrainingError, Trajectory

PIPELINE = [
    "--set", "sft.warmup=true", "--set", "sft.steps=3", "--set", "sft.demonstrations=4",
    "--set", "sft.batch_size=2", "--set", "lora.enabled=true", "--set", "lora.r=4",
    "--set", "eval.every=2", "--set", "eval.tasks=3", "--set", "eval.report_tasks=4",
    "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2",
    "--set", "sampling.max_new_tokens=12", "--set", "run.report_to=[]",
]  # fmt: skip


def test_the_pipeline_writes_report_curves_and_the_best_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "3"]
    assert main([*argv, "--output", str(out), *PIPELINE]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in rows if "eval/correctness" in r]
    assert [r["step"] for r in evaluated] == [2, 3]  # every 2 steps, and the last
    assert all({"eval/correctness_lenient", "eval/format_accuracy"} <= set(r) for r in evaluated)
    # the start (the SFT checkpoint) is scored on the same tasks as step 0, and is a candidate
    start = json.loads((out / "checkpoint-000003" / "state.json").read_text())["start_selection"]
    assert start["step"] == 0 and set(start) >= {"eval/correctness", "eval/format_accuracy"}
    candidates = [start, *evaluated]
    best = max(candidates, key=lambda r: (r["eval/correctness"], -r["step"]))["step"]
    state = json.loads((out / "checkpoint-best" / "state.json").read_text())
    assert state == {"step": best}
    sft = [json.loads(x) for x in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sft] == [1, 2, 3]
    report = json.loads((out / "report" / "report.json").read_text())
    assert list(report["models"]) == ["start", "sft", f"best@{best}"]
    assert set(report["comparisons"]) == {"sft - start", f"best@{best} - sft",
                                          f"best@{best} - start"}  # fmt: skip
    # the report's tasks are disjoint from the selection tasks that chose the best step
    report_ids = {t["task_id"] for t in report["tasks"]["start"]}
    assert len(report_ids) == 4
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "checkpoint-sft" / "model.safetensors").is_file()  # merged: a whole model
    printed = capsys.readouterr().out
    assert "held-out evaluation" in printed and f"best@{best}" in printed


def test_a_lora_checkpoint_loads_as_a_merged_model(tmp_path):
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    config = load_config(overrides={"lora.enabled": True, "lora.r": 4})
    wrapped = _wrap_lora(copy.deepcopy(model), config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)  # trained adapters: B is no longer zero
        expected = wrapped(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
    checkpoint = save_checkpoint(tmp_path, 1, wrapped, tokenizer, config)
    assert not (checkpoint / "model.safetensors").exists()
    merged, merged_tokenizer = load_model_and_tokenizer(str(checkpoint))
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        got = merged(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
        plain = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
    assert torch.allclose(got, expected, atol=1e-4)
    assert not torch.allclose(got, plain, atol=1e-3)
    assert merged_tokenizer.padding_side == "left"


def test_sft_saves_a_whole_model_that_eval_takes(tmp_path):
    out = tmp_path / "sft"
    argv = ["sft", "--env", "tool_call", "--model", "tiny-random", "--steps", "2",
            "--set", "lora.enabled=true", "--set", "sft.demonstrations=2",
            "--set", "sft.batch_size=2"]  # fmt: skip
    assert main([*argv, "--output", str(out)]) == 0
    checkpoint = out / "checkpoint-000002"
    assert (checkpoint / "model.safetensors").is_file()
    argv = ["eval", "--env", "tool_call", "--model", str(checkpoint), "--tasks", "2", "--n", "0",
            "--set", "sampling.max_new_tokens=6", "--output", str(tmp_path / "ev")]  # fmt: skip
    assert main(argv) == 0
    assert (tmp_path / "ev" / "report.json").is_file()


@pytest.mark.parametrize(
    ("start", "steps", "expected"),
    [(None, 5, [0.04] * 4), (0.01, 0, [0.04] * 4), (0.01, 3, [0.01, 0.02, 0.03, 0.04])],
)
def test_the_beta_schedule_moves_linearly_from_beta_start_to_beta(start, steps, expected):
    config = load_config(
        overrides={"grpo.beta": 0.04, "grpo.beta_start": start, "grpo.beta_warmup_steps": steps}
    )
    assert [config.grpo.beta_at(s) for s in (1, 2, 3, 4)] == pytest.approx(expected)


class ScriptedFakePolicy:
    """A fake policy: member k of a group answers `\\boxed{0}` after 2k filler tokens, so
    the members' completions are 2 tokens apart and their rewards equal."""

    def __init__(self, tokenizer, model):
        self.model = model  # the learner's: the step syncs no weights to this policy
        self.answer = tokenizer.encode("\\boxed{0}", add_special_tokens=False)
        self.answer.append(tokenizer.eos_token_id)
        self.filler = tokenizer.encode(" x", add_special_tokens=False)

    def generate(self, prompts, params, streams=None):
        ids = [tuple(self.filler * 2 * k + self.answer) for k in range(len(prompts))]
        return [Generation(i, (-0.5,) * len(i), "stop") for i in ids]


class RecordingFakeLearner:
    """A fake learner: records the advantages of each batch it is asked to step on."""

    def __init__(self):
        self.model, self.beta, self.advantages = torch.nn.Identity(), 0.0, []

    def step(self, batch, beta=None):
        """Records each row's advantage: the one on its sampled tokens."""
        rows = zip(batch.advantages, batch.loss_mask.bool(), strict=True)
        self.advantages.append([row[sampled][0].item() for row, sampled in rows])
        return {"loss": 0.0}


def _train_step(config, sampler, learner, tokenizer, reward_fns=None):
    """One `train_step` with `learner`, from the run's generator seeded 0; (record, metrics)."""
    trainer = Trainer(learner, tokenizer, np.random.default_rng(0), Progress())
    record = train_step(config, trainer, sampler, reward_fns)
    return record, step_metrics(record, learner.beta, config.grpo.length_penalty)


@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        # equal rewards: r - mean r = -0.01 * (length - mean length) = -0.01 * (-3, -1, 1, 3)
        ("none", [0.03, 0.01, -0.01, -0.03]),
        # the same over the group's std, 0.01 * sqrt((9 + 1 + 1 + 9) / 4) = 0.01 * sqrt(5)
        ("group", [3 / 5**0.5, 1 / 5**0.5, -1 / 5**0.5, -3 / 5**0.5]),
    ],
)
def test_a_length_penalty_lowers_the_rewards_advantages_are_computed_from(tiny, scale, expected):
    _, tokenizer = tiny
    grpo = {"length_penalty": 0.01, "group_size": 4, "tasks_per_step": 1, "scale_rewards": scale}
    config = load_config(overrides={f"grpo.{key}": value for key, value in grpo.items()})
    learner = RecordingFakeLearner()
    policy = ScriptedFakePolicy(tokenizer, learner.model)
    envs = [make_env("math") for _ in range(4)]
    try:
        sampler = InProcessSampler(envs, policy, TurnPlayer(tokenizer))
        record, metrics = _train_step(config, sampler, learner, tokenizer)
        trajectories = record.trajectories
    finally:
        for env in envs:
            env.close()
    lengths = [t.completion_length for t in trajectories]
    assert lengths == [lengths[0] + 2 * k for k in range(4)]
    assert len({t.reward for t in trajectories}) == 1  # unpenalised, every advantage is 0
    (advantages,) = learner.advantages
    assert advantages == pytest.approx(expected, abs=1e-6)
    penalised = [t.reward - 0.01 * n for t, n in zip(trajectories, lengths, strict=True)]
    assert metrics["reward/penalised_mean"] == pytest.approx(sum(penalised) / 4)


class ReplayingFakeSampler:
    """A fake `Sampler`: whatever is submitted, poll returns the episodes it was given."""

    version = 0

    def __init__(self, trajectories):
        self.trajectories = trajectories

    def submit(self, submission):
        pass

    def poll(self, wait=True):
        return list(self.trajectories)

    def load_weights(self, weights, version):
        return {}

    def close(self):
        pass


def _episode(task_id: str, group: int, reward: float) -> Trajectory:
    return Trajectory(task_id=task_id, group=group, tokens=(5, 6, 7, 8), loss_mask=(0, 0, 1, 1),
                      logprobs=(0.0, 0.0, -0.5, -0.5), prompt_length=2, reward=reward,
                      reward_parts={"correctness": reward}, turns=(), finish_reason="stop",
                      truncated=False)  # fmt: skip


TWO_TASKS = [_episode("a", 0, r) for r in (0.0, 1.0, 0.0, 1.0)] + [
    _episode("b", 1, r) for r in (5.0, 6.0, 6.0, 7.0)
]
"""Two groups at different reward levels: over the whole batch (mean 3.25) every "a"
advantage would be negative and every "b" one positive."""
BATCH_STD = (63.5 / 8) ** 0.5
"""The std of all eight rewards: mean 3.25, squared deviations 2 * 3.25^2 + 2 * 2.25^2 +
1.75^2 + 2 * 2.75^2 + 3.75^2 = 63.5, over 8."""


def _step_on(tiny, trajectories, scale: str, learner: RecordingFakeLearner) -> None:
    """One `train_step` of two tasks of four episodes, on the given episodes."""
    grpo = {"group_size": 4, "tasks_per_step": 2, "scale_rewards": scale}
    config = load_config(overrides={f"grpo.{key}": value for key, value in grpo.items()})
    _train_step(config, ReplayingFakeSampler(trajectories), learner, tiny[1])


@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        # "a": mean 0.5, std 0.5 -> +-1; "b": mean 6, std sqrt((1 + 0 + 0 + 1) / 4) = sqrt(0.5)
        ("group", [-1, 1, -1, 1, -(2**0.5), 0, 0, 2**0.5]),
        # the same centring, each group about its own mean, over the batch's std
        ("batch", [x / BATCH_STD for x in (-0.5, 0.5, -0.5, 0.5, -1, 0, 0, 1)]),
        ("none", [-0.5, 0.5, -0.5, 0.5, -1, 0, 0, 1]),
    ],
)
def test_each_task_of_a_step_is_normalised_within_its_own_group(tiny, scale, expected):
    learner = RecordingFakeLearner()
    _step_on(tiny, TWO_TASKS, scale, learner)
    (advantages,) = learner.advantages
    assert advantages == pytest.approx(expected, abs=1e-6)


def test_a_step_whose_groups_come_back_interleaved_stops_before_the_learner(tiny):
    shuffled = [TWO_TASKS[i] for i in (0, 4, 1, 5, 2, 6, 3, 7)]
    learner = RecordingFakeLearner()
    with pytest.raises(TrainingError, match=r"^block 0 \(samples 0-3\) is not one group"):
        _step_on(tiny, shuffled, "group", learner)
    assert learner.advantages == []  # stopped before any update


@pytest.mark.parametrize("path", ["configs/tool_call.yaml", "configs/math.yaml"])
def test_shipped_configs_are_valid(path):
    from pathlib import Path

    config = load_config(Path(__file__).parent.parent / path)
    assert config.run.env in {"tool_call", "math"}


def test_the_default_config_runs_its_whole_pipeline_on_tiny_random(tmp_path):
    from pathlib import Path

    config = Path(__file__).parent.parent / "configs" / "tool_call.yaml"
    out = tmp_path / "run"
    argv = ["train", "--config", str(config), "--model", "tiny-random", "--steps", "2",
            "--output", str(out)]  # fmt: skip
    small = ["sft.steps=2", "sft.demonstrations=2", "sft.batch_size=2", "eval.tasks=2",
             "eval.report_tasks=2", "eval.n=2", "eval.every=1", "grpo.group_size=2",
             "grpo.tasks_per_step=1", "sampling.max_new_tokens=6", "eval.max_new_tokens=6",
             "run.report_to=[]"]  # fmt: skip
    assert main([*argv, *(x for s in small for x in ("--set", s))]) == 0
    report = json.loads((out / "report" / "report.json").read_text())
    models = list(report["models"])
    assert models[:2] == ["start", "sft"]
    # eval.start_n = 0: the start model is played greedily only, the others sampled too
    assert "sampled" not in report["models"]["start"]
    assert all("sampled" in report["models"][m] for m in models[1:])
    assert "pass@1" in report["comparisons"][f"{models[2]} - sft"]
    assert "pass@1" not in report["comparisons"]["sft - start"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("eval/pass@1" in r for r in rows)  # n > 0: checkpoint-best follows pass@1

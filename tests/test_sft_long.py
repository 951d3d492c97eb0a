"""`sft.long`: the closing table's `sft-long` row, SFT trained on for a step count or for
as long as SFT and GRPO trained, compared with the best GRPO checkpoint and with SFT."""

from __future__ import annotations

import json

import cli_envs  # noqa: F401  (registers cli_envs/TaughtDigits-v0)
import pytest

from agentgym.cli import main
from agentgym.config import ConfigError, load_config
from agentgym.run import preflight
from agentgym.sft.warmup import long_config


def test_wall_is_sfts_steps_and_as_many_more_as_fit_in_grpos_seconds():
    config = load_config(overrides={"sft.long": "wall", "sft.steps": 4, "sft.batch_size": 8})
    # SFT: 4 steps of 0.5 s; GRPO: 10.2 s -> ceil(10.2 / 0.5) = 21 more steps, 25 in all
    long = long_config(config, [0.4, 0.6, 0.5, 0.5], 10.2)
    assert long.sft.steps == 25
    assert long.sft.demonstrations == 25 * 8  # a fresh demonstration for each row
    assert (long.sft.lr, long.sft.batch_size, long.run) == (config.sft.lr, 8, config.run)


def test_a_step_count_is_taken_as_it_is_and_keeps_at_least_the_demonstrations():
    config = load_config(overrides={"sft.long": 5, "sft.demonstrations": 64, "sft.batch_size": 2})
    long = long_config(config, [9.0], 1000.0)
    assert (long.sft.steps, long.sft.demonstrations) == (5, 64)


def test_preflight_wants_the_warm_up_and_the_closing_table():
    env = "cli_envs:cli_envs/TaughtDigits-v0"
    config = load_config(overrides={"sft.long": "wall", "run.env": env, "eval.tasks": 2})
    with pytest.raises(ConfigError, match="sft.long: .*valid: sft.warmup: true and eval.report"):
        preflight.check(config, "train")


RUN = [
    "train", "--env", "cli_envs:cli_envs/TaughtDigits-v0", "--model", "tiny-random",
    "--set", "sft.warmup=true", "--set", "sft.steps=2", "--set", "sft.demonstrations=4",
    "--set", "sft.batch_size=2", "--set", "sft.long=3", "--set", "eval.every=2",
    "--set", "eval.tasks=2", "--set", "eval.report_tasks=3", "--set", "grpo.group_size=2",
    "--set", "grpo.tasks_per_step=2", "--set", "sampling.max_new_tokens=8",
    "--set", "run.report_to=[]", "--steps", "2",
]  # fmt: skip


def test_the_closing_table_has_sft_long_and_compares_the_best_checkpoint_with_it(tmp_path):
    run = tmp_path / "run"
    assert main([*RUN, "--output", str(run)]) == 0
    report = json.loads((run / "report" / "report.json").read_text())
    best = list(report["models"])[2]  # step 2, or the start (step 0) where it scored higher
    assert list(report["models"]) == ["start", "sft", best, "sft-long"]
    assert best in ("best@0", "best@2")
    assert report["models"]["sft-long"]["tasks"] == 3
    assert {f"{best} - sft-long", "sft-long - sft", f"{best} - sft"} <= set(report["comparisons"])
    steps = [json.loads(x) for x in (run / "sft_long_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [1, 2, 3]


def test_warm_up_calls_after_step_with_the_model_and_each_steps_record():
    from agentgym.policy.models import load_configured
    from agentgym.sft.warmup import warm_up

    overrides = {"run.env": "cli_envs:cli_envs/TaughtDigits-v0", "sft.steps": 3,
                 "sft.demonstrations": 4, "sft.batch_size": 2, "lora.enabled": True}  # fmt: skip
    config = load_config(overrides=overrides)
    model, tokenizer = load_configured("tiny-random", config.model)
    seen = []

    def after_step(trained, record):
        seen.append((record["step"], record["step_seconds"] > 0, trained.training))
        trained.eval()  # as an evaluation leaves it; warm_up puts it back to training

    _, records = warm_up(model, tokenizer, config, after_step=after_step)
    assert seen == [(1, True, True), (2, True, True), (3, True, True)]
    assert [r["step"] for r in records] == [1, 2, 3]


def test_the_warm_ups_adamw_takes_sft_lr_and_optim_adam_epsilon(monkeypatch):
    import torch

    from agentgym.policy.models import load_configured
    from agentgym.sft.warmup import warm_up

    made = []

    class Recorded(torch.optim.AdamW):
        def __init__(self, params, **kwargs):
            super().__init__(params, **kwargs)
            made.append(self)

    monkeypatch.setattr(torch.optim, "AdamW", Recorded)
    overrides = {"run.env": "cli_envs:cli_envs/TaughtDigits-v0", "sft.steps": 1,
                 "sft.demonstrations": 2, "sft.batch_size": 2, "sft.lr": 3e-4,
                 "optim.adam_epsilon": 1e-6}  # fmt: skip
    config = load_config(overrides=overrides)
    model, tokenizer = load_configured("tiny-random", config.model)
    warm_up(model, tokenizer, config)
    (group,) = made[0].param_groups
    assert (len(made), group["lr"], group["eps"]) == (1, 3e-4, 1e-6)

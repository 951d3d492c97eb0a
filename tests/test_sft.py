"""SFT warm-up: demonstrations are correct episodes, masked like rollouts; SFT lowers the loss."""

from __future__ import annotations

import json

import pytest

from agentgym.cli import main
from agentgym.config import load_config
from agentgym.sft.warmup import demonstrations


@pytest.mark.parametrize(
    ("env", "kwargs", "best"),
    [
        ("math", {}, 1.0 + 0.1 * 0.3),
        ("tool_call", {"tool_format": "hermes"}, 1.0 + 0.5 + 0.1 * 0.3),
        ("tool_call", {"tool_format": "react"}, 1.0 + 0.5 + 0.1 * 0.3),
        ("code", {}, 1.0 + 0.1 * 0.3),
    ],
)
def test_demonstrations_earn_the_best_reward_and_train_only_the_agents_tokens(
    tiny, env, kwargs, best
):
    _, tokenizer = tiny
    config = load_config(overrides={"run.env": env, "run.env_kwargs": kwargs})
    demos = demonstrations(config, tokenizer, count=3, seed=1)
    assert len(demos) == 3
    for demo in demos:
        assert demo.reward == pytest.approx(best), demo.reward_parts
        agent = tokenizer.decode([t for t, m in zip(demo.tokens, demo.loss_mask, strict=True) if m])
        assert agent == "".join(turn.action + tokenizer.eos_token for turn in demo.turns)
        assert sum(demo.loss_mask[: demo.prompt_length]) == 0


def test_sft_lowers_the_loss_and_writes_a_checkpoint_train_can_start_from(tmp_path, capsys):
    out = tmp_path / "sft"
    argv = ["sft", "--env", "tool_call", "--model", "tiny-random", "--steps", "12"]
    sets = ["--set", "sft.lr=1e-3", "--set", "sft.demonstrations=8", "--set", "sft.batch_size=4"]
    assert main([*argv, "--output", str(out), *sets]) == 0
    losses = [json.loads(x)["sft/loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 12
    said = capsys.readouterr().out  # the console shows each step's loss, first to last
    assert f"sft: step 12: loss {losses[-1]:.3f}" in said
    assert f"sft: loss {losses[0]:.3f} -> {losses[-1]:.3f}" in said
    assert sum(losses[-3:]) / 3 < 0.9 * sum(losses[:3]) / 3
    checkpoint = out / "checkpoint-000012"
    argv = ["train", "--env", "tool_call", "--model", str(checkpoint), "--steps", "1"]
    small = ["--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=1",
             "--set", "sampling.max_new_tokens=8", "--set", "run.report_to=[]"]  # fmt: skip
    assert main([*argv, "--output", str(tmp_path / "grpo"), *small]) == 0

"""SFT warm-up: demonstrations are correct episodes, masked like rollouts; SFT lowers the loss."""

from __future__ import annotations

import json

import pytest

from agentgym.cli import main
from agentgym.config import load_config
from agentgym.env.core import make_env
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


def test_eval_of_a_checkpoint_plays_its_runs_env_and_sizes_tasks_to_the_split(tmp_path, capsys):
    data = tmp_path / "five.jsonl"
    rows = [{"prompt": f"What is {i} + {i}? Box it.", "answer": str(2 * i)} for i in range(5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = ["--env", "tasks", "--set", f"run.env_kwargs.data={data}",
           "--set", "run.env_kwargs.test_fraction=0.4"]  # fmt: skip
    sft = ["sft", "--model", "tiny-random", "--steps", "1", "--set", "sft.demonstrations=2"]
    assert main([*sft, *env, "--output", str(tmp_path / "sft")]) == 0
    checkpoint = tmp_path / "sft" / "checkpoint-000001"
    capsys.readouterr()
    out = tmp_path / "eval"
    small = ["--set", "eval.max_new_tokens=4"]
    assert main(["eval", "--model", str(checkpoint), "--output", str(out), *small]) == 0
    said = capsys.readouterr().out
    assert f"agentgym eval: {checkpoint} was trained on tasks {{'data': '{data}'" in said
    held = make_env("tasks", data=str(data), test_fraction=0.4).unwrapped.num_tasks("test")
    assert 1 <= held < 5
    assert f"eval.tasks 48, but the 'test' split of 'tasks' holds {held}: evaluating all" in said
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["env"] == "tasks" and report["meta"]["env_kwargs"]["data"] == str(data)
    assert report["models"]["model"]["tasks"] == held == len(report["tasks"]["model"])
    # an env named on the command line wins
    capsys.readouterr()
    argv = ["eval", "--model", str(checkpoint), "--env", "tool_call", "--tasks", "1", *small]
    assert main([*argv, "--output", str(tmp_path / "other")]) == 0
    assert "was trained on" not in capsys.readouterr().out

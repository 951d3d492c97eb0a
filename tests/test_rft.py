"""RFT: keeps exactly the verified episodes, fine-tunes on their sampled tokens alone, runs
as `agentgym rft`, and refuses bad configs before a model loads.

`ParityEnv` lives here so that the CLI can load it as `test_rft:test_rft/Parity-v0`
(pytest puts tests/ on sys.path): its verifier passes a reply of even length, so even a
random model passes about half its episodes and RFT has something to keep.
"""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from agentgym.cli import main
from agentgym.config import load_config
from agentgym.env.core import AgentEnv, Feedback, Task
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rewards.functions import RewardFunctions
from agentgym.rewards.score import score
from agentgym.rft.rejection_sampling import RFTRun, kept_episodes
from agentgym.run.setup import task_specs
from agentgym.sft.warmup import sft_loss
from agentgym.types import Batch, StepRecord, TaskSpec, Trajectory

PARITY = "test_rft:test_rft/Parity-v0"


class ParityEnv(AgentEnv):
    """One turn; correct when the reply has an even number of characters."""

    def num_tasks(self, split):
        return 8

    def task_id(self, split, index):
        return f"parity/{split}/{index}"

    def load_task(self, task_id):
        return Task(task_id=task_id, prompt=f"Reply with an even number of letters ({task_id}).")

    def respond(self, action):
        correct = float(len(action) % 2 == 0)
        return Feedback((), reward=correct, reward_parts={"correctness": correct}, terminated=True)


if "test_rft/Parity-v0" not in gym.registry:
    gym.register(id="test_rft/Parity-v0", entry_point=ParityEnv, max_episode_steps=1)


def episode(parts, reward, *, error=None, reward_error=None, sampled=2, name="t"):
    """A constructed one-turn episode: a 3-token prompt, then `sampled` sampled tokens."""
    tokens = tuple(range(5, 8 + sampled))
    mask = (0, 0, 0) + (1,) * sampled
    return Trajectory(name, 0, tokens, mask, (0.0,) * len(tokens), 3, reward, parts, (), "stop",
                      False, error=error, reward_error=reward_error)  # fmt: skip


def scored(episodes, length_penalty=0.0):
    record = StepRecord(1, 0, (TaskSpec(seed=0),), tuple(episodes))
    return score(record, None, length_penalty)


EPISODES = [
    episode({"correctness": 1.0, "format": 0.3}, 1.0, name="pass"),
    episode({"correctness": 0.0}, 0.0, name="fail"),
    episode({"correctness": 0.999}, 0.999, name="almost"),
    episode({"correctness": 1.0}, 1.0, error="RuntimeError: the env broke", name="env error"),
    episode({"correctness": 1.0}, math.nan, reward_error="reward is nan", name="reward error"),
    episode({"digits": 1.0}, 5.0, name="no verdict"),
    episode({"correctness": 2.0}, 1.5, name="two passing turns"),
    episode({"correctness": -1.0}, -1.0, name="no answer"),
]


def test_the_filter_keeps_exactly_the_scorable_episodes_with_correctness_at_least_one():
    kept = kept_episodes(scored(EPISODES))
    assert [t.task_id for t in kept] == ["pass", "two passing turns"]


@pytest.mark.parametrize(
    ("min_reward", "length_penalty", "names"),
    [
        (1.0, 0.0, ["pass", "two passing turns"]),  # equal to the threshold is enough
        (1.5, 0.0, ["two passing turns"]),
        (1.6, 0.0, []),
        (-5.0, 0.0, ["pass", "two passing turns"]),  # a low threshold keeps no failure
        (1.0, 0.25, ["two passing turns"]),  # 1.0 - 2 tokens x 0.25 = 0.5; 1.5 - 0.5 = 1.0
    ],
)
def test_min_reward_reads_the_reward_grpo_learns_from(min_reward, length_penalty, names):
    kept = kept_episodes(scored(EPISODES, length_penalty), min_reward)
    assert [t.task_id for t in kept] == names


def test_the_sft_loss_of_kept_episodes_is_the_nll_of_their_sampled_tokens_alone(tiny):
    model, tokenizer = tiny
    rows = [((11, 12, 13, 14, 15, 16), (0, 0, 1, 1, 0, 1)), ((21, 22, 23, 24), (0, 1, 1, 0))]
    passed = {"correctness": 1.0}
    kept = [
        Trajectory("k", 0, ids, mask, (0.0,) * len(ids), 1, 1.0, passed, (), "stop", False)
        for ids, mask in rows
    ]
    batch = Batch.from_trajectories(kept, torch.zeros(2), tokenizer.pad_token_id)
    with torch.no_grad():
        loss = float(sft_loss(model, batch))
        sampled, everything = [], []
        for ids, mask in rows:
            logp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
            for j in range(1, len(ids)):
                nll = -float(logp[j - 1, ids[j]])
                everything.append(nll)
                if mask[j]:
                    sampled.append(nll)
    assert len(sampled) == 5
    assert loss == pytest.approx(sum(sampled) / len(sampled), rel=1e-5)
    # the mask-0 tokens (prompt, tool results) would change it: the test can tell them apart
    assert abs(sum(everything) / len(everything) - loss) > 1e-3


def _weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _start(**overrides):
    """An RFTRun on `ParityEnv` with a fresh tiny-random model (its own: the tests train it)."""
    small = {"run.env": PARITY, "grpo.group_size": 2, "rft.tasks_per_round": 2,
             "sampling.max_new_tokens": 8, "sft.lr": 1e-3}  # fmt: skip
    config = load_config(overrides={**small, **overrides})
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    return RFTRun.start(config, model, tokenizer, RewardFunctions(config.rewards))


def test_a_round_that_keeps_nothing_takes_no_step_and_one_that_keeps_trains_on_them():
    run = _start(**{"rft.steps_per_round": 3, "sft.batch_size": 4})
    model, tokenizer = run.model, run.tokenizer
    try:
        record = run.play(1)
        assert len(record.trajectories) == 4 and all(t.scorable for t in record.trajectories)
        # GRPO's task stream: step 1 of a GRPO run with the same seed plays these tasks
        assert record.specs == tuple(task_specs(np.random.default_rng(0), 2))
        before = _weights(model)
        assert run.fine_tune([]) == []
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
        assert run.updates == 0 and run.sampler.version == 0 and not run.optimizer.state

        played = list(record.trajectories)  # all kept, as a verifier that passed them would
        pad_id = tokenizer.pad_token_id
        batch = Batch.from_trajectories(played, torch.zeros(len(played)), pad_id)
        with torch.no_grad():
            nll_before = float(sft_loss(model, batch))
        steps = run.fine_tune(played)
        with torch.no_grad():
            nll_after = float(sft_loss(model, batch))
    finally:
        run.close()
    assert len(steps) == 3 and all(s["grad_norm"] > 0 for s in steps)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(moved) >= len(before) // 2, moved
    assert nll_after < nll_before
    assert run.updates == 1 and run.sampler.version == 1


@pytest.mark.parametrize(("pool", "sizes"), [("round", [2, 0, 2]), ("all", [2, 2, 4])])
def test_the_pool_is_the_rounds_kept_episodes_or_all_rounds(pool, sizes):
    run = _start(**{"rft.pool": pool, "rft.steps_per_round": 1, "sft.batch_size": 2})
    try:
        played = list(run.play(1).trajectories)
        found = []
        for kept in (played[:2], [], played[2:]):
            steps = run.fine_tune(kept)
            assert len(steps) == (1 if kept else 0)  # an empty round takes no step, pool or not
            found.append(len(run.pool))
    finally:
        run.close()
    assert found == sizes
    assert run.updates == 2


SMALL = ["--set", "grpo.group_size=2", "--set", "rft.tasks_per_round=2",
         "--set", "sampling.max_new_tokens=8"]  # fmt: skip


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_rft_runs_two_rounds_and_writes_a_checkpoint_eval_and_rft_start_from(tmp_path, capsys):
    out = tmp_path / "rft"
    argv = ["rft", "--env", PARITY, "--model", "tiny-random", "--rounds", "2", *SMALL]
    sets = ["--set", "rft.steps_per_round=2", "--set", "sft.batch_size=2", "--set", "sft.lr=1e-3"]
    assert main([*argv, *sets, "--output", str(out)]) == 0
    rows = _rows(out)
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        assert (r["tasks"], r["episodes"], r["unscorable"]) == (2, 4, 0)
        assert r["kept_fraction"] == r["kept"] / 4
        assert (r["sft/loss"] is None) == (r["kept"] == 0) == (r["sft/steps"] == 0)
        assert r["seconds"] >= r["rollout_seconds"] > 0
    assert sum(r["kept"] for r in rows) > 0  # the seed's episodes: some even replies
    checkpoint = out / "checkpoint-000002"
    assert f"checkpoint written to {checkpoint}" in capsys.readouterr().out
    initial, _ = load_model_and_tokenizer("tiny-random")
    trained = load_file(checkpoint / "model.safetensors")
    assert any(not torch.equal(p, trained[n]) for n, p in initial.state_dict().items())

    report = tmp_path / "eval"
    ev = ["eval", "--env", PARITY, "--model", str(checkpoint), "--tasks", "2"]
    assert main([*ev, "--output", str(report), "--set", "sampling.max_new_tokens=8"]) == 0
    assert (report / "report.json").is_file()
    again = ["rft", "--env", PARITY, "--model", str(checkpoint), "--rounds", "1", *SMALL]
    assert main([*again, "--output", str(tmp_path / "again")]) == 0


def test_a_lora_run_trains_adapters_and_checkpoints_the_merged_model(tmp_path):
    out = tmp_path / "rft"
    argv = ["rft", "--env", PARITY, "--model", "tiny-random", "--rounds", "1", *SMALL]
    sets = ["--set", "lora.enabled=true", "--set", "sft.lr=1e-2", "--set", "sft.batch_size=2"]
    assert main([*argv, *sets, "--output", str(out)]) == 0
    assert _rows(out)[0]["sft/steps"] > 0
    checkpoint = out / "checkpoint-000001"
    assert not (checkpoint / "adapter_config.json").exists()
    initial, _ = load_model_and_tokenizer("tiny-random")
    trained = load_file(checkpoint / "model.safetensors")
    assert set(trained) <= set(initial.state_dict())  # a plain model: no adapter weights
    assert any(not torch.equal(p, trained[n]) for n, p in initial.state_dict().items())


def test_rounds_that_keep_nothing_are_logged_then_stop_the_run_with_its_checkpoint(
    tmp_path, capsys
):
    data = tmp_path / "tasks.jsonl"
    rows = [{"prompt": f"What is {i} + {i}?", "answer": 2 * i} for i in range(6)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rft"
    argv = ["rft", "--env", "tasks", "--model", "tiny-random", "--rounds", "4", *SMALL]
    sets = ["--set", f"run.env_kwargs.data={data}", "--set", "rft.max_empty_rounds=2"]
    assert main([*argv, *sets, "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "2 rounds in a row kept no episode (rft.max_empty_rounds)" in err
    rows = _rows(out)
    assert [(r["round"], r["kept"], r["sft/loss"], r["sft/steps"]) for r in rows] == [
        (1, 0, None, 0),
        (2, 0, None, 0),
    ]
    assert (out / "checkpoint-000002" / "COMPLETE").is_file()


def test_the_wall_budget_stops_after_the_round_it_ran_out_in(tmp_path):
    out = tmp_path / "rft"
    argv = ["rft", "--env", PARITY, "--model", "tiny-random", "--rounds", "5", *SMALL]
    assert main([*argv, "--set", "rft.max_seconds=0.001", "--output", str(out)]) == 0
    assert [r["round"] for r in _rows(out)] == [1]
    assert (out / "checkpoint-000001" / "COMPLETE").is_file()


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["--set", "rft.steps_per_round=0"], "rft.steps_per_round"),
        (["--rft.pool", "sometimes"], "rft.pool"),
        (["--set", "rft.max_seconds=-1"], "rft.max_seconds"),
        (["--set", "lora.enabled=true", "--set", "lora.target_modules=[]"], "lora.target_modules"),
        (["--env", "no_such_env"], "run.env"),
    ],
)
def test_a_bad_config_exits_2_naming_the_field_before_a_model_loads(
    tmp_path, capsys, monkeypatch, sets, field
):
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr("agentgym.rft.rejection_sampling.load_configured", refuse)
    out = tmp_path / "rft"
    argv = ["rft", "--env", PARITY, "--model", "tiny-random", "--rounds", "1", *SMALL, *sets]
    assert main([*argv, "--output", str(out)]) == 2
    assert field in capsys.readouterr().err
    assert not out.exists()

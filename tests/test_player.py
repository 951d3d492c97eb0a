"""The player seam (`agentgym.rollout.player`): a `Player` written outside the package
(`tests/players.py`, its environments served from threads of their own) trains and
evaluates through the CLI with `run.player`, and nothing under `agentgym/` names it; the
built-in turn loop is a player like it; a player that cannot be loaded, or two that are
named at once, are refused naming the option."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from players import ServedEnvPlayer
from safetensors.torch import load_file

from agentgym.cli import main
from agentgym.config import Config, load_config
from agentgym.env.core import make_env
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout.episodes import collect
from agentgym.rollout.player import Submission, TurnPlayer, load_player, user_player
from agentgym.rollout.sampler import InProcessSampler
from agentgym.types import TaskSpec

ROOT = Path(__file__).resolve().parent.parent
ENV = "cli_envs:cli_envs/TaughtDigits-v0"
SMALL = [
    "grpo.tasks_per_step=2", "grpo.group_size=4", "sampling.max_new_tokens=12",
    "optim.lr=5e-3", "run.report_to=[]",
]  # fmt: skip
TEXT_LENGTH = "rewards.functions=[{fn: 'reward_fns_fixture:text_length', weight: 1.0}]"


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny-random")


def test_a_player_written_outside_the_package_trains_two_steps_and_evaluates(tmp_path):
    ServedEnvPlayer.served_threads.clear()
    player = ["--set", "run.player=players:ServedEnvPlayer"]
    run = tmp_path / "run"
    sets = [*SMALL, "eval.every=2", "eval.tasks=2", "eval.report_tasks=0", TEXT_LENGTH]
    argv = ["train", "--env", ENV, "--model", "tiny-random", "--steps", "2", "--output", str(run)]
    assert main([*argv, *player, *(f"--set={s}" for s in sets)]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["failures/fraction"] == 0 for r in rows)
    # its episodes are learned from: rewards vary within groups and the weights move
    assert all(r["grad_norm"] > 0 for r in rows)
    start, _ = load_model_and_tokenizer("tiny-random")
    trained_weights = load_file(run / "checkpoint-000002" / "model.safetensors")
    assert any(not torch.equal(p, start.state_dict()[n]) for n, p in trained_weights.items())
    assert "eval/correctness" in rows[-1]  # the held-out evaluation at step 2, played by it
    trained = [json.loads(x) for x in (run / "trained.jsonl").read_text().splitlines()]
    assert [len(r["groups"]) for r in trained] == [2, 2]
    served = set(ServedEnvPlayer.served_threads)
    # every environment call went to a serving thread, none to the caller's
    assert served and threading.get_ident() not in served

    ServedEnvPlayer.served_threads.clear()
    report = tmp_path / "report"
    evaluate = ["eval", "--env", ENV, "--model", str(run / "checkpoint-000002"), "--tasks", "2"]
    assert (
        main([*evaluate, "--output", str(report), *player, "--set=sampling.max_new_tokens=8"]) == 0
    )
    tasks = json.loads((report / "report.json").read_text())["tasks"]["model"]
    assert len(tasks) == 2 and ServedEnvPlayer.served_threads


def test_the_player_is_named_nowhere_in_the_package():
    for path in (ROOT / "agentgym").rglob("*.py"):
        assert "ServedEnvPlayer" not in path.read_text(), path


def test_the_turn_player_plays_what_collect_plays_and_the_sampler_stamps_its_version(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    params = SamplingParams(max_new_tokens=6, seed=3)
    specs = (TaskSpec(seed=1), TaskSpec(seed=2))
    direct = collect([make_env(ENV) for _ in range(4)], specs, 2, policy, tokenizer, params)
    sampler = InProcessSampler([make_env(ENV) for _ in range(4)], policy, TurnPlayer(tokenizer))
    try:
        sampler.load_weights(lambda: [], 7)
        sampler.submit(Submission(specs, 2, params))
        played = sampler.poll(wait=True)
    finally:
        sampler.close()
    assert [t.tokens for t in played] == [t.tokens for t in direct]
    assert [t.group for t in played] == [0, 0, 1, 1]
    for t in played:
        assert t.token_versions == tuple(7 if m else -1 for m in t.loss_mask)
        assert 7 in t.token_versions


def test_a_submissions_share_keeps_its_groups_and_settings():
    params = SamplingParams(max_new_tokens=3)
    whole = Submission(tuple(TaskSpec(seed=s) for s in range(5)), 3, params, 40)
    part = whole.share(1, 3)
    assert part.specs == (TaskSpec(seed=1), TaskSpec(seed=2))
    assert (part.group_size, part.params, part.max_tokens) == (3, params, 40)
    assert (whole.episodes, part.episodes) == (15, 6)


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("players", r"give it as module:name"),
        ("no_such_module_here:Player", r"cannot import 'no_such_module_here'"),
        ("players:NoSuchPlayer", r"players has no callable 'NoSuchPlayer'"),
    ],
)
def test_a_player_that_cannot_be_loaded_is_refused_naming_run_player(path, error):
    with pytest.raises(ValueError, match=rf"^run.player '{path}': {error}"):
        load_player(path)


def test_a_factory_that_gives_no_player_is_refused_naming_what_it_lacks(tiny):
    config = Config.model_validate({"run": {"player": "players:gives_text"}})
    with pytest.raises(ValueError, match=r"gave a str, which has no play\(\)"):
        user_player(config, tiny[1])


def test_a_player_and_an_agent_at_once_are_refused():
    with pytest.raises(Exception, match="run.player with run.agent: each names who plays"):
        load_config(overrides={"run.player": "players:ServedEnvPlayer", "run.agent": "a:b"})


def test_a_player_that_cannot_be_loaded_stops_train_before_a_model_loads(tmp_path, capsys):
    argv = ["train", "--env", ENV, "--model", "tiny-random", "--steps", "1"]
    code = main([*argv, "--output", str(tmp_path / "run"), "--set", "run.player=players:NoSuch"])
    assert code == 2
    assert "run.player: players has no callable 'NoSuch'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()

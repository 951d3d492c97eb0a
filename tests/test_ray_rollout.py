"""Rollout workers as Ray actors: the same trajectories as in-process, restarts, the CLI.

One local Ray (2 CPUs) serves the module; its workers import this folder's
environments, as a user's workers import theirs.
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentgym.cli import main
from agentgym.config import Config, ConfigError, load_config
from agentgym.core import make_env
from agentgym.interrupt import TrainingError
from agentgym.learner import _wrap_lora
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy, merged_adapters
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.ray_rollout import RayRollout, require_ray, spread_groups
from agentgym.rollout import TaskSpec, collect

TESTS = Path(__file__).parent
SPECS = [TaskSpec(seed=11), TaskSpec(seed=12), TaskSpec(seed=13)]  # 2 + 1 over 2 workers
PARAMS = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(TESTS)}})  # fmt: skip
    yield ray
    ray.shutdown()


def _config(env: str, **overrides) -> Config:
    return load_config(overrides={
        "model.name": "tiny-random", "run.env": env, "lora.enabled": True, "lora.r": 4,
        "grpo.group_size": 2, "grpo.tasks_per_step": len(SPECS),
        "distributed.backend": "ray", "distributed.rollout_workers": 2, **overrides,
    })  # fmt: skip


def _trained_lora(config: Config):
    """tiny-random with LoRA adapters far from their zero start, so that they change samples."""
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    model = _wrap_lora(model, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    return model, tokenizer


def _in_process(config: Config, model, tokenizer, env: str | None = None):
    g = config.grpo.group_size
    envs = [make_env(env or config.run.env) for _ in range(len(SPECS) * g)]
    with merged_adapters(model):
        return collect(envs, SPECS, g, HFPolicy(model, tokenizer), tokenizer, PARAMS,
                       max_tokens=config.sampling.max_episode_tokens)  # fmt: skip


def _assert_same(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert (a.task_id, a.group, a.reward) == (b.task_id, b.group, b.reward)
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_groups_are_spread_whole_in_order_and_evenly():
    assert spread_groups(3, 2) == [range(0, 1), range(1, 3)]
    assert spread_groups(4, 2) == [range(0, 2), range(2, 4)]
    assert spread_groups(1, 3) == [range(0, 0), range(0, 0), range(0, 1)]


def test_without_ray_the_error_names_the_setting_and_the_install_command(monkeypatch):
    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ConfigError, match=r"distributed\.backend.*pip install 'ray>=2\.9'"):
        require_ray()


@pytest.mark.slow
def test_two_ray_workers_play_exactly_the_in_process_trajectories(ray_local):
    config = _config("tool_call")
    model, tokenizer = _trained_lora(config)
    expected = _in_process(config, model, tokenizer)
    untrained = _in_process(config, *load_model_and_tokenizer("tiny-random"))
    assert [t.tokens for t in untrained] != [t.tokens for t in expected]  # the weights matter
    weights = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    rollout = RayRollout(config, "tiny-random", weights)
    try:
        played = rollout.collect(SPECS, config.grpo.group_size, PARAMS,
                                 max_tokens=config.sampling.max_episode_tokens)  # fmt: skip
        assert [t.group for t in played] == [0, 0, 1, 1, 2, 2]
        _assert_same(played, expected)
        assert rollout.restarts == 0
    finally:
        rollout.close()


@pytest.mark.slow
def test_a_worker_that_dies_mid_rollout_is_restarted_and_replays_its_groups(ray_local, tmp_path):
    marker = tmp_path / "died"
    config = _config("ray_envs:ray_envs/CrashOnce-v0",
                     **{"run.env_kwargs": {"marker": str(marker)}})  # fmt: skip
    model, tokenizer = _trained_lora(config)
    weights = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    rollout = RayRollout(config, "tiny-random", weights)
    try:
        played = rollout.collect(SPECS, config.grpo.group_size, PARAMS,
                                 max_tokens=config.sampling.max_episode_tokens)  # fmt: skip
        assert marker.exists() and rollout.restarts == 1
        # the restarted worker got the current weights before it played its groups again
        digits = "cli_envs:cli_envs/Digits-v0"
        _assert_same(played, _in_process(config, model, tokenizer, env=digits))
        assert rollout.load_weights(weights) > 0 and rollout.restarts == 1
    finally:
        rollout.close()


@pytest.mark.slow
def test_a_worker_dying_past_max_worker_restarts_stops_with_a_clear_error(ray_local, tmp_path):
    config = _config("ray_envs:ray_envs/CrashOnce-v0", **{
        "run.env_kwargs": {"marker": str(tmp_path / "died")},
        "distributed.max_worker_restarts": 0,
    })  # fmt: skip
    rollout = RayRollout(config, "tiny-random", [])
    try:
        with pytest.raises(TrainingError, match=r"distributed\.max_worker_restarts=0"):
            rollout.collect(SPECS, config.grpo.group_size, PARAMS)
    finally:
        rollout.close()


def _run(out: Path, *extra: str) -> tuple[list[dict], list[dict]]:
    argv = ["train", "--env", "ray_envs:ray_envs/CrashOnce-v0", "--model", "tiny-random",
            "--steps", "2", "--output", str(out), "--set", "grpo.group_size=2",
            "--set", "grpo.tasks_per_step=3", "--set", "sampling.max_new_tokens=8",
            "--set", "optim.lr=1e-3", "--set", "run.tensorboard=false",
            "--set", "run.log_completions=100", *extra]  # fmt: skip
    assert main(argv) == 0

    def read(name):
        return [json.loads(line) for line in (out / name).read_text().splitlines()]

    return read("metrics.jsonl"), read("completions.jsonl")


@pytest.mark.slow
def test_two_cli_steps_on_two_ray_workers_train_as_in_process_through_a_worker_death(
    ray_local, tmp_path
):
    # a worker dies in step 1's rollout; without the marker, the env never ends its process
    dies = f"run.env_kwargs={{marker: {tmp_path / 'died'}}}"
    ray_rows, ray_episodes = _run(tmp_path / "ray", "--distributed", "ray",
                                  "--rollout-workers", "2", "--set", dies)  # fmt: skip
    local_rows, local_episodes = _run(tmp_path / "local")
    assert len(ray_episodes) == len(local_episodes) == 2 * 3 * 2
    keys = ("step", "task_id", "group", "turns", "reward")
    assert [[e[k] for k in keys] for e in ray_episodes] == [
        [e[k] for k in keys] for e in local_episodes
    ]  # step 2 too: the workers got step 1's update
    assert [r["rollout/worker_restarts"] for r in ray_rows] == [1.0, 1.0]
    assert all(r["rollout/sync_seconds"] > 0 for r in ray_rows)
    assert "rollout/sync_seconds" not in local_rows[0]
    assert any(r["grad_norm"] > 0 for r in ray_rows)
    initial, _ = load_model_and_tokenizer("tiny-random")
    ray_weights = load_file(tmp_path / "ray" / "checkpoint-000002" / "model.safetensors")
    local_weights = load_file(tmp_path / "local" / "checkpoint-000002" / "model.safetensors")
    start = initial.state_dict()
    moved = [n for n, p in ray_weights.items() if not torch.equal(p, start[n])]
    assert len(moved) >= len(ray_weights) // 2
    for name, p in ray_weights.items():
        assert torch.allclose(p, local_weights[name], atol=1e-5), name

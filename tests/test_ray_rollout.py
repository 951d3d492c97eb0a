"""Rollout workers as Ray actors: the same trajectories as in-process, restarts, the CLI.

One local Ray (2 CPUs) serves the module; its workers import this folder's
environments, as a user's workers import theirs.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentgym.cli import main
from agentgym.config import Config, ConfigError, load_config
from agentgym.env.core import make_env
from agentgym.learn.lora import wrap_lora as _wrap_lora
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy, merged_adapters
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.rollout.player import Submission
from agentgym.run.interrupt import TrainingError
from agentgym.run.preflight import require_ray
from agentgym.scale import ray_rollout
from agentgym.scale.players import make_player
from agentgym.scale.ray_rollout import RayRollout, spread_groups
from agentgym.sync import collective
from agentgym.sync.collective import SyncGroup

TESTS = Path(__file__).parent
SPECS = (TaskSpec(seed=11), TaskSpec(seed=12), TaskSpec(seed=13))  # 2 + 1 over 2 workers
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


def _step(config: Config) -> Submission:
    """A step's submission of `SPECS`, as the training loop makes it from `config`."""
    return Submission(SPECS, config.grpo.group_size, PARAMS, config.sampling.max_episode_tokens)


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


def test_collective_weight_sync_is_refused_without_ray_workers_or_through_a_ray_client():
    with pytest.raises(ConfigError, match=r"weight_sync 'collective'.*distributed\.backend 'ray'"):
        load_config(overrides={"distributed.weight_sync": "collective"})
    with pytest.raises(ConfigError, match=r"ray://.*'object_store'"):
        _config("tool_call", **{"distributed.weight_sync": "collective",
                                "distributed.ray_address": "ray://head:10001"})  # fmt: skip


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
        played = rollout.collect(_step(config))
        assert [t.group for t in played] == [0, 0, 1, 1, 2, 2]
        _assert_same(played, expected)
        assert rollout.restarts == 0
    finally:
        rollout.close()


def test_an_agent_program_plays_on_ray_workers_as_it_plays_in_process(ray_local):
    """`run.agent` is a player like the turn loop: each worker makes its own (its endpoint
    on the worker, the agent imported there) and plays its share as this process would."""
    config = _config("tool_call", **{"run.agent": "agents:tool_loop", "lora.enabled": False})
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    player = make_player(config, tokenizer)
    g = config.grpo.group_size
    envs = [make_env(config.run.env) for _ in range(len(SPECS) * g)]
    try:
        expected = player.play(HFPolicy(model, tokenizer), envs, _step(config))
    finally:
        player.close()
    assert any(t.turns for t in expected)
    rollout = RayRollout(config, "tiny-random", [])
    try:
        played = rollout.collect(_step(config))
        assert [t.group for t in played] == [0, 0, 1, 1, 2, 2]
        _assert_same(played, expected)
        # a worker does not know the policy version: the driver's sampler stamps it
        assert all(t.token_versions == () for t in (*played, *expected))
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
        played = rollout.collect(_step(config))
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
            rollout.collect(Submission(SPECS, config.grpo.group_size, PARAMS))
    finally:
        rollout.close()


@contextlib.contextmanager
def _within(ray, rollout: RayRollout, seconds: float):
    """Fails the block if it runs longer than `seconds`. Past them the rollout's workers
    are killed for good, which ends any wait on them: a wait without a limit then fails
    the test instead of hanging it (a Ray wait does not see Python's signals)."""
    fired = threading.Event()

    def unstick() -> None:
        fired.set()
        for actor in rollout._actors:
            ray.kill(actor, no_restart=True)

    timer = threading.Timer(seconds, unstick)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if fired.is_set():
            raise AssertionError(f"still waiting for a worker after {seconds:g} s")


def _stub_rollout(folder: Path, monkeypatch, timeout_s: float, weights=()) -> RayRollout:
    """Two `StubWorker`s (no model: they start in seconds), each given one batch, then
    waited for at most `timeout_s` a call: the config's limit is generous, so that a slow
    start (or a first batch's imports) cannot trip it."""
    from ray_stub_worker import StubWorker

    monkeypatch.setattr(ray_rollout, "RolloutWorker", StubWorker)
    config = _config("tool_call", **{"run.env_kwargs": {"stub_folder": str(folder)},
                                     "distributed.worker_timeout_s": 120})  # fmt: skip
    rollout = RayRollout(config, None, weights)
    assert rollout.timeout_s == 120  # distributed.worker_timeout_s
    assert rollout.collect(Submission(SPECS[:2], 2, PARAMS)) == []  # one group each
    rollout.timeout_s = timeout_s
    return rollout


WORKER_1 = r"rollout worker 1 \(actor [0-9a-f]{8,}\) did not answer "


def test_a_worker_whose_batch_hangs_stops_the_run_naming_it_within_the_timeout(
    ray_local, tmp_path, monkeypatch
):
    rollout = _stub_rollout(tmp_path, monkeypatch, timeout_s=2.0)
    try:
        (tmp_path / "hang-collect").touch()
        begun = time.monotonic()
        with (
            _within(ray_local, rollout, 60),
            pytest.raises(TrainingError, match=WORKER_1 + "its rollout batch within 2 s"),
        ):
            rollout.collect(Submission((TaskSpec(seed=1),), 2, PARAMS))  # one group: worker 1's
        assert time.monotonic() - begun < 10
    finally:
        rollout.close()


@pytest.mark.parametrize(
    ("hangs", "call"),
    [("hello", "a hello after a failure"), ("load_weights", "the weights sent after its restart")],
)
def test_a_restarted_worker_that_hangs_stops_the_run_naming_it(
    ray_local, tmp_path, monkeypatch, hangs, call
):
    # 10 s: time for Ray to restart the worker (a new process, its imports) before the hang
    rollout = _stub_rollout(tmp_path, monkeypatch, 10.0, [("w", torch.zeros(2))])
    try:
        (tmp_path / "crash-collect").touch()  # worker 1 dies; Ray restarts it
        (tmp_path / f"hang-{hangs}").touch()  # and its restart hangs in `_revive`
        with (
            _within(ray_local, rollout, 60),
            pytest.raises(TrainingError, match=f"{WORKER_1}{call} within 10 s"),
        ):
            rollout.collect(Submission((TaskSpec(seed=1),), 2, PARAMS))
        assert not (tmp_path / "crash-collect").exists()  # it did die
    finally:
        rollout.close()


def _trainable(model) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _learner_step(model, seed: int) -> None:
    """Stands in for an optimizer step: every trainable tensor changes, in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in _trainable(model):
            p.add_(torch.randn(p.shape, generator=generator) * 0.1)


def _assert_workers_hold(rollout: RayRollout, weights) -> None:
    names = [n for n, _ in weights]
    for w in range(2):
        theirs = rollout.worker_weights(w, names)
        for name, p in weights:
            assert torch.equal(theirs[name], p.detach()), f"worker {w}: {name}"


@pytest.mark.slow
def test_a_collective_sync_gives_both_workers_exactly_the_learners_weights(ray_local, monkeypatch):
    monkeypatch.setattr(collective, "BUCKET_BYTES", 4096)  # several buckets per sync
    config = _config("tool_call", **{"distributed.weight_sync": "collective"})
    model, tokenizer = _trained_lora(config)
    weights = _trainable(model)
    assert sum(p.numel() * 4 for _, p in weights) > 3 * 4096
    rollout = RayRollout(config, "tiny-random", weights)
    try:
        assert rollout.sync_path == "collective (gloo)"
        _assert_workers_hold(rollout, weights)
        _learner_step(model, 1)
        assert rollout.load_weights(weights) > 0
        assert rollout.sync_path == "collective (gloo)"
        _assert_workers_hold(rollout, weights)
        played = rollout.collect(_step(config))
        _assert_same(played, _in_process(config, model, tokenizer))
        assert rollout.restarts == 0 and rollout.collective_failures == 0
    finally:
        rollout.close()


def _kill_and_await_restart(ray, rollout: RayRollout, w: int) -> None:
    """Kills worker `w` and returns once its restarted process answers: `ray.kill` returns
    before the old process is gone, which could otherwise die during the next sync."""
    old = rollout._identities[w]
    ray.kill(rollout._actors[w], no_restart=False)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if ray.get(rollout._actors[w].hello.remote(), timeout=30)[0] != old:
                return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"worker {w} was not restarted within 120 s")


@pytest.mark.slow
def test_a_worker_killed_between_syncs_is_caught_up_and_joins_a_new_group(ray_local):
    config = _config("tool_call", **{"distributed.weight_sync": "collective"})
    model, _ = _trained_lora(config)
    weights = _trainable(model)
    rollout = RayRollout(config, "tiny-random", weights)
    try:
        _kill_and_await_restart(ray_local, rollout, 0)  # Ray restarts it, idle
        _learner_step(model, 2)
        rollout.load_weights(weights)
        assert rollout.restarts == 1 and rollout.sync_path == "collective (gloo)"
        _assert_workers_hold(rollout, weights)
    finally:
        rollout.close()


@pytest.mark.slow
def test_a_failed_broadcast_is_aborted_and_that_sync_goes_through_the_object_store(
    ray_local, monkeypatch, caplog
):
    config = _config("tool_call", **{"distributed.weight_sync": "collective"})
    model, _ = _trained_lora(config)
    weights = _trainable(model)
    rollout = RayRollout(config, "tiny-random", weights)
    try:
        send = SyncGroup.send

        def link_down(self, tensors):
            raise RuntimeError("link down")

        monkeypatch.setattr(SyncGroup, "send", link_down)  # the driver's side only
        _learner_step(model, 3)
        with caplog.at_level(logging.WARNING, logger="agentgym"):
            rollout.load_weights(weights)  # the workers' receives fail at once, not timed out
        assert "collective weight sync failed (link down)" in caplog.text
        assert rollout.sync_path == "object_store (collective failed)"
        assert rollout.collective_failures == 1
        _assert_workers_hold(rollout, weights)
        monkeypatch.setattr(SyncGroup, "send", send)
        _learner_step(model, 4)
        rollout.load_weights(weights)
        assert rollout.sync_path == "collective (gloo)"  # a new group
        _assert_workers_hold(rollout, weights)
    finally:
        rollout.close()


def _run(out: Path, *extra: str) -> tuple[list[dict], list[dict]]:
    argv = ["train", "--env", "ray_envs:ray_envs/CrashOnce-v0", "--model", "tiny-random",
            "--steps", "2", "--output", str(out), "--set", "grpo.group_size=2",
            "--set", "grpo.tasks_per_step=3", "--set", "sampling.max_new_tokens=8",
            "--set", "optim.lr=1e-3", "--set", "run.report_to=[]",
            "--set", "run.log_completions=100", *extra]  # fmt: skip
    assert main(argv) == 0

    def read(name):
        return [json.loads(line) for line in (out / name).read_text().splitlines()]

    return read("metrics.jsonl"), read("completions.jsonl")


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> tuple[Path, list[dict], list[dict]]:
    """The in-process run the Ray runs are compared with: its folder, metrics, episodes."""
    out = tmp_path_factory.mktemp("local") / "run"
    return out, *_run(out)


@pytest.mark.slow
@pytest.mark.parametrize("weight_sync", ["object_store", "collective"])
def test_two_cli_steps_on_two_ray_workers_train_as_in_process_through_a_worker_death(
    ray_local, local_run, tmp_path, weight_sync
):
    # a worker dies in step 1's rollout; without the marker, the env never ends its process
    dies = f"run.env_kwargs={{marker: {tmp_path / 'died'}}}"
    ray_rows, ray_episodes = _run(tmp_path / "ray", "--distributed", "ray",
                                  "--rollout-workers", "2", "--set", dies,
                                  "--set", f"distributed.weight_sync={weight_sync}")  # fmt: skip
    local_out, local_rows, local_episodes = local_run
    assert len(ray_episodes) == len(local_episodes) == 2 * 3 * 2
    keys = ("step", "task_id", "group", "turns", "reward")
    assert [[e[k] for k in keys] for e in ray_episodes] == [
        [e[k] for k in keys] for e in local_episodes
    ]  # step 2 too: the workers got step 1's update
    assert [r["rollout/worker_restarts"] for r in ray_rows] == [1.0, 1.0]
    assert all(r["rollout/sync_seconds"] > 0 for r in ray_rows)
    # the restarted worker caught up through the object store; the syncs took the chosen path
    path = "collective (gloo)" if weight_sync == "collective" else "object_store"
    assert [r["rollout/sync_path"] for r in ray_rows] == [path, path]
    assert "rollout/sync_seconds" not in local_rows[0]
    assert any(r["grad_norm"] > 0 for r in ray_rows)
    initial, _ = load_model_and_tokenizer("tiny-random")
    ray_weights = load_file(tmp_path / "ray" / "checkpoint-000002" / "model.safetensors")
    local_weights = load_file(local_out / "checkpoint-000002" / "model.safetensors")
    start = initial.state_dict()
    moved = [n for n, p in ray_weights.items() if not torch.equal(p, start[n])]
    assert len(moved) >= len(ray_weights) // 2
    for name, p in ray_weights.items():
        assert torch.allclose(p, local_weights[name], atol=1e-5), name


@pytest.mark.slow
def test_async_grpo_on_two_ray_workers_plays_each_step_as_in_process_async_does(
    ray_local, tmp_path
):
    """pipeline.max_off_policy_steps 1: the Ray workers play step t with the weights of
    version max(0, t - 2), as the in-process sampler does: the same episodes, step by step."""
    ahead = ("--steps", "3", "--set", "pipeline.max_off_policy_steps=1")
    local_rows, local_episodes = _run(tmp_path / "local", *ahead)
    ray_rows, ray_episodes = _run(tmp_path / "ray", *ahead, "--distributed", "ray",
                                  "--rollout-workers", "2")  # fmt: skip
    keys = ("step", "task_id", "group", "turns", "reward")
    assert [[e[k] for k in keys] for e in ray_episodes] == [
        [e[k] for k in keys] for e in local_episodes
    ]
    trained = [
        json.loads(line) for line in (tmp_path / "ray" / "trained.jsonl").read_text().splitlines()
    ]
    assert [g["versions"] for r in trained for g in r["groups"]] == [
        [max(0, r["step"] - 2)] * 2 for r in trained for _ in r["groups"]
    ]
    assert [r["async/staleness_max"] for r in ray_rows] == [0.0, 1.0, 1.0]
    assert any(r["grad_norm"] > 0 for r in ray_rows)

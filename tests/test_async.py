"""Asynchronous GRPO (`pipeline.max_off_policy_steps` k): the sampler plays the next steps'
tasks on a thread while the learner steps, each with the weights of version
max(start, t - 1 - k), staleness logged; a stopped run resumed trains every task of the
uninterrupted run once, and ends bitwise where it ends. The staleness rule by hand (stale
groups dropped and counted): tests/test_staleness.py."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from test_resume import _digest

from agentgym import faults, records
from agentgym.cli import main
from agentgym.config import Config
from agentgym.env.core import AgentEnv, Feedback, Task
from agentgym.learn.lora import wrap_lora
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout.ahead import AheadSampler
from agentgym.rollout.player import Submission, TurnPlayer
from agentgym.rollout.sampler import InProcessSampler
from agentgym.types import Message, TaskSpec

STEPS = 5
RUN = [
    "train", "--env", "cli_envs:cli_envs/Digits-v0", "--model", "tiny-random",
    "--set", "lora.enabled=true", "--set", "lora.r=4", "--set", "optim.lr=5e-3",
    "--set", "grpo.group_size=4", "--set", "grpo.tasks_per_step=3",
    "--set", "sampling.max_new_tokens=10", "--set", "run.report_to=[]",
    "--set", "run.save_every=2", "--steps", str(STEPS),
]  # fmt: skip
TESTS = Path(__file__).parent
TIMING = {"step_seconds", "rollout_seconds", "tokens_per_second", records.WEIGHT_SYNC_SECONDS}


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _trained(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "trained.jsonl").read_text().splitlines()]


def _weights(run: Path) -> str:
    return _digest((run / f"checkpoint-{STEPS:06d}" / "adapter_model.safetensors").read_bytes())


def _async(k: int) -> list[str]:
    return [*RUN, "--set", f"pipeline.max_off_policy_steps={k}"]


def test_with_k_1_each_step_trains_on_tokens_of_version_step_minus_2_and_logs_it(tmp_path):
    run = tmp_path / "run"
    assert main([*_async(1), "--output", str(run)]) == 0
    rows, trained = _metrics(run), _trained(run)
    assert [r["step"] for r in trained] == list(range(1, STEPS + 1))
    for row in trained:  # version max(0, step - 2): step 1 and 2 sampled by the start model
        want = max(0, row["step"] - 2)
        assert [g["versions"] for g in row["groups"]] == [[want, want]] * 3, row
    assert [r[records.STALENESS_MAX] for r in rows] == [0.0] + [1.0] * (STEPS - 1)
    assert [r[records.STALENESS_MEAN] for r in rows] == [0.0] + [1.0] * (STEPS - 1)
    assert all(r[records.STALE_GROUPS] == 0.0 for r in rows)
    assert all(r["grad_norm"] > 0 for r in rows)
    # the decoupled objective: the clip around the learner's own old logprobs, weights for
    # the sampler's; from step 2 on they differ (version step - 2 sampled, step - 1 learns)
    assert rows[0][records.IS_RATIO_MEAN] == 1.0
    assert all(r[records.IS_RATIO_MEAN] != 1.0 for r in rows[1:])


def test_the_synchronous_run_logs_no_async_figures_and_trains_on_the_newest_version(tmp_path):
    run = tmp_path / "run"
    assert main([*RUN, "--output", str(run)]) == 0
    assert not any(k.startswith("async/") for r in _metrics(run) for k in r)
    assert records.IS_RATIO_MEAN not in _metrics(run)[0]  # the sampler's logprobs are the old
    for row in _trained(run):
        assert all(g["versions"] == [row["step"] - 1] * 2 for g in row["groups"]), row


def test_the_sampler_plays_the_next_step_while_the_learner_steps(tmp_path, monkeypatch):
    """Counted, not timed: each update (but the last) waits until the sampler has begun
    playing the next step's tasks, which a synchronous loop would never do meanwhile."""
    import agentgym.run.train as train_module

    plays, begun = [], threading.Condition()
    real_play, real_update = InProcessSampler._play, train_module.update

    def play(self, submission):
        with begun:
            plays.append(threading.current_thread().name)
            begun.notify_all()
        return real_play(self, submission)

    def update(record, *args, **kwargs):
        if record.step < STEPS:
            with begun:
                assert begun.wait_for(lambda: len(plays) > record.step, timeout=60), (
                    f"step {record.step}: the sampler had not begun step {record.step + 1}"
                )
        return real_update(record, *args, **kwargs)

    monkeypatch.setattr(InProcessSampler, "_play", play)
    monkeypatch.setattr(train_module, "update", update)
    assert main([*_async(1), "--output", str(tmp_path / "run")]) == 0
    assert plays == ["agentgym-sampler"] * STEPS


def test_an_async_run_does_not_depend_on_timing(tmp_path, monkeypatch):
    """Two runs of a seed, the second with a sampler so slow that newer weights than the rule
    names are always there when it begins a step: bitwise the same weights, metrics and
    versions."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert main([*_async(2), "--output", str(first)]) == 0
    real_play = InProcessSampler._play

    def slow_play(self, submission):
        time.sleep(0.5)
        return real_play(self, submission)

    monkeypatch.setattr(InProcessSampler, "_play", slow_play)
    assert main([*_async(2), "--output", str(second)]) == 0
    assert _trained(first) == _trained(second)
    assert _metrics(first) == _metrics(second)
    assert _weights(first) == _weights(second)


def test_a_stopped_async_run_resumed_trains_every_task_of_the_whole_run_once(tmp_path, monkeypatch):
    """SIGTERM as step 2 ends (steps 3 and 4 already handed to the sampler, k = 2): the
    checkpoint goes back to before their tasks were drawn, so the resumed run draws them
    again, and holds the weights they are played with (versions 0 and 1); the tasks trained,
    counted from trained.jsonl, are the whole run's, each once, with the whole run's
    versions, and the run ends bitwise where the uninterrupted one does."""
    import agentgym.run.train as train_module

    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main([*_async(2), "--output", str(whole)]) == 0
    real, calls = train_module.train_step, []

    def train_step(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    with monkeypatch.context() as m:
        m.setattr(train_module, "train_step", train_step)
        assert main([*_async(2), "--output", str(split)]) == 0
    assert [r["step"] for r in _trained(split)] == [1, 2]
    assert main(["train", "--resume", str(split / "checkpoint-000002")]) == 0

    def tasks(run: Path) -> list[tuple[int, int]]:
        return [(r["step"], g["seed"]) for r in _trained(run) for g in r["groups"]]

    assert tasks(split) == tasks(whole)
    seeds = [seed for _, seed in tasks(split)]
    assert len(seeds) == len(set(seeds)) == STEPS * 3
    # step t played with version max(0, t - 1 - k), as in the uninterrupted run
    versions = {r["step"]: r["groups"][0]["versions"] for r in _trained(split)}
    assert versions == {1: [0, 0], 2: [0, 0], 3: [0, 0], 4: [1, 1], 5: [2, 2]}
    assert _trained(split) == _trained(whole)
    assert _metrics(split) == _metrics(whole)
    assert _weights(split) == _weights(whole)


def test_async_where_it_cannot_be_played_is_refused_naming_the_option():
    partial = {"max_off_policy_steps": 1, "partial_rollouts": True}
    with pytest.raises(ValueError, match="pipeline.partial_rollouts with run.agent"):
        Config.model_validate({"pipeline": partial, "run": {"agent": "a:b"}})
    Config.model_validate({"pipeline": {"max_off_policy_steps": 1}, "run": {"agent": "a:b"}})
    vllm = {"backend": "vllm", "enable_sleep_mode": True}
    with pytest.raises(ValueError, match="policy.enable_sleep_mode with pipeline.max_off"):
        Config.model_validate({"pipeline": {"max_off_policy_steps": 1}, "policy": vllm})
    vllm["enable_sleep_mode"] = False
    Config.model_validate({"pipeline": {"max_off_policy_steps": 1}, "policy": vllm})
    with pytest.raises(ValueError, match="partial_rollouts with policy.backend 'vllm'"):
        Config.model_validate({"pipeline": partial, "policy": vllm})
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Config.model_validate({"pipeline": {"max_off_policy_steps": -1}})


def test_an_error_while_playing_ahead_reaches_the_loop(tmp_path, monkeypatch):
    def broken(self, submission):
        raise RuntimeError("the sampler broke")

    monkeypatch.setattr(InProcessSampler, "_play", broken)
    with pytest.raises(RuntimeError, match="the sampler broke"):
        main([*_async(1), "--output", str(tmp_path / "run")])
    assert not [t for t in threading.enumerate() if t.name == "agentgym-sampler"]  # closed


def _in_a_process(argv: list[str], fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(TESTS)}
    env.pop(faults.VARIABLE, None)
    if fault is not None:
        env[faults.VARIABLE] = fault
    command = [sys.executable, "-m", "agentgym", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def _tasks(run: Path) -> list[tuple[int, int]]:
    return [(r["step"], g["seed"]) for r in _trained(run) for g in r["groups"]]


@pytest.fixture(scope="module")
def whole_async(tmp_path_factory) -> Path:
    """The uninterrupted run of k = 2 (one process), checkpoints every step."""
    run = tmp_path_factory.mktemp("whole") / "run"
    done = _in_a_process([*_async(2), "--set", "run.save_every=1", "--output", str(run)])
    assert done.returncode == 0, done.stderr[-2000:]
    return run


@pytest.mark.parametrize(
    ("fault", "died"),
    [
        ("kill@step_end:3", -signal.SIGKILL),  # between steps: step 3 logged, not saved
        ("kill@rollout:4", -signal.SIGKILL),  # the sampler begins step 4 during step 2 or 3
        ("kill@update:3", -signal.SIGKILL),  # mid-learner-step
        ("term@rollout:4", 0),  # SIGTERM: the step under way ends with a checkpoint
        ("term@update:3", 0),
    ],
)
def test_an_async_run_killed_or_stopped_anywhere_trains_each_task_once_after_resume(
    tmp_path, whole_async, fault, died
):
    """Stopped at a named point by AGENTGYM_FAULT (not by timing), then `--resume auto`:
    the tasks trained, counted from trained.jsonl, are the uninterrupted run's, each once,
    metrics.jsonl has every step once, and the run is bitwise the uninterrupted one (the
    checkpoint held the weights the steps handed ahead are played with)."""
    run = tmp_path / "run"
    argv = [*_async(2), "--set", "run.save_every=1", "--output", str(run)]
    stopped = _in_a_process(argv, fault)
    assert stopped.returncode == died, stopped.stderr[-2000:]
    assert len(_trained(run)) < STEPS  # it did stop early
    resumed = _in_a_process([*argv, "--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _tasks(run) == _tasks(whole_async)
    assert len(set(_tasks(run))) == STEPS * 3
    assert [r["step"] for r in _metrics(run)] == list(range(1, STEPS + 1))
    assert _trained(run) == _trained(whole_async)
    assert _metrics(run) == _metrics(whole_async)
    assert _weights(run) == _weights(whole_async)


def test_a_fault_point_that_does_not_parse_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(faults.VARIABLE, "kill@nowhere:3")
    with pytest.raises(ValueError, match=r"AGENTGYM_FAULT='kill@nowhere:3': expected"):
        faults.reached("update", 3)


class GatedTwoTurnEnv(AgentEnv):
    """Two turns; while `gate` is set, the first turn's tool says it `arrived` and waits
    until the gate opens (the test opens it after handing the sampler new weights: they
    arrive mid-episode, by design, not by timing)."""

    gate: threading.Event | None = None
    arrived = threading.Event()

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.turn = 0

    def num_tasks(self, split):
        return 8

    def task_id(self, split, index):
        return f"gated/{split}/{index}"

    def load_task(self, task_id):
        self.turn = 0
        return Task(task_id=task_id, prompt=f"Tell me about {task_id}.")

    def respond(self, action):
        self.turn += 1
        if self.turn == 1 and self.gate is not None:
            self.arrived.set()
            assert self.gate.wait(60), "the test never opened the gate"
        done = self.turn == 2
        reply = () if done else (Message("user", "The tool answered."),)
        return Feedback(reply, reward=float(done), reward_parts={}, terminated=done)


def _logprobs(model, tokens: tuple[int, ...]) -> torch.Tensor:
    """Each token's logprob under `model` (the first's is 0), in float64."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].double()
    picked = logits[:-1].log_softmax(-1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1, dtype=torch.float64), picked])


@pytest.mark.parametrize("tuning", ["full", "lora"])
def test_partial_rollouts_take_new_weights_between_turns_recomputing_the_cache(monkeypatch, tuning):
    """Step 2's episodes begin with version 0; new weights (version 1) arrive while their
    first tool call waits: the second turn is sampled with them. Each token records its
    version, and the second turn's logprobs are the new weights' over the whole episode
    (neither the old weights' keys and values kept, nor the old adapters left merged)."""
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    if tuning == "lora":
        model = wrap_lora(model, Config.model_validate({"lora": {"enabled": True, "r": 4}}))
    own = HFPolicy(copy.deepcopy(model), tokenizer)
    envs = [GatedTwoTurnEnv() for _ in range(4)]
    inner = InProcessSampler(envs, own, TurnPlayer(tokenizer), copies_weights=True)
    sampler = AheadSampler(inner, 1, partial_rollouts=True)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    try:
        sampler.submit(Submission((TaskSpec(seed=1), TaskSpec(seed=2)), 2, params))
        first = sampler.poll(wait=True)
        assert {v for t in first for v in t.token_versions if v >= 0} == {0}
        gate = threading.Event()
        monkeypatch.setattr(GatedTwoTurnEnv, "gate", gate)
        monkeypatch.setattr(GatedTwoTurnEnv, "arrived", threading.Event())
        sampler.submit(Submission((TaskSpec(seed=3), TaskSpec(seed=4)), 2, params))
        assert GatedTwoTurnEnv.arrived.wait(60)  # the first turn is sampled and at its tool
        torch.manual_seed(0)
        new = [
            (name, p.detach() + 0.5 * torch.randn_like(p))
            for name, p in model.named_parameters()
            if p.requires_grad
        ]
        sampler.load_weights(lambda: new, 1)
        gate.set()
        second = sampler.poll(wait=True)
    finally:
        sampler.close()
    fresh = copy.deepcopy(model)
    HFPolicy(fresh, tokenizer).load_weights(new)
    for t in second:
        (a, b), (c, d) = t.turn_spans
        assert t.token_versions[a:b] == (0,) * (b - a)
        assert t.token_versions[c:d] == (1,) * (d - c)
        assert set(t.token_versions) - {0, 1} == {-1}
        want = _logprobs(fresh, t.tokens)[c:d]
        got = torch.tensor(t.logprobs[c:d], dtype=torch.float64)
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_partial_rollouts_are_refused_where_they_cannot_be_played():
    with pytest.raises(ValueError, match="partial_rollouts needs pipeline.max_off_policy_steps"):
        Config.model_validate({"pipeline": {"partial_rollouts": True}})
    with pytest.raises(ValueError, match="distributed.backend must be 'none'"):
        Config.model_validate(
            {
                "pipeline": {"partial_rollouts": True, "max_off_policy_steps": 1},
                "distributed": {"backend": "ray"},
            }
        )


def _play_around_evaluations(evaluate: bool) -> list[tuple]:
    """Three steps played ahead (k = 1): step 1 and 2 with version 0, step 3 with version
    1; with `evaluate`, before step 2 and before step 3 an evaluation holds the thread and
    loads other weights (zeros) into the sampler's own policy, as one with a vLLM engine in
    this process does."""
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    trainable = [(n, p.detach().clone()) for n, p in model.named_parameters()]
    torch.manual_seed(0)
    version_1 = [(n, p + 0.5 * torch.randn_like(p)) for n, p in trainable]
    zeros = [(n, torch.zeros_like(p)) for n, p in trainable]
    own = HFPolicy(copy.deepcopy(model), tokenizer)
    envs = [GatedTwoTurnEnv() for _ in range(4)]
    inner = InProcessSampler(envs, own, TurnPlayer(tokenizer), copies_weights=True)
    sampler = AheadSampler(inner, 1, start=lambda: trainable)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    played = []
    try:
        sampler.submit(Submission((TaskSpec(seed=1), TaskSpec(seed=2)), 2, params))
        played += sampler.poll(wait=True)
        for step, seeds in ((2, (3, 4)), (3, (5, 6))):
            if step == 3:
                sampler.load_weights(lambda: version_1, 1)
            specs = tuple(TaskSpec(seed=s) for s in seeds)
            if not evaluate:
                sampler.submit(Submission(specs, 2, params))
            else:
                with sampler.paused():
                    sampler.policy.load_weights(zeros)
                    sampler.submit(Submission(specs, 2, params))
                    time.sleep(0.5)  # a thread that ignored the pause would have begun
                    assert sampler.poll(wait=False) == []
                    assert sampler.version == 0  # the weights of version 1 are not in yet
                assert sampler.version == step - 2  # put in by the block's end (step 3)
            played += sampler.poll(wait=True)
    finally:
        sampler.close()
    return [(t.task_id, t.tokens, t.logprobs, t.token_versions) for t in played]


def test_an_evaluation_holds_the_thread_and_the_sampler_plays_on_as_without_it():
    """`AheadSampler.paused`: the thread starts nothing while an evaluation uses its policy,
    and the block's end puts back the weights the next step is played with, from those
    kept (version 0, before step 2) or those handed over (version 1, before step 3)."""
    without = _play_around_evaluations(evaluate=False)
    assert [v for *_, versions in without for v in versions if v >= 0] != []
    assert sorted({v for *_, vs in without[8:] for v in vs if v >= 0}) == [1]
    assert _play_around_evaluations(evaluate=True) == without

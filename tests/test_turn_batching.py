"""Continuous batching over turns (`run.turn_batching`, issue 38): one decode batch that an
episode's turn leaves when it ends and its next turn joins when its tool replied, so no
episode waits for another's tool. Who waited for whom is counted, never timed."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from agentgym.cli import main
from agentgym.config import ConfigError, load_config
from agentgym.env.core import AgentEnv, Feedback, Task
from agentgym.policy.base import Generation, PolicyBase, SamplingParams, as_policy
from agentgym.policy.hf import HFPolicy
from agentgym.policy.kv_cache import ReservedCache, ReservedLayer, stack_rows
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.types import Message


class ManyTurnEnv(AgentEnv):
    """Task i ends after 1 + i % 3 turns; each reply's length grows with i and the turn, so
    episodes leave and rejoin the batch at different steps."""

    def num_tasks(self, split):
        return 8

    def task_id(self, split, index):
        return f"many/{split}/{index}"

    def load_task(self, task_id):
        self.index, self.turn = int(task_id.rsplit("/", 1)[1]), 0
        return Task(task_id=task_id, prompt=f"Say something about {self.index}.")

    def respond(self, action):
        self.turn += 1
        done = self.turn == 1 + self.index % 3
        reply = "Tool says" + " x" * (5 * self.index + self.turn)
        obs = () if done else (Message("user", reply),)
        return Feedback(obs, reward=len(action) / 10, reward_parts={}, terminated=done)


class Rendezvous(ManyTurnEnv):
    """Task 0's first tool waits (up to `wait_s`) for task 1's second tool call, and records
    whether it came: it can only come while task 0's tool is still out if task 1's turns go
    on without waiting for it."""

    def __init__(self, second_call: threading.Event, met: list[bool], wait_s: float = 1.0):
        super().__init__()
        self.second_call, self.met, self.wait_s = second_call, met, wait_s

    def respond(self, action):
        if self.index == 0 and self.turn == 0:
            self.met.append(self.second_call.wait(self.wait_s))
        if self.index == 1 and self.turn == 1:
            self.second_call.set()
        return super().respond(action)


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    return HFPolicy(model, tokenizer), tokenizer


SPECS = [TaskSpec(task_id=f"many/train/{i}") for i in range(6)]
PARAMS = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)


def _play(tiny, turn_batching, envs=None, specs=SPECS, workers=None):
    policy, tokenizer = tiny
    envs = envs or [ManyTurnEnv() for _ in range(2 * len(specs))]
    return collect(envs, specs, 2, policy, tokenizer, PARAMS, env_workers=workers,
                   turn_batching=turn_batching)  # fmt: skip


@pytest.mark.parametrize(
    ("turn_batching", "workers"), [("ordered", None), ("continuous", None), ("continuous", 1)]
)
def test_streamed_turns_sample_what_the_barrier_samples(tiny, turn_batching, workers):
    barrier = _play(tiny, "barrier")
    streamed = _play(tiny, turn_batching, workers=workers)  # 1: each reply in the loop itself
    assert sorted({len(t.turns) for t in barrier}) == [1, 2, 3]  # rows leave at different turns
    for a, b in zip(barrier, streamed, strict=True):
        assert (a.task_id, a.tokens, a.loss_mask, a.turns) == (
            b.task_id,
            b.tokens,
            b.loss_mask,
            b.turns,
        )
        # each row draws its own stream: only the sums over a different batch differ
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_ordered_turns_give_the_same_trajectories_for_a_seed(tiny):
    assert _play(tiny, "ordered") == _play(tiny, "ordered")


@pytest.mark.parametrize(
    ("turn_batching", "met"), [("continuous", True), ("ordered", False), ("barrier", False)]
)
def test_a_turn_waits_for_another_episodes_tool_only_when_told(tiny, turn_batching, met):
    second_call, seen = threading.Event(), []
    # the call can come only if the waiting does not hold task 1 back, however long it waits
    wait_s = 60.0 if met else 1.0
    envs = [Rendezvous(second_call, seen, wait_s) for _ in range(4)]
    played = _play(tiny, turn_batching, envs, SPECS[:2])
    assert seen == [met, met]  # both members of task 0's group
    assert [len(t.turns) for t in played] == [1, 1, 2, 2]


def test_a_turn_joining_a_running_batch_samples_what_it_samples_alone(tiny):
    policy, tokenizer = tiny
    prompts = [tokenizer.encode(f"Count to {n}:") for n in (3, 40, 7)]
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    alone = policy.generate([prompts[2]], params, [77])[0]
    with policy.reusing_cache(), policy.turn_stream(params) as turns:
        turns.add(0, prompts[0], 5)
        turns.add(1, prompts[1], 6)
        assert turns.step() == [] and len(turns) == 2  # both decoding, neither ended
        turns.add(2, prompts[2], 77)  # joins a batch three tokens wide on each row
        ended: dict[int, Generation] = {}
        while len(turns):
            ended.update(turns.step())
    assert sorted(ended) == [0, 1, 2]
    assert ended[2].ids == alone.ids
    assert ended[2].logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_no_more_rows_decode_than_the_policys_batch_size(tiny):
    _, tokenizer = tiny
    policy = HFPolicy(tiny[0].model, tokenizer, batch_size=2)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1)
    with policy.reusing_cache(), policy.turn_stream(params) as turns:
        for key in range(3):
            turns.add(key, tokenizer.encode(f"row {key}"), key)
        widths = []
        while len(turns):
            turns.step()
            widths.append(0 if turns.batch is None else len(turns.batch.keys))
    assert max(widths) == 2 and widths[-1] == 0


def _cache(keys: torch.Tensor) -> ReservedCache:
    """A one-layer cache holding `keys` [rows, 1, width, 1] as its keys and values."""
    cache = ReservedCache(keys.shape[2])
    layer = ReservedLayer(keys.shape[2])
    layer.update(keys, keys)
    cache.layers.append(layer)
    return cache


def test_stacked_rows_are_left_padded_and_drop_columns_no_row_attends():
    a = torch.tensor([[9.0, 1, 2], [9, 9, 3]]).view(2, 1, 3, 1)  # 9: padding
    b = torch.tensor([[4.0, 5, 6, 7]]).view(1, 1, 4, 1)
    mask_a, mask_b = torch.tensor([[0, 1, 1], [0, 0, 1]]), torch.ones(1, 4, dtype=torch.long)
    cache, mask = stack_rows([(_cache(a), mask_a), (_cache(b), mask_b)], extra=2)
    assert mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1]]
    keys = cache.layers[0].keys
    assert keys is not None and keys.shape == (3, 1, 4, 1)
    assert keys.flatten().tolist() == [0, 0, 1, 2, 0, 0, 9, 3, 4, 5, 6, 7]
    assert cache.get_seq_length() == 4


def test_a_policy_without_a_turn_stream_is_refused(tiny):
    policy, tokenizer = tiny

    class Plain:
        model = None

        def generate(self, prompts, params, streams=None):
            return policy.generate(prompts, params, streams)

    envs = [ManyTurnEnv() for _ in range(2)]
    with pytest.raises(
        ValueError, match=r"turn_batching 'continuous' needs a policy with a turn_stream"
    ):
        collect(envs, SPECS[:1], 2, Plain(), tokenizer, PARAMS, turn_batching="continuous")


def test_a_plain_policy_with_its_own_turn_stream_plays_continuous(tiny):
    """`streams_turns` is what a policy says it can do: a user's object that has a
    `turn_stream` gets it used (through `as_policy`), and plays as the backend it wraps."""
    policy, tokenizer = tiny
    opened = []

    class Wrapped:
        model = None

        def generate(self, prompts, params, streams=None):
            return policy.generate(prompts, params, streams)

        def reusing_cache(self):
            return policy.reusing_cache()

        def turn_stream(self, params):
            opened.append(params)
            return policy.turn_stream(params)

    assert as_policy(Wrapped()).streams_turns and not as_policy(PolicyBase()).streams_turns
    envs = [ManyTurnEnv() for _ in range(2)]
    wrapped = collect(envs, SPECS[:1], 2, Wrapped(), tokenizer, PARAMS, turn_batching="ordered")
    envs = [ManyTurnEnv() for _ in range(2)]
    direct = collect(envs, SPECS[:1], 2, policy, tokenizer, PARAMS, turn_batching="ordered")
    assert opened == [PARAMS]
    assert [t.tokens for t in wrapped] == [t.tokens for t in direct]


@pytest.mark.parametrize("turn_batching", ["continuous", "ordered"])
def test_a_turn_version_is_asked_as_each_turn_joins_the_batch(tiny, turn_batching):
    """Partial rollouts are refused with shared turns by the config (below), not by
    `collect`: with a `turn_version` each turn records the version asked as it joined."""
    policy, tokenizer = tiny
    asked = []

    def turn_version() -> int:
        asked.append(1)
        return len(asked)

    envs = [ManyTurnEnv() for _ in range(2 * 3)]
    played = collect(envs, SPECS[:3], 2, policy, tokenizer, PARAMS, turn_version=turn_version,
                     turn_batching=turn_batching)  # fmt: skip
    spans = [span for t in played for span in t.turn_spans]
    assert len(asked) == len(spans) > len(played)  # once a turn, and some episode had two
    seen = []
    for t in played:
        assert len(t.token_versions) == len(t.tokens)
        sampled = {i for a, b in t.turn_spans for i in range(a, b)}
        assert all(v == -1 for i, v in enumerate(t.token_versions) if i not in sampled)
        for a, b in t.turn_spans:
            (version,) = set(t.token_versions[a:b])
            seen.append(version)
        assert [t.token_versions[a] for a, _ in t.turn_spans] == sorted(
            t.token_versions[a] for a, _ in t.turn_spans
        )  # an episode's later turn joined later
    assert sorted(seen) == list(range(1, len(asked) + 1))  # each turn its own answer


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"pipeline.max_off_policy_steps": 1, "pipeline.partial_rollouts": True},
            "with pipeline.partial_rollouts",
        ),
        ({"run.agent": "agents:play"}, "with run.agent"),
    ],
)
def test_the_run_option_is_refused_where_turns_do_not_share_its_batch(extra, message):
    assert load_config(None, {"run.turn_batching": "ordered"}).run.turn_batching == "ordered"
    with pytest.raises(ConfigError, match=f"run.turn_batching 'continuous' {message}"):
        load_config(None, {"run.turn_batching": "continuous", **extra})
    with pytest.raises(ConfigError, match="run.turn_batching"):
        load_config(None, {"run.turn_batching": "sometimes"})


def _rows(run) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    timing = {"step_seconds", "rollout_seconds", "tokens_per_second"}
    return [{k: v for k, v in r.items() if k not in timing} for r in rows]


def test_a_run_with_ordered_turns_trains_as_the_barrier_run(tmp_path):
    """Two steps of GRPO: every first turn joins at once, as the barrier's batch starts, so
    one-turn episodes are computed alike and the runs are bitwise the same."""
    argv = ["train", "--env", "cli_envs:cli_envs/Digits-v0", "--model", "tiny-random",
            "--set", "grpo.group_size=4", "--set", "grpo.tasks_per_step=2", "--steps", "2",
            "--set", "sampling.max_new_tokens=10", "--set", "run.report_to=[]"]  # fmt: skip
    assert main([*argv, "--output", str(tmp_path / "barrier")]) == 0
    ordered = [*argv, "--set", "run.turn_batching=ordered", "--output", str(tmp_path / "o")]
    assert main(ordered) == 0
    assert _rows(tmp_path / "o") == _rows(tmp_path / "barrier")
    assert [r["step"] for r in _rows(tmp_path / "o")] == [1, 2]

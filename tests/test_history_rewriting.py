"""Templates that rewrite history (Qwen3-style thinking stripped from earlier turns; earlier
tool calls re-rendered): the rollout splits the episode into samples exactly where the
rendering stops extending the previous one; each sample's prompt is the conversation as
the template renders it at that turn, and its trained ids are the ids the policy sampled
there. An append-only template gives one sample, as before."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gymnasium as gym
import pytest

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.eval.episode_files import read_episodes
from agentgym.policy.base import Generation, SamplingParams
from agentgym.rollout.episodes import TaskSpec, collect, prompt_ids
from agentgym.run.runlog import rollout_metrics
from agentgym.tools import HERMES
from agentgym.types import ToolCall, Trajectory

TEMPLATES = Path(__file__).parent / "templates"
CALL = HERMES.render_call(ToolCall("calculator", {"expression": "2*3"}))
TURNS = [
    f"<think>\nI should compute it.\n</think>\n\n{CALL}",
    "<think>\nIt is 6.\n</think>\n\n\\boxed{6}",
]


class Scripted:
    """Turn k of the one episode is `turns[k]`, tokenized, then the template's turn end."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.sampled = tokenizer, turns, []

    def generate(self, prompts, params, streams=None):
        out = []
        for _ in prompts:
            ids = self.tokenizer.encode(self.turns[len(self.sampled)], add_special_tokens=False)
            ids += self.tokenizer.encode("<|im_end|>", add_special_tokens=False)
            self.sampled.append(tuple(ids))
            out.append(Generation(tuple(ids), tuple([-0.25] * len(ids)), "stop"))
        return out


def _play(tokenizer) -> tuple[Trajectory, Scripted]:
    env = gym.make("agentgym/ToolCall-v0", families=["calculator"], tool_format="hermes")
    policy = Scripted(tokenizer, TURNS)
    params = SamplingParams(max_new_tokens=64)
    (traj,) = collect([env], [TaskSpec(task_id="calculator/train/3")], 1, policy, tokenizer, params)
    return traj, policy


def _wearing(tiny, name: str):
    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.chat_template = (TEMPLATES / name).read_text()
    return tokenizer


def _trained(t: Trajectory) -> list[int]:
    return [i for i, m in zip(t.tokens, t.loss_mask, strict=True) if m]


@pytest.mark.parametrize("name", ["qwen3_style.jinja", "canonical_calls.jinja"])
def test_a_rewriting_template_splits_the_episode_where_the_rendering_stops_extending(tiny, name):
    tokenizer = _wearing(tiny, name)
    traj, policy = _play(tokenizer)
    assert traj.error is None and len(traj.turns) == 2
    (first,) = traj.split_samples
    assert traj.counts["split_samples"] == 1
    # each sample trains on exactly the ids sampled in it
    assert _trained(first) == list(policy.sampled[0]) and _trained(traj) == list(policy.sampled[1])
    # and counted: every sampled id compared, none re-tokenised (tokens/* on the metrics row)
    assert traj.counts["tokens_checked"] == sum(map(len, policy.sampled))
    assert traj.counts["tokens_resampled"] == 0
    row = rollout_metrics([traj])
    assert row["tokens/checked"] == sum(map(len, policy.sampled)) and row["tokens/resampled"] == 0
    assert first.tokens[first.prompt_length :] == policy.sampled[0]
    # the second sample's prompt: the conversation as the template renders it at turn 1
    messages = [m.to_dict() for m in traj.prompt_messages]
    messages += [{"role": "assistant", "content": TURNS[0]}]
    messages += [m.to_dict() for m in traj.turns[0].observation]
    assert list(traj.tokens[: traj.prompt_length]) == prompt_ids(tokenizer, messages)
    assert traj.tokens[traj.prompt_length :] == policy.sampled[1]
    prompt = tokenizer.decode(traj.tokens[: traj.prompt_length])
    if name == "qwen3_style.jinja":
        assert "I should compute it" not in prompt and CALL in prompt
    else:
        assert "I should compute it" in prompt and CALL not in prompt
        assert CALL.replace("\n", "") in prompt
    assert traj.reward == first.reward and first.turns == ()
    assert [r for r, _ in traj.step_rewards] == [traj.turns[1].reward]  # the last turn's


def test_an_append_only_template_gives_one_sample(tiny):
    traj, policy = _play(tiny[1])
    assert traj.split_samples == () and "split_samples" not in traj.counts
    assert traj.counts["tokens_checked"] == sum(map(len, policy.sampled))
    assert _trained(traj) == [i for ids in policy.sampled for i in ids]


def test_a_sample_whose_ids_are_not_the_sampled_ones_is_an_error_naming_episode_and_turn():
    from agentgym.rollout.samples import Sample, check_sampled

    class Ep:
        task_id, group, member = "t", 0, 1
        samples = [Sample((1, 2, 3), (0, 1, 1), (0.0, -1.0, -1.0), 1, ((1, 3),), ())]
        tokens, spans, sampled = [1, 9, 4], [(1, 3)], [(2, 3), (9, 5)]
        counts: dict[str, float] = {}

    with pytest.raises(AssertionError, match="episode 't' .*member 1.*turn 1: 1 of the ids"):
        check_sampled(Ep())
    assert Ep.counts == {"tokens_checked": 4.0, "tokens_resampled": 1.0}
    Ep.sampled = [(2, 3), (9, 4)]
    check_sampled(Ep())
    assert Ep.counts == {"tokens_checked": 4.0, "tokens_resampled": 0.0}
    Ep.sampled = [(2, 3)]  # a turn trained on that was never sampled
    with pytest.raises(AssertionError, match="2 trained turns for 1 sampled"):
        check_sampled(Ep())


def test_resampled_counts_each_differing_missing_or_extra_id_per_turn():
    from agentgym.rollout.samples import resampled

    tokens = [7, 1, 2, 3, 4, 5]
    assert resampled(tokens, [(1, 3), (3, 6)], [(1, 2), (3, 4, 5)]) == [0, 0]
    assert resampled(tokens, [(1, 3), (3, 6)], [(1, 9), (3, 0, 0)]) == [1, 2]
    assert resampled(tokens, [(1, 3)], [(1, 2, 8)]) == [1]  # one sampled id not trained on
    assert resampled(tokens, [(1, 4)], [(1, 2)]) == [1]  # one trained id never sampled
    assert resampled(tokens, [(1, 3)], [(2, 1)]) == [2]  # order matters


@pytest.mark.slow
def test_a_three_step_run_under_a_rewriting_template_trains_every_sample_as_sampled(tmp_path):
    from agentgym.cli import main

    out = tmp_path / "run"
    argv = ["train", "--env", "cli_envs:cli_envs/ChattyDigits-v0", "--model", "tiny-random",
            "--steps", "3", "--set", f"model.chat_template={TEMPLATES / 'qwen3_style.jinja'}",
            "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2",
            "--set", "sampling.max_new_tokens=8", "--set", "run.report_to=[]",
            "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        # 4 episodes of 3 turns, the template rewriting at each turn: 3 samples an episode
        assert row["agent/split_samples"] == 4 * 2
        assert row["tokens/resampled"] == 0 and row["tokens/checked"] > 0
    meta, _ = read_episodes(out / "episodes" / "step-000003.npz")
    for episode in meta["episodes"]:
        assert len(episode["samples"]) == 2 and episode["opened_by"].startswith("turn 2: ")
        assert episode["samples"][1]["opened_by"].startswith("turn 1: the template re-rendered")

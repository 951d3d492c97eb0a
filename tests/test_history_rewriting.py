"""Templates that rewrite history (Qwen3-style thinking stripped from earlier turns; earlier
tool calls re-rendered): the rollout splits the episode into samples exactly where the
rendering stops extending the previous one; each sample's prompt is the conversation as
the template renders it at that turn, and its trained ids are the ids the policy sampled
there. An append-only template gives one sample, as before."""

from __future__ import annotations

import copy
from pathlib import Path

import gymnasium as gym
import pytest

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.policy.base import Generation, SamplingParams
from agentgym.rollout.episodes import TaskSpec, collect, prompt_ids
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
    assert _trained(traj) == [i for ids in policy.sampled for i in ids]


def test_a_sample_whose_ids_are_not_the_sampled_ones_is_an_error_naming_episode_and_turn():
    from agentgym.rollout.samples import Sample, check_sampled

    class Ep:
        task_id, group, member = "t", 0, 1
        samples = [Sample((1, 2, 3), (0, 1, 1), (0.0, -1.0, -1.0), 1, ((1, 3),), ())]
        tokens, spans, sampled = [1, 9, 4], [(1, 3)], [(2, 3), (9, 5)]

    with pytest.raises(AssertionError, match="episode 't' .*member 1.*turn 1: the ids"):
        check_sampled(Ep())
    Ep.sampled = [(2, 3), (9, 4)]
    check_sampled(Ep())

"""The rollout: group structure, the loss mask, and token-exact multi-turn trajectories."""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import pytest
import torch

from agentgym.env.core import AgentEnv, Feedback, Task
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.types import Batch, Message


class ThreeTurnEnv(AgentEnv):
    """A real multi-turn env for tests: replies with a tool message until the third turn."""

    def num_tasks(self, split):
        return 5

    def task_id(self, split, index):
        return f"{split}/{index}"

    def load_task(self, task_id):
        return Task(task_id=task_id, prompt=f"Task {task_id}: count to three.")

    def respond(self, action):
        turn = sum(m.role == "assistant" for m in self.messages) + 1
        done = turn >= 3
        reply = () if done else (Message("tool", f"turn {turn} seen", name="counter"),)
        return Feedback(reply, reward=float(turn), reward_parts={"turns": 1.0}, terminated=done)


@pytest.fixture(scope="module", autouse=True)
def _register():
    gym.register(id="tests/ThreeTurn-v0", entry_point=ThreeTurnEnv, max_episode_steps=5)
    yield
    del gym.registry["tests/ThreeTurn-v0"]


def _run(tiny, specs, group_size, max_new_tokens=6):
    model, tokenizer = tiny
    envs = [gym.make("tests/ThreeTurn-v0") for _ in range(len(specs) * group_size)]
    params = SamplingParams(max_new_tokens=max_new_tokens, seed=0)
    return collect(envs, specs, group_size, HFPolicy(model, tokenizer), tokenizer, params)


def test_groups_share_a_task_and_mask_only_sampled_tokens(tiny):
    trajs = _run(tiny, [TaskSpec(seed=1), TaskSpec(seed=2)], group_size=3)
    assert [t.group for t in trajs] == [0, 0, 0, 1, 1, 1]
    assert len({t.task_id for t in trajs[:3]}) == 1 and len({t.task_id for t in trajs[3:]}) == 1
    for t in trajs:
        assert len(t.tokens) == len(t.loss_mask) == len(t.logprobs)
        assert set(t.loss_mask[: t.prompt_length]) == {0}
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 1)
        # three turns: rewards 1 + 2 + 3; parts summed over turns
        assert len(t.turns) == 3 and t.reward == 6.0 and t.reward_parts == {"turns": 3.0}
        assert t.prompt_messages[-1].role == "user"


def test_tool_replies_sit_between_turns_with_mask_zero(tiny):
    _, tokenizer = tiny
    (traj,) = _run(tiny, [TaskSpec(task_id="train/3")], group_size=1)
    runs, current = [], None  # maximal runs of equal mask values after the prompt
    for m in traj.loss_mask[traj.prompt_length :]:
        if m != current:
            runs.append(m)
            current = m
    assert runs == [1, 0, 1, 0, 1]  # sampled, tool reply, sampled, tool reply, sampled
    env_text = tokenizer.decode(
        [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m == 0][
            traj.prompt_length :
        ]
    )
    assert "turn 1 seen" in env_text and "turn 2 seen" in env_text
    assert traj.task_id == "train/3"


def test_a_stopped_conversation_tokenizes_as_the_template_renders_it(tiny):
    model, tokenizer = tiny
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    head = model.get_output_embeddings()
    saved = head.weight.data[stop_id].clone()
    try:  # make every turn end with the stop token after a few tokens at most
        head.weight.data[stop_id] = 50 * model.get_input_embeddings().weight.data.abs().max()
        (traj,) = _run(tiny, [TaskSpec(task_id="train/0")], group_size=1)
    finally:
        head.weight.data[stop_id] = saved
    assert traj.finish_reason == "stop"
    messages = [m.to_dict() for m in traj.prompt_messages]
    for turn in traj.turns:
        messages.append({"role": "assistant", "content": turn.action})
        messages.extend(m.to_dict() for m in turn.observation)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(list(traj.tokens)) == rendered.rstrip("\n")


def test_batch_aligns_masks_and_logprobs_with_target_tokens(tiny):
    trajs = _run(tiny, [TaskSpec(seed=5)], group_size=2)
    advantages = torch.tensor([0.5, -0.5])
    batch = Batch.from_trajectories(trajs, advantages, pad_id=0)
    for i, t in enumerate(trajs):
        n = len(t.tokens)
        assert batch.input_ids[i, :n].tolist() == list(t.tokens)
        assert batch.loss_mask[i, : n - 1].tolist() == [float(m) for m in t.loss_mask[1:]]
        assert batch.old_logprobs[i, : n - 1].tolist() == pytest.approx(list(t.logprobs[1:]))
        assert batch.loss_mask[i, n - 1 :].sum() == 0 and batch.attention_mask[i].sum() == n
    micro = batch.split(1)
    assert [m.size for m in micro] == [1, 1]
    assert micro[0].input_ids.shape[1] == len(trajs[0].tokens)


def test_a_turn_cut_at_a_stop_string_is_closed_by_the_template_s_end_of_turn(tiny):
    model, tokenizer = tiny
    envs = [gym.make("tests/ThreeTurn-v0")]
    spec, policy = [TaskSpec(task_id="train/1")], HFPolicy(model, tokenizer)
    params = SamplingParams(max_new_tokens=8, seed=0)
    (whole,) = collect(envs, spec, 1, policy, tokenizer, params)
    stop = whole.turns[0].action[2:5]  # the first turn is cut where this string ends
    (cut,) = collect(envs, spec, 1, policy, tokenizer, replace(params, stop=(stop,)))
    first, uncut = cut.turns[0].action, whole.turns[0].action
    assert stop in first and uncut.startswith(first) and first != uncut
    start, end = cut.turn_spans[0]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert cut.tokens[end - 1] != im_end  # the turn ended on the string, not the stop token
    assert cut.tokens[end] == im_end and cut.loss_mask[end] == 0  # the glue closes it
    messages = [m.to_dict() for m in cut.prompt_messages]
    for turn in cut.turns:
        messages.append({"role": "assistant", "content": turn.action})
        messages.extend(m.to_dict() for m in turn.observation)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(list(cut.tokens)).startswith(rendered.rsplit("<|im_end|>", 1)[0])

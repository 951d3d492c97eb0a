"""Multi-turn tool rollouts driven by a scripted policy: the mask is the agent's tokens only.

`ScriptedPolicy` is a test double for the policy: it "samples" known text, so
the test knows exactly which ids the agent produced and can check that the
loss mask is 1 on those ids and 0 on every template and tool-result token.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.policy.base import Generation, SamplingParams
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.tools.formats import get_format
from agentgym.types import ToolCall


class ScriptedPolicy:
    """Answers turn k of every episode with `script[k]`, tokenized, then the stop token."""

    def __init__(self, tokenizer, script: list[str]):
        self.tokenizer, self.script = tokenizer, script
        self.emitted: list[list[int]] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams, streams=None
                 ) -> list[Generation]:  # fmt: skip
        out = []
        for prompt in prompts:
            turn = self.tokenizer.decode(prompt).count("<|im_start|>assistant") - 1
            ids = self.tokenizer.encode(self.script[turn], add_special_tokens=False)
            ids.append(self.tokenizer.eos_token_id)
            self.emitted.append(ids)
            out.append(Generation(tuple(ids), tuple([-0.5] * len(ids)), "stop"))
        return out


def _reference_script(task_id: str, fmt: str) -> list[str]:
    env = gym.make("agentgym/ToolCall-v0", tool_format=fmt).unwrapped
    calls, answer = env.reference_solution(task_id)
    render = get_format(fmt).render_call
    turns = [("Thought: I need a tool.\n" if fmt == "react" else "") + render(c) for c in calls]
    final = f"Final Answer: {answer}" if fmt == "react" else f"The answer is \\boxed{{{answer}}}."
    return [*turns, final]


def _play(tokenizer, task_id: str, fmt: str, script: list[str], group_size: int = 2):
    policy = ScriptedPolicy(tokenizer, script)
    envs = [gym.make("agentgym/ToolCall-v0", tool_format=fmt) for _ in range(group_size)]
    trajs = collect(envs, [TaskSpec(task_id=task_id)], group_size, policy, tokenizer,
                    SamplingParams(max_new_tokens=256))  # fmt: skip
    return trajs, policy


@pytest.mark.parametrize("fmt", ["hermes", "react"])
@pytest.mark.parametrize("task_id", ["calculator/train/3", "sql/train/5", "chain/train/7"])
def test_mask_is_one_exactly_on_the_policys_tokens(tiny, fmt, task_id):
    _, tokenizer = tiny
    script = _reference_script(task_id, fmt)
    trajs, policy = _play(tokenizer, task_id, fmt, script)
    group = len(trajs)
    for e, traj in enumerate(trajs):
        assert len(traj.turns) == len(script)
        sampled = [list(traj.tokens[a:b]) for a, b in traj.turn_spans]
        # every turn generates for all live episodes in one call, in episode order
        assert sampled == [policy.emitted[k * group + e] for k in range(len(script))]
        inside = {i for a, b in traj.turn_spans for i in range(a, b)}
        for i, m in enumerate(traj.loss_mask):
            assert m == (1 if i in inside else 0), i
        agent_text = tokenizer.decode(
            [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
        )
        assert agent_text == "".join(text + tokenizer.eos_token for text in script)
        env_text = tokenizer.decode(
            [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if not m]
        )
        assert all(text not in env_text for text in script)


@pytest.mark.parametrize("fmt", ["hermes", "react"])
def test_the_reference_solution_earns_the_maximum_reward(tiny, fmt):
    _, tokenizer = tiny
    task_id = "chain/train/7"
    trajs, _ = _play(tokenizer, task_id, fmt, _reference_script(task_id, fmt))
    for traj in trajs:
        assert traj.reward_parts == pytest.approx({"correctness": 1.0, "tool": 1.0, "format": 0.3})
        assert traj.reward == pytest.approx(1.0 + 0.5 + 0.1 * 0.3)
        assert _env_counts(traj) == {"tool_calls": 2.0}


def test_bad_calls_are_counted_by_kind_and_the_episode_goes_on(tiny):
    _, tokenizer = tiny
    script = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1",}}</tool_call>',
        '<tool_call>{"name": "weather", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": 12}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>',
        "I give up. \\boxed{0}",
    ]
    trajs, _ = _play(tokenizer, "calculator/train/3", "hermes", script, group_size=1)
    (traj,) = trajs
    assert _env_counts(traj) == {
        "tool_calls": 4.0,
        "tool_errors/invalid_json": 1.0,
        "tool_errors/unknown_tool": 1.0,
        "tool_errors/invalid_arguments": 1.0,
        "tool_errors/tool_raised": 1.0,
    }
    replies = [m.content for turn in traj.turns for m in turn.observation]
    assert len(replies) == 4 and all(r.startswith("Error: ") for r in replies)
    assert "calculator" in replies[1]  # the unknown-tool message lists the tools
    assert traj.reward_parts["format"] == pytest.approx(-0.2)


def test_tool_metrics_aggregate_error_rates_by_kind(tiny):
    from agentgym.run.runlog import rollout_metrics

    _, tokenizer = tiny
    bad = ['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "\\boxed{1}"]
    trajs, _ = _play(tokenizer, "calculator/train/3", "hermes", bad, group_size=2)
    metrics = rollout_metrics(trajs)
    assert metrics["tools/calls_per_episode"] == 1.0
    assert metrics["tools/error_rate"] == 1.0
    assert metrics["tools/error_rate/unknown_tool"] == 1.0


def test_an_episode_over_the_token_budget_is_truncated(tiny):
    _, tokenizer = tiny
    call = get_format("hermes").render_call(ToolCall("calculator", {"expression": "2*3"}))
    policy = ScriptedPolicy(tokenizer, [call] * 6)
    envs = [gym.make("agentgym/ToolCall-v0")]
    spec, budget = TaskSpec(task_id="calculator/train/3"), len_prompt_plus(tokenizer)
    params = SamplingParams(max_new_tokens=64)
    (traj,) = collect(envs, [spec], 1, policy, tokenizer, params, max_tokens=budget)
    assert traj.truncated and len(traj.turns) < 6


def len_prompt_plus(tokenizer) -> int:
    env = gym.make("agentgym/ToolCall-v0")
    obs, _ = env.reset(options={"task_id": "calculator/train/3"})
    rendered = tokenizer.apply_chat_template(obs, add_generation_prompt=True, tokenize=False)
    return len(tokenizer.encode(rendered, add_special_tokens=False)) + 60


def _opening_and_play(tokenizer, budget_from_opening):
    """The task's opening length, then one episode played under the budget it gives."""
    spec, params = TaskSpec(task_id="calculator/train/3"), SamplingParams(max_new_tokens=64)
    policy = ScriptedPolicy(tokenizer, ["\\boxed{6}"])
    envs = [gym.make("agentgym/ToolCall-v0")]
    (first,) = collect(envs, [spec], 1, policy, tokenizer, params, max_tokens=None)
    opening, policy.emitted = first.prompt_length, []
    budget = budget_from_opening(opening)
    (traj,) = collect(envs, [spec], 1, policy, tokenizer, params, max_tokens=budget)
    return opening, traj, policy


@pytest.mark.parametrize("over", [0, 1, 500])
def test_an_opening_that_fills_the_budget_is_truncated_before_it_samples(tiny, over):
    opening, traj, policy = _opening_and_play(tiny[1], lambda n: n - over)
    assert traj.truncated and traj.error is None  # played and failed, not unscorable
    assert policy.emitted == [] and traj.turns == () and not any(traj.loss_mask)
    assert traj.reward == 0.0 and len(traj.tokens) == traj.prompt_length == opening


def test_an_opening_one_token_under_the_budget_samples_its_turn(tiny):
    _, traj, policy = _opening_and_play(tiny[1], lambda n: n + 1)
    assert len(policy.emitted) == 1 and any(traj.loss_mask) and len(traj.turns) == 1


def _env_counts(traj):
    """The environment's counters, after checking the rollout's own: every sampled id
    compared with the trained one (`tokens_checked`: the mask's ones), none differing."""
    assert traj.counts["tokens_checked"] == sum(traj.loss_mask[traj.prompt_length :])
    assert traj.counts["tokens_resampled"] == 0
    return {k: v for k, v in traj.counts.items() if not k.startswith("tokens_")}

"""The rollout token by token: the loss mask, the glue between turns, errors and truncation.

A character tokenizer with a small chat template stands in for a real one, so
every expected trajectory is written out by hand: one id per character, ids
2 and 3 special (BOS, added only when asked, and the end of turn).

Written against the mutants `make mutate` found alive in `agentgym.rollout.episodes`.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re

import gymnasium as gym
import pytest

from agentgym.policy.base import Generation, SamplingParams
from agentgym.rollout.episodes import TaskSpec, collect, continuation_ids
from agentgym.types import Message, Turn

BOS, EOS = "\x02", "\x03"


class CharTokenizer:
    """One id per character. Its template numbers each message and closes an assistant
    turn with EOS and the message's number, so the glue depends on where it stands."""

    eos_token = EOS
    all_special_ids = [ord(BOS), ord(EOS)]

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert tokenize is False
        text = ""
        for i, m in enumerate(messages, 1):
            if m["role"] == "assistant":
                text += f"[{i} assistant]{m['content']}{EOS}[/{i}]\n"
            else:
                text += f"[{i} {m['role']}]{m['content']}\n"
        if add_generation_prompt:
            text += f"[{len(messages) + 1} assistant]"
        return text

    def encode(self, text, add_special_tokens=True):
        return ([ord(BOS)] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        special = self.all_special_ids if skip_special_tokens else []
        return "".join(chr(i) for i in ids if i not in special)


TOKENIZER = CharTokenizer()
OPENING = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
PROMPT = "[1 system]S\n[2 user]Q\n[3 assistant]"


def ids(text: str) -> tuple[int, ...]:
    return tuple(ord(c) for c in text)


class ScriptedEnv(gym.Env):
    """Answers step k with `script[k]` (an exception is raised); records what it was given."""

    def __init__(self, script):
        self.script, self.actions, self.options = script, [], None

    def reset(self, *, seed=None, options=None):
        self.options, self.actions = options, []
        return list(OPENING), {"task_id": options.get("task_id", "task")}

    def step(self, action):
        self.actions.append(action)
        outcome = self.script[len(self.actions) - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


TOOL_REPLY = ([{"role": "tool", "content": "R"}], 1.0, False, False, {"reward_parts": {"a": 1.0}})
LAST = ([], 2.0, True, False, {})


class ScriptedPolicy:
    """Samples `turns[k]` (text, finish reason) at the k-th call for every live episode."""

    def __init__(self, turns, extra: int = 0):
        self.turns, self.extra = turns, extra
        self.streams, self.reused = [], 0

    @contextlib.contextmanager
    def reusing_cache(self):
        self.reused += 1
        yield

    def generate(self, prompts, params, streams=None):
        text, reason = self.turns[len(self.streams)]
        self.streams.append(streams)
        sampled = ids(text) + ((ord(EOS),) if reason == "stop" else ())
        logprobs = tuple(-0.5 - i for i in range(len(sampled)))
        return [Generation(sampled, logprobs, reason)] * (len(prompts) + self.extra)


def play(script, turns=(("hi", "stop"), ("ok", "length")), group_size=1, specs=None, **kw):
    specs = specs or [TaskSpec(task_id="task")]
    envs = [ScriptedEnv(script) for _ in range(len(specs) * group_size)]
    policy = ScriptedPolicy(list(turns))
    params = SamplingParams(seed=kw.pop("seed", None))
    trajs = collect(envs, specs, group_size, policy, TOKENIZER, params, **kw)
    return trajs, envs, policy


def test_the_mask_is_one_exactly_on_the_sampled_ids_and_their_logprobs_kept():
    (traj,), (env,), _ = play([TOOL_REPLY, LAST])
    # turn 1 "hi" + EOS (stopped: the glue's own EOS is dropped), the glue closing message
    # 3 and the tool's message 4, the generation prompt of message 5; then turn 2 "ok"
    glue = "[/3]\n[4 tool]R\n[5 assistant]"
    assert traj.tokens == ids(PROMPT + "hi" + EOS + glue + "ok")
    n, g = len(PROMPT), len(glue)
    assert traj.loss_mask == (0,) * n + (1,) * 3 + (0,) * g + (1,) * 2
    assert traj.logprobs == (0.0,) * n + (-0.5, -1.5, -2.5) + (0.0,) * g + (-0.5, -1.5)
    assert traj.prompt_length == n
    assert traj.turn_spans == ((n, n + 3), (n + 3 + g, n + 5 + g))
    # the environment saw each text with its finish reason
    assert env.actions == ["hi", "ok"]
    assert [a.finish_reason for a in env.actions] == ["stop", "length"]
    assert traj.turns == (
        Turn("hi", (Message("tool", "R"),), 1.0, {"a": 1.0}),
        Turn("ok", (), 2.0, {}),
    )
    assert traj.reward == 3.0 and traj.reward_parts == {"a": 1.0}
    assert traj.error is None and traj.reward_error is None and not traj.truncated


def test_the_glue_is_what_the_template_writes_after_the_last_assistant_message():
    history = [*OPENING, {"role": "assistant", "content": "hi"}]
    tool = [{"role": "tool", "content": "R"}]
    # not stopped: the template's EOS closes the turn
    assert continuation_ids(TOKENIZER, history, tool, stopped=False) == list(
        ids(EOS + "[/3]\n[4 tool]R\n[5 assistant]")
    )
    assert continuation_ids(TOKENIZER, history, tool, stopped=True) == list(
        ids("[/3]\n[4 tool]R\n[5 assistant]")
    )


def test_a_template_that_rewrites_the_past_is_caught_naming_where():
    class Counting(CharTokenizer):
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            header = f"{len(messages)} messages\n"
            return header + super().apply_chat_template(messages, add_generation_prompt, tokenize)

    history = [*OPENING, {"role": "assistant", "content": "hi"}]
    # where: the first character the longer rendering changes, and the text there
    message = re.escape(
        "the template re-rendered the conversation from character 0: "
        "'3 messages\\n[1 system]S\\n[' became '4 messages\\n[1 system]S\\n['"
    )
    with pytest.raises(ValueError, match=message):
        continuation_ids(Counting(), history, [{"role": "tool", "content": "R"}], stopped=True)


def test_an_environment_that_raises_ends_only_its_own_episode():
    script = [TOOL_REPLY, LAST]
    envs = [ScriptedEnv([RuntimeError("boom")]), ScriptedEnv(script)]
    policy = ScriptedPolicy([("hi", "stop"), ("ok", "length")])
    broken, fine = collect(envs, [TaskSpec(task_id="t")], 2, policy, TOKENIZER, SamplingParams())
    assert broken.error == "RuntimeError: boom"
    assert broken.turns == (Turn("hi", (), 0.0, {}),)
    assert broken.truncated
    assert broken.tokens == ids(PROMPT + "hi" + EOS)  # no glue after the failed step
    assert fine.error is None and len(fine.turns) == 2 and not fine.truncated


def test_a_non_finite_environment_reward_is_named():
    (traj,), _, _ = play([([], math.nan, True, False, {})])
    assert traj.reward_error == "environment reward is nan"


def test_the_environment_s_truncation_is_kept():
    (traj,), _, _ = play([([], 1.0, False, True, {})])
    assert traj.truncated and len(traj.turns) == 1 and traj.reward_parts == {}


def test_an_episode_that_reaches_max_tokens_is_cut_there():
    length = len(PROMPT + "hi" + EOS + "[/3]\n[4 tool]R\n[5 assistant]")
    (at,), _, _ = play([TOOL_REPLY, LAST], max_tokens=length)
    assert at.truncated and len(at.turns) == 1
    (below,), _, _ = play([TOOL_REPLY, LAST], max_tokens=length + 1)
    assert not below.truncated and len(below.turns) == 2


def test_collect_needs_an_environment_per_episode():
    envs = [ScriptedEnv([LAST]) for _ in range(3)]
    specs = [TaskSpec(task_id="a"), TaskSpec(task_id="b")]
    policy = ScriptedPolicy([("hi", "stop")])
    with pytest.raises(ValueError, match="^playing needs 4 environments, got 3$"):
        collect(envs, specs, 2, policy, TOKENIZER, SamplingParams())


def test_environment_i_plays_episode_i():
    specs = [TaskSpec(task_id="a"), TaskSpec(task_id="b")]
    trajs, envs, _ = play([LAST], turns=[("hi", "stop")], group_size=2, specs=specs)
    assert [env.options["task_id"] for env in envs] == ["a", "a", "b", "b"]
    assert [(t.task_id, t.group) for t in trajs] == [("a", 0), ("a", 0), ("b", 1), ("b", 1)]


def test_the_policy_keeps_its_cache_across_the_turns_of_one_rollout():
    _, _, policy = play([TOOL_REPLY, LAST])
    assert policy.reused == 1


def test_each_episode_s_turn_draws_from_its_own_seeded_stream():
    def stream(seed, task, member, turn):
        digest = hashlib.blake2b(f"{seed}/{task}/{member}/{turn}".encode(), digest_size=8)
        return int.from_bytes(digest.digest(), "little")

    _, _, unseeded = play([TOOL_REPLY, LAST], group_size=2)
    assert unseeded.streams == [None, None]
    _, _, seeded = play([TOOL_REPLY, LAST], group_size=2, seed=7)
    assert seeded.streams == [
        [stream(7, "task", 0, 0), stream(7, "task", 1, 0)],
        [stream(7, "task", 0, 1), stream(7, "task", 1, 1)],
    ]


def test_a_policy_that_returns_too_many_generations_is_an_error():
    policy = ScriptedPolicy([("hi", "stop")], extra=1)
    with pytest.raises(ValueError, match="zip"):
        collect([ScriptedEnv([LAST])], [TaskSpec()], 1, policy, TOKENIZER, SamplingParams())

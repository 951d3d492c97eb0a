"""The end of an assistant turn is read from the chat template, not assumed to be eos.

Two built-in variants of tiny-random end turns with a token that is not their eos, as
real models do: `tiny-random-llama3` (a Llama 3-style template: `<|eot_id|>`, eos
`<|end_of_text|>`) and `tiny-random-qwen-base` (ChatML: `<|im_end|>`, eos
`<|endoftext|>`). A template with no end token ("### Role:" headers) ends turns with
text. Generation is forced through HFPolicy's own sampler (`Forced`), so what stops it
is the policy's stop logic.
"""

from __future__ import annotations

import copy
import io
import shutil

import gymnasium as gym
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from rich.console import Console

import agentgym  # noqa: F401  (registers the built-in environments)
import agentgym.policy.hf as hf
from agentgym.cli import main
from agentgym.doctor.template_checks import (
    TOOLS,
    check_mask,
    masked_conversation,
    run_doctor,
    sample_conversation,
    tool_format,
)
from agentgym.policy.base import Generation, SamplingParams
from agentgym.policy.hf import HFPolicy, stop_token_ids
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.policy.turn_end import TurnEnd, eos_turn_end, find_turn_end
from agentgym.rollout.episodes import TaskSpec, collect, continuation_ids, prompt_ids, render

# "### Role:" headers and no end token: a turn ends with the text before the next header
PLAIN = (
    "{% for m in messages %}### {{ m.role | capitalize }}:\n{{ m.content }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}### Assistant:\n{% endif %}"
)


@pytest.fixture(scope="module")
def llama3():
    return load_model_and_tokenizer("tiny-random-llama3")


@pytest.fixture(scope="module")
def qwen_base():
    return load_model_and_tokenizer("tiny-random-qwen-base")


@pytest.fixture(scope="module")
def plain(tiny):
    """tiny-random's model with the "### Role:" template on its tokenizer."""
    model, tokenizer = tiny
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = PLAIN
    return model, tokenizer


def with_template(tokenizer, template: str):
    out = copy.deepcopy(tokenizer)
    out.chat_template = template
    return out


@pytest.mark.parametrize(
    ("name", "end", "eos"),
    [
        ("tiny-random", "<|im_end|>", "<|im_end|>"),
        ("tiny-random-llama3", "<|eot_id|>", "<|end_of_text|>"),
        ("tiny-random-qwen-base", "<|im_end|>", "<|endoftext|>"),
    ],
)
def test_the_finder_names_the_token_that_ends_each_template_s_turns(name, end, eos):
    _, tokenizer = load_model_and_tokenizer(name)
    assert tokenizer.eos_token == eos
    found = find_turn_end(tokenizer)
    end_id = tokenizer.convert_tokens_to_ids(end)
    assert found == TurnEnd(end, (end_id,), special=True, is_eos=end == eos)
    assert found.stop_strings == ()


def test_a_template_without_an_end_token_ends_turns_with_the_text_before_the_next_header(
    plain,
):
    _, tokenizer = plain
    found = find_turn_end(tokenizer)
    ids = tuple(tokenizer.encode("\n\n### ", add_special_tokens=False))
    assert len(ids) > 1
    assert found == TurnEnd("\n\n### ", ids, special=False, is_eos=False)
    assert found.stop_strings == ("\n\n### ",)
    assert (
        found.describe(tokenizer)
        == f"'\\n\\n### ' (text of {len(ids)} tokens, not eos '<|im_end|>')"
    )


def test_turn_markers_the_tokenizer_does_not_have_end_turns_as_text(tiny, llama3):
    """Templates written for other tokenizers: their markers are text of several ids here."""
    # ChatML's end, spelled with other markers: cut at the newline after it
    chatml = tiny[1].chat_template.replace("<|im_end|>", "[END]").replace("<|im_start|>", "[S]")
    found = find_turn_end(with_template(tiny[1], chatml))
    assert found.text == "[END]" and not found.special and len(found.ids) > 1
    # Llama 3's end and the next header's start have no newline between them: the end is
    # what the turn's text shares with the text after a last turn ("<|eot_id|>")
    found = find_turn_end(with_template(tiny[1], llama3[1].chat_template))
    assert found.text == "<|eot_id|>" and not found.special and len(found.ids) > 1


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{{ raise_exception('roles must alternate') }}", "cannot render a user/assistant/user "
         "probe (TemplateError: roles must alternate)"),
        ("{% for m in messages %}{{ m.content | upper }}{% endfor %}",
         "does not render the assistant's content of a user/assistant/user probe as given"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}",
         "writes no turn end right after the assistant's content ('')"),
        ("{% for m in messages %}{{ m.content }} <|im_end|>{% endfor %}",
         "writes no turn end right after the assistant's content (' <|im_end|>')"),
    ],
)  # fmt: skip
def test_a_template_whose_end_cannot_be_read_falls_back_to_eos_and_says_why(tiny, template, why):
    tokenizer = with_template(tiny[1], template)
    found = find_turn_end(tokenizer)
    reason = f"the chat template {why}"
    assert found == TurnEnd("<|im_end|>", (tokenizer.eos_token_id,), True, True, reason)
    assert found.describe(tokenizer) == f"eos '<|im_end|>' (fallback: {reason})"


def test_without_a_template_nor_eos_the_end_is_empty_and_ends_nothing(tiny):
    tokenizer = with_template(tiny[1], "{{ raise_exception('no') }}")
    tokenizer.eos_token = None
    found = find_turn_end(tokenizer)
    assert found.text == "" and found.ids == () and "no eos either" in (found.fallback or "")
    assert found.closing(tokenizer, [1, 2, 3]) is None


# ---------------------------------------------------------------- the doctor


@pytest.mark.parametrize(
    ("model", "line"),
    [
        ("tiny-random-llama3", "turn end: '<|eot_id|>' (special token, not eos '<|end_of_text|>')"),
        (
            "tiny-random-qwen-base",
            "turn end: '<|im_end|>' (special token, not eos '<|endoftext|>')",
        ),
        ("tiny-random", "turn end: '<|im_end|>' (special token, also eos)"),
    ],
)
def test_the_doctor_passes_native_tools_on_both_end_token_templates_and_names_the_end(
    capsys, model, line
):
    assert main(["doctor", "--tool-format", "native", "--model", model]) == 0
    out = capsys.readouterr().out
    assert f"  {line}\n" in out
    assert out.count(" ok ") == 4 and "FAIL" not in out


@pytest.mark.parametrize("model", ["llama3", "qwen_base"])
def test_a_mask_that_ends_turns_with_eos_fails_the_doctor_where_the_template_does_not(
    request, model
):
    """What the doctor checked before: every assistant turn ended by eos."""
    _, tokenizer = request.getfixturevalue(model)
    fmt = tool_format(tokenizer, "native")
    messages = sample_conversation(fmt)
    found, eos = find_turn_end(tokenizer), eos_turn_end(tokenizer, "assumed")
    assert check_mask(tokenizer, messages, TOOLS, found)[0].ok
    old, ids, mask = check_mask(tokenizer, messages, TOOLS, eos)
    assert not old.ok and old.detail == "the masked token stream differs from the template"
    assert tokenizer.eos_token_id in ids  # sampled, mask 1, where the template has no eos
    new_ids, new_mask = masked_conversation(tokenizer, messages, TOOLS, found)
    assert tokenizer.eos_token_id not in new_ids
    agent = [t for t, m in zip(new_ids, new_mask, strict=True) if m]
    assert agent.count(found.ids[0]) == 2 and agent[-1] == found.ids[0]  # each turn's end


def test_the_doctor_passes_a_template_that_ends_turns_with_text(plain):
    _, tokenizer = plain
    out = io.StringIO()
    assert run_doctor(tokenizer, "tiny-random", "hermes", Console(file=out, width=200))
    assert "turn end: '\\n\\n### ' (text of" in out.getvalue()


# ------------------------------------------------------------ generation stops


class Forced(HFPolicy):
    """HFPolicy whose draws follow a script (turn k's ids at its k-th call); the stopping
    is HFPolicy's own. Each draw's logprob is the model's, under its logits."""

    def __init__(self, model, tokenizer, turns: list[list[int]]):
        super().__init__(model, tokenizer)
        self.turns, self.calls, self.step = turns, 0, 0

    def generate(self, prompts, params, streams=None):
        self.script, self.step = self.turns[self.calls], 0
        self.calls += 1
        return super().generate(prompts, params, streams)

    def draw(self, logits, params, u):
        token = torch.full((logits.shape[0],), self.script[self.step], device=logits.device)
        self.step += 1
        logp = torch.log_softmax(logits, -1).gather(-1, token[:, None]).squeeze(-1)
        return token, logp


@pytest.fixture
def forcing(monkeypatch):
    """Makes HFPolicy draw through `Forced.draw` of the policy given."""

    def use(policy: Forced) -> Forced:
        monkeypatch.setattr(hf, "sample_ids", policy.draw)
        return policy

    return use


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_generation_stops_on_the_template_s_end_token_that_is_not_eos(llama3, forcing):
    model, tokenizer = llama3
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    policy = forcing(Forced(model, tokenizer, [encode(tokenizer, "Hi there") + [eot] + [5] * 9]))
    assert eot in policy.stop_ids and tokenizer.eos_token_id in policy.stop_ids
    prompt = prompt_ids(tokenizer, [{"role": "user", "content": "Hello"}])
    (gen,) = policy.generate([prompt], SamplingParams(max_new_tokens=20))
    assert gen.ids == (*encode(tokenizer, "Hi there"), eot) and gen.finish_reason == "stop"


def test_generation_stops_after_a_turn_end_written_as_text(plain, forcing):
    model, tokenizer = plain
    script = [encode(tokenizer, t) for t in ("Hi there", "\n\n### ", "User:")]
    policy = forcing(Forced(model, tokenizer, [sum(script, [])]))
    assert policy.stop_ids == {tokenizer.eos_token_id}  # the end is text: a stop string
    prompt = prompt_ids(tokenizer, [{"role": "user", "content": "Hello"}])
    (gen,) = policy.generate([prompt], SamplingParams(max_new_tokens=20))
    assert gen.ids == tuple(script[0] + script[1]) and gen.finish_reason == "stop"


def test_stop_ids_hold_the_end_token_eos_and_the_generation_config_s_eos(llama3):
    model, tokenizer = llama3
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    assert stop_token_ids(model, tokenizer) == {eot, tokenizer.eos_token_id}
    text_end = TurnEnd("\n\n### ", (1, 2), special=False, is_eos=False)
    assert stop_token_ids(model, tokenizer, text_end) == {tokenizer.eos_token_id}


# ------------------------------------------------------------------ the rollout


TASK = "calculator/train/3"


def play(tokenizer, policy, tool_format: str = "native"):
    """One ToolCall-v0 episode of `TASK`; returns its trajectory and the env."""
    env = gym.make("agentgym/ToolCall-v0", tool_format=tool_format)
    env.unwrapped.use_chat_template(tokenizer)
    spec = [TaskSpec(task_id=TASK)]
    (traj,) = collect([env], spec, 1, policy, tokenizer, SamplingParams(max_new_tokens=200))
    return traj, env.unwrapped


def demonstration(tokenizer, tool_format: str = "native") -> list[str]:
    """The assistant turns that solve `TASK`, in the format the env speaks with `tokenizer`."""
    env = gym.make("agentgym/ToolCall-v0", tool_format=tool_format).unwrapped
    env.use_chat_template(tokenizer)
    return env.demonstration(env.load_task(TASK))


def whole_text(tokenizer, traj, tools, then: dict | None = None) -> str:
    """The template's rendering of the episode's conversation (and of `then` after it)."""
    messages = [m.to_dict() for m in traj.prompt_messages]
    for turn in traj.turns:
        messages += [{"role": "assistant", "content": turn.action}]
        messages += [m.to_dict() for m in turn.observation]
    return render(tokenizer, messages + ([then] if then else []), False, tools)


@pytest.mark.parametrize("model", ["llama3", "qwen_base"])
def test_a_rollout_keeps_the_sampled_end_token_with_mask_one_and_no_eos(request, forcing, model):
    weights, tokenizer = request.getfixturevalue(model)
    end = find_turn_end(tokenizer)
    turns = demonstration(tokenizer)
    never = encode(tokenizer, " never sampled")  # after the end: the policy stopped there
    script = [encode(tokenizer, t) + list(end.ids) + never for t in turns]
    traj, env = play(tokenizer, forcing(Forced(weights, tokenizer, script)))
    assert traj.error is None and traj.reward_parts["correctness"] == 1.0
    assert [t.action for t in traj.turns] == turns  # the env saw the text without its end
    for _, b in traj.turn_spans:
        assert traj.tokens[b - 1] == end.ids[0] and traj.loss_mask[b - 1] == 1
    assert tokenizer.eos_token_id not in traj.tokens
    agent = [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
    assert tokenizer.decode(agent) == "".join(t + end.text for t in turns)
    played, whole = tokenizer.decode(traj.tokens), whole_text(tokenizer, traj, env.tools())
    assert whole.startswith(played) and whole[len(played) :].strip() == ""


@pytest.mark.parametrize(
    ("closing", "more"),
    [("\n\n### ", "Tool:"), ("\n\n### T", "ool:")],  # " T" is one token: it writes past
    ids=["exact", "past-the-end"],
)
def test_a_rollout_keeps_a_text_end_with_mask_one_and_the_env_sees_the_content(
    plain, forcing, closing, more
):
    model, tokenizer = plain
    turns = demonstration(tokenizer, "hermes")
    tail = encode(tokenizer, "\n\n###") + encode(tokenizer, closing[5:]) + encode(tokenizer, more)
    policy = forcing(Forced(model, tokenizer, [encode(tokenizer, t) + tail for t in turns]))
    traj, _ = play(tokenizer, policy, "hermes")
    assert traj.error is None and traj.reward_parts["correctness"] == 1.0
    assert [t.action for t in traj.turns] == turns
    agent = [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
    assert tokenizer.decode(agent) == "".join(t + closing for t in turns)
    # the glue writes on from where the sample stopped; the last turn's end reaches into
    # the header a next message (a tool's) would have
    whole = whole_text(tokenizer, traj, None, then={"role": "tool", "content": "1"})
    assert whole.startswith(tokenizer.decode(traj.tokens))


class EosPolicy:
    """A model that ends its turns with eos, where its template writes another end."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def generate(self, prompts, params, streams=None):
        ids = [*encode(self.tokenizer, self.turns[self.calls]), self.tokenizer.eos_token_id]
        self.calls += 1
        return [Generation(tuple(ids), (-0.5,) * len(ids), "stop")]


def test_a_turn_ended_by_eos_keeps_it_and_the_glue_adds_the_template_s_end(llama3):
    _, tokenizer = llama3
    turns = demonstration(tokenizer)
    traj, _ = play(tokenizer, EosPolicy(tokenizer, turns))
    eos, eot = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|eot_id|>")
    _, b = traj.turn_spans[0]
    assert traj.tokens[b - 1] == eos and traj.loss_mask[b - 1] == 1  # as sampled
    assert traj.tokens[b] == eot and traj.loss_mask[b] == 0  # the template's, from the glue
    assert [t.action for t in traj.turns] == turns


# ----------------------------------------------------------------- properties

CONTENT = st.text(st.characters(codec="ascii", exclude_categories=["Cc"]) | st.just("\n"))


@settings(max_examples=60, deadline=None)
@given(content=CONTENT)
@pytest.mark.parametrize("model", ["llama3", "qwen_base", "plain"])
def test_the_end_follows_any_assistant_content(request, model, content):
    _, tokenizer = request.getfixturevalue(model)
    end = find_turn_end(tokenizer)
    user = {"role": "user", "content": "hi"}
    turn = [user, {"role": "assistant", "content": content}, {"role": "user", "content": "more"}]
    head = render(tokenizer, [user], True)
    assert render(tokenizer, turn, False).startswith(head + content + end.text)


@settings(max_examples=60, deadline=None)
@given(content=CONTENT)
@pytest.mark.parametrize("model", ["llama3", "qwen_base", "plain"])
def test_a_sampled_turn_and_its_end_then_the_glue_spell_the_template_s_text(
    request, model, content
):
    _, tokenizer = request.getfixturevalue(model)
    end = find_turn_end(tokenizer)
    assume(end.text not in content)
    opening = [{"role": "user", "content": "hi"}]
    history = [*opening, {"role": "assistant", "content": content}]
    tool = [{"role": "tool", "content": "42"}]
    sampled = encode(tokenizer, content) + list(end.ids)
    assert end.closing(tokenizer, sampled) == end.text
    ids = (
        prompt_ids(tokenizer, opening) + sampled + continuation_ids(tokenizer, history, tool, True)
    )
    assert tokenizer.decode(ids) == render(tokenizer, history + tool, True)


def test_vllm_stops_on_the_turn_end_text(tmp_path):
    """vLLM's CPU build serves the embedded model, not tiny-random: the embedded model's
    greedy text gives a stop string, which must end the next greedy sample."""
    pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm (make test-vllm)")
    from agentgym.policy.vllm import VLLMPolicy, save_model_folder

    model, tokenizer = load_model_and_tokenizer(None)
    folder = save_model_folder(model, tokenizer)
    prompt = prompt_ids(tokenizer, [{"role": "user", "content": "Count from one to ten."}])
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    try:
        policy = VLLMPolicy(folder, stop_ids=stop_token_ids(model, tokenizer), max_model_len=512,
                            dtype="float32", enforce_eager=True)  # fmt: skip
        (free,) = policy.generate([prompt], greedy)
        text = tokenizer.decode(free.ids)
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        policy.stop_strings = (stop,)
        (stopped,) = policy.generate([prompt], greedy)
        policy.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert stopped.finish_reason == "stop"
    assert stop in tokenizer.decode(stopped.ids) and len(stopped.ids) < len(free.ids)

"""`tool_format="native"`: the shipped templates (one per family) render the tools, the
family's parser reads the model's calls back, and the rollout's ids are the template's
rendering of the whole conversation with the loss mask on the assistant's tokens only."""

from __future__ import annotations

import copy
import json

import gymnasium as gym
import pytest

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.config import Config, ConfigError
from agentgym.doctor.template_checks import (
    check_env_template,
    check_prefix,
    run_checks,
    sample_conversation,
    template_calls,
)
from agentgym.env.templates import TemplateFormat, renders_tools
from agentgym.policy.base import Generation, SamplingParams
from agentgym.policy.chat_templates import SHIPPED, read_chat_template
from agentgym.rollout.episodes import TaskSpec, collect, render
from agentgym.run import preflight
from agentgym.tools.native import detect_parser, get_parser
from agentgym.types import ToolCall

FAMILY = {"qwen2.5": "hermes", "llama3.1": "llama3_json", "mistral-v3": "mistral"}
ADD = ToolCall("calculator", {"expression": "(1 + 2) * 3"})
POW = ToolCall("calculator", {"expression": "2 ** 10"})

# Qwen3-style: the reasoning of earlier assistant turns is dropped from later renderings,
# so a conversation's text changes as it grows (not prefix-stable).
THINKING_STRIPPED = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and not loop.last %}"
    "{{- m.content.split('</think>')[-1] }}{%- else %}{{- m.content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    "{%- if tools %}{%- endif %}"
)


@pytest.fixture(params=sorted(SHIPPED))
def templated(tiny, request):
    """(template name, tiny-random's tokenizer wearing that shipped template)."""
    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.chat_template = read_chat_template(request.param)
    return request.param, tokenizer


def test_each_shipped_template_is_detected_as_its_family_and_renders_tools(templated):
    name, tokenizer = templated
    assert detect_parser(tokenizer.chat_template) == FAMILY[name]
    assert renders_tools(tokenizer)
    fmt = TemplateFormat("native", None).resolve(tokenizer)
    assert (fmt.name, fmt.parser.name) == ("native", FAMILY[name])


@pytest.mark.parametrize("calls", [[ADD], [ADD, POW]], ids=["one call", "two calls"])
def test_the_templates_own_rendering_of_calls_parses_back(templated, calls):
    _, tokenizer = templated
    fmt = TemplateFormat("native", None).resolve(tokenizer)
    before = sample_conversation(fmt)[:2]
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    assert template_calls(tokenizer, fmt, before, calls, tools) == calls


@pytest.mark.parametrize("family", ["hermes", "llama3_json", "mistral"])
def test_a_rendered_call_parses_back_to_itself(family):
    parser = get_parser(family)
    parsed = parser.parse(parser.render_call(POW))
    assert [a.call for a in parsed.calls] == [POW]


MALFORMED = {
    "hermes": {
        "invalid_json": '<tool_call>{"name": "calculator", "arguments": {</tool_call>',
        "missing_name": '<tool_call>{"arguments": {"expression": "1"}}</tool_call>',
        "arguments_not_object": '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>',
        "unknown_tool": '<tool_call>{"name": "calc", "arguments": {"expression": "1"}}</tool_call>',
        "invalid_arguments": '<tool_call>{"name": "calculator", "arguments": {"expression": 1}}'
        "</tool_call>",
    },
    "llama3_json": {
        "invalid_json": '{"name": "calculator", "parameters": {"expression": "1"}',
        "missing_name": '{"parameters": {"expression": "1"}}',
        "arguments_not_object": '{"name": "calculator", "parameters": "1 + 1"}',
        "unknown_tool": '{"name": "calc", "parameters": {"expression": "1"}}',
        "invalid_arguments": '{"name": "calculator", "parameters": {"expr": "1"}}',
    },
    "mistral": {
        "invalid_json": '[TOOL_CALLS] [{"name": "calculator", "arguments": {]',
        "missing_name": '[TOOL_CALLS] [{"name": "", "arguments": {"expression": "1"}}]',
        "arguments_not_object": '[TOOL_CALLS] [{"name": "calculator", "arguments": 7}]',
        "unknown_tool": '[TOOL_CALLS] [{"name": "calc", "arguments": {"expression": "1"}}]',
        "invalid_arguments": '[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": '
        "null}}]",
    },
}


@pytest.mark.parametrize(
    ("family", "kind"), [(f, k) for f, kinds in MALFORMED.items() for k in kinds]
)
def test_each_malformed_call_gets_its_error_observation(family, kind):
    env = gym.make(
        "agentgym/ToolCall-v0", families=["calculator"], tool_format="native", tool_parser=family
    )
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step(MALFORMED[family][kind])
    assert not terminated
    assert info["tool_errors"] == {kind: 1}
    assert [m["role"] for m in obs] == ["tool"]
    assert obs[0]["content"].startswith("Error: ")


@pytest.mark.parametrize("family", ["llama3_json", "mistral"])
def test_a_call_cut_off_by_the_length_limit_is_truncated(family):
    from agentgym.types import Completion

    env = gym.make(
        "agentgym/ToolCall-v0", families=["calculator"], tool_format="native", tool_parser=family
    )
    env.reset(seed=0)
    cut = MALFORMED[family]["invalid_json"]
    _, _, _, _, info = env.step(Completion(cut, "length"))
    assert info["tool_errors"] == {"truncated": 1}


class _Script:
    """A policy double: turn k of the one episode is `turns[k]`, tokenized, then eos."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.next = tokenizer, turns, 0

    def generate(self, prompts, params, streams=None):
        ids = self.tokenizer.encode(self.turns[self.next], add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        self.next += 1
        return [Generation(tuple(ids), tuple([-0.25] * len(ids)), "stop")]

    def load_weights(self, named_tensors):
        raise NotImplementedError


@pytest.mark.parametrize("task_id", ["calculator/train/3", "chain/train/1"])
def test_the_rollout_is_the_templates_rendering_with_the_mask_on_the_agents_tokens(
    templated, task_id
):
    _, tokenizer = templated
    env = gym.make("agentgym/ToolCall-v0")
    env.unwrapped.use_chat_template(tokenizer)
    turns = env.unwrapped.demonstration(env.unwrapped.load_task(task_id))
    (traj,) = collect(
        [env], [TaskSpec(task_id=task_id)], 1, _Script(tokenizer, turns), tokenizer,
        SamplingParams(max_new_tokens=256),
    )  # fmt: skip
    assert traj.reward_parts["correctness"] == 1.0 and traj.error is None
    messages = [m.to_dict() for m in traj.prompt_messages]
    for turn in traj.turns:
        messages += [{"role": "assistant", "content": turn.action}]
        messages += [m.to_dict() for m in turn.observation]
    whole = render(tokenizer, messages, False, env.unwrapped.tools())
    played = tokenizer.decode(traj.tokens)
    assert whole.startswith(played) and whole[len(played) :].strip() == ""  # all but the last "\n"
    agent = [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
    eos = tokenizer.eos_token
    assert tokenizer.decode(agent) == "".join(t + eos for t in turns)


def test_auto_is_native_where_the_template_renders_tools_and_hermes_elsewhere(tiny):
    plain = copy.deepcopy(tiny[1])
    plain.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    env = gym.make("agentgym/ToolCall-v0").unwrapped
    assert env.format.name == "hermes"  # unbound
    env.use_chat_template(plain)
    assert env.format.name == "hermes" and "<tools>" in env.system_message
    env.use_chat_template(tiny[1])
    assert env.format.name == "native" and "<tools>" not in env.system_message
    with pytest.raises(ConfigError, match="does not render tools=.*model.chat_template"):
        TemplateFormat("native", None).resolve(plain)


def test_native_without_a_known_family_asks_for_tool_parser(tiny):
    odd = copy.deepcopy(tiny[1])
    odd.chat_template = (
        "{{ tools | tojson }}{% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}"
        "{% endfor %}"
    )
    with pytest.raises(ConfigError, match="tool_parser.*hermes, llama3_json, mistral"):
        TemplateFormat("native", None).resolve(odd)
    assert TemplateFormat("native", "mistral").resolve(odd).parser.name == "mistral"


def test_an_unbound_native_env_without_a_parser_says_how_to_bind_it():
    env = gym.make("agentgym/ToolCall-v0", tool_format="native")
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="use_chat_template.*tool_parser"):
        env.step("hello")


def test_bad_format_and_parser_names_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="tool_format='xml'; valid: auto, native, hermes, react"):
        gym.make("agentgym/ToolCall-v0", tool_format="xml")
    with pytest.raises(ValueError, match="tool_parser='qwen'.*hermes, llama3_json, mistral"):
        gym.make("agentgym/ToolCall-v0", tool_format="native", tool_parser="qwen")


def test_a_template_that_drops_earlier_reasoning_is_reported_and_trained_split(tiny, caplog):
    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.chat_template = THINKING_STRIPPED
    plain = check_prefix(tokenizer, sample_conversation("hermes"))  # no reasoning to drop
    assert plain.ok and "append-only" in plain.detail
    checks, ids, _ = run_checks(tokenizer, "hermes")
    assert [(c.name, c.ok) for c in checks] == [
        ("prefix-consistent", True), ("round-trip", True), ("loss-mask", True)
    ] and ids  # fmt: skip
    assert "adding message 3 (tool) rewrites the earlier text" in checks[0].detail
    assert "splits such an episode there into samples" in checks[0].detail
    env = gym.make("agentgym/ToolCall-v0", tool_format="hermes")
    with caplog.at_level("WARNING"):
        check_env_template(env, tokenizer, "thinking-model")  # trained, with a warning
    assert "thinking-model rewrites the conversation's earlier text" in caplog.text
    caplog.clear()
    check_env_template(env, tiny[1], "tiny-random")  # a stable template: nothing to say
    assert caplog.text == ""


def test_doctor_passes_each_shipped_template_on_tiny_random(templated):
    checks, ids, mask = run_checks(templated[1], "native")
    assert [c.name for c in checks] == ["prefix-consistent", "round-trip", "loss-mask"]
    assert all(c.ok for c in checks), checks
    assert 0 < sum(mask) < len(ids)


def test_model_chat_template_takes_a_shipped_name_a_file_or_text(tmp_path):
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{{ messages[0].content }}")
    assert read_chat_template(str(jinja)) == "{{ messages[0].content }}"
    assert read_chat_template("{% for m in messages %}{% endfor %}").startswith("{%")
    assert "<tool_call>" in read_chat_template("qwen2.5")
    with pytest.raises(ValueError, match="model.chat_template='nope'.*qwen2.5, llama3.1"):
        read_chat_template("nope")
    config = Config.model_validate(
        {"model": {"name": "tiny-random", "chat_template": "nope"}, "run": {"env": "tool_call"}}
    )
    with pytest.raises(ConfigError, match=r"model.chat_template: model.chat_template='nope'"):
        preflight.check(config, "train")
    empty = tmp_path / "empty.jinja"
    empty.write_text("  ")
    with pytest.raises(ValueError, match="empty"):
        read_chat_template(str(empty))


def test_shipped_templates_cite_their_source():
    from agentgym.policy.chat_templates import TEMPLATE_DIR

    for name, file in SHIPPED.items():
        head = (TEMPLATE_DIR / file).read_text().split("-#}")[0]
        assert "published" in head and "format" in head, name


@pytest.mark.parametrize("template", sorted(SHIPPED))
def test_train_runs_in_the_native_format_with_a_shipped_template(tmp_path, template):
    from agentgym.cli import main

    out = tmp_path / "run"
    args = [
        "train", "--env", "tool_call", "--model", "tiny-random", "--steps", "2",
        "--set", "run.env_kwargs.tool_format=native", "--set", f"model.chat_template={template}",
        "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2",
        "--set", "sampling.max_new_tokens=24", "--set", "eval.every=0",
        "--set", "eval.report_tasks=0", "--output", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["env/errors"] == 0.0
    saved = (out / "checkpoint-000002" / "chat_template.jinja").read_text()
    assert saved == read_chat_template(template)  # the checkpoint keeps the template it used


def test_preflight_takes_a_native_env_before_any_template_is_known():
    config = Config.model_validate(
        {
            "model": {"name": "tiny-random", "chat_template": "mistral-v3"},
            "run": {"env": "tool_call", "env_kwargs": {"tool_format": "native"}},
            "sft": {"warmup": True},
        }
    )
    preflight.check(config, "sft")  # its demonstrations exist; their syntax waits for the template

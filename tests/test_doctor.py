"""`agentgym doctor`: passes on usable templates, fails with a hint on broken ones."""

from __future__ import annotations

import copy
import io

import pytest
from rich.console import Console

from agentgym.cli import main
from agentgym.doctor import template_checks
from agentgym.doctor.template_checks import (
    check_mask,
    check_prefix,
    run_doctor,
    sample_conversation,
)
from agentgym.rollout.episodes import render

# Renders only the last user message in full: not append-only, like templates that
# strip earlier turns' reasoning.
FORGETFUL = (
    "{% for m in messages %}{% if loop.last or m['role'] != 'user' %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("fmt", ["hermes", "react"])
def test_doctor_passes_on_tiny_random(tiny, fmt):
    _, tokenizer = tiny
    assert run_doctor(tokenizer, "tiny-random", fmt, Console(file=None, quiet=True))


def test_mask_covers_exactly_the_assistant_text(tiny):
    _, tokenizer = tiny
    messages = sample_conversation("hermes")
    check, ids, mask = check_mask(tokenizer, messages)
    assert check.ok, check.detail
    agent = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert "<tool_call>" in agent and "\\boxed{440036670}" in agent
    masked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "<tool_response>" in masked and "48213 * 9127 - 3381?" in masked
    assert "\\boxed" not in masked


def test_a_template_that_rewrites_history_is_reported_with_what_the_rollout_does(tiny):
    _, tokenizer = tiny
    broken = copy.deepcopy(tokenizer)
    broken.chat_template = FORGETFUL
    check = check_prefix(broken, sample_conversation("hermes"))
    assert check.ok and "adding message 2 (assistant) rewrites the earlier text" in check.detail
    assert "splits such an episode there into samples" in check.detail


def test_cli_doctor_exit_codes(capsys):
    assert main(["doctor", "--model", "tiny-random"]) == 0
    out = capsys.readouterr().out
    assert "prefix-consistent" in out and "FAIL" not in out


@pytest.mark.slow
def test_doctor_passes_on_the_embedded_model(capsys):
    assert main(["doctor"]) == 0
    assert "FAIL" not in capsys.readouterr().out


def test_cli_doctor_reports_a_model_whose_template_rewrites_history(tiny, tmp_path, capsys):
    model, tokenizer = tiny
    broken = copy.deepcopy(tokenizer)
    broken.chat_template = FORGETFUL
    model.save_pretrained(tmp_path)
    broken.save_pretrained(tmp_path)
    assert main(["doctor", "--model", str(tmp_path), "--format", "hermes"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "ok prefix-consistent: adding message 2 (assistant) rewrites the earlier text" in out
    assert "splits such an episode there into samples" in out and "FAIL" not in out


@pytest.mark.slow
@pytest.mark.parametrize("template", ["qwen2.5", "llama3.1", "mistral-v3"])
def test_doctor_passes_each_shipped_template_on_the_embedded_model(capsys, template):
    args = ["doctor", "--tool-format", "native", "--set", f"model.chat_template={template}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count(" ok ") == 4 and "FAIL" not in out and "the template's own 1 and 2" in out


def test_cli_doctor_all_adds_native_where_the_template_renders_tools(capsys):
    assert main(["doctor", "--model", "tiny-random"]) == 0
    out = capsys.readouterr().out
    assert [f in out for f in ("format hermes", "format react", "format native")] == [True] * 3
    assert main(["doctor", "--model", "tiny-random", "--set", "model.chat_template=nope"]) == 2


@pytest.mark.parametrize("fmt", ["hermes", "react", "native"])
def test_doctor_reports_that_tool_text_with_special_tokens_stays_plain_text(tiny, fmt):
    _, tokenizer = tiny
    out = io.StringIO()
    assert run_doctor(tokenizer, "tiny-random", fmt, Console(file=out, width=200))
    line = next(x for x in out.getvalue().splitlines() if "plain-tool-text" in x)
    assert " ".join(line.split()) == (
        "ok plain-tool-text: tool text holding all 3 special tokens (<|im_start|>, <|im_end|>, "
        "...) stays plain text; the 3 the template writes around it stay special"
    )


def test_the_plain_text_check_fails_where_tool_text_becomes_control_tokens(tiny, monkeypatch):
    def parsing(tokenizer, history, replies, stopped, tools=None):
        """The rollout's ids as they were before: special-token text parsed."""
        before = render(tokenizer, history, False, tools)
        after = render(tokenizer, history + replies, True, tools)
        return tokenizer.encode(after[len(before) :], add_special_tokens=False)

    monkeypatch.setattr(template_checks, "continuation_ids", parsing)
    check = template_checks.check_plain_tool_text(tiny[1], "hermes")
    assert not check.ok and check.name == "plain-tool-text"
    forged = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # the tool text's, in its order
    own = ["<|im_start|>", "<|im_end|>", "<|im_start|>"]
    seen = [own[0], *forged, *own[1:]]
    assert (
        check.detail == f"tool text became control tokens: {seen} where the template writes {own}"
    )

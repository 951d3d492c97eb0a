"""`agentgym doctor`: can this model's chat template carry a multi-turn tool conversation?

Three checks, each with a hint when it fails:

1. Prefix consistency: rendering the conversation one message more must
   extend the previous rendering (the rollout appends environment text as a
   template suffix, so a template that rewrites earlier turns cannot be used).
2. Round trip: a tool call written in the format, inside the assistant turn,
   parses back to the same call; and when the template has its own
   `tool_calls` rendering, the parser reads that back too.
3. The loss mask: the sample conversation is tokenized the way the rollout
   does it, and the mask-1 tokens must decode to exactly the assistant's text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

from agentgym.rollout.episodes import continuation_ids, render
from agentgym.tools.formats import get_format
from agentgym.types import ToolCall

_CALL = ToolCall("calculator", {"expression": "48213 * 9127 - 3381"})
_RESULT = "440036670"


@dataclass(frozen=True)
class Check:
    """The outcome of one doctor check."""

    name: str
    ok: bool
    detail: str
    hint: str = ""


def sample_conversation(format_name: str) -> list[dict]:
    """A two-turn tool conversation: a call, its result, then the final answer."""
    fmt = get_format(format_name)
    system = "You are a careful assistant. Use the calculator for arithmetic.\n\n"
    answer = f"\\boxed{{{_RESULT}}}" if format_name == "hermes" else f"Final Answer: {_RESULT}"
    call_text = fmt.render_call(_CALL)
    if format_name == "react":
        call_text = "Thought: I should compute this.\n" + call_text
    observation = [m.to_dict() for m in fmt.observation([_result()])]
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is 48213 * 9127 - 3381?"},
        {"role": "assistant", "content": call_text},
        *observation,
        {"role": "assistant", "content": f"The result is {_RESULT}. {answer}"},
    ]


def _result():
    from agentgym.tools.formats import ToolResult

    return ToolResult(name=_CALL.name, content=_RESULT, error=None)


def check_prefix(tokenizer, messages: list[dict]) -> Check:
    """Each rendering extends the previous one, with and without the generation prompt."""
    for k in range(1, len(messages)):
        shorter = render(tokenizer, messages[:k], messages[k]["role"] == "assistant")
        longer = render(tokenizer, messages[: k + 1], False)
        if not longer.startswith(shorter):
            return Check(
                "prefix-consistent",
                False,
                f"adding message {k} ({messages[k]['role']}) rewrites the earlier text",
                "the template must render conversations append-only (templates that drop "
                "earlier reasoning or move system text do not); pass a model whose template "
                "does, or a fixed template via the tokenizer's chat_template",
            )
    return Check("prefix-consistent", True, f"{len(messages)} messages render append-only")


def check_round_trip(tokenizer, format_name: str) -> Check:
    """A call in the assistant's text survives rendering and parses back to itself."""
    fmt = get_format(format_name)
    messages = sample_conversation(format_name)[:3]
    text = render(tokenizer, messages, False)
    start = text.rfind(messages[2]["content"])
    if start == -1:
        return Check(
            "round-trip",
            False,
            "the template alters the assistant's text",
            "use a template that renders assistant content verbatim",
        )
    parsed = fmt.parse(text[start : start + len(messages[2]["content"])])
    calls = [a.call for a in parsed.calls]
    if calls != [_CALL]:
        return Check(
            "round-trip",
            False,
            f"parsed {calls!r}, expected [{_CALL!r}]",
            f"the {format_name} parser cannot read its own calls back",
        )
    native = _native_tool_calls(tokenizer, fmt)
    return Check("round-trip", True, f"{format_name} call parses back; {native}")


def _native_tool_calls(tokenizer, fmt) -> str:
    """How the template renders `tool_calls` of its own, and whether the parser reads it."""
    call = {
        "type": "function",
        "function": {"name": _CALL.name, "arguments": dict(_CALL.arguments)},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    try:
        text = render(tokenizer, messages, False)
    except Exception as err:  # templates raise anything on fields they do not know
        return f"the template rejects tool_calls ({type(err).__name__}); calls stay in content"
    if _CALL.name not in text:
        return "the template ignores tool_calls; agentgym keeps calls in the assistant content"
    parsed = [a.call for a in fmt.parse(text).calls]
    if parsed == [_CALL]:
        return "the template's own tool_calls rendering parses back too"
    return "the template renders tool_calls its own way; agentgym keeps calls in content"


def masked_conversation(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids and loss mask for a conversation, built as the rollout builds them."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = tokenizer.encode(render(tokenizer, messages[:first], True), add_special_tokens=False)
    mask = [0] * len(ids)
    history = list(messages[:first])
    k = first
    while k < len(messages):
        sampled = tokenizer.encode(messages[k]["content"], add_special_tokens=False)
        sampled.append(tokenizer.eos_token_id)
        ids += sampled
        mask += [1] * len(sampled)
        history.append(messages[k])
        k += 1
        replies = []
        while k < len(messages) and messages[k]["role"] != "assistant":
            replies.append(messages[k])
            k += 1
        if replies:
            more = continuation_ids(tokenizer, history, replies, stopped=True)
            ids += more
            mask += [0] * len(more)
            history += replies
    return ids, mask


def check_mask(tokenizer, messages: list[dict]) -> tuple[Check, list[int], list[int]]:
    """The mask-1 tokens decode to exactly the assistant messages, each ended by eos."""
    ids, mask = masked_conversation(tokenizer, messages)
    sampled = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    eos = tokenizer.eos_token
    expected = "".join(m["content"] + eos for m in messages if m["role"] == "assistant")
    full = render(tokenizer, messages, False)
    if sampled != expected:
        check = Check(
            "loss-mask",
            False,
            f"mask-1 text {sampled!r} != {expected!r}",
            "the tokenizer does not round-trip the assistant's text",
        )
    elif not full.startswith(tokenizer.decode(ids)):
        check = Check(
            "loss-mask",
            False,
            "the masked token stream differs from the template",
            f"the template should end assistant turns with {eos!r}",
        )
    else:
        n = sum(mask)
        check = Check("loss-mask", True, f"{n} of {len(ids)} tokens are the agent's (mask 1)")
    return check, ids, mask


def show_mask(console: Console, tokenizer, ids: list[int], mask: list[int]) -> None:
    """Prints the conversation with the agent's tokens (mask 1) in green, the rest dim."""
    text = Text()
    for token, m in zip(ids, mask, strict=True):
        text.append(tokenizer.decode([token]), style="bold green" if m else "dim")
    console.print(text)


def run_doctor(tokenizer, model_name: str, format_name: str, console: Console) -> bool:
    """Runs every check, prints a report; True when the template can be used as it is."""
    messages = sample_conversation(format_name)
    mask_check, ids, mask = check_mask(tokenizer, messages)
    checks = [
        check_prefix(tokenizer, messages),
        check_round_trip(tokenizer, format_name),
        mask_check,
    ]
    console.print(f"[bold]agentgym doctor[/bold]: {model_name}, tool format {format_name}")
    for c in checks:
        mark = "[green]ok[/green]  " if c.ok else "[red]FAIL[/red]"
        console.print(f"  {mark} {c.name}: {c.detail}")
        if not c.ok:
            console.print(f"        hint: {c.hint}")
    console.print("\nloss mask over the sample conversation (green: trained on, dim: masked):")
    show_mask(console, tokenizer, ids, mask)
    return all(c.ok for c in checks)

"""`agentgym doctor`: can this model's chat template carry a multi-turn tool conversation?

For each tool format (hermes, react, native: the template's own tool prompt,
with `tools=`), three checks, each with a hint when it fails:

1. Prefix consistency: whether rendering the conversation one message more
   extends the previous rendering (the rollout appends environment text as a
   template suffix). Where a template rewrites earlier turns (drops earlier
   thinking, re-renders earlier calls), the report names the message and what
   the rollout does: it splits the episode there into samples (`SPLITS`); the
   loss-mask check then reads the last sample.
2. Round trip: a tool call written in the format, inside the assistant turn,
   parses back to the same call; and when the template has its own
   `tool_calls` rendering, the parser reads that back too (for native, it
   must: one call and two calls in a turn).
3. The loss mask: the sample conversation is tokenized the way the rollout
   does it, and the mask-1 tokens must decode to exactly the assistant's text,
   each turn ended by the turn end the template writes (`find_turn_end`: not
   always eos; the report names it).
4. Plain tool text: a tool result holding the text of every special token of
   the tokenizer (the template's turn markers among them) is tokenized as plain
   text; the tool turn's special ids are the template's own, as they are for
   an ordinary result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

from agentgym.env.templates import TemplateFormat
from agentgym.env.tool_env import ToolEnv
from agentgym.policy.turn_end import TurnEnd, find_turn_end
from agentgym.rollout.conversation import HistoryRewritten
from agentgym.rollout.episodes import continuation_ids, prompt_ids, render, use_chat_template
from agentgym.rollout.external_text import special_ids, special_strings
from agentgym.tools import ToolCallFormat, get_format
from agentgym.tools.formats import ToolResult
from agentgym.types import ToolCall

logger = logging.getLogger(__name__)

_CALL = ToolCall("calculator", {"expression": "48213 * 9127 - 3381"})
_SECOND = ToolCall("calculator", {"expression": "2 ** 10"})
_RESULT = "440036670"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluates an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
"""The sample conversation's tools, given to the template in the native format."""


@dataclass(frozen=True)
class Check:
    """The outcome of one doctor check."""

    name: str
    ok: bool
    detail: str
    hint: str = ""


def tool_format(tokenizer, format_name: str, tool_parser: str | None = None) -> ToolCallFormat:
    """The format called `format_name`, "native" resolved against `tokenizer`'s template
    (ValueError when it cannot be)."""
    if format_name in ("native", "auto"):
        return TemplateFormat(format_name, tool_parser).resolve(tokenizer)
    return get_format(format_name)


def sample_conversation(fmt: ToolCallFormat | str, think: bool = False) -> list[dict]:
    """A two-turn tool conversation: a call, its result, then the final answer; with
    `think`, the call follows a `<think>` block (templates that drop earlier reasoning
    rewrite it)."""
    fmt = get_format(fmt) if isinstance(fmt, str) else fmt
    system = "You are a careful assistant. Use the calculator for arithmetic.\n\n"
    answer = f"Final Answer: {_RESULT}" if fmt.name == "react" else f"\\boxed{{{_RESULT}}}"
    call_text = fmt.render_call(_CALL)
    if think:
        call_text = "<think>\nThe calculator computes this.\n</think>\n\n" + call_text
    if fmt.name == "react":
        call_text = "Thought: I should compute this.\n" + call_text
    result = ToolResult(name=_CALL.name, content=_RESULT, error=None)
    observation = [m.to_dict() for m in fmt.observation([result])]
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is 48213 * 9127 - 3381?"},
        {"role": "assistant", "content": call_text},
        *observation,
        {"role": "assistant", "content": f"The result is {_RESULT}. {answer}"},
    ]


SPLITS = (
    "agentgym splits such an episode there into samples: each one's prompt is the "
    "conversation as the template renders it at that turn, its trained ids the ids sampled in "
    "it (the episode's advantage, split_weights)"
)


def check_prefix(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> Check:
    """Each rendering extends the previous one, with and without the generation prompt; where
    one does not, the check says so and what the rollout does (it splits the episode)."""
    k = rewritten_at(tokenizer, messages, tools)
    if k is not None:
        role = messages[k]["role"]
        return Check(
            "prefix-consistent",
            True,
            f"adding message {k} ({role}) rewrites the earlier text: {SPLITS}",
        )
    return Check("prefix-consistent", True, f"{len(messages)} messages render append-only")


def rewritten_at(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> int | None:
    """The first message whose addition rewrites the earlier rendering; None: append-only."""
    for k in range(1, len(messages)):
        shorter = render(tokenizer, messages[:k], messages[k]["role"] == "assistant", tools)
        longer = render(tokenizer, messages[: k + 1], False, tools)
        if not longer.startswith(shorter):
            return k
    return None


def check_round_trip(
    tokenizer,
    fmt: ToolCallFormat | str,
    tools: list[dict] | None = None,
    end: TurnEnd | None = None,
) -> Check:
    """A call in the assistant's text survives rendering and parses back to itself; in the
    native format, the template's own rendering of one call and of two parses back too."""
    fmt = get_format(fmt) if isinstance(fmt, str) else fmt
    messages = sample_conversation(fmt)[:3]
    text = render(tokenizer, messages, False, tools)
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
            f"the {fmt.name} parser cannot read its own calls back",
        )
    if fmt.name != "native":
        native = _native_tool_calls(tokenizer, fmt, messages[:2])
        return Check("round-trip", True, f"{fmt.name} call parses back; {native}")
    for want in ([_CALL], [_CALL, _SECOND]):
        got = template_calls(tokenizer, fmt, messages[:2], want, tools, end)
        if got != want:
            return Check(
                "round-trip",
                False,
                f"the template's own rendering of {len(want)} call(s) parses as {got!r}",
                "set run.env_kwargs.tool_parser to the parser of this template's family",
            )
    parser = getattr(fmt, "parser", fmt).name
    return Check("round-trip", True, f"{parser}: the template's own 1 and 2 calls parse back")


def template_calls(
    tokenizer,
    fmt: ToolCallFormat,
    before: list[dict],
    calls: list[ToolCall],
    tools: list[dict] | None = None,
    end: TurnEnd | None = None,
) -> list[ToolCall | None] | str:
    """The calls `fmt` reads in the template's own rendering of an assistant turn making
    `calls` (its `tool_calls` field), without the turn's end (`end`, found from the template
    when None), or why there is none."""
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
            for c in calls
        ],
    }
    try:
        head = render(tokenizer, before, True, tools)
        text = render(tokenizer, [*before, message], False, tools)
    except Exception as err:  # templates raise anything on fields they do not know
        return f"the template rejects tool_calls ({type(err).__name__}: {err})"
    turn = text[len(head) :] if text.startswith(head) else text
    end = find_turn_end(tokenizer) if end is None else end
    for token in (end.text, tokenizer.eos_token, *tokenizer.all_special_tokens):
        turn = turn.removesuffix(token) if token else turn
    return [a.call for a in fmt.parse(turn).calls]


def _native_tool_calls(tokenizer, fmt: ToolCallFormat, before: list[dict]) -> str:
    """How the template renders `tool_calls` of its own, and whether the parser reads it."""
    parsed = template_calls(tokenizer, fmt, before, [_CALL])
    if isinstance(parsed, str):
        return f"{parsed}; calls stay in content"
    if parsed == [_CALL]:
        return "the template's own tool_calls rendering parses back too"
    return "the template renders tool_calls its own way; agentgym keeps calls in content"


def masked_conversation(
    tokenizer, messages: list[dict], tools: list[dict] | None = None, end: TurnEnd | None = None
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask for a conversation, built as the rollout builds them: each
    assistant turn sampled up to and with the turn's end (`end`, found when None)."""
    end = find_turn_end(tokenizer) if end is None else end
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = prompt_ids(tokenizer, messages[:first], tools)
    mask = [0] * len(ids)
    history = list(messages[:first])
    k = first
    while k < len(messages):  # the last sample, where the template rewrites history
        sampled = tokenizer.encode(messages[k]["content"], add_special_tokens=False)
        sampled += end.ids
        ids += sampled
        mask += [1] * len(sampled)
        history.append(messages[k])
        k += 1
        replies = []
        while k < len(messages) and messages[k]["role"] != "assistant":
            replies.append(messages[k])
            k += 1
        if replies:
            try:
                more = continuation_ids(tokenizer, history, replies, True, tools, end.text)
            except HistoryRewritten:  # a new sample: the conversation rendered as it is now
                ids = prompt_ids(tokenizer, history + replies, tools)
                ids, mask, more = ids, [0] * len(ids), []
            ids += more
            mask += [0] * len(more)
            history += replies
    return ids, mask


def check_mask(
    tokenizer, messages: list[dict], tools: list[dict] | None = None, end: TurnEnd | None = None
) -> tuple[Check, list[int], list[int]]:
    """The mask-1 tokens decode to exactly the assistant messages, each ended by the
    template's turn end (`end`, found when None)."""
    end = find_turn_end(tokenizer) if end is None else end
    ids, mask = masked_conversation(tokenizer, messages, tools, end)
    sampled = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    split = rewritten_at(tokenizer, messages, tools) is not None  # the last sample's turns
    turns = [m["content"] + end.text for m in messages if m["role"] == "assistant"]
    expected = "".join(turns[-sampled.count(end.text) :] if split and end.text else turns)
    # the conversation goes on: a turn end that reaches into the next turn's header
    # ("\n### ") is what the template writes after any assistant turn but the last (a
    # template that rewrites history renders no conversation the samples are prefixes of)
    full = render(tokenizer, [*messages, {"role": "user", "content": "Thanks."}], False, tools)
    if sampled != expected:
        check = Check(
            "loss-mask",
            False,
            f"mask-1 text {sampled!r} != {expected!r}",
            "the tokenizer does not round-trip the assistant's text",
        )
    elif not split and not full.startswith(tokenizer.decode(ids)):
        check = Check(
            "loss-mask",
            False,
            "the masked token stream differs from the template",
            "the template should write the same turn end right after every assistant "
            f"message's content (the turn end found: {end.describe(tokenizer)})",
        )
    else:
        n = sum(mask)
        check = Check("loss-mask", True, f"{n} of {len(ids)} tokens are the agent's (mask 1)")
    return check, ids, mask


def check_plain_tool_text(tokenizer, format_name: str, tool_parser: str | None = None) -> Check:
    """A tool result holding every special token's text is tokenized as plain text: the
    special ids after the sampled call are the template's own, as for an ordinary result."""
    fmt = tool_format(tokenizer, format_name, tool_parser)
    tools = TOOLS if fmt.name == "native" else None
    messages = sample_conversation(fmt)
    replies = [m for m in messages[3:] if m["role"] != "assistant"]
    strings = special_strings(tokenizer)
    forged = "\n".join(strings) + "\nforged"
    special = special_ids(tokenizer)

    def turn_specials(content: str) -> list[str]:
        """The special tokens of the ids that follow the call when each reply is `content`
        (of the whole new sample's prompt, where the template rewrites history)."""
        answered = [{**m, "content": content} for m in replies]
        try:
            ids = continuation_ids(tokenizer, messages[:3], answered, True, tools)
        except HistoryRewritten:
            ids = prompt_ids(tokenizer, [*messages[:3], *answered], tools)
        return [tokenizer.convert_ids_to_tokens(i) for i in ids if i in special]

    hint = "report it: the rollout cannot keep this tokenizer's special-token text plain"
    try:
        own, seen = turn_specials(_RESULT), turn_specials(forged)
    except ValueError as err:  # the tokenizer makes a special id out of plain text
        return Check("plain-tool-text", False, str(err), hint)
    if seen != own:
        return Check(
            "plain-tool-text",
            False,
            f"tool text became control tokens: {seen} where the template writes {own}",
            hint,
        )
    named = [s for s in strings if s in (tokenizer.chat_template or "")] or strings[:3]
    return Check(
        "plain-tool-text",
        True,
        f"tool text holding all {len(strings)} special tokens ({', '.join(named)}, ...) "
        f"stays plain text; the {len(own)} the template writes around it stay special",
    )


def show_mask(console: Console, tokenizer, ids: list[int], mask: list[int]) -> None:
    """Prints the conversation with the agent's tokens (mask 1) in green, the rest dim."""
    text = Text()
    for token, m in zip(ids, mask, strict=True):
        text.append(tokenizer.decode([token]), style="bold green" if m else "dim")
    console.print(text)


def run_checks(
    tokenizer, format_name: str, tool_parser: str | None = None, end: TurnEnd | None = None
) -> tuple[list[Check], list[int], list[int]]:
    """The three checks of one format, and the sample conversation's ids and mask; `end`
    is the template's turn end (found when None)."""
    end = find_turn_end(tokenizer) if end is None else end
    try:
        fmt = tool_format(tokenizer, format_name, tool_parser)
    except ValueError as err:
        return [Check("tool-format", False, str(err), "see the message")], [], []
    tools = TOOLS if fmt.name == "native" else None
    messages = sample_conversation(fmt)
    thinking = sample_conversation(fmt, think=True)
    prefix = check_prefix(tokenizer, thinking, tools)
    rewrites = rewritten_at(tokenizer, thinking, tools) is not None  # the mask: a split one
    mask_check, ids, mask = check_mask(tokenizer, thinking if rewrites else messages, tools, end)
    return [prefix, check_round_trip(tokenizer, fmt, tools, end), mask_check], ids, mask


def run_doctor(
    tokenizer, model_name: str, format_name: str, console: Console, tool_parser: str | None = None
) -> bool:
    """Runs every check, prints a report; True when the template can be used as it is."""
    end = find_turn_end(tokenizer)
    checks, ids, mask = run_checks(tokenizer, format_name, tool_parser, end)
    if ids:  # the sample conversation was built: its tool text is forged in turn
        checks.append(check_plain_tool_text(tokenizer, format_name, tool_parser))
    console.print(f"[bold]agentgym doctor[/bold]: {model_name}, tool format {format_name}")
    console.print(f"  turn end: {end.describe(tokenizer)}", markup=False)
    for c in checks:
        mark = "[green]ok[/green]  " if c.ok else "[red]FAIL[/red]"
        console.print(f"  {mark} {c.name}: {c.detail}")
        if not c.ok:
            console.print(f"        hint: {c.hint}")
    if ids:
        console.print("\nloss mask over the sample conversation (green: trained on, dim: masked):")
        show_mask(console, tokenizer, ids, mask)
    return all(c.ok for c in checks)


def check_env_template(env: Any, tokenizer: Any, model_name: str) -> None:
    """Refuses (ConfigError) to train a tool env with a chat template that cannot carry its
    conversations: "native" without template support. A template that rewrites history
    is trained on as the rollout splits its episodes (`agentgym.rollout.samples`); the
    log says so."""
    use_chat_template(env, tokenizer)  # a ConfigError when native cannot be used
    agent = env.unwrapped
    if not isinstance(agent, ToolEnv):
        return
    tools = agent.tools() if agent.format.name == "native" else None
    messages = sample_conversation(agent.format, think=True)
    k = rewritten_at(tokenizer, messages, tools)
    if k is not None:
        logger.warning(
            "the chat template of %s rewrites the conversation's earlier text (adding a %s "
            "message); %s. `agentgym doctor` shows it.",
            model_name,
            messages[k]["role"],
            SPLITS,
        )

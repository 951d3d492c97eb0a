"""The ids of a conversation's parts, as the rollout and the endpoint build them: an
episode's opening, a sampled turn's text, and the ids that follow a sampled turn (its
closing, then the environment's reply) under the chat template.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
from transformers import PreTrainedTokenizerBase

from agentgym.policy.turn_end import TurnEnd, find_turn_end
from agentgym.rollout.external_text import Rendered, encode_rendered, render, render_external

_SENTINEL = "\u2063agentgym-end-of-content\u2063"


class HistoryRewritten(ValueError):
    """The chat template renders the conversation with a new message so that the rendering
    no longer extends the one before (it drops earlier thinking, re-renders earlier calls):
    the ids that follow cannot be appended; the rollout starts a new sample there."""


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Ids of an episode's opening: `messages` (all from outside the policy) rendered with the
    generation prompt; special-token text in their content stays plain text."""
    return encode_rendered(tokenizer, render_external(tokenizer, messages, True, tools))


def use_chat_template(env: gym.Env, tokenizer: PreTrainedTokenizerBase) -> None:
    """Tells an environment that speaks the model's own tool format (`ToolEnv`'s
    `use_chat_template`) which tokenizer it plays with; other environments need not know."""
    bind = getattr(env.unwrapped, "use_chat_template", None)
    if bind is not None:
        bind(tokenizer)


def sampled_text(
    tokenizer: PreTrainedTokenizerBase,
    ids: Sequence[int],
    keep_special: bool,
    closing: str | None = None,
) -> str:
    """The text of a sampled turn, without `closing` (the text it closed with from its turn
    end on, `closing_text`). A native-format turn keeps special tokens that carry a call
    (`[TOOL_CALLS]`, `<|python_tag|>`), all but those that end it."""
    if not keep_special:
        # a tuple of ids decodes as a list does, to one str; transformers' types say neither
        text: str = tokenizer.decode(ids, skip_special_tokens=True)  # type: ignore[arg-type,assignment]
    else:
        special, stop = set(tokenizer.all_special_ids), len(ids)
        while stop and ids[stop - 1] in special:
            stop -= 1
        text = tokenizer.decode(list(ids[:stop]), skip_special_tokens=False)  # type: ignore[assignment]
    return text.removesuffix(closing) if closing else text


def rewrite_note(before: str, after: str, width: int = 24) -> str:
    """Where a longer rendering stops extending the shorter one: the character, and the
    text there before and after (the viewer shows it beside a split sample)."""
    at = len(os.path.commonprefix([before, after]))
    return (
        f"the template re-rendered the conversation from character {at}: "
        f"{before[at : at + width]!r} became {after[at : at + width]!r}"
    )


def continuation_ids(
    tokenizer: PreTrainedTokenizerBase,
    history: list[dict[str, str]],
    new_messages: list[dict[str, str]],
    stopped: bool,
    tools: list[dict[str, Any]] | None = None,
    closing: str | None = None,
) -> list[int]:
    """Ids that follow the last sampled token: end of the assistant turn, then `new_messages`;
    `HistoryRewritten` where the template does not render the conversation append-only.

    `history` ends with the assistant message just sampled. The text is the
    difference of two template renderings, so it matches what the template
    would produce for the whole conversation. When the sample `stopped` with its
    turn end, the text it closed with (`closing`: the template's turn end when None,
    or eos, see `closing_text`) is already in the trajectory and is not repeated
    where the template writes it.
    """
    before = render(tokenizer, history, False, tools)
    # new_messages come from outside the policy: their special-token text stays plain text
    rendered = render_external(tokenizer, history + new_messages, True, tools, len(history))
    after = rendered.text
    if not after.startswith(before):
        raise HistoryRewritten(rewrite_note(before, after))
    # what the template puts after the assistant's content: found with a sentinel content,
    # since the real content may be empty or occur earlier in the conversation
    marked = [*history[:-1], {**history[-1], "content": _SENTINEL}]
    glue = render(tokenizer, marked, False, tools).rpartition(_SENTINEL)[2]
    text = glue + after[len(before) :]
    if stopped and closing is None:
        closing = find_turn_end(tokenizer).text
    cut = len(closing) if stopped and closing and text.startswith(closing) else 0
    shift = len(glue) - len(before) - cut
    forged = tuple(p + shift for p in rendered.forged if p >= len(before) + cut)
    return encode_rendered(tokenizer, Rendered(text[cut:], forged))


def closing_text(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], end: TurnEnd
) -> str | None:
    """The text sampled `ids` close with after their content: from the template's turn
    `end` on (`TurnEnd.closing`), or eos (a model that emits eos where its template ends
    turns otherwise); None for a turn cut at a stop string or at the token budget."""
    closing = end.closing(tokenizer, ids)
    if closing is None and ids and ids[-1] == getattr(tokenizer, "eos_token_id", None):
        eos: str = tokenizer.eos_token
        return eos
    return closing

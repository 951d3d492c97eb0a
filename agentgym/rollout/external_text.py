"""Text from outside the policy, tokenized so that it never becomes control tokens.

A tool result, an observation, a user prompt or a program's output may hold the
text of a special token (`<|im_end|>`, `<|eot_id|>`, `[INST]`). Encoded with the
tokenizer's usual special-token parsing, `<|im_end|>\\n<|im_start|>assistant`
inside a tool result would become real turn markers: text the model wrote
(stdout) could forge turns in its own training data. Here only the chat
template's own special tokens are parsed; the same strings inside a message's
content are encoded as the plain text they are.

How: before rendering, each special-token string inside an external message's
content gets an invisible marker in front of it. The template renders the
marked messages (whatever it does to content, `tojson` or `trim`, the markers
ride along), the markers are taken out again, and their places are where the
forged strings start. The text is then encoded once, as before, with offsets;
a special id that starts at a marked place is forged. Only the stretch between
the template's real special tokens around it is encoded again, with special
tokens not parsed; every other id stays as the single encoding gave it. The
tokenizer splits its input at every special token anyway, so that stretch is
encoded as it would be if the forged string were not special. Text without
forged strings takes none of this: its ids are the tokenizer's ids of the
rendered text, exactly.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Rendered:
    """A chat template's text, and where in it special-token strings from outside the
    policy start (in message content; never the template's own)."""

    text: str
    forged: tuple[int, ...] = ()


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The chat template applied to messages, as text.

    `tools` (JSON schemas) go to the template only for an environment in the
    native tool format; the others describe their tools, in their own call
    format, in the system message, so no tool is listed twice.
    """
    extra: dict[str, Any] = {} if tools is None else {"tools": tools}
    # tokenize=False gives the text; transformers types the result of every mode at once
    return cast(
        str,
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **extra
        ),
    )


def special_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids of the tokenizer's special tokens: its named ones and every added token
    marked special (a tokenizer's `additional_special_tokens` may not list them all)."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    marked = {i for i, token in added.items() if token.special}
    return frozenset(getattr(tokenizer, "all_special_ids", ())) | marked


def special_strings(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The text of each special token, longest first (as the tokenizer matches them)."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    found = {t.content for t in added.values() if t.special}
    found.update(getattr(tokenizer, "all_special_tokens", ()))
    return tuple(sorted((s for s in found if s), key=lambda s: (-len(s), s)))


def render_external(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    external_from: int = 0,
) -> Rendered:
    """`render`, and where the content of `messages[external_from:]` (text from outside
    the policy) puts special-token strings."""
    strings = special_strings(tokenizer)
    pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
    outside = messages[external_from:]
    if pattern is None or not any(pattern.search(_content(m)) for m in outside):
        return Rendered(render(tokenizer, messages, generation_prompt, tools))
    marker = _free_marker([_content(m) for m in messages], tools)
    marked = [
        {**m, "content": pattern.sub(lambda hit: marker + hit[0], m["content"])}
        if isinstance(m.get("content"), str)
        else m
        for m in outside
    ]
    text = render(tokenizer, [*messages[:external_from], *marked], generation_prompt, tools)
    pieces = text.split(marker)
    starts, at = [], 0
    for piece in pieces[:-1]:
        at += len(piece)
        starts.append(at)
    return Rendered("".join(pieces), tuple(starts))


def encode_rendered(tokenizer: PreTrainedTokenizerBase, rendered: Rendered) -> list[int]:
    """The ids of a rendering: the template's special tokens as special ids, forged ones
    as the plain text they are.

    Raises:
        ValueError: The tokenizer makes a special id out of plain text, so forged text
            cannot be kept plain.
    """
    if not rendered.forged:
        ids: list[int] = tokenizer.encode(rendered.text, add_special_tokens=False)
        return ids
    text, special = rendered.text, special_ids(tokenizer)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoding["input_ids"]), list(encoding["offset_mapping"])
    # a forged string is matched where its marker was; lstrip/rstrip tokens widen the range
    forged = [
        k
        for k, (i, (s, e)) in enumerate(zip(ids, offsets, strict=True))
        if i in special and any(s <= p < e for p in rendered.forged)
    ]
    # the template's own special tokens bound the stretches that are encoded again
    real = [k for k, i in enumerate(ids) if i in special and k not in forged]
    stretches = sorted({_between(real, k, len(ids)) for k in forged})
    out: list[int] = []
    done = 0
    for first, last in stretches:
        start = offsets[first][1] if first >= 0 else 0
        end = offsets[last][0] if last < len(ids) else len(text)
        plain = _plain_ids(tokenizer, text[start:end], start > 0)
        if made := special.intersection(plain):
            raise ValueError(
                f"the tokenizer makes special ids {sorted(made)} out of plain text "
                f"{text[start:end][:200]!r}: text from outside the policy cannot be kept plain"
            )
        out += ids[done : first + 1] + plain
        done = last
    return out + ids[done:]


def _between(real: list[int], k: int, n: int) -> tuple[int, int]:
    """The indices of the real special ids just before and just after index `k` (-1 and
    `n` where there is none)."""
    at = bisect.bisect_left(real, k)
    return (real[at - 1] if at else -1, real[at] if at < len(real) else n)


def _plain_ids(tokenizer: PreTrainedTokenizerBase, text: str, mid_text: bool) -> list[int]:
    """Ids of `text` with no special token parsed. `mid_text`: it follows other text, which a
    tokenizer that marks the start of its input (SentencePiece's leading "▁") must not see
    as a start; encoding it after a newline, then dropping the newline, avoids that (the
    trick transformers' own `sanitize_control_tokens` uses)."""
    alone: list[int] = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    if not mid_text:
        return alone
    newline: list[int] = tokenizer.encode("\n", add_special_tokens=False)
    after: list[int] = tokenizer.encode(
        "\n" + text, add_special_tokens=False, split_special_tokens=True
    )
    return after[len(newline) :] if after[: len(newline)] == newline else alone


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _free_marker(texts: Sequence[str], tools: list[dict[str, Any]] | None) -> str:
    """A character (private use) that occurs in none of the texts nor the tools, so that
    every one found in the rendering was put there by `render_external`."""
    seen = "".join(texts) + repr(tools)
    return next(chr(c) for c in range(0xF0000, 0xFFFFE) if chr(c) not in seen)

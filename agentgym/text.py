"""Parsing of model text shared by the tool-call formats and the rewards: boxed answers.

Imports nothing of agentgym; it sits below `tools` and `rewards`, which both read answers.
"""

from __future__ import annotations

import re

BOXED = re.compile(r"\\boxed\s*\{")
"""The opening of a `\\boxed{` (whitespace allowed before the brace)."""


def _closing_brace(text: str, open_index: int) -> int | None:
    """Index of the `}` matching the `{` at `open_index`; None if it never closes."""
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # `\{` and `\}` are literal braces in LaTeX; `\\` is a line break
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def boxes(text: str) -> list[str] | None:
    """Contents of the top-level `\\boxed{...}`s in order; None if one is unbalanced."""
    found = []
    pos = 0
    while match := BOXED.search(text, pos):
        end = _closing_brace(text, match.end() - 1)
        if end is None:
            return None
        found.append(text[match.end() : end])
        pos = end + 1
    return found


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text`, nested braces balanced.

    `\\boxed {x}` (whitespace before the brace) counts; `\\boxed x` without braces
    does not. A box inside a box belongs to the outer one. Returns None when
    there is no box or when a box never closes.

    So "\\boxed{1}, no: \\boxed{\\frac{1}{2}}" gives "\\frac{1}{2}".
    """
    found = boxes(text)
    return found[-1] if found else None


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def outside_thinking(text: str) -> str:
    """`text` without the model's thinking, which never executes as a call nor answers:
    each `<think>...</think>` block; the text up to a `</think>` that no `<think>` opens
    (a template that opens the block in the generation prompt, as Qwen3's does); and, from
    a `<think>` that is never closed, the rest (a turn cut off while thinking)."""
    first_open, first_close = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        text = text[first_close + len(THINK_CLOSE) :]
    kept, pos = [], 0
    while (start := text.find(THINK_OPEN, pos)) != -1:
        kept.append(text[pos:start])
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end == -1:
            return "".join(kept)
        pos = end + len(THINK_CLOSE)
    kept.append(text[pos:])
    return "".join(kept)

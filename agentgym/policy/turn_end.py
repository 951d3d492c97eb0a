"""The end of an assistant turn, read from the chat template rather than assumed to be eos.

A model ends its turn with whatever its chat template writes after an assistant
message's content: ChatML's `<|im_end|>`, Llama 3's `<|eot_id|>`, Mistral's `</s>`.
That need not be the tokenizer's eos: a Llama 3.x tokenizer's eos may be
`<|end_of_text|>`, a Qwen base model's is `<|endoftext|>`, while their templates end
turns with `<|eot_id|>` and `<|im_end|>`. Generation stops on the turn end (and on eos),
and the rollout keeps it in the trajectory with loss mask 1, as the model sampled it.

`find_turn_end` renders a probe conversation (user, assistant, user) and reads what
follows the assistant's content. When that text starts with one of the tokenizer's
special or added tokens, the end is that one token. Otherwise it is a short text (a
template without such a token, e.g. `"\\n### "`), cut before the next message's role
name, at the first special token, and at a newline that follows other text; generation
stops on it as a stop string. A template that cannot be read this way gets eos, with
the reason in `TurnEnd.fallback`: never an exception.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_CONTENT = "\u2063agentgym-turn-end-probe\u2063"  # invisible separators: no template alters them
_NEXT = "\u2063agentgym-next-message\u2063"
_PROBE = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": _CONTENT},
    {"role": "user", "content": _NEXT},
]


@dataclass(frozen=True)
class TurnEnd:
    """What ends an assistant turn under a tokenizer's chat template.

    Attributes:
        text: What the template writes right after the assistant's content to end its turn.
        ids: The ids of `text` (one id when `special`).
        special: The end is one special or added token of the tokenizer (a stop id);
            otherwise it is text that several ids may spell (a stop string).
        is_eos: The end is the tokenizer's eos token.
        fallback: Why the template's end could not be read and eos stands in; None
            when it was read from the template.
    """

    text: str
    ids: tuple[int, ...]
    special: bool
    is_eos: bool
    fallback: str | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings a backend needs on top of its stop ids: the text of a
        multi-token end; none for a single-token end, which is a stop id."""
        return () if self.special or not self.text else (self.text,)

    def closing(self, tokenizer: Any, ids: Sequence[int]) -> str | None:
        """The text sampled `ids` close with, from this turn end on; None when they do
        not finish with it. For an end that is text, the token that completed it may
        have written more ("\\n### User" for the end "\\n### "): that is included."""
        if not self.ids or not ids:
            return None
        if self.special:
            return self.text if ids[-1] == self.ids[-1] else None
        # each id is at least one character: these ids hold the whole end if it is there
        tail = tokenizer.decode(list(ids[-(len(self.text) + 1) :]), skip_special_tokens=False)
        at = tail.rfind(self.text)
        return tail[at:] if at != -1 else None

    def describe(self, tokenizer: Any) -> str:
        """One line for people: the end, what kind it is, and how it relates to eos."""
        eos = getattr(tokenizer, "eos_token", None)
        if self.fallback is not None:
            return f"eos {eos!r} (fallback: {self.fallback})"
        kind = "special token" if self.special else f"text of {len(self.ids)} tokens"
        relation = "also eos" if self.is_eos else f"not eos {eos!r}"
        return f"{self.text!r} ({kind}, {relation})"


def find_turn_end(tokenizer: Any) -> TurnEnd:
    """The end of an assistant turn under `tokenizer`'s chat template (see the module
    docstring); eos, with `fallback` saying why, where the template cannot be read."""
    glue = tail = None
    why = ""
    try:
        glue = _after_content(tokenizer, _PROBE)
    except ValueError as err:
        why = str(err)
    try:
        tail = _after_content(tokenizer, _PROBE[:2])
    except ValueError as err:
        why = why or str(err)
    after = glue if glue is not None else tail
    if after is None:
        return eos_turn_end(tokenizer, f"the chat template {why}")
    token = _leading_token(tokenizer, after)
    if token is not None:
        return _turn_end(tokenizer, token)
    text = _text_end(tokenizer, glue, tail)
    if not text.strip():
        why = f"writes no turn end right after the assistant's content ({after[:40]!r})"
        return eos_turn_end(tokenizer, f"the chat template {why}")
    return _turn_end(tokenizer, text)


def eos_turn_end(tokenizer: Any, why: str) -> TurnEnd:
    """The tokenizer's eos as the turn end, standing in for one the template does not show."""
    eos, eos_id = getattr(tokenizer, "eos_token", None), getattr(tokenizer, "eos_token_id", None)
    if not eos or eos_id is None:
        return TurnEnd("", (), False, False, f"{why}; the tokenizer has no eos either")
    return TurnEnd(eos, (eos_id,), True, True, why)


def _after_content(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """What the template writes after the probe's assistant content: up to the next
    message's content when there is one, else to the end of the text.

    Raises:
        ValueError: The template fails on `messages`, or does not render the contents as
            they were given.
    """
    roles = "/".join(m["role"] for m in messages)
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    except Exception as err:  # templates raise anything on conversations they dislike
        raise ValueError(f"cannot render a {roles} probe ({type(err).__name__}: {err})") from err
    if not isinstance(text, str) or _CONTENT not in text:
        raise ValueError(f"does not render the assistant's content of a {roles} probe as given")
    after = text.rpartition(_CONTENT)[2]
    if messages[-1]["role"] == "assistant":
        return after
    if _NEXT not in after:
        raise ValueError(f"does not render the last content of a {roles} probe as given")
    return after.partition(_NEXT)[0]


def _token_strings(tokenizer: Any) -> tuple[str, ...]:
    """The text of each special and added token of the tokenizer, and eos; longest first
    (as the tokenizer matches them)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {t.content for t in added.values()}
    found.update(getattr(tokenizer, "all_special_tokens", None) or ())
    found.add(getattr(tokenizer, "eos_token", None) or "")
    return tuple(sorted((s for s in found if s), key=lambda s: (-len(s), s)))


def _leading_token(tokenizer: Any, text: str) -> str | None:
    """The special or added token `text` starts with, if it is one id of the tokenizer."""
    for token in _token_strings(tokenizer):
        if text.startswith(token) and len(_ids(tokenizer, token)) == 1:
            return token
    return None


def _text_end(tokenizer: Any, glue: str | None, tail: str | None) -> str:
    """A turn end that is text: the glue before the next role's name and any special
    token, narrowed to what the tail shares with it, cut at a newline after other text."""
    text = glue if glue is not None else tail or ""
    cuts = [text.find(t) for t in _token_strings(tokenizer)]
    if glue is not None:
        cuts.append(glue.lower().find(_PROBE[2]["role"]))
    text = text[: min([c for c in cuts if c > 0], default=len(text))]
    if glue is not None and tail is not None:
        shared = os.path.commonprefix([text, tail])
        text = shared if shared.strip() else text
    body = len(text) - len(text.lstrip())
    newline = text.find("\n", body)
    return text if newline == -1 else text[:newline]


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _turn_end(tokenizer: Any, text: str) -> TurnEnd:
    ids = _ids(tokenizer, text)
    eos = getattr(tokenizer, "eos_token", None)
    return TurnEnd(
        text, tuple(ids), len(ids) == 1 and text in _token_strings(tokenizer), text == eos
    )

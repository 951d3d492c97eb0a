"""`model.chat_template`: a chat template that replaces the tokenizer's own.

For a model whose template lacks tool support, and for tests, a run may name a
template: one shipped with agentgym (`SHIPPED`: a Qwen2.5-style, a Llama 3.1-style
and a Mistral v3-style template with tools, each written from its family's
published format; see the header of each file), a path to a Jinja file, or the
template text itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEMPLATE_DIR = Path(__file__).with_name("templates")
SHIPPED: dict[str, str] = {
    "qwen2.5": "qwen2_5_tools.jinja",
    "llama3.1": "llama3_1_json.jinja",
    "mistral-v3": "mistral_v3_tools.jinja",
}


def read_chat_template(value: str) -> str:
    """The template `value` names: a shipped name, a Jinja file, or template text itself.

    Raises:
        ValueError: `value` is none of these; the message lists what would be valid.
    """
    if value in SHIPPED:
        return (TEMPLATE_DIR / SHIPPED[value]).read_text()
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        text = path.read_text()
        if not text.strip():
            raise ValueError(f"model.chat_template: the file {path} is empty")
        return text
    raise ValueError(
        f"model.chat_template={value!r} is not a file, a shipped template "
        f"({', '.join(SHIPPED)}) or Jinja template text (with {{{{ or {{%)"
    )


def apply_chat_template_option(tokenizer: Any, value: str | None) -> Any:
    """`tokenizer` with its chat template replaced by the one `value` names (None keeps it)."""
    if value is not None:
        tokenizer.chat_template = read_chat_template(value)
    return tokenizer

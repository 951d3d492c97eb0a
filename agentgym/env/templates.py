"""Which tool-call format a `ToolEnv` speaks, once the model's chat template is known.

`tool_format="auto"` is native where the template renders `tools=`, else Hermes;
`"native"` demands a template that does. Either is resolved by
`TemplateFormat.resolve(tokenizer, tools)`, which the rollout reaches through
`ToolEnv.use_chat_template` before each reset; an env never bound stays Hermes
("auto") or, for "native", needs `tool_parser` to read calls.
"""

from __future__ import annotations

from typing import Any, Literal

from agentgym.config import ConfigError
from agentgym.tools import HERMES, ParsedTurn, ToolCallFormat, get_format
from agentgym.tools.native import (
    PARSERS,
    NativeFormat,
    ResponseSchemaParser,
    detect_parser,
    get_parser,
)

ToolFormatName = Literal["auto", "native", "hermes", "react"]
TOOL_FORMATS: tuple[str, ...] = ("auto", "native", "hermes", "react")

_PROBE = {
    "type": "function",
    "function": {
        "name": "agentgym_probe_tool",
        "description": "Checks whether the chat template lists tools.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}


def template_text(tokenizer: Any) -> str:
    """The tokenizer's chat template as one text (a dict of named templates joined)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(template.values()) if isinstance(template, dict) else str(template)


def renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template shows the `tools=` it is given (to a model that reads it)."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        text = tokenizer.apply_chat_template(messages, tools=[_PROBE], tokenize=False)
    except Exception:  # templates raise whatever they like on input they cannot take
        return False
    return isinstance(text, str) and "agentgym_probe_tool" in text


class _UnboundNative(NativeFormat):
    """ "native" before the template is known and with no `tool_parser`: cannot read calls."""

    def __init__(self) -> None:
        super().__init__(get_parser("hermes"))

    def parse(self, text: str, *, truncated: bool = False) -> ParsedTurn:
        raise RuntimeError(
            "tool_format='native' reads calls with the model's own parser, and no chat "
            "template was bound: call env.unwrapped.use_chat_template(tokenizer) before "
            f"reset (agentgym's rollout does), or pass tool_parser= one of {sorted(PARSERS)}"
        )


class TemplateFormat:
    """The format a `ToolEnv` asked for, and the one it speaks with a given tokenizer.

    Args:
        tool_format: "auto", "native", "hermes" or "react".
        tool_parser: The native parser's name; None detects it from the template.
    """

    def __init__(self, tool_format: str, tool_parser: str | None):
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format={tool_format!r}; valid: {', '.join(TOOL_FORMATS)}")
        if tool_parser is not None and tool_parser not in PARSERS:
            raise ValueError(
                f"tool_parser={tool_parser!r}; valid: None (detect it from the chat "
                f"template) or one of {', '.join(sorted(PARSERS))}"
            )
        self.requested, self.parser_name = tool_format, tool_parser
        self._fixed: ToolCallFormat = (
            get_format(tool_format) if tool_format in ("hermes", "react") else HERMES
        )
        self._cache: dict[tuple[int, str], ToolCallFormat] = {}

    def unbound(self) -> ToolCallFormat:
        """The format before any tokenizer is bound."""
        if self.requested != "native":
            return self._fixed
        if self.parser_name is not None:
            return NativeFormat(get_parser(self.parser_name))
        return _UnboundNative()

    def resolve(self, tokenizer: Any) -> ToolCallFormat:
        """The format to speak with `tokenizer`; ConfigError (a ValueError) if "native"
        cannot be."""
        if self.requested not in ("auto", "native"):
            return self._fixed
        key = (id(tokenizer), template_text(tokenizer))
        if key not in self._cache:
            self._cache[key] = self._choose(tokenizer)
        return self._cache[key]

    def _choose(self, tokenizer: Any) -> ToolCallFormat:
        name = getattr(tokenizer, "name_or_path", "") or "the model"
        if not renders_tools(tokenizer):
            if self.requested == "auto":
                return self._fixed
            raise ConfigError(
                f"tool_format='native': the chat template of {name} does not render tools=; "
                "set model.chat_template to one that does (shipped: 'qwen2.5', 'llama3.1', "
                "'mistral-v3'), or use tool_format='hermes' or 'react'"
            )
        family = self.parser_name or detect_parser(template_text(tokenizer))
        schema = getattr(tokenizer, "response_template", None)
        if schema and self.parser_name is None:
            fallback = get_parser(family or "hermes")
            return NativeFormat(ResponseSchemaParser(tokenizer.parse_response, fallback))
        if family is None:
            raise ConfigError(
                f"tool_format='native': cannot tell which tool-call syntax the chat template "
                f"of {name} uses; set tool_parser (run.env_kwargs.tool_parser) to one of "
                f"{', '.join(sorted(PARSERS))}"
            )
        return NativeFormat(get_parser(family))

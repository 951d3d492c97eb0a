"""The built-in random models, made in code: nothing downloads.

`tiny-random` is a seeded two-layer Qwen2-style model with a byte-level BPE
tokenizer trained here on a small corpus of the project's own kinds of text
(ChatML turns, Hermes tool calls, ReAct steps, Python); the tests train and
evaluate on it. `smollm2-shaped` has SmolLM2-135M-Instruct's layers (30 of
them, hidden size 576, 9 query and 3 key-value heads) with random weights and
the tiny tokenizer: the embedded model's compute without its 98 MB of weights,
for benchmarks on a machine its weights cannot reach (`bench/gpu_check.sh`).

Two variants of `tiny-random` have a chat template whose turns end with a token that
is not the tokenizer's eos, as real models do: `tiny-random-llama3` (a Llama 3-style
template, turns ended by `<|eot_id|>`, eos `<|end_of_text|>`) and
`tiny-random-qwen-base` (its own ChatML template, turns ended by `<|im_end|>`, eos
`<|endoftext|>`, as a Qwen base model's tokenizer). `agentgym.policy.models` caches
them all as plain Hugging Face folders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
from tokenizers import pre_tokenizers as pre
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY_RANDOM = "tiny-random"
TINY_RANDOM_VERSION = 1  # bump whenever the tiny model or its tokenizer changes
SMOLLM2_SHAPED = "smollm2-shaped"
SMOLLM2_SHAPED_VERSION = 1  # bump whenever the model or its tokenizer changes

_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen2's ids 0, 1, 2
# Qwen2's pre-tokenizer: transformers rebuilds every qwen2 tokenizer with it on load.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# ChatML with Hermes-style tools, as in Qwen2.5: the tool schemas go into the system turn,
# tool results come back as <tool_response> blocks inside one user turn.
CHAT_TEMPLATE = r"""
{%- if tools %}
  {{- '<|im_start|>system\n' }}
  {{- messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}
  {{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
  {%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
  {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
  {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first)
        or (message.role == 'assistant' and not message.tool_calls) %}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
  {%- elif message.role == 'assistant' %}
    {{- '<|im_start|>assistant' }}
    {%- if message.content %}{{- '\n' + message.content }}{%- endif %}
    {%- for call in message.tool_calls %}
      {%- set call = call.function if call.function is defined else call %}
      {{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
      {{- call.arguments if call.arguments is string else call.arguments | tojson }}
      {{- '}\n</tool_call>' }}
    {%- endfor %}
    {{- '<|im_end|>\n' }}
  {%- elif message.role == 'tool' %}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
      {{- '<|im_start|>user' }}
    {%- endif %}
    {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
      {{- '<|im_end|>\n' }}
    {%- endif %}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
""".strip()
# Llama 3.x's format (Meta's published prompt format, JSON tool calls): header-tagged turns,
# each ended by <|eot_id|>, tools in the system turn, results in an `ipython` turn.
LLAMA3_TEMPLATE = r"""
{%- if messages[0].role == 'system' %}
  {%- set system = messages[0].content %}{%- set messages = messages[1:] %}
{%- else %}{%- set system = '' %}{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{%- if tools %}
  {{- 'Environment: ipython\n\nRespond with a JSON function call {"name": function name, ' }}
  {{- '"parameters": dictionary of argument name and its value}. Functions:\n' }}
  {%- for tool in tools %}{{- (tool | tojson) + '\n' }}{%- endfor %}
  {{- '\n' }}
{%- endif %}
{{- system + '<|eot_id|>' }}
{%- for message in messages %}
  {%- if message.role == 'assistant' %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
    {%- for call in message.tool_calls or [] %}
      {%- set call = call.function if call.function is defined else call %}
      {{- '{"name": "' + call.name + '", "parameters": ' }}
      {{- call.arguments if call.arguments is string else call.arguments | tojson }}
      {{- '}' + ('; ' if not loop.last else '') }}
    {%- else %}{{- message.content }}{%- endfor %}
    {{- '<|eot_id|>' }}
  {%- else %}
    {%- set role = 'ipython' if message.role == 'tool' else message.role %}
    {{- '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
""".strip()
_PROSE = (
    "You are a helpful assistant. Solve the problem step by step and put the final answer "
    "in \\boxed{}. The user asks a question; the assistant thinks, calls a tool when it "
    "needs one, reads the result and answers. Python functions return values, raise errors "
    "and print output. A train leaves the station at noon travelling at a constant speed; "
    "how far has it gone after three hours? The price of each ticket is the total cost "
    "divided by the number of tickets. If the result is wrong, check the work again."
)


def tiny_corpus() -> str:
    """Returns the local text the tiny tokenizer is trained on: math, tool calls, code."""
    names, things = ("Ava", "Ben", "Cara", "Dan", "Eli", "Fay"), ("apples", "books", "coins")
    parts = [_PROSE, CHAT_TEMPLATE]
    for i in range(60):
        a, b, who, what = (7 * i + 3) % 97, (13 * i + 5) % 89, names[i % 6], things[i % 3]
        call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})
        parts += [
            f"{who} has {a} {what} and buys {b} more. How many {what} does {who} have now? "
            f"{who} has {a} + {b} = {a + b} {what}. The answer is \\boxed{{{a + b}}}.",
            f"Thought: I should use the calculator.\nAction: {call}\nObservation: {a * b}",
            f"<tool_call>\n{call}\n</tool_call>\n<tool_response>\n{a * b}\n</tool_response>",
            f"def solve(x: int) -> int:\n    return x * {a} - {b}\n\nprint(solve({i}))",
        ]
    return "\n\n".join(parts)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE tokenizer on `tiny_corpus()`, with ChatML special tokens."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    split = pre.Split(Regex(_QWEN2_SPLIT), behavior="isolated")
    tok.pre_tokenizer = pre.Sequence(
        [split, pre.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=768,
        min_frequency=2,
        special_tokens=list(_SPECIAL),
        initial_alphabet=pre.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([tiny_corpus()], trainer=trainer)
    # Not special, so decoding with skip_special_tokens keeps them for the tool-call parser.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _TOOL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=2048,
    )


def build_tiny_random(out: Path) -> None:
    """Builds the seeded tiny Qwen2-style model and its tokenizer, and saves them to `out`."""
    tokenizer = tiny_tokenizer()
    _save_seeded(Qwen2ForCausalLM, _tiny_config(tokenizer), tokenizer, out)


def _tiny_config(tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """The tiny model's shape: two layers of width 64, the tokenizer's vocabulary."""
    return Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        **_token_settings(tokenizer),
    )


@dataclass(frozen=True)
class TinyVariant:
    """A `tiny-random` whose chat template ends turns with a token that is not its eos."""

    chat_template: str
    eos_token: str
    added_special: tuple[str, ...] = ()


TINY_VARIANTS: dict[str, TinyVariant] = {
    "tiny-random-llama3": TinyVariant(
        LLAMA3_TEMPLATE,
        "<|end_of_text|>",
        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"),
    ),
    "tiny-random-qwen-base": TinyVariant(CHAT_TEMPLATE, "<|endoftext|>"),
}
TINY_VARIANT_VERSION = 1  # bump whenever a variant changes


def build_tiny_variant(name: str, out: Path) -> None:
    """Builds the tiny model with the tokenizer of `TINY_VARIANTS[name]` and saves them to
    `out`: the seeded weights, with room for the variant's added tokens."""
    variant = TINY_VARIANTS[name]
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(list(variant.added_special), special_tokens=True)
    tokenizer.eos_token = variant.eos_token
    tokenizer.chat_template = variant.chat_template
    _save_seeded(Qwen2ForCausalLM, _tiny_config(tokenizer), tokenizer, out)


def build_smollm2_shaped(out: Path) -> None:
    """Builds the seeded random model of SmolLM2-135M's shape with the tiny tokenizer,
    and saves them to `out`."""
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        **_token_settings(tokenizer),
    )
    _save_seeded(LlamaForCausalLM, config, tokenizer, out)


def _token_settings(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    """A built-in model's vocabulary and special ids: the tokenizer's, the head tied."""
    return {
        "vocab_size": len(tokenizer),
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def _save_seeded(model_class: Any, config: Any, tokenizer: PreTrainedTokenizerFast, out: Path):
    """Initialises `model_class(config)` from seed 0 and saves it and `tokenizer` to `out`."""
    with torch.random.fork_rng(devices=[]):  # seed locally; leave the caller's RNG alone
        torch.manual_seed(0)
        model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

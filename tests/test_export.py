"""`agentgym export`: a run's model as a folder plain transformers and peft load, after the
run folder moved; merged or as adapters; cast; with its card; uploaded to a stand-in hub."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym.cli import main
from agentgym.export.model_folder import export

TRAIN = [
    "train", "--env", "tool_call", "--model", "tiny-random", "--steps", "2",
    "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2",
    "--set", "sampling.max_new_tokens=16", "--set", "run.report_to=[]",
    "--set", "eval.every=1", "--set", "eval.tasks=2", "--set", "eval.report_tasks=2",
]  # fmt: skip
LORA_AFTER_SFT = [
    "--set", "lora.enabled=true", "--set", "lora.r=4", "--set", "optim.lr=5e-3",
    "--set", "sft.warmup=true", "--set", "sft.steps=2", "--set", "sft.demonstrations=4",
    "--set", "sft.batch_size=2", "--set", "run.env_kwargs.tool_format=hermes",
]  # fmt: skip


@pytest.fixture(scope="module")
def moved_run(tmp_path_factory) -> Path:
    """A LoRA run after an SFT warm-up, its folder moved elsewhere once it ended."""
    root = tmp_path_factory.mktemp("export")
    assert main([*TRAIN, *LORA_AFTER_SFT, "--output", str(root / "run")]) == 0
    (root / "elsewhere").mkdir()
    return Path(shutil.move(root / "run", root / "elsewhere" / "run"))


def _logits(model, tokenizer) -> torch.Tensor:
    ids = tokenizer("What is 2 + 2?", return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits.float()


def _generates(model, tokenizer) -> None:
    ids = tokenizer("What is 2 + 2?", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4)


def test_the_adapters_export_loads_with_peft_as_the_merged_best(moved_run, tmp_path):
    from peft import AutoPeftModelForCausalLM

    out = tmp_path / "adapters"
    assert main(["export", str(moved_run), "--output", str(out)]) == 0
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str((out / "base").resolve())
    peft_model = AutoPeftModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    _generates(peft_model, tokenizer)
    best = AutoModelForCausalLM.from_pretrained(moved_run / "checkpoint-best")
    assert torch.allclose(_logits(peft_model, tokenizer), _logits(best, tokenizer), atol=1e-5)
    # the base is the SFT model, not the model SFT started from
    sft = load_file(moved_run / "checkpoint-sft" / "model.safetensors")
    base = load_file(out / "base" / "model.safetensors")
    assert all(torch.equal(sft[name], base[name]) for name in sft)


def test_the_merged_export_is_plain_transformers_in_the_dtype_asked(moved_run, tmp_path):
    out = tmp_path / "merged"
    argv = ["export", str(moved_run / "checkpoint-best"), "--output", str(out), "--merge"]
    assert main([*argv, "--dtype", "bf16"]) == 0
    assert not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    _generates(model, tokenizer)
    best = AutoModelForCausalLM.from_pretrained(moved_run / "checkpoint-best")
    merged = load_file(out / "model.safetensors")
    for name, tensor in load_file(moved_run / "checkpoint-best" / "model.safetensors").items():
        assert torch.equal(merged[name], tensor.to(torch.bfloat16)), name
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(best.name_or_path).chat_template


def test_the_card_and_facts_say_how_the_model_was_trained(moved_run, tmp_path):
    out = export(moved_run / "checkpoint-000002", tmp_path / "one")
    facts = json.loads((out / "agentgym.json").read_text())
    assert facts["kind"] == "adapters" and facts["step"] == 2
    assert (facts["env"], facts["tool_format"], facts["base_model"]) == (
        "tool_call", "hermes", "tiny-random",
    )  # fmt: skip
    card = (out / "README.md").read_text()
    table = (moved_run / "report" / "report.md").read_text()
    assert "library_name: peft" in card and "AutoPeftModelForCausalLM" in card
    assert table.strip() in card and "tool_format: hermes" in card
    assert (out / "config.yaml").read_text() == (
        moved_run / "checkpoint-000002" / "config.yaml"
    ).read_text()


def test_a_full_fine_tune_exports_its_weights_as_they_are(tmp_path):
    run = tmp_path / "full"
    assert (
        main(
            [*TRAIN, "--set", "eval.every=0", "--set", "eval.report_tasks=0", "--output", str(run)]
        )
        == 0
    )
    out = export(run, tmp_path / "out")
    assert json.loads((out / "agentgym.json").read_text())["kind"] == "whole"
    saved = load_file(run / "checkpoint-000002" / "model.safetensors")
    exported = load_file(out / "model.safetensors")
    assert saved.keys() == exported.keys()
    assert all(torch.equal(saved[k], exported[k]) for k in saved)
    assert "no closing table" in (out / "README.md").read_text()


def test_bad_sources_and_outputs_are_refused_by_name(moved_run, tmp_path, capsys):
    assert main(["export", str(tmp_path), "--output", str(tmp_path / "x")]) == 2
    assert f"{tmp_path}: neither a complete checkpoint" in capsys.readouterr().err
    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_text("mine")
    assert main(["export", str(moved_run), "--output", str(full)]) == 2
    assert f"--output {full} is not empty" in capsys.readouterr().err
    assert (full / "something").read_text() == "mine"


class LocalHubStandIn:
    """A stand-in for `huggingface_hub.HfApi` (no hub here): keeps the repositories it is
    asked to make and copies each uploaded folder under `root/<repo>`."""

    root: Path
    calls: list[tuple] = []

    def whoami(self):
        self.calls.append(("whoami",))
        return {"name": "me"}

    def create_repo(self, repo_id, exist_ok=False):
        self.calls.append(("create_repo", repo_id, exist_ok))

    def upload_folder(self, folder_path, repo_id, commit_message):
        self.calls.append(("upload_folder", repo_id, commit_message))
        shutil.copytree(folder_path, self.root / repo_id, dirs_exist_ok=True)


def test_push_to_hub_uploads_the_export_through_huggingface_hub(moved_run, tmp_path, monkeypatch):
    import huggingface_hub

    LocalHubStandIn.root, LocalHubStandIn.calls = tmp_path / "hub", []
    monkeypatch.setattr(huggingface_hub, "HfApi", LocalHubStandIn)
    out = tmp_path / "merged"
    argv = ["export", str(moved_run), "--output", str(out), "--merge", "--push-to-hub", "me/agent"]
    assert main(argv) == 0
    assert LocalHubStandIn.calls == [
        ("whoami",),
        ("create_repo", "me/agent", True),
        ("upload_folder", "me/agent", "agentgym export"),
    ]
    uploaded = sorted(p.name for p in (tmp_path / "hub" / "me" / "agent").iterdir())
    assert uploaded == sorted(p.name for p in out.iterdir())
    assert {"README.md", "agentgym.json", "config.json", "model.safetensors"} <= set(uploaded)


class LoggedOut(LocalHubStandIn):
    """The hub as it answers without a token."""

    def whoami(self):
        self.calls.append(("whoami",))
        raise OSError("Invalid user token. 401 Client Error: Unauthorized for url: /api/whoami-v2")


@pytest.mark.parametrize("where", ["file", "logged-out"])
def test_export_checks_its_output_and_the_login_before_any_work(
    moved_run, tmp_path, monkeypatch, capsys, where
):
    import huggingface_hub

    LoggedOut.root, LoggedOut.calls = tmp_path / "hub", []
    monkeypatch.setattr(huggingface_hub, "HfApi", LoggedOut)
    out = tmp_path / "out"
    if where == "file":
        out.write_text("mine")
        argv = ["export", str(moved_run), "--output", str(out)]
        want = f"--output {out} is a file; give a new or empty folder"
    else:
        argv = ["export", str(moved_run), "--output", str(out), "--push-to-hub", "me/agent"]
        want = "--push-to-hub me/agent: the hub does not know who you are (Invalid user token."
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert want in err and "Traceback" not in err and len(err.splitlines()) <= 2
    assert (out.read_text() == "mine") if where == "file" else not out.exists()
    assert LoggedOut.calls == ([] if where == "file" else [("whoami",)])

"""Attacks on checkpoints (issue 53, item 3): a checkpoint proves its integrity. Its
`MANIFEST.json` holds each file's size and sha256; resume and load verify it and refuse,
naming the file, with exit 2; weights that are not finite are neither saved nor loaded; a
truncated or unreadable file is named, not a library traceback.

Before: weights overwritten with bytes that read as NaN resumed silently (exit 0) and went
on into the next checkpoint; a truncated weights file, `optimizer.pt` or `state.json` was a
traceback that did not name the file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentgym.cli import main
from agentgym.policy.integrity import MANIFEST, CheckpointError, sha256
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.run.checkpoint import save_checkpoint

ADAPTER = "adapter_model.safetensors"
RUN = [
    "train", "--env", "cli_envs:cli_envs/Digits-v0", "--model", "tiny-random", "--steps", "2",
    "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=1",
    "--set", "sampling.max_new_tokens=4", "--set", "run.report_to=[]",
    "--set", "lora.enabled=true", "--set", "run.save_every=1",
]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A 2-step tiny-random LoRA run; each test damages its own copy."""
    out = tmp_path_factory.mktemp("attack") / "run"
    assert main([*RUN, "--output", str(out)]) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run", symlinks=True)
    return tmp_path / "run" / "checkpoint-000001"


def _resume(checkpoint: Path, capsys) -> tuple[int, str]:
    code = main(["train", "--resume", str(checkpoint)])
    return code, " ".join(capsys.readouterr().err.split())


def test_every_file_of_a_checkpoint_is_in_its_manifest_with_its_size_and_sha256(run):
    folder = run / "checkpoint-000001"
    files = json.loads((folder / MANIFEST).read_text())["files"]
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert set(files) == on_disk - {MANIFEST, "COMPLETE"}
    assert {ADAPTER, "optimizer.pt", "state.json", "config.yaml"} <= set(files)
    for name, entry in files.items():
        assert entry == {"bytes": (folder / name).stat().st_size, "sha256": sha256(folder / name)}


def test_a_checkpoint_has_the_modes_the_umask_gives_not_private_ones(run):
    mask = os.umask(0)
    os.umask(mask)
    for folder in (run / "checkpoint-000001", run / "checkpoint-000002"):
        assert folder.stat().st_mode & 0o777 == 0o777 & ~mask
        for path in folder.rglob("*"):
            assert path.stat().st_mode & 0o777 == (0o777 if path.is_dir() else 0o666) & ~mask, path


def _nan_bytes(path: Path) -> None:
    """Overwrites every tensor's data with bytes that read as NaN (0xFF...) in place: the
    header and the file's size kept."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # safetensors: u64 header length, header
    data[start:] = b"\xff" * (len(data) - start)
    path.write_bytes(bytes(data))
    assert all(torch.isnan(t).all() for t in load_file(path).values())


def test_weights_overwritten_with_nan_are_refused_at_resume_naming_the_file(run, tmp_path, capsys):
    checkpoint = _copy(run, tmp_path)
    _nan_bytes(checkpoint / ADAPTER)
    code, err = _resume(checkpoint, capsys)
    assert code == 2
    assert f"{checkpoint / ADAPTER}: its contents changed (sha256 differs)" in err
    assert not (checkpoint.parent / "checkpoint-000002").exists() or (
        (checkpoint.parent / "checkpoint-000002" / MANIFEST).read_bytes()
        == (run / "checkpoint-000002" / MANIFEST).read_bytes()
    )  # nothing trained on, nothing written


def test_without_a_manifest_nan_weights_are_still_refused_naming_the_tensor(run, tmp_path, capsys):
    checkpoint = _copy(run, tmp_path)
    (checkpoint / MANIFEST).unlink()  # a checkpoint from before manifests
    _nan_bytes(checkpoint / ADAPTER)
    code, err = _resume(checkpoint, capsys)
    assert code == 2
    assert f"{checkpoint / ADAPTER}: tensor '" in err and "non-finite value(s)" in err


@pytest.mark.parametrize("name", [ADAPTER, "optimizer.pt", "state.json"])
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "legacy"])
def test_a_truncated_file_is_named_with_exit_2(run, tmp_path, capsys, name, manifest):
    checkpoint = _copy(run, tmp_path)
    if not manifest:
        (checkpoint / MANIFEST).unlink()
    path = checkpoint / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    code, err = _resume(checkpoint, capsys)
    assert code == 2, err
    assert str(path) in err
    assert ("truncated or replaced" if manifest else "unreadable") in err
    assert "Traceback" not in err


def test_a_changed_checkpoint_is_refused_where_it_is_loaded_as_a_model(run, tmp_path):
    checkpoint = _copy(run, tmp_path)
    config = checkpoint / "adapter_config.json"
    config.write_text(config.read_text().replace('"r": ', '"r":', 1) + " ")  # same size
    with pytest.raises(CheckpointError, match="adapter_config.json: .*sha256 differs"):
        load_model_and_tokenizer(str(checkpoint))
    (checkpoint / MANIFEST).unlink()  # without one, it loads (the edit changed nothing)
    model, _ = load_model_and_tokenizer(str(checkpoint))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_non_finite_weights_are_not_saved_and_the_run_stops_naming_the_tensor(tiny, tmp_path):
    from agentgym.config import load_config
    from agentgym.types import TrainingError

    model, tokenizer = tiny
    broken = type(model)(model.config)
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.model.norm.weight[3] = float("inf")
    with pytest.raises(TrainingError, match="step 7's weights.*'model.norm.weight' holds 1 non-"):
        save_checkpoint(tmp_path, 7, broken, tokenizer, load_config())
    assert list(tmp_path.iterdir()) == []  # no checkpoint, no staging folder left

"""`agentgym export`: a run's model as a folder that other tools load.

From a run folder (its `checkpoint-best`, else its newest checkpoint) or a checkpoint:

- `--merge`, or a run without LoRA: the whole model (adapters merged in), which
  `transformers.AutoModelForCausalLM.from_pretrained` and vLLM load;
- otherwise the LoRA adapters, which `peft.AutoPeftModelForCausalLM` loads: their
  `base_model_name_or_path` is the base's hub id when it has one, else the base model
  written whole into `base/` beside them and named by its absolute path (peft resolves
  a relative one from the working directory, not from the adapters);

each with the tokenizer and its chat template, the run's `config.yaml`, `agentgym.json`
(the tool format the model was trained with, the environment, the step) and a model card
(`README.md`: base model, environments, the closing table, the command that reproduces
it). `--dtype` casts the weights (the adapters of an unmerged export stay float32, as
peft trains them). `--push-to-hub REPO` uploads the folder with `huggingface_hub`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import AutoTokenizer

from agentgym.config import ConfigError
from agentgym.policy.models import adapter_base_name, is_built_in, load_model_and_tokenizer
from agentgym.run.checkpoint import ADAPTER_DIR, BEST, is_complete, latest_checkpoint, read_state

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def find_checkpoint(path: Path) -> Path:
    """The checkpoint `agentgym export PATH` exports: PATH itself when it is a complete
    checkpoint, else the run folder's `checkpoint-best`, else its newest checkpoint."""
    path = Path(path)
    if is_complete(path):
        return path
    for found in (path / BEST, latest_checkpoint(path)):
        if found is not None and is_complete(found):
            return found
    raise FileNotFoundError(
        f"{path}: neither a complete checkpoint (a folder with a COMPLETE file) nor a run "
        f"folder holding one; give a run folder or one of its checkpoint-* folders"
    )


def export(
    source: Path,
    output: Path,
    *,
    merge: bool = False,
    dtype: str | None = None,
    push_to_hub: str | None = None,
    hub_api: Any = None,
) -> Path:
    """Writes the export of `source` (a run folder or a checkpoint) to `output`; returns it.

    Args:
        merge: Merge a LoRA run's adapters into the base (a plain transformers folder).
        dtype: "bf16", "fp16" or "fp32"; None keeps the trained dtype.
        push_to_hub: A hub repository id to upload the folder to.
        hub_api: What uploads (`huggingface_hub.HfApi()` when None).
    """
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    checkpoint = find_checkpoint(source)
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"--output {output} is a file; give a new or empty folder")
    if output.exists() and any(output.iterdir()):
        raise FileExistsError(f"--output {output} is not empty; give a new or empty folder")
    if push_to_hub is not None:
        hub_api = logged_in(push_to_hub, hub_api)  # before anything is written
    output.mkdir(parents=True, exist_ok=True)
    adapters = _adapter_folder(checkpoint)
    if merge or adapters is None:
        model, tokenizer = load_model_and_tokenizer(str(checkpoint))
        _cast(model, dtype).save_pretrained(output, safe_serialization=True)
        kind, base = ("merged" if adapters is not None else "whole"), None
    else:
        kind, base = "adapters", _export_base(adapters, output, dtype)
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        _copy_adapters(adapters, output, base)
    tokenizer.save_pretrained(output)
    config = yaml.safe_load((checkpoint / "config.yaml").read_text())
    shutil.copyfile(checkpoint / "config.yaml", output / "config.yaml")
    facts = _facts(checkpoint, config, kind, base, dtype)
    (output / "agentgym.json").write_text(json.dumps(facts, indent=2) + "\n")
    (output / "README.md").write_text(model_card(facts, config, _closing_table(checkpoint)))
    if push_to_hub is not None:
        upload(output, push_to_hub, hub_api)
    return output


def logged_in(repo: str, api: Any = None) -> Any:
    """The hub API, once it says who is logged in; ConfigError naming what to do when no one
    is (or the hub cannot be reached), before any export is written."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    try:
        api.whoami()
    except Exception as err:  # no token, a token refused, no network: each its own type
        why = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
        raise ConfigError(
            f"--push-to-hub {repo}: the hub does not know who you are ({why}); log in "
            "(`huggingface-cli login`, or set HF_TOKEN) and check the network: nothing was "
            "exported"
        ) from None
    return api


def upload(folder: Path, repo: str, api: Any = None) -> None:
    """Creates the hub repository `repo` (if it is not there) and uploads `folder` to it,
    as the logged-in user (`huggingface-cli login` or `HF_TOKEN`)."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    api.create_repo(repo, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo, commit_message="agentgym export")


def _adapter_folder(checkpoint: Path) -> Path | None:
    """Where a checkpoint keeps LoRA adapters: itself (a numbered checkpoint), `adapter/`
    (checkpoint-best, whose top holds the merged model), or nowhere (a full fine-tune)."""
    for folder in (checkpoint, checkpoint / ADAPTER_DIR):
        if all((folder / name).is_file() for name in ADAPTER_FILES):
            return folder
    return None


def _export_base(adapters: Path, output: Path, dtype: str | None) -> str:
    """The base model the exported adapters name: a hub id as it is; a local or built-in
    model written whole into `output/base`, named by its absolute path."""
    base = adapter_base_name(adapters)
    local = Path(base).is_dir() or is_built_in(base)
    if not local:
        return base
    model, tokenizer = load_model_and_tokenizer(base)
    _cast(model, dtype).save_pretrained(output / "base", safe_serialization=True)
    tokenizer.save_pretrained(output / "base")
    return str((output / "base").resolve())


def _copy_adapters(adapters: Path, output: Path, base: str) -> None:
    shutil.copyfile(adapters / "adapter_model.safetensors", output / "adapter_model.safetensors")
    written = json.loads((adapters / "adapter_config.json").read_text())
    written["base_model_name_or_path"] = base
    (output / "adapter_config.json").write_text(json.dumps(written, indent=2) + "\n")


def _cast(model: Any, dtype: str | None) -> Any:
    return model if dtype is None else model.to(DTYPES[dtype])


def _facts(
    checkpoint: Path, config: dict[str, Any], kind: str, base: str | None, dtype: str | None
) -> dict[str, Any]:
    """What `agentgym.json` says: how the model was trained and what the folder holds."""
    run = config.get("run", {})
    env_kwargs = run.get("env_kwargs") or {}
    return {
        "kind": kind,
        "base_model": config.get("model", {}).get("name") or "embedded",
        "adapter_base": base,
        "env": run.get("env"),
        "env_kwargs": env_kwargs,
        "tool_format": env_kwargs.get("tool_format", "auto"),
        "checkpoint": checkpoint.resolve().name,
        "step": read_state(checkpoint)["step"],
        "dtype": dtype or "as trained",
        "lora": bool(config.get("lora", {}).get("enabled")),
    }


def _closing_table(checkpoint: Path) -> str | None:
    """The run's closing table (`report/report.md` beside the checkpoint), if it wrote one."""
    report = checkpoint.resolve().parent / "report" / "report.md"
    return report.read_text() if report.is_file() else None


def model_card(facts: dict[str, Any], config: dict[str, Any], table: str | None) -> str:
    """The export's README.md: what the model is, how it was trained, how to load it."""
    library = "peft" if facts["kind"] == "adapters" else "transformers"
    load = (
        "from peft import AutoPeftModelForCausalLM\n"
        "model = AutoPeftModelForCausalLM.from_pretrained(FOLDER)"
        if library == "peft"
        else "from transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(FOLDER)"
    )
    lines = [
        "---",
        f"library_name: {library}",
        "tags: [agentgym, grpo, reinforcement-learning, tool-use]",
        "---",
        "",
        f"# {facts['env']} agent, trained with agentgym",
        "",
        f"- base model: `{facts['base_model']}`"
        + (f" (the adapters' base: `{facts['adapter_base']}`)" if facts["adapter_base"] else ""),
        f"- environment: `{facts['env']}`, env_kwargs `{json.dumps(facts['env_kwargs'])}`",
        f"- tool-call format: `{facts['tool_format']}` (auto: the chat template's native "
        "format where it renders `tools=`, else Hermes `<tool_call>` blocks)",
        f"- weights: {facts['kind']}, from `{facts['checkpoint']}` (step {facts['step']}), "
        f"dtype {facts['dtype']}",
        "",
        "## Load it",
        "",
        "```python",
        load,
        "```",
        "",
        "## Reproduce it",
        "",
        "```bash",
        "pip install agentgym",
        "agentgym train --config config.yaml   # the run's own config, in this folder",
        "```",
        "",
        "## Closing table",
        "",
        table.strip() if table else "The run wrote no closing table (`eval.report_tasks: 0`).",
        "",
        "## Config",
        "",
        "```yaml",
        yaml.safe_dump(config, sort_keys=False).strip(),
        "```",
        "",
    ]
    return "\n".join(lines)

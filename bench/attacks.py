"""Issue 53's attacks on the inputs and checkpoints, side by side on two checkouts: each
attack's command, exit code, wall seconds and peak memory (the child's maximum RSS), on the
checkout before the hardening and on this one. A benchmark, not a test: the tests
(`tests/test_attacks_*.py`) assert the new behaviour; this prints both.

    python bench/attacks.py --before /path/to/older/checkout [--timeout 120]

Each checkout's own `agentgym` is imported (`PYTHONPATH`, its `envs/` and `sandboxes/`
linked in as the installed package maps them), in a child held to `--memory-gb` of address
space and `--timeout` seconds, so that an old behaviour that eats the machine ends as a
failure instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = ["--model", "tiny-random", "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=1",
       "--set", "sampling.max_new_tokens=4", "--set", "run.report_to=[]",
       "--set", "lora.enabled=true", "--set", "run.save_every=1"]  # fmt: skip


def bomb() -> str:
    """The billion-laughs shape inside a field the config has (`sampling.stop`, a list):
    each level a list of ten aliases of the one before, 10^9 strings once expanded."""
    levels = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for k in range(1, 9):
        levels.append(f"&a{k} [" + ",".join([f"*a{k - 1}"] * 10) + "]")
    return "sampling:\n  stop: [" + ", ".join(levels) + "]\n"


def inputs(work: Path) -> dict[str, list[str]]:
    """The attacks on inputs: name -> agentgym arguments (files made in `work`)."""
    (work / "bomb.yaml").write_text(bomb())
    (work / "huge.yaml").write_text("grpo:\n  beta: 0.0\n# " + "x" * (50 << 20) + "\n")
    (work / "deep.yaml").write_text("grpo: " + "[" * 10_000 + "]" * 10_000 + "\n")
    (work / "latin1.yaml").write_bytes("grpo:\n  beta: 0.0\n# caf\u00e9\n".encode("latin-1"))
    rows = [{"prompt": "What is 1 + 1?", "answer": "2", "split": "train"},
            {"prompt": "What is 2 + 2?", "answer": "4", "split": "test"}]  # fmt: skip
    deep = '{"prompt": "p", "answer": "1", "split": "train", "tools": ' + "[" * 5000
    deep += "]" * 5000 + "}"
    huge = json.dumps({"prompt": "x" * (2 << 20), "answer": "1", "split": "train"})
    for name, extra in (("deep.jsonl", deep), ("huge.jsonl", huge)):
        (work / name).write_text("".join(json.dumps(r) + "\n" for r in rows) + extra + "\n")
    (work / "run").mkdir()
    (work / "run" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "rew\n')
    (work / "file").write_text("mine")
    train = ["train", *RUN, "--steps", "1"]
    data = ["eval", "--env", "tasks", "--model", "tiny-random", "--tasks", "1", "--set"]
    deep_data, huge_data = (f"run.env_kwargs.data={work / n}" for n in ("deep.jsonl", "huge.jsonl"))
    return {
        "config: alias bomb (462 bytes)": ["train", "--config", str(work / "bomb.yaml")],
        "config: 50 MB file": ["train", "--config", str(work / "huge.yaml")],
        "config: nested 10,000 deep": ["train", "--config", str(work / "deep.yaml")],
        "config: not UTF-8": ["train", "--config", str(work / "latin1.yaml")],
        "data: a cell nested 5,000 deep": [*data, deep_data],
        "data: a 2 Mi-character cell": [*data, huge_data],
        "view: a torn metrics.jsonl": ["view", str(work / "run")],
        "export: --output is a file": ["export", "CHECKPOINT", "--output", str(work / "file")],
        "_train": [*train, "--env", "cli_envs:cli_envs/Digits-v0", "--output", str(work / "ok")],
    }  # fmt: skip


def checkpoint_attacks(work: Path) -> dict[str, tuple[str, list[str]]]:
    """The attacks on a checkpoint of `work/ok`: name -> (file damaged, how)."""
    weights = "adapter_model.safetensors"
    return {
        "checkpoint: weights overwritten with NaN bytes, resumed": (weights, ["nan"]),
        "checkpoint: truncated weights, resumed": (weights, ["half"]),
        "checkpoint: truncated optimizer.pt, resumed": ("optimizer.pt", ["half"]),
        "checkpoint: truncated state.json, resumed": ("state.json", ["half"]),
    }  # fmt: skip


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "half":
        path.write_bytes(bytes(data[: len(data) // 2]))
        return
    start = 8 + int.from_bytes(data[:8], "little")
    data[start:] = b"\xff" * (len(data) - start)
    path.write_bytes(bytes(data))


@contextlib.contextmanager
def checkout_tree(checkout: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of `checkout`'s package laid out as installed (its `envs/` and `sandboxes/`
    inside it), and the environment that imports it (its `tests/` on the path too)."""
    tree = Path(tempfile.mkdtemp(prefix="attack-tree-"))
    try:
        shutil.copytree(checkout / "agentgym", tree / "agentgym", symlinks=True)
        for name in ("envs", "sandboxes"):
            (tree / "agentgym" / name).unlink(missing_ok=True)
            shutil.copytree(checkout / name, tree / "agentgym" / name)
        yield (
            tree,
            dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(checkout / "tests")])),
        )
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def address_limit(memory_gb: float) -> Callable[[], None]:
    """A child's `preexec_fn` holding it to `memory_gb` of address space."""
    limit = int(memory_gb * (1 << 30))
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run(checkout: Path, args: list[str], timeout: float, memory_gb: float) -> dict:
    """One agentgym command on `checkout`: exit code, seconds, peak RSS (MB), last line."""
    with checkout_tree(checkout) as (tree, env):
        cmd = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "agentgym", *args]
        started = time.monotonic()
        try:
            held = address_limit(memory_gb)
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  env=env, cwd=tree, preexec_fn=held)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"exit": "timeout", "seconds": timeout, "peak_mb": None, "said": ""}
        seconds = time.monotonic() - started
        *lines, peak = done.stderr.strip().splitlines() or ["0"]
        said = next((x for x in reversed(lines) if x.strip() and "exited with" not in x), "")
        peak_mb = int(peak) // 1024 if peak.isdigit() else None
        return {"exit": done.returncode, "seconds": round(seconds, 1), "peak_mb": peak_mb,
                "said": said[:160]}  # fmt: skip


def side(checkout: Path, timeout: float, memory_gb: float) -> dict[str, dict]:
    out = {}
    with tempfile.TemporaryDirectory(prefix="attacks-") as tmp:
        work = Path(tmp)
        attacks = inputs(work)
        trained = run(checkout, attacks.pop("_train"), 600, memory_gb)
        assert trained["exit"] == 0, trained
        checkpoint = work / "ok" / "checkpoint-000001"
        for name, args in attacks.items():
            args = [str(checkpoint) if a == "CHECKPOINT" else a for a in args]
            out[name] = run(checkout, args, timeout, memory_gb)
        for name, (file, (how,)) in checkpoint_attacks(work).items():
            copy = work / "copy"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(work / "ok", copy, symlinks=True)
            damage(copy / "checkpoint-000001" / file, how)
            out[name] = run(checkout, ["train", "--resume", str(copy / "checkpoint-000001")],
                            timeout, memory_gb)  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--memory-gb", type=float, default=8.0)
    args = parser.parse_args()
    before = side(args.before.resolve(), args.timeout, args.memory_gb)
    after = side(ROOT, args.timeout, args.memory_gb)
    print("| attack | before: exit, s, peak MB | after: exit, s, peak MB | after says |")
    print("| --- | --- | --- | --- |")
    for name in after:
        b, a = before[name], after[name]
        said = a["said"].replace("|", "\\|")
        print(f"| {name} | {b['exit']}, {b['seconds']}, {b['peak_mb']} | "
              f"{a['exit']}, {a['seconds']}, {a['peak_mb']} | {said} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""The trackers of `run.report_to`: one 2-step run reports to TensorBoard, trackio, W&B and
MLflow at once, each offline, each writing its local store; each store holds the scalar
names metrics.jsonl has (MLflow's with `@` spelled `_at_`) and an episode table.
`run.tensorboard`, deprecated, still sets it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.config import Config
from agentgym.run.trackers import mlflow_name

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> Path:
    """A 2-step tiny-random run with every tracker, in a process of its own (trackio reads
    its folder when imported), with no W&B login and no MLflow server."""
    home = tmp_path_factory.mktemp("home")
    run = home / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env.update(HOME=str(home), TRACKIO_DIR=str(home / "trackio"), WANDB_SILENT="true")
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(TESTS))
    argv = [
        sys.executable, "-m", "agentgym", "train", "--env", "cli_envs:cli_envs/Digits-v0",
        "--model", "tiny-random", "--steps", "2", "--output", str(run),
        "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2",
        "--set", "sampling.max_new_tokens=8", "--set", "eval.every=2", "--set", "eval.tasks=2",
        "--set", "eval.n=2", "--set", "run.report_to=[tensorboard, trackio, wandb, mlflow]",
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def _names(run: Path) -> set[str]:
    """The numeric metric names metrics.jsonl has (null: not a finite number, not sent)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {k for r in rows for k, v in r.items() if k != "step" and isinstance(v, int | float)}


def test_tensorboard_holds_the_scalar_names_of_metrics_jsonl(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tracked / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == _names(tracked)
    assert "eval/pass@1" in _names(tracked)  # the held-out figures are among them
    assert "episodes/text_summary" in events.Tags()["tensors"]


def test_trackio_holds_the_scalar_names_of_metrics_jsonl(tracked):
    (db,) = (tracked.parent / "trackio").glob("*.db")
    with sqlite3.connect(db) as conn:
        logs = [json.loads(r[0]) for r in conn.execute("SELECT metrics FROM metrics")]
    scalars = {k for log in logs for k, v in log.items() if isinstance(v, int | float)}
    assert scalars == _names(tracked)
    assert any("episodes" in log for log in logs)  # the table


def _wandb_records(path: Path):
    """The protobuf records of a W&B offline run's `.wandb` file: after a 7-byte header
    (`:W&B`, a magic number, a version), LevelDB's log format: 32 KiB blocks of records, each
    a 7-byte header (CRC, length, kind: 1 full, 2 first, 3 middle, 4 last) and its bytes."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            yield chunks
            chunks = b""


def test_wandb_offline_holds_the_scalar_names_of_metrics_jsonl(tracked):
    from wandb.proto import wandb_internal_pb2

    (store,) = (tracked / "wandb").glob("offline-run-*/run-*.wandb")
    logged = set()
    for raw in _wandb_records(store):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            logged |= {i.key or "/".join(i.nested_key) for i in record.history.item}
    scalars = {k for k in logged if not k.startswith(("_", "episodes/"))}
    assert scalars == _names(tracked)
    assert "episodes/_type" in logged  # the table


def test_mlflow_holds_the_scalar_names_of_metrics_jsonl(tracked, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as the run set it

    client = MlflowClient((tracked / "mlruns").resolve().as_uri())
    (experiment,) = [e for e in client.search_experiments() if e.name == "agentgym"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert set(run.data.metrics) == {mlflow_name(n) for n in _names(tracked)}
    assert "eval/pass_at_1" in run.data.metrics and run.data.params["grpo.group_size"] == "2"
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "episodes")]
    assert artifacts == ["episodes/step-000001.json", "episodes/step-000002.json"]


def test_the_deprecated_tensorboard_option_still_sets_report_to():
    with pytest.warns(DeprecationWarning, match="run.tensorboard is deprecated"):
        off = Config.model_validate({"run": {"tensorboard": False, "report_to": ["wandb"]}})
    assert off.run.report_to == ["wandb"] and off.run.tensorboard is None
    with pytest.warns(DeprecationWarning):
        on = Config.model_validate({"run": {"tensorboard": True, "report_to": []}})
    assert on.run.report_to == ["tensorboard"]
    assert Config().run.report_to == ["tensorboard"]
    with pytest.raises(ValueError, match="report_to"):
        Config.model_validate({"run": {"report_to": ["comet"]}})

"""The experiment trackers a run reports to (`run.report_to`, TRL's name): TensorBoard,
trackio, Weights & Biases, MLflow. Each gets every step's scalars under the names
metrics.jsonl has, and a table of a few sampled episodes a step; each writes locally unless
told otherwise:

- `tensorboard`: event files in `RUN/tb`; never online.
- `trackio`: trackio's own folder (`TRACKIO_DIR`, default `~/.cache/huggingface/trackio`),
  project `agentgym`; online where `TRACKIO_SPACE_ID` or `TRACKIO_SERVER_URL` is set.
- `wandb`: `RUN/wandb`, offline; online where the user is logged in (`WANDB_API_KEY`, or
  `wandb login`'s netrc entry) or `WANDB_MODE` says so.
- `mlflow`: a file store in `RUN/mlruns` (MLflow 3 keeps it in maintenance mode: agentgym
  sets `MLFLOW_ALLOW_FILE_STORE`); elsewhere where `MLFLOW_TRACKING_URI` is set (a server, or
  `sqlite:///...` with the full `mlflow` package).

MLflow does not allow `@` in a metric name: `eval/pass@1` is logged to it as
`eval/pass_at_1`; every other name is as in metrics.jsonl. Strings (a first error's
message) go to metrics.jsonl only.
"""

from __future__ import annotations

import math
import netrc
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from agentgym.extras import need

TRACKERS = ("tensorboard", "trackio", "wandb", "mlflow")
PROJECT = "agentgym"
EPISODE_COLUMNS = ("step", "task_id", "group", "reward", "turns", "last_action")


class Tracker(Protocol):
    """Where a run's step figures go besides metrics.jsonl."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Logs the step's finite numbers, by metric name."""
        ...

    def episodes(self, step: int, rows: Sequence[Sequence[Any]]) -> None:
        """Logs a table of a few of the step's episodes (`EPISODE_COLUMNS`)."""
        ...

    def close(self) -> None: ...


def open_trackers(
    names: Sequence[str], directory: Path, config: dict[str, Any], purge_step: int | None
) -> list[Tracker]:
    """The trackers `names` (from `TRACKERS`), each started for the run in `directory`;
    `config` is the run's, stored by those that keep one; `purge_step`, a resumed run's
    first step, from which TensorBoard drops what an earlier process logged."""
    makers: dict[str, Callable[[], Tracker]] = {
        "tensorboard": lambda: TensorBoard(directory, purge_step),
        "trackio": lambda: Trackio(directory, config),
        "wandb": lambda: Wandb(directory, config),
        "mlflow": lambda: Mlflow(directory, config),
    }
    return [makers[name]() for name in names]


def finite(values: Mapping[str, float | str]) -> dict[str, float]:
    """The finite numbers of a metrics row (trackers take no strings, NaN or infinity)."""
    return {k: float(v) for k, v in values.items() if not isinstance(v, str) and math.isfinite(v)}


class TensorBoard:
    def __init__(self, directory: Path, purge_step: int | None):
        tensorboard = need("torch.utils.tensorboard", "run.report_to: tensorboard")
        self.writer = tensorboard.SummaryWriter(str(directory / "tb"), purge_step=purge_step)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def episodes(self, step: int, rows: Sequence[Sequence[Any]]) -> None:
        head = "| " + " | ".join(EPISODE_COLUMNS) + " |\n|" + " --- |" * len(EPISODE_COLUMNS)
        lines = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
        self.writer.add_text("episodes", "\n".join([head, *lines]), step)

    def close(self) -> None:
        self.writer.close()


class Trackio:
    def __init__(self, directory: Path, config: dict[str, Any]):
        self.trackio = need("trackio", "run.report_to: trackio")
        self.trackio.init(project=PROJECT, name=directory.name, config=config, embed=False)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.trackio.log(dict(values), step=step)

    def episodes(self, step: int, rows: Sequence[Sequence[Any]]) -> None:
        pandas = need("pandas", "run.report_to: trackio (its episode tables)")
        table = pandas.DataFrame([list(r) for r in rows], columns=list(EPISODE_COLUMNS))
        self.trackio.log({"episodes": self.trackio.Table(dataframe=table)}, step=step)

    def close(self) -> None:
        self.trackio.finish()


class Wandb:
    def __init__(self, directory: Path, config: dict[str, Any]):
        self.wandb = need("wandb", "run.report_to: wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_login() else "offline")
        self.run = self.wandb.init(
            project=PROJECT, name=directory.name, dir=str(directory), mode=mode, config=config
        )

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def episodes(self, step: int, rows: Sequence[Sequence[Any]]) -> None:
        table = self.wandb.Table(columns=list(EPISODE_COLUMNS), data=[list(r) for r in rows])
        self.run.log({"episodes": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class Mlflow:
    def __init__(self, directory: Path, config: dict[str, Any]):
        self.mlflow = need("mlflow", "run.report_to: mlflow")
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # MLflow 3 keeps its file store (what needs no server nor database) behind this
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            self.mlflow.set_tracking_uri((directory / "mlruns").resolve().as_uri())
        self.mlflow.set_experiment(PROJECT)
        self.run = self.mlflow.start_run(run_name=directory.name)
        flat = {k: str(v)[:500] for k, v in _flatten(config).items()}
        self.mlflow.log_params(flat)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.mlflow.log_metrics({mlflow_name(k): v for k, v in values.items()}, step=step)

    def episodes(self, step: int, rows: Sequence[Sequence[Any]]) -> None:
        columns = {c: [r[i] for r in rows] for i, c in enumerate(EPISODE_COLUMNS)}
        self.mlflow.log_table(columns, artifact_file=f"episodes/step-{step:06d}.json")

    def close(self) -> None:
        self.mlflow.end_run()


def mlflow_name(name: str) -> str:
    """A metric's name as MLflow takes it (no `@`)."""
    return name.replace("@", "_at_")


def _wandb_login() -> bool:
    """Whether the user has a W&B key (the variable, or `wandb login`'s netrc entry)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")[:200]

"""PNG charts: a run's training curves, and an evaluation report's bars.

matplotlib with the Agg backend, so they render without a display.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from agentgym import records  # noqa: E402

# (metric keys on one panel, panel title), from the metrics' declarations; the mean reward
# carries its standard deviation as a band.
CURVES: tuple[tuple[tuple[str, ...], str], ...] = tuple(records.panels())


def _series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
    return [p[0] for p in points], [float(p[1]) for p in points]


def training_curves(history: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Writes the run's curves (reward mean/std, correctness, KL, entropy, length) to `path`."""
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.2))
    for ax, (keys, title) in zip(axes, CURVES, strict=True):
        for key in keys:
            steps, values = _series(history, key)
            if not steps:
                continue
            ax.plot(
                steps,
                values,
                marker="o" if key.startswith("eval/") else None,
                markersize=3,
                label=key,
            )
            if key == records.REWARD_MEAN:
                _, std = _series(history, records.REWARD_STD)
                if len(std) == len(values):
                    low = [v - s for v, s in zip(values, std, strict=True)]
                    high = [v + s for v, s in zip(values, std, strict=True)]
                    ax.fill_between(steps, low, high, alpha=0.25)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def report_chart(figures: Mapping[str, Mapping[str, float]], path: Path) -> Path:
    """Grouped bars: for each model (key of `figures`), its rate metrics (0..1)."""
    metrics = sorted({m for f in figures.values() for m in f})
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(metrics), 3.6))
    width = 0.8 / max(1, len(figures))
    for i, (name, values) in enumerate(figures.items()):
        xs = [j + i * width for j in range(len(metrics))]
        ax.bar(xs, [values.get(m, 0.0) for m in metrics], width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(metrics))])
    ax.set_xticklabels(metrics, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)

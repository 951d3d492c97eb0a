"""`agentgym view`'s page: one self-contained HTML file (inline CSS, script and data; no
network; opens from file://) over the data `agentgym.view.data` reads.

A run's newest `inline` steps are in the page; older ones are side files beside it,
`<page>-data/step-NNNNNN.js`, each a call of `agentgymLoad(step, episodes, vocab)` that the
page loads by `<script src>` when the step is picked (a script tag, unlike fetch, works from
file://), so the page opens fast whatever the run's length. The curves are inline SVG.
"""

from __future__ import annotations

import html
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

INLINE_STEPS = 20
"""A run's newest steps written into the page itself; older ones are side files."""

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>agentgym view</title>
<style>@@CSS@@</style>
</head>
<body>
<h1 id="title"></h1>
<div id="run" hidden>
  <div class="curves">@@CURVES@@</div>
  <div class="controls">
    <input type="range" id="step-slider" min="0" value="0">
    <select id="step-list"></select>
    <strong id="step-label"></strong>
    <label>show <select id="filter"></select></label>
    <select id="env" hidden></select>
    <span id="count"></span>
  </div>
  <table id="episodes"></table>
  <div id="detail"></div>
</div>
<div id="eval" hidden>
  <table id="tasks"></table>
  <div id="compare"></div>
</div>
<script>window.AGENTGYM = @@DATA@@;</script>
<script>@@JS@@</script>
</body>
</html>
"""


def write_page(data: dict[str, Any], output: Path, inline: int = INLINE_STEPS) -> Path:
    """Writes the page for `data` (`run_view` or `report_view`) to `output`, and a run's
    steps older than its newest `inline` to side files; returns the page's path."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    page = dict(data)
    svg = ""
    if data["kind"] == "run":
        page, svg = _split_steps(data, output, inline), curves_svg(data["curves"])
    # one pass over the template: a value is never searched for another's placeholder
    values = {
        "CSS": _asset("viewer.css"),
        "CURVES": svg,
        "DATA": script_json(page),
        "JS": _asset("viewer.js"),
    }
    text = re.sub(r"@@([A-Z]+)@@", lambda m: values[m.group(1)], TEMPLATE)
    output.write_text(text, encoding="utf-8")
    return output


def _split_steps(data: dict[str, Any], output: Path, inline: int) -> dict[str, Any]:
    """The run's page data with only the newest `inline` steps' episodes, and an index of
    every step (reward mean, health warnings, side file); writes the side files."""
    steps: dict[int, list] = data["steps"]
    newest = sorted(steps)[-inline:] if inline > 0 else []
    side = output.with_name(f"{output.stem}-data")
    health = {int(k): v for k, v in data["curves"]["health"].items()}
    index = []
    for step in sorted(steps):
        episodes = steps[step]
        rewards = [e["reward"] for e in episodes if e["reward"] is not None]
        entry = {
            "step": step,
            "episodes": len(episodes),
            "reward": sum(rewards) / len(rewards) if rewards else None,
            "health": health.get(step, []),
            "file": None,
        }
        if step not in newest:
            side.mkdir(exist_ok=True)
            name = f"step-{step:06d}.js"
            words = _vocab_of(episodes, data["vocab"])
            call = f"agentgymLoad({step}, {script_json(episodes)}, {script_json(words)});\n"
            (side / name).write_text(call, encoding="utf-8")
            entry["file"] = f"{side.name}/{name}"
        index.append(entry)
    inline_steps = {step: steps[step] for step in newest}
    vocab = {}
    for episodes in inline_steps.values():
        vocab.update(_vocab_of(episodes, data["vocab"]))
    return {**data, "steps": inline_steps, "index": index, "vocab": vocab}


def _vocab_of(episodes: list[dict[str, Any]], vocab: dict[str, str]) -> dict[str, str]:
    ids = {str(i) for e in episodes for i in e.get("t", ())}
    return {i: vocab[i] for i in ids if i in vocab}


def curves_svg(curves: dict[str, Any], width: int = 260, height: int = 110) -> str:
    """One small SVG chart per curve: its values over the steps, the steps with a health
    warning marked by a red line (with the warnings as its tooltip), said in a legend."""
    steps, charts = curves["steps"], []
    health = {int(k): v for k, v in curves["health"].items()}
    if not steps:
        return ""
    low_step, high_step = min(steps), max(steps)

    def x(step: int) -> float:
        span = high_step - low_step or 1
        return 8 + (width - 16) * (step - low_step) / span

    for label, values in curves["series"].items():
        known = [(s, v) for s, v in zip(steps, values, strict=True) if _finite(v)]
        if not known:
            continue
        low, high = min(v for _, v in known), max(v for _, v in known)
        span = high - low or 1.0

        def y(v: float, low=low, span=span) -> float:
            return height - 18 - (height - 40) * (v - low) / span

        points = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in known)
        marks = "".join(
            f'<line class="warn" x1="{x(s):.1f}" x2="{x(s):.1f}" y1="18" y2="{height - 18}">'
            f"<title>step {s}: {html.escape(', '.join(kinds))}</title></line>"
            for s, kinds in sorted(health.items())
        )
        charts.append(
            f'<svg class="curve" data-curve="{html.escape(label)}" width="{width}" '
            f'height="{height}"><text x="8" y="13">{html.escape(label)} '
            f"(last {known[-1][1]:.3g})</text>{marks}"
            f'<polyline class="line" points="{points}"/>'
            f'<text x="8" y="{height - 4}">step {low_step}</text>'
            f'<text x="{width - 8}" y="{height - 4}" text-anchor="end">{high_step}</text>'
            f'<text x="{width - 8}" y="13" text-anchor="end">{high:.3g} / {low:.3g}</text></svg>'
        )
    if health and charts:
        charts.append(
            '<p class="legend"><span class="warn-key"></span>a step with a health warning '
            "(hover the line for its kind; the run's log says more)</p>"
        )
    return "".join(charts)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def script_json(value: Any) -> str:
    """JSON that is safe inside a <script> element (no `</script>` can close it early)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _asset(name: str) -> str:
    return resources.files("agentgym.view").joinpath(name).read_text(encoding="utf-8")

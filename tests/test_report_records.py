"""The typed report records write report.json as before and read it back."""

import json

import pytest

from agentgym.eval.heldout import EpisodeScore, TaskResult
from agentgym.eval.report import build_report
from agentgym.records import Figures, ModelSummary, Report


def _score(strict: bool) -> EpisodeScore:
    return EpisodeScore(
        reward=1.0 if strict else 0.25, parts={"format": 0.25}, strict=strict,
        lenient=strict, format_ok=True, answer="7" if strict else "8", turns=2,
        tool_calls=1, tool_errors=0.0, completion_length=10, truncated=False,
    )  # fmt: skip


def _report() -> Report:
    good, bad = _score(True), _score(False)
    model = [TaskResult("a", "7", good, [good, bad]), TaskResult("b", "7", bad, [bad, bad])]
    base = [TaskResult("a", "7", bad, [bad, bad]), TaskResult("b", "7", bad, [bad, bad])]
    results = {"model": model, "baseline": base}
    return build_report(results, k=2, comparisons=[("model", "baseline")], meta={"env": "x"})


def test_report_json_keeps_its_keys_in_their_order_and_reads_back_equal():
    report = _report()
    data = json.loads(json.dumps(report.to_json()))
    assert list(data) == ["meta", "models", "comparisons", "tasks"]
    model = data["models"]["model"]
    assert list(model) == ["tasks", "greedy", "n", "k", "sampled"]
    assert list(model["sampled"])[-3:] == ["pass@1", "pass@2", "maj@2"]
    assert model["sampled"]["pass@1"] == pytest.approx(0.25)  # (1/2 + 0) / 2
    assert list(data["comparisons"]["model - baseline"]) == [
        "level", "tasks", "correctness_strict", "correctness_lenient", "pass@1",
    ]  # fmt: skip
    assert Report.from_json(data) == report


def test_records_read_like_their_json():
    report = _report()
    summary = report.models["model"]
    assert isinstance(summary, ModelSummary) and isinstance(summary.greedy, Figures)
    assert summary["greedy"] == summary.greedy.to_json()
    assert summary.greedy.correctness_strict == summary["greedy"]["correctness_strict"] == 0.5
    assert dict(summary) == summary.to_json() and len(summary) == 5
    greedy_only = ModelSummary(tasks=1, greedy=summary.greedy)
    assert set(greedy_only) == {"tasks", "greedy"} and "sampled" not in greedy_only
    assert report.comparisons["model - baseline"]["correctness_strict"]["diff"] == 0.5


def test_a_task_row_names_its_category_only_when_it_has_one():
    good, bad = _score(True), _score(False)
    model = [TaskResult("a", "7", good, [], "simple"), TaskResult("b", "7", bad, [])]
    rows = build_report({"model": model}, k=1, comparisons=[], meta={}).to_json()["tasks"]
    assert rows["model"][0]["category"] == "simple"
    assert "category" not in rows["model"][1]  # a report without categories reads as before
    assert "model / simple" in build_report({"model": model}, k=1, comparisons=[], meta={}).models

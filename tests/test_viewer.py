"""`agentgym view`: the page over a training run and over an eval report with a baseline,
opened in a real headless browser (Debian's chromium through playwright, whose own browser
download cannot work here): no console errors, every step and episode rendered, the loss
mask on the exact tokens, older steps loaded from side files over file://, both models
side by side. Outside CI the browser tests skip where chromium is missing; in CI they fail."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agentgym.cli import main
from agentgym.eval.episode_files import read_episodes
from agentgym.view.data import curves, run_view, task_rows
from agentgym.view.page import curves_svg, script_json

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SMALL = [
    "--set", "grpo.tasks_per_step=2", "--set", "grpo.group_size=2",
    "--set", "sampling.max_new_tokens=16", "--set", "run.report_to=[]",
]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A 3-step tiny-random run of tool_call."""
    out = tmp_path_factory.mktemp("view") / "run"
    argv = ["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "3", *SMALL]
    assert main([*argv, "--output", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make setup` installs it (as root, with apt)")
        pytest.skip("chromium is not installed (`make setup` installs it where it can)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def _open(browser, page: Path):
    """The page opened from file://, once its script ran; and the console errors it met."""
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.goto(page.resolve().as_uri())
    tab.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return tab, errors


def _view(folder: Path, *extra: str) -> Path:
    assert main(["view", str(folder), *extra]) == 0
    return folder / "view.html"


def test_the_run_page_shows_every_step_and_the_mask_on_the_exact_tokens(run, browser):
    tab, errors = _open(browser, _view(run))
    assert tab.locator("#step-list option").count() == 3
    assert tab.locator("#episodes tr.row").count() == 4  # step 3: 2 tasks x 2
    assert tab.locator("svg.curve").count() >= 3  # reward, length, KL at least
    tab.locator("#episodes tr.row").first.click()
    meta, arrays = read_episodes(run / "episodes" / "step-000003.npz")
    first = meta["episodes"][0]
    start, end = first["span"]
    tokens = tab.locator("#detail .tokens .tok")
    assert tokens.count() == end - start  # one span a token id
    mask = arrays["loss_mask"][start:end]
    trained = tokens.nth(int(np.argmax(mask == 1)))
    masked = tokens.nth(0)  # the prompt's first token
    assert "trained" in trained.get_attribute("class").split()
    assert "masked" in masked.get_attribute("class").split()
    assert trained.get_attribute("class") != masked.get_attribute("class")
    trained.hover()
    info = tab.locator("#detail .tokinfo").inner_text()
    token = int(arrays["tokens"][start + int(np.argmax(mask == 1))])
    assert f"id {token} " in info and "mask 1" in info
    masked.hover()
    assert "mask 0" in tab.locator("#detail .tokinfo").inner_text()
    assert tab.locator("#detail .chat .msg.role-user").count() >= 1
    assert errors == []


def test_an_episode_split_into_samples_shows_each_sample_and_where_it_split(run, browser, tmp_path):
    from test_episode_files import split_episode

    from agentgym.eval.episode_files import write_episodes

    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    episode = split_episode()
    turns = (episode.turns[0], replace(episode.turns[1], action="\n" * 40))
    episode = replace(episode, turns=turns)
    write_episodes(
        folder / "episodes" / "step-000003.npz", [episode], [[0.0] * 5], extra={"step": 3}
    )
    tab, errors = _open(browser, _view(folder))
    tab.locator("#episodes tr.row").first.click()
    heads = tab.locator("#detail h4.sample")
    assert heads.all_inner_texts() == [
        "sample 1 of 2 \u00b7 turns 0\u20130",
        "sample 2 of 2 \u00b7 turns 1\u20131",
    ]
    notes = tab.locator("#detail p.note").all_inner_texts()
    assert "the episode's first sample" in notes and f"split at {episode.opened_by}" in notes
    blank = tab.locator("#detail .msg.role-assistant").nth(1)  # its turn 1 is 40 newlines
    assert blank.locator(".text").inner_text() == "(40 whitespace characters)"
    assert blank.bounding_box()["height"] < 60
    boxes = tab.locator("#detail .tokens")
    assert boxes.count() == 2
    assert boxes.nth(0).locator(".tok").count() == 4 and boxes.nth(1).locator(".tok").count() == 5
    assert boxes.nth(0).locator(".tok.trained").count() == 2
    assert errors == []


def test_older_steps_load_from_side_files_over_file_urls(run, browser, tmp_path):
    page = tmp_path / "page.html"
    assert main(["view", str(run), "--output", str(page), "--inline-steps", "1"]) == 0
    assert sorted(p.name for p in (tmp_path / "page-data").iterdir()) == [
        "step-000001.js", "step-000002.js"
    ]  # fmt: skip
    inline = page.read_text()
    tab, errors = _open(browser, page)
    tab.select_option("#step-list", "1")
    tab.wait_for_function("document.querySelectorAll('#episodes tr.row').length === 4")
    assert tab.locator("#step-label").inner_text().startswith("step 1")
    assert errors == []
    assert '"steps":{"3":' in inline and '"index":' in inline  # only step 3 in the page
    assert '"file":"page-data/step-000001.js"' in inline


def _vary_format_parts(run: Path, folder: Path) -> Path:
    """A copy of `run` whose last step's episodes have reward parts that differ (format
    0.3, -0.2, 0.1, -0.1 in that order): tiny-random's are all alike."""
    shutil.copytree(run, folder)
    path = folder / "episodes" / "step-000003.npz"
    meta, arrays = read_episodes(path)
    for episode, value in zip(meta["episodes"], (0.3, -0.2, 0.1, -0.1), strict=True):
        episode["reward_parts"]["format"] = value
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez_compressed(path, allow_pickle=False, **arrays)
    return folder


def test_the_filter_and_the_sort_act_on_the_list(run, browser, tmp_path):
    tab, errors = _open(browser, _view(_vary_format_parts(run, tmp_path / "run")))
    meta, _ = read_episodes(run / "episodes" / "step-000003.npz")
    correct = sum((e["reward_parts"].get("correctness") or 0) >= 1 for e in meta["episodes"])
    tab.select_option("#filter", "correct")
    assert tab.locator("#episodes tr.row").count() == correct
    tab.select_option("#filter", "all")
    reward = tab.locator("#episodes th[data-key='reward']")
    reward.click()
    reward = tab.locator("#episodes th[data-key='reward']")
    reward.click()  # a second click: descending
    column = [th.inner_text() for th in tab.locator("#episodes th").all()].index("reward")
    values = [
        float(row.locator("td").nth(column).inner_text())
        for row in tab.locator("#episodes tr.row").all()
    ]
    assert values == sorted(values, reverse=True) and len(values) == 4
    column = [th.inner_text() for th in tab.locator("#episodes th").all()].index("reward parts")
    for order in ("ascending", "descending"):  # text columns sort by their text
        tab.locator("#episodes th[data-key='parts']").click()
        rows = tab.locator("#episodes tr.row").all()
        texts = [row.locator("td").nth(column).inner_text() for row in rows]
        assert texts == sorted(texts, reverse=order == "descending"), texts
    assert len(set(texts)) == 4  # they differ: each order moved them
    assert errors == []


def test_an_eval_with_a_baseline_shows_both_models_side_by_side(run, browser, tmp_path):
    report = tmp_path / "report"
    argv = ["eval", "--env", "tool_call", "--model", str(run / "checkpoint-000003")]
    argv += ["--baseline", "tiny-random", "--tasks", "3", "--n", "2", "--output", str(report)]
    assert main([*argv, "--set", "sampling.max_new_tokens=16"]) == 0
    tab, errors = _open(browser, _view(report))
    assert tab.locator("#tasks tr.row").count() == 3
    heads = [th.inner_text() for th in tab.locator("#tasks th").all()]
    assert heads[1:3] == ["model correct (greedy)", "model mean reward"]  # what each is over
    assert heads[-1] == "mean reward difference"
    assert tab.locator("#compare .side.model .episode").count() == 1
    assert tab.locator("#compare .side.baseline .episode").count() == 1
    tab.locator("#compare select").select_option(label="sample 1")
    assert "sample 1" in tab.locator("#compare .side.baseline h3").inner_text()
    assert tab.locator("#compare .side.model .tokens .tok.trained").count() > 0
    assert errors == []


def test_per_task_rows_by_hand():
    tasks = {
        "model": [{"task_id": "a", "greedy": {"strict": True, "reward": 1.0}, "samples": [
            {"strict": False, "reward": 0.0}]}],
        "baseline": [{"task_id": "a", "greedy": {"strict": False, "reward": 0.5}, "samples": [
            {"strict": False, "reward": 0.0}]}],
    }  # fmt: skip
    assert task_rows(tasks) == [
        {
            "task": "a",
            "model": {"correct": True, "reward": 0.5},
            "baseline": {"correct": False, "reward": 0.25},
            "diff": 0.25,
        }
    ]


def test_the_curves_mark_the_steps_with_health_warnings():
    rows = [
        {"step": 1, "reward/mean": 0.1},
        {"step": 2, "reward/mean": 0.3, "health": ["reward_collapse"]},
        {"step": 3, "reward/mean": float("nan")},
    ]
    figures = curves(rows)
    assert list(figures["series"]) == ["reward"] and figures["series"]["reward"][:2] == [0.1, 0.3]
    assert figures["health"] == {2: ["reward_collapse"]}
    svg = curves_svg(figures)
    assert svg.count("<svg") == 1 and svg.count('class="warn"') == 1
    assert "step 2: reward_collapse" in svg
    assert "a step with a health warning" in svg  # the legend says what the line is
    assert "health warning" not in curves_svg(curves(rows[:1]))  # no warning, no legend


def test_page_data_cannot_close_its_script_element():
    text = script_json({"content": "</script><script>alert(1)</script>"})
    assert "</script>" not in text and json.loads(text)["content"].startswith("</script>")


def test_a_folder_with_nothing_to_show_is_refused_naming_what_it_lacks(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither episodes/step-\\*.npz nor metrics.jsonl"):
        run_view(tmp_path)


def test_the_view_command_refuses_a_folder_it_cannot_show_with_a_message_and_exit_2(
    tmp_path, capsys
):
    assert main(["view", str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err == (
        f"agentgym view: error: {tmp_path / 'absent'} is not a folder; give a training run's "
        "or an eval report's\n"
    )
    assert main(["view", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentgym view: error: {tmp_path}: neither episodes/step-*.npz")
    assert not (tmp_path / "view.html").exists()


def test_the_curves_draw_each_benchmark_and_category_a_run_evaluated():
    rows = [
        {"step": 1, "reward/mean": 0.1, "bench/bfcl/correctness": 0.25},
        {"step": 2, "reward/mean": 0.3},
        {"step": 3, "bench/bfcl/correctness": 0.5, "bench/bfcl/multiple/correctness": 1.0},
    ]
    series = curves(rows)["series"]
    assert list(series) == ["reward", "bench/bfcl", "bench/bfcl/multiple"]
    assert series["bench/bfcl"] == [0.25, None, 0.5]  # steps without an evaluation: gaps
    assert series["bench/bfcl/multiple"] == [None, None, 1.0]
    assert curves_svg(curves(rows)).count("<svg") == 3

"""Benchmark (issue 39): how fast `agentgym view`'s page opens on a large run. A benchmark,
not a test.

A synthetic run folder of `--steps` (500) steps x `--episodes` (64) episodes, each of about
`--tokens` (300) token ids over three turns with a tool reply (written with the same
`write_episodes` training uses, a vocabulary of 5000 ids), and its metrics.jsonl. Then:

1. `agentgym view` builds the page (seconds);
2. headless chromium (Debian's, through playwright) opens it from file:// five times; time
   to first render is navigation start to the page's script having drawn the newest step's
   episode list (`body[data-ready]`), the median of five;
3. a step that lives in a side file is picked and its list drawn (median, ms);
4. page weight: the page itself, and the side files beside it.

The peer, measured in the same run: the same browser opening a page of the same size made
of one preformatted text block (no script): the floor for moving that many bytes.

    .venv/bin/python bench/viewer.py [--steps 500] [--episodes 64] [--tokens 300]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from agentgym.eval.episode_files import write_episodes
from agentgym.types import Message, Trajectory, Turn


def episode(rng: np.random.Generator, i: int, tokens: int, step: int) -> Trajectory:
    prompt = int(tokens * 0.3)
    ids = tuple(int(x) for x in rng.integers(0, 5000, tokens))
    mask = tuple(0 if j < prompt or (j // 40) % 3 == 2 else 1 for j in range(tokens))
    logprobs = tuple(float(-rng.random()) if m else 0.0 for m in mask)
    correct = float(rng.random() < 0.4)
    turns = tuple(
        Turn(
            f'Let me look.\n<tool_call>{{"name": "sql", "arguments": {{"q": "select {k}"}}}}'
            "</tool_call>",
            (Message("tool", f"rows: {k * 7}", name="sql"),),
            0.0,
            {},
        )
        for k in range(3)
    )
    return Trajectory(
        task_id=f"sql/{step * 16 + i // 4}", group=i % 4, tokens=ids, loss_mask=mask,
        logprobs=logprobs, prompt_length=prompt, reward=correct + 0.1,
        reward_parts={"correctness": correct, "format": 0.1}, turns=turns,
        finish_reason="stop", truncated=False,
        prompt_messages=(Message("system", "You are a shop assistant."),
                         Message("user", "How many orders last week?")),
        turn_spans=((prompt, prompt + 40),), counts={"tool_calls": 3.0},
        token_versions=tuple(step - 1 if m else -1 for m in mask),
    )  # fmt: skip


def synthetic_run(folder: Path, steps: int, episodes: int, tokens: int) -> None:
    rng = np.random.default_rng(0)
    vocab = {i: f"w{i}" for i in range(5000)}
    rows = []
    for step in range(1, steps + 1):
        played = [episode(rng, i, tokens, step) for i in range(episodes)]
        advantages = [[0.5 * m for m in t.loss_mask] for t in played]
        write_episodes(
            folder / "episodes" / f"step-{step:06d}.npz", played, advantages,
            extra={"step": step}, decode=vocab.__getitem__,
        )  # fmt: skip
        rewards = [t.reward for t in played]
        rows.append({"step": step, "reward/mean": sum(rewards) / len(rewards), "kl": 0.01})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def open_times(page: Path, chromium: str, rounds: int, side_step: int | None) -> dict:
    from playwright.sync_api import sync_playwright

    first, side = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(rounds):
            tab = browser.new_page()
            tab.goto(page.resolve().as_uri(), wait_until="commit")
            tab.wait_for_selector("body[data-ready='1']", timeout=120_000)
            first.append(tab.evaluate("performance.now()"))
            if side_step is not None:
                start = tab.evaluate("performance.now()")
                tab.select_option("#step-list", str(side_step))
                tab.wait_for_function(
                    f"document.getElementById('step-label').textContent.startsWith("
                    f"'step {side_step}') && document.querySelectorAll('#episodes tr.row')"
                    ".length > 0"
                )
                side.append(tab.evaluate("performance.now()") - start)
            tab.close()
        browser.close()
    return {"first": statistics.median(first), "side": statistics.median(side) if side else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium is needed (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        start = time.perf_counter()
        synthetic_run(run, args.steps, args.episodes, args.tokens)
        print(f"synthetic run: {args.steps} steps x {args.episodes} episodes x {args.tokens} "
              f"tokens written in {time.perf_counter() - start:.1f} s")  # fmt: skip
        start = time.perf_counter()
        command = [sys.executable, "-m", "agentgym", "view", str(run)]
        subprocess.run(command, check=True, capture_output=True)
        built = time.perf_counter() - start
        page = run / "view.html"
        sides = sorted((run / "view-data").glob("*.js"))
        weight, side_weight = page.stat().st_size, sum(p.stat().st_size for p in sides)
        mine = open_times(page, chromium, args.rounds, side_step=1)
        peer = Path(tmp) / "peer.html"
        filler = "x" * (weight - 60)
        peer.write_text(f"<html><body data-ready='1'><pre>{filler}</pre></body></html>")
        floor = open_times(peer, chromium, args.rounds, side_step=None)
    each = side_weight / max(1, len(sides)) / 1e3
    first, rounds = mine["first"] / 1000, args.rounds
    print(f"agentgym view built the page in {built:.1f} s")
    print(f"page weight: {weight / 1e6:.2f} MB inline, {len(sides)} side files")
    print(f"side files: {side_weight / 1e6:.1f} MB in all ({each:.0f} kB each)")
    print(f"time to first render: {first:.2f} s (median of {rounds}); aim < 2 s")
    print(f"a step from a side file: {mine['side']:.0f} ms")
    peer_s = floor["first"] / 1000
    print(f"peer (a script-less page of that size): {peer_s:.2f} s; ratio {first / peer_s:.2f}x")


if __name__ == "__main__":
    main()

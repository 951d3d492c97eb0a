"""Makes the viewer's screenshots in docs/: `agentgym view` over a training run (an episode
opened, the loss mask on its tokens) and over an evaluation of the run's best checkpoint
against its SFT start (both models side by side). Needs Debian's chromium (apt-get install
chromium) and playwright (the dev extra).

    python docs/screenshots.py RUN_FOLDER            # the default run's: runs/tool_call
    python docs/screenshots.py RUN_FOLDER --tasks 8  # tasks of the evaluation it makes

The evaluation (`agentgym eval --model RUN/checkpoint-best --baseline RUN/checkpoint-sft`)
is written to RUN/eval-best-vs-sft once; later calls reuse it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent


def agentgym(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "agentgym", *args], check=True)


def shoot(page: Path, chromium: str, shots: dict[str, str], out: Path) -> None:
    """Opens `page` and takes each shot: png name -> the episode list row to click first
    ("" for the page as it opens; a row marked correct where there is one)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.goto(page.resolve().as_uri())
        tab.wait_for_selector("body[data-ready='1']")
        for png, row in shots.items():
            if row:
                rows = tab.locator(row)
                (rows if rows.count() else tab.locator("#episodes tr.row")).first.click()
                tab.locator("#detail .tokens .tok.trained").first.hover()
                tab.locator("#detail .episode").first.scroll_into_view_if_needed()
            tab.screenshot(path=str(out / png))
            print(f"wrote {out / png}")
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a training run's folder (the default run's)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--config", type=Path, default=DOCS.parent / "configs" / "tool_call.yaml")
    parser.add_argument("--out", type=Path, default=DOCS, help="where the PNG files go")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium is needed: apt-get install chromium")
    report = args.run / "eval-best-vs-sft"
    if not (report / "report.json").exists():
        agentgym(
            "eval", "--config", str(args.config), "--model", str(args.run / "checkpoint-best"),
            "--baseline", str(args.run / "checkpoint-sft"), "--tasks", str(args.tasks),
            "--n", "2", "--output", str(report),
        )  # fmt: skip
    agentgym("view", str(args.run), "--output", str(args.run / "view.html"))
    agentgym("view", str(report), "--output", str(report / "view.html"))
    runs = {"viewer-run.png": "", "viewer-episode.png": "#episodes tr.row.correct"}
    shoot(args.run / "view.html", chromium, runs, args.out)
    shoot(report / "view.html", chromium, {"viewer-eval.png": ""}, args.out)


if __name__ == "__main__":
    main()

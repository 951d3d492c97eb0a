"""`agentgym view RUN_OR_REPORT [--output view.html] [--serve --port P]`."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any


def view_parser(sub: Any) -> None:
    """The `view` command's arguments."""
    v = sub.add_parser("view", help="See a run's or an evaluation's episodes in the browser.")
    v.add_argument("folder", type=Path, help="a training run's folder or an eval report's")
    v.add_argument("--output", type=Path, help="the page (default FOLDER/view.html)")
    v.add_argument("--inline-steps", type=int, default=20, help="newest steps in the page")
    v.add_argument("--serve", action="store_true", help="serve the page over HTTP")
    v.add_argument("--port", type=int, default=8765, help="--serve's port (127.0.0.1)")


def cmd_view(args: argparse.Namespace) -> int:
    """Writes the page (and a run's side files); with `--serve`, serves them until Ctrl-C."""
    from agentgym.config import ConfigError
    from agentgym.view.data import UnreadableFile, report_view, run_view
    from agentgym.view.page import write_page

    folder = Path(args.folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder; give a training run's or an eval report's")
    is_report = (folder / "report.json").is_file()
    try:
        data = report_view(folder) if is_report else run_view(folder)
    except (FileNotFoundError, UnreadableFile) as err:  # says what it lacks, or names the file
        raise ConfigError(str(err)) from None
    page = write_page(data, args.output or folder / "view.html", inline=args.inline_steps)
    print(f"view written to {page}")
    if args.serve:
        serve(page, args.port)
    return 0


def serve(page: Path, port: int) -> None:
    """Serves `page`'s folder on 127.0.0.1:`port` until interrupted."""
    import functools
    import http.server

    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(page.parent.resolve())
    )
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving http://127.0.0.1:{server.server_address[1]}/{page.name} (Ctrl-C stops)")
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()

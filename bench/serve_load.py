"""`agentgym serve` under load (issue 53): 20 concurrent clients, of which 10 send short
requests, 5 send prompts past the model's context, and 5 send long requests and
disconnect after a second. Prints the short requests' latency (p50, p99) under that load
against the same short requests alone, on the same server, and the server's peak memory.

    python bench/serve_load.py [--model embedded] [--rounds 3] [--checkout PATH]

A benchmark, not a test: the tests (`tests/test_attacks_serve.py`) assert the behaviours
(over-long prompts refused before work, a disconnected client's sampling cancelled); this
measures what a user of the server sees while they happen. `--checkout` serves another
checkout's `agentgym` (as `bench/attacks.py` does) to put an older behaviour beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
SHORT = {"messages": [{"role": "user", "content": "What is 2 + 2? Answer briefly."}],
         "max_tokens": 16, "temperature": 0.0}  # fmt: skip
LONG = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": 2000}  # fmt: skip
TOO_LONG = {"messages": [{"role": "user", "content": "lighthouse keeper " * 6000}],
            "max_tokens": 16}  # fmt: skip
"""108,000 characters: past the embedded model's 8,192 tokens once tokenized."""


MODEL = ["embedded"]  # the model id the requests name: --model, which serve accepts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(checkout: Path, model: str, port: int) -> subprocess.Popen:
    """`agentgym serve` of `checkout` on `port`, once it answers /v1/models."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    command = [sys.executable, "-m", "agentgym", "serve", "--model", model, "--port", str(port)]
    proc = subprocess.Popen(command, env=env, cwd=checkout, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).raise_for_status()
            return proc
        except httpx.HTTPError:
            assert proc.poll() is None, "the server exited while starting"
            time.sleep(0.5)
    raise TimeoutError("the server did not start in 300 s")


class Peak:
    """The server's peak resident memory, sampled every 0.1 s on a thread."""

    def __init__(self, pid: int):
        self.process, self.mb, self._stop = psutil.Process(pid), 0.0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.mb = max(self.mb, self.process.memory_info().rss / 2**20)
            time.sleep(0.1)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.mb


def _post(url: str, body: dict, timeout: float) -> tuple[str, float]:
    """The outcome (status code, or "disconnected"/"timeout") and seconds of one request."""
    started = time.monotonic()
    try:
        reply = httpx.post(url, json={"model": MODEL[0], **body}, timeout=timeout)
        outcome = str(reply.status_code)
    except httpx.TimeoutException:
        outcome = "timeout"
    return outcome, time.monotonic() - started


def short_clients(url: str, clients: int, rounds: int, timeout: float) -> list[tuple[str, float]]:
    """`clients` threads, each sending `rounds` short requests one after another."""
    results: list[tuple[str, float]] = []

    def client() -> None:
        for _ in range(rounds):
            results.append(_post(url, SHORT, timeout))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def attackers(
    url: str, done: threading.Event, kinds: tuple[str, ...] = ("too_long", "dropped")
) -> tuple[list[threading.Thread], dict[str, list]]:
    """5 clients sending over-long prompts and 5 sending long requests they drop after 1 s,
    each again and again until `done`; what they got."""
    seen: dict[str, list] = {"too_long": [], "dropped": []}

    def loop(kind: str, body: dict, timeout: float) -> None:
        while not done.is_set():
            seen[kind].append(_post(url, body, timeout)[0])

    threads = []
    if "too_long" in kinds:
        threads += [
            threading.Thread(target=loop, args=("too_long", TOO_LONG, 300)) for _ in range(5)
        ]
    if "dropped" in kinds:
        threads += [threading.Thread(target=loop, args=("dropped", LONG, 1.0)) for _ in range(5)]
    for t in threads:
        t.start()
    return threads, seen


def _latency(results: list[tuple[str, float]]) -> str:
    times = sorted(s for outcome, s in results if outcome == "200")
    failed = len(results) - len(times)
    if not times:
        return f"none answered ({failed} failed)"
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return f"p50 {statistics.median(times):.2f} s, p99 {p99:.2f} s, {failed} not answered"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--rounds", type=int, default=3, help="short requests per client")
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--timeout", type=float, default=300.0, help="per short request")
    parser.add_argument("--attackers", choices=["both", "too_long", "dropped"], default="both",
                        help="which 5 + 5 attackers run (one kind alone: 5 clients)")  # fmt: skip
    args = parser.parse_args()
    MODEL[0], port = args.model, _free_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    server = start(args.checkout.resolve(), args.model, port)
    try:
        peak = Peak(server.pid)
        short_clients(url, 2, 1, args.timeout)  # warm-up
        alone = short_clients(url, 10, args.rounds, args.timeout)
        alone_mb = peak.stop()
        peak, done = Peak(server.pid), threading.Event()
        kinds = ("too_long", "dropped") if args.attackers == "both" else (args.attackers,)
        threads, seen = attackers(url, done, kinds)
        time.sleep(2.0)  # the attacks are under way
        loaded = short_clients(url, 10, args.rounds, args.timeout)
        done.set()
        for t in threads:
            t.join()
        loaded_mb = peak.stop()
        answered = _post(url, SHORT, args.timeout)[0]
    finally:
        server.terminate()
        server.wait(60)
    counts = {k: {o: v.count(o) for o in sorted(set(v))} for k, v in seen.items()}
    print(f"agentgym serve --model {args.model} ({args.checkout}), 10 short clients x "
          f"{args.rounds} requests (max_tokens 16)")  # fmt: skip
    print("| phase | short requests' latency | server peak RSS |")
    print("| --- | --- | --- |")
    print(f"| alone | {_latency(alone)} | {alone_mb:.0f} MB |")
    beside = {"both": "5 over-long + 5 disconnecting", "too_long": "5 over-long",
              "dropped": "5 disconnecting"}[args.attackers]  # fmt: skip
    print(f"| beside {beside} clients | {_latency(loaded)} | "
          f"{loaded_mb:.0f} MB |")  # fmt: skip
    print(f"attackers' outcomes: {json.dumps(counts)}; a short request after: {answered}")


if __name__ == "__main__":
    main()

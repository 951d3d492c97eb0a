"""Issue 53's attacks on `agentgym serve` and on agent programs (`run.agent`), side by side
on two checkouts: each attack's answer (HTTP status or exit code), seconds, the server's or
run's peak memory, and what came after (a short request's answer; what the run recorded).

    python bench/attacks_serve.py --before /path/to/older/checkout [--timeout 60]

A benchmark, not a test: `tests/test_attacks_serve.py` and `tests/test_attacks_agents.py`
assert the new behaviour; this prints both. Each checkout's own `agentgym` is imported
(`bench/attacks.py`'s tree), the server held to `--memory-gb` of address space, and
tiny-random served, so that the older behaviour ends within the time limits.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import httpx
from attacks import ROOT, address_limit, checkout_tree
from serve_load import Peak, _free_port

HI = [{"role": "user", "content": "Hi"}]
AGENTS = textwrap.dedent('''
    import asyncio, json, os, threading, time

    URLS = []

    def _note(**seen):
        with open(os.environ["ATTACK_OUT"], "a") as f:
            f.write(json.dumps(seen) + "\\n")

    async def _ask(client, task):
        await client.chat.completions.create(model="policy", messages=task.messages)

    async def blocks(client, task):
        await _ask(client, task)
        time.sleep(3600)

    async def ignores_cancellation(client, task):
        await _ask(client, task)
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass

    async def exits(client, task):
        await _ask(client, task)
        raise SystemExit(3)

    async def leaves_a_thread(client, task):
        await _ask(client, task)
        threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
        return 1.0

    async def _cross(client, task, key):
        import openai
        await _ask(client, task)
        own = str(client.base_url)
        URLS.append(own)
        while len(URLS) < 2:
            await asyncio.sleep(0.05)
        if own == URLS[0]:
            await asyncio.sleep(2.0)  # open while the other tries
            return 1.0
        other = openai.AsyncOpenAI(base_url=URLS[0], api_key=key(client), max_retries=0)
        try:
            await other.chat.completions.create(model="policy", messages=task.messages)
            _note(status=200)
        except openai.APIStatusError as err:
            _note(status=err.status_code)
        finally:
            await other.close()
        return 1.0

    async def uses_anothers_url(client, task):
        """Sends to the URL the other episode's agent put in a module global."""
        return await _cross(client, task, lambda client: "x")

    async def uses_anothers_url_with_its_own_key(client, task):
        return await _cross(client, task, lambda client: client.api_key)
''')
TRAIN = ["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "1",
         "--set", "grpo.tasks_per_step=1", "--set", "grpo.group_size=2",
         "--set", "sampling.max_new_tokens=8", "--set", "eval.every=0",
         "--set", "eval.report_tasks=0", "--set", "run.report_to=[]",
         "--set", "run.agent_timeout_s=5"]  # fmt: skip


def _ask(url: str, body: bytes | dict, timeout: float) -> tuple[str, float, httpx.Response | None]:
    started = time.monotonic()
    try:
        if isinstance(body, dict):
            body = json.dumps({"model": "tiny-random", "messages": HI, **body}).encode()
        reply = httpx.post(f"{url}/chat/completions", content=body, timeout=timeout,
                           headers={"Content-Type": "application/json"})  # fmt: skip
        return str(reply.status_code), time.monotonic() - started, reply
    except httpx.TimeoutException:
        return "no answer", time.monotonic() - started, None
    except httpx.HTTPError:  # the server went away
        return "closed", time.monotonic() - started, None


def nested(depth: int) -> bytes:
    inner = "[" * depth + "]" * depth
    return f'{{"model": "tiny-random", "messages": {json.dumps(HI)}, "stop": {inner}}}'.encode()


def serve_attacks(timeout: float) -> dict[str, object]:
    """name -> the body of one request (bytes or fields), or a callable(url, proc)."""
    return {
        "a 1 MB prompt": {"messages": [{"role": "user", "content": "x " * 500_000}],
                          "max_tokens": 16},
        "max_tokens 2^20": {"max_tokens": 1 << 20},
        "n = 128, max_tokens 512": {"n": 128, "max_tokens": 512},
        "20 requests dropped after 1 s": dropped,
        "JSON nested 10,000 deep": nested(10_000),
        "an unknown model id": {"model": "gpt-5", "max_tokens": 2},
        '"logprobs": "false"': {"logprobs": "false", "max_tokens": 2},
        "SIGTERM while a request computes": stopped,
        "SIGTERM, then SIGINT": stopped_twice,
    }  # fmt: skip


def dropped(url: str, proc: subprocess.Popen, timeout: float) -> tuple[str, float]:
    started = time.monotonic()
    for _ in range(20):
        _ask(url, {"max_tokens": 2000, "temperature": 0.0, "n": 4}, 1.0)
    return "20 dropped", time.monotonic() - started


def _computing(url: str) -> None:
    body = {"max_tokens": 2000, "temperature": 0.0, "n": 8}
    for _ in range(4):
        threading.Thread(target=_ask, args=(url, body, 600), daemon=True).start()
    time.sleep(1.0)


def stopped(
    url: str, proc: subprocess.Popen, timeout: float, again: bool = False
) -> tuple[str, float]:
    """SIGTERM while requests compute (and SIGINT half a second after, when `again`): the
    exit code, and the seconds from the last signal to the exit."""
    _computing(url)
    proc.send_signal(signal.SIGTERM)
    if again:
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    try:
        return f"exit {proc.wait(timeout)}", time.monotonic() - started
    except subprocess.TimeoutExpired:
        return "still running", timeout


def stopped_twice(url: str, proc: subprocess.Popen, timeout: float) -> tuple[str, float]:
    return stopped(url, proc, timeout, again=True)


def serving(tree: Path, env: dict, memory_gb: float) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    command = [sys.executable, "-m", "agentgym", "serve", "--model", "tiny-random",
               "--port", str(port)]  # fmt: skip
    held, quiet = address_limit(memory_gb), subprocess.DEVNULL
    proc = subprocess.Popen(command, env=env, cwd=tree, stdout=quiet, stderr=quiet,
                            preexec_fn=held)  # fmt: skip
    url, deadline = f"http://127.0.0.1:{port}/v1", time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/models", timeout=2).raise_for_status()
            return proc, url
        except httpx.HTTPError:
            assert proc.poll() is None, "the server exited while starting"
            time.sleep(0.3)
    raise TimeoutError("the server did not start")


def serve_side(checkout: Path, timeout: float, memory_gb: float) -> dict[str, str]:
    out = {}
    with checkout_tree(checkout) as (tree, env):
        for name, attack in serve_attacks(timeout).items():
            proc, url = serving(tree, env, memory_gb)
            peak = Peak(proc.pid)
            try:
                if callable(attack):
                    answer, seconds = attack(url, proc, timeout)
                    reply = None
                else:
                    answer, seconds, reply = _ask(url, attack, timeout)
                mb = peak.stop()
                if reply is not None and reply.status_code == 200 and "logprobs" in name:
                    answer += (
                        f" (logprobs {'on' if reply.json()['choices'][0]['logprobs'] else 'off'})"
                    )
                elif reply is not None and reply.status_code >= 400:
                    answer += f" {reply.headers.get('content-type', '').split(';')[0]}"
                then = "exited" if proc.poll() is not None else "{}, {:.1f} s".format(
                    *_ask(url, {"max_tokens": 2}, 10.0)[:2])  # fmt: skip
                out[name] = f"{answer}, {seconds:.1f} s, {mb:.0f} MB; then {then}"
            finally:
                proc.kill()
                proc.wait()
    return out


def agent_side(checkout: Path, timeout: float, memory_gb: float) -> dict[str, str]:
    out = {}
    names = ["blocks", "ignores_cancellation", "exits", "leaves_a_thread",
             "uses_anothers_url", "uses_anothers_url_with_its_own_key"]  # fmt: skip
    with checkout_tree(checkout) as (tree, env), tempfile.TemporaryDirectory() as tmp:
        (tree / "attack_agents.py").write_text(AGENTS)
        for name in names:
            work = Path(tmp) / name
            notes = work / "notes.jsonl"
            work.mkdir()
            args = [*TRAIN, "--agent", f"{tree / 'attack_agents.py'}:{name}", "--output",
                    str(work / "run")]  # fmt: skip
            started = time.monotonic()
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "agentgym", *args], capture_output=True, text=True,
                    timeout=timeout, env={**env, "ATTACK_OUT": str(notes)}, cwd=tree,
                    preexec_fn=address_limit(memory_gb),
                )  # fmt: skip
                answer = f"exit {done.returncode}"
            except subprocess.TimeoutExpired:
                answer = "still running"
            seconds = time.monotonic() - started
            metrics = work / "run" / "metrics.jsonl"
            rows = (
                [json.loads(x) for x in metrics.read_text().splitlines()]
                if metrics.exists()
                else []
            )
            seen = (
                [json.loads(x)["status"] for x in notes.read_text().splitlines()]
                if notes.exists()
                else []
            )
            keys = ("failures/fraction", "agent/split_samples")
            last = rows[-1] if rows else {}
            recorded = ", ".join(f"{k} {last[k]:g}" for k in keys if k in last)
            said = f"; its request: {seen}" if seen else ""
            out[f"agent {name}"] = (f"{answer}, {seconds:.0f} s, {len(rows)} steps written"
                                    f"{'; ' + recorded if recorded else ''}{said}")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--timeout", type=float, default=60.0, help="per request or stop")
    parser.add_argument("--run-timeout", type=float, default=180.0, help="per agent run")
    parser.add_argument("--memory-gb", type=float, default=8.0)
    parser.add_argument("--only", choices=["serve", "agents"], help="one kind of attack")
    args = parser.parse_args()
    sides: dict[str, dict[str, str]] = {}
    for label, checkout in (("before", args.before.resolve()), ("after", ROOT)):
        sides[label] = {}
        if args.only != "agents":
            sides[label].update(serve_side(checkout, args.timeout, args.memory_gb))
        if args.only != "serve":
            sides[label].update(agent_side(checkout, args.run_timeout, args.memory_gb))
    print("| attack | before | after |")
    print("| --- | --- | --- |")
    for name, after in sides["after"].items():
        print(f"| {name} | {sides['before'][name]} | {after} |")


if __name__ == "__main__":
    main()

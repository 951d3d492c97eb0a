"""Sandbox latency: p50/p95 and runs/s, as ratios to a bare `python -c` subprocess.

Run: `python bench/sandbox.py [--runs 60]`. Compares, at concurrency 1 and 2:
a bare unisolated subprocess (the baseline), the local sandbox cold, the
local sandbox with a warm pool, and Docker where `make_sandbox("docker")`
works; back to back, and paced (a pause after each run, as when code runs come
between generation steps). Aim: isolated local <= 1.5x bare at p50, warm pool <= 0.5x.

The local rows run in the machine's budget mode (a cgroup per run where one can
be made); where that is "cgroup", the same sandbox forced to the rlimit fallback
runs too, and a "cgroup cost" row gives the p50 difference between the two.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from agentgym.sandboxes import SandboxUnavailableError, make_sandbox
from agentgym.sandboxes.local import LocalSandbox

CODE = "print(sum(range(1000)))"


def measure(
    run_once: Callable[[], object], runs: int, concurrency: int, gap_s: float = 0.0
) -> tuple[float, ...]:
    """Returns (p50 s, p95 s, runs/s) of `runs` calls made by `concurrency` threads.

    `gap_s` is an untimed pause after each call: code runs in RL arrive between
    generation steps, not back to back, and a warm pool refills in the gaps.
    """

    def timed(_: int) -> float:
        t0 = time.perf_counter()
        run_once()
        elapsed = time.perf_counter() - t0
        time.sleep(gap_s)
        return elapsed

    for _ in range(3):  # warm-up: page cache, pools
        run_once()
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = sorted(pool.map(timed, range(runs)))
    wall = time.perf_counter() - start
    return latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.95)], runs / wall


def bare() -> None:
    subprocess.run([sys.executable, "-c", CODE], capture_output=True, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--gap-ms", type=float, default=100.0, help="pause of the paced rows")
    args = parser.parse_args()
    contenders: dict[str, Callable[[], object]] = {"bare subprocess": bare}
    local = LocalSandbox()
    warm = LocalSandbox(pool_size=4)
    print(f"local: {local.describe()}")
    cold_name = f"local cold ({local.isolation}, {local.budget})"
    fallback_name = f"local cold ({local.isolation}, rlimit)"
    contenders[cold_name] = lambda: local.run(CODE)
    contenders[f"local warm pool (4, {warm.budget})"] = lambda: warm.run(CODE)
    fallback = LocalSandbox(budget="rlimit") if local.budget == "cgroup" else None
    if fallback is not None:
        contenders[fallback_name] = lambda: fallback.run(CODE)
    try:
        docker = make_sandbox("docker")
        contenders["docker"] = lambda: docker.run(CODE)
    except (SandboxUnavailableError, ImportError) as exc:
        print(f"docker: skipped ({exc})")
    print(
        f"{'sandbox':<34} {'conc':>4} {'p50 ms':>8} {'p95 ms':>8} {'runs/s':>8} {'p50 x bare':>10}"
    )
    for concurrency, gap_s in ((1, 0.0), (2, 0.0), (1, args.gap_ms / 1e3)):
        if gap_s:
            print(f"paced: a {args.gap_ms:.0f} ms pause after each run (runs/s counts it)")
        base = None
        p50s = {}
        for name, run_once in contenders.items():
            p50, p95, rate = measure(run_once, args.runs, concurrency, gap_s)
            base = base or p50
            p50s[name] = p50
            print(
                f"{name:<34} {concurrency:>4} {p50 * 1e3:>8.1f} {p95 * 1e3:>8.1f} "
                f"{rate:>8.1f} {p50 / base:>10.2f}"
            )
        if fallback is not None:
            cost = p50s[cold_name] - p50s[fallback_name]
            print(f"{'cgroup cost (cold - rlimit cold)':<34} {concurrency:>4} {cost * 1e3:>8.1f}")
    warm.close()


if __name__ == "__main__":
    main()

"""What our own world teaches, measured outside it: checkpoints trained on agentgym's own
environments, evaluated on BFCL v4 as published. A benchmark, not a test.

The models: the embedded start model; the `FunctionCalls-v0` warm-up and its three arms
(`bench/function_calls.py`: grpo, rft, sft) of one seed's folder; and the default run's
(`make train`) SFT and best checkpoints. Each is played greedily on the same seeded subset
of BFCL's single-turn categories (`--n` tasks of each of `CATEGORIES`, `agentgym eval
--benchmark`), scored by BFCL's checker (`string_match: bfcl`); the table gives each
category's correctness per model and each model's difference from the model it was trained
from (the arms: the warm-up; the default run's best: its SFT checkpoint; the rest: the start
model) with a 95 % paired bootstrap interval over the same tasks.

    python bench/bfcl_transfer.py --arms runs/bench-function-calls/seed0 \
        --default-run runs/tool_call [--n 20] [--out runs/bench-bfcl]
    python bench/bfcl_transfer.py --table [RECORD]

Each model's report stays in `OUT/<model>/`, and its per-task correctness, the benchmark's
description and its weights' sha256 are recorded in `--record` (`bench/records/bfcl/`, kept
in git), so the models can be trained and evaluated across sittings on fresh machines: a
rerun skips a recorded model, and the table is made from the records. The `fc-*` models'
records keep the warm-up's sha they started from; the table refuses arms of different
warm-ups (retrained on another machine, say).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "bench" / "records" / "bfcl"
CATEGORIES = ("simple_python", "multiple", "parallel", "irrelevance", "live_simple")


def models(start: str, arms: Path | None, default_run: Path | None) -> dict[str, str]:
    """name -> model (`start`, then the checkpoint folders that exist)."""
    found = {"start": start}
    if arms is not None:
        for name in ("warmup", "grpo", "rft", "sft"):
            done = arms / name / "done"
            if done.exists():
                found[f"fc-{name}"] = done.read_text().strip()
    if default_run is not None:
        for name, folder in (
            ("default-sft", "checkpoint-sft"),
            ("default-best", "checkpoint-best"),
        ):
            if (default_run / folder).exists():
                found[name] = str((default_run / folder).resolve())
    return found


def evaluate(name: str, model: str, out: Path, n: int, extra: list[str]) -> Path:
    """`agentgym eval --benchmark` of `model` into `out/name` (skipped when done)."""
    folder = out / name
    if not (folder / "report.json").exists():
        spec = f"bfcl:{','.join(CATEGORIES)}@{n}"
        cmd = [sys.executable, "-m", "agentgym", "eval", "--benchmark", spec, "--model", model]
        cmd += ["--output", str(folder), "--save-episodes", "failures"]
        cmd += [x for s in extra for x in ("--set", s)]
        with open(out / f"{name}.log", "a") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        if code != 0:
            raise SystemExit(f"{name}: agentgym eval failed ({code}); see {out}/{name}.log")
    return folder


def keep(name: str, model: str, arms: Path | None, folder: Path, record: Path) -> None:
    """Records `name`'s per-task correctness (from its report in `folder`), the benchmark's
    description, its weights' sha256 and, for an `fc-*` arm, its warm-up's."""
    from credit import weights_sha

    path = Path(model)
    start = None
    if name.startswith("fc-") and arms is not None:
        start = weights_sha(Path((arms / "warmup" / "done").read_text().strip()))
    meta = json.loads((folder / "report.json").read_text())["meta"]["benchmarks"]
    kept = {
        "model": model if not path.exists() else path.name,
        "weights": weights_sha(path) if (path / "MANIFEST.json").exists() else model,
        "warmup": start,
        "benchmarks": meta,
        "correct": correct(folder),
    }
    record.mkdir(parents=True, exist_ok=True)
    (record / f"{name}.json").write_text(json.dumps(kept, sort_keys=True) + "\n")


def correct(folder: Path) -> dict[str, dict[str, float]]:
    """category -> task id -> greedy correctness (0/1) of one report."""
    tasks = json.loads((folder / "report.json").read_text())["tasks"]["model"]
    out: dict[str, dict[str, float]] = {}
    for t in tasks:
        out.setdefault(t["category"].partition("/")[2], {})[t["task_id"]] = float(
            t["greedy"]["strict"]
        )
    return out


ORDER = ("start", "default-sft", "default-best", "fc-warmup", "fc-grpo", "fc-rft", "fc-sft")
BASE = {"default-best": "default-sft", "fc-grpo": "fc-warmup", "fc-rft": "fc-warmup",
        "fc-sft": "fc-warmup"}  # fmt: skip
"""What a model is compared with: the model it was trained from (the others: start)."""


def table(record: Path) -> str:
    """The markdown table of every model recorded in `record`: each category's correctness
    and each model's difference from the model it was trained from."""
    from agentgym.eval.stats import paired_bootstrap

    kept = {p.stem: json.loads(p.read_text()) for p in sorted(record.glob("*.json"))}
    if "start" not in kept:
        raise SystemExit(f"{record}: the start model is not recorded (start.json)")
    names = sorted(kept, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    warmups = {kept[n]["warmup"] for n in names if n.startswith("fc-")}
    if len(warmups) > 1:
        raise SystemExit(f"{record}: the fc-* arms started from different warm-ups {warmups}")
    other = [n for n in names if kept[n]["benchmarks"] != kept["start"]["benchmarks"]]
    if other:
        raise SystemExit(f"{record}: {other} played other BFCL subsets than start.json's")
    scores = {n: kept[n]["correct"] for n in names}
    ((label, entry),) = kept["start"]["benchmarks"].items()
    bases = {n: BASE.get(n, "start") for n in names}
    lines = [
        f"BFCL v4 ({entry['package']} {entry['version']}), `{label}`, greedy, "
        f"subset seed {entry['subset_seed']}; correctness, and in brackets the difference from "
        "the model it was trained from with its 95 % paired bootstrap interval ("
        + ", ".join(f"{n} from {bases[n]}" for n in names if n != "start")
        + ")",
        "",
        "| category | n | " + " | ".join(names) + " |",
        "|" + " --- |" * (2 + len(names)),
    ]
    rows = {c: {n: scores[n].get(c, {}) for n in names} for c in CATEGORIES}
    calls = tuple(c for c in CATEGORIES if c != "irrelevance")
    for row, cats in (("calls expected", calls), ("all", CATEGORIES)):
        rows[row] = {
            n: {t: v for c in cats for t, v in scores[n].get(c, {}).items()} for n in names
        }
    for category, by_model in rows.items():
        ids = sorted(by_model["start"])
        cells = []
        for n in names:
            values = [by_model[n][t] for t in ids]
            cell = f"{sum(values) / len(values):.3f}"
            if n != "start" and bases[n] in by_model:
                base = [by_model[bases[n]][t] for t in ids]
                diff, low, high = paired_bootstrap(values, base)
                cell += f" ({diff:+.3f} [{low:+.3f}, {high:+.3f}])"
            cells.append(cell)
        lines.append(f"| {category} | {len(ids)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", type=Path, help="a bench/function_calls.py seed folder")
    parser.add_argument("--default-run", type=Path, help="the default run's folder (make train)")
    parser.add_argument("--start", default="embedded", help="the start model (smoke: tiny-random)")
    parser.add_argument("--n", type=int, default=20, help="BFCL tasks of each category")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-bfcl")
    parser.add_argument("--record", type=Path, default=RECORD, help="where models are recorded")
    parser.add_argument("--table", type=Path, nargs="?", const=RECORD,
                        help="print the table of the models recorded in it")  # fmt: skip
    parser.add_argument("--set", dest="sets", action="append", default=[], help="eval overrides")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for name, model in models(args.start, args.arms, args.default_run).items():
        if not (args.record / f"{name}.json").exists():
            folder = evaluate(name, model, args.out, args.n, args.sets)
            keep(name, model, args.arms, folder, args.record)
    print(table(args.record), flush=True)


if __name__ == "__main__":
    main()

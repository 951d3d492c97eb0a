"""Reading rows of tasks from a data file, a `datasets` folder, or memory.

`read_rows(data)` takes a `.jsonl`, `.json`, `.csv` or `.parquet` file, a folder
written by `datasets`' `save_to_disk` (a `Dataset`, or a `DatasetDict` whose
splits are "train" and "test"), a `datasets.Dataset`/`DatasetDict`, or a list of
dicts, and returns the rows with where each one is, for error messages: "line
N" (1-based, as an editor shows it) in `.jsonl` and `.csv` files, "row N"
(0-based, as `dataset[N]` indexes it) elsewhere.

JSON and CSV files are read with the standard library rather than
`datasets.load_dataset`: that keeps each row's line number, lets a column mix
types (an answer 42 in one row and "x" in the next, which Arrow's type
inference refuses with an error naming no row), and writes no cache. Parquet
files are read with pyarrow (the `datasets` storage format) and folders with
`datasets.load_from_disk`, neither of which writes a cache either. Nothing is
downloaded. Files are read once per process (cached by path, size and mtime).
"""

from __future__ import annotations

import csv
import functools
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.config.files import not_utf8
from agentgym.extras import need

FILE_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".csv", ".parquet")
MAX_LISTED = 50  # problems listed in one error; the rest are counted
MAX_CELL_CHARS = int(os.environ.get("AGENTGYM_MAX_CELL_CHARS", 1 << 20))
"""The longest string a cell may hold, at any depth (1 Mi characters, about 250k tokens:
past any context); AGENTGYM_MAX_CELL_CHARS changes it. A longer one makes its row unreadable."""
MAX_CELL_DEPTH = int(os.environ.get("AGENTGYM_MAX_CELL_DEPTH", 64))
"""The deepest nesting of lists and objects in a cell (a tool schema has a few levels);
AGENTGYM_MAX_CELL_DEPTH changes it."""


class DataError(ValueError):
    """A data source that cannot be read, or rows that are not valid tasks."""


def data_error(name: str, problems: Sequence[str]) -> DataError:
    """One error listing `problems` of the source `name` (the first `MAX_LISTED`, then a count)."""
    listed = [f"  {p}" for p in problems[:MAX_LISTED]]
    if len(problems) > MAX_LISTED:
        listed.append(f"  ... and {len(problems) - MAX_LISTED} more")
    noun = "problem" if len(problems) == 1 else "problems"
    return DataError(f"{name}: {len(problems)} {noun}:\n" + "\n".join(listed))


@dataclass(frozen=True, eq=False)
class Rows:
    """The rows of a data source, each with where it is and, from a `DatasetDict`, its split.

    `numbers[i]` is row i's index within its file (or its split, from a
    `DatasetDict`); task ids are built from it. `positions[i]` orders row i among
    the `unreadable` lines ((position, problem) pairs: not JSON, too many cells),
    so that all problems can be listed in file order. Rows compare (and hash) by
    identity: reading an unchanged file again gives the same object, so what is
    built from it can be cached.
    """

    name: str
    rows: tuple[Mapping[str, Any], ...]
    where: tuple[str, ...]
    numbers: tuple[int, ...]
    positions: tuple[int, ...]
    columns: tuple[str, ...]
    splits: tuple[str, ...] | None = None
    unreadable: tuple[tuple[int, str], ...] = ()


def _rows(
    name: str,
    rows: Sequence[Mapping[str, Any]],
    where: Sequence[str],
    *,
    numbers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    splits: Sequence[str] | None = None,
    unreadable: Sequence[tuple[int, str]] = (),
) -> Rows:
    numbers = list(numbers) if numbers is not None else list(range(len(rows)))
    positions = list(positions) if positions is not None else list(range(len(rows)))
    large = {i: why for i, row in enumerate(rows) if (why := _too_large(row))}
    if large:  # past the limits: listed with the unreadable lines, in file order
        unreadable = sorted(
            [*unreadable, *((positions[i], f"{where[i]}: {why}") for i, why in large.items())]
        )
        kept = [i for i in range(len(rows)) if i not in large]
        rows, where = [rows[i] for i in kept], [where[i] for i in kept]
        numbers, positions = [numbers[i] for i in kept], [positions[i] for i in kept]
        splits = [splits[i] for i in kept] if splits is not None else None
    if not rows:
        if unreadable:
            raise data_error(name, [problem for _, problem in unreadable])
        raise DataError(f"{name} holds no rows; valid: at least two rows (one train, one test)")
    columns = dict.fromkeys(key for row in rows for key in row)
    return Rows(
        name=name,
        rows=tuple(rows),
        where=tuple(where),
        numbers=tuple(numbers),
        positions=tuple(positions),
        columns=tuple(columns),
        splits=tuple(splits) if splits is not None else None,
        unreadable=tuple(unreadable),
    )


def _too_large(row: Mapping[str, Any]) -> str | None:
    """Why `row` is past the limits (`MAX_CELL_CHARS`, `MAX_CELL_DEPTH`), or None."""
    todo: list[tuple[str, Any, int]] = [(str(key), value, 1) for key, value in row.items()]
    while todo:
        column, value, depth = todo.pop()
        if depth > MAX_CELL_DEPTH:
            limit = f"{MAX_CELL_DEPTH} levels (AGENTGYM_MAX_CELL_DEPTH)"
            return f"column {column!r} nests deeper than {limit}"
        if isinstance(value, str) and len(value) > MAX_CELL_CHARS:
            return (
                f"column {column!r} holds a string of {len(value)} characters; at most "
                f"{MAX_CELL_CHARS} (AGENTGYM_MAX_CELL_CHARS)"
            )
        if isinstance(value, Mapping):
            todo += [(column, v, depth + 1) for v in value.values()]
        elif isinstance(value, list | tuple):
            todo += [(column, v, depth + 1) for v in value]
    return None


def read_rows(data: Any, name: str = "data") -> Rows:
    """The rows of `data`: a path, a `datasets.Dataset` or `DatasetDict`, or a list of dicts
    (`name` names the last in messages).

    Raises:
        DataError: The source is missing, empty, of an unknown kind, or not parseable
            (every unparseable line is listed).
    """
    if isinstance(data, str | os.PathLike):
        path = Path(data).expanduser()
        if not path.exists():
            raise DataError(
                f"data file {str(path)!r} does not exist (relative paths start at "
                f"{os.getcwd()!r}); valid: a {', '.join(FILE_SUFFIXES)} file or a folder "
                "saved by datasets' save_to_disk"
            )
        stat = path.stat()
        return _read_path(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        if not all(isinstance(row, Mapping) for row in data):
            raise DataError("data given as a list must hold dicts, one per row")
        return _rows(name, data, [f"row {i}" for i in range(len(data))])
    return _from_datasets(data, name)


@functools.lru_cache(maxsize=16)
def _read_path(path: str, mtime_ns: int, size: int) -> Rows:
    """The rows of the file or folder `path` (the mtime and size key the cache)."""
    del mtime_ns, size  # only the cache reads them: a changed file is read again
    file = Path(path)
    if file.is_dir():
        return _read_folder(file)
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv}
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(file)
    if suffix not in readers:
        raise DataError(
            f"{path}: unknown kind of data file {suffix!r}; valid: {', '.join(FILE_SUFFIXES)}, "
            "or a folder saved by datasets' save_to_disk"
        )
    try:
        text = file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text ({not_utf8(file)})") from None
    return readers[suffix](path, text)


def _read_jsonl(name: str, text: str) -> Rows:
    """One JSON object per line; blank lines are skipped."""
    rows, lines, unreadable = [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            unreadable.append((number, f"line {number}: not JSON ({err.msg}, column {err.colno})"))
            continue
        except RecursionError:
            unreadable.append((number, f"line {number}: nests too deep to parse"))
            continue
        if not isinstance(row, dict):
            kind = type(row).__name__
            unreadable.append((number, f"line {number}: a JSON {kind}; valid: an object"))
            continue
        rows.append(row)
        lines.append(number)
    where = [f"line {n}" for n in lines]
    return _rows(name, rows, where, positions=lines, unreadable=unreadable)


def _read_json(name: str, text: str) -> Rows:
    """A JSON list of objects, or JSON lines (as `datasets` also accepts in a .json file)."""
    try:
        loaded = json.loads(text)
    except RecursionError:
        raise DataError(f"{name}: nests too deep to parse") from None
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # several values: JSON lines
            return _read_jsonl(name, text)
        raise DataError(f"{name}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(loaded, list):
        got = (
            f"an object with keys {sorted(loaded)[:8]}"
            if isinstance(loaded, dict)
            else f"a JSON {type(loaded).__name__}"
        )
        raise DataError(f"{name}: holds {got}; valid: a list of objects, or one object a line")
    rows, indices, unreadable = [], [], []
    for i, row in enumerate(loaded):
        if isinstance(row, dict):
            rows.append(row)
            indices.append(i)
        else:
            unreadable.append((i, f"row {i}: a JSON {type(row).__name__}; valid: an object"))
    where = [f"row {i}" for i in indices]
    return _rows(name, rows, where, numbers=indices, positions=indices, unreadable=unreadable)


def _csv_records(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line where the record starts, its cells) of each CSV record."""
    reader = csv.reader(text.splitlines(keepends=True))
    start = 1
    for cells in reader:
        yield start, cells
        start = reader.line_num + 1


def _read_csv(name: str, text: str) -> Rows:
    """A header line, then one record a line; every cell is text."""
    records = list(_csv_records(text))
    if not records:
        raise DataError(f"{name} is empty; valid: a header line, then one row a line")
    header = records[0][1]
    rows, lines, unreadable = [], [], []
    for line, cells in records[1:]:
        if not any(c.strip() for c in cells):
            continue
        if len(cells) > len(header):
            too_many = f"{len(cells)} cells, but the header has {len(header)}"
            unreadable.append((line, f"line {line}: {too_many}"))
            continue
        rows.append(dict(zip(header, cells, strict=False)))  # a short row misses columns
        lines.append(line)
    where = [f"line {n}" for n in lines]
    return _rows(name, rows, where, positions=lines, unreadable=unreadable)


def _read_parquet(path: Path) -> Rows:
    parquet = need("pyarrow.parquet", f"reading the parquet file {path}")

    try:
        rows = parquet.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises its own kinds (ArrowInvalid, OSError, ...)
        raise DataError(f"{path}: not a readable parquet file ({err})") from None
    return _rows(str(path), rows, [f"row {i}" for i in range(len(rows))])


def _read_folder(path: Path) -> Rows:
    datasets = need("datasets", f"reading the folder {path}")  # ~1 s to import: only here

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as err:
        raise DataError(
            f"{path}: a folder, but not one saved by datasets' save_to_disk ({err}); valid: "
            f"such a folder, or a {', '.join(FILE_SUFFIXES)} file"
        ) from None
    return _from_datasets(loaded, str(path))


def _from_datasets(data: Any, name: str) -> Rows:
    """The rows of a `datasets.Dataset` or `DatasetDict` (whose split names must be ours)."""
    import datasets  # type: ignore[import-untyped]

    if isinstance(data, datasets.Dataset):
        return _rows(name, data.to_list(), [f"row {i}" for i in range(len(data))])
    if not isinstance(data, datasets.DatasetDict):
        raise DataError(
            f"data is a {type(data).__name__}; valid: a path to a {', '.join(FILE_SUFFIXES)} "
            "file or a save_to_disk folder, a datasets.Dataset or DatasetDict, or a list of dicts"
        )
    names = list(data)
    if not names or not set(names) <= {"train", "test"}:
        raise DataError(
            f"{name}: a DatasetDict with splits {names}; valid: 'train' and 'test' (or 'train' "
            "alone, split by hash), e.g. DatasetDict(train=d['train'], test=d['validation'])"
        )
    rows: list[dict[str, Any]] = []
    where: list[str] = []
    numbers: list[int] = []
    splits: list[str] = []
    for split in names:
        part = data[split].to_list()
        rows += part
        where += [f"{split} row {i}" for i in range(len(part))]
        numbers += range(len(part))
        splits += [split] * len(part)
    given = splits if names != ["train"] else None
    return _rows(name, rows, where, numbers=numbers, splits=given)

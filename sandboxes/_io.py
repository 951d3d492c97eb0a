"""Feeding and draining a sandboxed process without deadlock, under a deadline and a cap."""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import time
from typing import Literal, cast

TRUNCATED = b"\n...[output truncated]"
Cut = Literal["timeout", "output_limit"]


def communicate(
    proc: subprocess.Popen[bytes],
    control_fd: int,
    payload: bytes,
    stdin: bytes,
    deadline: float,
    max_bytes: int,
) -> tuple[bytes, bytes, Cut | None]:
    """Writes the payload and stdin, reads stdout and stderr until exit, deadline or cap.

    One selector loop serves all four pipes, so a child that writes a lot
    before reading its input (or never reads it) cannot block us. A stream
    past `max_bytes` is cut there and ends in TRUNCATED.

    Returns:
        stdout, stderr, and why we stopped early ("timeout", "output_limit")
        or None when the process closed its output itself. The caller kills
        the process tree in every case. Both write ends are closed on return.
    """
    assert proc.stdin and proc.stdout and proc.stderr
    # We own both write ends from here on and close them by fd; stdin is a dup,
    # so closing the file object too never closes a reused fd number.
    stdin_fd = os.dup(proc.stdin.fileno())
    proc.stdin.close()
    pending = {control_fd: memoryview(payload), stdin_fd: memoryview(stdin)}
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    sizes = dict.fromkeys(chunks, 0)
    cut: Cut | None = None
    with selectors.DefaultSelector() as sel:
        for fd in pending:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_WRITE)
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while len(sel.get_map()):
            left = deadline - time.monotonic()
            if left <= 0:
                cut = "timeout"
                break
            for key, _ in sel.select(left):
                fd = key.fd
                if fd in pending:
                    _write(sel, fd, pending)
                    continue
                data = _read(fd)
                if data is None:
                    continue
                if not data:
                    sel.unregister(fd)
                    continue
                room = max_bytes - sizes[fd]
                chunks[fd].append(data[:room])
                sizes[fd] += len(data)
                if sizes[fd] > max_bytes:
                    chunks[fd].append(TRUNCATED)
                    cut = "output_limit"
            if cut:
                break
        for fd in cast(list[int], list(sel.get_map())):  # registered by fd above
            if fd in pending:
                _close(fd)
    out, err = (b"".join(chunks[s.fileno()]) for s in (proc.stdout, proc.stderr))
    if cut is None:
        # Output closed: the process is exiting; wait for it under the same deadline.
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            cut = "timeout"
    return out, err, cut


def _write(sel: selectors.BaseSelector, fd: int, pending: dict[int, memoryview]) -> None:
    data = pending[fd]
    try:
        written = os.write(fd, data[: 1 << 16])
    except BlockingIOError:
        return
    except OSError:  # the child closed its end (or exited): drop the rest
        written = len(data)
    pending[fd] = data = data[written:]
    if not data:
        sel.unregister(fd)
        _close(fd)


def _read(fd: int) -> bytes | None:
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)

"""File locks in the state directory (`<state>/locks/NAME.lock`), so two processes sharing one state dir
take turns: the registry's alias moves hold `registry`, a flywheel run holds `flywheel`.

`fcntl.flock` locks: the kernel drops them when the holder exits, so a crashed run never leaves a stale
lock behind. The lock file holds the holder's pid for the error message. These locks serialise processes
on one machine sharing one state dir; they do not reach a remote MLflow shared by several machines.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator

from draftwheel import home


class LockedError(RuntimeError):
    """Another process holds the state-dir lock; the message names the lock file and the holder."""


def lock_path(name: str) -> Path:
    return home.state_dir() / "locks" / f"{name}.lock"


@contextlib.contextmanager
def state_lock(name: str, timeout_s: float = 0.0, purpose: str = "") -> Iterator[Path]:
    """Hold `<state>/locks/NAME.lock` for the block; wait up to `timeout_s` (0 = fail at once) for it."""
    path = lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "unknown"
                    raise LockedError(f"{purpose or name}: the state dir is locked by another process "
                                      f"(pid {holder}, lock file {path}); wait for it to finish") from None
                time.sleep(0.2)
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            yield path
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

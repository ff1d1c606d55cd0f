"""The request index: one fixed-size row per kept request, spilled to a binary file as it is built.

Selection needs to compare every request (quantiles, deepest rollbacks, the hold-out cut by time),
but not their text. The scan writes ~50 bytes per request here (position in the log, ts, slice,
acceptance, rollback depth, prompt key, sampling key) and selection reads it back in fixed-size
chunks, so memory stays flat however long the log is; the text is re-read only for the few
requests selected (`draftwheel.mining.log_reader.fetch_lines`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROW = np.dtype([
    ("row", "<u8"), ("file", "<u2"), ("line", "<u4"), ("offset", "<u8"), ("ts", "<f8"), ("slice", "<u2"),
    ("rate", "<f4"), ("depth", "u1"), ("key", "<u8"), ("rand", "<u8"),
])
CHUNK = 1 << 16


class IndexFile:
    """Append rows (tuples in ROW order) while scanning, then iterate them as numpy chunks."""

    def __init__(self, path: Path, write: bool = True):
        """A new (truncated) index file, or with write=False an existing one to read."""
        self.path = path
        self.rows = 0
        self._pending: list[tuple] = []
        self._handle = open(path, "wb") if write else None

    def append(self, row: tuple) -> None:
        self._pending.append(row)
        if len(self._pending) >= CHUNK:
            self._flush()

    def append_rows(self, rows: np.ndarray) -> None:
        """Append a ROW array (merging index parts)."""
        self._flush()
        rows.astype(ROW, copy=False).tofile(self._handle)
        self.rows += len(rows)

    def _flush(self) -> None:
        if self._pending:
            np.array(self._pending, dtype=ROW).tofile(self._handle)
            self.rows += len(self._pending)
            self._pending = []

    def close(self) -> None:
        if self._handle is not None and not self._handle.closed:
            self._flush()
            self._handle.close()

    def chunks(self) -> Iterator[np.ndarray]:
        """The rows in scan order, CHUNK at a time (read with plain file I/O, not mmap, so RSS stays flat)."""
        self.close()
        if not self.path.exists():
            return
        with open(self.path, "rb") as handle:
            while True:
                chunk = np.fromfile(handle, dtype=ROW, count=CHUNK)
                if not len(chunk):
                    return
                yield chunk

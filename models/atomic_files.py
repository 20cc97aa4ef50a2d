"""Files written so that a reader (another process, or this one after a crash) sees the old file or
the whole new one, never a part: a temporary file in the same folder, then `os.replace`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def replace_atomically(path: Path, write: Callable[[str], object]) -> None:
    """``write(temporary path)``, then move the result to `path` in one step; the temporary file is
    removed if anything fails (also KeyboardInterrupt)."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(temp)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path, text: str, *, mode: int | None = None) -> None:
    """`text` (UTF-8) to `path`, flushed to disk before the rename; `mode`: its permission bits
    (a temporary file is created 0600)."""

    def write(temp: str) -> None:
        with open(temp, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(temp, mode)

    replace_atomically(path, write)

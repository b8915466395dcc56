"""Writing a file atomically: the one place that gives a file its final name only once it is whole.

Data folders' ``.npz``, ``.xml`` and ``.npy`` files and every JSON record (``rpm_lib.json_files.write_object``) are
written through ``write_atomically``; checkpoints have their own writer, which Lightning calls
(``rpm_lib.training.checkpoint_io``).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

#: The suffix of every temporary file (``.<name>.<pid>.tmp``), for the code that clears those a kill left behind.
TEMP_SUFFIX = ".tmp"


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before it is renamed: hidden, in the same folder (so ``os.replace`` is an atomic
    rename), and never matching a loader's ``*.npz`` / ``*.npy`` glob."""
    return path.with_name(f".{path.name}.{os.getpid()}{TEMP_SUFFIX}")


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None], *, fsync: bool = False) -> None:
    """Call ``write(handle)`` on a temporary file, then rename it to ``path``; the temporary file is removed when
    anything fails, a kill aside.

    Args:
        fsync: flush the bytes to disk before the rename (a file that resuming relies on); not for files that are
            checked and remade when damaged (the generator's problem files), where it would cost a disk flush each.
    """
    path = Path(path)
    temp = temporary_name(path)
    try:
        with open(temp, "wb") as handle:
            write(handle)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise

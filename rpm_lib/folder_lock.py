"""Guards for the commands that write large folders: one writer per output folder, and enough disk space.

One writer per output folder: an exclusive advisory lock (``fcntl.flock``) held while ``rpm-generate`` or
``rpm-data prepare`` writes, so a second writer is refused with a message naming the first instead of mixing
or deleting its files. The lock is released when the process ends, however it ends (kill included)."""
from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class FolderBusyError(RuntimeError):
    """Another process holds the folder's write lock; the message names it (pid, host, since when)."""


@contextmanager
def exclusive_writer(lock_file: str | Path, what: str) -> Iterator[None]:
    """Hold ``lock_file``'s exclusive lock for the ``with`` block.

    Args:
        lock_file: the lock file (created if missing; left in place, harmless once released).
        what: the writer, for the message (e.g. ``"rpm-generate"``).

    Raises:
        FolderBusyError: another process holds the lock.
    """
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_file, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise FolderBusyError(f"{lock_file.parent}: another {what} is writing here ({holder}); wait for it to "
                              "finish or choose another folder") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def nearest_existing(path: str | Path) -> Path:
    """``path`` itself if it exists, else its nearest existing parent (what a write there will depend on)."""
    existing = Path(path)
    while not existing.exists():
        existing = existing.parent
    return existing


def output_folder_problem(out: str) -> str | None:
    """Why ``out`` cannot be an output folder (empty, an existing file, under a file, not writable), or None."""
    if not out or not out.strip():
        return "empty path (name the folder to write into)"
    path = Path(out)
    if path.exists() and not path.is_dir():
        return f"{out} exists and is not a folder"
    existing = nearest_existing(path)
    if not existing.is_dir():
        return f"{existing} is a file, so {out} cannot be created"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


class NotEnoughSpaceError(OSError):
    """The disk holding an output folder has less free space than the write needs."""


def check_free_space(folder: str | Path, needed_bytes: int, what: str) -> None:
    """Refuse a write of about ``needed_bytes`` into ``folder`` (or its nearest existing parent) that cannot fit,
    before any byte is written: a full disk mid-way breaks memory maps with SIGBUS instead of an error.

    Raises:
        NotEnoughSpaceError: one line with the folder, the need and the free space, in MB.
    """
    import shutil

    existing = nearest_existing(folder)
    free = shutil.disk_usage(existing).free
    margin = 16 * 2**20  # journal, manifest, file-system overhead
    if needed_bytes + margin > free:
        raise NotEnoughSpaceError(f"no space left on {existing} for {what}: need ~{(needed_bytes + margin) / 1e6:,.0f} "
                                  f"MB, {free / 1e6:,.0f} MB free")


"""Guards for the commands that write large folders: one writer per output folder, and enough disk space.

One writer per output folder: an exclusive advisory lock (``fcntl.flock``) held while ``rpm-generate`` or
``rpm-data prepare`` writes, so a second writer is refused with a message naming the first instead of mixing
or deleting its files. The lock is released when the process ends, however it ends (kill included)."""
from __future__ import annotations

import fcntl
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class FolderBusyError(RuntimeError):
    """Another process holds the folder's write lock; the message names it (pid, host, since when)."""


class UnsafeLockFileError(ValueError):
    """Something other than a plain, singly-linked regular file sits at a lock file's path (a symbolic link, a
    hard link, a folder, a FIFO...); the message names the path."""


def _lock_path_kind(status: os.stat_result) -> str | None:
    """Why a file with ``status`` must not be used (truncated and written) as a lock file, or None."""
    if stat.S_ISREG(status.st_mode):
        # A hard link shares its bytes with another name: truncating the lock would wipe that file too.
        return None if status.st_nlink <= 1 else f"a hard link ({status.st_nlink} names share its content)"
    kinds = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket",
             stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device", stat.S_ISLNK: "a symbolic link"}
    return next((name for test, name in kinds.items() if test(status.st_mode)), "not a regular file")


def _open_lock_file(lock_file: Path, folder: Path) -> int:
    """Open (creating it if missing) ``lock_file`` for reading and writing; never through a symbolic link, and
    only a regular file with one name, since the holder's line is written over the file's content."""
    refusal = f"{lock_file}: the lock file of {folder} is {{}}; refusing to write to it (remove it and rerun)"
    try:
        # O_NOFOLLOW: a link planted at the path fails here (ELOOP) instead of having its target truncated;
        # O_NONBLOCK: a FIFO planted there cannot hang the open.
        handle = os.open(lock_file, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError:
        try:
            kind = _lock_path_kind(os.lstat(lock_file))
        except OSError:
            kind = None
        if kind is not None:
            raise UnsafeLockFileError(refusal.format(kind)) from None
        raise
    kind = _lock_path_kind(os.fstat(handle))
    if kind is not None:
        os.close(handle)
        raise UnsafeLockFileError(refusal.format(kind))
    return handle


@contextmanager
def exclusive_writer(lock_file: str | Path, what: str, folder: str | Path | None = None) -> Iterator[None]:
    """Hold ``lock_file``'s exclusive lock for the ``with`` block.

    Args:
        lock_file: the lock file (created if missing; left in place, harmless once released).
        what: the writer, for the message (e.g. ``"rpm-generate"``).
        folder: the folder the lock guards, named in the messages (default: the lock file's folder).

    Raises:
        FolderBusyError: another process holds the lock.
        UnsafeLockFileError: a symbolic link, hard link or anything but a regular file is at ``lock_file``.
    """
    lock_file = Path(lock_file)
    folder = lock_file.parent if folder is None else Path(folder)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    handle = _open_lock_file(lock_file, folder)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(handle, 4096, 0).decode(errors="replace").strip() or "another process"
        os.close(handle)
        raise FolderBusyError(f"{folder}: another {what} is writing here ({holder}; lock {lock_file}); wait for it "
                              "to finish or choose another folder") from None
    try:
        os.ftruncate(handle, 0)
        os.pwrite(handle, f"pid {os.getpid()} on {socket.gethostname()} since "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        os.close(handle)


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


def check_free_space(folder: str | Path, needed_bytes: int, what: str, detail: str = "") -> None:
    """Refuse a write of about ``needed_bytes`` (bytes) into ``folder`` (or its nearest existing parent) that
    cannot fit, before any byte is written: a full disk mid-way breaks memory maps with SIGBUS instead of an
    error.

    Args:
        detail: appended to the message (e.g. what the need is made of), in parentheses.

    Raises:
        NotEnoughSpaceError: one line with the folder, the need and the free space, in MB (10**6 bytes).
    """
    import shutil

    existing = nearest_existing(folder)
    free = shutil.disk_usage(existing).free
    margin = 16 * 2**20  # journal, manifest, file-system overhead
    if needed_bytes + margin > free:
        need_mb, free_mb = _megabytes(needed_bytes + margin), _megabytes(free)
        raise NotEnoughSpaceError(f"no space left on {existing} for {what}: need ~{need_mb:,} MB, {free_mb:,} MB free"
                                  + (f" ({detail})" if detail else ""))


def _megabytes(num_bytes: int) -> int:
    """``num_bytes`` in MB (10**6 bytes), rounded half up; integer division, since a need typed as 10**400
    bytes would overflow a float."""
    return (int(num_bytes) + 500_000) // 1_000_000


def cap_workers(workers: int, program: str) -> int:
    """``workers`` (processes), or the number of CPUs when it asks for more, saying so in one line on stderr:
    each worker is a process with its own interpreter and buffers, so more than one per CPU only costs memory
    and start-up time (a thousand of them can exhaust the machine)."""
    import sys

    cpus = os.cpu_count() or 1
    if workers <= cpus:
        return workers
    print(f"{program}: note: --workers {workers} capped at {cpus}, the number of CPUs", file=sys.stderr)
    return cpus


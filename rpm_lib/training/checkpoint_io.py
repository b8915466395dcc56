"""Writing a stage's checkpoints so that a kill at any moment leaves either the old file or the new one, whole.

Lightning 2.6 (``TorchCheckpointIO`` through fsspec's local transaction) writes a checkpoint to a temporary file in
the *system* temporary folder and then moves it over ``last.ckpt``. When that folder is on another filesystem than
the run folder -- node-local ``/tmp`` and a network run folder, the usual cluster layout, or a ``tmpfs`` ``/tmp`` --
the move is a copy straight into ``last.ckpt``: a job killed during the copy (SIGKILL after a scheduler's grace
period, the out-of-memory killer) leaves a truncated ``last.ckpt``, the only resume point of the stage. It also
needs room for a whole checkpoint in ``/tmp``.

``SameFolderCheckpointIO`` writes ``<name>.partial`` beside the target, flushes it to disk and renames it over the
target: a rename within one folder is atomic, so ``last.ckpt`` is never seen half-written. A ``.partial`` left by a
kill is removed and made anew by the next save (never written through: it may be a link) and is never read
(nothing loads or packs that name); one from a failed write (a full disk) is removed at once.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

PARTIAL_SUFFIX = ".partial"


class SameFolderCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves go through a temporary file in the target's own folder (see module doc).

    Loading is Lightning's own; only ``save_checkpoint`` differs.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` (Lightning's checkpoint mapping) to ``path`` atomically.

        Raises:
            TypeError: ``storage_options`` given (as ``TorchCheckpointIO`` does; nothing here uses them).
        """
        if storage_options is not None:
            raise TypeError(f"Trainer.save_checkpoint(..., storage_options=...) is not supported by "
                            f"{type(self).__name__}")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + PARTIAL_SUFFIX)
        if target.is_dir() and not target.is_symlink():
            # os.replace would fail after the whole write, with an error naming the .partial, not what is in the way
            raise IsADirectoryError(errno.EISDIR, "a folder is where the checkpoint goes (remove it)", str(target))
        # A stale .partial (left by a kill, or in a copied run folder) may be a symbolic link -- writing through it
        # overwrote a file outside the run folder and left last.ckpt a link to it -- or a read-only file, which failed
        # the save although the folder is writable. Remove it and create the file anew, never through a link.
        partial.unlink(missing_ok=True)
        try:
            # "x": create, never reuse; O_NOFOLLOW: never through a link (the handle keeps the path as its name)
            with open(partial, "xb", opener=_no_follow) as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                # without fsync a power loss or node crash after the rename can leave an empty file under the new name
                os.fsync(handle.fileno())
            os.replace(partial, target)
        except BaseException:
            # a full disk (or an interrupt) mid-write: the previous checkpoint stays, the half-written one goes,
            # so it does not keep the disk full
            partial.unlink(missing_ok=True)
            raise
        _sync_folder(target.parent)


def _no_follow(path: str, flags: int) -> int:
    """``open``'s opener: ``os.open`` that refuses a symbolic link as the last part of ``path`` (where supported)."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)


def _sync_folder(folder: Path) -> None:
    """Make the rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems (e.g. certain network mounts) refuse fsync on a folder; the rename still happened
    finally:
        os.close(descriptor)

"""Reading a finished cache: ``CacheReader`` checks it (``format.check_cache``), keeps its labels in memory and
memory-maps its panels in each process that reads them."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rpm_lib.data.cache.format import MANIFEST, check_cache, kind_spec, read_manifest
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.raw_files import SPLITS


def _file_identity(path: Path) -> tuple[int, ...]:
    """Device, inode, size and modification time of ``path``: any of them differs once it is replaced or rewritten."""
    status = path.stat()
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


class CacheReader:
    """Read access to a complete cache: label arrays in RAM, panels memory-mapped on first use (per process).

    Args:
        path: the cache folder.
        kind: expected kind (``"raven"`` / ``"pgm"``).
        image_size: requested panel size; must equal the cache's.
        resize: requested resize method; must equal the cache's.

    Raises:
        DataFormatError: incomplete cache, other kind, size or resize method.
    """

    def __init__(self, path: str | Path, kind: str, image_size: int, resize: str) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.spec = kind_spec(kind)
        for field in ("kind", "image_size", "resize"):  # compared below, before the whole cache is checked
            if field not in self.manifest:
                raise DataFormatError(f"{self.path / MANIFEST}: field {field!r} missing")
        if self.manifest["kind"] != kind:
            raise DataFormatError(f"{self.path}: this is a {self.manifest['kind']} cache, not a {kind} one")
        if self.manifest["image_size"] != image_size:
            raise DataFormatError(
                f"{self.path}: cache built for image_size={self.manifest['image_size']} cannot serve image_size={image_size}; "
                f"use image_size={self.manifest['image_size']}, {self._other_size_hint(image_size)}"
            )
        if self.manifest["resize"] != resize:
            raise DataFormatError(
                f"{self.path}: cache built with resize={self.manifest['resize']!r}, requested resize={resize!r}"
            )
        arrays = check_cache(self.path, self.manifest)
        self.groups = arrays["groups"].astype(np.int64)
        self.splits = arrays["splits"].astype(np.int64)
        self.file_ids = arrays["file_ids"]
        self.valid = arrays["valid"]
        self.targets = arrays["targets"]
        self.meta = arrays["meta"]
        self.meta_target = arrays["meta_target"]
        #: uint8 (N, 16) content hashes of the rows' original panels; None for a cache built before they existed.
        self.problem_hashes: np.ndarray | None = arrays.get("problem_hashes")
        #: what ``panels.npy`` was when the labels were read: each process maps it anew (see ``panels``)
        self._panels_identity: tuple[int, ...] | None = _file_identity(self.path / "panels.npy")
        self._panels: np.ndarray | None = None
        self._panels_pid: int | None = None

    def _other_size_hint(self, image_size: int) -> str:
        plan = self.manifest["plan"]
        if isinstance(plan.get("generator"), dict):  # no raw folder: made by rpm-generate --cache-size
            return f"or generate another cache with `rpm-generate --cache-size {image_size}` ({plan['source_root']})"
        return f"the raw folder {plan['source_root']}, or build another cache with `rpm-data prepare --size {image_size}`"

    def select(self, group_names: Sequence[str], split: str) -> np.ndarray:
        """int64 rows of valid problems of ``split`` for each group in the given order, by file id."""
        split_index = SPLITS.index(split)
        parts = []
        for name in group_names:
            g = self.spec.groups.index(name)
            rows = np.flatnonzero((self.groups == g) & (self.splits == split_index) & self.valid)
            if len(rows) == 0:
                present = [n for i, n in enumerate(self.spec.groups) if ((self.groups == i) & self.valid).any()]
                field = "configurations" if self.spec.name == "raven" else "pgm_regime"
                raise DataFormatError(f"{self.path}: the cache has no {name!r} problems for split {split!r}; it "
                                      f"holds {', '.join(present) or 'nothing'} (choose those with {field}=)")
            parts.append(rows[np.argsort(self.file_ids[rows], kind="stable")])
        return np.concatenate(parts)

    def source_id(self, row: int) -> str:
        return self.spec.source_id(self.spec.groups[self.groups[row]], int(self.file_ids[row]), SPLITS[self.splits[row]])

    def panels(self, row: int) -> np.ndarray:
        """uint8 (16, S, S) copy of a row (file answer order)."""
        if self._panels is None or self._panels_pid != os.getpid():
            # A DataLoader worker maps the file when it starts (each epoch, without persistent workers), maybe long
            # after the labels were read: a cache deleted and made again, or rewritten, since then would give its
            # panels beside the old labels, silently. The process that mapped it first keeps the file it mapped.
            file = self.path / "panels.npy"
            try:
                identity = _file_identity(file)
            except FileNotFoundError:
                identity = None
            if identity != self._panels_identity:
                raise DataFormatError(f"{file}: changed since the dataset was opened (deleted, replaced or "
                                      "rewritten); its labels were read from the old one, so the run cannot go on: "
                                      "restart it")
            self._panels = np.load(file, mmap_mode="r")
            self._panels_pid = os.getpid()
        return np.array(self._panels[row])

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_panels"] = None  # re-mapped in the receiving process
        return state

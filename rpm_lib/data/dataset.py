"""The common sample logic of ``RavenDataset`` and ``PgmDataset``: raw or cached source, answer order,
transform, views, tensors, and the label table.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from rpm_lib import rules
from rpm_lib.data.answer_order import AnswerOrder, apply_permutation, default_answer_order
from rpm_lib.data.cache import CacheReader, is_cache, kind_spec
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.raw_files import CACHE_MARKERS, RawFile, check_split
from rpm_lib.data.seeding import derive_seed
from rpm_lib.data.resize import check_resize, resize_panels

#: ``transform(panels uint8 (16, S, S), preserve_position) -> uint8 (16, S, S)``
Transform = Callable[[np.ndarray, bool], np.ndarray]


@dataclass(frozen=True)
class RpmLabels:
    """Per-sample labels of a dataset, without any image decoding (index i = dataset index i).

    Attributes:
        targets: int64 (N,) correct choice in FILE order (before answer shuffling; the returned sample's
            ``target`` follows its permutation).
        configurations: int64 (N,) index into ``group_names`` (``rules.CONFIGURATIONS`` / ``rules.PGM_REGIMES``).
        meta: uint8 ``meta_matrix`` (RAVEN): (N, 8, 9), or (N, 12, 9) when the dataset holds a Mesh problem
            (rows 8..11 the Mesh, zero for the problems without one); or (N, 4, 12)
            ``relation_structure_encoded`` (PGM).
        meta_target: uint8 (N, 9) / (N, 12) dense labels.
        source_ids: the problems' stable names.
        group_names: names for ``configurations``.
    """

    targets: np.ndarray
    configurations: np.ndarray
    meta: np.ndarray
    meta_target: np.ndarray
    source_ids: tuple[str, ...]
    group_names: tuple[str, ...]


class RpmDataset(Dataset):
    """Base class; use ``RavenDataset`` or ``PgmDataset``.

    A sample is the dict of ``docs/architecture.md``: ``panels`` torch.uint8 (16, S, S) (or (V, 16, S, S)
    when ``num_views = V > 1``), ``target`` torch.int64 scalar, ``rules_dense`` / ``rules_sparse``
    torch.float32, ``configuration`` int, ``index`` int, ``source_id`` str.
    """

    kind: str = ""

    def __init__(
        self,
        root: str | Path,
        split: str,
        groups: list[str],
        find_files: Callable[[], list[RawFile]],
        image_size: int,
        rule_encoding: str,
        answer_order: str | None,
        seed: int,
        transform: Transform | None,
        num_views: int,
        resize: str,
    ) -> None:
        self.root = Path(root)
        self.split = check_split(split)
        self.image_size = int(image_size)
        if self.image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {image_size}")
        self.resize = check_resize(resize)
        if num_views < 1:
            raise ValueError(f"num_views must be >= 1, got {num_views}")
        self.num_views = int(num_views)
        self.transform = transform
        self.rule_encoding = rule_encoding
        self.seed = int(seed)
        self.answer_order = AnswerOrder(answer_order or default_answer_order(self.split), self.seed)
        self.epoch = 0
        self._spec = kind_spec(self.kind)
        self.group_names = list(groups)
        if is_cache(self.root):
            self._cache: CacheReader | None = CacheReader(self.root, self.kind, self.image_size, self.resize)
            self._rows = self._cache.select(groups, self.split)
            self._files: list[RawFile] | None = None
            self.source_ids = [self._cache.source_id(r) for r in self._rows]
            group_index = self._cache.groups[self._rows]
        else:
            markers = [m for m in CACHE_MARKERS if (self.root / m).exists()]
            if markers:
                raise DataFormatError(
                    f"{self.root}: incomplete or damaged cache (has {markers} but no manifest.json): rerun "
                    "`rpm-data prepare` into a new folder"
                )
            self._cache = None
            self._files = find_files()
            self.source_ids = [f.source_id for f in self._files]
            group_index = np.array([self._spec.groups.index(f.group) for f in self._files], dtype=np.int64)
        #: int64 (N,): configuration (RAVEN) / regime (PGM) index of every sample, available without I/O.
        self.configuration_indices = group_index.astype(np.int64)
        self._labels: RpmLabels | None = None
        self._sparse_table: np.ndarray | None = None

    @property
    def from_cache(self) -> bool:
        return self._cache is not None

    @property
    def cache_manifest(self) -> dict | None:
        """The cache's ``manifest.json`` content (None for a folder of problem files)."""
        return None if self._cache is None else self._cache.manifest

    def stored_panels(self, index: int) -> np.ndarray:
        """uint8 (16, S, S) panels of sample ``index`` exactly as the folder stores them: file answer order, no
        resizing or augmentation (a cache's row at its size; a raw file's image, S = 160 for I-RAVEN)."""
        if self._cache is not None:
            return self._cache.panels(int(self._rows[index]))
        from rpm_lib.data.npz import read_npz

        path = self._files[index].path
        image = read_npz(path, ("image",))["image"]
        if image.dtype == np.uint8 and image.ndim == 3 and image.shape[0] == 16 and image.shape[1] == image.shape[2]:
            return np.ascontiguousarray(image)  # what load_raven_npz / load_pgm_npz return for such an image
        return self._spec.load(path).panels

    def __len__(self) -> int:
        return len(self.source_ids)

    def recorded_hashes(self) -> list[bytes | None]:
        """The hash the folder's record gives for each sample (a cache's ``problem_hashes.npy`` row, a raw folder's
        ``problem_hashes.json`` entry), unchecked; ``None`` where there is none, or where the file changed (size or
        time) since it was recorded.

        Raises:
            DataFormatError: a damaged record (one line naming it).
        """
        from rpm_lib.data.problem_hashes import read_raw_record, recorded_entry

        if self._cache is not None:
            stored = self._cache.problem_hashes
            return [None] * len(self) if stored is None else [bytes(row) for row in stored[self._rows]]
        record = read_raw_record(self.root)
        return [recorded_entry(record, self.root, f.path) for f in self._files]

    def problem_hashes(self) -> list[bytes] | None:
        """The 16-byte content hash of every sample's original panels (``problem_hashes.panels_hash``), in sample
        order: what tells two folders' problems apart by content, not by name.

        Read from the cache's ``problem_hashes.npy`` or the raw folder's record; problems without one (folders
        made before these records, downloaded ones, files replaced since) are hashed now, with a one-line note on
        stderr. ``None`` (with a note) for a cache of resized panels built before hashes were recorded: its
        original panels are not stored, so it cannot be hashed.
        """
        from rpm_lib.data.problem_hashes import note, panels_hash, raw_hashes

        if self._cache is not None:
            stored = self._cache.problem_hashes
            if stored is not None:
                return [bytes(row) for row in stored[self._rows]]
            if self._cache.manifest["image_size"] != 160:
                note(f"{self.root}: built before caches recorded problem hashes, with resized panels, so its "
                     "problems cannot be compared with other folders' by content; rebuild it with `rpm-data "
                     "prepare` to check for overlap")
                return None
            note(f"{self.root}: built before caches recorded problem hashes; hashing its {len(self)} "
                 f"{self.split} problems now")
            return [panels_hash(self._cache.panels(int(row))) for row in self._rows]
        hashes, computed = raw_hashes(self.root, [f.path for f in self._files], self._spec.load)
        if computed:
            note(f"{self.root}: hashed {computed} {self.split} problem(s) that its problem_hashes.json does not "
                 "record (made before it existed, downloaded, or changed since)")
        return hashes

    # -- labels -----------------------------------------------------------------------------------

    @property
    def labels(self) -> RpmLabels:
        """Label table (read from the cache's arrays, or from every raw file's small members once)."""
        if self._labels is None:
            if self._cache is not None:
                targets = self._cache.targets[self._rows].astype(np.int64)
                meta = self._label_meta(self._cache.meta[self._rows])
                meta_target = self._cache.meta_target[self._rows]
            else:
                records = [self._spec.load(f.path, with_image=False) for f in self._files]
                targets = np.array([r.target for r in records], dtype=np.int64)
                meta = self._label_meta([r.meta for r in records])
                meta_target = np.stack([r.meta_target for r in records])
            self._labels = RpmLabels(
                targets, self.configuration_indices, meta, meta_target, tuple(self.source_ids), self._spec.groups
            )
        return self._labels

    def _label_meta(self, metas: list[np.ndarray] | np.ndarray) -> np.ndarray:
        """The ``meta`` column of the label table from per-file arrays (raw) or cache rows."""
        return np.stack(metas) if isinstance(metas, list) else metas

    # -- samples ----------------------------------------------------------------------------------

    def _read(self, index: int) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
        """(panels uint8 (16, S, S) file order, target, meta, meta_target) of sample ``index``."""
        if self._cache is not None:
            row = int(self._rows[index])
            c = self._cache
            return c.panels(row), int(c.targets[row]), c.meta[row], c.meta_target[row]
        record = self._spec.load(self._files[index].path)
        try:
            panels = resize_panels(record.panels, self.image_size, self.resize)
        except ValueError as error:
            raise DataFormatError(f"{self._files[index].path}: {error}") from None
        return panels, record.target, record.meta, record.meta_target

    def _sparse(self, meta: np.ndarray) -> np.ndarray:
        """float32 (R,) sparse label of one ``meta`` array (validates it)."""
        raise NotImplementedError

    def _sparse_batch(self, meta: np.ndarray) -> np.ndarray:
        """float32 (N, R) sparse labels of a stack of validated ``meta`` arrays."""
        raise NotImplementedError

    def _sparse_of(self, index: int, meta: np.ndarray) -> np.ndarray:
        if self._cache is None:
            return self._sparse(meta)
        # Cached rows were validated when the cache was built: encode them all at once, vectorised.
        if self._sparse_table is None:
            self._sparse_table = self._sparse_batch(self._cache.meta[self._rows])
        return self._sparse_table[index].copy()

    def _preserve_position(self, meta: np.ndarray) -> bool:
        return rules.requires_position_preserving(meta)

    def _apply_transform(self, panels: np.ndarray, preserve: bool) -> np.ndarray:
        out = self.transform(panels, preserve)
        if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != panels.shape:
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise TypeError(f"transform must return uint8 {panels.shape}, got {got}")
        return out

    def set_epoch(self, epoch: int) -> None:
        """The epoch plain integer keys draw their answer order and augmentation for (like
        ``DistributedSampler.set_epoch``); ``(epoch, index)`` keys name it themselves."""
        if int(epoch) < 0:
            raise ValueError(f"set_epoch: epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        """Sample ``index``, or ``(epoch, index)``. Its random parts (the ``"random"`` answer order and the
        transform, when it has ``reseed``) are pure functions of ``(seed, epoch, index)``
        (``rpm_lib.data.seeding``): the same in any DataLoader worker, resumed run or machine."""
        epoch, index = (int(key[0]), int(key[1])) if isinstance(key, tuple) else (self.epoch, int(key))
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} problems")
        index %= len(self)
        panels, target, meta, meta_target = self._read(index)
        source_id = self.source_ids[index]
        perm = self.answer_order.permutation(source_id, epoch, index)
        if perm is not None:
            panels, target = apply_permutation(panels, target, perm)
        if self.transform is not None:
            if hasattr(self.transform, "reseed"):
                self.transform.reseed(derive_seed(self.seed, "augment", epoch, index))
            preserve = self._preserve_position(meta)
            views = [self._apply_transform(panels.copy() if self.num_views > 1 else panels, preserve) for _ in range(self.num_views)]
        else:
            views = [panels] * self.num_views
        stacked = views[0] if self.num_views == 1 else np.stack(views)
        return {
            "panels": torch.from_numpy(np.ascontiguousarray(stacked)),
            "target": torch.tensor(target, dtype=torch.int64),
            "rules_dense": torch.from_numpy(meta_target.astype(np.float32)),
            "rules_sparse": torch.from_numpy(self._sparse_of(index, meta)),
            "configuration": int(self.configuration_indices[index]),
            "index": index,
            "source_id": source_id,
        }

    def __repr__(self) -> str:
        source = "cache" if self.from_cache else "raw"
        return (
            f"{type(self).__name__}(root={str(self.root)!r}, split={self.split!r}, {len(self)} problems, {source}, "
            f"image_size={self.image_size}, rule_encoding={self.rule_encoding!r}, answer_order={self.answer_order.mode!r})"
        )

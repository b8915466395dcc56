"""``RavenDataset``: RAVEN / I-RAVEN (and ``rpm-generate`` output) from a raw folder or a cache."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rpm_lib import rules
from rpm_lib.data.dataset import RpmDataset, Transform
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.raw_files import find_raven_files, resolve_configurations
from rpm_lib.data.validation import stack_raven_meta
from rpm_lib.rule_encodings import sparse_rule_encoding


class RavenDataset(RpmDataset):
    """RAVEN / I-RAVEN problems of one split; also raven-datasets' Attributeless-I-RAVEN and I-RAVEN-Mesh.

    Args:
        root: raw folder ``<root>/<configuration>/RAVEN_<k>_<split>.npz`` or a cache made by
            ``rpm-data prepare`` (detected by its ``manifest.json``).
        split: ``"train"``, ``"val"`` or ``"test"``.
        configurations: folder or short names (default all 7); samples are ordered by configuration in this
            order, then by ``k``.
        image_size: panel side S in px (160 -> 80 by default; a cache serves only its own size).
        rule_encoding: ``"sparse38"`` (paper, default), ``"sparse40"`` (official MLCL layout) or
            ``"sparse45"`` (sparse38 plus the I-RAVEN-Mesh Mesh's Number/Position rule) for ``rules_sparse``;
            ``rules_dense`` (9, the file's ``meta_target``) is always present. sparse38 / sparse40 leave a
            Mesh out (``rpm_lib.rule_encodings``).
        answer_order: ``"random"`` / ``"fixed"`` / ``"none"``; default random for train, fixed otherwise.
        seed: seeds the answer order.
        transform: ``transform(panels uint8 (16, S, S), preserve_position) -> uint8 (16, S, S)``, once per view.
        num_views: V > 1 returns ``panels`` (V, 16, S, S), each view transformed independently.
        resize: ``"area"`` (default) or ``"stride"``.

    Raw files are validated when read (``load_raven_npz``); ``rpm-data prepare`` validates all of them.
    Attributes ``configuration_indices`` (int64 (N,)) and ``labels`` (``RpmLabels``) give labels without images.

    Files with an (8, 9) or a (12, 9) ``meta_matrix`` are read alike; a file whose rows 8..11 are non-zero is
    an I-RAVEN-Mesh problem. ``labels.meta`` is (N, 12, 9) when the dataset holds a Mesh problem (problems
    without one get zero rows 8..11) and (N, 8, 9) otherwise; one dataset may mix the two. A sample never
    contains ``meta_answer_mods`` or anything computed from it.

    Raises:
        DataFormatError: missing / misnamed folders or files, unknown configuration, bad file content,
        incompatible cache.
    """

    kind = "raven"

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        configurations: Sequence[str] | str | None = None,
        image_size: int = 80,
        rule_encoding: str = "sparse38",
        answer_order: str | None = None,
        seed: int = 0,
        transform: Transform | None = None,
        num_views: int = 1,
        resize: str = "area",
    ) -> None:
        self.rule_spec = sparse_rule_encoding(rule_encoding, "raven")
        folders = resolve_configurations(configurations)
        super().__init__(
            root, split, folders, lambda: find_raven_files(root, folders, [split]), image_size, rule_encoding,
            answer_order, seed, transform, num_views, resize,
        )

    @property
    def has_mesh(self) -> bool:
        """True when a problem of this dataset has an I-RAVEN-Mesh Mesh (reads ``labels``: for a raw folder
        the small members of every file, once)."""
        return self.labels.meta.shape[1] == rules.MESH_META_ROWS

    def _label_meta(self, metas: list[np.ndarray] | np.ndarray) -> np.ndarray:
        return stack_raven_meta(metas)

    @property
    def rule_dim(self) -> int:
        """Length of ``rules_sparse`` (38, 40 or 45)."""
        return self.rule_spec.width

    def _sparse(self, meta: np.ndarray) -> np.ndarray:
        try:
            return rules.raven_sparse(meta, self.rule_encoding)
        except ValueError as error:  # cached rows were validated; this guards hand-edited caches
            raise DataFormatError(f"{self.root}: {error}") from None

    def _sparse_batch(self, meta: np.ndarray) -> np.ndarray:
        try:
            return rules.raven_sparse_batch(meta, self.rule_encoding)
        except ValueError as error:
            raise DataFormatError(f"{self.root}: {error}") from None

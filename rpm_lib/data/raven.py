"""``RavenDataset``: RAVEN / I-RAVEN (and ``rpm-generate`` output) from a raw folder or a cache."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rpm_lib import rules
from rpm_lib.data.dataset import RpmDataset, Transform
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.raw_files import find_raven_files, resolve_configurations
from rpm_lib.rule_encodings import sparse_rule_encoding


class RavenDataset(RpmDataset):
    """RAVEN / I-RAVEN problems of one split.

    Args:
        root: raw folder ``<root>/<configuration>/RAVEN_<k>_<split>.npz`` or a cache made by
            ``rpm-data prepare`` (detected by its ``manifest.json``).
        split: ``"train"``, ``"val"`` or ``"test"``.
        configurations: folder or short names (default all 7); samples are ordered by configuration in this
            order, then by ``k``.
        image_size: panel side S in px (160 -> 80 by default; a cache serves only its own size).
        rule_encoding: ``"sparse38"`` (paper, default) or ``"sparse40"`` (official MLCL layout) for
            ``rules_sparse``; ``rules_dense`` (9) is always present.
        answer_order: ``"random"`` / ``"fixed"`` / ``"none"``; default random for train, fixed otherwise.
        seed: seeds the answer order.
        transform: ``transform(panels uint8 (16, S, S), preserve_position) -> uint8 (16, S, S)``, once per view.
        num_views: V > 1 returns ``panels`` (V, 16, S, S), each view transformed independently.
        resize: ``"area"`` (default) or ``"stride"``.

    Raw files are validated when read (``load_raven_npz``); ``rpm-data prepare`` validates all of them.
    Attributes ``configuration_indices`` (int64 (N,)) and ``labels`` (``RpmLabels``) give labels without images.

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
    def rule_dim(self) -> int:
        """Length of ``rules_sparse`` (38 or 40)."""
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

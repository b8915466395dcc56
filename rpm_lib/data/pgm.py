"""``PgmDataset``: DeepMind's PGM (Procedurally Generated Matrices) from a raw folder or a cache."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rpm_lib import rules
from rpm_lib.data.dataset import RpmDataset, Transform
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.raw_files import check_regime, find_pgm_files
from rpm_lib.rule_encodings import sparse_rule_encoding



class PgmDataset(RpmDataset):
    """PGM problems of one regime and split.

    Args:
        root: folder with ``PGM_<regime>_<split>_<id>.npz`` (directly or in ``<root>/<regime>/``), or a cache
            made by ``rpm-data prepare --kind pgm``.
        regime: one of ``rules.PGM_REGIMES``.
        split: ``"train"``, ``"val"`` or ``"test"``.
        image_size: panel side S (160 -> 80 by default).
        rule_encoding: ``"sparse50"`` (official layout, ``rules.pgm_sparse``); ``rules_dense`` (12) is always present.
        answer_order, seed, transform, num_views, resize: as for ``RavenDataset``. ``resize="stride"``
            reproduces the official MLCL code's ``[:, ::2, ::2]`` subsampling.

    The stored (160, 160, 16) buffer is reshaped (not transposed) to (16, 160, 160) and cast to uint8.
    ``transform``'s ``preserve_position`` is True when a triple has progression on position.
    Sample key ``configuration`` is the regime index in ``rules.PGM_REGIMES``.
    """

    kind = "pgm"

    def __init__(
        self,
        root: str | Path,
        regime: str = "neutral",
        split: str = "train",
        image_size: int = 80,
        rule_encoding: str = "sparse50",
        answer_order: str | None = None,
        seed: int = 0,
        transform: Transform | None = None,
        num_views: int = 1,
        resize: str = "area",
    ) -> None:
        self.rule_spec = sparse_rule_encoding(rule_encoding, "pgm")
        self.regime = check_regime(regime)
        super().__init__(
            root, split, [regime], lambda: find_pgm_files(root, [regime], [split]), image_size, rule_encoding,
            answer_order, seed, transform, num_views, resize,
        )

    @property
    def rule_dim(self) -> int:
        """Length of ``rules_sparse`` (50)."""
        return self.rule_spec.width

    def _sparse(self, meta: np.ndarray) -> np.ndarray:
        try:
            return rules.pgm_sparse(meta)
        except ValueError as error:
            raise DataFormatError(f"{self.root}: {error}") from None

    def _sparse_batch(self, meta: np.ndarray) -> np.ndarray:
        return rules.pgm_sparse_batch(meta)

    def _preserve_position(self, meta: np.ndarray) -> bool:
        return rules.pgm_requires_position_preserving(meta)

"""Helpers for the data-layer tests: synthetic PGM files and small raw RAVEN folders in tmp_path."""
from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from rpm_lib import rules


def pgm_structure(triples: Sequence[tuple[str, str, str]], dtype=np.int64) -> np.ndarray:
    """(4, 12) relation_structure_encoded for (object, attribute, relation) triples."""
    out = np.zeros((4, 12), dtype=dtype)
    for i, (o, a, r) in enumerate(triples):
        out[i, rules.PGM_OBJECTS.index(o)] = 1
        out[i, 2 + rules.PGM_ATTRIBUTES.index(a)] = 1
        out[i, 7 + rules.PGM_RELATIONS.index(r)] = 1
    return out


def pgm_panels(seed: int, side: int = 160) -> np.ndarray:
    """uint8 (16, side, side): panel p is a distinct random pattern (so reshape vs transpose differ)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(16, side, side), dtype=np.uint8)


def write_pgm(
    path: Path,
    panels: np.ndarray,
    target: int = 3,
    triples: Sequence[tuple[str, str, str]] = (("shape", "size", "progression"),),
    image_dtype=np.uint8,
    **overrides,
) -> Path:
    """Write a PGM-style .npz: ``image`` declared (H, W, 16) but panel-major in memory, like the release."""
    structure = pgm_structure(triples)
    arrays = {
        "image": panels.astype(image_dtype).reshape(panels.shape[1], panels.shape[2], 16),
        "target": np.array(target, dtype=np.int64),
        "relation_structure_encoded": structure,
        "meta_target": structure.max(axis=0).astype(np.int8),
        "relation_structure": np.array([[o.encode(), a.encode(), r.encode()] for o, a, r in triples], dtype="S16"),
    }
    arrays.update(overrides)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


@pytest.fixture
def make_pgm_root(tmp_path: Path) -> Callable[..., Path]:
    """Build ``<tmp>/pgm/<regime>/PGM_<regime>_<split>_<id>.npz`` files; returns the root."""

    def make(regime: str = "neutral", counts: dict[str, int] | None = None, in_subfolder: bool = True) -> Path:
        root = tmp_path / "pgm"
        folder = root / regime if in_subfolder else root
        counts = counts or {"train": 4, "val": 2, "test": 2}
        seed = 0
        for split, n in counts.items():
            for file_id in range(n):
                seed += 1
                triples = [("shape", "position", "progression")] if file_id % 2 else [("line", "color", "XOR"), ("shape", "type", "OR")]
                write_pgm(folder / f"PGM_{regime}_{split}_{file_id}.npz", pgm_panels(seed), target=seed % 8, triples=triples)
        return root

    return make


@pytest.fixture
def make_raven_root(tmp_path: Path, iraven_reference: Path) -> Callable[..., Path]:
    """Copy reference I-RAVEN files into ``<tmp>/<name>/<configuration>/`` (few files keep tests fast)."""

    def make(name: str = "raven", configurations: Sequence[str] = rules.CONFIGURATIONS, ks: Sequence[int] = range(10)) -> Path:
        root = tmp_path / name
        for configuration in configurations:
            (root / configuration).mkdir(parents=True)
            for source in sorted((iraven_reference / configuration).glob("RAVEN_*.npz")):
                if int(source.stem.split("_")[1]) in ks:
                    shutil.copyfile(source, root / configuration / source.name)
        return root

    return make


def rewrite_npz(path: Path, **changes) -> Path:
    """Rewrite an .npz with some members replaced (value) or removed (None)."""
    arrays = dict(np.load(path))
    for key, value in changes.items():
        if value is None:
            arrays.pop(key, None)
        else:
            arrays[key] = value
    np.savez(path, **arrays)
    return path


@pytest.fixture
def rewrite() -> Callable[..., Path]:
    return rewrite_npz


class PgmHelpers:
    """The module-level PGM helpers, handed to tests as a fixture (conftest modules are not importable)."""

    structure = staticmethod(pgm_structure)
    panels = staticmethod(pgm_panels)
    write = staticmethod(write_pgm)


@pytest.fixture
def pgm() -> type[PgmHelpers]:
    return PgmHelpers

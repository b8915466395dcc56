"""Fixtures of the training tests: a tiny generated I-RAVEN and a factory of tiny configs."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rpm_lib.training.config import TrainConfig

#: Problems per configuration in the generated set: the minimum that gives every split (6 / 2 / 2).
TINY_NUM_PER_CONFIG = 10


@pytest.fixture(scope="session")
def tiny_iraven(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A balanced I-RAVEN of 10 problems per configuration (42 train / 14 val / 14 test), made once per session
    through the training package's own ``generate=true`` path."""
    from rpm_lib.training.generation import ensure_generated

    root = tmp_path_factory.mktemp("tiny_iraven")
    config = TrainConfig(data_root=str(root), generate=True, generate_num_per_config=TINY_NUM_PER_CONFIG,
                         generate_seed=3, progress_bar=False)
    assert ensure_generated(config)
    return root


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Training tests run single-threaded: cheaper on the shared 2-core machine and bit-reproducible."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tiny_config(tiny_iraven: Path, tmp_path: Path) -> Callable[..., TrainConfig]:
    """``make(**fields)``: a config for 2-step stages at batch 2 on the tiny set, run folder in tmp_path."""

    def make(**fields: Any) -> TrainConfig:
        values: dict[str, Any] = dict(
            run_dir=str(tmp_path / "run"), data_root=str(tiny_iraven), batch_size=2, max_epochs=1, max_steps=2,
            progress_bar=False, limit_val_batches=1, limit_test_batches=1, max_val_samples=2, max_test_samples=2,
            encoder="scl",
        )
        values.update(fields)
        return TrainConfig(**values)

    return make


@pytest.fixture(scope="session")
def tiny_pgm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic PGM-format files (random pixels, valid labels) for one regime: 6 train / 2 val / 3 test."""
    import numpy as np

    from rpm_lib import rules

    regime = "interpolation"
    root = tmp_path_factory.mktemp("tiny_pgm")
    rng = np.random.default_rng(0)
    triples = [[("shape", "size", "progression")], [("line", "color", "XOR"), ("shape", "type", "OR")]]
    for split, count in (("train", 6), ("val", 2), ("test", 3)):
        for file_id in range(count):
            structure = np.zeros((4, 12), dtype=np.int64)
            for row, (obj, attribute, relation) in enumerate(triples[file_id % 2]):
                structure[row, rules.PGM_OBJECTS.index(obj)] = 1
                structure[row, 2 + rules.PGM_ATTRIBUTES.index(attribute)] = 1
                structure[row, 7 + rules.PGM_RELATIONS.index(relation)] = 1
            panels = rng.integers(0, 256, size=(16, 160, 160), dtype=np.uint8)
            np.savez(root / f"PGM_{regime}_{split}_{file_id}.npz",
                     image=panels.reshape(160, 160, 16),  # the release's (H, W, 16) declaration, panel-major bytes
                     target=np.array(file_id % 8, dtype=np.int64), relation_structure_encoded=structure,
                     meta_target=structure.max(axis=0).astype(np.int8))
    return root

"""Shared fixtures: the original generators' reference files (outside the repo, in ``../shared/reference-data``),
a cache made by ``rpm-generate --cache-size`` and a training run stopped mid-way, each used by tests of several
folders."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rpm_lib.training.config import TrainConfig

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

REPO_ROOT = Path(__file__).resolve().parents[1]

#: The test files that take longest on a 2-core machine (`pytest --durations=40`: the real SLURM's requeue test waits
#: on 1-minute task limits; the campaign, GPU-check and demo dry runs train several tiny runs), longest first.
#: ``make test`` runs the suite on two processes, one file per process at a time (pytest-xdist, ``--dist
#: loadfile``): these start first, so that their waits overlap the many short files instead of ending the suite.
LONGEST_FIRST = ("test_slurm.py", "test_campaign.py", "test_gpu_check.py", "test_demo.py", "test_training_ddp.py",
                 "test_notebooks_in_browser.py", "test_notebooks.py", "test_notebook_parameters.py",
                 "test_compile_scope.py", "test_training_run.py")


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist 3.x sends the files with the most tests first unless told not to (--no-loadscope-reorder): that
    # left the SLURM file's few long tests alone on one process at the end of the suite, 13 of its 36 minutes.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, move the files of :data:`LONGEST_FIRST` to the front (in that order); every file keeps
    its own tests' order, and a run on one process keeps pytest's order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


REFERENCE_DATA = Path(os.environ.get("RPM_REFERENCE_DATA", REPO_ROOT.parent / "shared" / "reference-data"))


def reference_root(dataset: str) -> Path:
    """Path of ``reference-data/<dataset>``, or skip the test with the reason when it is absent."""
    root = REFERENCE_DATA / dataset
    if not root.is_dir():
        pytest.skip(f"reference data not found at {root} (set RPM_REFERENCE_DATA or clone beside ../shared)")
    return root


@pytest.fixture
def iraven_reference() -> Path:
    return reference_root("I-RAVEN")


@pytest.fixture
def raven_reference() -> Path:
    return reference_root("RAVEN")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache generated with ``generated_caches.SETTINGS`` without interruption, to compare resumed, edited or
    damaged builds with byte for byte (tests of ``rpm-generate --cache-size`` and of ``rpm-data``)."""
    from generated_caches import SETTINGS
    from rpm_lib.generator.cache_writer import generate_cache

    out = tmp_path_factory.mktemp("reference") / "cache"
    generate_cache(out, **SETTINGS)
    return out


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> TrainConfig:
    """An MLCL run stopped in its second stage (linear): pre-training finished, linear's last.ckpt to resume from,
    history rows of both stages. Its config has ``resume=true``; each test copies the folder (:func:`copy_run`)."""
    import json

    import torch

    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.run import train

    root = tmp_path_factory.mktemp("stopped")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = TrainConfig(run_dir=str(root / "run"), data_root=str(root / "data"), generate=True,
                             generate_num_per_config=10, generate_seed=3, progress_bar=False, setup="mlcl",
                             encoder="scl", batch_size=4, max_epochs=1, linear_eval_epochs=1,
                             max_train_samples=8, max_val_samples=4, max_test_samples=4, image_size=32,
                             limit_val_batches=1, limit_test_batches=1)
        train(config)
    finally:
        torch.set_num_threads(previous)
    run_dir = Path(config.run_dir)
    progress = json.loads((run_dir / "progress.json").read_text())
    progress["status"] = "unfinished"
    progress["stages"]["linear"] = {"name": "linear", "completed": False, "global_step": 1}
    (run_dir / "progress.json").write_text(json.dumps(progress))
    (run_dir / "metrics.json").unlink()
    return TrainConfig(**{**config.to_dict(), "resume": True})


def copy_run(stopped: TrainConfig, tmp_path: Path, **fields) -> TrainConfig:
    """A copy of the stopped run's folder in ``tmp_path/run``, and its resume config there (with ``fields``)."""
    import shutil

    from rpm_lib.training.config import TrainConfig

    shutil.copytree(stopped.run_dir, tmp_path / "run")
    return TrainConfig(**{**stopped.to_dict(), "run_dir": str(tmp_path / "run"), **fields})

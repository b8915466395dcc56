"""Shared fixtures. Reference files live outside the repo, in ``../shared/reference-data``."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

REPO_ROOT = Path(__file__).resolve().parents[1]
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

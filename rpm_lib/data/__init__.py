"""RAVEN / I-RAVEN / PGM readers and the memory-mapped resize cache.

Main entry points::

    from rpm_lib.data import RavenDataset, PgmDataset, prepare_cache, DataFormatError

    train = RavenDataset("data/i-raven", "train")            # raw folder, 160 -> 80 px on the fly
    prepare_cache("data/i-raven", "data/i-raven-80")          # or: rpm-data prepare data/i-raven --out data/i-raven-80
    train = RavenDataset("data/i-raven-80", "train")         # same API, from the cache

The dataset classes import torch; they are loaded lazily so that ``rpm-data`` and cache workers start fast.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpm_lib.data.answer_order import ANSWER_ORDERS, AnswerOrder, apply_permutation, default_answer_order, fixed_permutation
from rpm_lib.data.cache import CacheReader, is_cache, prepare_cache, read_manifest
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.raw_files import SPLITS, RawFile, find_pgm_files, find_raven_files
from rpm_lib.data.resize import RESIZE_METHODS, resize_panels
from rpm_lib.data.validation import RpmRecord, load_pgm_npz, load_raven_npz

if TYPE_CHECKING:
    from rpm_lib.data.dataset import RpmDataset, RpmLabels
    from rpm_lib.data.pgm import PgmDataset
    from rpm_lib.data.raven import RavenDataset

_LAZY = {
    "RavenDataset": "rpm_lib.data.raven",
    "PgmDataset": "rpm_lib.data.pgm",
    "RpmDataset": "rpm_lib.data.dataset",
    "RpmLabels": "rpm_lib.data.dataset",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rpm_lib.data' has no attribute {name!r}")


__all__ = [
    "ANSWER_ORDERS",
    "AnswerOrder",
    "CacheReader",
    "DataFormatError",
    "PgmDataset",
    "RESIZE_METHODS",
    "RavenDataset",
    "RawFile",
    "RpmDataset",
    "RpmLabels",
    "RpmRecord",
    "SPLITS",
    "apply_permutation",
    "default_answer_order",
    "find_pgm_files",
    "find_raven_files",
    "fixed_permutation",
    "is_cache",
    "load_pgm_npz",
    "load_raven_npz",
    "prepare_cache",
    "read_manifest",
    "resize_panels",
]

"""The memory-mapped cache of resized problems (``rpm-data prepare``, ``rpm-generate --cache-size``).

One module per responsibility: ``format`` (the files of a cache, its dataset kinds and manifest, and the check of a
finished cache; its docstring gives the layout), ``plan`` (what a cache is built from), ``partial`` (an interrupted
build), ``build`` (building and resuming), ``prepare`` (a raw folder into a cache) and ``read`` (``CacheReader``).
The public names are re-exported here: ``from rpm_lib.data.cache import prepare_cache``.
"""
from __future__ import annotations

from rpm_lib.data.cache.build import build_cache, cache_destination, check_cache_fits
from rpm_lib.data.cache.format import (CACHE_FORMAT, CACHE_VERSION, JOURNAL, KINDS, MANIFEST, ON_ERROR, PLAN, SKIPPED,
                                       check_cache, is_cache, kind_spec, read_manifest)
from rpm_lib.data.cache.plan import names_sha256
from rpm_lib.data.cache.prepare import FileRecords, prepare_cache
from rpm_lib.data.cache.read import CacheReader

__all__ = [
    "CACHE_FORMAT", "CACHE_VERSION", "JOURNAL", "KINDS", "MANIFEST", "ON_ERROR", "PLAN", "SKIPPED", "CacheReader",
    "FileRecords", "build_cache", "cache_destination", "check_cache", "check_cache_fits", "is_cache", "kind_spec",
    "names_sha256", "prepare_cache", "read_manifest",
]

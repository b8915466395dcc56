"""Names and discovery of raw dataset files.

RAVEN / I-RAVEN (released layout, also written by ``rpm-generate``)::

    <root>/<configuration>/RAVEN_<k>_<split>.npz      (+ .xml, not read here)

PGM (DeepMind release; one folder per regime, or all files in one folder)::

    <root>/<regime>/PGM_<regime>_<split>_<id>.npz     or     <root>/PGM_<regime>_<split>_<id>.npz
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rpm_lib import rules
from rpm_lib.data.errors import DataFormatError

SPLITS: tuple[str, ...] = ("train", "val", "test")
RAVEN_FILE_PATTERN = re.compile(r"^RAVEN_(?P<id>\d+)_(?P<split>train|val|test)\.npz$")
PGM_FILE_PATTERN = re.compile(r"^PGM_(?P<regime>[A-Za-z.]+)_(?P<split>train|val|test)_(?P<id>\d+)\.npz$")
#: Files whose presence marks a folder as an rpm_lib cache (complete or being built); never raw data.
CACHE_MARKERS: tuple[str, ...] = ("manifest.json", "journal.jsonl", "plan.json", "panels.npy")


@dataclass(frozen=True)
class RawFile:
    """One raw problem file.

    Attributes:
        path: the .npz file.
        group: configuration folder name (RAVEN) or regime (PGM).
        file_id: ``k`` of ``RAVEN_<k>_<split>`` / ``id`` of ``PGM_<regime>_<split>_<id>``.
        split: ``"train"``, ``"val"`` or ``"test"``.
        source_id: stable name, ``"center_single/RAVEN_12_train"`` or ``"PGM_neutral_train_12"``.
    """

    path: Path
    group: str
    file_id: int
    split: str
    source_id: str


def raven_source_id(configuration: str, file_id: int, split: str) -> str:
    return f"{configuration}/RAVEN_{file_id}_{split}"


def pgm_source_id(regime: str, file_id: int, split: str) -> str:
    return f"PGM_{regime}_{split}_{file_id}"


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise DataFormatError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    return split


def check_regime(regime: str) -> str:
    if regime not in rules.PGM_REGIMES:
        raise DataFormatError(f"unknown PGM regime {regime!r}; expected one of {list(rules.PGM_REGIMES)}")
    return regime


def resolve_configurations(configurations: Sequence[str] | str | None) -> list[str]:
    """Folder names for folder or short names (None: all 7, in ``rules.CONFIGURATIONS`` order)."""
    try:
        return rules.resolve_configurations(configurations)
    except ValueError as error:
        raise DataFormatError(str(error)) from None


def _check_root(root: Path) -> None:
    if root.is_dir():
        if _is_cache(root):  # not raw data: a training cache is used as data_root as it is, never prepared again
            raise DataFormatError(f"{root}: is a training cache, not a folder of problem files; use it as it is "
                                  "(data_root=...), or prepare the raw folder it was made from")
        return
    partial = root.with_name(root.name + ".partial")
    if partial.is_dir():
        raise DataFormatError(
            f"{root}: folder not found; an interrupted cache build exists at {partial}: rerun `rpm-data prepare` to finish it"
        )
    raise DataFormatError(f"{root}: dataset folder not found")


def _is_cache(folder: Path) -> bool:
    """A cache (complete, or a ``<out>.partial`` build) kept inside a dataset folder is not raw data."""
    return folder.name.endswith(".partial") or any((folder / marker).exists() for marker in CACHE_MARKERS)


def _subfolders(root: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def find_raven_files(
    root: str | Path, configurations: Sequence[str] | None = None, splits: Sequence[str] = SPLITS
) -> list[RawFile]:
    """Raw RAVEN / I-RAVEN files, ordered by configuration (given order) then by ``k``.

    Args:
        root: dataset folder holding one subfolder per configuration.
        configurations: folder or short names; every one must exist. ``None``: every configuration folder
            present (at least one; a non-hidden subfolder with another name is an error).
        splits: splits to keep.

    Raises:
        DataFormatError: missing root or configuration folder, unknown folder, a .npz with a name other than
        ``RAVEN_<k>_<split>.npz``, duplicate ``k``, or no file for a requested configuration and split.
    """
    root = Path(root)
    _check_root(root)
    splits = [check_split(s) for s in splits]
    if configurations is None:
        present = [name for name in _subfolders(root) if not _is_cache(root / name)]
        unknown = [name for name in present if name not in rules.CONFIGURATIONS]
        if unknown:
            raise DataFormatError(
                f"{root}: unknown configuration folder(s) {unknown}; expected names from {list(rules.CONFIGURATIONS)}"
            )
        folders = [c for c in rules.CONFIGURATIONS if c in present]
        if not folders:
            raise DataFormatError(
                f"{root}: no configuration folders (expected subfolders named like {list(rules.CONFIGURATIONS)})"
            )
    else:
        folders = resolve_configurations(configurations)
    files: list[RawFile] = []
    for configuration in folders:
        folder = root / configuration
        if not folder.is_dir():
            raise DataFormatError(
                f"{folder}: configuration folder not found; {root} has subfolders {_subfolders(root)}"
            )
        found: dict[int, RawFile] = {}
        for entry in os.scandir(folder):
            if not entry.name.endswith(".npz"):
                continue
            match = RAVEN_FILE_PATTERN.match(entry.name)
            if match is None:
                raise DataFormatError(f"{folder / entry.name}: unexpected file name (expected RAVEN_<k>_<train|val|test>.npz)")
            k, split = int(match["id"]), match["split"]
            if k in found:
                raise DataFormatError(f"{folder}: problem id {k} appears twice ({found[k].path.name}, {entry.name})")
            found[k] = RawFile(folder / entry.name, configuration, k, split, raven_source_id(configuration, k, split))
        if not found:
            raise DataFormatError(f"{folder}: no RAVEN_<k>_<split>.npz files")
        kept = [found[k] for k in sorted(found) if found[k].split in splits]
        if not kept:
            raise DataFormatError(f"{folder}: no files for split(s) {splits} (found {len(found)} other files)")
        files.extend(kept)
    return files


def find_pgm_files(
    root: str | Path, regimes: Sequence[str] | None = None, splits: Sequence[str] = SPLITS
) -> list[RawFile]:
    """Raw PGM files, ordered by regime (given order, else ``rules.PGM_REGIMES`` order) then by id.

    Looks in ``<root>/<regime>/`` when that folder exists, else in ``<root>``; with ``regimes=None`` in
    ``<root>`` and every non-hidden subfolder.

    Raises:
        DataFormatError: missing root, unknown regime, a .npz named otherwise than
        ``PGM_<regime>_<split>_<id>.npz``, duplicates, or no file for a requested regime and split.
    """
    root = Path(root)
    _check_root(root)
    splits = [check_split(s) for s in splits]
    if regimes is None:
        folders = [root] + [root / name for name in _subfolders(root) if not _is_cache(root / name)]
    else:
        regimes = [check_regime(r) for r in ([regimes] if isinstance(regimes, str) else regimes)]
        folders = sorted({root / r if (root / r).is_dir() else root for r in regimes})
    found: dict[tuple[str, str, int], RawFile] = {}
    for folder in folders:
        for entry in os.scandir(folder):
            if not entry.name.endswith(".npz"):
                continue
            match = PGM_FILE_PATTERN.match(entry.name)
            if match is None:
                raise DataFormatError(f"{folder / entry.name}: unexpected file name (expected PGM_<regime>_<train|val|test>_<id>.npz)")
            regime, split, file_id = match["regime"], match["split"], int(match["id"])
            if regime not in rules.PGM_REGIMES:
                raise DataFormatError(f"{folder / entry.name}: unknown regime {regime!r}; expected one of {list(rules.PGM_REGIMES)}")
            key = (regime, split, file_id)
            if key in found:
                raise DataFormatError(f"{folder / entry.name}: duplicate of {found[key].path}")
            found[key] = RawFile(folder / entry.name, regime, file_id, split, pgm_source_id(regime, file_id, split))
    wanted = list(regimes) if regimes is not None else [r for r in rules.PGM_REGIMES if any(k[0] == r for k in found)]
    if not wanted:
        raise DataFormatError(f"{root}: no PGM_<regime>_<split>_<id>.npz files (looked in {[str(f) for f in folders]})")
    files: list[RawFile] = []
    for regime in wanted:
        kept = sorted((f for k, f in found.items() if k[0] == regime and k[1] in splits), key=lambda f: (SPLITS.index(f.split), f.file_id))
        if not kept:
            raise DataFormatError(f"{root}: no PGM files for regime {regime!r} and split(s) {splits}")
        files.extend(kept)
    return files

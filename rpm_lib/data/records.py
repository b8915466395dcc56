"""The records that describe a data folder: their file names, and how they are read and written.

A folder written by ``rpm-generate`` holds ``generator.json`` (:data:`SETTINGS_FILE`: the settings its problems
were made with -- seed, candidate mode, regime, split proportions, generator version and the OpenCV that drew
them) and ``regime.json`` (:data:`REGIME_FILE`: its regime, for people and loaders). A training cache holds
``manifest.json`` (:data:`MANIFEST`), written last, whose presence marks the cache complete (its layout:
``rpm_lib.data.cache``). Which OpenCV made the pixels is a key of two of these records
(``rpm_lib.data.opencv_version``); the per-problem content hashes have their own record
(``rpm_lib.data.problem_hashes``).

The generator builds the content of ``generator.json`` and ``regime.json`` from its regime
(``rpm_lib.generator.settings``); this module only names, writes and reads them, so that the data layer and
training can read a folder's records without the generator. Every reader checks what it reads: these files come
from shared folders, and a damaged or hand-edited one is refused with one line naming it.
"""
from __future__ import annotations

import os
from pathlib import Path

from rpm_lib.json_files import read_object, shown_value, write_object

#: Written into a generated folder: the settings its problems were made with (seed, mode, regime, split
#: proportions, generator version, OpenCV version).
SETTINGS_FILE = "generator.json"
#: Written into a generated folder: its regime (``rpm_lib.generator.settings.regime_record`` gives the content).
REGIME_FILE = "regime.json"
#: Written last into a finished cache: its presence marks the cache complete.
MANIFEST = "manifest.json"

#: generator.json's record of how a balanced Mesh folder draws its distractors' Mesh line counts
#: (``rpm_lib.generator.mesh_balance``); Mesh folders made before it have raven-datasets' uniform draw.
MESH_DRAW_KEY = "mesh_number_draw"
MESH_DRAW = "answer-blind-v1"

# What a settings record written before regimes existed means for the keys it lacks: such a generator could
# only write plain I-RAVEN with the 6/2/2 split.
_SETTINGS_BEFORE_REGIMES = {"regime": "I-RAVEN", "held_out": {}, "mesh": False, "val": 2, "test": 2}

#: The types of ``generator.json``'s fields, as the generator writes them (a hand-edited ``"seed": "3"`` is refused
#: naming the field, not compared as another seed).
_SETTINGS_TYPES = {"seed": int, "mode": str, "regime": str, "held_out": dict, "mesh": bool, "val": int, "test": int,
                   MESH_DRAW_KEY: str, "opencv": str}

#: The fields ``regime.json`` and ``generator.json`` both record, which must agree.
SHARED_FIELDS = ("regime", "held_out", "mesh", "seed", "mode", "val", "test")


class GeneratorSettingsError(RuntimeError):
    """The output folder holds problems of another seed, mode, regime or split (or an unreadable settings record)."""


def write_settings(root: str | os.PathLike, record: dict) -> None:
    """Write ``record`` as ``root``'s ``generator.json`` (atomically, indented by one space)."""
    write_object(Path(root) / SETTINGS_FILE, record, indent=1)


def read_settings(path: str | os.PathLike) -> dict:
    """``generator.json``'s settings, with what a record written by an earlier rpm_lib means for the keys it
    lacks (before regimes: plain I-RAVEN 6/2/2; a Mesh folder before the answer-blind draw: raven-datasets' draw).

    Raises:
        GeneratorSettingsError: not a JSON object, or a field of another type than the generator writes (one line
            naming the file and the field).
    """
    found = {**_SETTINGS_BEFORE_REGIMES, **read_object(Path(path), GeneratorSettingsError, fields=_SETTINGS_TYPES)}
    if found.get("mesh") and MESH_DRAW_KEY not in found:
        found[MESH_DRAW_KEY] = "raven-datasets (made before the answer-blind draw)"
    return found


def write_regime_file(root: str | os.PathLike, record: dict) -> None:
    """Write ``record`` as ``root``'s ``regime.json`` (atomically, indented by one space)."""
    write_object(Path(root) / REGIME_FILE, record, indent=1)


def regime_fields(path: Path | None, data: dict | None = None) -> dict | None:
    """The shared fields of a regime record (read from ``path`` unless ``data`` is given); None when unreadable
    (missing, damaged, not a JSON object, larger or deeper than a record: ``rpm_lib.json_files.read_object``)."""
    if data is None:
        try:
            data = read_object(path, _Unreadable)
        except (OSError, _Unreadable):
            return None
    if not isinstance(data, dict):
        return None
    return {key: data.get(key) for key in SHARED_FIELDS}


class _Unreadable(ValueError):
    """A record that ``read_object`` refuses (reworded by the caller)."""


def read_regime_file(root: str | os.PathLike) -> dict | None:
    """The content of ``root``'s ``regime.json``, or None when it has none; checked to be a JSON object that
    agrees with ``generator.json`` (when present) on regime, held-out groups, mesh, seed, mode and split
    proportions.

    What the regime itself means is checked where a regime is built from it
    (``rpm_lib.generator.regimes.Regime.from_json``), and whether the problem files agree with it by
    ``rpm_lib.data.validation.read_regime_record``.

    Raises:
        GeneratorSettingsError: one line naming the file and the disagreement.
    """
    root = Path(root)
    path = root / REGIME_FILE
    if not path.is_file():
        return None
    try:
        data = read_object(path, _Unreadable)
    except OSError as error:
        raise GeneratorSettingsError(f"{path} is not readable ({error.strerror or type(error).__name__})") from None
    except _Unreadable as error:
        # read_object's reason without its "<path>: " (and the parse error itself for text that is not JSON)
        reason = str(error).removeprefix(f"{path}: ")
        if reason.startswith("not valid JSON (") and reason.endswith(")"):
            reason = reason[len("not valid JSON ("):-1]
        raise GeneratorSettingsError(f"{path} is not readable JSON ({reason})") from None
    settings = root / SETTINGS_FILE
    if settings.is_file():
        found = read_settings(settings)
        differ = [f"{key} {shown_value(data.get(key), 40)} vs {shown_value(found.get(key), 40)}"
                  for key in SHARED_FIELDS if data.get(key) != found.get(key)]
        if differ:
            raise GeneratorSettingsError(f"{path}: disagrees with {settings} ({'; '.join(differ)}); one of them was "
                                         "edited or replaced: regenerate the folder")
    return data

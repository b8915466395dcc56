"""The settings of a generated folder: the content of its ``generator.json`` and ``regime.json``, built from a
regime (the files themselves are named, written and read by ``rpm_lib.data.records``), and the checks that refuse
to extend a folder with problems of other settings or of another OpenCV.
"""
from __future__ import annotations

import sys
from pathlib import Path

import rpm_lib.data.opencv_version as opencv_version
from rpm_lib.data.records import (MESH_DRAW, MESH_DRAW_KEY, REGIME_FILE, SETTINGS_FILE, GeneratorSettingsError,
                                  read_settings, regime_fields, write_regime_file, write_settings)
from rpm_lib.generator.regimes import Regime, resolve_regime


def regime_record(regime: Regime, seed: int, mode: str, val: int, test: int) -> dict:
    """The content of ``regime.json``: regime name, one-line description, held-out groups by name with their
    train rules (``{"Color": "Constant"}``), mesh flag, seed, candidate mode, val / test tenths, generator
    and version."""
    import rpm_lib

    return {**regime.to_json(), "seed": int(seed), "mode": mode, "val": val, "test": test,
            "train": 10 - val - test, "generator": "rpm_lib", "version": rpm_lib.__version__}


def generator_settings(seed: int, mode: str, regime: Regime, val: int, test: int) -> dict:
    """What decides a generated folder's problems besides their indices (``generator.json`` without the version):
    seed, candidate mode, regime name, held-out groups, mesh flag, val / test tenths, and for a balanced Mesh the
    line-count draw. Problems of two folders with equal settings are byte-identical index by index."""
    wanted = {"seed": int(seed), "mode": mode, "regime": regime.name, "held_out": regime.to_json()["held_out"],
              "mesh": regime.mesh, "val": val, "test": test}
    if regime.mesh and mode == "balanced":
        # The balanced Mesh draws its distractors' line counts answer-blind since this key exists; a Mesh folder
        # without it holds raven-datasets' draws, and extending it would mix the two.
        wanted[MESH_DRAW_KEY] = MESH_DRAW
    return wanted


def check_settings(root: Path, seed: int, mode: str, regime: Regime | None = None, val: int = 2,
                   test: int = 2) -> None:
    """Refuse to add problems of other settings to a folder; record the settings (and ``regime.json``) in a new one.

    Raises:
        GeneratorSettingsError: one line naming the settings that differ.
    """
    import rpm_lib

    regime = resolve_regime(regime)
    record = root / SETTINGS_FILE
    wanted = generator_settings(seed, mode, regime, val, test)
    regime_json = regime_record(regime, seed, mode, val, test)
    if record.is_file():
        found = read_settings(record)
        differ = {k: (found.get(k), v) for k, v in wanted.items() if found.get(k) != v}
        if differ:
            said = ", ".join(f"{k} {old!r} there, {new!r} asked" for k, (old, new) in differ.items())
            raise GeneratorSettingsError(f"{root}: holds problems generated with other settings ({said}); use the "
                                         "same settings to extend it, or another --out")
        if not (root / REGIME_FILE).is_file():  # a folder of an rpm_lib from before regime.json
            write_regime_file(root, regime_json)
        elif regime_fields(root / REGIME_FILE) != regime_fields(None, regime_json):
            # generator.json (just checked) says what the problems are; a truncated or edited regime.json must not
            # outlive the resume that could repair it.
            print(f"rpm-generate: note: {root / REGIME_FILE} did not match {SETTINGS_FILE}; rewritten from the "
                  "settings", file=sys.stderr)
            write_regime_file(root, regime_json)
        return
    if any(root.glob("*/RAVEN_*_*.npz")):
        print(f"rpm-generate: note: {root} has problems but no {SETTINGS_FILE} (made by an older rpm_lib); their "
              f"seed and mode cannot be checked, and no {REGIME_FILE} is written", file=sys.stderr)
        return
    write_regime_file(root, regime_json)
    write_settings(root, {**wanted, "generator": "rpm_lib", "version": rpm_lib.__version__,
                          opencv_version.KEY: opencv_version.current()})


def check_renderer(root: Path, writing: bool) -> None:
    """Refuse to add problems to a folder whose ``generator.json`` says another OpenCV rendered it: the two draw
    some pixels differently (``rpm_lib.data.opencv_version``), and one folder must not mix them. A finished folder
    (nothing to write) is only read, and a folder from before the record says nothing either way."""
    there, here = opencv_version.rendered_by(root), opencv_version.current()
    if writing and there is not None and there != here:
        raise GeneratorSettingsError(f"{root}: its problems were rendered with OpenCV {there}, and this OpenCV "
                                     f"({here}) draws some pixels differently; finish it with OpenCV {there}, or use "
                                     "another --out")

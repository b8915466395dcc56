"""Which OpenCV made a dataset's pixels (``rpm_lib.data.opencv_version``): recorded by the generator and the cache,
kept out of one folder's mixing, and named when a resumed run finds other pixels of the same problems.

Two OpenCV versions draw some edge pixels differently (4.14.0 against 5.0.0: 1.62 % of the campaign cache's pixels,
by at most 3 grey levels). Here "another OpenCV" is ``opencv_version.current`` patched to another string, and its
pixels are the cache's plus one grey level on some pixels.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.data import opencv_version
from rpm_lib.data.cache import prepare_cache
from rpm_lib.data.fingerprint import data_fingerprint, problems_fingerprint
from rpm_lib.generator.cache_writer import GeneratedRecords, generate_cache
from rpm_lib.data.records import GeneratorSettingsError
from rpm_lib.generator.writer import write_dataset
from rpm_lib.training.config import ConfigError
from rpm_lib.training.progress_record import ProgressRecord

OTHER = "0.0.0-other"


@pytest.fixture
def another_opencv(monkeypatch: pytest.MonkeyPatch):
    """Makes this process report another OpenCV version (the pixels it draws stay the same)."""
    def install() -> None:
        monkeypatch.setattr(opencv_version, "current", lambda: OTHER)
    return install


def _redraw(cache: Path) -> None:
    """What another OpenCV does to a cache: a few pixels one grey level apart, every label the same."""
    path = cache / "panels.npy"
    panels = np.load(path)
    flat = panels.reshape(-1)
    flat[::97] = np.where(flat[::97] < 255, flat[::97] + 1, flat[::97] - 1)
    np.save(path, panels)


def test_the_generator_and_both_caches_record_the_opencv_that_made_their_pixels(tmp_path, another_opencv):
    here = opencv_version.current()
    generate_cache(tmp_path / "generated", configurations=["Center"], count=2, size=16, progress=False)
    assert opencv_version.recorded(tmp_path / "generated") == {"rendered": here, "resized": here}
    write_dataset(tmp_path / "raw", configurations=["Center"], count=2, write_xml=False, progress=False)
    assert json.loads((tmp_path / "raw" / "generator.json").read_text())["opencv"] == here
    assert opencv_version.recorded(tmp_path / "raw") == {"rendered": here, "resized": None}
    another_opencv()  # files drawn by one OpenCV, resized by another
    prepare_cache(tmp_path / "raw", tmp_path / "prepared", 16, show_progress=False)
    made = opencv_version.recorded(tmp_path / "prepared")
    assert made == {"rendered": here, "resized": OTHER}
    assert opencv_version.describe(made) == f"rendered with OpenCV {here} and resized with OpenCV {OTHER}"
    assert opencv_version.describe({"rendered": OTHER, "resized": OTHER}) == f"rendered and resized with OpenCV {OTHER}"
    (tmp_path / "raw" / "generator.json").unlink()  # data from elsewhere (the official generators) say nothing
    assert opencv_version.recorded(tmp_path / "raw") == {"rendered": None, "resized": None}
    assert opencv_version.describe(opencv_version.recorded(tmp_path / "raw")) == "with an unrecorded OpenCV"


def test_the_problems_fingerprint_ignores_the_pixels_and_nothing_else(tmp_path):
    generate_cache(tmp_path / "cache", configurations=["Center", "L-R"], count=3, size=16, progress=False)
    fingerprint, problems = data_fingerprint(tmp_path / "cache"), problems_fingerprint(tmp_path / "cache")
    assert problems.startswith("sha256-problems-v1:")
    _redraw(tmp_path / "cache")
    assert data_fingerprint(tmp_path / "cache") != fingerprint
    assert problems_fingerprint(tmp_path / "cache") == problems
    targets = np.load(tmp_path / "cache" / "targets.npy")
    targets[0] = (targets[0] + 1) % 8  # another answer: other problems
    np.save(tmp_path / "cache" / "targets.npy", targets)
    assert problems_fingerprint(tmp_path / "cache") != problems
    write_dataset(tmp_path / "raw", configurations=["Center"], count=2, write_xml=False, progress=False)
    assert problems_fingerprint(tmp_path / "raw") is None  # labels and pixels share one file per problem


def test_a_raw_folder_drawn_by_another_opencv_is_read_but_never_extended(tmp_path, another_opencv):
    root = tmp_path / "raw"
    write_dataset(root, configurations=["Center"], count=2, write_xml=False, progress=False)
    here = opencv_version.current()
    another_opencv()
    summary = write_dataset(root, configurations=["Center"], count=2, write_xml=False, progress=False)
    assert summary["written"] == 0  # complete: nothing is drawn, nothing is mixed
    with pytest.raises(GeneratorSettingsError, match=rf"rendered with OpenCV {here}, and this OpenCV \({OTHER}\) "
                                                     "draws some pixels differently"):
        write_dataset(root, configurations=["Center"], count=3, write_xml=False, progress=False)
    assert len(list((root / "center_single").glob("*.npz"))) == 2


def test_a_cache_build_is_never_finished_by_another_opencv(tmp_path, monkeypatch, another_opencv, capsys):
    settings = dict(configurations=["Center"], count=10, size=16, progress=False, chunk_size=5)
    original = GeneratedRecords.__call__
    made = []

    def dies_at_the_seventh(self, file):
        if len(made) == 6:
            raise KeyboardInterrupt
        made.append(file)
        return original(self, file)

    monkeypatch.setattr(GeneratedRecords, "__call__", dies_at_the_seventh)
    out = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        generate_cache(out, **settings)
    monkeypatch.setattr(GeneratedRecords, "__call__", original)
    another_opencv()
    # One chunk of 5 was finished by the first OpenCV: thrown away, everything drawn again by the second.
    assert generate_cache(out, **settings) == {"total": 10, "skipped": 0, "written": 10}
    assert "discarding an interrupted build" in capsys.readouterr().err
    assert opencv_version.recorded(out) == {"rendered": OTHER, "resized": OTHER}
    # A finished cache is whole: asked again under a third OpenCV it is kept, and the difference is said.
    monkeypatch.setattr(opencv_version, "current", lambda: "0.0.0-third")
    assert generate_cache(out, **settings)["written"] == 0
    err = capsys.readouterr().err
    assert "complete and up to date" in err and f"rendered and resized with OpenCV {OTHER}" in err
    assert "0.0.0-third" in err


def test_a_resumed_run_names_the_opencv_when_only_the_pixels_differ(tmp_path, capsys):
    cache = tmp_path / "cache"
    generate_cache(cache, configurations=["Center", "O-IC"], count=3, size=16, progress=False)
    here = opencv_version.current()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    started = ProgressRecord(run_dir, {}, writer=True)
    fingerprint = started.check_data(cache)
    progress = started.progress
    assert progress["data_fingerprint"] == fingerprint and progress["data_problems"] == problems_fingerprint(cache)
    assert progress["data_opencv"] == {"rendered": here, "resized": here}

    redrawn = tmp_path / "redrawn"
    generate_cache(redrawn, configurations=["Center", "O-IC"], count=3, size=16, progress=False)
    _redraw(redrawn)
    manifest = json.loads((redrawn / "manifest.json").read_text())
    manifest["plan"]["opencv"] = {"rendered": OTHER, "resized": OTHER}
    (redrawn / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError) as refused:
        ProgressRecord(run_dir, json.loads(json.dumps(progress)), writer=True).check_data(redrawn)
    message = str(refused.value)
    assert "hold the problems this run started on, but other pixels" in message and "\n" not in message
    assert (f"pixels here rendered and resized with OpenCV {OTHER}, when the run started rendered and resized with "
            f"OpenCV {here}") in message
    assert "data_check=problems" in message

    accepting = ProgressRecord(run_dir, json.loads(json.dumps(progress)), writer=True, data_check="problems")
    assert accepting.check_data(redrawn) == data_fingerprint(redrawn)
    change, = accepting.progress["data_changes"]
    assert change["previous_fingerprint"] == fingerprint and change["data_opencv"]["rendered"] == OTHER
    assert accepting.progress["data_fingerprint"] == data_fingerprint(redrawn)
    assert "continuing on other pixels of the same problems" in capsys.readouterr().err

    # Other problems are refused whatever data_check says.
    targets = np.load(redrawn / "targets.npy")
    targets[0] = (targets[0] + 1) % 8
    np.save(redrawn / "targets.npy", targets)
    with pytest.raises(ConfigError, match="are not the data this run started on"):
        ProgressRecord(run_dir, json.loads(json.dumps(progress)), writer=True, data_check="problems").check_data(
            redrawn)


def test_a_run_from_before_the_record_gets_it_when_its_data_pass(tmp_path):
    cache = tmp_path / "cache"
    generate_cache(cache, configurations=["Center"], count=2, size=16, progress=False)
    fingerprint = data_fingerprint(cache)
    record = ProgressRecord(tmp_path, {"data_fingerprint": fingerprint}, writer=False)  # campaign slices 1-3
    record.check_data(cache)
    assert record.progress["data_problems"] == problems_fingerprint(cache)
    assert record.progress["data_opencv"]["rendered"] == opencv_version.current()
    # ... and, before that, other pixels cannot be told from other problems: refused as other data.
    _redraw(cache)
    with pytest.raises(ConfigError, match=r"not the data this run started on .*started with an unrecorded OpenCV"):
        ProgressRecord(tmp_path, {"data_fingerprint": fingerprint}, writer=False, data_check="problems").check_data(
            cache)

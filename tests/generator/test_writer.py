"""Files: released layout, keys, dtypes; atomic + resumable + deterministic set writing."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rpm_lib import rules
from rpm_lib.data import records
from rpm_lib.generator import writer
from rpm_lib.generator.labels import problem_labels
from rpm_lib.generator.xml_io import read_problem_xml

CONFIGURATION = "center_single"
SMALL = ["center_single", "in_distribute_four_out_center_single"]


def _tree(root: Path) -> dict[str, bytes]:
    """The problem files (inside the configuration folders; the settings record and lock file aside)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.parent != root}


def test_split_by_index_mod_10():
    assert [writer.split_of(k) for k in range(12)] == ["train"] * 6 + ["val"] * 2 + ["test"] * 2 + ["train"] * 2
    assert writer.problem_stem("r", "center_single", 17).as_posix() == "r/center_single/RAVEN_17_val"
    with pytest.raises(ValueError):
        writer.split_of(-1)


def test_split_proportions_in_tenths():
    assert [writer.split_of(k, val=0, test=10) for k in range(10)] == ["test"] * 10
    assert [writer.split_of(k, val=0, test=0) for k in range(10)] == ["train"] * 10
    assert [writer.split_of(k, val=1, test=3) for k in range(10)] == ["train"] * 6 + ["val"] + ["test"] * 3
    assert writer.problem_stem("r", "center_single", 13, val=0, test=10).as_posix() == "r/center_single/RAVEN_13_test"
    for val, test, message in [(6, 5, "at most 10 tenths"), (-1, 2, "val must be"), (2, 1.5, "test must be")]:
        with pytest.raises(ValueError, match=message):
            writer.split_of(0, val=val, test=test)


def test_written_problem_matches_the_reference_file_format(iraven_reference, tmp_path):
    for source in sorted(iraven_reference.glob("*/RAVEN_0_train.xml")):
        problem = read_problem_xml(source)
        (tmp_path / problem.configuration).mkdir()
        stem = writer.problem_stem(tmp_path, problem.configuration, 0)
        writer.write_problem(problem, stem)
        npz = stem.with_name(stem.name + ".npz")
        assert zipfile.ZipFile(npz).testzip() is None
        with np.load(npz, allow_pickle=False) as ours, np.load(source.with_suffix(".npz")) as reference:
            assert ours.files == reference.files
            for key in reference.files:
                assert ours[key].dtype == reference[key].dtype, key
                assert ours[key].shape == reference[key].shape, key
                if key != "predict":  # the reference solver's pick; ours is the target
                    assert np.array_equal(ours[key], reference[key]), key
            assert int(ours["predict"]) == int(ours["target"])
        assert npz.stat().st_size == writer.expected_npz_size(problem.configuration)
        assert stem.with_name(stem.name + ".xml").read_bytes() == source.read_bytes()
        assert read_problem_xml(stem.with_name(stem.name + ".xml")) == problem
        assert not list(tmp_path.rglob(".*tmp"))


def test_generated_problem_files_round_trip(tmp_path):
    from rpm_lib.generator.api import generate_problem, problem_rng

    for mode in ("balanced", "original"):
        problem = generate_problem("distribute_four", problem_rng(7, "distribute_four", 3), mode)
        (tmp_path / mode).mkdir()
        stem = tmp_path / mode / "RAVEN_3_train"
        writer.write_problem(problem, stem)
        loaded = read_problem_xml(stem.with_name(stem.name + ".xml"))
        assert loaded.context == problem.context and loaded.candidates == problem.candidates
        assert loaded.target == problem.target and loaded.modified == problem.modified
        assert [(r.component, r.name, r.attr) for r in loaded.rules] == [
            (r.component, r.name, r.attr) for r in problem.rules]
        with np.load(stem.with_name(stem.name + ".npz")) as data:
            assert np.array_equal(data["meta_matrix"], problem_labels(problem)["meta_matrix"])
            assert int(data["target"]) == problem.target


def test_a_failed_write_leaves_neither_a_final_nor_a_temporary_file(iraven_reference, tmp_path, monkeypatch):
    problem = read_problem_xml(iraven_reference / "center_single" / "RAVEN_0_train.xml")

    def broken(arrays, handle):
        handle.write(b"PK partial")
        raise OSError("disk full")

    monkeypatch.setattr(writer, "write_npz", broken)
    with pytest.raises(OSError, match="disk full"):
        writer.write_problem(problem, tmp_path / "RAVEN_0_train")
    assert list(tmp_path.iterdir()) == []


def test_is_complete_detects_missing_and_truncated_files(iraven_reference, tmp_path):
    problem = read_problem_xml(iraven_reference / "center_single" / "RAVEN_0_train.xml")
    stem = tmp_path / "RAVEN_0_train"
    assert not writer.is_complete(stem, "center_single")
    writer.write_problem(problem, stem)
    assert writer.is_complete(stem, "center_single")
    xml = stem.with_name(stem.name + ".xml")
    xml.write_bytes(xml.read_bytes()[:-3])
    assert not writer.is_complete(stem, "center_single")
    assert writer.is_complete(stem, "center_single", write_xml=False)
    npz = stem.with_name(stem.name + ".npz")
    npz.write_bytes(npz.read_bytes()[:1000])
    assert not writer.is_complete(stem, "center_single", write_xml=False)


def test_set_is_byte_identical_for_one_and_two_workers(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    writer.write_dataset(one, SMALL, count=6, seed=5, workers=1, progress=False, chunk_size=2)
    writer.write_dataset(two, SMALL, count=6, seed=5, workers=2, progress=False, chunk_size=2)
    files = _tree(one)
    assert len(files) == 2 * 6 * 2
    assert files == _tree(two)


def test_resume_rewrites_only_missing_or_damaged_problems(tmp_path):
    root = tmp_path / "set"
    first = writer.write_dataset(root, SMALL, count=5, seed=3, progress=False)
    assert first == {"total": 10, "skipped": 0, "written": 10}
    pristine = _tree(root)
    folder = root / "center_single"
    (folder / "RAVEN_1_train.xml").unlink()                      # interrupted before the .xml
    (folder / "RAVEN_2_train.npz").unlink()                      # both gone... .xml alone is not enough
    damaged = folder / "RAVEN_3_train.npz"
    damaged.write_bytes(damaged.read_bytes()[:5000])             # truncated by someone else
    (folder / ".RAVEN_4_train.npz.999.tmp").write_bytes(b"junk")  # left by a killed writer
    again = writer.write_dataset(root, SMALL, count=5, seed=3, progress=False)
    assert again == {"total": 10, "skipped": 7, "written": 3}
    assert _tree(root) == pristine
    assert writer.write_dataset(root, SMALL, count=5, seed=3, progress=False)["written"] == 0


def test_no_xml_mode_writes_only_npz(tmp_path):
    writer.write_dataset(tmp_path, ["center_single"], count=3, seed=1, write_xml=False, progress=False)
    names = sorted(p.name for p in (tmp_path / "center_single").iterdir())
    assert names == ["RAVEN_0_train.npz", "RAVEN_1_train.npz", "RAVEN_2_train.npz"]


def test_write_dataset_validates_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown RAVEN configuration 'centre'"):
        writer.write_dataset(tmp_path, ["centre"], count=1, progress=False)
    with pytest.raises(ValueError, match="mode"):
        writer.write_dataset(tmp_path, "all", count=1, mode="biased", progress=False)
    assert rules.resolve_configurations("all") == list(rules.CONFIGURATIONS)
    assert rules.resolve_configurations("center_single, 2x2grid") == ["center_single", "distribute_four"]


def test_the_generator_knows_exactly_the_shared_configurations_and_component_names():
    from rpm_lib.generator.constants import CONFIG_SPECS

    assert tuple(CONFIG_SPECS) == rules.CONFIGURATIONS
    for folder, spec in CONFIG_SPECS.items():
        assert tuple(name for name, _layout in spec.components) == rules.COMPONENT_NAMES[folder]


def test_generated_files_have_the_reference_keys_shapes_and_dtypes(iraven_reference, tmp_path):
    writer.write_dataset(tmp_path, "all", count=1, seed=11, progress=False)
    for configuration in rules.CONFIGURATIONS:
        ours_path = tmp_path / configuration / "RAVEN_0_train.npz"
        with np.load(ours_path, allow_pickle=False) as ours, \
                np.load(iraven_reference / configuration / "RAVEN_0_train.npz") as reference:
            assert ours.files == reference.files
            for key in reference.files:
                assert (ours[key].shape, ours[key].dtype) == (reference[key].shape, reference[key].dtype), key
        assert ours_path.stat().st_size == (iraven_reference / configuration / "RAVEN_0_train.npz").stat().st_size
        assert read_problem_xml(ours_path.with_suffix(".xml")).configuration == configuration


def test_a_folder_of_other_settings_is_refused_and_the_settings_are_recorded(tmp_path):
    writer.write_dataset(tmp_path, SMALL, count=2, seed=5, progress=False)
    record = json.loads((tmp_path / records.SETTINGS_FILE).read_text())
    assert (record["seed"], record["mode"]) == (5, "balanced")
    with pytest.raises(records.GeneratorSettingsError, match=r"other settings \(seed 5 there, 6 asked\)"):
        writer.write_dataset(tmp_path, SMALL, count=3, seed=6, progress=False)
    with pytest.raises(records.GeneratorSettingsError, match=r"mode 'balanced' there, 'original' asked"):
        writer.write_dataset(tmp_path, SMALL, count=3, seed=5, mode="original", progress=False)
    assert writer.write_dataset(tmp_path, SMALL, count=3, seed=5, progress=False)["written"] == len(SMALL)


def test_a_mesh_folder_of_the_draw_before_the_answer_blind_one_is_not_extended(tmp_path):
    writer.write_dataset(tmp_path, SMALL, count=1, seed=5, progress=False, regime="I-RAVEN-Mesh")
    record = json.loads((tmp_path / records.SETTINGS_FILE).read_text())
    assert record[records.MESH_DRAW_KEY] == records.MESH_DRAW
    del record[records.MESH_DRAW_KEY]  # what an rpm_lib before the answer-blind draw wrote
    (tmp_path / records.SETTINGS_FILE).write_text(json.dumps(record))
    with pytest.raises(records.GeneratorSettingsError, match=r"mesh_number_draw 'raven-datasets .*' there, "
                                                            r"'answer-blind-v1' asked"):
        writer.write_dataset(tmp_path, SMALL, count=2, seed=5, progress=False, regime="I-RAVEN-Mesh")
    # The faithful mode is raven-datasets' draw, named by its mode; plain folders never carry the key.
    writer.write_dataset(tmp_path / "faithful", SMALL, count=1, seed=5, progress=False, regime="I-RAVEN-Mesh",
                         mode="mesh-faithful")
    writer.write_dataset(tmp_path / "plain", SMALL, count=1, seed=5, progress=False)
    for folder in ("faithful", "plain"):
        assert records.MESH_DRAW_KEY not in json.loads((tmp_path / folder / records.SETTINGS_FILE).read_text())


def test_a_second_writer_is_refused_naming_the_first(tmp_path):
    from rpm_lib.folder_lock import FolderBusyError, exclusive_writer

    with exclusive_writer(tmp_path / writer.LOCK_FILE, "rpm-generate"):  # what a running rpm-generate holds
        with pytest.raises(FolderBusyError, match=r"another rpm-generate is writing here \(pid \d+ on "):
            writer.write_dataset(tmp_path, SMALL, count=1, seed=5, progress=False)
    writer.write_dataset(tmp_path, SMALL, count=1, seed=5, progress=False)  # free again


def test_a_write_that_cannot_fit_is_refused_before_any_byte(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from rpm_lib.folder_lock import NotEnoughSpaceError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(NotEnoughSpaceError, match=r"no space left on .* for rpm-generate: need ~\d+ MB, 1 MB free"):
        writer.write_dataset(tmp_path, SMALL, count=100, seed=5, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == [writer.LOCK_FILE], "nothing but the (released) lock file"


def test_the_up_front_space_check_counts_problems_already_there(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    writer.write_dataset(tmp_path, [CONFIGURATION], count=3, seed=5, progress=False)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(10**9, 10**9 - 10**6, 10**6))
    # A rerun of a finished write needs no space: a full disk must not refuse it.
    summary = writer.write_dataset(tmp_path, [CONFIGURATION], count=3, seed=5, progress=False)
    assert summary == {"total": 3, "skipped": 3, "written": 0}


class _Terminal:
    """A stand-in for stderr on a terminal (``isatty()`` true), keeping what is written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_the_progress_bar_is_drawn_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    # a bar written to a log file (SLURM output, CI, `> log 2>&1`) is every redraw joined by carriage returns
    writer.write_dataset(tmp_path / "log", [CONFIGURATION], count=2, seed=0, progress=True)
    err = capsys.readouterr().err
    assert "rpm-generate ->" not in err and "\r" not in err, repr(err[:200])
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    writer.write_dataset(tmp_path / "terminal", [CONFIGURATION], count=2, seed=0, progress=True)
    assert "rpm-generate ->" in terminal.text  # the bar itself is still there for people
    terminal.text = ""
    writer.write_dataset(tmp_path / "quiet", [CONFIGURATION], count=2, seed=0, progress=False)
    assert terminal.text == ""  # and "no progress" still means none

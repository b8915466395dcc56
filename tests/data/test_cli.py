"""``rpm-data`` command line (rpm_lib.data.cli.main): prepare and info, their one-line errors, the lock of the cache
folder being written, --workers capped at the CPUs, and caches whose manifest was edited by hand."""
from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from generated_caches import edited_cache, one_error_line
from rpm_lib.data import RavenDataset, read_manifest
from rpm_lib.data import cli as data_cli
from rpm_lib.data.cli import main
from rpm_lib.folder_lock import exclusive_writer
from rpm_lib.generator import writer

CONFIGURATION = "center_single"
CPUS = os.cpu_count() or 1


def test_prepare_and_info(make_raven_root, tmp_path, capsys):
    root = make_raven_root(configurations=["center_single", "distribute_four"], ks=range(10))
    out = tmp_path / "cache40"
    assert main(["prepare", str(root), "--out", str(out), "--size", "40", "--workers", "2", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "| center_single | 6 | 2 | 2 |" in printed and "40 px (area)" in printed
    assert read_manifest(out)["image_size"] == 40
    assert len(RavenDataset(out, "val", configurations=["center_single", "distribute_four"], image_size=40)) == 4
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "problems     20 valid of 20 (0 skipped)" in info
    # hand-made files without generator.json: who drew them is unknown, who resized them is this OpenCV
    assert f"pixels       resized with OpenCV {cv2.__version__}\n" in info


def test_errors_exit_with_code_2_and_a_message(make_raven_root, tmp_path, rewrite, capsys):
    assert main(["prepare", str(tmp_path / "missing"), "--out", str(tmp_path / "c")]) == 2
    assert "dataset folder not found" in capsys.readouterr().err
    root = make_raven_root(configurations=["center_single"], ks=range(3))
    rewrite(root / "center_single" / "RAVEN_2_train.npz", meta_target=np.zeros(9, np.uint8))
    assert main(["prepare", str(root), "--out", str(tmp_path / "c"), "--no-progress"]) == 2
    assert "RAVEN_2_train.npz: 'meta_target'" in capsys.readouterr().err
    assert main(["prepare", str(root), "--out", str(tmp_path / "c"), "--on-error", "skip", "--no-progress"]) == 0
    assert "skipped 1 file(s)" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "nothing")]) == 2


@pytest.fixture(scope="module")
def raw_root(tmp_path_factory) -> Path:
    """A generated I-RAVEN folder of 10 center_single problems (all three splits), for rpm-data prepare."""
    root = tmp_path_factory.mktemp("raw")
    writer.write_dataset(root, [CONFIGURATION], count=10, seed=3, progress=False)
    return root


def test_rpm_data_prepare_never_writes_through_a_symlink_at_its_lock(raw_root, tmp_path, capsys):
    out, target = tmp_path / "cache", tmp_path / "precious.txt"
    target.write_text("precious content\n")
    lock = out.with_name("cache.lock")
    lock.symlink_to(target)

    code = data_cli.main(["prepare", str(raw_root), "--out", str(out), "--size", "32", "--no-progress"])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"rpm-data: error: {lock}: the lock file of {out} is a symbolic link; refusing to write to it "
                   "(remove it and rerun)"]
    assert target.read_text() == "precious content\n"
    assert not out.exists() and not out.with_name("cache.partial").exists()


def test_rpm_data_prepare_names_the_cache_folder_it_locked_not_its_parent(raw_root, tmp_path, capsys):
    out = tmp_path / "cache"
    with exclusive_writer(out.with_name("cache.lock"), "rpm-data prepare", folder=out):  # a running prepare
        code = data_cli.main(["prepare", str(raw_root), "--out", str(out), "--size", "32", "--no-progress"])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert err[0].startswith(f"rpm-data: error: {out}: another rpm-data prepare is writing here (pid {os.getpid()} ")
    assert f"lock {out.with_name('cache.lock')})" in err[0]


def test_rpm_data_prepare_caps_workers_at_the_cpus_and_says_so(raw_root, tmp_path, capsys, monkeypatch):
    asked = []
    prepare_cache = data_cli.prepare_cache

    def recording_prepare_cache(*args, **options):
        asked.append(options["workers"])
        return prepare_cache(*args, **options)

    monkeypatch.setattr(data_cli, "prepare_cache", recording_prepare_cache)
    code = data_cli.main(["prepare", str(raw_root), "--out", str(tmp_path / "cache"), "--size", "32",
                          "--workers", str(CPUS + 1000), "--no-progress"])

    assert code == 0 and asked == [CPUS]
    assert capsys.readouterr().err.strip().splitlines() == [
        f"rpm-data prepare: note: --workers {CPUS + 1000} capped at {CPUS}, the number of CPUs"]


@pytest.mark.parametrize("edit, named", [
    (lambda m: m.pop("plan"), "field 'plan' must be the build plan"),  # found: KeyError traceback
    (lambda m: m["plan"].pop("source_root"), None),  # found: KeyError traceback; now "source (not recorded)"
    (lambda m: m.pop("num_valid"), None),  # found: KeyError traceback; the count comes from valid.npy now
    (lambda m: m.update(counts=[1, 2]), None),  # found: AttributeError traceback
    (lambda m: m.update(counts={"center_single": {"train": 600}}), None),  # found: info said 600 train problems
    (lambda m: m.update(num_rows=10**26), "panels.npy: shape (12, 16, 16, 16), but manifest.json"),  # found: exit 0
], ids=["no-plan", "no-source", "no-num-valid", "counts-a-list", "counts-lie", "huge-num-rows"])
def test_rpm_data_info_on_a_hand_edited_manifest_never_crashes_nor_lies(reference, tmp_path, capsys, edit, named):
    out = edited_cache(reference, tmp_path, edit)
    code = data_cli.main(["info", str(out)])
    if named is not None:
        assert code == 2 and named in one_error_line(capsys, "rpm-data")
        return
    assert code == 0
    text = capsys.readouterr().out
    assert "problems     12 valid of 12 (0 skipped)" in text
    assert "| center_single | 6 | 0 | 0 |" in text and "| left_center_single_right_center_single | 6 | 0 | 0 |" in text


def test_rpm_data_prepare_names_a_problem_index_past_int64(tmp_path, capsys):
    # found: rpm-generate writes RAVEN_9223372036854775808_test.npz (file names have no limit), and preparing the
    # folder died with "OverflowError: Python int too large to convert to C long", leaving a half-made partial
    from rpm_lib.generator.writer import write_dataset

    raw = tmp_path / "raw"
    write_dataset(raw, ["center_single"], count=1, start=2**63, write_xml=False, progress=False)
    assert data_cli.main(["prepare", str(raw), "--out", str(tmp_path / "cache"), "--size", "16", "--no-progress"]) == 2
    line = one_error_line(capsys, "rpm-data")
    assert "RAVEN_9223372036854775808_test.npz: problem index 9223372036854775808 is past 2**63 - 1" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_rpm_data_prepare_on_a_cache_says_it_is_a_cache(reference, tmp_path, capsys):
    # found: "no configuration folders (expected subfolders named like [...])", as if the folder were empty
    assert data_cli.main(["prepare", str(reference), "--out", str(tmp_path / "again"), "--size", "16",
                          "--no-progress"]) == 2
    line = one_error_line(capsys, "rpm-data")
    assert f"{reference}: is a training cache, not a folder of problem files" in line
    assert not (tmp_path / "again").exists()

"""Hostile requests to the writing commands (issue 22): a link planted at a lock file's path, lock messages
naming the folder actually locked, a request far larger than the disk, and absurd --workers."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rpm_lib.data import cli as data_cli
from rpm_lib.folder_lock import exclusive_writer
from rpm_lib.generator import cli as generator_cli
from rpm_lib.generator import writer

CONFIGURATION = "center_single"
CPUS = os.cpu_count() or 1


@pytest.fixture(scope="module")
def raw_root(tmp_path_factory) -> Path:
    """A generated I-RAVEN folder of 10 center_single problems (all three splits), for rpm-data prepare."""
    root = tmp_path_factory.mktemp("raw")
    writer.write_dataset(root, [CONFIGURATION], count=10, seed=3, progress=False)
    return root


def _plant(kind: str, lock: Path, target: Path) -> None:
    """Put ``kind`` of file at ``lock``: something a lock file must never be written through."""
    if kind == "symlink":
        lock.symlink_to(target)
    elif kind == "dangling symlink":
        lock.symlink_to(target.with_name("not-there"))
    elif kind == "hard link":
        os.link(target, lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()


PLANTED = {"symlink": "a symbolic link", "dangling symlink": "a symbolic link", "hard link": "a hard link (2 names share its content)",
           "fifo": "a FIFO", "folder": "a folder"}


@pytest.mark.parametrize("kind", list(PLANTED))
def test_rpm_generate_never_writes_through_what_is_planted_at_its_lock(tmp_path, capsys, kind):
    out, target = tmp_path / "out", tmp_path / "precious.txt"
    out.mkdir()
    target.write_text("precious content\n")
    lock = out / writer.LOCK_FILE
    _plant(kind, lock, target)

    code = generator_cli.main(["--out", str(out), "--num-per-config", "1", "--configurations", CONFIGURATION,
                               "--quiet"])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"rpm-generate: error: {lock}: the lock file of {out} is {PLANTED[kind]}; refusing to write to "
                   "it (remove it and rerun)"]
    assert target.read_text() == "precious content\n"
    assert not target.with_name("not-there").exists(), "a dangling link's target must not be created"
    assert not (out / CONFIGURATION).exists(), "nothing generated"


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


def test_a_request_far_beyond_the_disk_is_refused_at_once_with_one_line(tmp_path):
    out = tmp_path / "huge"
    began = time.perf_counter()
    # Without the up-front check, the scan alone of 7 * 10**8 requested problems takes many minutes.
    result = subprocess.run(
        [sys.executable, "-m", "rpm_lib.generator.cli", "--out", str(out), "--num-per-config", "100000000", "--quiet"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"})
    seconds = time.perf_counter() - began

    err = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert len(err) == 1 and result.stdout == ""
    assert err[0].startswith(f"rpm-generate: error: no space left on {out} for rpm-generate: need ~")
    assert " MB, " in err[0] and " MB free (700,000,000 problems to write, ~" in err[0]
    assert seconds < 15, f"took {seconds:.1f} s"
    assert not (out / CONFIGURATION).exists()


def test_the_up_front_space_check_counts_problems_already_there(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    writer.write_dataset(tmp_path, [CONFIGURATION], count=3, seed=5, progress=False)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(10**9, 10**9 - 10**6, 10**6))
    # A rerun of a finished write needs no space: a full disk must not refuse it.
    summary = writer.write_dataset(tmp_path, [CONFIGURATION], count=3, seed=5, progress=False)
    assert summary == {"total": 3, "skipped": 3, "written": 0}


def test_rpm_generate_caps_workers_at_the_cpus_and_says_so(tmp_path, capsys, monkeypatch):
    asked = []

    def fake_write_dataset(root, configurations, **options):
        asked.append(options["workers"])
        return {"total": 1, "skipped": 0, "written": 1}

    monkeypatch.setattr(generator_cli, "write_dataset", fake_write_dataset)
    code = generator_cli.main(["--out", str(tmp_path), "--num-per-config", "1", "--configurations", CONFIGURATION,
                               "--workers", str(CPUS + 1000), "--quiet"])

    assert code == 0 and asked == [CPUS]
    assert capsys.readouterr().err.strip().splitlines() == [
        f"rpm-generate: note: --workers {CPUS + 1000} capped at {CPUS}, the number of CPUs"]
    generator_cli.main(["--out", str(tmp_path), "--num-per-config", "1", "--configurations", CONFIGURATION,
                        "--workers", str(CPUS), "--quiet"])
    assert asked[-1] == CPUS and capsys.readouterr().err == "", "no note when nothing is capped"


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


@pytest.mark.parametrize("text", ["Center,,L-R", "Center,", "Center, ,L-R"])
def test_an_empty_item_in_a_configuration_list_is_refused_not_dropped(tmp_path, capsys, text):
    from rpm_lib.training.config import ConfigError, TrainConfig

    with pytest.raises(SystemExit) as caught:  # argparse's usage error
        generator_cli.main(["--out", str(tmp_path / "out"), "--num-per-config", "1", "--configurations", text,
                            "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2
    assert err == [f"rpm-generate: error: --configurations: empty item in the comma-separated list {text!r} (remove "
                   "the extra comma) (see rpm-generate --help)"]
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"^config field 'configurations': empty item in the comma-separated list"):
        TrainConfig().with_overrides([f"configurations={text}"])

"""``rpm-generate`` and the ``python -m rpm_lib.demo`` steps."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.generator import cli, writer

CONFIGURATION = "center_single"
CPUS = os.cpu_count() or 1


def test_help_lists_every_option_and_the_layout(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--out", "--num-per-config", "--configurations", "--seed", "--mode", "--workers", "--no-xml",
                   "--cache-size", "--regime", "--held-out", "--mesh", "--val", "--test"):
        assert option in text
    assert "RAVEN_<k>_<split>.npz" in text and "Resumable" in text
    from rpm_lib.generator.regimes import REGIMES

    for name, regime in REGIMES.items():  # one line per regime, with its description
        assert any(line.split()[:1] == [name] and regime.description in line for line in text.splitlines()), name


@pytest.mark.parametrize("argv, message", [
    (["--out", "x", "--configurations", "centre"], "--configurations: unknown RAVEN configuration 'centre'"),
    (["--out", "x", "--workers", "0"], "--workers"),
    (["--out", "x", "--mode", "biased"], "invalid choice"),
    (["--num-per-config", "3"], "--out"),
])
def test_bad_arguments_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_generates_a_small_set_and_resumes(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--num-per-config", "3", "--configurations", "distribute_nine",
            "--seed", "9", "--quiet"]
    assert cli.main(argv) == 0
    assert "3 written, 0 already complete" in capsys.readouterr().out
    folder = tmp_path / "distribute_nine"
    assert sorted(p.name for p in folder.iterdir()) == [
        "RAVEN_0_train.npz", "RAVEN_0_train.xml", "RAVEN_1_train.npz", "RAVEN_1_train.xml",
        "RAVEN_2_train.npz", "RAVEN_2_train.xml"]
    with np.load(folder / "RAVEN_1_train.npz") as data:
        assert data["image"].shape == (16, 160, 160) and data["image"].dtype == np.uint8
    assert cli.main(argv) == 0
    assert "0 written, 3 already complete" in capsys.readouterr().out


def test_original_mode_without_xml(tmp_path, capsys):
    assert cli.main(["--out", str(tmp_path), "--num-per-config", "1", "--configurations", "center_single",
                     "--mode", "original", "--no-xml", "--start", "8", "--quiet"]) == 0
    assert [p.name for p in (tmp_path / "center_single").iterdir()] == ["RAVEN_8_test.npz"]


def test_demo_steps_are_idempotent_and_write_the_gallery(tmp_path, capsys):
    from rpm_lib import demo

    argv = ["--out", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--num-per-config", "1",
            "--steps", "generate,gallery"]
    assert demo.main(argv) == 0
    gallery = tmp_path / "run" / "gallery.png"
    assert gallery.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((tmp_path / "data").glob("*/RAVEN_0_train.npz"))) == 7
    assert demo.main(argv[:-1] + ["generate"]) == 0  # a rerun reuses the finished data
    assert "0 written, 7 reused" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:  # before any work: one line, exit 2
        demo.main(argv[:-2] + ["--steps", "fly"])
    assert refused.value.code == 2
    assert "argument --steps: unknown step fly (known: " in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--out", "x", "--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--out", "", "--num-per-config", "1"], "--out: empty path"),
    (["--out", "x", "--num-per-config", "0"], "--num-per-config must be >= 1"),
])
def test_hostile_arguments_are_refused_before_anything_is_created(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [], "nothing created"


def test_out_must_be_a_writable_folder(capsys, tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("not a folder")
    for out, message in [(a_file, "exists and is not a folder"), (a_file / "sub", "is a file, so")]:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["--out", str(out), "--num-per-config", "1"])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--held-out", "type:Arithmetic"], "--held-out type:Arithmetic: there is no Arithmetic on Type"),
    (["--held-out", "shape"], "unknown attribute 'shape'"),
    (["--held-out", "color", "--mesh"], "--mesh cannot be combined with --held-out"),
    (["--regime", "A/Color", "--held-out", "size"], "--regime and --held-out exclude each other"),
    (["--regime", "A/Colour"], "argument --regime: invalid choice: 'A/Colour'"),
    (["--regime", "I-RAVEN-Mesh", "--mode", "original"], "not defined for a Mesh problem"),
    (["--mesh", "--mode", "original"], "not defined for a Mesh problem"),
    (["--mesh", "--mode", "fair"], "fair (RAVEN-FAIR) candidates are not defined for a Mesh problem"),
    (["--mode", "mesh-faithful"], "mode 'mesh-faithful' (raven-datasets' Mesh Number alternatives) needs the Mesh"),
    (["--val", "6", "--test", "5"], "--val/--test: val + test must be at most 10 tenths"),
    (["--test", "-1"], "--val/--test: test must be a whole number of tenths >= 0"),
])
def test_regime_and_split_errors_are_one_line_and_create_nothing(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--out", "x", "--num-per-config", "1"] + argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == [], "nothing created"


def test_regime_flags_reach_the_files(tmp_path, capsys):
    import json

    out = tmp_path / "a"
    assert cli.main(["--out", str(out), "--num-per-config", "2", "--configurations", "center_single",
                     "--held-out", "color:progression", "--val", "0", "--test", "10", "--quiet"]) == 0
    assert "2 A/Color-Progression problems" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "center_single").glob("*.npz")) == ["RAVEN_0_test.npz", "RAVEN_1_test.npz"]
    record = json.loads((out / "regime.json").read_text())
    assert (record["regime"], record["held_out"], record["val"], record["test"]) == (
        "A/Color-Progression", {"Color": "Progression"}, 0, 10)
    for k in range(2):
        with np.load(out / "center_single" / f"RAVEN_{k}_test.npz") as data:
            assert data["meta_matrix"][3, 1] == 0, "test split: Color is not governed by Progression"
    # resuming with another regime is refused with one line (exit 1: the folder is fine, the request is not)
    assert cli.main(["--out", str(out), "--num-per-config", "2", "--configurations", "center_single",
                     "--regime", "A/Size", "--val", "0", "--test", "10", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "regime 'A/Color-Progression' there, 'A/Size' asked" in err and len(err.strip().splitlines()) == 1


def test_no_xml_with_a_cache_is_said_to_do_nothing(tmp_path, capsys):
    assert cli.main(["--out", str(tmp_path / "c"), "--num-per-config", "1", "--configurations", "center_single",
                     "--cache-size", "16", "--no-xml", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "--no-xml has no effect with --cache-size" in err and len(err.strip().splitlines()) == 1
    assert not list((tmp_path / "c").rglob("*.xml"))


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

    code = cli.main(["--out", str(out), "--num-per-config", "1", "--configurations", CONFIGURATION,
                               "--quiet"])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"rpm-generate: error: {lock}: the lock file of {out} is {PLANTED[kind]}; refusing to write to "
                   "it (remove it and rerun)"]
    assert target.read_text() == "precious content\n"
    assert not target.with_name("not-there").exists(), "a dangling link's target must not be created"
    assert not (out / CONFIGURATION).exists(), "nothing generated"


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


def test_rpm_generate_caps_workers_at_the_cpus_and_says_so(tmp_path, capsys, monkeypatch):
    asked = []

    def fake_write_dataset(root, configurations, **options):
        asked.append(options["workers"])
        return {"total": 1, "skipped": 0, "written": 1}

    monkeypatch.setattr(cli, "write_dataset", fake_write_dataset)
    code = cli.main(["--out", str(tmp_path), "--num-per-config", "1", "--configurations", CONFIGURATION,
                               "--workers", str(CPUS + 1000), "--quiet"])

    assert code == 0 and asked == [CPUS]
    assert capsys.readouterr().err.strip().splitlines() == [
        f"rpm-generate: note: --workers {CPUS + 1000} capped at {CPUS}, the number of CPUs"]
    cli.main(["--out", str(tmp_path), "--num-per-config", "1", "--configurations", CONFIGURATION,
                        "--workers", str(CPUS), "--quiet"])
    assert asked[-1] == CPUS and capsys.readouterr().err == "", "no note when nothing is capped"


@pytest.mark.parametrize("text", ["Center,,L-R", "Center,", "Center, ,L-R"])
def test_an_empty_item_in_a_configuration_list_is_refused_not_dropped(tmp_path, capsys, text):
    from rpm_lib.training.config import ConfigError, TrainConfig

    with pytest.raises(SystemExit) as caught:  # argparse's usage error
        cli.main(["--out", str(tmp_path / "out"), "--num-per-config", "1", "--configurations", text,
                            "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2
    assert err == [f"rpm-generate: error: --configurations: empty item in the comma-separated list {text!r} (remove "
                   "the extra comma) (see rpm-generate --help)"]
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"^config field 'configurations': empty item in the comma-separated list"):
        TrainConfig().with_overrides([f"configurations={text}"])

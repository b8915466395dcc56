"""``rpm-generate`` and the ``python -m rpm_lib.demo`` steps."""
from __future__ import annotations

import numpy as np
import pytest

from rpm_lib.generator import cli


def test_help_lists_every_option_and_the_layout(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--out", "--num-per-config", "--configurations", "--seed", "--mode", "--workers", "--no-xml"):
        assert option in text
    assert "RAVEN_<k>_<split>.npz" in text and "Resumable" in text


@pytest.mark.parametrize("argv, message", [
    (["--out", "x", "--configurations", "centre"], "--configurations: unknown RAVEN configuration 'centre'"),
    (["--out", "x", "--workers", "0"], "--workers"),
    (["--out", "x", "--mode", "fair"], "invalid choice"),
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
    assert demo.main(argv[:-2] + ["--steps", "fly"]) == 1
    assert "unknown demo step" in capsys.readouterr().err


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

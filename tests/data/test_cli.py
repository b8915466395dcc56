"""``rpm-data`` command line (rpm_lib.data.cli.main)."""
from __future__ import annotations

import cv2
import numpy as np

from rpm_lib.data import RavenDataset, read_manifest
from rpm_lib.data.cli import main


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

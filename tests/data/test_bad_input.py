"""Bad input -> DataFormatError naming the file/folder and the problem (RAVEN and PGM)."""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.data import DataFormatError, PgmDataset, RavenDataset, find_raven_files, load_pgm_npz, load_raven_npz
from rpm_lib.data.npz import read_npz

CONFIG = "center_single"


def test_data_format_error_is_a_value_error():
    assert issubclass(DataFormatError, ValueError)


# ------------------------------------------------------------------------------------------------
# folders and names
# ------------------------------------------------------------------------------------------------


def test_missing_root(tmp_path):
    with pytest.raises(DataFormatError, match="dataset folder not found") as info:
        RavenDataset(tmp_path / "nowhere", "train")
    assert "nowhere" in str(info.value)
    with pytest.raises(DataFormatError, match="dataset folder not found"):
        PgmDataset(tmp_path / "nowhere", "neutral", "train")


def test_missing_configuration_folder(make_raven_root):
    root = make_raven_root(configurations=[CONFIG])
    with pytest.raises(DataFormatError, match="distribute_four: configuration folder not found") as info:
        RavenDataset(root, "train")
    assert "center_single" in str(info.value)  # lists what is there
    assert len(RavenDataset(root, "train", configurations=[CONFIG])) == 6


def test_empty_and_misnamed_folders(make_raven_root):
    root = make_raven_root(configurations=[CONFIG], ks=[0, 6])
    (root / "distribute_four").mkdir()
    with pytest.raises(DataFormatError, match="distribute_four: no RAVEN_<k>_<split>.npz files"):
        RavenDataset(root, "train", configurations=["center_single", "distribute_four"])
    (root / "distribute_four").rmdir()
    (root / "Center").mkdir()
    with pytest.raises(DataFormatError, match=r"unknown configuration folder\(s\) \['Center'\]"):
        find_raven_files(root)
    with pytest.raises(DataFormatError, match="no files for split"):
        RavenDataset(root, "test", configurations=[CONFIG])


def test_misnamed_files(make_raven_root):
    root = make_raven_root(configurations=[CONFIG], ks=[0])
    (root / CONFIG / "RAVEN_0_train.npz").rename(root / CONFIG / "raven_0_train.npz")
    with pytest.raises(DataFormatError, match="raven_0_train.npz: unexpected file name"):
        RavenDataset(root, "train", configurations=[CONFIG])


def test_unknown_configuration_and_regime(iraven_reference, tmp_path):
    with pytest.raises(DataFormatError, match="unknown RAVEN configuration 'centre'"):
        RavenDataset(iraven_reference, "train", configurations=["centre"])
    with pytest.raises(DataFormatError, match="unknown PGM regime"):
        PgmDataset(tmp_path, "hard", "train")


def test_pgm_misnamed_and_unknown_regime_files(tmp_path, pgm):
    pgm.write(tmp_path / "neutral" / "PGM_neutral_train_0.npz", pgm.panels(0))
    pgm.write(tmp_path / "neutral" / "PGM_neutral_train_x.npz", pgm.panels(0))
    with pytest.raises(DataFormatError, match="PGM_neutral_train_x.npz: unexpected file name"):
        PgmDataset(tmp_path, "neutral", "train")
    (tmp_path / "neutral" / "PGM_neutral_train_x.npz").unlink()
    with pytest.raises(DataFormatError, match="no PGM files for regime 'neutral' and split"):
        PgmDataset(tmp_path, "neutral", "val")


# ------------------------------------------------------------------------------------------------
# file content (RAVEN)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def raven_file(make_raven_root):
    root = make_raven_root(configurations=[CONFIG], ks=[1])
    return root / CONFIG / "RAVEN_1_train.npz"


def test_truncated_and_corrupt_files(raven_file):
    data = raven_file.read_bytes()
    raven_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match="RAVEN_1_train.npz: not a readable .npz"):
        load_raven_npz(raven_file)
    raven_file.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(DataFormatError, match="RAVEN_1_train.npz: not a readable .npz"):
        load_raven_npz(raven_file)


def _edited(raven_file, rewrite, **changes):
    rewrite(raven_file, **changes)
    return raven_file


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"meta_matrix": None}, r"missing key\(s\) \['meta_matrix'\]"),
        ({"image": np.zeros((16, 160, 120), np.uint8)}, "'image' has shape"),
        ({"image": np.zeros((8, 160, 160), np.uint8)}, "'image' has shape"),
        ({"image": np.zeros((16, 160, 160), np.float32)}, "'image' has dtype float32"),
        ({"target": np.array(8)}, "'target' = 8 is out of range"),
        ({"target": np.array(-1)}, "'target' = -1 is out of range"),
        ({"target": np.array(2.0)}, "'target' has dtype float64"),
        ({"target": np.array([1, 2])}, "'target' has shape"),
        ({"meta_matrix": np.zeros((8, 9), np.uint8)}, "invalid rules"),
        ({"meta_matrix": np.zeros((4, 9), np.uint8)}, "'meta_matrix' has shape"),
        ({"meta_target": np.ones(9, np.uint8) * 2}, "'meta_target' must hold only 0/1"),
        ({"meta_target": np.zeros(9, np.uint8)}, "is not the OR of the rows"),
    ],
)
def test_bad_raven_content(raven_file, rewrite, changes, message):
    _edited(raven_file, rewrite, **changes)
    with pytest.raises(DataFormatError, match=message) as info:
        load_raven_npz(raven_file)
    assert str(raven_file) in str(info.value)


def test_bad_file_fails_at_access_with_its_name(raven_file, rewrite):
    rewrite(raven_file, target=np.array(9))
    dataset = RavenDataset(raven_file.parents[1], "train", configurations=[CONFIG])  # names are checked, not content
    with pytest.raises(DataFormatError, match="RAVEN_1_train.npz: 'target' = 9"):
        dataset[0]
    with pytest.raises(DataFormatError, match="RAVEN_1_train.npz"):
        dataset.labels


def test_header_only_read_still_checks_the_image(raven_file, rewrite):
    rewrite(raven_file, image=np.zeros((16, 80, 81), np.uint8))
    with pytest.raises(DataFormatError, match="'image' has shape"):
        load_raven_npz(raven_file, with_image=False)


# ------------------------------------------------------------------------------------------------
# file content (PGM)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"relation_structure_encoded": None}, "missing key"),
        ({"image": np.zeros((160, 160, 15), np.uint8)}, "'image' has shape"),
        ({"image": np.full((160, 160, 16), 300, np.int64)}, r"values span \[300, 300\]"),
        ({"image": np.full((160, 160, 16), np.nan, np.float32)}, "NaN"),
        ({"image": np.zeros((160, 160, 16), np.complex64)}, "dtype complex64"),
        ({"target": np.array(12)}, "out of range"),
        ({"relation_structure_encoded": np.zeros((5, 12), np.int64)}, "'relation_structure_encoded' has shape"),
        ({"relation_structure_encoded": np.eye(4, 12, dtype=np.int64)}, "invalid rules"),
        ({"meta_target": np.zeros(11, np.int8)}, "'meta_target' has shape"),
    ],
)
def test_bad_pgm_content(tmp_path, pgm, overrides, message):
    path = pgm.write(tmp_path / "PGM_neutral_train_0.npz", pgm.panels(0), **overrides)
    with pytest.raises(DataFormatError, match=message) as info:
        load_pgm_npz(path)
    assert str(path) in str(info.value)


def test_an_npz_header_promising_more_than_the_file_is_refused_before_allocation(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f8", "fortran_order": False,
                                                  "shape": (60_000, 60_000, 2)})  # 53 GiB promised
    buffer.write(b"\0" * 64)
    path = tmp_path / "RAVEN_0_train.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("image.npy", buffer.getvalue())
    with pytest.raises(DataFormatError, match=r"member 'image' claims \(60000, 60000, 2\) float64 "
                                              r"\(57600000000 bytes\) but holds"):
        read_npz(path, ("image",))

"""``rpm_lib.data.npz.read_npz``: the arrays ``np.load`` gives, each header parsed once and never by two threads at
once (numpy parses it with ``ast.literal_eval``, which CPython 3.11 cannot run on two threads at a time:
"SystemError: AST constructor recursion depth mismatch", seen once when problem hashing read a folder on threads)."""
from __future__ import annotations

import io
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.data import DataFormatError
from rpm_lib.data import npz


def _write(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_members_read_as_np_load_reads_them_in_c_and_fortran_order(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"image": rng.integers(0, 256, (16, 20, 24), dtype=np.uint8),
              "fortran": np.asfortranarray(rng.normal(size=(5, 7))),
              "big_endian": np.arange(12, dtype=">u2").reshape(3, 4), "empty": np.zeros((0, 3), np.int64)}
    path = _write(tmp_path / "a.npz", **arrays)
    read = npz.read_npz(path, tuple(arrays))
    with np.load(path, allow_pickle=False) as loaded:
        for name in arrays:
            assert read[name].dtype == loaded[name].dtype and read[name].shape == loaded[name].shape, name
            assert np.array_equal(read[name], loaded[name]), name
            assert read[name].flags.writeable, name
    assert npz.read_npz(path, ("image",), header_only=("image",))["image"] == npz.ArrayHeader((16, 20, 24),
                                                                                              np.dtype(np.uint8))


def test_each_header_is_parsed_once_and_under_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [_write(tmp_path / f"{i}.npz", image=np.full((4, 8, 8), i, np.uint8), target=np.array(i)) for i in range(16)]
    parsed, unlocked = [], []
    original = np.lib.format.read_array_header_1_0

    def parse(*args, **kwargs):
        parsed.append(1)
        if not npz._HEADER_LOCK.locked():
            unlocked.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "read_array_header_1_0", parse)
    with ThreadPoolExecutor(4) as pool:
        read = list(pool.map(lambda p: npz.read_npz(p, ("image", "target")), paths))
    assert [int(r["target"]) for r in read] == list(range(16)) and all((r["image"] == i).all() for i, r in enumerate(read))
    assert len(parsed) == 2 * len(paths) and not unlocked, (len(parsed), len(unlocked))


def test_data_cut_short_or_holding_objects_is_refused_naming_the_file(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.zeros((4, 4), np.uint8))
    short = tmp_path / "short.npz"
    with zipfile.ZipFile(short, "w") as archive:
        archive.writestr("image.npy", buffer.getvalue()[:-5])
    with pytest.raises(DataFormatError, match=r"short\.npz: not a readable \.npz file \(ValueError: the array data "
                                              r"ends before its 16 bytes\)"):
        npz.read_npz(short, ("image",))
    objects = _write(tmp_path / "objects.npz", image=np.array([{"a": 1}], dtype=object))
    with pytest.raises(DataFormatError, match=r"objects\.npz: .*holds Python objects"):
        npz.read_npz(objects, ("image",))

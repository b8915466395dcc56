"""Opening raw .npz files defensively, with or without decoding the (large) image member.

``np.load`` of an .npz is lazy per member; reading only the header of ``image.npy`` lets label tables
and validation inspect a 400 kB file while reading a few hundred bytes of it.
"""
from __future__ import annotations

import threading
import tokenize
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rpm_lib.data.errors import DataFormatError

#: numpy parses an .npy header (a Python literal) with ``ast.literal_eval``, and CPython 3.11 builds ASTs with a
#: recursion counter shared by all threads: two threads parsing at once can fail with "SystemError: AST constructor
#: recursion depth mismatch" (python/cpython#106905). Problem hashing reads files on several threads, so headers
#: are parsed one at a time, and the data is read after the header without numpy parsing it a second time.
_HEADER_LOCK = threading.Lock()


@dataclass(frozen=True)
class ArrayHeader:
    """Shape and dtype of an .npy member whose data was not read (``fortran_order``: stored column-major)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool = False


def _read_header(member) -> ArrayHeader:
    with _HEADER_LOCK:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(member)
        else:
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(member)
    return ArrayHeader(tuple(shape), np.dtype(dtype), bool(fortran_order))


def _read_data(member, header: ArrayHeader) -> np.ndarray:
    """The array whose ``header`` was just read from ``member`` (``ValueError`` when the data is cut short)."""
    stored = header.shape[::-1] if header.fortran_order else header.shape
    array = np.empty(stored, dtype=header.dtype)
    if array.nbytes and member.readinto(array.reshape(-1).view(np.uint8)) != array.nbytes:
        raise ValueError(f"the array data ends before its {array.nbytes} bytes")
    return array.T if header.fortran_order else array


def read_npz(path: Path, keys: tuple[str, ...], header_only: tuple[str, ...] = (),
             optional: tuple[str, ...] = ()) -> dict[str, np.ndarray | ArrayHeader]:
    """Members of an .npz file.

    Args:
        path: the file.
        keys: members to return (all must exist).
        header_only: subset of ``keys`` returned as ``ArrayHeader`` (data not read).
        optional: further members returned when the file has them (absent from the result otherwise, and
            also when they hold Python objects, which only unpickling could read).

    Raises:
        DataFormatError: the file is missing, not a readable .npz (truncated, corrupt, pickled objects) or
        lacks one of ``keys``; the message names the file.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = {name[:-4] if name.endswith(".npy") else name: name for name in archive.namelist()}
            missing = [key for key in keys if key not in names]
            if missing:
                raise DataFormatError(f"{path}: missing key(s) {missing}; the file has {sorted(names)}")
            out: dict[str, np.ndarray | ArrayHeader] = {}
            for key in (*keys, *(k for k in optional if k in names)):
                with archive.open(names[key]) as member:
                    header = _read_header(member)
                    if key in optional and header.dtype.hasobject:
                        continue  # an optional member readable only by unpickling is left out, never unpickled
                    if key in header_only:
                        out[key] = header
                        continue
                    # A header may promise any size; allocating it first would fail (or swap) on a 400 kB file.
                    promised = int(np.prod(header.shape, dtype=np.int64)) * header.dtype.itemsize
                    if promised > archive.getinfo(names[key]).file_size:
                        raise DataFormatError(f"{path}: member {key!r} claims {header.shape} {header.dtype} "
                                              f"({promised} bytes) but holds {archive.getinfo(names[key]).file_size}")
                    if header.dtype.hasobject:  # what np.load(allow_pickle=False) refuses: only a pickle holds it
                        raise ValueError(f"member {key!r} holds Python objects, which only unpickling could read")
                    out[key] = _read_data(member, header)
            return out
    except DataFormatError:
        raise
    except FileNotFoundError:
        raise DataFormatError(f"{path}: file not found") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError, KeyError, MemoryError,
            SyntaxError, tokenize.TokenError) as error:  # the last two: a damaged .npy header (Python literal text)
        why = str(error).splitlines()[0] if str(error) else ""
        raise DataFormatError(f"{path}: not a readable .npz file ({type(error).__name__}: {why})") from None

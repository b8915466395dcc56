"""A small cache made by ``rpm-generate --cache-size``, shared by the tests of the generator's cache writer
(tests/generator/test_cache_writer.py), of ``rpm-data`` (tests/data/test_cli.py) and of a dataset reading a
cache (tests/data/test_cache.py); the uninterrupted build is the ``reference`` fixture of tests/conftest.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

#: 12 rows in 3 chunks of 4 (center_single, then left_center_single_right_center_single, k = 0..5).
SETTINGS = dict(configurations=["Center", "L-R"], count=6, size=16, progress=False, chunk_size=4, seed=3)


def one_error_line(capsys, program: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"{program}: error: ") and "Traceback" not in err[0]
    return err[0]


def edited_cache(reference: Path, tmp_path: Path, edit) -> Path:
    """A copy of ``reference`` in ``tmp_path/cache`` whose manifest.json was changed by ``edit``."""
    out = tmp_path / "cache"
    shutil.copytree(reference, out)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out

"""``rpm-generate --cache-size``: problems straight into a training cache, equal byte for byte to generating the
files and running ``rpm-data prepare`` on them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.data.cache import CacheReader, prepare_cache
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.fingerprint import data_fingerprint
from rpm_lib.generator import cli
from rpm_lib.generator.cache_writer import GeneratedRecords, generate_cache
from rpm_lib.generator.writer import write_dataset


def _two_step(tmp_path: Path, size: int, **settings) -> Path:
    """The recipe the generated cache must equal: problem files, then ``prepare_cache``."""
    write_dataset(tmp_path / "raw", write_xml=False, progress=False, **settings)
    return prepare_cache(tmp_path / "raw", tmp_path / "prepared", size, show_progress=False)


def _assert_same_cache(prepared: Path, generated: Path) -> None:
    arrays = sorted(p.name for p in prepared.glob("*.npy"))
    assert arrays == sorted(p.name for p in generated.glob("*.npy")) and "problem_hashes.npy" in arrays
    for name in arrays:
        assert (prepared / name).read_bytes() == (generated / name).read_bytes(), name
    assert data_fingerprint(prepared) == data_fingerprint(generated)
    one, other = (json.loads((folder / "manifest.json").read_text()) for folder in (prepared, generated))
    assert {key for key in one if one[key] != other[key]} == {"plan"}  # regime, counts, meta_rows: all equal
    assert one["plan"]["files_sha256"] == other["plan"]["files_sha256"]  # the same problems in the same rows


@pytest.mark.parametrize("settings", [
    dict(configurations="all", count=3, start=5),  # k = 5..7: train and val rows in every configuration
    dict(configurations=["L-R", "Center"], count=10, regime="A/Color", mode="balanced"),  # given order, all splits
    dict(configurations=["Center", "O-IC"], count=4, start=7, regime="I-RAVEN-Mesh"),  # 12-row labels
    dict(configurations=["2x2Grid"], count=6, mode="original", val=0, test=10, seed=7),
], ids=["i-raven", "attributeless", "mesh", "original-all-test"])
def test_a_generated_cache_equals_the_prepared_files_byte_for_byte(tmp_path, settings):
    size = 24
    prepared = _two_step(tmp_path, size, **settings)
    summary = generate_cache(tmp_path / "generated", size=size, progress=False, workers=2, chunk_size=4, **settings)
    rows = len(np.load(prepared / "targets.npy"))
    assert summary == {"total": rows, "skipped": 0, "written": rows}
    _assert_same_cache(prepared, tmp_path / "generated")


def test_an_interrupted_generation_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    settings = dict(configurations=["Center", "U-D"], count=10, seed=3)
    prepared = _two_step(tmp_path, 16, **settings)
    made = []
    original = GeneratedRecords.__call__

    def dies_at_the_thirteenth(self, file):
        if len(made) == 12:
            raise KeyboardInterrupt
        made.append(file.source_id)
        return original(self, file)

    monkeypatch.setattr(GeneratedRecords, "__call__", dies_at_the_thirteenth)
    out = tmp_path / "generated"
    with pytest.raises(KeyboardInterrupt):
        generate_cache(out, size=16, progress=False, chunk_size=5, **settings)
    assert not out.exists() and (tmp_path / "generated.partial").is_dir()  # never looks complete
    monkeypatch.setattr(GeneratedRecords, "__call__", original)
    summary = generate_cache(out, size=16, progress=False, chunk_size=5, **settings)
    assert summary == {"total": 20, "skipped": 10, "written": 10}  # two chunks of 5 were kept
    _assert_same_cache(prepared, out)


def test_the_same_command_again_checks_and_other_settings_are_refused_by_name(tmp_path, capsys):
    out = tmp_path / "cache"
    settings = dict(configurations=["Center"], count=4, size=16, progress=False)
    assert generate_cache(out, **settings)["written"] == 4
    assert generate_cache(out, **settings) == {"total": 4, "skipped": 4, "written": 0}
    assert "cache is complete and up to date" in capsys.readouterr().err
    with pytest.raises(DataFormatError, match=r"differs in seed 1234 there, 5 asked\)"):
        generate_cache(out, **{**settings, "seed": 5})
    with pytest.raises(DataFormatError, match=r"differs in num_rows 4 there, 6 asked\)"):
        generate_cache(out, **{**settings, "count": 6})
    with pytest.raises(DataFormatError, match=r"differs in image_size 16 there, 20 asked\)"):
        generate_cache(out, **{**settings, "size": 20})
    with pytest.raises(DataFormatError, match=r"differs in the problem indices or configurations\)"):
        generate_cache(out, **{**settings, "start": 1})
    with pytest.raises(DataFormatError, match="rpm-generate --cache-size 32"):
        CacheReader(out, "raven", 32, "area")


def test_the_command_line_writes_a_cache_and_refuses_mixing_files_and_caches(tmp_path, capsys):
    out = tmp_path / "c16"
    argv = ["--out", str(out), "--cache-size", "16", "--num-per-config", "2", "--configurations", "Center", "--quiet"]
    assert cli.main(argv) == 0
    assert "(a cache at 16 px; 2 written, 0 already complete)" in capsys.readouterr().out
    assert not (out / "center_single").exists() and (out / "panels.npy").is_file()
    assert np.load(out / "panels.npy").shape == (2, 16, 16, 16)
    # Problem files into the cache would change its data (and fingerprint): refused, nothing written.
    assert cli.main(argv[:2] + argv[4:]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a training cache" in err and "Traceback" not in err
    assert not (out / "center_single").exists()
    # A cache into a folder of problem files: refused the same way.
    raw = tmp_path / "raw"
    assert cli.main(["--out", str(raw)] + argv[4:]) == 0
    capsys.readouterr()
    assert cli.main(["--out", str(raw)] + argv[2:]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not an rpm_lib cache" in err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--out", str(tmp_path / "x"), "--cache-size", "0"])
    assert exit_info.value.code == 2 and "--cache-size must be >= 1, got 0" in capsys.readouterr().err

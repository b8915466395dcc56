"""``rpm-generate --cache-size``: problems straight into a training cache, equal byte for byte to generating the
files and running ``rpm-data prepare`` on them; a build killed at any moment, or whose files were damaged,
resumed or redone to the same bytes; odd ``--out`` and numbers; a cache edited or replaced by hand."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from generated_caches import SETTINGS, edited_cache, one_error_line
from rpm_lib.data import RavenDataset
from rpm_lib.data import cli as data_cli
from rpm_lib.data.cache import CacheReader, prepare_cache
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.fingerprint import data_fingerprint
from rpm_lib.generator import cli
from rpm_lib.generator.cache_writer import GeneratedRecords, generate_cache
from rpm_lib.generator.writer import write_dataset

ENV = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"}
#: The cache of ``SETTINGS`` from the command line (chunks of 64: one chunk).
ARGV = ["--cache-size", "16", "--num-per-config", "6", "--configurations", "Center,L-R", "--seed", "3", "--quiet"]


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
    dict(configurations=["O-IG", "3x3Grid"], count=3, mode="fair", seed=8),
], ids=["i-raven", "attributeless", "mesh", "original-all-test", "fair"])
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


def _assert_same_bytes(reference: Path, out: Path) -> None:
    names = sorted(p.name for p in reference.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names
    for name in names:
        assert (reference / name).read_bytes() == (out / name).read_bytes(), name


def _interrupted(out: Path, monkeypatch, after: int = 8) -> Path:
    """An interrupted build of SETTINGS into ``out`` with its first ``after // 4`` chunks finished; its partial."""
    original, made = GeneratedRecords.__call__, []

    def dies(self, file):
        if len(made) == after:
            raise KeyboardInterrupt
        made.append(file)
        return original(self, file)

    monkeypatch.setattr(GeneratedRecords, "__call__", dies)
    with pytest.raises(KeyboardInterrupt):
        generate_cache(out, **SETTINGS)
    monkeypatch.setattr(GeneratedRecords, "__call__", original)
    return out.with_name(out.name + ".partial")


# ------------------------------------------------------------------------------------------------------------
# Killed builds: the same command again finishes them, never redoing finished work, to the same bytes
# ------------------------------------------------------------------------------------------------------------

_KILLER = """
import os, signal, sys
import rpm_lib.data.cache.build as cache
from rpm_lib.generator.cache_writer import generate_cache

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

point = sys.argv[2]
if point == "a chunk":  # chunk 0 finished and journaled, chunk 1 killed mid-way
    convert = cache._convert_chunk
    cache._convert_chunk = lambda chunk: die() if chunk.chunk_id == 1 else convert(chunk)
elif point == "the meta trim":  # meta.npy already cut to its 8 plain rows, no manifest yet
    trim = cache._trim_meta
    cache._trim_meta = lambda *args: (trim(*args), die())
elif point == "the manifest":
    write = cache.write_object
    cache.write_object = lambda path, data: die() if path.name == "manifest.json" else write(path, data)
elif point == "the rename":  # complete, with its manifest, still under <out>.partial
    os.rename = die
generate_cache(sys.argv[1], **SETTINGS)
"""


@pytest.mark.parametrize("point, written", [
    ("a chunk", 8),  # guard: 4 rows were journaled before the kill
    ("the meta trim", 0),  # found: the finished build was thrown away ("other inputs/settings") and redone
    ("the manifest", 0),  # found: the same
    ("the rename", 0),  # found: the same; the "killed before the rename" branch could never be reached
])
def test_a_build_killed_with_sigkill_resumes_without_redoing_work_to_the_same_bytes(reference, tmp_path, capsys,
                                                                                   point, written):
    out = tmp_path / "cache"
    script = f"SETTINGS = {SETTINGS!r}\n" + _KILLER
    killed = subprocess.run([sys.executable, "-c", script, str(out), point], env=ENV, capture_output=True, text=True,
                            timeout=120)
    assert killed.returncode == -9, killed.stderr
    assert not out.exists()

    summary = generate_cache(out, **SETTINGS)

    assert summary == {"total": 12, "skipped": 12 - written, "written": written}
    assert "discarding" not in capsys.readouterr().err
    _assert_same_bytes(reference, out)
    assert not out.with_name("cache.partial").exists()


# ------------------------------------------------------------------------------------------------------------
# Interrupted builds whose files were damaged: started again, never trusted (found)
# ------------------------------------------------------------------------------------------------------------


def _truncate(path: Path, size: int) -> None:
    with path.open("r+b") as handle:
        handle.truncate(size)


@pytest.mark.parametrize("name, damage", [
    # numpy's r+ memory map pads a short file with zeros: the finished rows' answers silently became 0
    ("targets.npy", lambda p: _truncate(p, 130)),
    ("problem_hashes.npy", lambda p: _truncate(p, 130)),
    ("panels.npy", lambda p: p.unlink()),  # was: "No such file" with "a rerun resumes", forever
    ("panels.npy", lambda p: _truncate(p, 20)),  # was: a ValueError traceback (EOF reading the header)
    ("valid.npy", lambda p: p.unlink()),
], ids=["targets-truncated", "hashes-truncated", "panels-deleted", "panels-header-cut", "valid-deleted"])
def test_a_damaged_interrupted_build_is_started_again_not_trusted(reference, tmp_path, monkeypatch, capsys, name,
                                                                  damage):
    out = tmp_path / "cache"
    partial = _interrupted(out, monkeypatch)
    damage(partial / name)
    capsys.readouterr()

    assert generate_cache(out, **SETTINGS)["written"] == 12

    err = capsys.readouterr().err
    assert f"{partial}: discarding an interrupted build that cannot be continued ({name}: " in err
    _assert_same_bytes(reference, out)


def test_a_garbled_journal_line_is_ignored_not_a_traceback(reference, tmp_path, monkeypatch):
    out = tmp_path / "cache"
    partial = _interrupted(out, monkeypatch)
    with (partial / "journal.jsonl").open("a") as journal:  # found: TypeError 'NoneType' is not subscriptable
        journal.write('null\n{"chunk": "two"}\n')

    assert generate_cache(out, **SETTINGS) == {"total": 12, "skipped": 8, "written": 4}
    _assert_same_bytes(reference, out)


def test_a_file_where_the_partial_folder_goes_is_named_in_one_line(tmp_path, capsys):
    out = tmp_path / "cache"
    out.with_name("cache.partial").write_text("not a folder")
    # found: "Not a directory (cache.partial/plan.json); ... a rerun of the same command resumes", which it never did
    assert cli.main(["--out", str(out)] + ARGV) == 2
    line = one_error_line(capsys, "rpm-generate")
    assert f"{out.with_name('cache.partial')}: exists and is not a folder" in line
    assert out.with_name("cache.partial").read_text() == "not a folder"


# ------------------------------------------------------------------------------------------------------------
# Odd --out and odd numbers
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target_exists", [True, False], ids=["link-to-empty-folder", "dangling-link"])
def test_out_as_a_symbolic_link_gets_the_cache_where_it_points(reference, tmp_path, capsys, target_exists):
    # found: the whole build ran, then the rename onto the link failed with "Not a directory ...; a rerun of the
    # same command resumes", and every rerun failed the same way
    target, link = tmp_path / "scratch" / "cache", tmp_path / "cache"
    if target_exists:
        target.mkdir(parents=True)
    else:
        target.parent.mkdir()
    link.symlink_to(target)

    assert cli.main(["--out", str(link)] + ARGV) == 0
    assert link.is_symlink() and (target / "manifest.json").is_file()
    assert len(RavenDataset(link, "train", image_size=16, configurations=["center_single"])) == 6
    assert cli.main(["--out", str(link)] + ARGV) == 0
    assert "0 written, 12 already complete" in capsys.readouterr().out


def test_a_start_beyond_the_caches_int64_ids_is_refused_before_anything_is_made(tmp_path, capsys):
    # found: an OverflowError traceback from np.save(file_ids.npy), leaving a half-made partial folder
    out = tmp_path / "cache"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--out", str(out), "--start", str(2**63 - 2)] + ARGV)
    assert exit_info.value.code == 2
    line = one_error_line(capsys, "rpm-generate")
    assert "--start" in line and "2**63" in line
    assert list(tmp_path.iterdir()) == []


def test_a_cache_request_far_beyond_the_disk_is_refused_at_once_with_one_line(tmp_path):
    # found: the rows were listed before the space check: 23 GB of memory for --num-per-config 10**11 (killed),
    # and for 10**8 many minutes of silence. A 3 GB address-space limit keeps the old behaviour from eating the
    # machine (it failed by the timeout).
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    out = tmp_path / "huge"
    began = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "rpm_lib.generator.cli", "--out", str(out), "--cache-size", "80",
                             "--num-per-config", "100000000", "--quiet"],
                            capture_output=True, text=True, timeout=30, env=ENV, preexec_fn=limit)
    seconds = time.perf_counter() - began

    err = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert len(err) == 1 and result.stdout == ""
    assert err[0].startswith(f"rpm-generate: error: no space left on {tmp_path} for rpm-generate: need ~")
    assert "(700,000,000 problems to write, ~" in err[0]
    assert seconds < 15, f"took {seconds:.1f} s"
    assert not out.exists() and not out.with_name("huge.partial").exists()


def test_a_full_disk_does_not_refuse_rerunning_a_finished_cache(reference, tmp_path, monkeypatch, capsys):
    # guard for the up-front space check above: a finished cache needs no space, a full disk must not refuse it
    import shutil as shutil_module
    from collections import namedtuple

    out = tmp_path / "cache"
    shutil.copytree(reference, out)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda _path: usage(10**9, 10**9 - 10**6, 10**6))
    assert generate_cache(out, **SETTINGS)["written"] == 0


def test_a_newline_typed_into_out_keeps_the_error_on_one_line(reference, tmp_path, capsys):
    out = tmp_path / "two\nlines"
    shutil.copytree(reference, out)
    # found: the message quoted the path as typed, so it was two lines
    assert cli.main(["--out", str(out), *ARGV[:-1], "--seed", "4", "--quiet"]) == 2
    line = one_error_line(capsys, "rpm-generate")
    assert "two\\nlines" in line and "seed 3 there, 4 asked" in line
    (out / "panels.npy").unlink()
    assert data_cli.main(["info", str(out)]) == 2
    assert "two\\nlines/panels.npy: missing" in one_error_line(capsys, "rpm-data")

# ------------------------------------------------------------------------------------------------------------
# A cache edited, damaged or replaced, and what rpm-generate then says
# ------------------------------------------------------------------------------------------------------------


def test_an_odd_opencv_record_does_not_crash_the_up_to_date_check(reference, tmp_path, capsys):
    out = edited_cache(reference, tmp_path, lambda m: m["plan"].update(opencv="4.x"))
    # found: AttributeError: 'str' object has no attribute 'get'
    assert cli.main(["--out", str(out)] + ARGV) == 0
    assert "would make some pixels differently" in capsys.readouterr().err


def test_an_object_array_in_a_downloaded_cache_is_refused_in_one_line(reference, tmp_path, capsys):
    out = tmp_path / "cache"
    shutil.copytree(reference, out)
    groups = np.load(out / "groups.npy")
    np.save(out / "groups.npy", np.array(list(groups), dtype=object), allow_pickle=True)  # a pickle inside
    # found: "ValueError: Object arrays cannot be loaded when allow_pickle=False" as a traceback
    assert cli.main(["--out", str(out)] + ARGV) == 2
    assert f"{out / 'groups.npy'}: dtype object, expected an integer array" in one_error_line(capsys, "rpm-generate")
    with pytest.raises(DataFormatError, match=r"groups.npy: dtype object"):
        RavenDataset(out, "train", image_size=16)


def test_a_damaged_generated_cache_points_to_rpm_generate_not_a_raw_folder(reference, tmp_path, capsys):
    out = tmp_path / "cache"
    shutil.copytree(reference, out)
    (out / "targets.npy").unlink()
    # found: "rebuild it with `rpm-data prepare`", which needs the raw folder a generated cache never had
    assert cli.main(["--out", str(out)] + ARGV) == 2
    line = one_error_line(capsys, "rpm-generate")
    assert "targets.npy: missing" in line and "delete it and rebuild it with `rpm-generate --cache-size`" in line

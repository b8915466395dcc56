"""Hostile round 4: ``rpm-generate --cache-size`` (generated problems straight into a training cache), and the
cache it leaves used by ``rpm-data`` and by training. Each case is what a careless or confused user did; the
ones marked "found" failed before their fix (the report of this round lists them)."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.data import DataFormatError, RavenDataset
from rpm_lib.data import cli as data_cli
from rpm_lib.generator import cli as generator_cli
from rpm_lib.generator.cache_writer import GeneratedRecords, generate_cache

ENV = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"}
#: 12 rows in 3 chunks of 4 (center_single, then left_center_single_right_center_single, k = 0..5).
SETTINGS = dict(configurations=["Center", "L-R"], count=6, size=16, progress=False, chunk_size=4, seed=3)
#: The same cache from the command line (chunks of 64: one chunk).
ARGV = ["--cache-size", "16", "--num-per-config", "6", "--configurations", "Center,L-R", "--seed", "3", "--quiet"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted build of SETTINGS, to compare resumed builds with byte for byte."""
    out = tmp_path_factory.mktemp("reference") / "cache"
    generate_cache(out, **SETTINGS)
    return out


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


def _one_error_line(capsys, program: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"{program}: error: ") and "Traceback" not in err[0]
    return err[0]


# ------------------------------------------------------------------------------------------------------------
# Killed builds: the same command again finishes them, never redoing finished work, to the same bytes
# ------------------------------------------------------------------------------------------------------------

_KILLER = """
import os, signal, sys
import rpm_lib.data.cache as cache
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
    write = cache._write_json_atomic
    cache._write_json_atomic = lambda path, data: die() if path.name == "manifest.json" else write(path, data)
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
    assert generator_cli.main(["--out", str(out)] + ARGV) == 2
    line = _one_error_line(capsys, "rpm-generate")
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

    assert generator_cli.main(["--out", str(link)] + ARGV) == 0
    assert link.is_symlink() and (target / "manifest.json").is_file()
    assert len(RavenDataset(link, "train", image_size=16, configurations=["center_single"])) == 6
    assert generator_cli.main(["--out", str(link)] + ARGV) == 0
    assert "0 written, 12 already complete" in capsys.readouterr().out


def test_a_start_beyond_the_caches_int64_ids_is_refused_before_anything_is_made(tmp_path, capsys):
    # found: an OverflowError traceback from np.save(file_ids.npy), leaving a half-made partial folder
    out = tmp_path / "cache"
    with pytest.raises(SystemExit) as exit_info:
        generator_cli.main(["--out", str(out), "--start", str(2**63 - 2)] + ARGV)
    assert exit_info.value.code == 2
    line = _one_error_line(capsys, "rpm-generate")
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
    assert generator_cli.main(["--out", str(out), *ARGV[:-1], "--seed", "4", "--quiet"]) == 2
    line = _one_error_line(capsys, "rpm-generate")
    assert "two\\nlines" in line and "seed 3 there, 4 asked" in line
    (out / "panels.npy").unlink()
    assert data_cli.main(["info", str(out)]) == 2
    assert "two\\nlines/panels.npy: missing" in _one_error_line(capsys, "rpm-data")


# ------------------------------------------------------------------------------------------------------------
# A cache edited, damaged or replaced, and what rpm-generate, rpm-data and training then say
# ------------------------------------------------------------------------------------------------------------


def _edited(reference: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "cache"
    shutil.copytree(reference, out)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize("edit, named", [
    (lambda m: m.pop("plan"), "field 'plan' must be the build plan"),  # found: KeyError traceback
    (lambda m: m["plan"].pop("source_root"), None),  # found: KeyError traceback; now "source (not recorded)"
    (lambda m: m.pop("num_valid"), None),  # found: KeyError traceback; the count comes from valid.npy now
    (lambda m: m.update(counts=[1, 2]), None),  # found: AttributeError traceback
    (lambda m: m.update(counts={"center_single": {"train": 600}}), None),  # found: info said 600 train problems
    (lambda m: m.update(num_rows=10**26), "panels.npy: shape (12, 16, 16, 16), but manifest.json"),  # found: exit 0
], ids=["no-plan", "no-source", "no-num-valid", "counts-a-list", "counts-lie", "huge-num-rows"])
def test_rpm_data_info_on_a_hand_edited_manifest_never_crashes_nor_lies(reference, tmp_path, capsys, edit, named):
    out = _edited(reference, tmp_path, edit)
    code = data_cli.main(["info", str(out)])
    if named is not None:
        assert code == 2 and named in _one_error_line(capsys, "rpm-data")
        return
    assert code == 0
    text = capsys.readouterr().out
    assert "problems     12 valid of 12 (0 skipped)" in text
    assert "| center_single | 6 | 0 | 0 |" in text and "| left_center_single_right_center_single | 6 | 0 | 0 |" in text


def test_an_odd_opencv_record_does_not_crash_the_up_to_date_check(reference, tmp_path, capsys):
    out = _edited(reference, tmp_path, lambda m: m["plan"].update(opencv="4.x"))
    # found: AttributeError: 'str' object has no attribute 'get'
    assert generator_cli.main(["--out", str(out)] + ARGV) == 0
    assert "would make some pixels differently" in capsys.readouterr().err


def test_an_object_array_in_a_downloaded_cache_is_refused_in_one_line(reference, tmp_path, capsys):
    out = tmp_path / "cache"
    shutil.copytree(reference, out)
    groups = np.load(out / "groups.npy")
    np.save(out / "groups.npy", np.array(list(groups), dtype=object), allow_pickle=True)  # a pickle inside
    # found: "ValueError: Object arrays cannot be loaded when allow_pickle=False" as a traceback
    assert generator_cli.main(["--out", str(out)] + ARGV) == 2
    assert f"{out / 'groups.npy'}: dtype object, expected an integer array" in _one_error_line(capsys, "rpm-generate")
    with pytest.raises(DataFormatError, match=r"groups.npy: dtype object"):
        RavenDataset(out, "train", image_size=16)


def test_a_damaged_generated_cache_points_to_rpm_generate_not_a_raw_folder(reference, tmp_path, capsys):
    out = tmp_path / "cache"
    shutil.copytree(reference, out)
    (out / "targets.npy").unlink()
    # found: "rebuild it with `rpm-data prepare`", which needs the raw folder a generated cache never had
    assert generator_cli.main(["--out", str(out)] + ARGV) == 2
    line = _one_error_line(capsys, "rpm-generate")
    assert "targets.npy: missing" in line and "delete it and rebuild it with `rpm-generate --cache-size`" in line


def test_a_cache_replaced_while_a_run_reads_it_is_refused_not_mixed(tmp_path):
    """A DataLoader worker maps ``panels.npy`` when it starts (each epoch without persistent workers): found, it
    mapped the new cache's panels beside the labels read from the old one, silently."""
    first, second = tmp_path / "cache", tmp_path / "other"
    for out, seed in ((first, 1), (second, 2)):
        generate_cache(out, **{**SETTINGS, "seed": seed})
    dataset = RavenDataset(first, "train", image_size=16, configurations=["center_single"])
    dataset[0]
    in_a_worker = pickle.dumps(dataset)  # what a spawned worker receives
    shutil.rmtree(first)
    shutil.copytree(second, first)  # the user regenerated it "with the same command", another seed

    worker = pickle.loads(in_a_worker)
    with pytest.raises(DataFormatError, match=r"cache/panels.npy: changed since the dataset was opened"):
        worker[0]
    dataset[0]  # the process that mapped the old file keeps reading it whole


def test_rpm_data_prepare_names_a_problem_index_past_int64(tmp_path, capsys):
    # found: rpm-generate writes RAVEN_9223372036854775808_test.npz (file names have no limit), and preparing the
    # folder died with "OverflowError: Python int too large to convert to C long", leaving a half-made partial
    from rpm_lib.generator.writer import write_dataset

    raw = tmp_path / "raw"
    write_dataset(raw, ["center_single"], count=1, start=2**63, write_xml=False, progress=False)
    assert data_cli.main(["prepare", str(raw), "--out", str(tmp_path / "cache"), "--size", "16", "--no-progress"]) == 2
    line = _one_error_line(capsys, "rpm-data")
    assert "RAVEN_9223372036854775808_test.npz: problem index 9223372036854775808 is past 2**63 - 1" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_rpm_data_prepare_on_a_cache_says_it_is_a_cache(reference, tmp_path, capsys):
    # found: "no configuration folders (expected subfolders named like [...])", as if the folder were empty
    assert data_cli.main(["prepare", str(reference), "--out", str(tmp_path / "again"), "--size", "16",
                          "--no-progress"]) == 2
    line = _one_error_line(capsys, "rpm-data")
    assert f"{reference}: is a training cache, not a folder of problem files" in line
    assert not (tmp_path / "again").exists()

"""Caches that lie: a damaged or edited cache is refused on open with one DataFormatError that names
the file and the field, and `rpm-data prepare` never calls a damaged cache "up to date"."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.data import DataFormatError, RavenDataset, prepare_cache, read_manifest


@pytest.fixture(scope="module")
def raw_and_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from rpm_lib.generator.writer import write_dataset

    root = tmp_path_factory.mktemp("hostile-cache")
    raw = root / "raw"
    write_dataset(raw, "all", count=10, seed=5, progress=False)  # k 0-5 train, 6-7 val, 8-9 test
    cache = prepare_cache(raw, root / "cache", size=32, show_progress=False)
    return raw, cache


@pytest.fixture
def damaged(raw_and_cache: tuple[Path, Path], tmp_path: Path) -> Path:
    """A private copy of the good cache to break."""
    copy = tmp_path / "cache"
    shutil.copytree(raw_and_cache[1], copy)
    return copy


def _die_in_worker(_chunk) -> None:
    """What SIGBUS from a memory map on a full disk does to a cache worker (module level: it is pickled)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def _open(cache: Path) -> RavenDataset:
    return RavenDataset(cache, "train", image_size=32)


def _edit_manifest(cache: Path, **changes) -> None:
    manifest = json.loads((cache / "manifest.json").read_text())
    for key, value in changes.items():
        if value is None:
            manifest.pop(key)
        else:
            manifest[key] = value
    (cache / "manifest.json").write_text(json.dumps(manifest))


def test_the_intact_cache_opens(raw_and_cache: tuple[Path, Path]) -> None:
    assert len(_open(raw_and_cache[1])) == 7 * 6


def test_a_deleted_manifest_is_named(damaged: Path) -> None:
    (damaged / "manifest.json").unlink()
    with pytest.raises(DataFormatError, match=r"incomplete or damaged cache \(has \['panels.npy'\] but no manifest"):
        _open(damaged)


def test_a_truncated_panels_file_is_refused_on_open_and_by_prepare(raw_and_cache, damaged: Path) -> None:
    panels = damaged / "panels.npy"
    with panels.open("r+b") as handle:
        handle.truncate(panels.stat().st_size // 2)
    with pytest.raises(DataFormatError, match=r"panels.npy: truncated: \d+ bytes, \d+ needed"):
        _open(damaged)
    with pytest.raises(DataFormatError, match=r"panels.npy: truncated"):
        prepare_cache(raw_and_cache[0], damaged, size=32, show_progress=False)


def test_an_edited_image_size_is_caught(damaged: Path) -> None:
    _edit_manifest(damaged, image_size=48)
    with pytest.raises(DataFormatError, match=r"panels.npy: shape \(\d+, 16, 32, 32\), but manifest.json .* needs"):
        RavenDataset(damaged, "train", image_size=48)


@pytest.mark.parametrize(("changes", "message"), [
    ({"num_rows": "many"}, r"field 'num_rows' must be a row count \(int\), got 'many'"),
    ({"group_names": None}, r"field 'group_names' must be a list of names"),
    ({"kind": None}, r"field 'kind' missing"),
    ({"plan": []}, r"field 'plan' must be the build plan \(dict\)"),
])
def test_malformed_manifests_name_the_field(damaged: Path, changes: dict, message: str) -> None:
    _edit_manifest(damaged, **changes)
    with pytest.raises(DataFormatError, match=f"manifest.json: {message}"):
        _open(damaged)


def test_a_group_id_out_of_range_is_refused_not_dropped(damaged: Path) -> None:
    groups = np.load(damaged / "groups.npy")
    groups[3] = 99
    np.save(damaged / "groups.npy", groups)
    with pytest.raises(DataFormatError, match=r"groups.npy: id 99 outside 0..6"):
        _open(damaged)


def test_a_missing_label_array_is_named(damaged: Path) -> None:
    (damaged / "targets.npy").unlink()
    with pytest.raises(DataFormatError, match=r"targets.npy: missing"):
        _open(damaged)


def test_replaced_raw_files_make_an_existing_cache_stale_not_up_to_date(tmp_path: Path) -> None:
    from rpm_lib.generator.writer import write_dataset

    raw = tmp_path / "raw"
    write_dataset(raw, ["center_single"], count=10, seed=5, progress=False)
    cache = prepare_cache(raw, tmp_path / "cache", size=32, configurations=["center_single"], show_progress=False)
    assert prepare_cache(raw, cache, size=32, configurations=["center_single"], show_progress=False) == cache
    # Another problem's bytes under the same name (what regenerating with another seed does).
    first, other = raw / "center_single" / "RAVEN_0_train.npz", raw / "center_single" / "RAVEN_1_train.npz"
    first.write_bytes(other.read_bytes())
    with pytest.raises(DataFormatError, match=r"built from other inputs or settings exists \(differs in content_sha256\)"):
        prepare_cache(raw, cache, size=32, configurations=["center_single"], show_progress=False)


def test_a_second_prepare_into_the_same_folder_is_refused(raw_and_cache, tmp_path: Path) -> None:
    from rpm_lib.folder_lock import FolderBusyError, exclusive_writer

    out = tmp_path / "busy"
    with exclusive_writer(out.with_name("busy.lock"), "rpm-data prepare"):
        with pytest.raises(FolderBusyError, match=r"another rpm-data prepare is writing here \(pid \d+"):
            prepare_cache(raw_and_cache[0], out, size=32, show_progress=False)
    assert not out.exists() and not out.with_name("busy.partial").exists()


def test_a_cache_that_cannot_fit_is_refused_before_any_byte(raw_and_cache, tmp_path: Path, monkeypatch) -> None:
    import shutil as shutil_module
    from collections import namedtuple

    from rpm_lib.folder_lock import NotEnoughSpaceError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda _path: usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(NotEnoughSpaceError, match=r"no space left on .* for rpm-data prepare: need ~\d+ MB, 1 MB free"):
        prepare_cache(raw_and_cache[0], tmp_path / "full", size=160, show_progress=False)
    assert not (tmp_path / "full").exists() and not (tmp_path / "full.partial").exists()


def test_rpm_data_answers_a_busy_folder_with_one_line(raw_and_cache, tmp_path: Path, capsys) -> None:
    from rpm_lib.data.cli import main
    from rpm_lib.folder_lock import exclusive_writer

    out = tmp_path / "busy"
    with exclusive_writer(out.with_name("busy.lock"), "rpm-data prepare"):
        assert main(["prepare", str(raw_and_cache[0]), "--out", str(out), "--size", "32", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rpm-data: error: ") and "another rpm-data prepare" in err[0]


def test_a_worker_killed_mid_build_stops_the_build_with_an_error_not_a_hang(raw_and_cache, tmp_path: Path,
                                                                            monkeypatch) -> None:
    from rpm_lib.data.cache import build as cache_module

    monkeypatch.setattr(cache_module, "_convert_chunk", _die_in_worker)
    with pytest.raises(RuntimeError, match=r"a worker process died .* finished chunks are kept and a rerun resumes"):
        prepare_cache(raw_and_cache[0], tmp_path / "killed", size=32, workers=2, chunk_size=8, show_progress=False)
    monkeypatch.undo()
    cache = prepare_cache(raw_and_cache[0], tmp_path / "killed", size=32, workers=2, chunk_size=8, show_progress=False)
    assert len(RavenDataset(cache, "train", image_size=32)) == 7 * 6


@pytest.mark.parametrize("content", ["[1, 2]", '"a string"', "3"])
def test_a_manifest_that_is_not_an_object_is_one_line(damaged: Path, content: str) -> None:
    (damaged / "manifest.json").write_text(content)
    with pytest.raises(DataFormatError, match=r"manifest.json: expected a JSON object, got (list|str|int)"):
        read_manifest(damaged)


#: JSON nested 100,000 levels deep: ``json.loads`` recurses once per level, so reading it whole ends in a
#: RecursionError (a traceback) unless the depth is bounded before parsing.
DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000


def test_a_manifest_nested_100000_deep_is_one_line(damaged: Path) -> None:
    (damaged / "manifest.json").write_text(DEEP)
    with pytest.raises(DataFormatError) as caught:
        _open(damaged)
    message = str(caught.value)
    assert message.startswith(f"{damaged / 'manifest.json'}: nested deeper than 200 levels") and "\n" not in message


@pytest.mark.parametrize(("changes", "message"), [
    # found: AttributeError traceback ('list' object has no attribute 'get') while naming the other size's cache
    ({"plan": [], "image_size": 48}, r"field 'plan' must be the build plan \(dict\), got \[\]"),
    # found: "cache built for image_size='32' cannot serve image_size=32", a size it would have been read at
    ({"image_size": "32"}, r"field 'image_size' must be a panel size in px \(int\), got '32'"),
    ({"version": True}, r"not an rpm_lib cache of version 1 \(format='rpm_lib-cache', version=True\)"),
])
def test_a_manifest_field_of_the_wrong_type_is_named_before_it_is_used(damaged: Path, changes: dict,
                                                                        message: str) -> None:
    _edit_manifest(damaged, **changes)
    with pytest.raises(DataFormatError, match=f"^{damaged / 'manifest.json'}: {message}"):
        _open(damaged)

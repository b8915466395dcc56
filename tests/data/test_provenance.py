"""Where a data folder's problems came from, recorded by content: every generated folder and every cache records
the hash of each problem and the regime it was generated with, and checks use those records.

A cache whose raw folder was deleted or regenerated with another regime, training problems renamed as test
problems, a ``regime.json`` edited by hand: each time a run either refuses with one line or labels the data by
what the cache itself recorded when it was built.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.data import RavenDataset, prepare_cache
from rpm_lib.data.cache import CacheReader
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.records import GeneratorSettingsError
from rpm_lib.data.problem_hashes import (CACHE_ARRAY, HASH_BYTES, RAW_RECORD, panels_hash, read_raw_record,
                                        write_raw_record)
from rpm_lib.data.validation import load_raven_npz
from rpm_lib.generator import writer
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.eval_sets import check_extra_sets, read_regime

CONFIGURATION = "center_single"
SIZE = 32


def _generate(root: Path, regime: str | None = None, seed: int = 3) -> Path:
    writer.write_dataset(root, [CONFIGURATION], count=10, seed=seed, progress=False, regime=regime)
    return root


def _cache(raw: Path, out: Path) -> Path:
    return prepare_cache(raw, out, size=SIZE, show_progress=False)


def _renamed_training_problems(train_root: Path, out: Path) -> Path:
    """A folder with no records whose "test" problems are ``train_root``'s training problems under other names."""
    folder = out / CONFIGURATION
    folder.mkdir(parents=True)
    for k, path in enumerate(sorted((train_root / CONFIGURATION).glob("RAVEN_*_train.npz"))):
        shutil.copyfile(path, folder / f"RAVEN_{100 + k}_test.npz")
    return out


def _config(data_root: Path, *test_roots: Path) -> TrainConfig:
    return TrainConfig(data_root=str(data_root), test_data_roots=[str(r) for r in test_roots],
                       configurations=["Center"], image_size=SIZE)


def _refusal(config: TrainConfig) -> str:
    with pytest.raises(ConfigError) as caught:
        check_extra_sets(config)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------------------------
# records written at creation
# ----------------------------------------------------------------------------------------------
def test_a_generated_folder_records_the_hash_of_every_problem(tmp_path):
    raw = _generate(tmp_path / "raw")
    record = read_raw_record(raw)
    files = sorted((raw / CONFIGURATION).glob("*.npz"))
    assert sorted(record) == [f"{CONFIGURATION}/{f.name}" for f in files]
    for path in files:
        assert record[f"{CONFIGURATION}/{path.name}"][0] == panels_hash(load_raven_npz(path).panels)


def test_an_interrupted_write_is_completed_in_the_record_on_resume(tmp_path):
    raw = _generate(tmp_path / "raw")
    (raw / RAW_RECORD).unlink()  # as if killed before the record was written
    writer.write_dataset(raw, [CONFIGURATION], count=10, seed=3, progress=False)
    assert len(read_raw_record(raw)) == 10


def test_a_cache_records_hashes_and_the_regime_of_its_raw_folder(tmp_path):
    raw = _generate(tmp_path / "raw", regime="A/Color")
    cache = _cache(raw, tmp_path / "cache")
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["regime"]["regime"] == "A/Color"
    reader = CacheReader(cache, "raven", SIZE, "area")
    stored = {bytes(row) for row in reader.problem_hashes}
    assert stored == {value for value, _, _ in read_raw_record(raw).values()}  # hashes of the 160 px originals


# ----------------------------------------------------------------------------------------------
# regime labels come from the cache's own record
# ----------------------------------------------------------------------------------------------
def test_a_cache_keeps_its_regime_when_its_raw_folder_is_regenerated_with_another(tmp_path):
    raw = _generate(tmp_path / "raw", regime="A/Color")
    cache = _cache(raw, tmp_path / "cache")
    shutil.rmtree(raw)
    _generate(raw, regime="I-RAVEN")
    assert read_regime(cache).name == "A/Color"
    shutil.rmtree(raw)
    assert read_regime(cache).name == "A/Color"


def test_a_cache_whose_recorded_regime_contradicts_its_labels_is_refused(tmp_path):
    cache = _cache(_generate(tmp_path / "raw"), tmp_path / "cache")
    manifest = json.loads((cache / "manifest.json").read_text())
    manifest["regime"].update(regime="I-RAVEN-Mesh", mesh=True)
    (cache / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"says mesh=True, but the cache's labels have 8 meta_matrix rows"):
        read_regime(cache)


# ----------------------------------------------------------------------------------------------
# regime.json against generator.json and the data
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit, shown", [
    ({"regime": "A/Color", "held_out": {"Color": "Constant"}}, "regime 'A/Color' vs 'I-RAVEN'"),
    ({"seed": 4}, "seed 4 vs 3"),
    ({"val": 0, "test": 10}, "val 0 vs 2; test 10 vs 2"),
])
def test_a_hand_edited_regime_json_is_refused_naming_the_disagreement(tmp_path, capsys, edit, shown):
    from rpm_lib.data import cli as data_cli

    raw = _generate(tmp_path / "raw")
    record = json.loads((raw / "regime.json").read_text())
    (raw / "regime.json").write_text(json.dumps({**record, **edit}))
    with pytest.raises(ConfigError) as caught:
        read_regime(raw)
    message = str(caught.value)
    assert message.startswith(f"config field 'data_root': {raw / 'regime.json'}: disagrees with {raw / 'generator.json'} (")
    assert shown in message and "\n" not in message
    assert data_cli.main(["prepare", str(raw), "--out", str(tmp_path / "cache"), "--size", "32",
                          "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"disagrees with {raw / 'generator.json'}" in err[0] and str(raw / "regime.json") in err[0]
    assert not (tmp_path / "cache").exists()


def test_a_regime_json_contradicting_the_data_is_refused(tmp_path):
    raw = _generate(tmp_path / "raw")
    for name in ("regime.json", "generator.json"):  # both edited alike: only the data can contradict them
        record = json.loads((raw / name).read_text())
        (raw / name).write_text(json.dumps({**record, "regime": "I-RAVEN-Mesh", "mesh": True}))
    with pytest.raises(ConfigError, match=r"says mesh=True, but .*RAVEN_0_train\.npz has 8-row meta_matrix labels"):
        read_regime(raw)


@pytest.mark.parametrize("damage", ["truncate", "edit"])
def test_a_damaged_regime_json_is_rewritten_on_resume(tmp_path, capsys, damage):
    raw = _generate(tmp_path / "raw", regime="A/Size")
    good = (raw / "regime.json").read_text()
    if damage == "truncate":
        (raw / "regime.json").write_text(good[: len(good) // 2])
    else:
        (raw / "regime.json").write_text(good.replace('"A/Size"', '"I-RAVEN"'))
    writer.write_dataset(raw, [CONFIGURATION], count=10, seed=3, progress=False, regime="A/Size")
    assert (raw / "regime.json").read_text() == good
    assert "regime.json did not match generator.json; rewritten from the settings" in capsys.readouterr().err
    assert read_regime(raw).name == "A/Size"


#: JSON nested 100,000 levels deep: ``json.loads`` recurses once per level (a RecursionError, a traceback) unless the
#: depth is bounded before parsing.
DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000


@pytest.mark.parametrize("name", ["regime.json", "generator.json"])
def test_a_record_nested_100000_deep_is_one_line_naming_it(tmp_path, name):
    raw = _generate(tmp_path / "raw")
    (raw / name).write_text(DEEP)
    with pytest.raises(ConfigError) as caught:
        read_regime(raw)
    message = str(caught.value)
    assert str(raw / name) in message and "nested deeper than 200 levels" in message and "\n" not in message


def test_a_settings_field_of_another_type_is_named_not_compared(tmp_path):
    raw = _generate(tmp_path / "raw")
    record = json.loads((raw / "generator.json").read_text())
    (raw / "generator.json").write_text(json.dumps({**record, "seed": "3"}))
    with pytest.raises(ConfigError, match=r"generator\.json: field 'seed' must be int, got str '3'$"):
        read_regime(raw)
    with pytest.raises(GeneratorSettingsError, match=r"generator\.json: field 'seed' must be int, got str '3'$"):
        writer.write_dataset(raw, [CONFIGURATION], count=10, seed=3, progress=False)


@pytest.mark.parametrize("content, shown", [
    (DEEP, "nested deeper than 200 levels"),
    ('{"method": ["blake2b-16-panels-v1"], "problems": {}}', "field 'method' must be str, got list"),
    ('{"method": "blake2b-16-panels-v1", "problems": []}', "field 'problems' must be dict, got list"),
    ('{"method": "blake2b-16-panels-v1", "problems": {"\\u001b[2Jx": 5}}', r"entry '\x1b[2Jx' must be [hex digest"),
])
def test_a_hostile_hash_record_is_one_line_naming_it(tmp_path, content, shown):
    raw = _generate(tmp_path / "raw")
    (raw / RAW_RECORD).write_text(content)
    with pytest.raises(DataFormatError) as caught:
        read_raw_record(raw)
    message = str(caught.value)
    assert message.startswith(f"{raw / RAW_RECORD}: ") and shown in message and "\n" not in message, message
    assert "\x1b" not in message  # a terminal escape from the file is shown escaped, never sent to the terminal


def test_a_hash_record_over_its_size_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from rpm_lib.data import problem_hashes

    # a legitimate record has an entry of ~100 bytes per problem: the bound leaves room for millions of them
    assert problem_hashes.RAW_RECORD_MAX_BYTES // 100 > 2_000_000
    raw = _generate(tmp_path / "raw")
    size = (raw / RAW_RECORD).stat().st_size
    monkeypatch.setattr(problem_hashes, "RAW_RECORD_MAX_BYTES", size - 1)
    with pytest.raises(DataFormatError, match=f"{RAW_RECORD}: larger than {size - 1} bytes"):
        read_raw_record(raw)


# ----------------------------------------------------------------------------------------------
# overlap by content
# ----------------------------------------------------------------------------------------------
def test_training_problems_renamed_as_test_problems_are_refused(tmp_path):
    raw = _generate(tmp_path / "raw")
    renamed = _renamed_training_problems(raw, tmp_path / "renamed")
    message = _refusal(_config(raw, renamed))
    assert message.startswith(f"config field 'test_data_roots': {renamed}: 6 of its 6 test problems have the panels "
                              f"of train problems of {raw} (e.g. center_single/RAVEN_100_test = "
                              "center_single/RAVEN_0_train)")


def test_overlap_is_found_when_the_training_cache_has_lost_its_raw_folder(tmp_path, capsys):
    raw = _generate(tmp_path / "raw")
    cache = _cache(raw, tmp_path / "cache")
    renamed = _renamed_training_problems(raw, tmp_path / "renamed")
    shutil.rmtree(raw)
    assert "6 of its 6 test problems have the panels of train problems" in _refusal(_config(cache, renamed))
    # the renamed folder has no record: its problems were hashed now, and a note said so
    assert "renamed: hashed 6 test problem(s) that its problem_hashes.json does not record" in capsys.readouterr().err


def test_a_cache_of_the_training_data_is_refused_as_its_own_test_split(tmp_path):
    raw = _generate(tmp_path / "raw")
    cache = _cache(raw, tmp_path / "cache")
    shutil.rmtree(raw)
    copy = _cache(_generate(tmp_path / "again"), tmp_path / "copy")  # the same problems, regenerated elsewhere
    assert "holds the training data's test problems" in _refusal(_config(cache, copy))


def test_another_seed_is_accepted(tmp_path):
    raw = _generate(tmp_path / "raw")
    other = _cache(_generate(tmp_path / "other", seed=4), tmp_path / "other-cache")
    check_extra_sets(_config(raw, other))


def test_a_file_replaced_after_generation_is_hashed_again(tmp_path, capsys):
    raw = _generate(tmp_path / "raw")
    renamed = _generate(tmp_path / "renamed", seed=4)
    # one test problem of the other folder replaced by a training problem: the record no longer describes it
    target = renamed / CONFIGURATION / "RAVEN_8_test.npz"
    shutil.copyfile(raw / CONFIGURATION / "RAVEN_2_train.npz", target)
    message = _refusal(_config(raw, renamed))
    assert "1 of its 2 test problems have the panels of train problems" in message
    assert "RAVEN_8_test = center_single/RAVEN_2_train" in message
    assert "hashed 1 test problem(s)" in capsys.readouterr().err


def test_a_damaged_hash_record_is_one_line(tmp_path):
    raw = _generate(tmp_path / "raw")
    other = _generate(tmp_path / "other", seed=4)
    (other / RAW_RECORD).write_text('{"method": "blake2b-16-panels-v1", "problems": {"x": [1, 2]}}')
    message = _refusal(_config(raw, other))
    assert message.startswith(f"config field 'test_data_roots': {other / RAW_RECORD}: entry 'x' must be [hex digest")


# ----------------------------------------------------------------------------------------------
# records that lie: the panels decide
# ----------------------------------------------------------------------------------------------
TEST_FILES = ("RAVEN_8_test.npz", "RAVEN_9_test.npz")  # the test problems of a 10-problem folder


def _training_problems_as_tests(train_root: Path, out: Path) -> Path:
    """A folder whose two test problems are ``train_root``'s first two training problems (no record)."""
    (out / CONFIGURATION).mkdir(parents=True)
    for source, name in zip(("RAVEN_0_train.npz", "RAVEN_1_train.npz"), TEST_FILES):
        shutil.copyfile(train_root / CONFIGURATION / source, out / CONFIGURATION / name)
    return out


def _match_record_times(folder: Path) -> None:
    """Give every file the size and time its problem_hashes.json entry records (the record then looks current)."""
    for name, (_, size, mtime) in read_raw_record(folder).items():
        if not (folder / name).is_file():
            continue  # a copied record names the other folder's training files too
        assert (folder / name).stat().st_size == size  # same shapes, same .npz size: only the time needs forging
        os.utime(folder / name, ns=(mtime, mtime))


def _refused_as_overlapping(raw: Path, test_root: Path, capsys) -> None:
    message = _refusal(_config(raw, test_root))
    assert message.startswith(f"config field 'test_data_roots': {test_root}: 2 of its 2 test problems have the "
                              f"panels of train problems of {raw} (e.g. center_single/RAVEN_8_test = "
                              "center_single/RAVEN_0_train)"), message
    err = capsys.readouterr().err
    assert f"{test_root}: the problem_hashes.json entry of 2 test problem(s) does not match its panels" in err, err


def test_a_record_copied_from_another_folder_does_not_hide_training_problems(tmp_path, capsys):
    raw = _generate(tmp_path / "raw")
    other = _generate(tmp_path / "other", seed=4)  # its record names the same test files, with its own hashes
    tampered = _training_problems_as_tests(raw, tmp_path / "tampered")
    shutil.copyfile(other / RAW_RECORD, tampered / RAW_RECORD)
    _match_record_times(tampered)
    _refused_as_overlapping(raw, tampered, capsys)


def test_a_record_edited_to_other_digests_does_not_hide_training_problems(tmp_path, capsys):
    raw = _generate(tmp_path / "raw")
    tampered = _training_problems_as_tests(raw, tmp_path / "tampered")
    write_raw_record(tampered, {f"{CONFIGURATION}/{name}": bytes([k + 1]) * HASH_BYTES
                                for k, name in enumerate(TEST_FILES)})  # current sizes and times, wrong digests
    _refused_as_overlapping(raw, tampered, capsys)


def test_files_replaced_with_size_and_time_forged_do_not_hide_training_problems(tmp_path, capsys):
    raw = _generate(tmp_path / "raw")
    other = _generate(tmp_path / "other", seed=4)  # an honest folder with an honest record...
    for source, name in zip(("RAVEN_0_train.npz", "RAVEN_1_train.npz"), TEST_FILES):  # ...its test files replaced
        shutil.copyfile(raw / CONFIGURATION / source, other / CONFIGURATION / name)
    _match_record_times(other)  # and their times set back to the recorded ones
    _refused_as_overlapping(raw, other, capsys)


def test_a_training_record_that_lies_does_not_hide_them_either(tmp_path):
    raw = _generate(tmp_path / "raw")
    write_raw_record(raw, {f"{CONFIGURATION}/RAVEN_{k}_train.npz": bytes([k + 1]) * HASH_BYTES for k in range(6)})
    renamed = _renamed_training_problems(raw, tmp_path / "renamed")
    assert "6 of its 6 test problems have the panels of train problems" in _refusal(_config(raw, renamed))
    cache = _cache(raw, tmp_path / "cache")  # a cache of resized panels whose hash array was zeroed
    hashes = np.load(cache / CACHE_ARRAY, mmap_mode="r+")
    hashes[:] = 0
    hashes.flush()
    del hashes
    assert "6 of its 6 test problems have the panels of train problems" in _refusal(_config(cache, renamed))


def test_a_test_cache_whose_hash_array_lies_is_compared_by_its_panels(tmp_path):
    raw = _generate(tmp_path / "raw")
    cache = _cache(_renamed_training_problems(raw, tmp_path / "renamed"), tmp_path / "renamed-cache")
    hashes = np.load(cache / CACHE_ARRAY, mmap_mode="r+")
    hashes[:] = np.arange(HASH_BYTES, dtype=np.uint8)
    hashes.flush()
    del hashes
    assert "6 of its 6 test problems have the panels of train problems" in _refusal(_config(raw, cache))


def test_panels_resized_by_another_opencv_are_compared_by_their_records_too(tmp_path, capsys):
    # 160 -> 48 px is OpenCV's area resize, which another version may round differently: simulated by one grey
    # level in every problem of a cache that records another version; its honest hashes still find the overlap
    raw = _generate(tmp_path / "raw")
    cache = prepare_cache(_renamed_training_problems(raw, tmp_path / "renamed"), tmp_path / "renamed-48", size=48,
                          show_progress=False)
    manifest = json.loads((cache / "manifest.json").read_text())
    manifest["plan"]["opencv"]["resized"] = "0.0.0"
    (cache / "manifest.json").write_text(json.dumps(manifest))
    panels = np.load(cache / "panels.npy", mmap_mode="r+")
    panels[:, 0, 0, 0] ^= 1
    panels.flush()
    del panels
    config = TrainConfig(data_root=str(raw), test_data_roots=[str(cache)], configurations=["Center"], image_size=48)
    assert "6 of its 6 test problems have the panels of train problems" in _refusal(config)
    assert "resized by OpenCV versions that may set some pixels differently" in capsys.readouterr().err


def test_an_honest_folder_of_another_seed_gives_no_note(tmp_path, capsys):
    raw = _generate(tmp_path / "raw")
    other = _generate(tmp_path / "other", seed=4)
    capsys.readouterr()
    check_extra_sets(_config(raw, other))
    assert "note" not in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# caches built before the records existed
# ----------------------------------------------------------------------------------------------
def _as_old_cache(cache: Path) -> None:
    manifest = json.loads((cache / "manifest.json").read_text())
    for field in ("problem_hashes", "regime"):
        del manifest[field]
    (cache / "manifest.json").write_text(json.dumps(manifest))
    (cache / CACHE_ARRAY).unlink()


def test_an_old_cache_of_original_panels_is_hashed_now_with_a_note(tmp_path, capsys):
    raw = _generate(tmp_path / "raw")
    cache = prepare_cache(raw, tmp_path / "cache", size=160, show_progress=False)
    _as_old_cache(cache)
    dataset = RavenDataset(cache, "train", configurations=["Center"], image_size=160)
    assert dataset.problem_hashes() == [panels_hash(load_raven_npz(raw / CONFIGURATION / f"{s.split('/')[1]}.npz")
                                                    .panels) for s in dataset.source_ids]
    assert "built before caches recorded problem hashes; hashing its 6 train problems now" in capsys.readouterr().err
    assert read_regime(cache) is None
    assert "built before caches recorded their regime" in capsys.readouterr().err


def test_an_old_cache_of_resized_panels_is_compared_at_its_panel_size(tmp_path):
    # it records no hashes and keeps no original panels, but the test problems resized as it was resized are its rows
    raw = _generate(tmp_path / "raw")
    cache = _cache(raw, tmp_path / "cache")
    _as_old_cache(cache)
    renamed = _renamed_training_problems(raw, tmp_path / "renamed")
    assert "6 of its 6 test problems have the panels of train problems" in _refusal(_config(cache, renamed))


def test_a_cache_hash_array_of_the_wrong_shape_is_one_line(tmp_path):
    cache = _cache(_generate(tmp_path / "raw"), tmp_path / "cache")
    np.save(cache / CACHE_ARRAY, np.zeros((3, 16), np.uint8))
    with pytest.raises(DataFormatError, match=r"problem_hashes\.npy: shape \(3, 16\), but manifest\.json"):
        CacheReader(cache, "raven", SIZE, "area")

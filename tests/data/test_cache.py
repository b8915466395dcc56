"""The memory-mapped cache: equality with raw reading, interrupted builds, skip reports, incompatibilities, and a
cache replaced while a dataset reads it."""
from __future__ import annotations

import json
import pickle
import shutil

import numpy as np
import pytest
import torch

from generated_caches import SETTINGS
from rpm_lib import rules
from rpm_lib.data import DataFormatError, PgmDataset, RavenDataset, is_cache, prepare_cache, read_manifest
from rpm_lib.data.cache import build as cache_module
from rpm_lib.generator.cache_writer import generate_cache

SPLITS = ("train", "val", "test")


def assert_same_samples(a, b) -> None:
    assert len(a) == len(b) > 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x["source_id"] == y["source_id"] and x["configuration"] == y["configuration"]
        assert torch.equal(x["panels"], y["panels"]), x["source_id"]
        assert torch.equal(x["target"], y["target"])
        assert torch.equal(x["rules_dense"], y["rules_dense"]) and torch.equal(x["rules_sparse"], y["rules_sparse"])


@pytest.mark.parametrize("encoding", ["sparse38", "sparse40"])
def test_cache_equals_raw(iraven_reference, tmp_path, encoding):
    out = prepare_cache(iraven_reference, tmp_path / "cache", show_progress=False)
    assert is_cache(out) and not (tmp_path / "cache.partial").exists()
    manifest = read_manifest(out)
    assert manifest["num_rows"] == manifest["num_valid"] == 70 and manifest["image_size"] == 80
    assert manifest["counts"]["distribute_nine"] == {"train": 6, "val": 2, "test": 2}
    panels = np.load(out / "panels.npy", mmap_mode="r")
    assert panels.shape == (70, 16, 80, 80) and panels.dtype == np.uint8
    for split in SPLITS:
        raw = RavenDataset(iraven_reference, split, rule_encoding=encoding, answer_order="fixed", seed=4)
        cached = RavenDataset(out, split, rule_encoding=encoding, answer_order="fixed", seed=4)
        assert cached.from_cache and not raw.from_cache
        assert_same_samples(raw, cached)
        assert np.array_equal(raw.labels.targets, cached.labels.targets)
        assert np.array_equal(raw.labels.meta, cached.labels.meta)
        assert np.array_equal(raw.configuration_indices, cached.configuration_indices)
    subset = ["O-IC", "center_single"]
    assert_same_samples(
        RavenDataset(iraven_reference, "train", configurations=subset, answer_order="none"),
        RavenDataset(out, "train", configurations=subset, answer_order="none"),
    )


def test_workers_write_the_same_cache(make_raven_root, tmp_path):
    root = make_raven_root(configurations=rules.CONFIGURATIONS[:3], ks=range(6))
    one = prepare_cache(root, tmp_path / "one", size=40, show_progress=False, chunk_size=5)
    two = prepare_cache(root, tmp_path / "two", size=40, workers=2, show_progress=False, chunk_size=5)
    for name in ("panels", "targets", "meta", "meta_target", "valid", "groups", "splits", "file_ids"):
        assert np.array_equal(np.load(one / f"{name}.npy"), np.load(two / f"{name}.npy")), name


class Killed(Exception):
    pass


def test_interrupted_build_leaves_no_manifest_and_resumes(make_raven_root, tmp_path, monkeypatch):
    root = make_raven_root(configurations=rules.CONFIGURATIONS[:4], ks=range(10))  # 40 files, 10 chunks of 4
    out = tmp_path / "cache"

    def kill_after_12(done: int, total: int) -> None:
        if done >= 12:
            raise Killed

    with pytest.raises(Killed):
        prepare_cache(root, out, chunk_size=4, progress=kill_after_12, show_progress=False)
    partial = tmp_path / "cache.partial"
    assert not out.exists() and partial.is_dir()
    assert not (partial / "manifest.json").exists()
    with pytest.raises(DataFormatError, match="interrupted cache build"):
        RavenDataset(out, "train")
    with pytest.raises(DataFormatError, match="incomplete or damaged cache"):
        RavenDataset(partial, "train")

    # Simulate a kill in the middle of writing the journal: a torn last line must be ignored.
    with open(partial / "journal.jsonl", "a") as journal:
        journal.write('{"chunk": 9, "skipp')
    converted = []
    original = cache_module._convert_chunk
    monkeypatch.setattr(cache_module, "_convert_chunk", lambda chunk: converted.append(chunk.chunk_id) or original(chunk))
    prepare_cache(root, out, chunk_size=4, show_progress=False)
    assert sorted(converted) == list(range(3, 10))  # the 3 journaled chunks were not redone
    assert is_cache(out) and not partial.exists()
    clean = prepare_cache(root, tmp_path / "clean", chunk_size=4, show_progress=False)
    for name in ("panels", "targets", "meta", "meta_target", "valid"):
        assert np.array_equal(np.load(out / f"{name}.npy"), np.load(clean / f"{name}.npy")), name


def test_stale_partial_of_other_settings_is_discarded(make_raven_root, tmp_path):
    root = make_raven_root(configurations=rules.CONFIGURATIONS[:1])
    def kill(done: int, total: int) -> None:
        raise Killed

    with pytest.raises(Killed):
        prepare_cache(root, tmp_path / "c", size=40, chunk_size=2, progress=kill, show_progress=False)
    assert (tmp_path / "c.partial" / "plan.json").exists()
    out = prepare_cache(root, tmp_path / "c", size=80, chunk_size=2, show_progress=False)
    assert read_manifest(out)["image_size"] == 80 and np.load(out / "panels.npy").shape == (10, 16, 80, 80)


def test_on_error_skip_reports_every_bad_file(make_raven_root, tmp_path, rewrite, capsys):
    root = make_raven_root(configurations=rules.CONFIGURATIONS[:2], ks=range(4))
    truncated = root / "center_single" / "RAVEN_1_train.npz"
    truncated.write_bytes(truncated.read_bytes()[:1000])
    bad_target = rewrite(root / "distribute_four" / "RAVEN_2_train.npz", target=np.array(11))
    with pytest.raises(DataFormatError, match="RAVEN_1_train.npz"):
        prepare_cache(root, tmp_path / "stop", show_progress=False)
    assert not (tmp_path / "stop").exists()

    out = prepare_cache(root, tmp_path / "skip", on_error="skip", chunk_size=3, show_progress=False)
    assert "skipped 2 file(s)" in capsys.readouterr().err
    lines = (out / "skipped.txt").read_text().splitlines()
    assert len(lines) == 2
    reasons = dict(line.split("\t", 1) for line in lines)
    assert "not a readable .npz" in reasons[str(truncated.resolve())]
    assert "'target' = 11 is out of range" in reasons[str(bad_target.resolve())]
    manifest = read_manifest(out)
    assert (manifest["num_rows"], manifest["num_valid"], manifest["num_skipped"]) == (8, 6, 2)
    cached = RavenDataset(out, "train", configurations=rules.CONFIGURATIONS[:2])
    assert len(cached) == 6
    assert "center_single/RAVEN_1_train" not in cached.source_ids


def test_incompatible_requests_are_refused(iraven_reference, tmp_path, make_pgm_root):
    out = prepare_cache(iraven_reference, tmp_path / "c80", configurations=["center_single"], show_progress=False)
    with pytest.raises(DataFormatError, match="cache built for image_size=80 cannot serve image_size=160"):
        RavenDataset(out, "train", image_size=160)
    with pytest.raises(DataFormatError, match="resize='area', requested resize='stride'"):
        RavenDataset(out, "train", configurations=["center_single"], resize="stride")
    with pytest.raises(DataFormatError, match="no 'distribute_four' problems"):
        RavenDataset(out, "train")
    with pytest.raises(DataFormatError, match="raven cache, not a pgm one"):
        PgmDataset(out, "neutral", "train")
    assert prepare_cache(iraven_reference, out, configurations=["center_single"], show_progress=False) == out
    with pytest.raises(DataFormatError, match="other inputs or settings"):
        prepare_cache(iraven_reference, out, size=40, configurations=["center_single"], show_progress=False)
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "notes.txt").write_text("mine")
    with pytest.raises(DataFormatError, match="not an rpm_lib cache"):
        prepare_cache(iraven_reference, tmp_path / "occupied", configurations=["center_single"], show_progress=False)


def test_pgm_cache_equals_raw(make_pgm_root, tmp_path):
    root = make_pgm_root("neutral")
    make_pgm_root("extrapolation", counts={"train": 2, "val": 1, "test": 1})
    out = prepare_cache(root, tmp_path / "pgm80", kind="pgm", resize="stride", workers=2, chunk_size=3, show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "pgm" and set(manifest["counts"]) == {"neutral", "extrapolation"}
    for regime in ("neutral", "extrapolation"):
        for split in SPLITS:
            assert_same_samples(
                PgmDataset(root, regime, split, resize="stride", answer_order="fixed"),
                PgmDataset(out, regime, split, resize="stride", answer_order="fixed"),
            )


def test_datasets_survive_pickling(iraven_reference, tmp_path):
    """DataLoader workers started with spawn receive pickled datasets (memmaps are re-opened there)."""
    import pickle

    out = prepare_cache(iraven_reference, tmp_path / "c", configurations=["L-R"], show_progress=False)
    for root in (iraven_reference, out):
        dataset = RavenDataset(root, "val", configurations=["L-R"])
        dataset[0]  # opens the memmap / draws nothing for "fixed"
        clone = pickle.loads(pickle.dumps(dataset))
        assert_same_samples(dataset, clone)


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


def test_journal_lines_that_are_no_entry_of_this_build_only_mean_their_chunk_is_made_again(tmp_path, monkeypatch):
    from rpm_lib.data.cache import partial as partial_module

    monkeypatch.setattr(partial_module, "MAX_JOURNAL_LINE", 200)
    lines = [
        '{"chunk": 0, "skipped": []}',
        '{"chunk": 1, "skipped": [["a.npz", "truncated"]]}',
        '{"a": ' * 100_000 + "1" + "}" * 100_000,  # found: RecursionError from json.loads
        '{"chunk": 2, "skipped": [["' + "x" * 300 + '", "longer than a line may be"]]}',
        '{"chunk": "3", "skipped": []}', '{"chunk": true, "skipped": []}', '{"chunk": 4, "skipped": "none"}',
        '{"chunk": 5, "skipped": [["b.npz", {"not": "a reason"}]]}', '{"chunk": 6, "chunk": 6, "skipped": []}',
        '{"chunk": -7, "skipped": []}', '{"chunk": 99, "skipped": []}', '[8]', '{"chunk": 9, "skipp',
    ]
    (tmp_path / "journal.jsonl").write_text("\n".join(lines))
    done, skipped = partial_module.read_journal(tmp_path, chunks=50)
    assert done == {0, 1} and skipped == [("a.npz", "truncated")]
    assert partial_module.read_journal(tmp_path)[0] == {0, 1, 99}  # without a chunk count any id >= 0 is one


def test_a_plan_nested_100000_deep_is_a_build_that_cannot_be_continued(tmp_path):
    from rpm_lib.data.cache.partial import partial_plan

    (tmp_path / "plan.json").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    assert partial_plan(tmp_path) is None  # discarded and built anew by prepare_cache, as an unreadable plan is
    (tmp_path / "manifest.json").write_text(json.dumps({"plan": ["not", "a", "plan"]}))
    assert partial_plan(tmp_path) is None

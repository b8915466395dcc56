"""Files written by raven-datasets: I-RAVEN-Mesh (12-row meta_matrix with the Mesh in rows 8-11) and
Attributeless-I-RAVEN (12 rows, rows 8-11 zero): raw folder and cache, labels, the Mesh rules against the .xml,
mixing with plain files, and the answer-revealing ``meta_answer_mods`` that must never reach a model."""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import reference_root
from rpm_lib import rules
from rpm_lib.data import DataFormatError, RavenDataset, load_raven_npz, prepare_cache, read_manifest

SPLITS = ("train", "val", "test")
#: Every key a sample may have (docs/architecture.md); nothing else, in particular nothing about the answer.
SAMPLE_KEYS = {"panels", "target", "rules_dense", "rules_sparse", "configuration", "index", "source_id"}
#: Every file of a finished cache (docs: data_README.md section 4).
CACHE_FILES = {"manifest.json", "panels.npy", "targets.npy", "meta.npy", "meta_target.npy", "groups.npy", "splits.npy",
               "file_ids.npy", "valid.npy", "problem_hashes.npy"}
AIRAVEN_CONFIGURATIONS = ["center_single", "in_distribute_four_out_center_single"]


@pytest.fixture(scope="module")
def mesh_root() -> Path:
    return reference_root("I-RAVEN-Mesh")


@pytest.fixture(scope="module")
def airaven_root() -> Path:
    return reference_root("A-I-RAVEN-Color")


def _files(root: Path) -> list[Path]:
    return sorted(root.glob("*/RAVEN_*.npz"))


def _xml_rule_groups(xml_path: Path) -> dict[int, list[tuple[str, str]]]:
    """``{Rule_Group id: [(relation, attr), ...]}`` from the .xml ``<Rules>`` (attributes read by name)."""
    groups = ET.parse(xml_path).getroot().find("Rules").iter("Rule_Group")
    return {int(g.get("id")): [(r.get("name"), r.get("attr")) for r in g.iter("Rule")] for g in groups}


def _xml_component_names(xml_path: Path) -> dict[int, str]:
    panel = ET.parse(xml_path).getroot().find("Panels").find("Panel")
    return {int(c.get("id")): c.get("name") for c in panel.iter("Component")}


# ------------------------------------------------------------------------------------------------
# every reference file, one at a time
# ------------------------------------------------------------------------------------------------


def test_every_mesh_file_loads_as_a_mesh_problem(mesh_root):
    files = _files(mesh_root)
    assert len(files) == 7 * 6
    for path in files:
        data = np.load(path)
        assert data["meta_matrix"].shape == (12, 9) and data["meta_answer_mods"].shape == (24, 5)
        record = load_raven_npz(path)
        assert record.mesh and record.meta.shape == (12, 9) and record.panels.shape == (16, 160, 160)
        assert np.array_equal(record.meta, data["meta_matrix"]) and record.target == int(data["target"])
        assert np.array_equal(record.meta_target, data["meta_target"])
        header_only = load_raven_npz(path, with_image=False)
        assert header_only.panels is None and np.array_equal(header_only.meta, record.meta)


def test_every_attributeless_file_loads_as_a_plain_problem(airaven_root):
    files = _files(airaven_root)
    assert len(files) == 2 * 20
    for path in files:
        data = np.load(path)
        assert data["meta_matrix"].shape == (12, 9) and not data["meta_matrix"][8:].any()
        assert data["meta_answer_mods"].shape == (16, 5)
        record = load_raven_npz(path)
        assert not record.mesh and record.meta.shape == (8, 9)
        assert np.array_equal(record.meta, data["meta_matrix"][:8])


@pytest.mark.parametrize("configuration", rules.CONFIGURATIONS)
def test_mesh_rules_equal_the_xml_rule_groups(mesh_root, configuration):
    names = rules.COMPONENT_NAMES[configuration]
    for npz in sorted((mesh_root / configuration).glob("RAVEN_*.npz")):
        xml = npz.with_suffix(".xml")
        meta = load_raven_npz(npz, with_image=False).meta
        decoded = rules.raven_rules_from_meta_matrix(meta)
        groups = _xml_rule_groups(xml)
        # the xml numbers the Mesh after the shape components (id 1 or 2); meta_matrix keeps it in rows 8-11
        mesh_id = len(names)
        assert _xml_component_names(xml) == {**dict(enumerate(names)), mesh_id: "Mesh"}
        assert sorted(groups) == list(range(len(names) + 1))
        assert [(r, a) for c, r, a in decoded if c == rules.MESH_COMPONENT] == groups[mesh_id]
        for c in range(len(names)):
            assert [(r, a) for k, r, a in decoded if k == c] == groups[c]
        lines = rules.describe_raven_rules(meta, configuration)
        expected = [f"{names[c]}: {r} on {a}" for c in range(len(names)) for r, a in groups[c]]
        assert lines == expected + [f"Mesh: {r} on {a}" for r, a in groups[mesh_id]]
        # sparse45 carries the Mesh's Number/Position rule (its first rule group) and decodes back to it
        mesh_rule = groups[mesh_id][0]
        sparse = rules.raven_sparse(meta, "sparse45")
        assert rules.decode_raven_sparse(sparse, "sparse45")[-1] == f"Mesh: {mesh_rule[0]} on {mesh_rule[1]}"
        assert groups[mesh_id][1:] == [("Constant", "Type"), ("Constant", "Size"), ("Constant", "Color")]


# ------------------------------------------------------------------------------------------------
# datasets: raw folder and cache
# ------------------------------------------------------------------------------------------------


def _same_samples(a: RavenDataset, b: RavenDataset) -> None:
    assert len(a) == len(b) > 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert set(x) == set(y) == SAMPLE_KEYS
        assert x["source_id"] == y["source_id"] and x["configuration"] == y["configuration"]
        assert torch.equal(x["panels"], y["panels"]) and torch.equal(x["target"], y["target"])
        assert torch.equal(x["rules_dense"], y["rules_dense"]) and torch.equal(x["rules_sparse"], y["rules_sparse"])


@pytest.fixture(scope="module")
def caches(mesh_root, airaven_root, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("regime-caches")
    return {"mesh": prepare_cache(mesh_root, out / "mesh", show_progress=False),
            "airaven": prepare_cache(airaven_root, out / "airaven", show_progress=False)}


@pytest.mark.parametrize("encoding", ["sparse45", "sparse38"])
def test_mesh_raw_and_cache_give_the_same_samples_and_labels(mesh_root, caches, encoding):
    manifest = read_manifest(caches["mesh"])
    assert manifest["meta_rows"] == 12 and manifest["num_valid"] == 42
    assert np.load(caches["mesh"] / "meta.npy").shape == (42, 12, 9)
    for split in SPLITS:
        raw = RavenDataset(mesh_root, split, rule_encoding=encoding, answer_order="fixed", seed=3)
        cached = RavenDataset(caches["mesh"], split, rule_encoding=encoding, answer_order="fixed", seed=3)
        _same_samples(raw, cached)
        for dataset in (raw, cached):
            labels = dataset.labels
            assert dataset.has_mesh and labels.meta.shape == (len(dataset), 12, 9)
            files = [np.load(mesh_root / f"{s}.npz") for s in labels.source_ids]
            assert np.array_equal(labels.meta, np.stack([f["meta_matrix"] for f in files]))
            assert np.array_equal(labels.meta_target, np.stack([f["meta_target"] for f in files]))
            assert np.array_equal(labels.targets, [int(f["target"]) for f in files])
        for i in range(len(raw)):
            sample = raw[i]
            meta = np.load(mesh_root / f"{sample['source_id']}.npz")["meta_matrix"]
            assert torch.equal(sample["rules_sparse"], torch.from_numpy(rules.raven_sparse(meta, encoding)))
            mesh_bits = sample["rules_sparse"][38:]
            # sparse45: exactly one Mesh rule; sparse38 leaves the Mesh out (the shape components only)
            assert int(mesh_bits.sum()) == (1 if encoding == "sparse45" else 0)
            if encoding == "sparse38":
                assert torch.equal(sample["rules_sparse"], torch.from_numpy(rules.raven_sparse(meta[:8], "sparse38")))


def test_attributeless_raw_and_cache_are_plain_i_raven(airaven_root, caches):
    manifest = read_manifest(caches["airaven"])
    assert manifest["meta_rows"] == 8 and np.load(caches["airaven"] / "meta.npy").shape == (40, 8, 9)
    for split in SPLITS:
        raw = RavenDataset(airaven_root, split, configurations=AIRAVEN_CONFIGURATIONS, answer_order="none")
        cached = RavenDataset(caches["airaven"], split, configurations=AIRAVEN_CONFIGURATIONS, answer_order="none")
        _same_samples(raw, cached)
        assert not raw.has_mesh and raw.labels.meta.shape == cached.labels.meta.shape == (len(raw), 8, 9)
        assert np.array_equal(raw.labels.meta, cached.labels.meta)
        files = [np.load(airaven_root / f"{s}.npz") for s in raw.labels.source_ids]
        assert np.array_equal(raw.labels.meta, np.stack([f["meta_matrix"][:8] for f in files]))
        sample = raw[0]
        assert sample["rules_sparse"].shape == (38,)
        with_mesh_slots = RavenDataset(airaven_root, split, configurations=AIRAVEN_CONFIGURATIONS,
                                       rule_encoding="sparse45")[0]["rules_sparse"]
        assert with_mesh_slots.shape == (45,) and not with_mesh_slots[38:].any()


def test_a_folder_mixing_plain_and_mesh_problems(mesh_root, iraven_reference, tmp_path):
    """Supported: labels get 12 rows (zero Mesh rows for the plain problems); a selection without a Mesh, 8."""
    root = tmp_path / "mixed"
    shutil.copytree(iraven_reference / "center_single", root / "center_single")
    shutil.copytree(mesh_root / "distribute_four", root / "distribute_four", ignore=shutil.ignore_patterns("*.xml"))
    cache = prepare_cache(root, tmp_path / "mixed-cache", show_progress=False)
    assert read_manifest(cache)["meta_rows"] == 12
    both = ["center_single", "distribute_four"]
    for source in (root, cache):
        dataset = RavenDataset(source, "train", configurations=both, rule_encoding="sparse45", answer_order="none")
        meta = dataset.labels.meta
        plain = dataset.configuration_indices == 0
        assert dataset.has_mesh and meta.shape == (6 + 3, 12, 9)
        assert not meta[plain, 8:].any() and meta[~plain, 8].any(axis=1).all()
        assert np.array_equal(meta[plain, :8], np.stack([np.load(root / f"{s}.npz")["meta_matrix"]
                                                         for s in np.array(dataset.source_ids)[plain]]))
        sparse = torch.stack([dataset[i]["rules_sparse"] for i in range(len(dataset))]).numpy()
        assert not sparse[plain, 38:].any() and (sparse[~plain, 38:].sum(axis=1) == 1).all()
        center = RavenDataset(source, "train", configurations=["center_single"])
        assert not center.has_mesh and center.labels.meta.shape == (6, 8, 9)
    _same_samples(RavenDataset(root, "test", configurations=both, answer_order="none"),
                  RavenDataset(cache, "test", configurations=both, answer_order="none"))


# ------------------------------------------------------------------------------------------------
# meta_answer_mods: the correct answer is the one candidate with no modified attribute
# ------------------------------------------------------------------------------------------------


def test_meta_answer_mods_would_reveal_the_answer(mesh_root, airaven_root):
    """Why it must never reach a model: its all-zero 3-row (Mesh) / 2-row block is the answer."""
    for path in _files(mesh_root) + _files(airaven_root):
        data = np.load(path)
        mods = data["meta_answer_mods"]
        rows_per_candidate = mods.shape[0] // 8
        untouched = [k for k in range(8) if not mods[rows_per_candidate * k : rows_per_candidate * (k + 1)].any()]
        assert untouched == [int(data["target"])], path


def test_nothing_derived_from_meta_answer_mods_is_returned_or_stored(mesh_root, caches, tmp_path):
    """Samples have no such key, and replacing meta_answer_mods by garbage (or deleting it) changes no sample and
    no byte of the cache's arrays: nothing read, returned or stored depends on it."""
    assert {p.name for p in caches["mesh"].iterdir()} == CACHE_FILES
    for split in SPLITS:
        for i, sample in enumerate(RavenDataset(mesh_root, split)):
            assert set(sample) == SAMPLE_KEYS and "meta_answer_mods" not in sample
    assert not hasattr(RavenDataset(mesh_root, "val").labels, "meta_answer_mods")
    rng = np.random.default_rng(0)
    for variant in ("garbage", "deleted"):
        root = tmp_path / variant
        shutil.copytree(mesh_root, root, ignore=shutil.ignore_patterns("*.xml"))
        for path in _files(root):
            arrays = dict(np.load(path))
            if variant == "garbage":
                arrays["meta_answer_mods"] = rng.integers(0, 2, size=arrays["meta_answer_mods"].shape, dtype=np.uint8)
            else:
                del arrays["meta_answer_mods"]
            np.savez(path, **arrays)
        cache = prepare_cache(root, tmp_path / f"{variant}-cache", show_progress=False)
        for name in CACHE_FILES - {"manifest.json"}:
            assert np.array_equal(np.load(cache / name), np.load(caches["mesh"] / name)), (variant, name)
        manifest, reference = read_manifest(cache), read_manifest(caches["mesh"])
        assert {k: v for k, v in manifest.items() if k != "plan"} == {k: v for k, v in reference.items() if k != "plan"}
        for split in SPLITS:
            _same_samples(RavenDataset(root, split, rule_encoding="sparse45", answer_order="fixed"),
                          RavenDataset(mesh_root, split, rule_encoding="sparse45", answer_order="fixed"))


# ------------------------------------------------------------------------------------------------
# bad raven-datasets files: one line naming the file
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def mesh_file(mesh_root, tmp_path) -> Path:
    target = tmp_path / "raw" / "distribute_four" / "RAVEN_0_train.npz"
    target.parent.mkdir(parents=True)
    shutil.copyfile(mesh_root / "distribute_four" / "RAVEN_0_train.npz", target)
    return target


def _rewrite(path: Path, **changes) -> None:
    arrays = dict(np.load(path))
    arrays.update(changes)
    np.savez(path, **arrays)


def _mesh_type_progression(path: Path) -> np.ndarray:
    meta = np.load(path)["meta_matrix"].copy()
    meta[9, :4] = [0, 1, 0, 0]  # Progression on the Mesh's Type
    return meta


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: {"structure": np.array(["Scene", "Singleton", "Grid", "Distribute_Four", "/", "/", "/", "/"])},
         "rows 8-11 hold Mesh rules but 'structure' names no Mesh component"),
        (lambda p: {"meta_matrix": np.pad(np.load(p)["meta_matrix"][:8], ((0, 4), (0, 0))),
                    "meta_target": np.load(p)["meta_matrix"][:8].max(axis=0)},
         "'structure' names a Mesh component but 'meta_matrix' has no Mesh rules"),
        (lambda p: {"meta_matrix": np.load(p)["meta_matrix"][:8], "meta_target": np.load(p)["meta_matrix"][:8].max(axis=0)},
         "'structure' names a Mesh component but 'meta_matrix' has no Mesh rules"),
        (lambda p: {"meta_matrix": _mesh_type_progression(p), "meta_target": _mesh_type_progression(p).max(axis=0)},
         "invalid rules: .*the Mesh's Type is always Constant"),
        (lambda p: {"meta_target": np.load(p)["meta_matrix"][:8].max(axis=0) * 0},
         "'meta_target' .* is not the OR of the rows"),
        (lambda p: {"meta_matrix": np.zeros((10, 9), np.uint8)}, r"'meta_matrix' has shape \(10, 9\), expected \(8, 9\) or"),
        (lambda p: {"structure": np.array([1, 2, 3])}, "'structure' has shape .* expected a 1-D array of strings"),
    ],
)
def test_inconsistent_mesh_files_are_refused_naming_the_file(mesh_file, change, message):
    _rewrite(mesh_file, **change(mesh_file))
    for load in (lambda: load_raven_npz(mesh_file), lambda: load_raven_npz(mesh_file, with_image=False),
                 lambda: RavenDataset(mesh_file.parents[1], "train", configurations=["2x2Grid"])[0]):
        with pytest.raises(DataFormatError, match=message) as info:
            load()
        assert str(info.value).startswith(str(mesh_file)) and "\n" not in str(info.value)
    with pytest.raises(DataFormatError, match=message):
        prepare_cache(mesh_file.parents[1], mesh_file.parents[2] / "cache", show_progress=False)


def test_a_cache_whose_meta_rows_lie_is_refused(caches, tmp_path):
    copy = tmp_path / "cache"
    shutil.copytree(caches["mesh"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for value, message in ((8, r"meta.npy: shape \(42, 12, 9\), but manifest.json \(.*meta_rows=8\) needs"),
                           (10, r"field 'meta_rows' must be one of \[8, 12\]"), ("12", "field 'meta_rows'")):
        (copy / "manifest.json").write_text(json.dumps({**manifest, "meta_rows": value}))
        with pytest.raises(DataFormatError, match=message):
            RavenDataset(copy, "train")


def test_rpm_data_info_says_the_labels_have_the_mesh_rows(caches, capsys):
    from rpm_lib.data.cli import main

    assert main(["info", str(caches["mesh"])]) == 0
    assert "labels       meta_matrix with 12 rows (I-RAVEN-Mesh: rows 8-11 the Mesh)" in capsys.readouterr().out
    assert main(["info", str(caches["airaven"])]) == 0
    assert "labels       meta_matrix with 8 rows\n" in capsys.readouterr().out


def test_a_structure_of_python_objects_is_not_unpickled_and_not_needed(iraven_reference, mesh_file, tmp_path):
    """``structure`` only cross-checks the Mesh: a file whose structure holds Python objects (loadable only by
    unpickling) is read from its meta_matrix alone, as before the cross-check existed."""
    plain = tmp_path / "RAVEN_0_train.npz"
    shutil.copyfile(iraven_reference / "center_single" / "RAVEN_0_train.npz", plain)
    for path, rows in ((plain, 8), (mesh_file, 12)):
        expected = load_raven_npz(path)
        arrays = dict(np.load(path))
        arrays["structure"] = np.array(list(arrays["structure"]), dtype=object)
        np.savez(path, **arrays)
        record = load_raven_npz(path)
        assert record.meta.shape == (rows, 9) and np.array_equal(record.meta, expected.meta)

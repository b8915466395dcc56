"""RavenDataset on the reference files: loading, sample contract, answer order, resize, transform, labels."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rpm_lib import rules
from rpm_lib.data import RavenDataset, load_raven_npz


def test_every_reference_file_loads(iraven_reference, raven_reference):
    for root in (iraven_reference, raven_reference):
        files = sorted(root.glob("*/RAVEN_*.npz"))
        assert len(files) == 70
        for path in files:
            record = load_raven_npz(path)
            assert record.panels.shape == (16, 160, 160) and record.panels.dtype == np.uint8
            assert 0 <= record.target < 8
            assert record.meta.shape == (8, 9) and record.meta_target.shape == (9,)


def test_sample_matches_the_architecture_contract(iraven_reference):
    dataset = RavenDataset(iraven_reference, "train")
    sample = dataset[3]
    assert set(sample) == {"panels", "target", "rules_dense", "rules_sparse", "configuration", "index", "source_id"}
    assert sample["panels"].dtype == torch.uint8 and sample["panels"].shape == (16, 80, 80)
    assert sample["target"].dtype == torch.int64 and sample["target"].shape == ()
    assert sample["rules_dense"].dtype == torch.float32 and sample["rules_dense"].shape == (9,)
    assert sample["rules_sparse"].dtype == torch.float32 and sample["rules_sparse"].shape == (38,)
    assert sample["index"] == 3 and sample["source_id"] == "center_single/RAVEN_3_train"
    assert sample["configuration"] == 0
    assert len(dataset) == 42 and dataset[-1]["source_id"].startswith("in_distribute_four_out_center_single/")
    with pytest.raises(IndexError):
        dataset[42]


@pytest.mark.parametrize("configuration", rules.CONFIGURATIONS)
def test_each_configuration_alone(iraven_reference, configuration):
    counts = {}
    for split in ("train", "val", "test"):
        dataset = RavenDataset(iraven_reference, split, configurations=[configuration], rule_encoding="sparse40")
        counts[split] = len(dataset)
        sample = dataset[len(dataset) - 1]
        assert sample["configuration"] == rules.CONFIGURATIONS.index(configuration)
        assert sample["source_id"].startswith(f"{configuration}/RAVEN_") and sample["source_id"].endswith(f"_{split}")
        raw = np.load(iraven_reference / f"{sample['source_id']}.npz")
        assert torch.equal(sample["rules_sparse"], torch.from_numpy(rules.raven_sparse(raw["meta_matrix"], "sparse40")))
        assert torch.equal(sample["rules_dense"], torch.from_numpy(raw["meta_target"].astype(np.float32)))
    assert counts == {"train": 6, "val": 2, "test": 2}
    short = RavenDataset(iraven_reference, "val", configurations=rules.SHORT_NAMES[configuration])
    assert short.source_ids == RavenDataset(iraven_reference, "val", configurations=[configuration]).source_ids


def test_configuration_order_follows_the_argument(iraven_reference):
    dataset = RavenDataset(iraven_reference, "test", configurations=["O-IG", "center_single"])
    assert dataset.configuration_indices.tolist() == [6, 6, 0, 0]
    assert [dataset[i]["configuration"] for i in range(4)] == [6, 6, 0, 0]


def _file_panels(root, source_id: str) -> tuple[np.ndarray, int]:
    data = np.load(root / f"{source_id}.npz")
    image = data["image"].astype(np.float64).reshape(16, 80, 2, 80, 2).mean(axis=(2, 4))
    return np.floor(image + 0.5).astype(np.uint8), int(data["target"])


@pytest.mark.parametrize("answer_order", ["random", "fixed", "none"])
def test_shuffling_keeps_the_target_on_the_same_image(iraven_reference, answer_order):
    dataset = RavenDataset(iraven_reference, "val", answer_order=answer_order, seed=1)
    positions = set()
    for index in range(len(dataset)):
        for epoch in range(3):
            dataset.set_epoch(epoch)
            sample = dataset[index]
            assert torch.equal(sample["panels"], dataset[(epoch, index)]["panels"])
            panels, target = _file_panels(iraven_reference, sample["source_id"])
            got = sample["panels"].numpy()
            assert np.array_equal(got[:8], panels[:8])
            assert np.array_equal(got[8 + int(sample["target"])], panels[8 + target])
            assert sorted(map(bytes, got[8:])) == sorted(map(bytes, panels[8:]))  # same 8 choices
            positions.add((index, int(sample["target"])))
    if answer_order == "none":
        assert positions == {(i, _file_panels(iraven_reference, dataset.source_ids[i])[1]) for i in range(len(dataset))}
    elif answer_order == "fixed":
        assert len(positions) == len(dataset)  # same order at every access
        other_seed = RavenDataset(iraven_reference, "val", answer_order="fixed", seed=2)
        assert [int(other_seed[i]["target"]) for i in range(len(dataset))] != [t for _, t in sorted(positions)]
    else:
        assert len(positions) > len(dataset)  # reshuffled every epoch


def test_default_answer_orders(iraven_reference):
    assert RavenDataset(iraven_reference, "train").answer_order.mode == "random"
    assert RavenDataset(iraven_reference, "test").answer_order.mode == "fixed"


def test_image_sizes_and_resize_methods(iraven_reference):
    source_id = "distribute_nine/RAVEN_2_train"
    data = np.load(iraven_reference / f"{source_id}.npz")
    full = RavenDataset(iraven_reference, "train", configurations=["distribute_nine"], image_size=160, answer_order="none")
    assert np.array_equal(full[2]["panels"].numpy(), data["image"])
    stride = RavenDataset(iraven_reference, "train", configurations=["distribute_nine"], resize="stride", answer_order="none")
    assert np.array_equal(stride[2]["panels"].numpy(), data["image"][:, ::2, ::2])
    small = RavenDataset(iraven_reference, "train", configurations=["distribute_nine"], image_size=40, answer_order="none")
    assert small[2]["panels"].shape == (16, 40, 40)


def test_transform_gets_the_position_flag_and_views_are_independent(iraven_reference):
    calls = []

    def transform(panels: np.ndarray, preserve_position: bool) -> np.ndarray:
        calls.append(preserve_position)
        return np.ascontiguousarray(panels[:, ::-1, :]) if len(calls) % 2 else panels

    dataset = RavenDataset(iraven_reference, "train", answer_order="none", transform=transform, num_views=2)
    plain = RavenDataset(iraven_reference, "train", answer_order="none")
    flags = []
    for index in range(len(dataset)):
        calls.clear()
        sample = dataset[index]
        assert sample["panels"].shape == (2, 16, 80, 80)
        reference = plain[index]["panels"]
        assert torch.equal(sample["panels"][0], reference.flip(1)) and torch.equal(sample["panels"][1], reference)
        meta = np.load(iraven_reference / f"{sample['source_id']}.npz")["meta_matrix"]
        assert calls == [rules.requires_position_preserving(meta)] * 2
        flags.append(calls[0])
    assert True in flags and False in flags  # the reference set has both kinds


def test_bad_transform_output_is_reported(iraven_reference):
    dataset = RavenDataset(iraven_reference, "train", transform=lambda p, _keep: p.astype(np.float32))
    with pytest.raises(TypeError, match="transform must return uint8"):
        dataset[0]


def test_label_table_without_images(iraven_reference):
    dataset = RavenDataset(iraven_reference, "test", answer_order="none")
    labels = dataset.labels
    assert labels.targets.dtype == np.int64 and labels.targets.shape == (14,)
    assert labels.meta.shape == (14, 8, 9) and labels.meta_target.shape == (14, 9)
    assert labels.group_names == rules.CONFIGURATIONS
    for i in range(len(dataset)):
        sample = dataset[i]
        assert labels.targets[i] == int(sample["target"]) and labels.configurations[i] == sample["configuration"]
        assert labels.source_ids[i] == sample["source_id"]
        assert np.array_equal(labels.meta_target[i], sample["rules_dense"].numpy())


def test_invalid_arguments(iraven_reference):
    with pytest.raises(ValueError, match="rule_encoding"):
        RavenDataset(iraven_reference, "train", rule_encoding="dense")
    with pytest.raises(ValueError, match="num_views"):
        RavenDataset(iraven_reference, "train", num_views=0)
    with pytest.raises(ValueError, match="split"):
        RavenDataset(iraven_reference, "training")

"""PgmDataset on synthetic files with the release's key layout (PGM itself is not in the reference set)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rpm_lib import rules
from rpm_lib.data import PgmDataset, load_pgm_npz


def test_image_buffer_is_reshaped_not_transposed(tmp_path, pgm):
    panels = pgm.panels(1)
    path = pgm.write(tmp_path / "PGM_neutral_train_0.npz", panels)
    stored = np.load(path)["image"]
    assert stored.shape == (160, 160, 16)
    record = load_pgm_npz(path)
    assert np.array_equal(record.panels, panels)
    assert not np.array_equal(record.panels, stored.transpose(2, 0, 1))


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.int16])
def test_image_dtypes_are_cast(tmp_path, pgm, dtype):
    panels = pgm.panels(2)
    record = load_pgm_npz(pgm.write(tmp_path / "PGM_neutral_val_1.npz", panels, image_dtype=dtype))
    assert record.panels.dtype == np.uint8 and np.array_equal(record.panels, panels)


def test_dataset_samples_and_labels(make_pgm_root):
    root = make_pgm_root("interpolation")
    dataset = PgmDataset(root, "interpolation", "train", answer_order="none", image_size=160)
    assert len(dataset) == 4
    assert dataset.source_ids == [f"PGM_interpolation_train_{i}" for i in range(4)]
    for i in range(len(dataset)):
        sample = dataset[i]
        raw = np.load(root / "interpolation" / f"{sample['source_id']}.npz")
        assert sample["panels"].dtype == torch.uint8 and sample["panels"].shape == (16, 160, 160)
        assert np.array_equal(sample["panels"].numpy(), raw["image"].reshape(16, 160, 160))
        assert int(sample["target"]) == int(raw["target"])
        assert sample["configuration"] == rules.PGM_REGIMES.index("interpolation")
        assert torch.equal(sample["rules_dense"], torch.from_numpy(raw["meta_target"].astype(np.float32)))
        assert torch.equal(sample["rules_sparse"], torch.from_numpy(rules.pgm_sparse(raw["relation_structure_encoded"])))
        assert sample["rules_sparse"].shape == (50,)
    assert dataset.labels.meta.shape == (4, 4, 12)
    assert dataset.labels.targets.tolist() == [int(dataset[i]["target"]) for i in range(4)]


def test_resize_area_and_stride(make_pgm_root):
    root = make_pgm_root()
    raw = np.load(root / "neutral" / "PGM_neutral_test_1.npz")["image"].reshape(16, 160, 160)
    stride = PgmDataset(root, "neutral", "test", resize="stride", answer_order="none")[1]["panels"].numpy()
    assert np.array_equal(stride, raw[:, ::2, ::2])
    area = PgmDataset(root, "neutral", "test", answer_order="none")[1]["panels"].numpy()
    mean = raw.astype(np.float64).reshape(16, 80, 2, 80, 2).mean(axis=(2, 4))
    assert np.array_equal(area, np.floor(mean + 0.5).astype(np.uint8))


def test_files_directly_in_root_and_answer_shuffle(make_pgm_root):
    root = make_pgm_root("attr.rels", in_subfolder=False)
    plain = PgmDataset(root, "attr.rels", "val", answer_order="none")
    shuffled = PgmDataset(root, "attr.rels", "val", answer_order="random", seed=3)
    for i in range(len(plain)):
        a = plain[i]
        for _ in range(4):
            b = shuffled[i]
            assert torch.equal(b["panels"][8 + int(b["target"])], a["panels"][8 + int(a["target"])])


def test_transform_position_flag_follows_progression_on_position(make_pgm_root):
    root = make_pgm_root()
    seen = []
    dataset = PgmDataset(root, "neutral", "train", transform=lambda p, keep: seen.append(keep) or p)
    for i in range(len(dataset)):
        dataset[i]
    # odd ids carry (shape, position, progression), even ids do not (see make_pgm_root)
    assert seen == [False, True, False, True]


def test_unknown_regime_and_encoding(make_pgm_root):
    root = make_pgm_root()
    with pytest.raises(ValueError, match="unknown PGM regime"):
        PgmDataset(root, "neutrall", "train")
    with pytest.raises(ValueError, match="rule_encoding"):
        PgmDataset(root, "neutral", "train", rule_encoding="sparse38")

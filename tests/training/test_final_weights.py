"""A finished run keeps the weights its test scored: bfloat16, with the config, hash in metrics.json."""
from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from rpm_lib.run_folder import FINAL_WEIGHTS, METRICS
from rpm_lib.training import train
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.samples import make_dataset
from rpm_lib.training.final_weights import WeightsError, load_final_weights, read_final_weights


@pytest.mark.parametrize("setup", ["ce_aux_sparse", "mlcl"])
def test_a_finished_run_writes_bf16_weights_that_rebuild_the_scored_model(
        tiny_config: Callable[..., TrainConfig], setup: str) -> None:
    config = tiny_config(setup=setup, max_test_samples=14, limit_test_batches=1.0)
    metrics = train(config)
    run_dir = Path(config.run_dir)
    record = json.loads((run_dir / METRICS).read_text())["final_weights"]
    assert record == metrics["final_weights"]
    path = run_dir / FINAL_WEIGHTS
    assert record["file"] == FINAL_WEIGHTS
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["bytes"] == path.stat().st_size
    payload = read_final_weights(path, record["sha256"])
    floats = [t for t in payload["state_dict"].values() if t.is_floating_point()]
    assert floats and all(t.dtype == torch.bfloat16 for t in floats)
    # about 2 bytes a parameter, not 4 (plus the file's own structure)
    assert record["bytes"] < 2.5 * record["parameters"] + 200_000

    model = load_final_weights(path, record["sha256"])
    assert not model.training
    correct = total = 0
    with torch.no_grad():
        for batch in DataLoader(make_dataset(config, "test"), batch_size=7):
            correct += int((model(batch["panels"])["scores"].argmax(1) == batch["target"]).sum())
            total += len(batch["target"])
    # the bf16 copy scores what the full-precision weights scored on this set, give or take one problem
    assert abs(correct / total - metrics["test_accuracy"]) <= 1.01 / total


def test_an_altered_or_foreign_weights_file_is_refused_in_one_line(tiny_config: Callable[..., TrainConfig],
                                                                   tmp_path: Path) -> None:
    config = tiny_config(setup="ce")
    record = train(config)["final_weights"]
    path = Path(config.run_dir) / FINAL_WEIGHTS
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    altered = tmp_path / "altered.pt"
    altered.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match=r"altered\.pt: SHA-256 .* differs from the recorded") as caught:
        read_final_weights(altered, record["sha256"])
    assert "\n" not in str(caught.value)

    class Payload:  # a pickle that would run code on an unsafe load
        def __reduce__(self):
            return (print, ("ran",))

    hostile = tmp_path / "hostile.pt"
    hostile.write_bytes(pickle.dumps({"format": "rpm_lib-final-weights", "x": Payload()}))
    with pytest.raises(WeightsError, match=r"hostile\.pt: not loadable as plain tensors"):
        read_final_weights(hostile)
    other = tmp_path / "other.pt"
    torch.save({"state_dict": {}}, other)
    with pytest.raises(WeightsError, match=r"other\.pt: not a final-weights file"):
        read_final_weights(other)
    with pytest.raises(WeightsError, match=r"missing\.pt: no such weights file"):
        read_final_weights(tmp_path / "missing.pt")

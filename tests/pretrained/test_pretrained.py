"""The shipped-model registry: a tiny model trained here goes through add, list, load, verify and evaluate; every
model that ships loads, matches its hash, and scores fresh problems as its record says."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rpm_lib.pretrained import PretrainedError, load_pretrained, model_entry, read_registry, verify
from rpm_lib.pretrained.cli import main
from rpm_lib.pretrained.evaluate import (accuracy_rows, expected_range, fresh_problems, merged, regime_rows,
                                         score_folder)
from rpm_lib.pretrained.registry import PROTOCOLS, REGISTRY_FILE
from rpm_lib.run_folder import FINAL_WEIGHTS, METRICS
from rpm_lib.training import train
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.eval_sets import IN_DISTRIBUTION, OUT_OF_DISTRIBUTION
from rpm_lib.training.final_weights import load_final_weights, read_final_weights

SHIPPED = list(read_registry())


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny CE+AUX-sparse run (10 problems per configuration, 24 px, 2 steps)."""
    root = tmp_path_factory.mktemp("pretrained")
    config = TrainConfig(run_dir=str(root / "run"), data_root=str(root / "data"), generate=True,
                         generate_num_per_config=10, generate_seed=3, image_size=24, setup="ce_aux_sparse",
                         encoder="scl", batch_size=2, max_epochs=1, max_steps=2, progress_bar=False,
                         limit_val_batches=1, max_val_samples=2, max_test_samples=14)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(config)
    finally:
        torch.set_num_threads(previous)
    return root / "run"


@pytest.fixture
def registry(tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "zoo" / "models.json"
    assert main(["--registry", str(path), "add", str(tiny_run), "--name", "tiny", "--command", "pytest"]) == 0
    assert "tiny added" in capsys.readouterr().out
    return path


def test_a_finished_run_becomes_an_entry_whose_records_are_the_run_s(tiny_run: Path, registry: Path) -> None:
    entry = model_entry("tiny", registry)
    metrics = json.loads((tiny_run / METRICS).read_text())
    assert (entry.encoder, entry.setup, entry.protocol, entry.image_size) == ("scl", "ce_aux_sparse", "supervised",
                                                                             24)
    assert entry.test_accuracy == metrics["test_accuracy"] and entry.val_accuracy == metrics["val_accuracy"]
    assert entry.test_num_samples == metrics["test_num_samples"] == 14
    assert entry.sha256 == metrics["final_weights"]["sha256"]
    assert entry.epochs == {"supervised": 1}
    assert entry.data["regime"]["seed"] == 3 and entry.data["regime"]["regime"] == "I-RAVEN"
    assert entry.data["num_problems"] == 70 and entry.data["num_per_config"] == 10
    assert entry.data["fingerprint"].startswith("sha256-")
    assert entry.weights_path(registry).read_bytes() == (tiny_run / FINAL_WEIGHTS).read_bytes()
    assert verify(entry, registry) is None


def test_load_pretrained_gives_the_run_s_model_in_eval_mode(tiny_run: Path, registry: Path) -> None:
    model = load_pretrained("tiny", registry=registry)
    reference = load_final_weights(tiny_run / FINAL_WEIGHTS)
    assert not model.training
    panels = torch.randint(0, 256, (3, 16, 24, 24), dtype=torch.uint8)
    with torch.no_grad():
        out, expected = model(panels), reference(panels)
    assert out["scores"].shape == (3, 8) and out["rule_logits"].shape[0] == 3
    assert torch.equal(out["scores"], expected["scores"])


def test_a_tampered_file_or_an_unknown_name_is_refused_in_one_line(registry: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PretrainedError, match=r"no shipped model called 'tny'; did you mean 'tiny'\?"):
        load_pretrained("tny", registry=registry)
    path = model_entry("tiny", registry).weights_path(registry)
    data = bytearray(path.read_bytes())
    data[-100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(PretrainedError, match=r"shipped model 'tiny': .*tiny\.pt: SHA-256 .* differs") as caught:
        load_pretrained("tiny", registry=registry)
    assert "\n" not in str(caught.value)
    assert main(["--registry", str(registry), "verify"]) == 1
    assert "differs from the registry's" in capsys.readouterr().err
    path.unlink()
    assert main(["--registry", str(registry), "evaluate", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such weights file" in err


def test_list_and_evaluate_on_fresh_problems(registry: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="2"):
        main(["--registry", str(registry), "evaluate", "tiny", "--num-per-config", "9"])
    assert "--num-per-config: must be from 10 to 100,000, got 9" in capsys.readouterr().err
    assert main(["--registry", str(registry), "list"]) == 0
    assert "| tiny | scl | CE+AUX-sparse | supervised | 24 |" in capsys.readouterr().out
    assert main(["--registry", str(registry), "evaluate", "tiny", "--num-per-config", "10",
                 "--data", str(tmp_path / "fresh")]) == 0
    out = capsys.readouterr().out
    assert "tiny on 70 fresh I-RAVEN problems (seed 20261128; it was trained on seed 3)" in out
    assert "| All | 70 |" in out and "| Center | 10 |" in out
    assert (tmp_path / "fresh" / "I-RAVEN" / "manifest.json").is_file()  # kept with --data


def test_regimes_are_labelled_in_or_out_of_the_training_distribution(registry: Path, tmp_path: Path) -> None:
    model = load_pretrained("tiny", registry=registry)
    rows = regime_rows(model, model_entry("tiny", registry), ["I-RAVEN", "A/Color", "I-RAVEN-Mesh"], tmp_path, 10)
    labels = {(row["regime"], row["split"]): row["distribution"] for row in rows}
    assert labels[("I-RAVEN", "train+val")] == labels[("I-RAVEN", "test")] == IN_DISTRIBUTION
    assert labels[("A/Color", "test")] == labels[("I-RAVEN-Mesh", "test")] == OUT_OF_DISTRIBUTION
    assert all(row["problems"] == (56 if row["split"] == "train+val" else 14) for row in rows)
    assert all(row["low"] <= row["accuracy"] <= row["high"] for row in rows)


def test_the_expected_range_holds_a_model_s_own_accuracy_and_rejects_a_far_one() -> None:
    low, high = expected_range(0.6, 700)
    assert low < 0.6 < high and high - low < 0.1
    assert not low <= 0.45 <= high


def test_the_shipped_registry_lists_only_files_that_ship_and_says_what_they_hold() -> None:
    assert SHIPPED, "no model ships"
    for name in SHIPPED:
        entry = model_entry(name)
        assert verify(entry) is None, name
        payload = read_final_weights(entry.weights_path(), entry.sha256)
        config = payload["config"]
        assert (config["encoder"], config["setup"], config["image_size"]) == (entry.encoder, entry.setup,
                                                                              entry.image_size), name
        assert sum(t.numel() for k, t in payload["state_dict"].items() if "running" not in k
                   and "num_batches" not in k) == entry.parameters, name
        assert entry.protocol in PROTOCOLS and entry.test_num_samples > 0, name
    shipped = {p.name for p in (REGISTRY_FILE.parent / "weights").glob("*.pt")}
    assert shipped == {Path(model_entry(name).file).name for name in SHIPPED}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_model_scores_fresh_problems_as_its_record_says(name: str, tmp_path: Path) -> None:
    """700 problems of another seed: the accuracy lies in the 99 % binomial range of the recorded test accuracy."""
    entry = model_entry(name)
    model = load_pretrained(name)
    root = fresh_problems(tmp_path / "fresh", entry.image_size, num_per_config=100, seed=20_261_128)
    rows = accuracy_rows(entry, merged(list(score_folder(model, root).values())))
    total = rows[-1]
    assert total["problems"] == 700
    low, high = expected_range(entry.test_accuracy, 700)
    assert low <= total["accuracy"] <= high, (name, total["accuracy"], entry.test_accuracy)


def test_a_copied_registry_finds_its_weights_beside_it(registry: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere"
    shutil.copytree(registry.parent, moved)
    assert verify(model_entry("tiny", moved / "models.json"), moved / "models.json") is None

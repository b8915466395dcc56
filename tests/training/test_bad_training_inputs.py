"""Training inputs that are wrong or damaged: every case a clear one-line error naming the field, nothing silently
wrong."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from rpm_lib.training import ConfigError, TrainConfig, parse_overrides
from rpm_lib.training.callbacks import NonFiniteLossError
from rpm_lib.training.cli import main as rpm_train


@pytest.mark.parametrize("override", ["lr=nan", "lr=.inf", "beta=-.inf", "temperature=nan", "gamma=.nan"])
def test_non_finite_numbers_are_refused_naming_the_field(override: str) -> None:
    field = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"config field '{field}': must be a finite number"):
        TrainConfig.from_dict(parse_overrides([override]))


def test_rpm_train_answers_a_non_finite_lr_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert rpm_train([f"run_dir={tmp_path / 'run'}", "lr=nan"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "rpm-train: error: config field 'lr': must be a finite number, got nan"


def test_a_diverging_run_stops_with_a_clear_error_and_no_results(tiny_config: Callable[..., TrainConfig]) -> None:
    from rpm_lib.training import train

    # Adam moves every weight by about lr per step: 1e30 overflows float32 activations at once.
    config = tiny_config(setup="ce", lr=1e30, max_steps=2)
    with pytest.raises(NonFiniteLossError, match=r"stage supervised, epoch 0: the loss is not finite"):
        train(config)
    assert not (Path(config.run_dir) / "metrics.json").exists(), "no metrics that look real"
    assert (Path(config.run_dir) / "history.csv").is_file(), "the diverged epoch stays on record"


def test_a_missing_test_split_is_found_before_training(tiny_config: Callable[..., TrainConfig], tmp_path: Path) -> None:
    import shutil

    from rpm_lib.training import train

    config = tiny_config(setup="ce")
    data = tmp_path / "no-test"
    shutil.copytree(config.data_root, data)
    for path in data.rglob("*_test.*"):
        path.unlink()
    config = tiny_config(setup="ce", data_root=str(data))
    from rpm_lib.data import DataFormatError

    with pytest.raises(DataFormatError, match=r"no-test/center_single: no files for split\(s\) \['test'\]"):
        train(config)
    assert not (Path(config.run_dir) / "history.csv").exists(), "stopped before the first epoch"


def test_a_cache_of_one_configuration_names_what_it_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rpm_lib.data import prepare_cache
    from rpm_lib.generator.writer import write_dataset

    raw = tmp_path / "raw"
    write_dataset(raw, ["center_single"], count=10, seed=5, progress=False)
    cache = prepare_cache(raw, tmp_path / "cache", size=32, configurations=["center_single"], show_progress=False)
    assert rpm_train([f"data_root={cache}", "image_size=32", f"run_dir={tmp_path / 'run'}", "setup=ce",
                      "max_steps=1", "progress_bar=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the cache has no 'distribute_four' problems" in err[0]
    assert "it holds center_single (choose those with configurations=)" in err[0]


@pytest.mark.parametrize(("fields", "says"), [
    (["encoder=wren", "image_size=16"], "FourLayerCNN: image_size 16 is too small for 4 stride-2 convs"),
    (["encoder=scl", 'encoder_kwargs={"bogus": 1}'], "unexpected keyword argument 'bogus'"),
])
def test_an_encoder_that_cannot_be_built_from_the_config_is_one_line_naming_the_fields(
        fields: list[str], says: str, tiny_iraven: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the encoder checks its arguments only when it is built, after the data were opened: a traceback before
    assert rpm_train([f"data_root={tiny_iraven}", f"run_dir={tmp_path / 'run'}", "setup=ce", "max_steps=1",
                      "progress_bar=false", *fields]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rpm-train: error: config fields 'encoder' (") and says in err[0], err

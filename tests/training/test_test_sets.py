"""Extra test sets (``test_data_roots``) and the in / out-of-distribution label of every evaluated set."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rpm_lib.training import cli
from rpm_lib.training.cli import main as rpm_train
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.eval_sets import (IN_DISTRIBUTION, OUT_OF_DISTRIBUTION, UNKNOWN, EvalSet, RegimeInfo,
                                        classify_distribution, extra_sets, read_regime, regime_file,
                                        unshifted_configurations)
from rpm_lib.training.run import train

A_COLOR = {"regime": "A/Color", "held_out": {"Color": "Constant"}, "mesh": False}
A_SIZE = {"regime": "A/Size", "held_out": {"Size": "Constant"}, "mesh": False}
I_RAVEN = {"regime": "I-RAVEN", "held_out": {}, "mesh": False}


def _folder(path: Path, record: dict[str, Any] | None, **extra: Any) -> Path:
    """A folder with a fake ``regime.json`` (the generator's keys) or none."""
    path.mkdir(parents=True, exist_ok=True)
    if record is not None:
        (path / "regime.json").write_text(json.dumps({**record, "seed": 1, "mode": "balanced", "val": 2, "test": 2,
                                                      **extra}))
    return path


# ----------------------------------------------------------------------------------------------
# labelling
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("trained, evaluated, split, expected", [
    (A_COLOR, A_COLOR, "val", IN_DISTRIBUTION),        # val follows the train rules
    (A_COLOR, A_COLOR, "train", IN_DISTRIBUTION),
    (A_COLOR, A_COLOR, "test", OUT_OF_DISTRIBUTION),   # test: the held-out Color follows other rules
    (I_RAVEN, I_RAVEN, "test", IN_DISTRIBUTION),       # nothing held out: test is i.i.d.
    (I_RAVEN, I_RAVEN, "val", IN_DISTRIBUTION),
    (A_COLOR, A_SIZE, "test", OUT_OF_DISTRIBUTION),    # another regime
    (A_COLOR, A_SIZE, "val", OUT_OF_DISTRIBUTION),     # another regime, even its train-like split
    (I_RAVEN, A_COLOR, "val", OUT_OF_DISTRIBUTION),
    (A_COLOR, None, "test", UNKNOWN),                  # no regime.json: not recorded
    (None, A_COLOR, "test", UNKNOWN),
    (None, None, "val", UNKNOWN),
])
def test_distribution_from_regime_json(tmp_path: Path, trained: dict | None, evaluated: dict | None, split: str,
                                       expected: str) -> None:
    train_info = read_regime(_folder(tmp_path / "train", trained))
    eval_info = read_regime(_folder(tmp_path / "eval", evaluated))
    distribution, reason = classify_distribution(train_info, eval_info, split)
    assert distribution == expected
    assert reason and "\n" not in reason
    if expected == UNKNOWN:
        assert "no regime.json" in reason


def test_same_name_with_other_held_out_groups_or_mode_is_another_distribution(tmp_path: Path) -> None:
    custom = {"regime": "mine", "held_out": {"Color": "Constant"}, "mesh": False}
    base = read_regime(_folder(tmp_path / "a", custom))
    other_rule = read_regime(_folder(tmp_path / "b", {**custom, "held_out": {"Color": "Progression"}}))
    original = read_regime(_folder(tmp_path / "c", custom, mode="original"))
    reseeded = read_regime(_folder(tmp_path / "d", custom, seed=99))
    assert classify_distribution(base, other_rule, "val") == (
        OUT_OF_DISTRIBUTION, "regime mine differs from the training regime mine (held-out groups)")
    assert classify_distribution(base, original, "val")[0] == OUT_OF_DISTRIBUTION
    assert classify_distribution(base, reseeded, "val")[0] == IN_DISTRIBUTION  # the seed is not the distribution
    assert base.held_out == ("Color:Constant",)


def test_a_cache_uses_the_regime_its_manifest_recorded_not_its_source_folder(tmp_path: Path) -> None:
    source = _folder(tmp_path / "raw", A_COLOR)
    cache = tmp_path / "cache"
    cache.mkdir()
    record = json.loads((source / "regime.json").read_text())
    (cache / "manifest.json").write_text(json.dumps({"plan": {"source_root": str(source)}, "regime": record}))
    assert regime_file(cache) == cache / "manifest.json"
    assert read_regime(cache).name == "A/Color"
    (source / "regime.json").write_text(json.dumps(I_RAVEN))  # the source folder regenerated with another regime
    assert read_regime(cache).name == "A/Color"
    (cache / "manifest.json").write_text(json.dumps({"plan": {"source_root": str(source)}}))  # an older cache
    assert read_regime(cache) is None  # its raw folder may hold other problems now: unknown, with a note


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not readable JSON"),
    ('{"held_out": {}, "mesh": false}', "missing key 'regime'"),
    ('{"regime": "A/Color", "held_out": 3, "mesh": false}', "held_out must be an object"),
    ('{"regime": "A/Color", "held_out": {"Size": "Constant"}, "mesh": false}', "'A/Color' is a registered regime"),
])
def test_a_broken_regime_json_is_one_line_naming_field_and_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "regime.json").write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        read_regime(tmp_path, field="test_data_roots")
    assert str(info.value).startswith("config field 'test_data_roots': ")
    assert str(tmp_path / "regime.json") in str(info.value) and "\n" not in str(info.value)


DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000  # json.loads alone: a RecursionError


@pytest.mark.parametrize("text, message", [
    (DEEP, "is not readable JSON (nested deeper than 200 levels"),
    ('{"regime": "A/Color", "held_out": {"Color": "Constant"}, "mesh": false, "mode": ["balanced"]}',
     # found: taken as the mode named "['balanced']"
     "field 'mode' must be a generator mode (str) or null, got ['balanced']"),
])
def test_a_hostile_regime_json_is_one_line_naming_field_and_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "regime.json").write_text(text)
    with pytest.raises(ConfigError) as info:
        read_regime(tmp_path, field="test_data_roots")
    assert str(info.value).startswith(f"config field 'test_data_roots': {tmp_path / 'regime.json'}")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_cache_manifest_nested_100000_deep_is_left_to_the_cache_reader(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(DEEP)
    assert read_regime(tmp_path) is None  # no RecursionError; opening the cache names the file (test_damaged_caches)


def test_extra_set_names_are_unique_and_file_safe() -> None:
    config = TrainConfig(test_data_roots=["data/x/A-Color", "other/A-Color", "data/test", "data/a b+c"])
    sets = extra_sets(config)
    assert [s.name for s in sets] == ["A-Color", "A-Color-2", "test-2", "a b+c"]
    assert [s.split for s in sets] == ["test"] * 4
    assert sets[3].predictions_file == "predictions_a_b_c.npz"
    assert EvalSet("test", "d", "test", True).predictions_file == "predictions.npz"


# ----------------------------------------------------------------------------------------------
# the config field
# ----------------------------------------------------------------------------------------------
def test_field_in_yaml_overrides_and_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("test_data_roots: [data/a, data/b]\n")
    assert TrainConfig.from_yaml(path).test_data_roots == ["data/a", "data/b"]
    assert TrainConfig.from_yaml(path, ["test_data_roots=[data/c]"]).test_data_roots == ["data/c"]
    assert TrainConfig().with_overrides(["test_data_roots=[]"]).test_data_roots is None
    assert TrainConfig.from_yaml(path).to_yaml().count("test_data_roots: [data/a, data/b]") == 1
    with pytest.raises(ConfigError, match="config field 'test_data_roots': data/a/ is listed twice"):
        TrainConfig(test_data_roots=["data/a", "data/a/"])
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "test_data_roots = null" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# errors before training
# ----------------------------------------------------------------------------------------------
def test_a_missing_test_root_fails_before_training(tiny_config: Callable[..., TrainConfig], tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    config = tiny_config(test_data_roots=[str(missing)])
    with pytest.raises(ConfigError) as info:
        train(config)
    assert str(info.value) == f"config field 'test_data_roots': {missing} does not exist"
    assert not Path(config.run_dir).exists()  # nothing was started


def test_a_test_root_without_test_problems_fails_before_training(tiny_config: Callable[..., TrainConfig],
                                                                 tiny_iraven: Path, tmp_path: Path) -> None:
    only_train = tmp_path / "only_train" / "center_single"
    only_train.mkdir(parents=True)
    source = next((tiny_iraven / "center_single").glob("RAVEN_*_train.npz"))
    (only_train / source.name).write_bytes(source.read_bytes())
    config = tiny_config(test_data_roots=[str(only_train.parent)], configurations=["Center"])
    with pytest.raises(ConfigError, match=r"^config field 'test_data_roots': .*only_train/center_single: no files for "
                                          r"split\(s\) \['test'\]"):
        train(config)
    assert not Path(config.run_dir).exists()


def test_the_training_data_itself_is_refused_as_an_extra_set(tiny_config: Callable[..., TrainConfig],
                                                             tiny_iraven: Path) -> None:
    config = tiny_config(test_data_roots=[str(tiny_iraven)])
    with pytest.raises(ConfigError, match="is the training data"):
        train(config)


def test_an_extra_folder_reusing_training_streams_is_refused(tiny_config: Callable[..., TrainConfig],
                                                             tmp_path: Path) -> None:
    trained = _folder(tmp_path / "train", I_RAVEN, seed=5)
    (trained / "center_single").mkdir()
    all_test = _folder(tmp_path / "all_test", I_RAVEN, seed=5, val=0, test=10)
    config = tiny_config(data_root=str(trained), test_data_roots=[str(all_test)])
    with pytest.raises(ConfigError, match=r"generated with the training data's seed \(5\) but other split"):
        train(config)


# ----------------------------------------------------------------------------------------------
# end to end
# ----------------------------------------------------------------------------------------------
def test_configurations_whose_test_rules_are_the_training_rules() -> None:
    """A/Position can only move Number/Position in the grids: its other test problems are in distribution."""
    from rpm_lib.generator.regimes import REGIMES
    from rpm_lib.rules import CONFIGURATIONS

    def info(name: str) -> RegimeInfo:
        return RegimeInfo(REGIMES[name], "balanced", None)

    assert unshifted_configurations(info("A/Position"), info("A/Position"), "test") == [
        "center_single", "left_center_single_right_center_single", "up_center_single_down_center_single",
        "in_center_single_out_center_single"]
    assert unshifted_configurations(info("A/Color"), info("A/Color"), "test") == []  # every one has a coloured shape
    assert unshifted_configurations(info("A/Color"), info("A/Color"), "val") == list(CONFIGURATIONS)
    assert unshifted_configurations(info("I-RAVEN"), info("I-RAVEN"), "test") == list(CONFIGURATIONS)
    assert unshifted_configurations(info("I-RAVEN"), RegimeInfo(REGIMES["I-RAVEN"], "original", None), "test") == []
    assert unshifted_configurations(None, info("A/Color"), "test") is None


@pytest.mark.parametrize("fields, message", [
    ({"generate_regime": "A/Colour", "generate": True}, "unknown regime 'A/Colour' (did you mean 'A/Color'?)"),
    ({"generate_regime": "A/Color"}, "A/Color has no effect without generate=true"),
])
def test_generate_regime_is_checked(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"config field 'generate_regime': {message}")):
        TrainConfig(**fields)
    assert TrainConfig(generate=True, generate_regime="A/Type").generate_regime == "A/Type"


@pytest.fixture(scope="module")
def a_size(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny A/Size set (another seed), two configurations: the extra test set."""
    from rpm_lib.generator.writer import write_dataset

    root = tmp_path_factory.mktemp("extra") / "A-Size"
    write_dataset(root, ["center_single", "left_center_single_right_center_single"], count=10, seed=11,
                  regime="A/Size", write_xml=False, progress=False)
    return root


def test_train_on_a_regime_reports_every_set_in_or_out(tiny_config: Callable[..., TrainConfig], a_size: Path,
                                                       tmp_path: Path) -> None:
    """generate=true makes an A/Color set; the run reports its val (in), its test (out) and A/Size's test (out)."""
    config = tiny_config(setup="ce_aux_sparse", data_root=str(tmp_path / "A-Color"), generate=True,
                         generate_regime="A/Color", generate_num_per_config=10, generate_seed=3,
                         configurations=["Center", "L-R"], test_data_roots=[str(a_size)], max_test_samples=4,
                         limit_test_batches=2)
    metrics = train(config)
    run_dir = Path(config.run_dir)
    assert json.loads((tmp_path / "A-Color" / "regime.json").read_text())["regime"] == "A/Color"
    on_disk = json.loads((run_dir / "metrics.json").read_text())
    sets = on_disk["test_sets"]
    assert [(s["name"], s["split"], s["regime"], s["distribution"]) for s in sets] == [
        ("val", "val", "A/Color", IN_DISTRIBUTION), ("test", "test", "A/Color", OUT_OF_DISTRIBUTION),
        ("A-Size", "test", "A/Size", OUT_OF_DISTRIBUTION)]
    assert sets[0]["configurations_in_distribution"] == list(sets[0]["accuracy_per_configuration"])
    assert sets[1]["configurations_in_distribution"] == [] and sets[1]["held_out"] == ["Color:Constant"]
    assert sets[2]["data_root"] == str(a_size)
    # The main splits repeat the flat keys, which stay as they were.
    assert sets[0]["accuracy"] == on_disk["val_accuracy"] and sets[1]["accuracy"] == on_disk["test_accuracy"]
    assert sets[1]["accuracy_per_configuration"] == on_disk["test_accuracy_per_configuration"]
    for entry in sets:
        assert set(entry) >= {"name", "data_root", "split", "regime", "distribution", "distribution_reason",
                              "accuracy", "accuracy_per_configuration", "num_samples", "rules"}
    # The extra set is read with the run's limits and its predictions are saved beside predictions.npz.
    extra = sets[2]
    assert extra["num_samples"] == 4
    saved = np.load(run_dir / "predictions_A-Size.npz")
    assert len(saved["target"]) == 4
    assert extra["accuracy"] == pytest.approx(float(np.mean(saved["predicted"] == saved["target"])))
    per_config = {c: float(np.mean(saved["predicted"][m] == saved["target"][m]))
                  for c in extra["accuracy_per_configuration"]
                  for m in [np.char.startswith(saved["source_id"].astype(str), c + "/")]}
    assert extra["accuracy_per_configuration"] == pytest.approx(per_config)
    assert metrics["test_sets"] == sets
    # overwrite removes the extra predictions with the rest of the run.
    train(config.with_overrides({"overwrite": True, "test_data_roots": None}))
    assert not (run_dir / "predictions_A-Size.npz").exists()


def test_resuming_with_other_test_sets_drops_the_old_sets_predictions(tiny_config: Callable[..., TrainConfig],
                                                                      a_size: Path) -> None:
    """A finished run resumed with another test_data_roots is evaluated again; the predictions of a set no longer
    listed go (they would read as this evaluation's)."""
    config = tiny_config(setup="ce", test_data_roots=[str(a_size)], max_test_samples=4, configurations=["Center", "L-R"])
    train(config)
    run_dir = Path(config.run_dir)
    assert (run_dir / "predictions_A-Size.npz").is_file()
    metrics = train(config.with_overrides({"resume": True, "test_data_roots": None}))
    assert [s["name"] for s in metrics["test_sets"]] == ["val", "test"]
    assert not (run_dir / "predictions_A-Size.npz").exists() and (run_dir / "predictions.npz").is_file()


def test_a_data_folder_of_another_regime_is_one_line_from_rpm_train(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "a-color"
    common = [f"data_root={data}", "generate=true", "generate_num_per_config=10", "setup=ce", "max_steps=1",
              "max_epochs=1", "batch_size=2", "progress_bar=false", "image_size=32"]
    assert rpm_train([*common, f"run_dir={tmp_path / 'a'}", "generate_regime=A/Color"]) == 0
    capsys.readouterr()
    assert rpm_train([*common, f"run_dir={tmp_path / 'b'}"]) == 2  # the same folder, asked for plain I-RAVEN
    err = capsys.readouterr().err.strip()
    assert err.startswith("rpm-train: error: config field 'data_root': ") and "\n" not in err, err

"""TrainConfig: YAML round trip, key=value overrides, validation errors, the stage plans and the CLI."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from rpm_lib.training import cli
from rpm_lib.training.config import ConfigError, TrainConfig, field_help, parse_overrides
from rpm_lib.training.plans import stage_plan
from rpm_lib.training.setups import SETUPS

REPO = Path(__file__).resolve().parents[2]


def test_yaml_round_trip(tmp_path: Path) -> None:
    config = TrainConfig(setup="ce_aux_sparse", beta=5.0, configurations=["Center", "L-R"], encoder="wren",
                         encoder_kwargs={"hidden": 3}, devices=[0, 1], limit_val_batches=3)
    path = tmp_path / "config.yaml"
    config.to_yaml(path)
    assert TrainConfig.from_yaml(path) == config
    assert yaml.safe_load(path.read_text())["configurations"] == ["center_single",
                                                                "left_center_single_right_center_single"]


def test_overrides_are_parsed_per_field_type() -> None:
    config = TrainConfig().with_overrides([
        "lr=1e-3", "batch_size=32", "configurations=[Center, 2x2Grid]", "run_dir=007", "max_train_samples=null",
        "encoder_kwargs={backbone: cnn4}", "devices=2", "limit_train_batches=0.5", "progress_bar=false",
        "gradient_clip_val=1",
    ])
    assert config.lr == 0.001 and isinstance(config.lr, float)
    assert config.batch_size == 32
    assert config.configurations == ["center_single", "distribute_four"]
    assert config.run_dir == "007"
    assert config.max_train_samples is None
    assert config.encoder_kwargs == {"backbone": "cnn4"}
    assert config.devices == 2
    assert config.limit_train_batches == 0.5
    assert config.progress_bar is False
    assert config.gradient_clip_val == 1.0 and isinstance(config.gradient_clip_val, float)
    assert TrainConfig().with_overrides(["configurations=Center,O-IG"]).configurations == [
        "center_single", "in_distribute_four_out_center_single"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["learning_rate=0.1"], "learning_rate"),
        (["setup=mlcl_augmented"], "setup"),
        (["encoder=resnet"], "encoder"),
        (["batch_size=abc"], "batch_size"),
        (["batch_size=2.5"], "batch_size"),
        (["lr=-0.1"], "lr"),
        (["lr=0"], "lr"),
        (["temperature=0"], "temperature"),
        (["beta=-1"], "beta"),
        (["negatives=some"], "negatives"),
        (["configurations=[Middle]"], "configurations"),
        (["setup=ce_aux_sparse", "rule_encoding=dense"], "rule_encoding"),
        (["setup=ce_aux_dense", "rule_encoding=sparse38"], "rule_encoding"),
        (["dataset=pgm", "rule_encoding=sparse38"], "rule_encoding"),
        (["setup=mlcl", "beta=0", "gamma=0"], "beta"),
        (["precision=fp8"], "precision"),
        (["devices=many"], "devices"),
        (["progress_bar=maybe"], "progress_bar"),
        (["dataset=pgm", "pgm_regime=neutrall"], "pgm_regime"),
        (["encoder_kwargs={image_size: 40}"], "encoder_kwargs"),
        (["augment=strong"], "augment"),
    ],
)
def test_bad_values_name_the_field(overrides: list[str], field: str) -> None:
    with pytest.raises(ConfigError, match=f"'{field}'"):
        TrainConfig().with_overrides(overrides)


def test_unknown_key_suggests_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("bach_size: 4\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*'bach_size'.*did you mean 'batch_size'"):
        TrainConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides(["batch_size"])


def test_a_bad_value_in_a_config_file_names_the_file_and_one_from_the_command_line_does_not(tmp_path: Path) -> None:
    # found: a truncated run-folder config.yaml ("head_views: sin") was refused without naming the file
    path = tmp_path / "config.yaml"
    path.write_text("head_views: sin\n")
    with pytest.raises(ConfigError) as error:
        TrainConfig.from_yaml(path)
    assert str(error.value).startswith(f"config file {path}: config field 'head_views': 'sin' is not one of")
    with pytest.raises(ConfigError) as error:
        TrainConfig.from_yaml(tmp_path / "config.yaml", ["head_views=sin"])
    assert str(error.value).startswith("config field 'head_views'")


def test_shipped_training_configs_are_valid() -> None:
    # configs/ also holds rpm-batch grid files (another format); these three are TrainConfig files.
    configs = {name: TrainConfig.from_yaml(REPO / "configs" / f"{name}.yaml") for name in ("iraven", "pgm", "tiny")}
    # The paper's hyper-parameters.
    assert (configs["iraven"].batch_size, configs["iraven"].lr, configs["iraven"].max_epochs) == (128, 0.002, 100)
    assert (configs["pgm"].batch_size, configs["pgm"].lr, configs["pgm"].max_epochs) == (256, 0.003, 50)
    assert configs["pgm"].dataset == "pgm"


def test_stage_plans_follow_the_setups() -> None:
    base = TrainConfig(beta=10.0, gamma=1.0, lr=0.002)
    plans = {name: stage_plan(dataclasses.replace(base, setup=name)) for name in SETUPS}
    assert [p.name for p in plans["ce"]] == ["supervised"] and plans["ce"][0].aux_weight == 0
    assert plans["ce_aux_sparse"][0].aux_weight == 10.0 and plans["ce_aux_sparse"][0].answer_weight == 1.0
    for name in ("mlcl", "mlcl_aug"):
        pretrain, linear = plans[name]
        assert (pretrain.name, linear.name) == ("pretrain", "linear")
        assert pretrain.answer_weight == 0 and pretrain.contrastive_weight == 1.0 and pretrain.aux_weight == 10.0
        assert not linear.train_encoder and linear.reset_scoring_head and linear.answer_weight == 1.0
        assert linear.contrastive_weight == 0 and linear.aux_weight == 0 and linear.augment == "none"
    assert plans["mlcl"][0].num_views == 1 and plans["mlcl"][0].augment == "none"
    assert plans["mlcl_aug"][0].num_views == 2 and plans["mlcl_aug"][0].augment == "official"
    finetuned = stage_plan(dataclasses.replace(base, setup="mlcl", finetune=True, finetune_lr=3e-4))
    assert [p.name for p in finetuned] == ["pretrain", "linear", "finetune"]
    assert finetuned[-1].train_encoder and finetuned[-1].lr == 3e-4
    assert TrainConfig(setup="ce_aux_dense").resolved_rule_encoding == "dense"
    assert TrainConfig(setup="mlcl", dataset="pgm").resolved_rule_encoding == "sparse50"


def test_cli_help_lists_every_field_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for _group, name, _type, default, _help in field_help():
        assert f"  {name} = {default}   (" in text, name
    assert "run_dir = runs/train" in text and "beta = 10.0" in text


def test_cli_print_config_applies_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "base.yaml"
    path.write_text("setup: ce\nbatch_size: 16\n")
    assert cli.main(["--config", str(path), "--print-config", "batch_size=8", "lr=5e-4"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["setup"], printed["batch_size"], printed["lr"]) == ("ce", 8, 0.0005)


def test_cli_reports_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--print-config", "lr=-1"]) == 2
    assert "'lr'" in capsys.readouterr().err


def test_a_config_file_naming_a_field_twice_or_a_folder_is_one_line(tmp_path: Path) -> None:
    # Before this check, PyYAML silently kept the second of two values; a folder "did not exist".
    twice = tmp_path / "twice.yaml"
    twice.write_text("matmul_precision: high\nseed: 1\nmatmul_precision: medium\n")
    with pytest.raises(ConfigError, match=r"twice.yaml: not valid YAML: key 'matmul_precision' appears twice \(line 3\)"):
        TrainConfig.from_yaml(twice)
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(ConfigError, match="folder.yaml is a folder, not a YAML file"):
        TrainConfig.from_yaml(tmp_path / "folder.yaml")
    nested = tmp_path / "nested.yaml"
    nested.write_text("configurations: [Center]\nrule_spec: {a: 1, a: 2}\n")
    with pytest.raises(ConfigError, match="key 'a' appears twice"):
        TrainConfig.from_yaml(nested)


def test_settings_that_change_nothing_are_named() -> None:
    # Before this check, compile_scope=step without compile=true was accepted without a word.
    assert TrainConfig().unused_settings() == []
    assert TrainConfig(compile_scope="step", compile_mode="reduce-overhead").unused_settings() == [
        "compile_scope=step and compile_mode=reduce-overhead take effect only with compile=true"]
    assert TrainConfig(compile_scope="step").unused_settings() == [
        "compile_scope=step takes effect only with compile=true"]
    on_cpu = TrainConfig(compile=True, compile_mode="reduce-overhead", accelerator="cpu")
    assert on_cpu.unused_settings() == ["compile_mode=reduce-overhead replays CUDA graphs only on a CUDA GPU; here "
                                        "the step is compiled without them"]
    assert TrainConfig(compile=True, compile_scope="step").unused_settings() == []
    assert TrainConfig(restart_stage=True).unused_settings() == ["restart_stage=true takes effect only with resume=true"]
    assert TrainConfig(restart_stage=True, resume=True).unused_settings() == []


#: The three field classes as they were listed by hand before the fields carried them (training/run.py and
#: rpm_lib/results.py): the metadata must reproduce them exactly.
_RESUMABLE_CHANGES = {
    "resume", "overwrite", "progress_bar", "num_workers", "log_every_n_steps", "save_predictions", "accelerator",
    "devices", "num_nodes", "strategy", "max_epochs", "linear_eval_epochs", "finetune_epochs", "max_steps",
    "patience", "min_delta", "limit_test_batches", "generate_workers", "test_data_roots", "time_budget", "compile",
    "compile_scope", "compile_mode", "fused_adam", "logger", "data_root", "run_dir", "data_check", "restart_stage",
}
_FINISHED_RUN_IGNORES = {"max_epochs", "linear_eval_epochs", "finetune_epochs", "max_steps", "patience", "min_delta"}
_NOT_COMPARED = {
    "run_dir", "seed", "resume", "overwrite", "progress_bar", "save_predictions", "log_every_n_steps", "logger",
    "time_budget", "data_root", "data_check", "test_data_roots", "generate", "generate_workers", "num_workers",
    "accelerator", "devices", "num_nodes", "strategy", "precision", "matmul_precision", "memory_format",
    "deterministic", "fused_adam", "compile", "compile_scope", "compile_mode", "restart_stage",
}


def test_field_classes_are_computed_from_the_field_metadata() -> None:
    from rpm_lib.training.config import FINISHED_RUN_IGNORES, NOT_COMPARED, RESUMABLE_CHANGES

    assert RESUMABLE_CHANGES == _RESUMABLE_CHANGES
    assert FINISHED_RUN_IGNORES == _FINISHED_RUN_IGNORES
    assert NOT_COMPARED == _NOT_COMPARED
    assert all(isinstance(s, frozenset) for s in (RESUMABLE_CHANGES, FINISHED_RUN_IGNORES, NOT_COMPARED))
    assert FINISHED_RUN_IGNORES <= RESUMABLE_CHANGES  # only a resumable field can be ignored by a finished run


def test_every_field_is_classified_for_each_class() -> None:
    # A new field must say whether it may change on resume, whether a finished run ignores it and whether it
    # separates Table 1 rows: the helper that declares fields has no default for its role.
    for f in dataclasses.fields(TrainConfig):
        for key in ("resumable", "finished_run_ignores", "compared"):
            assert isinstance(f.metadata.get(key), bool), (f.name, key)
    from rpm_lib.training import config_values

    with pytest.raises(TypeError):
        config_values.field(0, "a field without a role", "run")  # type: ignore[call-arg]


def test_rpm_train_refuses_an_empty_config_path_instead_of_running_the_defaults(
        capsys: pytest.CaptureFixture[str]) -> None:
    from rpm_lib.training import cli

    with pytest.raises(SystemExit) as stopped:
        cli.main(["--config", "", "--print-config"])
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rpm-train: error: argument --config/-c: empty"), err

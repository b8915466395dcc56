"""End-to-end training on the tiny generated set: every setup x encoder, frozen linear evaluation, exact resume,
run-folder safety and the rpm-train CLI."""
from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch

from rpm_lib.method_choices import BUILT_IN_ENCODERS
from rpm_lib.training import cli
from rpm_lib.training.history import history_rows
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.run import train
from rpm_lib.training.setups import SETUPS
from comparable_metrics import comparable as _comparable

# every registered encoder: tests/encoders/test_encoder_registry.py checks that this list is the registry
@pytest.mark.parametrize("encoder", BUILT_IN_ENCODERS)
@pytest.mark.parametrize("setup", list(SETUPS))
def test_two_steps_of_every_setup_and_encoder(tiny_config: Callable[..., TrainConfig], setup: str,
                                              encoder: str) -> None:
    # 32 px: what is tested here is the setups' path through each encoder (the encoders at 80 px: tests/encoders);
    # at 80 px these 25 runs took twice as long (69 s against 32 s, alone on a 2-core machine)
    config = tiny_config(setup=setup, encoder=encoder, image_size=32)
    metrics = train(config)
    run_dir = Path(config.run_dir)
    on_disk = json.loads((run_dir / "metrics.json").read_text())
    assert on_disk["test_accuracy"] == metrics["test_accuracy"]
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and np.isfinite(metrics["test_loss"])
    assert metrics["config"]["setup"] == setup and metrics["config"]["encoder"] == encoder
    assert set(metrics["versions"]) >= {"torch", "lightning", "numpy"} and metrics["seed"] == config.seed
    expected_stages = ["pretrain", "linear"] if SETUPS[setup].contrastive else ["supervised"]
    assert [s["name"] for s in metrics["stages"]] == expected_stages
    assert all(s["global_step"] == 2 for s in metrics["stages"])
    predictions = np.load(run_dir / "predictions.npz")
    assert predictions["scores"].shape == (2, 8)
    assert np.array_equal(predictions["predicted"], predictions["scores"].argmax(1))
    assert ("rule_logits" in predictions) == (setup != "ce")
    assert ("test_rules" in metrics) == (setup != "ce")
    assert set(metrics["test_accuracy_per_configuration_short"]) <= {"Center", "2x2Grid", "3x3Grid", "L-R", "U-D",
                                                                     "O-IC", "O-IG"}
    rows = list(csv.DictReader((run_dir / "history.csv").open()))
    assert [r["stage"] for r in rows] == expected_stages
    assert TrainConfig.from_yaml(run_dir / "config.yaml") == config.with_overrides({"overwrite": False})


class _EncoderWatch(L.Callback):
    """Records the encoder state when linear evaluation starts and ends, and its mode during every step."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, torch.Tensor]] = {}
        self.head: dict[str, torch.Tensor] = {}
        self.encoder_modes: list[bool] = []

    @staticmethod
    def _copy(module: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if pl_module.plan.name == "linear":
            self.states["start"] = self._copy(pl_module.encoder)
            self.head["start"] = pl_module.scoring_head.linear.weight.detach().clone()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if pl_module.plan.name == "linear":
            self.encoder_modes.extend(m.training for m in pl_module.encoder.modules())

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if pl_module.plan.name == "linear":
            self.states["end"] = self._copy(pl_module.encoder)
            self.head["end"] = pl_module.scoring_head.linear.weight.detach().clone()


def test_linear_evaluation_keeps_encoder_and_batchnorm_frozen(tiny_config: Callable[..., TrainConfig]) -> None:
    watch = _EncoderWatch()
    train(tiny_config(setup="mlcl", max_steps=4), callbacks=[watch])
    start, end = watch.states["start"], watch.states["end"]
    assert any("running_mean" in k for k in start) and any("num_batches_tracked" in k for k in start)
    assert start.keys() == end.keys()
    for key in start:
        assert torch.equal(start[key], end[key]), f"encoder {key} changed during linear evaluation"
    assert watch.encoder_modes and not any(watch.encoder_modes), "encoder left eval mode during linear evaluation"
    assert not torch.equal(watch.head["start"], watch.head["end"]), "the scoring head did not train"


class _KillDuringEpoch(L.Callback):
    """Simulates a killed job: raises after the first batch of ``stage``'s epoch ``epoch`` (epoch >= 1, so the
    checkpoint of the previous epoch exists and the work since then is lost)."""

    def __init__(self, stage: str, epoch: int) -> None:
        self.stage, self.epoch = stage, epoch

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if pl_module.plan.name == self.stage and trainer.current_epoch == self.epoch:
            raise _SimulatedKill(f"killed during {self.stage} epoch {self.epoch}")


class _SimulatedKill(RuntimeError):
    pass


class _EpochLog(L.Callback):
    """Records (stage, epoch) of every training epoch that starts."""

    def __init__(self) -> None:
        self.epochs: list[tuple[str, int]] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.epochs.append((pl_module.plan.name, trainer.current_epoch))




@pytest.mark.parametrize(("setup", "kill_stage", "workers"),
                         [("mlcl_aug", "pretrain", 0), ("mlcl", "linear", 0), ("ce_aux_sparse", "supervised", 0),
                          ("ce_aux_sparse", "supervised", 2)])
def test_resume_gives_the_same_final_metrics(tiny_config: Callable[..., TrainConfig], tmp_path: Path, setup: str,
                                             kill_stage: str, workers: int) -> None:
    # workers: loader processes fetch the resumed epoch's first indices as soon as the iterator exists, before
    # Lightning sets the sampler's epoch; the data module must set it first.
    fields = dict(setup=setup, max_steps=-1, max_epochs=2, linear_eval_epochs=2, max_train_samples=8, batch_size=4,
                  max_val_samples=4, max_test_samples=6, limit_val_batches=1.0, limit_test_batches=1.0, patience=5,
                  num_workers=workers)
    reference = train(tiny_config(run_dir=str(tmp_path / "uninterrupted"), **fields))
    interrupted = tiny_config(run_dir=str(tmp_path / "resumed"), **fields)
    with pytest.raises(_SimulatedKill):
        train(interrupted, callbacks=[_KillDuringEpoch(kill_stage, 1)])
    assert not (tmp_path / "resumed" / "metrics.json").exists()
    with pytest.raises(ConfigError, match="resume=true"):
        train(interrupted)  # an existing run is never silently replaced
    log = _EpochLog()
    resumed = train(interrupted.with_overrides({"resume": True}), callbacks=[log])
    # It really continued from the checkpoint (a restart from scratch would also match, being deterministic).
    expected = [(kill_stage, 1)] + ([("linear", 0), ("linear", 1)] if kill_stage == "pretrain" else [])
    assert log.epochs == expected
    assert _comparable(resumed) == _comparable(reference)
    a = np.load(tmp_path / "uninterrupted" / "predictions.npz")
    b = np.load(tmp_path / "resumed" / "predictions.npz")
    assert np.array_equal(a["scores"], b["scores"])
    history = [(tmp_path / d / "history.csv").read_text() for d in ("uninterrupted", "resumed")]
    assert history[0] == history[1] and history[0].count("\n") == 1 + 2 * (2 if SETUPS[setup].contrastive else 1)


def test_resume_refuses_a_changed_config(tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="ce")
    train(config)
    with pytest.raises(ConfigError, match="differs in lr"):
        train(config.with_overrides({"resume": True, "lr": 0.1}))
    assert train(config.with_overrides({"overwrite": True}))["test_num_samples"] == 2


def test_cli_trains_from_yaml_and_generates_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_file = tmp_path / "run.yaml"
    config_file.write_text(
        f"data_root: {tmp_path / 'generated'}\ngenerate: true\ngenerate_num_per_config: 10\n"
        "setup: ce_aux_sparse\nencoder: wren\nbatch_size: 2\nmax_steps: 1\nmax_epochs: 1\nprogress_bar: false\n"
        "limit_val_batches: 1\nlimit_test_batches: 1\n"
    )
    run_dir = tmp_path / "cli_run"
    assert cli.main(["--config", str(config_file), f"run_dir={run_dir}", "configurations=[Center, O-IG]"]) == 0
    assert "test_accuracy" in capsys.readouterr().out
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert set(metrics["test_accuracy_per_configuration"]) <= {"center_single", "in_distribute_four_out_center_single"}
    assert sorted(p.name for p in (tmp_path / "generated").iterdir()) == [
        ".rpm-generate.lock", "center_single", "generator.json", "in_distribute_four_out_center_single",
        "problem_hashes.json", "regime.json"]
    assert cli.main(["--config", str(config_file), f"run_dir={run_dir}"]) == 2  # refuses to overwrite


@pytest.mark.parametrize(("setup", "num_rules"), [("mlcl_aug", 50), ("ce_aux_dense", 12)])
def test_pgm_runs_report_per_regime(tiny_pgm: Path, tmp_path: Path, setup: str, num_rules: int) -> None:
    config = TrainConfig(run_dir=str(tmp_path / "pgm"), dataset="pgm", pgm_regime="interpolation",
                         data_root=str(tiny_pgm), setup=setup, encoder="wren", batch_size=2, max_steps=2, max_epochs=1,
                         progress_bar=False)
    metrics = train(config)
    assert metrics["test_num_samples"] == 3
    assert set(metrics["test_accuracy_per_regime"]) == {"interpolation"}
    assert "test_accuracy_per_configuration" not in metrics
    assert len(metrics["test_rules"]["per_rule"]) == num_rules
    assert np.load(tmp_path / "pgm" / "predictions.npz")["rule_logits"].shape == (3, num_rules)


@pytest.mark.parametrize("fields", [{"beta": 0.0}, {"gamma": 0.0}, {"negatives": "none"}, {"negatives": "own"},
                                    {"mlcl_numerics": "official", "rule_pooling": "mean"}])
def test_mlcl_ablations_run(tiny_config: Callable[..., TrainConfig], fields: dict[str, Any]) -> None:
    metrics = train(tiny_config(setup="mlcl", **fields))
    stage = metrics["stages"][0]
    assert stage["name"] == "pretrain" and np.isfinite(stage["best_val_loss"])
    # beta = 0 drops the rule head (no rule metrics); gamma = 0 trains the rule head alone.
    assert ("test_rules" in metrics) == (fields.get("beta", 10.0) > 0)


class _ParameterWatch(L.Callback):
    def __init__(self) -> None:
        self.encoder: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if pl_module.plan.name == "finetune":
            self.encoder["start"] = torch.cat([p.detach().flatten() for p in pl_module.encoder.parameters()])
            assert all(p.requires_grad for p in pl_module.encoder.parameters())

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if pl_module.plan.name == "finetune":
            self.encoder["end"] = torch.cat([p.detach().flatten() for p in pl_module.encoder.parameters()])


def test_finetune_stage_trains_the_encoder(tiny_config: Callable[..., TrainConfig]) -> None:
    watch = _ParameterWatch()
    config = tiny_config(setup="mlcl", finetune=True)
    metrics = train(config, callbacks=[watch])
    assert [s["name"] for s in metrics["stages"]] == ["pretrain", "linear", "finetune"]
    assert metrics["stages"][2]["lr"] == 3e-4
    assert not torch.equal(watch.encoder["start"], watch.encoder["end"])
    # A fine-tuned run says so, and keeps the linear-evaluation result of its own stage.
    assert metrics["setup_label"] == "MLCL+FT"
    history = [r for r in history_rows(Path(config.run_dir) / "history.csv") if r["stage"] == "linear"]
    best = min(history, key=lambda r: float(r["val_loss"]))
    assert metrics["stages"][0]["best_val_accuracy"] is None  # pre-training has no answer accuracy
    assert metrics["stages"][1]["best_val_accuracy"] == pytest.approx(float(best["val_accuracy"]))
    assert 0.0 <= metrics["stages"][2]["best_val_accuracy"] <= 1.0


def test_worker_processes_do_not_change_the_numbers(tiny_config: Callable[..., TrainConfig], tmp_path: Path) -> None:
    fields = dict(setup="mlcl_aug", max_steps=3, max_val_samples=4, max_test_samples=4)
    single = train(tiny_config(run_dir=str(tmp_path / "w0"), num_workers=0, **fields))
    workers = train(tiny_config(run_dir=str(tmp_path / "w2"), num_workers=2, **fields))
    assert [s["best_val_loss"] for s in single["stages"]] == [s["best_val_loss"] for s in workers["stages"]]
    assert np.array_equal(np.load(tmp_path / "w0" / "predictions.npz")["scores"],
                          np.load(tmp_path / "w2" / "predictions.npz")["scores"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only precision error")
def test_half_precision_on_cpu_is_a_config_error(tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(precision="16-mixed")
    with pytest.raises(ConfigError, match="'precision'"):
        train(config)
    assert not Path(config.run_dir).exists()


def test_missing_data_is_reported_before_the_run_folder_is_touched(tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(data_root="/nonexistent/i-raven")
    with pytest.raises(ConfigError, match="'data_root'.*does not exist"):
        train(config)
    assert not Path(config.run_dir).exists()


class _Payload:
    """Unpickling this creates a marker file: stands for any code a crafted checkpoint could run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_resume_never_unpickles_code_and_stays_inside_the_run_folder(tiny_config: Callable[..., TrainConfig],
                                                                     tmp_path: Path) -> None:
    config = tiny_config(setup="ce")
    train(config)
    run_dir = Path(config.run_dir)
    progress_path = run_dir / "progress.json"
    progress = json.loads(progress_path.read_text())
    # Stopped by its time budget before the final evaluation: resuming reloads every finished stage's weights
    # (a finished run is not reloaded at all; its stored metrics are returned).
    progress["status"] = "unfinished"
    resumed = TrainConfig(**{**config.to_dict(), "resume": True})

    marker = tmp_path / "executed"
    crafted = run_dir / "checkpoints" / "supervised" / "crafted.ckpt"
    torch.save({"state_dict": {}, "payload": _Payload(str(marker))}, crafted)
    progress["stages"]["supervised"]["weights"] = "checkpoints/supervised/crafted.ckpt"
    progress_path.write_text(json.dumps(progress))
    with pytest.raises(ConfigError, match="not loadable as plain weights"):
        train(resumed)
    assert not marker.exists()

    for outside in (str(tmp_path / "elsewhere.ckpt"), "../elsewhere.ckpt"):
        progress["stages"]["supervised"]["weights"] = outside
        progress_path.write_text(json.dumps(progress))
        with pytest.raises(ConfigError, match="outside the run folder"):
            train(resumed)


@pytest.mark.parametrize("reached_by", ["relative path", "symbolic link"])
def test_a_run_folder_named_relatively_or_through_a_link_resumes(tiny_config: Callable[..., TrainConfig],
                                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  reached_by: str) -> None:
    # Lightning records checkpoint paths made absolute; the record must still name them inside the run folder
    # (regression: the default run_dir=runs/train could not resume once a stage had finished).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    if reached_by == "symbolic link":
        (tmp_path / "link").symlink_to(tmp_path / "runs", target_is_directory=True)
    config = tiny_config(setup="ce", run_dir="runs/train" if reached_by == "relative path" else "link/train")
    first = train(config)
    progress_path = Path(config.run_dir) / "progress.json"
    progress = json.loads(progress_path.read_text())
    assert progress["stages"]["supervised"]["weights"] in ("checkpoints/supervised/best.ckpt",
                                                          "checkpoints/supervised/last.ckpt")
    # stopped before the final evaluation: resuming reloads the finished stage's weights
    progress["status"] = "unfinished"
    progress_path.write_text(json.dumps(progress))
    resumed = train(TrainConfig(**{**config.to_dict(), "resume": True}))
    assert resumed["test_accuracy"] == first["test_accuracy"]
    assert resumed["test_loss"] == first["test_loss"]


def test_a_checkpoint_that_does_not_fit_the_run_is_refused_in_one_line(tiny_config: Callable[..., TrainConfig]) -> None:
    # Regression: checkpoints that load as plain tensors but are not this run's gave Lightning's and
    # PyTorch's tracebacks (missing keys, wrong shapes, no loop state, another stage's optimiser).
    config = tiny_config(setup="mlcl")
    train(config)
    run_dir = Path(config.run_dir)
    progress = json.loads((run_dir / "progress.json").read_text())
    assert list(progress["stages"]) == ["pretrain", "linear"]
    # As if the run had stopped inside linear evaluation: resuming reloads pretrain's weights, then linear's last.ckpt.
    progress["status"] = "unfinished"
    del progress["stages"]["linear"]
    (run_dir / "progress.json").write_text(json.dumps(progress))
    resumed = TrainConfig(**{**config.to_dict(), "resume": True})
    last = run_dir / "checkpoints" / "linear" / "last.ckpt"
    own = torch.load(last, weights_only=True)
    other_stage = torch.load(run_dir / "checkpoints" / "pretrain" / "last.ckpt", weights_only=True)
    weights = own["state_dict"]
    first = next(iter(weights))
    cases = {
        "a weight missing": ({**own, "state_dict": {k: v for k, v in weights.items() if k != first}},
                             f"1 missing, e.g. {first}"),
        "a weight of another shape": ({**own, "state_dict": {**weights, first: torch.zeros(3)}},
                                      f"weight {first} has shape (3,)"),
        "weights only": ({"state_dict": weights}, "not a checkpoint that training resumes from"),
        "another stage's": (other_stage, "written by stage pretrain, not linear"),
    }
    for case, (content, expected) in cases.items():
        torch.save(content, last)
        with pytest.raises(ConfigError) as refused:
            train(resumed)
        assert str(refused.value).startswith(f"resume: checkpoint {last} does not fit this run ("), case
        assert expected in str(refused.value) and "\n" not in str(refused.value), (case, str(refused.value))
    torch.save(own, last)
    finished_weights = run_dir / progress["stages"]["pretrain"]["weights"]
    content = torch.load(finished_weights, weights_only=True)
    torch.save({**content, "state_dict": {k: v for k, v in content["state_dict"].items() if k != first}},
               finished_weights)
    with pytest.raises(ConfigError, match=f"checkpoint {finished_weights} does not fit this run .weights: 1 missing"):
        train(resumed)

"""The release's options and schedule: configs/release.yaml, phase switches by early stopping under a total epoch
limit, the lr reset and plateau schedule, head training with BatchNorm in train mode, the concat rule head in a
model, the run's protocol label, and the collapse bench cycling its loader past one epoch."""
from __future__ import annotations

import contextlib
import importlib.util
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.datamodule import RpmDataModule
from rpm_lib.training.history import history_rows
from rpm_lib.training.module import RpmModule
from rpm_lib.training.run import train
from rpm_lib.training.plans import protocol_of, stage_plan, within_total_epochs
from rpm_lib.training.setups import PROTOCOLS

REPO = Path(__file__).resolve().parents[2]


def test_release_preset_reproduces_the_release_schedule() -> None:
    config = TrainConfig.from_yaml(REPO / "configs" / "release.yaml")
    assert (config.batch_size, config.lr, config.beta, config.gamma) == (64, 1e-4, 1.0, 1.0)
    assert (config.lr_schedule, config.lr_plateau_factor, config.lr_plateau_patience) == ("plateau", 0.1, 5)
    assert (config.max_total_epochs, config.patience, config.restore_best) == (30, 15, False)
    assert (config.rule_pooling, config.augment, config.encoder_kwargs) == ("concat", "release", {"panel_norm": "none"})
    assert config.mlcl_numerics == "official" and config.precision == "32-true"
    plans = stage_plan(config)
    assert [p.name for p in plans] == ["pretrain", "linear", "finetune"]
    assert [p.lr for p in plans] == [1e-4, 3e-4, 3e-4]  # the lr is reset to 3e-4 at each phase change
    assert [p.batch_size for p in plans] == [64, 64, 64]
    assert [p.num_views for p in plans] == [2, 2, 2] and {p.augment for p in plans} == {"release"}
    assert [p.encoder_train_mode for p in plans] == [False, True, False]
    assert [p.bn_recalibration for p in plans] == ["none", "none", "none"]
    assert [p.train_encoder for p in plans] == [True, False, True]
    # The defaults stay the paper's: fixed features, one plain view, constant lr, no total limit.
    default = stage_plan(TrainConfig(setup="mlcl_aug", finetune=True))
    assert [(p.encoder_train_mode, p.num_views, p.augment) for p in default] == [
        (False, 2, "official"), (False, 1, "none"), (False, 1, "official")]
    # ... except that evaluation re-estimates the encoder's BatchNorm statistics (docs/linear-evaluation.md)
    assert [p.bn_recalibration for p in default] == ["before_validation", "at_start", "none"]


def test_total_epoch_limit_cuts_and_skips_stages() -> None:
    config = TrainConfig(setup="mlcl", finetune=True, max_epochs=30, max_total_epochs=30)
    pretrain, linear, finetune = stage_plan(config)
    # The release's numbers: each phase runs at least 16 epochs (1 + 15 without improvement) before it switches,
    # so after a 16-epoch pre-training the head trains for at most 14 and fine-tuning never starts.
    assert within_total_epochs(pretrain, 0, config).max_epochs == 30
    assert within_total_epochs(linear, 16, config).max_epochs == 14
    assert within_total_epochs(finetune, 30, config) is None
    assert within_total_epochs(finetune, 10, TrainConfig(max_total_epochs=None)) is finetune


def test_protocols_are_told_apart() -> None:
    mlcl = TrainConfig(setup="mlcl")
    assert protocol_of(mlcl, ["pretrain", "linear"]) == "linear_evaluation"
    assert protocol_of(mlcl, ["pretrain", "linear", "finetune"]) == "fine_tuned"
    assert protocol_of(mlcl, ["pretrain"]) == "untrained_head"
    assert protocol_of(TrainConfig(setup="ce"), ["supervised"]) == "supervised"
    assert set(PROTOCOLS) == {"linear_evaluation", "fine_tuned", "supervised", "untrained_head"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"lr_plateau_factor": 1.0}, "'lr_plateau_factor': must be < 1"),
    ({"lr_schedule": "cosine"}, "'lr_schedule'"),
    ({"linear_eval_encoder_mode": "frozen"}, "'linear_eval_encoder_mode'"),
    ({"head_views": "two"}, "'head_views'"),
    ({"max_total_epochs": 0}, "'max_total_epochs': must be >= 1"),
])
def test_bad_release_options_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**fields)


def _stage_epochs(config: TrainConfig) -> dict[str, Any]:
    metrics = train(config)
    rows = history_rows(Path(config.run_dir) / "history.csv")
    first_lr = {}
    for row in rows:
        first_lr.setdefault(row["stage"], float(row["lr"]))
    return {"metrics": metrics, "epochs": [s["epochs"] for s in metrics["stages"]],
            "skipped": [bool(s.get("skipped")) for s in metrics["stages"]], "first_lr": first_lr}


@pytest.mark.parametrize(("total", "epochs", "protocol", "label"), [
    (5, [2, 2, 1], "fine_tuned", "MLCL+FT"),
    (3, [2, 1, 0], "linear_evaluation", "MLCL"),
])
def test_phases_switch_by_early_stopping_within_the_total_epoch_limit(
        tiny_config: Callable[..., TrainConfig], total: int, epochs: list[int], protocol: str, label: str) -> None:
    # min_delta huge: no epoch after a stage's first counts as an improvement, so patience 1 switches after 2.
    config = tiny_config(setup="mlcl", finetune=True, max_steps=-1, max_epochs=10, limit_train_batches=1,
                         patience=1, min_delta=1e9, max_total_epochs=total, lr=1e-3, linear_eval_lr=3e-4,
                         finetune_lr=2e-4, lr_schedule="plateau", restore_best=False)
    run = _stage_epochs(config)
    assert run["epochs"] == epochs
    assert run["skipped"] == [False, False, epochs[2] == 0]
    assert run["metrics"]["protocol"] == protocol and run["metrics"]["setup_label"] == label
    # Every stage starts from its own lr (the release resets it to 3e-4 at each phase change).
    expected_lr = {"pretrain": 1e-3, "linear": 3e-4, "finetune": 2e-4}
    assert run["first_lr"] == {k: v for k, v in expected_lr.items() if k in run["first_lr"]}
    assert ("finetune" in run["first_lr"]) == (epochs[2] > 0)


def test_plateau_schedule_lowers_the_lr_after_patience_flat_epochs(tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="ce", lr_schedule="plateau", lr_plateau_factor=0.5, lr_plateau_patience=1, lr=0.01)
    module = RpmModule(config, config.rule_spec.width)
    module.set_stage(stage_plan(config)[0])
    setup = module.configure_optimizers()
    optimizer, scheduler = setup["optimizer"], setup["lr_scheduler"]["scheduler"]
    assert setup["lr_scheduler"]["monitor"] == "val/loss" and isinstance(optimizer, torch.optim.Adam)
    lrs = []
    for loss in (1.0, 1.0, 1.0, 0.5, 0.5, 0.5):  # best, flat (1 bad epoch: within patience), flat -> drop, ...
        scheduler.step(loss)
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs == [0.01, 0.01, 0.005, 0.005, 0.005, 0.0025]
    constant = tiny_config(setup="ce")
    module = RpmModule(constant, constant.rule_spec.width)
    module.set_stage(stage_plan(constant)[0])
    assert isinstance(module.configure_optimizers(), torch.optim.Adam)


class _LinearStageWatch(L.Callback):
    """Encoder state when linear evaluation starts / ends and the BatchNorm modes seen during its steps."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, torch.Tensor]] = {}
        self.bn_modes: list[bool] = []

    def _copy(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if pl_module.plan.name == "linear":
            self.states["start"] = self._copy(pl_module.encoder)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        if pl_module.plan.name == "linear":
            self.bn_modes.extend(m.training for m in pl_module.encoder.modules()
                                 if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if pl_module.plan.name == "linear":
            self.states["end"] = self._copy(pl_module.encoder)


def test_release_head_training_keeps_weights_but_moves_batchnorm_statistics(
        tiny_config: Callable[..., TrainConfig]) -> None:
    watch = _LinearStageWatch()
    train(tiny_config(setup="mlcl_aug", linear_eval_encoder_mode="train", head_views="pretrain", augment="release",
                      rule_pooling="concat"), callbacks=[watch])
    start, end = watch.states["start"], watch.states["end"]
    moved = {k for k in start if not torch.equal(start[k], end[k])}
    assert moved and all(k.endswith(("running_mean", "running_var", "num_batches_tracked")) for k in moved), moved
    assert watch.bn_modes and all(watch.bn_modes)


def test_concat_rule_head_in_the_model(tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="mlcl", rule_pooling="concat", image_size=32)
    width = config.rule_spec.width
    module = RpmModule(config, width).eval()
    assert module.rule_head.summary.in_features == 8 * width and module.rule_head.summary.out_features == width
    out = module(torch.randint(0, 256, (3, 16, 32, 32), dtype=torch.uint8))
    assert out["rule_logits"].shape == (3, width) and out["embeddings"].shape[:2] == (3, 8)


def _load_bench() -> Any:
    spec = importlib.util.spec_from_file_location(
        "bench_mlcl_collapse", REPO / "experiments" / "release-comparison" / "bench_mlcl_collapse.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_collapse_bench_cycles_its_loader_past_one_epoch(tiny_config: Callable[..., TrainConfig]) -> None:
    bench = _load_bench()
    config = tiny_config(setup="mlcl", batch_size=8)
    datamodule = RpmDataModule(config, stage_plan(config)[0])
    datamodule.setup()
    loader = datamodule.train_dataloader()
    per_epoch = len(loader)  # 42 training problems at batch 8, ragged end dropped: 5
    batches = bench.endless_batches(loader)
    indices = [next(batches)["index"] for _ in range(2 * per_epoch + 1)]
    first, second = torch.cat(indices[:per_epoch]), torch.cat(indices[per_epoch:2 * per_epoch])
    assert len(first) == len(second) == per_epoch * 8 and not torch.equal(first, second)  # epoch 2: a new order
    # The bench itself, for more steps than one epoch has batches (it raised StopIteration before).
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = bench.main(["--data", config.data_root, "--image-size", "32", "--setup", "mlcl", "--batch-size", "8",
                           "--steps", str(per_epoch + 1), "--every", str(per_epoch + 1), "--threads", "1"])
    assert code == 0
    rows = [line for line in output.getvalue().splitlines() if line.startswith(f"| {per_epoch + 1} |")]
    assert len(rows) == 1

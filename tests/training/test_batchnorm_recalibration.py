"""BatchNorm statistics re-estimated for evaluation (``rpm_lib.training.batchnorm``, ``bn_recalibration_batches``):
the average is the one PyTorch's cumulative average defines, nothing else changes, and in a contrastive run the
linear evaluation and the pre-training validation read statistics of the current weights on plain problems."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rpm_lib.training.batchnorm import batchnorm_layers, recalibrate_batchnorm
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.datamodule import RpmDataModule
from rpm_lib.training.module import RpmModule
from rpm_lib.training.run import train
from rpm_lib.training.plans import stage_plan


def _small_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Dropout(0.5), nn.Conv2d(3, 2, 1),
                         nn.BatchNorm2d(2))


def _batch_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and unbiased variance of (N, C, H, W)."""
    flat = x.transpose(0, 1).flatten(1)
    return flat.mean(dim=1), flat.var(dim=1, unbiased=True)


def test_recalibration_is_the_plain_average_of_the_batch_statistics() -> None:
    net = _small_net().train()
    for bn in batchnorm_layers(net):  # stale statistics, as training leaves them
        bn.running_mean.fill_(5.0)
        bn.running_var.fill_(9.0)
    params = {k: v.clone() for k, v in net.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(4, 1, 6, 6, generator=generator) * (i + 1) + i for i in range(3)]

    used = recalibrate_batchnorm(net, batches, net)

    assert used == 3
    conv1, bn1, _, _, conv2, bn2 = net
    first = [_batch_stats(conv1(x).detach()) for x in batches]
    # the second layer sees the first one normalising with each batch's own statistics; dropout is off
    second = []
    for x in batches:
        h = conv1(x).detach()
        h = F.batch_norm(h, None, None, bn1.weight, bn1.bias, training=True, eps=bn1.eps)
        second.append(_batch_stats(conv2(F.relu(h)).detach()))
    for bn, stats in ((bn1, first), (bn2, second)):
        assert torch.allclose(bn.running_mean, torch.stack([m for m, _ in stats]).mean(0), atol=1e-5)
        assert torch.allclose(bn.running_var, torch.stack([v for _, v in stats]).mean(0), atol=1e-5)
        assert bn.momentum == 0.1 and int(bn.num_batches_tracked) == 3
    assert all(m.training for m in net.modules())  # the modes it had before
    assert all(torch.equal(v, params[k]) for k, v in net.named_parameters())
    assert all(p.grad is None for p in net.parameters())


def test_recalibration_of_an_eval_model_leaves_it_in_eval_mode_and_ignores_the_old_statistics() -> None:
    a, b = _small_net().eval(), _small_net().eval()
    for bn in batchnorm_layers(b):
        bn.running_mean.fill_(-3.0)
        bn.running_var.fill_(0.01)
    batches = [torch.randn(4, 1, 6, 6) for _ in range(2)]
    recalibrate_batchnorm(a, batches, a)
    recalibrate_batchnorm(b, batches, b)
    assert not any(m.training for m in a.modules())
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_no_batches_is_refused_and_the_statistics_stay() -> None:
    net = _small_net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(ValueError, match="no batches"):
        recalibrate_batchnorm(net, [], net)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_a_model_without_batchnorm_reads_no_batch() -> None:
    def never() -> Iterator[torch.Tensor]:
        raise AssertionError("read a batch")
        yield torch.zeros(1)

    assert recalibrate_batchnorm(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)), never(), lambda x: None) == 0


def test_contrastive_stages_plan_their_recalibration() -> None:
    assert [p.bn_recalibration for p in stage_plan(TrainConfig(setup="mlcl"))] == ["before_validation", "at_start"]
    assert [p.bn_recalibration for p in stage_plan(TrainConfig(setup="mlcl", bn_recalibration_batches=0))] == [
        "none", "none"]
    # a frozen encoder in train mode normalises with batch statistics: nothing to re-estimate
    assert stage_plan(TrainConfig(setup="mlcl_aug", linear_eval_encoder_mode="train"))[1].bn_recalibration == "none"
    # the supervised rows of Table 1 are as they were
    assert [p.bn_recalibration for p in stage_plan(TrainConfig(setup="ce_aux_sparse"))] == ["none"]


def _encoder_bn_state(module: RpmModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.encoder.state_dict().items()
            if k.endswith(("running_mean", "running_var"))}


class _LinearStage(L.Callback):
    """The encoder's BatchNorm statistics when the linear stage starts training and when it ends."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, torch.Tensor]] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if pl_module.plan.name == "linear":
            self.states["start"] = _encoder_bn_state(pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if pl_module.plan.name == "linear":
            self.states["end"] = _encoder_bn_state(pl_module)


def _recalibrated_from(config: TrainConfig, checkpoint: str, stage: int) -> dict[str, torch.Tensor]:
    """An independent re-estimate: a fresh module with ``checkpoint``'s weights, recalibrated on the datamodule's
    fixed batches."""
    plan = stage_plan(config)[stage]
    module = RpmModule(config, config.rule_spec.width)
    module.set_stage(plan)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    module.load_state_dict(state)
    datamodule = RpmDataModule(config, plan)
    assert module.recalibrate_encoder_batchnorm(datamodule.bn_recalibration_loader()) == 2
    return _encoder_bn_state(module)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)


def test_linear_evaluation_and_pretraining_validation_read_recalibrated_statistics(
        tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="mlcl_aug", bn_recalibration_batches=2)
    watch = _LinearStage()
    train(config, callbacks=[watch])
    run = config.run_dir
    stored = {k: v for k, v in torch.load(f"{run}/checkpoints/pretrain/best.ckpt", map_location="cpu",
                                          weights_only=True)["state_dict"].items()
              if k.startswith("encoder.") and k.endswith(("running_mean", "running_var"))}
    stored = {k.removeprefix("encoder."): v for k, v in stored.items()}
    # The checkpoint written after the pre-training validation holds the statistics that validation used: those
    # of its own weights on the fixed plain training problems.
    assert _same(stored, _recalibrated_from(config, f"{run}/checkpoints/pretrain/best.ckpt", 0))
    # Linear evaluation starts from them and never moves them (frozen encoder in eval mode).
    assert _same(watch.states["start"], stored) and _same(watch.states["end"], stored)


def test_without_recalibration_linear_evaluation_keeps_the_training_averages(
        tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="mlcl_aug", bn_recalibration_batches=0)
    watch = _LinearStage()
    train(config, callbacks=[watch])
    recalibrated = _recalibrated_from(config.with_overrides({"bn_recalibration_batches": 2}),
                                      f"{config.run_dir}/checkpoints/pretrain/best.ckpt", 0)
    assert _same(watch.states["start"], watch.states["end"])
    assert not _same(watch.states["start"], recalibrated)  # averages of augmented two-view batches differ


class _SpoilAfterPretraining(L.Callback):
    """Overwrites the encoder's running statistics when pre-training ends (as stale averages would be)."""

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if pl_module.plan.name == "pretrain":
            for layer in pl_module.encoder.modules():
                if isinstance(layer, nn.modules.batchnorm._BatchNorm):
                    layer.running_mean.fill_(7.0)
                    layer.running_var.fill_(0.5)


def test_linear_evaluation_re_estimates_the_statistics_it_was_handed(
        tiny_config: Callable[..., TrainConfig]) -> None:
    # restore_best=false: the linear stage continues from the in-memory encoder, spoiled after pre-training
    config = tiny_config(setup="mlcl", bn_recalibration_batches=2, restore_best=False)
    watch = _LinearStage()
    train(config, callbacks=[_SpoilAfterPretraining(), watch])
    expected = _recalibrated_from(config, f"{config.run_dir}/checkpoints/pretrain/last.ckpt", 1)
    assert _same(watch.states["start"], expected) and _same(watch.states["end"], expected)


def test_fitting_without_the_datamodule_says_how_to_turn_the_re_estimate_off(
        tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="mlcl")
    plan = stage_plan(config)[1]  # linear evaluation: re-estimates when fit starts
    module = RpmModule(config, config.rule_spec.width)
    module.set_stage(plan)
    datamodule = RpmDataModule(config, plan)
    datamodule.setup()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(RuntimeError, match="bn_recalibration_batches=0"):
        trainer.fit(module, train_dataloaders=datamodule.train_dataloader())

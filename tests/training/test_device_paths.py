"""The accelerator code paths, on the device ``tools/gpu_check.sh`` runs them on.

Marked ``gpu``: the device check runs ``pytest -m gpu`` on the GPU machine. The device is ``RPM_TEST_DEVICE``
(``cuda`` / ``cpu``), by default CUDA when present and the CPU otherwise, so every path also runs in
``make test`` (there bf16 autocast runs on the CPU: same code, different kernels).

Tolerances: fp32 encoder outputs and gradients on the device equal the CPU's within 1e-3 relative to the
largest magnitude (TF32 off; cuDNN picks other convolution algorithms, so bit equality is not expected);
the MLCL loss under bf16 autocast equals the fp32 loss within 1e-5 (the loss disables autocast inside);
channels_last equals contiguous within 1e-4 relative.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import lightning as L
import torch

from rpm_lib.encoders import create_encoder, list_encoders
from rpm_lib.losses import mlcl_loss
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.run import train
from rpm_lib.training.trainer import resolve_precision
from rpm_lib.training.setups import SETUPS

pytestmark = pytest.mark.gpu


def _device() -> torch.device:
    name = os.environ.get("RPM_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


DEVICE = _device()
ACCELERATOR = "gpu" if DEVICE.type == "cuda" else "cpu"


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-12))


@pytest.fixture(autouse=True)
def no_tf32():
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


@pytest.mark.parametrize("name", list_encoders())
def test_encoder_forward_and_backward_on_the_device_equal_the_cpu(name: str) -> None:
    torch.manual_seed(0)
    cpu = create_encoder(name, image_size=32).eval()  # eval: BatchNorm uses its running statistics on both
    device = create_encoder(name, image_size=32).eval()
    device.load_state_dict(cpu.state_dict())
    device.to(DEVICE)
    x = torch.rand(2, 16, 32, 32, generator=torch.Generator().manual_seed(1))
    out_cpu = cpu(x)
    out_device = device(x.to(DEVICE))
    error = _relative_error(out_device.cpu(), out_cpu)
    assert error < 1e-3, f"embeddings: relative error {error:.2e}"
    out_cpu.square().mean().backward()
    out_device.square().mean().backward()
    # Gradients are compared against the scale of the whole gradient, not each parameter's own largest value: a
    # parameter whose gradient is zero in exact arithmetic (SCL: a bias right before per-panel standardisation,
    # which removes any constant) holds only rounding noise, which differs between devices (seen on an H200,
    # relative error 1.0 at |grad| 6e-7, and on an H100, 1.14 at 2.6e-6, each relative to that parameter's own
    # tiny gradient). A gradient that is wrong by more than a thousandth of the whole scale anywhere still fails.
    largest = max(float(p.grad.abs().max()) for p in cpu.parameters() if p.grad is not None)
    for (pname, p_cpu), p_device in zip(cpu.named_parameters(), device.parameters()):
        if p_cpu.grad is None:
            assert p_device.grad is None, f"{pname}: a gradient on the device only"
            continue
        error = float((p_device.grad.cpu().double() - p_cpu.grad.double()).abs().max()) / largest
        assert error < 1e-3, (f"{pname}: gradient error {error:.2e} of the largest |grad| {largest:.2e} "
                              f"(its own largest |grad| {p_cpu.grad.abs().max():.2e})")


@pytest.mark.parametrize("name", list_encoders())
def test_channels_last_equals_contiguous(name: str) -> None:
    torch.manual_seed(0)
    encoder = create_encoder(name, image_size=32).eval().to(DEVICE)
    x = torch.rand(2, 16, 32, 32, device=DEVICE)
    reference = encoder(x)
    encoder = encoder.to(memory_format=torch.channels_last)
    assert _relative_error(encoder(x.contiguous(memory_format=torch.channels_last)), reference) < 1e-4


def test_mlcl_loss_under_autocast_equals_fp32() -> None:
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(16, 128, generator=generator).to(DEVICE)
    z_neg = torch.randn(16, 7, 128, generator=generator).to(DEVICE)
    rules = (torch.rand(16, 38, generator=generator) < 0.15).float().to(DEVICE)
    reference = mlcl_loss(z, z_neg, rules)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        mixed = mlcl_loss(z, z_neg, rules)
    assert mixed.dtype == torch.float32
    assert abs(float(mixed) - float(reference)) < 1e-5


def test_precision_auto_picks_bf16_on_cuda_and_fp32_on_cpu() -> None:
    config = TrainConfig(accelerator="auto", precision="auto")
    expected = "bf16-mixed" if DEVICE.type == "cuda" and torch.cuda.is_bf16_supported() else "32-true"
    if DEVICE.type == "cpu" and torch.cuda.is_available():
        pytest.skip("RPM_TEST_DEVICE=cpu on a CUDA machine: 'auto' resolves to the GPU")
    assert resolve_precision(config) == expected


@pytest.mark.parametrize("setup", list(SETUPS))
def test_one_bf16_mixed_step_of_each_setup_is_finite(tiny_config: Callable[..., TrainConfig], setup: str) -> None:
    # Few problems: bf16 convolutions are slow on a CPU, and linear evaluation embeds every training problem once;
    # two batches re-estimate BatchNorm under bf16 as fifty would (20 s a contrastive setup on a CPU).
    config = tiny_config(setup=setup, accelerator=ACCELERATOR, devices=1, precision="bf16-mixed", max_steps=1,
                         max_train_samples=4, bn_recalibration_batches=2)
    metrics = train(config)
    assert all(math.isfinite(stage["best_val_loss"]) for stage in metrics["stages"])
    assert math.isfinite(metrics["test_loss"])
    predictions = np.load(Path(config.run_dir) / "predictions.npz")
    assert np.isfinite(predictions["scores"]).all()


@pytest.fixture
def isolated_process_group():
    """Leave no process group and no MASTER_PORT behind: a later DDP test would find the port taken."""
    saved = dict(os.environ)
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def test_one_process_ddp_run(tiny_config: Callable[..., TrainConfig], isolated_process_group: None) -> None:
    # NCCL on CUDA, gloo on the CPU: Lightning picks the backend from the accelerator.
    config = tiny_config(setup="mlcl", accelerator=ACCELERATOR, devices=1, strategy="ddp", max_steps=1)
    metrics = train(config)
    assert [s["name"] for s in metrics["stages"]] == ["pretrain", "linear"]
    assert math.isfinite(metrics["test_loss"])


@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_training_step_never_waits_for_the_gpu(tiny_config: Callable[..., TrainConfig], setup: str) -> None:
    """On CUDA, the second step runs under sync-debug mode "error"; on the CPU the same steps run (no host-device
    synchronisation exists there), so the test's own code cannot rot between GPU runs."""
    from rpm_lib.training.module import RpmModule
    from rpm_lib.training.plans import stage_plan

    config = tiny_config(setup=setup)
    module = RpmModule(config, config.rule_spec.width).to(DEVICE)
    module.set_stage(stage_plan(config)[0])
    views = SETUPS[setup].num_views
    side = config.image_size
    shape = (4, views, 16, side, side) if views > 1 else (4, 16, side, side)
    batch = {"panels": torch.randint(0, 256, shape, dtype=torch.uint8, device=DEVICE),
             "target": torch.tensor([0, 3, 7, 1], device=DEVICE),
             "rules": (torch.rand(4, config.rule_spec.width, device=DEVICE) < 0.2).float()}
    # One step first: the first call of each kernel may initialise libraries (cuDNN, cuBLAS) synchronously,
    # which costs once per process, not per step.
    to_backward, _value, _parts = module.stage_losses(batch)
    to_backward.backward()
    if DEVICE.type != "cuda":
        to_backward, _value, _parts = module.stage_losses(batch)
        to_backward.backward()
        assert torch.isfinite(to_backward)
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        to_backward, _value, _parts = module.stage_losses(batch)
        to_backward.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(to_backward)


def test_channels_last_training_and_its_auto_default(tiny_config: Callable[..., TrainConfig]) -> None:
    from rpm_lib.training.module import RpmModule, resolve_memory_format

    config = tiny_config(setup="ce", memory_format="channels_last", accelerator=ACCELERATOR, devices=1, max_steps=1)
    module = RpmModule(config, config.rule_spec.width)
    weights = [p for p in module.encoder.parameters() if p.ndim == 4]
    assert weights and all(p.is_contiguous(memory_format=torch.channels_last) for p in weights)
    assert math.isfinite(train(config)["test_loss"])
    assert resolve_memory_format(TrainConfig(accelerator="auto")) == "channels_last"
    assert resolve_memory_format(TrainConfig(accelerator="cpu")) == "channels_last"
    assert resolve_memory_format(TrainConfig(accelerator="cpu", memory_format="contiguous")) == "contiguous"
    contiguous = RpmModule(tiny_config(setup="ce", memory_format="contiguous"), config.rule_spec.width)
    assert all(p.is_contiguous() for p in contiguous.encoder.parameters())


class _SeenMatmulPrecision(L.Callback):
    def __init__(self) -> None:
        self.seen: set[str] = set()

    def on_train_batch_start(self, *args: object) -> None:
        self.seen.add(torch.get_float32_matmul_precision())


def test_matmul_precision_holds_inside_a_run_and_the_process_gets_its_own_back(
        tiny_config: Callable[..., TrainConfig]) -> None:
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # a notebook's own choice, before the run
        high = _SeenMatmulPrecision()
        train(tiny_config(setup="ce", accelerator=ACCELERATOR, devices=1, matmul_precision="high"), callbacks=[high])
        assert high.seen == {"high"} and torch.get_float32_matmul_precision() == "medium"
        kept = _SeenMatmulPrecision()
        train(tiny_config(setup="ce", accelerator=ACCELERATOR, devices=1, overwrite=True), callbacks=[kept])
        assert kept.seen == {"medium"}  # auto: the process's setting
    finally:
        torch.set_float32_matmul_precision(previous)

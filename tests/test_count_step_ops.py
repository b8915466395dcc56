"""`bench/count_step_ops.py`: the operations of one training step, counted on the CPU (the evidence that autocast's
casts are a quarter of an SCL step's kernels; docs/reproduction-gpu.md)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from torch import nn

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "count_step_ops.py"


def _bench():
    spec = importlib.util.spec_from_file_location("count_step_ops", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_autocast_adds_a_cast_per_weight_and_bias_that_fp32_does_not_have() -> None:
    bench = _bench()
    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.module import RpmModule

    config = TrainConfig(setup="ce", encoder="scl", image_size=32)
    layers = [m for m in RpmModule(config, config.rule_spec.width).modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    mixed = bench.count_step("ce", image_size=32, precision="bf16")
    full = bench.count_step("ce", image_size=32, precision="fp32")
    extra = mixed["forward"][bench.CAST_OP] - full["forward"][bench.CAST_OP]
    # every conv / linear layer's weight and bias is cast to bfloat16 in the forward, and its inputs where they
    # arrive in float32 (after a LayerNorm, say)
    assert extra >= sum(1 + (m.bias is not None) for m in layers), (extra, len(layers))
    assert bench.kernel_ops(full["forward"]) + extra == bench.kernel_ops(mixed["forward"])
    assert full["forward"]["view"] > 0 and bench.kernel_ops(full["forward"]) < sum(full["forward"].values())
    assert sum(full["optimizer"].values()) > 0 and mixed["backward"][bench.CAST_OP] > 0

"""When the losses check tensor *values* (targets in range, rules multi-hot).

Shape and dtype checks are free and always run. A value check reads a result back to the host, which on an
accelerator waits for every queued kernel: five such checks per training step would serialise the GPU with
the Python loop. So value checks run on CPU tensors always, and on an accelerator only when the environment
variable ``RPM_LIB_CHECK_VALUES=1`` asks for them (debugging). Training data reach the losses through
validated datasets, so the checks guard hand-written calls, which are usually on the CPU.
"""
from __future__ import annotations

import os

import torch


def check_values(tensor: torch.Tensor) -> bool:
    """Whether to run value checks on ``tensor`` (see the module docstring)."""
    return tensor.device.type == "cpu" or os.environ.get("RPM_LIB_CHECK_VALUES") == "1"

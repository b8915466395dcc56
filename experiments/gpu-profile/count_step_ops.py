"""Count the operations one training step dispatches: forward, backward and optimiser, by kind.

The H100 profile (docs/reproduction-gpu.md) found an SCL step bound by the host issuing ~300 kernels, not by the
GPU's arithmetic. Which operations are they? This counts what PyTorch's dispatcher runs for one step of the real
``RpmModule`` (the training setup's losses and heads, bf16 autocast, channels_last), on the CPU: no GPU is needed,
and the count does not depend on the batch size. The optimiser's operations are listed but not added to the
forward + backward total: here Adam runs per parameter, while on CUDA rpm_lib uses the fused Adam. Operations that only change a tensor's metadata (views,
transposes, detach) launch no kernel on a GPU and are counted apart. The casts are those of the CPU's autocast;
CUDA's also casts convolutions and linear layers, but its lists differ for some other operations, so a GPU profile
remains the measurement of launches.

    python experiments/gpu-profile/count_step_ops.py                       # SCL, CE+AUX-sparse and MLCL+AUG, 80 px
    python experiments/gpu-profile/count_step_ops.py --setups ce --encoder wren --image-size 80
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from typing import Any

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

#: Dispatcher operations that only make a new view or alias of a tensor: no kernel on a GPU.
METADATA_OPS = frozenset({
    "view", "t", "detach", "_unsafe_view", "as_strided", "expand", "unsqueeze", "squeeze", "transpose", "permute",
    "slice", "select", "alias", "split", "split_with_sizes", "unbind", "_reshape_alias", "lift_fresh", "empty",
    "empty_like", "new_empty", "empty_strided",
})
#: The operation autocast inserts to change a tensor's dtype.
CAST_OP = "_to_copy"


class OpCounter(TorchDispatchMode):
    """Counts every dispatched ATen operation by name while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def kernel_ops(ops: collections.Counter[str]) -> int:
    """Operations of ``ops`` that run a kernel (everything but :data:`METADATA_OPS`)."""
    return sum(count for name, count in ops.items() if name not in METADATA_OPS)


def count_step(setup: str, encoder: str = "scl", image_size: int = 80, batch_size: int = 4,
               precision: str = "bf16") -> dict[str, collections.Counter[str]]:
    """The operations of one training step of ``setup``'s first stage, counted after one warm-up step.

    Args:
        setup, encoder, image_size: as ``TrainConfig``.
        batch_size: RPMs per step (the counts do not depend on it).
        precision: ``bf16`` (autocast, as ``precision=auto`` on a GPU) or ``fp32``.

    Returns:
        ``{"forward": ..., "backward": ..., "optimizer": ...}``: operation name -> count.
    """
    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.module import RpmModule
    from rpm_lib.training.plans import stage_plan

    torch.manual_seed(0)
    config = TrainConfig(setup=setup, encoder=encoder, image_size=image_size, batch_size=batch_size)
    module = RpmModule(config, config.rule_spec.width)
    module.set_stage(stage_plan(config)[0])
    module = module.to(memory_format=torch.channels_last)
    optimizer = module.make_optimizer()
    views = (2,) if setup == "mlcl_aug" else ()
    batch = {"panels": torch.randint(0, 256, (batch_size, *views, 16, image_size, image_size), dtype=torch.uint8),
             "target": torch.randint(0, 8, (batch_size,)),
             "rules": torch.randint(0, 2, (batch_size, config.rule_spec.width)).float()}
    counted: dict[str, collections.Counter[str]] = {}
    for _ in range(2):  # the first step allocates the optimiser's state
        with OpCounter() as forward, torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = module.stage_losses(batch)[0]
        with OpCounter() as backward:
            loss.backward()
        with OpCounter() as step:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        counted = {"forward": forward.ops, "backward": backward.ops, "optimizer": step.ops}
    return counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", default="ce_aux_sparse,mlcl_aug", help="comma-separated training setups")
    parser.add_argument("--encoder", default="scl")
    parser.add_argument("--image-size", type=int, default=80)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--top", type=int, default=8, help="most frequent kernel operations listed per part")
    args = parser.parse_args(argv)
    print(f"{args.encoder}, {args.image_size} px, {args.precision}, torch {torch.__version__}; one training step")
    print("| setup | part | kernel ops | of them casts | metadata ops | most frequent kernel ops |")
    print("|---|---|---:|---:|---:|---|")
    for setup in args.setups.split(","):
        parts = count_step(setup, args.encoder, args.image_size, precision=args.precision)
        for part, ops in parts.items():
            kernels = {name: n for name, n in ops.items() if name not in METADATA_OPS}
            top = ", ".join(f"{name} {n}" for name, n in collections.Counter(kernels).most_common(args.top))
            print(f"| {setup} | {part} | {kernel_ops(ops)} | {ops[CAST_OP]} | {sum(ops.values()) - kernel_ops(ops)} "
                  f"| {top} |")
        # The optimiser is left out of the total: on the CPU Adam runs per parameter, on CUDA rpm_lib uses the fused
        # Adam (fused_adam=true), a few kernels for all parameters.
        total = kernel_ops(parts["forward"]) + kernel_ops(parts["backward"])
        casts = parts["forward"][CAST_OP] + parts["backward"][CAST_OP]
        print(f"| {setup} | **forward + backward** | **{total}** | **{casts}** ({100 * casts / total:.0f} %) | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

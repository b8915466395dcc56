"""The MLCL gather path under DDP: 2 gloo processes give the single-process loss on the concatenated batch."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rpm_lib.losses import mlcl_loss
from rpm_lib.training.distributed import gather_with_local_grad, gathered_mlcl_loss

WORLD_SIZE = 2
#: Anchors per rank; deliberately unequal to exercise the padded gather.
LOCAL_SIZES = (3, 2)


def _global_inputs(negatives_dim: int = 7, dim: int = 5, num_rules: int = 6) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(11)
    total = sum(LOCAL_SIZES)
    z = torch.randn(total, dim, generator=generator, dtype=torch.float64)
    z_neg = torch.randn(total, negatives_dim, dim, generator=generator, dtype=torch.float64)
    rules = (torch.rand(total, num_rules, generator=generator) < 0.3).double()
    return z, z_neg, rules


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, port: int, out_dir: str, negatives: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        z, z_neg, rules = _global_inputs()
        start = sum(LOCAL_SIZES[:rank])
        stop = start + LOCAL_SIZES[rank]
        local_z = z[start:stop].clone().requires_grad_(True)
        local_neg = z_neg[start:stop].clone().requires_grad_(True)
        value, to_backward = gathered_mlcl_loss(local_z, local_neg, rules[start:stop], negatives=negatives)
        to_backward.backward()
        gathered = gather_with_local_grad(torch.arange(start, stop, dtype=torch.float64))
        torch.save({"value": value.detach(), "to_backward": to_backward.detach(), "grad_z": local_z.grad,
                    "grad_neg": local_neg.grad, "gathered": gathered}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("negatives", ["batch", "own"])
def test_gathered_loss_matches_single_process(tmp_path: Path, negatives: str) -> None:
    mp.spawn(_worker, args=(_free_port(), str(tmp_path), negatives), nprocs=WORLD_SIZE, join=True)
    z, z_neg, rules = _global_inputs()
    z.requires_grad_(True)
    z_neg.requires_grad_(True)
    reference = mlcl_loss(z, z_neg, rules, negatives=negatives)
    reference.backward()
    for rank in range(WORLD_SIZE):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        start = sum(LOCAL_SIZES[:rank])
        stop = start + LOCAL_SIZES[rank]
        # Every rank sees the global batch in rank order.
        assert torch.equal(result["gathered"], torch.arange(sum(LOCAL_SIZES), dtype=torch.float64))
        torch.testing.assert_close(result["value"], reference.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(result["to_backward"], WORLD_SIZE * reference.detach(), rtol=1e-12, atol=1e-12)
        # Gradient of the scaled loss w.r.t. the local slice, averaged by DDP over 2 ranks, is the full gradient.
        torch.testing.assert_close(result["grad_z"] / WORLD_SIZE, z.grad[start:stop], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(result["grad_neg"] / WORLD_SIZE, z_neg.grad[start:stop], rtol=1e-10, atol=1e-12)


def test_single_process_is_plain_mlcl() -> None:
    z, z_neg, rules = _global_inputs()
    value, to_backward = gathered_mlcl_loss(z, z_neg, rules)
    assert value is to_backward
    torch.testing.assert_close(value, mlcl_loss(z, z_neg, rules))

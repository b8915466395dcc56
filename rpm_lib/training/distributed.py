"""Cross-process gathering for the MLCL loss under DDP.

MLCL contrasts every anchor with every other RPM in the batch, so with D processes each one must see
the *global* batch: projections, their wrong-completion negatives and the rule vectors of all ranks.
:func:`gather_with_local_grad` concatenates a tensor over ranks (rank order) keeping the autograd
graph only for this rank's own slice. Every rank then computes the same global loss L, but its
gradient flows only through its local inputs; DDP averages gradients over ranks, so the total is
(1 / D) sum_r dL/dtheta|_r = (1 / D) dL/dtheta. :func:`gathered_mlcl_loss` therefore returns the loss
value L (for logging) and the loss to back-propagate, D * L, whose DDP-averaged gradient is exactly
dL/dtheta, the single-process gradient on the concatenated batch.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from rpm_lib.losses import mlcl_loss


def distributed_world() -> tuple[int, int]:
    """(rank, world_size) of the default process group, (0, 1) when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def release_process_group() -> None:
    """Destroy this process's default process group, if one is initialised (a no-op otherwise).

    Lightning destroys the group at exit only for NCCL. A gloo group left to the interpreter's finalisation can
    abort the process after training has ended and its files are written ("terminate called without an active
    exception", exit status -6): its worker threads are torn down after the interpreter that their work refers to.
    :mod:`rpm_lib.training.run` registers this with :mod:`atexit`, so it runs in every rank while the interpreter is
    still whole.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def gather_with_local_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` (N_r, ...) from every rank along dim 0, in rank order.

    Ranks may hold different N_r (the last batch of an epoch); the other dims must match. The slice
    of this rank is ``tensor`` itself (graph kept); the others are detached copies.
    Without an initialised process group this returns ``tensor`` unchanged.
    """
    rank, world_size = distributed_world()
    if world_size == 1:
        return tensor
    local_size = torch.tensor([tensor.shape[0]], device=tensor.device, dtype=torch.long)
    sizes = [torch.zeros_like(local_size) for _ in range(world_size)]
    dist.all_gather(sizes, local_size)
    counts = [int(s.item()) for s in sizes]
    largest = max(counts)
    padded = tensor.detach()
    if tensor.shape[0] < largest:
        pad = tensor.new_zeros((largest - tensor.shape[0], *tensor.shape[1:]))
        padded = torch.cat([padded, pad])
    buffers = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(buffers, padded.contiguous())
    parts = [buffer[:count] for buffer, count in zip(buffers, counts)]
    parts[rank] = tensor
    return torch.cat(parts)


def gathered_mlcl_loss(z: torch.Tensor, z_neg: torch.Tensor, rules: torch.Tensor, temperature: float = 0.07,
                       negatives: str = "batch", numerics: str = "paper") -> tuple[torch.Tensor, torch.Tensor]:
    """MLCL over the global batch of all ranks.

    Args:
        z: (M_r, d) this rank's anchor projections.
        z_neg: (M_r, 7, d) their wrong-completion projections.
        rules: (M_r, R) multi-hot rule vectors.
        temperature, negatives, numerics: as :func:`rpm_lib.losses.mlcl_loss`.

    Returns:
        ``(value, to_backward)``: the global loss L (identical on every rank, equal to ``mlcl_loss`` on
        the concatenated batch) and ``world_size * L`` for back-propagation under DDP gradient averaging.
        Single process: both are L.
    """
    _rank, world_size = distributed_world()
    if world_size == 1:
        loss = mlcl_loss(z, z_neg, rules, temperature=temperature, negatives=negatives, numerics=numerics)
        return loss, loss
    all_z = gather_with_local_grad(z)
    all_neg = gather_with_local_grad(z_neg)
    all_rules = gather_with_local_grad(rules)
    loss = mlcl_loss(all_z, all_neg, all_rules, temperature=temperature, negatives=negatives, numerics=numerics)
    return loss, loss * world_size

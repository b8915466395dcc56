"""Auxiliary rule loss: binary cross-entropy between rule logits and the multi-hot rule vector."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rpm_lib.losses.value_checks import check_values


def rule_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean BCE-with-logits over all B x R rule slots (the paper's L^aux).

    Args:
        logits: (B, R) float, e.g. from :class:`rpm_lib.heads.RuleHead`.
        targets: (B, R) multi-hot, any numeric dtype: dense (``rules_dense``, R = 9 / 12) or
            sparse (``rules_sparse``, R = 38 / 40 / 50) encoding.

    Returns:
        Scalar tensor.

    Raises:
        ValueError: shapes differ or are not (B, R), or targets outside [0, 1].
    """
    if logits.ndim != 2 or logits.shape != targets.shape:
        raise ValueError(
            f"rule_loss: logits and targets must both be (B, R), got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    targets = targets.to(logits.dtype)
    if targets.numel() and check_values(targets) and bool(((targets < 0) | (targets > 1)).any()):
        raise ValueError("rule_loss: targets must lie in [0, 1] (a multi-hot rule vector)")
    return F.binary_cross_entropy_with_logits(logits, targets)


class RuleLoss(nn.Module):
    """Module wrapper of :func:`rule_loss`: ``forward(logits (B, R), targets (B, R)) -> scalar``."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return rule_loss(logits, targets)

"""CoPINet's "contrast loss" (Zhang et al. 2019): BCE of every answer score against the one-hot target.

Each of the 8 scores is treated as an independent binary classifier (correct vs wrong), instead of
one softmax over the 8 as in :func:`rpm_lib.losses.answer_cross_entropy`.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rpm_lib.losses.cross_entropy import check_scores_and_target


def copinet_contrast_loss(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean BCE-with-logits over the B x 8 scores against one-hot(target).

    Args:
        scores: (B, 8) float logits.
        target: (B,) int64, index of the correct answer.

    Returns:
        Scalar tensor.
    """
    check_scores_and_target("copinet_contrast_loss", scores, target)
    one_hot = F.one_hot(target, scores.shape[1]).to(scores.dtype)
    return F.binary_cross_entropy_with_logits(scores, one_hot)


class CopinetContrastLoss(nn.Module):
    """Module wrapper of :func:`copinet_contrast_loss`: ``forward(scores (B, 8), target (B,))``."""

    def forward(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return copinet_contrast_loss(scores, target)

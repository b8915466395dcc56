"""Answer-selection cross-entropy: softmax over the 8 completion scores of each RPM."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rpm_lib.losses.value_checks import check_values


def check_scores_and_target(name: str, scores: torch.Tensor, target: torch.Tensor) -> None:
    """Raise ValueError unless scores is float (B, A) and target is int64 (B,) with values in [0, A)."""
    if scores.ndim != 2 or not scores.is_floating_point():
        raise ValueError(f"{name}: scores must be float (B, A), got {scores.dtype} {tuple(scores.shape)}")
    if target.shape != scores.shape[:1] or target.dtype != torch.int64:
        raise ValueError(
            f"{name}: target must be int64 of shape ({scores.shape[0]},), got {target.dtype} {tuple(target.shape)}"
        )
    if target.numel() and check_values(target) and (int(target.min()) < 0 or int(target.max()) >= scores.shape[1]):
        raise ValueError(f"{name}: target values must be in [0, {scores.shape[1] - 1}]")


def answer_cross_entropy(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the answer scores (the paper's CE / linear-evaluation loss).

    Args:
        scores: (B, 8) float logits, e.g. from :class:`rpm_lib.heads.ScoringHead`.
        target: (B,) int64, index of the correct answer.

    Returns:
        Scalar tensor, the mean over the batch.
    """
    check_scores_and_target("answer_cross_entropy", scores, target)
    return F.cross_entropy(scores, target)


class AnswerCrossEntropy(nn.Module):
    """Module wrapper of :func:`answer_cross_entropy`: ``forward(scores (B, 8), target (B,))``."""

    def forward(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return answer_cross_entropy(scores, target)

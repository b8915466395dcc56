"""Heads on top of per-completion embeddings (B, 8, D) from an :mod:`rpm_lib.encoders` encoder.

=========================== =================================== ===================================================
head                        shapes                              used for
=========================== =================================== ===================================================
:class:`ScoringHead`        (B, 8, D) -> (B, 8) logits          answer selection (softmax over the 8 is in the loss)
:class:`RuleHead`           (B, 8, D) -> (B, R) logits          auxiliary rule prediction (BCE with logits)
:class:`ProjectionHead`     (..., D) -> (..., 128)              MLCL; L2 normalisation happens inside the loss
=========================== =================================== ===================================================
"""
from __future__ import annotations

import torch
from torch import nn

from rpm_lib.encoders.base import NUM_CANDIDATES
from rpm_lib.method_choices import RULE_POOLINGS


def _check_last_dim(name: str, x: torch.Tensor, dim: int, min_ndim: int = 1) -> None:
    if x.ndim < min_ndim or x.shape[-1] != dim:
        raise ValueError(f"{name}: expected input (..., {dim}) with at least {min_ndim} dims, got {tuple(x.shape)}")


class ScoringHead(nn.Module):
    """Linear(D, 1) applied to every completion: (B, 8, D) -> (B, 8) answer logits.

    The paper's linear scoring head s_psi; trained with :func:`rpm_lib.losses.answer_cross_entropy`.
    """

    def __init__(self, embedding_dim: int) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        self.linear = nn.Linear(embedding_dim, 1)

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        _check_last_dim("ScoringHead", embeddings, self.embedding_dim, min_ndim=2)
        return self.linear(embeddings).squeeze(-1)


class RuleHead(nn.Module):
    """Rule prediction (the paper's rule discovery network rho): (B, 8, D) -> (B, R) logits.

    Every completion goes through Linear(D, H) -> ReLU -> Dropout -> Linear(H, R) (H = D by default),
    giving (B, 8, R); the 8 outputs are then pooled:

    * ``pooling="mean"`` (default): the mean over completions. Invariant to the answer order,
      which matters because answers are shuffled at every access.
    * ``pooling="concat"``: the MLCL release's summary layer, Linear(8 R, R) on the flattened
      outputs. It depends on the answer order; kept for comparison with the release.

    Args:
        embedding_dim: D.
        num_rules: R (9 / 38 / 40 for RAVEN, 12 / 50 for PGM).
        hidden_dim: H; ``None`` means D.
        dropout: dropout probability after the hidden layer (0.5 in the release).
        pooling: ``"mean"`` or ``"concat"``.
        num_completions: completions per RPM (8); only the ``concat`` layer depends on it.
    """

    def __init__(self, embedding_dim: int, num_rules: int, hidden_dim: int | None = None, dropout: float = 0.5,
                 pooling: str = "mean", num_completions: int = NUM_CANDIDATES) -> None:
        super().__init__()
        if pooling not in RULE_POOLINGS:
            raise ValueError(f"RuleHead: pooling must be one of {RULE_POOLINGS}, got {pooling!r}")
        hidden_dim = embedding_dim if hidden_dim is None else hidden_dim
        self.embedding_dim = embedding_dim
        self.num_rules = num_rules
        self.num_completions = num_completions
        self.pooling = pooling
        self.per_completion = nn.Sequential(
            nn.Linear(embedding_dim, hidden_dim), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(hidden_dim, num_rules),
        )
        self.summary = nn.Linear(num_completions * num_rules, num_rules) if pooling == "concat" else None

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        _check_last_dim("RuleHead", embeddings, self.embedding_dim, min_ndim=3)
        if embeddings.ndim != 3 or (self.summary is not None and embeddings.shape[1] != self.num_completions):
            raise ValueError(
                f"RuleHead: expected embeddings (B, {self.num_completions}, {self.embedding_dim}), "
                f"got {tuple(embeddings.shape)}"
            )
        logits = self.per_completion(embeddings)  # (B, 8, R)
        if self.summary is None:
            return logits.mean(dim=1)
        return self.summary(logits.flatten(1))


class ProjectionHead(nn.Module):
    """MLCL / SupCon projection g_phi: Linear(D, H) -> ReLU -> Linear(H, P), on the last axis.

    (..., D) -> (..., P), H = D and P = 128 by default. Not normalised: :func:`rpm_lib.losses.mlcl_loss`
    L2-normalises its inputs.
    """

    def __init__(self, embedding_dim: int, projection_dim: int = 128, hidden_dim: int | None = None) -> None:
        super().__init__()
        hidden_dim = embedding_dim if hidden_dim is None else hidden_dim
        self.embedding_dim = embedding_dim
        self.projection_dim = projection_dim
        self.mlp = nn.Sequential(
            nn.Linear(embedding_dim, hidden_dim), nn.ReLU(inplace=True), nn.Linear(hidden_dim, projection_dim)
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        _check_last_dim("ProjectionHead", embeddings, self.embedding_dim)
        return self.mlp(embeddings)

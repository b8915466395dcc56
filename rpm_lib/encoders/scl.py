"""SCL, the Scattering Compositional Learner (Wu et al. 2020), in the variant of the MLCL code.

Differences from the original SCL (dhh1995/SCL) that the MLCL release made and that this module
keeps: only the first conv has stride 2 (40x40 maps at 80 px), a Linear per channel over the
flattened map, feed-forward residual blocks with LayerNorm after the ReLU, one relation MLP
instead of 5 softmax-mixed experts, and no scorer: the 400-d relation output *is* the embedding.
529,293 parameters at 80 px.

One difference of rpm_lib's own (``panel_norm``, default ``"completion"``): in every completion (8
context panels + 1 candidate) the 9 panel vectors are standardised, feature by feature, over those 9
panels before the relation network. See :func:`standardize_panels` for why; ``panel_norm="none"`` is the
MLCL release's network.
"""
from __future__ import annotations

import torch
from torch import nn

from rpm_lib.encoders.backbones import ConvBnRelu, conv_output_size
from rpm_lib.encoders.base import NUM_CANDIDATES, NUM_CONTEXT, Encoder, register_encoder


class FeedForwardResidual(nn.Module):
    """x + Linear(LayerNorm(ReLU(Linear(x)))), width ``dim`` on the last axis."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(inplace=True), nn.LayerNorm(dim), nn.Linear(dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def scatter_groups(x: torch.Tensor, num_groups: int) -> torch.Tensor:
    """SCL's "scattering": regroup the last axis across the second-to-last one.

    (..., C, G*K) -> (..., G, C*K): group ``g`` collects slice ``[g*K:(g+1)*K]`` of every one of the C
    rows, so a network shared over groups sees the same feature slice of every object.
    """
    *lead, rows, width = x.shape
    if width % num_groups:
        raise ValueError(f"scatter_groups: last axis {width} is not divisible by {num_groups} groups")
    x = x.reshape(*lead, rows, num_groups, width // num_groups).transpose(-3, -2)
    return x.flatten(-2)


#: Values of ``SCLEncoder(panel_norm=...)``.
PANEL_NORMS: tuple[str, ...] = ("completion", "none")


def standardize_panels(completions: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Standardise each feature over the panels of one completion.

    (B, 8, 9, F) -> (B, 8, 9, F): ``(v - mean) / (std + eps)``, mean and (unbiased) std over the 9 panels
    (axis 2), separately for every RPM, completion and feature.

    Why: at initialisation SCL's panel vectors are dominated by what all panels share (mostly white
    background), so the 8 completions' embeddings differ by only ~6 % of their spread and the 8 answer
    scores are nearly equal. Cross-entropy then first removes that small candidate-dependent part (the
    score spread falls from 2e-2 to 6e-4 within 60 steps and the gradients shrink 100x): training sits at
    loss ln 8 for hundreds of steps (``experiments/release-comparison/bench_plateau.py``). Standardising makes the
    relation network see how panels *differ*, at unit scale. Statistics come from the completion itself, so a
    completion's embedding still depends on the context and its own candidate alone.
    """
    mean = completions.mean(dim=2, keepdim=True)
    std = completions.std(dim=2, keepdim=True)
    return (completions - mean) / (std + eps)


@register_encoder("scl")
class SCLEncoder(Encoder):
    """SCL encoder (MLCL variant); D = 400, candidates independent.

    Pipeline per RPM (shapes at 80 px):
        1. panel CNN: (16, 1, 80, 80) -> (16, 32, 40, 40)
        2. per channel Linear(1600 -> 80) + ReLU, residual block: (16, 32, 80)
        3. scatter into 10 groups (16, 10, 256), shared MLP 256 -> 128 -> 8, residual block: (16, 80)
        4. completion k = 8 context vectors + choice k: (8, 9, 80), each feature standardised over the 9
           panels (``panel_norm="completion"``, :func:`standardize_panels`)
        5. scatter into 80 groups (8, 80, 9), shared MLP 9 -> 64 -> 32 -> 5: (8, 400)
        6. residual block of width 400 -> embeddings (8, 400)

    Args:
        image_size: panel side S; the per-channel Linear has (ceil(S/2))^2 inputs.
        panel_norm: ``"completion"`` (default): step 4's completions are standardised over their 9 panels
            (:func:`standardize_panels`); ``"none"``: as in the MLCL release.
    """

    couples_candidates = False

    def __init__(self, image_size: int = 80, panel_norm: str = "completion") -> None:
        super().__init__(image_size)
        if panel_norm not in PANEL_NORMS:
            raise ValueError(f"SCLEncoder: panel_norm must be one of {PANEL_NORMS}, got {panel_norm!r}")
        self.panel_norm = panel_norm
        self.panel_cnn = nn.Sequential(
            ConvBnRelu(1, 16, 3, stride=2, padding=1),
            ConvBnRelu(16, 16, 3, padding=1),
            ConvBnRelu(16, 32, 3, padding=1),
            ConvBnRelu(32, 32, 3, padding=1),
        )
        map_size = conv_output_size(image_size, 3, 2, 1)
        self.object_dim = 80
        self.num_attribute_groups = 10
        self.attribute_dim = 8
        self.relation_dim = 5
        self.channel_projection = nn.Sequential(nn.Linear(map_size * map_size, self.object_dim), nn.ReLU(inplace=True))
        self.object_residual = FeedForwardResidual(self.object_dim)
        group_width = 32 * self.object_dim // self.num_attribute_groups
        self.attribute_network = nn.Sequential(
            nn.Linear(group_width, 128), nn.ReLU(inplace=True), nn.Linear(128, self.attribute_dim)
        )
        panel_dim = self.num_attribute_groups * self.attribute_dim
        self.attribute_residual = FeedForwardResidual(panel_dim)
        self.relation_network = nn.Sequential(
            nn.Linear(NUM_CONTEXT + 1, 64), nn.ReLU(inplace=True),
            nn.Linear(64, 32), nn.ReLU(inplace=True),
            nn.Linear(32, self.relation_dim),
        )
        self.embedding_dim = panel_dim * self.relation_dim
        self.relation_residual = FeedForwardResidual(self.embedding_dim)

    def embed(self, panels: torch.Tensor) -> torch.Tensor:
        batch, num_panels, height, width = panels.shape
        maps = self.panel_cnn(panels.reshape(batch * num_panels, 1, height, width))
        objects = maps.flatten(2).reshape(batch, num_panels, maps.shape[1], -1)  # (B, 16, 32, 1600)
        objects = self.object_residual(self.channel_projection(objects))  # (B, 16, 32, 80)
        attributes = self.attribute_network(scatter_groups(objects, self.num_attribute_groups))  # (B, 16, 10, 8)
        panel_vectors = self.attribute_residual(attributes.flatten(2))  # (B, 16, 80)

        context = panel_vectors[:, :NUM_CONTEXT].unsqueeze(1).expand(-1, NUM_CANDIDATES, -1, -1)
        choices = panel_vectors[:, NUM_CONTEXT:].unsqueeze(2)
        completions = torch.cat([context, choices], dim=2)  # (B, 8, 9, 80)
        if self.panel_norm == "completion":
            completions = standardize_panels(completions)
        relations = self.relation_network(scatter_groups(completions, completions.shape[-1]))  # (B, 8, 80, 5)
        return self.relation_residual(relations.flatten(2))  # (B, 8, 400)

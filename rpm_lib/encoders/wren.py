"""WReN, the Wild Relation Network (Santoro et al. 2018), as a cheap embedding baseline.

Follows the widely used PyTorch port (Fen9/WReN) up to the last hidden layer of its f-MLP: the
scorer / meta-target layer Linear(256 -> 13) is dropped and the 256-d hidden vector is the
per-completion embedding. 1,212,832 parameters at 80 px (1,216,173 with the dropped layer).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rpm_lib.encoders.backbones import FourLayerCNN
from rpm_lib.encoders.base import NUM_CANDIDATES, NUM_CONTEXT, Encoder, register_encoder


def _mlp(widths: list[int]) -> nn.Sequential:
    """Linear + ReLU after every layer, widths[0] -> widths[1] -> ... -> widths[-1]."""
    layers: list[nn.Module] = []
    for dim_in, dim_out in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(dim_in, dim_out), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


@register_encoder("wren")
class WReNEncoder(Encoder):
    """WReN encoder; D = 256, candidates independent.

    Shapes (B RPMs, 80 px):
        1. 4-layer CNN per panel: (B, 16, 512); append a one-hot position tag (9: context
           positions 0..7, and 8 for every choice); Linear(521 -> 256) -> objects (B, 16, 256)
        2. completion k has 80 ordered object pairs: the 64 context-context pairs (8 self-pairs
           included, as in the port) and (choice k, context j), (context j, choice k) for all j
        3. g: MLP 512 -> 512 -> 512 -> 512 -> 256 on every pair, summed over the 80 pairs
        4. f: MLP 256 -> 256 -> 256 -> embeddings (B, 8, 256)
    The 64 context pairs do not depend on k, so they go through g once per RPM.

    Args:
        image_size: panel side S.
        object_dim: width of the tagged object vectors (256).
    """

    couples_candidates = False

    def __init__(self, image_size: int = 80, object_dim: int = 256) -> None:
        super().__init__(image_size)
        self.panel_cnn = FourLayerCNN(in_channels=1, image_size=image_size)
        self.num_tags = NUM_CONTEXT + 1
        self.object_projection = nn.Linear(self.panel_cnn.out_features + self.num_tags, object_dim)
        self.relation_mlp = _mlp([2 * object_dim, 512, 512, 512, 256])
        self.embedding_dim = 256
        self.output_mlp = _mlp([256, 256, self.embedding_dim])
        tags = torch.cat([torch.arange(NUM_CONTEXT), torch.full((NUM_CANDIDATES,), NUM_CONTEXT)])
        self.register_buffer("position_tags", F.one_hot(tags, self.num_tags).float(), persistent=False)

    def embed(self, panels: torch.Tensor) -> torch.Tensor:
        batch, num_panels, height, width = panels.shape
        features = self.panel_cnn(panels.reshape(batch * num_panels, 1, height, width)).reshape(batch, num_panels, -1)
        tags = self.position_tags.to(features.dtype).expand(batch, -1, -1)
        objects = self.object_projection(torch.cat([features, tags], dim=2))  # (B, 16, 256)
        context, choices = objects[:, :NUM_CONTEXT], objects[:, NUM_CONTEXT:]

        dim = objects.shape[-1]
        context_pairs = torch.cat([
            context.unsqueeze(2).expand(-1, -1, NUM_CONTEXT, -1),
            context.unsqueeze(1).expand(-1, NUM_CONTEXT, -1, -1),
        ], dim=3)  # (B, 8, 8, 512): (context i, context j)
        context_relations = self.relation_mlp(context_pairs).sum(dim=(1, 2))  # (B, 256)

        choice_grid = choices.unsqueeze(2).expand(-1, -1, NUM_CONTEXT, -1)  # (B, 8 choices, 8 context, 256)
        context_grid = context.unsqueeze(1).expand(-1, NUM_CANDIDATES, -1, -1)
        choice_pairs = torch.stack([
            torch.cat([choice_grid, context_grid], dim=3),
            torch.cat([context_grid, choice_grid], dim=3),
        ], dim=2)  # (B, 8, 2, 8, 512)
        choice_relations = self.relation_mlp(choice_pairs.reshape(batch, NUM_CANDIDATES, -1, 2 * dim)).sum(2)
        return self.output_mlp(choice_relations + context_relations.unsqueeze(1))  # (B, 8, 256)

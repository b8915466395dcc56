"""HriNet / SRAN, the Stratified Rule-Aware Network (Hu et al. 2021), as used in the MLCL paper.

Three hierarchies look at a row of the matrix at increasing scope:
    cell        each panel alone (1-channel images), fused per row (3 x 512 -> 512)
    individual  the row as a 3-channel image, fused with the row's cell vector (2 rows -> 512)
    ecological  two rows as a 6-channel image, fused with the individual vector of the pair (-> 512)
A row pair's "rule" vector comes out of the ecological fusion. The dominant rule is that of rows
(1, 2); completion k's rule is the mean of pairs (1, 3_k) and (2, 3_k), where row 3_k is panels
(6, 7, choice k). The embedding is an MLP of [dominant, completion-k rule] (1024 -> 1024).

Backbones (one per hierarchy, with 1, 3 and 6 input channels):
    ``"cnn4"`` (default, the paper's): 4 x [3x3 conv, 32 channels, stride 2, BN, ReLU], no padding,
        32 x 4 x 4 = 512 features at 80 px; 13,221,824 parameters in total.
    ``"resnet18"`` (the MLCL release's): ResNet-18 without classifier, 512 features;
        46,667,520 parameters in total.

Unlike the MLCL release, which loops over the 8 candidates, all rows and row pairs of a batch go
through each network in one call; in train mode BatchNorm therefore normalises over all of them
together (the release normalised each candidate's call separately).
"""
from __future__ import annotations

import torch
from torch import nn

from rpm_lib.encoders.backbones import build_backbone
from rpm_lib.encoders.base import NUM_CANDIDATES, NUM_CONTEXT, Encoder, register_encoder


class LinearBnReluStack(nn.Sequential):
    """``depth`` x [Linear, BatchNorm1d, ReLU]; widths in_dim -> ... -> in_dim -> out_dim.

    Input (N, in_dim) -> (N, out_dim). As in the MLCL release, the width changes in the last layer.
    """

    def __init__(self, depth: int, in_dim: int, out_dim: int) -> None:
        layers: list[nn.Module] = []
        for index in range(depth):
            width = out_dim if index == depth - 1 else in_dim
            layers += [nn.Linear(in_dim, width), nn.BatchNorm1d(width), nn.ReLU(inplace=True)]
        super().__init__(*layers)


@register_encoder("hrinet")
class HriNetEncoder(Encoder):
    """HriNet (SRAN) encoder, rows only; D = 1024, candidates independent (in eval mode).

    Args:
        image_size: panel side S.
        backbone: ``"cnn4"`` (paper) or ``"resnet18"`` (MLCL release).
        feature_dim: width of every fused vector (512, the backbones' output size at 80 px).
    """

    couples_candidates = False

    def __init__(self, image_size: int = 80, backbone: str = "cnn4", feature_dim: int = 512) -> None:
        super().__init__(image_size)
        self.backbone = backbone
        self.cell_cnn = build_backbone(backbone, 1, image_size)
        self.row_cnn = build_backbone(backbone, 3, image_size)
        self.row_pair_cnn = build_backbone(backbone, 6, image_size)
        cnn_dim = self.cell_cnn.out_features
        self.cell_fusion = LinearBnReluStack(2, 3 * cnn_dim, feature_dim)
        self.row_fusion = LinearBnReluStack(2, 2 * (feature_dim + cnn_dim), feature_dim)
        self.row_pair_fusion = LinearBnReluStack(3, feature_dim + cnn_dim, feature_dim)
        self.embedding_dim = 2 * feature_dim
        self.embedding_mlp = LinearBnReluStack(2, 2 * feature_dim, self.embedding_dim)

        # Rows: 0 = panels (0, 1, 2), 1 = (3, 4, 5), 2 + k = (6, 7, choice k).
        rows = [[0, 1, 2], [3, 4, 5]] + [[6, 7, NUM_CONTEXT + k] for k in range(NUM_CANDIDATES)]
        self.register_buffer("row_index", torch.tensor(rows), persistent=False)
        # Row pairs: (1, 2), then (1, 3_k) for every k, then (2, 3_k) for every k: 17 pairs.
        third = list(range(2, 2 + NUM_CANDIDATES))
        pairs = [[0] + [0] * NUM_CANDIDATES + [1] * NUM_CANDIDATES, [1] + third + third]
        self.register_buffer("pair_index", torch.tensor(pairs), persistent=False)

    def embed(self, panels: torch.Tensor) -> torch.Tensor:
        batch, num_panels, height, width = panels.shape
        rows = panels[:, self.row_index]  # (B, 10, 3, S, S)
        num_rows = rows.shape[1]

        cells = self.cell_cnn(panels.reshape(batch * num_panels, 1, height, width)).reshape(batch, num_panels, -1)
        row_cells = self.cell_fusion(cells[:, self.row_index].flatten(2).flatten(0, 1))  # (B*10, F)
        row_images = self.row_cnn(rows.flatten(0, 1))  # (B*10, cnn)
        row_vectors = torch.cat([row_cells, row_images], dim=1).reshape(batch, num_rows, -1)

        first, second = self.pair_index
        num_pairs = first.shape[0]
        pair_individual = self.row_fusion(
            torch.cat([row_vectors[:, first], row_vectors[:, second]], dim=2).flatten(0, 1)
        )  # (B*17, F)
        pair_images = torch.cat([rows[:, first], rows[:, second]], dim=2).flatten(0, 1)  # (B*17, 6, S, S)
        rules = self.row_pair_fusion(torch.cat([pair_individual, self.row_pair_cnn(pair_images)], dim=1))
        rules = rules.reshape(batch, num_pairs, -1)  # (B, 17, F)

        dominant = rules[:, :1].expand(-1, NUM_CANDIDATES, -1)
        completion = 0.5 * (rules[:, 1:1 + NUM_CANDIDATES] + rules[:, 1 + NUM_CANDIDATES:])
        joint = torch.cat([dominant, completion], dim=2).flatten(0, 1)  # (B*8, 2F)
        return self.embedding_mlp(joint).reshape(batch, NUM_CANDIDATES, self.embedding_dim)

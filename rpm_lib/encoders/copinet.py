"""CoPINet, the Contrastive Perceptual Inference network (Zhang et al. 2019), as an embedding model.

As in the MLCL code, the scorer Linear(256 -> 1) is dropped and the 256-d output of the MLP's
first layer (+ ReLU) is the per-completion embedding; 1,685,692 parameters at 80 px.

CoPINet **couples the candidates**: at two scales every candidate's feature map has a learned
function of the *sum over all 8 candidates* subtracted from it, so embedding ``k`` depends on the
whole answer set. It is permutation-equivariant in the candidates, but the same completed matrix
gets a different embedding under a different set of wrong answers.

Deviations from the reference code, none of which changes the parameter count: BatchNorm uses the
default eps (the reference passes 64 as ``eps`` by mistake in ``BatchNorm2d(64, 64)``), the Gumbel
sampling option is dropped (off by default there), and feature maps are broadcast at whatever
size the input produces instead of a hard-coded 20x20 / 10x10.
"""
from __future__ import annotations

import torch
from torch import nn

from rpm_lib.encoders.base import NUM_CANDIDATES, NUM_CONTEXT, Encoder, register_encoder


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


class _DownsampleBlock(nn.Module):
    """Residual block that doubles the channels and halves the resolution (1x1-conv shortcut)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride=2)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 1, stride=2, bias=False), nn.BatchNorm2d(out_channels)
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.shortcut(x) + self.bn2(self.conv2(out)))


class _PanelStem(nn.Sequential):
    """7x7/2 conv (1 -> 64) + BN + ReLU + 3x3/2 max-pool: (N, 1, 80, 80) -> (N, 64, 20, 20)."""

    def __init__(self, channels: int) -> None:
        super().__init__(
            nn.Conv2d(1, channels, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )


class _LineConv(nn.Sequential):
    """3x3 conv + BN + ReLU applied to the summed panel maps of one row or column."""

    def __init__(self, channels: int) -> None:
        super().__init__(_conv3x3(channels, channels), nn.BatchNorm2d(channels), nn.ReLU(inplace=True))


def _two_layer_mlp(dim_in: int, dim_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim_in, dim_in), nn.ReLU(inplace=True), nn.Linear(dim_in, dim_out))


@register_encoder("copinet")
class CoPINetEncoder(Encoder):
    """CoPINet encoder; D = 256, candidates coupled.

    Shapes at 80 px (B RPMs):
        inference branch (context only): stem -> rows 1-2 and columns 1-2 -> pooled (B, 64) ->
            softmax over 6 rules for each of 10 attributes -> contrast biases (B, 64) at two scales
        perception branch: stem on all 16 panels (B, 16, 64, 20, 20); per candidate k the three
            row maps plus the three column maps (row 3 / column 3 contain choice k): (B, 8, 64, 20, 20)
        contrast 1: subtract conv([sum over candidates, bias]) -> residual block -> (B, 8, 128, 10, 10)
        contrast 2: subtract conv([sum over candidates, bias]) -> residual block -> (B, 8, 256, 5, 5)
        average pool + Linear(256, 256) + ReLU -> embeddings (B, 8, 256)

    Args:
        image_size: panel side S (80 in the paper; any S divisible by 16 works).
        num_attributes: attributes in the inference branch's rule prediction (10).
        num_rules: rules per attribute in the inference branch (6).
    """

    couples_candidates = True

    def __init__(self, image_size: int = 80, num_attributes: int = 10, num_rules: int = 6) -> None:
        super().__init__(image_size)
        width = 64
        self.num_attributes = num_attributes
        self.num_rules = num_rules
        self.embedding_dim = 256

        self.stem = _PanelStem(width)
        self.row_conv = _LineConv(width)
        self.column_conv = _LineConv(width)

        self.inference_stem = _PanelStem(width)
        self.inference_row_conv = _LineConv(width)
        self.inference_column_conv = _LineConv(width)
        self.predict_rules = nn.Linear(width, num_attributes * num_rules)
        self.rule_basis = nn.Linear(num_rules, width, bias=False)
        self.contrast1_bias = _two_layer_mlp(width, width)
        self.contrast2_bias = _two_layer_mlp(width, width)

        self.contrast1 = nn.Sequential(_conv3x3(width + width, width), nn.BatchNorm2d(width))
        self.block1 = _DownsampleBlock(width, 2 * width)
        self.contrast2 = nn.Sequential(_conv3x3(2 * width + width, 2 * width), nn.BatchNorm2d(2 * width))
        self.block2 = _DownsampleBlock(2 * width, 4 * width)
        self.head = nn.Sequential(nn.Linear(4 * width, self.embedding_dim), nn.ReLU(inplace=True))

        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def _context_bias(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference branch: context (B, 8, S, S) -> two contrast biases, each (B, 64)."""
        batch = context.shape[0]
        maps = self.inference_stem(context.reshape(batch * NUM_CONTEXT, 1, *context.shape[-2:]))
        maps = maps.reshape(batch, NUM_CONTEXT, *maps.shape[1:])
        rows = torch.cat([maps[:, 0:3].sum(1), maps[:, 3:6].sum(1)])
        columns = torch.cat([maps[:, 0:8:3].sum(1), maps[:, 1:8:3].sum(1)])
        rows = self.inference_row_conv(rows)
        columns = self.inference_column_conv(columns)
        summary = rows[:batch] + rows[batch:] + columns[:batch] + columns[batch:]
        summary = summary.mean(dim=(-2, -1))  # (B, 64)
        rule_probs = self.predict_rules(summary).reshape(batch * self.num_attributes, self.num_rules).softmax(-1)
        basis = self.rule_basis(rule_probs).reshape(batch, self.num_attributes, -1).sum(1)  # (B, 64)
        return self.contrast1_bias(basis), self.contrast2_bias(basis)

    def _line_features(self, maps: torch.Tensor, first: list[int], second: list[int], third: list[int],
                       line_conv: nn.Module) -> torch.Tensor:
        """Sum the conv'd maps of three parallel lines (rows or columns) per candidate.

        ``first``/``second`` index the two complete context lines, ``third`` the two context panels
        of the line that the candidate completes. maps: (B, 16, C, h, w) -> (B, 8, C, h, w).
        """
        batch = maps.shape[0]
        choices = maps[:, NUM_CONTEXT:]  # (B, 8, C, h, w)
        line3 = maps[:, third].sum(1, keepdim=True) + choices
        stacked = torch.cat([maps[:, first].sum(1), maps[:, second].sum(1), line3.flatten(0, 1)])
        features = line_conv(stacked)
        line1, line2 = features[:batch], features[batch:2 * batch]
        line3 = features[2 * batch:].reshape(batch, NUM_CANDIDATES, *features.shape[1:])
        return line3 + (line1 + line2).unsqueeze(1)

    @staticmethod
    def _contrast(features: torch.Tensor, bias: torch.Tensor, contrast: nn.Module) -> torch.Tensor:
        """Subtract contrast([sum over candidates, bias]) from every candidate; (B, 8, C, h, w)."""
        bias_map = bias[:, :, None, None].expand(-1, -1, *features.shape[-2:])
        shared = contrast(torch.cat([features.sum(1), bias_map], dim=1))
        return features - shared.unsqueeze(1)

    def embed(self, panels: torch.Tensor) -> torch.Tensor:
        batch = panels.shape[0]
        bias1, bias2 = self._context_bias(panels[:, :NUM_CONTEXT])

        maps = self.stem(panels.reshape(batch * 16, 1, *panels.shape[-2:]))
        maps = maps.reshape(batch, 16, *maps.shape[1:])
        features = (self._line_features(maps, [0, 1, 2], [3, 4, 5], [6, 7], self.row_conv)
                    + self._line_features(maps, [0, 3, 6], [1, 4, 7], [2, 5], self.column_conv))

        features = self._contrast(features, bias1, self.contrast1)
        features = self.block1(features.flatten(0, 1))
        features = features.reshape(batch, NUM_CANDIDATES, *features.shape[1:])
        features = self._contrast(features, bias2, self.contrast2)
        features = self.block2(features.flatten(0, 1))
        pooled = features.mean(dim=(-2, -1))  # (B*8, 256)
        return self.head(pooled).reshape(batch, NUM_CANDIDATES, self.embedding_dim)

"""Image backbones shared by the encoders: the WReN 4-layer CNN and ResNet-18.

Both map images (N, C, S, S) to feature vectors (N, F). torchvision is not a dependency, so
ResNet-18 is written out here (He et al. 2016, "basic" blocks, layers [2, 2, 2, 2]).
"""
from __future__ import annotations

import torch
from torch import nn


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Side length after a square convolution / pooling (floor rounding, as PyTorch)."""
    return (size + 2 * padding - kernel) // stride + 1


class ConvBnRelu(nn.Sequential):
    """Conv2d (with bias, as in the reference models) -> BatchNorm2d -> ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 padding: int = 0) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )


class FourLayerCNN(nn.Module):
    """WReN's panel CNN (Santoro et al. 2018): 4 x [3x3 conv, stride 2, no padding, BN, ReLU].

    At 80 px the maps shrink 80 -> 39 -> 19 -> 9 -> 4, so ``out_features`` = 32 * 4 * 4 = 512.

    Shapes: (N, in_channels, S, S) -> (N, out_features), flattened channel-major.
    """

    def __init__(self, in_channels: int = 1, channels: int = 32, image_size: int = 80, num_layers: int = 4) -> None:
        super().__init__()
        layers = []
        size = image_size
        for index in range(num_layers):
            layers.append(ConvBnRelu(in_channels if index == 0 else channels, channels, 3, stride=2))
            size = conv_output_size(size, 3, 2, 0)
        if size < 1:
            raise ValueError(f"FourLayerCNN: image_size {image_size} is too small for {num_layers} stride-2 convs")
        self.layers = nn.Sequential(*layers)
        self.out_features = channels * size * size

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images).flatten(1)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with BN, identity (or 1x1-conv projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 without the classifier, with ``in_channels`` input planes.

    Same layout as torchvision's ``resnet18`` with ``conv1`` replaced and ``fc = Identity``
    (11,170,240 parameters for 1 input channel): 7x7/2 conv, 3x3/2 max-pool, 4 stages of 2
    basic blocks (64, 128, 256, 512 channels), global average pool.

    Shapes: (N, in_channels, S, S) -> (N, 512) for any S >= 32.
    """

    out_features: int = 512

    def __init__(self, in_channels: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages = []
        in_width = 64
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(in_width, width, stride), BasicBlock(width, width)))
            in_width = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.pool(self.stages(self.stem(images))).flatten(1)


def build_backbone(name: str, in_channels: int, image_size: int) -> nn.Module:
    """``"cnn4"`` (:class:`FourLayerCNN`) or ``"resnet18"`` (:class:`ResNet18`); both expose ``out_features``."""
    if name == "cnn4":
        return FourLayerCNN(in_channels=in_channels, image_size=image_size)
    if name == "resnet18":
        return ResNet18(in_channels=in_channels)
    raise ValueError(f"unknown backbone {name!r}; expected 'cnn4' or 'resnet18'")

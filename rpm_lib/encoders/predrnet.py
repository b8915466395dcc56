"""PredRNet, the Predictive Reasoning Network (Yang et al., ICML 2023; official code ZjjConan/AVR-PredRNet).

Three parts, as in the official ``predrnet_raven``:

1. **Image encoder**: four residual stages (three 3x3 conv+BN+ReLU, the first with stride 2; an average-pool + 1x1
   conv shortcut) with ``num_filters`` x (1, 2, 3, 4) channels, then a 1x1 conv+BN down to 32 channels. At 80 px a
   panel becomes 32 maps of 5 x 5.
2. **Predictive reasoning blocks** (``num_extra_stages`` of them). Completion ``k`` is the 8 context panels followed
   by choice ``k``, as a (32, 9, 25) tensor. A conv spanning the 8 context positions *predicts* the missing panel;
   the block replaces the last position by the *prediction error* ``relu(choice) - prediction`` and mixes the
   9 positions with two 3x3 convs (a residual block of width 4 x 32 inside).
3. **Classifier**: the (32 x 9 x 25) relation tensor is average-pooled to 1024 values, then Linear(1024, H, no bias)
   -> BatchNorm1d -> ReLU -> Dropout -> Linear(H, 1), H = 1024 // ``classifier_hidden_reduce``.

The per-completion interface cuts the classifier before its last layer: **the embedding is the classifier's hidden
vector** (after ReLU and dropout, D = H = 256 by default), and rpm_lib's :class:`~rpm_lib.heads.ScoringHead`,
Linear(D, 1), is the official last layer. So encoder + scoring head have exactly the official parameter count and
compute the official scores, and MLCL's projection head and the auxiliary rule head read the vector the official
score is a linear function of. ``column_pass=True`` is the official ``enable_rc`` (used there for PGM): completions
are also read column by column (the context transposed) and the embedding is the *sum* of the row and column hidden
vectors; the official sums the two scores, which equals Linear(D, 1) of the sum up to one more bias, a constant that
softmax over the 8 answers ignores.

Panels in [0, 1] are mapped to the official input range [-1, 1] (``2 x - 1``) inside :meth:`embed`.

Defaults are the official training command's (3 extra stages, block and classifier dropout 0.1, H = 256):
1,277,632 parameters at 80 px, + 257 in the scoring head = the official model's 1,277,889. Embedding ``k`` depends
only on the context and choice ``k`` (BatchNorm in eval mode).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rpm_lib.encoders.base import NUM_CANDIDATES, NUM_CONTEXT, Encoder, register_encoder

#: Channels of the panel maps the reasoning blocks work on (fixed in the official code).
REASONING_CHANNELS: int = 32
#: Length the relation tensor of one completion is average-pooled to before the classifier (fixed in the official code).
RELATION_FEATURES: int = 1024
#: The context panels in column-major order: the 3x3 context transposed (the missing cell stays last).
COLUMN_ORDER: tuple[int, ...] = (0, 3, 6, 1, 4, 7, 2, 5)


def conv_bn(in_channels: int, out_channels: int, kernel_size: int | tuple[int, int], padding: int = 0,
            stride: int = 1, activate: bool = True) -> nn.Sequential:
    """Conv2d (no bias) -> BatchNorm2d (-> ReLU): the official ``ConvNormAct``."""
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, stride=stride, bias=False),
        nn.BatchNorm2d(out_channels),
    ]
    if activate:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class ResidualStage(nn.Module):
    """One image-encoder stage: (N, C_in, S, S) -> (N, C_out, S/stride, S/stride).

    Three conv+BN+ReLU (the first strided) plus a shortcut AvgPool(stride) -> 1x1 conv+BN.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = conv_bn(in_channels, out_channels, 3, 1, stride=stride)
        self.conv2 = conv_bn(out_channels, out_channels, 3, 1)
        self.conv3 = conv_bn(out_channels, out_channels, 3, 1)
        self.downsample = nn.Sequential(
            nn.AvgPool2d(kernel_size=2, stride=stride) if stride != 1 else nn.Identity(),
            conv_bn(in_channels, out_channels, 1, 0, activate=False),
        )
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.conv3(self.conv2(self.conv1(x)))) + self.downsample(x)


class PredictiveReasoningBlock(nn.Module):
    """(N, C, 9, L) -> (N, C, 9, L): positions 0..7 are the context panels, 8 the candidate; L = map size.

    A conv with kernel (8, 1) over the context positions predicts the candidate's features; the candidate's
    position is replaced by the prediction error ``relu(candidate) - prediction``, then conv 3x3 C -> 4C -> C
    over (positions, map), plus a 1x1 conv+BN shortcut of the input.
    """

    def __init__(self, channels: int, dropout: float, num_contexts: int = NUM_CONTEXT) -> None:
        super().__init__()
        self.pconv = conv_bn(channels, channels, (num_contexts, 1))
        self.conv1 = conv_bn(channels, 4 * channels, 3, 1)
        self.conv2 = conv_bn(4 * channels, channels, 3, 1)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.downsample = conv_bn(channels, channels, 1, 0, activate=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        contexts, candidate = x[:, :, :-1], x[:, :, -1:]
        prediction_error = F.relu(candidate) - self.pconv(contexts)
        out = torch.cat((contexts, prediction_error), dim=2)
        return self.drop(self.conv2(self.conv1(out))) + self.downsample(x)


@register_encoder("predrnet")
class PredRNetEncoder(Encoder):
    """PredRNet up to its classifier's hidden layer; D = 1024 // ``classifier_hidden_reduce``, candidates independent.

    Shapes (B RPMs, 80 px, defaults):
        1. image encoder on every panel: (B*16, 1, 80, 80) -> (B, 16, 32, 25)
        2. completions: (B*8, 32, 9, 25), context panels then choice k
        3. ``num_extra_stages`` predictive reasoning blocks: same shape
        4. flatten to (B, 8, 7200), adaptive average pool to (B, 8, 1024)
        5. Linear(1024, 256, no bias) -> BatchNorm1d -> ReLU -> Dropout: embeddings (B, 8, 256)

    Args:
        image_size: panel side S (80 in the official runs; the encoder halves it four times).
        num_filters: width of the first image-encoder stage (32).
        num_extra_stages: predictive reasoning blocks (3 in the official training command, 1 in its class default).
        block_dropout: dropout at the end of every residual and reasoning block (0.1).
        classifier_dropout: dropout after the classifier's hidden layer (0.1), i.e. on the embedding.
        classifier_hidden_reduce: H = 1024 // this (4, the official command-line default).
        column_pass: also reason over columns and sum the two hidden vectors (the official ``enable_rc``).
    """

    couples_candidates = False

    def __init__(self, image_size: int = 80, num_filters: int = 32, num_extra_stages: int = 3,
                 block_dropout: float = 0.1, classifier_dropout: float = 0.1, classifier_hidden_reduce: int = 4,
                 column_pass: bool = False) -> None:
        super().__init__(image_size)
        name = type(self).__name__
        if image_size < 16:
            raise ValueError(f"{name}: image_size must be at least 16 (four stride-2 stages), got {image_size}")
        if num_filters < 1 or num_extra_stages < 0:
            raise ValueError(f"{name}: num_filters must be >= 1 and num_extra_stages >= 0, "
                             f"got {num_filters} and {num_extra_stages}")
        for field_name, value in (("block_dropout", block_dropout), ("classifier_dropout", classifier_dropout)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name}: {field_name} must be in [0, 1), got {value}")
        if not 1 <= classifier_hidden_reduce <= RELATION_FEATURES:
            raise ValueError(f"{name}: classifier_hidden_reduce must be in 1..{RELATION_FEATURES}, "
                             f"got {classifier_hidden_reduce}")
        widths = [1] + [num_filters * factor for factor in (1, 2, 3, 4)]
        self.image_encoder = nn.Sequential(*[
            ResidualStage(widths[index], widths[index + 1], stride=2, dropout=block_dropout) for index in range(4)
        ])
        self.channel_reducer = conv_bn(widths[-1], REASONING_CHANNELS, 1, 0, activate=False)
        self.reasoning_blocks = nn.Sequential(*[
            PredictiveReasoningBlock(REASONING_CHANNELS, dropout=block_dropout) for _ in range(num_extra_stages)
        ])
        self.embedding_dim = RELATION_FEATURES // int(classifier_hidden_reduce)
        self.classifier_hidden = nn.Sequential(
            nn.Linear(RELATION_FEATURES, self.embedding_dim, bias=False),
            nn.BatchNorm1d(self.embedding_dim),
            nn.ReLU(),
            nn.Dropout(classifier_dropout),
        )
        self.column_pass = bool(column_pass)

    def embed(self, panels: torch.Tensor) -> torch.Tensor:
        batch, num_panels, height, width = panels.shape
        # The official code feeds (pixel / 255 - 0.5) * 2, white = 1: with zero padding the scale is not only BN's.
        images = (panels * 2.0 - 1.0).reshape(batch * num_panels, 1, height, width)
        maps = self.channel_reducer(self.image_encoder(images))
        features = maps.reshape(batch, num_panels, REASONING_CHANNELS, -1)  # (B, 16, 32, L)
        hidden = self._hidden(features[:, :NUM_CONTEXT], features[:, NUM_CONTEXT:])
        if self.column_pass:
            hidden = hidden + self._hidden(features[:, list(COLUMN_ORDER)], features[:, NUM_CONTEXT:])
        return hidden

    def _hidden(self, context: torch.Tensor, choices: torch.Tensor) -> torch.Tensor:
        """context (B, 8, C, L), choices (B, 8, C, L) -> classifier hidden vectors (B, 8, D)."""
        batch, _, channels, length = context.shape
        completions = torch.cat([
            context.unsqueeze(1).expand(-1, NUM_CANDIDATES, -1, -1, -1), choices.unsqueeze(2),
        ], dim=2)  # (B, 8, 9, C, L)
        relations = self.reasoning_blocks(completions.reshape(batch * NUM_CANDIDATES, NUM_CONTEXT + 1, channels,
                                                               length).transpose(1, 2))  # (B*8, C, 9, L)
        pooled = F.adaptive_avg_pool1d(relations.reshape(batch, NUM_CANDIDATES, -1), RELATION_FEATURES)
        return self.classifier_hidden(pooled.reshape(batch * NUM_CANDIDATES, RELATION_FEATURES)).reshape(
            batch, NUM_CANDIDATES, self.embedding_dim)

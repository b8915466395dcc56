"""answer_cross_entropy and CoPINet's contrast loss over the 8 answer scores."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rpm_lib.losses import (ANSWER_LOSSES, AnswerCrossEntropy, CopinetContrastLoss, answer_cross_entropy,
                            copinet_contrast_loss)


def scores_and_target(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(5, 8, generator=generator, dtype=torch.float64), torch.tensor([0, 3, 7, 2, 2])


def test_cross_entropy_is_mean_negative_log_softmax() -> None:
    scores, target = scores_and_target()
    expected = 0.0
    for row, answer in zip(scores.tolist(), target.tolist()):
        expected -= row[answer] - math.log(sum(math.exp(s) for s in row))
    expected /= len(target)
    assert answer_cross_entropy(scores, target).item() == pytest.approx(expected, rel=1e-12)
    assert AnswerCrossEntropy()(scores, target).item() == answer_cross_entropy(scores, target).item()


def test_contrast_loss_is_bce_against_one_hot() -> None:
    scores, target = scores_and_target(1)
    expected = 0.0
    for row, answer in zip(scores.tolist(), target.tolist()):
        for k, s in enumerate(row):
            p = 1.0 / (1.0 + math.exp(-s))
            expected -= math.log(p) if k == answer else math.log(1.0 - p)
    expected /= scores.numel()
    assert copinet_contrast_loss(scores, target).item() == pytest.approx(expected, rel=1e-12)
    assert CopinetContrastLoss()(scores, target).item() == copinet_contrast_loss(scores, target).item()


def test_contrast_and_cross_entropy_differ() -> None:
    """CE only sees score differences; the contrast loss also sees the absolute level."""
    scores, target = scores_and_target(2)
    assert answer_cross_entropy(scores + 3.0, target).item() == pytest.approx(answer_cross_entropy(scores, target).item())
    assert copinet_contrast_loss(scores + 3.0, target).item() != pytest.approx(copinet_contrast_loss(scores, target).item())


def test_the_answer_loss_registry_is_the_config_vocabulary() -> None:
    from rpm_lib.training.config import TrainConfig

    assert ANSWER_LOSSES == {"ce": answer_cross_entropy, "copinet_contrast": copinet_contrast_loss}
    field = next(f for f in dataclasses.fields(TrainConfig) if f.name == "answer_loss")
    assert field.metadata["choices"] == tuple(ANSWER_LOSSES)


@pytest.mark.parametrize("loss_fn", [answer_cross_entropy, copinet_contrast_loss])
@pytest.mark.parametrize(
    "scores, target, message",
    [
        (torch.zeros(2, 8, 1), torch.tensor([0, 1]), "scores must be float"),
        (torch.zeros(2, 8, dtype=torch.long), torch.tensor([0, 1]), "scores must be float"),
        (torch.zeros(2, 8), torch.tensor([0, 1, 2]), "target must be int64"),
        (torch.zeros(2, 8), torch.tensor([0.0, 1.0]), "target must be int64"),
        (torch.zeros(2, 8), torch.tensor([0, 8]), "target values"),
    ],
)
def test_bad_inputs_raise(loss_fn, scores: torch.Tensor, target: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        loss_fn(scores, target)

"""rule_loss: BCE with logits over multi-hot rule vectors (dense or sparse encodings)."""
from __future__ import annotations

import math

import pytest
import torch

from rpm_lib.losses import RuleLoss, rule_loss


def manual_bce(logits: torch.Tensor, targets: torch.Tensor) -> float:
    total = 0.0
    for x, y in zip(logits.flatten().tolist(), targets.flatten().tolist()):
        p = 1.0 / (1.0 + math.exp(-x))
        total -= y * math.log(p) + (1 - y) * math.log(1 - p)
    return total / logits.numel()


@pytest.mark.parametrize("num_rules", [9, 38, 40, 12, 50])
def test_matches_manual_bce(num_rules: int) -> None:
    generator = torch.Generator().manual_seed(num_rules)
    logits = torch.randn(4, num_rules, generator=generator, dtype=torch.float64)
    targets = (torch.rand(4, num_rules, generator=generator) < 0.2).to(torch.uint8)
    assert rule_loss(logits, targets).item() == pytest.approx(manual_bce(logits, targets.double()), rel=1e-10)
    assert RuleLoss()(logits, targets).item() == rule_loss(logits, targets).item()


def test_perfect_logits_give_near_zero_loss() -> None:
    targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    assert rule_loss(40.0 * (2 * targets - 1), targets).item() < 1e-12


@pytest.mark.parametrize(
    "logits, targets, message",
    [
        (torch.zeros(2, 9), torch.zeros(2, 40), "must both be"),
        (torch.zeros(9), torch.zeros(9), "must both be"),
        (torch.zeros(2, 9), torch.full((2, 9), 2.0), r"\[0, 1\]"),
    ],
)
def test_bad_inputs_raise(logits: torch.Tensor, targets: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rule_loss(logits, targets)


def test_value_checks_run_on_the_cpu_and_on_accelerators_only_when_asked(monkeypatch) -> None:
    from rpm_lib.losses.value_checks import check_values

    monkeypatch.delenv("RPM_LIB_CHECK_VALUES", raising=False)
    assert check_values(torch.zeros(2))
    assert not check_values(torch.zeros(2, device="meta"))  # stands for any accelerator: no host read-back
    monkeypatch.setenv("RPM_LIB_CHECK_VALUES", "1")
    assert check_values(torch.zeros(2, device="meta"))

"""Losses: pure functions plus thin ``nn.Module`` wrappers (solo-learn / SupContrast style).

========================== ============================== ==================================
function                   module                         inputs
========================== ============================== ==================================
:func:`mlcl_loss`          :class:`MLCLLoss`              z (M, d), z_neg (M, 7, d), rules (M, R)
:func:`rule_loss`          :class:`RuleLoss`              logits (B, R), targets (B, R)
:func:`answer_cross_entropy` :class:`AnswerCrossEntropy`  scores (B, 8), target (B,)
:func:`copinet_contrast_loss` :class:`CopinetContrastLoss` scores (B, 8), target (B,)
========================== ============================== ==================================

``ANSWER_LOSSES`` maps the config field ``answer_loss`` to its function.
"""
from __future__ import annotations

from rpm_lib.losses.copinet_contrast import CopinetContrastLoss, copinet_contrast_loss
from rpm_lib.losses.cross_entropy import AnswerCrossEntropy, answer_cross_entropy
from rpm_lib.losses.mlcl import NEGATIVE_MODES, NUMERICS, MLCLLoss, mlcl_loss, split_completions
from rpm_lib.losses.rule import RuleLoss, rule_loss
from rpm_lib.method_choices import ANSWER_LOSS_NAMES

#: Registry of answer losses, config field ``answer_loss`` -> ``loss(scores (B, 8), target (B,)) -> scalar``.
ANSWER_LOSSES = {
    "ce": answer_cross_entropy,
    "copinet_contrast": copinet_contrast_loss,
}
assert tuple(ANSWER_LOSSES) == ANSWER_LOSS_NAMES, "rpm_lib.method_choices names every answer loss, in this order"

__all__ = [
    "ANSWER_LOSSES",
    "NEGATIVE_MODES",
    "NUMERICS",
    "mlcl_loss",
    "MLCLLoss",
    "split_completions",
    "rule_loss",
    "RuleLoss",
    "answer_cross_entropy",
    "AnswerCrossEntropy",
    "copinet_contrast_loss",
    "CopinetContrastLoss",
]

"""The setup registry: the paper's five training setups, the stages each one runs, and what a stage is.

======================  =====================================================================
setup                   stages
======================  =====================================================================
``ce``                  supervised: encoder + scoring head, cross-entropy
``ce_aux_dense``        supervised: CE + beta * BCE(rule head, dense meta-target)
``ce_aux_sparse``       supervised: CE + beta * BCE(rule head, sparse-38 / sparse-50 code)
``mlcl``                pretrain: gamma * MLCL + beta * aux (encoder, projection, rule head);
                        linear: frozen encoder (eval mode), fresh linear scoring head, CE
``mlcl_aug``            as ``mlcl`` with two augmented views per RPM in pre-training
======================  =====================================================================

A setup is one :data:`SETUPS` entry: the stage kinds it runs (:data:`STAGE_KINDS`, built from the config by
:mod:`rpm_lib.training.plans`), the objectives its training stages add to the answer loss (names in
:data:`rpm_lib.training.objectives.OBJECTIVES`), the rule code they need, its views and its default augmentation.
A setup that recombines existing stages and objectives is one entry here: TrainConfig's ``setup`` choices and
help, ``rpm-train --help``, the model's heads, its losses and what each stage freezes all follow from it.

Any setup can append ``finetune`` (``config.finetune``): encoder + scoring head, answer loss only.
What a run's final weights measure is its *protocol* (:data:`PROTOCOLS`): the protocol of the last stage that
trained. A contrastive run that ends after linear evaluation reports the paper's Table 1 protocol; one that ran
``finetune`` reports a fine-tuned encoder (the release's phase 3), which is never a Table 1 number.
Ablations are config values: ``beta=0`` (contrastive only), ``gamma=0`` (auxiliary only),
``negatives=none`` (no wrong completions in the MLCL denominator), sweeps over ``beta`` / ``batch_size``.

This module imports nothing of rpm_lib, so the configuration can validate against it.
"""
from __future__ import annotations

import dataclasses

#: What the final weights of a run measure, by the last stage that trained: ``linear_evaluation`` (frozen
#: pre-trained encoder + linear scoring head: the paper's protocol for the MLCL rows of Table 1),
#: ``fine_tuned`` (the encoder was trained end to end with the answer loss after pre-training: the release's
#: phase 3), ``supervised`` (a supervised setup trained end to end; the CE rows of Table 1),
#: ``untrained_head`` (``max_total_epochs`` ended a contrastive run before its scoring head trained: chance).
PROTOCOLS: tuple[str, ...] = ("linear_evaluation", "fine_tuned", "supervised", "untrained_head")


@dataclasses.dataclass(frozen=True)
class StageKind:
    """A kind of stage a setup can run (its recipe from the config: ``rpm_lib.training.plans.STAGE_BUILDERS``).

    Attributes:
        name: the stage's name (checkpoints/<name>/, history.csv, progress.json).
        description: how messages name it.
        setup_objectives: the stage trains the setup's objectives (``SetupSpec.objectives``).
        answer: the stage trains the answer loss on the scoring head.
        protocol: what the final weights measure when this is the last stage that trained (:data:`PROTOCOLS`).
    """

    name: str
    description: str
    setup_objectives: bool
    answer: bool
    protocol: str


#: Stage kinds, in the order they run (a stage's seeds derive from its position here: never reorder).
STAGE_KINDS: dict[str, StageKind] = {kind.name: kind for kind in (
    StageKind("supervised", "supervised training", setup_objectives=True, answer=True, protocol="supervised"),
    StageKind("pretrain", "pre-training", setup_objectives=True, answer=False, protocol="untrained_head"),
    StageKind("linear", "linear evaluation", setup_objectives=False, answer=True, protocol="linear_evaluation"),
    StageKind("finetune", "fine-tuning", setup_objectives=False, answer=True, protocol="fine_tuned"),
)}
#: Stage names, in the order they run.
STAGES: tuple[str, ...] = tuple(STAGE_KINDS)


@dataclasses.dataclass(frozen=True)
class SetupSpec:
    """What a setup trains.

    Attributes:
        name: config value of ``setup``.
        label: the paper's name (Table 1 rows).
        stages: the stage kinds it runs, in order (:data:`STAGE_KINDS`); ``finetune`` is appended by the config.
        objectives: what its ``setup_objectives`` stages train besides (or, in pre-training, instead of) the
            answer loss, in :data:`rpm_lib.training.objectives.OBJECTIVES` names (``aux``, ``mlcl``).
        rule_kind: ``"dense"``, ``"sparse"`` or ``None`` (no rules needed).
        num_views: views per RPM in the first stage (2 only for ``mlcl_aug``).
        augment: what ``augment=auto`` resolves to (a recipe of :mod:`rpm_lib.augment`, or ``none``).
        summary: a few words for the ``setup`` field's help (empty: the name says it).
    """

    name: str
    label: str
    stages: tuple[str, ...]
    objectives: tuple[str, ...]
    rule_kind: str | None
    num_views: int = 1
    augment: str = "none"
    summary: str = ""

    @property
    def auxiliary(self) -> bool:
        """Uses the rule head and the auxiliary BCE loss (weight ``beta``)."""
        return "aux" in self.objectives

    @property
    def contrastive(self) -> bool:
        """Pre-trains (MLCL) and then trains the scoring head in linear evaluation."""
        return "pretrain" in self.stages


SETUPS: dict[str, SetupSpec] = {spec.name: spec for spec in (
    SetupSpec("ce", "CE", stages=("supervised",), objectives=(), rule_kind=None),
    SetupSpec("ce_aux_dense", "CE+AUX-dense", stages=("supervised",), objectives=("aux",), rule_kind="dense"),
    SetupSpec("ce_aux_sparse", "CE+AUX-sparse", stages=("supervised",), objectives=("aux",), rule_kind="sparse"),
    SetupSpec("mlcl", "MLCL", stages=("pretrain", "linear"), objectives=("aux", "mlcl"), rule_kind="sparse",
              summary="contrastive pre-training + linear evaluation"),
    SetupSpec("mlcl_aug", "MLCL+AUG", stages=("pretrain", "linear"), objectives=("aux", "mlcl"), rule_kind="sparse",
              num_views=2, augment="official", summary="mlcl with two augmented views"),
)}


def setup_help() -> str:
    """The ``setup`` field's help: every registered setup, with its summary."""
    return "training setup: " + ", ".join(f"{name} ({spec.summary})" if spec.summary else name
                                          for name, spec in SETUPS.items())


#: When a stage re-estimates the encoder's BatchNorm statistics (``StagePlan.bn_recalibration``): ``none``;
#: ``before_validation`` (pre-training: the validation loss that picks the encoder for linear evaluation is
#: measured with statistics of the current weights on plain images); ``at_start`` (linear evaluation with the
#: frozen encoder in eval mode: once, before the scoring head trains; the statistics then stay fixed).
BN_RECALIBRATIONS: tuple[str, ...] = ("none", "before_validation", "at_start")


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One ``Trainer.fit`` call.

    Attributes:
        name: one of :data:`STAGES`.
        max_epochs: epoch limit (early stopping may end it sooner).
        lr: Adam learning rate (the optimiser is rebuilt at every stage).
        batch_size: RPMs per step per device.
        train_encoder: encoder parameters are optimised; otherwise frozen *and* in eval mode.
        num_views: views per RPM (2 = two augmented views).
        augment: augmentation recipe for training batches (``"none"`` = identity).
        weights: objective name (:data:`rpm_lib.training.objectives.OBJECTIVES`) -> its weight in the stage's
            loss; an objective absent or at 0 is not computed and its head is frozen.
        reset_scoring_head: re-initialise the scoring head before the stage (linear evaluation).
        encoder_train_mode: a frozen encoder stays in train mode (BatchNorm uses batch statistics and updates
            its running ones), as the release's head training; otherwise a frozen encoder is in eval mode.
        bn_recalibration: when the encoder's BatchNorm statistics are re-estimated on un-augmented training
            batches (:mod:`rpm_lib.training.batchnorm`): one of :data:`BN_RECALIBRATIONS`.
        cached_features: the frozen encoder's embeddings are computed once when the stage starts and the head
            trains on them (:mod:`rpm_lib.training.feature_cache`).
    """

    name: str
    max_epochs: int
    lr: float
    batch_size: int
    train_encoder: bool
    num_views: int
    augment: str
    weights: dict[str, float] = dataclasses.field(default_factory=dict)
    reset_scoring_head: bool = False
    encoder_train_mode: bool = False
    bn_recalibration: str = "none"
    cached_features: bool = False

    def weight(self, objective: str) -> float:
        """The weight of ``objective`` in this stage's loss (0 when the stage does not train it)."""
        return self.weights.get(objective, 0.0)

    @property
    def answer_weight(self) -> float:
        """Weight of the answer loss (CE) on the scoring head; 0 = scoring head frozen."""
        return self.weight("answer")

    @property
    def aux_weight(self) -> float:
        """Weight of the rule BCE loss (0 = rule head unused)."""
        return self.weight("aux")

    @property
    def contrastive_weight(self) -> float:
        """Weight of the MLCL loss (0 = projection head unused)."""
        return self.weight("mlcl")
